#pragma once
// rms_norm and layer_norm over the last dim (host launchers).
#include "gpu/cuda/kernel_args.hpp"

namespace ag::gpu::cuda {

/// y = x / sqrt(mean(x^2) + eps) [* w]; f32 accumulation. x strided; w
/// (optional, [D]) any float dtype; out contiguous. Rows that are contiguous,
/// 16-byte aligned, a multiple of 8 and at most 32768 long, with out of x's
/// dtype, take a register-resident kernel (16-byte loads, one read of x, a
/// warp per row up to 1024 elements, else a block per row); the rest one block
/// per row through the strides.
error launch_rms_norm(const launch_ctx& c, const kt& out, const kt& x, const kt* w, float eps);
/// y = (x - mean) / sqrt(var + eps) [* w] [+ b]; two-pass mean / variance
/// (over registers on the fast path above, so x is still read once).
error launch_layer_norm(const launch_ctx& c, const kt& out, const kt& x, const kt* w, const kt* b, float eps);

}  // namespace ag::gpu::cuda
