#pragma once
// rms_norm and layer_norm over the last dim (host launchers).
#include "gpu/cuda/kernel_args.hpp"

namespace ag::gpu::cuda {

/// y = x / sqrt(mean(x^2) + eps) [* w]; one block per row, f32 accumulation.
/// x strided; w (optional, [D]) any float dtype; out contiguous.
error launch_rms_norm(const launch_ctx& c, const kt& out, const kt& x, const kt* w, float eps);
/// y = (x - mean) / sqrt(var + eps) [* w] [+ b]; two-pass mean / variance.
error launch_layer_norm(const launch_ctx& c, const kt& out, const kt& x, const kt* w, const kt* b, float eps);

}  // namespace ag::gpu::cuda
