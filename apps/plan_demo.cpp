// actorgraph-plan-demo: plans a transformer over simulated H100s and prints
// the plan (splits, copies, memory), then proves it with check_hazards.
//
//   actorgraph-plan-demo [--layers N] [--devices N] [--lanes N] [--d-model N]
//                        [--seq N] [--batch N] [--variant gpt2|llama]
//                        [--min-branch-us X] [--dot]
//
// Defaults: 12 layers, 4 devices, 1 lane, d_model 256 (small, so the
// weights the graph owns stay a few MiB).

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>

#include "graph/models/transformer.hpp"
#include "graph/plan.hpp"

namespace {

void usage() {
  std::fprintf(stderr,
               "usage: actorgraph-plan-demo [--layers N] [--devices N] [--lanes N] [--d-model N]\n"
               "                            [--seq N] [--batch N] [--variant gpt2|llama] [--min-branch-us X]\n"
               "                            [--dot]\n");
}

bool parse_int(const char* s, long long& out) {
  char* end = nullptr;
  out = std::strtoll(s, &end, 10);
  return end != s && *end == '\0';
}

}  // namespace

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
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--dot") { dot = true; continue; }
    if (a == "--help" || a == "-h") { usage(); return 0; }
    if (i + 1 >= argc) { usage(); return 2; }
    const char* v = argv[++i];
    long long n = 0;
    if (a == "--min-branch-us") {
      opt.min_branch_seconds = std::atof(v) * 1e-6;
      continue;
    }
    if (a == "--variant") {
      if (!ag::models::parse_variant(v, cfg.variant)) { std::fprintf(stderr, "unknown variant '%s'\n", v); return 2; }
      continue;
    }
    if (!parse_int(v, n) || n <= 0) { std::fprintf(stderr, "%s needs a positive integer, got '%s'\n", a.c_str(), v); return 2; }
    if (a == "--layers") cfg.n_layers = static_cast<int>(n);
    else if (a == "--devices") devices = static_cast<int>(n);
    else if (a == "--lanes") opt.lanes_per_device = static_cast<int>(n);
    else if (a == "--d-model") cfg.d_model = n, cfg.d_ff = 4 * n;
    else if (a == "--seq") cfg.seq_len = n;
    else if (a == "--batch") cfg.batch = n;
    else { usage(); return 2; }
  }

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
