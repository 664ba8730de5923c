#pragma once
// Rotary position embedding (host launcher).
#include "gpu/cuda/kernel_args.hpp"

namespace ag::gpu::cuda {

/// x [.., S, H, D] (strided), pos i32 [S]. Pair k in [0, D/2) rotates by
/// pos * theta^(-2k/D): neox pairs (k, k + D/2), interleaved pairs (2k, 2k+1);
/// (a, b) -> (a cos - b sin, a sin + b cos). The angle is computed in f64 so
/// long positions keep f32 accuracy.
error launch_rope(const launch_ctx& c, const kt& out, const kt& x, const kt& pos, float theta, bool neox);

}  // namespace ag::gpu::cuda
