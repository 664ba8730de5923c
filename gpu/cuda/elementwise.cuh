#pragma once
// Elementwise ops and strided copies (host launchers).
#include "gpu/cuda/kernel_args.hpp"

namespace ag::gpu::cuda {

enum class ew_op : int { add = 0, mul = 1, scale = 2, gelu_tanh = 3, gelu_erf = 4, silu = 5, copy = 6 };

/// out = op(a[, b]) elementwise over out's dims; a and b are read through their
/// strides, size-1 dims (and missing outer dims) of b broadcast. `scale` is the
/// factor of ew_op::scale. Any float dtype for each tensor; math in f32.
error launch_elementwise(const launch_ctx& c, ew_op op, const kt& out, const kt& a, const kt* b, float scale);

/// dst[idx] = src[idx] over src's dims, both strided (dst strides may place it
/// inside a bigger tensor: concat). Casts between dtypes; same-dtype copies are
/// bit-exact (also for i32).
error launch_strided_copy(const launch_ctx& c, const kt& dst, const kt& src);

}  // namespace ag::gpu::cuda
