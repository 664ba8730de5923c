#pragma once
// Fused attention for decode-sized queries (host launcher).
#include "gpu/cuda/kernel_args.hpp"

namespace ag::gpu::cuda {

/// out = softmax((q k^T [+ mask]) * scale, causal) v, one kernel: the chain
/// the lowering fuses (gpu::op_launch::fusion::attention). q and out are
/// [.., M, dh], k and v [.., keys, dh] with the same batch dims; mask (or
/// null) is [S, keys]. Query row r (flat over q's rows) is row r % S of the
/// softmax's [.., S, keys] view: the mask row it adds, and under `causal` it
/// sees keys j <= r % S + (keys - S); a row that sees none is zeros. One
/// block per query row: f32 scores in shared memory (keys <= 8192, dh <=
/// 256, checked), f32 accumulation; f32, f16 or bf16, all one dtype.
error launch_fused_attention(const launch_ctx& c, const kt& out, const kt& q, const kt& k, const kt& v,
                             const kt* mask, float scale, bool causal, int64_t softmax_rows);

}  // namespace ag::gpu::cuda
