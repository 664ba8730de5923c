// actorgraph-save-model: writes a random-init transformer as a Hugging Face
// model folder (config.json + model.safetensors, or shards), for load
// benchmarks, demos and scripts that need a checkpoint without PyTorch.
//
//   actorgraph-save-model --out DIR [--shape tiny-gpt2|tiny-llama|tiny-qwen2|gpt2-124m|llama-1b|llama3.2-1b|
//                                    llama2-7b|llama3.1-8b|qwen2.5-0.5b|qwen3-0.6b]
//                         [--dtype f32|f16|bf16] [--layers N] [--seed N] [--shard-mb N]
//                         [--d-model N] [--d-ff N] [--heads N] [--kv-heads N] [--head-dim N] [--vocab N]
//                         [--attention-bias none|qkv|qkv_o] [--sliding-window N]   (--help)
//
// llama-1b is the decode benchmark's shape (16 layers, d 2048, ff 8192, 32
// heads, 8 kv heads, vocab 32000; bf16 by default: 2.2 GB); llama3.2-1b is
// Llama 3.2 1B's (the same widths, vocab 128,256, a tied head, Llama 3's RoPE
// scaling: 2.5 GB); llama2-7b and llama3.1-8b are LLaMA-2 7B's and Llama
// 3.1 8B's (13.5 and 16 GB; --layers for a slice of them). The width flags
// change the shape's (--head-dim: heads of another width than d_model /
// heads, LLaMA only, as Mistral NeMo's). qwen2.5-0.5b is Qwen2.5-0.5B's
// shape (q/k/v biases, written as a Qwen2 config; 1 GB in bf16), qwen3-0.6b
// Qwen3-0.6B's (q/k norms, heads of 128 on d 1024; 1.2 GB);
// --attention-bias sets the biases of another LLaMA shape. Prints the folder, the bytes written
// and the time it took.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>

#include "apps/common/flags.hpp"
#include "graph/models/transformer.hpp"
#include "graph/checkpoint/hf_model.hpp"

namespace {

bool shape_named(const std::string& name, ag::models::transformer_config& c) {
  using ag::models::model_variant;
  c = {};
  c.initializer_range = 0.02f;
  if (name == "tiny-gpt2") {
    c.variant = model_variant::gpt2;
    c.n_layers = 2, c.d_model = 64, c.n_heads = 4, c.d_ff = 256, c.vocab = 300, c.max_positions = 128;
  } else if (name == "tiny-llama") {
    c.variant = model_variant::llama;
    c.n_layers = 2, c.d_model = 64, c.n_heads = 4, c.n_kv_heads = 2, c.d_ff = 160, c.vocab = 300;
  } else if (name == "tiny-qwen2") {
    c.variant = model_variant::llama;
    c.n_layers = 2, c.d_model = 64, c.n_heads = 4, c.n_kv_heads = 2, c.d_ff = 160, c.vocab = 300;
    c.attn_bias = ag::models::attention_bias::qkv;
    c.head = ag::models::head_tying::tied;
  } else if (name == "qwen2.5-0.5b") {  // Qwen2.5-0.5B's shape: q/k/v biases, a tied head (494 M parameters)
    c.variant = model_variant::llama;
    c.n_layers = 24, c.d_model = 896, c.n_heads = 14, c.n_kv_heads = 2, c.d_ff = 4864, c.vocab = 151936;
    c.attn_bias = ag::models::attention_bias::qkv;
    c.head = ag::models::head_tying::tied;
    c.rope_theta = 1000000.0f;
    c.eps = 1e-6f;
    c.dtype = ag::dtype::bf16;
  } else if (name == "qwen3-0.6b") {  // Qwen3-0.6B's shape: 16 heads of 128 on d 1024, q/k norms, a tied head (596 M)
    c.variant = model_variant::llama;
    c.n_layers = 28, c.d_model = 1024, c.n_heads = 16, c.n_kv_heads = 8, c.d_ff = 3072, c.vocab = 151936;
    c.explicit_head_dim = 128;
    c.qk_norm = true;
    c.head = ag::models::head_tying::tied;
    c.rope_theta = 1000000.0f;
    c.eps = 1e-6f;
    c.dtype = ag::dtype::bf16;
  } else if (name == "gpt2-124m") {
    c = ag::models::transformer_config::gpt2_124m();
  } else if (name == "llama-1b") {
    c.variant = model_variant::llama;
    c.n_layers = 16, c.d_model = 2048, c.n_heads = 32, c.n_kv_heads = 8, c.d_ff = 8192, c.vocab = 32000;
    c.rope_theta = 500000.0f;
    c.dtype = ag::dtype::bf16;
  } else if (name == "llama3.2-1b") {  // Llama 3.2 1B's shape, RoPE scaling and tied head
    c.variant = model_variant::llama;
    c.n_layers = 16, c.d_model = 2048, c.n_heads = 32, c.n_kv_heads = 8, c.d_ff = 8192, c.vocab = 128256;
    c.rope_theta = 500000.0f;
    c.rope_scale = {32.0f, 1.0f, 4.0f, 8192};
    c.head = ag::models::head_tying::tied;
    c.dtype = ag::dtype::bf16;
  } else if (name == "llama2-7b") {  // LLaMA-2 7B's shape (multi-head attention, d_ff 11008; 13.5 GB in bf16)
    c.variant = model_variant::llama;
    c.n_layers = 32, c.d_model = 4096, c.n_heads = 32, c.n_kv_heads = 32, c.d_ff = 11008, c.vocab = 32000;
    c.dtype = ag::dtype::bf16;
  } else if (name == "llama3.1-8b") {  // Llama 3.1 8B's shape and RoPE scaling (16 GB in bf16)
    c.variant = model_variant::llama;
    c.n_layers = 32, c.d_model = 4096, c.n_heads = 32, c.n_kv_heads = 8, c.d_ff = 14336, c.vocab = 128256;
    c.rope_theta = 500000.0f;
    c.rope_scale = {8.0f, 1.0f, 4.0f, 8192};
    c.dtype = ag::dtype::bf16;
  } else {
    return false;
  }
  c.seq_len = 1;
  c.batch = 1;
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  std::string out, shape = "tiny-gpt2", dtype, bias;
  int layers = 0, heads = 0, kv_heads = 0;
  int64_t d_model = 0, d_ff = 0, head_dim = 0, vocab = 0;
  uint64_t seed = 1;
  int64_t shard_mb = 0;
  ag::apps::flags app("actorgraph-save-model",
                      "Writes a random-init transformer as a Hugging Face model folder (config.json + "
                      "model.safetensors or shards).");
  app.add_option("--out", out, "the folder to write (made if missing)")->required();
  app.add_option("--shape", shape,
                 "llama-1b: 16 layers, d 2048, ff 8192, 32 heads, 8 kv heads, vocab 32000, bf16; llama3.2-1b: "
                 "the same with vocab 128256, a tied head and Llama 3's RoPE scaling; llama3.1-8b: 32 layers, d 4096, "
                 "ff 14336, 32 heads, 8 kv heads, vocab 128256, Llama 3.1's RoPE scaling (16 GB: --layers N for fewer); "
                 "llama2-7b: 32 layers, d 4096, ff 11008, 32 heads, vocab 32000; qwen2.5-0.5b: 24 layers, d 896, ff 4864, "
                 "14 heads, 2 kv heads, vocab 151936, q/k/v biases, a tied head, bf16; qwen3-0.6b: 28 layers, d 1024, "
                 "16 heads of 128, 8 kv heads, ff 3072, q/k norms, a tied head, bf16")
      ->check(CLI::IsMember({"tiny-gpt2", "tiny-llama", "tiny-qwen2", "gpt2-124m", "llama-1b", "llama3.2-1b", "llama2-7b",
                             "llama3.1-8b", "qwen2.5-0.5b", "qwen3-0.6b"}));
  app.add_option("--dtype", dtype, "f32, f16 or bf16 (default: the shape's)")->check(CLI::IsMember({"", "f32", "f16", "bf16"}));
  app.add_option("--layers", layers, "layers (0: the shape's)")->check(CLI::Range(0, 1000));
  app.add_option("--seed", seed, "seed of the random weights");
  app.add_option("--shard-mb", shard_mb, "shards of at most this many MB (0: one file)")->check(CLI::NonNegativeNumber);
  app.add_option("--d-model", d_model, "d_model (0: the shape's)")->check(CLI::NonNegativeNumber);
  app.add_option("--d-ff", d_ff, "the MLP's width (0: the shape's)")->check(CLI::NonNegativeNumber);
  app.add_option("--heads", heads, "attention heads (0: the shape's)")->check(CLI::NonNegativeNumber);
  app.add_option("--kv-heads", kv_heads, "LLaMA: key/value heads (0: the shape's)")->check(CLI::NonNegativeNumber);
  app.add_option("--head-dim", head_dim, "LLaMA: each head's width (0: d_model / heads)")->check(CLI::NonNegativeNumber);
  app.add_option("--vocab", vocab, "vocabulary (0: the shape's)")->check(CLI::NonNegativeNumber);
  app.add_option("--attention-bias", bias,
                 "LLaMA: biases of the attention's projections: none, qkv (written as a Qwen2 model) or qkv_o "
                 "(LLaMA's attention_bias; default: the shape's)")
      ->check(CLI::IsMember({"", "none", "qkv", "qkv_o"}));
  int64_t sliding_window = -1;
  app.add_option("--sliding-window", sliding_window,
                 "LLaMA: every layer's sliding window (written as a Mistral model, or a Qwen2 / Qwen3 one with "
                 "use_sliding_window); 0: none (default: the shape's)")
      ->check(CLI::NonNegativeNumber);
  if (auto status = ag::apps::parse_flags(app, argc, argv)) return *status;
  ag::models::transformer_config c;
  shape_named(shape, c);
  if (!dtype.empty()) ag::parse_dtype(dtype.c_str(), c.dtype);
  if (layers > 0) c.n_layers = layers;
  if (d_model > 0) c.d_model = d_model;
  if (d_ff > 0) c.d_ff = d_ff;
  if (heads > 0) c.n_heads = heads;
  if (kv_heads > 0) c.n_kv_heads = kv_heads;
  if (head_dim > 0) c.explicit_head_dim = head_dim;
  if (vocab > 0) c.vocab = vocab;
  if (!bias.empty()) ag::models::parse_attention_bias(bias, c.attn_bias);
  if (sliding_window >= 0) c.sliding_window = sliding_window;
  c.seed = seed;
  const auto t0 = std::chrono::steady_clock::now();
  std::error_code ec;
  std::filesystem::create_directories(out, ec);
  if (ec) {
    std::fprintf(stderr, "error: cannot make the folder %s: %s\n", out.c_str(), ec.message().c_str());
    return 1;
  }
  auto g = ag::models::build_transformer(c);
  if (!g) {
    std::fprintf(stderr, "error: %s\n", g.err().to_string().c_str());
    return 1;
  }
  if (auto e = ag::models::save_hf_model(out, c, *g, {.max_shard_bytes = shard_mb * 1000000})) {
    std::fprintf(stderr, "error: %s\n", e.to_string().c_str());
    return 1;
  }
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("saved %s (%s, %lld parameters, %lld bytes) to %s in %.1f s\n", shape.c_str(),
              ag::to_string(c.dtype), static_cast<long long>(ag::models::parameter_count(c)),
              static_cast<long long>(g->weight_bytes()), out.c_str(), s);
  return 0;
}
