// model and graph: building the current graph (a transformer, or a custom
// graph from expressions), refused before building when it is too big.
#include <sstream>

#include "apps/repl/graph_expr.hpp"
#include "apps/repl/memory_budget.hpp"
#include "apps/repl/session_impl.hpp"
#include "graph/cost_model.hpp"

namespace ag::repl {

namespace {

// A graph file is a few lines; anything bigger is a mistake (`graph @/dev/zero`).
constexpr std::size_t max_graph_file_bytes = 1u << 20;

std::string model_text(const models::transformer_config& cfg) {
  std::string bias = cfg.attn_bias == models::attention_bias::qkv     ? " with q/k/v biases"
                    : cfg.attn_bias == models::attention_bias::qkv_o ? " with q/k/v/o biases"
                                                                     : "";
  if (cfg.qk_norm) bias += bias.empty() ? " with q/k norms" : " and q/k norms";
  if (cfg.sliding_window > 0)
    bias += (bias.empty() ? " with a sliding window of " : " and a sliding window of ") + std::to_string(cfg.sliding_window);
  return fmt("%s: %d layers, d %lld, %d heads%s%s%s, ff %lld, seq %lld, batch %lld, vocab %lld, %s", models::to_string(cfg.variant),
             cfg.n_layers, static_cast<long long>(cfg.d_model), cfg.n_heads,
             cfg.explicit_head_dim > 0 ? fmt(" of %lld", static_cast<long long>(cfg.head_dim())).c_str() : "",
             cfg.variant == models::model_variant::llama && cfg.kv_heads() != cfg.n_heads ? fmt(" (%d kv)", cfg.kv_heads()).c_str() : "",
             bias.c_str(),
             static_cast<long long>(cfg.d_ff), static_cast<long long>(cfg.seq_len), static_cast<long long>(cfg.batch),
             static_cast<long long>(cfg.vocab), ag::to_string(cfg.dtype));
}

}  // namespace

outcome session::impl::cmd_model(const command_line& c) {
  if (c.positional.size() != 1) return fail(bad_arg(c.positional.empty() ? "which model? gpt2 or llama" : "one model name expected"));
  models::transformer_config cfg;
  if (!models::parse_variant(c.positional[0].text, cfg.variant))
    return fail(bad_arg("unknown model '" + c.positional[0].text + "' (gpt2 or llama)"));
  // The REPL's default model: small enough to build and check in a second.
  cfg.n_layers = 12;
  cfg.d_model = 256;
  cfg.n_heads = 8;
  cfg.d_ff = 1024;
  cfg.seq_len = 64;
  cfg.batch = 1;
  cfg.vocab = 512;
  params p(c);
  auto geti = [&](const char* k, int64_t lo, int64_t hi, auto& field) -> error {
    auto v = p.get_int(k, lo, hi);
    if (!v) return v.err();
    if (*v) field = static_cast<std::remove_reference_t<decltype(field)>>(**v);
    return {};
  };
  int64_t sd = static_cast<int64_t>(cfg.seed);
  for (error e : {geti("layers", 1, 4096, cfg.n_layers), geti("d", 1, 1 << 16, cfg.d_model), geti("heads", 1, 1024, cfg.n_heads),
                  geti("kv", 0, 1024, cfg.n_kv_heads), geti("head_dim", 0, 1 << 12, cfg.explicit_head_dim),
                  geti("ff", 1, 1 << 18, cfg.d_ff), geti("seq", 1, 1 << 16, cfg.seq_len),
                  geti("batch", 1, 4096, cfg.batch), geti("vocab", 1, 1 << 22, cfg.vocab), geti("seed", 0, INT64_MAX, sd)})
    if (e) return fail(e);
  cfg.seed = static_cast<uint64_t>(sd);
  if (auto t = p.raw("dtype"); t && !parse_dtype(t->c_str(), cfg.dtype))
    return fail(bad_arg("dtype: '" + *t + "' is not one of f32, f16, bf16"));
  if (auto e = geti("qk_norm", 0, 1, cfg.qk_norm)) return fail(e);
  if (auto e = geti("window", 0, 1 << 20, cfg.sliding_window)) return fail(e);
  if (auto b = p.raw("bias"); b && !models::parse_attention_bias(*b, cfg.attn_bias))
    return fail(bad_arg("bias: '" + *b + "' is not one of none, qkv (Qwen2's), qkv_o (LLaMA's attention_bias)"));
  if (auto e = p.finish()) return fail(e);
  if (cfg.dtype == dtype::i32) return fail(bad_arg("dtype: i32 cannot hold weights (f32, f16 or bf16)"));
  if (auto e = models::validate(cfg)) return fail(bad_arg(e.message));
  // Building draws every weight: refuse sizes that would take minutes.
  const int64_t params_n = models::parameter_count(cfg);
  const double weight_bytes = static_cast<double>(params_n) * static_cast<double>(dtype_size(cfg.dtype));
  if (weight_bytes > host_weight_limit())
    return fail(bad_arg(fmt("%.2f G parameters (%s of weights) is too big to build on this host (%s of memory; the REPL builds "
                            "weights up to a quarter of it)",
                            static_cast<double>(params_n) / 1e9, bytes_text(weight_bytes).c_str(), bytes_text(host_memory_bytes()).c_str())),
                false);
  auto gr = models::build_transformer(cfg);
  if (!gr) return fail(gr.err(), false);
  hf.reset();
  tok.reset();
  tcfg = cfg;
  set_graph(std::make_shared<const graph>(std::move(*gr)), model_text(cfg));
  out << fmt("model %s\n  %.2f M parameters, %s of weights, %zu nodes, %.3f GFLOP per job\n", model_desc.c_str(),
             static_cast<double>(params_n) / 1e6, bytes_text(static_cast<double>(g->weight_bytes())).c_str(), g->size(), model_flops / 1e9);
  return {};
}

void session::impl::set_graph(std::shared_ptr<const graph> ng, std::string desc) {
  g = std::move(ng);
  model_desc = std::move(desc);
  gen.reset();
  plan_ptr.reset();
  model_flops = 0;
  for (const node& n : g->nodes()) model_flops += cost_of(*g, n).flops;
}

outcome session::impl::cmd_graph(const command_line& c) {
  const std::string& text = c.rest;
  const auto first = text.find_first_not_of(" \t");
  if (first == std::string::npos) return fail(bad_arg("no expression"));
  graph_expr_limits limits;
  limits.max_weight_bytes = host_weight_limit();
  if (text[first] == '@') {
    std::string path = text.substr(first + 1);
    path.erase(path.find_last_not_of(" \t") + 1);
    auto file = read_text_file(path, max_graph_file_bytes);
    if (!file) return fail(file.err(), false);
    // '#' starts a comment in a file; blanking it keeps the columns.
    std::string all;
    std::istringstream lines(*file);
    for (std::string l; std::getline(lines, l);) {
      if (const auto h = l.find('#'); h != std::string::npos) l.replace(h, std::string::npos, l.size() - h, ' ');
      all += l + "\n";
    }
    auto gr = graph_from_expr(all, seed, 0, limits);
    if (!gr) return fail(error(gr.err().code, path + ": " + gr.err().message));
    return adopt_graph(std::move(*gr), path);
  }
  auto gr = graph_from_expr(text, seed, c.rest_pos, limits);
  if (!gr) return fail(gr.err());
  return adopt_graph(std::move(*gr), "custom graph");
}

outcome session::impl::adopt_graph(graph gr, const std::string& what) {
  // Shapes the builder accepted but whose bytes no 64-bit count holds
  // (a matmul of two huge inputs): refused before anything is planned.
  if (auto e = check_node_sizes(gr)) return fail(bad_arg("graph: " + e.message), false);
  tcfg.reset();
  auto sp = std::make_shared<const graph>(std::move(gr));
  std::string io;
  for (node_id id : sp->inputs()) io += " " + sp->at(id).name + sp->at(id).dims.to_string();
  io += " ->";
  for (node_id id : sp->outputs()) io += " " + sp->at(id).name + sp->at(id).dims.to_string();
  set_graph(sp, what + ":" + io);
  out << fmt("graph %s\n  %zu nodes, %s of weights, %.3f MFLOP per job\n", model_desc.c_str(), g->size(),
             bytes_text(static_cast<double>(g->weight_bytes())).c_str(), model_flops / 1e6);
  return {};
}

}  // namespace ag::repl
