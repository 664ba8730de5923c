#pragma once
// Flash attention for long query runs (host launcher): a prefill's, or a
// training-shaped layer's attention without its [.., S, keys] scores.
#include "gpu/cuda/kernel_args.hpp"

namespace ag::gpu::cuda {

/// out = softmax((q k^T [+ mask]) * scale, causal) v in one kernel that never
/// writes the scores: per block 64 query rows of one batch entry, tiles of
/// 64 keys and values through shared memory, scores and the running
/// softmax (row max and sum, f32) in registers, tensor-core products (bf16
/// or f16 in, f32 accumulation) and the probabilities rounded to the dtype
/// for the second product. Shapes and the row convention are
/// launch_fused_attention's (attention.cuh): q and out [.., M, dh], k and v
/// [.., keys, dh], mask [S, keys] or null, query row r is softmax row r % S;
/// under `causal` row i sees keys j <= i + (keys - S), and key tiles past a
/// block's last visible key are skipped. A row that sees no key is zeros.
/// Under a mask (not causal) over 256 keys or more, a first kernel finds
/// each mask row's first and last key above attention_hidden_limit
/// (graph/attention_mask.hpp) into the stream's attention workspace, and a
/// block computes only the keys from the first its rows see to the last
/// (every key when one of its rows hides all): a prefill chunk over a long
/// KV cache computes the positions its sequence holds, not the cache.
/// Needs f16 or bf16 and dh 64 or 128 (flash_attention_fits); any strides
/// (16-byte rows load as vectors, others element by element).
bool flash_attention_fits(int dtype_code, int64_t dh);
error launch_flash_attention(const launch_ctx& c, const kt& out, const kt& q, const kt& k, const kt& v,
                             const kt* mask, float scale, bool causal, int64_t softmax_rows);

}  // namespace ag::gpu::cuda
