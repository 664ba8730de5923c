// actorgraph-tp-bench: tensor-parallel figures.
//   tp_plan_ms_64            compile wall time (median of --repeats; the table
//                            also shows CPU time, which a loaded machine does
//                            not inflate) of an 8 x 8
//                            pipeline x tensor plan of an 80-layer LLaMA (d 8192,
//                            64 heads, 8 kv heads, ff 28672, vocab 32000, T 2048,
//                            bf16) over 64 simulated H200s, its weights as shapes
//                            only (the model is never materialised)
//   tp_weight_bytes_ratio_4  largest per-device weight bytes of a 12-layer LLaMA
//                            (d 4096, 32 heads, 8 kv heads, ff 14336, vocab 32000)
//                            planned at tensor-parallel degree 4, over its
//                            1-device plan's
// The runtime figures (tp_speedup_*_sim, tp_overlap_gain_4_sim, allreduce_us_*)
// need collectives in the runtime and are not printed yet.
// Flags (--name=value): --repeats=3 --layers=80 (of the 64-device plan)
//   --devices=SPEC (for the runtime figures; the planning figures always use
//   simulated H200 specs).
// Prints a table, then `name: value` lines.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "graph/models/transformer.hpp"
#include "graph/plan.hpp"

namespace {

std::map<std::string, std::string> parse_flags(int argc, char** argv) {
  std::map<std::string, std::string> f;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a.rfind("--", 0) != 0) continue;
    const auto eq = std::find(a.begin(), a.end(), '=');
    std::string key(a.begin() + 2, eq);
    f[key] = eq == a.end() ? std::string("1") : std::string(eq + 1, a.end());
  }
  return f;
}

int flag(const std::map<std::string, std::string>& f, const std::string& k, int def) {
  auto it = f.find(k);
  return it == f.end() ? def : std::atoi(it->second.c_str());
}

[[noreturn]] void die(const std::string& what, const ag::error& e) {
  std::fprintf(stderr, "actorgraph-tp-bench: %s: %s\n", what.c_str(), e.to_string().c_str());
  std::exit(1);
}

/// A simulated H200 (figures from ../shared/DESIGN.md: NVLink one way 396 GB/s,
/// NCCL all-reduce 1 MiB in 29 us over 4 GPUs, i.e. ~4 us per ring step).
ag::device_spec h200(int i) {
  ag::device_spec d;
  d.name = "sim" + std::to_string(i);
  d.ordinal = i;
  d.flops_f32 = 67e12;
  d.flops_bf16 = 989e12;
  d.mem_bandwidth = 4.8e12;
  d.mem_bytes = int64_t{141} << 30;
  d.link_bandwidth = 396e9;
  d.collective_latency = 4e-6;
  return d;
}

std::vector<ag::device_spec> h200s(int n) {
  std::vector<ag::device_spec> v;
  for (int i = 0; i < n; ++i) v.push_back(h200(i));
  return v;
}

std::shared_ptr<const ag::graph> build(const ag::models::transformer_config& c) {
  auto g = ag::models::build_transformer(c);
  if (!g) die("build", g.err());
  return std::make_shared<const ag::graph>(std::move(*g));
}

double ms_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

std::string gib(int64_t b) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f GiB", static_cast<double>(b) / (1LL << 30));
  return buf;
}

}  // namespace

int main(int argc, char** argv) {
  const auto flags = parse_flags(argc, argv);
  const int repeats = std::max(1, flag(flags, "repeats", 3));
  const int layers = std::max(1, flag(flags, "layers", 80));

  // tp_plan_ms_64
  ag::models::transformer_config big;
  big.variant = ag::models::model_variant::llama;
  big.n_layers = layers;
  big.d_model = 8192;
  big.n_heads = 64;
  big.n_kv_heads = 8;
  big.d_ff = 28672;
  big.vocab = 32000;
  big.seq_len = 2048;
  big.batch = 1;
  big.dtype = ag::dtype::bf16;
  big.weight_values = false;
  auto g64 = build(big);
  ag::plan_options o64;
  o64.pipeline_stages = 8;
  o64.tensor_parallel = 8;
  std::vector<double> times, cpu;
  std::shared_ptr<const ag::plan> p64;
  for (int r = 0; r < repeats; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    const std::clock_t c0 = std::clock();
    auto p = ag::compile(g64, h200s(64), o64);
    cpu.push_back(1000.0 * static_cast<double>(std::clock() - c0) / CLOCKS_PER_SEC);
    times.push_back(ms_since(t0));
    if (!p) die("64-device plan", p.err());
    p64 = std::move(*p);
  }
  std::sort(times.begin(), times.end());
  std::sort(cpu.begin(), cpu.end());
  const double plan_ms = times[times.size() / 2];
  std::size_t coll_parts = 0;
  for (const ag::step& s : p64->steps()) coll_parts += s.kind == ag::step_kind::collective;

  // tp_weight_bytes_ratio_4
  auto small = ag::models::transformer_config::llama_8b_like(12);
  small.weight_values = false;
  auto g12 = build(small);
  auto one = ag::compile(g12, h200s(1));
  if (!one) die("1-device plan", one.err());
  ag::plan_options o4;
  o4.tensor_parallel = 4;
  auto four = ag::compile(g12, h200s(4), o4);
  if (!four) die("degree-4 plan", four.err());
  int64_t worst = 0;
  for (const auto& m : (*four)->memory()) worst = std::max(worst, m.weight_bytes);
  const int64_t whole = (*one)->memory()[0].weight_bytes;
  const double ratio = static_cast<double>(worst) / static_cast<double>(whole);

  std::printf("%-26s %12s  %s\n", "figure", "value", "setup");
  std::printf("%-26s %12.1f  8 x 8 over 64 sim H200, %d layers d 8192, %zu nodes, %zu steps (%zu collective parts), "
              "wall ms:",
              "tp_plan_ms_64", plan_ms, layers, p64->source().size(), p64->steps().size(), coll_parts);
  for (double t : times) std::printf(" %.1f", t);
  std::printf(" (cpu ms:");
  for (double t : cpu) std::printf(" %.1f", t);
  std::printf(")\n");
  std::printf("%-26s %12.3f  12-layer d 4096 LLaMA, largest device %s of %s on 1 device\n", "tp_weight_bytes_ratio_4",
              ratio, gib(worst).c_str(), gib(whole).c_str());
  std::printf("tp_plan_ms_64: %.1f\n", plan_ms);
  std::printf("tp_weight_bytes_ratio_4: %.3f\n", ratio);
  return 0;
}
