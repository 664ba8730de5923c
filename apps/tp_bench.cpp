// actorgraph-tp-bench: tensor-parallel figures.
//   tp_speedup_2_sim, tp_speedup_4_sim  one LLaMA layer (d 8192, 64 heads, ff
//                            4 d, T 2048, B 2, bf16, vocab --vocab) run as jobs
//                            on 2 and 4 simulated H200s (NVLink figures of
//                            ../shared/DESIGN.md, values off) at tensor-parallel
//                            degree 2 / 4, against the same layer on 1: median
//                            job wall time over the sim time scale (--time-scale,
//                            default 50: a modelled ms takes 50 wall ms, so the
//                            host's dispatch overhead, which the sim does not
//                            model, weighs 1/50), one job in flight at a time
//   tp_overlap_gain_4_sim    degree 4 with tp_overlap off over on
//   tp_speedup_2_sim_modelled, tp_speedup_4_sim_modelled,
//   tp_overlap_gain_4_sim_modelled
//                            the same from a second run with the trace on:
//                            median modelled device span of a job (first
//                            step's start to last step's end), the host's
//                            share left out (what the CUDA figures measure)
// (--sequence-parallel off|on|auto: plan_options::sequence_parallel of every
// plan; auto, the default, runs these sequence parallel on sim)
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
// --allreduce=SPEC prints allreduce_us_<size>_<path> (8k, 64k, 256k, 1m, 16m;
// path: oneshot, ring on cpu / sim, instream on CUDA, nccl on distinct GPUs) and
// allreduce_crossover_bytes (what the runtime picks; -1: never)
// for the backend's one-shot all-reduce on those devices (cuda:0,0 on one GPU).
// --devices=KIND runs the runtime figures on another backend kind ("cpu",
// "cuda"; figure names then end in that kind); --small shrinks the layer
// (d 1024, 8 heads, T 256) for a quick run.
// --devices=cuda:all prints issues 14 / 15's figures instead, at degree N =
// the GPU count (--same-gpu --degree N: N logical devices of GPU 0, which
// checks the program, not the speedups):
//   tpN_layer_speedup        the layer's device span (a job's first step's
//                            start to its last step's end, from the trace:
//                            what PyTorch's CUDA events around its layer
//                            measure) on 1 GPU over on N
//   tpN_layer_device_ms, layer_device_ms_1gpu   those spans
//   tpN_layer_speedup_wall, tpN_layer_ms, layer_ms_1gpu   the same by job
//                            wall time (submit to future, the host's hops in)
//   tpN_start_skew_us        median over jobs of how far apart the GPUs
//                            began the job (the latest first step start
//                            minus the earliest; trace)
//   tpN_gpu_busy_fraction    least member's compute-lane busy share of the
//                            last job's span (trace)
//   tpN_sim_error            the sim's time for the N-way plan, from the
//                            GPUs' own device specs, over the measured
//                            device span (the sim models devices, not hosts)
//   sim_error_1gpu           the same on one GPU
//   tpN_decode_step_speedup  a LLaMA 7B-shaped decode step (--decode-layers,
//                            B 1, T 1, no cache) on 1 GPU vs on N (job wall
//                            ms, trace off), with decode_step_ms_1gpu and
//                            tpN_decode_step_ms
// With --trace FILE: the N-GPU layer's trace in FILE, the 1-GPU layer's in
// FILE-1gpu, and a few decode steps' in FILE-decode-1gpu / -decode-tpN.
// Then, with 4 or more devices (GPUs, or --same-gpu --degree 4) and unless
// --no-layouts, issue 15's layout comparison; --layouts runs it alone, on
// any kind but cpu (sim: 4 simulated H200s, values off, wall over the time
// scale; cuda: GPUs 0..3, or --same-gpu: GPU 0 four times). A 24-layer LLaMA
// (d 4096, 32 heads, ff 11008, vocab 32000, bf16; --layout-layers), 16
// micro-batches (--layout-microbatches) of B 1 x T 512 (--layout-seq) each,
// i.e. 16 jobs of one plan submitted together (submit_batch), timed as
// rounds (submit to the last job done; two warm-up rounds, then the median of
// --layout-rounds 3, trace off) in four layouts, stages x devices per stage:
// 1 x 1 (a 1-device runtime), 2 x 2, 4 x 1 and 1 x 4:
//   pp2xtp2_speedup          1 x 1's round over 2 x 2's
//   pp2xtp2_vs_pp4           4 x 1's over 2 x 2's (>1: 2 x 2 wins)
//   pp2xtp2_vs_tp4           1 x 4's over 2 x 2's
//   pp_layout_ms_1x1, pp_layout_ms_2x2, pp_layout_ms_4x1, pp_layout_ms_1x4
//                            the median round wall ms
// (on sim each name ends in _sim); the table also names the winning layout
// and its margin, and each layout's arena and weight bytes per device. With
// --trace FILE, one more 2 x 2 round, on a runtime of its own with the trace
// on, in FILE-pp2xtp2 (the timed rounds stay untraced).
// --op-profile prints each op's GPU time in the layer instead (1 GPU, then N).
// scripts/gpu-tp.sh runs them with the tests and PyTorch's layer.
// Prints a table, then `name: value` lines.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <ctime>
#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "actors/actorgraph.hpp"
#include "apps/common/flags.hpp"
#include "apps/common/trace_spans.hpp"
#include "apps/common/warm_up.hpp"
#include "gpu/collective_path.hpp"
#ifdef ACTORGRAPH_HAVE_CUDA
#include "gpu/cuda/cuda_testing.hpp"
#endif
#include "gpu/device.hpp"
#include "graph/models/transformer.hpp"
#include "graph/plan.hpp"
#include "graph/weight_source.hpp"

namespace {

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


/// Values the layer's weights "have" on a timing-only device: zeros made on
/// read (no d 8192 model is kept in host memory; the sim does not read them).
class zero_weight final : public ag::weight_source {
 public:
  zero_weight(ag::dtype t, ag::shape d) : type_(t), dims_(d) {}
  ag::dtype type() const noexcept override { return type_; }
  const ag::shape& dims() const noexcept override { return dims_; }
  ag::error read_slice(int dim, int64_t begin, int64_t end, void* dst) const override {
    std::memset(dst, 0, static_cast<std::size_t>(slice_bytes(dim, end - begin)));
    return {};
  }
  std::string origin() const override { return "zeros (tp bench)"; }

 private:
  ag::dtype type_;
  ag::shape dims_;
};

struct run_result {
  double median_ms = 0;
  /// With the trace on: median over the timed jobs of each job's device
  /// span (its first step's start to its last step's end, over all
  /// devices): the time the GPUs spent on the job, what PyTorch's CUDA
  /// events around its layer measure; without the host's submit and
  /// completion hops, which median_ms includes. 0 when the trace is off.
  double device_ms = 0;
  /// With the trace on: medians over the timed jobs of how far apart the
  /// devices started each job (first step's start on the GPUs, first
  /// enqueue on the host), in us (trace_spans.hpp, job_start_skews).
  double start_skew_us = 0;
  double enqueue_skew_us = 0;
  int collectives = 0;  ///< collective parts per job
  /// With layer_run::busy: per device, the fraction of the last job's span
  /// (first step start to last step end, over all devices) in which one of
  /// its compute lanes ran a step.
  std::vector<double> busy;
};

/// One runtime configuration of time_layer.
struct layer_run {
  std::string kind = "sim";  ///< sim, cpu, cuda
  int n = 1;                 ///< devices = tensor-parallel degree (1: none)
  bool overlap = true;       ///< plan_options::tp_overlap
  bool same_gpu = false;     ///< cuda: the n devices are logical devices of GPU 0
  double time_scale = 50;    ///< sim: wall seconds per modelled second
  ag::device_spec sim_spec = h200(0);
  std::string trace_out;     ///< Chrome trace of the runs, when not empty
  bool busy = false;         ///< trace on; fill run_result::busy
  bool spans = false;        ///< trace on (run_result::device_ms), no file
  bool replay_off = false;   ///< plan_options::graph_replay off (plain launches)
};

/// Compute-lane busy fraction of each device over the last job's span.
std::vector<double> busy_fractions(const ag::trace& t, int devices) {
  const auto spans = ag::apps::job_spans(t);
  std::vector<double> busy(static_cast<std::size_t>(devices), 0.0);
  if (spans.empty()) return busy;
  const uint64_t last = spans.rbegin()->first;
  const auto [lo, hi] = spans.rbegin()->second;
  std::vector<std::vector<std::pair<int64_t, int64_t>>> on(static_cast<std::size_t>(devices));
  for (const auto& r : t.records)
    if (r.job == last && r.end_ns > r.start_ns && r.lane.rfind("compute", 0) == 0 && r.device >= 0 && r.device < devices)
      on[static_cast<std::size_t>(r.device)].emplace_back(r.start_ns, r.end_ns);
  for (int d = 0; d < devices; ++d) {
    auto& v = on[static_cast<std::size_t>(d)];
    std::sort(v.begin(), v.end());
    int64_t covered = 0, at = lo;
    for (const auto& [a, b] : v) {  // union of the lanes' intervals
      const int64_t from = std::max(a, at);
      if (b > from) covered += b - from;
      at = std::max(at, b);
    }
    busy[static_cast<std::size_t>(d)] = static_cast<double>(covered) / static_cast<double>(hi - lo);
  }
  return busy;
}

using ag::apps::warm_up_jobs;  // apps/common/warm_up.hpp

/// Median of `value(job)` over the jobs of a per-job map (ascending job ids)
/// after the first warm_up_jobs (all of them when there are no more); 0 for none.
template <typename PerJob, typename Value>
double median_after_warm_up(const PerJob& jobs, const Value& value) {
  std::vector<double> v;
  const bool skip = jobs.size() > static_cast<std::size_t>(warm_up_jobs);
  int k = 0;
  for (auto it = jobs.begin(); it != jobs.end(); ++it, ++k)
    if (!skip || k >= warm_up_jobs) v.push_back(value(it->second));
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

/// Median over the jobs after the warm-up of each job's device span in `t`,
/// in ms; 0 when the trace holds none.
double median_device_span_ms(const ag::trace& t) {
  return median_after_warm_up(ag::apps::job_spans(t),
                              [](const auto& span) { return static_cast<double>(span.second - span.first) / 1e6; });
}

/// Medians over the jobs after the warm-up of job_start_skews: {start,
/// enqueue} in us.
std::pair<double, double> median_start_skews_us(const ag::trace& t) {
  const auto skews = ag::apps::job_start_skews(t);
  return {median_after_warm_up(skews, [](const ag::apps::start_skew& k) { return static_cast<double>(k.start) / 1e3; }),
          median_after_warm_up(skews, [](const ag::apps::start_skew& k) { return static_cast<double>(k.enqueue) / 1e3; })};
}

/// The device spec of `c`: sim / cpu take a count; cuda takes ordinals: GPUs
/// 0..n-1, or GPU 0 n times (--same-gpu: logical devices of one GPU).
std::string devices_of(const layer_run& c) {
  if (c.kind != "cuda") return c.kind + ":" + std::to_string(c.n);
  std::string spec = "cuda:";
  for (int k = 0; k < c.n; ++k) spec += (k ? "," : "") + std::to_string(c.same_gpu ? 0 : k);
  return spec;
}

/// A runtime over `c`'s devices (sim: c.sim_spec, values off, no jitter, at
/// c.time_scale), its trace on or off, `arenas` jobs of a plan holding memory
/// on a device at once.
/// --gemv / --pdl: backend_options::cuda_gemv / cuda_pdl of every runtime the bench makes.
bool cuda_gemv = true;
bool cuda_pdl = true;
/// --in-stream: plan_options::in_stream_collectives of every plan the bench runs.
ag::in_stream_mode in_stream_collectives = ag::in_stream_mode::distinct_gpus;
/// --fusion off: plan_options::fuse_ops and fuse_projections off in every
/// plan the bench runs (the decode step's attention chain and projections
/// kernel by kernel, as before session 11 / 21).
bool fusion = true;
/// --tiny-job-path off: jobs start through the device and job actors, small
/// inputs are not pinned at submit and small copies keep their copy queues
/// (runtime_options::start_jobs_on_submit, pinned_inputs_max_bytes,
/// plan_options::inline_small_copies), as before session 15.
bool tiny_job_path = true;
/// --sequence-parallel: plan_options::sequence_parallel of every plan the bench runs.
ag::sequence_parallel_mode sequence_parallel = ag::sequence_parallel_mode::automatic;
/// --output-pieces: plan_options::output_pieces of every plan the bench runs.
bool output_pieces = true;
/// --copy-engine: backend_options::cuda_copy_engine_collectives of every runtime the bench makes.
bool cuda_copy_engine = ag::gpu::backend_options{}.cuda_copy_engine_collectives;
/// --sp-min-kib: backend_options::cuda_sequence_parallel_min_bytes of every runtime the bench makes.
int64_t sequence_parallel_min_bytes = ag::gpu::backend_options{}.cuda_sequence_parallel_min_bytes;
/// --chunks: plan_options::tp_overlap_chunks of every plan the bench runs.
int overlap_chunks = 0;
/// --elide-concats: plan_options::elide_concats of every plan the bench runs.
bool elide_concats = true;
/// --fold-norms: plan_options::fold_norm_weights of every plan the bench runs.
bool fold_norm_weights = true;
/// --order-steps: plan_options::order_steps_by_model of every plan the bench
/// compiles.
bool order_steps = true;
/// --batch-chunks: plan_options::tp_batch_chunks of every plan the bench compiles.
ag::batch_chunks_mode batch_chunks = ag::batch_chunks_mode::automatic;
/// --hand-over-lane: plan_options::hand_over_lane of every plan the bench compiles.
bool hand_over_lane = true;
/// --job-lanes: plan_options::job_lanes of every plan the bench compiles (0: auto).
int job_lanes = 0;

/// The plan options the command-line flags above set (every plan the bench
/// compiles starts from these).
ag::plan_options flag_plan_options() {
  ag::plan_options po;
  po.in_stream_collectives = in_stream_collectives;
  po.fuse_ops = po.fuse_projections = fusion;
  po.sequence_parallel = sequence_parallel;
  po.output_pieces = output_pieces;
  po.tp_overlap_chunks = overlap_chunks;
  po.elide_concats = elide_concats;
  po.fold_norm_weights = fold_norm_weights;
  po.order_steps_by_model = order_steps;
  po.tp_batch_chunks = batch_chunks;
  po.hand_over_lane = hand_over_lane;
  po.inline_small_copies = tiny_job_path;
  po.job_lanes = job_lanes;
  return po;
}

std::unique_ptr<ag::runtime> runtime_of(const layer_run& c, bool trace, int arenas) {
  ag::runtime_options ro;
  ro.backend.cuda_gemv = cuda_gemv;
  ro.backend.cuda_pdl = cuda_pdl;
  ro.backend.cuda_copy_engine_collectives = cuda_copy_engine;
  ro.backend.cuda_sequence_parallel_min_bytes = sequence_parallel_min_bytes;
  ro.trace = trace;
  ro.arenas_per_device = arenas;
  ro.start_jobs_on_submit = tiny_job_path;
  if (!tiny_job_path) ro.pinned_inputs_max_bytes = 0;
  ro.backend.sim.spec = c.sim_spec;
  ro.backend.sim.spec.kind = ag::device_kind::sim;
  ro.backend.sim.compute_values = false;
  ro.backend.sim.time_scale = c.time_scale;
  ro.backend.sim.jitter = 0;
  const std::string spec = devices_of(c);
  auto rt = ag::runtime::create(spec, ro);
  if (!rt) die("runtime " + spec, rt.err());
  return std::move(*rt);
}

/// `t` as Chrome trace JSON in `path` (a message on stderr when it cannot be written).
void write_trace(const ag::trace& t, const std::string& path) {
  if (FILE* f = std::fopen(path.c_str(), "w")) {
    const std::string json = t.to_chrome_json();
    std::fwrite(json.data(), 1, json.size(), f);
    std::fclose(f);
  } else {
    std::fprintf(stderr, "actorgraph-tp-bench: cannot write %s\n", path.c_str());
  }
}

/// Runs warm_up_jobs and then `jobs` timed jobs of g, one at a time, as `c`
/// says; median wall ms of the timed ones (over the sim time scale on sim).
run_result time_layer(const layer_run& c, const std::shared_ptr<const ag::graph>& g,
                      const std::vector<ag::host_tensor>& in, int jobs) {
  const bool trace = !c.trace_out.empty() || c.busy || c.spans;
  const std::string spec = devices_of(c);
  auto rt = runtime_of(c, trace, 2);
  ag::plan_options po = flag_plan_options();
  if (c.n > 1) po.tensor_parallel = c.n;
  po.tp_overlap = c.overlap;
  if (c.replay_off) po.graph_replay = ag::graph_replay_mode::off;
  auto p = rt->compile(g, po);
  if (!p) die("compile at degree " + std::to_string(c.n) + " on " + spec, p.err());
  run_result r;
  for (const auto& s : (*p)->steps()) r.collectives += s.kind == ag::step_kind::collective;
  std::vector<double> ms;
  for (int k = 0; k < warm_up_jobs + jobs; ++k) {
    const auto t0 = std::chrono::steady_clock::now();
    const auto& res = rt->submit(*p, in).wait();
    // Wall ms over the scale: modelled ms plus the host's share, scaled down.
    const double t = ms_since(t0) / (c.kind == "sim" ? c.time_scale : 1.0);
    if (!res) die("job at degree " + std::to_string(c.n) + " on " + spec, res.err());
    if (k >= warm_up_jobs) ms.push_back(t);
  }
  std::sort(ms.begin(), ms.end());
  r.median_ms = ms[ms.size() / 2];
  if (trace) {
    const ag::trace t = rt->take_trace();
    if (c.busy) r.busy = busy_fractions(t, c.n);
    r.device_ms = median_device_span_ms(t) / (c.kind == "sim" ? c.time_scale : 1.0);
    std::tie(r.start_skew_us, r.enqueue_skew_us) = median_start_skews_us(t);
    if (!c.trace_out.empty()) write_trace(t, c.trace_out);
  }
  return r;
}


/// Per-call times of one all-reduce path (allreduce_us).
struct allreduce_times {
  double host_us = 0;  ///< wall per call, the host enqueueing as the GPUs run
  double gpu_us = -1;  ///< the devices' time per call (CUDA; -1 elsewhere)
};

/// allreduce_us_<size>_<path>: one member part per device of `spec` per
/// iteration, each member's stream waiting for every member's previous part
/// (the collective's barrier) unless the backend pairs the members on the
/// device, f32 operands of `bytes`. host_us: the time
/// per iteration once `iters` ran (after a warm-up), the host enqueueing
/// while the GPUs run, so the host's enqueue cost bounds it from below.
/// gpu_us (CUDA): every member's stream is held by a spin gate while the
/// host enqueues `gated` iterations, then released: the devices run them
/// back to back, and timing events after the gate and after the last one
/// on member 0 give the devices' time per call, the host's cost out of it.
allreduce_times allreduce_us(const std::string& spec, int64_t bytes, int iters, const std::string& path) {
  // The path is forced through the backend's own knobs: on CUDA the NCCL
  // crossover (1 byte: always NCCL; never: always one-shot), on cpu the
  // launch's algorithm (ring or one-shot).
  ag::gpu::backend_options bo;
  bo.cuda_nccl_min_bytes = bo.cuda_nccl_min_bytes_wide = path == "nccl" ? 1 : std::numeric_limits<int64_t>::max();
  auto devs = ag::gpu::make_devices(spec, bo);
  if (!devs) die("devices " + spec, devs.err());
  const int n = static_cast<int>(devs->size());
  const int64_t elems = bytes / 4;
  std::vector<ag::node> nodes;
  std::vector<ag::node_id> ins, outs;
  for (int k = 0; k < n; ++k) {
    ag::node x;
    x.id = static_cast<ag::node_id>(nodes.size());
    x.op = ag::op_kind::input;
    x.name = "x" + std::to_string(k);
    x.dims = ag::shape{elems};
    nodes.push_back(x);
    ins.push_back(x.id);
  }
  for (int k = 0; k < n; ++k) {
    ag::node ar;
    ar.id = static_cast<ag::node_id>(nodes.size());
    ar.op = ag::op_kind::all_reduce;
    ar.name = "sum" + std::to_string(k);
    ar.inputs = ins;
    ar.attrs.group = 0;
    ar.attrs.rank = k;
    nodes.push_back(ar);
    outs.push_back(ar.id);
  }
  auto g = ag::graph::from_nodes(nodes, ins, outs);
  if (!g) die("all-reduce graph", g.err());
  std::vector<std::unique_ptr<ag::gpu::stream>> streams;
  std::vector<std::unique_ptr<ag::gpu::event>> done;
  std::vector<void*> in(static_cast<std::size_t>(n)), out(static_cast<std::size_t>(n));
  std::vector<ag::gpu::device*> members;
  // instream: each member's part is a kernel of its compute stream, meeting
  // the others on the devices (collective_algo::in_stream); one job tag for
  // the run, a fresh key per call.
  const bool in_stream = path == "instream";
  for (int k = 0; k < n; ++k) {
    auto& d = (*devs)[static_cast<std::size_t>(k)];
    auto s = d->create_stream(in_stream ? ag::step_kind::compute : ag::step_kind::collective);
    if (!s) die("stream", s.err());
    streams.push_back(std::move(*s));
    auto e = d->create_event(false);
    if (!e) die("event", e.err());
    done.push_back(std::move(*e));
    auto a = d->allocate(bytes), b = d->allocate(bytes);
    if (!a || !b) die("allocate", a ? b.err() : a.err());
    in[static_cast<std::size_t>(k)] = *a;
    out[static_cast<std::size_t>(k)] = *b;
    members.push_back(d.get());
  }
  if (auto e = members.front()->prepare_collective_group(members)) die("collective group", e);
  std::vector<ag::gpu::collective_launch> parts(static_cast<std::size_t>(n));
  for (int k = 0; k < n; ++k) {
    auto& l = parts[static_cast<std::size_t>(k)];
    l.op = &g->at(outs[static_cast<std::size_t>(k)]);
    l.rank = k;
    l.bytes = bytes;
    l.algo = path == "oneshot" ? ag::collective_algo::one_shot : ag::collective_algo::ring;
    l.members = members;
    l.out = {out[static_cast<std::size_t>(k)], ag::dtype::f32, ag::shape{elems}, ag::strides{1}};
    for (int j = 0; j < n; ++j) l.inputs.push_back({in[static_cast<std::size_t>(j)], ag::dtype::f32, ag::shape{elems}, ag::strides{1}});
  }
  std::vector<ag::gpu::op_launch> in_stream_parts(static_cast<std::size_t>(n));
  for (int k = 0; k < n && in_stream; ++k) {
    auto& l = in_stream_parts[static_cast<std::size_t>(k)];
    l.op = parts[static_cast<std::size_t>(k)].op;
    l.out = parts[static_cast<std::size_t>(k)].out;
    l.inputs = parts[static_cast<std::size_t>(k)].inputs;
    l.collective.rank = k;
    l.collective.members = n;
    for (int j = 0; j < n; ++j) {
      l.collective.device_index[static_cast<std::size_t>(j)] = j;
      l.collective.devices[static_cast<std::size_t>(j)] = members[static_cast<std::size_t>(j)];
    }
    if (auto e = members[static_cast<std::size_t>(k)]->set_collective_tag(*streams[static_cast<std::size_t>(k)], 1))
      die("in-stream tag", e);
  }
  uint32_t key = 0;
  // A backend that pairs the members on the device (CUDA: NCCL; in-stream
  // parts) needs no waits for the other members' events, as in the runtime
  // (device::collective_syncs_members).
  const bool paired = in_stream || members.front()->collective_syncs_members(parts.front());
  auto round = [&] {
    key = (key + 1) % (1u << 20);
    for (int k = 0; k < n; ++k) {
      auto& d = *members[static_cast<std::size_t>(k)];
      if (in_stream) {
        in_stream_parts[static_cast<std::size_t>(k)].collective.key = key;
        if (auto e = d.launch(*streams[static_cast<std::size_t>(k)], in_stream_parts[static_cast<std::size_t>(k)]))
          die("in-stream all-reduce", e);
        continue;
      }
      for (int j = 0; j < n && !paired; ++j)
        if (j != k) (void)d.wait(*streams[static_cast<std::size_t>(k)], *done[static_cast<std::size_t>(j)]);
      if (auto e = d.collective(*streams[static_cast<std::size_t>(k)], parts[static_cast<std::size_t>(k)])) die("collective", e);
    }
    for (int k = 0; k < n; ++k)
      if (auto e = members[static_cast<std::size_t>(k)]->record(*done[static_cast<std::size_t>(k)], *streams[static_cast<std::size_t>(k)]))
        die("record", e);
  };
  auto sync = [&] {
    for (int k = 0; k < n; ++k)
      if (auto e = members[static_cast<std::size_t>(k)]->synchronize(*streams[static_cast<std::size_t>(k)])) die("synchronize", e);
  };
  for (int i = 0; i < 10; ++i) round();
  sync();
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < iters; ++i) round();
  sync();
  allreduce_times times;
  times.host_us = 1000.0 * ms_since(t0) / iters;
#ifdef ACTORGRAPH_HAVE_CUDA
  if (members.front()->spec().kind == ag::device_kind::cuda) {
    // Few enough that the gated streams' queues never fill (a full queue
    // would block the host's enqueue behind the gate).
    constexpr int gated = 64;
    auto flag_mem = members.front()->allocate_host(sizeof(uint32_t));
    if (!flag_mem) die("gate flag", flag_mem.err());
    auto* flag = static_cast<volatile uint32_t*>(*flag_mem);
    *flag = 0;
    for (int k = 0; k < n; ++k)
      if (auto e = ag::gpu::cuda::testing::launch_spin_gate(*members[static_cast<std::size_t>(k)],
                                                            *streams[static_cast<std::size_t>(k)], flag))
        die("spin gate", e);
    auto start = members.front()->create_event(true), end = members.front()->create_event(true);
    if (!start || !end) die("timing event", start ? end.err() : start.err());
    if (auto e = members.front()->record(**start, *streams.front())) die("record", e);
    for (int i = 0; i < gated; ++i) round();
    if (auto e = members.front()->record(**end, *streams.front())) die("record", e);
    *flag = 1;  // release every member at once
    sync();
    times.gpu_us = static_cast<double>((*end)->completion_ns() - (*start)->completion_ns()) / 1000.0 / gated;
    members.front()->deallocate_host(*flag_mem);
  }
#endif
  streams.clear();
  for (int k = 0; k < n; ++k) {
    members[static_cast<std::size_t>(k)]->deallocate(in[static_cast<std::size_t>(k)]);
    members[static_cast<std::size_t>(k)]->deallocate(out[static_cast<std::size_t>(k)]);
  }
  return times;
}

struct figure {
  std::string name;
  double value;
  std::string setup;
  bool table_only = false;  ///< a row of the table, no `name: value` line (not a figure to track)
};

/// The table of `figs`: name, value, setup.
void print_table(const std::vector<figure>& figs) {
  std::printf("%-26s %12s  %s\n", "figure", "value", "setup");
  for (const auto& f : figs) std::printf("%-26s %12.3f  %s\n", f.name.c_str(), f.value, f.setup.c_str());
}

/// The `name: value` lines of `figs` (what scripts grep).
void print_values(const std::vector<figure>& figs) {
  for (const auto& f : figs)
    if (!f.table_only) std::printf("%s: %.3f\n", f.name.c_str(), f.value);
}

/// The LLaMA layer of the tensor-parallel issue (d 8192, 64 heads, ff 4 d,
/// T 2048, B 2, bf16; --small: d 1024, 8 heads, T 256), weights read as zeros.
ag::models::transformer_config layer_config(bool small_layer, int64_t vocab) {
  ag::models::transformer_config layer;
  layer.variant = ag::models::model_variant::llama;
  layer.n_layers = 1;
  layer.d_model = small_layer ? 1024 : 8192;
  layer.n_heads = small_layer ? 8 : 64;
  layer.d_ff = 4 * layer.d_model;
  layer.vocab = vocab;
  layer.seq_len = small_layer ? 256 : 2048;
  layer.batch = 2;
  layer.dtype = ag::dtype::bf16;
  return layer;
}

std::shared_ptr<const ag::graph> build_zero_weights(const ag::models::transformer_config& c) {
  auto provider = [](const std::string&, ag::dtype t, const ag::shape& d) -> ag::expected<ag::weight_source_ptr> {
    return ag::weight_source_ptr(std::make_shared<zero_weight>(t, d));
  };
  auto g = ag::models::build_transformer(c, provider);
  if (!g) die("build the model", g.err());
  return std::make_shared<const ag::graph>(std::move(*g));
}

/// `path` with `-tag` before its extension ("t.json", "1gpu" -> "t-1gpu.json");
/// empty stays empty.
std::string tagged(const std::string& path, const std::string& tag) {
  if (path.empty()) return path;
  const auto dot = path.rfind('.');
  const auto slash = path.rfind('/');
  if (dot == std::string::npos || (slash != std::string::npos && dot < slash)) return path + "-" + tag;
  return path.substr(0, dot) + "-" + tag + path.substr(dot);
}

/// The LLaMA 7B-shaped decode step of issues 14 and 15: batch 1, one token,
/// no cache (weight-bandwidth bound).
ag::models::transformer_config decode_step_config(int layers) {
  ag::models::transformer_config d;
  d.variant = ag::models::model_variant::llama;
  d.n_layers = layers;
  d.d_model = 4096;
  d.n_heads = 32;
  d.d_ff = 11008;
  d.vocab = 32000;
  d.seq_len = 1;
  d.batch = 1;
  d.dtype = ag::dtype::bf16;
  return d;
}

/// Issues 14 and 15 (--devices cuda:all): the layer and a decode step on all
/// n GPUs at degree n against one GPU, the compute lanes' busy fraction of
/// each GPU, and the sim's prediction for the same plan from the GPUs' own
/// device specs. With same_gpu, the n members are logical devices of GPU 0:
/// the figures then check the program, not the speedups (one GPU does the
/// work of all members).
void multi_gpu_figures(int n, bool same_gpu, bool small_layer, int64_t vocab, int jobs, int decode_layers,
                       const std::string& trace_out, bool op_profile, bool overlap, std::vector<figure>& figs) {
  const std::string tp = "tp" + std::to_string(n);
  const std::string where = same_gpu ? " on " + std::to_string(n) + " logical devices of GPU 0 (not a speedup)"
                                     : " on GPUs 0.." + std::to_string(n - 1);
  char buf[256];
  const auto layer = layer_config(small_layer, vocab);
  const auto g = build_zero_weights(layer);
  const auto in = ag::models::transformer_inputs(layer, 1);
  const std::string what = "LLaMA layer d " + std::to_string(layer.d_model) + ", T " + std::to_string(layer.seq_len) +
                           ", B 2, bf16";
  layer_run c;
  c.kind = "cuda";
  c.same_gpu = same_gpu;
  c.overlap = overlap;
  if (op_profile) {
    // Each op's time on each GPU, 1 GPU then n (plain launches, 3 jobs):
    // the devices print "op_profile" lines when the runtime ends.
    ::setenv("AG_CUDA_OP_PROFILE", "1", 1);
    c.replay_off = true;
    std::fprintf(stderr, "== op profile: the layer on 1 GPU\n");
    (void)time_layer(c, g, in, 2);
    c.n = n;
    std::fprintf(stderr, "== op profile: the layer at degree %d\n", n);
    (void)time_layer(c, g, in, 2);
    if (decode_layers > 0) {
      const ag::models::transformer_config d = decode_step_config(decode_layers);
      const auto gd = build_zero_weights(d);
      const auto din = ag::models::transformer_inputs(d, 1);
      layer_run dc = c;
      dc.n = 1;
      std::fprintf(stderr, "== op profile: the decode step on 1 GPU\n");
      (void)time_layer(dc, gd, din, 2);
      dc.n = n;
      std::fprintf(stderr, "== op profile: the decode step at degree %d\n", n);
      (void)time_layer(dc, gd, din, 2);
    }
    ::unsetenv("AG_CUDA_OP_PROFILE");
    return;
  }
  c.busy = true;
  c.trace_out = tagged(trace_out, "1gpu");
  const run_result one = time_layer(c, g, in, jobs);
  c.n = n;
  c.trace_out = trace_out;
  const run_result many = time_layer(c, g, in, jobs);
  // Two measures, both printed: the job's wall time (submit to its future,
  // the host's hops included) and its device span (what the GPUs spent on
  // it; PyTorch's reference times its layer with CUDA events, the same).
  std::snprintf(buf, sizeof buf, ": device span %.3f ms on 1 GPU, %.3f ms at degree %d (%d collective parts)",
                one.device_ms, many.device_ms, n, many.collectives);
  figs.push_back({tp + "_layer_speedup", one.device_ms / many.device_ms, what + where + buf});
  figs.push_back({tp + "_layer_device_ms", many.device_ms,
                  what + where + ", median job device span ms (trace on), comparable to PyTorch's CUDA events"});
  figs.push_back({"layer_device_ms_1gpu", one.device_ms, what + " on 1 GPU, median job device span ms (trace on)"});
  std::snprintf(buf, sizeof buf, ", median over jobs of the latest device's first step start minus the earliest's "
                "(the host's first enqueues: %.1f us apart)", many.enqueue_skew_us);
  figs.push_back({tp + "_start_skew_us", many.start_skew_us, what + where + buf});
  std::snprintf(buf, sizeof buf, ": job wall %.3f ms on 1 GPU, %.3f ms at degree %d", one.median_ms, many.median_ms, n);
  figs.push_back({tp + "_layer_speedup_wall", one.median_ms / many.median_ms, what + where + buf});
  figs.push_back({tp + "_layer_ms", many.median_ms, what + where + ", median job wall ms (trace on)"});
  figs.push_back({"layer_ms_1gpu", one.median_ms, what + " on 1 GPU, median job wall ms (trace on)"});
  std::string each;
  double least = 1.0;
  for (double b : many.busy) {
    least = std::min(least, b);
    std::snprintf(buf, sizeof buf, " %.3f", b);
    each += buf;
  }
  figs.push_back({tp + "_gpu_busy_fraction", least,
                  "least of the members' compute-lane busy fractions over the last job's span:" + each});

  // The sim's prediction from the GPUs' own specs (values off, time scale
  // 50), made with the backend options of the measured runs: with
  // --copy-engine on the spec says so, and the sim plans the sequence-parallel
  // chunks that ran (until session 36 it planned NCCL all-reduces there).
  ag::gpu::backend_options spec_options;
  spec_options.cuda_gemv = cuda_gemv;
  spec_options.cuda_pdl = cuda_pdl;
  spec_options.cuda_copy_engine_collectives = cuda_copy_engine;
  spec_options.cuda_sequence_parallel_min_bytes = sequence_parallel_min_bytes;
  auto devs = ag::gpu::make_devices("cuda:0", spec_options);
  if (!devs) die("devices cuda:0", devs.err());
  layer_run s;
  s.kind = "sim";
  s.sim_spec = devs->front()->spec();
  devs->clear();
  const run_result predicted_one = time_layer(s, g, in, jobs);
  s.n = n;
  const run_result predicted = time_layer(s, g, in, jobs);
  // The sim models the devices, not the host's submit and completion hops:
  // its prediction is compared with the device span.
  std::snprintf(buf, sizeof buf, ": sim %.3f ms predicted, %.3f ms measured (device span)", predicted.median_ms,
                many.device_ms);
  figs.push_back({tp + "_sim_error", predicted.median_ms / many.device_ms,
                  what + " at degree " + std::to_string(n) + buf + (same_gpu ? " (logical devices: not comparable)" : "")});
  // The same on one GPU: how far the device spec's figures are from the GPU.
  std::snprintf(buf, sizeof buf, ": sim %.3f ms predicted, %.3f ms measured (device span)", predicted_one.median_ms,
                one.device_ms);
  figs.push_back({"sim_error_1gpu", predicted_one.median_ms / one.device_ms, what + " on 1 GPU" + buf});

  // A decode step: LLaMA 7B shape, batch 1, one token, no cache (weight
  // bandwidth bound).
  if (decode_layers > 0) {
    const ag::models::transformer_config d = decode_step_config(decode_layers);
    const auto gd = build_zero_weights(d);
    const auto din = ag::models::transformer_inputs(d, 1);
    layer_run dc;
    dc.kind = "cuda";
    dc.same_gpu = same_gpu;
    const run_result d1 = time_layer(dc, gd, din, 4 * jobs);
    dc.n = n;
    const run_result dn = time_layer(dc, gd, din, 4 * jobs);
    std::snprintf(buf, sizeof buf, ", %d layers d 4096 ff 11008 bf16, B 1, T 1: %.3f ms on 1 GPU, %.3f ms at degree %d",
                  decode_layers, d1.median_ms, dn.median_ms, n);
    figs.push_back({tp + "_decode_step_speedup", d1.median_ms / dn.median_ms, "LLaMA 7B-shaped decode step" + where + buf});
    figs.push_back({"decode_step_ms_1gpu", d1.median_ms, "LLaMA 7B-shaped decode step on 1 GPU, median job wall ms"});
    figs.push_back({tp + "_decode_step_ms", dn.median_ms, "LLaMA 7B-shaped decode step at degree " +
                                                              std::to_string(n) + ", median job wall ms"});
    // Traces of a few more steps, where a step's time goes per device and
    // lane. Not timed: the trace's timing events (two per step) weigh on a
    // step of small kernels, and on the N-GPU one most.
    if (!trace_out.empty()) {
      dc.n = 1;
      dc.trace_out = tagged(trace_out, "decode-1gpu");
      (void)time_layer(dc, gd, din, 4);
      dc.n = n;
      dc.trace_out = tagged(trace_out, "decode-" + tp);
      (void)time_layer(dc, gd, din, 4);
    }
  }
}

/// Sizes of issue 15's layout comparison (the --layout-* flags).
struct layout_sizes {
  int layers = 24;         ///< LLaMA layers (d 4096, 32 heads, ff 11008, vocab 32000, bf16)
  int micro_batches = 16;  ///< jobs of one round, submitted together
  int seq = 512;           ///< tokens of a micro-batch (batch 1)
  int rounds = 3;          ///< timed rounds after warm_up_rounds (the median counts)
  int devices = 4;         ///< 4: 1 x 1, 2 x 2, 4 x 1, 1 x 4 (issue 15); 2: 1 x 1, 2 x 1, 1 x 2
};

/// One layout's result in layout_figures.
struct layout_time {
  double round_ms = 0;       ///< median round wall ms (over the time scale on sim)
  int64_t arena_bytes = 0;   ///< the largest device's activation arena (one job's peak)
  int64_t weight_bytes = 0;  ///< the largest device's weights
  int arenas = 0;            ///< arenas per device: jobs holding memory on a device at once
  int collectives = 0;       ///< collective parts per job
};

/// Wall ms of one round: every micro-batch's job submitted together
/// (submit_batch), to the last one done.
double round_ms(ag::runtime& rt, const std::shared_ptr<const ag::plan>& p,
                const std::vector<std::vector<ag::host_tensor>>& batch, const std::string& what) {
  auto in = batch;  // submit_batch takes its inputs: copied before the clock starts
  const auto t0 = std::chrono::steady_clock::now();
  const std::vector<ag::job> jobs = rt.submit_batch(p, std::move(in));
  for (const ag::job& j : jobs)
    if (const auto& r = j.wait(); !r) die("job of the " + what, r.err());
  return ms_since(t0);
}

/// Rounds of a layout before its timed (or traced) ones: each of a round's
/// jobs holds an arena of its own, and a replayed plan runs its first job on
/// an arena plainly and captures its graphs on the second (until 2026-11-30
/// one warm-up round: the traced round was the capturing one, which took a
/// 1 x 2 copy-engine round 244 ms against 124 replayed).
constexpr int warm_up_rounds = 2;

/// g planned as `stages` pipeline stages x `tp` devices each over c's kind
/// (stages x tp devices; 1 x 1: a 1-device runtime), warm_up_rounds then
/// `rounds` timed rounds of the micro-batches in `batch`, trace off. With
/// `trace_out`, one more round's trace is written there, from a runtime of
/// its own with the trace on (a runtime option): the timed rounds of every
/// layout run untraced, so the trace's end event per step is in none of them.
layout_time time_layout(layer_run c, int stages, int tp, const std::shared_ptr<const ag::graph>& g,
                        const std::vector<std::vector<ag::host_tensor>>& batch, int rounds,
                        const std::string& trace_out) {
  c.n = stages * tp;
  const std::string what = std::to_string(stages) + " x " + std::to_string(tp) + " layout on " + devices_of(c);
  ag::plan_options po = flag_plan_options();
  po.pipeline_stages = stages;
  po.tensor_parallel = tp;
  // A job holds an arena on each of its devices from its start to its end,
  // so a 4-stage pipeline keeps its stages busy only with at least 4 jobs
  // holding memory; 16 (every micro-batch of the default round) fill each
  // layout, more would only cost device memory.
  const int arenas = std::min(static_cast<int>(batch.size()), 16);
  auto load = [&](bool trace) {
    auto rt = runtime_of(c, trace, arenas);
    auto p = rt->compile(g, po);
    if (!p) die("compile the " + what, p.err());
    return std::make_pair(std::move(rt), std::move(*p));  // the plan goes first, then its runtime
  };
  layout_time r;
  r.arenas = arenas;
  {
    const auto [rt, p] = load(false);
    for (const auto& m : p->memory()) {
      r.arena_bytes = std::max(r.arena_bytes, m.arena_bytes);
      r.weight_bytes = std::max(r.weight_bytes, m.weight_bytes);
    }
    for (const auto& s : p->steps()) r.collectives += s.kind == ag::step_kind::collective;
    for (int k = 0; k < warm_up_rounds; ++k) (void)round_ms(*rt, p, batch, what);
    // Wall ms over the scale on sim: modelled ms plus the host's share, scaled down.
    const double scale = c.kind == "sim" ? c.time_scale : 1.0;
    std::vector<double> ms;
    for (int k = 0; k < rounds; ++k) ms.push_back(round_ms(*rt, p, batch, what) / scale);
    std::sort(ms.begin(), ms.end());
    r.round_ms = ms[ms.size() / 2];
  }  // the timed runtime is gone before the traced one loads: the devices' memory is free again
  if (!trace_out.empty()) {
    const auto [rt, p] = load(true);
    for (int k = 0; k < warm_up_rounds; ++k) (void)round_ms(*rt, p, batch, what);
    (void)rt->take_trace();  // the warm-up rounds' records
    (void)round_ms(*rt, p, batch, what);
    write_trace(rt->take_trace(), trace_out);
  }
  return r;
}

/// Issue 15's layout comparison (--layouts; after the cuda:all figures on 4
/// or more devices): a LLaMA of o.layers layers (d 4096, 32 heads, ff 11008,
/// vocab 32000, bf16; weights are zero sources, nothing big is drawn on the
/// host), o.micro_batches micro-batches of B 1 x T o.seq per round, as
/// 1 device, 2 stages x 2, 4 stages x 1 and 1 stage x 4 on 4 devices of
/// base's kind (sim: 4 simulated H200s; cuda: GPUs 0..3, or 4 logical
/// devices of GPU 0 with base.same_gpu, which checks the program, not the
/// speedups). Figures end in "_sim" on sim. With `trace_out`, the trace of
/// one 2 x 2 round goes to tagged(trace_out, "pp2xtp2"). With o.devices 2
/// (--layout-devices 2): 1 device, 2 stages x 1 and 1 stage x 2, only the
/// pp_layout_* figures, and the trace of one 1 x 2 round in
/// tagged(trace_out, "pp1xtp2").
void layout_figures(const layer_run& base, const layout_sizes& o, const std::string& trace_out,
                    std::vector<figure>& figs) {
  ag::models::transformer_config m;
  m.variant = ag::models::model_variant::llama;
  m.n_layers = o.layers;
  m.d_model = 4096;
  m.n_heads = 32;
  m.d_ff = 11008;
  m.vocab = 32000;
  m.seq_len = o.seq;
  m.batch = 1;
  m.dtype = ag::dtype::bf16;
  const auto g = build_zero_weights(m);
  std::vector<std::vector<ag::host_tensor>> batch;
  for (int i = 0; i < o.micro_batches; ++i)
    batch.push_back(ag::models::transformer_inputs(m, 100 + static_cast<uint64_t>(i)));
  const std::string sfx = base.kind == "sim" ? "_sim" : "";
  const std::string where =
      base.kind == "sim" ? " on sim H200s (time scale " + std::to_string(base.time_scale).substr(0, 5) + ")"
      : base.same_gpu    ? " on logical devices of GPU 0 (not a speedup)"
                         : " on GPUs 0.." + std::to_string(o.devices - 1);
  const std::string what = "LLaMA " + std::to_string(o.layers) + " layers d 4096 ff 11008 bf16, " +
                           std::to_string(o.micro_batches) + " micro-batches of B 1 x T " + std::to_string(o.seq) +
                           where;
  struct layout {
    int stages, tp;
    std::string name;  ///< figure name part: stages x devices per stage
    layout_time t{};
    std::string label() const { return std::to_string(stages) + " x " + std::to_string(tp); }
    std::string shown() const { return stages * tp == 1 ? "1 device" : label(); }  ///< in the table's text
  };
  std::vector<layout> ls{{1, 1, "1x1"}, {2, 2, "2x2"}, {4, 1, "4x1"}, {1, 4, "1x4"}};
  if (o.devices == 2) ls = {{1, 1, "1x1"}, {2, 1, "2x1"}, {1, 2, "1x2"}};
  for (auto& l : ls) {
    // The traced round: 2 x 2 on 4 devices, 1 x 2 on 2.
    const bool traced = l.name == (o.devices == 4 ? "2x2" : "1x2");
    l.t = time_layout(base, l.stages, l.tp, g, batch, o.rounds,
                      traced ? tagged(trace_out, o.devices == 4 ? "pp2xtp2" : "pp1xtp2") : "");
    std::fprintf(stderr, "layouts: %s: %.2f ms per round\n", l.label().c_str(), l.t.round_ms);
  }
  const double one = ls[0].t.round_ms, two_by_two = ls[1].t.round_ms;
  char buf[256];
  if (o.devices == 4) {
  auto vs = [&](const layout& l) {
    std::snprintf(buf, sizeof buf, ": round %.2f ms as %s, %.2f ms as 2 x 2 (stages x devices; >1: 2 x 2 wins)",
                  l.t.round_ms, l.shown().c_str(), two_by_two);
    return what + buf;
  };
  figs.push_back({"pp2xtp2_speedup" + sfx, one / two_by_two, vs(ls[0])});
  figs.push_back({"pp2xtp2_vs_pp4" + sfx, ls[2].t.round_ms / two_by_two, vs(ls[2])});
  figs.push_back({"pp2xtp2_vs_tp4" + sfx, ls[3].t.round_ms / two_by_two, vs(ls[3])});
  }
  for (const auto& l : ls) {
    std::snprintf(buf, sizeof buf,
                  " (stages x devices per stage): median wall ms of %d rounds (submit to the last job done); largest "
                  "device: arena %s x %d, weights %s; %d collective parts per job",
                  o.rounds, gib(l.t.arena_bytes).c_str(), l.t.arenas, gib(l.t.weight_bytes).c_str(), l.t.collectives);
    figs.push_back({"pp_layout_ms_" + l.name + sfx, l.t.round_ms, l.label() + buf});
  }
  // Which layout wins and by how much: the winner's round against each other's.
  std::vector<const layout*> by_time;
  for (const auto& l : ls) by_time.push_back(&l);
  std::sort(by_time.begin(), by_time.end(),
            [](const layout* a, const layout* b) { return a->t.round_ms < b->t.round_ms; });
  std::string text = by_time[0]->shown() + " wins:";
  for (std::size_t k = 1; k < by_time.size(); ++k) {
    std::snprintf(buf, sizeof buf, "%s %.2fx faster than %s", k > 1 ? "," : "",
                  by_time[k]->t.round_ms / by_time[0]->t.round_ms, by_time[k]->shown().c_str());
    text += buf;
  }
  figs.push_back({"pp_layout_winner" + sfx, by_time[1]->t.round_ms / by_time[0]->t.round_ms,
                  text + " (value: over the runner-up; layouts are stages x devices per stage)", true});
}

/// GPUs on this machine (exits with the reason when there is no CUDA backend or device).
int gpu_count() {
  auto devs = ag::gpu::make_devices("cuda:all");
  if (!devs) die("devices cuda:all", devs.err());
  return static_cast<int>(devs->size());
}

}  // namespace

int main(int argc, char** argv) {
  int repeats = 3, layers = 80, jobs = 5;
  double time_scale = 50.0;
  int64_t vocab = 256;
  std::string kind = "sim", trace_out, allreduce_spec;
  int allreduce_iters = 200;
  bool same_gpu = false, op_profile = false, no_overlap = false;
  bool small_layer = false, plan_only = false, run_only = false;
  int degree = 2, decode_layers = 32;
  bool layouts_only = false, no_layouts = false;
  layout_sizes sizes;
  ag::apps::flags app("actorgraph-tp-bench", "Tensor-parallel figures: runtime speedups on simulated H200s, planning.");
  app.add_option("--repeats", repeats, "compiles of the 64-device plan (the median counts)")->check(CLI::Range(1, 1000));
  app.add_option("--layers", layers, "layers of the 64-device plan's model")->check(CLI::Range(1, 1000));
  app.add_option("--jobs", jobs, "timed jobs per runtime configuration (the median counts)")->check(CLI::Range(1, 10000));
  app.add_option("--vocab", vocab, "vocabulary of the one-layer model (its head is not what is measured)")
      ->check(CLI::Range(int64_t{8}, int64_t{1} << 20));
  app.add_option("--devices", kind,
                 "backend kind of the runtime figures: sim, cpu or cuda; cuda:all: the multi-GPU figures of issues 14 "
                 "and 15 (tpN_*) on all GPUs at degree N = their count")
      ->check(CLI::IsMember({"sim", "cpu", "cuda", "cuda:all"}));
  app.add_option("--degree", degree, "cuda:all with --same-gpu: logical devices of GPU 0 (the degree)")
      ->check(CLI::Range(2, 16));
  app.add_option("--decode-layers", decode_layers,
                 "cuda:all: layers of the LLaMA 7B-shaped decode step (tpN_decode_step_speedup); 0 leaves it out")
      ->check(CLI::Range(0, 1000));
  app.add_option("--time-scale", time_scale,
                 "sim: wall seconds per modelled second; job times are divided by it, so host dispatch overhead "
                 "(not modelled) weighs 1/scale as much")
      ->check(CLI::Range(0.01, 1000.0));
  app.add_option("--trace", trace_out,
                 "write the Chrome trace of the degree-4 runs (overlap on) to this file, the degree-2 runs to FILE.2, the 1-device runs to FILE.1; "
                 "with --devices cuda:all, the N-GPU layer's (and FILE-1gpu, FILE-decode-1gpu, FILE-decode-tpN); "
                 "with the layout comparison, one 2 x 2 round's in FILE-pp2xtp2");
  std::string gemv = "on";
  ag::apps::add_on_off(app, "--gemv", gemv,
                       "cuda: backend_options::cuda_gemv, the GEMV kernel for few-row matmuls (on, off)");
  std::string pdl = "on";
  ag::apps::add_on_off(app, "--pdl", pdl,
                       "cuda: backend_options::cuda_pdl, kernels as programmatic dependent launches (on, off)");
  std::string in_stream = "auto";
  app.add_option("--in-stream", in_stream,
                 "cuda: plan_options::in_stream_collectives, small all-reduces as kernels of the compute stream that "
                 "meet on the devices (auto: the default, where the members are distinct GPUs; on: also on logical "
                 "devices of one GPU; off: the communication queue)")
      ->check(CLI::IsMember({"auto", "on", "off"}));
  std::string fusion_flag = "on";
  ag::apps::add_on_off(app, "--fusion", fusion_flag,
                       "cuda: plan_options::fuse_ops and fuse_projections (on: the defaults; off: the decode step's "
                       "attention and projections kernel by kernel)");
  std::string seq_parallel = "auto";
  app.add_option("--sequence-parallel", seq_parallel,
                 "plan_options::sequence_parallel of the tensor-parallel plans: reduce-scatter and all-gather by rows "
                 "instead of all-reduce, norms and residual adds on a rank's rows (on, off, auto: on where they "
                 "run beside compute: sim, cpu, and CUDA GPUs with --copy-engine on for activations of at least "
                 "--sp-min-kib)")
      ->check(CLI::IsMember({"on", "off", "auto"}));
  std::string pieces = "on";
  ag::apps::add_on_off(
      app, "--output-pieces", pieces,
      "plan_options::output_pieces of every plan: an output concatenated from several devices is copied "
      "to the host by each of them (on), or gathered on one device first (off)");
  std::string elide = "on";
  ag::apps::add_on_off(
      app, "--elide-concats", elide,
      "plan_options::elide_concats of every plan: producers write a concat's inputs in place where they "
      "can, so the concat copies nothing (on), or every concat is a kernel (off)");
  std::string fold_norms = "on";
  ag::apps::add_on_off(app, "--fold-norms", fold_norms,
                       "plan_options::fold_norm_weights of every plan: rms_norm weights folded into the weights of the "
                       "projections that read them (on), or read by the norms (off)");
  std::string order = "on";
  ag::apps::add_on_off(
      app, "--order-steps", order,
      "plan_options::order_steps_by_model of every plan: steps ordered by a simulation of one job and a "
      "search over the collectives' order (on), or the step builder's order (off)");
  std::string batch = "auto";
  app.add_option("--batch-chunks", batch,
                 "plan_options::tp_batch_chunks of every plan: a sequence-parallel region's chunks are parts of the "
                 "batch, attention included (on), always runs of rows (off), or per stage where the hand-over of "
                 "chunks of rows does not fit beside their last product (auto, the default)")
      ->check(CLI::IsMember({"on", "off", "auto"}));
  std::string hand_over = "on";
  app.add_option("--job-lanes", job_lanes,
                 "plan_options::job_lanes of every plan: copies of each device's compute lanes and communication "
                 "queue that jobs in flight alternate over (0: auto, 2 on CUDA plans with collectives; 1: off)")
      ->check(CLI::Range(0, 8));
  ag::apps::add_on_off(
      app, "--hand-over-lane", hand_over,
      "plan_options::hand_over_lane of every plan: the ops that hand a chunk's rows to a later all-gather "
      "or output piece run on compute lane 1 (on), or on lane 0 (off)");
  std::string copy_engine = cuda_copy_engine ? "on" : "off";
  ag::apps::add_on_off(
      app, "--copy-engine", copy_engine,
      "cuda: backend_options::cuda_copy_engine_collectives, large reduce-scatters and all-gathers moved "
      "by the copy engines beside the GEMMs, with sequence parallelism (on, the default), or none and "
      "NCCL's all-reduces (off)");
  int64_t sp_min_kib = sequence_parallel_min_bytes >> 10;
  app.add_option("--sp-min-kib", sp_min_kib,
                 "cuda: backend_options::cuda_sequence_parallel_min_bytes in KiB: sequence parallelism on the "
                 "copy-engine collectives only for activations of at least this size in rows of 4096 elements (scaled by "
                 "4096 / w for rows of w; 0: any size)")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 30));
  app.add_option("--chunks", overlap_chunks,
                 "plan_options::tp_overlap_chunks: 0 (the cost model's choice), or 2 / 4 chunks of rows wherever a "
                 "sequence-parallel region can be chunked")
      ->check(CLI::IsMember({0, 2, 4}));
  std::string tiny_jobs = "on";
  ag::apps::add_on_off(
      app, "--tiny-job-path", tiny_jobs,
      "start on submit, pinned small inputs and small copies on the compute lane (on: the defaults; off: "
      "none of them, as before session 15)");
  app.add_flag("--no-overlap", no_overlap,
               "cuda:all: plan the layer with plan_options::tp_overlap off (each row-parallel matmul whole, then "
               "one all-reduce), to compare with the chunked overlap");
  app.add_flag("--same-gpu", same_gpu, "cuda: the degrees' devices are logical devices of GPU 0 (cuda:0,0,...)");
  app.add_flag("--op-profile", op_profile,
               "cuda:all: instead of the figures, each op's GPU time of the layer (and of the decode step, "
               "unless --decode-layers 0) on 1 GPU and at degree N (\"op_profile\" lines on stderr; plain launches, whose "
               "plan may use other lanes, and so other fusions, than the replayed one)");
  app.add_flag("--small", small_layer, "a small layer (d 1024, 8 heads, T 256) for a quick run");
  app.add_option("--allreduce", allreduce_spec,
                 "print allreduce_us_<size>_<path> (oneshot, ring, nccl) for 8 KiB..16 MiB and the crossover on these devices (e.g. cuda:0,0, cuda:0,1, cpu:2)");
  app.add_option("--allreduce-iters", allreduce_iters, "timed all-reduces per size")->check(CLI::Range(1, 1000000));
  auto* layouts_flag =
      app.add_flag("--layouts", layouts_only,
                   "only issue 15's layout comparison (pp2xtp2_*, pp_layout_ms_*): a LLaMA (d 4096) as 1 device, "
                   "2 stages x 2, 4 x 1 and 1 x 4 on 4 devices of --devices (sim: simulated H200s; cuda, cuda:all: "
                   "GPUs 0..3, or with --same-gpu 4 logical devices of GPU 0)");
  app.add_flag("--no-layouts", no_layouts,
               "cuda:all: leave out the layout comparison (it follows the other figures when there are 4 devices)")
      ->excludes(layouts_flag);
  app.add_option("--layout-layers", sizes.layers, "layout comparison: layers of the LLaMA")->check(CLI::Range(1, 1000));
  app.add_option("--layout-devices", sizes.devices,
                 "layout comparison: 4 (1 x 1, 2 x 2, 4 x 1, 1 x 4; the pp2xtp2 figures) or 2 (1 x 1, 2 x 1, 1 x 2)")
      ->check(CLI::IsMember({2, 4}));
  app.add_option("--layout-microbatches", sizes.micro_batches,
                 "layout comparison: micro-batches (jobs of one plan submitted together) per round")
      ->check(CLI::Range(1, 4096));
  app.add_option("--layout-seq", sizes.seq, "layout comparison: tokens per micro-batch (batch 1)")
      ->check(CLI::Range(1, 32768));
  app.add_option("--layout-rounds", sizes.rounds, "layout comparison: timed rounds per layout (the median counts)")
      ->check(CLI::Range(1, 1000));
  app.add_flag("--plan-only", plan_only, "only the planning figures");
  app.add_flag("--run-only", run_only, "only the runtime figures");
  if (auto rc = ag::apps::parse_flags(app, argc, argv)) return *rc;
  cuda_gemv = gemv == "on";
  cuda_pdl = pdl == "on";
  in_stream_collectives = in_stream == "on"    ? ag::in_stream_mode::on
                          : in_stream == "off" ? ag::in_stream_mode::off
                                               : ag::in_stream_mode::distinct_gpus;
  fusion = fusion_flag == "on";
  ag::parse_sequence_parallel_mode(seq_parallel, sequence_parallel);
  tiny_job_path = tiny_jobs == "on";
  output_pieces = pieces == "on";
  elide_concats = elide == "on";
  fold_norm_weights = fold_norms == "on";
  order_steps = order == "on";
  ag::parse_batch_chunks_mode(batch, batch_chunks);
  hand_over_lane = hand_over == "on";
  cuda_copy_engine = copy_engine == "on";
  sequence_parallel_min_bytes = sp_min_kib << 10;

  std::vector<figure> figs;
  if (!allreduce_spec.empty()) {
    auto devs = ag::gpu::make_devices(allreduce_spec);
    if (!devs) die("devices " + allreduce_spec, devs.err());
    std::vector<const ag::device_spec*> specs;
    std::vector<int> gpus;
    for (const auto& d : *devs) {
      specs.push_back(&d->spec());
      gpus.push_back(d->spec().ordinal);
    }
    const ag::device_kind kind = specs.front()->kind;
    // The paths this machine has: one-shot everywhere; the ring on cpu and
    // sim (modelled there); NCCL on distinct GPUs of a build with it.
    std::vector<std::string> paths{"oneshot"};
    if (kind == ag::device_kind::cuda) paths.push_back("instream");
    if (kind != ag::device_kind::cuda) paths.push_back("ring");
    else if (ag::gpu::choose_cuda_collective_path(ag::op_kind::all_reduce, int64_t{1} << 40, gpus, {}, 1,
                                                  ag::gpu::nccl_built())
                 .path == ag::gpu::collective_path::nccl)
      paths.push_back("nccl");
    for (int64_t kib : {8, 64, 256, 1024, 16384}) {
      const std::string size = kib >= 1024 ? std::to_string(kib / 1024) + "m" : std::to_string(kib) + "k";
      for (const std::string& path : paths) {
        const allreduce_times t = allreduce_us(allreduce_spec, kib * 1024, allreduce_iters, path);
        const std::string what = path + " all-reduce of " + std::to_string(kib) + " KiB f32 on " + allreduce_spec;
        if (t.gpu_us >= 0) {
          figs.push_back({"allreduce_us_" + size + "_" + path, t.gpu_us,
                          what + ": the devices' time per call, back to back (64 calls queued behind a gate)"});
          figs.push_back({"allreduce_host_us_" + size + "_" + path, t.host_us,
                          what + ": wall per call with the host enqueueing (" + std::to_string(allreduce_iters) +
                              " calls)"});
        } else {
          figs.push_back({"allreduce_us_" + size + "_" + path, t.host_us,
                          what + " (per call, " + std::to_string(allreduce_iters) + " calls)"});
        }
      }
    }
    // What the runtime picks by default: the smallest message the planner's
    // rule (it depends on the group's size) sends by ring, i.e. NCCL on CUDA,
    // found by bisection; -1: never (e.g. members on one GPU).
    int64_t crossover = -1;
    if (ag::choose_collective_algo(specs, int64_t{1} << 40, ag::op_kind::all_reduce) == ag::collective_algo::ring) {
      int64_t lo = 1, hi = int64_t{1} << 40;  // hi is ring
      while (lo < hi) {
        const int64_t mid = lo + (hi - lo) / 2;
        if (ag::choose_collective_algo(specs, mid, ag::op_kind::all_reduce) == ag::collective_algo::ring) hi = mid;
        else lo = mid + 1;
      }
      crossover = lo;
    }
    figs.push_back({"allreduce_crossover_bytes", static_cast<double>(crossover),
                    "smallest message the runtime sends by ring / NCCL on " + allreduce_spec + " (-1: never)"});
  }

  // The layout comparison's devices: sim, or GPUs 0..3 (--same-gpu: GPU 0
  // four times); cuda and cuda:all are the same there.
  layer_run layouts;
  layouts.kind = kind == "cuda:all" ? "cuda" : kind;
  layouts.same_gpu = same_gpu;
  layouts.time_scale = time_scale;
  if (layouts_only) {
    if (kind == "cpu") {
      // A micro-batch of the 24-layer d 4096 model is ~5 TFLOP: ~80 s on a
      // cpu device of a 2-core machine that runs the small layer at ~70
      // GFLOP/s, so 1 x 1's 4 rounds alone take an hour and a half; and the
      // 4 cpu devices share the host's cores, so the layouts would not
      // compare anyway.
      std::fprintf(stderr, "actorgraph-tp-bench: --layouts does not run on cpu (16 micro-batches of a 24-layer "
                           "d 4096 LLaMA, 4 layouts x 4 rounds: hours, on 4 devices that share the host's cores); "
                           "--devices sim --layouts runs it on 4 simulated H200s, --devices cuda --layouts on 4 "
                           "GPUs\n");
      return 2;
    }
    if (layouts.kind == "cuda" && !same_gpu) {
      if (const int gpus = gpu_count(); gpus < sizes.devices) {
        std::fprintf(stderr, "actorgraph-tp-bench: --layouts on cuda needs %d GPUs (--layout-devices), this machine "
                             "has %d (--same-gpu runs the devices as logical devices of GPU 0)\n", sizes.devices, gpus);
        return 2;
      }
    }
    layout_figures(layouts, sizes, trace_out, figs);
    print_table(figs);
    print_values(figs);
    return 0;
  }

  if (kind == "cuda:all") {
    // Degree: every GPU, or --degree logical devices of GPU 0.
    int n = degree;
    if (!same_gpu) {
      n = gpu_count();
      if (n < 2) {
        std::fprintf(stderr, "actorgraph-tp-bench: --devices cuda:all needs at least 2 GPUs, this machine has %d "
                             "(--same-gpu --degree N runs N logical devices of GPU 0)\n", n);
        return 2;
      }
    }
    multi_gpu_figures(n, same_gpu, small_layer, vocab, jobs, decode_layers, trace_out, op_profile, !no_overlap, figs);
    if (!op_profile && !no_layouts) {
      if (n >= sizes.devices) layout_figures(layouts, sizes, trace_out, figs);
      else std::fprintf(stderr, "layouts: skipped, the layout comparison needs %d devices, this run has %d\n", sizes.devices, n);
    }
    print_table(figs);
    print_values(figs);
    return 0;
  }
  if (!plan_only && kind != "cuda:all") {
    const auto layer = layer_config(small_layer, vocab);
    const auto gl = build_zero_weights(layer);
    const auto in = ag::models::transformer_inputs(layer, 1);
    // Wall times with the trace off (unless asked for); on sim, a second run
    // with the trace on gives the modelled device spans (device_ms).
    const auto time_with_spans = [&](layer_run r, int n_jobs) {
      run_result res = time_layer(r, gl, in, n_jobs);
      if (r.kind == "sim" && res.device_ms == 0) {
        r.spans = true;
        res.device_ms = time_layer(r, gl, in, n_jobs).device_ms;
      }
      return res;
    };
    const std::string what = "LLaMA layer d " + std::to_string(layer.d_model) + ", " + std::to_string(layer.n_heads) +
                             " heads, ff 4d, T " + std::to_string(layer.seq_len) + ", B 2, bf16 on " + kind +
                             (kind == "sim" ? " (time scale " + std::to_string(time_scale).substr(0, 5) + ")" : "");
    layer_run c;
    c.kind = kind;
    c.same_gpu = same_gpu;
    c.time_scale = time_scale;
    c.trace_out = trace_out.empty() ? "" : trace_out + ".1";
    const run_result one = time_with_spans(c, jobs);
    c.n = 2;
    c.trace_out = trace_out.empty() ? "" : trace_out + ".2";
    const run_result two = time_with_spans(c, jobs);
    c.n = 4;
    c.trace_out = trace_out;
    const run_result four = time_with_spans(c, jobs);
    c.overlap = false;
    c.trace_out.clear();
    const run_result four_off = time_with_spans(c, jobs);
    char buf[160];
    std::snprintf(buf, sizeof buf, ": %.2f ms on 1, %.2f ms on 2 (%d collective parts)", one.median_ms, two.median_ms,
                  two.collectives);
    figs.push_back({"tp_speedup_2_" + kind, one.median_ms / two.median_ms, what + buf});
    std::snprintf(buf, sizeof buf, ": %.2f ms on 1, %.2f ms on 4 (%d collective parts)", one.median_ms, four.median_ms,
                  four.collectives);
    figs.push_back({"tp_speedup_4_" + kind, one.median_ms / four.median_ms, what + buf});
    std::snprintf(buf, sizeof buf, ": overlap off %.2f ms (%d parts), on %.2f ms (%d parts)", four_off.median_ms,
                  four_off.collectives, four.median_ms, four.collectives);
    figs.push_back({"tp_overlap_gain_4_" + kind, four_off.median_ms / four.median_ms, what + buf});
    if (kind == "sim") {
      // The same from the trace: each job's modelled span on the devices
      // (first step's start to last step's end), without the host's share.
      std::snprintf(buf, sizeof buf, ": modelled device span %.3f ms on 1, %.3f on 2, %.3f on 4 (%.3f overlap off)",
                    one.device_ms, two.device_ms, four.device_ms, four_off.device_ms);
      figs.push_back({"tp_speedup_2_sim_modelled", one.device_ms / two.device_ms, what + buf});
      figs.push_back({"tp_speedup_4_sim_modelled", one.device_ms / four.device_ms, what + buf});
      figs.push_back({"tp_overlap_gain_4_sim_modelled", four_off.device_ms / four.device_ms, what + buf});
    }
  }
  if (run_only) {
    print_table(figs);
    print_values(figs);
    return 0;
  }

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
  o64.order_steps_by_model = order_steps;
  o64.sequence_parallel = sequence_parallel;
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

  print_table(figs);
  std::printf("%-26s %12.1f  8 x 8 over 64 sim H200, %d layers d 8192, %zu nodes, %zu steps (%zu collective parts), "
              "wall ms:",
              "tp_plan_ms_64", plan_ms, layers, p64->source().size(), p64->steps().size(), coll_parts);
  for (double t : times) std::printf(" %.1f", t);
  std::printf(" (cpu ms:");
  for (double t : cpu) std::printf(" %.1f", t);
  std::printf(")\n");
  std::printf("%-26s %12.3f  12-layer d 4096 LLaMA, largest device %s of %s on 1 device\n", "tp_weight_bytes_ratio_4",
              ratio, gib(worst).c_str(), gib(whole).c_str());
  print_values(figs);
  std::printf("tp_plan_ms_64: %.1f\n", plan_ms);
  std::printf("tp_weight_bytes_ratio_4: %.3f\n", ratio);
  return 0;
}
