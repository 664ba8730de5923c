// actorgraph-e2e-bench: end-to-end figures of a transformer forward pass on
// the runtime's devices (real GPUs by default: --devices=cuda:all).
//
//   1. e2e_forward_ms / e2e_tokens_per_s   one device, one job at a time:
//      median wall time of submit -> job.wait() over --runs after --warmup.
//      Compare with scripts/torch_e2e_ref.py (torch_forward_ms); pass
//      --torch-ms=X to print e2e_ratio_vs_torch.
//   2. e2e_gpu_idle_fraction               from the trace of those jobs: over
//      [first compute step start, last compute step end] on the device, the
//      fraction of time no compute step ran (median over the timed jobs).
//   3. host_completion_us_median / _p99    tiny jobs (one add) one at a time:
//      a then() continuation's host_clock_ns minus the trace's end_ns of the
//      job's last step (its d2h copy).
//   4. pipeline_speedup_n2_m32 / pipeline_efficiency_n2_m32
//      the same model (batch --micro-batch-size) split over 2 devices
//      (pipeline_stages = 2) vs everything on device 0, 32 micro-batch jobs
//      submitted together with submit_batch; efficiency = speedup / ideal,
//      ideal = N*M / (M+N-1).
//
// Only the public API is used (actors/actorgraph.hpp, graph/models).
// Flags: --name=value or --name value; --help lists them with their defaults.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "actors/actorgraph.hpp"
#include "apps/common/flags.hpp"
#include "apps/common/trace_spans.hpp"
#include "graph/models/transformer.hpp"

namespace {

struct options {
  std::string devices = "cuda:all";
  bool small = false;
  std::string variant = "llama";
  int layers = 12;
  int64_t d_model = 2048;
  int heads = 16;
  int kv_heads = 0;  // 0: = heads (plain multi-head attention)
  int64_t ff = 5632;
  int64_t vocab = 4096;
  int64_t seq = 512;
  int64_t batch = 8;
  std::string dtype = "bf16";
  int runs = 20;
  int warmup = 3;
  int lanes = 1;
  std::string replay = "off";  // plan_options::graph_replay of figure 1
  int idle_lanes = 2;
  double idle_min_branch_us = 20;
  int arenas = 8;
  int threads = 0;
  int micro_batches = 32;
  int64_t micro_batch_size = 2;
  int pipeline_repeats = 3;
  int pipeline_runs = 1;
  int sched_max_throughput = ag::runtime_options{}.scheduler_max_throughput;
  int sched_idle_steal_us = ag::runtime_options{}.scheduler_idle_steal_us;
  int tiny_jobs = 2000;
  double torch_ms = 0;
  double torch_pinned_ms = 0;
  bool sim_values = false;
  bool pageable_outputs = false;
  std::string pdl = "on";  ///< backend_options::cuda_pdl (on: the default)
  std::string fusion = "on";  ///< plan_options::fuse_ops of figure 1 (on: the default)
  std::string chrome_trace;
  std::string pipeline_trace;
  bool skip_forward = false, skip_idle = false, skip_completion = false, skip_pipeline = false;
};

[[noreturn]] void die(const std::string& what, const std::string& why) {
  std::fprintf(stderr, "actorgraph-e2e-bench: %s: %s\n", what.c_str(), why.c_str());
  std::exit(1);
}
[[noreturn]] void die(const std::string& what, const ag::error& e) { die(what, e.to_string()); }

// Parses the flags into `o`; nullopt to go on, else main's exit status
// (0 after --help, 2 for a bad flag).
std::optional<int> parse(int argc, char** argv, options& o) {
  ag::apps::flags app("actorgraph-e2e-bench",
                                      "actorgraph-e2e-bench: end-to-end transformer figures through the public API "
                                      "(forward latency, GPU idle fraction, host completion latency, 2-device pipeline)");
  app.add_option("--devices", o.devices, "device spec (sim:2, cpu:1, cuda:0,1, ...)");
  app.add_flag("--small", o.small, "small model defaults (for sim/cpu devices); explicit flags still win");
  app.add_option("--variant", o.variant, "model variant")->check(CLI::IsMember({"llama", "gpt2"}));
  app.add_option("--layers", o.layers)->check(CLI::PositiveNumber);
  app.add_option("--d-model", o.d_model)->check(CLI::PositiveNumber);
  app.add_option("--heads", o.heads)->check(CLI::PositiveNumber);
  app.add_option("--kv-heads", o.kv_heads, "key/value heads (0: = heads)")->check(CLI::NonNegativeNumber);
  app.add_option("--ff", o.ff)->check(CLI::PositiveNumber);
  app.add_option("--vocab", o.vocab)->check(CLI::PositiveNumber);
  app.add_option("--seq", o.seq)->check(CLI::PositiveNumber);
  app.add_option("--batch", o.batch)->check(CLI::PositiveNumber);
  app.add_option("--dtype", o.dtype)->check(CLI::IsMember({"f32", "f16", "bf16"}));
  app.add_option("--runs", o.runs, "timed forward jobs (figures 1, 2)")->check(CLI::PositiveNumber);
  app.add_option("--warmup", o.warmup, "untimed forward jobs first")->check(CLI::NonNegativeNumber);
  ag::apps::add_on_off(
      app, "--fusion", o.fusion,
      "plan_options::fuse_ops of the figure-1 plan (on: the default, attention chains as one kernel; off)");
  app.add_option("--replay", o.replay, "graph replay of the figure-1 plan (plan_options::graph_replay)")
      ->check(CLI::IsMember({"off", "on", "auto"}));
  app.add_option("--lanes", o.lanes,
                 "compute lanes (streams) per device the planner may use (figures 1, 4; 0: auto, where the cost model "
                 "predicts a gain)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--idle-lanes", o.idle_lanes, "lanes of the figure-2 plan when the figure-1 plan is one split")->check(CLI::PositiveNumber);
  app.add_option("--idle-min-branch-us", o.idle_min_branch_us, "min_branch_seconds of that plan, in us")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--arenas", o.arenas, "activation arenas per device and plan (jobs in flight)")->check(CLI::PositiveNumber);
  app.add_option("--threads", o.threads, "CAF scheduler threads (0: auto, runtime_options::scheduler_threads)")->check(CLI::NonNegativeNumber);
  app.add_option("--sched-max-throughput", o.sched_max_throughput, "runtime_options::scheduler_max_throughput (0: CAF's default)");
  app.add_option("--sched-idle-steal-us", o.sched_idle_steal_us, "runtime_options::scheduler_idle_steal_us (0: CAF's default)");
  app.add_option("--micro-batches", o.micro_batches, "micro-batch jobs of figure 4")->check(CLI::PositiveNumber);
  app.add_option("--micro-batch-size", o.micro_batch_size, "batch of each micro-batch job (figure 4)")->check(CLI::PositiveNumber);
  app.add_option("--pipeline-repeats", o.pipeline_repeats, "rounds per figure-4 measurement")->check(CLI::PositiveNumber);
  app.add_option("--pipeline-runs", o.pipeline_runs,
                 "measure figure 4 this many times (1 and 2 devices each time); the figure is their median, the "
                 "diagnostics are of the worst run")
      ->check(CLI::PositiveNumber);
  app.add_option("--tiny-jobs", o.tiny_jobs, "jobs for the host-completion latency (figure 3)")->check(CLI::PositiveNumber);
  app.add_option("--torch-ms", o.torch_ms, "torch_forward_ms of scripts/torch_e2e_ref.py: prints e2e_ratio_vs_torch");
  app.add_option("--torch-pinned-ms", o.torch_pinned_ms, "torch_forward_pinned_ms of it: prints e2e_ratio_vs_torch_pinned");
  app.add_flag("--sim-values", o.sim_values, "sim devices compute real values (default: timing only)");
  app.add_flag("--pageable-outputs", o.pageable_outputs, "job outputs on the heap (runtime_options::pinned_outputs = false)");
  ag::apps::add_on_off(app, "--pdl", o.pdl,
                       "cuda: backend_options::cuda_pdl, kernels as programmatic dependent launches (on, off)");
  app.add_option("--chrome-trace", o.chrome_trace, "write the trace of one timed forward job (Perfetto / chrome://tracing)")
      ->option_text("FILE");
  app.add_option("--pipeline-trace", o.pipeline_trace, "write the trace of the last 2-device pipeline round")->option_text("FILE");
  app.add_flag("--skip-forward", o.skip_forward);
  app.add_flag("--skip-idle", o.skip_idle);
  app.add_flag("--skip-completion", o.skip_completion);
  app.add_flag("--skip-pipeline", o.skip_pipeline);
  if (auto status = ag::apps::parse_flags(app, argc, argv)) return status;
  if (o.small) {
    // Small defaults for what the command line left alone.
    auto small = [&](const char* flag, auto& field, auto value) {
      if (!ag::apps::given(app, flag)) field = value;
    };
    small("--layers", o.layers, 4);
    small("--d-model", o.d_model, 256);
    small("--heads", o.heads, 4);
    small("--ff", o.ff, 704);
    small("--vocab", o.vocab, 512);
    small("--seq", o.seq, 64);
    small("--batch", o.batch, 2);
    small("--runs", o.runs, 10);
    small("--warmup", o.warmup, 2);
    small("--micro-batches", o.micro_batches, 32);
    small("--micro-batch-size", o.micro_batch_size, 1);
    small("--pipeline-repeats", o.pipeline_repeats, 2);
    small("--tiny-jobs", o.tiny_jobs, 300);
    small("--idle-min-branch-us", o.idle_min_branch_us, 2.0);
  }
  return std::nullopt;
}

ag::models::transformer_config model_config(const options& o, int64_t batch) {
  ag::models::transformer_config c;
  if (!ag::models::parse_variant(o.variant, c.variant)) die("flags", "--variant: unknown '" + o.variant + "' (llama | gpt2)");
  if (!ag::parse_dtype(o.dtype.c_str(), c.dtype)) die("flags", "--dtype: unknown '" + o.dtype + "'");
  c.n_layers = o.layers;
  c.d_model = o.d_model;
  c.n_heads = o.heads;
  c.n_kv_heads = o.kv_heads;
  c.d_ff = o.ff;
  c.vocab = o.vocab;
  c.seq_len = o.seq;
  c.batch = batch;
  if (auto e = ag::models::validate(c); !e.ok()) die("model config", e);
  return c;
}

std::shared_ptr<const ag::graph> build_model(const ag::models::transformer_config& c) {
  const double t0 = ag::gpu::host_clock_ns() * 1e-9;
  auto g = ag::models::build_transformer(c);
  if (!g) die("build_transformer", g.err());
  std::fprintf(stderr, "built %s: %d layers, batch %lld, %.1f M parameters in %.1f s\n", ag::models::to_string(c.variant),
               c.n_layers, static_cast<long long>(c.batch), ag::models::parameter_count(c) / 1e6,
               ag::gpu::host_clock_ns() * 1e-9 - t0);
  return std::make_shared<const ag::graph>(std::move(*g));
}

double percentile(std::vector<double> v, double p) {
  if (v.empty()) return NAN;
  std::sort(v.begin(), v.end());
  const double x = p * static_cast<double>(v.size() - 1);
  const auto lo = static_cast<std::size_t>(std::floor(x));
  const auto hi = std::min(lo + 1, v.size() - 1);
  return v[lo] + (v[hi] - v[lo]) * (x - static_cast<double>(lo));
}
double median(std::vector<double> v) { return percentile(std::move(v), 0.5); }

/// Sum of the union of [start, end) intervals.
int64_t union_ns(std::vector<std::pair<int64_t, int64_t>> iv) {
  std::sort(iv.begin(), iv.end());
  int64_t total = 0, cur_s = 0, cur_e = 0;
  bool open = false;
  for (auto [s, e] : iv) {
    if (e <= s) continue;
    if (!open || s > cur_e) {
      if (open) total += cur_e - cur_s;
      cur_s = s;
      cur_e = e;
      open = true;
    } else {
      cur_e = std::max(cur_e, e);
    }
  }
  if (open) total += cur_e - cur_s;
  return total;
}

/// Idle fraction of compute lanes on `device` for `job`: 1 - busy / window,
/// window = [first compute start, last compute end] (or all steps when
/// `with_io`: the h2d upload before and the d2h copy after count as idle).
/// A step on a compute lane ("compute0", "compute1", ...), not a copy.
bool is_compute(const ag::trace_record& r) { return r.lane.rfind("compute", 0) == 0; }

struct idle_figure {
  double fraction = NAN;
  int compute_steps = 0;
  double window_us = 0;
};
constexpr uint64_t all_jobs = ~0ull;
idle_figure idle_of(const ag::trace& t, uint64_t job, int device, bool with_io) {
  idle_figure f;
  std::vector<std::pair<int64_t, int64_t>> busy;
  int64_t lo = INT64_MAX, hi = INT64_MIN;
  for (const auto& r : t.records) {
    if ((job != all_jobs && r.job != job) || r.device != device) continue;
    const bool compute = is_compute(r);
    if (compute) {
      busy.emplace_back(r.start_ns, r.end_ns);
      ++f.compute_steps;
    }
    if (compute || with_io) {
      lo = std::min(lo, r.start_ns);
      hi = std::max(hi, r.end_ns);
    }
  }
  if (busy.empty() || hi <= lo) return f;
  f.window_us = static_cast<double>(hi - lo) / 1e3;
  f.fraction = 1.0 - static_cast<double>(union_ns(std::move(busy))) / static_cast<double>(hi - lo);
  return f;
}

ag::runtime_options runtime_opts(const options& o) {
  ag::runtime_options ro;
  ro.arenas_per_device = o.arenas;
  ro.scheduler_threads = o.threads;
  ro.scheduler_max_throughput = o.sched_max_throughput;
  ro.scheduler_idle_steal_us = o.sched_idle_steal_us;
  ro.trace = true;
  ro.pinned_outputs = !o.pageable_outputs;
  ro.backend.cuda_pdl = o.pdl == "on";
  // Sim devices: costs of the default (H100-like) spec in real time; timing
  // only unless --sim-values (the cpu kernels behind sim values would be the
  // bottleneck on a small host, not the runtime).
  ro.backend.sim.compute_values = o.sim_values;
  ro.backend.sim.time_scale = 1.0;
  ro.backend.sim.jitter = 0.0;
  return ro;
}

std::unique_ptr<ag::runtime> make_runtime(const options& o) {
  auto rt = ag::runtime::create(o.devices, runtime_opts(o));
  if (!rt) die("runtime::create(\"" + o.devices + "\")", rt.err());
  return std::move(*rt);
}

std::shared_ptr<const ag::plan> compile_plan(ag::runtime& rt, std::shared_ptr<const ag::graph> g, ag::plan_options po,
                                        const char* what) {
  const double t0 = ag::gpu::host_clock_ns() * 1e-9;
  auto p = rt.compile(std::move(g), po);
  if (!p) die(std::string("compile (") + what + ")", p.err());
  std::fprintf(stderr, "compiled %s: %zu steps on %zu device(s) in %.1f s\n", what, (*p)->steps().size(),
               (*p)->used_devices().size(), ag::gpu::host_clock_ns() * 1e-9 - t0);
  return *p;
}

void check(const ag::job& j, const char* what) {
  const auto& r = j.wait();
  if (!r.has_value()) die(what, r.err());
}

struct row {
  std::string name;
  std::string value;
};
std::vector<row> table;
std::vector<std::pair<std::string, double>> figures;

void add_row(const std::string& name, double v, const char* fmt = "%.3f") {
  char buf[64];
  std::snprintf(buf, sizeof buf, fmt, v);
  table.push_back({name, buf});
}
void add_row(const std::string& name, const std::string& v) { table.push_back({name, v}); }
void figure(const std::string& name, double v) { figures.emplace_back(name, v); }

// ---- figures 1 and 2 ---------------------------------------------------------

int compute_steps_on(const ag::plan& p, int device) {
  int n = 0;
  for (const auto& s : p.steps()) n += s.kind == ag::step_kind::compute && s.device == device;
  return n;
}

/// Runs `warmup` then `runs` jobs one at a time (submit, wait); returns the
/// wall ms of each timed job and their ids; the trace of the timed jobs goes
/// to `t` (the warm-up's is dropped).
std::vector<double> forward_jobs(const options& o, ag::runtime& rt, const std::shared_ptr<const ag::plan>& p,
                                 const std::vector<ag::host_tensor>& inputs, std::vector<uint64_t>& ids, ag::trace& t,
                                 std::vector<ag::job_times>* times = nullptr) {
  for (int i = 0; i < o.warmup; ++i) check(rt.submit(p, inputs), "forward job (warm-up)");
  (void)rt.take_trace();
  std::vector<double> ms;
  for (int i = 0; i < o.runs; ++i) {
    const int64_t t0 = ag::gpu::host_clock_ns();
    ag::job j = rt.submit(p, inputs);
    check(j, "forward job");
    ms.push_back(static_cast<double>(ag::gpu::host_clock_ns() - t0) / 1e6);
    ids.push_back(j.id());
    if (times) times->push_back(j.times());
  }
  t = rt.take_trace();
  return ms;
}

void run_forward(const options& o, ag::runtime& rt) {
  const auto cfg = model_config(o, o.batch);
  auto g = build_model(cfg);
  ag::plan_options po{.policy = ag::placement_policy::single, .lanes_per_device = o.lanes};
  if (!ag::parse_graph_replay_mode(o.replay, po.graph_replay)) throw std::runtime_error("--replay " + o.replay);
  po.fuse_ops = o.fusion == "on";
  auto p = compile_plan(rt, g, po, "forward, 1 device");
  const auto inputs = ag::models::transformer_inputs(cfg, 7);
  std::vector<uint64_t> ids;
  ag::trace t;
  std::vector<ag::job_times> times;
  const std::vector<double> ms = forward_jobs(o, rt, p, inputs, ids, t, &times);
  const double fwd = median(ms);
  const double tokens = static_cast<double>(cfg.batch * cfg.seq_len);
  add_row("forward: model", std::string(ag::models::to_string(cfg.variant)) + " " + o.dtype);
  add_row("forward: layers / d / heads / kv / ff",
          std::to_string(cfg.n_layers) + " / " + std::to_string(cfg.d_model) + " / " + std::to_string(cfg.n_heads) +
              " / " + std::to_string(cfg.kv_heads()) + " / " + std::to_string(cfg.d_ff));
  add_row("forward: vocab / seq / batch",
          std::to_string(cfg.vocab) + " / " + std::to_string(cfg.seq_len) + " / " + std::to_string(cfg.batch));
  add_row("forward: parameters, M", ag::models::parameter_count(cfg) / 1e6, "%.1f");
  add_row("forward: lanes / compute steps",
          (o.lanes == 0 ? std::string("auto") : std::to_string(o.lanes)) + " / " + std::to_string(compute_steps_on(*p, 0)));
  add_row("forward: graph replay", o.replay);
  add_row("forward: runs", o.runs, "%.0f");
  add_row("forward: min ms", percentile(ms, 0), "%.3f");
  add_row("forward: median ms", fwd, "%.3f");
  add_row("forward: max ms", percentile(ms, 1), "%.3f");
  add_row("forward: est. device ms (cost model)", p->est_seconds(0) * 1e3, "%.3f");
  // GPU time of the forward: [first compute start, last compute end] on the
  // device (compare torch_forward_device_ms); wall minus this is uploads,
  // the logits copy, output allocation and the runtime.
  std::vector<double> device_ms;
  for (uint64_t id : ids)
    if (auto f = idle_of(t, id, 0, false); !std::isnan(f.fraction)) device_ms.push_back(f.window_us / 1e3);
  // Where the wall time goes: job milestones against the trace (all on
  // host_clock_ns). "started" is after arenas and host output buffers.
  {
    const auto span = ag::apps::job_spans(t);  // job -> first start, last end (any step)
    std::vector<double> to_start, to_first, on_device, to_finish;
    for (std::size_t i = 0; i < ids.size() && i < times.size(); ++i) {
      auto it = span.find(ids[i]);
      if (it == span.end() || times[i].started_ns == 0 || times[i].finished_ns == 0) continue;
      to_start.push_back(static_cast<double>(times[i].started_ns - times[i].submitted_ns) / 1e6);
      to_first.push_back(static_cast<double>(it->second.first - times[i].started_ns) / 1e6);
      on_device.push_back(static_cast<double>(it->second.second - it->second.first) / 1e6);
      to_finish.push_back(static_cast<double>(times[i].finished_ns - it->second.second) / 1e6);
    }
    if (!on_device.empty()) {
      add_row("forward: submitted -> started, median ms", median(to_start), "%.3f");
      add_row("forward: started -> first step, median ms", median(to_first), "%.3f");
      add_row("forward: first step -> last step end, ms", median(on_device), "%.3f");
      add_row("forward: last step end -> finished, ms", median(to_finish), "%.3f");
    }
  }
  add_row("forward: logits to host, MB per job",
          static_cast<double>(cfg.batch * cfg.seq_len * cfg.vocab * 4) / (1 << 20), "%.1f");
  figure("e2e_forward_ms", fwd);
  figure("e2e_tokens_per_s", tokens / (fwd / 1e3));
  if (!device_ms.empty()) figure("e2e_forward_device_ms", median(device_ms));
  if (o.torch_ms > 0) {
    add_row("forward: torch ms (given)", o.torch_ms, "%.3f");
    figure("e2e_ratio_vs_torch", fwd / o.torch_ms);
  }
  if (o.torch_pinned_ms > 0) {
    add_row("forward: torch ms, pinned logits (given)", o.torch_pinned_ms, "%.3f");
    figure("e2e_ratio_vs_torch_pinned", fwd / o.torch_pinned_ms);
  }
  if (o.skip_idle) return;

  // A job that is one split has no gap the trace can see (its kernels are
  // enqueued back to back): measure the idle time on a plan that forks
  // branches onto --idle-lanes lanes, so that steps wait on each other
  // through events, which is where a runtime leaves the GPU idle.
  std::shared_ptr<const ag::plan> pi = p;
  if (compute_steps_on(*p, 0) <= 1 && o.idle_lanes > 1) {
    pi = compile_plan(rt, g, ag::plan_options{.policy = ag::placement_policy::single,
                                              .lanes_per_device = o.idle_lanes,
                                              .min_branch_seconds = o.idle_min_branch_us * 1e-6},
                      "forward, 1 device, idle figure");
    ids.clear();
    const std::vector<double> ms_i = forward_jobs(o, rt, pi, inputs, ids, t);
    add_row("idle: forward median ms (this plan)", median(ms_i), "%.3f");
  }
  std::vector<double> idle, idle_io, window;
  for (uint64_t id : ids) {
    const auto f = idle_of(t, id, 0, false);
    if (std::isnan(f.fraction)) continue;
    idle.push_back(f.fraction);
    window.push_back(f.window_us);
    idle_io.push_back(idle_of(t, id, 0, true).fraction);
  }
  if (idle.empty()) {
    std::fprintf(stderr, "idle: no compute records in the trace\n");
    return;
  }
  add_row("idle: lanes / compute steps per job", std::to_string(pi->options().lanes_per_device) + " / " +
                                                     std::to_string(compute_steps_on(*pi, 0)));
  add_row("idle: compute window, median us", median(window), "%.1f");
  add_row("idle: fraction, max over jobs", percentile(idle, 1), "%.4f");
  add_row("idle: fraction incl. h2d/d2h, median", median(idle_io), "%.4f");
  figure("e2e_gpu_idle_fraction", median(idle));
  figure("e2e_gpu_idle_fraction_incl_io", median(idle_io));
  if (!o.chrome_trace.empty()) {
    ag::trace one;
    one.device_names = t.device_names;
    const uint64_t pick = ids[ids.size() / 2];
    for (const auto& r : t.records)
      if (r.job == pick) one.records.push_back(r);
    std::ofstream(o.chrome_trace) << one.to_chrome_json();
    std::fprintf(stderr, "wrote the trace of job %llu to %s\n", static_cast<unsigned long long>(pick),
                 o.chrome_trace.c_str());
  }
}

// ---- figure 3 ----------------------------------------------------------------

void run_completion(const options& o, ag::runtime& rt) {
  constexpr int64_t n = 256;
  ag::graph_builder b;
  auto x = b.input("x", ag::dtype::f32, {n});
  auto w = b.weight("w", ag::host_tensor::random_normal(ag::dtype::f32, {n}, 3, 1.0f));
  b.output(b.add(x, w, "y"));
  auto g = std::move(b).build();
  if (!g) die("tiny graph", g.err());
  auto p = compile_plan(rt, std::make_shared<const ag::graph>(std::move(*g)), ag::plan_options{.policy = ag::placement_policy::single}, "tiny add");
  const std::vector<ag::host_tensor> in{ag::host_tensor::random_normal(ag::dtype::f32, {n}, 5, 1.0f)};
  for (int i = 0; i < 50; ++i) check(rt.submit(p, in), "tiny job (warm-up)");
  (void)rt.take_trace();

  const int count = o.tiny_jobs;
  // One slot per job, written by its continuation (a runtime thread) before
  // the job's wait() returns here.
  std::vector<std::atomic<int64_t>> ready_ns(static_cast<std::size_t>(count));
  std::vector<uint64_t> ids(static_cast<std::size_t>(count));
  std::vector<int64_t> submit_ns(static_cast<std::size_t>(count));
  int already_ready = 0;
  for (int i = 0; i < count; ++i) {
    submit_ns[static_cast<std::size_t>(i)] = ag::gpu::host_clock_ns();
    ag::job j = rt.submit(p, in);
    auto* slot = &ready_ns[static_cast<std::size_t>(i)];
    slot->store(0);
    if (j.ready()) ++already_ready;  // then() would run here, late: counted, not hidden
    j.then([slot](const ag::job_result&) { slot->store(ag::gpu::host_clock_ns(), std::memory_order_release); });
    check(j, "tiny job");
    const int64_t deadline = ag::gpu::host_clock_ns() + 10'000'000'000;
    while (slot->load(std::memory_order_acquire) == 0)
      if (ag::gpu::host_clock_ns() > deadline) die("tiny job", "then() continuation did not run within 10 s of ready");
    ids[static_cast<std::size_t>(i)] = j.id();
  }
  const ag::trace t = rt.take_trace();
  std::map<uint64_t, int64_t> last_end;
  for (const auto& r : t.records) {
    auto& e = last_end[r.job];
    e = std::max(e, r.end_ns);
  }
  std::vector<double> us, round_trip_us;
  for (int i = 0; i < count; ++i)
    round_trip_us.push_back(static_cast<double>(ready_ns[static_cast<std::size_t>(i)].load() -
                                                submit_ns[static_cast<std::size_t>(i)]) / 1e3);
  int missing = 0;
  for (int i = 0; i < count; ++i) {
    auto it = last_end.find(ids[static_cast<std::size_t>(i)]);
    if (it == last_end.end() || it->second == 0) {
      ++missing;
      continue;
    }
    us.push_back(static_cast<double>(ready_ns[static_cast<std::size_t>(i)].load() - it->second) / 1e3);
  }
  if (us.empty()) die("host completion", "no trace records for the tiny jobs");
  add_row("completion: tiny jobs", count, "%.0f");
  if (missing) add_row("completion: jobs without trace", missing, "%.0f");
  if (already_ready) add_row("completion: ready before then()", already_ready, "%.0f");
  add_row("completion: min us", percentile(us, 0), "%.1f");
  add_row("completion: median us", median(us), "%.1f");
  add_row("completion: p99 us", percentile(us, 0.99), "%.1f");
  add_row("completion: submit -> then(), median us", median(round_trip_us), "%.1f");
  figure("host_completion_us_median", median(us));
  figure("host_completion_us_p99", percentile(us, 0.99));
  figure("submit_to_then_us", median(round_trip_us));  // issue 16's figure (target <= 20 on CUDA)
}

// ---- figure 4 ----------------------------------------------------------------

/// Median wall ms of `repeats` rounds (after one warm-up round) of
/// submit_batch(ins) and waiting for every job; `t` gets the last round's trace.
/// `span` gets the last round's [submit, all ready] on the host clock.
double run_batch(ag::runtime& rt, const std::shared_ptr<const ag::plan>& p,
                 const std::vector<std::vector<ag::host_tensor>>& ins, int repeats, ag::trace& t,
                 std::pair<int64_t, int64_t>& span) {
  auto once = [&] {
    (void)rt.take_trace();
    const int64_t t0 = ag::gpu::host_clock_ns();
    auto jobs = rt.submit_batch(p, ins);
    for (auto& j : jobs) check(j, "pipeline job");
    span = {t0, ag::gpu::host_clock_ns()};
    return static_cast<double>(span.second - t0) / 1e6;
  };
  (void)once();  // warm-up: arenas, event pools, pinned output buffers
  std::vector<double> ms;
  for (int r = 0; r < repeats; ++r) ms.push_back(once());
  t = rt.take_trace();
  return median(ms);
}

/// [start, end] of every compute step on `device` (over all jobs), unsorted.
std::vector<std::pair<int64_t, int64_t>> compute_intervals(const ag::trace& t, int device) {
  std::vector<std::pair<int64_t, int64_t>> iv;
  for (const auto& r : t.records)
    if (r.device == device && is_compute(r)) iv.emplace_back(r.start_ns, r.end_ns);
  return iv;
}

/// Gaps between consecutive compute steps on `device` (over all jobs):
/// count and sum of those longer than `min_us`, and the longest.
struct gap_figure {
  int count = 0;
  double total_ms = 0, longest_us = 0;
};
gap_figure gaps_of(const ag::trace& t, int device, double min_us) {
  auto iv = compute_intervals(t, device);
  std::sort(iv.begin(), iv.end());
  gap_figure g;
  int64_t end = iv.empty() ? 0 : iv.front().second;
  for (std::size_t i = 1; i < iv.size(); ++i) {
    const double gap_us = static_cast<double>(iv[i].first - end) / 1e3;
    if (gap_us > min_us) {
      ++g.count;
      g.total_ms += gap_us / 1e3;
    }
    g.longest_us = std::max(g.longest_us, gap_us);
    end = std::max(end, iv[i].second);
  }
  return g;
}

void run_pipeline(const options& o, ag::runtime& rt) {
  constexpr int n = 2;
  if (rt.devices().size() < 2) {
    std::fprintf(stderr, "pipeline: skipped, needs 2 devices, '%s' has %zu\n", o.devices.c_str(), rt.devices().size());
    return;
  }
  const int m = o.micro_batches;
  const auto cfg = model_config(o, o.micro_batch_size);
  auto g = build_model(cfg);
  auto p1 = compile_plan(rt, g, ag::plan_options{.policy = ag::placement_policy::single, .lanes_per_device = o.lanes},
                    "pipeline baseline, 1 device");
  auto p2 = compile_plan(rt, g, ag::plan_options{.pipeline_stages = n, .lanes_per_device = o.lanes}, "pipeline, 2 stages");
  std::vector<std::vector<ag::host_tensor>> ins;
  for (int i = 0; i < m; ++i) ins.push_back(ag::models::transformer_inputs(cfg, 100 + static_cast<uint64_t>(i)));
  const double ideal = static_cast<double>(n) * m / (m + n - 1);
  // Each run: the 1-device baseline and the 2-device pipeline side by side.
  // The figures below are of the worst run (lowest efficiency).
  ag::trace tr1, tr2;
  std::pair<int64_t, int64_t> span1, span2;
  double t1 = 0, t2 = 0, worst = 0;
  std::vector<double> efficiencies;
  for (int run = 0; run < o.pipeline_runs; ++run) {
    ag::trace a, b;
    std::pair<int64_t, int64_t> sa, sb;
    const double ta = run_batch(rt, p1, ins, o.pipeline_repeats, a, sa);
    const double tb = run_batch(rt, p2, ins, o.pipeline_repeats, b, sb);
    efficiencies.push_back(ta / tb / ideal);
    if (run == 0 || efficiencies.back() < worst) {
      worst = efficiencies.back();
      tr1 = std::move(a), tr2 = std::move(b), span1 = sa, span2 = sb, t1 = ta, t2 = tb;
    }
  }
  if (!o.pipeline_trace.empty()) {
    std::ofstream(o.pipeline_trace) << tr2.to_chrome_json();
    std::fprintf(stderr, "wrote the 2-device pipeline round's trace to %s\n", o.pipeline_trace.c_str());
  }
  const double speedup = t1 / t2;
  const std::string tag = "_n" + std::to_string(n) + "_m" + std::to_string(m);
  add_row("pipeline: micro-batches x batch", std::to_string(m) + " x " + std::to_string(cfg.batch));
  if (o.pipeline_runs > 1) {
    std::string all;
    for (double e : efficiencies) all += (all.empty() ? "" : ", ") + std::to_string(e).substr(0, 5);
    add_row("pipeline: efficiency of each run (rows below: the worst)", all);
  }
  add_row("pipeline: est. ms per micro-batch, dev 0 / 1",
          [&] {
            char b[64];
            std::snprintf(b, sizeof b, "%.3f / %.3f", p2->est_seconds(0) * 1e3, p2->est_seconds(1) * 1e3);
            return std::string(b);
          }());
  add_row("pipeline: 1 device, median ms", t1, "%.2f");
  add_row("pipeline: 2 devices, median ms", t2, "%.2f");
  add_row("pipeline: 1 device, ms per micro-batch", t1 / m, "%.3f");
  add_row("pipeline: ideal speedup", ideal, "%.3f");
  // Gaps between the steps of consecutive jobs: the device stays fed only if
  // the runtime dispatches ahead. Windows are per device ([its first compute
  // start, its last compute end]), so pipeline fill and drain are outside.
  const double i1 = idle_of(tr1, all_jobs, 0, false).fraction;
  add_row("pipeline: 1 device, compute idle fraction", i1, "%.4f");
  auto busy_ms = [](const ag::trace& t, int device) {
    return static_cast<double>(union_ns(compute_intervals(t, device))) / 1e6;
  };
  add_row("pipeline: 2 devices, compute busy ms dev 0 / 1", [&] {
    char b[64];
    std::snprintf(b, sizeof b, "%.2f / %.2f", busy_ms(tr2, 0), busy_ms(tr2, 1));
    return std::string(b);
  }());
  add_row("pipeline: 2 devices, idle fraction dev 0 / 1", [&] {
    char b[64];
    std::snprintf(b, sizeof b, "%.4f / %.4f", idle_of(tr2, all_jobs, 0, false).fraction,
                  idle_of(tr2, all_jobs, 1, false).fraction);
    return std::string(b);
  }());
  // Where the 2-device round loses time against the ideal: before the first
  // compute step, after the last one, and in gaps between compute steps.
  {
    int64_t first = INT64_MAX, last = INT64_MIN;
    for (const auto& r : tr2.records)
      if (is_compute(r)) {
        first = std::min(first, r.start_ns);
        last = std::max(last, r.end_ns);
      }
    if (first < last) {
      char b[96];
      std::snprintf(b, sizeof b, "%.3f / %.3f", static_cast<double>(first - span2.first) / 1e6,
                    static_cast<double>(span2.second - last) / 1e6);
      add_row("pipeline: 2 devices, submit -> first compute / last compute -> all ready, ms", b);
    }
    int64_t first_on[2] = {INT64_MAX, INT64_MAX}, last_on[2] = {INT64_MIN, INT64_MIN};
    for (const auto& r : tr2.records)
      if (is_compute(r) && r.device >= 0 && r.device < 2) {
        first_on[r.device] = std::min(first_on[r.device], r.start_ns);
        last_on[r.device] = std::max(last_on[r.device], r.end_ns);
      }
    add_row("pipeline: 2 devices, fill (dev 1 first start - dev 0 first start), ms",
            static_cast<double>(first_on[1] - first_on[0]) / 1e6, "%.3f");
    add_row("pipeline: 2 devices, drain (dev 1 last end - dev 0 last end), ms",
            static_cast<double>(last_on[1] - last_on[0]) / 1e6, "%.3f");
    // The longest gap on each device: was the next step enqueued late (the
    // host fell behind) or enqueued in time but waiting for its input copy?
    for (int d = 0; d < 2; ++d) {
      std::vector<const ag::trace_record*> cs;
      for (const auto& r : tr2.records)
        if (r.device == d && is_compute(r)) cs.push_back(&r);
      std::sort(cs.begin(), cs.end(), [](auto* a, auto* b) { return a->start_ns < b->start_ns; });
      const ag::trace_record* before = nullptr;
      const ag::trace_record* after = nullptr;
      int64_t longest = 0;
      for (std::size_t i = 1; i < cs.size(); ++i)
        if (cs[i]->start_ns - cs[i - 1]->end_ns > longest) {
          longest = cs[i]->start_ns - cs[i - 1]->end_ns;
          before = cs[i - 1];
          after = cs[i];
        }
      if (!after || longest < 50'000) continue;
      const auto rel = [&](int64_t t) { return static_cast<double>(t - before->end_ns) / 1e3; };
      std::string detail = "job " + std::to_string(after->job) + " at +" +
                           std::to_string(static_cast<int>(static_cast<double>(before->end_ns - first_on[d]) / 1e6)) +
                           " ms; relative to the gap's start (us): next step enqueued " +
                           std::to_string(static_cast<int>(rel(after->enqueue_ns))) + ", started " +
                           std::to_string(static_cast<int>(rel(after->start_ns)));
      // Every other step of that job, on both devices: a late upstream step
      // means the job started late; an upstream step in time but a late
      // copy or split here means a message waited between actors.
      for (const auto& r : tr2.records)
        if (r.job == after->job && &r != after)
          detail += "; dev " + std::to_string(r.device) + " " + r.lane + " enqueued " +
                    std::to_string(static_cast<int>(rel(r.enqueue_ns))) + " ran " +
                    std::to_string(static_cast<int>(rel(r.start_ns))) + ".." + std::to_string(static_cast<int>(rel(r.end_ns)));
      add_row("pipeline: 2 devices, dev " + std::to_string(d) + " longest gap", detail);
    }
    for (int d = 0; d < 2; ++d) {
      const auto g = gaps_of(tr2, d, 20);
      char b[96];
      std::snprintf(b, sizeof b, "%d / %.3f / %.1f", g.count, g.total_ms, g.longest_us);
      add_row("pipeline: 2 devices, dev " + std::to_string(d) + " gaps > 20 us: count / ms / longest us", b);
    }
  }
  figure("e2e_gpu_idle_fraction_batch_m" + std::to_string(m), i1);
  figure("pipeline_speedup" + tag, speedup);
  figure("pipeline_efficiency" + tag, median(efficiencies));
  if (o.pipeline_runs > 1) {
    figure("pipeline_efficiency_min" + tag, worst);
    figure("pipeline_efficiency_max" + tag, *std::max_element(efficiencies.begin(), efficiencies.end()));
  }
}

}  // namespace

int main(int argc, char** argv) {
  options o;
  if (auto status = parse(argc, argv, o)) return *status;
  auto rt = make_runtime(o);
  {
    std::string names;
    for (const auto& d : rt->devices()) names += (names.empty() ? "" : ", ") + d.name;
    add_row("devices", o.devices + " (" + names + ")");
    add_row("job outputs", o.pageable_outputs ? "heap (--pageable-outputs)" : "device host memory (pinned on CUDA)");
    add_row("CAF scheduler: max throughput / idle steal us (0: CAF default)",
            std::to_string(o.sched_max_throughput) + " / " + std::to_string(o.sched_idle_steal_us));
  }
  if (!o.skip_forward) run_forward(o, *rt);
  if (!o.skip_completion) run_completion(o, *rt);
  if (!o.skip_pipeline) run_pipeline(o, *rt);

  std::size_t w = 12;
  for (const auto& r : table) w = std::max(w, r.name.size());
  std::printf("%-*s  %s\n", static_cast<int>(w), "measurement", "value");
  for (const auto& r : table) std::printf("%-*s  %s\n", static_cast<int>(w), r.name.c_str(), r.value.c_str());
  for (const auto& [name, v] : figures) std::printf("%s: %.6g\n", name.c_str(), v);
  std::fflush(stdout);
  return 0;
}
