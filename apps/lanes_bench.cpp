// actorgraph-lanes-bench: do compute lanes pay off where the planner uses them?
//
// The graph is the one issue 16 names: `--chains` independent chains of
// `--depth` small matmuls ([rows, d] x [d, d], d 256) + gelu, from one input,
// joined at the end by a sum. The same graph is planned twice on one device:
// with auto lanes (plan_options::lanes_per_device = 0, the default: the
// planner spreads branches over lanes only where its cost model predicts a
// gain and the arena stays within max_lane_memory_ratio of one lane's) and
// with one lane. Jobs run one at a time (lanes only help inside a job); the
// plans take turns round by round (--repeats rounds of --jobs jobs each), and
// each plan's best round counts.
//
// Prints a table and:
//   lanes_speedup_branchy[_sim]: X   one-lane time per job / auto-lanes time
//   lanes_peak_memory_ratio: X       auto-lanes plan's arena / one-lane plan's
//   lanes_used: N                    lanes the planner chose
//   ..._relaxed                      the same with max_lane_memory_ratio
//                                    = --relaxed-memory-ratio (default 4)
//   lanes_speedup_mixed[_sim]: X     the same for a large matmul next to a
//                                    chain of small gelus, where the cost
//                                    model predicts lanes pay
// On sim (default --devices sim:1) the device is modelled (time scaled by
// --time-scale so that microsecond kernels are long against thread wake-ups;
// the sim overlaps launch latencies across lanes and serialises throughput);
// with --devices cuda:0 it is a GPU.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "actors/actorgraph.hpp"
#include "apps/common/flags.hpp"

namespace {

[[noreturn]] void die(const std::string& what, const ag::error& e) {
  std::fprintf(stderr, "actorgraph-lanes-bench: %s: %s\n", what.c_str(), e.to_string().c_str());
  std::exit(1);
}

ag::graph branchy_graph(int chains, int depth, int64_t rows, int64_t d, ag::dtype type) {
  ag::graph_builder b;
  auto x = b.input("x", type, {rows, d});
  ag::tensor sum;
  for (int c = 0; c < chains; ++c) {
    ag::tensor h = x;
    for (int k = 0; k < depth; ++k) {
      const std::string n = "c" + std::to_string(c) + ".l" + std::to_string(k);
      auto w = b.weight(n + ".w", ag::host_tensor::random_normal(type, {d, d}, 1000 * c + k, 0.06f));
      h = b.gelu(b.matmul(h, w, false, false, n + ".mm"), ag::gelu_mode::tanh, n + ".act");
    }
    sum = sum.valid() ? b.add(sum, h, "join" + std::to_string(c)) : h;
  }
  b.output(sum);
  auto g = std::move(b).build();
  if (!g) die("branchy graph", g.err());
  return std::move(*g);
}

/// One large matmul ([rows_big, 2048] x [2048, 2048], throughput-bound) next
/// to a chain of `small_ops` gelus on [16, 256] (launch-bound): the graph
/// where the cost model predicts lanes pay (one branch's launches overlap the
/// other's work).
ag::graph mixed_graph(int small_ops, int64_t rows_big, ag::dtype type) {
  ag::graph_builder b;
  auto x = b.input("x", type, {rows_big, 2048});
  auto w = b.weight("w", ag::host_tensor::random_normal(type, {2048, 2048}, 3, 0.02f));
  b.output(b.matmul(x, w, false, false, "big"));
  auto s = b.input("s", type, {16, 256});
  ag::tensor h = s;
  for (int k = 0; k < small_ops; ++k) h = b.gelu(h, ag::gelu_mode::tanh, "small" + std::to_string(k));
  b.output(h);
  auto g = std::move(b).build();
  if (!g) die("mixed graph", g.err());
  return std::move(*g);
}

struct plan_figures {
  double ms_per_job = 0;
  int64_t arena_bytes = 0;
  int lanes_used = 1;
  int compute_steps = 0;
};

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

/// A compiled plan and what the table prints of it.
struct measured_plan {
  std::shared_ptr<const ag::plan> plan;
  plan_figures figures;
};

double run_round(ag::runtime& rt, const std::shared_ptr<const ag::plan>& p, const std::vector<ag::host_tensor>& inputs,
                 int jobs) {
  const double t0 = now_s();
  for (int j = 0; j < jobs; ++j) {
    auto res = rt.submit(p, inputs).wait();
    if (!res.has_value()) die("job", res.err());
  }
  return (now_s() - t0) / jobs;
}

/// Compiles each of `options` and times them side by side: a warm-up round
/// of each (arenas, events, streams, captured graphs), then `repeats` rounds
/// in which every plan runs `jobs` jobs one at a time in turn, so that a
/// change of the host's pace (another tenant, clocks) falls on every plan
/// alike; each plan's best round counts.
std::vector<plan_figures> measure_side_by_side(ag::runtime& rt, const ag::graph& g,
                                               const std::vector<ag::plan_options>& options,
                                               const std::vector<ag::host_tensor>& inputs, int jobs, int repeats) {
  std::vector<measured_plan> plans;
  for (const auto& po : options) {
    auto p = rt.compile(g, po);
    if (!p) die("compile", p.err());
    measured_plan m{*p, {}};
    for (const auto& s : m.plan->steps())
      if (s.kind == ag::step_kind::compute) {
        ++m.figures.compute_steps;
        m.figures.lanes_used = std::max(m.figures.lanes_used, s.lane + 1);
      }
    for (const auto& mem : m.plan->memory()) m.figures.arena_bytes = std::max(m.figures.arena_bytes, mem.arena_bytes);
    (void)run_round(rt, m.plan, inputs, jobs);
    plans.push_back(std::move(m));
  }
  std::vector<double> best(plans.size(), 1e30);
  for (int r = 0; r < repeats; ++r)
    for (std::size_t i = 0; i < plans.size(); ++i) best[i] = std::min(best[i], run_round(rt, plans[i].plan, inputs, jobs));
  std::vector<plan_figures> out;
  for (std::size_t i = 0; i < plans.size(); ++i) {
    plans[i].figures.ms_per_job = best[i] * 1e3;
    out.push_back(plans[i].figures);
  }
  return out;
}

/// One traced job of each plan (after warm-up jobs, whose records are
/// dropped), in a runtime of its own so that tracing costs nothing above.
void write_trace(const std::string& path, const std::string& devices, ag::runtime_options o, const ag::graph& g,
                 const std::vector<ag::plan_options>& plans, const std::vector<ag::host_tensor>& inputs) {
  o.trace = true;
  auto rt = ag::runtime::create(devices, o);
  if (!rt) die("traced runtime (" + devices + ")", rt.err());
  std::vector<std::shared_ptr<const ag::plan>> compiled;
  for (const auto& po : plans) {
    auto p = (*rt)->compile(g, po);
    if (!p) die("compile (traced)", p.err());
    for (int j = 0; j < 20; ++j)
      if (auto r = (*rt)->submit(*p, inputs).wait(); !r.has_value()) die("job (traced)", r.err());
    compiled.push_back(*p);
  }
  (void)(*rt)->take_trace();
  for (const auto& p : compiled)
    if (auto r = (*rt)->submit(p, inputs).wait(); !r.has_value()) die("job (traced)", r.err());
  FILE* f = std::fopen(path.c_str(), "w");
  if (!f) die("trace", {ag::errc::invalid_argument, "cannot write " + path});
  const std::string json = (*rt)->take_trace().to_chrome_json();
  std::fwrite(json.data(), 1, json.size(), f);
  std::fclose(f);
  std::printf("trace: %s (one job of each plan: one lane, then every lane)\n", path.c_str());
}

}  // namespace

int main(int argc, char** argv) {
  std::string devices = "sim:1";
  int chains = 8, depth = 8, jobs = 50, repeats = 5;
  int64_t rows = 16, d = 256;
  double time_scale = 20;
  std::string type_name = "f32";
  double relaxed_ratio = 4;
  int mixed_small_ops = 32;
  std::string replay = "off";
  bool replay_host_copies = true;
  bool fold_lanes = true;
  std::string trace_out;
  int64_t mixed_rows = 1024;
  ag::apps::flags app("actorgraph-lanes-bench",
                      "actorgraph-lanes-bench: auto lanes against one lane on a graph of independent small chains");
  app.add_option("--devices", devices, "one device: sim:1 (modelled) or cuda:0");
  app.add_option("--chains", chains, "independent chains")->check(CLI::Range(1, 256));
  app.add_option("--depth", depth, "matmul + gelu per chain")->check(CLI::Range(1, 1024));
  app.add_option("--rows", rows, "rows of the activations")->check(CLI::Range(int64_t{1}, int64_t{1} << 16));
  app.add_option("--d", d, "width of the matmuls")->check(CLI::Range(int64_t{1}, int64_t{1} << 14));
  app.add_option("--jobs", jobs, "jobs per round, one at a time")->check(CLI::Range(1, 1000000));
  app.add_option("--repeats", repeats, "timed rounds, the plans in turn in each (each plan's best counts)")->check(CLI::Range(1, 1000));
  app.add_option("--time-scale", time_scale, "sim only: wall seconds per modelled second")->check(CLI::Range(1e-3, 1e6));
  app.add_option("--dtype", type_name, "f32 or bf16");
  app.add_option("--mixed-small-ops", mixed_small_ops, "gelus of the mixed graph's launch-bound branch")
      ->check(CLI::Range(1, 4096));
  app.add_option("--mixed-rows", mixed_rows, "rows of the mixed graph's large matmul")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 16));
  app.add_option("--relaxed-memory-ratio", relaxed_ratio, "max_lane_memory_ratio of the table's relaxed auto row")
      ->check(CLI::Range(1.0, 1e6));
  app.add_option("--replay", replay, "plan_options::graph_replay of every plan: off, on or auto");
  app.add_option("--replay-host-copies", replay_host_copies,
                 "on|off: plan_options::replay_host_copies of every plan (small input and output copies inside the graphs)");
  app.add_option("--fold-lanes", fold_lanes,
                 "on|off: plan_options::fold_lanes of every plan (under replay, a device's lanes run from one queue and "
                 "each segment is one graph whose branches are the lanes; off: a queue and stream per lane)");
  app.add_option("--trace", trace_out,
                 "write a Chrome trace of one job of the one-lane plan and one of the every-lane plan (a traced "
                 "runtime of its own, after the figures) to this file");
  if (auto status = ag::apps::parse_flags(app, argc, argv)) return *status;
  ag::graph_replay_mode replay_mode = ag::graph_replay_mode::off;
  if (!ag::parse_graph_replay_mode(replay, replay_mode))
    die("flags", {ag::errc::invalid_argument, "--replay must be off, on or auto, got '" + replay + "'"});
  const ag::dtype type = type_name == "bf16" ? ag::dtype::bf16 : ag::dtype::f32;
  if (type_name != "bf16" && type_name != "f32") die("flags", {ag::errc::invalid_argument, "--dtype must be f32 or bf16"});

  ag::runtime_options o;
  o.backend.sim.compute_values = false;
  o.backend.sim.jitter = 0;
  o.backend.sim.time_scale = time_scale;
  o.trace = false;
  auto rt = ag::runtime::create(devices, o);
  if (!rt) die("runtime (" + devices + ")", rt.err());
  const bool sim = devices.rfind("sim", 0) == 0;
  const auto g = branchy_graph(chains, depth, rows, d, type);
  const std::vector<ag::host_tensor> in{ag::host_tensor::random_normal(type, {rows, d}, 7, 1.0f)};

  ag::plan_options base;
  base.graph_replay = replay_mode;
  base.replay_host_copies = replay_host_copies;
  base.fold_lanes = fold_lanes;
  ag::plan_options one_lane = base;
  one_lane.lanes_per_device = 1;
  ag::plan_options auto_lanes = base;  // lanes_per_device = 0: the planner decides
  ag::plan_options relaxed = base;  // auto lanes, more arena allowed
  relaxed.max_lane_memory_ratio = relaxed_ratio;
  ag::plan_options forced = base;  // every lane the device offers, whatever it costs
  forced.lanes_per_device = 64;
  forced.min_branch_seconds = 0;
  const auto figures = measure_side_by_side(**rt, g, {one_lane, auto_lanes, relaxed, forced}, in, jobs, repeats);
  const plan_figures &one = figures[0], &lanes = figures[1], &roomy = figures[2], &all = figures[3];
  const double scale = sim ? time_scale : 1.0;  // report modelled ms on sim

  std::printf("graph: %d chains x %d (matmul [%lld, %lld] x [%lld, %lld] + gelu), %s, on %s, graph replay %s\n",
              chains, depth, static_cast<long long>(rows), static_cast<long long>(d), static_cast<long long>(d),
              static_cast<long long>(d), type_name.c_str(), devices.c_str(), ag::to_string(replay_mode));
  std::printf("%-22s %8s %14s %12s %14s\n", "plan", "lanes", "compute steps", "arena KiB", sim ? "modelled ms" : "ms per job");
  std::printf("%-22s %8d %14d %12.1f %14.4f\n", "one lane", one.lanes_used, one.compute_steps,
              static_cast<double>(one.arena_bytes) / 1024, one.ms_per_job / scale);
  std::printf("%-22s %8d %14d %12.1f %14.4f\n", "auto lanes (planner)", lanes.lanes_used, lanes.compute_steps,
              static_cast<double>(lanes.arena_bytes) / 1024, lanes.ms_per_job / scale);
  char roomy_name[64];
  std::snprintf(roomy_name, sizeof roomy_name, "auto, memory <= %.1fx", relaxed_ratio);
  std::printf("%-22s %8d %14d %12.1f %14.4f\n", roomy_name, roomy.lanes_used, roomy.compute_steps,
              static_cast<double>(roomy.arena_bytes) / 1024, roomy.ms_per_job / scale);
  std::printf("%-22s %8d %14d %12.1f %14.4f\n", "every lane (forced)", all.lanes_used, all.compute_steps,
              static_cast<double>(all.arena_bytes) / 1024, all.ms_per_job / scale);
  std::printf("lanes_used: %d\n", lanes.lanes_used);
  const auto ratio = [&](const plan_figures& f) {
    return one.arena_bytes > 0 ? static_cast<double>(f.arena_bytes) / static_cast<double>(one.arena_bytes) : 1.0;
  };
  // Default options: what a user gets without asking.
  std::printf("lanes_speedup_branchy%s: %.3f\n", sim ? "_sim" : "", one.ms_per_job / lanes.ms_per_job);
  std::printf("lanes_peak_memory_ratio: %.3f\n", ratio(lanes));
  // With the relaxed memory ratio: what lanes buy when the arena may grow.
  std::printf("lanes_speedup_branchy%s_relaxed: %.3f\n", sim ? "_sim" : "", one.ms_per_job / roomy.ms_per_job);
  std::printf("lanes_peak_memory_ratio_relaxed: %.3f\n", ratio(roomy));

  if (!trace_out.empty()) write_trace(trace_out, devices, o, g, {one_lane, forced}, in);

  // The mixed graph: the cost model's case for lanes.
  const auto mg = mixed_graph(mixed_small_ops, mixed_rows, type);
  const std::vector<ag::host_tensor> min{ag::host_tensor::random_normal(type, {mixed_rows, 2048}, 8, 1.0f),
                                         ag::host_tensor::random_normal(type, {16, 256}, 9, 1.0f)};
  const auto mixed = measure_side_by_side(**rt, mg, {one_lane, auto_lanes}, min, jobs, repeats);
  const plan_figures &m_one = mixed[0], &m_auto = mixed[1];
  std::printf("graph: matmul [%lld, 2048] x [2048, 2048] next to %d gelus on [16, 256], %s, on %s\n",
              static_cast<long long>(mixed_rows), mixed_small_ops, type_name.c_str(), devices.c_str());
  std::printf("%-22s %8d %14d %12.1f %14.4f\n", "one lane", m_one.lanes_used, m_one.compute_steps,
              static_cast<double>(m_one.arena_bytes) / 1024, m_one.ms_per_job / scale);
  std::printf("%-22s %8d %14d %12.1f %14.4f\n", "auto lanes (planner)", m_auto.lanes_used, m_auto.compute_steps,
              static_cast<double>(m_auto.arena_bytes) / 1024, m_auto.ms_per_job / scale);
  std::printf("lanes_used_mixed: %d\n", m_auto.lanes_used);
  std::printf("lanes_speedup_mixed%s: %.3f\n", sim ? "_sim" : "", m_one.ms_per_job / m_auto.ms_per_job);
  std::printf("lanes_peak_memory_ratio_mixed: %.3f\n",
              m_one.arena_bytes > 0 ? static_cast<double>(m_auto.arena_bytes) / static_cast<double>(m_one.arena_bytes)
                                    : 1.0);
  return 0;
}
