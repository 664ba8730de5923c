#pragma once
/// \file runtime_core.hpp
/// Internal interface of the actor runtime (not for apps): runtime_core
/// builds and owns every actor of one runtime on a given caf::actor_system.
/// The public runtime (actorgraph.hpp, runtime.cpp) owns one actor system
/// and one core; protocol tests build a core on CAF's deterministic test
/// coordinator instead.
///
/// Threads: every method may be called from any thread (the user's, a
/// backend's, an actor's). compile() runs on the caller's thread and blocks
/// there for the weight upload. The actors it spawns run on the CAF
/// scheduler; see docs/ARCHITECTURE.md for who owns which thread.

#include <array>
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include <caf/actor.hpp>
#include <caf/actor_system.hpp>

#include "actors/actorgraph.hpp"
#include "actors/collective_order.hpp"
#include "actors/job_actor.hpp"
#include "actors/job_context.hpp"
#include "actors/job_registry.hpp"
#include "actors/loaded_plan.hpp"
#include "actors/stream_actor.hpp"
#include "actors/trace_buffer.hpp"
#include "gpu/device.hpp"

namespace ag::actors {

struct liveness;
struct fault_sink;

/// Graph replay counters (runtime::replay_statistics): written by the
/// executing actors, read by any thread.
class replay_counters {
 public:
  void note(replay_outcome o, const std::string& why = {});
  replay_stats read() const;

 private:
  std::atomic<int64_t> plain_{0}, captured_{0}, replayed_{0}, fallbacks_{0};
  mutable std::mutex why_m_;
  std::string last_fallback_;  // under why_m_
};

class runtime_core {
 public:
  /// Spawns the runtime actor, and per device its device actor, its first
  /// compute-lane actor and its three copy-engine actors (h2d, d2h, peer).
  runtime_core(caf::actor_system& sys, std::vector<gpu::device_ptr> devices, runtime_options opts);
  /// shutdown(). The system must outlive the core's shutdown().
  ~runtime_core();

  const std::vector<gpu::device_ptr>& devices() const noexcept { return devices_; }
  const std::vector<device_spec>& specs() const noexcept { return specs_; }
  const runtime_options& options() const noexcept { return opts_; }
  caf::actor_system& system() noexcept { return sys_; }
  caf::actor runtime_actor() const { return runtime_actor_; }
  job_registry& jobs() noexcept { return *jobs_; }
  caf::actor device_actor(int i) const { return device_actors_[static_cast<std::size_t>(i)]; }
  /// Every executing (stream and copy-engine) actor spawned so far (tests).
  std::vector<caf::actor> exec_actors();
  /// The loaded plan behind a plan handle this runtime's compile() returned
  /// (tests); null for any other pointer.
  static std::shared_ptr<const loaded_plan> loaded(const std::shared_ptr<const plan>& p);
  /// The loaded plan behind `p` when this runtime compiled it, else null.
  const std::shared_ptr<const loaded_plan>* loaded_here(const std::shared_ptr<const plan>& p) const;

  /// Plans `g`, lowers the plan (lower(), launch_program.hpp), binds each
  /// queue to its executing actor (spawning missing compute lanes), uploads
  /// the weights and allocates the first arena of each used device, then
  /// registers the memory with the device actors. Errors name the device
  /// (error::device) where one is concerned.
  expected<std::shared_ptr<const plan>> compile(std::shared_ptr<const graph> g, plan_options options);
  /// Spawns the job's actor and sends its first arena request (from this
  /// thread, so that one thread's jobs queue in submission order).
  job submit(const std::shared_ptr<const plan>& p, std::vector<host_tensor> inputs,
             const submit_options& options = {});

  /// Job actors spawned ahead and not yet bound to a job (tests): at most
  /// runtime_options::spare_job_actors, fewer while submitting threads race
  /// for them, none after shutdown().
  std::size_t spare_job_actors() const;

  int64_t jobs_in_flight() const noexcept { return in_flight_.load(); }
  /// Blocks until no job actor is alive.
  void wait_idle();
  /// A job's handle became ready (jobs_in_flight() counts these down).
  void job_ready() noexcept;
  /// A job actor is done with the runtime (wait_idle() and teardown wait for these).
  void job_gone() noexcept;
  trace take_trace();
  trace_buffer& traces() noexcept { return trace_; }
  replay_counters& replays() noexcept { return replays_; }
  /// The turns of every plan's jobs on the executing actors' issue lines
  /// (actors/collective_order.hpp): one order across plans. Any thread.
  issue_lines& issue_order() noexcept { return issue_order_; }

  /// Asks device `index`'s actor to lift its quarantine / revive it
  /// (runtime::reset_device); `done` runs once jobs may use the device again,
  /// or with the error that refused it (an index out of range and a stopping
  /// runtime: at once, on this thread; else on an actor's thread).
  void reset_device(int index, std::function<void(const error&)> done);
  /// runtime::device_in_service.
  bool device_in_service(int index) const;

  /// Stops every actor (call after wait_idle). Idempotent.
  void shutdown();
  bool stopped() const noexcept { return stopped_.load(); }
  /// From now on submit() fails at once with errc::shutting_down (the
  /// runtime's destructor calls it before waiting for the jobs in flight).
  void stop_submissions() noexcept { stopping_.store(true); }

 private:
  /// The stall watch of device `device`'s executing actors (from the options).
  stall_watch watch_of(std::size_t device) const;
  /// The actor of queue (device, kind, lane), spawning missing compute lanes.
  caf::actor queue_actor(int device, step_kind kind, int lane);

  caf::actor_system& sys_;
  std::vector<gpu::device_ptr> devices_;
  std::vector<device_spec> specs_;
  runtime_options opts_;
  std::shared_ptr<job_registry> jobs_ = std::make_shared<job_registry>();
  caf::actor runtime_actor_;
  std::vector<caf::actor> device_actors_;
  std::mutex lanes_m_;
  std::vector<std::vector<caf::actor>> lanes_;          // [device][lane], under lanes_m_
  std::vector<std::array<caf::actor, 3>> copy_actors_;  // [device][h2d, d2h, peer]
  std::vector<std::vector<caf::actor>> comm_actors_;    // [device][job lane], spawned on first use, under lanes_m_
  std::vector<std::shared_ptr<fault_sink>> fault_sinks_;
  issue_lines issue_order_;
  /// Spare job actors (job_actor.hpp, spare_job_actor): submit() binds one
  /// instead of spawning, and spawns its replacement once the job is sent.
  /// Dismissed by shutdown(). Any submitting thread; under spares_m_.
  mutable std::mutex spares_m_;
  std::vector<spare_job_actor> spares_;
  std::atomic<uint64_t> next_job_{1};
  std::atomic<int64_t> in_flight_{0};  ///< submitted, handle not yet ready
  std::atomic<int64_t> alive_{0};      ///< submitted, job actor not yet finished
  mutable std::mutex idle_m_;
  std::condition_variable idle_cv_;
  std::atomic<bool> stopped_{false};
  std::atomic<bool> stopping_{false};  ///< submissions refused (stop_submissions)
  trace_buffer trace_;
  replay_counters replays_;
  std::shared_ptr<liveness> live_;
};

}  // namespace ag::actors
