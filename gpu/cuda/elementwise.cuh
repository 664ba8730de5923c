#pragma once
// Elementwise ops and strided copies (host launchers).
#include "gpu/byte_copy.hpp"
#include "gpu/cuda/kernel_args.hpp"

namespace ag::gpu::cuda {

enum class ew_op : int { add = 0, mul = 1, scale = 2, gelu_tanh = 3, gelu_erf = 4, silu = 5, copy = 6 };

/// out = op(a[, b]) elementwise over out's dims; a and b are read through their
/// strides, size-1 dims (and missing outer dims) of b broadcast. `scale` is the
/// factor of ew_op::scale. Any float dtype for each tensor; math in f32.
/// When out, a (and b) share one dtype and are 16-byte aligned, a is
/// contiguous with out's shape and b is absent or contiguous with out's shape
/// (f16 / bf16 only; f32 takes a scalar contiguous kernel) or one vector over a
/// last dim that is a multiple of 8 (any float dtype), the kernel moves 8
/// elements per access (16-byte loads / stores).
error launch_elementwise(const launch_ctx& c, ew_op op, const kt& out, const kt& a, const kt* b, float scale);

/// dst[idx] = src[idx] over src's dims, both strided (dst strides may place it
/// inside a bigger tensor: concat). Casts between dtypes; same-dtype copies are
/// bit-exact (also for i32).
error launch_strided_copy(const launch_ctx& c, const kt& dst, const kt& src);

/// The most copies one launch_byte_copies kernel takes.
inline constexpr int max_batched_copies = 8;

/// `count` (1 .. max_batched_copies) copies, pairwise independent
/// (gpu::copies_independent), by one kernel: a row of blocks per copy, 16
/// bytes a thread where both of its pointers are 16-byte aligned; either
/// side in device memory or in pinned host memory the GPU reads and writes
/// directly (unified addressing). A replayed segment's host copies become
/// such kernels, consecutive independent ones sharing one
/// (cuda_device::capture_segment): a decode step's inputs in one kernel.
error launch_byte_copies(const launch_ctx& c, const gpu::byte_copy* copies, int count);

}  // namespace ag::gpu::cuda
