#pragma once
// Fused attention for decode-sized queries (host launcher).
#include "gpu/cuda/kernel_args.hpp"
#include "graph/rope_frequencies.hpp"

namespace ag::gpu::cuda {

/// out = softmax((q k^T [+ mask]) * scale, causal) v, one kernel: the chain
/// the lowering fuses (gpu::op_launch::fusion::attention). q and out are
/// [.., M, dh], k and v [.., keys, dh] with the same batch dims; mask (or
/// null) is [S, keys]. Query row r (flat over q's rows) is row r % S of the
/// softmax's [.., S, keys] view: the mask row it adds, and under `causal` it
/// sees keys j <= r % S + (keys - S); a row that sees none is zeros. One
/// block per query row: f32 scores in shared memory (keys <= 8192, dh <=
/// 256, checked), f32 accumulation; f32, f16 or bf16, all one dtype.
/// A KV cache's prologue taken into the kernel (graph/fusion.hpp,
/// gpu::op_launch::attention_params): the S new rows k_new / v_new [.., S,
/// dh] (views with k's batch dims) are stored into k and v (the caches) at
/// rows cache_positions[i] (i32 [S]; -1 or out of range: not stored) and
/// read from there; with rope_q / rope_k, q's rows and the new keys are
/// first rotated (neox, theta, scaling) by rope_positions (i32 [S]) of their softmax
/// row, rounded to the dtype. Needs the split kernel (head dims 32, 64, 128
/// or 256, 16-byte cache rows, the stream's workspace): else an
/// errc::internal error, launching nothing.
/// rows_apart (op_attrs::rows_apart: each softmax row sees keys that no
/// other row does, a batched decode step's sequences): with a mask, no
/// causal flag and one batch entry, the split kernel runs a block group per
/// (kv head, softmax row) over that row's keys; a row that saw another's
/// new row would read it from the cache before it is stored.
struct attention_prologue {
  kt k_new, v_new, cache_positions, rope_positions;
  bool rope_q = false, rope_k = false;
  float theta = 10000.0f;
  rope_scaling scaling{};  ///< graph/rope_frequencies.hpp
};
error launch_fused_attention(const launch_ctx& c, const kt& out, const kt& q, const kt& k, const kt& v,
                             const kt* mask, float scale, bool causal, int64_t softmax_rows,
                             const attention_prologue* prologue = nullptr, bool rows_apart = false);

}  // namespace ag::gpu::cuda
