#pragma once
// Scoped current-device switch for the CUDA backend's host code. Only
// gpu/cuda/ includes it.

#include <cuda_runtime.h>

#include "gpu/cuda/cuda_check.cuh"

namespace ag::gpu::cuda::detail {

/// Sets the calling thread's current device for its scope and restores it.
/// Every backend method that makes CUDA calls takes one, because the caller
/// (an actor on any scheduler thread) may have another device current.
class device_guard {
 public:
  explicit device_guard(int ordinal) noexcept {
    if (cudaGetDevice(&prev_) != cudaSuccess) {
      (void)cudaGetLastError();
      prev_ = -1;
    }
    if (prev_ != ordinal) {
      if (cudaSetDevice(ordinal) == cudaSuccess) changed_ = true;
      else (void)cudaGetLastError();
    }
  }
  ~device_guard() {
    if (changed_ && prev_ >= 0) AG_CUDA_LOG(cudaSetDevice(prev_));
  }
  device_guard(const device_guard&) = delete;
  device_guard& operator=(const device_guard&) = delete;

 private:
  int prev_ = -1;
  bool changed_ = false;
};

}  // namespace ag::gpu::cuda::detail
