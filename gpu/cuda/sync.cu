#include "gpu/cuda/common.cuh"
#include "gpu/cuda/cuda_check.cuh"
#include "gpu/cuda/sync.cuh"

namespace ag::gpu::cuda {

AG_CUDA_MODULE_ANCHOR()
namespace {

__global__ void wait_flag_kernel(volatile unsigned int* flag) {
  while (*flag == 0u) __nanosleep(500);
  *flag = 2u;
  __threadfence_system();
}

__global__ void write_value_kernel(volatile unsigned int* dst, unsigned int value) {
  *dst = value;
  __threadfence_system();
}

__global__ void trap_kernel() { __trap(); }

}  // namespace

error launch_wait_flag(cudaStream_t stream, unsigned int* flag, const std::string& where) {
  wait_flag_kernel<<<1, 1, 0, stream>>>(flag);
  AG_CUDA_TRY_LAUNCH(where);
  return {};
}

error launch_write_value(cudaStream_t stream, unsigned int* dst, unsigned int value, const std::string& where) {
  write_value_kernel<<<1, 1, 0, stream>>>(dst, value);
  AG_CUDA_TRY_LAUNCH(where);
  return {};
}

error launch_trap(cudaStream_t stream, const std::string& where) {
  trap_kernel<<<1, 1, 0, stream>>>();
  AG_CUDA_TRY_LAUNCH(where);
  return {};
}

}  // namespace ag::gpu::cuda
