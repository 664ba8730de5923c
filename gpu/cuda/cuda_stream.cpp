// A CUDA stream (cuda_stream.hpp): creation, cuBLAS handle, teardown.

#include "gpu/cuda/cuda_stream.hpp"

#include <cstdio>

#include "gpu/cuda/cuda_check.cuh"
#include "gpu/cuda/decode_step.cuh"
#include "gpu/cuda/device_guard.hpp"
#include "gpu/cuda/gemm.cuh"

namespace ag::gpu::cuda::detail {

cuda_stream::~cuda_stream() {
  if (core_->poll) core_->poll->drain_launches();  // a launch handed to the poller still names s_
  device_guard g(core_->ordinal);
  if (blas_) {
    if (cublasDestroy(blas_) != CUBLAS_STATUS_SUCCESS)
      std::fprintf(stderr, "actorgraph cuda: cublasDestroy failed on %s\n", core_->name.c_str());
  }
  // cudaStreamDestroy returns at once; cuBLAS work may still use the
  // workspace, so drain the stream before freeing it.
  if (s_ && (workspace_ || attention_ws_ || decode_step_ws_ || in_stream_tag_) && core_->alive.load())
    AG_CUDA_ASSERT(cudaStreamSynchronize(s_));
  if (s_) AG_CUDA_ASSERT(cudaStreamDestroy(s_));
  for (int i = 0; i < side_streams; ++i) {
    if (side_[i]) AG_CUDA_ASSERT(cudaStreamDestroy(side_[i]));
    if (join_[i]) AG_CUDA_ASSERT(cudaEventDestroy(join_[i]));
  }
  if (fork_) AG_CUDA_ASSERT(cudaEventDestroy(fork_));
  if (workspace_) AG_CUDA_ASSERT(cudaFree(workspace_));
  if (attention_ws_) AG_CUDA_ASSERT(cudaFree(attention_ws_));
  if (decode_step_ws_) AG_CUDA_ASSERT(cudaFree(decode_step_ws_));
  if (in_stream_tag_) AG_CUDA_ASSERT(cudaFree(in_stream_tag_));
}

error cuda_stream::init() {
  device_guard g(core_->ordinal);
  // One priority for all roles: the driver picks copy engines by direction.
  AG_CUDA_TRY(cudaStreamCreateWithFlags(&s_, cudaStreamNonBlocking), core_->name + " create_stream");
  fault_ = std::make_shared<fault_cell>();
  void* p = nullptr;
  AG_CUDA_TRY(cudaHostAlloc(&p, sizeof(unsigned int), cudaHostAllocMapped | cudaHostAllocPortable),
              core_->name + " create_stream");
  fault_->host = static_cast<unsigned int*>(p);
  *fault_->host = 0;
  void* d = nullptr;
  AG_CUDA_TRY(cudaHostGetDevicePointer(&d, p, 0), core_->name + " create_stream");
  fault_->dev = static_cast<unsigned int*>(d);
  if (role_ == step_kind::collective) {
    bool made = cudaEventCreateWithFlags(&fork_, cudaEventDisableTiming) == cudaSuccess;
    for (int i = 0; made && i < side_streams; ++i)
      made = cudaStreamCreateWithFlags(&side_[i], cudaStreamNonBlocking) == cudaSuccess &&
             cudaEventCreateWithFlags(&join_[i], cudaEventDisableTiming) == cudaSuccess;
    if (!made) {  // optional: the pulls then run one after another
      (void)cudaGetLastError();
      for (int i = 0; i < side_streams; ++i) {
        if (side_[i]) (void)cudaStreamDestroy(side_[i]);
        if (join_[i]) (void)cudaEventDestroy(join_[i]);
        side_[i] = nullptr;
        join_[i] = nullptr;
      }
      if (fork_) (void)cudaEventDestroy(fork_);
      fork_ = nullptr;
    }
  }
  if (role_ == step_kind::compute) {
    // One allocation: the partials, then the counters (zeroed once; the
    // kernel leaves them zero). Optional: without it attention runs unsplit.
    const std::size_t bytes = static_cast<std::size_t>(attention_workspace_floats) * sizeof(float) +
                              static_cast<std::size_t>(attention_counters) * sizeof(unsigned);
    void* ws = nullptr;
    if (cudaMalloc(&ws, bytes) == cudaSuccess) {
      // On this stream, whose kernels use it: a memset on the default stream
      // would not be ordered before them (the stream is non-blocking).
      AG_CUDA_TRY(cudaMemsetAsync(ws, 0, bytes, s_), core_->name + " create_stream (attention workspace)");
      attention_ws_ = static_cast<float*>(ws);
      attention_counters_ = reinterpret_cast<unsigned*>(attention_ws_ + attention_workspace_floats);
    } else {
      (void)cudaGetLastError();
    }
    // The decode-step kernel's workspace (decode_step.cuh): zeroed once, the
    // kernel leaves its counters zero. Optional: without it a fused decode
    // step fails with an error saying so.
    void* step_ws = nullptr;
    if (cudaMalloc(&step_ws, decode_step_workspace_bytes()) == cudaSuccess) {
      AG_CUDA_TRY(cudaMemsetAsync(step_ws, 0, decode_step_workspace_bytes(), s_),
                  core_->name + " create_stream (decode-step workspace)");
      decode_step_ws_ = step_ws;
    } else {
      (void)cudaGetLastError();
    }
    void* tag = nullptr;
    if (cudaMalloc(&tag, sizeof(unsigned long long)) == cudaSuccess) {
      AG_CUDA_TRY(cudaMemsetAsync(tag, 0, sizeof(unsigned long long), s_),
                  core_->name + " create_stream (in-stream tag)");
      in_stream_tag_ = static_cast<unsigned long long*>(tag);
    } else {
      (void)cudaGetLastError();
    }
    // The cuBLAS handle and its workspace now, not on the stream's first
    // matmul: their allocations synchronise the device, which must not
    // happen while a kernel of another stream spins waiting for this
    // stream's work (in-stream collectives, in_stream.cuh).
    if (auto h = blas(false); !h) return h.err();
  }
  return {};
}

expected<cublasHandle_t> cuda_stream::blas(bool tf32) {
  if (!blas_) {
    if (cublasStatus_t st = cublasCreate(&blas_); st != CUBLAS_STATUS_SUCCESS) {
      blas_ = nullptr;
      return error(errc::device_failed, core_->name + ": cublasCreate failed: " + cublas_status_name(st));
    }
    cublasSetStream(blas_, s_);
    constexpr size_t ws = 32u << 20;
    if (cudaMalloc(&workspace_, ws) == cudaSuccess) cublasSetWorkspace(blas_, workspace_, ws);
    else (void)cudaGetLastError(), workspace_ = nullptr;
    cublasSetMathMode(blas_, CUBLAS_DEFAULT_MATH);
  }
  (void)tf32;  // the compute type of each call selects TF32 (gemm.cu)
  return blas_;
}

}  // namespace ag::gpu::cuda::detail
