#pragma once
/// \file host_device.hpp
/// The part of the cpu and sim devices that is the same: host memory,
/// host_stream streams, host_event events, record / wait / notify /
/// synchronize, death. A backend subclass decides how long work takes
/// (timing hooks) and whether it computes values.
///
/// Threading: every method is thread-safe (device.hpp). Work runs on the
/// streams' worker threads (or inline in the caller for inline streams).

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "gpu/device.hpp"
#include "gpu/host/caching_host_memory.hpp"
#include "gpu/host/collective_sequence.hpp"
#include "gpu/host/host_stream.hpp"

namespace ag::gpu::host {

/// How a host device behaves.
struct host_device_config {
  bool compute = true;         ///< run kernels and memcpys (false: timing only, values garbage)
  bool timed = false;          ///< occupy streams for the modelled time (sim)
  bool inline_streams = false; ///< run work in the calling thread (instant sim device)
  bool lazy_memory = false;    ///< back device memory with untouched mmap pages (timing only)
  double time_scale = 1.0;     ///< wall seconds per modelled second
  /// Collectives whose plan picked the ring (collective_launch::algo) run as
  /// a ring (gpu/cpu/ring.hpp) instead of one-shot: the cpu backend. Needs
  /// worker streams (the parts meet); the sim keeps the one-shot for its
  /// values and models the ring's time.
  bool ring_collectives = false;
  /// Threads each kernel may use, its stream's worker included
  /// (cpu::run_op's `threads`): the cpu backend's cpu_threads_per_stream.
  int kernel_threads = 1;
  /// How many parts a kernel cuts a large f32 BLAS product into
  /// (cpu::run_op's `parts`; 0: cpu::machine_parts()): the cpu backend's
  /// share of the machine per device (hardware threads / cpu devices), never
  /// kernel_threads, so that the bits do not depend on the thread count.
  int kernel_parts = 0;
};

/// What a piece of work costs on a timed device.
struct work_timing {
  double seconds = 0;            ///< modelled seconds (scaled by time_scale)
  /// The part of `seconds` that is launch cost (kernels). Launches of all the
  /// device's compute lanes come one after another (one actor launches them,
  /// as on CUDA); the rest of a kernel shares the device's throughput with
  /// the other lanes' kernels. So lanes overlap one lane's launches with
  /// another's work, no more (measured on an H100: 8 chains of small matmuls
  /// ran 1.07x faster on 4 lanes than on one; docs/BENCHMARKS.md).
  double launch_seconds = 0;
  /// The part of `seconds` that holds only the kernel's own stream (a
  /// replayed kernel's spec.kernel_latency less its issue interval,
  /// replayed_kernel_overlap_seconds): it waits for neither the
  /// launch clock nor the device's throughput, so other lanes' kernels
  /// overlap it.
  double latency_seconds = 0;
  /// The part of `seconds` after the kernel's throughput-bound work that
  /// holds only its own stream: a product's partly filled last wave of tiles
  /// (estimate_wave_tail_seconds), whose idle SMs another lane's kernel
  /// fills, as the planner's auto lanes assume.
  double tail_seconds = 0;
  double extra_wall_seconds = 0; ///< unscaled extra wall time (injected stall)
};

enum class copy_kind : uint8_t { h2d, d2h, peer };

/// Whether a computing host device's allocations of 2 MiB and more (its
/// own memory, the output cache's buffers) are mappings on huge pages, 2 MiB
/// aligned: on unless the environment says AG_CPU_HUGE_PAGES=0 (read once).
bool huge_pages_enabled() noexcept;

/// The process's cache of job outputs of computing host devices
/// (device::output_memory()): buffers of at least host_output_min_bytes are
/// mappings on huge pages (as the devices' own memory), kept when a
/// host_tensor lets them go and handed to the next output of about that
/// size, up to host_output_cache_bytes cached; smaller ones come from the
/// heap. Made on first use and never destroyed (host_tensors holding its
/// buffers may outlive every runtime). Thread-safe.
inline constexpr std::size_t host_output_min_bytes = std::size_t{1} << 20;
inline constexpr int64_t host_output_cache_bytes = int64_t{1} << 30;
host_memory_resource& host_output_memory() noexcept;
host_cache_stats host_output_memory_stats();

class host_device : public device {
 public:
  /// Unless cfg.lazy_memory, this device's memory is the host's:
  /// spec.mem_bytes is capped at host_memory_bytes() and spec.in_host_memory
  /// set, so compile() refuses a plan the host cannot hold (with the sizes).
  host_device(device_spec spec, int index, host_device_config cfg);
  /// Frees memory still allocated. Streams must be destroyed before their device.
  ~host_device() override;

  const device_spec& spec() const noexcept override { return spec_; }
  int index() const noexcept override { return index_; }

  expected<void*> allocate(int64_t bytes) override;
  void deallocate(void* p) noexcept override;
  expected<void*> allocate_host(int64_t bytes) override;
  void deallocate_host(void* p) noexcept override;
  /// host_output_memory() for a computing device; timing-only devices keep
  /// the heap (their outputs are never written).
  host_memory_resource* output_memory() noexcept override;
  int64_t memory_capacity() const noexcept override { return spec_.mem_bytes; }
  int64_t memory_in_use() const noexcept override { return in_use_.load(std::memory_order_relaxed); }
  /// Timing-only devices (compute = false) skip the copy: values are garbage there.
  error upload(void* dst, const void* src, int64_t bytes) override;
  error download(void* dst, const void* src, int64_t bytes) override;

  /// Starts the stream's worker thread (none for inline streams). Fails on a
  /// dead device or when the thread cannot be started.
  expected<std::unique_ptr<stream>> create_stream(step_kind kind) override;
  expected<std::unique_ptr<event>> create_event(bool timing = false) override;
  /// `e` must be a host event (from any host device): another event type is
  /// refused with errc::invalid_argument. `s` must be a stream of this device.
  /// On a dead device the record still completes the event (nothing waits forever).
  error record(event& e, stream& s) override;
  /// Host events are waited for by generation on the worker; any other event
  /// type (e.g. CUDA) by a blocking e.host_wait() on the worker. On an inline
  /// stream the wait blocks the calling thread. `s` must be a stream of this
  /// device. Never fails. A host event's wait holds until the event fires,
  /// also when this device dies or is reset meanwhile (only the stream's
  /// destruction ends it early): what `s` records after it never fires
  /// before the work `e` marks, which may still run on a live device.
  error wait(stream& s, const event& e) override;

  error launch(stream& s, const op_launch& l) override;
  error copy_h2d(stream& s, void* dst, const void* src, int64_t bytes) override;
  error copy_d2h(stream& s, void* dst, const void* src, int64_t bytes) override;
  /// One copy of blocks x block_bytes (timed as one, like a 2-D copy).
  error copy_d2h_blocks(stream& s, void* dst, int64_t dst_pitch, const void* src, int64_t block_bytes,
                        int64_t blocks) override;
  /// From a host device: memcpy. From any other backend: src_dev.download() on the worker.
  error copy_peer(stream& s, void* dst, device& src_dev, const void* src, int64_t bytes) override;
  /// Over host memory: one-shot (gpu/cpu/collective.hpp), or, on a device
  /// configured with ring_collectives and a plan that picked the ring, a
  /// ring whose parts meet on the members' communication streams
  /// (gpu/cpu/ring.hpp). Every member must be a host device (cpu or sim),
  /// else unsupported_op. A member that died before or while the part ran
  /// fails the part (device_failed naming that member, through notify); it
  /// never waits for it.
  error collective(stream& s, const collective_launch& c) override;
  /// The callback gets: device_failed once the device died; else the first
  /// asynchronous op error on `s` since the previous notify (op_failed); else
  /// ok. On an inline stream it runs in the calling thread, before notify returns.
  void notify(stream& s, std::function<void(const error&)> done) override;
  error synchronize(stream& s) override;

  void on_fault(std::function<void(const error&)> handler) override;
  bool alive() const noexcept override { return !dead_.load(std::memory_order_acquire); }

  /// Kills the device: launches and copies fail from now on, pending work
  /// completes without running (an op under way finishes what it computes,
  /// its modelled time is cut short), in stream order: a pending wait still
  /// holds until its event fires (wait()), so the events recorded behind it
  /// keep the order of the work around this device. The on_fault handler
  /// runs (once, in the calling thread). Later calls do nothing.
  void die(error why);
  /// Brings the device back (sim revival, or a quarantine lifted): work
  /// enqueued before the reset is abandoned (it does not run; a stalled op
  /// stops sleeping; a wait still holds until its event fires, as on a
  /// death), and each notify() enqueued before it reports
  /// errc::device_failed ("reset with this work pending"); streams, events
  /// and memory stay valid; a later death is reported to on_fault again.
  /// Any thread. Always succeeds on host devices.
  error reset() override;
  /// reset() count.
  uint64_t generation() const noexcept override { return epoch(); }
  /// Wall seconds per modelled second of this device's timing (time_scale).
  double time_scale() const noexcept override { return cfg_.timed ? cfg_.time_scale : 1.0; }
  /// Number of ops that ran (or were skipped by death) on this device's streams.
  int64_t ops_run() const noexcept { return ops_run_.load(std::memory_order_relaxed); }
  /// Timed devices (sim with delays): number of ops whose work began on a
  /// stream's worker (compute, then the modelled time). Tests use it to know
  /// an op is under way. Untimed devices do not count (0).
  int64_t ops_begun() const noexcept { return ops_begun_.load(std::memory_order_relaxed); }

 protected:
  /// Called in launch() (the driving thread of `s`) before the op is enqueued:
  /// may refuse it (injected fault) and sets its timing. Default: ok, no time.
  virtual error admit_op(host_stream& s, const op_launch& l, work_timing& t) { return {}; }
  /// Timing of a copy; `src` is the source device for peer copies. Default: none.
  virtual work_timing copy_timing(host_stream& s, copy_kind k, int64_t bytes, const device* src) { return {}; }
  /// Timing of a collective part (sim: the cost model's ring or one-shot
  /// time from the members' link figures). Default: none.
  virtual work_timing collective_timing(host_stream& s, const collective_launch& c) { return {}; }
  /// Called on the worker after each op ran (sim: die_after_ops).
  virtual void op_executed(int64_t count) {}
  /// Called by reset() once the device is alive again (sim: die_after_ops is spent).
  virtual void revived() {}

  const host_device_config& config() const noexcept { return cfg_; }
  host_stream& as_host(stream& s) const { return static_cast<host_stream&>(s); }
  error dead_error(const char* what) const;

 private:
  /// This member's place for `c` in its communicator's order
  /// (collective_sequence), when the check is on; else an empty ticket.
  collective_sequence::ticket checked_place(const collective_launch& c, const std::string& label) const;
  /// Occupies the stream (and its copy engine, if any; for a kernel, the
  /// device's compute throughput after its launch latency) for `t` from the
  /// task's ready time, then sleeps until the end. Returns the end time.
  int64_t occupy(task_context& ctx, host_stream& hs, const work_timing& t, int64_t kernel_end_ns, uint64_t ep,
                 bool kernel = false);
  /// Sleeps until `deadline_ns` or until the device dies, is reset (leaves
  /// epoch `ep`) or the stream is dropped.
  void sleep_until(int64_t deadline_ns, const host_stream& hs, uint64_t ep);
  /// The reset generation: work captures it at enqueue and is skipped once it changed.
  uint64_t epoch() const noexcept { return epoch_.load(std::memory_order_acquire); }
  /// Work enqueued in epoch `ep` must not run: the device died or was reset since.
  bool stale(uint64_t ep) const noexcept { return !alive() || ep != epoch(); }
  /// `bytes` in all; with blocks > 1 (d2h only) they land in `blocks` runs
  /// of bytes / blocks, dst_pitch apart.
  error enqueue_copy(stream& s, copy_kind k, void* dst, const void* src, int64_t bytes,
                     device* src_dev, int64_t blocks = 1, int64_t dst_pitch = 0);

  device_spec spec_;
  int index_;
  host_device_config cfg_;
  /// Process-unique: names this device in collective_sequence's communicators.
  const uint64_t instance_id_ = next_host_device_id();

  std::mutex mem_mutex_;
  std::unordered_map<void*, int64_t> allocations_;  // device memory -> bytes (as requested)
  std::unordered_map<void*, int64_t> host_allocations_;
  std::atomic<int64_t> in_use_{0};

  std::atomic<int> streams_created_{0};
  std::atomic<int> copy_streams_created_{0};
  struct engine_clock {
    std::mutex mutex;
    int64_t busy_until = 0;
  };
  std::vector<std::unique_ptr<engine_clock>> engines_;
  /// Kernels of all compute lanes: a launch starts when the previous launch
  /// (any lane) has ended, the throughput-bound part when the previous
  /// kernel's (any lane) has (work_timing::launch_seconds).
  engine_clock launch_clock_;
  engine_clock compute_clock_;

  std::atomic<bool> dead_{false};
  std::atomic<uint64_t> epoch_{0};  ///< reset() count (written under death_mutex_)
  mutable std::mutex death_mutex_;  // mutable: dead_error() reads death_error_ under it
  std::condition_variable death_cv_;
  std::function<void(const error&)> fault_handler_;
  error death_error_;
  bool fault_reported_ = false;
  std::atomic<int64_t> ops_run_{0};
  std::atomic<int64_t> ops_begun_{0};
};

}  // namespace ag::gpu::host
