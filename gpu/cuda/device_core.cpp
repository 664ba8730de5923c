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
  // `clock` (a member) destroys its anchor events and stream after this body.
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
