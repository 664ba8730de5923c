// actorgraph-bench: runtime figures on simulated devices.
//   dispatch_us_per_split      host cost of the actor runtime per compute split
//                              (zero-delay, timing-only sim devices: the device
//                              costs nothing, so wall time is all runtime).
//                              Jobs of 32 layers x 16 branches on 2 devices: 96
//                              splits, but about 21 ops per split, launched one
//                              by one through the sim. The table also shows
//                              6-split jobs (fixed per-job cost) and 1-3 op
//                              splits (2 branches: the runtime's own cost).
//                              Graph replay is off for these (each split is a
//                              message and a launch: the runtime's own cost);
//                              dispatch_us_per_split_replayed is the same
//                              jobs as compiled by default (replayed segments).
//   tiny_jobs_per_s            (--dispatch-only=4) the same tiny jobs, --in-flight
//                              of them in flight over as many arenas: jobs/s
//   submit_to_then_us          median round trip of a tiny one-kernel job
//                              (x + w, 256 floats: h2d, one add, d2h), from
//                              submit() to its then() continuation, one job at
//                              a time, on --then-devices (default sim:1, an
//                              instant sim device: the runtime's own round
//                              trip; cpu:1 or cuda:0 for a real device)
//   pipeline_speedup_n4_m16    4 sim devices, one stage each, 16 micro-batch
//                              jobs submitted together, vs the same model on 1
//   pipeline_efficiency_n4_m16 speedup / (N*M / (M+N-1)), the ideal for a
//                              pipeline of N equal stages and M micro-batches
// Flags (--name=value or --name value; --help lists them with their defaults):
//   --devices=4 --micro=16 --stage-ms=2 --repeats=3
//   --dispatch-jobs=2000 --dispatch-layers=32 --dispatch-branches=16 --dispatch-devices=2
//   --in-flight=64 --threads=0 (CAF scheduler threads, 0: default)
//   --sched-max-throughput=1 --sched-idle-steal-us=1000 (runtime_options::scheduler_*, 0: CAF's default)
//   --then-devices=sim:1 --then-jobs=2000
//   --dispatch-only=1 (many-split jobs only) / =2 (6-split jobs) / =3 (1-3 op splits): for profilers
//                   / =4 (submit_to_then_us only; with -DACTORGRAPH_HOP_PROBES=ON also its hop table)
//                   / =5 (its round trip cut into hops, trace on)
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <string>

#include "actors/actorgraph.hpp"
#include "apps/common/flags.hpp"

namespace {

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

[[noreturn]] void die(const std::string& what, const ag::error& e) {
  std::fprintf(stderr, "actorgraph-bench: %s: %s\n", what.c_str(), e.to_string().c_str());
  std::exit(1);
}

/// x -> `branches` independent chains (matmul, gelu, scale) -> summed: with
/// several lanes the planner gives each chain its own split.
ag::graph dispatch_graph(int branches, int layers) {
  ag::graph_builder b;
  auto x = b.input("x", ag::dtype::f32, {8, 32});
  ag::tensor acc;
  for (int l = 0; l < layers; ++l) {
    b.set_layer(l);
    ag::tensor sum;
    for (int i = 0; i < branches; ++i) {
      const std::string n = "l" + std::to_string(l) + ".b" + std::to_string(i);
      auto w = b.weight(n + ".w", ag::host_tensor::random_normal(ag::dtype::f32, {32, 32}, 100 * l + i, 0.1f));
      auto h = b.scale(b.gelu(b.matmul(l == 0 ? x : acc, w, false, false, n + ".mm"), ag::gelu_mode::tanh, n + ".act"),
                       0.5f, n + ".scale");
      sum = sum.valid() ? b.add(sum, h, n + ".sum") : h;
    }
    acc = sum;
  }
  b.output(acc);
  auto g = std::move(b).build();
  if (!g) die("dispatch graph", g.err());
  return std::move(*g);
}

/// `stages` layers, each one matmul [rows, d] x [d, d] + gelu.
ag::graph pipeline_graph(int stages, int64_t rows, int64_t d) {
  ag::graph_builder b;
  auto h = b.input("x", ag::dtype::f32, {rows, d});
  for (int l = 0; l < stages; ++l) {
    b.set_layer(l);
    auto w = b.weight("w" + std::to_string(l), ag::host_tensor::random_normal(ag::dtype::f32, {d, d}, l, 0.05f));
    h = b.gelu(b.matmul(h, w, false, false, "mm" + std::to_string(l)), ag::gelu_mode::tanh, "act" + std::to_string(l));
  }
  b.output(h);
  auto g = std::move(b).build();
  if (!g) die("pipeline graph", g.err());
  return std::move(*g);
}

/// Scheduler settings from the flags; every runtime of this benchmark starts from it.
ag::runtime_options base_options;

struct dispatch_result {
  double us_per_split = 0, us_per_step = 0, jobs_per_s = 0;
  int splits = 0, steps = 0, ops = 0;  // per job; ops: launched ops of the compute splits
};

/// Submits `count` jobs of `p`, at most `in_flight` of them unfinished at
/// once, and returns when all are done; a failed job ends the program.
void submit_in_flight(ag::runtime& rt, const std::shared_ptr<const ag::plan>& p, const std::vector<ag::host_tensor>& in,
                      int count, int in_flight, const char* what) {
  std::deque<ag::job> q;
  const auto finish_front = [&] {
    if (!q.front().wait().has_value()) die(what, q.front().wait().err());
    q.pop_front();
  };
  for (int i = 0; i < count; ++i) {
    if (static_cast<int>(q.size()) >= in_flight) finish_front();
    q.push_back(rt.submit(p, in));
  }
  while (!q.empty()) finish_front();
}

/// `replay`: off measures the runtime's own cost per split (each split is a
/// message and a launch); automatic lets the sim replay captured segments,
/// one launch per segment (what a job gets by default).
dispatch_result run_dispatch(int devices, int branches, int layers, int jobs, int in_flight, int threads,
                             ag::graph_replay_mode replay = ag::graph_replay_mode::off) {
  ag::runtime_options o = base_options;
  o.backend.sim.zero_delay = true;
  o.backend.sim.compute_values = false;
  o.arenas_per_device = in_flight;
  o.scheduler_threads = threads;
  o.trace = false;
  auto rt = ag::runtime::create("sim:" + std::to_string(devices), o);
  if (!rt) die("runtime", rt.err());
  ag::plan_options po;
  po.lanes_per_device = 4;
  po.min_branch_seconds = 0;
  po.pipeline_stages = devices;
  po.graph_replay = replay;
  auto p = (*rt)->compile(dispatch_graph(branches, layers), po);
  if (!p) die("compile (dispatch)", p.err());
  dispatch_result r;
  r.steps = static_cast<int>((*p)->steps().size());
  for (const auto& s : (*p)->steps())
    if (s.kind == ag::step_kind::compute) {
      ++r.splits;
      for (ag::node_id id : s.ops) r.ops += !ag::is_view_op((*p)->source().at(id).op) && !ag::is_leaf_op((*p)->source().at(id).op);
    }
  std::vector<ag::host_tensor> in{ag::host_tensor::random_normal(ag::dtype::f32, {8, 32}, 1)};
  auto run = [&](int n) { submit_in_flight(**rt, *p, in, n, in_flight, "dispatch job"); };
  run(std::min(jobs / 10 + 1, 1000));  // warm-up: event pools, arenas
  const double t0 = now_s();
  run(jobs);
  const double wall = now_s() - t0;
  r.us_per_split = wall * 1e6 / (static_cast<double>(jobs) * r.splits);
  r.us_per_step = wall * 1e6 / (static_cast<double>(jobs) * r.steps);
  r.jobs_per_s = jobs / wall;
  return r;
}

/// Median and p99 microseconds from submit() to the then() continuation of a
/// tiny one-kernel job on `devices`, one job at a time (`jobs` timed after 50
/// warm-ups).
struct then_result {
  double median_us = 0, p99_us = 0;
};

/// With `breakdown`, the trace is on and each timed job's round trip is cut
/// into hops (medians over the jobs, printed as a table): submit -> the first
/// step enqueued, then per step enqueue -> start (queueing, launch) and
/// start -> end (device), the hop from one step's end to the next step's
/// enqueue (completion seen, message, next actor), and the last end -> the
/// continuation. Tracing adds its own cost: the total is higher than the
/// untraced figure.
bool then_inline_copies = true;  // --inline-copies
bool then_replay_host_copies = true;  // --replay-host-copies
bool then_windows_in_place = true;    // --host-windows-in-place
bool then_pinned_inputs = true;  // --pinned-inputs

/// The tiny one-kernel job (x + w, 256 floats) compiled for one device of
/// `devices` in a runtime of `arenas` arenas per device (0: the default).
struct tiny_job {
  std::unique_ptr<ag::runtime> rt;
  std::shared_ptr<const ag::plan> p;
  std::vector<ag::host_tensor> in;
};

tiny_job make_tiny_job(const std::string& devices, int threads, bool trace, int arenas = 0) {
  ag::runtime_options o = base_options;
  o.backend.sim.zero_delay = true;
  o.backend.sim.compute_values = false;
  o.scheduler_threads = threads;
  o.trace = trace;
  if (arenas > 0) o.arenas_per_device = arenas;
  auto rt = ag::runtime::create(devices, o);
  if (!rt) die("runtime (" + devices + ")", rt.err());
  constexpr int64_t n = 256;
  ag::graph_builder b;
  auto x = b.input("x", ag::dtype::f32, {n});
  auto w = b.weight("w", ag::host_tensor::random_normal(ag::dtype::f32, {n}, 3, 1.0f));
  b.output(b.add(x, w, "y"));
  auto g = std::move(b).build();
  if (!g) die("tiny graph", g.err());
  ag::plan_options po;
  po.policy = ag::placement_policy::single;
  po.inline_small_copies = then_inline_copies;
  po.replay_host_copies = then_replay_host_copies;
  po.host_windows_in_place = then_windows_in_place;
  auto p = (*rt)->compile(std::move(*g), po);
  if (!p) die("compile (tiny)", p.err());
  return {std::move(*rt), std::move(*p), {ag::host_tensor::random_normal(ag::dtype::f32, {n}, 5, 1.0f)}};
}

/// Tiny jobs per second with `in_flight` of them in flight (as many arenas):
/// the runtime's throughput where each job is all overhead.
double run_tiny_throughput(const std::string& devices, int jobs, int in_flight, int threads) {
  tiny_job t = make_tiny_job(devices, threads, false, in_flight);
  auto run = [&](int count) { submit_in_flight(*t.rt, t.p, t.in, count, in_flight, "tiny job"); };
  run(std::max(4 * in_flight, 200));  // warm-up: every arena's graph captured
  const double t0 = now_s();
  run(jobs);
  return jobs / (now_s() - t0);
}

then_result run_submit_to_then(const std::string& devices, int jobs, int threads, bool breakdown = false) {
  tiny_job t = make_tiny_job(devices, threads, breakdown);
  std::vector<double> us;
  us.reserve(static_cast<std::size_t>(jobs));
  std::vector<std::pair<std::string, std::vector<double>>> hops;  // breakdown: name, per-job us
  std::atomic<int64_t> done_ns{0};
  for (int i = -50; i < jobs; ++i) {
    done_ns.store(0, std::memory_order_relaxed);
    const int64_t t0 = ag::gpu::host_clock_ns();
    ag::job j = t.rt->submit(t.p, t.in);
    j.then([&done_ns](const ag::job_result&) { done_ns.store(ag::gpu::host_clock_ns(), std::memory_order_release); });
    if (!j.wait().has_value()) die("tiny job", j.wait().err());
    // wait() may return just before the continuation has run: bounded spin.
    const int64_t deadline = ag::gpu::host_clock_ns() + 10'000'000'000;
    int64_t t1;
    while ((t1 = done_ns.load(std::memory_order_acquire)) == 0)
      if (ag::gpu::host_clock_ns() > deadline) die("tiny job", {ag::errc::internal, "then() did not run within 10 s"});
    if (i >= 0) us.push_back(static_cast<double>(t1 - t0) / 1e3);
    if (breakdown) {
      auto tr = t.rt->take_trace();
      if (i < 0) continue;
      auto& r = tr.records;
      std::sort(r.begin(), r.end(), [](const auto& a, const auto& b) { return a.start_ns < b.start_ns; });
      if (r.empty()) continue;
      std::vector<std::pair<std::string, double>> row;
      row.emplace_back("submit -> first enqueue", static_cast<double>(r.front().enqueue_ns - t0) / 1e3);
      for (std::size_t k = 0; k < r.size(); ++k) {
        const std::string name = r[k].lane;
        if (k > 0) row.emplace_back("  end -> enqueue " + name, static_cast<double>(r[k].enqueue_ns - r[k - 1].end_ns) / 1e3);
        row.emplace_back("  " + name + ": enqueue -> start", static_cast<double>(r[k].start_ns - r[k].enqueue_ns) / 1e3);
        row.emplace_back("  " + name + ": start -> end", static_cast<double>(r[k].end_ns - r[k].start_ns) / 1e3);
      }
      row.emplace_back("last end -> continuation", static_cast<double>(t1 - r.back().end_ns) / 1e3);
      if (hops.empty()) hops.resize(row.size());
      if (hops.size() == row.size())
        for (std::size_t k = 0; k < row.size(); ++k) {
          hops[k].first = row[k].first;
          hops[k].second.push_back(row[k].second);
        }
    }
  }
  if (breakdown) {
    std::printf("%-40s %12s\n", ("round trip hops, " + devices + " (trace on)").c_str(), "median us");
    for (auto& [name, v] : hops) {
      std::sort(v.begin(), v.end());
      if (!v.empty()) std::printf("%-40s %12.1f\n", name.c_str(), v[v.size() / 2]);
    }
  }
  std::sort(us.begin(), us.end());
  then_result r;
  r.median_us = us[us.size() / 2];
  r.p99_us = us[std::min(us.size() - 1, us.size() * 99 / 100)];
  return r;
}

double run_pipeline(int devices, int stages, int micro, double stage_ms, int repeats, int threads) {
  ag::runtime_options o = base_options;
  // A slow f32 unit so that one stage (2 * rows * d * d flops) takes stage_ms
  // of simulated (= wall, time_scale 1) time; copies stay in the microseconds.
  constexpr int64_t rows = 64, d = 256;
  o.backend.sim.spec.flops_f32 = 2.0 * rows * d * d / (stage_ms * 1e-3);
  o.backend.sim.compute_values = false;
  o.backend.sim.jitter = 0;
  o.backend.sim.time_scale = 1.0;
  o.arenas_per_device = micro;
  o.scheduler_threads = threads;
  o.trace = false;
  auto rt = ag::runtime::create("sim:" + std::to_string(devices), o);
  if (!rt) die("runtime", rt.err());
  ag::plan_options po;
  po.pipeline_stages = devices;
  auto p = (*rt)->compile(pipeline_graph(stages, rows, d), po);
  if (!p) die("compile (pipeline)", p.err());
  std::vector<std::vector<ag::host_tensor>> ins(static_cast<std::size_t>(micro));
  for (int m = 0; m < micro; ++m) ins[static_cast<std::size_t>(m)] = {ag::host_tensor::random_normal(ag::dtype::f32, {rows, d}, m)};
  double best = 1e30;
  for (int r = 0; r < repeats + 1; ++r) {  // first round warms up
    const double t0 = now_s();
    auto jobs = (*rt)->submit_batch(*p, ins);
    for (auto& j : jobs)
      if (!j.wait().has_value()) die("pipeline job", j.wait().err());
    const double t = now_s() - t0;
    if (r > 0) best = std::min(best, t);
  }
  return best;
}

}  // namespace

int main(int argc, char** argv) {
  int n = 4, m = 16, repeats = 3, threads = 0;
  double stage_ms = 2.0;
  int dispatch_devices = 2, branches = 16, layers = 32, dispatch_jobs = 2000, in_flight = 64, only = 0;
  std::string then_devices = "sim:1";
  int then_jobs = 2000;
  ag::apps::flags app("actorgraph-bench",
                                      "actorgraph-bench: dispatch cost per split and pipeline speedup on simulated devices");
  app.add_option("--devices", n, "sim devices (= pipeline stages) for the pipeline figure")->check(CLI::Range(1, 1024));
  app.add_option("--micro", m, "micro-batch jobs per pipeline round")->check(CLI::Range(1, 1000000));
  app.add_option("--stage-ms", stage_ms, "simulated milliseconds per pipeline stage")->check(CLI::PositiveNumber);
  app.add_option("--repeats", repeats, "pipeline rounds (the best counts)")->check(CLI::Range(1, 1000));
  app.add_option("--threads", threads, "CAF scheduler threads (0: auto, runtime_options::scheduler_threads)")->check(CLI::NonNegativeNumber);
  app.add_option("--sched-max-throughput", base_options.scheduler_max_throughput,
                 "runtime_options::scheduler_max_throughput (0: CAF's default)");
  app.add_option("--sched-idle-steal-us", base_options.scheduler_idle_steal_us,
                 "runtime_options::scheduler_idle_steal_us (0: CAF's default)");
  app.add_option("--dispatch-devices", dispatch_devices, "devices of the dispatch jobs")->check(CLI::Range(1, 1024));
  app.add_option("--dispatch-branches", branches, "independent chains per dispatch job")->check(CLI::Range(1, 4096));
  app.add_option("--dispatch-layers", layers, "layers of each chain")->check(CLI::Range(1, 4096));
  app.add_option("--dispatch-jobs", dispatch_jobs, "dispatch jobs timed")->check(CLI::Range(1, 100000000));
  app.add_option("--in-flight", in_flight, "dispatch jobs in flight at once")->check(CLI::Range(1, 1000000));
  app.add_option("--then-devices", then_devices, "device spec of the submit_to_then_us figure (sim:1, cpu:1, cuda:0)");
  app.add_option("--then-jobs", then_jobs, "tiny jobs timed for submit_to_then_us")->check(CLI::Range(1, 10000000));
  app.add_option("--start-on-submit", base_options.start_jobs_on_submit,
                 "on|off: runtime_options::start_jobs_on_submit (a job with free arenas starts from submit)");
  app.add_option("--spare-job-actors", base_options.spare_job_actors,
                 "runtime_options::spare_job_actors (job actors spawned ahead of their jobs; 0: spawned by submit)")
      ->check(CLI::Range(0, 1024));
  app.add_option("--pinned-inputs", then_pinned_inputs,
                 "on|off: runtime_options::pinned_inputs_max_bytes 64 KiB or 0 (submit copies small inputs to pinned memory)");
  app.add_option("--inline-copies", then_inline_copies,
                 "on|off: plan_options::inline_small_copies of the submit_to_then_us job (its copies on its compute lane)");
  app.add_option("--replay-host-copies", then_replay_host_copies,
                 "on|off: plan_options::replay_host_copies of the submit_to_then_us job (its copies inside its "
                 "replayed graph, through the arena's host window)");
  app.add_option("--host-windows-in-place", then_windows_in_place,
                 "on|off: plan_options::host_windows_in_place of the submit_to_then_us job (its add reads and writes "
                 "the arena's host window itself)");
  app.add_option("--dispatch-only", only,
                 "1: many-split jobs only, 2: 6-split jobs only, 3: 1-3 op splits only, 4: submit_to_then_us only "
                 "(for profilers); 5: submit_to_then's round trip cut into hops (trace on); 0: everything")
      ->check(CLI::Range(0, 5));
  if (auto status = ag::apps::parse_flags(app, argc, argv)) return *status;
  if (!then_pinned_inputs) base_options.pinned_inputs_max_bytes = 0;

  // Dispatch cost: jobs of many small splits (the headline figure), and small
  // jobs of 6 splits, where the fixed per-job cost (job actor, arenas, handle)
  // is spread over few splits.
  if (only == 5) {
    (void)run_submit_to_then(then_devices, then_jobs, threads, /*breakdown=*/true);
    return 0;
  }
  if (only == 4) {
    const auto t = run_submit_to_then(then_devices, then_jobs, threads);
    std::printf("submit_to_then_us_p99 (%s): %.1f\nsubmit_to_then_us: %.1f\n", then_devices.c_str(), t.p99_us,
                t.median_us);
    // A build with -DACTORGRAPH_HOP_PROBES=ON: where the round trips went
    // (before the throughput run's jobs stamp the table too).
    std::fputs(ag::hop_probe_report().c_str(), stdout);
    std::printf("tiny_jobs_per_s (%s, %d in flight): %.0f\n", then_devices.c_str(), in_flight,
                run_tiny_throughput(then_devices, then_jobs * 4, in_flight, threads));
    return 0;
  }
  if (only != 0) {
    auto r = only == 1   ? run_dispatch(dispatch_devices, branches, layers, dispatch_jobs, in_flight, threads)
             : only == 2 ? run_dispatch(dispatch_devices, branches, dispatch_devices, dispatch_jobs, in_flight, threads)
                         : run_dispatch(dispatch_devices, 2, layers, dispatch_jobs, in_flight, threads);
    std::printf("splits per job %d, steps %d, jobs/s %.0f\ndispatch_us_per_split: %.3f\n", r.splits, r.steps,
                r.jobs_per_s, r.us_per_split);
    return 0;
  }
  auto d = run_dispatch(dispatch_devices, branches, layers, dispatch_jobs, in_flight, threads);
  auto small = run_dispatch(dispatch_devices, branches, dispatch_devices, dispatch_jobs * 10, in_flight, threads);
  // The planner packs most branches of a layer into one split (about 21 ops
  // per split above); with 2 branches per layer a split is 1-3 ops, so the
  // device's per-op cost hardly counts and the figure is the runtime's own.
  auto tiny = run_dispatch(dispatch_devices, 2, layers, dispatch_jobs * 4, in_flight, threads);
  // The same many-split jobs with graph replay as compiled by default.
  auto replayed = run_dispatch(dispatch_devices, branches, layers, dispatch_jobs, in_flight, threads,
                               ag::graph_replay_mode::automatic);
  const auto then = run_submit_to_then(then_devices, then_jobs, threads);
  const double t1 = run_pipeline(1, n, m, stage_ms, repeats, threads);
  const double tn = run_pipeline(n, n, m, stage_ms, repeats, threads);
  const double speedup = t1 / tn;
  const double ideal = static_cast<double>(n) * m / (m + n - 1);

  std::printf("%-34s %12s\n", "measurement", "value");
  std::printf("%-34s %12d\n", "dispatch: compute splits per job", d.splits);
  std::printf("%-34s %12d\n", "dispatch: steps (splits+copies)", d.steps);
  std::printf("%-34s %12.0f\n", "dispatch: jobs per second", d.jobs_per_s);
  std::printf("%-34s %12.3f\n", "dispatch: us per step", d.us_per_step);
  std::printf("%-34s %12.1f\n", "dispatch: ops per split", static_cast<double>(d.ops) / d.splits);
  std::printf("%-34s %12d\n", "small jobs: compute splits per job", small.splits);
  std::printf("%-34s %12.0f\n", "small jobs: jobs per second", small.jobs_per_s);
  std::printf("%-34s %12.3f\n", "small jobs: us per split", small.us_per_split);
  std::printf("%-34s %12d\n", "1-3 op splits: splits per job", tiny.splits);
  std::printf("%-34s %12.1f\n", "1-3 op splits: ops per split", static_cast<double>(tiny.ops) / tiny.splits);
  std::printf("%-34s %12.3f\n", "1-3 op splits: us per split", tiny.us_per_split);
  std::printf("%-34s %12.3f\n", "replayed: us per split", replayed.us_per_split);
  std::printf("%-34s %12.1f\n", ("submit -> then, p99 us, " + then_devices).c_str(), then.p99_us);
  std::printf("%-34s %12.2f\n", "pipeline: 1 device, ms", t1 * 1e3);
  std::printf("%-34s %12.2f\n", ("pipeline: " + std::to_string(n) + " devices, ms").c_str(), tn * 1e3);
  std::printf("%-34s %12.3f\n", "pipeline: ideal speedup", ideal);
  std::printf("dispatch_us_per_split: %.3f\n", d.us_per_split);
  std::printf("dispatch_us_per_split_replayed: %.3f\n", replayed.us_per_split);
  std::printf("submit_to_then_us: %.1f\n", then.median_us);
  std::printf("pipeline_speedup_n%d_m%d: %.3f\n", n, m, speedup);
  std::printf("pipeline_efficiency_n%d_m%d: %.3f\n", n, m, speedup / ideal);
  return 0;
}
