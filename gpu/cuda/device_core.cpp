// The shared device state (device_core.hpp): teardown and death.

#include "gpu/cuda/device_core.hpp"
#include "gpu/cuda/nccl_group.hpp"

#include "gpu/cuda/cuda_check.cuh"
#include "gpu/cuda/device_guard.hpp"

namespace ag::gpu::cuda::detail {

core::~core() {
  if (poll) poll->stop();
  device_guard g(ordinal);
  for (cudaEvent_t e : pool) AG_CUDA_ASSERT(cudaEventDestroy(e));
  if (dead_word) AG_CUDA_ASSERT(cudaFreeHost(dead_word));
  // `clock` (a member) destroys its anchor events and stream after this body.
}

unsigned int* core::dead_word_for_kernels() {
  std::lock_guard<std::mutex> lk(fault_mu);
  if (!dead_word) {
    void* p = nullptr;
    if (cudaHostAlloc(&p, sizeof(unsigned int), cudaHostAllocMapped | cudaHostAllocPortable) != cudaSuccess) {
      (void)cudaGetLastError();
      return nullptr;
    }
    dead_word = static_cast<unsigned int*>(p);
    __atomic_store_n(dead_word, fault_reported ? 1u : 0u, __ATOMIC_RELEASE);
  }
  return dead_word;
}

void core::mark_dead(const error& e) {
  std::function<void(const error&)> h;
  {
    std::lock_guard<std::mutex> lk(fault_mu);
    if (fault_reported) return;
    fault_reported = true;
    death = e;
    death.device = index;  // the message names the device ("cudaN ...")
    alive.store(false, std::memory_order_release);
    if (dead_word) __atomic_store_n(dead_word, 1u, __ATOMIC_RELEASE);  // peers' in-stream parts stop waiting
    h = fault_handler;
  }
  // Other members' NCCL parts would wait for this GPU forever: abort the
  // communicators it belongs to (nothing without NCCL).
  abort_nccl_groups_of(ordinal, e.message);
  if (h) h(death);
}

error core::check(cudaError_t r, const std::string& where, const char* call, const char* file, int line) {
  if (r == cudaSuccess) return {};
  error e = cuda_error(r, where, call, file, line);
  if (is_sticky(r)) mark_dead(e);
  return e;
}

}  // namespace ag::gpu::cuda::detail
