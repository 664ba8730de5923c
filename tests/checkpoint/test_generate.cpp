// ag::generator: decode over the KV cache equals recomputing the whole
// sequence (tiny GPT-2 and LLaMA GQA checkpoints written here, sim with
// values and cpu, one device and two pipeline stages, with and without a
// prefill plan); many sequences at once; cancel; a full cache; sampling.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <future>
#include <limits>
#include <map>
#include <set>
#include <thread>
#include <tuple>

#include "actors/generator.hpp"
#include "checkpoint/checkpoint_test_util.hpp"
#include "graph/plan.hpp"
#include "graph/reference.hpp"
#include "graph/tensor_parallel.hpp"
#include "gpu/sim/sim_device.hpp"

using namespace std::chrono_literals;
using ag::test::temp_dir;

namespace {

ag::runtime_options fast_sim() {
  ag::runtime_options o;
  o.backend.sim.time_scale = 1e-2;
  return o;
}

// GPT-2, LLaMA with GQA, a Llama-3-style LLaMA: a tied head and Llama 3's
// RoPE scaling, whose original context of 128 puts the heads' four pairs
// (wavelengths 6.3, 53, 444, 3738 at theta 5000) in all three of its
// regimes: kept, blended, slowed by the factor; and a LLaMA with linear RoPE
// scaling (every pair slowed by 2); heads wider than d_model / heads; Qwen2's biases; Qwen3's q/k norms;
// Mistral's sliding window.
std::vector<ag::models::transformer_config> tiny_models() {
  auto llama3 = ag::test::tiny_model(ag::models::model_variant::llama, 2);
  llama3.head = ag::models::head_tying::tied;
  llama3.rope_scale = {4.0f, 1.0f, 4.0f, 128};
  auto linear = ag::test::tiny_model(ag::models::model_variant::llama, 2);
  linear.rope_scale.kind = ag::rope_scaling_kind::linear;
  linear.rope_scale.factor = 2.0f;
  // Heads of 12 where d_model / n_heads is 8 (HF's head_dim: q 48 wide, o's input 48).
  auto wide_heads = ag::test::tiny_model(ag::models::model_variant::llama, 2);
  wide_heads.explicit_head_dim = 12;
  // Qwen2's q/k/v biases: the cache holds keys and values with theirs.
  auto qwen2 = ag::test::tiny_model(ag::models::model_variant::llama, 2);
  qwen2.attn_bias = ag::models::attention_bias::qkv;
  qwen2.head = ag::models::head_tying::tied;
  // Qwen3's q/k norms (the cache holds normed, roped keys).
  auto qwen3 = ag::test::tiny_model(ag::models::model_variant::llama, 2);
  qwen3.qk_norm = true;
  // Mistral's sliding window of 4 over a prompt of 6 and 7 new tokens: the
  // generator's masks hide the older keys as the plain pass's window masks do.
  auto mistral = ag::test::tiny_model(ag::models::model_variant::llama, 2);
  mistral.sliding_window = 4;
  return {ag::test::tiny_model(ag::models::model_variant::gpt2),
          ag::test::tiny_model(ag::models::model_variant::llama, 2), llama3, linear, wide_heads, qwen2, qwen3, mistral};
}

using ag::test::recomputed_last_logits;

// The largest |ref[i] - got[i]|.
double worst_logit_error(const std::vector<float>& ref, const std::vector<float>& got) {
  double worst = 0.0;
  for (std::size_t i = 0; i < ref.size() && i < got.size(); ++i)
    worst = std::max(worst, static_cast<double>(std::abs(ref[i] - got[i])));
  return worst;
}

// A tiny LLaMA (GQA, 2 kv heads) in f32.
ag::models::transformer_config tiny_llama_f32() {
  auto cfg = ag::test::tiny_model(ag::models::model_variant::llama, 2);
  cfg.dtype = ag::dtype::f32;
  return cfg;
}

// `cfg` with random weights saved into `dir`, opened again.
ag::expected<ag::models::hf_model> saved_model(const temp_dir& dir, const ag::models::transformer_config& cfg) {
  ag::test::save_random_model(dir.str(), cfg);
  return ag::models::hf_model::open(dir.str());
}

// `cfg` with random weights saved into a directory of its own and opened
// again, and a runtime on `spec`: where most tests here start.
struct saved_setup {
  temp_dir dir;  // outlives the model, which maps its files
  ag::expected<ag::models::hf_model> model;
  ag::expected<std::unique_ptr<ag::runtime>> rt;
  std::string why;  // what failed, empty when both are there
  saved_setup(const ag::models::transformer_config& cfg, const std::string& spec)
      : model(saved_model(dir, cfg)), rt(ag::runtime::create(spec, fast_sim())) {
    if (!model) why = model.err().to_string();
    else if (!rt) why = rt.err().to_string();
  }
  bool ready() const { return why.empty(); }
};

// `cfg` saved into `dir` and opened, a cpu:1 runtime, and a generator over
// it with one sequence of `cache_tokens` positions in prefill chunks of 512.
struct chunked_setup {
  ag::generator_options options;
  ag::expected<ag::models::hf_model> model;
  ag::expected<std::unique_ptr<ag::runtime>> rt;
  ag::expected<std::shared_ptr<ag::generator>> gen = ag::error(ag::errc::internal, "not made");
  std::string why;
  chunked_setup(const temp_dir& dir, const ag::models::transformer_config& cfg, int64_t cache_tokens,
                bool prompt_masks_on_device = true)
      : model(saved_model(dir, cfg)), rt(ag::runtime::create("cpu:1")) {
    if (!model) { why = model.err().to_string(); return; }
    if (!rt) { why = rt.err().to_string(); return; }
    options.cache_tokens = cache_tokens;
    options.max_sequences = 1;
    options.prefill_chunk = 512;
    options.prompt_masks_on_device = prompt_masks_on_device;
    gen = ag::generator::create(**rt, model->model_config(1), model->provider(), options);
    if (!gen) why = gen.err().to_string();
  }
  bool ready() const { return why.empty(); }
};

// Generates `new_tokens` tokens after `prompt`, keeping their logits, and
// checks each token's logits against recomputing the whole sequence so far.
void expect_logits_equal_recompute(ag::generator& gen, const ag::models::hf_model& m,
                                   const std::vector<int32_t>& prompt, int new_tokens, double tolerance) {
  ag::generate_options o;
  o.max_new_tokens = new_tokens;
  o.keep_logits = true;
  const ag::generation h = gen.generate(prompt, o);
  ASSERT_TRUE(h.wait_for(120s)) << "generation hung";
  const auto& r = h.wait();
  ASSERT_TRUE(r.has_value()) << r.err().to_string();
  ASSERT_EQ(r->tokens.size(), static_cast<std::size_t>(new_tokens));
  std::vector<int32_t> seq = prompt;
  for (std::size_t k = 0; k < r->tokens.size(); ++k) {
    EXPECT_LT(worst_logit_error(recomputed_last_logits(m, seq), r->logits[k]), tolerance)
        << "prompt of " << prompt.size() << ", token " << k;
    seq.push_back(r->tokens[k]);
  }
}

void decode_equals_recompute(const std::string& spec, int stages, int64_t prefill_chunk, int tp = 1,
                             bool across_stages = false,
                             ag::sequence_parallel_mode sp = ag::sequence_parallel_mode::automatic) {
  for (const auto& cfg : tiny_models()) {
    SCOPED_TRACE(std::string(to_string(cfg.variant)) + " (heads of " + std::to_string(cfg.head_dim()) + ") on " + spec +
                 ", stages " + std::to_string(stages) +
                 ", prefill_chunk " + std::to_string(prefill_chunk));
    const saved_setup s(cfg, spec);
    ASSERT_TRUE(s.ready()) << s.why;
    const auto& m = s.model;
    const auto& rt = s.rt;
    ASSERT_EQ(m->model_config(1).rope_scale, cfg.rope_scale) << "the saved config's RoPE scaling";
    ASSERT_EQ(m->model_config(1).sliding_window, cfg.sliding_window) << "the saved config's sliding window";
    ag::generator_options go;
    go.cache_tokens = 16;
    go.prefill_chunk = prefill_chunk;
    go.plan.pipeline_stages = stages;
    go.plan.tensor_parallel = tp;
    go.pipeline_across_stages = across_stages;
    go.plan.sequence_parallel = sp;
    auto gen = ag::generator::create(**rt, m->model_config(1), m->provider(), go);
    ASSERT_TRUE(gen.has_value()) << gen.err().to_string();
    // Mistral's window of 4: a ring of 4 + chunk - 1 rows, which the 13
    // positions go round more than once.
    EXPECT_EQ((*gen)->cache_rows(),
              cfg.sliding_window > 0 ? cfg.sliding_window + std::max<int64_t>(prefill_chunk, 1) - 1 : go.cache_tokens);
    if (sp == ag::sequence_parallel_mode::on) {
      // The prefill chunks' rows split over the ranks; a one-row step cannot.
      const auto count = [](const ag::plan* p, ag::op_kind op) {
        int n = 0;
        if (p && p->tensor_parallel())
          for (const auto& c : p->tensor_parallel()->collectives) n += c.op == op;
        return n;
      };
      ASSERT_NE((*gen)->prefill_plan(), nullptr);
      EXPECT_GT(count((*gen)->prefill_plan(), ag::op_kind::reduce_scatter), 0);
      EXPECT_GT(count((*gen)->prefill_plan(), ag::op_kind::all_gather), 0);
      EXPECT_EQ(count(&(*gen)->decode_plan(), ag::op_kind::reduce_scatter), 0);
    }
    if (stages <= 1 && tp == 1) {
      // Decode and prefill plans lay the weights out alike on one device: one
      // upload, the decode plan's. Each weight's slot is 256-byte aligned;
      // the norms' weights folded into the projections are not uploaded.
      EXPECT_EQ((*gen)->weight_bytes(), (*gen)->decode_plan().memory().at(0).weight_bytes);
      EXPECT_GT((*gen)->weight_bytes(), m->model_bytes() * 9 / 10);
      EXPECT_LT((*gen)->weight_bytes(), m->model_bytes() + 256 * 64);
    }
    const std::vector<int32_t> prompt{3, 1, 4, 1, 5, 9};
    ag::generate_options o;
    o.max_new_tokens = 7;
    o.keep_logits = true;
    std::vector<int32_t> streamed;
    o.on_token = [&](int32_t t, int64_t i) {
      EXPECT_EQ(i, static_cast<int64_t>(streamed.size()));
      streamed.push_back(t);
    };
    ag::generation h = (*gen)->generate(prompt, o);
    ASSERT_TRUE(h.wait_for(120s)) << "generation hung";
    const auto& r = h.wait();
    ASSERT_TRUE(r.has_value()) << r.err().to_string();
    ASSERT_EQ(r->tokens.size(), 7u);
    EXPECT_EQ(r->reason, ag::stop_reason::max_tokens);
    EXPECT_EQ(streamed, r->tokens);
    std::vector<int32_t> seq = prompt;
    for (std::size_t t = 0; t < r->tokens.size(); ++t) {
      const std::vector<float> ref = recomputed_last_logits(*m, seq);
      ASSERT_EQ(ref.size(), r->logits[t].size());
      EXPECT_LT(worst_logit_error(ref, r->logits[t]), 2e-3) << "token " << t << ": logits differ from recomputing the whole sequence";
      const auto argmax = static_cast<int32_t>(std::max_element(ref.begin(), ref.end()) - ref.begin());
      EXPECT_EQ(r->tokens[t], argmax) << "token " << t;
      seq.push_back(r->tokens[t]);
    }
    EXPECT_EQ(r->tokens_picked_on_device, 0) << "keep_logits samples on the host";
    // Greedy without logits: every token picked on the device
    // (generator_options::device_greedy), the same tokens.
    o.keep_logits = false;
    streamed.clear();
    ag::generation d = (*gen)->generate(prompt, o);
    ASSERT_TRUE(d.wait_for(120s)) << "generation hung";
    const auto& dr = d.wait();
    ASSERT_TRUE(dr.has_value()) << dr.err().to_string();
    EXPECT_EQ(dr->tokens, r->tokens);
    // The first token comes from the prompt's last job: a prefill chunk of
    // more than one token samples on the host.
    const auto last_chunk = prefill_chunk > 1 ? (static_cast<int64_t>(prompt.size()) - 1) % prefill_chunk + 1 : 1;
    EXPECT_EQ(dr->tokens_picked_on_device, last_chunk > 1 ? 6 : 7);
    EXPECT_EQ(streamed, dr->tokens);
    // Pipelined (generator_options::pipeline_depth 2, the default) on one
    // stage: each step after the first read its token on the device, queued
    // behind the step before (one stream) or started when it ended (tensor
    // parallel). Layouts of several stages keep one step at a time unless
    // generator_options::pipeline_across_stages (the token crosses stages).
    const bool pipelines = stages <= 1 || across_stages;
    EXPECT_EQ(dr->tokens_pipelined, pipelines ? (last_chunk > 1 ? 5 : 6) : 0);
    {
      // One step at a time (pipeline_depth 1): the same tokens, none pipelined.
      go.pipeline_depth = 1;
      auto serial = ag::generator::create(**rt, m->model_config(1), m->provider(), go);
      ASSERT_TRUE(serial.has_value()) << serial.err().to_string();
      streamed.clear();
      auto sr = (*serial)->generate(prompt, o).wait();
      ASSERT_TRUE(sr.has_value()) << sr.err().to_string();
      EXPECT_EQ(sr->tokens, r->tokens);
      EXPECT_EQ(streamed, sr->tokens);
      EXPECT_EQ(sr->tokens_pipelined, 0);
    }
  }
}

// Generates `prompt` alone, greedy, on a fresh generator over the same model.
std::vector<int32_t> alone(ag::runtime& rt, const ag::models::hf_model& m, const std::vector<int32_t>& prompt,
                           int max_new, int stages) {
  ag::generator_options go;
  go.cache_tokens = 16;
  go.max_sequences = 1;
  go.plan.pipeline_stages = stages;
  auto gen = ag::generator::create(rt, m.model_config(1), m.provider(), go);
  EXPECT_TRUE(gen.has_value()) << gen.err().to_string();
  if (!gen) return {};
  ag::generate_options o;
  o.max_new_tokens = max_new;
  auto h = (*gen)->generate(prompt, o);
  EXPECT_TRUE(h.wait_for(120s));
  const auto& r = h.wait();
  EXPECT_TRUE(r.has_value()) << r.err().to_string();
  return r ? r->tokens : std::vector<int32_t>{};
}

// Starts a greedy sequence per prompt, max_new(i) tokens each; sequence
// `cancelled` cancels itself on its first token, so it is cancelled while it
// runs whatever the machine's speed. Its on_token waits for the handle,
// which generate() returns before any token streams (generator.hpp).
std::vector<ag::generation> start_one_self_cancelling(ag::generator& gen,
                                                      const std::vector<std::vector<int32_t>>& prompts,
                                                      std::size_t cancelled, const std::function<int(std::size_t)>& max_new) {
  std::promise<ag::generation> cancelled_handle;
  std::shared_future<ag::generation> cancelled_future = cancelled_handle.get_future().share();
  std::vector<ag::generation> hs;
  for (std::size_t i = 0; i < prompts.size(); ++i) {
    ag::generate_options o;
    o.max_new_tokens = max_new(i);
    if (i == cancelled)
      o.on_token = [cancelled_future](int32_t, int64_t index) {
        if (index == 0) cancelled_future.get().cancel();
      };
    hs.push_back(gen.generate(prompts[i], o));
    if (i == cancelled) cancelled_handle.set_value(hs.back());
  }
  return hs;
}

}  // namespace

TEST(GenerateDecode, EqualsRecomputeSim1Device) { decode_equals_recompute("sim:1", 1, 0); }
TEST(GenerateDecode, EqualsRecomputeCpu1Device) { decode_equals_recompute("cpu:1", 1, 0); }
TEST(GenerateDecode, EqualsRecomputeSim2Stages) { decode_equals_recompute("sim:2", 2, 0); }
TEST(GenerateDecode, EqualsRecomputeCpu2Stages) { decode_equals_recompute("cpu:2", 2, 0); }
TEST(GenerateDecode, EqualsRecomputeWithPaddedPrefillChunksCpu) { decode_equals_recompute("cpu:1", 1, 4); }
TEST(GenerateDecode, EqualsRecomputeWithPrefillChunks2StagesSim) { decode_equals_recompute("sim:2", 2, 4); }
TEST(GenerateDecode, EqualsRecomputeTensorParallel2Sim) { decode_equals_recompute("sim:2", 1, 4, 2); }
TEST(GenerateDecode, EqualsRecomputeTensorParallel2Cpu) { decode_equals_recompute("cpu:2", 1, 0, 2); }
// Sequence parallelism in the prefill (rows of the prompt split over the
// ranks: reduce-scatters and all-gathers); the one-row steps keep all-reduces.
TEST(GenerateDecode, EqualsRecomputeTensorParallel2SequenceParallelCpu) {
  decode_equals_recompute("cpu:2", 1, 4, 2, false, ag::sequence_parallel_mode::on);
}
TEST(GenerateDecode, EqualsRecomputeTwoStagesByTensorParallel2Sim) { decode_equals_recompute("sim:4", 2, 0, 2); }
TEST(GenerateDecode, EqualsRecomputePipelinedAcrossTwoStages) {
  decode_equals_recompute("sim:2", 2, 0, 1, /*across_stages=*/true);
  decode_equals_recompute("cpu:2", 2, 4, 1, /*across_stages=*/true);
}

TEST(GenerateMany, ConcurrentSequencesEachEqualTheirSoloRunAndCancelledOnesStop) {
  const auto cfg = ag::test::tiny_model(ag::models::model_variant::llama, 2);
  const saved_setup s(cfg, "sim:2");
  ASSERT_TRUE(s.ready()) << s.why;
  const auto& m = s.model;
  const auto& rt = s.rt;
  ag::generator_options go;
  go.cache_tokens = 16;
  go.max_sequences = 3;  // 6 sequences: three wait for a slot
  go.plan.pipeline_stages = 2;
  auto gen = ag::generator::create(**rt, m->model_config(1), m->provider(), go);
  ASSERT_TRUE(gen.has_value()) << gen.err().to_string();
  const std::vector<std::vector<int32_t>> prompts{{1, 2, 3}, {7, 7}, {40, 0, 13, 2}, {5}, {9, 8, 7, 6, 5}, {11, 22}};
  // Sequence 2 cancels itself on its first token (cancelling from here
  // after the six generate() calls raced it to its sixth token on a fast sim).
  const std::size_t cancelled = 2;
  const std::vector<ag::generation> hs = start_one_self_cancelling(**gen, prompts, cancelled, [](std::size_t) { return 6; });
  for (std::size_t i = 0; i < hs.size(); ++i) {
    ASSERT_TRUE(hs[i].wait_for(120s)) << "sequence " << i << " hung";
    const auto& r = hs[i].wait();
    ASSERT_TRUE(r.has_value()) << r.err().to_string();
    if (i == cancelled) {
      EXPECT_EQ(r->reason, ag::stop_reason::cancelled);
      EXPECT_LT(r->tokens.size(), 6u);
      continue;
    }
    EXPECT_EQ(r->reason, ag::stop_reason::max_tokens);
    EXPECT_EQ(r->tokens, alone(**rt, *m, prompts[i], 6, 2)) << "sequence " << i << " differs from its solo run";
  }
  EXPECT_EQ((*gen)->active_sequences(), 0);
  EXPECT_EQ((*gen)->waiting_sequences(), 0);
}

TEST(GeneratePipelined, DepthOutsideItsRangeIsRefused) {
  const auto cfg = ag::test::tiny_model(ag::models::model_variant::gpt2);
  const saved_setup s(cfg, "sim:1");
  ASSERT_TRUE(s.ready()) << s.why;
  const auto& m = s.model;
  const auto& rt = s.rt;
  for (int depth : {0, 17}) {
    ag::generator_options go;
    go.cache_tokens = 16;
    go.pipeline_depth = depth;
    auto gen = ag::generator::create(**rt, m->model_config(1), m->provider(), go);
    ASSERT_FALSE(gen.has_value());
    EXPECT_NE(gen.err().message.find("pipeline_depth must be 1..16, got " + std::to_string(depth)), std::string::npos)
        << gen.err().message;
  }
}

namespace {

struct held_first {
  std::promise<void> release;
  std::shared_future<void> released{release.get_future().share()};
};

}  // namespace

TEST(GenerateCache, FullCacheFailsClearlyOrQueuesAndSequencesStopAtCapacity) {
  const auto cfg = ag::test::tiny_model(ag::models::model_variant::gpt2);
  const saved_setup s(cfg, "cpu:1");
  ASSERT_TRUE(s.ready()) << s.why;
  const auto& m = s.model;
  const auto& rt = s.rt;
  for (bool queue : {false, true}) {
    SCOPED_TRACE(queue ? "queue_when_full" : "fail when full");
    ag::generator_options go;
    go.cache_tokens = 8;
    go.max_sequences = 1;
    go.queue_when_full = queue;
    auto gen = ag::generator::create(**rt, m->model_config(1), m->provider(), go);
    ASSERT_TRUE(gen.has_value()) << gen.err().to_string();
    // Keys and values, and the two token states of pipelined greedy
    // decoding (one device: pipelined), 4 bytes each in a 256-byte slot.
    EXPECT_EQ((*gen)->cache_bytes(), 2 * cfg.n_layers * cfg.n_heads * 8 * cfg.head_dim() * 4 + 2 * 256);
    // The first sequence holds the only slot until the test lets its first
    // token's callback return.
    held_first hold;
    ag::generate_options first;
    first.max_new_tokens = 100;  // capacity decides: 8 - 5 + 1 tokens
    first.on_token = [&](int32_t, int64_t i) {
      if (i == 0) hold.released.wait_for(60s);
    };
    ag::generation a = (*gen)->generate({1, 2, 3, 4, 5}, first);
    ag::generate_options second;
    second.max_new_tokens = 5;
    ag::generation b = (*gen)->generate({6, 7}, second);
    if (!queue) {
      ASSERT_TRUE(b.ready());
      ASSERT_FALSE(b.wait().has_value());
      EXPECT_EQ(b.wait().err().code, ag::errc::out_of_memory);
      EXPECT_NE(b.wait().err().message.find("KV cache slots are taken"), std::string::npos)
          << b.wait().err().message;
    } else {
      EXPECT_FALSE(b.ready());
      EXPECT_EQ((*gen)->waiting_sequences(), 1);
    }
    hold.release.set_value();
    ASSERT_TRUE(a.wait_for(120s));
    ASSERT_TRUE(a.wait().has_value()) << a.wait().err().to_string();
    EXPECT_EQ(a.wait()->reason, ag::stop_reason::cache_full);
    EXPECT_EQ(a.wait()->tokens.size(), 4u);
    if (queue) {
      ASSERT_TRUE(b.wait_for(120s));
      ASSERT_TRUE(b.wait().has_value()) << b.wait().err().to_string();
      EXPECT_EQ(b.wait()->tokens, alone(**rt, *m, {6, 7}, 5, 1));
    }
  }
}

TEST(GenerateCache, ASlidingWindowKeepsARingOfItsWindowAndASequenceRunsToCacheTokens) {
  auto cfg = ag::test::tiny_model(ag::models::model_variant::llama, 2);
  cfg.sliding_window = 4;
  const saved_setup s(cfg, "cpu:1");
  ASSERT_TRUE(s.ready()) << s.why;
  const auto& m = s.model;
  const auto& rt = s.rt;
  ag::generator_options go;
  go.cache_tokens = 64;
  go.max_sequences = 1;
  go.prefill_chunk = 3;
  auto gen = ag::generator::create(**rt, m->model_config(1), m->provider(), go);
  ASSERT_TRUE(gen.has_value()) << gen.err().to_string();
  // 4 + 3 - 1 rows, not 64: each layer's keys and values (a 256-byte
  // aligned slot each), and the two token states (4 bytes in a slot each).
  EXPECT_EQ((*gen)->cache_rows(), 6);
  const auto slot_bytes = [](int64_t b) { return (b + 255) / 256 * 256; };
  EXPECT_EQ((*gen)->cache_bytes(), 2 * cfg.n_layers * slot_bytes(cfg.kv_heads() * 6 * cfg.head_dim() * 4) + 2 * 256);
  // 12 prompt tokens (4 chunks of 3: a chunk's first query reaches back to
  // the row its last store would take in a ring one row shorter), then
  // tokens until the 64 positions are reached: 64 - 12 + 1 of them, each
  // equal to the plain pass over the whole sequence with its window mask.
  const std::vector<int32_t> prompt{3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5, 8};
  ag::generate_options o;
  o.max_new_tokens = 100;
  o.keep_logits = true;
  const auto r = (*gen)->generate(prompt, o).wait();
  ASSERT_TRUE(r.has_value()) << r.err().to_string();
  EXPECT_EQ(r->reason, ag::stop_reason::cache_full);
  ASSERT_EQ(r->tokens.size(), 53u);
  std::vector<int32_t> seq = prompt;
  for (std::size_t t = 0; t < r->tokens.size(); ++t) {
    const std::vector<float> ref = recomputed_last_logits(*m, seq);
    ASSERT_EQ(ref.size(), r->logits[t].size());
    ASSERT_LT(worst_logit_error(ref, r->logits[t]), 2e-3) << "token " << t << " (position " << seq.size() << "): logits differ from the recompute";
    seq.push_back(r->tokens[t]);
  }
  // Greedy on the device, steps pipelined: the same tokens.
  o.keep_logits = false;
  const auto d = (*gen)->generate(prompt, o).wait();
  ASSERT_TRUE(d.has_value()) << d.err().to_string();
  EXPECT_EQ(d->tokens, r->tokens);
  EXPECT_GT(d->tokens_pipelined, 40);
  // The same model without the window: every position a row.
  cfg.sliding_window = 0;
  auto full = ag::generator::create(**rt, cfg, {}, go);
  ASSERT_TRUE(full.has_value()) << full.err().to_string();
  EXPECT_EQ((*full)->cache_rows(), 64);
}

TEST(GenerateCache, CancellingAWaitingSequenceEndsItWhileTheSlotIsStillHeld) {
  const auto cfg = ag::test::tiny_model(ag::models::model_variant::gpt2);
  const saved_setup s(cfg, "cpu:1");
  ASSERT_TRUE(s.ready()) << s.why;
  const auto& m = s.model;
  const auto& rt = s.rt;
  ag::generator_options go;
  go.cache_tokens = 8;
  go.max_sequences = 1;
  auto gen = ag::generator::create(**rt, m->model_config(1), m->provider(), go);
  ASSERT_TRUE(gen.has_value()) << gen.err().to_string();
  // `a` holds the only slot until its first token's callback returns, which
  // is after the test has seen the cancelled waiters end.
  held_first hold;
  ag::generate_options first;
  first.max_new_tokens = 2;
  first.on_token = [&](int32_t, int64_t i) {
    if (i == 0) hold.released.wait_for(60s);
  };
  ag::generation a = (*gen)->generate({1, 2, 3}, first);
  ag::generate_options later;
  later.max_new_tokens = 3;
  ag::generation b = (*gen)->generate({4, 5}, later);
  ag::generation c = (*gen)->generate({6, 7}, later);
  EXPECT_EQ((*gen)->waiting_sequences(), 2);
  b.cancel();
  ASSERT_TRUE(b.ready());  // no slot and no job: it ends in cancel() itself
  ASSERT_TRUE(b.wait().has_value()) << b.wait().err().to_string();
  EXPECT_EQ(b.wait()->reason, ag::stop_reason::cancelled);
  EXPECT_TRUE(b.wait()->tokens.empty());
  EXPECT_EQ((*gen)->waiting_sequences(), 1);
  EXPECT_FALSE(a.ready());
  EXPECT_EQ((*gen)->active_sequences(), 1);
  hold.release.set_value();
  ASSERT_TRUE(a.wait_for(120s));
  ASSERT_TRUE(a.wait().has_value()) << a.wait().err().to_string();
  // The slot went to c, the waiter left after b's cancel.
  ASSERT_TRUE(c.wait_for(120s));
  ASSERT_TRUE(c.wait().has_value()) << c.wait().err().to_string();
  EXPECT_EQ(c.wait()->tokens, alone(**rt, *m, {6, 7}, 3, 1));
  EXPECT_EQ((*gen)->active_sequences(), 0);
  EXPECT_EQ((*gen)->waiting_sequences(), 0);
}

TEST(GenerateCache, BadPromptsFailAtOnceNamingWhy) {
  const auto cfg = ag::test::tiny_model(ag::models::model_variant::gpt2);
  auto rt = ag::runtime::create("cpu:1");
  ASSERT_TRUE(rt.has_value());
  ag::generator_options go;
  go.cache_tokens = 8;
  auto gen = ag::generator::create(**rt, cfg, {}, go);
  ASSERT_TRUE(gen.has_value()) << gen.err().to_string();
  auto empty = (*gen)->generate({});
  ASSERT_TRUE(empty.ready());
  EXPECT_NE(empty.wait().err().message.find("prompt is empty"), std::string::npos);
  auto oov = (*gen)->generate({1, 41});
  EXPECT_NE(oov.wait().err().message.find("prompt token 1 is 41, outside the vocabulary [0, 41)"), std::string::npos)
      << oov.wait().err().message;
  auto longp = (*gen)->generate(std::vector<int32_t>(9, 1));
  EXPECT_NE(longp.wait().err().message.find("exceed cache_tokens 8"), std::string::npos);
  go.cache_tokens = 17;  // tiny gpt2 has 16 positions
  auto too_long = ag::generator::create(**rt, cfg, {}, go);
  ASSERT_FALSE(too_long.has_value());
  EXPECT_NE(too_long.err().message.find("position table"), std::string::npos) << too_long.err().message;
}

TEST(GenerateSampling, SeedsTopKAndTopP) {
  std::vector<float> logits{0.0f, 3.0f, 2.9f, -1.0f, 1.0f};
  uint64_t s = 1;
  EXPECT_EQ(ag::sample_token(logits, {}, s), 1);  // greedy
  ag::sampling_options top2{.temperature = 1.0f, .top_k = 2};
  std::set<int32_t> seen;
  for (int i = 0; i < 400; ++i) seen.insert(ag::sample_token(logits, top2, s));
  EXPECT_EQ(seen, (std::set<int32_t>{1, 2}));
  ag::sampling_options nucleus{.temperature = 1.0f, .top_p = 0.3f};  // token 1 alone holds > 0.3
  for (int i = 0; i < 100; ++i) EXPECT_EQ(ag::sample_token(logits, nucleus, s), 1);
  ag::sampling_options hot{.temperature = 100.0f};
  seen.clear();
  for (int i = 0; i < 400; ++i) seen.insert(ag::sample_token(logits, hot, s));
  EXPECT_EQ(seen.size(), 5u);
  uint64_t a = 7, b = 7;
  for (int i = 0; i < 50; ++i) EXPECT_EQ(ag::sample_token(logits, hot, a), ag::sample_token(logits, hot, b));
}

// transformers' repetition_penalty: a positive logit of a token in the
// history divided by the penalty, a negative one multiplied, once however
// often it occurs; ids outside the row ignored. min_p drops the tokens less
// likely than min_p times the most likely one.
TEST(GenerateSampling, RepetitionPenaltyAndMinP) {
  uint64_t s = 1;
  const std::vector<float> logits{2.0f, 1.9f, -1.0f, -1.1f, 0.5f};
  ag::sampling_options pen{.repetition_penalty = 1.2f};
  EXPECT_EQ(ag::sample_token(logits, pen, s), 0) << "no history: nothing to penalise";
  const std::vector<int32_t> seen0{0, 7, -3};
  EXPECT_EQ(ag::sample_token(logits, pen, s, seen0), 1) << "2.0 / 1.2 < 1.9";
  // Once: 2.0 / 1.04 = 1.92 beats 1.9, 2.0 / 1.04^2 = 1.85 would not.
  const std::vector<int32_t> twice{0, 0, 0};
  EXPECT_EQ(ag::sample_token(logits, {.repetition_penalty = 1.04f}, s, twice), 0);
  // Negative logits are multiplied: -1.0 * 1.2 = -1.2 < -1.1.
  const std::vector<float> negative{-1.0f, -1.1f};
  const std::vector<int32_t> seen_first{0};
  EXPECT_EQ(ag::sample_token(negative, pen, s, seen_first), 1);
  // A penalty < 1 favours repeats.
  const std::vector<int32_t> seen1{1};
  EXPECT_EQ(ag::sample_token(logits, {.repetition_penalty = 0.5f}, s, seen1), 1);
  // Sampling with the penalty: token 0, by far the likelier, is penalised
  // from -1 to -1000 and never drawn; without it, it always is.
  const std::vector<float> two{-1.0f, -20.0f};
  std::set<int32_t> drawn, drawn_plain;
  for (int i = 0; i < 200; ++i) {
    drawn.insert(ag::sample_token(two, {.temperature = 1.0f, .repetition_penalty = 1000.0f}, s, seen_first));
    drawn_plain.insert(ag::sample_token(two, {.temperature = 1.0f}, s, seen_first));
  }
  EXPECT_EQ(drawn, std::set<int32_t>{1});
  EXPECT_EQ(drawn_plain, std::set<int32_t>{0});
  // min_p 0.1 at temperature 1: exp(-1) = 0.37 of the top stays, exp(-3) = 0.05 goes.
  const std::vector<float> spread{0.0f, -1.0f, -3.0f, -5.0f};
  std::map<int32_t, int> count, count_plain;
  for (int i = 0; i < 4000; ++i) {
    ++count[ag::sample_token(spread, {.temperature = 1.0f, .min_p = 0.1f}, s)];
    ++count_plain[ag::sample_token(spread, {.temperature = 1.0f}, s)];
  }
  EXPECT_EQ(count.size(), 2u);
  EXPECT_GT(count[1], 600) << "token 1 holds 0.27 of the kept mass";
  EXPECT_GT(count_plain[2], 40) << "without min_p token 2 holds 0.035 of the mass";
}

// Greedy picks the first maximum wherever it lies (the argmax runs eight
// lanes at a time, then a tail), ignores NaNs, and matches a plain scan on
// random rows of odd lengths.
TEST(GenerateSampling, GreedyIsTheFirstMaximumInEveryPosition) {
  uint64_t s = 1;
  for (std::size_t n : {1u, 7u, 8u, 9u, 31u, 32000u, 32003u}) {
    for (std::size_t at : {std::size_t{0}, n / 2, n - 1}) {
      std::vector<float> v(n, -1.0f);
      v[at] = 5.0f;
      EXPECT_EQ(ag::sample_token(v, {}, s), static_cast<int32_t>(at)) << "n " << n << " max at " << at;
      if (at + 1 < n) {
        v[n - 1] = 5.0f;  // a tie later on: the first one wins
        EXPECT_EQ(ag::sample_token(v, {}, s), static_cast<int32_t>(at)) << "n " << n << " tie at " << at;
      }
    }
  }
  std::vector<float> with_nan{1.0f, std::numeric_limits<float>::quiet_NaN(), 3.0f, 2.0f};
  EXPECT_EQ(ag::sample_token(with_nan, {}, s), 2);
  ag::host_tensor r = ag::host_tensor::random_normal(ag::dtype::f32, {1001}, 99, 1.0f);
  std::vector<float> row(1001);
  for (int64_t i = 0; i < 1001; ++i) row[static_cast<std::size_t>(i)] = r.at(i);
  EXPECT_EQ(ag::sample_token(row, {}, s), static_cast<int32_t>(std::max_element(row.begin(), row.end()) - row.begin()));
}

TEST(GenerateSampling, SameSeedSameTokensOtherSeedOtherTokens) {
  auto cfg = ag::test::tiny_model(ag::models::model_variant::llama, 2);
  auto rt = ag::runtime::create("cpu:1");
  ASSERT_TRUE(rt.has_value());
  ag::generator_options go;
  go.cache_tokens = 16;
  auto gen = ag::generator::create(**rt, cfg, {}, go);
  ASSERT_TRUE(gen.has_value()) << gen.err().to_string();
  auto run = [&](uint64_t seed) {
    ag::generate_options o;
    o.max_new_tokens = 12;
    o.sampling = {.temperature = 50.0f, .seed = seed};
    auto h = (*gen)->generate({1, 2}, o);
    EXPECT_TRUE(h.wait_for(60s));
    return h.wait().has_value() ? h.wait()->tokens : std::vector<int32_t>{};
  };
  const auto x = run(5);
  EXPECT_EQ(x.size(), 12u);
  EXPECT_EQ(x, run(5));
  EXPECT_NE(x, run(6));  // 12 draws nearly uniform over 41 ids: equal with probability ~1e-19
  // An end-of-sequence id stops the sequence right after emitting it.
  ag::generate_options o;
  o.max_new_tokens = 12;
  o.sampling = {.temperature = 50.0f, .seed = 5};
  o.stop_ids = {x[3]};
  auto h = (*gen)->generate({1, 2}, o);
  ASSERT_TRUE(h.wait_for(60s));
  ASSERT_TRUE(h.wait().has_value());
  EXPECT_EQ(h.wait()->reason, ag::stop_reason::eos);
  const auto stop_at = std::find(x.begin(), x.end(), x[3]) - x.begin();
  EXPECT_EQ(h.wait()->tokens, std::vector<int32_t>(x.begin(), x.begin() + stop_at + 1));
}

// A greedy sequence with a repetition penalty picks its tokens on the host
// (the device's argmax has no history): each equals the first maximum of
// the recomputed logits with the prompt's and the earlier tokens' penalised.
// Bad penalties and min_p are refused at generate().
TEST(GenerateSampling, GreedyWithARepetitionPenaltyEqualsThePenalisedRecompute) {
  auto cfg = ag::test::tiny_model(ag::models::model_variant::llama, 2);
  const saved_setup s(cfg, "cpu:1");
  ASSERT_TRUE(s.ready()) << s.why;
  const auto& m = s.model;
  const auto& rt = s.rt;
  ag::generator_options go;
  go.cache_tokens = 24;
  go.prefill_chunk = 4;
  auto gen = ag::generator::create(**rt, m->model_config(1), m->provider(), go);
  ASSERT_TRUE(gen.has_value()) << gen.err().to_string();
  const std::vector<int32_t> prompt{3, 1, 4, 1, 5};
  ag::generate_options o;
  o.max_new_tokens = 10;
  o.sampling.repetition_penalty = 3.0f;
  auto h = (*gen)->generate(prompt, o);
  ASSERT_TRUE(h.wait_for(60s));
  ASSERT_TRUE(h.wait().has_value()) << h.wait().err().to_string();
  const auto& got = h.wait()->tokens;
  ASSERT_EQ(got.size(), 10u);
  EXPECT_EQ(h.wait()->tokens_picked_on_device, 0);
  std::vector<int32_t> seq = prompt;
  for (std::size_t i = 0; i < got.size(); ++i) {
    std::vector<float> row = recomputed_last_logits(*m, seq);
    ASSERT_FALSE(row.empty());
    for (int32_t id : std::set<int32_t>(seq.begin(), seq.end())) {  // once per token
      float& x = row[static_cast<std::size_t>(id)];
      x = x > 0.0f ? x / 3.0f : x * 3.0f;
    }
    const int32_t want = static_cast<int32_t>(std::max_element(row.begin(), row.end()) - row.begin());
    EXPECT_EQ(got[i], want) << "token " << i;
    seq.push_back(got[i]);
  }
  // Without the penalty the sequence repeats itself somewhere; with it, the
  // greedy tokens differ (the penalty is live).
  o.sampling.repetition_penalty = 1.0f;
  auto plain = (*gen)->generate(prompt, o);
  ASSERT_TRUE(plain.wait_for(60s));
  ASSERT_TRUE(plain.wait().has_value());
  EXPECT_NE(plain.wait()->tokens, got);
  for (const auto& [pen, min_p, why] : {std::tuple{0.0f, 0.0f, "repetition_penalty must be a finite number > 0"},
                                        std::tuple{std::numeric_limits<float>::infinity(), 0.0f, "repetition_penalty"},
                                        std::tuple{1.0f, 1.5f, "min_p must be in [0, 1]"},
                                        std::tuple{1.0f, std::numeric_limits<float>::quiet_NaN(), "min_p"}}) {
    ag::generate_options bad;
    bad.sampling.repetition_penalty = pen;
    bad.sampling.min_p = min_p;
    auto r = (*gen)->generate(prompt, bad).wait();
    ASSERT_FALSE(r.has_value()) << why;
    EXPECT_EQ(r.err().code, ag::errc::invalid_argument);
    EXPECT_NE(r.err().message.find(why), std::string::npos) << r.err().message;
  }
}

// generate_options::stop_when ends a sequence at the token it says, which is
// kept, with stop_reason::stop_condition: on the host's sampling path and on
// the pipelined greedy path (steps already queued behind it are dropped).
TEST(GenerateSampling, StopWhenEndsTheSequenceAtItsToken) {
  auto cfg = ag::test::tiny_model(ag::models::model_variant::llama, 2);
  for (const char* spec : {"cpu:1", "sim:2"}) {
    auto rt = ag::runtime::create(spec, fast_sim());
    ASSERT_TRUE(rt.has_value());
    ag::generator_options go;
    go.cache_tokens = 32;
    auto gen = ag::generator::create(**rt, cfg, {}, go);
    ASSERT_TRUE(gen.has_value()) << gen.err().to_string();
    for (const float temperature : {0.0f, 5.0f}) {
      SCOPED_TRACE(std::string(spec) + (temperature > 0 ? ", sampling" : ", greedy"));
      ag::generate_options o;
      o.max_new_tokens = 12;
      o.sampling = {.temperature = temperature, .seed = 3};
      const auto all = (*gen)->generate({1, 2, 3}, o).wait();
      ASSERT_TRUE(all.has_value()) << all.err().to_string();
      ASSERT_EQ(all->tokens.size(), 12u);
      int seen = 0;
      o.stop_when = [&](int32_t) { return ++seen == 4; };
      const auto stopped = (*gen)->generate({1, 2, 3}, o).wait();
      ASSERT_TRUE(stopped.has_value()) << stopped.err().to_string();
      EXPECT_EQ(stopped->reason, ag::stop_reason::stop_condition);
      EXPECT_STREQ(ag::to_string(stopped->reason), "stop_condition");
      EXPECT_EQ(stopped->tokens, std::vector<int32_t>(all->tokens.begin(), all->tokens.begin() + 4));
      EXPECT_EQ(seen, 4) << "stop_when is not asked again after it said stop";
    }
  }
}

TEST(GenerateDecode, Bf16LlamaEqualsRecomputeWithinBf16RoundingCpu) {
  auto cfg = ag::test::tiny_model(ag::models::model_variant::llama, 2);
  cfg.dtype = ag::dtype::bf16;
  const saved_setup s(cfg, "cpu:1");
  ASSERT_TRUE(s.ready()) << s.why;
  const auto& m = s.model;
  const auto& rt = s.rt;
  ASSERT_EQ(m->dtype(), ag::dtype::bf16);
  ag::generator_options go;
  go.cache_tokens = 16;
  go.prefill_chunk = 4;
  auto gen = ag::generator::create(**rt, m->model_config(1), m->provider(), go);
  ASSERT_TRUE(gen.has_value()) << gen.err().to_string();
  ag::generate_options o;
  o.max_new_tokens = 6;
  o.keep_logits = true;
  const std::vector<int32_t> prompt{3, 1, 4, 1, 5, 9};
  const ag::generation h = (*gen)->generate(prompt, o);
  ASSERT_TRUE(h.wait_for(120s));
  const auto& r = h.wait();
  ASSERT_TRUE(r.has_value()) << r.err().to_string();
  std::vector<int32_t> seq = prompt;
  double worst = 0.0;
  for (std::size_t t = 0; t < r->tokens.size(); ++t) {
    worst = std::max(worst, worst_logit_error(recomputed_last_logits(*m, seq), r->logits[t]));
    seq.push_back(r->tokens[t]);
  }
  std::printf("bf16 decode vs recompute: max |logit error| %.4f\n", worst);
  EXPECT_LT(worst, 0.15);
}

// On a cpu device a decode step over a cache of 1024 positions or more runs
// its attention fused (graph/fusion.hpp, cpu_fused_cache_min_keys): the
// kernel reads only the cache rows up to the last the mask shows, through
// the few-row products. A second sequence in the same slot finds the first
// one's rows past its own, hidden. Greedy tokens and logits equal
// recomputing the whole sequence, in f32 and bf16, with and without
// prefill chunks; a cache of 16 keeps the separate ops.
TEST(GenerateDecode, LongCacheCpuDecodeAttentionIsFusedAndEqualsRecompute) {
  for (const ag::dtype t : {ag::dtype::f32, ag::dtype::bf16})
    for (const int64_t chunk : {int64_t{0}, int64_t{4}}) {
      SCOPED_TRACE(std::string(ag::to_string(t)) + ", prefill_chunk " + std::to_string(chunk));
      auto cfg = ag::test::tiny_model(ag::models::model_variant::llama, 2);
      cfg.dtype = t;
      const saved_setup s(cfg, "cpu:1");
      ASSERT_TRUE(s.ready()) << s.why;
      const auto& m = s.model;
      const auto& rt = s.rt;
      for (const int64_t cache : {int64_t{16}, int64_t{1100}}) {
        SCOPED_TRACE("cache " + std::to_string(cache));
        ag::generator_options go;
        go.cache_tokens = cache;
        go.max_sequences = 1;
        go.prefill_chunk = chunk;
        auto gen = ag::generator::create(**rt, m->model_config(1), m->provider(), go);
        ASSERT_TRUE(gen.has_value()) << gen.err().to_string();
        const auto& fused = (*gen)->decode_plan().fusions();
        EXPECT_EQ(fused.size(), cache >= ag::cpu_fused_cache_min_keys ? static_cast<std::size_t>(cfg.n_layers) : 0u)
            << (*gen)->decode_plan().describe();
        for (const auto& f : fused) EXPECT_NE(f.mask_add, ag::no_node) << "masked";
        for (const std::vector<int32_t>& prompt : {std::vector<int32_t>{3, 1, 4, 1, 5, 9, 2, 6}, std::vector<int32_t>{7, 2}})
          expect_logits_equal_recompute(**gen, *m, prompt, 5, t == ag::dtype::f32 ? 2e-3 : 0.15);
      }
    }
}

// A prompt chunk's mask of 8 MiB and more is filled in parts of at least
// 4 MiB on up to 8 threads (actors/generator.cpp): a prompt of 700 tokens in
// chunks of 512 over a cache of 4096 rows, f32 (masks of 8 MiB, two parts on
// a machine of two threads or more: the boundary falls inside both chunks,
// the second one padded, its real tokens last), generates tokens whose
// logits equal recomputing the whole sequence. The prefill plan's head
// takes the chunk's last row only: its output is [1, 1, vocab].
TEST(GenerateDecode, PromptMasksFilledInPartsEqualRecompute) {
  const auto cfg = tiny_llama_f32();
  temp_dir dir;
  chunked_setup t(dir, cfg, 4096, /*prompt_masks_on_device=*/false);
  ASSERT_TRUE(t.ready()) << t.why;
  auto& gen = t.gen;
  auto& m = t.model;
  ASSERT_NE((*gen)->prefill_plan(), nullptr);
  const ag::graph& prefill = (*gen)->prefill_plan()->source();
  ASSERT_EQ(prefill.outputs().size(), 1u);
  EXPECT_EQ(prefill.at(prefill.outputs()[0]).dims, ag::shape({1, 1, cfg.vocab})) << "the head over the last row only";
  std::printf("hardware threads: %u (the mask fills in %u parts)\n", std::thread::hardware_concurrency(),
              std::min(2u, std::max(1u, std::thread::hardware_concurrency())));
  std::vector<int32_t> prompt(700);
  for (std::size_t i = 0; i < prompt.size(); ++i) prompt[i] = static_cast<int32_t>((i * 37 + 11) % cfg.vocab);
  expect_logits_equal_recompute(**gen, *m, prompt, 3, 2e-3);
}

// generator_options::prompt_masks_on_device (the default): the prompt plans
// take the cache rows' positions and each token's range of positions
// (a few KiB a job) and build the mask on the device (op_kind::range_mask);
// the decode plan keeps its one-row mask input. A prompt of 700 tokens
// (two chunks of 512 over a cache of 4096, the second padded) gives the
// same logits, bit for bit, as the masks the host builds, and both equal
// recomputing.
TEST(GenerateDecode, PromptMasksBuiltOnTheDeviceEqualTheHostsBitForBit) {
  const auto cfg = tiny_llama_f32();
  temp_dir dir_on, dir_off;  // one checkpoint each: a second save would rewrite the files the first maps
  chunked_setup on(dir_on, cfg, 4096), off(dir_off, cfg, 4096, /*prompt_masks_on_device=*/false);
  ASSERT_TRUE(on.ready()) << on.why;
  ASSERT_TRUE(off.ready()) << off.why;
  const auto input_names = [](const ag::plan& p) {
    std::vector<std::string> names;
    for (ag::node_id i : p.source().inputs()) names.push_back(p.source().at(i).name);
    return names;
  };
  const auto has_range_mask = [](const ag::plan& p) {
    for (const ag::node& n : p.source().nodes())
      if (n.op == ag::op_kind::range_mask) return true;
    return false;
  };
  ASSERT_EQ((*on.gen)->prompt_plans().size(), 4u) << "64, 128, 256 and the chunk of 512";
  for (const ag::plan* p : (*on.gen)->prompt_plans()) {
    const std::vector<std::string> names = input_names(*p);
    EXPECT_EQ(names, (std::vector<std::string>{"tokens", "positions", "cache_positions", "key_positions", "query_ranges"}));
    EXPECT_TRUE(has_range_mask(*p));
  }
  EXPECT_EQ(input_names((*on.gen)->decode_plan()).back(), "attn_mask") << "a decode step copies its one-row mask";
  EXPECT_FALSE(has_range_mask((*on.gen)->decode_plan()));
  EXPECT_EQ(input_names(*(*off.gen)->prefill_plan()).back(), "attn_mask");
  EXPECT_FALSE(has_range_mask(*(*off.gen)->prefill_plan()));

  std::vector<int32_t> prompt(700);
  for (std::size_t i = 0; i < prompt.size(); ++i) prompt[i] = static_cast<int32_t>((i * 29 + 5) % cfg.vocab);
  ag::generate_options o;
  o.max_new_tokens = 3;
  o.keep_logits = true;
  const auto run = [&](ag::generator& g) {
    const ag::generation h = g.generate(prompt, o);
    EXPECT_TRUE(h.wait_for(120s)) << "generation hung";
    return h.wait();
  };
  const auto& device = run(**on.gen);
  const auto& host = run(**off.gen);
  ASSERT_TRUE(device.has_value()) << device.err().to_string();
  ASSERT_TRUE(host.has_value()) << host.err().to_string();
  EXPECT_EQ(device->tokens, host->tokens);
  ASSERT_EQ(device->logits.size(), host->logits.size());
  for (std::size_t k = 0; k < device->logits.size(); ++k)
    EXPECT_EQ(device->logits[k], host->logits[k]) << "token " << k << ": the same mask, the same bits";
  expect_logits_equal_recompute(**on.gen, *on.model, prompt, 3, 2e-3);
}

// With prefill_chunk 512 the generator also plans prompt pieces of
// short_prompt_chunk (64) tokens and, doubling, of 128 and 256: each
// outputs [1, 1, vocab]. Prompts of 10 and 64 tokens (the 64 plan), 65 and
// 200 (128, 256), and 540 (512, then a last piece of 28: the 64 plan
// again) give logits equal to recomputing. Without doubling_prompt_plans
// the 64 plan alone; short_prompt_chunk 0 plans none; a negative one is
// refused with its name.
TEST(GenerateDecode, ShortPromptsEqualRecomputeThroughTheShortPromptPlans) {
  const auto cfg = tiny_llama_f32();
  temp_dir dir;
  chunked_setup t(dir, cfg, 1024);
  ASSERT_TRUE(t.ready()) << t.why;
  auto& gen = t.gen;
  auto& m = t.model;
  auto& rt = t.rt;
  ag::generator_options go = t.options;
  const auto chunk_sizes = [](const ag::generator& g) {
    std::vector<int64_t> n;
    for (const ag::plan* p : g.prompt_plans()) n.push_back(p->source().at(p->source().inputs()[0]).dims[1]);
    return n;
  };
  EXPECT_EQ(chunk_sizes(**gen), (std::vector<int64_t>{64, 128, 256, 512}));
  ASSERT_NE((*gen)->short_prompt_plan(), nullptr);
  EXPECT_EQ((*gen)->short_prompt_plan(), (*gen)->prompt_plans().front());
  EXPECT_EQ((*gen)->prefill_plan(), (*gen)->prompt_plans().back());
  for (const ag::plan* p : (*gen)->prompt_plans())
    EXPECT_EQ(p->source().at(p->source().outputs()[0]).dims, ag::shape({1, 1, cfg.vocab}));
  for (const int64_t n : {int64_t{10}, int64_t{64}, int64_t{65}, int64_t{200}, int64_t{540}}) {
    SCOPED_TRACE("prompt of " + std::to_string(n));
    std::vector<int32_t> prompt(static_cast<std::size_t>(n));
    for (std::size_t i = 0; i < prompt.size(); ++i) prompt[i] = static_cast<int32_t>((i * 53 + 7) % cfg.vocab);
    expect_logits_equal_recompute(**gen, *m, prompt, 2, 2e-3);
  }
  go.doubling_prompt_plans = false;
  auto one = ag::generator::create(**rt, m->model_config(1), m->provider(), go);
  ASSERT_TRUE(one.has_value()) << one.err().to_string();
  EXPECT_EQ(chunk_sizes(**one), (std::vector<int64_t>{64, 512}));
  go.short_prompt_chunk = 0;
  auto none = ag::generator::create(**rt, m->model_config(1), m->provider(), go);
  ASSERT_TRUE(none.has_value()) << none.err().to_string();
  EXPECT_EQ((*none)->short_prompt_plan(), nullptr);
  EXPECT_EQ(chunk_sizes(**none), (std::vector<int64_t>{512}));
  go.short_prompt_chunk = -1;
  auto bad = ag::generator::create(**rt, m->model_config(1), m->provider(), go);
  ASSERT_FALSE(bad.has_value());
  EXPECT_NE(bad.err().message.find("short_prompt_chunk"), std::string::npos) << bad.err().message;
}

TEST(GenerateCache, WaitOnATemporaryHandleKeepsTheResult) {
  const auto cfg = ag::test::tiny_model(ag::models::model_variant::gpt2);
  auto rt = ag::runtime::create("cpu:1");
  ASSERT_TRUE(rt.has_value());
  auto gen = ag::generator::create(**rt, cfg, {}, {.cache_tokens = 8});
  ASSERT_TRUE(gen.has_value()) << gen.err().to_string();
  ag::generate_options o;
  o.max_new_tokens = 3;
  const auto& r = (*gen)->generate({1, 2}, o).wait();  // a copy, kept alive by the reference
  ASSERT_TRUE(r.has_value()) << r.err().to_string();
  EXPECT_EQ(r->tokens.size(), 3u);
}

// Tensor parallelism does not execute in the runtime yet; its planning of a
// step graph can be checked now: a decode step (cache mode) of GPT-2 and of
// LLaMA with GQA, at degree 2, rewritten into per-device graphs whose
// reference evaluation equals the user's graph, and how many gathers the
// replicated cache inputs cost (printed: what sharding the cache by kv head
// would remove).
TEST(GenerateTensorParallel, DecodeStepGraphsPlanAtDegreeTwoAndEqualTheReference) {
  for (auto cfg : tiny_models()) {
    SCOPED_TRACE(to_string(cfg.variant));
    cfg.seq_len = 1;
    cfg.kv_cache_capacity = 8;
    auto g = ag::models::build_transformer(cfg);
    ASSERT_TRUE(g.has_value()) << g.err().to_string();
    auto gp = std::make_shared<const ag::graph>(std::move(*g));
    std::vector<ag::device_spec> devs(2);
    for (int i = 0; i < 2; ++i) devs[static_cast<std::size_t>(i)].name = "sim" + std::to_string(i), devs[static_cast<std::size_t>(i)].ordinal = i;
    ag::plan_options po;
    po.tensor_parallel = 2;
    auto p = ag::compile(gp, devs, po);
    ASSERT_TRUE(p.has_value()) << p.err().to_string();
    ASSERT_NE((*p)->tensor_parallel(), nullptr);
    // The caches are kept per device, sharded by kv head when the heads divide.
    const int64_t C = 8, Hkv = cfg.kv_heads();
    int states = 0;
    for (const ag::node& n : (*p)->source().nodes()) {
      if (!ag::is_state_op(n.op)) continue;
      ++states;
      EXPECT_EQ(n.dims[1], Hkv % 2 == 0 ? Hkv / 2 : Hkv) << n.name;
      EXPECT_EQ(n.dims[2], C) << n.name;
    }
    EXPECT_EQ(states, 2 * 2 * cfg.n_layers);  // keys and values, per layer, on each of 2 devices
    // Three decode steps (tokens 5, 2, 7 at positions 0, 1, 2), each storing
    // into and reading the caches the earlier steps left: the sharded plan's
    // graph and the user's graph, each over its own state, agree at every step.
    ag::reference_state want_state, got_state;
    const int32_t tokens[] = {5, 2, 7};
    for (int32_t step = 0; step < 3; ++step) {
      std::vector<float> mask(static_cast<std::size_t>(C), -30000.0f);
      for (int j = 0; j <= step; ++j) mask[static_cast<std::size_t>(j)] = 0.0f;
      std::vector<ag::host_tensor> in{ag::host_tensor::from_ints({1, 1}, {tokens[step]}),
                                      ag::host_tensor::from_ints({1}, {step}), ag::host_tensor::from_ints({1}, {step}),
                                      ag::host_tensor::from_floats(ag::dtype::f32, {1, C}, mask)};
      auto want = ag::evaluate_reference(*gp, in, want_state);
      auto got = ag::evaluate_reference((*p)->source(), in, got_state);
      ASSERT_TRUE(want.has_value()) << want.err().to_string();
      ASSERT_TRUE(got.has_value()) << got.err().to_string();
      ASSERT_EQ(got->size(), want->size());
      for (std::size_t i = 0; i < want->size(); ++i) {
        auto c = ag::compare((*got)[i], (*want)[i], 1e-4, 1e-4);
        EXPECT_TRUE(c.ok) << "step " << step << " output " << i << ": " << c.message;
      }
    }
    int gathers = 0;
    for (const auto& c : (*p)->tensor_parallel()->collectives) gathers += c.op == ag::op_kind::all_gather;
    std::printf("%s decode step at tp 2: %zu collectives, %d all-gathers\n", to_string(cfg.variant),
                (*p)->tensor_parallel()->collectives.size(), gathers);
  }
}

// ---- batched decode steps (generator_options::decode_batch) ----

namespace {

// Five sequences of different prompts and lengths on a generator of
// decode_batch 4 (two slots of four lanes), started while the first one's
// first token is held, so that all five are in their slots' batches before
// it goes on: every token's logits equal recomputing its own sequence, the
// greedy tokens are the recomputation's argmax, and some tokens were decoded
// beside other sequences' (the batches shrink to 3, 2 and 1 as the shorter
// ones end: padding rows, and the one-token plans).
void batched_equals_recompute(const std::string& spec, int stages, int64_t prefill_chunk, int tp,
                              const std::vector<ag::models::transformer_config>& models) {
  for (const auto& cfg : models) {
    SCOPED_TRACE(std::string(to_string(cfg.variant)) + " (window " + std::to_string(cfg.sliding_window) + ") on " +
                 spec + ", stages " + std::to_string(stages) + ", tp " + std::to_string(tp) + ", prefill_chunk " +
                 std::to_string(prefill_chunk));
    temp_dir dir;
    auto m = saved_model(dir, cfg);
    ASSERT_TRUE(m.has_value()) << m.err().to_string();
    auto rt = ag::runtime::create(spec, fast_sim());
    ASSERT_TRUE(rt.has_value()) << rt.err().to_string();
    ag::generator_options go;
    go.cache_tokens = 16;
    go.max_sequences = 5;  // two slots of four lanes
    go.prefill_chunk = prefill_chunk;
    go.decode_batch = 4;
    go.plan.pipeline_stages = stages;
    go.plan.tensor_parallel = tp;
    auto gen = ag::generator::create(**rt, m->model_config(1), m->provider(), go);
    ASSERT_TRUE(gen.has_value()) << gen.err().to_string();
    EXPECT_EQ((*gen)->lanes_per_slot(), 4);
    ASSERT_EQ((*gen)->batch_decode_plans().size(), 2u);
    EXPECT_EQ((*gen)->cache_rows(), cfg.sliding_window > 0
                                        ? std::min<int64_t>(16, cfg.sliding_window + std::max<int64_t>(prefill_chunk, 1) - 1)
                                        : 16);
    const std::vector<std::vector<int32_t>> prompts{{3, 1, 4, 1, 5, 9}, {2, 7}, {1}, {8, 8, 1, 0, 3}, {6, 5, 4}};
    const int max_new[] = {8, 3, 6, 5, 7};
    held_first hold;
    std::vector<ag::generation> hs;
    for (std::size_t i = 0; i < prompts.size(); ++i) {
      ag::generate_options o;
      o.max_new_tokens = max_new[i];
      o.keep_logits = i != 4;  // the last one greedy without logits: a lane of the same batches
      if (i == 0)
        o.on_token = [&](int32_t, int64_t k) {
          if (k == 0) hold.released.wait_for(60s);
        };
      hs.push_back((*gen)->generate(prompts[i], o));
    }
    // Slot 0's four wait behind sequence 0's held token (its group's job
    // has not ended); sequence 4, alone in slot 1, may have ended already.
    EXPECT_GE((*gen)->active_sequences(), 4);
    hold.release.set_value();
    int64_t batched = 0;
    std::vector<std::vector<int32_t>> got(prompts.size());
    for (std::size_t i = 0; i < hs.size(); ++i) {
      ASSERT_TRUE(hs[i].wait_for(120s)) << "sequence " << i << " hung";
      const auto& r = hs[i].wait();
      ASSERT_TRUE(r.has_value()) << r.err().to_string();
      EXPECT_EQ(r->reason, ag::stop_reason::max_tokens);
      ASSERT_EQ(r->tokens.size(), static_cast<std::size_t>(max_new[i]));
      batched += r->tokens_batched;
      got[i] = r->tokens;
      if (i == 4) continue;
      std::vector<int32_t> seq = prompts[i];
      for (std::size_t t = 0; t < r->tokens.size(); ++t) {
        const std::vector<float> ref = recomputed_last_logits(*m, seq);
        ASSERT_EQ(ref.size(), r->logits[t].size());
        EXPECT_LT(worst_logit_error(ref, r->logits[t]), 2e-3)
            << "sequence " << i << ", token " << t << ": logits differ from recomputing the sequence";
        EXPECT_EQ(r->tokens[t], static_cast<int32_t>(std::max_element(ref.begin(), ref.end()) - ref.begin()))
            << "sequence " << i << ", token " << t;
        seq.push_back(r->tokens[t]);
      }
    }
    EXPECT_GT(batched, 0) << "no token was decoded beside another sequence's";
    // The greedy sequence without logits: its solo run's tokens.
    EXPECT_EQ(got[4], alone(**rt, *m, prompts[4], max_new[4], stages));
    EXPECT_EQ((*gen)->active_sequences(), 0);
  }
}

}  // namespace

TEST(GenerateBatched, EachSequenceEqualsRecomputeCpu) { batched_equals_recompute("cpu:1", 1, 4, 1, tiny_models()); }
TEST(GenerateBatched, EachSequenceEqualsRecomputeWithoutPrefillPlanSim) {
  batched_equals_recompute("sim:1", 1, 0, 1, tiny_models());
}
TEST(GenerateBatched, EachSequenceEqualsRecomputeTwoStagesSim) {
  batched_equals_recompute("sim:2", 2, 4, 1, {tiny_llama_f32(), ag::test::tiny_model(ag::models::model_variant::gpt2)});
}
TEST(GenerateBatched, EachSequenceEqualsRecomputeTensorParallel2Cpu) {
  batched_equals_recompute("cpu:2", 1, 4, 2, {tiny_llama_f32(), ag::test::tiny_model(ag::models::model_variant::gpt2)});
}

// A tiny LLaMA (GQA) saved into a temporary folder and opened, and a cpu:1
// runtime.
struct tiny_llama_on_cpu {
  temp_dir dir;
  ag::expected<ag::models::hf_model> m{saved_model(dir, ag::test::tiny_model(ag::models::model_variant::llama, 2))};
  ag::expected<std::unique_ptr<ag::runtime>> rt{ag::runtime::create("cpu:1", fast_sim())};
};

// More sequences than lanes wait for one and run when a lane frees; one that
// cancels itself stops; one that outgrows cache_tokens stops with cache_full;
// each other one equals its solo run; the caches of 2 slots x 3 lanes take
// what 6 one-sequence slots take.
TEST(GenerateBatched, SequencesQueueForLanesCancelAndFillTheirCache) {
  tiny_llama_on_cpu t;
  ASSERT_TRUE(t.m.has_value()) << t.m.err().to_string();
  ASSERT_TRUE(t.rt.has_value()) << t.rt.err().to_string();
  auto& m = t.m;
  auto& rt = t.rt;
  ag::generator_options go;
  go.cache_tokens = 16;
  go.max_sequences = 6;
  go.prefill_chunk = 4;
  go.decode_batch = 3;
  auto gen = ag::generator::create(**rt, m->model_config(1), m->provider(), go);
  ASSERT_TRUE(gen.has_value()) << gen.err().to_string();
  // Batch plans of 2 and 3 rows.
  ASSERT_EQ((*gen)->batch_decode_plans().size(), 2u);
  {
    ag::generator_options solo = go, batched = go;
    solo.decode_batch = 0;
    solo.device_greedy = batched.device_greedy = false;  // no token states: the caches alone
    auto one_each = ag::generator::create(**rt, m->model_config(1), m->provider(), solo);
    ASSERT_TRUE(one_each.has_value()) << one_each.err().to_string();
    auto caches_only = ag::generator::create(**rt, m->model_config(1), m->provider(), batched);
    ASSERT_TRUE(caches_only.has_value()) << caches_only.err().to_string();
    EXPECT_EQ((*caches_only)->cache_bytes(), (*one_each)->cache_bytes());
    // With device_greedy the pipelined steps' two token states of 3 rows
    // come on top, an aligned block each a slot.
    EXPECT_GT((*gen)->cache_bytes(), (*caches_only)->cache_bytes());
    EXPECT_LE((*gen)->cache_bytes() - (*caches_only)->cache_bytes(), 2 * 2 * 256);  // 256: the plans' alignment
  }
  const std::vector<std::vector<int32_t>> prompts{{1, 2, 3}, {7, 7}, {40, 0, 13, 2}, {5}, {9, 8, 7, 6, 5},
                                                  {11, 22}, {3, 3, 3}, {1, 4, 1, 5, 9, 2, 6}, {10}};
  const std::size_t cancelled = 2, fills = 7;  // fills: 7 prompt tokens + 9 new reach cache_tokens 16
  const std::vector<ag::generation> hs =
      start_one_self_cancelling(**gen, prompts, cancelled, [](std::size_t i) { return i == fills ? 100 : 6; });
  for (std::size_t i = 0; i < hs.size(); ++i) {
    ASSERT_TRUE(hs[i].wait_for(120s)) << "sequence " << i << " hung";
    const auto& r = hs[i].wait();
    ASSERT_TRUE(r.has_value()) << r.err().to_string();
    if (i == cancelled) {
      EXPECT_EQ(r->reason, ag::stop_reason::cancelled);
      EXPECT_LT(r->tokens.size(), 6u);
      continue;
    }
    if (i == fills) {
      EXPECT_EQ(r->reason, ag::stop_reason::cache_full);
      EXPECT_EQ(r->tokens.size(), 10u);  // the 16th position's token comes from the 16th row
      EXPECT_EQ(r->tokens, alone(**rt, *m, prompts[i], 10, 1));
      continue;
    }
    EXPECT_EQ(r->reason, ag::stop_reason::max_tokens);
    EXPECT_EQ(r->tokens, alone(**rt, *m, prompts[i], 6, 1)) << "sequence " << i << " differs from its solo run";
  }
  EXPECT_EQ((*gen)->active_sequences(), 0);
  EXPECT_EQ((*gen)->waiting_sequences(), 0);
}

TEST(GenerateBatched, StepsMarkTheirRowsApartAndPromptsDoNot) {
  // A batched step's rows are sequences in lanes of their own: its mask is
  // marked rows_apart (transformer_config::rows_apart), which lets a CUDA
  // device run each row's attention over its lane only. A prompt chunk's
  // rows are one sequence's tokens, seeing each other's keys: not marked.
  tiny_llama_on_cpu t;
  ASSERT_TRUE(t.m.has_value()) << t.m.err().to_string();
  ASSERT_TRUE(t.rt.has_value()) << t.rt.err().to_string();
  ag::generator_options go;
  go.cache_tokens = 16;
  go.max_sequences = 4;
  go.prefill_chunk = 4;
  go.decode_batch = 4;
  auto gen = ag::generator::create(**t.rt, t.m->model_config(1), t.m->provider(), go);
  ASSERT_TRUE(gen.has_value()) << gen.err().to_string();
  const auto masks_apart = [](const ag::plan& p) {
    int apart = 0, masks = 0;
    for (const ag::node& n : p.source().nodes())
      if (n.op == ag::op_kind::range_mask) ++masks, apart += n.attrs.rows_apart;
    return std::make_pair(masks, apart);
  };
  const std::vector<const ag::plan*> batched = (*gen)->batch_decode_plans();
  ASSERT_FALSE(batched.empty());
  for (const ag::plan* p : batched) EXPECT_EQ(masks_apart(*p), std::make_pair(1, 1));
  const std::vector<const ag::plan*> prompts = (*gen)->prompt_plans();
  ASSERT_FALSE(prompts.empty());
  for (const ag::plan* p : prompts) EXPECT_EQ(masks_apart(*p), std::make_pair(1, 0));
}

// Greedy sequences without logits that decode together take the batch
// plans whose output is each row's token (generator_options::device_greedy):
// every token they decoded beside another sequence's was picked on the
// device, and each sequence equals its solo run. A sequence that samples
// (temperature) makes the steps it shares carry logits: its tokens are all
// picked on the host. Without device_greedy the host picks every token, and
// the greedy sequences still equal their solo runs.
TEST(GenerateBatched, GreedyRowsPickTheirTokensOnTheDevice) {
  tiny_llama_on_cpu t;
  ASSERT_TRUE(t.m.has_value()) << t.m.err().to_string();
  ASSERT_TRUE(t.rt.has_value()) << t.rt.err().to_string();
  auto& m = t.m;
  auto& rt = t.rt;
  const std::vector<std::vector<int32_t>> prompts{{1, 2, 3}, {7, 7}, {40, 0, 13, 2}, {5, 9}};
  for (const bool device_greedy : {true, false})
    for (const bool one_samples : {false, true}) {
      SCOPED_TRACE(std::string("device_greedy ") + (device_greedy ? "on" : "off") +
                   (one_samples ? ", sequence 3 samples" : ", all greedy"));
      ag::generator_options go;
      go.cache_tokens = 16;
      go.max_sequences = 4;
      go.prefill_chunk = 4;
      go.decode_batch = 4;
      go.device_greedy = device_greedy;
      auto gen = ag::generator::create(**rt, m->model_config(1), m->provider(), go);
      ASSERT_TRUE(gen.has_value()) << gen.err().to_string();
      held_first hold;
      std::vector<ag::generation> hs;
      for (std::size_t i = 0; i < prompts.size(); ++i) {
        ag::generate_options o;
        o.max_new_tokens = 6;
        if (one_samples && i == 3) {
          o.max_new_tokens = 3;  // it ends first: the others go on in greedy batches
          o.sampling.temperature = 0.8f;
          o.sampling.top_k = 5;
          o.sampling.seed = 7;
        }
        if (i == 0)
          o.on_token = [&](int32_t, int64_t k) {
            if (k == 0) hold.released.wait_for(60s);
          };
        hs.push_back((*gen)->generate(prompts[i], o));
      }
      hold.release.set_value();
      int64_t batched = 0, picked = 0;
      for (std::size_t i = 0; i < hs.size(); ++i) {
        ASSERT_TRUE(hs[i].wait_for(120s)) << "sequence " << i << " hung";
        const auto& r = hs[i].wait();
        ASSERT_TRUE(r.has_value()) << r.err().to_string();
        if (one_samples && i == 3) {
          EXPECT_EQ(r->tokens.size(), 3u);
          EXPECT_EQ(r->tokens_picked_on_device, 0) << "a sampling sequence's token picked on the device";
          continue;
        }
        EXPECT_EQ(r->tokens, alone(**rt, *m, prompts[i], 6, 1)) << "sequence " << i << " differs from its solo run";
        batched += r->tokens_batched;
        picked += r->tokens_picked_on_device;
        if (!device_greedy) {
          EXPECT_EQ(r->tokens_picked_on_device, 0) << "sequence " << i;
        } else if (!one_samples) {
          EXPECT_GE(r->tokens_picked_on_device, r->tokens_batched)
              << "sequence " << i << ": a token decoded beside other sequences' was picked on the host";
        }
      }
      EXPECT_GT(batched, 0) << "no token was decoded beside another sequence's";
      if (device_greedy) {
        EXPECT_GT(picked, 0) << "no greedy token was picked on the device";
      }
    }
}

// ---- pipelined batched greedy steps (lane_group's runs) ----

namespace {

// Four greedy sequences in one slot of four lanes, started while the first
// one's first token is held: once all four feed a token a step, the steps
// of a run read each row's token from the state the step before kept
// (pipeline_depth 2), so some tokens are pipelined wherever the batch
// plans pipeline (one stage: on one device and across tensor-parallel
// ranks; not across pipeline stages, like a lone sequence's steps). With a
// stop id, a self-cancelling sequence, or neither; each sequence equals its
// solo run (cut where it stopped), and a sequence started afterwards, in a
// lane whose old sequence left steps that ran past its end, equals its own;
// so does one alone in its slot, pipelined on the one-token plans.
struct run_case {
  std::string spec;
  int stages = 1, tp = 1;
  bool pipelines = true;
};

// The runs' four sequences: at most three prompt pieces go before every
// sequence feeds a token a step, when sequence 0 has at least 5 tokens to
// go and the others at least 9.
const std::vector<std::vector<int32_t>> run_prompts{{3, 1, 4, 1, 5, 9}, {2, 7}, {1}, {8, 8, 1, 0, 3}};
constexpr int run_max_new[] = {9, 10, 10, 10};

// Starts the four on `gen`, sequence 0 held on its first token until all
// have started (so all four are in the slot's lanes before it goes on);
// `adjust(i, o)` sets more of sequence i's options (not sequence 0's
// on_token).
std::vector<ag::generation> start_runs_held(ag::generator& gen,
                                            const std::function<void(std::size_t, ag::generate_options&)>& adjust) {
  held_first hold;
  std::vector<ag::generation> hs;
  for (std::size_t i = 0; i < run_prompts.size(); ++i) {
    ag::generate_options o;
    o.max_new_tokens = run_max_new[i];
    adjust(i, o);
    if (i == 0)
      o.on_token = [released = hold.released](int32_t, int64_t k) {
        if (k == 0) released.wait_for(60s);
      };
    hs.push_back(gen.generate(run_prompts[i], o));
  }
  hold.release.set_value();
  return hs;
}

// The runs' four sequences, each alone in a generator of one slot on `rt`.
std::vector<std::vector<int32_t>> solo_runs(ag::runtime& rt, const ag::models::hf_model& m, int stages) {
  std::vector<std::vector<int32_t>> solo;
  for (std::size_t i = 0; i < run_prompts.size(); ++i) solo.push_back(alone(rt, m, run_prompts[i], run_max_new[i], stages));
  return solo;
}

void batched_runs_equal_solo(const run_case& rc, bool stop_and_cancel) {
  SCOPED_TRACE(rc.spec + ", stages " + std::to_string(rc.stages) + ", tp " + std::to_string(rc.tp) +
               (stop_and_cancel ? ", a stop id and a cancel" : ""));
  temp_dir dir;
  auto m = saved_model(dir, tiny_llama_f32());
  ASSERT_TRUE(m.has_value()) << m.err().to_string();
  auto rt = ag::runtime::create(rc.spec, fast_sim());
  ASSERT_TRUE(rt.has_value()) << rt.err().to_string();
  ag::generator_options go;
  go.cache_tokens = 16;
  go.max_sequences = 4;
  go.prefill_chunk = 4;
  go.decode_batch = 4;
  go.plan.pipeline_stages = rc.stages;
  go.plan.tensor_parallel = rc.tp;
  auto gen = ag::generator::create(**rt, m->model_config(1), m->provider(), go);
  ASSERT_TRUE(gen.has_value()) << gen.err().to_string();
  const auto& prompts = run_prompts;
  const auto& max_new = run_max_new;
  const std::vector<std::vector<int32_t>> solo = solo_runs(**rt, *m, rc.stages);
  // Sequence 1 stops at its fifth token's id (or where that id first
  // comes); sequence 2 cancels itself on its sixth token.
  std::vector<int32_t> want1 = solo[1], want2 = solo[2];
  const int32_t stop_id = solo[1].at(4);
  if (stop_and_cancel) {
    want1.resize(static_cast<std::size_t>(std::find(solo[1].begin(), solo[1].end(), stop_id) - solo[1].begin()) + 1);
    want2.resize(6);
  }
  // Sequence 2's handle, for its own token stream to cancel it by (its
  // sixth token comes after the handle is set).
  std::promise<ag::generation> self;
  std::shared_future<ag::generation> handle2 = self.get_future().share();
  std::vector<ag::generation> hs = start_runs_held(**gen, [&](std::size_t i, ag::generate_options& o) {
    if (stop_and_cancel && i == 1) o.stop_ids = {stop_id};
    if (stop_and_cancel && i == 2)
      o.on_token = [handle2](int32_t, int64_t k) {
        if (k == 5) handle2.get().cancel();
      };
  });
  self.set_value(hs[2]);
  int64_t pipelined = 0;
  for (std::size_t i = 0; i < hs.size(); ++i) {
    ASSERT_TRUE(hs[i].wait_for(120s)) << "sequence " << i << " hung";
    const auto& r = hs[i].wait();
    ASSERT_TRUE(r.has_value()) << r.err().to_string();
    const std::vector<int32_t>& want = i == 1 ? want1 : i == 2 ? want2 : solo[i];
    EXPECT_EQ(r->tokens, want) << "sequence " << i << " differs from its solo run";
    const ag::stop_reason why = !stop_and_cancel ? ag::stop_reason::max_tokens
                                : i == 1         ? ag::stop_reason::eos
                                : i == 2         ? ag::stop_reason::cancelled
                                                 : ag::stop_reason::max_tokens;
    EXPECT_EQ(r->reason, why) << "sequence " << i;
    EXPECT_LT(r->tokens_pipelined, static_cast<int64_t>(r->tokens.size())) << "sequence " << i;
    pipelined += r->tokens_pipelined;
  }
  if (rc.pipelines) {
    EXPECT_GT(pipelined, 0) << "no batched step read its tokens from the state";
  } else {
    EXPECT_EQ(pipelined, 0) << "batched steps pipelined across pipeline stages";
  }
  // The lanes again, after steps that ran past their sequences' ends.
  std::vector<ag::generation> again;
  for (std::size_t i = 0; i < prompts.size(); ++i) {
    ag::generate_options o;
    o.max_new_tokens = max_new[i];
    again.push_back((*gen)->generate(prompts[i], o));
  }
  for (std::size_t i = 0; i < again.size(); ++i) {
    ASSERT_TRUE(again[i].wait_for(120s)) << "second sequence " << i << " hung";
    const auto& r = again[i].wait();
    ASSERT_TRUE(r.has_value()) << r.err().to_string();
    EXPECT_EQ(r->tokens, solo[i]) << "second sequence " << i << " differs from its solo run";
  }
  // A sequence alone in its slot runs the one-token plans the same way:
  // its first token from the prompt's last piece, the next fed from the
  // host, the 7 after it pipelined.
  ag::generate_options o;
  o.max_new_tokens = max_new[0];
  const ag::generation lone = (*gen)->generate(prompts[0], o);
  ASSERT_TRUE(lone.wait_for(120s)) << "the lone sequence hung";
  const auto& r = lone.wait();
  ASSERT_TRUE(r.has_value()) << r.err().to_string();
  EXPECT_EQ(r->tokens, solo[0]) << "the lone sequence differs from its solo run";
  EXPECT_EQ(r->tokens_batched, 0);
  EXPECT_EQ(r->tokens_pipelined, rc.pipelines ? max_new[0] - 2 : 0);
  EXPECT_EQ((*gen)->active_sequences(), 0);
}

}  // namespace

TEST(GenerateBatched, GreedyStepsPipelineAndEqualSoloRuns) {
  for (const run_case& rc : {run_case{"cpu:1"}, run_case{"sim:1"}, run_case{"cpu:2", 1, 2},
                             run_case{"sim:2", 2, 1, false}})
    for (const bool stop_and_cancel : {false, true}) batched_runs_equal_solo(rc, stop_and_cancel);
}

// A device that dies while a run of pipelined batched steps is in flight
// (killed from a sequence's own token stream, mid-run): each sequence of
// the slot either ended before it, equal to its solo run, or fails with
// errc::device_failed naming the device; none hangs. After reset_device
// the same generator runs the four again, each equal to its solo run.
TEST(GenerateBatched, ADeviceDyingMidRunFailsTheRunsSequencesAndTheGeneratorGoesOn) {
  temp_dir dir;
  auto m = saved_model(dir, tiny_llama_f32());
  ASSERT_TRUE(m.has_value()) << m.err().to_string();
  auto rt = ag::runtime::create("sim:1", fast_sim());
  ASSERT_TRUE(rt.has_value()) << rt.err().to_string();
  ag::generator_options go;
  go.cache_tokens = 16;
  go.max_sequences = 4;
  go.prefill_chunk = 4;
  go.decode_batch = 4;
  auto gen = ag::generator::create(**rt, m->model_config(1), m->provider(), go);
  ASSERT_TRUE(gen.has_value()) << gen.err().to_string();
  const auto& prompts = run_prompts;
  const auto& max_new = run_max_new;
  const std::vector<std::vector<int32_t>> solo = solo_runs(**rt, *m, 1);
  auto* sim = dynamic_cast<ag::gpu::sim::sim_device*>((*rt)->device(0).get());
  ASSERT_NE(sim, nullptr);
  std::vector<ag::generation> hs = start_runs_held(**gen, [sim](std::size_t i, ag::generate_options& o) {
    if (i == 3)  // its fifth token: every sequence decodes in the slot's run by then
      o.on_token = [sim](int32_t, int64_t k) {
        if (k == 4) sim->kill("killed by the test");
      };
  });
  int failed = 0;
  for (std::size_t i = 0; i < hs.size(); ++i) {
    ASSERT_TRUE(hs[i].wait_for(120s)) << "sequence " << i << " hung";
    const auto& r = hs[i].wait();
    if (r.has_value()) {
      EXPECT_EQ(r->tokens, solo[i]) << "sequence " << i << " ended before the death, unlike its solo run";
      continue;
    }
    ++failed;
    EXPECT_EQ(r.err().code, ag::errc::device_failed) << "sequence " << i << ": " << r.err().to_string();
    EXPECT_EQ(r.err().device, 0) << r.err().to_string();
  }
  EXPECT_FALSE(hs[3].wait().has_value()) << "the sequence that killed the device ended well";
  EXPECT_GE(failed, 3) << "the run's sequences outlived the device";
  ASSERT_FALSE((*rt)->reset_device(0));
  for (std::size_t i = 0; i < prompts.size(); ++i) {
    ag::generate_options o;
    o.max_new_tokens = max_new[i];
    hs[i] = (*gen)->generate(prompts[i], o);
  }
  for (std::size_t i = 0; i < hs.size(); ++i) {
    ASSERT_TRUE(hs[i].wait_for(120s)) << "sequence " << i << " hung after the reset";
    const auto& r = hs[i].wait();
    ASSERT_TRUE(r.has_value()) << r.err().to_string();
    EXPECT_EQ(r->tokens, solo[i]) << "sequence " << i << " after the reset";
  }
  EXPECT_EQ((*gen)->active_sequences(), 0);
}

// decode_batch -1 (the default): lanes where the plans run as one stage,
// max_sequences spread over slots of at most 8; a slot a sequence over
// several stages. The caches hold what max_sequences asks (give or take a
// lane a slot), and sequences started together share their steps and equal
// their solo runs.
TEST(GenerateBatched, TheAutomaticChoiceBatchesOneStageLayoutsWithinMaxSequences) {
  temp_dir dir;
  auto m = saved_model(dir, tiny_llama_f32());
  ASSERT_TRUE(m.has_value()) << m.err().to_string();
  struct choice {
    const char* spec;
    int max_sequences;
    int stages, tp;
    ag::placement_policy policy;
    int lanes;  // expected lanes_per_slot()
  };
  const auto automatic = ag::placement_policy::automatic, single = ag::placement_policy::single;
  for (const choice& c : std::vector<choice>{{"sim:1", 8, 0, 1, automatic, 8},
                                             {"sim:1", 12, 0, 1, automatic, 6},  // two slots of 6
                                             {"sim:1", 17, 0, 1, automatic, 6},  // three of 6: one lane more
                                             {"sim:1", 3, 0, 1, automatic, 3},
                                             {"sim:1", 1, 0, 1, automatic, 1},
                                             {"sim:2", 8, 0, 1, automatic, 1},  // two stages: a slot a sequence
                                             {"sim:2", 8, 2, 1, automatic, 1},
                                             {"sim:2", 8, 1, 1, automatic, 8},
                                             {"sim:2", 8, 0, 2, automatic, 8},  // one tensor-parallel stage
                                             {"sim:2", 8, 0, 1, single, 8}}) {
    SCOPED_TRACE(std::string(c.spec) + ", max_sequences " + std::to_string(c.max_sequences) + ", stages " +
                 std::to_string(c.stages) + ", tp " + std::to_string(c.tp) +
                 (c.policy == single ? ", single" : ""));
    auto rt = ag::runtime::create(c.spec, fast_sim());
    ASSERT_TRUE(rt.has_value()) << rt.err().to_string();
    ag::generator_options go;
    go.cache_tokens = 16;
    go.max_sequences = c.max_sequences;
    go.plan.pipeline_stages = c.stages;
    go.plan.tensor_parallel = c.tp;
    go.plan.policy = c.policy;
    ASSERT_EQ(go.decode_batch, -1) << "the default is the automatic choice";
    auto gen = ag::generator::create(**rt, m->model_config(1), m->provider(), go);
    ASSERT_TRUE(gen.has_value()) << gen.err().to_string();
    EXPECT_EQ((*gen)->lanes_per_slot(), c.lanes);
    go.decode_batch = 0;
    auto unbatched = ag::generator::create(**rt, m->model_config(1), m->provider(), go);
    ASSERT_TRUE(unbatched.has_value()) << unbatched.err().to_string();
    EXPECT_EQ((*unbatched)->lanes_per_slot(), 1);
    // The caches: a lane more a slot at most (17: 18 lanes), and the
    // token states.
    const int slots = (c.max_sequences + c.lanes - 1) / c.lanes;
    const double lanes_over_asked = static_cast<double>(slots * c.lanes) / c.max_sequences;
    EXPECT_LE(static_cast<double>((*gen)->cache_bytes()),
              static_cast<double>((*unbatched)->cache_bytes()) * lanes_over_asked * 1.02);
  }
  // Four sequences started together on one device share their steps.
  auto rt = ag::runtime::create("sim:1", fast_sim());
  ASSERT_TRUE(rt.has_value()) << rt.err().to_string();
  const std::vector<std::vector<int32_t>> solo = solo_runs(**rt, *m, 0);
  ag::generator_options go;
  go.cache_tokens = 16;
  go.max_sequences = 4;
  auto gen = ag::generator::create(**rt, m->model_config(1), m->provider(), go);
  ASSERT_TRUE(gen.has_value()) << gen.err().to_string();
  ASSERT_EQ((*gen)->lanes_per_slot(), 4);
  std::vector<ag::generation> hs = start_runs_held(**gen, [](std::size_t, ag::generate_options&) {});
  int64_t batched = 0;
  for (std::size_t i = 0; i < hs.size(); ++i) {
    ASSERT_TRUE(hs[i].wait_for(120s)) << "sequence " << i << " hung";
    const auto& r = hs[i].wait();
    ASSERT_TRUE(r.has_value()) << r.err().to_string();
    EXPECT_EQ(r->tokens, solo[i]) << "sequence " << i << " differs from its solo run";
    batched += r->tokens_batched;
  }
  EXPECT_GT(batched, 0) << "no decode step carried two sequences";
}

TEST(GenerateBatched, BadBatchOptionsAreRefusedNamingThem) {
  const auto cfg = ag::test::tiny_model(ag::models::model_variant::gpt2);
  auto rt = ag::runtime::create("cpu:1");
  ASSERT_TRUE(rt.has_value());
  ag::generator_options go;
  go.decode_batch = 257;
  auto gen = ag::generator::create(**rt, cfg, {}, go);
  ASSERT_FALSE(gen.has_value());
  EXPECT_NE(gen.err().message.find("decode_batch must be -1 (automatic) or 0..256, got 257"), std::string::npos)
      << gen.err().message;
  go.decode_batch = -2;
  gen = ag::generator::create(**rt, cfg, {}, go);
  ASSERT_FALSE(gen.has_value());
  EXPECT_NE(gen.err().message.find("got -2"), std::string::npos) << gen.err().message;
  go.decode_batch = -1;  // max_sequences is checked before the automatic choice reads it
  go.max_sequences = std::numeric_limits<int>::max();
  gen = ag::generator::create(**rt, cfg, {}, go);
  ASSERT_FALSE(gen.has_value());
  EXPECT_NE(gen.err().message.find("max_sequences must be at most 65536"), std::string::npos) << gen.err().message;
  go.max_sequences = 8;
  auto llama = ag::test::tiny_model(ag::models::model_variant::llama, 2);
  go.decode_batch = 256;
  go.cache_tokens = int64_t{1} << 24;
  gen = ag::generator::create(**rt, llama, {}, go);
  ASSERT_FALSE(gen.has_value());
  EXPECT_NE(gen.err().message.find("exceed the 2^31 - 1 positions"), std::string::npos) << gen.err().message;
}
