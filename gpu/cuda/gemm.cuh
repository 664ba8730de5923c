#pragma once
// Matmul through cuBLAS (host launcher).
#include <cublas_v2.h>

#include "gpu/cuda/kernel_args.hpp"

namespace ag::gpu::cuda {

/// out [.., M, N] = op(a) [.., M, K] x op(b) [.., K, N] (row-major, as the
/// graph defines it) through cublasGemmStridedBatchedEx on cuBLAS's column-major
/// view: C^T = op(B)^T op(A)^T. Batch dims broadcast (a 2-D b is shared by every
/// batch: batch stride 0). Strided inputs are used in place when each matrix
/// has one unit stride (a transposed view flips the op); others are first
/// copied to a contiguous scratch buffer (stream-ordered cudaMallocAsync).
/// a and b must share a dtype; out has that dtype or f32. f16/bf16 accumulate
/// in f32; f32 uses TF32 tensor cores only when `tf32`.
error launch_matmul(const launch_ctx& c, cublasHandle_t h, const tensor_arg& out, const tensor_arg& a,
                    const tensor_arg& b, bool trans_a, bool trans_b, bool tf32);

const char* cublas_status_name(cublasStatus_t s) noexcept;

}  // namespace ag::gpu::cuda
