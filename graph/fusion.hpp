#pragma once
/// \file fusion.hpp
/// Chains of a plan's ops that a backend runs as one kernel
/// (plan_options::fuse_ops). The planner finds them (ag::compile) and keeps
/// them in the plan, so that the memory plan keeps the chain's inputs until
/// the kernel that reads them runs (it reads them at the chain's last op);
/// the runtime's lowering (actors/launch_program.cpp) turns each into one
/// launch record (gpu::op_launch::fusion). Pure functions; no threads.

#include <algorithm>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "graph/cost_model.hpp"
#include "graph/graph.hpp"

namespace ag {

struct step;
using step_id = int32_t;

/// Attention of decode-sized queries: scores = matmul(q, k^T) [-> add(scores,
/// mask)] -> softmax(.. * scale, causal) -> out = matmul(probs, v), reshapes
/// between them allowed, every intermediate read only by the next op and no
/// graph output; consecutive compute ops of one step on a CUDA device (on a
/// cpu device: see find_attention_fusions); q
/// [.., M, dh], k and v [.., keys, dh] with equal batch dims, one float dtype;
/// within the decode kernels' limits (M <= 16, keys <= 8192, M x keys <=
/// 32768, dh <= 256; gpu/cuda/attention.cuh), or, for longer query runs (a
/// prefill, a training-shaped layer: M > 16), the flash kernel's
/// (fused_flash_attention_fits: f16 or bf16, dh 64 or 128, any keys, at
/// most fused_flash_max_batch batch entries;
/// gpu/cuda/flash_attention.cuh), which never writes the scores. The kernel
/// reads q, k and the mask at `out`'s place in the step.
///
/// The chain may take in a KV cache's prologue, the compute ops right before
/// it in the step (any order): `k_store` and `v_store`, the store_rows ops
/// whose outputs (the caches [.., keys, dh]) are k and v, storing the same
/// positions (i32 [S]) along the keys; then optionally `k_rope`, the neox
/// rope whose output (through views) is k_store's rows, and `q_rope`, the
/// neox rope whose output (through views) is q, both by one positions input
/// and theta; each read by nothing else. The kernel then rotates q's and the
/// new keys' rows itself (rounding as the rope would), stores the new rows
/// into the caches and uses them in place of the caches' rows at those
/// positions. Only where the head dim is 32, 64, 128 or 256 (the split
/// kernel, gpu/cuda/attention.cu) and S <= 16.
struct attention_fusion {
  step_id step = -1;
  node_id scores = no_node;   ///< matmul(q, k^T): its inputs are q and k
  node_id mask_add = no_node; ///< add(scores, mask), or no_node
  node_id softmax = no_node;
  node_id out = no_node;      ///< matmul(probs, v): its input 1 is v
  node_id k_store = no_node;  ///< the prologue (above), or no_node
  node_id v_store = no_node;
  node_id k_rope = no_node;
  node_id q_rope = no_node;
  /// The prologue's ops (those set), then the chain's, in no particular order.
  std::vector<node_id> ops() const;
  /// The nodes the kernel reads from outside the chain: q (q_rope's input
  /// when it is fused), k and v (the caches), the mask, and with a prologue
  /// the new rows, their positions and the rope positions.
  std::vector<node_id> inputs(const graph& g) const;
  /// How many prologue ops the chain took in (0 to 4).
  int prologue_ops() const noexcept {
    return (k_store != no_node) + (v_store != no_node) + (k_rope != no_node) + (q_rope != no_node);
  }
};
/// The most batch entries (the product of q's leading dims) the flash
/// kernel takes: they are its grid's y, which CUDA bounds at 65535.
inline constexpr int64_t fused_flash_max_batch = 65535;

/// Whether a chain of more than fused_attention_max_rows query rows fuses
/// (the flash kernel: f16 or bf16, head dim 64 or 128, at most
/// fused_flash_max_batch batch entries; more keep their four kernels). Such
/// a chain takes no cache prologue.
inline bool fused_flash_attention_fits(dtype t, int64_t dh, int64_t batch_entries) noexcept {
  return (t == dtype::bf16 || t == dtype::f16) && (dh == 64 || dh == 128) && batch_entries >= 1 &&
         batch_entries <= fused_flash_max_batch;
}

/// The most query positions (S) a fused prologue takes.
inline constexpr int64_t fused_attention_max_new_rows = 16;

/// The kernel's limits (gpu/cuda/attention.cu checks them again).
inline constexpr int64_t fused_attention_max_rows = 16;
inline constexpr int64_t fused_attention_max_keys = 8192;
inline constexpr int64_t fused_attention_max_scores = 32768;
inline constexpr int64_t fused_attention_max_head = 256;
/// Whether a chain over a KV cache (k and v store_rows nodes: state, aligned
/// and contiguous rows) fuses with more keys than fused_attention_max_keys
/// (or scores than fused_attention_max_scores): the split kernel takes any
/// number (a block a share of the keys, in rounds of 32; its memory does not
/// grow with them), for these head dims. The kernel that holds a row's
/// scores in shared memory keeps the limits.
inline bool fused_attention_any_keys(int64_t dh) noexcept { return dh == 32 || dh == 64 || dh == 128 || dh == 256; }

/// A chain over a KV cache (as fused_attention_any_keys) of at most
/// fused_attention_max_rows softmax rows S but more query rows M (S rows of
/// several query heads a kv head: a batched decode step's rows, one
/// sequence each, generator_options::decode_batch) fuses into the split
/// kernel up to this many query rows, not into the flash kernel, whose grid
/// has one block per 64 query rows and kv head (8 blocks for LLaMA-1B's 8
/// rows of 4 heads a kv head) and reads every key a block's rows see.
inline constexpr int64_t fused_attention_split_max_rows = 64;
inline bool fused_attention_split_rows_fit(int64_t M, int64_t S, int64_t dh) noexcept {
  return fused_attention_any_keys(dh) && M <= fused_attention_split_max_rows && S >= 1 &&
         S <= fused_attention_max_rows && M % S == 0;
}

/// On cpu devices a decode-sized chain (at most fused_attention_max_rows
/// query rows) fuses only over a KV cache of this many rows or more, with a
/// mask: the fused kernel then reads only the rows up to the last its mask
/// shows (a sequence of 512 tokens in a cache of 16,384 reads 512), where
/// the separate ops' few-row products read the whole cache.
inline constexpr int64_t cpu_fused_cache_min_keys = 1024;

/// When `qk` is the scores product of an attention chain as above (q k^T
/// -> [add a mask] -> softmax -> times v, each op the only reader of the
/// one before, through views): the chain's operands after q and k (the
/// mask, if any, then v); empty otherwise. The step builder makes the
/// scores' split wait for them from its start, so that the whole chain
/// lands in one split, which find_attention_fusions needs.
std::vector<node_id> attention_chain_late_operands(const graph& g, node_id qk);

/// The attention chains of `steps` (a compiled plan's, in order) that the
/// backends of `devices` run fused: those on CUDA devices (above), and on
/// cpu devices those of more than fused_attention_max_rows query rows (a
/// prefill), any sizes, and decode-sized ones over a masked cache of
/// cpu_fused_cache_min_keys rows or more, without a cache prologue
/// (gpu/cpu/kernels.hpp).
std::vector<attention_fusion> find_attention_fusions(const graph& g, const std::vector<step>& steps,
                                                     const std::vector<device_spec>& devices);

/// Matrix-vector products of a decode step that one GEMV kernel runs
/// together (plan_options::fuse_projections; gpu/cuda/gemv.cuh). Every
/// matmul here is x [.., K] times a weight leaf w [N, K] transposed (an
/// nn.Linear), with at most fused_gemv_max_rows rows of x, K a whole number
/// of 16-byte vectors, x contiguous and 16-byte aligned, one float dtype;
/// the ops are consecutive compute ops of one step on a CUDA device.
enum class projection_kind : uint8_t {
  shared_input,  ///< 2-3 matmuls of the same x (q, k, v): each output written
  gated,         ///< {gate = x w_g^T, up = x w_u^T, silu(gate), mul(silu, up)}: the mul's output
  residual,      ///< {m = x w^T, add(r, m) or add(m, r)}, same dims: the add's output
};
struct projection_fusion {
  step_id step = -1;
  projection_kind kind = projection_kind::shared_input;
  /// In step order; the kernel runs at the last, reading every op's inputs
  /// there (the memory plan keeps them live until then). The outputs of
  /// gated's first three ops and residual's matmul are never written.
  std::vector<node_id> ops;
  /// shared_input and gated: ops[0] is an rms_norm whose output is the x of
  /// the group's matmuls and is read by nothing else; the kernel normalises
  /// x's rows itself (the norm's input, and its weight when it has one, are
  /// the group's inputs) and the norm's output is never written.
  bool norm_prologue = false;
  /// shared_input only: how many ropes end `ops` (0 to 3; a decode step
  /// without a KV cache, whose ropes no attention chain takes in). Each
  /// rotates the rows of one of the group's matmuls: its input is that
  /// matmul's output reshaped to [.., S, H, D] (same element order, read by
  /// nothing else; H x D its N), all of them by one positions input i32 [S]
  /// and one theta and mode, and every output of the group has an even N.
  /// The kernel rotates those outputs as it writes them (rounding
  /// the products to the dtype first, as the rope would read them) into the
  /// rope's output, and the matmul's own output is never written.
  int ropes = 0;
};

/// The rope of a group's matmul `mm` (projection_fusion::ropes), or no_node.
node_id projection_rope_of(const graph& g, const projection_fusion& f, node_id mm);

/// What a projection group's kernel writes: shared_input, each matmul's
/// output or, where a rope takes it, the rope's; gated and residual, the
/// last op's.
std::vector<node_id> projection_group_outputs(const graph& g, const projection_fusion& f);

/// The most rows of x a fused projection takes (gpu/cuda/gemv.cuh's gemv_max_rows).
inline constexpr int64_t fused_gemv_max_rows = 8;
/// The widest head a group's rope epilogue takes (the kernel takes a
/// frequency per pair of a head as a launch parameter).
inline constexpr int64_t fused_gemv_rope_max_head = 512;

/// What a projection group's kernel reads, at the group's last op: the
/// inputs of its ops that no op of the group computes (x, the weights, the
/// residual), with repeats.
std::vector<node_id> projection_group_inputs(const graph& g, const projection_fusion& f);

/// The projection groups of `steps` on CUDA devices, in step order; an op is
/// in at most one group (gated before shared_input: gate and up are matmuls
/// of one x), and no group takes an op of `attention` (the chains found
/// first: a rope that an attention chain's cache prologue took stays there).
std::vector<projection_fusion> find_projection_fusions(const graph& g, const std::vector<step>& steps,
                                                       const std::vector<device_spec>& devices,
                                                       const std::vector<attention_fusion>& attention = {});

/// An rms_norm's weight g folded into the projections that read the norm
/// (plan_options::fold_norm_weights): norm(x) * g @ W = norm(x) @ W', W' =
/// diag(g) W (W's rows, or its columns under trans_b, scaled by g: a
/// weight_source made by make_scaled_weight, so a checkpoint's tensor is still
/// read straight from its mapping, and a tensor-parallel shard of W' reads
/// only its slice of W). The norm then has no weight, and the GEMV kernel that
/// takes the norm in (projection_fusion::norm_prologue) reads x alone instead
/// of x and g for every weight it multiplies: the LLaMA-1B decode step's GEMV
/// chain 682 -> 624 us on an H200 (scripts/cuda-experiments/persistent_chain.cu),
/// its decode 0.811 -> 0.790 ms a token (docs/BENCHMARKS.md session 44). One
/// extra rounding of each W' element to W's dtype (bf16: 2^-9 relative).
///
/// A norm is folded when its weight is a weight leaf [K] of a float type,
/// the norm is no graph output and every reader of it is a matmul taking it
/// as `a` (not transposed) with a weight leaf of rank 2 as `b`, each of
/// those weights read only by such matmuls of this norm (a weight tied to
/// an embedding, say, is not rescaled, and its norm keeps its weight). Node
/// ids, names, dims and dtypes are unchanged; the norm weight's node stays,
/// unread. Returns the rewritten graph, or null when no norm qualifies.
expected<std::shared_ptr<const graph>> fold_norm_weights(const graph& g);

/// The shape of a whole decode step that one persistent kernel runs
/// (gpu::op_launch::fusion::decode_step, gpu/cuda/decode_step.cuh): a
/// LLaMA-family step of batch 1 and one new token over a KV cache.
struct decode_step_shape {
  int layers = 0;
  int64_t d_model = 0, d_ff = 0, heads = 0, kv_heads = 0, head_dim = 0, vocab = 0, cache_rows = 0;
  dtype type = dtype::bf16;
};
/// The kernel's limits: bf16; heads of 64 or 128 dims; at most 512 query
/// values a kv head (H / Hkv x dh); d_model, d_ff and the heads' width whole
/// numbers of 128 (LLaMA-2-7B's 11008 split over two devices is 5504 = 43 x
/// 128; Qwen2.5-0.5B's d_model 896 = 7 x 128, 14 heads of 64 over 2 kv
/// heads), all at most decode_step_max_width (each block stages the whole of x in
/// shared memory beside its weight rings: three chunks a warp up to 8192,
/// two above, with heads of 128: Llama 3.1 8B's d_ff 14336 among them); at most decode_step_max_layers
/// layers (a phase's tag has 8 bits: 5 phases a layer and up to 4 of the
/// head); at most decode_step_max_vocab logits (the head's rows go in up to
/// 4 parts of 1024 a block: 256 Ki logits need 66 SMs, Llama 3's 128,256
/// need 32; an H100 or H200 has 132).
inline constexpr int decode_step_max_layers = 48;
inline constexpr int64_t decode_step_max_width = 16384;
/// Widths above it take two chunks a warp, and heads of 128.
inline constexpr int64_t decode_step_max_narrow_width = 8192;
inline constexpr int64_t decode_step_max_vocab = 256 * 1024;
/// The kernel's attention goes over the whole cache in rounds, a block a
/// share of the rows, and its time grows about three times as fast with the
/// rows as the split attention kernel's of a kernel a record: on LLaMA-1B's
/// shape (H200, session 65) 0.763 against 0.813 ms a token with 1152 rows,
/// 0.807 one kernel with 2047, 1.000 against 0.883 with 4224, 1.944
/// against 1.198 with 16,512. Above this many rows the step keeps its
/// records, unless plan_options::decode_step_max_cache_rows raises it: the
/// generator's twins of its decode plans do, for sequences of at most this
/// many positions (the kernel's attention reads only the rows its mask
/// shows since session 66).
inline constexpr int64_t decode_step_max_cache_rows = 2048;
/// The elements of the chunks a row of width `k` streams in: the largest
/// divisor of k up to 2048 (4 KiB of bf16) that is a whole number of 16-byte
/// pieces; for a k that is a multiple of 128 at least 128 (LLaMA-2-7B's
/// d_ff 11008 = 43 x 256: chunks of 1376, not 256; 5504: 1376 too).
constexpr int64_t decode_step_chunk(int64_t k) {
  for (int64_t c = 2048; c >= 8; c -= 8)
    if (k % c == 0) return c;
  return 8;
}
/// Warps of a block of the decode-step kernel: each streams its own items
/// (a row's chunk) of every GEMV.
inline constexpr int64_t decode_step_warps = 16;
/// One warp's walk over its items of a GEMV phase of the decode-step kernel
/// (gpu/cuda/decode_step.cu): items warp, warp + warps, warp + 2 warps, ...
/// of the block's, item j being chunk j % chunks_per_row of the block's row
/// j / chunks_per_row. Each step is a carry, not a division: the kernel's
/// issuing lane walks it for every weight load. start() sets every field
/// (no initialisers: the kernel keeps it in shared memory).
struct decode_step_item_walk {
  int item, row, chunk;                        // item j, its row and its chunk in the row
  int chunks_per_row, step_rows, step_chunks;  // step: warps / chunks_per_row rows, warps % chunks_per_row chunks
  constexpr void start(int warp, int warps, int chunks) {
    chunks_per_row = chunks;
    step_rows = warps / chunks, step_chunks = warps % chunks;
    item = warp, row = warp / chunks, chunk = warp % chunks;
  }
  constexpr void next(int warps) {
    item += warps, row += step_rows, chunk += step_chunks;
    if (chunk >= chunks_per_row) chunk -= chunks_per_row, ++row;
  }
};
/// The elements of the chunks q/k/v's rows stream in on `blocks` SMs (the
/// phase's rows of width d_model, `qkv_rows` of them): decode_step_chunk,
/// halved from 2048 to 1024 where that takes the block's busiest warp fewer
/// chunks' time. The attention waits for all of q/k/v, so the phase's time
/// is its busiest warp's, and a 4 KiB chunk takes a warp about as long
/// whether it waited in the ring or not (docs/BENCHMARKS.md, session 52):
/// LLaMA-1B's 3072 rows are 24 a block on 132 SMs, two chunks for 8 of the
/// 16 warps, three halves for every warp in halves (0.904 -> 0.890 ms a
/// token on an H100, session 79). Where the items already fill the warps
/// evenly (Llama 3.1 8B: 94 chunks a block, 6 a warp either way), halves
/// only add a chunk's fixed work; quarters measured slower (0.941).
constexpr int64_t decode_step_qkv_chunk(int64_t d_model, int64_t qkv_rows, int64_t blocks) {
  const int64_t chunk = decode_step_chunk(d_model);
  if (chunk != 2048 || blocks < 1) return chunk;
  const int64_t items = (qkv_rows + blocks - 1) / blocks * (d_model / chunk);  // the busiest block's
  const int64_t rounds = (items + decode_step_warps - 1) / decode_step_warps;
  const int64_t half_rounds = (2 * items + decode_step_warps - 1) / decode_step_warps;
  return half_rounds < 2 * rounds ? chunk / 2 : chunk;
}
/// Empty when `s` fits the kernel, else why not (for describe()).
/// `max_cache_rows`: plan_options::decode_step_max_cache_rows.
inline std::string decode_step_misfit(const decode_step_shape& s,
                                      int64_t max_cache_rows = decode_step_max_cache_rows) {
  if (s.type != dtype::bf16) return "not bf16";
  if (s.head_dim != 64 && s.head_dim != 128) return "heads of " + std::to_string(s.head_dim) + " (64 or 128 fit)";
  if (s.kv_heads < 1 || s.heads % s.kv_heads != 0) return "query heads not a multiple of the kv heads";
  if (s.heads / s.kv_heads * s.head_dim > 512) return "more than 512 query values a kv head";
  if (s.kv_heads > 64) return "more than 64 kv heads";
  if (s.d_model % 128 != 0 || s.d_ff % 128 != 0 || s.heads * s.head_dim % 128 != 0)
    return "d_model, d_ff or the heads' width not a multiple of 128";
  if (s.d_model > decode_step_max_width || s.d_ff > decode_step_max_width || s.heads * s.head_dim > decode_step_max_width)
    return "wider than " + std::to_string(decode_step_max_width);
  if (std::max({s.d_model, s.d_ff, s.heads * s.head_dim}) > decode_step_max_narrow_width && s.head_dim != 128)
    return "wider than " + std::to_string(decode_step_max_narrow_width) + " with heads of " + std::to_string(s.head_dim) +
           " (128 only)";
  if (s.layers < 1 || s.layers > decode_step_max_layers) return std::to_string(s.layers) + " layers";
  if (s.vocab < 1 || s.vocab > decode_step_max_vocab) return "a vocabulary of " + std::to_string(s.vocab);
  if (s.cache_rows < 1) return "no cache";
  if (s.cache_rows > max_cache_rows)
    return "a cache of " + std::to_string(s.cache_rows) + " rows (more than " + std::to_string(max_cache_rows) +
           ": a kernel a record attends faster)";
  return {};
}

}  // namespace ag
