// dump_transformer <out_dir>: builds small models with build_transformer,
// evaluates them with the reference evaluator and writes, for each model, a
// folder <out_dir>/<case>/ with
//   index.json   the config and one entry per tensor: name, kind, dtype, shape, file
//   <n>.bin      raw little-endian data: weights and logits as f32, tokens and
//                positions as i32
// for tests/models/transformer_ref.py to recompute the logits independently.
// Exit status 0 on success; errors go to stderr.

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include "graph/models/transformer.hpp"
#include "graph/reference.hpp"

namespace {

namespace fs = std::filesystem;
using ag::models::model_variant;
using ag::models::transformer_config;

struct named_config {
  const char* name;
  transformer_config cfg;
  int position_offset = 0;  ///< positions are offset..offset+seq_len-1
};

std::vector<named_config> cases() {
  transformer_config base;
  base.n_layers = 2;
  base.d_model = 64;
  base.n_heads = 4;
  base.d_ff = 128;
  base.vocab = 97;
  base.seq_len = 12;
  base.batch = 2;
  base.seed = 7;
  // Sharp attention and O(1) activations: at HF's 0.02 attention is nearly
  // uniform and tanh- vs erf-GELU differ by less than the tolerance.
  base.initializer_range = 0.25f;
  std::vector<named_config> out;
  auto gpt2 = base;
  gpt2.variant = model_variant::gpt2;
  gpt2.max_positions = 20;  // more rows than positions used, as in a real wpe
  out.push_back({"gpt2", gpt2, 0});
  out.push_back({"gpt2_offset", gpt2, 5});
  auto llama = base;
  llama.variant = model_variant::llama;
  llama.eps = 1e-6f;
  llama.rope_theta = 10000.0f;
  out.push_back({"llama", llama, 0});
  auto gqa = llama;
  gqa.n_kv_heads = 2;
  gqa.rope_theta = 500000.0f;
  gqa.d_ff = 96;
  out.push_back({"llama_gqa", gqa, 3});
  // Heads wider than d_model / n_heads (HF's head_dim, as Mistral NeMo's):
  // q is [4 x 24, 64], o [64, 96].
  auto wide = gqa;
  wide.explicit_head_dim = 24;
  out.push_back({"llama_wide_heads", wide, 1});
  // Qwen2's q/k/v biases, and LLaMA's attention_bias (o's too).
  auto qwen2 = gqa;
  qwen2.attn_bias = ag::models::attention_bias::qkv;
  out.push_back({"qwen2_qkv_bias", qwen2, 2});
  auto llama_bias = llama;
  llama_bias.attn_bias = ag::models::attention_bias::qkv_o;
  out.push_back({"llama_attention_bias", llama_bias, 0});
  // Qwen3's RMSNorm over each head's q and k before RoPE, on heads of 24.
  auto qwen3 = wide;
  qwen3.qk_norm = true;
  out.push_back({"qwen3_qk_norm", qwen3, 4});
  // Mistral's sliding window: 5 keys over 12 positions.
  auto mistral = gqa;
  mistral.sliding_window = 5;
  out.push_back({"mistral_sliding_window", mistral, 0});
  return out;
}

std::string shape_json(const ag::shape& s) {
  std::string r = "[";
  for (int i = 0; i < s.rank(); ++i) r += (i ? ", " : "") + std::to_string(s[i]);
  return r + "]";
}

// Writes t as f32 (floats) or i32 (ints), little-endian (the hosts we run on).
bool write_tensor(const fs::path& file, const ag::host_tensor& t) {
  std::ofstream f(file, std::ios::binary);
  if (t.type() == ag::dtype::i32) {
    f.write(reinterpret_cast<const char*>(t.data()), static_cast<std::streamsize>(t.bytes()));
  } else {
    const auto v = t.to_floats();
    f.write(reinterpret_cast<const char*>(v.data()), static_cast<std::streamsize>(v.size() * sizeof(float)));
  }
  return static_cast<bool>(f);
}

int dump(const fs::path& dir, const named_config& nc) {
  const auto& c = nc.cfg;
  auto g = ag::models::build_transformer(c);
  if (!g) {
    std::cerr << nc.name << ": build_transformer: " << g.err().to_string() << "\n";
    return 1;
  }
  auto inputs = ag::models::transformer_inputs(c, c.seed + 100);
  for (int64_t i = 0; i < c.seq_len; ++i) inputs[1].set(i, static_cast<float>(i + nc.position_offset));
  auto out = ag::evaluate_reference(*g, inputs);
  if (!out) {
    std::cerr << nc.name << ": evaluate_reference: " << out.err().to_string() << "\n";
    return 1;
  }
  fs::create_directories(dir);
  std::ostringstream idx;
  idx.precision(9);
  idx << "{\n  \"variant\": \"" << ag::models::to_string(c.variant) << "\",\n"
      << "  \"n_layers\": " << c.n_layers << ", \"d_model\": " << c.d_model << ", \"n_heads\": " << c.n_heads
      << ", \"n_kv_heads\": " << c.kv_heads() << ", \"head_dim\": " << c.head_dim() << ", \"d_ff\": " << c.d_ff << ", \"vocab\": " << c.vocab
      << ", \"seq_len\": " << c.seq_len << ", \"batch\": " << c.batch << ",\n"
      << "  \"eps\": " << c.eps << ", \"rope_theta\": " << c.rope_theta << ", \"sliding_window\": " << c.sliding_window
      << ",\n  \"tensors\": [\n";
  int file_no = 0;
  bool first = true;
  auto entry = [&](const std::string& name, const char* kind, const ag::host_tensor& t) {
    const std::string file = std::to_string(file_no++) + ".bin";
    if (!write_tensor(dir / file, t)) return false;
    idx << (first ? "" : ",\n") << "    {\"name\": \"" << name << "\", \"kind\": \"" << kind << "\", \"dtype\": \""
        << (t.type() == ag::dtype::i32 ? "i32" : "f32") << "\", \"shape\": " << shape_json(t.dims())
        << ", \"file\": \"" << file << "\"}";
    first = false;
    return true;
  };
  bool ok = true;
  for (const auto& n : g->nodes())
    if (n.op == ag::op_kind::weight) ok = ok && entry(n.name, "weight", *n.data->in_memory());
  ok = ok && entry("tokens", "input", inputs[0]) && entry("positions", "input", inputs[1]);
  ok = ok && entry("logits", "output", (*out)[0]);
  idx << "\n  ]\n}\n";
  std::ofstream(dir / "index.json") << idx.str();
  if (!ok) {
    std::cerr << nc.name << ": could not write into " << dir << "\n";
    return 1;
  }
  std::cout << nc.name << ": " << ag::models::parameter_count(c) << " parameters, " << g->size()
            << " nodes -> " << dir.string() << "\n";
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::cerr << "usage: dump_transformer <out_dir>\n";
    return 2;
  }
  int rc = 0;
  for (const auto& nc : cases()) rc |= dump(fs::path(argv[1]) / nc.name, nc);
  return rc;
}
