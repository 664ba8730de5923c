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

/// The poller of one device. push() is thread-safe (a lock-free queue); the
/// thread owns the pending items and runs every `done` callback. The thread
/// holds the poller through a shared_ptr (start()), so the last device
/// reference may be dropped from inside a callback.
class poller {
 public:
  poller(int ordinal, std::string name) : ordinal_(ordinal), name_(std::move(name)) {}
  ~poller();

  void start(const std::shared_ptr<poller>& self);
  /// Stops the thread once pending work has drained. Safe on the poller thread.
  void stop();

  void push(poll_item it);

  /// A notification event (timing disabled) from the pool; nullptr on failure.
  cudaEvent_t take_event();
  void give_event(cudaEvent_t e);

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
};

}  // namespace ag::gpu::cuda::detail
