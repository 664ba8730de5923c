// config.json of GPT-2 and LLaMA, as older (4.x) and current (5.x)
// transformers versions write them, into transformer_config; configs the
// builder cannot honour are errors naming the key.
#include <gtest/gtest.h>

#include "graph/checkpoint/hf_config.hpp"

using namespace ag;
using namespace ag::models;

namespace {

hf_config parse_ok(const std::string& text) {
  auto c = parse_hf_config(text, "config.json");
  EXPECT_TRUE(c.has_value()) << c.err().to_string();
  return c ? *c : hf_config{};
}

void expect_key_error(const std::string& text, const std::string& key, const std::string& what = "") {
  auto c = parse_hf_config(text, "config.json");
  ASSERT_FALSE(c.has_value()) << text;
  EXPECT_EQ(c.err().code, errc::invalid_argument);
  EXPECT_NE(c.err().message.find("config.json: '" + key + "'"), std::string::npos) << c.err().message;
  EXPECT_NE(c.err().message.find(what), std::string::npos) << c.err().message;
}

// GPT-2 small's config.json as published (openai-community/gpt2, transformers 4.x).
const char* gpt2_small = R"({
  "activation_function": "gelu_new", "architectures": ["GPT2LMHeadModel"], "attn_pdrop": 0.1,
  "bos_token_id": 50256, "embd_pdrop": 0.1, "eos_token_id": 50256, "initializer_range": 0.02,
  "layer_norm_epsilon": 1e-05, "model_type": "gpt2", "n_ctx": 1024, "n_embd": 768, "n_head": 12,
  "n_layer": 12, "n_positions": 1024, "resid_pdrop": 0.1, "summary_activation": null,
  "summary_first_dropout": 0.1, "summary_proj_to_labels": true, "summary_type": "cls_index",
  "summary_use_proj": true, "task_specific_params": {"text-generation": {"do_sample": true, "max_length": 50}},
  "vocab_size": 50257})";

// A LLaMA-3.2-1B-like config (transformers 4.45: rope_theta at the top level).
const char* llama_v4 = R"({
  "architectures": ["LlamaForCausalLM"], "attention_bias": false, "attention_dropout": 0.0,
  "bos_token_id": 128000, "eos_token_id": [128001, 128008, 128009], "head_dim": 64,
  "hidden_act": "silu", "hidden_size": 2048, "initializer_range": 0.02, "intermediate_size": 8192,
  "max_position_embeddings": 131072, "mlp_bias": false, "model_type": "llama", "num_attention_heads": 32,
  "num_hidden_layers": 16, "num_key_value_heads": 8, "pretraining_tp": 1, "rms_norm_eps": 1e-05,
  "rope_scaling": null, "rope_theta": 500000.0, "tie_word_embeddings": true, "torch_dtype": "bfloat16",
  "transformers_version": "4.45.0", "use_cache": true, "vocab_size": 128256})";

// The same model as transformers 5 writes it: "dtype", rope_parameters.
const char* llama_v5 = R"({
  "architectures": ["LlamaForCausalLM"], "attention_bias": false, "bos_token_id": 128000,
  "dtype": "bfloat16", "eos_token_id": 128001, "head_dim": 64, "hidden_act": "silu", "hidden_size": 2048,
  "intermediate_size": 8192, "max_position_embeddings": 131072, "mlp_bias": false, "model_type": "llama",
  "num_attention_heads": 32, "num_hidden_layers": 16, "num_key_value_heads": 8, "rms_norm_eps": 1e-05,
  "rope_parameters": {"rope_theta": 500000.0, "rope_type": "default"}, "tie_word_embeddings": true,
  "transformers_version": "5.0.0", "vocab_size": 128256})";

// Adds (or, as a later duplicate key, overrides) keys at the end of the object.
std::string with(std::string text, const std::string& extra) {
  text.insert(text.rfind('}'), ", " + extra);
  return text;
}

}  // namespace

TEST(HfConfig, Gpt2SmallAsPublished) {
  hf_config c = parse_ok(gpt2_small);
  EXPECT_EQ(c.model_type, "gpt2");
  EXPECT_EQ(c.model.variant, model_variant::gpt2);
  EXPECT_EQ(c.model.n_layers, 12);
  EXPECT_EQ(c.model.d_model, 768);
  EXPECT_EQ(c.model.n_heads, 12);
  EXPECT_EQ(c.model.d_ff, 3072) << "n_inner absent: 4 n_embd";
  EXPECT_EQ(c.model.vocab, 50257);
  EXPECT_EQ(c.max_positions, 1024);
  EXPECT_EQ(c.model.max_positions, 1024);
  EXPECT_FLOAT_EQ(c.model.eps, 1e-5f);
  EXPECT_TRUE(c.model.tied_head());
  EXPECT_EQ(c.model.activation, gelu_mode::tanh);
  EXPECT_FALSE(c.dtype.has_value());
  EXPECT_EQ(c.bos_token_id, 50256);
  EXPECT_EQ(c.eos_token_ids, std::vector<int32_t>{50256});
  // The builder would accept it, and its parameter count is GPT-2 small's.
  EXPECT_EQ(parameter_count(c.model), 124439808);
}

TEST(HfConfig, LlamaFromTransformers4And5AreTheSameModel) {
  hf_config a = parse_ok(llama_v4), b = parse_ok(llama_v5);
  for (const hf_config* c : {&a, &b}) {
    EXPECT_EQ(c->model.variant, model_variant::llama);
    EXPECT_EQ(c->model.n_layers, 16);
    EXPECT_EQ(c->model.d_model, 2048);
    EXPECT_EQ(c->model.d_ff, 8192);
    EXPECT_EQ(c->model.n_heads, 32);
    EXPECT_EQ(c->model.kv_heads(), 8);
    EXPECT_EQ(c->model.vocab, 128256);
    EXPECT_FLOAT_EQ(c->model.rope_theta, 500000.0f);
    EXPECT_FLOAT_EQ(c->model.eps, 1e-5f);
    EXPECT_TRUE(c->model.tied_head());
    EXPECT_EQ(c->dtype, dtype::bf16);
    EXPECT_EQ(c->model.dtype, dtype::bf16);
    EXPECT_EQ(c->max_positions, 131072);
    EXPECT_EQ(c->bos_token_id, 128000);
  }
  EXPECT_EQ(a.eos_token_ids, (std::vector<int32_t>{128001, 128008, 128009}));
  EXPECT_EQ(b.eos_token_ids, std::vector<int32_t>{128001});
  // LLaMA 3.2 1B has 1,235,814,400 parameters (tied head).
  EXPECT_EQ(parameter_count(a.model), 1235814400);
}

TEST(HfConfig, MissingKeysTakeTransformersDefaults) {
  hf_config g = parse_ok(R"({"model_type": "gpt2"})");
  EXPECT_EQ(g.model.n_layers, 12);
  EXPECT_EQ(g.model.vocab, 50257);
  EXPECT_TRUE(g.model.tied_head());
  hf_config l = parse_ok(R"({"model_type": "llama", "hidden_size": 64, "num_attention_heads": 4})");
  EXPECT_EQ(l.model.kv_heads(), 4) << "num_key_value_heads defaults to the heads";
  EXPECT_FLOAT_EQ(l.model.rope_theta, 10000.0f);
  EXPECT_FLOAT_EQ(l.model.eps, 1e-6f);
  EXPECT_FALSE(l.model.tied_head());
  EXPECT_EQ(l.model.d_ff, 11008);
  // No model_type: the architecture names it.
  hf_config a = parse_ok(R"({"architectures": ["LlamaForCausalLM"], "hidden_size": 64, "num_attention_heads": 4})");
  EXPECT_EQ(a.model.variant, model_variant::llama);
}

TEST(HfConfig, OlderAndNewerKeySpellings) {
  // n_ctx when n_positions is absent (early GPT-2 configs), explicit n_inner, erf gelu.
  hf_config g = parse_ok(R"({"model_type": "gpt2", "n_ctx": 512, "n_embd": 64, "n_head": 4, "n_inner": 100,
                             "activation_function": "gelu", "tie_word_embeddings": false,
                             "torch_dtype": "torch.float16"})");
  EXPECT_EQ(g.max_positions, 512);
  EXPECT_EQ(g.model.d_ff, 100);
  EXPECT_EQ(g.model.activation, gelu_mode::erf);
  EXPECT_FALSE(g.model.tied_head());
  EXPECT_EQ(g.dtype, dtype::f16);
  hf_config n = parse_ok(R"({"model_type": "gpt2", "n_inner": null, "n_embd": 64, "n_head": 4})");
  EXPECT_EQ(n.model.d_ff, 256);
  // rope_scaling of type default is plain RoPE; dtype "auto" is unspecified.
  hf_config l = parse_ok(with(llama_v4, R"("rope_scaling": {"rope_type": "default"}, "dtype": "auto")"));
  EXPECT_EQ(l.dtype, dtype::bf16) << "torch_dtype still applies";
  // "dtype" wins over "torch_dtype" when both are present.
  hf_config d = parse_ok(with(llama_v4, R"("dtype": "float32")"));
  EXPECT_EQ(d.dtype, dtype::f32);
  hf_config m = parse_ok(R"({"model_type": "mistral", "hidden_size": 64, "num_attention_heads": 4,
                             "num_key_value_heads": 2, "sliding_window": null})");
  EXPECT_EQ(m.model.kv_heads(), 2);
}

TEST(HfConfig, UnsupportedFeaturesNameTheKey) {
  expect_key_error(with(llama_v4, R"("rope_scaling": {"rope_type": "yarn", "factor": 4.0})"), "rope_scaling.rope_type",
                   "\"yarn\" is not implemented (plain RoPE, \"llama3\" and \"linear\" are)");
  expect_key_error(with(llama_v4, R"("rope_scaling": {"type": "dynamic", "factor": 2.0})"), "rope_scaling.rope_type",
                   "\"dynamic\"");
  expect_key_error(with(llama_v4, R"("rope_scaling": {"factor": 2.0})"), "rope_scaling.rope_type", "missing");
  expect_key_error(with(llama_v5, R"("rope_parameters": {"rope_type": "yarn", "rope_theta": 1e4})"),
                   "rope_parameters.rope_type", "\"yarn\"");
  expect_key_error(R"({"model_type": "mistral", "sliding_window": null, "attention_bias": true})", "attention_bias",
                   "no bias");
  expect_key_error(with(llama_v4, R"("mlp_bias": true)"), "mlp_bias");
  expect_key_error(with(llama_v4, R"("hidden_act": "gelu")"), "hidden_act", "\"gelu\" is not implemented");
  expect_key_error(with(llama_v4, R"("head_dim": 63)"), "head_dim", "63 is not an even width >= 2 (RoPE rotates pairs)");
  expect_key_error(with(llama_v4, R"("hidden_size": 2050, "head_dim": null)"), "hidden_size",
                   "2050 is not divisible by 'num_attention_heads' 32 (and no 'head_dim' says the heads' width)");
  expect_key_error(with(llama_v4, R"("num_key_value_heads": 5)"), "num_key_value_heads", "does not divide");
  expect_key_error(with(gpt2_small, R"("activation_function": "relu")"), "activation_function", "\"relu\"");
  expect_key_error(with(gpt2_small, R"("scale_attn_by_inverse_layer_idx": true)"), "scale_attn_by_inverse_layer_idx");
  expect_key_error(with(gpt2_small, R"("add_cross_attention": true)"), "add_cross_attention");
  expect_key_error(with(gpt2_small, R"("n_embd": 100)"), "n_embd", "not divisible by 'n_head' 12");
  expect_key_error(R"({"model_type": "mistral", "sliding_window": 0})", "sliding_window", "0 is outside [1, ");
  expect_key_error(R"({"model_type": "mistral", "sliding_window": "4096"})", "sliding_window", "expected an integer");
  expect_key_error(R"({"model_type": "bert"})", "model_type", "\"bert\"");
  expect_key_error(R"({"architectures": ["Qwen2MoeForCausalLM"]})", "architectures", "Qwen2MoeForCausalLM");
  expect_key_error(R"({"vocab_size": 5})", "model_type", "missing");
  expect_key_error(with(llama_v4, R"("torch_dtype": "float64")"), "torch_dtype", "\"float64\"");
}

TEST(HfConfig, WrongTypesAndRangesNameTheKey) {
  expect_key_error(with(gpt2_small, R"("n_layer": "12")"), "n_layer", "expected an integer");
  expect_key_error(with(gpt2_small, R"("n_layer": 0)"), "n_layer", "outside");
  expect_key_error(with(gpt2_small, R"("n_head": 12.5)"), "n_head", "expected an integer");
  expect_key_error(with(gpt2_small, R"("vocab_size": 99999999999)"), "vocab_size", "outside");
  expect_key_error(with(gpt2_small, R"("layer_norm_epsilon": -1)"), "layer_norm_epsilon", "> 0");
  expect_key_error(with(gpt2_small, R"("tie_word_embeddings": "yes")"), "tie_word_embeddings", "true or false");
  expect_key_error(with(llama_v4, R"("rope_theta": "big")"), "rope_theta", "expected a number");
  expect_key_error(with(llama_v4, R"("eos_token_id": [1, "x"])"), "eos_token_id", "not a token id");
  expect_key_error(with(llama_v5, R"("rope_parameters": 7)"), "rope_parameters", "expected an object");
  expect_key_error(with(llama_v4, R"("rope_scaling": "llama3")"), "rope_scaling", "expected an object or null");
  // Llama 3's scaling needs its four numbers, each of the right type.
  expect_key_error(with(llama_v4, R"("rope_scaling": {"rope_type": "llama3", "factor": 32.0})"),
                   "rope_scaling.low_freq_factor", "missing");
  expect_key_error(with(llama_v5, R"("rope_parameters": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                      "high_freq_factor": 4.0, "original_max_position_embeddings": "8k"})"),
                   "rope_parameters.original_max_position_embeddings", "expected an integer");
  expect_key_error(with(llama_v4, R"("rope_scaling": {"rope_type": "llama3", "factor": -2, "low_freq_factor": 1.0,
                                      "high_freq_factor": 4.0, "original_max_position_embeddings": 8192})"),
                   "rope_scaling.factor", "> 0");
  expect_key_error(with(llama_v4, R"("rope_scaling": {"rope_type": "llama3", "factor": 8, "low_freq_factor": 4.0,
                                      "high_freq_factor": 1.0, "original_max_position_embeddings": 8192})"),
                   "rope_scaling.high_freq_factor", "greater than low_freq_factor");
  auto c = parse_hf_config("{not json", "config.json");
  ASSERT_FALSE(c.has_value());
  EXPECT_NE(c.err().message.find("config.json: not valid JSON"), std::string::npos) << c.err().message;
  c = parse_hf_config("[1]", "config.json");
  ASSERT_FALSE(c.has_value());
  EXPECT_NE(c.err().message.find("not a JSON object"), std::string::npos) << c.err().message;
}

// Heads of another width than hidden_size / heads (Mistral NeMo 12B's
// published config: hidden 5120, 32 heads of 128, so q is 4096 wide); a
// head_dim equal to hidden_size / heads, or null, is the default.
TEST(HfConfig, HeadDimOtherThanHiddenOverHeads) {
  hf_config c = parse_ok(R"({"architectures": ["MistralForCausalLM"], "model_type": "mistral", "head_dim": 128,
    "hidden_size": 5120, "intermediate_size": 14336, "num_attention_heads": 32, "num_hidden_layers": 40,
    "num_key_value_heads": 8, "rope_theta": 1000000.0, "sliding_window": null, "vocab_size": 131072,
    "torch_dtype": "bfloat16"})");
  EXPECT_EQ(c.model.head_dim(), 128);
  EXPECT_EQ(c.model.explicit_head_dim, 128);
  EXPECT_FALSE(ag::models::validate(c.model)) << "a valid model";
  // 5120 x 4096 q, 1024-wide k and v, 4096-wide o input per layer.
  EXPECT_EQ(ag::models::parameter_count(c.model),
            131072LL * 5120 * 2 + 40LL * (2 * 5120 + 5120LL * 4096 * 2 + 5120LL * 1024 * 2 + 3LL * 5120 * 14336) + 5120);
  EXPECT_EQ(parse_ok(llama_v4).model.explicit_head_dim, 0) << "64 = 2048 / 32: the default";
  EXPECT_EQ(parse_ok(with(llama_v4, R"("head_dim": null)")).model.head_dim(), 64);
  // d_model need not divide by the heads when head_dim is given.
  hf_config odd = parse_ok(with(llama_v4, R"("hidden_size": 2050, "head_dim": 64)"));
  EXPECT_EQ(odd.model.d_model, 2050);
  EXPECT_EQ(odd.model.head_dim(), 64);
}

// Qwen2.5-0.5B's config.json as published (transformers 4.43): LLaMA's
// architecture with q/k/v biases (no key says so: Qwen2Attention has them),
// a tied head and a sliding window that is off.
namespace {
const char* qwen25_half_b = R"({
  "architectures": ["Qwen2ForCausalLM"], "attention_dropout": 0.0, "bos_token_id": 151643,
  "eos_token_id": 151643, "hidden_act": "silu", "hidden_size": 896, "initializer_range": 0.02,
  "intermediate_size": 4864, "max_position_embeddings": 32768, "max_window_layers": 24, "model_type": "qwen2",
  "num_attention_heads": 14, "num_hidden_layers": 24, "num_key_value_heads": 2, "rms_norm_eps": 1e-06,
  "rope_theta": 1000000.0, "sliding_window": 32768, "tie_word_embeddings": true, "torch_dtype": "bfloat16",
  "transformers_version": "4.43.1", "use_cache": true, "use_sliding_window": false, "vocab_size": 151936})";
}  // namespace

TEST(HfConfig, Qwen2AsPublishedHasQkvBiases) {
  hf_config c = parse_ok(qwen25_half_b);
  EXPECT_EQ(c.model_type, "qwen2");
  EXPECT_EQ(c.model.variant, model_variant::llama);
  EXPECT_EQ(c.model.attn_bias, attention_bias::qkv);
  EXPECT_EQ(c.model.n_layers, 24);
  EXPECT_EQ(c.model.d_model, 896);
  EXPECT_EQ(c.model.n_heads, 14);
  EXPECT_EQ(c.model.kv_heads(), 2);
  EXPECT_EQ(c.model.head_dim(), 64);
  EXPECT_EQ(c.model.d_ff, 4864);
  EXPECT_EQ(c.model.vocab, 151936);
  EXPECT_FLOAT_EQ(c.model.rope_theta, 1e6f);
  EXPECT_FLOAT_EQ(c.model.eps, 1e-6f);
  EXPECT_TRUE(c.model.tied_head());
  EXPECT_EQ(c.dtype, dtype::bf16);
  EXPECT_EQ(c.max_positions, 32768);
  // Qwen2.5-0.5B has 494,032,768 parameters, its q/k/v biases among them
  // (24 x (896 + 2 x 128) = 27,648).
  EXPECT_EQ(parameter_count(c.model), 494032768);
  // No model_type: the architecture names it; missing keys take
  // Qwen2Config's defaults, not LlamaConfig's.
  hf_config d = parse_ok(R"({"architectures": ["Qwen2ForCausalLM"], "hidden_size": 64, "num_attention_heads": 4})");
  EXPECT_EQ(d.model_type, "qwen2");
  EXPECT_EQ(d.model.attn_bias, attention_bias::qkv);
  EXPECT_EQ(d.model.vocab, 151936);
  EXPECT_EQ(d.model.d_ff, 22016);
  EXPECT_EQ(d.max_positions, 32768);
  // transformers 5 writes layer_types; all "full_attention" is no window.
  hf_config v5 = parse_ok(with(qwen25_half_b, R"("use_sliding_window": true, "layer_types": ["full_attention",
      "full_attention", "full_attention", "full_attention", "full_attention", "full_attention", "full_attention",
      "full_attention", "full_attention", "full_attention", "full_attention", "full_attention", "full_attention",
      "full_attention", "full_attention", "full_attention", "full_attention", "full_attention", "full_attention",
      "full_attention", "full_attention", "full_attention", "full_attention", "full_attention"])"));
  EXPECT_EQ(v5.model.attn_bias, attention_bias::qkv);
  EXPECT_EQ(v5.model.sliding_window, 0);
  EXPECT_EQ(c.model.sliding_window, 0) << "sliding_window 32768 without use_sliding_window";
  // A window on every layer is the model's (from max_window_layers 0, or
  // every layer_types entry); on some layers and not others it is refused,
  // naming the key that says so.
  EXPECT_EQ(parse_ok(with(qwen25_half_b, R"("use_sliding_window": true, "max_window_layers": 0)")).model.sliding_window,
            32768);
  expect_key_error(with(qwen25_half_b, R"("use_sliding_window": true, "max_window_layers": 21)"), "use_sliding_window",
                   "'max_window_layers' 21 of 24: a sliding window on some layers and not on others is not implemented");
  hf_config none_slide = parse_ok(with(qwen25_half_b, R"("use_sliding_window": true)"));
  EXPECT_EQ(none_slide.model.sliding_window, 0) << "max_window_layers 24 of 24 layers: no layer slides";
  const char* two_layers = R"({"model_type": "qwen2", "hidden_size": 64, "num_attention_heads": 4,
      "num_hidden_layers": 2, "use_sliding_window": true, "sliding_window": 64)";
  expect_key_error(std::string(two_layers) + R"(, "layer_types": ["full_attention", "sliding_attention"]})",
                   "layer_types", "1 of 2 entries \"sliding_attention\": a sliding window on some layers");
  expect_key_error(std::string(two_layers) + R"(, "layer_types": ["chunked_attention", "full_attention"]})",
                   "layer_types", "entry \"chunked_attention\"");
  hf_config all_slide = parse_ok(std::string(two_layers) + R"(, "layer_types": ["sliding_attention", "sliding_attention"]})");
  expect_key_error(std::string(two_layers) + R"(, "layer_types": ["sliding_attention"]})", "layer_types",
                   "1 entries for 2 layers");
  EXPECT_EQ(all_slide.model.sliding_window, 64);
  // Written back with the window on every layer, read back the same.
  hf_config back = parse_ok(to_hf_config_json(all_slide.model, 0));
  EXPECT_EQ(back.model_type, "qwen2");
  EXPECT_EQ(back.model.sliding_window, 64);
}

// Mistral's sliding window (transformer_config::sliding_window): the
// number, MistralConfig's 4096 where the key is absent, none where it is
// null; written back as a Mistral config with its window.
TEST(HfConfig, MistralSlidingWindowIsTheModels) {
  EXPECT_EQ(parse_ok(R"({"model_type": "mistral", "sliding_window": 4096})").model.sliding_window, 4096);
  EXPECT_EQ(parse_ok(R"({"model_type": "mistral"})").model.sliding_window, 4096) << "MistralConfig's default";
  EXPECT_EQ(parse_ok(R"({"model_type": "mistral", "sliding_window": null})").model.sliding_window, 0);
  EXPECT_EQ(parse_ok(R"({"model_type": "llama", "sliding_window": 16})").model.sliding_window, 0)
      << "LlamaConfig has no window: the key means nothing there";
  hf_config m = parse_ok(R"({"model_type": "mistral", "sliding_window": 3, "hidden_size": 64, "num_attention_heads": 4,
                             "num_key_value_heads": 2, "num_hidden_layers": 2, "intermediate_size": 128,
                             "vocab_size": 50})");
  const std::string written = to_hf_config_json(m.model, 0);
  EXPECT_NE(written.find("\"MistralForCausalLM\""), std::string::npos) << written;
  hf_config back = parse_ok(written);
  EXPECT_EQ(back.model_type, "mistral");
  EXPECT_EQ(back.model.sliding_window, 3);
  EXPECT_EQ(parameter_count(back.model), parameter_count(m.model));
  // Without a window the same model is written as LLaMA's.
  m.model.sliding_window = 0;
  EXPECT_EQ(parse_ok(to_hf_config_json(m.model, 0)).model_type, "llama");
}

// Qwen3-0.6B's config.json as published (transformers 4.51): heads of 128
// (16 of them on d_model 1024: q is 2048 wide), an RMSNorm over each head's
// q and k (no key says so: Qwen3Attention has them), a tied head.
TEST(HfConfig, Qwen3AsPublishedHasQkNorms) {
  const char* qwen3 = R"({"architectures": ["Qwen3ForCausalLM"], "attention_bias": false, "attention_dropout": 0.0,
    "bos_token_id": 151643, "eos_token_id": 151645, "head_dim": 128, "hidden_act": "silu", "hidden_size": 1024,
    "initializer_range": 0.02, "intermediate_size": 3072, "max_position_embeddings": 40960, "max_window_layers": 28,
    "model_type": "qwen3", "num_attention_heads": 16, "num_hidden_layers": 28, "num_key_value_heads": 8,
    "rms_norm_eps": 1e-06, "rope_scaling": null, "rope_theta": 1000000, "sliding_window": null,
    "tie_word_embeddings": true, "torch_dtype": "bfloat16", "transformers_version": "4.51.0", "use_cache": true,
    "use_sliding_window": false, "vocab_size": 151936})";
  hf_config c = parse_ok(qwen3);
  EXPECT_EQ(c.model_type, "qwen3");
  EXPECT_TRUE(c.model.qk_norm);
  EXPECT_EQ(c.model.attn_bias, attention_bias::none);
  EXPECT_EQ(c.model.head_dim(), 128);
  EXPECT_EQ(c.model.explicit_head_dim, 128) << "16 x 128 is not 1024";
  EXPECT_EQ(c.model.kv_heads(), 8);
  EXPECT_TRUE(c.model.tied_head());
  EXPECT_FLOAT_EQ(c.model.rope_theta, 1e6f);
  // 28 layers of 15,731,968 (the q/k norms' 256 among them), the tied
  // embedding, the final norm.
  EXPECT_EQ(parameter_count(c.model), 596049920);
  // Qwen3Config's head_dim defaults to 128, whatever hidden_size / heads is;
  // its attention_bias is LLaMA's (o's bias too).
  hf_config d = parse_ok(R"({"model_type": "qwen3", "hidden_size": 512, "num_attention_heads": 8,
                             "attention_bias": true})");
  EXPECT_EQ(d.model.head_dim(), 128);
  EXPECT_EQ(d.model.attn_bias, attention_bias::qkv_o);
  EXPECT_TRUE(d.model.qk_norm);
  expect_key_error(with(qwen3, R"("use_sliding_window": true, "sliding_window": 4096, "max_window_layers": 20)"),
                   "use_sliding_window", "a sliding window on some layers and not on others is not implemented");
  // Written back as Qwen3.
  hf_config back = parse_ok(to_hf_config_json(c.model, 0));
  EXPECT_EQ(back.model_type, "qwen3");
  EXPECT_TRUE(back.model.qk_norm);
  EXPECT_EQ(parameter_count(back.model), parameter_count(c.model));
}

// LlamaConfig's attention_bias puts a bias on q, k, v and o.
TEST(HfConfig, LlamaAttentionBiasIsQkvAndO) {
  hf_config c = parse_ok(with(llama_v4, R"("attention_bias": true)"));
  EXPECT_EQ(c.model_type, "llama");
  EXPECT_EQ(c.model.attn_bias, attention_bias::qkv_o);
  EXPECT_EQ(parameter_count(c.model), 1235814400 + 16 * (2048 + 2 * 512 + 2048)) << "q, k, v, o biases";
  EXPECT_EQ(parse_ok(llama_v4).model.attn_bias, attention_bias::none);
}

TEST(HfConfig, WrittenConfigsReadBackAsTheSameModel) {
  for (auto v : {model_variant::gpt2, model_variant::llama}) {
    transformer_config t;
    t.variant = v;
    t.n_layers = 3;
    t.d_model = 48;
    t.n_heads = 6;
    t.n_kv_heads = v == model_variant::llama ? 2 : 0;
    t.d_ff = 80;
    t.vocab = 77;
    t.max_positions = v == model_variant::gpt2 ? 40 : 0;
    t.eps = 3e-6f;
    t.rope_theta = 12345.0f;
    t.dtype = dtype::bf16;
    t.head = v == model_variant::gpt2 ? head_tying::separate : head_tying::tied;
    hf_config c = parse_ok(to_hf_config_json(t, t.max_positions));
    EXPECT_EQ(c.model.variant, v);
    EXPECT_EQ(c.model.n_layers, 3);
    EXPECT_EQ(c.model.d_model, 48);
    EXPECT_EQ(c.model.n_heads, 6);
    EXPECT_EQ(c.model.kv_heads(), t.kv_heads());
    EXPECT_EQ(c.model.d_ff, 80);
    EXPECT_EQ(c.model.vocab, 77);
    EXPECT_EQ(c.model.eps, 3e-6f);
    EXPECT_EQ(c.model.tied_head(), t.tied_head());
    EXPECT_EQ(c.dtype, dtype::bf16);
    if (v == model_variant::llama) EXPECT_EQ(c.model.rope_theta, 12345.0f);
    else EXPECT_EQ(c.max_positions, 40);
    EXPECT_FALSE(c.model.rope_scale.on());
  }
  // Llama 3's scaling is written as transformers 4.x writes it and read back.
  transformer_config t;
  t.variant = model_variant::llama;
  t.n_layers = 1, t.d_model = 32, t.n_heads = 2, t.d_ff = 40, t.vocab = 50;
  t.rope_scale = {8.0f, 1.5f, 6.0f, 4096};
  hf_config c = parse_ok(to_hf_config_json(t, 0));
  EXPECT_EQ(c.model.rope_scale, t.rope_scale);
  EXPECT_EQ(c.model.explicit_head_dim, 0);
  // Heads of another width are written as head_dim and read back.
  t.explicit_head_dim = 24;
  c = parse_ok(to_hf_config_json(t, 0));
  EXPECT_EQ(c.model.head_dim(), 24);
  EXPECT_EQ(ag::models::parameter_count(c.model), ag::models::parameter_count(t));
  // Biases: q/k/v alone are written as Qwen2, with o as LLaMA's attention_bias.
  for (attention_bias b : {attention_bias::qkv, attention_bias::qkv_o}) {
    t.attn_bias = b;
    c = parse_ok(to_hf_config_json(t, 0));
    EXPECT_EQ(c.model_type, b == attention_bias::qkv ? "qwen2" : "llama");
    EXPECT_EQ(c.model.attn_bias, b);
    EXPECT_EQ(c.model.rope_scale, t.rope_scale);
    EXPECT_EQ(ag::models::parameter_count(c.model), ag::models::parameter_count(t));
  }
}

// Llama 3.1 / 3.2's configs as published carry rope_type "llama3"; both
// transformers generations' spellings read into the same scaling.
TEST(HfConfig, Llama3RopeScalingInBothSpellings) {
  const rope_scaling want{32.0f, 1.0f, 4.0f, 8192};
  hf_config v4 = parse_ok(with(llama_v4, R"("rope_scaling": {"factor": 32.0, "high_freq_factor": 4.0,
      "low_freq_factor": 1.0, "original_max_position_embeddings": 8192, "rope_type": "llama3"})"));
  EXPECT_EQ(v4.model.rope_scale, want);
  EXPECT_EQ(v4.model.rope_theta, 500000.0f);
  // Older 4.x files name the type "type".
  hf_config old = parse_ok(with(llama_v4, R"("rope_scaling": {"factor": 32.0, "high_freq_factor": 4.0,
      "low_freq_factor": 1.0, "original_max_position_embeddings": 8192, "type": "llama3"})"));
  EXPECT_EQ(old.model.rope_scale, want);
  hf_config v5 = parse_ok(with(llama_v5, R"("rope_parameters": {"rope_theta": 500000.0, "rope_type": "llama3",
      "factor": 32.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0, "original_max_position_embeddings": 8192})"));
  EXPECT_EQ(v5.model.rope_scale, want);
  EXPECT_EQ(v5.model.rope_theta, 500000.0f);
  EXPECT_FALSE(parse_ok(llama_v4).model.rope_scale.on()) << "rope_scaling null: plain RoPE";
}

// Linear scaling (position interpolation; LongChat-style checkpoints write
// {"type": "linear", "factor": 8.0}) in both generations' spellings, written
// back as transformers 4.x does; it needs a factor > 0.
TEST(HfConfig, LinearRopeScalingInBothSpellingsAndItsErrors) {
  rope_scaling want;
  want.kind = rope_scaling_kind::linear;
  want.factor = 8.0f;
  hf_config old = parse_ok(with(llama_v4, R"("rope_scaling": {"type": "linear", "factor": 8.0})"));
  EXPECT_EQ(old.model.rope_scale, want);
  hf_config v4 = parse_ok(with(llama_v4, R"("rope_scaling": {"rope_type": "linear", "factor": 8.0})"));
  EXPECT_EQ(v4.model.rope_scale, want);
  hf_config v5 = parse_ok(with(llama_v5, R"("rope_parameters": {"rope_theta": 500000.0, "rope_type": "linear",
      "factor": 8.0})"));
  EXPECT_EQ(v5.model.rope_scale, want);
  EXPECT_EQ(v5.model.rope_theta, 500000.0f);
  transformer_config t = v4.model;
  hf_config back = parse_ok(to_hf_config_json(t, 0));
  EXPECT_EQ(back.model.rope_scale, want) << "written and read back";
  expect_key_error(with(llama_v4, R"("rope_scaling": {"rope_type": "linear"})"), "rope_scaling.factor",
                   "rope_type \"linear\" needs a factor");
  expect_key_error(with(llama_v4, R"("rope_scaling": {"rope_type": "linear", "factor": -2})"), "rope_scaling.factor",
                   "must be a finite number > 0");
}
