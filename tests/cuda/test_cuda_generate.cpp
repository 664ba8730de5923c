// ag::generator on real GPUs: decode over the KV cache (step graphs: cache
// concat, broadcast mask add, non-causal softmax) equals recomputing the
// whole sequence with the reference evaluator, for tiny GPT-2 and LLaMA GQA
// checkpoints written by the test (f32, and bf16 with a bf16 tolerance), on
// one GPU and pipelined over two.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <future>
#include <iterator>

#include "actors/generator.hpp"
#include "actors/launch_program.hpp"
#include "checkpoint/checkpoint_test_util.hpp"
#include "cuda/cuda_test_util.hpp"
#include "graph/models/transformer.hpp"
#include "graph/hidden_keys_attention.hpp"
#include "graph/reference.hpp"

namespace ag {
namespace {

using namespace std::chrono_literals;

std::vector<float> recomputed_last_logits(const models::hf_model& m, const std::vector<int32_t>& tokens) {
  const auto n = static_cast<int64_t>(tokens.size());
  auto g = m.build(n);
  EXPECT_TRUE(g) << g.err().to_string();
  if (!g) return {};
  std::vector<int32_t> pos(tokens.size());
  for (std::size_t i = 0; i < pos.size(); ++i) pos[i] = static_cast<int32_t>(i);
  auto r = evaluate_reference(*g, {host_tensor::from_ints({1, n}, tokens), host_tensor::from_ints({n}, pos)});
  EXPECT_TRUE(r) << r.err().to_string();
  if (!r) return {};
  const int64_t V = (*r)[0].dims()[2];
  std::vector<float> row(static_cast<std::size_t>(V));
  for (int64_t i = 0; i < V; ++i) row[static_cast<std::size_t>(i)] = (*r)[0].at((n - 1) * V + i);
  return row;
}

// A prompt of n tokens below 1000 from a xorshift stream seeded `seed`.
std::vector<int32_t> xorshift_prompt(std::size_t n, uint64_t seed) {
  std::vector<int32_t> prompt(n);
  for (int32_t& t : prompt) {
    seed ^= seed << 13, seed ^= seed >> 7, seed ^= seed << 17;
    t = static_cast<int32_t>(seed % 1000);
  }
  return prompt;
}

// The largest of |want - got| over its tolerance: bf16, 0.1 + 5% of the
// value (every node rounded to 8 mantissa bits); f32, 2e-3. Below 1: within.
double worst_over_tolerance(const std::vector<float>& want, const std::vector<float>& got, bool bf16) {
  double worst = 0.0;
  for (std::size_t i = 0; i < want.size() && i < got.size(); ++i) {
    const double allowed = bf16 ? 0.1 + 0.05 * std::abs(want[i]) : 2e-3;
    worst = std::max(worst, std::abs(want[i] - got[i]) / allowed);
  }
  return worst;
}

// Generates 6 tokens after a fixed prompt with their logits kept: each
// step's logits equal recomputing the sequence with the reference evaluator
// (bf16: 0.1 + 5% of the value, every node being rounded to 8 mantissa bits,
// so the GPU and the reference may round a value to neighbouring steps and
// carry it on; f32: 2e-3 and the same token); then greedily without logits:
// the tokens picked on the GPU (argmax of the same head output) equal the
// host's picks. `greedy` gets the second run's result.
void expect_generation_equals_recompute(generator& gen, const models::hf_model& m, bool bf16,
                                        generation_result& greedy) {
  const std::vector<int32_t> prompt{3, 1, 4, 1, 5, 9};
  generate_options o;
  o.max_new_tokens = 6;
  o.keep_logits = true;
  const generation h = gen.generate(prompt, o);
  ASSERT_TRUE(h.wait_for(120s)) << "generation hung";
  const auto& r = h.wait();
  ASSERT_TRUE(r) << r.err().to_string();
  ASSERT_EQ(r->tokens.size(), 6u);
  std::vector<int32_t> seq = prompt;
  for (std::size_t t = 0; t < r->tokens.size(); ++t) {
    const std::vector<float> ref = recomputed_last_logits(m, seq);
    ASSERT_EQ(ref.size(), r->logits[t].size());
    EXPECT_LT(worst_over_tolerance(ref, r->logits[t], bf16), 1.0) << "token " << t << ": error over tolerance";
    if (!bf16) { EXPECT_EQ(r->tokens[t], std::max_element(ref.begin(), ref.end()) - ref.begin()) << "token " << t; }
    seq.push_back(r->tokens[t]);
  }
  o.keep_logits = false;
  const generation d = gen.generate(prompt, o);
  ASSERT_TRUE(d.wait_for(120s)) << "generation hung";
  const auto& dr = d.wait();
  ASSERT_TRUE(dr) << dr.err().to_string();
  EXPECT_EQ(dr->tokens, r->tokens);
  greedy = *dr;
}

// head_dim: the tiny models' heads (8) or wider (d_model = 4 heads of it):
// from 32 on, a fused attention takes in the KV cache's stores and ropes.
// sequence_parallel: plan_options::sequence_parallel on, with every
// reduce-scatter and all-gather on the copy engines (the one-shot limit at 0).
void decode_on(const std::string& spec, int stages, bool fuse_ops = false, int64_t head_dim = 8,
               int tensor_degree = 1, bool sequence_parallel = false) {
  runtime_options ro;
  if (sequence_parallel) ro.backend.cuda_nccl_min_bytes = 1;
  auto rt = runtime::create(spec, ro);
  ASSERT_TRUE(rt) << rt.err().to_string();
  const auto widened = [&](models::transformer_config c) {
    // The initial scale shrinks with the width (as 1 / sqrt(fan-in)), so
    // that the logits, and with them bf16's rounding, stay the tiny model's size.
    c.initializer_range *= std::sqrt(static_cast<float>(c.d_model) / static_cast<float>(c.n_heads * head_dim));
    c.d_model = c.n_heads * head_dim;
    c.d_ff = 3 * c.d_model / 2;
    return c;
  };
  auto bf16_llama = widened(test::tiny_model(models::model_variant::llama, 2));
  bf16_llama.dtype = dtype::bf16;
  // Qwen2's q/k/v biases (a tied head), bf16.
  auto bf16_qwen2 = bf16_llama;
  bf16_qwen2.attn_bias = models::attention_bias::qkv;
  bf16_qwen2.head = models::head_tying::tied;
  // Qwen3's q/k norms, bf16.
  auto bf16_qwen3 = bf16_llama;
  bf16_qwen3.qk_norm = true;
  // Mistral's sliding window (4 keys, over a prompt of 6 and 6 new tokens; a
  // ring of 7 cache rows), f32.
  auto mistral = widened(test::tiny_model(models::model_variant::llama, 2));
  mistral.sliding_window = 4;
  for (const auto& cfg : {widened(test::tiny_model(models::model_variant::gpt2)),
                          widened(test::tiny_model(models::model_variant::llama, 2)), bf16_llama, bf16_qwen2,
                          bf16_qwen3, mistral}) {
    SCOPED_TRACE(std::string(models::to_string(cfg.variant)) + " " + to_string(cfg.dtype) + " bias " +
                 models::to_string(cfg.attn_bias) + (cfg.qk_norm ? " qk_norm" : "") +
                 (cfg.sliding_window > 0 ? " window " + std::to_string(cfg.sliding_window) : "") + " on " + spec);
    const bool bf16 = cfg.dtype == dtype::bf16;
    test::temp_dir dir;
    test::save_random_model(dir.str(), cfg);
    auto m = models::hf_model::open(dir.str());
    ASSERT_TRUE(m) << m.err().to_string();
    generator_options go;
    go.cache_tokens = 16;
    go.prefill_chunk = 4;
    go.decode_batch = 0;  // a slot a sequence (lanes on the GPU: BatchedDecodeOfEightSequences...)
    go.plan.pipeline_stages = stages;
    go.plan.tensor_parallel = tensor_degree;
    go.plan.fuse_ops = fuse_ops;
    if (sequence_parallel) go.plan.sequence_parallel = sequence_parallel_mode::on;
    auto gen = generator::create(**rt, m->model_config(1), m->provider(), go);
    ASSERT_TRUE(gen) << gen.err().to_string();
    EXPECT_EQ((*gen)->cache_rows(), cfg.sliding_window > 0 ? 7 : 16) << "a window of 4: a ring of 4 + 3 rows";
    if (sequence_parallel) {  // the prefill's reduce-scatters on the copy engines
      const plan* prefill = (*gen)->prefill_plan();
      ASSERT_NE(prefill, nullptr);
      EXPECT_GT(test::collective_steps(*prefill, collective_algo::copy_engine), 0);
    }
    generation_result dr;
    expect_generation_equals_recompute(**gen, *m, bf16, dr);
    if (::testing::Test::HasFatalFailure()) return;
    EXPECT_EQ(dr.tokens_picked_on_device, 5) << "the first token from the last prefill chunk's logits (2 tokens)";
    // Steps 2.. read their token on the device (pipeline_depth 2): queued
    // behind the step before on one stream, started when it ended over
    // tensor-parallel ranks; over stages one step at a time.
    EXPECT_EQ(dr.tokens_pipelined, stages > 1 ? 0 : 4);
  }
}

// The attention of a step graph in isolation: cache rows joined with new
// ones (concat of a view), the [S, C+S] mask added with broadcasting over
// [B, H, S, C+S], a non-causal scaled softmax, the product with the values.
TEST(CudaGenerate, CachedAttentionOpsMatchReference) {
  AG_REQUIRE_GPU(1);
  for (dtype t : {dtype::f32, dtype::bf16}) {
    const int64_t H = 4, S = 3, C = 37, dh = 16;
    graph_builder b;
    auto q = b.input("q", t, {1, H, S, dh});
    auto kc = b.input("k_cache", t, {1, H, C, dh});
    auto vc = b.input("v_cache", t, {1, H, C, dh});
    auto kn = b.input("k_new", t, {1, S, H, dh});
    auto vn = b.input("v_new", t, {1, S, H, dh});
    auto mask = b.input("mask", t, {S, C + S});
    auto k = b.concat({kc, b.permute(kn, {0, 2, 1, 3})}, 2);
    auto v = b.concat({vc, b.permute(vn, {0, 2, 1, 3})}, 2);
    auto scores = b.add(b.matmul(q, k, false, true), mask);
    auto o = b.matmul(b.softmax(scores, false, 0.25f), v);
    b.output(o);
    auto g = std::move(b).build();
    ASSERT_TRUE(g) << g.err().to_string();
    std::vector<float> m(static_cast<std::size_t>(S * (C + S)));
    for (int64_t i = 0; i < S; ++i)
      for (int64_t j = 0; j < C + S; ++j)
        m[static_cast<std::size_t>(i * (C + S) + j)] = (j < C ? j < 20 : j - C <= i) ? 0.0f : -30000.0f;
    check_against_reference(*g,
                            {host_tensor::random_normal(t, {1, H, S, dh}, 1, 1.0f),
                             host_tensor::random_normal(t, {1, H, C, dh}, 2, 1.0f),
                             host_tensor::random_normal(t, {1, H, C, dh}, 3, 1.0f),
                             host_tensor::random_normal(t, {1, S, H, dh}, 4, 1.0f),
                             host_tensor::random_normal(t, {1, S, H, dh}, 5, 1.0f), host_tensor::from_floats(t, {S, C + S}, m)},
                            t == dtype::f32 ? test::tol{1e-4, 1e-4} : test::tol{6e-2, 6e-2},
                            "cached attention " + std::string(to_string(t)));
  }
}

TEST(CudaGenerate, DecodeEqualsRecomputeOnOneGpu) {
  AG_REQUIRE_GPU(1);
  decode_on("cuda:0", 1);
}

// plan_options::fuse_ops: each decode step's attention is one fused kernel
// (graph/fusion.hpp); generation still equals recomputing the sequence.
TEST(CudaGenerate, DecodeWithFusedAttentionEqualsRecomputeOnOneGpu) {
  AG_REQUIRE_GPU(1);
  decode_on("cuda:0", 1, /*fuse_ops=*/true);
}

// Heads of 32 and 64: each decode step's fused attention also rotates q and
// the new key (LLaMA), stores the new key and value rows into the cache and
// reads them from there (graph/fusion.hpp's cache prologue), token after
// token on one state slot; generation still equals recomputing the sequence.
TEST(CudaGenerate, DecodeWithTheCacheStoresAndRopesInTheFusedAttentionEqualsRecompute) {
  AG_REQUIRE_GPU(1);
  for (int64_t head : {int64_t{32}, int64_t{64}})
    for (bool fuse : {false, true}) {  // the same models through the unfused kernels too
      SCOPED_TRACE("heads of " + std::to_string(head) + (fuse ? ", fused" : ", unfused"));
      decode_on("cuda:0", 1, fuse, head);
    }
}

// The same at tensor degree 2 on two logical devices of one GPU: each
// device's fused attention stores and rotates its share of the kv heads.
TEST(CudaGenerate, DecodeAtTensorDegreeTwoWithTheCacheStoresAndRopesFusedEqualsRecompute) {
  AG_REQUIRE_GPU(1);
  decode_on("cuda:0,0", 1, /*fuse_ops=*/true, /*head_dim=*/32, /*tensor_degree=*/2);
}

// Sequence parallelism in the prefill chunks (their rows split over the two
// ranks, reduce-scatters and all-gathers on the copy engines, as the CUDA
// default plans activations of 16 MiB and more at width 4096); the one-row decode steps
// keep their all-reduces.
TEST(CudaGenerate, DecodeAtTensorDegreeTwoWithSequenceParallelPrefillEqualsRecompute) {
  AG_REQUIRE_GPU(1);
  decode_on("cuda:0,0", 1, /*fuse_ops=*/true, /*head_dim=*/32, /*tensor_degree=*/2, /*sequence_parallel=*/true);
}

// Jobs of a decode-step plan of `cfg` compiled with `o` (4 state slots),
// each (with a cache: on a fresh state slot) against the reference.
void decode_steps_equal_the_reference(runtime& rt, const models::transformer_config& cfg, plan_options o,
                                      std::size_t attention_fusions, std::size_t projection_groups) {
  auto g = std::make_shared<const graph>(models::build_transformer(cfg).value());
  o.state_slots = 4;
  auto p = rt.compile(g, o);
  ASSERT_TRUE(p) << p.err().to_string();
  EXPECT_EQ((*p)->fusions().size(), attention_fusions) << "fused attentions";
  // Heads of 32 and more with a cache: every fused attention took in its
  // cache's stores (and, for LLaMA, the ropes of q and k).
  const bool prologue = cfg.kv_cache_capacity > 0 && cfg.head_dim() >= 32;
  for (const attention_fusion& f : (*p)->fusions()) {
    EXPECT_EQ(f.k_store != no_node && f.v_store != no_node, prologue) << "cache stores fused";
    const bool llama = cfg.variant == models::model_variant::llama;
    EXPECT_EQ(f.q_rope != no_node && f.k_rope != no_node, prologue && llama) << "ropes fused";
  }
  EXPECT_EQ((*p)->projection_fusions().size(), projection_groups) << "projection groups";
  for (int k = 0; k < 4; ++k) {
    std::vector<host_tensor> in;
    for (node_id id : g->inputs()) {
      const node& n = g->at(id);
      if (n.type == dtype::i32) {
        // tokens < vocab; positions and cache positions: row k of the cache
        const bool tokens = n.name.find("token") != std::string::npos;
        in.push_back(tokens ? host_tensor::random_ints(n.dims, 40 + static_cast<uint64_t>(k), cfg.vocab)
                            : host_tensor::from_ints(n.dims, std::vector<int32_t>(
                                                                 static_cast<std::size_t>(n.dims.numel()), k)));
      } else {
        // the [S, C] mask: key j visible when j <= k
        std::vector<float> m(static_cast<std::size_t>(n.dims.numel()));
        for (std::size_t j = 0; j < m.size(); ++j) m[j] = static_cast<int64_t>(j) <= k ? 0.0f : -30000.0f;
        in.push_back(host_tensor::from_floats(n.type, n.dims, m));
      }
    }
    auto want = evaluate_reference(*g, in);
    ASSERT_TRUE(want) << want.err().to_string();
    submit_options so;
    if (cfg.kv_cache_capacity > 0) so.state_slot = k;  // a fresh slot each: zero cache rows, as the reference has
    const job j = rt.submit(*p, in, so);
    ASSERT_TRUE(j.wait_for(60s)) << "job " << k << " hung";
    const auto& r = j.wait();
    ASSERT_TRUE(r) << "job " << k << ": " << r.err().to_string();
    const auto c = cfg.dtype == dtype::f32 ? compare(r->front(), want->front(), 2e-4, 2e-3)
                                           : compare(r->front(), want->front(), 6e-2, 6e-2);
    EXPECT_TRUE(c.ok) << "job " << k << ": " << c.message;
  }
}

models::transformer_config decode_step_config(models::model_variant variant, dtype t, int64_t cache,
                                              int64_t head_dim = 8) {
  models::transformer_config cfg;
  cfg.variant = variant;
  cfg.n_layers = 2;
  cfg.d_model = 8 * head_dim;
  cfg.n_heads = 8;
  cfg.n_kv_heads = variant == models::model_variant::llama ? 2 : 0;
  cfg.vocab = 97;
  cfg.seq_len = 1;
  cfg.batch = 2;
  cfg.dtype = t;
  cfg.kv_cache_capacity = cache;
  cfg.max_positions = 32;  // GPT-2's position table: the jobs' positions go up to 3
  return cfg;
}

// The fused attention kernel on its own plans: decode-shaped steps of GPT-2
// and LLaMA (grouped-query: 4 query rows per kv head) with a KV cache (mask)
// and without (causal over one key), f32 and bf16, batch 2; each job (with a
// cache: on a fresh state slot) equals the reference, and every layer's
// chain is fused.
TEST(CudaGenerate, FusedAttentionStepsEqualTheReference) {
  AG_REQUIRE_GPU(1);
  auto rt = runtime::create("cuda:0");
  ASSERT_TRUE(rt) << rt.err().to_string();
  for (auto variant : {models::model_variant::gpt2, models::model_variant::llama})
    for (dtype t : {dtype::f32, dtype::bf16})
      for (int64_t cache : {int64_t{0}, int64_t{24}})
        for (int64_t head : {int64_t{8}, int64_t{32}}) {  // 32: with a cache, its stores and ropes fused in
          SCOPED_TRACE(std::string(models::to_string(variant)) + " " + to_string(t) + " cache " +
                       std::to_string(cache) + " heads of " + std::to_string(head));
          plan_options o;
          o.fuse_ops = true;
          o.fuse_projections = false;
          decode_steps_equal_the_reference(**rt, decode_step_config(variant, t, cache, head), o, 2, 0);
        }
}

// Attention over long query runs is one flash kernel (gpu/cuda/
// flash_attention.cuh) that never writes the scores. Each case is the
// chain the transformer builds (q k^T [+ mask] -> softmax -> p v) on its
// own, f16 and bf16 inputs of fresh random values: heads of 64 and 128,
// causal with as many keys as queries and with more (a cache's offset),
// non-causal, an additive mask of
// random finite values and holes, query and key counts that are not
// multiples of the kernel's 64, and q as a strided view (rows not whole
// 16-byte units: the element-by-element loads). And a mask of zeros (a
// generator's: the kernel then reads no mask value in the tiles that all
// of a block's rows see with a 0) with one row's bias of 2.5 at key 300,
// which its block must still add, and one row hiding its keys from 350:
// its block's tiles before 320 read no mask, the one across 350 does. Every
// output equals the reference and the chain is fused.
TEST(CudaGenerate, FlashAttentionOfLongQueryRunsEqualsTheReference) {
  AG_REQUIRE_GPU(1);
  auto rt = runtime::create("cuda:0");
  ASSERT_TRUE(rt) << rt.err().to_string();
  struct attention_case {
    dtype t;
    int64_t batch, heads, S, keys, dh;
    bool causal, mask, strided_q;
    bool zero_mask = false;  // the mask of zeros with a bias and a hidden tail (above)
  };
  const attention_case cases[] = {
      {dtype::bf16, 2, 3, 100, 100, 64, true, false, false},  {dtype::f16, 1, 2, 70, 130, 128, true, false, false},
      {dtype::bf16, 2, 2, 90, 150, 64, false, true, false},
      {dtype::f16, 1, 3, 64, 64, 128, false, false, false},   {dtype::bf16, 1, 2, 96, 96, 64, true, false, true},
      {dtype::bf16, 1, 1, 200, 333, 128, false, true, false},
      {dtype::bf16, 1, 2, 130, 400, 64, false, true, false, true}, {dtype::f16, 1, 1, 130, 400, 128, false, true, false, true},
  };
  uint64_t seed = 7300;
  for (const attention_case& c : cases) {
    SCOPED_TRACE(std::string(to_string(c.t)) + " B " + std::to_string(c.batch) + " H " + std::to_string(c.heads) +
                 " S " + std::to_string(c.S) + " keys " + std::to_string(c.keys) + " dh " + std::to_string(c.dh) +
                 (c.causal ? " causal" : "") + (c.mask ? " masked" : "") + (c.strided_q ? " strided q" : "") +
                 (c.zero_mask ? " (zeros, a bias, a hidden tail)" : ""));
    graph_builder b;
    tensor q = c.strided_q ? b.slice(b.input("q_wide", c.t, {c.batch, c.heads, c.S, c.dh + 2}), 3, 0, c.dh, "q")
                           : b.input("q", c.t, {c.batch, c.heads, c.S, c.dh});
    tensor k = b.input("k", c.t, {c.batch, c.heads, c.keys, c.dh});
    tensor v = b.input("v", c.t, {c.batch, c.heads, c.keys, c.dh});
    tensor scores = b.matmul(q, k, false, true, "qk");
    if (c.mask) scores = b.add(scores, b.input("mask", c.t, {c.S, c.keys}), "masked");
    tensor probs = b.softmax(scores, c.causal, 1.0f / std::sqrt(static_cast<float>(c.dh)), "softmax");
    b.output(b.matmul(probs, v, false, false, "pv"));
    auto g = std::move(b).build();
    ASSERT_TRUE(g) << g.err().to_string();
    std::vector<host_tensor> in;
    for (node_id id : g->inputs()) {
      const node& n = g->at(id);
      if (n.name != "mask") {
        in.push_back(host_tensor::random_normal(n.type, n.dims, ++seed, 1.0f));
        continue;
      }
      // Finite values and holes (-30000) but at each row's first key (a row
      // of holes only would compare the reference's rounding of -30000 + s
      // in bf16, not the kernel), one row left with that key alone.
      if (c.zero_mask) {
        std::vector<float> z(static_cast<std::size_t>(c.S * c.keys), 0.0f);
        z[static_cast<std::size_t>(5 * c.keys + 300)] = 2.5f;
        for (int64_t j = 350; j < c.keys; ++j) z[static_cast<std::size_t>(70 * c.keys + j)] = -30000.0f;
        in.push_back(host_tensor::from_floats(n.type, n.dims, z));
        continue;
      }
      auto m = host_tensor::random_normal(dtype::f32, n.dims, ++seed, 1.0f).to_floats();
      for (std::size_t j = 0; j < m.size(); ++j)
        if ((j * 7919) % 5 == 0 && j % static_cast<std::size_t>(c.keys) != 0) m[j] = -30000.0f;
      for (int64_t j = 1; j < c.keys; ++j) m[static_cast<std::size_t>(3 * c.keys + j)] = -30000.0f;
      in.push_back(host_tensor::from_floats(n.type, n.dims, m));
    }
    plan_options o;
    o.policy = placement_policy::single;
    o.fuse_ops = true;
    auto p = (*rt)->compile(*g, o);
    ASSERT_TRUE(p) << p.err().to_string();
    EXPECT_EQ((*p)->fusions().size(), 1u) << (*p)->describe();
    auto want = evaluate_reference(*g, in);
    ASSERT_TRUE(want) << want.err().to_string();
    for (int round = 0; round < 2; ++round) {
      const job j = (*rt)->submit(*p, in);
      ASSERT_TRUE(j.wait_for(60s)) << "hung";
      const auto& r = j.wait();
      ASSERT_TRUE(r) << r.err().to_string();
      const auto cmp = compare(r->front(), want->front(), 2e-2, 2e-2);
      EXPECT_TRUE(cmp.ok) << "round " << round << ": " << cmp.message;
    }
  }
}

// A long query run over more batch entries than the flash kernel's grid
// takes (graph/fusion.hpp, fused_flash_max_batch) keeps its four kernels
// and still equals the reference, on fresh random values.
TEST(CudaGenerate, AttentionOverMoreBatchEntriesThanTheFlashGridTakesRunsUnfused) {
  AG_REQUIRE_GPU(1);
  auto rt = runtime::create("cuda:0");
  ASSERT_TRUE(rt) << rt.err().to_string();
  const int64_t batch = fused_flash_max_batch + 1, rows = 17, dh = 64;
  graph_builder b;
  auto q = b.input("q", dtype::bf16, {1, batch, rows, dh});
  auto k = b.input("k", dtype::bf16, {1, batch, rows, dh});
  auto v = b.input("v", dtype::bf16, {1, batch, rows, dh});
  auto probs = b.softmax(b.matmul(q, k, false, true, "qk"), true, 0.125f, "softmax");
  b.output(b.matmul(probs, v, false, false, "pv"));
  auto g = std::move(b).build();
  ASSERT_TRUE(g) << g.err().to_string();
  auto p = (*rt)->compile(*g, plan_options{});
  ASSERT_TRUE(p) << p.err().to_string();
  EXPECT_TRUE((*p)->fusions().empty()) << "past the flash kernel's grid";
  std::vector<host_tensor> in;
  uint64_t seed = 7700;
  for (node_id id : g->inputs()) in.push_back(host_tensor::random_normal(dtype::bf16, g->at(id).dims, ++seed, 1.0f));
  auto want = evaluate_reference(*g, in);
  ASSERT_TRUE(want) << want.err().to_string();
  const job j = (*rt)->submit(*p, in);
  ASSERT_TRUE(j.wait_for(60s)) << "hung";
  const auto& r = j.wait();
  ASSERT_TRUE(r) << r.err().to_string();
  const auto cmp = compare(r->front(), want->front(), 3e-2, 3e-2);
  EXPECT_TRUE(cmp.ok) << cmp.message;
}

// A prefill through the transformer: LLaMA with grouped-query heads (4
// query heads per kv head, so a kernel's 64 rows span heads) with a KV cache
// (masked) and without (causal), GPT-2 with heads of 64, bf16 and f16,
// every layer's attention one flash kernel; the logits equal the reference.
TEST(CudaGenerate, PrefillWithFlashAttentionEqualsTheReference) {
  AG_REQUIRE_GPU(1);
  auto rt = runtime::create("cuda:0");
  ASSERT_TRUE(rt) << rt.err().to_string();
  for (auto variant : {models::model_variant::llama, models::model_variant::gpt2})
    for (dtype t : {dtype::bf16, dtype::f16})
      for (int64_t cache : {int64_t{0}, int64_t{96}}) {
        SCOPED_TRACE(std::string(models::to_string(variant)) + " " + to_string(t) + " cache " + std::to_string(cache));
        models::transformer_config cfg = decode_step_config(variant, t, cache, 64);
        cfg.seq_len = 72;
        cfg.max_positions = 128;
        plan_options o;
        o.fuse_ops = true;
        o.state_slots = 2;
        auto g = std::make_shared<const graph>(models::build_transformer(cfg).value());
        auto p = (*rt)->compile(g, o);
        ASSERT_TRUE(p) << p.err().to_string();
        EXPECT_EQ((*p)->fusions().size(), static_cast<std::size_t>(cfg.n_layers)) << "one flash kernel a layer";
        std::vector<host_tensor> in;
        for (node_id id : g->inputs()) {
          const node& n = g->at(id);
          if (n.type == dtype::i32) {
            const bool tokens = n.name.find("token") != std::string::npos;
            std::vector<int32_t> pos(static_cast<std::size_t>(n.dims.numel()));
            for (std::size_t i = 0; i < pos.size(); ++i) pos[i] = static_cast<int32_t>(i % static_cast<std::size_t>(cfg.seq_len));
            in.push_back(tokens ? host_tensor::random_ints(n.dims, 91, cfg.vocab) : host_tensor::from_ints(n.dims, pos));
          } else {
            // the [S, C] mask of a prefill from position 0: causal over the cache
            std::vector<float> m(static_cast<std::size_t>(n.dims.numel()));
            for (int64_t i = 0; i < n.dims[0]; ++i)
              for (int64_t j = 0; j < n.dims[1]; ++j) m[static_cast<std::size_t>(i * n.dims[1] + j)] = j <= i ? 0.f : -30000.f;
            in.push_back(host_tensor::from_floats(n.type, n.dims, m));
          }
        }
        auto want = evaluate_reference(*g, in);
        ASSERT_TRUE(want) << want.err().to_string();
        submit_options so;
        if (cache > 0) so.state_slot = 0;
        const job j = (*rt)->submit(*p, in, so);
        ASSERT_TRUE(j.wait_for(60s)) << "hung";
        const auto& r = j.wait();
        ASSERT_TRUE(r) << r.err().to_string();
        const auto cmp = compare(r->front(), want->front(), 6e-2, 6e-2);
        EXPECT_TRUE(cmp.ok) << cmp.message;
      }
}

/// A runtime on cuda:0 whose GEMVs of at least `rows` rows take the tensor
/// cores (backend_options::cuda_gemv_tensor_core_rows; 0: the FMA kernel).
expected<std::unique_ptr<runtime>> runtime_with_tensor_core_rows(int rows) {
  runtime_options ro;
  ro.backend.cuda_gemv_tensor_core_rows = rows;
  return runtime::create("cuda:0", ro);
}

// plan_options::fuse_projections (on by default): a LLaMA decode step's q /
// k / v, gate / up / silu / mul, and o and down with their residual adds run
// as GEMV groups (4 per layer), alone and with the fused attention; every job
// equals the reference in f32, f16 and bf16, with a cache and without.
TEST(CudaGenerate, ProjectionGroupStepsEqualTheReference) {
  AG_REQUIRE_GPU(1);
  for (int tensor_core_rows : {0, 2}) {
    SCOPED_TRACE("backend_options::cuda_gemv_tensor_core_rows " + std::to_string(tensor_core_rows));
    auto rt = runtime_with_tensor_core_rows(tensor_core_rows);
    ASSERT_TRUE(rt) << rt.err().to_string();
    for (dtype t : {dtype::f32, dtype::f16, dtype::bf16})
      for (int64_t cache : {int64_t{0}, int64_t{24}})
        for (bool attention : {false, true}) {
          SCOPED_TRACE(std::string(to_string(t)) + " cache " + std::to_string(cache) +
                       (attention ? " + attention" : ""));
          plan_options o;
          o.fuse_ops = attention;
          decode_steps_equal_the_reference(**rt, decode_step_config(models::model_variant::llama, t, cache), o,
                                           attention ? 2 : 0, 8);
        }
  }
}

/// Job `job` of plan `p` (of graph `g`) on `in` equals the reference
/// evaluator's outputs within the tolerance of dtype `t`.
void job_equals_the_reference(runtime& rt, const std::shared_ptr<const plan>& p, const graph& g,
                              const std::vector<host_tensor>& in, dtype t, int job) {
  auto want = evaluate_reference(g, in);
  ASSERT_TRUE(want) << want.err().to_string();
  const job_result& r = rt.submit(p, in).wait();
  ASSERT_TRUE(r) << "job " << job << ": " << r.err().to_string();
  const test::tol tl = test::tol_for(t, 4);
  for (std::size_t i = 0; i < want->size(); ++i) {
    auto c = compare((*r)[i], (*want)[i], tl.atol, tl.rtol);
    EXPECT_TRUE(c.ok) << "job " << job << " output " << i << ": " << c.message;
  }
}

// The rms_norm right before a projection group runs inside the group's GEMV
// kernel (projection_fusion::norm_prologue): without a weight, with one that
// the kernel reads (plan_options::fold_norm_weights off) and with one folded
// into the projections' weights (on, the default), 1 to 8 rows, rows of 512 and of 4096 (8 x 4096 floats: more than
// a block's shared memory held when the kernel staged the normalised rows
// there), a q/k/v-shaped group and a gated one, f32 / f16 / bf16, replayed
// over several jobs; a norm whose output is also a graph output stays a
// kernel of its own. Every job equals the reference.
TEST(CudaGenerate, NormProloguesOfProjectionGroupsEqualTheReference) {
  AG_REQUIRE_GPU(1);
  uint64_t seed = 9100;
  for (int tensor_core_rows : {0, 2}) {
    SCOPED_TRACE("backend_options::cuda_gemv_tensor_core_rows " + std::to_string(tensor_core_rows));
    auto rt = runtime_with_tensor_core_rows(tensor_core_rows);
    ASSERT_TRUE(rt) << rt.err().to_string();
    for (dtype t : {dtype::f32, dtype::f16, dtype::bf16})
      for (int64_t rows : {int64_t{1}, int64_t{3}, int64_t{8}})
        for (int64_t K : {int64_t{512}, int64_t{4096}})
          for (int form = 0; form < 3; ++form) {
            const bool weighted = form > 0, folded = form == 2;
            SCOPED_TRACE(std::string(to_string(t)) + " rows " + std::to_string(rows) + " K " + std::to_string(K) +
                         (folded ? " weight folded" : weighted ? " weighted" : ""));
            const float scale = 0.05f * std::sqrt(512.0f / static_cast<float>(K));  // outputs of one size at every K
            auto w = [&](const std::string& name, shape dims, float sd) {
              return host_tensor::random_normal(t, dims, ++seed, sd);
            };
            graph_builder b;
            auto x = b.input("x", t, {rows, K});
            auto norm = [&](const std::string& name) {
              tensor g = weighted ? b.weight(name + ".w", w(name, {K}, 1.0f)) : tensor();
              return b.rms_norm(x, g, 1e-5f, name);
            };
            auto n1 = norm("n1");
            b.output(b.matmul(n1, b.weight("wq", w("wq", {256, K}, scale)), false, true, "q"));
            b.output(b.matmul(n1, b.weight("wk", w("wk", {64, K}, scale)), false, true, "k"));
            auto n2 = norm("n2");
            auto gate = b.matmul(n2, b.weight("wg", w("wg", {192, K}, scale)), false, true, "gate");
            auto up = b.matmul(n2, b.weight("wu", w("wu", {192, K}, scale)), false, true, "up");
            b.output(b.mul(b.silu(gate, "act"), up, "mlp"));
            auto n3 = norm("n3");  // also an output: not a prologue
            b.output(n3);
            b.output(b.matmul(n3, b.weight("wv", w("wv", {64, K}, scale)), false, true, "v1"));
            b.output(b.matmul(n3, b.weight("wv2", w("wv2", {64, K}, scale)), false, true, "v2"));
            auto g = std::move(b).build();
            ASSERT_TRUE(g) << g.err().to_string();
            plan_options o;
            o.policy = placement_policy::single;
            o.graph_replay = graph_replay_mode::on;
            o.fold_norm_weights = folded;
            auto p = (*rt)->compile(*g, o);
            ASSERT_TRUE(p) << p.err().to_string();
            int prologues = 0, read_weights = 0;
            for (const projection_fusion& f : (*p)->projection_fusions()) {
              prologues += f.norm_prologue ? 1 : 0;
              read_weights += f.norm_prologue && (*p)->source().at(f.ops.front()).inputs.size() > 1 ? 1 : 0;
            }
            EXPECT_EQ(read_weights, weighted && !folded ? 2 : 0) << "norm weights the kernel reads";
            EXPECT_EQ((*p)->projection_fusions().size(), 3u) << (*p)->describe();
            EXPECT_EQ(prologues, 2) << "n1 and n2, not n3 (an output)";
            for (int k = 0; k < 3; ++k) {
              std::vector<host_tensor> in{host_tensor::random_normal(t, {rows, K}, ++seed, 1.5f, 0.3f)};
              job_equals_the_reference(**rt, *p, *g, in, t, k);
            }
          }
  }
}

// The ropes right after a q/k/v group run inside the group's GEMV kernel
// (projection_fusion::ropes: a decode step without a KV cache): neox and
// interleaved pairs, heads of 64 and 128, 1 to 8 rows as batches of
// positions (x's row r at position r % S), GQA (k with fewer heads than q),
// with and without the norm prologue, f32 / f16 / bf16, positions up to
// 5000 and new ones every job, replayed over several jobs. Every job equals
// the reference; with only q's rope, k's rope (read by a second op too)
// stays a kernel of its own.
TEST(CudaGenerate, RopesOfProjectionGroupsEqualTheReference) {
  AG_REQUIRE_GPU(1);
  for (int tensor_core_rows : {0, 2}) {
    SCOPED_TRACE("backend_options::cuda_gemv_tensor_core_rows " + std::to_string(tensor_core_rows));
    auto rt = runtime_with_tensor_core_rows(tensor_core_rows);
    ASSERT_TRUE(rt) << rt.err().to_string();
    struct rope_case {
      int64_t batch, seq, head;
      rope_mode mode;
      bool norm, both;
    };
    const rope_case cases[] = {
        {1, 1, 64, rope_mode::neox, true, true},          // a decode step
        {2, 1, 128, rope_mode::neox, true, true},         // two sequences of one step
        {1, 4, 64, rope_mode::interleaved, false, true},  // four positions, pairs (2k, 2k + 1)
        {2, 3, 128, rope_mode::interleaved, true, true},
        {2, 4, 64, rope_mode::neox, true, true},          // 8 rows: the kernel's most
        {1, 2, 64, rope_mode::neox, true, false},         // q's rope only
    };
    uint64_t seed = 9400;
    const int64_t K = 512, H = 4, Hkv = 2;
    for (const rope_case& rc : cases)
      for (dtype t : {dtype::f32, dtype::f16, dtype::bf16}) {
        const int64_t B = rc.batch, S = rc.seq, D = rc.head;
        SCOPED_TRACE(std::string(to_string(t)) + " B " + std::to_string(B) + " S " + std::to_string(S) + " head " +
                     std::to_string(D) + (rc.mode == rope_mode::neox ? " neox" : " interleaved") +
                     (rc.norm ? " norm" : "") + (rc.both ? "" : " q only"));
        auto w = [&](shape dims, float sd) { return host_tensor::random_normal(t, dims, ++seed, sd); };
        graph_builder b;
        auto x = b.input("x", t, {B * S, K});
        auto pos = b.input("pos", dtype::i32, {S});
        tensor a = rc.norm ? b.rms_norm(x, b.weight("n.w", w({K}, 1.0f)), 1e-5f, "norm") : x;
        auto q = b.matmul(a, b.weight("wq", w({H * D, K}, 0.05f)), false, true, "q");
        auto k = b.matmul(a, b.weight("wk", w({Hkv * D, K}, 0.05f)), false, true, "k");
        auto v = b.matmul(a, b.weight("wv", w({Hkv * D, K}, 0.05f)), false, true, "v");
        auto qh = b.reshape(q, {B, S, H, D}, "q.heads");
        auto kh = b.reshape(k, {B, S, Hkv, D}, "k.heads");
        b.output(b.rope(qh, pos, 10000.0f, rc.mode, "q.rope"));
        b.output(b.rope(kh, pos, 10000.0f, rc.mode, "k.rope"));
        b.output(v);
        if (!rc.both) b.output(b.gelu(k, gelu_mode::tanh, "k.other"));  // k's output read twice: its rope stays apart
        auto g = std::move(b).build();
        ASSERT_TRUE(g) << g.err().to_string();
        plan_options o;
        o.policy = placement_policy::single;
        o.graph_replay = graph_replay_mode::on;
        auto p = (*rt)->compile(*g, o);
        ASSERT_TRUE(p) << p.err().to_string();
        ASSERT_EQ((*p)->projection_fusions().size(), 1u) << (*p)->describe();
        EXPECT_EQ((*p)->projection_fusions()[0].ropes, rc.both ? 2 : 1) << (*p)->describe();
        EXPECT_EQ((*p)->projection_fusions()[0].norm_prologue, rc.norm);
        EXPECT_NE((*p)->describe().find(rc.both ? "2 rope(s) in their groups" : "1 rope(s) in their groups"),
                  std::string::npos)
            << (*p)->describe();
        for (int job = 0; job < 3; ++job) {
          std::vector<int32_t> positions(static_cast<std::size_t>(S));
          for (int64_t s = 0; s < S; ++s)
            positions[static_cast<std::size_t>(s)] = static_cast<int32_t>((seed * 7919 + 613 * s) % 5000);
          std::vector<host_tensor> in{host_tensor::random_normal(t, {B * S, K}, ++seed, 1.0f, 0.2f),
                                      host_tensor::from_ints({S}, positions)};
          job_equals_the_reference(**rt, *p, *g, in, t, job);
        }
      }
  }
}

// Fused attention with its keys split over blocks (gpu/cuda/attention.cu):
// key counts that leave a last split short, heads of 32 to 128, 1 to 16
// query rows per kv head, masked (some keys hidden) and causal, f32 / f16 /
// bf16; 3 jobs each, so that graph replay runs the kernel again on the
// counters the last launch left. Every job equals the reference, and the
// chain is fused.
TEST(CudaGenerate, FusedAttentionWithKeysSplitOverBlocksEqualsTheReference) {
  AG_REQUIRE_GPU(1);
  auto rt = runtime::create("cuda:0");
  ASSERT_TRUE(rt) << rt.err().to_string();
  struct shape_case {
    int64_t batch, kv_heads, rows, keys, head;
    bool causal;
  };
  const shape_case cases[] = {
      {1, 8, 4, 600, 64, false},    // a LLaMA-1B decode step's shape
      {2, 3, 1, 4097, 128, false},  // one row per kv head, many keys
      {1, 2, 16, 1000, 32, false},  // 16 rows (4 positions of 4 heads each)
      {1, 4, 2, 300, 64, true},     // causal over the keys, no mask
      {1, 2, 4, 900, 128, false},   // heads of 128: four dims a lane, the last split short
  };
  uint64_t seed = 7000;
  for (const shape_case& sc : cases)
    for (dtype t : {dtype::f32, dtype::f16, dtype::bf16}) {
      const int64_t B = sc.batch, G = sc.kv_heads, M = sc.rows, C = sc.keys, D = sc.head;
      const int64_t S = sc.causal ? M : (M >= 4 ? 4 : 1);  // softmax rows: query positions
      SCOPED_TRACE(std::string(to_string(t)) + " B " + std::to_string(B) + " kv heads " + std::to_string(G) +
                   " rows " + std::to_string(M) + " keys " + std::to_string(C) + " head " + std::to_string(D) +
                   (sc.causal ? " causal" : " masked"));
      graph_builder b;
      auto q = b.input("q", t, {B, G, M, D});
      auto k = b.input("k", t, {B, G, C, D});
      auto v = b.input("v", t, {B, G, C, D});
      auto scores = b.matmul(q, k, false, true, "qk");
      auto heads = b.reshape(scores, {B, G * (M / S), S, C}, "heads");
      tensor probs;
      if (sc.causal) {
        probs = b.softmax(heads, true, 0.125f, "softmax");
      } else {
        auto mask = b.input("mask", t, {S, C});
        probs = b.softmax(b.add(heads, mask, "masked"), false, 0.125f, "softmax");
      }
      auto pg = b.reshape(probs, {B, G, M, C}, "probs");
      b.output(b.matmul(pg, v, false, false, "pv"));
      auto g = std::make_shared<const graph>(std::move(b).build().value());
      plan_options o;
      o.fuse_ops = true;
      auto p = (*rt)->compile(g, o);
      ASSERT_TRUE(p) << p.err().to_string();
      EXPECT_EQ((*p)->fusions().size(), 1u) << "the chain is fused";
      for (int job_no = 0; job_no < 3; ++job_no) {
        std::vector<host_tensor> in{host_tensor::random_normal(t, {B, G, M, D}, ++seed, 1.0f),
                                    host_tensor::random_normal(t, {B, G, C, D}, ++seed, 1.0f),
                                    host_tensor::random_normal(t, {B, G, C, D}, ++seed, 1.0f)};
        if (!sc.causal) {
          // Position s sees keys j < C - 37 * (job + s): the last keys hidden, more for later jobs.
          std::vector<float> m(static_cast<std::size_t>(S * C));
          for (int64_t s = 0; s < S; ++s)
            for (int64_t j = 0; j < C; ++j)
              m[static_cast<std::size_t>(s * C + j)] = j < C - 37 * (job_no + s) ? 0.0f : -30000.0f;
          in.push_back(host_tensor::from_floats(t, {S, C}, m));
        }
        auto want = evaluate_reference(*g, in);
        ASSERT_TRUE(want) << want.err().to_string();
        const job j = (*rt)->submit(*p, in);
        ASSERT_TRUE(j.wait_for(60s)) << "job " << job_no << " hung";
        const auto& r = j.wait();
        ASSERT_TRUE(r) << "job " << job_no << ": " << r.err().to_string();
        const auto c = t == dtype::f32   ? compare(r->front(), want->front(), 1e-4, 1e-3)
                       : t == dtype::f16 ? compare(r->front(), want->front(), 4e-3, 1e-2)
                                         : compare(r->front(), want->front(), 3e-2, 3e-2);
        EXPECT_TRUE(c.ok) << "job " << job_no << ": " << c.message;
      }
    }
}

// Compiles `c`'s attention chain fused on `rt` and runs it twice on the
// poisoned inputs (the second job over the counters and row bounds the
// first left in the stream's workspace): no hidden key's NaN reaches the
// output, which equals the reference on the clean inputs within t's
// tolerance.
void expect_hidden_keys_never_read(runtime& rt, const test::hidden_keys_attention& c, dtype t) {
  plan_options o;
  o.fuse_ops = true;
  auto p = rt.compile(std::make_shared<const graph>(c.g), o);
  ASSERT_TRUE(p) << p.err().to_string();
  ASSERT_EQ((*p)->fusions().size(), 1u) << "the chain is fused";
  auto want = evaluate_reference(c.g, c.clean);
  ASSERT_TRUE(want) << want.err().to_string();
  ASSERT_TRUE(test::all_finite(want->front())) << "the reference on finite rows";
  for (int job_no = 0; job_no < 2; ++job_no) {
    const job j = rt.submit(*p, c.poisoned);
    ASSERT_TRUE(j.wait_for(60s)) << "job " << job_no << " hung";
    const auto& r = j.wait();
    ASSERT_TRUE(r) << "job " << job_no << ": " << r.err().to_string();
    EXPECT_TRUE(test::all_finite(r->front())) << "job " << job_no << ": a hidden key's NaN reached the output";
    const auto cmp = t == dtype::f32   ? compare(r->front(), want->front(), 1e-4, 1e-3)
                     : t == dtype::f16 ? compare(r->front(), want->front(), 4e-3, 1e-2)
                                       : compare(r->front(), want->front(), 3e-2, 3e-2);
    EXPECT_TRUE(cmp.ok) << "job " << job_no << ": " << cmp.message;
  }
}

// The split kernel over a long cache (1024 keys or more) shares out only
// the keys the mask leaves visible to some query row (gpu/cuda/attention.cu,
// visible_keys): the keys before and after them are NaN in k and v and
// never reach the output, which equals the reference on the same inputs
// with those rows finite. A decode step's shape (4 query heads of a kv
// head), a chunk of 4 positions seeing different numbers of keys (16 rows),
// 40 visible keys among 3000 (most splits get none), visible keys near
// both ends (the scan stops after the ends) and 3001 keys (not whole
// vectors); f32, f16 and bf16 (the scan tests the mask's bits a word at a
// time, per dtype).
TEST(CudaGenerate, FusedAttentionOverALongCacheReadsNoKeyItsMaskHides) {
  AG_REQUIRE_GPU(1);
  auto rt = runtime::create("cuda:0");
  ASSERT_TRUE(rt) << rt.err().to_string();
  struct hidden_case {
    int64_t rows, keys, head, first_visible;
    std::vector<int64_t> ends;
  };
  const hidden_case cases[] = {
      {4, 3000, 64, 100, {700}},
      {16, 2000, 128, 37, {1000, 1001, 1002, 1500}},
      {4, 3000, 64, 0, {40}},
      {4, 3000, 64, 5, {2995}},  // visible keys at both ends: the scan of the ends alone finds them
      {4, 3001, 64, 3, {2999}},  // not whole 16-byte vectors: the last keys one by one
  };
  uint64_t seed = 8100;
  for (const hidden_case& hc : cases)
    for (dtype t : {dtype::f32, dtype::f16, dtype::bf16}) {
      SCOPED_TRACE(std::string(to_string(t)) + " rows " + std::to_string(hc.rows) + " keys " +
                   std::to_string(hc.keys) + " visible from " + std::to_string(hc.first_visible));
      const auto c = test::make_hidden_keys_attention(t, 2, hc.rows, hc.keys, hc.head, hc.first_visible, hc.ends,
                                                      seed += 10);
      expect_hidden_keys_never_read(**rt, c, t);
    }
}

// The flash kernel (more than 16 query rows: a prefill chunk's attention)
// under a mask over a long cache: each block computes only the keys from
// the first to the last that one of its 64 rows sees (the mask's row
// bounds, found first), so the NaN rows of k and v that every row hides
// never reach the output. Blocks whose rows wrap around the softmax rows
// (GQA's packing), a last block of fewer rows, keys that are not whole
// 16-byte vectors, a run far from key 0.
TEST(CudaGenerate, FlashAttentionOverALongCacheComputesOnlyTheKeysItsRowsSee) {
  AG_REQUIRE_GPU(1);
  auto rt = runtime::create("cuda:0");
  ASSERT_TRUE(rt) << rt.err().to_string();
  struct flash_case {
    int64_t rows, keys, head, first_visible;
    std::vector<int64_t> ends;  // per softmax row
  };
  const auto staircase = [](int64_t S, int64_t from, int64_t step) {
    std::vector<int64_t> e(static_cast<std::size_t>(S));
    for (int64_t s = 0; s < S; ++s) e[static_cast<std::size_t>(s)] = from + step * s;
    return e;
  };
  const flash_case cases[] = {
      {256, 3000, 128, 100, staircase(64, 700, 3)},     // 4 heads of 64 positions
      {200, 3001, 64, 0, staircase(200, 40, 1)},        // one head, a last block of 8 rows
      {128, 5000, 128, 4000, staircase(32, 4100, 10)},  // blocks of two heads of 32
  };
  uint64_t seed = 8300;
  for (const flash_case& fc : cases)
    for (dtype t : {dtype::f16, dtype::bf16}) {
      SCOPED_TRACE(std::string(to_string(t)) + " rows " + std::to_string(fc.rows) + " keys " +
                   std::to_string(fc.keys) + " visible from " + std::to_string(fc.first_visible));
      const auto c = test::make_hidden_keys_attention(t, 2, fc.rows, fc.keys, fc.head, fc.first_visible, fc.ends,
                                                      seed += 10);
      expect_hidden_keys_never_read(**rt, c, t);
    }
}

TEST(CudaGenerate, DecodeEqualsRecomputePipelinedOverTwoGpus) {
  AG_REQUIRE_GPU(2);
  decode_on("cuda:0,1", 2);
}

// Two stages, and two stages x tensor degree 2, on logical devices of one
// GPU (one step at a time: decode_on checks that none was pipelined).
TEST(CudaGenerate, DecodeEqualsRecomputeOverStagesAndStagesByTensorOnOneGpu) {
  AG_REQUIRE_GPU(1);
  decode_on("cuda:0,0", 2);
  decode_on("cuda:0,0,0,0", 2, /*fuse_ops=*/true, /*head_dim=*/32, /*tensor_degree=*/2);
}

// The records the runtime launches for `p` (lowered as the runtime lowers
// it) that run a whole decode step as one kernel (fusion::decode_step).
int whole_step_records(const plan& p) {
  auto prog = actors::lower(std::shared_ptr<const plan>(&p, [](const plan*) {}));
  EXPECT_TRUE(prog) << prog.err().to_string();
  int n = 0;
  if (prog)
    for (const actors::lowered_step& s : (*prog)->steps())
      for (const actors::lowered_op& op : s.ops) n += op.fused == gpu::op_launch::fusion::decode_step;
  return n;
}

// A bf16 LLaMA with `heads` heads of `head_dim` (d_model their product) and
// the tiny model's 2 layers: a shape the whole-step kernel takes. The
// initial scale shrinks with the width, as in decode_on.
// d_model 0: heads x head_dim; else heads of head_dim on that width (HF's head_dim).
models::transformer_config whole_step_model(int heads, int kv_heads, int64_t head_dim, int64_t d_ff,
                                            int64_t vocab = 1000, int64_t d_model = 0) {
  models::transformer_config cfg = test::tiny_model(models::model_variant::llama, kv_heads);
  if (d_model == 0) d_model = heads * head_dim;
  cfg.initializer_range *= std::sqrt(static_cast<float>(cfg.d_model) / static_cast<float>(d_model));
  cfg.n_heads = heads;
  cfg.d_model = d_model;
  if (d_model != heads * head_dim) cfg.explicit_head_dim = head_dim;
  cfg.d_ff = d_ff;
  cfg.vocab = vocab;
  cfg.dtype = dtype::bf16;
  return cfg;
}

// A LLaMA-family decode step that fits the persistent kernel
// (plan_options::fuse_decode_step, gpu/cuda/decode_step.cuh) runs as one
// kernel, and generation still equals recomputing the whole sequence: heads
// of 64 over a cache of 80 rows (a span of 5 keys a block) and over 1100
// (spans of 69 keys: a round of 64, then one of 5 with its own mask), heads
// of 128 over 1100 rows (three rounds of 32), and four
// query heads of 128 a kv head (512 values a head's blocks combine: the
// combine's two passes of 8 splits; with linear RoPE scaling), and LLaMA-1B's widths over 2 layers
// (32 heads of 64 over 8 kv heads, d_model 2048, d_ff 8192: the products
// of whole 4 KiB chunks, the only path LLaMA-1B takes, and down's rows of 4
// chunks in two slots), a Llama-3-style model (a tied head, Llama 3's RoPE
// scaling, 12 heads of 64 over 4 kv heads: d_model 768) whose 140,000 logits
// take the head's rows in parts (about 1061 a block on 132 SMs: two parts),
// Llama 3.1 8B's d_ff of 14336 (over 8 heads of 128: the kernel with two
// chunks a warp, x of 28 KiB beside them) and LLaMA-2-7B's 11008 (rows of 8
// chunks of 1376, whose 172 16-byte pieces go round the lanes) and half of
// it, 5504 (43 x 128: what a device of two holds), heads of
// another width than d_model / heads (8 of 128 on d_model 1536, 16 of 64 on
// 512: o's rows narrower and wider than q/k/v's), one runtime, so
// the shapes share each stream's workspace; then the greedy
// plans (the token picked by the kernel and kept in the token states), whose
// tokens equal the host's picks from the logits.
TEST(CudaGenerate, WholeDecodeStepAsOneKernelEqualsRecompute) {
  AG_REQUIRE_GPU(1);
  auto rt = runtime::create("cuda:0");
  ASSERT_TRUE(rt) << rt.err().to_string();
  struct shape {
    int64_t head_dim, d_ff, cache, kv_heads, heads, vocab = 1000;
    bool llama3 = false;
    bool linear = false;  // linear RoPE scaling, factor 4
    int64_t d_model = 0;  // 0: heads x head_dim
  };
  const shape shapes[] = {shape{64, 512, 80, 2, 4}, shape{64, 512, 1100, 2, 4}, shape{128, 768, 1100, 2, 4},
                          shape{128, 512, 300, 1, 4, 1000, false, true}, shape{64, 8192, 300, 8, 32},
                          shape{64, 1024, 300, 4, 12, 140000, true}, shape{128, 14336, 300, 2, 8},
                          shape{128, 11008, 300, 2, 8}, shape{128, 5504, 300, 2, 8},
                          // heads narrower and wider than d_model (HF's head_dim)
                          shape{128, 1024, 300, 2, 8, 1000, false, false, 1536},
                          shape{64, 768, 300, 4, 16, 1000, false, false, 512},
                          // Qwen2.5-0.5B's widths: d_model 896 (7 x 128), 14 heads of 64 over 2 kv heads
                          // (7 query heads a kv head), d_ff 4864
                          shape{64, 4864, 300, 2, 14}};
  const int shape_count = static_cast<int>(std::size(shapes));
  // AG_WHOLE_STEP_SHAPE=i runs shape i alone: scripts/gpu-sanitize.sh's
  // racecheck pass runs the shapes a process each, since the tool's shadow
  // state for all of them in one process outgrew the GPU machine's 128 GiB
  // of host memory (session 83).
  int only = -1;
  if (const char* v = std::getenv("AG_WHOLE_STEP_SHAPE"); v && *v) {
    char* end = nullptr;
    const long i = std::strtol(v, &end, 10);
    ASSERT_TRUE(*end == '\0') << "AG_WHOLE_STEP_SHAPE=" << v << ": not a shape index (0 to " << shape_count - 1 << ")";
    if (i < 0 || i >= shape_count)
      GTEST_SKIP() << "AG_WHOLE_STEP_SHAPE=" << v << ": no such shape (the test has " << shape_count << ", 0 to "
                   << shape_count - 1 << ")";
    only = static_cast<int>(i);
    std::printf("AG_WHOLE_STEP_SHAPE=%d: shape %d of the test's %d alone\n", only, only, shape_count);
  }
  for (int index = 0; index < shape_count; ++index) {
    if (only >= 0 && index != only) continue;
    const shape& sh = shapes[index];
    SCOPED_TRACE("shape " + std::to_string(index) + ": d_model " + std::to_string(sh.d_model) + ", " +
                 std::to_string(sh.heads) + " heads of " +
                 std::to_string(sh.head_dim) + ", cache " +
                 std::to_string(sh.cache) + ", kv heads " + std::to_string(sh.kv_heads) + ", d_ff " +
                 std::to_string(sh.d_ff) + ", vocab " + std::to_string(sh.vocab) + (sh.llama3 ? ", llama3" : "") +
                 (sh.linear ? ", linear RoPE scaling" : ""));
    models::transformer_config cfg =
        whole_step_model(static_cast<int>(sh.heads), static_cast<int>(sh.kv_heads), sh.head_dim, sh.d_ff, sh.vocab,
                         sh.d_model);
    if (sh.llama3) {
      cfg.head = models::head_tying::tied;
      cfg.rope_theta = 500000.0f;
      // Llama 3's scaling with an original context of 256 (Llama 3.2's is
      // 8192): at the test's positions (up to about 20) the pairs it slows
      // turn by angles that differ visibly from plain RoPE's.
      cfg.rope_scale = {8.0f, 1.0f, 4.0f, 256};
    }
    if (sh.linear) {
      cfg.rope_scale.kind = rope_scaling_kind::linear;
      cfg.rope_scale.factor = 4.0f;
    }
    test::temp_dir dir;
    test::save_random_model(dir.str(), cfg);
    auto m = models::hf_model::open(dir.str());
    ASSERT_TRUE(m) << m.err().to_string();
    generator_options go;
    go.cache_tokens = sh.cache;
    go.prefill_chunk = 4;
    go.decode_batch = 0;  // a slot a sequence: its own cache rows, the one-kernel step's limit
    auto gen = generator::create(**rt, m->model_config(1), m->provider(), go);
    ASSERT_TRUE(gen) << gen.err().to_string();
    ASSERT_EQ(whole_step_records((*gen)->decode_plan()), 1) << "the decode step is not one kernel";
    generation_result dr;
    expect_generation_equals_recompute(**gen, *m, /*bf16=*/true, dr);
    if (::testing::Test::HasFatalFailure()) return;
    EXPECT_EQ(dr.tokens_picked_on_device, 5);
  }
}

// The two ranks of the tensor-parallel decode-step tests: two GPUs where
// the machine has them (the exchange then crosses NVLink), else two logical
// devices of GPU 0 (each rank's kernel on half its SMs).
std::string two_ranks() { return gpu::cuda::device_count() >= 2 ? "cuda:0,1" : "cuda:0,0"; }

// A generator at tensor degree 2 on `rt` (two_ranks()) whose greedy
// decode steps run as one kernel a rank
// (plan_options::fuse_tp_decode_step; in-stream collectives forced on, as
// logical devices of one GPU do not choose them), for a bf16 LLaMA of
// whole_step_model's shape saved in `dir`; `ratios` the ranks' shares
// (empty: even). Checks that each greedy plan has a record a rank.
std::shared_ptr<generator> tp_whole_step_generator(runtime& rt, const models::hf_model& m, int64_t cache,
                                                   std::vector<double> ratios) {
  generator_options go;
  go.cache_tokens = cache;
  go.prefill_chunk = 4;
  go.decode_batch = 0;  // a slot a sequence: the one-kernel step's limit
  go.plan.tensor_parallel = 2;
  go.plan.shard_ratios = std::move(ratios);
  go.plan.in_stream_collectives = in_stream_mode::on;
  go.plan.fuse_tp_decode_step = true;
  auto gen = generator::create(rt, m.model_config(1), m.provider(), go);
  EXPECT_TRUE(gen) << gen.err().to_string();
  if (!gen) return nullptr;
  const std::vector<const plan*> greedy = (*gen)->greedy_decode_plans();
  EXPECT_FALSE(greedy.empty()) << "no greedy decode plan (generator_options::device_greedy)";
  for (const plan* p : greedy) EXPECT_EQ(whole_step_records(*p), 2) << "the greedy step is not one kernel a rank";
  return std::move(*gen);
}

// A tensor-parallel decode step as one kernel a rank (decode_step.cu's kTp
// variant: the ranks push the embedding's row, each layer's o and down
// partial rows and their best logits into each other's exchange and sum
// them in rank order) on two GPUs, or two logical devices of one GPU with
// each rank's grid on half of its SMs: greedy generation equals recomputing the sequence
// (through the logits of the unfused plans, whose picks the fused steps'
// tokens equal), for 4 heads of 64 over 2 kv heads (a kv head a rank), heads
// of 128 over 300 cache rows, LLaMA-1B's widths (32 heads of 64 over 8 kv
// heads, d_ff 8192: 16 heads and 4096 a rank) and a 3:1 split (6 heads
// and 3 kv heads on rank 0, 2 and 1 on rank 1).
TEST(CudaGenerate, TensorParallelDecodeStepAsOneKernelARankEqualsRecompute) {
  AG_REQUIRE_GPU(1);
  SCOPED_TRACE("on " + two_ranks());
  auto rt = runtime::create(two_ranks());
  ASSERT_TRUE(rt) << rt.err().to_string();
  struct shape {
    int64_t head_dim, d_ff, cache, kv_heads, heads;
    std::vector<double> ratios;
  };
  const shape shapes[] = {shape{64, 512, 80, 2, 4, {}}, shape{128, 768, 300, 2, 4, {}}, shape{64, 8192, 300, 8, 32, {}},
                          shape{64, 1024, 80, 4, 8, {3, 1}}};
  for (const shape& sh : shapes) {
    SCOPED_TRACE(std::to_string(sh.heads) + " heads of " + std::to_string(sh.head_dim) + " over " +
                 std::to_string(sh.kv_heads) + ", d_ff " + std::to_string(sh.d_ff) + ", cache " + std::to_string(sh.cache) +
                 (sh.ratios.empty() ? ", even" : ", 3:1"));
    test::temp_dir dir;
    test::save_random_model(dir.str(), whole_step_model(static_cast<int>(sh.heads), static_cast<int>(sh.kv_heads),
                                                        sh.head_dim, sh.d_ff));
    auto m = models::hf_model::open(dir.str());
    ASSERT_TRUE(m) << m.err().to_string();
    auto gen = tp_whole_step_generator(**rt, *m, sh.cache, sh.ratios);
    ASSERT_TRUE(gen);
    if (::testing::Test::HasFailure()) return;
    generation_result dr;
    expect_generation_equals_recompute(*gen, *m, /*bf16=*/true, dr);
    if (::testing::Test::HasFatalFailure()) return;
    EXPECT_EQ(dr.tokens_picked_on_device, 5);
  }
}

// A rank that never launches its kernel (AG_CUDA_DEBUG_SKIP=tprank1): the
// other rank's waits give up after cuda_collective_timeout_s, the job fails
// with the decode step's give-up (not a hang, not a wrong token), and the
// runtime serves on: a generation through the unfused plans (logits kept)
// still equals recomputing.
TEST(CudaGenerate, ATensorParallelDecodeStepWhoseRankNeverComesFailsInBoundedTime) {
  AG_REQUIRE_GPU(1);
  runtime_options ro;
  ro.backend.cuda_collective_timeout_s = 1.0;
  ASSERT_EQ(setenv("AG_CUDA_DEBUG_SKIP", "tprank1", 1), 0);  // read when the devices are made
  SCOPED_TRACE("on " + two_ranks());
  auto rt = runtime::create(two_ranks(), ro);
  unsetenv("AG_CUDA_DEBUG_SKIP");
  ASSERT_TRUE(rt) << rt.err().to_string();
  test::temp_dir dir;
  test::save_random_model(dir.str(), whole_step_model(4, 2, 64, 512));
  auto m = models::hf_model::open(dir.str());
  ASSERT_TRUE(m) << m.err().to_string();
  auto gen = tp_whole_step_generator(**rt, *m, 80, {});
  ASSERT_TRUE(gen);
  const std::vector<int32_t> prompt{3, 1, 4, 1, 5, 9};
  generate_options o;
  o.max_new_tokens = 4;  // the first from the prompt's logits, then the greedy steps
  const auto t0 = std::chrono::steady_clock::now();
  const generation h = gen->generate(prompt, o);
  ASSERT_TRUE(h.wait_for(60s)) << "the generation hung";
  const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const auto& r = h.wait();
  ASSERT_FALSE(r) << "a step whose rank 1 never ran gave tokens";
  EXPECT_NE(r.err().to_string().find("tensor-parallel decode step"), std::string::npos) << r.err().to_string();
  EXPECT_NE(r.err().to_string().find("gave up"), std::string::npos) << r.err().to_string();
  EXPECT_GE(waited, 0.9) << "gave up before the timeout";
  EXPECT_LT(waited, 30.0) << "did not give up in bounded time";
  o.keep_logits = true;  // the logits plans keep their records: rank 1 takes part
  const generation k = gen->generate(prompt, o);
  ASSERT_TRUE(k.wait_for(60s)) << "the generation after the failed one hung";
  const auto& kr = k.wait();
  ASSERT_TRUE(kr) << kr.err().to_string();
  ASSERT_EQ(kr->tokens.size(), 4u);
  std::vector<int32_t> seq = prompt;
  for (std::size_t t = 0; t < kr->tokens.size(); ++t) {
    const std::vector<float> ref = recomputed_last_logits(*m, seq);
    EXPECT_LT(worst_over_tolerance(ref, kr->logits[t], /*bf16=*/true), 1.0) << "token " << t;
    seq.push_back(kr->tokens[t]);
  }
}

// Qwen2's q/k/v biases and Qwen3's q/k norms: the whole step is still one
// kernel (the biases added in q/k/v's hand-on, the norms where the
// attention takes q and the new key, decode_step.cu), over heads of 64 and
// of 128, at Qwen2.5-0.5B's widths and at Qwen3-0.6B's (16 heads of 128 over
// 8 kv heads on d_model 1024, d_ff 3072) and with 8 query heads a kv head
// (a warp each and one for the key), and with sliding windows (Mistral's,
// Qwen2's with its biases: the kernel reads the generator's mask); LLaMA's attention_bias (o's bias too) keeps a kernel per fused
// record and the launch program's note says why. Generation equals
// recomputing the sequence either way.
TEST(CudaGenerate, Qwen2BiasesQwen3NormsAndWindowsInTheWholeStepAndLlamaAttentionBiasPerRecordEqualRecompute) {
  AG_REQUIRE_GPU(1);
  auto rt = runtime::create("cuda:0");
  ASSERT_TRUE(rt) << rt.err().to_string();
  struct bias_case {
    models::attention_bias bias;
    bool qk_norm;
    int64_t head_dim;
    int heads = 4, kv_heads = 2;
    int64_t d_ff = 512, d_model = 0;  // 0: heads x head_dim
    int64_t window = 0;               // a sliding window (Mistral's, Qwen2's): the mask the kernel reads
  };
  using models::attention_bias;
  for (const bias_case bc : {bias_case{attention_bias::qkv, false, 64}, bias_case{attention_bias::qkv, false, 128},
                             bias_case{attention_bias::qkv, false, 64, 14, 2, 4864},  // Qwen2.5-0.5B's widths
                             bias_case{attention_bias::none, true, 64}, bias_case{attention_bias::none, true, 128},
                             bias_case{attention_bias::none, true, 128, 16, 8, 3072, 1024},  // Qwen3-0.6B's widths
                             bias_case{attention_bias::none, true, 64, 8, 1},  // 8 query heads a kv head: 9 warps
                             bias_case{attention_bias::none, false, 64, 4, 2, 512, 0, 4},  // Mistral's window
                             bias_case{attention_bias::qkv, false, 128, 4, 2, 512, 0, 5},  // Qwen2's
                             bias_case{attention_bias::qkv_o, false, 64}}) {
    const attention_bias bias = bc.bias;
    SCOPED_TRACE(std::string(models::to_string(bias)) + (bc.qk_norm ? " qk_norm, " : ", ") + std::to_string(bc.heads) +
                 " heads of " + std::to_string(bc.head_dim) + ", window " + std::to_string(bc.window));
    models::transformer_config cfg = whole_step_model(bc.heads, bc.kv_heads, bc.head_dim, bc.d_ff, 1000, bc.d_model);
    cfg.attn_bias = bias;
    cfg.qk_norm = bc.qk_norm;
    cfg.sliding_window = bc.window;
    cfg.head = models::head_tying::tied;
    test::temp_dir dir;
    test::save_random_model(dir.str(), cfg);
    auto m = models::hf_model::open(dir.str());
    ASSERT_TRUE(m) << m.err().to_string();
    generator_options go;
    go.cache_tokens = 80;
    go.prefill_chunk = 4;
    go.decode_batch = 0;  // a slot a sequence
    auto gen = generator::create(**rt, m->model_config(1), m->provider(), go);
    ASSERT_TRUE(gen) << gen.err().to_string();
    // A window's cache is a ring of window + 3 rows, which the 12 positions go round.
    EXPECT_EQ((*gen)->cache_rows(), bc.window > 0 ? bc.window + 3 : 80);
    const bool whole = bias != attention_bias::qkv_o;
    EXPECT_EQ(whole_step_records((*gen)->decode_plan()), whole ? 1 : 0);
    const plan& dp = (*gen)->decode_plan();
    auto prog = actors::lower(std::shared_ptr<const plan>(&dp, [](const plan*) {}));
    ASSERT_TRUE(prog) << prog.err().to_string();
    EXPECT_EQ((*prog)->decode_step_note().find("decode step not fused"), whole ? std::string::npos : 0)
        << (*prog)->decode_step_note();
    std::printf("%s%s, %d heads of %lld, window %lld: %s\n", models::to_string(bias), bc.qk_norm ? " qk_norm" : "",
                bc.heads, static_cast<long long>(bc.head_dim), static_cast<long long>(bc.window),
                (*prog)->decode_step_note().c_str());
    generation_result dr;
    expect_generation_equals_recompute(**gen, *m, /*bf16=*/true, dr);
  }
}

// A cache slot of 4096 rows is longer than the one-kernel step takes
// (decode_step_max_cache_rows): the decode plan keeps its records, and its
// twin (generator::short_sequence_decode_plan) runs the step as one kernel
// while the sequence holds at most 2048 positions. A prompt of 2040 tokens
// and 16 new ones crosses from the twin to the plan (positions 2040-2047,
// then 2048-2055), with logits kept on the host: each token's logits
// within bf16's tolerance of the cpu device's while the tokens so far agree
// (the test prints how many: a random model's bf16 logits tie often);
// greedy on the device, pipelined, the same tokens; a prompt of 6 tokens
// equals recomputing.
TEST(CudaGenerate, ShortSequencesInALongCacheDecodeAsOneKernelAndEqualTheCpuDevice) {
  AG_REQUIRE_GPU(1);
  const std::vector<int32_t> prompt = xorshift_prompt(2040, 0x9e3779b97f4a7c15ull);
  models::transformer_config cfg = whole_step_model(4, 2, 64, 512);
  test::temp_dir dir;
  test::save_random_model(dir.str(), cfg);
  auto m = models::hf_model::open(dir.str());
  ASSERT_TRUE(m) << m.err().to_string();
  const auto make = [&](runtime& rt) {
    generator_options go;
    go.cache_tokens = 4096;
    go.prefill_chunk = 512;
    go.max_sequences = 1;
    return generator::create(rt, m->model_config(1), m->provider(), go);
  };
  const auto run = [&](generator& gen, bool keep_logits) -> generation_result {
    generate_options o;
    o.max_new_tokens = 16;
    o.keep_logits = keep_logits;
    const generation h = gen.generate(prompt, o);
    EXPECT_TRUE(h.wait_for(300s)) << "generation hung";
    const auto& r = h.wait();
    EXPECT_TRUE(r) << r.err().to_string();
    return r ? *r : generation_result{};
  };
  auto cpu_rt = runtime::create("cpu:1");
  ASSERT_TRUE(cpu_rt) << cpu_rt.err().to_string();
  auto cpu = make(**cpu_rt);
  ASSERT_TRUE(cpu) << cpu.err().to_string();
  EXPECT_EQ((*cpu)->short_sequence_decode_plan(), nullptr) << "no twin off CUDA";
  const generation_result want = run(**cpu, true);
  ASSERT_EQ(want.tokens.size(), 16u);

  auto rt = runtime::create("cuda:0");
  ASSERT_TRUE(rt) << rt.err().to_string();
  auto gen = make(**rt);
  ASSERT_TRUE(gen) << gen.err().to_string();
  EXPECT_EQ(whole_step_records((*gen)->decode_plan()), 0) << "4096 cache rows: a kernel a record";
  ASSERT_NE((*gen)->short_sequence_decode_plan(), nullptr);
  EXPECT_EQ(whole_step_records(*(*gen)->short_sequence_decode_plan()), 1) << "the twin: one kernel";
  const generation_result got = run(**gen, true);
  ASSERT_EQ(got.tokens.size(), 16u);
  // bf16 over 2040 keys: a random model's logits tie often, so they are
  // compared (bf16's tolerance, as above) while the tokens so far agree.
  std::size_t compared = 0;
  for (std::size_t t = 0; t < 16 && (t == 0 || got.tokens[t - 1] == want.tokens[t - 1]); ++t, ++compared) {
    ASSERT_EQ(got.logits[t].size(), want.logits[t].size());
    EXPECT_LT(worst_over_tolerance(want.logits[t], got.logits[t], /*bf16=*/true), 1.0)
        << "token " << t << " (position " << 2040 + t << "): error over tolerance";
  }
  std::printf("%zu of 16 tokens' logits compared (positions 2040-2055: the twin to 2047, then the plan)\n", compared);
  // Greedy on the device, pipelined: the twins of the greedy and chain
  // plans, then the plans themselves; the same tokens as with logits kept.
  const generation_result greedy = run(**gen, false);
  EXPECT_EQ(greedy.tokens, got.tokens);
  EXPECT_GT(greedy.tokens_pipelined, 0);
  generation_result dr;
  expect_generation_equals_recompute(**gen, *m, /*bf16=*/true, dr);
}

// A context longer than the 8192 keys the unsplit attention kernel holds:
// 8705 prompt tokens, in 17 chunks of 512 and the last one through the
// decode plan (so that the first token's logits are a decode step's over
// 8705 keys), then 3 more tokens, over a cache of 8720 rows: a kernel a
// record (more rows than the whole-step kernel takes), the attention the
// split kernel fused with its cache prologue. f32: every token's logits
// within 2e-3 of the cpu device's run of the same model and the same
// tokens; bf16: each token's logits within bf16's tolerance (as above) of
// the cpu's while the tokens so far agree (a random model's attention over
// 8705 keys is nearly flat: its bf16 logits tie often, so a later token may
// differ; session 65's run compared all 4). Until session 65 a cache of
// more than 8192 rows kept the attention's four kernels.
TEST(CudaGenerate, DecodeOverMoreThan8192KeysEqualsTheCpuDevice) {
  AG_REQUIRE_GPU(1);
  const std::vector<int32_t> prompt = xorshift_prompt(8705, 88172645463325252ull);
  for (dtype type : {dtype::f32, dtype::bf16}) {
    SCOPED_TRACE(to_string(type));
    models::transformer_config cfg = whole_step_model(4, 2, 64, 512);
    cfg.dtype = type;
    test::temp_dir dir;
    test::save_random_model(dir.str(), cfg);
    auto m = models::hf_model::open(dir.str());
    ASSERT_TRUE(m) << m.err().to_string();
    const auto run = [&](const std::string& spec) -> generation_result {
      auto rt = runtime::create(spec);
      EXPECT_TRUE(rt) << rt.err().to_string();
      if (!rt) return {};
      generator_options go;
      go.cache_tokens = 8720;
      go.prefill_chunk = 512;
      go.max_sequences = 1;
      auto gen = generator::create(**rt, m->model_config(1), m->provider(), go);
      EXPECT_TRUE(gen) << gen.err().to_string();
      if (!gen) return {};
      if (spec != "cpu:1") {
        EXPECT_EQ(whole_step_records((*gen)->decode_plan()), 0) << "8720 cache rows: a kernel a record";
        int fused = 0;
        auto prog = actors::lower(std::shared_ptr<const plan>(&(*gen)->decode_plan(), [](const plan*) {}));
        if (prog)
          for (const auto& ls : (*prog)->steps())
            for (const auto& op : ls.ops)
              fused += op.fused == gpu::op_launch::fusion::attention && op.attention.store_new_rows;
        EXPECT_EQ(fused, cfg.n_layers) << "fused attentions over the cache";
      }
      generate_options o;
      o.max_new_tokens = 4;
      o.keep_logits = true;
      const generation h = (*gen)->generate(prompt, o);
      EXPECT_TRUE(h.wait_for(300s)) << "generation hung";
      const auto& r = h.wait();
      EXPECT_TRUE(r) << r.err().to_string();
      return r ? *r : generation_result{};
    };
    const generation_result want = run("cpu:1");
    ASSERT_EQ(want.tokens.size(), 4u);
    const generation_result got = run("cuda:0");
    ASSERT_EQ(got.tokens.size(), 4u);
    std::size_t compared = 0;
    for (std::size_t t = 0; t < 4 && (t == 0 || got.tokens[t - 1] == want.tokens[t - 1]); ++t, ++compared) {
      ASSERT_EQ(got.logits[t].size(), want.logits[t].size());
      EXPECT_LT(worst_over_tolerance(want.logits[t], got.logits[t], type == dtype::bf16), 1.0)
          << "token " << t << ": error over tolerance";
      if (type == dtype::f32) {
        EXPECT_EQ(got.tokens[t], want.tokens[t]) << "token " << t;
      }
    }
    std::printf("%s: %zu of 4 tokens' logits compared\n", to_string(type), compared);
  }
}

// The whole-step kernel's products of a row wider than one chunk are added
// by several warps, in whatever order they finish; it keeps the step's bits
// the same every run anyway (decode_step.cu, sums_per_row). Down's rows of
// 3 and 4 chunks (d_ff 6144 in chunks of 2048, 5632 in chunks of 1408, whose
// pieces go round the lanes), and LLaMA-1B's
// widths over 2 layers (d_model 2048, d_ff 8192: about 16 rows of 4 chunks
// a block), generated again and again from one prompt: every token's
// logits equal the first run's, bit for bit. (Float atomics adding a row's
// chunks into one sum gave greedy tokens that differed between runs of a
// 16-layer LLaMA-1B; at these sizes they happened to repeat.)
TEST(CudaGenerate, WholeDecodeStepGivesTheSameBitsEveryRun) {
  AG_REQUIRE_GPU(1);
  auto rt = runtime::create("cuda:0");
  ASSERT_TRUE(rt) << rt.err().to_string();
  struct shape {
    int heads, kv_heads;
    int64_t d_ff;
  };
  for (const shape& sh : {shape{4, 2, 6144}, shape{4, 2, 5632}, shape{32, 8, 8192}}) {
    SCOPED_TRACE("heads " + std::to_string(sh.heads) + ", d_ff " + std::to_string(sh.d_ff));
    const models::transformer_config cfg = whole_step_model(sh.heads, sh.kv_heads, 64, sh.d_ff);
    test::temp_dir dir;
    test::save_random_model(dir.str(), cfg);
    auto m = models::hf_model::open(dir.str());
    ASSERT_TRUE(m) << m.err().to_string();
    generator_options go;
    go.cache_tokens = 300;
    go.decode_batch = 0;  // a slot a sequence: 300 rows, within the one-kernel step's limit
    auto gen = generator::create(**rt, m->model_config(1), m->provider(), go);
    ASSERT_TRUE(gen) << gen.err().to_string();
    ASSERT_EQ(whole_step_records((*gen)->decode_plan()), 1) << "the decode step is not one kernel";
    generate_options o;
    o.max_new_tokens = 12;
    o.keep_logits = true;
    std::vector<std::vector<float>> first;
    for (int run = 0; run < 8; ++run) {
      const generation h = (*gen)->generate({3, 1, 4, 1, 5, 9}, o);
      ASSERT_TRUE(h.wait_for(120s)) << "run " << run << " hung";
      const auto& r = h.wait();
      ASSERT_TRUE(r) << "run " << run << ": " << r.err().to_string();
      ASSERT_EQ(r->logits.size(), 12u);
      if (run == 0) {
        first = r->logits;
        continue;
      }
      for (std::size_t t = 0; t < first.size(); ++t) {
        ASSERT_EQ(r->logits[t].size(), first[t].size());
        std::size_t differ = 0;
        for (std::size_t i = 0; i < first[t].size(); ++i)
          differ += std::memcmp(&r->logits[t][i], &first[t][i], sizeof(float)) != 0;
        EXPECT_EQ(differ, 0u) << "run " << run << ", token " << t << ": logits whose bits differ from the first run's";
      }
    }
  }
}

// A generator of 8 sequences of `cache_tokens` each, prompts in chunks of
// 64, `batch` of them a decode step (generator_options::decode_batch).
generator_options eight_sequences(int64_t cache_tokens, int batch) {
  generator_options go;
  go.cache_tokens = cache_tokens;
  go.prefill_chunk = 64;
  go.max_sequences = 8;
  go.decode_batch = batch;
  return go;
}

// Starts a sequence of max_new[s] tokens per prompt, the first one held on
// its first token until all have started (so that all are in their slot's
// lanes before it goes on).
std::vector<generation> start_all_before_the_first_goes_on(generator& gen,
                                                           const std::vector<std::vector<int32_t>>& prompts,
                                                           const std::vector<int>& max_new, bool keep_logits) {
  std::promise<void> release;
  std::shared_future<void> released = release.get_future().share();
  std::vector<generation> hs;
  for (std::size_t s = 0; s < prompts.size(); ++s) {
    generate_options o;
    o.max_new_tokens = max_new[s];
    o.keep_logits = keep_logits;
    if (s == 0)
      o.on_token = [released](int32_t, int64_t k) {
        if (k == 0) released.wait_for(60s);
      };
    hs.push_back(gen.generate(prompts[s], o));
  }
  release.set_value();
  return hs;
}

// Batched decode steps (generator_options::decode_batch 8) on one GPU: 8
// sequences of different prompts (5 to 89 tokens, in prefill chunks of 64)
// and lengths, all in one slot's lanes before the first goes on, decode
// together in steps of 8, then of fewer rows as they end (padding rows, and
// the one-token plans for the last one); each sequence's logits equal the
// cpu device's run of it alone: f32 within 2e-3 and the same tokens; bf16
// within 1.5 times bf16's tolerance while its tokens so far agree (a random
// model's bf16 logits tie often), with the steps' GEMVs on the FMA kernel and
// on the tensor cores (backend_options::cuda_gemv_tensor_core_rows 2). The
// steps' attention runs its rows apart (transformer_config::rows_apart: a
// block group a row and kv head), over 8 lanes of 160 rows (trimmed to the
// row's lane) and of 112 (896 keys: swept whole, masked).
TEST(CudaGenerate, BatchedDecodeOfEightSequencesEqualsTheCpuDevice) {
  AG_REQUIRE_GPU(1);
  struct form {
    dtype type;
    int tensor_core_rows;  // backend_options::cuda_gemv_tensor_core_rows (f32 stays on the FMA kernel)
    int64_t cache_tokens;  // a lane's; 8 lanes of 160 rows: 1280 keys, which the attention trims to a row's
                           // lane; of 112: 896, fewer than it trims (each row's blocks sweep all, masked)
  };
  for (const form& f : {form{dtype::f32, 0, 160}, form{dtype::bf16, 0, 160}, form{dtype::bf16, 2, 160},
                        form{dtype::bf16, 2, 112}}) {
    const dtype type = f.type;
    SCOPED_TRACE(std::string(to_string(type)) + ", GEMVs on the tensor cores from " +
                 std::to_string(f.tensor_core_rows) + " rows, " + std::to_string(f.cache_tokens) + " cache rows a lane");
    models::transformer_config cfg = whole_step_model(4, 2, 64, 512);
    cfg.dtype = type;
    test::temp_dir dir;
    test::save_random_model(dir.str(), cfg);
    auto m = models::hf_model::open(dir.str());
    ASSERT_TRUE(m) << m.err().to_string();
    const auto make = [&](runtime& rt, int batch) {
      return generator::create(rt, m->model_config(1), m->provider(), eight_sequences(f.cache_tokens, batch));
    };
    std::vector<std::vector<int32_t>> prompts;
    std::vector<int> max_new;
    for (int s = 0; s < 8; ++s) {
      prompts.push_back(xorshift_prompt(static_cast<std::size_t>(5 + 12 * s), 0x2545f4914f6cdd1dull + static_cast<uint64_t>(s)));
      max_new.push_back(24 - 2 * s);
    }
    auto cpu_rt = runtime::create("cpu:1");
    ASSERT_TRUE(cpu_rt) << cpu_rt.err().to_string();
    auto cpu = make(**cpu_rt, 0);
    ASSERT_TRUE(cpu) << cpu.err().to_string();
    auto rt = runtime_with_tensor_core_rows(f.tensor_core_rows);
    ASSERT_TRUE(rt) << rt.err().to_string();
    auto gen = make(**rt, 8);
    ASSERT_TRUE(gen) << gen.err().to_string();
    const std::vector<generation> hs = start_all_before_the_first_goes_on(**gen, prompts, max_new, true);
    int64_t batched = 0;
    for (std::size_t s = 0; s < prompts.size(); ++s) {
      ASSERT_TRUE(hs[s].wait_for(300s)) << "sequence " << s << " hung";
      const auto& got = hs[s].wait();
      ASSERT_TRUE(got) << got.err().to_string();
      ASSERT_EQ(got->tokens.size(), static_cast<std::size_t>(max_new[s]));
      batched += got->tokens_batched;
      generate_options o;
      o.max_new_tokens = max_new[s];
      o.keep_logits = true;
      const auto want = (*cpu)->generate(prompts[s], o).wait();
      ASSERT_TRUE(want) << want.err().to_string();
      const bool bf16 = type == dtype::bf16;
      for (std::size_t t = 0; t < got->tokens.size() && (t == 0 || got->tokens[t - 1] == want->tokens[t - 1]); ++t) {
        // bf16: up to 1.5 of the one-sequence tolerance (the 8-row products
        // and the attention over other lanes' rows round in another order
        // than the cpu device's; the first run measured 1.0014 once).
        EXPECT_LT(worst_over_tolerance(want->logits[t], got->logits[t], bf16), bf16 ? 1.5 : 1.0)
            << "sequence " << s << ", token " << t << ": error over tolerance";
        if (!bf16) {
          EXPECT_EQ(got->tokens[t], want->tokens[t]) << "sequence " << s << ", token " << t;
        }
      }
    }
    EXPECT_GT(batched, 8 * 6) << "the steps of 8 rows carried few tokens";
  }
}

// Pipelined batched greedy steps on one GPU (lane_group's runs: each row's
// token kept in a state of 8 rows and read back by the next step on the
// device). f32: 8 greedy sequences in one slot of 8 lanes, all joined
// before the first goes on, each equal to the cpu device's greedy run of it
// alone, some tokens pipelined. bf16, the persistent decode-step kernel's
// dtype: a sequence alone in a slot of 8 lanes runs the one-token plans
// that keep its token in row 0 of those states (the kernel's output), its
// tokens those of a slot of its own on the same GPU, 14 of 16 pipelined.
TEST(CudaGenerate, BatchedGreedyStepsPipelineOnTheDevice) {
  AG_REQUIRE_GPU(1);
  for (const dtype type : {dtype::f32, dtype::bf16}) {
    SCOPED_TRACE(to_string(type));
    models::transformer_config cfg = whole_step_model(4, 2, 64, 512);
    cfg.dtype = type;
    test::temp_dir dir;
    test::save_random_model(dir.str(), cfg);
    auto m = models::hf_model::open(dir.str());
    ASSERT_TRUE(m) << m.err().to_string();
    const auto make = [&](runtime& rt, int batch) {
      return generator::create(rt, m->model_config(1), m->provider(), eight_sequences(160, batch));
    };
    auto rt = runtime::create("cuda:0");
    ASSERT_TRUE(rt) << rt.err().to_string();
    auto gen = make(**rt, 8);
    ASSERT_TRUE(gen) << gen.err().to_string();
    if (type == dtype::bf16) {
      auto own_slot = make(**rt, 0);
      ASSERT_TRUE(own_slot) << own_slot.err().to_string();
      const std::vector<int32_t> prompt = xorshift_prompt(37, 0x9e3779b97f4a7c15ull);
      generate_options o;
      o.max_new_tokens = 16;
      const auto want = (*own_slot)->generate(prompt, o).wait();
      ASSERT_TRUE(want) << want.err().to_string();
      const auto got = (*gen)->generate(prompt, o).wait();
      ASSERT_TRUE(got) << got.err().to_string();
      EXPECT_EQ(got->tokens, want->tokens) << "alone in a slot of 8 lanes against a slot of its own";
      EXPECT_EQ(got->tokens_pipelined, 14);
      continue;
    }
    auto cpu_rt = runtime::create("cpu:1");
    ASSERT_TRUE(cpu_rt) << cpu_rt.err().to_string();
    auto cpu = make(**cpu_rt, 0);
    ASSERT_TRUE(cpu) << cpu.err().to_string();
    std::vector<std::vector<int32_t>> prompts;
    std::vector<int> max_new;
    for (int s = 0; s < 8; ++s) {
      prompts.push_back(xorshift_prompt(static_cast<std::size_t>(5 + 9 * s), 0x2545f4914f6cdd1dull + static_cast<uint64_t>(s)));
      max_new.push_back(28 - 2 * s);
    }
    const std::vector<generation> hs = start_all_before_the_first_goes_on(**gen, prompts, max_new, false);
    int64_t pipelined = 0;
    for (std::size_t s = 0; s < prompts.size(); ++s) {
      ASSERT_TRUE(hs[s].wait_for(300s)) << "sequence " << s << " hung";
      const auto& got = hs[s].wait();
      ASSERT_TRUE(got) << got.err().to_string();
      pipelined += got->tokens_pipelined;
      generate_options o;
      o.max_new_tokens = max_new[s];
      const auto want = (*cpu)->generate(prompts[s], o).wait();
      ASSERT_TRUE(want) << want.err().to_string();
      EXPECT_EQ(got->tokens, want->tokens) << "sequence " << s;
    }
    EXPECT_GT(pipelined, 0) << "no batched step read its tokens on the device";
  }
}

}  // namespace
}  // namespace ag
