#pragma once
// State shared by a CUDA device, its streams and its events. Only gpu/cuda/
// includes it.
//
// Ownership: a cuda_device holds a shared `core` (ordinal, event pool, poller,
// clock anchor, death state); its streams and events hold the core too, so
// they may outlive the device object. The poller thread owns its own state
// through a shared_ptr, so dropping the last device reference from inside a
// notify callback (on the poller thread) is safe.

#include <cuda_runtime.h>

#include <atomic>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "gpu/cuda/clock_anchor.hpp"
#include "gpu/cuda/event_poller.hpp"
#include "graph/error.hpp"

namespace ag::gpu::cuda::detail {

/// State shared by a device, its streams and its events.
struct core {
  core(int cuda_ordinal, std::string device_name)
      : ordinal(cuda_ordinal), name(std::move(device_name)), clock(cuda_ordinal, name) {}
  ~core();
  core(const core&) = delete;
  core& operator=(const core&) = delete;

  int ordinal = 0;
  int index = -1;  ///< the device's index in the runtime (error::device)
  std::string name;
  std::shared_ptr<poller> poll;
  std::atomic<bool> alive{true};
  std::mutex fault_mu;
  std::function<void(const error&)> fault_handler;
  bool fault_reported = false;
  error death;
  /// Host-mapped (portable) word that mark_dead sets to 1: in-stream
  /// collective parts of other devices waiting for this one read it
  /// (in_stream.cuh). Made on first use (dead_word_for_kernels), under fault_mu.
  unsigned int* dead_word = nullptr;
  /// The death word, made now if needed (1 already when dead); null when
  /// the host allocation failed.
  unsigned int* dead_word_for_kernels();

  // Event pool (timing disabled) for create_event().
  std::mutex pool_mu;
  std::vector<cudaEvent_t> pool;

  // Host-clock mapping of timing events (cuda_event::completion_ns).
  clock_anchor clock;

  error dead_error() const {
    return error(errc::device_failed, name + " is dead" + (death.message.empty() ? "" : ": " + death.message), index);
  }

  /// Marks the device dead once and reports it to the fault handler.
  void mark_dead(const error& e);

  /// Checks a CUDA result: sticky errors kill the device.
  error check(cudaError_t r, const std::string& where, const char* call, const char* file, int line);
};

}  // namespace ag::gpu::cuda::detail

namespace ag::gpu::cuda::detail {
/// AG_CORE_CHECK's body: `where` is a callable making the text, called only on
/// an error, so a successful call (every stream call on the hot path) builds
/// no string.
template <class Where>
inline error core_check_lazy(core& c, cudaError_t r, Where&& where, const char* call, const char* file, int line) {
  if (r == cudaSuccess) return {};
  return c.check(r, where(), call, file, line);
}
}  // namespace ag::gpu::cuda::detail

/// Checks `call` against the device core `core_`: an error naming `where`,
/// the call and file:line; a sticky error marks the device dead. `where` is
/// evaluated only when the call failed.
#define AG_CORE_CHECK(core_, call, where)                                                              \
  ::ag::gpu::cuda::detail::core_check_lazy((core_), (call), [&]() -> std::string { return (where); }, \
                                           #call, __FILE__, __LINE__)
