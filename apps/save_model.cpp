// actorgraph-save-model: writes a random-init transformer as a Hugging Face
// model folder (config.json + model.safetensors, or shards), for load
// benchmarks, demos and scripts that need a checkpoint without PyTorch.
//
//   actorgraph-save-model --out DIR [--shape tiny-gpt2|tiny-llama|gpt2-124m|llama-1b]
//                         [--dtype f32|f16|bf16] [--layers N] [--seed N] [--shard-mb N]
//
// llama-1b is the decode benchmark's shape (16 layers, d 2048, ff 8192, 32
// heads, 8 kv heads, vocab 32000; bf16 by default: 2.2 GB). Prints the folder,
// the bytes written and the time it took.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>

#include "graph/models/transformer.hpp"
#include "models/hf_model.hpp"

namespace {

void usage(FILE* to) {
  std::fputs(
      "usage: actorgraph-save-model --out DIR [--shape tiny-gpt2|tiny-llama|gpt2-124m|llama-1b]\n"
      "                             [--dtype f32|f16|bf16] [--layers N] [--seed N] [--shard-mb N]\n",
      to);
}

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
  } else if (name == "gpt2-124m") {
    c = ag::models::transformer_config::gpt2_124m();
  } else if (name == "llama-1b") {
    c.variant = model_variant::llama;
    c.n_layers = 16, c.d_model = 2048, c.n_heads = 32, c.n_kv_heads = 8, c.d_ff = 8192, c.vocab = 32000;
    c.rope_theta = 500000.0f;
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
  std::string out, shape = "tiny-gpt2", dtype;
  long layers = 0, seed = 1, shard_mb = 0;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--help" || a == "-h") {
      usage(stdout);
      return 0;
    }
    if (i + 1 >= argc) {
      std::fprintf(stderr, "actorgraph-save-model: %s needs a value\n", a.c_str());
      return 2;
    }
    const std::string v = argv[++i];
    if (a == "--out") out = v;
    else if (a == "--shape") shape = v;
    else if (a == "--dtype") dtype = v;
    else if (a == "--layers") layers = std::strtol(v.c_str(), nullptr, 10);
    else if (a == "--seed") seed = std::strtol(v.c_str(), nullptr, 10);
    else if (a == "--shard-mb") shard_mb = std::strtol(v.c_str(), nullptr, 10);
    else {
      std::fprintf(stderr, "actorgraph-save-model: unknown flag %s\n", a.c_str());
      usage(stderr);
      return 2;
    }
  }
  ag::models::transformer_config c;
  if (out.empty() || !shape_named(shape, c)) {
    usage(stderr);
    return 2;
  }
  if (!dtype.empty() && (!ag::parse_dtype(dtype.c_str(), c.dtype) || c.dtype == ag::dtype::i32)) {
    std::fprintf(stderr, "actorgraph-save-model: --dtype wants f32, f16 or bf16\n");
    return 2;
  }
  if (layers > 0) c.n_layers = static_cast<int>(layers);
  c.seed = static_cast<uint64_t>(seed);
  const auto t0 = std::chrono::steady_clock::now();
  std::error_code ec;
  std::filesystem::create_directories(out, ec);
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
