#pragma once
// The event poller: one thread per CUDA device that turns GPU completion into
// host callbacks (notify()) and releases GPU-side waits on host backends'
// events. Only gpu/cuda/ includes it.
//
// Why a thread of our own: cudaLaunchHostFunc wakes its callback thread ~10x
// later than a thread spinning on cudaEventQuery (docs/ARCHITECTURE.md).

#include <cuda_runtime.h>

#if __has_include(<concurrentqueue/moodycamel/concurrentqueue.h>)
#include <concurrentqueue/moodycamel/concurrentqueue.h>
#else
#include <concurrentqueue/concurrentqueue.h>
#endif

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "gpu/cuda/fault_cell.hpp"
#include "gpu/device.hpp"
#include "graph/error.hpp"

namespace ag::gpu::cuda::detail {

struct core;

/// One piece of work for the poller thread.
struct poll_item {
  enum class kind : uint8_t { notify, foreign_wait } k = kind::notify;
  cudaEvent_t ev = nullptr;                     // notify: recorded after the stream's work
  std::shared_ptr<fault_cell> fault;            // notify: the stream's fault word
  std::function<void(const error&)> done;       // notify
  error early;                                  // notify: failed already at enqueue
  const event* foreign = nullptr;               // foreign_wait: a non-CUDA event
  unsigned int* slot = nullptr;                 // foreign_wait: host-mapped flag
  bool released = false;                        // foreign_wait: flag set to 1
};

/// A replayed graph handed to the poller thread to launch
/// (cuda_device::replay_and_notify): the thread launches it on `stream`,
/// records `then`'s event after it and polls that like any notification.
/// A launch that fails reaches `then.done` as its error.
struct launch_item {
  std::shared_ptr<core> owner;  // the device's core: keeps it alive, checks errors (a sticky one kills it)
  cudaGraphExec_t exec = nullptr;
  cudaStream_t stream = nullptr;
  poll_item then;  // kind::notify; its event is taken and recorded by the thread
};

/// The poller of one device. push() is thread-safe (a lock-free queue); the
/// thread owns the pending items and runs every `done` callback. The thread
/// holds the poller through a shared_ptr (start()), so the last device
/// reference may be dropped from inside a callback.
///
/// It also launches replayed graphs handed to it (push_launch): a graph
/// launch made by a CAF worker costs the host 3.6-4.4 us on an H200 against
/// 1.2-2.0 from a thread that launches again and again (the driver's code
/// and data stay in its core's caches; docs/BENCHMARKS.md, session 34). The
/// launches keep their hand-over order (one locked FIFO, not the lock-free
/// queue, whose order holds per producing thread only); a device call on a
/// stream first waits for the handed launches to be issued
/// (drain_launches), so a stream's work stays in the order its actor made it.
class poller {
 public:
  poller(int ordinal, std::string name) : ordinal_(ordinal), name_(std::move(name)) {}
  ~poller();

  void start(const std::shared_ptr<poller>& self);
  /// Stops the thread once pending work has drained. Safe on the poller thread.
  void stop();

  void push(poll_item it);

  /// Hands a graph launch to the thread (see the class comment).
  void push_launch(launch_item it);
  /// Returns once every launch handed over before this call was issued to
  /// its stream (at once on the poller thread itself, which issues them in
  /// order anyway).
  void drain_launches() const;
  /// True while the thread spins in its loop (recent work, no callback
  /// running): a hand-over is then issued within a microsecond. A sleeping
  /// thread is woken by a hand-over, and a callback may run for long, which
  /// the caller would rather not wait for (cuda_device launches itself then).
  bool awake() const noexcept { return awake_.load(std::memory_order_relaxed); }
  /// Launches issued by the thread so far (tests).
  uint64_t launches_issued() const noexcept { return launches_issued_.load(std::memory_order_acquire); }

  /// A notification event (timing disabled) from the pool; nullptr on failure.
  cudaEvent_t take_event();
  void give_event(cudaEvent_t e);

  /// Arms notification `it` on `s` of device `c`: an event from the pool,
  /// recorded after the work enqueued on `s` so far. On a failure `it.early`
  /// says why (and the event is back in the pool).
  void record_notification(core& c, poll_item& it, cudaStream_t s);

  /// A host-mapped flag word, zeroed; nullptr on failure.
  unsigned int* take_slot();

  /// Called once from the poller thread when an event query reports a sticky error.
  std::function<void(const error&)> on_death;
  std::atomic<bool> dead{false};
  error death;  // written once before `dead` is set

 private:
  void wake();
  // Returns true when the item is finished (and its callback ran).
  bool poll(poll_item& it);
  void declare_dead(error e);
  void finish(poll_item& it, const error& e);
  void run();
  /// Issues the launches handed over so far, in order; their notifications join `pending`.
  bool issue_launches(std::vector<poll_item>& pending);

  int ordinal_;
  std::string name_;
  moodycamel::ConcurrentQueue<poll_item> q_;
  std::atomic<uint32_t> seq_{0};
  std::atomic<bool> stop_{false};
  std::thread thread_;
  std::mutex mu_;
  std::vector<cudaEvent_t> free_events_;
  std::vector<unsigned int*> free_slots_;
  std::vector<unsigned int*> slab_;
  std::mutex launch_mu_;
  std::vector<launch_item> launches_;   // under launch_mu_
  std::vector<launch_item> issuing_;    // the thread's: swapped with launches_, keeps its capacity
  std::vector<poll_item> issued_in_callbacks_;  // the thread's: notifications of launches issued in finish()
  std::atomic<uint64_t> launches_handed_{0};
  std::atomic<uint64_t> launches_issued_{0};
  std::atomic<bool> awake_{false};
  std::atomic<std::thread::id> thread_id_{};
};

}  // namespace ag::gpu::cuda::detail
