#pragma once
/// \file transformer.hpp
/// Decoder-only transformer graphs (GPT-2 and LLaMA) built with
/// graph_builder, with deterministic random weights owned by the graph.
///
///     ag::models::transformer_config cfg;            // small GPT-2 by default
///     cfg.variant = ag::models::model_variant::llama;
///     ag::expected<ag::graph> g = ag::models::build_transformer(cfg);
///     std::vector<ag::host_tensor> in = ag::models::transformer_inputs(cfg, 42);
///
/// The math follows HF transformers literally:
/// - gpt2 (GPT2LMHeadModel): h = wte[tok] + wpe[pos]; per block
///   x += attn(ln_1(x)); x += mlp(ln_2(x)); attention through one fused Conv1D
///   (weight [d, 3d] + bias), causal softmax(q k^T / sqrt(dh)), c_proj (+ bias);
///   mlp = c_proj(gelu_new(c_fc(x))) with gelu_new the tanh approximation;
///   final ln_f; logits = h wte^T (tied head).
/// - llama (LlamaForCausalLM): h = embed[tok]; per block
///   x += attn(rms_norm(x)); x += mlp(rms_norm(x)); q/k/v/o projections as
///   nn.Linear without bias (weights [out, in], multiplied with trans_b); RoPE
///   on q and k with rotate_half pairing (rope_mode::neox) and rope_theta;
///   grouped-query attention when n_kv_heads < n_heads (query head h uses kv
///   head h / rep, as HF's repeat_kv; done by regrouping the queries, without
///   copying k and v); heads of cfg.head_dim() (d / n_heads unless
///   explicit_head_dim says otherwise, HF's head_dim); mlp = down(silu(gate(x)) * up(x));
///   final rms_norm; untied lm_head [vocab, d]. cfg.attn_bias adds biases
///   to the attention's projections after their products: q, k and v
///   (Qwen2ForCausalLM, otherwise LLaMA's architecture), or q, k, v and o
///   (LlamaConfig's attention_bias); cfg.qk_norm normalises each head's q
///   and k (RMSNorm over head_dim, its own weight) before RoPE, as Qwen3;
///   cfg.sliding_window limits every layer's keys to the last that many
///   positions, as Mistral's.
/// - either variant: cfg.head ties or unties the head (HF tie_word_embeddings),
///   and gpt2's cfg.activation picks tanh or erf GELU (activation_function).
///
/// Graph interface (both variants):
/// - job inputs, in order: `tokens` i32 [batch, seq_len] and `positions`
///   i32 [seq_len] (0..seq_len-1 for a plain forward pass; an input rather
///   than a constant so that a caller can offset them). gpt2 gathers
///   wpe[positions]; llama rotates q and k by them.
/// - job output: `logits` f32 [batch, seq_len, vocab] (a cast node when the
///   storage dtype is lower).
/// - weights and activations are stored in cfg.dtype (f32 / f16 / bf16); ops
///   compute in f32 or wider and round their result to the storage type.
///
/// Cache mode (kv_cache_capacity = C > 0; the step graphs of ag::generator):
/// - inputs: `tokens` [B,S], `positions` [S] (the tokens' positions, for
///   RoPE / wpe), `cache_positions` i32 [S] (the cache row each new token's
///   keys and values go to; -1 stores nothing: padding), `attn_mask` [S, C]
///   in cfg.dtype (added to the attention scores before a non-causal
///   softmax: 0 where query i may see cache row j, a large negative value
///   elsewhere, e.g. rows not yet written and later positions). With
///   mask_from_positions, `key_positions` i32 [C] and `query_ranges` i32
///   [S, 2] instead of `attn_mask`, the mask built from them on the device
///   (op_kind::range_mask, "attn_mask"; cache_mask_inputs makes them).
/// - state: per block k, `l<k>.k_cache` and `l<k>.v_cache` [B, Hkv, C, dh]
///   (op_kind::store_rows, tagged layer k so a pipeline keeps each with its
///   block, sharded by kv head under tensor parallelism): this step's keys
///   (after RoPE for llama) and values are stored at cache_positions, then
///   attention reads all C rows in place. The cache lives on the devices, one
///   copy per state slot (plan_options::state_slots), and a job names its
///   slot (submit_options::state_slot).
/// - outputs: `logits` [B,S,vocab] f32 ([B,1,vocab] with last_row_logits).
///
/// Layer tags (node::layer, the unit the pipeline planner places):
/// - 0: embedding (inputs, wte/wpe or embed_tokens, the gathers);
/// - 1..n_layers: transformer block k (HF block k-1: `h.{k-1}` / `layers.{k-1}`);
/// - n_layers+1: final norm, head and the logits cast.
/// A tied head (gpt2's default) reads `wte` / `embed_tokens`, which is tagged
/// 0: a pipeline with the head on another device copies it there.
///
/// Names: nodes of block k start with "l<k>." (same k as the layer tag), e.g.
/// "l3.attn.qk", "l3.mlp.fc"; weights "l3.attn.w_qkv", "l3.ln_1.w" (llama:
/// "l3.attn.wq" .. "l3.mlp.w_down", biases "l3.attn.bq" ..). Global
/// weights: gpt2 "wte", "wpe", "ln_f.w", "ln_f.b"; llama "embed_tokens", "norm.w";
/// "lm_head" when the head is separate. weight_names(cfg) lists them all in
/// build order.
///
/// Initialisation (deterministic from cfg.seed and the weight's name, so a
/// weight's values do not depend on which other weights exist): matrices and
/// embeddings N(0, r^2) with r = cfg.initializer_range (0.02) as GPT-2 does,
/// with gpt2's two c_proj matrices scaled by 1/sqrt(2 n_layers) as GPT-2's
/// paper and HF's init do; biases N(0, r^2) and norm weights N(1, 0.1^2)
/// (HF starts them at 0 and 1: we perturb them so that a test notices a
/// dropped bias or norm weight).
///
/// Weights from elsewhere (a checkpoint): pass a weight_provider to
/// build_transformer; it is asked for each weight by the names above and
/// returns a source (e.g. a memory-mapped safetensors tensor) instead of the
/// random draw. models/hf_model.hpp maps Hugging Face checkpoints this way.
///
/// Thread-safety: every function here is pure; call from any thread.

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "graph/attention_mask.hpp"
#include "graph/dtype.hpp"
#include "graph/error.hpp"
#include "graph/graph.hpp"
#include "graph/host_tensor.hpp"
#include "graph/weight_source.hpp"

namespace ag::models {

/// Which published architecture to build.
enum class model_variant : uint8_t { gpt2 = 0, llama = 1 };
/// "gpt2" / "llama".
const char* to_string(model_variant v) noexcept;
/// Parses the names above; false if unknown.
bool parse_variant(const std::string& s, model_variant& out) noexcept;

/// llama only: which of the attention's projections carry a bias (HF
/// nn.Linear(bias=True), added after the product).
/// - none: LLaMA, Mistral;
/// - qkv: q, k and v (Qwen2 and Qwen2.5, model_type "qwen2");
/// - qkv_o: q, k, v and o (LlamaConfig's attention_bias = true).
enum class attention_bias : uint8_t { none = 0, qkv = 1, qkv_o = 2 };
/// "none" / "qkv" / "qkv_o".
const char* to_string(attention_bias b) noexcept;
/// Parses the names above; false if unknown.
bool parse_attention_bias(const std::string& s, attention_bias& out) noexcept;

/// Whether the output head reuses the token embedding.
/// - tied: logits = h E^T with E the embedding table ("wte" / "embed_tokens");
///   one weight node is read by the gather (layer 0) and the head (layer n+1);
/// - separate: a weight "lm_head" [vocab, d] of its own;
/// - variant_default: gpt2 tied, llama separate (HF's defaults for
///   GPT2LMHeadModel and LlamaForCausalLM).
enum class head_tying : uint8_t { variant_default = 0, tied = 1, separate = 2 };

/// The score a masked key gets, added to its attention score: exp() of it
/// times any attention scale is 0 in f32, and it fits f16 and bf16 (the
/// cache mode's attn_mask and the sliding window's mask use it). It is
/// attention_hidden_score (graph/attention_mask.hpp), so the fused
/// attention kernels skip the keys a generator's mask hides.
inline constexpr float attention_masked_score = attention_hidden_score;

/// Whether weight `name` is a layer's sliding-window mask
/// (transformer_config::sliding_window): a constant the builder makes, no
/// checkpoint tensor.
inline bool is_window_mask(std::string_view name) {
  constexpr std::string_view suffix = ".attn.window_mask";
  return name.size() >= suffix.size() && name.substr(name.size() - suffix.size()) == suffix;
}

/// Shape and initialisation of one model. Defaults: a tiny GPT-2 (2 layers,
/// d_model 64, 4 heads, vocab 97, 12 tokens x batch 2) that the reference
/// evaluator runs in milliseconds.
struct transformer_config {
  model_variant variant = model_variant::gpt2;
  int n_layers = 2;
  int64_t d_model = 64;
  int n_heads = 4;
  /// llama only: key/value heads; 0 = n_heads. Must divide n_heads (GQA).
  int n_kv_heads = 0;
  /// llama only: each attention head's width (HF head_dim) where it is not
  /// d_model / n_heads (Mistral NeMo: d_model 5120, 32 heads of 128); 0 =
  /// d_model / n_heads. q's projection is then [n_heads * head_dim, d_model]
  /// and o's [d_model, n_heads * head_dim]; d_model need not divide by n_heads.
  int64_t explicit_head_dim = 0;
  /// llama only: biases of the attention's projections ("l<k>.attn.bq",
  /// "attn.bk", "attn.bv" [heads x head_dim or kv heads x head_dim] and, for
  /// qkv_o, "attn.bo" [d_model]); see attention_bias.
  attention_bias attn_bias = attention_bias::none;
  /// llama only: an RMSNorm over each head's q and k before RoPE (Qwen3's
  /// q_norm and k_norm: weights "l<k>.attn.q_norm.w" and "attn.k_norm.w"
  /// [head_dim], the layers' eps).
  bool qk_norm = false;
  /// llama only: sliding-window attention on every layer (Mistral's
  /// sliding_window): the query at position i sees the keys at positions
  /// i - sliding_window + 1 .. i; 0 = the whole sequence. A plain forward
  /// pass longer than the window adds a constant [seq_len, seq_len] mask
  /// ("l<k>.attn.window_mask", one a layer) to the causal scores; with a KV cache the job's
  /// attn_mask carries it (the generator makes it so).
  int64_t sliding_window = 0;
  /// MLP hidden width (gpt2: n_inner, usually 4 d; llama: intermediate_size).
  int64_t d_ff = 256;
  int64_t vocab = 97;
  int64_t seq_len = 12;
  int64_t batch = 2;
  /// gpt2 only: rows of the position table wpe (n_positions); 0 = seq_len.
  /// Must be >= seq_len.
  int64_t max_positions = 0;
  /// Storage type of weights and activations: f32, f16 or bf16.
  ag::dtype dtype = ag::dtype::f32;
  uint64_t seed = 1;
  /// Standard deviation of matrices, embeddings and biases (HF's
  /// initializer_range, 0.02). Tests raise it so that attention is sharp and
  /// activations are O(1), where a wrong definition shows in the logits.
  float initializer_range = 0.02f;
  /// layer_norm (gpt2: layer_norm_epsilon) / rms_norm (llama: rms_norm_eps).
  float eps = 1e-5f;
  /// llama only: RoPE base.
  float rope_theta = 10000.0f;
  /// llama only: Llama 3's scaling of the RoPE frequencies (HF rope_type
  /// "llama3"; off by default; graph/rope_frequencies.hpp).
  rope_scaling rope_scale{};
  /// Output head tied to the embedding or separate (see head_tying).
  head_tying head = head_tying::variant_default;
  /// gpt2 only: the MLP's GELU (HF activation_function: gelu_new = tanh,
  /// gelu = erf). llama's MLP is always SwiGLU.
  gelu_mode activation = gelu_mode::tanh;
  /// false: weights are shapes only (no values are drawn or held): the graph
  /// can be planned, described and costed, not loaded or evaluated. Large
  /// layouts are planned this way (an 80-layer d 8192 model in milliseconds).
  bool weight_values = true;
  /// Step graphs over a KV cache (0: a plain forward pass). With C > 0 the
  /// graph processes seq_len new tokens of sequences whose earlier keys and
  /// values are job inputs; see "Cache mode" in the file comment.
  int64_t kv_cache_capacity = 0;
  /// true: the graph's output is each position's greedy token, i32 [batch,
  /// seq_len, 1] (op_kind::argmax of its logits, picked on the device:
  /// "next_token"), instead of the logits. A decode step then copies 4
  /// bytes to the host instead of a row of the vocabulary.
  bool argmax_output = false;
  /// true: the final norm and the head take the last position only, so the
  /// output is [batch, 1, vocab] (or [batch, 1, 1] with argmax_output). A
  /// prompt chunk's job needs only its last row (the generator puts a
  /// chunk's real tokens last): LLaMA-1B's chunk of 1024 then skips 134
  /// GFLOP of head and 131 MB of f32 logits copied to the host.
  bool last_row_logits = false;
  /// Cache mode: the graph takes the position each cache row holds and the
  /// range of positions each new token sees (`key_positions`, `query_ranges`:
  /// a few KiB) instead of the [seq_len, C] mask, and builds the mask on its
  /// device (op_kind::range_mask). A prompt chunk of 1024 tokens over a
  /// cache of 65,536 rows otherwise has the host fill 128 MiB and copy it
  /// over. The generator sets it on its prompt plans; its decode steps keep
  /// the one-row mask (what the one-kernel decode step reads).
  bool mask_from_positions = false;
  /// With mask_from_positions: each new token is a sequence of its own whose
  /// query range holds keys no other token's does (a batched decode step,
  /// each row in a lane of the cache: generator_options::decode_batch). A
  /// promise (op_attrs::rows_apart) that lets a CUDA device run the rows'
  /// attention apart, a block a row and kv head over that row's keys only,
  /// instead of every block sweeping all the lanes; a row that saw another
  /// row's new key would read it before it is stored. Values unchanged.
  bool rows_apart = false;
  /// Tokens handed from one job of a state slot to the next on the device
  /// (the generator's pipelined greedy decoding, generator.hpp): both need
  /// batch 1 and a KV cache, and seq_len 1 or, for a batched decode step
  /// whose every row is a sequence of its own (last_row_logits off), up to
  /// token_state_rows.
  /// - token_state_out (needs argmax_output): each row's greedy token is
  ///   also kept, row i's in row i of a state of token_state_rows i32 of
  ///   this name (store_rows, [token_state_rows]), and that state is the
  ///   graph's output instead of next_token: i32 [token_state_rows], rows
  ///   past seq_len as the slot's earlier jobs left them. The positions are
  ///   the constant weight "token_state.at" (i32 [1] = 0) for one row, else
  ///   the first seq_len of "token_state.rows" (i32 [token_state_rows] =
  ///   0, 1, ...).
  /// - token_state_in: the graph has no "tokens" input; its tokens are the
  ///   first seq_len rows of the state of this name, as the slot's previous
  ///   job kept them (a store_rows node that stores nothing: its rows and
  ///   position are the constant weight "token_state.none", i32 [1] = -1).
  /// The two names must differ: a job reads the tokens the previous job
  /// kept in one state and keeps its own in the other (two plans alternate).
  std::string token_state_in, token_state_out;
  /// Rows of the token states (1..65536): the batched steps of a slot of
  /// that many sequences (generator_options::decode_batch) share them.
  int64_t token_state_rows = 1;

  /// n_kv_heads with the default resolved (n_heads for gpt2 or when 0).
  int kv_heads() const noexcept { return variant == model_variant::llama && n_kv_heads > 0 ? n_kv_heads : n_heads; }
  /// explicit_head_dim, else d_model / n_heads.
  int64_t head_dim() const noexcept {
    return explicit_head_dim > 0 ? explicit_head_dim : n_heads > 0 ? d_model / n_heads : 0;
  }
  int64_t positions_rows() const noexcept { return max_positions > 0 ? max_positions : seq_len; }
  /// head with the default resolved.
  bool tied_head() const noexcept {
    return head == head_tying::variant_default ? variant == model_variant::gpt2 : head == head_tying::tied;
  }

  /// GPT-2 small (124M: 12 layers, d 768, 12 heads, vocab 50257, 1024 positions).
  static transformer_config gpt2_124m(int64_t seq_len = 128, int64_t batch = 1);
  /// A LLaMA-shaped model of `n_layers` layers at d 4096 / 32 heads / 8 kv heads /
  /// ff 14336 / vocab 32000 (LLaMA-3-8B-like widths with LLaMA-2's vocab), for
  /// planner and benchmark sizes. Building it draws every weight: about
  /// 218M elements per layer, so mind memory and time (use few layers).
  static transformer_config llama_8b_like(int n_layers = 32, int64_t seq_len = 128, int64_t batch = 1);
};

/// Checks a config; the error (errc::invalid_argument) names the field and why,
/// e.g. "transformer_config: d_model 100 is not divisible by n_heads 3".
error validate(const transformer_config& cfg);

/// Supplies the values of one weight: called by build_transformer once per
/// weight, in weight_names() order, with the weight's name, the dtype the
/// graph stores it in (cfg.dtype) and the dims the graph needs. Returns a
/// source of exactly that dtype and dims (a source may convert from its
/// backing store's dtype, e.g. a bf16 file into an f32 model), or an error
/// that names the weight and what is wrong. Called on the building thread.
using weight_provider =
    std::function<expected<weight_source_ptr>(const std::string& name, dtype type, const shape& dims)>;

/// Builds the graph (see the file comment for inputs, outputs, names and layer
/// tags). Weights come from `weights` when given, else from the seeded random
/// draw (or shapes only, cfg.weight_values = false). Errors: an invalid
/// config (see validate); the provider's first error, as it gave it; a source
/// of another dtype or dims than the weight needs (invalid_shape /
/// dtype_mismatch naming the weight, the source's origin() and both shapes);
/// or a graph error from the builder, which would be a bug here.
expected<graph> build_transformer(const transformer_config& cfg, const weight_provider& weights = {});

/// Job inputs for one forward pass, in the graph's input order: tokens
/// (deterministic from `seed`, uniform in [0, vocab)) and positions 0..seq_len-1.
/// Returns an empty vector when the config is invalid.
std::vector<host_tensor> transformer_inputs(const transformer_config& cfg, uint64_t seed);

/// Cache mode's `attn_mask` [T, C] in `t` for a job of T new tokens at
/// positions cached.. (the last n real, the T - n before them padding: the
/// generator puts a chunk's real tokens last, so that its last row, the one
/// the next token comes from, is always row T - 1), over a cache of C
/// rows where position p's keys and values live in row p % C (a ring when
/// the positions outgrow C). Once the job stored its rows, row r holds the
/// latest position p <= cached + n - 1 with p % C == r (none when that is
/// below 0). Query i (padding: as the first real one) sees the positions
/// from 0, or with window > 0 its last `window` ones, to cached + max(i -
/// (T - n), 0): 0 in the rows holding them, attention_masked_score elsewhere.
/// Each row is the one before with at most the positions entering and
/// leaving changed, so a chunk of 1024 tokens over a cache of 16,384 rows
/// costs a copy of its 32 MiB, not 16 million conversions. `memory`: where
/// the tensor's bytes live (runtime::input_memory: a fresh 32 MiB of heap
/// costs more in page faults than the copy); null: the heap.
host_tensor cache_attention_mask(dtype t, int64_t T, int64_t C, int64_t cached, int64_t n, int64_t window,
                                 host_memory_resource* memory = nullptr);
/// What a graph with mask_from_positions takes instead of that mask:
/// `key_positions` i32 [C] (the position row r holds, -1 none) and
/// `query_ranges` i32 [T, 2] (the first and last position query i sees), so
/// that op_kind::range_mask over them equals cache_attention_mask(t, T, C,
/// cached, n, window) in any dtype. Positions past 2^31 - 1 are out of range
/// for i32: such a call returns empty tensors.
struct cache_mask_positions {
  host_tensor key_positions, query_ranges;
};
cache_mask_positions cache_mask_inputs(int64_t T, int64_t C, int64_t cached, int64_t n, int64_t window);
/// Rows [i0, i1) (clamped to [0, T)) of such a mask, `mask` [T, C] of its
/// dtype, the first from the definition and each next from the row before:
/// ranges of rows are independent, so a caller may fill a large mask in
/// parts on several threads (the generator does, actors/generator.cpp).
void fill_cache_attention_mask_rows(host_tensor& mask, int64_t cached, int64_t n, int64_t window, int64_t i0,
                                    int64_t i1);

/// Number of weight elements the graph holds (a tied embedding counted once):
///   gpt2:  V d + P d + L (4 d^2 + 2 d ff + 9 d + ff) + 2 d   (P = positions_rows())
///   llama: 2 V d + L (2 d + d (H + 2 Hkv) dh + H dh d + 3 d ff) + d
///          + L (H + 2 Hkv) dh with q/k/v biases, + L d more with o's,
///          + L 2 dh with qk_norm
/// with V d less for a tied llama head and V d more for a separate gpt2 head.
/// 0 when the config is invalid.
int64_t parameter_count(const transformer_config& cfg);

/// Names of all weights in build order (what build_transformer creates).
std::vector<std::string> weight_names(const transformer_config& cfg);

}  // namespace ag::models
