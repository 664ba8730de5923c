#include "graph/models/transformer.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <cstdio>
#include <limits>
#include <optional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

namespace ag::models {

namespace {

// The weight's seed depends only on (cfg.seed, name): adding a weight or
// changing the build order never changes the values of the others.
uint64_t weight_seed(uint64_t seed, const std::string& name) {
  uint64_t h = 0xcbf29ce484222325ull;  // FNV-1a
  for (unsigned char c : name) {
    h ^= c;
    h *= 0x100000001b3ull;
  }
  uint64_t z = h ^ (seed + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2));
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

error bad(std::string msg) {
  return error{errc::invalid_argument, "transformer_config: " + std::move(msg)};
}

constexpr float norm_noise = 0.1f;

// Builds one model; every helper reads cfg_ and writes through b_.
class model_builder {
 public:
  model_builder(const transformer_config& cfg, const weight_provider& provider) : cfg_(cfg), provider_(provider) {}

  expected<graph> build() && {
    const int64_t B = cfg_.batch, S = cfg_.seq_len;
    b_.set_layer(0);
    tensor tokens;
    if (cfg_.token_state_in.empty()) tokens = b_.input("tokens", dtype::i32, {B, S});
    tensor positions = b_.input("positions", dtype::i32, {S});
    if (cached()) {
      cache_positions_ = b_.input("cache_positions", dtype::i32, {S});
      if (cfg_.mask_from_positions) {
        tensor keys = b_.input("key_positions", dtype::i32, {cfg_.kv_cache_capacity});
        tensor ranges = b_.input("query_ranges", dtype::i32, {S, 2});
        mask_ = b_.range_mask(keys, ranges, cfg_.dtype, "attn_mask", cfg_.rows_apart);
      } else {
        mask_ = b_.input("attn_mask", cfg_.dtype, {S, cfg_.kv_cache_capacity});
      }
    }
    if (!cfg_.token_state_in.empty()) {
      // The token the slot's previous job kept: the state read through a
      // store_rows node that stores nothing (its rows and position: the
      // constant -1). Another plan that shares this one's weights finds
      // each weight by name (plan_options::share_weights_with), so the
      // constant may sit ahead of the model's weights.
      // A batched step (token_state_rows > 1) reads its S rows' tokens
      // from the state's first S rows.
      const int64_t R = cfg_.token_state_rows;
      tensor none = b_.weight("token_state.none", host_tensor::from_ints({1}, {-1}));
      tensor kept = b_.store_rows(none, none, 0, R, cfg_.token_state_in);
      if (R > B * S) kept = b_.slice(kept, 0, 0, B * S, "token_state.read");
      tokens = b_.reshape(kept, {B, S}, "tokens");
    }
    tensor x;
    if (cfg_.variant == model_variant::gpt2) {
      embed_ = normal("wte", {cfg_.vocab, cfg_.d_model});
      tensor wpe = normal("wpe", {cfg_.positions_rows(), cfg_.d_model});
      tensor tok = b_.get_rows(embed_, tokens, "embed.tok");
      tensor pos = b_.get_rows(wpe, positions, "embed.pos");
      x = b_.add(tok, pos, "embed");
    } else {
      embed_ = normal("embed_tokens", {cfg_.vocab, cfg_.d_model});
      x = b_.get_rows(embed_, tokens, "embed");
    }
    for (int k = 1; k <= cfg_.n_layers; ++k) {
      b_.set_layer(k);
      x = cfg_.variant == model_variant::gpt2 ? gpt2_block(k, x) : llama_block(k, x, positions);
    }
    b_.set_layer(cfg_.n_layers + 1);
    if (cfg_.last_row_logits && cfg_.seq_len > 1) x = b_.slice(x, 1, cfg_.seq_len - 1, cfg_.seq_len, "last_row");
    tensor h;
    if (cfg_.variant == model_variant::gpt2) {
      tensor w = norm_weight("ln_f.w");
      tensor bias = normal("ln_f.b", {cfg_.d_model});
      h = b_.layer_norm(x, w, bias, cfg_.eps, "ln_f");
    } else {
      h = b_.rms_norm(x, norm_weight("norm.w"), cfg_.eps, "norm");
    }
    tensor head = cfg_.tied_head() ? embed_ : normal("lm_head", {cfg_.vocab, cfg_.d_model});
    tensor logits = b_.matmul(h, head, false, true, cfg_.dtype == dtype::f32 ? "logits" : "head");
    if (cfg_.argmax_output) {
      // The first maximum of the head's output: the same token as of its
      // f32 copy (the conversion is exact), without the copy.
      tensor next = b_.argmax(logits, "next_token");
      if (!cfg_.token_state_out.empty()) {
        // Kept for the slot's next job (token_state_in there); the state is
        // the output, so the job's host copy is the same 4 bytes.
        // Row i's token at row i. The positions are one constant of R rows
        // whatever S is (a batched step's first S of them): plans that share
        // weights find each by name, and a constant of another shape under
        // the same name would make a plan upload its own copy of the model.
        const int64_t R = cfg_.token_state_rows;
        tensor at;
        if (R == 1) {
          at = b_.weight("token_state.at", host_tensor::from_ints({1}, {0}));
        } else {
          std::vector<int32_t> rows(static_cast<std::size_t>(R));
          for (int64_t i = 0; i < R; ++i) rows[static_cast<std::size_t>(i)] = static_cast<int32_t>(i);
          at = b_.weight("token_state.rows", host_tensor::from_ints({R}, rows));
          if (R > B * S) at = b_.slice(at, 0, 0, B * S, "token_state.rows_kept");
        }
        next = b_.store_rows(b_.reshape(next, {B * S}, "next_token.row"), at, 0, R, cfg_.token_state_out);
      }
      b_.output(next);
    } else {
      if (cfg_.dtype != dtype::f32) logits = b_.copy(logits, dtype::f32, "logits");
      b_.output(logits);
    }
    if (provider_error_) return provider_error_;
    return std::move(b_).build();
  }

 private:
  static std::string p(int k, const char* what) { return "l" + std::to_string(k) + "." + what; }

  // The provider's source for `name`, checked against what the graph needs.
  // After the first error every weight is a placeholder of the right shape,
  // so that building goes on to the end and build() returns that error.
  tensor provided(const std::string& name, const shape& dims) {
    if (!provider_error_) {
      expected<weight_source_ptr> src = provider_(name, cfg_.dtype, dims);
      if (!src) {
        provider_error_ = src.err();
      } else if (!*src) {
        provider_error_ = error{errc::internal, "weight '" + name + "': the weight provider returned no source"};
      } else if ((*src)->dims() != dims) {
        provider_error_ = error{errc::invalid_shape, "weight '" + name + "' (" + (*src)->origin() + "): dims " +
                                                         (*src)->dims().to_string() + ", the model needs " +
                                                         dims.to_string()};
      } else if ((*src)->type() != cfg_.dtype) {
        provider_error_ = error{errc::dtype_mismatch, "weight '" + name + "' (" + (*src)->origin() + "): dtype " +
                                                          ag::to_string((*src)->type()) + ", the model needs " +
                                                          ag::to_string(cfg_.dtype)};
      } else {
        return b_.weight(name, std::move(*src));
      }
    }
    return b_.weight(name, make_shape_only_weight(cfg_.dtype, dims));
  }

  // stddev_scale multiplies cfg.initializer_range.
  tensor normal(const std::string& name, shape dims, float stddev_scale = 1.0f) {
    if (provider_) return provided(name, dims);
    if (!cfg_.weight_values) return b_.weight(name, make_shape_only_weight(cfg_.dtype, dims));
    return b_.weight(name, host_tensor::random_normal(cfg_.dtype, dims, weight_seed(cfg_.seed, name),
                                                      cfg_.initializer_range * stddev_scale));
  }
  // width 0: d_model.
  tensor norm_weight(const std::string& name, int64_t width = 0) {
    const shape dims{width > 0 ? width : cfg_.d_model};
    if (provider_) return provided(name, dims);
    if (!cfg_.weight_values) return b_.weight(name, make_shape_only_weight(cfg_.dtype, dims));
    return b_.weight(name, host_tensor::random_normal(cfg_.dtype, dims, weight_seed(cfg_.seed, name), norm_noise, 1.0f));
  }

  bool cached() const noexcept { return cfg_.kv_cache_capacity > 0; }

  // x itself when its layout is already contiguous (a permute that only
  // moves a dim of size 1, as a decode step's S = 1 does), else a copy: two
  // kernels fewer per block of a decode step.
  tensor contiguous(tensor x, std::string name) {
    return b_.info(x).contiguous() ? x : b_.contiguous(x, std::move(name));
  }

  // Cache mode: this step's keys / values [B,Hkv,S,dh] stored into the
  // layer's KV cache (state that outlives the job: store_rows [B,Hkv,C,dh],
  // row i at cache_positions[i]), which attention then reads whole, in
  // place; the scores are masked additively by `attn_mask` [S, C] instead of
  // the causal flag. Returns the keys / values attention reads.
  std::pair<tensor, tensor> with_cache(int k, tensor kh, tensor vh) {
    const int64_t C = cfg_.kv_cache_capacity;
    return {b_.store_rows(kh, cache_positions_, 2, C, p(k, "k_cache")),
            b_.store_rows(vh, cache_positions_, 2, C, p(k, "v_cache"))};
  }

  // Softmax over the last dim of scores [B,H,S,keys]: causal without a cache,
  // masked by attn_mask (broadcast over B and H) with one.
  tensor attn_softmax(int k, tensor scores, float scale) {
    if (!cached()) {
      if (windowed()) scores = b_.add(scores, window_mask(k), p(k, "attn.windowed"));
      return b_.softmax(scores, true, scale, p(k, "attn.softmax"));
    }
    tensor masked = b_.add(scores, mask_, p(k, "attn.masked"));
    return b_.softmax(masked, false, scale, p(k, "attn.softmax"));
  }

  // A plain forward pass longer than the sliding window: its keys further
  // back than the window masked, additively as the cache mode's attn_mask
  // masks (the causal flag masks the later ones). One constant a layer, so
  // that each pipeline stage holds its layers' own; its values are worked
  // out once and copied.
  bool windowed() const { return cfg_.sliding_window > 0 && cfg_.sliding_window < cfg_.seq_len; }
  tensor window_mask(int k) {
    if (!window_mask_values_) {
      const int64_t S = cfg_.seq_len, W = cfg_.sliding_window;
      host_tensor m = host_tensor::uninitialized(cfg_.dtype, {S, S});
      for (int64_t i = 0; i < S; ++i)
        for (int64_t j = 0; j < S; ++j) m.set(i * S + j, i - j >= W ? attention_masked_score : 0.0f);
      window_mask_values_ = std::move(m);
    }
    return b_.weight(p(k, "attn.window_mask"), *window_mask_values_);
  }

  // Causal multi-head attention core. q [B,S,H,dh], k and v [B,S,Hkv,dh]
  // (views are fine) -> [B,S,H*dh], contiguous.
  tensor attention(int k, tensor q, tensor kk, tensor v) {
    const int64_t B = cfg_.batch, S = cfg_.seq_len, H = cfg_.n_heads, Hkv = cfg_.kv_heads();
    const int64_t dh = cfg_.head_dim(), rep = H / Hkv;
    const int64_t keys = cached() ? cfg_.kv_cache_capacity : S;
    const float scale = 1.0f / std::sqrt(static_cast<float>(dh));
    const std::array<int, max_rank> bhsd{0, 2, 1, 3};
    tensor qh = b_.permute(q, bhsd, p(k, "attn.q_heads"));   // [B,H,S,dh]
    tensor kh = b_.permute(kk, bhsd, p(k, "attn.k_heads"));  // [B,Hkv,S,dh]
    tensor vh = b_.permute(v, bhsd, p(k, "attn.v_heads"));
    if (cached()) std::tie(kh, vh) = with_cache(k, kh, vh);  // [B,Hkv,C,dh]
    tensor out;
    if (rep == 1) {
      tensor scores = b_.matmul(qh, kh, false, true, p(k, "attn.qk"));  // [B,H,S,keys]
      tensor probs = attn_softmax(k, scores, scale);
      out = b_.matmul(probs, vh, false, false, p(k, "attn.pv"));  // [B,H,S,dh]
    } else {
      // GQA without materialising repeated k/v: query heads g*rep .. g*rep+rep-1
      // share kv head g, so view the contiguous queries [B,H,S,dh] as
      // [B,Hkv,rep*S,dh] and multiply once per kv head; the causal mask needs
      // each head's [S,S] block again, hence the reshapes around the softmax.
      tensor qc = contiguous(qh, p(k, "attn.q_cont"));
      tensor qg = b_.reshape(qc, {B, Hkv, rep * S, dh}, p(k, "attn.q_groups"));
      tensor scores = b_.matmul(qg, kh, false, true, p(k, "attn.qk"));  // [B,Hkv,rep*S,keys]
      tensor sh = b_.reshape(scores, {B, H, S, keys}, p(k, "attn.qk_heads"));
      tensor probs = attn_softmax(k, sh, scale);
      tensor pg = b_.reshape(probs, {B, Hkv, rep * S, keys}, p(k, "attn.probs_groups"));
      tensor og = b_.matmul(pg, vh, false, false, p(k, "attn.pv"));  // [B,Hkv,rep*S,dh]
      out = b_.reshape(og, {B, H, S, dh}, p(k, "attn.pv_heads"));
    }
    tensor merged = b_.permute(out, bhsd, p(k, "attn.merge"));  // [B,S,H,dh]
    tensor mc = contiguous(merged, p(k, "attn.merge_cont"));
    return b_.reshape(mc, {B, S, H * dh}, p(k, "attn.out"));
  }

  tensor gpt2_block(int k, tensor x) {
    const int64_t B = cfg_.batch, S = cfg_.seq_len, d = cfg_.d_model, H = cfg_.n_heads, dh = cfg_.head_dim();
    const float proj_scale = 1.0f / std::sqrt(2.0f * static_cast<float>(cfg_.n_layers));
    // Weights are made in separate statements so that node order does not
    // depend on the compiler's argument evaluation order.
    tensor ln1_w = norm_weight(p(k, "ln_1.w"));
    tensor ln1_b = normal(p(k, "ln_1.b"), {d});
    tensor a = b_.layer_norm(x, ln1_w, ln1_b, cfg_.eps, p(k, "ln_1"));
    tensor qkv = b_.matmul(a, normal(p(k, "attn.w_qkv"), {d, 3 * d}), false, false, p(k, "attn.qkv_mm"));
    qkv = b_.add(qkv, normal(p(k, "attn.b_qkv"), {3 * d}), p(k, "attn.qkv"));
    // HF splits the 3d columns into q | k | v, each d = H * dh columns.
    tensor heads = b_.reshape(qkv, {B, S, 3 * H, dh}, p(k, "attn.qkv_heads"));
    tensor q = b_.slice(heads, 2, 0, H, p(k, "attn.q"));
    tensor kk = b_.slice(heads, 2, H, 2 * H, p(k, "attn.k"));
    tensor v = b_.slice(heads, 2, 2 * H, 3 * H, p(k, "attn.v"));
    tensor att = attention(k, q, kk, v);
    tensor o = b_.matmul(att, normal(p(k, "attn.w_proj"), {d, d}, proj_scale), false, false, p(k, "attn.proj_mm"));
    o = b_.add(o, normal(p(k, "attn.b_proj"), {d}), p(k, "attn.proj"));
    x = b_.add(x, o, p(k, "attn.residual"));

    tensor ln2_w = norm_weight(p(k, "ln_2.w"));
    tensor ln2_b = normal(p(k, "ln_2.b"), {d});
    tensor m = b_.layer_norm(x, ln2_w, ln2_b, cfg_.eps, p(k, "ln_2"));
    tensor h = b_.matmul(m, normal(p(k, "mlp.w_fc"), {d, cfg_.d_ff}), false, false, p(k, "mlp.fc_mm"));
    h = b_.add(h, normal(p(k, "mlp.b_fc"), {cfg_.d_ff}), p(k, "mlp.fc"));
    h = b_.gelu(h, cfg_.activation, p(k, "mlp.gelu"));
    h = b_.matmul(h, normal(p(k, "mlp.w_proj"), {cfg_.d_ff, d}, proj_scale), false, false, p(k, "mlp.proj_mm"));
    h = b_.add(h, normal(p(k, "mlp.b_proj"), {d}), p(k, "mlp.proj"));
    return b_.add(x, h, p(k, "mlp.residual"));
  }

  tensor llama_block(int k, tensor x, tensor positions) {
    const int64_t B = cfg_.batch, S = cfg_.seq_len, d = cfg_.d_model, H = cfg_.n_heads, Hkv = cfg_.kv_heads();
    const int64_t dh = cfg_.head_dim();
    tensor a = b_.rms_norm(x, norm_weight(p(k, "attn_norm.w")), cfg_.eps, p(k, "attn_norm"));
    tensor q = b_.matmul(a, normal(p(k, "attn.wq"), {H * dh, d}), false, true, p(k, "attn.q_proj"));
    tensor kk = b_.matmul(a, normal(p(k, "attn.wk"), {Hkv * dh, d}), false, true, p(k, "attn.k_proj"));
    tensor v = b_.matmul(a, normal(p(k, "attn.wv"), {Hkv * dh, d}), false, true, p(k, "attn.v_proj"));
    if (cfg_.attn_bias != attention_bias::none) {
      // After the three products, so that they stay consecutive (one
      // projection group reads the normed x once: graph/fusion.hpp).
      tensor bq = normal(p(k, "attn.bq"), {H * dh});
      tensor bk = normal(p(k, "attn.bk"), {Hkv * dh});
      tensor bv = normal(p(k, "attn.bv"), {Hkv * dh});
      q = b_.add(q, bq, p(k, "attn.q_bias"));
      kk = b_.add(kk, bk, p(k, "attn.k_bias"));
      v = b_.add(v, bv, p(k, "attn.v_bias"));
    }
    q = b_.reshape(q, {B, S, H, dh}, p(k, "attn.q"));
    kk = b_.reshape(kk, {B, S, Hkv, dh}, p(k, "attn.k"));
    v = b_.reshape(v, {B, S, Hkv, dh}, p(k, "attn.v"));
    if (cfg_.qk_norm) {  // Qwen3: each head's q and k normalised over its dh before RoPE
      q = b_.rms_norm(q, norm_weight(p(k, "attn.q_norm.w"), dh), cfg_.eps, p(k, "attn.q_norm"));
      kk = b_.rms_norm(kk, norm_weight(p(k, "attn.k_norm.w"), dh), cfg_.eps, p(k, "attn.k_norm"));
    }
    q = b_.rope(q, positions, cfg_.rope_theta, rope_mode::neox, p(k, "attn.q_rope"), cfg_.rope_scale);
    kk = b_.rope(kk, positions, cfg_.rope_theta, rope_mode::neox, p(k, "attn.k_rope"), cfg_.rope_scale);
    tensor att = attention(k, q, kk, v);
    tensor o = b_.matmul(att, normal(p(k, "attn.wo"), {d, H * dh}), false, true, p(k, "attn.o_proj"));
    if (cfg_.attn_bias == attention_bias::qkv_o) o = b_.add(o, normal(p(k, "attn.bo"), {d}), p(k, "attn.o_bias"));
    x = b_.add(x, o, p(k, "attn.residual"));

    tensor m = b_.rms_norm(x, norm_weight(p(k, "mlp_norm.w")), cfg_.eps, p(k, "mlp_norm"));
    tensor gate = b_.matmul(m, normal(p(k, "mlp.w_gate"), {cfg_.d_ff, d}), false, true, p(k, "mlp.gate"));
    tensor up = b_.matmul(m, normal(p(k, "mlp.w_up"), {cfg_.d_ff, d}), false, true, p(k, "mlp.up"));
    tensor act = b_.mul(b_.silu(gate, p(k, "mlp.silu")), up, p(k, "mlp.act"));
    tensor down = b_.matmul(act, normal(p(k, "mlp.w_down"), {d, cfg_.d_ff}), false, true, p(k, "mlp.down"));
    return b_.add(x, down, p(k, "mlp.residual"));
  }

  const transformer_config& cfg_;
  const weight_provider& provider_;
  error provider_error_;
  graph_builder b_;
  tensor embed_;  // wte / embed_tokens: the head reads it when tied
  tensor mask_;             // cache mode: attn_mask [S, C]
  tensor cache_positions_;  // cache mode: cache_positions i32 [S]
  std::optional<host_tensor> window_mask_values_;  // a plain pass longer than the sliding window: [S, S], made once
};

}  // namespace

const char* to_string(model_variant v) noexcept {
  switch (v) {
    case model_variant::gpt2: return "gpt2";
    case model_variant::llama: return "llama";
  }
  return "?";
}

bool parse_variant(const std::string& s, model_variant& out) noexcept {
  if (s == "gpt2") { out = model_variant::gpt2; return true; }
  if (s == "llama") { out = model_variant::llama; return true; }
  return false;
}

const char* to_string(attention_bias b) noexcept {
  switch (b) {
    case attention_bias::none: return "none";
    case attention_bias::qkv: return "qkv";
    case attention_bias::qkv_o: return "qkv_o";
  }
  return "?";
}

bool parse_attention_bias(const std::string& s, attention_bias& out) noexcept {
  for (attention_bias b : {attention_bias::none, attention_bias::qkv, attention_bias::qkv_o})
    if (s == to_string(b)) {
      out = b;
      return true;
    }
  return false;
}

transformer_config transformer_config::gpt2_124m(int64_t seq_len, int64_t batch) {
  transformer_config c;
  c.variant = model_variant::gpt2;
  c.n_layers = 12;
  c.d_model = 768;
  c.n_heads = 12;
  c.d_ff = 3072;
  c.vocab = 50257;
  c.max_positions = 1024;
  c.seq_len = seq_len;
  c.batch = batch;
  c.eps = 1e-5f;
  return c;
}

transformer_config transformer_config::llama_8b_like(int n_layers, int64_t seq_len, int64_t batch) {
  transformer_config c;
  c.variant = model_variant::llama;
  c.n_layers = n_layers;
  c.d_model = 4096;
  c.n_heads = 32;
  c.n_kv_heads = 8;
  c.d_ff = 14336;
  c.vocab = 32000;
  c.seq_len = seq_len;
  c.batch = batch;
  c.eps = 1e-5f;
  c.rope_theta = 500000.0f;
  return c;
}

namespace {

std::string fmt_count(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.3g", v);
  return buf;
}

// The model's parameters, counted in T: double to check that the count
// fits 64 bits (a config.json may name any widths), int64_t once it does.
template <class T>
T count_parameters(const transformer_config& c) {
  const T d = static_cast<T>(c.d_model), ff = static_cast<T>(c.d_ff), V = static_cast<T>(c.vocab),
          L = static_cast<T>(c.n_layers);
  if (c.variant == model_variant::gpt2) {
    const T block = 2 * d + (d * 3 * d + 3 * d) + (d * d + d) + 2 * d + (d * ff + ff) + (ff * d + d);
    return V * d + static_cast<T>(c.positions_rows()) * d + L * block + 2 * d + (c.tied_head() ? 0 : V * d);
  }
  const T H = static_cast<T>(c.n_heads), Hkv = static_cast<T>(c.kv_heads()), dh = static_cast<T>(c.head_dim());
  T block = d + d * H * dh + 2 * d * Hkv * dh + H * dh * d + d + 3 * d * ff;
  if (c.attn_bias != attention_bias::none) block += (H + 2 * Hkv) * dh;
  if (c.attn_bias == attention_bias::qkv_o) block += d;
  if (c.qk_norm) block += 2 * dh;
  return V * d + L * block + d + (c.tied_head() ? 0 : V * d);
}

}  // namespace

error validate(const transformer_config& c) {
  using std::to_string;
  if (c.variant != model_variant::gpt2 && c.variant != model_variant::llama)
    return bad("unknown variant " + to_string(static_cast<int>(c.variant)));
  if (c.n_layers < 1) return bad("n_layers must be >= 1, got " + to_string(c.n_layers));
  if (c.d_model < 1) return bad("d_model must be >= 1, got " + to_string(c.d_model));
  if (c.n_heads < 1) return bad("n_heads must be >= 1, got " + to_string(c.n_heads));
  if (c.explicit_head_dim < 0) return bad("explicit_head_dim must be >= 0 (0 = d_model / n_heads), got " + to_string(c.explicit_head_dim));
  if (c.variant == model_variant::gpt2 && c.explicit_head_dim != 0 && c.explicit_head_dim * c.n_heads != c.d_model)
    return bad("explicit_head_dim " + to_string(c.explicit_head_dim) + " x n_heads " + to_string(c.n_heads) +
               " != d_model " + to_string(c.d_model) + ": gpt2's heads split d_model");
  if (c.explicit_head_dim == 0 && c.d_model % c.n_heads != 0)
    return bad("d_model " + to_string(c.d_model) + " is not divisible by n_heads " + to_string(c.n_heads) +
               (c.variant == model_variant::llama ? " (set explicit_head_dim for heads of another width)" : ""));
  if (c.attn_bias != attention_bias::none && c.attn_bias != attention_bias::qkv && c.attn_bias != attention_bias::qkv_o)
    return bad("unknown attention bias " + to_string(static_cast<int>(c.attn_bias)));
  if (c.variant == model_variant::gpt2 && c.attn_bias != attention_bias::none)
    return bad("attn_bias is for llama models (gpt2's projections always have biases)");
  if (c.variant == model_variant::gpt2 && c.qk_norm) return bad("qk_norm is for llama models");
  if (c.sliding_window < 0) return bad("sliding_window must be >= 0 (0 = none), got " + to_string(c.sliding_window));
  if (c.variant == model_variant::gpt2 && c.sliding_window != 0) return bad("sliding_window is for llama models");
  if (c.n_kv_heads < 0) return bad("n_kv_heads must be >= 0 (0 = n_heads), got " + to_string(c.n_kv_heads));
  if (c.variant == model_variant::gpt2 && c.n_kv_heads != 0 && c.n_kv_heads != c.n_heads)
    return bad("n_kv_heads " + to_string(c.n_kv_heads) + " != n_heads " + to_string(c.n_heads) +
               ": gpt2 has no grouped-query attention");
  if (c.n_heads % c.kv_heads() != 0)
    return bad("n_kv_heads " + to_string(c.kv_heads()) + " does not divide n_heads " + to_string(c.n_heads));
  if (c.variant == model_variant::llama && c.head_dim() % 2 != 0)
    return bad("head_dim " + to_string(c.head_dim()) + (c.explicit_head_dim > 0 ? "" : " (d_model / n_heads)") +
               " must be even for RoPE");
  if (c.d_ff < 1) return bad("d_ff must be >= 1, got " + to_string(c.d_ff));
  if (c.vocab < 1) return bad("vocab must be >= 1, got " + to_string(c.vocab));
  if (c.vocab > (int64_t{1} << 31) - 1) return bad("vocab " + to_string(c.vocab) + " does not fit i32 token ids");
  if (c.seq_len < 1) return bad("seq_len must be >= 1, got " + to_string(c.seq_len));
  if (c.batch < 1) return bad("batch must be >= 1, got " + to_string(c.batch));
  if (c.kv_cache_capacity < 0)
    return bad("kv_cache_capacity must be >= 0 (0 = no cache), got " + to_string(c.kv_cache_capacity));
  if (c.mask_from_positions && c.kv_cache_capacity < 1)
    return bad("mask_from_positions builds a KV cache's mask: it needs kv_cache_capacity > 0");
  if (c.rows_apart && !c.mask_from_positions)
    return bad("rows_apart is a promise about the mask built from positions: it needs mask_from_positions");
  if (c.max_positions < 0) return bad("max_positions must be >= 0 (0 = seq_len), got " + to_string(c.max_positions));
  if (c.variant == model_variant::gpt2 && c.positions_rows() < c.seq_len)
    return bad("max_positions " + to_string(c.max_positions) + " < seq_len " + to_string(c.seq_len));
  if (c.dtype != dtype::f32 && c.dtype != dtype::f16 && c.dtype != dtype::bf16)
    return bad(std::string("dtype must be f32, f16 or bf16, got ") + ag::to_string(c.dtype));
  if (!(c.eps > 0.0f) || !std::isfinite(c.eps)) return bad("eps must be a finite value > 0, got " + to_string(c.eps));
  if (!(c.initializer_range > 0.0f) || !std::isfinite(c.initializer_range))
    return bad("initializer_range must be a finite value > 0, got " + to_string(c.initializer_range));
  if (c.head != head_tying::variant_default && c.head != head_tying::tied && c.head != head_tying::separate)
    return bad("unknown head tying " + to_string(static_cast<int>(c.head)));
  if (c.activation != gelu_mode::tanh && c.activation != gelu_mode::erf)
    return bad("unknown activation (gelu mode) " + to_string(static_cast<int>(c.activation)));
  if (c.variant == model_variant::llama && (!(c.rope_theta > 0.0f) || !std::isfinite(c.rope_theta)))
    return bad("rope_theta must be a finite value > 0, got " + to_string(c.rope_theta));
  if (c.rope_scale.factor != 0.0f && c.variant != model_variant::llama) return bad("rope scaling is for llama models only");
  if (std::string why = rope_scaling_misfit(c.rope_scale); !why.empty()) return bad(why);
  if (!c.token_state_in.empty() || !c.token_state_out.empty()) {
    const std::string which = c.token_state_in.empty() ? "token_state_out" : "token_state_in";
    if (c.batch != 1 || c.kv_cache_capacity < 1)
      return bad(which + " needs batch 1 and a KV cache, got batch " + to_string(c.batch) + ", kv_cache_capacity " +
                 to_string(c.kv_cache_capacity));
    if (c.token_state_rows < 1 || c.token_state_rows > 65536)
      return bad("token_state_rows must be 1..65536, got " + to_string(c.token_state_rows));
    if (c.seq_len > c.token_state_rows)
      return bad(which + " keeps a token a row in " + to_string(c.token_state_rows) +
                 " rows (token_state_rows), fewer than seq_len " + to_string(c.seq_len));
    if (c.seq_len > 1 && c.last_row_logits)
      return bad(which + " with seq_len " + to_string(c.seq_len) +
                 " needs every row's logits (last_row_logits off): each row is a sequence of its own");
    if (!c.token_state_out.empty() && !c.argmax_output)
      return bad("token_state_out '" + c.token_state_out + "' needs argmax_output (it keeps the greedy token)");
    if (c.token_state_in == c.token_state_out)
      return bad("token_state_in and token_state_out are both '" + c.token_state_in +
                 "': a job reads the token the slot's previous job kept in one state and keeps its own in another");
  }
  // Rank-4 shapes: [B, Hkv, rep*S, S] etc. must not overflow int64 element counts.
  const double biggest = static_cast<double>(c.batch) * c.n_heads * c.seq_len * c.seq_len +
                         static_cast<double>(c.n_heads) * c.head_dim() * c.d_model +
                         static_cast<double>(c.vocab) * c.d_model + static_cast<double>(c.batch) * c.seq_len * c.vocab;
  if (biggest > 9.0e18) return bad("sizes overflow 64-bit element counts");
  // The weights too: every matrix and their sum (fuzzing found a GPT-2
  // config.json with n_embd 933921636, whose 12 blocks of 12 d^2 parameters
  // overflowed parameter_count()'s 64 bits).
  if (const double params = count_parameters<double>(c); params > 9.0e18)
    return bad("sizes overflow 64-bit element counts: d_model " + to_string(c.d_model) + ", d_ff " +
               to_string(c.d_ff) + ", vocab " + to_string(c.vocab) + " and " + to_string(c.n_layers) +
               " layers make " + fmt_count(params) + " parameters");
  return {};
}

expected<graph> build_transformer(const transformer_config& cfg, const weight_provider& weights) {
  if (error e = validate(cfg)) return e;
  return model_builder(cfg, weights).build();
}

std::vector<host_tensor> transformer_inputs(const transformer_config& cfg, uint64_t seed) {
  if (validate(cfg)) return {};
  std::vector<int32_t> pos(static_cast<std::size_t>(cfg.seq_len));
  for (std::size_t i = 0; i < pos.size(); ++i) pos[i] = static_cast<int32_t>(i);
  std::vector<host_tensor> out;
  out.push_back(host_tensor::random_ints({cfg.batch, cfg.seq_len}, seed, static_cast<int32_t>(cfg.vocab)));
  out.push_back(host_tensor::from_ints({cfg.seq_len}, pos));
  return out;
}

int64_t parameter_count(const transformer_config& c) {
  if (validate(c)) return 0;  // validate() checked the count fits (count_parameters<double>)
  return count_parameters<int64_t>(c);
}

std::vector<std::string> weight_names(const transformer_config& c) {
  std::vector<std::string> n;
  auto p = [](int k, const char* w) { return "l" + std::to_string(k) + "." + w; };
  if (c.variant == model_variant::gpt2) {
    n = {"wte", "wpe"};
    for (int k = 1; k <= c.n_layers; ++k)
      for (const char* w : {"ln_1.w", "ln_1.b", "attn.w_qkv", "attn.b_qkv", "attn.w_proj", "attn.b_proj", "ln_2.w",
                            "ln_2.b", "mlp.w_fc", "mlp.b_fc", "mlp.w_proj", "mlp.b_proj"})
        n.push_back(p(k, w));
    n.insert(n.end(), {"ln_f.w", "ln_f.b"});
    if (!c.tied_head()) n.push_back("lm_head");
  } else {
    n = {"embed_tokens"};
    const bool qkv_bias = c.attn_bias != attention_bias::none, o_bias = c.attn_bias == attention_bias::qkv_o;
    for (int k = 1; k <= c.n_layers; ++k) {
      for (const char* w : {"attn_norm.w", "attn.wq", "attn.wk", "attn.wv"}) n.push_back(p(k, w));
      if (qkv_bias)
        for (const char* w : {"attn.bq", "attn.bk", "attn.bv"}) n.push_back(p(k, w));
      if (c.qk_norm)
        for (const char* w : {"attn.q_norm.w", "attn.k_norm.w"}) n.push_back(p(k, w));
      n.push_back(p(k, "attn.wo"));
      if (o_bias) n.push_back(p(k, "attn.bo"));
      for (const char* w : {"mlp_norm.w", "mlp.w_gate", "mlp.w_up", "mlp.w_down"}) n.push_back(p(k, w));
    }
    n.push_back("norm.w");
    if (!c.tied_head()) n.push_back("lm_head");
  }
  return n;
}

namespace {

// Which positions a cache mask shows (cache_attention_mask's definition):
// row r of the cache holds held(r), query i sees [first_of(i), last_of(i)].
struct cache_mask_geometry {
  int64_t T, C, cached, n, window;
  int64_t top() const { return cached + n - 1; }
  // The position row r holds (< 0: none).
  int64_t held(int64_t r) const { return top() - ((top() - r) % C + C) % C; }
  int64_t last_of(int64_t i) const { return cached + std::max<int64_t>(i - (T - n), 0); }  // padding first
  int64_t first_of(int64_t i) const { return window > 0 ? std::max<int64_t>(0, last_of(i) - window + 1) : 0; }
  // f(r, held(r)) for every row r in order: held(r) = top - back, `back`
  // stepping down from held(0)'s and wrapping, without a division a row.
  template <class F>
  void each_row_held(F&& f) const {
    if (C <= 0) return;
    for (int64_t r = 0, back = top() - held(0); r < C; ++r, back = back == 0 ? C - 1 : back - 1) f(r, top() - back);
  }
};

}  // namespace

cache_mask_positions cache_mask_inputs(int64_t T, int64_t C, int64_t cached, int64_t n, int64_t window) {
  constexpr int64_t most = std::numeric_limits<int32_t>::max();
  if (T < 0 || C < 0 || cached < 0 || n < 0 || cached + n > most) return {};
  const cache_mask_geometry g{T, C, cached, n, window};
  cache_mask_positions out{host_tensor::uninitialized(dtype::i32, {C}), host_tensor::uninitialized(dtype::i32, {T, 2})};
  // Written in place (65,536 rows are a prompt job's host work).
  auto* keys = reinterpret_cast<int32_t*>(out.key_positions.data());
  g.each_row_held([&](int64_t r, int64_t p) { keys[r] = static_cast<int32_t>(std::max<int64_t>(p, -1)); });
  auto* ranges = reinterpret_cast<int32_t*>(out.query_ranges.data());
  for (int64_t i = 0; i < T; ++i) {
    ranges[2 * i] = static_cast<int32_t>(g.first_of(i));
    ranges[2 * i + 1] = static_cast<int32_t>(g.last_of(i));
  }
  return out;
}

void fill_cache_attention_mask_rows(host_tensor& mask, int64_t cached, int64_t n, int64_t window, int64_t i0,
                                    int64_t i1) {
  const int64_t T = mask.dims().rank() == 2 ? mask.dims()[0] : 0, C = T > 0 ? mask.dims()[1] : 0;
  i0 = std::max<int64_t>(i0, 0);
  i1 = std::min(i1, T);
  if (i0 >= i1 || C <= 0) return;
  const dtype t = mask.type();
  const cache_mask_geometry g{T, C, cached, n, window};
  const std::size_t es = dtype_size(t);
  std::byte seen[8], hidden[8];
  store_from_float(seen, t, 0, 0.0f);
  store_from_float(hidden, t, 0, attention_masked_score);
  std::byte* m = mask.data();
  const auto put = [&](int64_t i, int64_t r, bool visible) {
    std::memcpy(m + static_cast<std::size_t>(i * C + r) * es, visible ? seen : hidden, es);
  };
  const int64_t first = g.first_of(i0), last = g.last_of(i0);
  g.each_row_held([&](int64_t r, int64_t p) { put(i0, r, p >= first && p <= last); });  // the first row
  const std::size_t row_bytes = static_cast<std::size_t>(C) * es;
  for (int64_t i = i0 + 1; i < i1; ++i) {
    std::memcpy(m + static_cast<std::size_t>(i) * row_bytes, m + static_cast<std::size_t>(i - 1) * row_bytes, row_bytes);
    // Both ends only grow: the positions in [first, last] now and not
    // before enter, those before and not now leave; each is shown or
    // hidden in the row that holds it, if one does.
    const int64_t first0 = g.first_of(i - 1), last0 = g.last_of(i - 1), first1 = g.first_of(i), last1 = g.last_of(i);
    for (int64_t p = std::max(last0 + 1, first1); p <= last1; ++p)
      if (p >= 0 && g.held(p % C) == p) put(i, p % C, true);
    for (int64_t p = first0; p <= std::min(first1 - 1, last0); ++p)
      if (p >= 0 && g.held(p % C) == p) put(i, p % C, false);
  }
}

host_tensor cache_attention_mask(dtype t, int64_t T, int64_t C, int64_t cached, int64_t n, int64_t window,
                                 host_memory_resource* memory) {
  host_tensor mask = host_tensor::uninitialized(t, {T, C}, memory);
  fill_cache_attention_mask_rows(mask, cached, n, window, 0, T);
  return mask;
}

}  // namespace ag::models
