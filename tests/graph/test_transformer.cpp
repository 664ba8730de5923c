// Tests of ag::models::build_transformer: structure (shapes, names, layer
// tags, parameter counts), determinism, config validation, and behaviour
// through the reference evaluator (causality, batch independence, RoPE's
// relative positions, reduced-precision storage). The numerical match with
// HF transformers' definitions is tests/models/transformer_ref.py.

#include <gtest/gtest.h>

#include <cstring>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <set>
#include <string>
#include <vector>

#include "graph/graph.hpp"
#include "graph/models/transformer.hpp"
#include "graph/reference.hpp"

namespace {

using ag::dtype;
using ag::host_tensor;
using ag::models::model_variant;
using ag::models::transformer_config;

transformer_config small(model_variant v, int kv_heads = 0) {
  transformer_config c;
  c.variant = v;
  c.n_layers = 2;
  c.d_model = 32;
  c.n_heads = 4;
  c.n_kv_heads = kv_heads;
  c.d_ff = 48;
  c.vocab = 41;
  c.seq_len = 7;
  c.batch = 2;
  c.seed = 11;
  return c;
}

// The last: heads of 12 where d_model / n_heads is 8 (HF's head_dim).
std::vector<transformer_config> all_small() {
  auto wide_heads = small(model_variant::llama, 2);
  wide_heads.explicit_head_dim = 12;
  return {small(model_variant::gpt2), small(model_variant::llama), small(model_variant::llama, 2),
          small(model_variant::llama, 1), wide_heads};
}

std::string label(const transformer_config& c) {
  return std::string(ag::models::to_string(c.variant)) + " kv_heads=" + std::to_string(c.kv_heads()) +
         " head_dim=" + std::to_string(c.head_dim());
}

host_tensor eval_logits(const ag::graph& g, const std::vector<host_tensor>& in) {
  auto out = ag::evaluate_reference(g, in);
  EXPECT_TRUE(out.has_value()) << (out ? "" : out.err().to_string());
  if (!out || out->size() != 1) return {};
  return (*out)[0];
}

TEST(Transformer, BuildsBothVariantsWithDocumentedInterface) {
  for (const auto& c : all_small()) {
    SCOPED_TRACE(label(c));
    auto g = ag::models::build_transformer(c);
    ASSERT_TRUE(g.has_value()) << g.err().to_string();
    ASSERT_EQ(g->inputs().size(), 2u);
    const auto& tok = g->at(g->inputs()[0]);
    const auto& pos = g->at(g->inputs()[1]);
    EXPECT_EQ(tok.name, "tokens");
    EXPECT_EQ(tok.type, dtype::i32);
    EXPECT_EQ(tok.dims, (ag::shape{c.batch, c.seq_len}));
    EXPECT_EQ(pos.name, "positions");
    EXPECT_EQ(pos.type, dtype::i32);
    EXPECT_EQ(pos.dims, (ag::shape{c.seq_len}));
    ASSERT_EQ(g->outputs().size(), 1u);
    const auto& out = g->at(g->outputs()[0]);
    EXPECT_EQ(out.name, "logits");
    EXPECT_EQ(out.type, dtype::f32);
    EXPECT_EQ(out.dims, (ag::shape{c.batch, c.seq_len, c.vocab}));

    auto in = ag::models::transformer_inputs(c, 5);
    ASSERT_EQ(in.size(), 2u);
    EXPECT_TRUE(ag::check_inputs(*g, in).ok());
    host_tensor logits = eval_logits(*g, in);
    ASSERT_EQ(logits.dims(), out.dims);
    for (int64_t i = 0; i < logits.numel(); ++i) ASSERT_TRUE(std::isfinite(logits.at(i))) << "element " << i;
  }
}

TEST(Transformer, InputsAreTokensInRangeAndPlainPositions) {
  auto c = small(model_variant::llama);
  c.vocab = 5;
  auto in = ag::models::transformer_inputs(c, 3);
  ASSERT_EQ(in.size(), 2u);
  std::set<int> seen;
  for (int64_t i = 0; i < in[0].numel(); ++i) {
    const int t = static_cast<int>(in[0].at(i));
    EXPECT_GE(t, 0);
    EXPECT_LT(t, 5);
    seen.insert(t);
  }
  EXPECT_GT(seen.size(), 1u) << "tokens should be random, not constant";
  for (int64_t i = 0; i < in[1].numel(); ++i) EXPECT_EQ(in[1].at(i), static_cast<float>(i));
  EXPECT_FALSE(ag::models::transformer_inputs(c, 3)[0] == ag::models::transformer_inputs(c, 4)[0]);
  c.n_heads = 3;  // invalid: 32 % 3 != 0
  EXPECT_TRUE(ag::models::transformer_inputs(c, 3).empty());
}

TEST(Transformer, ParameterCountMatchesWeightsAndPublishedModels) {
  for (auto c : all_small()) {
    c.max_positions = c.variant == model_variant::gpt2 ? 16 : 0;
    SCOPED_TRACE(label(c));
    auto g = ag::models::build_transformer(c);
    ASSERT_TRUE(g.has_value()) << g.err().to_string();
    int64_t elems = 0;
    std::vector<std::string> names;
    for (const auto& n : g->nodes())
      if (n.op == ag::op_kind::weight) {
        elems += n.dims.numel();
        names.push_back(n.name);
        ASSERT_NE(n.data, nullptr) << n.name;
        EXPECT_EQ(n.data->dims(), n.dims) << n.name;
      }
    EXPECT_EQ(elems, ag::models::parameter_count(c));
    EXPECT_EQ(g->weight_bytes(), elems * 4);
    EXPECT_EQ(names, ag::models::weight_names(c));
  }
  // Published sizes: GPT-2 small has 124,439,808 parameters (HF, tied head);
  // LLaMA-2-7B 6,738,415,616 (untied head, no GQA).
  EXPECT_EQ(ag::models::parameter_count(transformer_config::gpt2_124m()), 124439808);
  transformer_config l7;
  l7.variant = model_variant::llama;
  l7.n_layers = 32;
  l7.d_model = 4096;
  l7.n_heads = 32;
  l7.d_ff = 11008;
  l7.vocab = 32000;
  EXPECT_EQ(ag::models::parameter_count(l7), 6738415616);
  // LLaMA-3-8B's GQA widths with vocab 128256: 8,030,261,248.
  auto l3 = transformer_config::llama_8b_like(32);
  l3.vocab = 128256;
  EXPECT_EQ(ag::models::parameter_count(l3), 8030261248);
}

TEST(Transformer, LayerTagsAreMonotoneAlongEdgesAndMatchNames) {
  for (const auto& c : all_small()) {
    SCOPED_TRACE(label(c));
    auto g = ag::models::build_transformer(c);
    ASSERT_TRUE(g.has_value()) << g.err().to_string();
    std::set<int> layers;
    for (const auto& n : g->nodes()) {
      ASSERT_GE(n.layer, 0) << n.name << " is untagged";
      ASSERT_LE(n.layer, c.n_layers + 1) << n.name;
      layers.insert(n.layer);
      for (ag::node_id i : n.inputs)
        EXPECT_LE(g->at(i).layer, n.layer) << g->at(i).name << " -> " << n.name;
      if (n.name.size() > 1 && n.name[0] == 'l' && std::isdigit(static_cast<unsigned char>(n.name[1]))) {
        EXPECT_EQ(n.layer, std::stoi(n.name.substr(1))) << n.name;
      }
    }
    EXPECT_EQ(static_cast<int>(layers.size()), c.n_layers + 2);
    EXPECT_EQ(g->at(g->find("tokens")).layer, 0);
    EXPECT_EQ(g->at(g->outputs()[0]).layer, c.n_layers + 1);
    for (int k = 1; k <= c.n_layers; ++k) {
      const std::string p = "l" + std::to_string(k) + ".";
      for (const char* what : {"attn.qk", "attn.softmax", "attn.pv", "mlp.residual"})
        EXPECT_NE(g->find(p + what), ag::no_node) << p + what;
    }
  }
}

TEST(Transformer, SameSeedSameWeightsOtherSeedOthers) {
  for (auto c : all_small()) {
    SCOPED_TRACE(label(c));
    auto a = ag::models::build_transformer(c);
    auto b = ag::models::build_transformer(c);
    c.seed += 1;
    auto d = ag::models::build_transformer(c);
    ASSERT_TRUE(a && b && d);
    ASSERT_EQ(a->size(), d->size());
    int weights = 0;
    for (std::size_t i = 0; i < a->size(); ++i) {
      const auto& na = a->nodes()[i];
      if (na.op != ag::op_kind::weight) continue;
      ++weights;
      EXPECT_TRUE(*na.data->in_memory() == *b->nodes()[i].data->in_memory()) << na.name;
      EXPECT_FALSE(*na.data->in_memory() == *d->nodes()[i].data->in_memory()) << na.name;
      // No weight is constant (norm weights are ones plus noise, biases nonzero).
      const auto v = na.data->in_memory()->to_floats();
      EXPECT_GT(*std::max_element(v.begin(), v.end()), *std::min_element(v.begin(), v.end())) << na.name;
    }
    EXPECT_EQ(weights, static_cast<int>(ag::models::weight_names(c).size()));
    auto in = ag::models::transformer_inputs(c, 9);
    EXPECT_TRUE(eval_logits(*a, in) == eval_logits(*b, in));
  }
}

TEST(Transformer, InitialisationHasDocumentedStatistics) {
  auto c = small(model_variant::gpt2);
  c.d_model = 64;
  auto g = ag::models::build_transformer(c);
  ASSERT_TRUE(g.has_value());
  auto stats = [&](const char* name) {
    const auto v = g->at(g->find(name)).data->in_memory()->to_floats();
    double s = 0, s2 = 0;
    for (float x : v) s += x;
    const double mean = s / v.size();
    for (float x : v) s2 += (x - mean) * (x - mean);
    return std::pair{mean, std::sqrt(s2 / v.size())};
  };
  auto [wm, ws] = stats("wte");  // 41 x 64 values
  EXPECT_NEAR(wm, 0.0, 0.003);
  EXPECT_NEAR(ws, 0.02, 0.002);
  auto [pm, ps] = stats("l1.mlp.w_proj");  // scaled by 1 / sqrt(2 n_layers)
  EXPECT_NEAR(ps, 0.02 / 2.0, 0.001);
  auto [nm, ns] = stats("l1.ln_1.w");
  EXPECT_NEAR(nm, 1.0, 0.05);
  EXPECT_NEAR(ns, 0.1, 0.04);
}

TEST(Transformer, LaterTokensDoNotChangeEarlierLogits) {
  for (const auto& c : all_small()) {
    SCOPED_TRACE(label(c));
    auto g = ag::models::build_transformer(c);
    ASSERT_TRUE(g.has_value()) << g.err().to_string();
    auto in = ag::models::transformer_inputs(c, 21);
    const host_tensor base = eval_logits(*g, in);
    const int64_t S = c.seq_len, V = c.vocab;
    const int64_t t = 4;  // change token t of sequence 0
    auto changed = in;
    changed[0].set(t, static_cast<float>((static_cast<int>(in[0].at(t)) + 1) % c.vocab));
    const host_tensor other = eval_logits(*g, changed);
    ASSERT_EQ(base.numel(), other.numel());
    double before = 0, after = 0, seq1 = 0;
    for (int64_t s = 0; s < S; ++s)
      for (int64_t v = 0; v < V; ++v) {
        const double d0 = std::fabs(base.at(s * V + v) - other.at(s * V + v));
        (s < t ? before : after) = std::max(s < t ? before : after, d0);
        seq1 = std::max(seq1, static_cast<double>(std::fabs(base.at((S + s) * V + v) - other.at((S + s) * V + v))));
      }
    EXPECT_EQ(before, 0.0) << "positions before " << t << " saw a later token";
    EXPECT_EQ(seq1, 0.0) << "sequence 1 saw sequence 0's token";
    EXPECT_GT(after, 1e-4) << "position " << t << " and later must see the changed token";
  }
}

// A sliding window of W (Mistral's) limits what a token can change: over
// one layer, token t reaches the rows t .. t + W - 1; over L layers, the
// rows up to t + L (W - 1). Rows beyond keep their logits to the bit, rows
// within change; a window at least as long as the sequence is no window (the
// graph has no mask constants, the logits are the unwindowed model's).
TEST(Transformer, SlidingWindowLimitsHowFarATokenReaches) {
  for (const int layers : {1, 2}) {
    SCOPED_TRACE(std::to_string(layers) + " layers");
    auto c = small(model_variant::llama, 2);
    c.n_layers = layers;
    c.seq_len = 9;
    c.sliding_window = 3;
    auto g = ag::models::build_transformer(c);
    ASSERT_TRUE(g.has_value()) << g.err().to_string();
    int masks = 0;
    for (const auto& n : g->nodes()) masks += n.op == ag::op_kind::weight && ag::models::is_window_mask(n.name);
    EXPECT_EQ(masks, layers) << "one window mask a layer";
    auto in = ag::models::transformer_inputs(c, 5);
    const host_tensor base = eval_logits(*g, in);
    const int64_t t = 1, V = c.vocab, reach = t + layers * (c.sliding_window - 1);
    auto changed = in;
    changed[0].set(t, static_cast<float>((static_cast<int>(in[0].at(t)) + 1) % c.vocab));
    const host_tensor other = eval_logits(*g, changed);
    ASSERT_EQ(base.numel(), other.numel());
    for (int64_t s = 0; s < c.seq_len; ++s) {
      double d = 0;
      for (int64_t v = 0; v < V; ++v) d = std::max(d, static_cast<double>(std::fabs(base.at(s * V + v) - other.at(s * V + v))));
      if (s < t || s > reach) EXPECT_EQ(d, 0.0) << "row " << s << " is out of token " << t << "'s reach";
      else EXPECT_GT(d, 1e-6) << "row " << s << " is within token " << t << "'s reach";
    }
    // Without the window the last row sees token t too.
    auto full = c;
    full.sliding_window = 0;
    auto gf = ag::models::build_transformer(full);
    ASSERT_TRUE(gf.has_value());
    const host_tensor fb = eval_logits(*gf, in), fo = eval_logits(*gf, changed);
    double last = 0;
    for (int64_t v = 0; v < V; ++v) {
      const int64_t i = (c.seq_len - 1) * V + v;
      last = std::max(last, static_cast<double>(std::fabs(fb.at(i) - fo.at(i))));
    }
    EXPECT_GT(last, 1e-6);
    // Rows within the window of the start see what the unwindowed model sees.
    for (int64_t i = 0; i < c.sliding_window * V; ++i) EXPECT_EQ(base.at(i), fb.at(i)) << "element " << i;
    // A window as long as the sequence: no masks, the unwindowed logits.
    auto as_long = c;
    as_long.sliding_window = c.seq_len;
    auto gl = ag::models::build_transformer(as_long);
    ASSERT_TRUE(gl.has_value());
    EXPECT_EQ(gl->nodes().size(), gf->nodes().size());
    EXPECT_TRUE(eval_logits(*gl, in) == fb);
  }
}

TEST(Transformer, LlamaLogitsDependOnlyOnRelativePositions) {
  // RoPE rotates q and k by their positions, so q.k depends on the difference
  // only: shifting every position leaves logits unchanged (up to rounding),
  // while GPT-2's learned absolute positions change them.
  for (auto c : {small(model_variant::llama), small(model_variant::llama, 2), small(model_variant::gpt2)}) {
    SCOPED_TRACE(label(c));
    c.max_positions = 16;
    auto g = ag::models::build_transformer(c);
    ASSERT_TRUE(g.has_value()) << g.err().to_string();
    auto in = ag::models::transformer_inputs(c, 8);
    auto shifted = in;
    for (int64_t i = 0; i < c.seq_len; ++i) shifted[1].set(i, static_cast<float>(i + 5));
    const host_tensor a = eval_logits(*g, in), b = eval_logits(*g, shifted);
    const auto r = ag::compare(b, a, 1e-5, 1e-4);
    if (c.variant == model_variant::llama) {
      EXPECT_TRUE(r.ok) << r.message;
    } else {
      EXPECT_GT(r.max_abs_err, 1e-3) << "gpt2 must see absolute positions";
    }
  }
}

TEST(Transformer, GroupedQueryAttentionWithFullKvEqualsMultiHead) {
  // n_kv_heads == n_heads takes the plain path; writing it explicitly must give
  // the same graph output as the default (0), and n_kv_heads = 2 must differ
  // in parameter count by the saved k/v projections.
  auto a = small(model_variant::llama), b = small(model_variant::llama, 4), q = small(model_variant::llama, 2);
  auto ga = ag::models::build_transformer(a), gb = ag::models::build_transformer(b);
  ASSERT_TRUE(ga && gb);
  auto in = ag::models::transformer_inputs(a, 2);
  EXPECT_TRUE(eval_logits(*ga, in) == eval_logits(*gb, in));
  const int64_t dh = a.d_model / a.n_heads;
  EXPECT_EQ(ag::models::parameter_count(a) - ag::models::parameter_count(q),
            a.n_layers * 2 * a.d_model * (4 - 2) * dh);
}

TEST(Transformer, ReducedPrecisionStorageStaysCloseToF32) {
  for (auto v : {model_variant::gpt2, model_variant::llama}) {
    auto c = small(v);
    auto g32 = ag::models::build_transformer(c);
    ASSERT_TRUE(g32.has_value());
    auto in = ag::models::transformer_inputs(c, 4);
    const host_tensor ref = eval_logits(*g32, in);
    for (auto t : {dtype::f16, dtype::bf16}) {
      SCOPED_TRACE(std::string(ag::models::to_string(v)) + " " + ag::to_string(t));
      c.dtype = t;
      auto g = ag::models::build_transformer(c);
      ASSERT_TRUE(g.has_value()) << g.err().to_string();
      for (const auto& n : g->nodes()) {
        if (n.op == ag::op_kind::weight) {
          EXPECT_EQ(n.type, t) << n.name;
        }
      }
      EXPECT_EQ(g->at(g->outputs()[0]).type, dtype::f32);
      EXPECT_EQ(g->at(g->outputs()[0]).op, ag::op_kind::copy);
      const host_tensor lo = eval_logits(*g, in);
      // Weights and every activation are rounded to 11 (f16) / 8 (bf16)
      // significant bits; logits are O(0.1-1). Measured: 2.7e-4 (f16) and
      // 2.4e-3 (bf16) max abs error for both variants.
      const auto r = ag::compare(lo, ref, t == dtype::f16 ? 2e-3 : 1.5e-2, 0.0);
      EXPECT_TRUE(r.ok) << r.message;
      EXPECT_GT(r.max_abs_err, 0.0) << "storage type had no effect";
    }
  }
}

TEST(Transformer, InvalidConfigsAreRejectedWithTheField) {
  struct bad_case {
    const char* field;
    void (*mutate)(transformer_config&);
  };
  const bad_case cases[] = {
      {"n_layers", [](transformer_config& c) { c.n_layers = 0; }},
      {"d_model", [](transformer_config& c) { c.d_model = 0; }},
      {"n_heads", [](transformer_config& c) { c.n_heads = 0; }},
      {"n_heads", [](transformer_config& c) { c.n_heads = 5; }},
      {"n_kv_heads", [](transformer_config& c) { c.variant = model_variant::llama; c.n_kv_heads = 3; }},
      {"n_kv_heads", [](transformer_config& c) { c.n_kv_heads = 2; }},  // gpt2 has no GQA
      {"n_kv_heads", [](transformer_config& c) { c.n_kv_heads = -1; }},
      {"head_dim", [](transformer_config& c) { c.variant = model_variant::llama; c.d_model = 36; c.n_heads = 4; }},
      {"set explicit_head_dim", [](transformer_config& c) { c.variant = model_variant::llama; c.d_model = 30; c.n_heads = 4; }},
      {"head_dim 7 must be even", [](transformer_config& c) { c.variant = model_variant::llama; c.explicit_head_dim = 7; }},
      {"explicit_head_dim must be >= 0", [](transformer_config& c) { c.variant = model_variant::llama; c.explicit_head_dim = -8; }},
      {"gpt2's heads split d_model", [](transformer_config& c) { c.explicit_head_dim = 32; }},
      {"d_ff", [](transformer_config& c) { c.d_ff = -4; }},
      {"vocab", [](transformer_config& c) { c.vocab = 0; }},
      {"seq_len", [](transformer_config& c) { c.seq_len = 0; }},
      {"batch", [](transformer_config& c) { c.batch = -1; }},
      {"max_positions", [](transformer_config& c) { c.max_positions = 3; }},
      {"dtype", [](transformer_config& c) { c.dtype = dtype::i32; }},
      {"eps", [](transformer_config& c) { c.eps = 0.0f; }},
      {"eps", [](transformer_config& c) { c.eps = NAN; }},
      {"initializer_range", [](transformer_config& c) { c.initializer_range = 0.0f; }},
      {"rope_theta", [](transformer_config& c) { c.variant = model_variant::llama; c.rope_theta = -1.0f; }},
      {"variant", [](transformer_config& c) { c.variant = static_cast<model_variant>(7); }},
      {"sliding_window must be >= 0", [](transformer_config& c) { c.variant = model_variant::llama; c.sliding_window = -2; }},
      {"sliding_window is for llama models", [](transformer_config& c) { c.sliding_window = 4; }},
      {"rows_apart", [](transformer_config& c) {
         c.kv_cache_capacity = 16;
         c.rows_apart = true;  // without mask_from_positions
       }},
      // Token states: one token a job over a cache; out keeps an argmax; two names.
      {"token_state_in", [](transformer_config& c) { c.token_state_in = "t"; }},
      {"token_state_out", [](transformer_config& c) { c.argmax_output = true; c.token_state_out = "t"; }},
      {"token_state_out", [](transformer_config& c) {
         c.batch = c.seq_len = 1;
         c.kv_cache_capacity = 4;
         c.token_state_out = "t";  // without argmax_output
       }},
      {"token_state_in", [](transformer_config& c) {
         c.batch = c.seq_len = 1;
         c.kv_cache_capacity = 4;
         c.argmax_output = true;
         c.token_state_in = c.token_state_out = "t";
       }},
      // A batched step's token states: a row each, every row's logits.
      {"token_state_rows must be 1..65536", [](transformer_config& c) {
         c.batch = c.seq_len = 1;
         c.kv_cache_capacity = 4;
         c.token_state_in = "t";
         c.token_state_rows = 0;
       }},
      {"in 2 rows (token_state_rows), fewer than seq_len 4", [](transformer_config& c) {
         c.batch = 1;
         c.seq_len = 4;
         c.kv_cache_capacity = 8;
         c.last_row_logits = false;
         c.argmax_output = true;
         c.token_state_out = "t";
         c.token_state_rows = 2;
       }},
      {"needs every row's logits (last_row_logits off)", [](transformer_config& c) {
         c.batch = 1;
         c.seq_len = 4;
         c.kv_cache_capacity = 8;
         c.last_row_logits = true;
         c.token_state_in = "t";
         c.token_state_rows = 4;
       }},
  };
  for (const auto& bc : cases) {
    auto c = small(model_variant::gpt2);
    bc.mutate(c);
    auto g = ag::models::build_transformer(c);
    ASSERT_FALSE(g.has_value()) << bc.field;
    EXPECT_EQ(g.err().code, ag::errc::invalid_argument) << bc.field;
    EXPECT_NE(g.err().message.find(bc.field), std::string::npos) << g.err().message;
    EXPECT_EQ(ag::models::parameter_count(c), 0) << bc.field;
  }
}

// Fuzzing (fuzz_checkpoint, a config.json of GPT-2 with n_embd 933921636)
// found parameter_count() overflowing 64 bits: each weight matrix fitted,
// their sum did not. validate() now counts the parameters first and refuses
// widths whose count overflows, naming them; parameter_count() is then 0.
TEST(Transformer, WidthsWhoseParametersOverflow64BitsAreRejected) {
  for (auto v : {model_variant::gpt2, model_variant::llama}) {
    transformer_config c;
    c.variant = v;
    c.d_model = 933921636;
    c.n_heads = 6;  // heads of 155653606: even, as RoPE needs
    c.d_ff = 4 * c.d_model;
    c.n_layers = 12;
    c.vocab = 50257;
    c.seq_len = 1;
    SCOPED_TRACE(ag::models::to_string(v));
    const ag::error e = ag::models::validate(c);
    ASSERT_TRUE(e);
    EXPECT_NE(e.message.find("sizes overflow 64-bit element counts: d_model 933921636"), std::string::npos) << e.message;
    EXPECT_EQ(ag::models::parameter_count(c), 0);
    c.d_model = 120000, c.d_ff = 480000, c.n_layers = 4;  // 7e11-9e11 parameters: valid, counted
    ASSERT_FALSE(ag::models::validate(c)) << ag::models::validate(c).to_string();
    EXPECT_GT(ag::models::parameter_count(c), int64_t{1} << 39);
  }
}

TEST(Transformer, VariantNamesRoundTrip) {
  for (auto v : {model_variant::gpt2, model_variant::llama}) {
    model_variant out{};
    ASSERT_TRUE(ag::models::parse_variant(ag::models::to_string(v), out));
    EXPECT_EQ(out, v);
  }
  model_variant out{};
  EXPECT_FALSE(ag::models::parse_variant("bert", out));
}

TEST(Transformer, HeadTyingFollowsTheConfig) {
  using ag::models::head_tying;
  for (auto v : {model_variant::gpt2, model_variant::llama}) {
    for (auto tying : {head_tying::variant_default, head_tying::tied, head_tying::separate}) {
      auto c = small(v);
      c.head = tying;
      const bool tied = tying == head_tying::tied || (tying == head_tying::variant_default && v == model_variant::gpt2);
      SCOPED_TRACE(std::string(ag::models::to_string(v)) + " tied=" + std::to_string(tied));
      EXPECT_EQ(c.tied_head(), tied);
      auto g = ag::models::build_transformer(c);
      ASSERT_TRUE(g.has_value()) << g.err().to_string();
      const auto names = ag::models::weight_names(c);
      EXPECT_EQ(std::count(names.begin(), names.end(), "lm_head"), tied ? 0 : 1);
      EXPECT_EQ(g->find("lm_head") != ag::no_node, !tied);
      int64_t elems = 0;
      for (const auto& n : g->nodes())
        if (n.op == ag::op_kind::weight) elems += n.dims.numel();
      EXPECT_EQ(elems, ag::models::parameter_count(c));
      // The head matmul's second operand is the embedding table itself when tied.
      const auto& head = g->at(g->find("logits"));
      ASSERT_EQ(head.op, ag::op_kind::matmul);
      const std::string embed = v == model_variant::gpt2 ? "wte" : "embed_tokens";
      EXPECT_EQ(g->at(head.inputs[1]).name, tied ? embed : std::string("lm_head"));
    }
  }
}

TEST(Transformer, Gpt2ActivationPicksTheGeluVariant) {
  auto c = small(model_variant::gpt2);
  c.initializer_range = 0.5f;  // large pre-activations, where tanh and erf GELU differ
  auto tanh_g = ag::models::build_transformer(c);
  c.activation = ag::gelu_mode::erf;
  auto erf_g = ag::models::build_transformer(c);
  ASSERT_TRUE(tanh_g.has_value() && erf_g.has_value());
  EXPECT_EQ(erf_g->at(erf_g->find("l1.mlp.gelu")).attrs.gelu, ag::gelu_mode::erf);
  EXPECT_EQ(tanh_g->at(tanh_g->find("l1.mlp.gelu")).attrs.gelu, ag::gelu_mode::tanh);
  auto in = ag::models::transformer_inputs(c, 2);
  auto c_tanh = ag::compare(eval_logits(*tanh_g, in), eval_logits(*erf_g, in), 0, 0);
  EXPECT_FALSE(c_tanh.ok) << "tanh and erf GELU gave identical logits";
}

TEST(Transformer, WeightProviderSuppliesEveryWeightByName) {
  for (auto c : all_small()) {
    SCOPED_TRACE(label(c));
    auto random = ag::models::build_transformer(c);
    ASSERT_TRUE(random.has_value()) << random.err().to_string();
    std::vector<std::string> asked;
    ag::models::weight_provider provider = [&](const std::string& name, dtype type,
                                               const ag::shape& dims) -> ag::expected<ag::weight_source_ptr> {
      asked.push_back(name);
      const auto& n = random->at(random->find(name));
      EXPECT_EQ(n.dims, dims) << name;
      EXPECT_EQ(n.type, type) << name;
      // A copy of the random weight: same values through another source object.
      return ag::make_host_weight(*n.data->in_memory());
    };
    auto g = ag::models::build_transformer(c, provider);
    ASSERT_TRUE(g.has_value()) << g.err().to_string();
    EXPECT_EQ(asked, ag::models::weight_names(c));
    auto in = ag::models::transformer_inputs(c, 4);
    EXPECT_TRUE(eval_logits(*g, in) == eval_logits(*random, in));
  }
}

TEST(Transformer, WeightProviderErrorsNameTheWeight) {
  auto c = small(model_variant::llama, 2);
  // A source of other dims: invalid_shape naming the weight, its source and the dims it needs.
  auto g = ag::models::build_transformer(c, [](const std::string& name, dtype type, const ag::shape& dims)
                                                -> ag::expected<ag::weight_source_ptr> {
    if (name == "embed_tokens") return ag::make_shape_only_weight(type, {1});
    return ag::make_shape_only_weight(type, dims);
  });
  ASSERT_FALSE(g.has_value());
  EXPECT_EQ(g.err().code, ag::errc::invalid_shape);
  EXPECT_NE(g.err().message.find("'embed_tokens' (shapes only)"), std::string::npos) << g.err().message;
  EXPECT_NE(g.err().message.find("[41, 32]"), std::string::npos) << g.err().message;

  auto exact = [&](const std::string& bad_name, ag::error e, dtype bad_type) {
    return [=](const std::string& name, dtype type, const ag::shape& dims) -> ag::expected<ag::weight_source_ptr> {
      if (name == bad_name) {
        if (e) return e;
        return ag::make_shape_only_weight(bad_type, dims);
      }
      return ag::make_shape_only_weight(type, dims);
    };
  };
  // The provider's own error comes back unchanged.
  g = ag::models::build_transformer(c, exact("l2.attn.wk", {ag::errc::invalid_argument, "no tensor l2.attn.wk"}, dtype::f32));
  ASSERT_FALSE(g.has_value());
  EXPECT_EQ(g.err().code, ag::errc::invalid_argument);
  EXPECT_EQ(g.err().message, "no tensor l2.attn.wk");
  g = ag::models::build_transformer(c, exact("none", {}, dtype::f32));
  EXPECT_TRUE(g.has_value()) << "sources of the right dims and dtype build a graph";
  g = ag::models::build_transformer(c, exact("l1.mlp.w_up", {}, dtype::bf16));
  ASSERT_FALSE(g.has_value());
  EXPECT_EQ(g.err().code, ag::errc::dtype_mismatch);
  EXPECT_NE(g.err().message.find("'l1.mlp.w_up'"), std::string::npos) << g.err().message;
  EXPECT_NE(g.err().message.find("shapes only"), std::string::npos) << g.err().message;
}

}  // namespace

// cache_attention_mask builds each row from the one before; every entry must
// equal the definition taken entry by entry: row r holds the latest position
// p <= cached + n - 1 with p % C == r, and query i sees it when p is in
// [first_i, last_i] (last_i = cached + max(i - (T - n), 0): the real rows
// last, the padding before them; first_i = 0 or, with
// a window, last_i - window + 1). Caches that hold every position, rings
// that wrap once or many times, windows wider and narrower than the chunk,
// padding rows, and every dtype; filled in parts (fill_cache_attention_mask_rows,
// as the generator fills a large mask on several threads), the same bytes.
namespace {
struct mask_case {
  int64_t T, C, cached, n, window;
};
// Caches that hold every position, rings that wrap once or many times,
// windows wider and narrower than the chunk, padding rows.
constexpr mask_case mask_cases[] = {
    {1, 16, 0, 1, 0},   {1, 16, 9, 1, 0},    {8, 64, 0, 8, 0},     {8, 64, 10, 5, 0},   // padding rows
    {16, 40, 0, 16, 0}, {4, 19, 37, 4, 16},  {4, 19, 3, 4, 16},    {8, 15, 100, 8, 8},  // rings
    {8, 15, 90, 3, 8},  {32, 40, 7, 32, 9},  {1, 10, 1000, 1, 10}, {5, 7, 12, 5, 3},
};
std::string label(const mask_case& mc, dtype t) {
  return "T " + std::to_string(mc.T) + " C " + std::to_string(mc.C) + " cached " + std::to_string(mc.cached) + " n " +
         std::to_string(mc.n) + " window " + std::to_string(mc.window) + " " + ag::to_string(t);
}
}  // namespace

TEST(Transformer, CacheAttentionMaskEqualsItsDefinitionEntryByEntry) {
  for (const mask_case& mc : mask_cases)
    for (dtype t : {dtype::f32, dtype::f16, dtype::bf16}) {
      SCOPED_TRACE(label(mc, t));
      const host_tensor m = ag::models::cache_attention_mask(t, mc.T, mc.C, mc.cached, mc.n, mc.window);
      ASSERT_EQ(m.dims(), ag::shape({mc.T, mc.C}));
      ASSERT_EQ(m.type(), t);
      const int64_t top = mc.cached + mc.n - 1;
      const float hidden = host_tensor::from_floats(t, {1}, {ag::models::attention_masked_score}).at(0);
      int64_t shown = 0;
      for (int64_t i = 0; i < mc.T; ++i) {
        const int64_t last = mc.cached + std::max<int64_t>(i - (mc.T - mc.n), 0);  // the real rows last
        const int64_t first = mc.window > 0 ? std::max<int64_t>(0, last - mc.window + 1) : 0;
        for (int64_t r = 0; r < mc.C; ++r) {
          int64_t p = top - ((top - r) % mc.C + mc.C) % mc.C;
          const bool sees = p >= first && p <= last;
          shown += sees;
          ASSERT_EQ(m.at(i * mc.C + r), sees ? 0.0f : hidden) << "query " << i << ", cache row " << r;
        }
      }
      EXPECT_GT(shown, 0) << "every case shows some key";
      // Filled in parts, the last part first (as threads may finish), the
      // same bytes: each part starts from its first row's definition.
      for (const int64_t parts : {int64_t{2}, int64_t{3}, mc.T}) {
        host_tensor p = host_tensor::uninitialized(t, {mc.T, mc.C});
        for (int64_t k = parts - 1; k >= 0; --k)
          ag::models::fill_cache_attention_mask_rows(p, mc.cached, mc.n, mc.window, mc.T * k / parts,
                                                     mc.T * (k + 1) / parts);
        EXPECT_EQ(std::memcmp(p.data(), m.data(), m.bytes()), 0) << "filled in " << parts << " parts";
      }
    }
}

// transformer_config::mask_from_positions: the graph builds the mask from
// the key positions and query ranges cache_mask_inputs makes
// (op_kind::range_mask). The reference's range_mask over them gives the
// host's cache_attention_mask byte for byte, every case and dtype; keys the
// cache does not hold yet are -1.
TEST(Transformer, RangeMaskOverCacheMaskInputsEqualsTheHostsMask) {
  for (const mask_case& mc : mask_cases)
    for (dtype t : {dtype::f32, dtype::f16, dtype::bf16}) {
      SCOPED_TRACE(label(mc, t));
      const ag::models::cache_mask_positions in = ag::models::cache_mask_inputs(mc.T, mc.C, mc.cached, mc.n, mc.window);
      ASSERT_EQ(in.key_positions.dims(), ag::shape({mc.C}));
      ASSERT_EQ(in.query_ranges.dims(), ag::shape({mc.T, 2}));
      if (mc.cached + mc.n < mc.C) {  // the rows past the sequence hold nothing
        std::vector<int32_t> keys(static_cast<std::size_t>(mc.C));
        std::memcpy(keys.data(), in.key_positions.data(), in.key_positions.bytes());
        EXPECT_EQ(keys.back(), -1);
      }
      ag::graph_builder b;
      ag::tensor keys = b.input("key_positions", dtype::i32, {mc.C});
      ag::tensor ranges = b.input("query_ranges", dtype::i32, {mc.T, 2});
      b.output(b.range_mask(keys, ranges, t, "attn_mask"));
      auto g = std::move(b).build();
      ASSERT_TRUE(g) << g.err().message;
      auto out = ag::evaluate_reference(*g, {in.key_positions, in.query_ranges});
      ASSERT_TRUE(out) << out.err().message;
      const host_tensor m = ag::models::cache_attention_mask(t, mc.T, mc.C, mc.cached, mc.n, mc.window);
      ASSERT_EQ((*out)[0].dims(), m.dims());
      ASSERT_EQ((*out)[0].type(), t);
      EXPECT_EQ(std::memcmp((*out)[0].data(), m.data(), m.bytes()), 0);
    }
}

// transformer_config::rows_apart marks the mask built from positions
// (op_attrs::rows_apart: what lets a CUDA device run a batched step's rows'
// attention apart); without it the mask is not marked.
TEST(Transformer, RowsApartMarksTheRangeMask) {
  for (bool apart : {false, true}) {
    auto c = small(model_variant::llama);
    c.kv_cache_capacity = 32;
    c.mask_from_positions = true;
    c.rows_apart = apart;
    auto g = ag::models::build_transformer(c);
    ASSERT_TRUE(g) << g.err().message;
    int masks = 0;
    for (const ag::node& n : g->nodes())
      if (n.op == ag::op_kind::range_mask) {
        ++masks;
        EXPECT_EQ(n.attrs.rows_apart, apart) << n.name;
      }
    EXPECT_EQ(masks, 1);
  }
}

// range_mask's operands are checked where the graph is built: i32 key
// positions [C] and query ranges [T, 2], and a float mask; the error names
// the operand and its shape or dtype.
TEST(Transformer, RangeMaskRejectsOperandsOfTheWrongShapeOrDtype) {
  struct bad_case {
    dtype keys_t;
    ag::shape keys;
    dtype ranges_t;
    ag::shape ranges;
    dtype out;
    const char* says;
  };
  const bad_case cases[] = {
      {dtype::f32, {8}, dtype::i32, {4, 2}, dtype::bf16, "key_positions 'k' are f32, must be i32"},
      {dtype::i32, {8}, dtype::bf16, {4, 2}, dtype::bf16, "query_ranges 'r' are bf16, must be i32"},
      {dtype::i32, {2, 8}, dtype::i32, {4, 2}, dtype::bf16, "key_positions [2, 8] must be [C]"},
      {dtype::i32, {8}, dtype::i32, {4, 3}, dtype::bf16, "query_ranges [4, 3] must be [T, 2]"},
      {dtype::i32, {8}, dtype::i32, {4}, dtype::bf16, "query_ranges [4] must be [T, 2]"},
      {dtype::i32, {8}, dtype::i32, {4, 2}, dtype::i32, "a mask of i32: it must be a float type"},
  };
  for (const bad_case& bc : cases) {
    SCOPED_TRACE(bc.says);
    ag::graph_builder b;
    ag::tensor k = b.input("k", bc.keys_t, bc.keys);
    ag::tensor r = b.input("r", bc.ranges_t, bc.ranges);
    ag::tensor m = b.range_mask(k, r, bc.out, "mask");
    if (m.valid()) b.output(m);
    auto g = std::move(b).build();
    ASSERT_FALSE(g);
    EXPECT_NE(g.err().message.find(bc.says), std::string::npos) << g.err().message;
    EXPECT_NE(g.err().message.find("mask"), std::string::npos) << "names the node: " << g.err().message;
  }
}
