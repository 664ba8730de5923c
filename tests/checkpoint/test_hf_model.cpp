// load_model: tiny GPT-2 and LLaMA (GQA) checkpoints written by the tests
// load into graphs whose weights are the mapped tensors and compute exactly
// what the same model built from the same tensors computes; on the runtime
// (sim and cpu, one device and 2 pipeline stages) they equal the reference
// evaluator. Checkpoints that do not fit their config are refused, naming the
// file and the tensor.
#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>

#include "actors/actorgraph.hpp"
#include "checkpoint_test_util.hpp"
#include "graph/plan.hpp"
#include "graph/reference.hpp"
#include "graph/checkpoint/hf_model.hpp"

using namespace ag;
using namespace ag::models;
using ag::test::temp_dir;
using ag::test::tiny_model;

namespace {

using namespace std::chrono_literals;

host_tensor logits_of(const graph& g, const std::vector<host_tensor>& in) {
  auto out = evaluate_reference(g, in);
  EXPECT_TRUE(out.has_value()) << out.err().to_string();
  return out ? (*out)[0] : host_tensor{};
}

std::string describe(const transformer_config& c) {
  return std::string(to_string(c.variant)) + " kv=" + std::to_string(c.kv_heads()) + " tied=" +
         std::to_string(c.tied_head()) + " bias=" + to_string(c.attn_bias) + (c.qk_norm ? " qk_norm " : " ") +
         to_string(c.dtype);
}

std::vector<transformer_config> tiny_models() {
  std::vector<transformer_config> out = {tiny_model(model_variant::gpt2), tiny_model(model_variant::llama, 2),
                                         tiny_model(model_variant::llama, 4)};
  auto tied_llama = tiny_model(model_variant::llama, 1);
  tied_llama.head = head_tying::tied;
  out.push_back(tied_llama);
  auto untied_gpt2 = tiny_model(model_variant::gpt2);
  untied_gpt2.head = head_tying::separate;
  untied_gpt2.activation = gelu_mode::erf;
  out.push_back(untied_gpt2);
  // Qwen2's q/k/v biases (a tied head, as the small Qwen2.5 models), and
  // LLaMA's attention_bias (o's too).
  auto qwen2 = tiny_model(model_variant::llama, 2);
  qwen2.attn_bias = attention_bias::qkv;
  qwen2.head = head_tying::tied;
  out.push_back(qwen2);
  auto llama_bias = tiny_model(model_variant::llama, 4);
  llama_bias.attn_bias = attention_bias::qkv_o;
  out.push_back(llama_bias);
  // Qwen3's q/k norms, on heads wider than d_model / heads.
  auto qwen3 = tiny_model(model_variant::llama, 2);
  qwen3.qk_norm = true;
  qwen3.explicit_head_dim = 16;
  qwen3.head = head_tying::tied;
  out.push_back(qwen3);
  return out;
}

error open_error(const std::string& dir) {
  auto m = hf_model::open(dir);
  EXPECT_FALSE(m.has_value()) << dir << " opened";
  return m ? error{} : m.err();
}

}  // namespace

TEST(HfModel, HfNamesAreTransformersNames) {
  // The names transformers' GPT2LMHeadModel and LlamaForCausalLM save.
  EXPECT_EQ(hf_tensor_name(model_variant::gpt2, "wte", "transformer."), "transformer.wte.weight");
  EXPECT_EQ(hf_tensor_name(model_variant::gpt2, "wpe", ""), "wpe.weight");
  EXPECT_EQ(hf_tensor_name(model_variant::gpt2, "l1.attn.w_qkv", "transformer."), "transformer.h.0.attn.c_attn.weight");
  EXPECT_EQ(hf_tensor_name(model_variant::gpt2, "l1.attn.b_qkv", ""), "h.0.attn.c_attn.bias");
  EXPECT_EQ(hf_tensor_name(model_variant::gpt2, "l12.attn.w_proj", ""), "h.11.attn.c_proj.weight");
  EXPECT_EQ(hf_tensor_name(model_variant::gpt2, "l3.mlp.w_fc", ""), "h.2.mlp.c_fc.weight");
  EXPECT_EQ(hf_tensor_name(model_variant::gpt2, "l3.mlp.b_proj", ""), "h.2.mlp.c_proj.bias");
  EXPECT_EQ(hf_tensor_name(model_variant::gpt2, "l2.ln_2.w", ""), "h.1.ln_2.weight");
  EXPECT_EQ(hf_tensor_name(model_variant::gpt2, "ln_f.b", "transformer."), "transformer.ln_f.bias");
  EXPECT_EQ(hf_tensor_name(model_variant::gpt2, "lm_head", "transformer."), "lm_head.weight");
  EXPECT_EQ(hf_tensor_name(model_variant::llama, "embed_tokens", "model."), "model.embed_tokens.weight");
  EXPECT_EQ(hf_tensor_name(model_variant::llama, "l1.attn_norm.w", "model."), "model.layers.0.input_layernorm.weight");
  EXPECT_EQ(hf_tensor_name(model_variant::llama, "l1.attn.wq", "model."), "model.layers.0.self_attn.q_proj.weight");
  EXPECT_EQ(hf_tensor_name(model_variant::llama, "l1.attn.wk", "model."), "model.layers.0.self_attn.k_proj.weight");
  EXPECT_EQ(hf_tensor_name(model_variant::llama, "l1.attn.wv", "model."), "model.layers.0.self_attn.v_proj.weight");
  EXPECT_EQ(hf_tensor_name(model_variant::llama, "l1.attn.wo", "model."), "model.layers.0.self_attn.o_proj.weight");
  EXPECT_EQ(hf_tensor_name(model_variant::llama, "l1.attn.bq", "model."), "model.layers.0.self_attn.q_proj.bias");
  EXPECT_EQ(hf_tensor_name(model_variant::llama, "l1.attn.bk", "model."), "model.layers.0.self_attn.k_proj.bias");
  EXPECT_EQ(hf_tensor_name(model_variant::llama, "l3.attn.bv", "model."), "model.layers.2.self_attn.v_proj.bias");
  EXPECT_EQ(hf_tensor_name(model_variant::llama, "l1.attn.bo", "model."), "model.layers.0.self_attn.o_proj.bias");
  EXPECT_EQ(hf_tensor_name(model_variant::llama, "l2.attn.q_norm.w", "model."), "model.layers.1.self_attn.q_norm.weight");
  EXPECT_EQ(hf_tensor_name(model_variant::llama, "l2.attn.k_norm.w", "model."), "model.layers.1.self_attn.k_norm.weight");
  EXPECT_EQ(hf_tensor_name(model_variant::llama, "l2.mlp_norm.w", "model."),
            "model.layers.1.post_attention_layernorm.weight");
  EXPECT_EQ(hf_tensor_name(model_variant::llama, "l2.mlp.w_gate", "model."), "model.layers.1.mlp.gate_proj.weight");
  EXPECT_EQ(hf_tensor_name(model_variant::llama, "l2.mlp.w_up", "model."), "model.layers.1.mlp.up_proj.weight");
  EXPECT_EQ(hf_tensor_name(model_variant::llama, "l2.mlp.w_down", "model."), "model.layers.1.mlp.down_proj.weight");
  EXPECT_EQ(hf_tensor_name(model_variant::llama, "norm.w", "model."), "model.norm.weight");
  EXPECT_EQ(hf_tensor_name(model_variant::llama, "lm_head", "model."), "lm_head.weight");
  EXPECT_EQ(hf_tensor_name(model_variant::llama, "l0.attn.wq", "model."), "");
  EXPECT_EQ(hf_tensor_name(model_variant::llama, "l1.attn.w_qkv", "model."), "");
  EXPECT_EQ(hf_tensor_name(model_variant::gpt2, "lx.ln_1.w", ""), "");
}

TEST(HfModel, LoadedModelsComputeExactlyWhatTheirTensorsBuild) {
  for (const auto& cfg : tiny_models()) {
    SCOPED_TRACE(describe(cfg));
    temp_dir dir;
    const graph original = ag::test::save_random_model(dir.str(), cfg);
    auto m = hf_model::open(dir.str());
    ASSERT_TRUE(m.has_value()) << m.err().to_string();
    EXPECT_EQ(m->dtype(), dtype::f32);
    EXPECT_EQ(m->model_bytes(), original.weight_bytes());
    auto g = m->build(cfg.seq_len, cfg.batch);
    ASSERT_TRUE(g.has_value()) << g.err().to_string();
    for (const node& n : g->nodes())
      if (n.op == op_kind::weight) {
        EXPECT_EQ(n.data->in_memory(), nullptr) << n.name << " is a copy, not the mapping";
        EXPECT_NE(n.data->origin().find("model.safetensors: '"), std::string::npos) << n.data->origin();
      }
    const auto in = transformer_inputs(cfg, 9);
    const host_tensor want = logits_of(original, in);
    const host_tensor got = logits_of(*g, in);
    EXPECT_TRUE(got == want) << compare(got, want, 0, 0).message;
    // The load counted every byte it read out of the mapping.
    EXPECT_EQ(m->weights().bytes_read(), m->model_bytes());
  }
}

TEST(HfModel, ShardedUnprefixedAndBufferCarryingCheckpointsLoadTheSame) {
  const auto cfg = tiny_model(model_variant::gpt2);
  temp_dir a, b;
  const graph original = ag::test::save_random_model(a.str(), cfg, {.max_shard_bytes = 20000});
  ASSERT_TRUE(std::filesystem::exists(a / "model.safetensors.index.json"));
  // openai-community/gpt2's own file: no "transformer." prefix, with the causal-mask buffers.
  std::vector<named_weight> tensors;
  for (const node& n : original.nodes())
    if (n.op == op_kind::weight) tensors.push_back({hf_tensor_name(cfg.variant, n.name, ""), n.data});
  for (int k = 0; k < cfg.n_layers; ++k)
    tensors.push_back({"h." + std::to_string(k) + ".attn.bias",
                       make_host_weight(host_tensor::random_normal(dtype::f32, {1, 1, 16, 16}, 3))});
  ASSERT_FALSE(save_safetensors(b / "model.safetensors", tensors));
  ag::test::write_text(b / "config.json", to_hf_config_json(cfg, cfg.max_positions));
  const auto in = transformer_inputs(cfg, 4);
  const host_tensor want = logits_of(original, in);
  for (const std::string& dir : {a.str(), b.str()}) {
    auto g = load_model(dir, cfg.seq_len);
    ASSERT_TRUE(g.has_value()) << g.err().to_string();
    EXPECT_TRUE(logits_of(*g, in) == want) << dir;
  }
}

TEST(HfModel, Bf16CheckpointLoadsAsF32WithConvertedWeights) {
  auto cfg = tiny_model(model_variant::llama, 2);
  cfg.dtype = dtype::bf16;
  temp_dir dir;
  const graph original = ag::test::save_random_model(dir.str(), cfg);
  auto m16 = hf_model::open(dir.str());
  ASSERT_TRUE(m16.has_value()) << m16.err().to_string();
  EXPECT_EQ(m16->dtype(), dtype::bf16) << "config.json's torch_dtype";
  auto m32 = hf_model::open(dir.str(), {.dtype = dtype::f32});
  ASSERT_TRUE(m32.has_value()) << m32.err().to_string();
  auto g = m32->build(cfg.seq_len);
  ASSERT_TRUE(g.has_value()) << g.err().to_string();
  // Reference: the same bf16 values, cast to f32 in memory.
  auto cfg32 = cfg;
  cfg32.dtype = dtype::f32;
  auto ref = build_transformer(cfg32, [&](const std::string& name, dtype, const shape&) -> expected<weight_source_ptr> {
    return make_host_weight(original.at(original.find(name)).data->in_memory()->cast(dtype::f32));
  });
  ASSERT_TRUE(ref.has_value()) << ref.err().to_string();
  const auto in = transformer_inputs(cfg, 2);
  EXPECT_TRUE(logits_of(*g, in) == logits_of(*ref, in));
  auto g16 = m16->build(cfg.seq_len);
  ASSERT_TRUE(g16.has_value());
  EXPECT_TRUE(logits_of(*g16, in) == logits_of(original, in));
}

TEST(HfModel, BuildsAnyLengthFromOneOpenModel) {
  const auto cfg = tiny_model(model_variant::gpt2);
  temp_dir dir;
  const graph original = ag::test::save_random_model(dir.str(), cfg);
  auto m = hf_model::open(dir.str());
  ASSERT_TRUE(m.has_value());
  // The first 3 positions of a 7-token forward equal a 3-token forward (causal).
  auto g3 = m->build(3);
  ASSERT_TRUE(g3.has_value());
  auto in7 = transformer_inputs(cfg, 5);
  std::vector<int32_t> toks(3), pos = {0, 1, 2};
  for (int i = 0; i < 3; ++i) toks[static_cast<std::size_t>(i)] = static_cast<int32_t>(in7[0].at(i));
  const host_tensor l3 = logits_of(*g3, {host_tensor::from_ints({1, 3}, toks), host_tensor::from_ints({3}, pos)});
  const host_tensor l7 = logits_of(original, in7);
  for (int64_t i = 0; i < 3 * cfg.vocab; ++i) ASSERT_NEAR(l3.at(i), l7.at(i), 1e-5) << i;
  auto too_long = m->build(17);
  ASSERT_FALSE(too_long.has_value());
  EXPECT_NE(too_long.err().message.find("exceed n_positions 16"), std::string::npos) << too_long.err().message;
  EXPECT_FALSE(m->build(0).has_value());
}

TEST(HfModel, TensorParallelDeviceReadsOnlyItsShardsOfTheMapping) {
  // The runtime does not run all-reduce yet (tp phase 1): this plans a loaded
  // model at tensor degree 2 and checks, in the reference evaluator, the
  // rewritten graph and what device 0's weights read from the mapping.
  const auto cfg = tiny_model(model_variant::llama, 2);
  temp_dir dir;
  ag::test::save_random_model(dir.str(), cfg);
  auto m = hf_model::open(dir.str());
  ASSERT_TRUE(m.has_value()) << m.err().to_string();
  auto g = m->build(cfg.seq_len);
  ASSERT_TRUE(g.has_value()) << g.err().to_string();
  auto original = std::make_shared<const graph>(std::move(*g));
  std::vector<device_spec> devices(2);
  for (int i = 0; i < 2; ++i) devices[static_cast<std::size_t>(i)].name = "sim" + std::to_string(i);
  plan_options o;
  o.tensor_parallel = 2;
  auto p = compile(original, devices, o);
  ASSERT_TRUE(p.has_value()) << p.err().to_string();
  const graph& rewritten = (*p)->source();
  const int64_t before = m->weights().bytes_read();
  int64_t on_device0 = 0;
  for (const node& n : rewritten.nodes()) {
    if (n.op != op_kind::weight || (*p)->placement()[static_cast<std::size_t>(n.id)] != 0) continue;
    on_device0 += n.data->bytes();
    auto v = read_all(*n.data);
    ASSERT_TRUE(v.has_value()) << n.name << ": " << v.err().to_string();
  }
  // Device 0 reads its weights straight from the mapping, and not the whole
  // model: the sharded matrices come in halves (norms and the embedding's
  // other rows are replicated or elsewhere).
  EXPECT_EQ(m->weights().bytes_read() - before, on_device0);
  EXPECT_LT(on_device0, m->model_bytes() * 3 / 4);
  const auto in = transformer_inputs(cfg, 6);
  auto want = evaluate_reference(*original, in);
  auto got = evaluate_reference(rewritten, in);
  ASSERT_TRUE(want.has_value()) << want.err().to_string();
  ASSERT_TRUE(got.has_value()) << got.err().to_string();
  auto c = compare((*got)[0], (*want)[0], 1e-5, 1e-4);
  EXPECT_TRUE(c.ok) << c.message;
}

// ---- checkpoints that do not fit their config ------------------------------------

TEST(HfModelBadCheckpoint, MissingTensorNamesIt) {
  const auto cfg = tiny_model(model_variant::llama, 2);
  temp_dir dir;
  graph g = ag::test::save_random_model(dir.str(), cfg);
  std::vector<named_weight> tensors;
  for (const node& n : g.nodes())
    if (n.op == op_kind::weight && n.name != "l2.attn.wv")
      tensors.push_back({hf_tensor_name(cfg.variant, n.name, "model."), n.data});
  ASSERT_FALSE(save_safetensors(dir / "model.safetensors", tensors));
  error e = open_error(dir.str());
  EXPECT_NE(e.message.find("'model.layers.1.self_attn.v_proj.weight' is missing"), std::string::npos) << e.message;
  EXPECT_NE(e.message.find(dir.str()), std::string::npos) << e.message;
}

TEST(HfModelBadCheckpoint, WrongShapeNamesFileTensorAndBothShapes) {
  auto cfg = tiny_model(model_variant::llama, 2);
  temp_dir dir;
  ag::test::save_random_model(dir.str(), cfg);
  cfg.d_ff = 40;  // the config now disagrees with the tensors
  ag::test::write_text(dir / "config.json", to_hf_config_json(cfg, 0));
  error e = open_error(dir.str());
  EXPECT_EQ(e.code, errc::invalid_shape) << e.to_string();
  EXPECT_NE(e.message.find(dir / "model.safetensors: 'model.layers.0.mlp.gate_proj.weight'"), std::string::npos)
      << e.message;
  EXPECT_NE(e.message.find("dims [48, 32], the model needs [40, 32]"), std::string::npos) << e.message;
}

TEST(HfModelBadCheckpoint, LeftoverTensorsTheBuilderWouldIgnore) {
  const auto cfg = tiny_model(model_variant::llama, 2);
  temp_dir dir;
  graph g = ag::test::save_random_model(dir.str(), cfg);
  std::vector<named_weight> tensors;
  for (const node& n : g.nodes())
    if (n.op == op_kind::weight) tensors.push_back({hf_tensor_name(cfg.variant, n.name, "model."), n.data});
  tensors.push_back({"model.layers.0.self_attn.q_proj.bias",
                     make_host_weight(host_tensor::random_normal(dtype::f32, {32}, 1))});
  ASSERT_FALSE(save_safetensors(dir / "model.safetensors", tensors));
  error e = open_error(dir.str());
  EXPECT_NE(e.message.find("model.safetensors: tensor 'model.layers.0.self_attn.q_proj.bias' is not part of a llama model"),
            std::string::npos)
      << e.message;
}

TEST(HfModelBadCheckpoint, IntegerTensorWhereAWeightBelongs) {
  const auto cfg = tiny_model(model_variant::gpt2);
  temp_dir dir;
  graph g = ag::test::save_random_model(dir.str(), cfg);
  std::vector<named_weight> tensors;
  for (const node& n : g.nodes()) {
    if (n.op != op_kind::weight) continue;
    weight_source_ptr src = n.data;
    if (n.name == "ln_f.b") src = make_host_weight(host_tensor::random_ints({32}, 1, 5));
    tensors.push_back({hf_tensor_name(cfg.variant, n.name, "transformer."), src});
  }
  ASSERT_FALSE(save_safetensors(dir / "model.safetensors", tensors));
  error e = open_error(dir.str());
  EXPECT_EQ(e.code, errc::dtype_mismatch) << e.to_string();
  EXPECT_NE(e.message.find("tensor 'transformer.ln_f.bias' of I32 cannot be read as f32"), std::string::npos)
      << e.message;
}

TEST(HfModelBadCheckpoint, UntiedConfigWithoutHeadAndWrongArchitecture) {
  auto cfg = tiny_model(model_variant::llama, 2);
  cfg.head = head_tying::tied;
  temp_dir dir;
  ag::test::save_random_model(dir.str(), cfg);  // no lm_head.weight
  cfg.head = head_tying::separate;
  ag::test::write_text(dir / "config.json", to_hf_config_json(cfg, 0));
  error e = open_error(dir.str());
  EXPECT_NE(e.message.find("'lm_head.weight' is missing"), std::string::npos) << e.message;
  // A GPT-2 config over LLaMA tensors.
  ag::test::write_text(dir / "config.json", to_hf_config_json(tiny_model(model_variant::gpt2), 16));
  e = open_error(dir.str());
  EXPECT_NE(e.message.find("'transformer.wte.weight' (or 'wte.weight') is missing"), std::string::npos) << e.message;
  // No config at all.
  std::filesystem::remove(dir / "config.json");
  e = open_error(dir.str());
  EXPECT_NE(e.message.find("config.json: cannot open"), std::string::npos) << e.message;
}

// ---- on the runtime ----------------------------------------------------------------

namespace {

ag::runtime_options fast_sim() {
  ag::runtime_options o;
  o.backend.sim.time_scale = 1e-2;
  return o;
}

void run_loaded(const std::string& spec, int stages) {
  for (const auto& cfg : tiny_models()) {
    SCOPED_TRACE(describe(cfg) + " on " + spec + " stages " + std::to_string(stages));
    temp_dir dir;
    ag::test::save_random_model(dir.str(), cfg);
    auto rt = ag::runtime::create(spec, fast_sim());
    ASSERT_TRUE(rt.has_value()) << rt.err().to_string();
    auto g = load_model(dir.str(), cfg.seq_len);
    ASSERT_TRUE(g.has_value()) << g.err().to_string();
    auto p = (*rt)->compile(*g, {.pipeline_stages = stages});
    ASSERT_TRUE(p.has_value()) << p.err().to_string();
    if (stages > 1) { EXPECT_EQ(static_cast<int>((*p)->used_devices().size()), stages); }
    const auto in = transformer_inputs(cfg, 17);
    job j = (*rt)->submit(*p, in);
    ASSERT_TRUE(j.wait_for(60s)) << "job hung";
    const auto& r = j.wait();
    ASSERT_TRUE(r.has_value()) << r.err().to_string();
    auto ref = evaluate_reference(*g, in);
    ASSERT_TRUE(ref.has_value());
    auto c = compare((*r)[0], (*ref)[0], 2e-4, 2e-3);
    EXPECT_TRUE(c.ok) << c.message;
  }
}

}  // namespace

TEST(HfModelRuntime, Sim1Device) { run_loaded("sim:1", 1); }
TEST(HfModelRuntime, Cpu1Device) { run_loaded("cpu:1", 1); }
TEST(HfModelRuntime, Sim2Stages) { run_loaded("sim:2", 2); }
TEST(HfModelRuntime, Cpu2Stages) { run_loaded("cpu:2", 2); }
