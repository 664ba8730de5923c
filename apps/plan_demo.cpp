// actorgraph-plan-demo: plans a transformer over simulated H100s and prints
// the plan (splits, copies, memory), then proves it with check_hazards.
//
//   actorgraph-plan-demo [--layers N] [--devices N] [--lanes N] [--d-model N]
//                        [--seq N] [--batch N] [--variant gpt2|llama]
//                        [--min-branch-us X] [--dot]      (--help: defaults)
//
// Defaults: 12 layers, 4 devices, 1 lane, d_model 256 (small, so the
// weights the graph owns stay a few MiB).

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>

#include "apps/common/flags.hpp"
#include "graph/models/transformer.hpp"
#include "graph/plan.hpp"

int main(int argc, char** argv) {
  ag::models::transformer_config cfg;
  cfg.n_layers = 12;
  cfg.d_model = 256;
  cfg.n_heads = 8;
  cfg.d_ff = 1024;
  cfg.vocab = 1000;
  cfg.seq_len = 64;
  cfg.batch = 4;
  int devices = 4;
  ag::plan_options opt;
  bool dot = false;
  std::string variant = "gpt2";
  double min_branch_us = opt.min_branch_seconds * 1e6;
  ag::apps::flags app("actorgraph-plan-demo",
                                      "actorgraph-plan-demo: plans a transformer over simulated H100s, prints the plan "
                                      "and proves it with check_hazards");
  const auto positive = CLI::Range(1, 1 << 30);
  app.add_option("--layers", cfg.n_layers)->check(positive);
  app.add_option("--devices", devices, "simulated H100s to plan over")->check(CLI::Range(1, 1024));
  app.add_option("--lanes", opt.lanes_per_device, "compute lanes per device")->check(CLI::Range(1, 64));
  app.add_option("--d-model", cfg.d_model, "model width (the MLP is 4x as wide)")->check(positive);
  app.add_option("--seq", cfg.seq_len)->check(positive);
  app.add_option("--batch", cfg.batch)->check(positive);
  app.add_option("--variant", variant)->check(CLI::IsMember({"gpt2", "llama"}));
  app.add_option("--min-branch-us", min_branch_us, "plan_options::min_branch_seconds, in us")->check(CLI::NonNegativeNumber);
  app.add_flag("--dot", dot, "print the plan as DOT instead");
  if (auto status = ag::apps::parse_flags(app, argc, argv)) return *status;
  if (ag::apps::given(app, "--d-model")) cfg.d_ff = 4 * cfg.d_model;
  ag::models::parse_variant(variant, cfg.variant);
  opt.min_branch_seconds = min_branch_us * 1e-6;

  auto g = ag::models::build_transformer(cfg);
  if (!g) { std::fprintf(stderr, "build_transformer: %s\n", g.err().to_string().c_str()); return 1; }
  auto gp = std::make_shared<const ag::graph>(std::move(*g));

  std::vector<ag::device_spec> specs(static_cast<std::size_t>(devices));  // defaults model an H100 SXM
  for (int i = 0; i < devices; ++i) {
    specs[static_cast<std::size_t>(i)].name = "h100-" + std::to_string(i);
    specs[static_cast<std::size_t>(i)].ordinal = i;
  }
  auto p = ag::compile(gp, specs, opt);
  if (!p) { std::fprintf(stderr, "compile: %s\n", p.err().to_string().c_str()); return 1; }
  const ag::plan& pl = **p;
  if (dot) {
    std::fputs(pl.to_dot().c_str(), stdout);
    return 0;
  }
  std::printf("%s %d layers, d_model %lld, seq %lld x batch %lld: %zu nodes, %.1f MiB weights\n",
              ag::models::to_string(cfg.variant), cfg.n_layers, static_cast<long long>(cfg.d_model),
              static_cast<long long>(cfg.seq_len), static_cast<long long>(cfg.batch), gp->size(),
              static_cast<double>(gp->weight_bytes()) / (1 << 20));
  std::fputs(pl.describe().c_str(), stdout);
  const ag::error e = ag::check_hazards(pl);
  std::printf("hazard check: %s\n", e.ok() ? "ok" : e.to_string().c_str());
  double worst = 0, total = 0;
  for (int d : pl.used_devices()) {
    worst = std::max(worst, pl.est_seconds(d));
    total += pl.est_seconds(d);
  }
  std::printf("est_stage_max_us: %.1f\nest_compute_total_us: %.1f\nbytes_moved: %lld\n", worst * 1e6, total * 1e6,
              static_cast<long long>(pl.bytes_moved()));
  return e.ok() ? 0 : 1;
}
