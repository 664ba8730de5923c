#include "graph/checkpoint/hf_model.hpp"

#include <filesystem>
#include <fstream>
#include <set>
#include <span>

namespace ag::models {

namespace {

// Builder weight suffix -> HF suffix, per block.
constexpr std::pair<const char*, const char*> gpt2_block[] = {
    {"ln_1.w", "ln_1.weight"},           {"ln_1.b", "ln_1.bias"},
    {"attn.w_qkv", "attn.c_attn.weight"}, {"attn.b_qkv", "attn.c_attn.bias"},
    {"attn.w_proj", "attn.c_proj.weight"}, {"attn.b_proj", "attn.c_proj.bias"},
    {"ln_2.w", "ln_2.weight"},           {"ln_2.b", "ln_2.bias"},
    {"mlp.w_fc", "mlp.c_fc.weight"},     {"mlp.b_fc", "mlp.c_fc.bias"},
    {"mlp.w_proj", "mlp.c_proj.weight"}, {"mlp.b_proj", "mlp.c_proj.bias"},
};
constexpr std::pair<const char*, const char*> gpt2_global[] = {
    {"wte", "wte.weight"}, {"wpe", "wpe.weight"}, {"ln_f.w", "ln_f.weight"}, {"ln_f.b", "ln_f.bias"}};
constexpr std::pair<const char*, const char*> llama_block[] = {
    {"attn_norm.w", "input_layernorm.weight"},
    {"attn.wq", "self_attn.q_proj.weight"},
    {"attn.wk", "self_attn.k_proj.weight"},
    {"attn.wv", "self_attn.v_proj.weight"},
    {"attn.wo", "self_attn.o_proj.weight"},
    {"attn.bq", "self_attn.q_proj.bias"},  // attention_bias qkv (Qwen2) and qkv_o
    {"attn.bk", "self_attn.k_proj.bias"},
    {"attn.bv", "self_attn.v_proj.bias"},
    {"attn.bo", "self_attn.o_proj.bias"},  // qkv_o only
    {"attn.q_norm.w", "self_attn.q_norm.weight"},  // qk_norm (Qwen3)
    {"attn.k_norm.w", "self_attn.k_norm.weight"},
    {"mlp_norm.w", "post_attention_layernorm.weight"},
    {"mlp.w_gate", "mlp.gate_proj.weight"},
    {"mlp.w_up", "mlp.up_proj.weight"},
    {"mlp.w_down", "mlp.down_proj.weight"},
};
constexpr std::pair<const char*, const char*> llama_global[] = {{"embed_tokens", "embed_tokens.weight"},
                                                                {"norm.w", "norm.weight"}};

using name_pairs = std::span<const std::pair<const char*, const char*>>;

bool ends_with(const std::string& s, const std::string& tail) {
  return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}

// Buffers transformers saves in some checkpoints and ignores on load.
bool ignorable(const std::string& name, bool tied) {
  return ends_with(name, ".attn.bias") || ends_with(name, ".attn.masked_bias") ||
         ends_with(name, ".rotary_emb.inv_freq") || (tied && name == "lm_head.weight");
}

}  // namespace

std::string hf_tensor_name(model_variant variant, const std::string& name, const std::string& prefix) {
  if (name == "lm_head") return "lm_head.weight";
  const bool gpt2 = variant == model_variant::gpt2;
  for (const auto& [ours, theirs] : gpt2 ? name_pairs(gpt2_global) : name_pairs(llama_global))
    if (name == ours) return prefix + theirs;
  // "l<k>.<suffix>" -> "<prefix>h.<k-1>.<suffix'>" / "<prefix>layers.<k-1>.<suffix'>"
  if (name.size() < 3 || name[0] != 'l') return {};
  const auto dot = name.find('.');
  if (dot == std::string::npos || dot == 1) return {};
  int k = 0;
  for (std::size_t i = 1; i < dot; ++i) {
    if (name[i] < '0' || name[i] > '9' || k > 1'000'000) return {};
    k = k * 10 + (name[i] - '0');
  }
  if (k < 1) return {};
  const std::string suffix = name.substr(dot + 1);
  for (const auto& [ours, theirs] : gpt2 ? name_pairs(gpt2_block) : name_pairs(llama_block))
    if (suffix == ours) return prefix + (gpt2 ? "h." : "layers.") + std::to_string(k - 1) + "." + theirs;
  return {};
}

expected<hf_model> hf_model::open(const std::string& dir, load_options options) {
  std::error_code ec;
  if (!std::filesystem::is_directory(dir, ec))
    return error{errc::invalid_argument, dir + ": " + (std::filesystem::exists(dir, ec) ? "not a folder" : "no such folder") +
                                             " (a model folder holds config.json and model.safetensors)"};
  auto cfg = read_hf_config(dir);
  if (!cfg) return cfg.err();
  auto ck = checkpoint::open(dir);
  if (!ck) return ck.err();
  hf_model m;
  m.config_ = std::move(*cfg);
  m.checkpoint_ = std::move(*ck);
  const bool gpt2 = m.config_.model.variant == model_variant::gpt2;
  const std::string with = gpt2 ? "transformer." : "model.";
  const std::string embed = gpt2 ? "wte.weight" : "embed_tokens.weight";
  if (m.checkpoint_.find(with + embed).first) m.prefix_ = with;
  else if (m.checkpoint_.find(embed).first) m.prefix_ = "";
  else
    return error{errc::invalid_argument, m.checkpoint_.origin() + ": tensor '" + with + embed + "' (or '" + embed +
                                             "') is missing: is this a " + m.config_.model_type + " checkpoint?"};
  if (options.dtype) {
    m.dtype_ = *options.dtype;
  } else if (m.config_.dtype) {
    m.dtype_ = *m.config_.dtype;
  } else {
    auto [f, e] = m.checkpoint_.find(m.prefix_ + embed);
    m.dtype_ = e->type && *e->type != ag::dtype::i32 ? *e->type : ag::dtype::f32;
  }
  if (m.dtype_ == ag::dtype::i32)
    return error{errc::invalid_argument, dir + ": a model stores f32, f16 or bf16, not i32"};

  // Check everything now, by building the smallest graph: the provider below
  // names missing tensors, the builder wrong shapes and dtypes.
  std::set<std::string> used;
  int64_t bytes = 0;
  auto cfg1 = m.model_config(1, 1);
  auto g = build_transformer(cfg1, [&](const std::string& name, ag::dtype type,
                                       const ag::shape&) -> expected<weight_source_ptr> {
    const std::string hf = m.hf_name(name);
    if (hf.empty()) return error{errc::internal, "no Hugging Face name for builder weight '" + name + "'"};
    used.insert(hf);
    auto [f, e] = m.checkpoint_.find(hf);
    if (e) bytes += static_cast<int64_t>(e->bytes);
    return m.checkpoint_.weight(hf, type);
  });
  if (!g) return g.err();
  m.model_bytes_ = bytes;
  std::vector<std::string> extra;
  for (const auto& name : m.checkpoint_.names())
    if (!used.count(name) && !ignorable(name, cfg1.tied_head())) extra.push_back(name);
  if (!extra.empty()) {
    std::string list;
    for (std::size_t i = 0; i < extra.size() && i < 3; ++i) list += (i ? ", '" : "'") + extra[i] + "'";
    if (extra.size() > 3) list += " and " + std::to_string(extra.size() - 3) + " more";
    auto [f, e] = m.checkpoint_.find(extra[0]);
    return error{errc::invalid_argument, f->path() + ": tensor " + list + " is not part of a " +
                                             m.config_.model_type + " model as config.json describes it "
                                             "(a bias, layer or head the builder does not have?)"};
  }
  return m;
}

transformer_config hf_model::model_config(int64_t seq_len, int64_t batch) const {
  transformer_config c = config_.model;
  c.seq_len = seq_len;
  c.batch = batch;
  c.dtype = dtype_;
  return c;
}

std::string hf_model::hf_name(const std::string& name) const {
  return hf_tensor_name(config_.model.variant, name, prefix_);
}

expected<graph> hf_model::build(int64_t seq_len, int64_t batch) const {
  if (seq_len < 1 || batch < 1)
    return error{errc::invalid_argument, "build: seq_len " + std::to_string(seq_len) + " and batch " +
                                             std::to_string(batch) + " must be >= 1"};
  if (config_.model.variant == model_variant::gpt2 && seq_len > config_.max_positions)
    return error{errc::invalid_argument, config_.origin + ": " + std::to_string(seq_len) +
                                             " tokens exceed n_positions " + std::to_string(config_.max_positions)};
  return build_transformer(model_config(seq_len, batch),
                           [this](const std::string& name, ag::dtype type, const ag::shape&) {
                             return checkpoint_.weight(hf_name(name), type);
                           });
}

weight_provider hf_model::provider() const {
  return [this](const std::string& name, ag::dtype type, const ag::shape&) {
    return checkpoint_.weight(hf_name(name), type);
  };
}

expected<graph> load_model(const std::string& dir, int64_t seq_len, int64_t batch, load_options options) {
  auto m = hf_model::open(dir, options);
  if (!m) return m.err();
  return m->build(seq_len, batch);
}

error save_hf_model(const std::string& dir, const transformer_config& cfg, const graph& g, save_options options) {
  if (cfg.qk_norm && cfg.attn_bias == attention_bias::qkv)
    return error{errc::invalid_argument, dir + ": q/k norms with q/k/v biases but none on o is no Hugging Face "
                                               "architecture (Qwen3's attention_bias puts one on o too)"};
  if (cfg.sliding_window > 0 && cfg.attn_bias == attention_bias::qkv_o && !cfg.qk_norm)
    return error{errc::invalid_argument, dir + ": a sliding window with q/k/v/o biases is no Hugging Face "
                                               "architecture (Mistral's projections have no biases)"};
  const std::string prefix =
      cfg.variant == model_variant::gpt2 ? (options.gpt2_prefix ? "transformer." : "") : "model.";
  std::vector<named_weight> tensors;
  for (const node& n : g.nodes()) {
    if (n.op != op_kind::weight) continue;
    if (is_window_mask(n.name)) continue;  // a constant the builder makes, not the model's
    const std::string hf = hf_tensor_name(cfg.variant, n.name, prefix);
    if (hf.empty()) return error{errc::invalid_argument, dir + ": weight '" + n.name + "' has no Hugging Face name"};
    tensors.push_back({hf, n.data});
  }
  const std::filesystem::path d(dir);
  {
    std::ofstream out(d / "config.json", std::ios::trunc);
    out << to_hf_config_json(cfg, cfg.max_positions);
    if (!out) return error{errc::invalid_argument, (d / "config.json").string() + ": write failed"};
  }
  if (options.max_shard_bytes > 0) {
    auto n = save_safetensors_sharded(dir, tensors, options.max_shard_bytes);
    return n ? error{} : n.err();
  }
  return save_safetensors((d / "model.safetensors").string(), tensors, {{"format", "pt"}});
}

}  // namespace ag::models
