// A CUDA event (cuda_event.hpp): queries, host waits, host-clock times.

#include "gpu/cuda/cuda_event.hpp"

#include <mutex>
#include <thread>

#include "gpu/cuda/cuda_check.cuh"
#include "gpu/cuda/device_guard.hpp"

namespace ag::gpu::cuda::detail {

cuda_event::~cuda_event() {
  if (!ev_) return;
  if (timing_) {
    device_guard g(core_->ordinal);
    AG_CUDA_ASSERT(cudaEventDestroy(ev_));
  } else {
    std::lock_guard<std::mutex> lk(core_->pool_mu);
    core_->pool.push_back(ev_);
  }
}

bool cuda_event::query() const {
  if (!recorded_.load(std::memory_order_acquire) || !core_->alive.load(std::memory_order_acquire)) return true;
  const cudaError_t r = cudaEventQuery(ev_);
  if (r == cudaSuccess) return true;
  if (r == cudaErrorNotReady) return false;
  (void)cudaGetLastError();
  if (is_sticky(r)) core_->mark_dead(cuda_error(r, core_->name, "cudaEventQuery", __FILE__, __LINE__));
  return true;  // a failed event never completes otherwise: nothing may wait forever
}

void cuda_event::host_wait() const {
  if (!recorded_.load(std::memory_order_acquire)) return;
  // Poll rather than cudaEventSynchronize so a dying device cannot hang us.
  while (!query()) std::this_thread::yield();
}

int64_t cuda_event::completion_ns() const {
  if (!timing_ || !recorded_.load(std::memory_order_acquire)) return 0;
  return core_->clock.host_ns(ev_);
}

}  // namespace ag::gpu::cuda::detail
