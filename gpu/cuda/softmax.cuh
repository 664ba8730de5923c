#pragma once
// Softmax over the last dim with pre-scale and causal mask (host launcher).
#include "gpu/cuda/kernel_args.hpp"

namespace ag::gpu::cuda {

/// out = softmax(x * scale) over the last dim. causal: element (i, j) of the
/// last two dims [Sq, Sk] is masked (output 0) when j > i + (Sk - Sq); a row
/// with every element masked is all zeros. One block per row, online max/sum
/// (two reads, one write), f32 accumulation; any row length.
error launch_softmax(const launch_ctx& c, const kt& out, const kt& x, float scale, bool causal);

}  // namespace ag::gpu::cuda
