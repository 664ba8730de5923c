#pragma once
// Rotary position embedding (host launcher).
#include "gpu/cuda/kernel_args.hpp"
#include "graph/rope_frequencies.hpp"

namespace ag::gpu::cuda {

/// x [.., S, H, D] (strided), pos i32 [S]. Pair k in [0, D/2) rotates by
/// pos * f_k (theta, `scaling`: graph/rope_frequencies.hpp): neox pairs (k, k + D/2), interleaved pairs (2k, 2k+1);
/// (a, b) -> (a cos - b sin, a sin + b cos). The angle is computed in f64 so
/// long positions keep f32 accuracy.
error launch_rope(const launch_ctx& c, const kt& out, const kt& x, const kt& pos, float theta,
                  const rope_scaling& scaling, bool neox);

/// inv[k] = f_k for k < D/2, in f64 (graph/rope_frequencies.hpp): the
/// frequencies the rope kernels rotate pair k by (the fused attention's,
/// the projection groups' and the decode step's too).
void rope_inverse_frequencies(float theta, const rope_scaling& scaling, int64_t D, double* inv);

}  // namespace ag::gpu::cuda
