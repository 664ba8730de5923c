#pragma once
/// \file sim_device.hpp
/// The sim backend: simulated GPUs. Each op and copy occupies its stream for
/// the cost model's time (graph/cost_model.hpp) times a seeded lognormal
/// jitter factor times options.time_scale, in wall time; copy streams share
/// spec.copy_engines engine timelines. With compute_values the cpu kernels
/// also run, so values are real. Faults can be injected (fault_config) or
/// caused by tests through the methods below.
///
/// Modes:
///  - default: worker thread per stream, modelled delays, real values;
///  - compute_values = false: timing only, memory is reserved address space
///    that is never touched (a 70B-parameter model "fits" on a laptop);
///    upload / download / copies move no bytes, so values are garbage;
///  - zero_delay: no delays; with compute_values = false this is the
///    *instant* device: work runs inline in the calling thread, events
///    complete at record time and notify callbacks run before notify()
///    returns (the dispatch-cost benchmark measures the runtime with it;
///    wait + launch + record cost ~0.2 us there, Release). A wait on an
///    event that is not complete yet blocks the calling thread.
///
/// Costs: an op with op_launch::source set costs estimate_seconds(spec,
/// *source, *op), else estimate_seconds(spec, cost_of_launch(l), dtype);
/// copies estimate_host_copy_seconds / estimate_peer_copy_seconds. Faults and
/// jitter are drawn at launch() from one seeded generator per device, so the
/// same seed and the same sequence of calls give the same times and faults.
///
/// Threading: as every device (device.hpp); kill(), set_faults() and the
/// counters may be called from any thread.

#include <atomic>
#include <mutex>

#include "graph/random.hpp"
#include "gpu/host/host_device.hpp"

namespace ag::gpu::sim {

class sim_device final : public host::host_device {
 public:
  /// `options.spec` is ignored here: `spec` is this device's (name, ordinal set).
  sim_device(device_spec spec, int index, const sim_options& options);

  /// Kills the device now (as die_after_ops would): on_fault handler once,
  /// pending work completes without running, later calls fail with device_failed.
  void kill(const std::string& why = "killed");
  /// Replaces the fault configuration (affects ops launched afterwards).
  /// die_after_ops counts from the ops already run.
  void set_faults(const fault_config& f);
  /// Ops that ran on this device's streams (skipped ones after death included).
  int64_t ops_run() const noexcept { return host_device::ops_run(); }
  /// Sum of the modelled durations (seconds, after jitter, before time_scale)
  /// of all ops and copies enqueued so far: the same seed and the same calls
  /// give the same sum. A zero_delay device without op faults models nothing
  /// and stays at 0 (its per-op cost is what dispatch benchmarks must not see).
  double modelled_seconds() const;
  const sim_options& options() const noexcept { return options_; }

  /// Graph replay, modelled: capture_segment() keeps a copy of the launch
  /// records (views and leaves dropped) with launch_paid_by_replay set on
  /// every kernel but the first, and the segment's host copies; replay()
  /// launches and copies them in order, so a replayed segment pays one
  /// launch latency and computes the same values as plain launches of the
  /// same buffers (its copies keep their modelled transfer time).
  /// fault_config::refuse_capture makes capture fail (fallback tests).
  bool captures() const noexcept override { return true; }
  expected<std::unique_ptr<replay_graph>> capture_segment(stream& s, const segment_op* ops, std::size_t n) override;
  /// Several lanes: replay() forks lanes 1.. off the replaying stream with
  /// events, runs each op on its lane's stream after the events of the ops
  /// it follows (segment_op::after), and joins the lanes back, so the
  /// branches overlap as plain lanes do, for one launch.
  expected<std::unique_ptr<replay_graph>> capture_lanes(stream* const* lanes, int count, const segment_op* ops,
                                                       std::size_t n) override;
  error replay(stream& s, replay_graph& g) override;

 protected:
  error admit_op(host::host_stream& s, const op_launch& l, host::work_timing& t) override;
  host::work_timing copy_timing(host::host_stream& s, host::copy_kind k, int64_t bytes,
                                const device* src) override;
  host::work_timing collective_timing(host::host_stream& s, const collective_launch& c) override;
  void op_executed(int64_t count) override;
  /// After reset() (host_device: revives a dead device, cuts a stall short):
  /// a die_after_ops that killed it is spent (set_faults arms a new one); op
  /// error and stall rates stay as configured.
  void revived() override;

 private:
  double jitter_factor();  // under mutex_

  sim_options options_;
  mutable std::mutex mutex_;  // rng_, faults_, modelled_
  rng rng_;
  fault_config faults_;
  /// op errors or stalls configured: admit_op must draw; read without the lock.
  std::atomic<bool> faults_possible_{false};
  /// ops_run count at which the device dies (-1: never); written under mutex_, read lock-free per op.
  std::atomic<int64_t> die_at_{-1};
  double modelled_ = 0;
};

/// Creates sim device `sim<ordinal>` with index `index` from options.sim.
device_ptr make_sim_device(int ordinal, int index, const sim_options& options);

/// Modelled op cost from the launch's tensors when no graph is given (the
/// same formula as graph/cost_model's cost_of: matmul 2*M*N*K*batch flops,
/// bytes = inputs read + output written; views and leaves cost nothing).
op_cost cost_of_launch(const op_launch& l);

}  // namespace ag::gpu::sim
