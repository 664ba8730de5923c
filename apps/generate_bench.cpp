// actorgraph-generate-bench: generation figures through ag::generator.
//
//   actorgraph-generate-bench --mode sim
//     pipelined_sequences_speedup_sim: 8 sequences decoding at once on 2
//     simulated pipeline stages, against the same 8 one after another
//     (timing-only sim devices: the cost model's time per op, scaled by
//     --time-scale so that device time dominates the host's work per job).
//
//   actorgraph-generate-bench --mode batch --model DIR --devices cuda:0
//                             [--sequences 8] [--context 512] [--new-tokens 64]
//     batched_decode_tokens_per_s: --sequences sequences decoding together
//     (generator_options::decode_batch), tokens a second while all of them
//     decode; unbatched_decode_tokens_per_s: the same sequences each stepping
//     on its own; batched_decode_speedup: the ratio (same run, alternated).
//     --decode-batch N (N > --sequences) leaves lanes of the slot empty:
//     --sequences 1 --decode-batch 8 times a sequence alone in a slot of 8
//     lanes against one in a slot of its own.
//
//   actorgraph-generate-bench --mode decode --model DIR --devices cuda:0
//                             [--context 512] [--new-tokens 64] [--prefill 2048]
//                             [--bandwidth-gbs B]
//     load_gb_per_s (checkpoint to device memory, through compile),
//     decode_ms_per_token (median interval between tokens after a prompt of
//     --context tokens), decode_vs_bandwidth_floor (over the time to read the
//     weights a token reads (all but the input embedding table) plus the
//     cache at B GB/s; B defaults to the device spec's bandwidth), and
//     prefill_tokens_per_s (one forward job of --prefill tokens, best of 3
//     after 4 warm-up jobs, apps/common/warm_up.hpp: a
//     greedy prefill, the next token of each position to the host) and
//     prefill_with_logits_tokens_per_s (every position's f32 logits to the host);
//     time_to_first_token_ms (--first-token-runs sequences of one token: the
//     prompt's prefill through the generator's cache plans, then a token).
//
// Prints a table and `name: value` lines.
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "actors/actorgraph.hpp"
#include "actors/generator.hpp"
#include "actors/launch_program.hpp"
#include "apps/common/flags.hpp"
#include "apps/common/trace_spans.hpp"
#include "apps/common/warm_up.hpp"
#include "gpu/device.hpp"
#include "graph/checkpoint/hf_model.hpp"
#include "graph/fusion.hpp"

namespace {

using clock_type = std::chrono::steady_clock;

double seconds_since(clock_type::time_point t0) {
  return std::chrono::duration<double>(clock_type::now() - t0).count();
}

int fail(const ag::error& e) {
  std::fprintf(stderr, "error: %s\n", e.to_string().c_str());
  return 1;
}

int run_sim(double time_scale, int sequences, int new_tokens) {
  ag::runtime_options ro;
  ro.backend.sim.time_scale = time_scale;
  ro.backend.sim.compute_values = false;  // timing only: the tokens are arbitrary ids
  auto rt = ag::runtime::create("sim:2", ro);
  if (!rt) return fail(rt.err());
  ag::models::transformer_config cfg;
  cfg.variant = ag::models::model_variant::llama;
  cfg.n_layers = 8;
  cfg.d_model = 512;
  cfg.n_heads = 8;
  cfg.n_kv_heads = 2;
  cfg.d_ff = 1408;
  cfg.vocab = 4000;
  ag::generator_options go;
  go.cache_tokens = 64;
  go.max_sequences = sequences;
  go.plan.pipeline_stages = 2;
  auto gen = ag::generator::create(**rt, cfg, {}, go);
  if (!gen) return fail(gen.err());
  ag::generate_options o;
  o.max_new_tokens = new_tokens;
  auto prompt = [](int i) { return std::vector<int32_t>{1, 2 + i, 3, 4}; };
  // Warm-up: the first jobs of a plan make the actors' per-plan scratch.
  (*gen)->generate(prompt(0), o).wait();

  // Each way twice, alternating, best of two: neither order nor a slow first
  // round (arenas allocated as jobs need them) favours one side.
  double serial_s = 1e300, together_s = 1e300;
  for (int round = 0; round < 2; ++round) {
    const auto t_serial = clock_type::now();
    for (int i = 0; i < sequences; ++i) {
      const ag::generation h = (*gen)->generate(prompt(i), o);
      if (!h.wait()) return fail(h.wait().err());
    }
    serial_s = std::min(serial_s, seconds_since(t_serial));

    const auto t_together = clock_type::now();
    std::vector<ag::generation> hs;
    for (int i = 0; i < sequences; ++i) hs.push_back((*gen)->generate(prompt(i), o));
    for (const auto& h : hs)
      if (!h.wait()) return fail(h.wait().err());
    together_s = std::min(together_s, seconds_since(t_together));
  }

  const double tokens = static_cast<double>(sequences) * new_tokens;
  std::printf("%-34s %12s %14s\n", "sim:2, 2 stages, llama d512 x 8", "seconds", "tokens/s");
  std::printf("%-34s %12.3f %14.1f\n", "one sequence at a time", serial_s, tokens / serial_s);
  std::printf("%-34s %12.3f %14.1f\n", (std::to_string(sequences) + " sequences at once").c_str(), together_s,
              tokens / together_s);
  std::printf("pipelined_sequences_speedup_sim: %.2f\n", serial_s / together_s);
  return 0;
}

struct decode_args {
  std::string model, devices = "cuda:0";
  int64_t context = 512, prefill = 2048;
  int64_t prefill_chunk = 0;  ///< generator_options::prefill_chunk (0: the whole context, one job)
  int64_t short_prompt_chunk = ag::generator_options{}.short_prompt_chunk;  ///< generator_options::short_prompt_chunk
  int64_t cache_tokens = 0;   ///< generator_options::cache_tokens (0: context + new tokens)
  int cpu_threads = 0;  ///< backend_options::cpu_threads_per_stream (0: the machine's, shared among cpu devices)
  int new_tokens = 64;
  /// Sequences of one token after the measured one: time_to_first_token_ms
  /// is their median (the prompt's prefill through the generator's plans, in
  /// chunks of --prefill-chunk over its cache, then its first token)
  int first_token_runs = 5;
  /// Where to write the Chrome trace of the time-to-first-token runs (empty: none)
  std::string first_token_trace;
  double bandwidth_gbs = 0.0;
  std::string replay = "auto";  ///< plan_options::graph_replay of the decode and prefill plans (the default)
  std::string fusion = "on";    ///< plan_options::fuse_ops of both plans (on: the default)
  std::string gemv = "on";      ///< backend_options::cuda_gemv (on: the default)
  int gemv_tensor_core_rows = ag::gpu::backend_options{}.cuda_gemv_tensor_core_rows;  ///< (0: the FMA kernel for every GEMV)
  std::string projections = "on";  ///< plan_options::fuse_projections of both plans (on: the default)
  std::string fold_norms = "on";   ///< plan_options::fold_norm_weights of both plans (on: the default)
  std::string decode_step = "on";  ///< plan_options::fuse_decode_step of both plans (on: the default)
  /// plan_options::fuse_tp_decode_step (off: the default); on also forces
  /// in-stream collectives, which the step needs (logical devices of one
  /// GPU do not choose them)
  std::string tp_decode_step = "off";
  std::string pdl = "on";          ///< backend_options::cuda_pdl (on: the default)
  /// backend_options::cuda_copy_engine_collectives (on: the default): with
  /// --tp, a prefill of at least 16 MiB of activations at width 4096 (32 MiB
  /// at 2048: LLaMA-1B's 8192 tokens) runs sequence parallel
  std::string copy_engine = ag::gpu::backend_options{}.cuda_copy_engine_collectives ? "on" : "off";
  /// backend_options::cuda_sequence_parallel_min_bytes in KiB (the default's)
  int64_t sp_min_kib = ag::gpu::backend_options{}.cuda_sequence_parallel_min_bytes >> 10;
  std::string inline_copies = "on";  ///< plan_options::inline_small_copies of both plans (on: the default)
  std::string device_masks = "on";   ///< generator_options::prompt_masks_on_device (on: the default)
  std::string doubling = "on";       ///< generator_options::doubling_prompt_plans (on: the default)
  std::string replay_host_copies = "on";  ///< plan_options::replay_host_copies of both plans (on: the default)
  std::string windows_in_place = "on";    ///< plan_options::host_windows_in_place of both plans (on: the default)
  std::string device_greedy = "on";  ///< generator_options::device_greedy (on: the default): tokens picked on the device
  int pipeline_depth = 2;  ///< generator_options::pipeline_depth (2: the default): greedy steps queued ahead
  int tensor_parallel = 1;  ///< plan_options::tensor_parallel of the generator's plans
  std::string across_stages = "off";  ///< generator_options::pipeline_across_stages (off: the default)
  bool sim_zero_delay = false;  ///< sim devices model no time and compute no values: the host's costs alone
  bool sim_timing_only = false; ///< sim devices model their kernels' time but compute no values
  int stages = 0;           ///< plan_options::pipeline_stages of the generator's plans (0: every device)
  std::string start_on_submit = "on";  ///< runtime_options::start_jobs_on_submit (on: the default)
  std::string pinned_inputs = "on";    ///< runtime_options::pinned_inputs_max_bytes 64 KiB (on: the default) or 0
  /// runtime_options::trace (on: the default, and the per-token breakdown
  /// below needs it; off: no timing events per step)
  std::string trace = "on";
};

// The median of `v` (0 when empty).
double median_of(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

int run_decode(const decode_args& a) {
  ag::runtime_options ro;
  ro.backend.cpu_threads_per_stream = a.cpu_threads;
  ro.backend.cuda_gemv = a.gemv == "on";
  ro.backend.cuda_gemv_tensor_core_rows = a.gemv_tensor_core_rows;
  ro.backend.cuda_pdl = a.pdl == "on";
  ro.backend.cuda_copy_engine_collectives = a.copy_engine == "on";
  ro.backend.cuda_sequence_parallel_min_bytes = a.sp_min_kib << 10;
  ro.start_jobs_on_submit = a.start_on_submit == "on";
  ro.trace = a.trace == "on";
  if (a.pinned_inputs == "off") ro.pinned_inputs_max_bytes = 0;
  if (a.sim_zero_delay) ro.backend.sim.zero_delay = true;
  if (a.sim_zero_delay || a.sim_timing_only) ro.backend.sim.compute_values = false;
  auto rt = ag::runtime::create(a.devices, ro);
  if (!rt) return fail(rt.err());
  const auto t_open = clock_type::now();
  auto model = ag::models::hf_model::open(a.model);
  if (!model) return fail(model.err());
  const auto& mc = model->config().model;
  ag::generator_options go;
  go.cache_tokens = a.cache_tokens > 0 ? a.cache_tokens : a.context + a.new_tokens;
  if (go.cache_tokens < a.context + a.new_tokens)
    return fail({ag::errc::invalid_argument, "--cache-tokens " + std::to_string(a.cache_tokens) +
                                                 " is less than --context + --new-tokens (" +
                                                 std::to_string(a.context + a.new_tokens) + ")"});
  go.max_sequences = 1;
  go.prefill_chunk = a.prefill_chunk > 0 ? a.prefill_chunk : a.context;
  go.short_prompt_chunk = a.short_prompt_chunk;
  if (!ag::parse_graph_replay_mode(a.replay, go.plan.graph_replay))
    return fail({ag::errc::invalid_argument, "--replay must be off, on or auto, got '" + a.replay + "'"});
  go.plan.fuse_ops = a.fusion == "on";
  go.plan.fuse_projections = a.projections == "on";
  go.plan.fold_norm_weights = a.fold_norms == "on";
  go.plan.fuse_decode_step = a.decode_step == "on";
  if (a.tp_decode_step == "on") {
    go.plan.fuse_tp_decode_step = true;
    go.plan.in_stream_collectives = ag::in_stream_mode::on;
  }
  go.plan.inline_small_copies = a.inline_copies == "on";
  go.prompt_masks_on_device = a.device_masks == "on";
  go.doubling_prompt_plans = a.doubling == "on";
  go.plan.replay_host_copies = a.replay_host_copies == "on";
  go.plan.host_windows_in_place = a.windows_in_place == "on";
  go.device_greedy = a.device_greedy == "on";
  go.pipeline_depth = a.pipeline_depth;
  go.pipeline_across_stages = a.across_stages == "on";
  go.plan.tensor_parallel = a.tensor_parallel;
  go.plan.pipeline_stages = a.stages;
  auto gen = ag::generator::create(**rt, model->model_config(1), model->provider(), go);
  if (!gen) return fail(gen.err());
  const double load_s = seconds_since(t_open);
  // The generator compiled two plans (prefill and decode); the prefill plan
  // uploads the model only where it cannot use the decode plan's weights.
  const double model_gb = static_cast<double>((*gen)->weight_bytes()) / 1e9;
  {
    // The plans a prompt's pieces take, and the activation memory each holds.
    std::string plans;
    for (const ag::plan* p : (*gen)->prompt_plans()) {
      int64_t arena = 0;
      for (const ag::device_memory& dm : p->memory()) arena += dm.arena_bytes;
      const ag::graph& g = p->source();
      plans += " " + std::to_string(g.at(g.inputs()[0]).dims.numel()) + " (arena " +
               std::to_string(arena >> 20) + " MiB)";
    }
    std::printf("%-28s%s\n", "prompt plans (tokens a job)", plans.empty() ? " none: the decode plan" : plans.c_str());
  }

  std::vector<int32_t> prompt(static_cast<std::size_t>(a.context));
  for (std::size_t i = 0; i < prompt.size(); ++i) prompt[i] = static_cast<int32_t>((i * 7919 + 13) % mc.vocab);
  std::mutex m;
  std::vector<clock_type::time_point> at;
  std::vector<int64_t> token_ns;  // host_clock_ns of each token's on_token (the trace's clock)
  ag::generate_options o;
  o.max_new_tokens = a.new_tokens;
  o.on_token = [&](int32_t, int64_t) {
    std::lock_guard lk(m);
    at.push_back(clock_type::now());
    token_ns.push_back(ag::gpu::host_clock_ns());
  };
  const ag::generation h = (*gen)->generate(prompt, o);
  if (!h.wait()) return fail(h.wait().err());
  std::vector<double> gaps;
  for (std::size_t i = 1; i < at.size(); ++i) gaps.push_back(std::chrono::duration<double>(at[i] - at[i - 1]).count());
  if (gaps.empty()) return fail({ag::errc::internal, "fewer than 2 tokens generated"});
  std::sort(gaps.begin(), gaps.end());
  const double ms = gaps[gaps.size() / 2] * 1e3;
  // Where a token's time goes, from the trace: the device's span of each
  // decode job (its first step's start to its last step's end) and the
  // device's idle time between one job's end and the next one's start (the
  // host's round trip: logits down, sampling, the next submit, inputs up).
  const ag::trace tr = (*rt)->take_trace();
  const auto span = ag::apps::job_spans(tr);
  // Per job also: its first step's enqueue (host clock), its input copies
  // (the steps that end before its longest compute step, the replayed
  // segment, starts: on the h2d queue, or on the compute lane when small
  // copies run there) and that segment.
  struct job_marks {
    int64_t first_enqueue = 0, h2d_first_start = 0, h2d_last_end = 0, compute_first_start = 0, compute_last_end = 0;
    int64_t longest = -1;  // the longest compute step's duration
    int h2d_steps = 0;
  };
  std::map<uint64_t, job_marks> marks;
  const auto first_of = [](int64_t& v, int64_t x) { v = v == 0 ? x : std::min(v, x); };
  for (const auto& r : tr.records) {
    auto& mk = marks[r.job];
    first_of(mk.first_enqueue, r.enqueue_ns);
    if (r.lane.rfind("compute", 0) == 0 && r.end_ns - r.start_ns > mk.longest) {
      mk.longest = r.end_ns - r.start_ns;
      mk.compute_first_start = r.start_ns;
    }
  }
  for (const auto& r : tr.records) {
    auto& mk = marks[r.job];
    if ((r.lane == "h2d" || r.lane.rfind("compute", 0) == 0) && r.end_ns <= mk.compute_first_start) {
      ++mk.h2d_steps;
      first_of(mk.h2d_first_start, r.start_ns);
      mk.h2d_last_end = std::max(mk.h2d_last_end, r.end_ns);
    } else if (r.lane.rfind("compute", 0) == 0) {
      mk.compute_last_end = std::max(mk.compute_last_end, r.end_ns);
    }
  }
  // Tensor-parallel steps: each device's longest compute step of a job (a
  // fused step's kernel, one a rank), to see how far apart the ranks start
  // and how long each runs.
  std::map<uint64_t, std::map<int, std::pair<int64_t, int64_t>>> rank_longest;
  for (const auto& r : tr.records) {
    if (r.lane.rfind("compute", 0) != 0) continue;
    auto& l = rank_longest[r.job][r.device];
    if (r.end_ns - r.start_ns > l.second - l.first) l = {r.start_ns, r.end_ns};
  }
  std::vector<double> rank_skew_us, rank_kernel_ms;
  std::vector<double> device_ms, idle_ms, to_enqueue_us, h2d_us, h2d_to_compute_us, compute_ms, tail_us;
  std::vector<double> h2d_steps, end_to_token_us, token_to_enqueue_us;
  const std::pair<int64_t, int64_t>* before = nullptr;
  std::size_t k = 0;
  for (const auto& [job, sp] : span) {
    if (k++ > 0) {  // the first job is the prompt's (prefill)
      const job_marks& mk = marks[job];
      device_ms.push_back(static_cast<double>(sp.second - sp.first) / 1e6);
      if (k > 2) {
        idle_ms.push_back(static_cast<double>(sp.first - before->second) / 1e6);
        to_enqueue_us.push_back(static_cast<double>(mk.first_enqueue - before->second) / 1e3);
        // Job k - 2 in span order sampled token k - 2 (the prompt's job, token 0, is first).
        if (k - 2 < token_ns.size()) {
          const int64_t tok = token_ns[k - 2];
          end_to_token_us.push_back(static_cast<double>(tok - before->second) / 1e3);
          token_to_enqueue_us.push_back(static_cast<double>(mk.first_enqueue - tok) / 1e3);
        }
      }
      h2d_steps.push_back(mk.h2d_steps);
      h2d_us.push_back(static_cast<double>(mk.h2d_last_end - mk.h2d_first_start) / 1e3);
      h2d_to_compute_us.push_back(mk.h2d_steps > 0 ? static_cast<double>(mk.compute_first_start - mk.h2d_last_end) / 1e3
                                                   : 0.0);
      compute_ms.push_back(static_cast<double>(mk.compute_last_end - mk.compute_first_start) / 1e6);
      tail_us.push_back(static_cast<double>(sp.second - mk.compute_last_end) / 1e3);
      if (const auto& ranks = rank_longest[job]; ranks.size() > 1) {
        int64_t first = INT64_MAX, last = 0;
        for (const auto& [dev, se] : ranks) {
          first = std::min(first, se.first), last = std::max(last, se.first);
          rank_kernel_ms.push_back(static_cast<double>(se.second - se.first) / 1e6);
        }
        rank_skew_us.push_back(static_cast<double>(last - first) / 1e3);
      }
    }
    before = &sp;
  }

  // Bytes one decode token must read: every weight but the input embedding
  // table (one row of it), and the cache of `context` positions (of the
  // last sliding_window ones under a window).
  const double esize = static_cast<double>(ag::dtype_size(model->dtype()));
  const double embed = static_cast<double>(mc.vocab * mc.d_model) * esize;
  const double weights_read =
      static_cast<double>(ag::models::parameter_count(model->model_config(1))) * esize - (mc.tied_head() ? 0.0 : embed);
  const int64_t keys_seen = mc.sliding_window > 0 ? std::min(a.context, mc.sliding_window) : a.context;
  const double cache = 2.0 * mc.n_layers * static_cast<double>(mc.kv_heads() * keys_seen * mc.head_dim()) * esize;
  const double bw = a.bandwidth_gbs > 0 ? a.bandwidth_gbs * 1e9 : (*rt)->devices().at(0).mem_bandwidth;
  const double floor_ms = (weights_read + cache) / bw * 1e3;

  // Prefill: one forward job of `prefill` tokens (best of 3 after the
  // warm-up jobs, apps/common/warm_up.hpp), twice: as a
  // greedy generation's prefill runs it (each position's next token picked
  // on the device, 4 bytes a position to the host), and with every
  // position's f32 logits copied to the host (268 MB for 2048 x 32000: the
  // PCIe copy, not the GPU, is most of that job). PyTorch's reference keeps
  // its logits on the device. The generator's plan options: its layout
  // (--tp, --stages) and --fusion, --projections, --replay and the copies'
  // flags (until session 42 only the fusion flags: with --tp the prefill ran
  // as a pipeline of one job over the devices).
  // Time to first token: a new sequence of the same prompt, one token,
  // from generate() to its end (its slot reused: the cache's old rows stay,
  // hidden by the mask). Medians of --first-token-runs.
  std::vector<double> first_token_ms;
  std::vector<int64_t> first_token_start_ns;  // each run's generate() call (the trace's clock)
  if (!a.first_token_trace.empty()) (void)(*rt)->take_trace();  // only the runs below
  for (int run = 0; run < a.first_token_runs; ++run) {
    ag::generate_options one;
    one.max_new_tokens = 1;
    first_token_start_ns.push_back(ag::gpu::host_clock_ns());
    const auto t0 = clock_type::now();
    const ag::generation g1 = (*gen)->generate(prompt, one);
    if (!g1.wait()) return fail(g1.wait().err());
    first_token_ms.push_back(seconds_since(t0) * 1e3);
  }
  if (!a.first_token_trace.empty() && a.first_token_runs > 0) {
    const ag::trace ft = (*rt)->take_trace();
    std::ofstream f(a.first_token_trace);
    f << ft.to_chrome_json();
    if (!f) return fail({ag::errc::invalid_argument, "--first-token-trace: cannot write " + a.first_token_trace});
    // Per run: generate() to the device's first enqueue, and the device's
    // span (its first start to its last end) on the trace's clock.
    for (std::size_t run = 0; run < first_token_start_ns.size(); ++run) {
      const int64_t from = first_token_start_ns[run];
      const int64_t to = run + 1 < first_token_start_ns.size() ? first_token_start_ns[run + 1] : INT64_MAX;
      int64_t first_enqueue = INT64_MAX, first_start = INT64_MAX, last_end = 0;
      for (const auto& r : ft.records)
        if (r.enqueue_ns >= from && r.enqueue_ns < to) {
          first_enqueue = std::min(first_enqueue, r.enqueue_ns);
          first_start = std::min(first_start, r.start_ns);
          last_end = std::max(last_end, r.end_ns);
        }
      if (first_enqueue == INT64_MAX) continue;
      std::printf("%-28s run %zu: %.3f ms to the first enqueue, device %.3f ms from its first start to its last end\n",
                  "first token, cut", run, static_cast<double>(first_enqueue - from) / 1e6,
                  static_cast<double>(last_end - first_start) / 1e6);
    }
  }

  double prefill_best = 0.0, prefill_logits_best = 0.0;
  if (a.prefill > 0) {
    for (const bool greedy : {true, false}) {
      ag::models::transformer_config pc = model->model_config(a.prefill, 1);
      pc.argmax_output = greedy;
      auto g = ag::models::build_transformer(pc, model->provider());
      if (!g) return fail(g.err());
      auto p = (*rt)->compile(std::move(*g), go.plan);
      if (!p) return fail(p.err());
      std::vector<int32_t> ids(static_cast<std::size_t>(a.prefill)), pos(ids.size());
      for (std::size_t i = 0; i < ids.size(); ++i) {
        ids[i] = static_cast<int32_t>((i * 7919 + 13) % mc.vocab);
        pos[i] = static_cast<int32_t>(i);
      }
      double& best = greedy ? prefill_best : prefill_logits_best;
      for (int rep = 0; rep < ag::apps::warm_up_jobs + 3; ++rep) {
        const auto t0 = clock_type::now();
        ag::job j = (*rt)->submit(*p, {ag::host_tensor::from_ints({1, a.prefill}, ids),
                                       ag::host_tensor::from_ints({a.prefill}, pos)});
        if (!j.wait()) return fail(j.wait().err());
        const double s = seconds_since(t0);
        if (rep >= ag::apps::warm_up_jobs && (best == 0.0 || s < best)) best = s;
      }
    }
  }

  std::printf("%-28s %s, %s, %d layers, d %lld, %d heads (%d kv), vocab %lld\n", "model", a.model.c_str(),
              ag::to_string(model->dtype()), mc.n_layers, static_cast<long long>(mc.d_model), mc.n_heads,
              mc.kv_heads(), static_cast<long long>(mc.vocab));
  std::printf("%-28s %.3f GB uploaded (%.2f x the model's %.3f GB, for its plans) in %.3f s\n", "load", model_gb,
              model_gb * 1e9 / static_cast<double>(model->model_bytes()), static_cast<double>(model->model_bytes()) / 1e9,
              load_s);
  std::printf(
      "%-28s %.3f ms/token (median of %zu), context %lld, graph replay %s, fusion %s, gemv %s, projections %s, "
      "norm weights folded %s, decode step fused %s, pdl %s, inline copies %s, prompt masks on the device %s, "
      "start on submit %s, pinned inputs %s, device greedy %s, pipeline depth %d (across stages "
      "%s), trace %s; devices %s%s, stages %d, tp %d\n",
      "decode", ms, gaps.size(), static_cast<long long>(a.context), a.replay.c_str(), a.fusion.c_str(), a.gemv.c_str(),
      a.projections.c_str(), a.fold_norms.c_str(), a.decode_step.c_str(), a.pdl.c_str(), a.inline_copies.c_str(),
      a.device_masks.c_str(), a.start_on_submit.c_str(),
      a.pinned_inputs.c_str(), a.device_greedy.c_str(), a.pipeline_depth, a.across_stages.c_str(), a.trace.c_str(),
      a.devices.c_str(), a.sim_zero_delay ? " (zero delay)" : "",
      (*gen)->decode_plan().stage_count(), (*gen)->decode_plan().tensor_degree());
  {
    // Whether the decode step runs as one kernel, or why not (the lowering
    // the runtime does, done again here to read its note).
    const auto note_of = [](const ag::plan& p) {
      auto prog = ag::actors::lower(std::shared_ptr<const ag::plan>(&p, [](const ag::plan*) {}));
      return prog ? (*prog)->decode_step_note() : prog.err().message;
    };
    std::printf("%-28s %s\n", "decode step", note_of((*gen)->decode_plan()).c_str());
    if (const ag::plan* twin = (*gen)->short_sequence_decode_plan())
      std::printf("%-28s %s (while a sequence holds at most %lld positions)\n", "decode step, short sequences",
                  note_of(*twin).c_str(), static_cast<long long>(ag::decode_step_max_cache_rows));
    // The greedy steps (device_greedy): the plans a greedy run decodes with.
    const std::vector<const ag::plan*> greedy = (*gen)->greedy_decode_plans();
    if (!greedy.empty()) std::printf("%-28s %s\n", "decode step, greedy", note_of(*greedy.front()).c_str());
  }
  std::printf("%-28s %.3f ms (%.1f MB weights + %.1f MB cache at %.0f GB/s)\n", "bandwidth floor", floor_ms,
              weights_read / 1e6, cache / 1e6, bw / 1e9);
  // The cache as held: every position, or a sliding window's ring.
  std::printf("%-28s %lld positions, %lld rows a layer%s, %.1f MB on the devices\n", "kv cache",
              static_cast<long long>(go.cache_tokens), static_cast<long long>((*gen)->cache_rows()),
              mc.sliding_window > 0 ? (", window " + std::to_string(mc.sliding_window)).c_str() : "",
              static_cast<double>((*gen)->cache_bytes()) / 1e6);
  std::printf("kv_cache_rows: %lld\nkv_cache_mb: %.1f\n", static_cast<long long>((*gen)->cache_rows()),
              static_cast<double>((*gen)->cache_bytes()) / 1e6);
  if (!device_ms.empty()) {
    std::printf("%-28s %.3f ms on the device, %.3f ms idle between tokens (medians over %zu decode jobs, trace)\n",
                "decode job", median_of(device_ms), median_of(idle_ms), device_ms.size());
    std::printf("decode_device_ms_per_token: %.3f\ndecode_idle_ms_between_tokens: %.3f\n", median_of(device_ms),
                median_of(idle_ms));
    std::printf("%-28s previous job's end -> first step enqueued %.1f us; input copies: %.0f steps over %.1f us; "
                "-> segment %.1f us; segment to the last compute end %.3f ms; -> job end %.1f us (medians)\n",
                "decode job, cut", median_of(to_enqueue_us), median_of(h2d_steps), median_of(h2d_us),
                median_of(h2d_to_compute_us), median_of(compute_ms), median_of(tail_us));
    std::printf("%-28s previous job's end -> its token sampled on the host %.1f us; token -> first step enqueued "
                "%.1f us (medians)\n",
                "decode job, host part", median_of(end_to_token_us), median_of(token_to_enqueue_us));
    if (!rank_skew_us.empty())
      std::printf("%-28s the latest rank's longest compute step starts %.1f us after the first's; each lasts %.3f ms "
                  "(medians)\n",
                  "decode job, ranks", median_of(rank_skew_us), median_of(rank_kernel_ms));
  }
  std::printf("%-28s %lld of %zu tokens picked on the device, %lld of them read their token there (pipelined)\n",
              "decode tokens", static_cast<long long>(h.wait()->tokens_picked_on_device), h.wait()->tokens.size(),
              static_cast<long long>(h.wait()->tokens_pipelined));
  std::printf("load_gb_per_s: %.3f\n", model_gb / load_s);
  {
    const ag::replay_stats rs = (*rt)->replay_statistics();
    std::printf("%-28s plain %lld, captured %lld, replayed %lld, fallbacks %lld%s%s\n", "graph replay",
                static_cast<long long>(rs.plain), static_cast<long long>(rs.captured),
                static_cast<long long>(rs.replayed), static_cast<long long>(rs.fallbacks),
                rs.last_fallback.empty() ? "" : ": ", rs.last_fallback.c_str());
  }
  std::printf("decode_ms_per_token: %.3f\n", ms);
  std::printf("decode_floor_ms: %.3f\n", floor_ms);
  std::printf("decode_vs_bandwidth_floor: %.3f\n", ms / floor_ms);
  if (!first_token_ms.empty())
    std::printf("time_to_first_token_ms: %.3f\n", median_of(first_token_ms));
  if (prefill_best > 0) std::printf("prefill_tokens_per_s: %.1f\n", static_cast<double>(a.prefill) / prefill_best);
  if (prefill_logits_best > 0)
    std::printf("prefill_with_logits_tokens_per_s: %.1f\n", static_cast<double>(a.prefill) / prefill_logits_best);
  return 0;
}


// --mode batch: N sequences decoding at once, their steps batched
// (generator_options::decode_batch N) against the same N each stepping on
// its own (decode_batch 0), two generators over one runtime, alternated.
// The figure is the steady state: tokens streamed between the moment the
// last sequence got its first token and the moment the first one ended,
// when all N decode (prompts of --context tokens first, in chunks of
// --prefill-chunk).
struct batch_args {
  std::string model, devices = "cuda:0";
  int sequences = 8;
  int decode_batch = 8;  // generator_options::decode_batch of the batched side
  int64_t context = 512, prefill_chunk = 0, new_tokens = 64;
  int rounds = 2;
  int cpu_threads = 0;                                   // backend_options::cpu_threads_per_stream
  int gemv_tensor_core_rows = ag::gpu::backend_options{}.cuda_gemv_tensor_core_rows;  // its default
  bool fusion = true, projections = true, gemv = true;  // plan_options::fuse_ops, fuse_projections; cuda_gemv
  bool sim_zero_delay = false;                           // the instant sim device: the host's costs alone
  bool sim_timing_only = false;                          // sim devices' modelled time, no values
  int pipeline_depth = 2;                                // generator_options::pipeline_depth of both
  ag::graph_replay_mode replay = ag::graph_replay_mode::automatic;
};

struct batch_round {
  double steady_tokens_per_s = 0.0, all_tokens_per_s = 0.0, step_ms = 0.0;
  // From the trace, over the jobs that began inside the steady window: the
  // median device span of a job (its first step's start to its last step's
  // end) and the device's median idle time between consecutive jobs. A
  // step whose device span is near step_ms is decided by its kernels; a
  // large idle time by the host's round trip.
  double job_device_ms = 0.0, idle_between_jobs_ms = 0.0;
  int64_t tokens_batched = 0, tokens = 0, tokens_pipelined = 0;
};

ag::expected<batch_round> run_batch_round(ag::runtime& rt, ag::generator& gen, const batch_args& a, int64_t vocab,
                                          int round) {
  (void)rt.take_trace();  // only this round's jobs
  std::mutex m;
  std::vector<std::vector<clock_type::time_point>> at(static_cast<std::size_t>(a.sequences));
  std::vector<ag::generation> hs;
  const auto t0 = clock_type::now();
  for (int s = 0; s < a.sequences; ++s) {
    std::vector<int32_t> prompt(static_cast<std::size_t>(a.context));
    for (std::size_t i = 0; i < prompt.size(); ++i)
      prompt[i] = static_cast<int32_t>((i * 7919 + 13 + static_cast<std::size_t>(s * 101 + round)) % vocab);
    ag::generate_options o;
    o.max_new_tokens = static_cast<int>(a.new_tokens);
    o.on_token = [&m, &at, s](int32_t, int64_t) {
      std::lock_guard lk(m);
      at[static_cast<std::size_t>(s)].push_back(clock_type::now());
    };
    hs.push_back(gen.generate(std::move(prompt), o));
  }
  batch_round r;
  for (const auto& h : hs) {
    if (!h.wait()) return h.wait().err();
    r.tokens_batched += h.wait()->tokens_batched;
    r.tokens_pipelined += h.wait()->tokens_pipelined;
    r.tokens += static_cast<int64_t>(h.wait()->tokens.size());
  }
  const double all_s = seconds_since(t0);
  clock_type::time_point start = t0, end = clock_type::time_point::max();
  for (const auto& v : at) {
    if (v.empty()) return ag::error{ag::errc::internal, "a sequence streamed no token"};
    start = std::max(start, v.front());
    end = std::min(end, v.back());
  }
  int64_t inside = 0;
  std::vector<double> gaps;
  for (const auto& v : at)
    for (std::size_t i = 0; i < v.size(); ++i) {
      if (v[i] > start && v[i] <= end) ++inside;
      if (i > 0 && v[i - 1] >= start && v[i] <= end)
        gaps.push_back(std::chrono::duration<double>(v[i] - v[i - 1]).count());
    }
  const double steady_s = std::chrono::duration<double>(end - start).count();
  r.steady_tokens_per_s = steady_s > 0 ? static_cast<double>(inside) / steady_s : 0.0;
  r.all_tokens_per_s = static_cast<double>(r.tokens) / all_s;
  r.step_ms = median_of(gaps) * 1e3;
  // The trace's clock is the host's steady clock in ns (gpu::host_clock_ns),
  // as clock_type's.
  const int64_t from_ns = std::chrono::duration_cast<std::chrono::nanoseconds>(start.time_since_epoch()).count();
  const int64_t to_ns = std::chrono::duration_cast<std::chrono::nanoseconds>(end.time_since_epoch()).count();
  std::vector<std::pair<int64_t, int64_t>> spans;  // the steady window's jobs, by start
  for (const auto& [job, sp] : ag::apps::job_spans(rt.take_trace()))
    if (sp.first >= from_ns && sp.second <= to_ns) spans.push_back(sp);
  std::sort(spans.begin(), spans.end());
  std::vector<double> device_ms, idle_ms;
  for (std::size_t i = 0; i < spans.size(); ++i) {
    device_ms.push_back(static_cast<double>(spans[i].second - spans[i].first) / 1e6);
    if (i > 0) idle_ms.push_back(static_cast<double>(std::max<int64_t>(0, spans[i].first - spans[i - 1].second)) / 1e6);
  }
  r.job_device_ms = median_of(device_ms);
  r.idle_between_jobs_ms = median_of(idle_ms);
  return r;
}

int run_batch(const batch_args& a) {
  ag::runtime_options ro;
  ro.backend.cuda_gemv = a.gemv;
  ro.backend.cpu_threads_per_stream = a.cpu_threads;
  ro.backend.cuda_gemv_tensor_core_rows = a.gemv_tensor_core_rows;
  if (a.sim_zero_delay) ro.backend.sim.zero_delay = true;
  if (a.sim_zero_delay || a.sim_timing_only) ro.backend.sim.compute_values = false;
  auto rt = ag::runtime::create(a.devices, ro);
  if (!rt) return fail(rt.err());
  auto model = ag::models::hf_model::open(a.model);
  if (!model) return fail(model.err());
  const int64_t vocab = model->config().model.vocab;
  std::shared_ptr<ag::generator> gens[2];  // [0]: batched, [1]: one sequence a job
  for (int k = 0; k < 2; ++k) {
    ag::generator_options go;
    go.cache_tokens = a.context + a.new_tokens;
    go.max_sequences = a.sequences;
    go.prefill_chunk = a.prefill_chunk > 0 ? a.prefill_chunk : a.context;
    go.decode_batch = k == 0 ? a.decode_batch : 0;
    go.pipeline_depth = a.pipeline_depth;
    go.plan.fuse_ops = a.fusion;
    go.plan.fuse_projections = a.projections;
    go.plan.graph_replay = a.replay;
    auto gen = ag::generator::create(**rt, model->model_config(1), model->provider(), go);
    if (!gen) return fail(gen.err());
    gens[k] = std::move(*gen);
  }
  // Warm-up: every plan's first jobs (arenas, captures).
  for (auto& g : gens) {
    batch_args w = a;
    w.new_tokens = std::min<int64_t>(a.new_tokens, 8);
    if (auto r = run_batch_round(**rt, *g, w, vocab, -1); !r) return fail(r.err());
  }
  batch_round best[2];
  for (int round = 0; round < a.rounds; ++round)
    for (int k = 0; k < 2; ++k) {
      auto r = run_batch_round(**rt, *gens[k], a, vocab, round);
      if (!r) return fail(r.err());
      std::printf("%-34s round %d: steady %.1f tokens/s (a sequence's step %.3f ms), all %.1f tokens/s, %lld of %lld "
                  "tokens batched, %lld pipelined; a job %.3f ms on the device, %.3f ms idle between jobs (trace "
                  "medians)\n",
                  k == 0 ? "batched" : "one sequence a job", round, r->steady_tokens_per_s, r->step_ms,
                  r->all_tokens_per_s, static_cast<long long>(r->tokens_batched), static_cast<long long>(r->tokens),
                  static_cast<long long>(r->tokens_pipelined), r->job_device_ms, r->idle_between_jobs_ms);
      if (r->steady_tokens_per_s > best[k].steady_tokens_per_s) best[k] = *r;
    }
  std::printf("%-34s %14s %14s %14s\n", (a.devices + ", " + std::to_string(a.sequences) + " sequences").c_str(),
              "steady tok/s", "step ms", "all tok/s");
  std::printf("%-34s %14.1f %14.3f %14.1f\n", ("decode_batch " + std::to_string(a.decode_batch)).c_str(),
              best[0].steady_tokens_per_s, best[0].step_ms, best[0].all_tokens_per_s);
  std::printf("%-34s %14.1f %14.3f %14.1f\n", "decode_batch 0", best[1].steady_tokens_per_s, best[1].step_ms,
              best[1].all_tokens_per_s);
  std::printf("batched_decode_tokens_per_s: %.1f\n", best[0].steady_tokens_per_s);
  std::printf("unbatched_decode_tokens_per_s: %.1f\n", best[1].steady_tokens_per_s);
  std::printf("batched_decode_step_ms: %.3f\n", best[0].step_ms);
  std::printf("batched_decode_job_device_ms: %.3f\n", best[0].job_device_ms);
  std::printf("batched_decode_idle_between_jobs_ms: %.3f\n", best[0].idle_between_jobs_ms);
  {
    const ag::replay_stats rs = (*rt)->replay_statistics();
    std::printf("%-34s plain %lld, captured %lld, replayed %lld, fallbacks %lld%s%s\n", "graph replay (both sides)",
                static_cast<long long>(rs.plain), static_cast<long long>(rs.captured),
                static_cast<long long>(rs.replayed), static_cast<long long>(rs.fallbacks),
                rs.last_fallback.empty() ? "" : ": ", rs.last_fallback.c_str());
  }
  std::printf("batched_decode_speedup: %.2f\n", best[1].steady_tokens_per_s > 0
                                                      ? best[0].steady_tokens_per_s / best[1].steady_tokens_per_s
                                                      : 0.0);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  std::string mode = "sim";
  double time_scale = 20.0;
  int sequences = 8, sim_tokens = 12, rounds = 2, decode_batch = 0;
  decode_args d;
  ag::apps::flags app("actorgraph-generate-bench",
                      "Generation figures: pipelined_sequences_speedup_sim (--mode sim), or decode, prefill and load "
                      "figures of a model folder on real devices (--mode decode), or batched decoding of many "
                      "sequences against one sequence a job (--mode batch).");
  app.add_option("--mode", mode, "sim, decode or batch")->check(CLI::IsMember({"sim", "decode", "batch"}));
  app.add_option("--time-scale", time_scale, "sim: wall seconds per simulated second")->check(CLI::PositiveNumber);
  app.add_option("--sequences", sequences,
                 "sim, batch: sequences decoding at once (batch: also generator_options::decode_batch unless "
                 "--decode-batch)")
      ->check(CLI::Range(1, 256));
  app.add_option("--decode-batch", decode_batch,
                 "batch: generator_options::decode_batch of the batched side (0: --sequences); more than "
                 "--sequences leaves lanes empty (--sequences 1 --decode-batch 8: a sequence alone in a slot of 8 "
                 "lanes against a slot of its own)")
      ->check(CLI::Range(0, 256));
  app.add_option("--rounds", rounds, "batch: rounds of each side, alternated (the best taken)")->check(CLI::Range(1, 100));
  app.add_option("--sim-tokens", sim_tokens, "sim: tokens per sequence")->check(CLI::Range(1, 48));
  app.add_option("--model", d.model, "decode: the model folder (actorgraph-save-model --shape llama-1b)");
  app.add_option("--devices", d.devices, "decode: device spec");
  app.add_option("--cpu-threads", d.cpu_threads,
                 "decode, batch: threads each cpu device's kernels use (0: the machine's hardware threads, shared "
                 "among the cpu devices)")
      ->check(CLI::Range(0, 1024));
  app.add_option("--context", d.context, "decode: prompt tokens before decoding")->check(CLI::Range(1, 1 << 20));
  app.add_option("--new-tokens", d.new_tokens, "decode: tokens to generate")->check(CLI::Range(2, 1 << 20));
  app.add_option("--prefill", d.prefill, "prefill tokens (0: skip)")->check(CLI::Range(0, 1 << 20));
  app.add_option("--short-prompt-chunk", d.short_prompt_chunk,
                 "decode: generator_options::short_prompt_chunk, the plan of prompts at most this long (0: none)")
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 20));
  app.add_option("--prefill-chunk", d.prefill_chunk,
                 "decode: the context's tokens a prefill job (0: all of them in one; under a sliding window the cache "
                 "keeps window + chunk - 1 rows)")
      ->check(CLI::Range(0, 1 << 20));
  app.add_option("--cache-tokens", d.cache_tokens,
                 "decode: the sequence's KV cache positions (0: context + new tokens; more: a cache the sequence "
                 "fills only partly, as a server's slot of a longer context)")
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 24));
  app.add_option("--first-token-runs", d.first_token_runs,
                 "decode: one-token sequences of the same prompt after the measured one (time_to_first_token_ms: "
                 "their median; 0: none)")
      ->check(CLI::Range(0, 1000));
  app.add_option("--first-token-trace", d.first_token_trace,
                 "decode: write the Chrome trace of the --first-token-runs to this file (and print each run's host "
                 "and device parts)");
  app.add_option("--bandwidth-gbs", d.bandwidth_gbs, "measured device memory bandwidth (0: the device spec's)");
  app.add_option("--replay", d.replay, "decode: graph replay of the generator's plans (off, on, auto)");
  ag::apps::add_on_off(app, "--fusion", d.fusion,
                       "decode: plan_options::fuse_ops of the generator's and the prefill's plans (on, off)");
  ag::apps::add_on_off(app, "--projections", d.projections,
                       "decode: plan_options::fuse_projections, projection groups on the GEMV kernel (on, off)");
  ag::apps::add_on_off(app, "--fold-norms", d.fold_norms,
                       "decode: plan_options::fold_norm_weights, rms_norm weights folded into the projections' weights "
                       "(on, off; plans of cpu devices alone never fold)");
  ag::apps::add_on_off(
      app, "--decode-step", d.decode_step,
      "decode: plan_options::fuse_decode_step, a whole one-device LLaMA decode step as one kernel where "
      "it fits (on, off)");
  ag::apps::add_on_off(app, "--tp-decode-step", d.tp_decode_step,
                       "decode: plan_options::fuse_tp_decode_step, a tensor-parallel LLaMA decode step as one kernel "
                       "a rank where it fits, in-stream collectives forced on (on, off)");
  ag::apps::add_on_off(app, "--gemv", d.gemv,
                       "decode: backend_options::cuda_gemv, the GEMV kernel for few-row matmuls (on, off)");
  app.add_option("--gemv-tensor-cores", d.gemv_tensor_core_rows,
                 "decode, batch: backend_options::cuda_gemv_tensor_core_rows, GEMVs of at least this many rows (2..8) "
                 "of 16-bit types on the tensor cores (0: never; default: backend_options')")
      ->check(CLI::Range(0, 8));
  ag::apps::add_on_off(app, "--pdl", d.pdl,
                       "decode: backend_options::cuda_pdl, kernels as programmatic dependent launches (on, off)");
  ag::apps::add_on_off(
      app, "--copy-engine", d.copy_engine,
      "decode: backend_options::cuda_copy_engine_collectives, with --tp large prefills sequence parallel "
      "on the copy engines (on, the default), or all-reduces (off)");
  app.add_option("--sp-min-kib", d.sp_min_kib,
                 "decode: backend_options::cuda_sequence_parallel_min_bytes in KiB: with --tp and --copy-engine on, "
                 "a prefill runs sequence parallel only for activations of at least this size in rows of 4096 elements "
                 "(scaled by 4096 / w for rows of w; 0: any size)")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 30));
  ag::apps::add_on_off(app, "--inline-copies", d.inline_copies,
                       "decode: plan_options::inline_small_copies, small host copies on the compute lane (on, off)");
  ag::apps::add_on_off(
      app, "--doubling-prompt-plans", d.doubling,
      "decode: generator_options::doubling_prompt_plans, prompt plans of the short prompt chunk doubling "
      "up to the prefill chunk (on, off: the short one alone)");
  ag::apps::add_on_off(
      app, "--device-masks", d.device_masks,
      "decode: generator_options::prompt_masks_on_device, the prompt plans' masks built on the device from "
      "the cache rows' positions (on, off: the host builds and copies them)");
  ag::apps::add_on_off(
      app, "--replay-host-copies", d.replay_host_copies,
      "decode: plan_options::replay_host_copies, the token's copies inside the replayed graph (on, off)");
  ag::apps::add_on_off(
      app, "--host-windows-in-place", d.windows_in_place,
      "decode: plan_options::host_windows_in_place, the token read and written in the host window (on, off)");
  app.add_option("--pipeline-depth", d.pipeline_depth,
                 "decode, batch: generator_options::pipeline_depth, greedy steps in flight (1: one at a time)")
      ->check(CLI::Range(1, 16));
  ag::apps::add_on_off(
      app, "--pipeline-across-stages", d.across_stages,
      "decode: generator_options::pipeline_across_stages, greedy steps pipelined over stages too (on, off)");
  app.add_flag("--sim-zero-delay", d.sim_zero_delay,
               "decode, batch: sim devices model no time and compute no values (the host's costs alone; tokens "
               "meaningless)");
  app.add_flag("--sim-timing-only", d.sim_timing_only,
               "decode, batch: sim devices model their kernels' time but compute no values (a device's timeline "
               "without its arithmetic; tokens meaningless)");
  app.add_option("--tp", d.tensor_parallel, "decode: plan_options::tensor_parallel of the generator's plans")
      ->check(CLI::Range(1, 1024));
  app.add_option("--stages", d.stages, "decode: plan_options::pipeline_stages of the generator's plans (0: every device)")
      ->check(CLI::Range(0, 1024));
  ag::apps::add_on_off(app, "--device-greedy", d.device_greedy,
                       "decode: generator_options::device_greedy, the token picked on the device (on, off)");
  ag::apps::add_on_off(
      app, "--pinned-inputs", d.pinned_inputs,
      "decode: runtime_options::pinned_inputs_max_bytes, small inputs copied to pinned memory by submit (on, off)");
  ag::apps::add_on_off(
      app, "--start-on-submit", d.start_on_submit,
      "decode: runtime_options::start_jobs_on_submit, jobs with free arenas start from submit (on, off)");
  ag::apps::add_on_off(
      app, "--trace", d.trace,
      "decode: runtime_options::trace, timing events per step (on: the default and what the breakdown reads; "
      "off)");
  if (auto status = ag::apps::parse_flags(app, argc, argv)) return *status;
  if (mode == "sim") return run_sim(time_scale, sequences, sim_tokens);
  if (d.model.empty()) {
    std::fprintf(stderr, "actorgraph-generate-bench: --mode %s needs --model\n", mode.c_str());
    return ag::apps::bad_flags_status;
  }
  if (mode == "batch") {
    batch_args b;
    b.model = d.model;
    b.devices = d.devices;
    b.sequences = sequences;
    b.decode_batch = decode_batch > 0 ? decode_batch : sequences;
    b.context = d.context;
    b.prefill_chunk = d.prefill_chunk;
    b.new_tokens = d.new_tokens;
    b.rounds = rounds;
    b.fusion = d.fusion == "on";
    b.projections = d.projections == "on";
    b.gemv = d.gemv == "on";
    b.cpu_threads = d.cpu_threads;
    b.gemv_tensor_core_rows = d.gemv_tensor_core_rows;
    b.sim_zero_delay = d.sim_zero_delay;
    b.sim_timing_only = d.sim_timing_only;
    b.pipeline_depth = d.pipeline_depth;
    if (!ag::parse_graph_replay_mode(d.replay, b.replay))
      return fail({ag::errc::invalid_argument, "--replay must be off, on or auto, got '" + d.replay + "'"});
    return run_batch(b);
  }
  return run_decode(d);
}
