#pragma once
// Index of the first maximum along the last dim (host launcher).
#include "gpu/cuda/kernel_args.hpp"

namespace ag::gpu::cuda {

/// out (i32, [.., 1]) = the index of the first maximum of each row of x
/// ([.., N], f32 / f16 / bf16); NaNs never win, a row of NaNs gives 0 (the
/// reference's and the CPU backend's rule). One block per row: a decode
/// step's greedy token over its logits.
error launch_argmax(const launch_ctx& c, const kt& out, const kt& x);

}  // namespace ag::gpu::cuda
