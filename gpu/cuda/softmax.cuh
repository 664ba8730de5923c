#pragma once
// Softmax over the last dim with pre-scale and causal mask (host launcher).
#include "gpu/cuda/kernel_args.hpp"

namespace ag::gpu::cuda {

/// out = softmax(x * scale) over the last dim. causal: element (i, j) of the
/// last two dims [Sq, Sk] is masked (output 0) when j > i + (Sk - Sq); a row
/// with every element masked is all zeros. f32 accumulation; any row length.
/// Paths (out of x's dtype): contiguous 16-byte aligned rows of a multiple of
/// 8 up to 32768 elements stay in registers (one read, one write; masked
/// chunks are not read); few rows of >= 16384 elements, or longer aligned
/// rows, are split over several blocks per row (per-segment max / sum in a
/// stream-ordered scratch buffer, then a second pass writes; two reads, one
/// write); everything else one block per row with an online max / sum.
error launch_softmax(const launch_ctx& c, const kt& out, const kt& x, float scale, bool causal);

}  // namespace ag::gpu::cuda
