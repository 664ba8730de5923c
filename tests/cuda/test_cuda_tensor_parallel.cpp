// Tensor parallelism on the CUDA backend, against the CPU reference: the
// layouts of issues 14 (two GPUs) and 15 (four GPUs), each also run on
// logical devices of one GPU so that the same code is checked on a 1-GPU
// machine. A layout needing more GPUs than the machine has skips, naming
// how many it needs.
//
// Layouts (device spec, collective path):
//  - logical: cuda:0,0 (cuda:0,0,0,0 for degree 4 and 2 x 2): members on one
//    GPU, the project's own one-shot all-reduce (NCCL cannot run there);
//  - oneshot: distinct GPUs, NCCL's crossover set above every message, so
//    every collective takes the own path over peer-mapped buffers;
//  - nccl: distinct GPUs, crossover at 1 byte, so every collective is NCCL's;
//  - logical_sp / nccl_sp: sequence parallelism on (reduce-scatter and
//    all-gather by rows), own one-shot path on logical devices, NCCL on two
//    GPUs;
//  - logical_ce / copy_engine: sequence parallelism on with the one-shot
//    limit at 0, so every reduce-scatter and all-gather moves by the copy
//    engines (collective_algo::copy_engine, the default for large messages);
//    all-reduces one-shot on logical devices, NCCL on two GPUs;
//  - logical_instream / instream: all-reduces in-stream (collective_algo::
//    in_stream, plan_options::in_stream_collectives, on by default: kernels
//    of the compute streams meeting on the devices), on logical devices of
//    GPU 0 or on distinct GPUs; the others take the own one-shot path. The
//    other layouts turn in-stream collectives off, so that theirs keep the
//    path they name.
//    On logical devices of one GPU the segments holding in-stream parts
//    launch kernel by kernel (mark_replay_segments: replayed, they timed
//    out there). Degree 4 with jobs in flight timed out on 4 H100s and on
//    logical devices until every queue of the plan kept the jobs' agreed
//    order (launch_queue::in_job_order, session 24), so these layouts ran
//    disabled until then.
#include <gtest/gtest.h>

#include <chrono>
#include <iostream>
#include <limits>
#include <memory>
#include <ostream>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "actors/actorgraph.hpp"
#include "cuda_test_util.hpp"
#include "gpu/collective_path.hpp"
#include "graph/models/transformer.hpp"
#include "graph/reference.hpp"
#include "graph/tp_random_graph.hpp"

namespace ag {
namespace {

using namespace std::chrono_literals;

struct tp_layout {
  const char* name;
  int gpus;          ///< distinct GPUs the layout needs
  bool nccl;         ///< collectives through NCCL (else the own one-shot path)
  bool in_stream = false;  ///< plan_options::in_stream_collectives
  /// plan_options::sequence_parallel on (its auto mode leaves it off on CUDA):
  /// reduce-scatters and all-gathers by rows, on the own one-shot path or
  /// NCCL (a reduce-scatter of rows that are not outermost: an all-reduce
  /// into scratch and a copy).
  bool sequence_parallel = false;
  /// backend_options::cuda_copy_engine_collectives, with the one-shot limit
  /// at 0: every reduce-scatter and all-gather by the copy engines. Off in
  /// the other layouts, so that theirs keep the path the layout names.
  bool copy_engine = false;
};

// What gtest prints for a layout (test names and ctest's list): its name.
void PrintTo(const tp_layout& l, std::ostream* os) { *os << l.name; }

const tp_layout logical{"logical", 1, false};
const tp_layout oneshot{"oneshot", 2, false};
const tp_layout nccl{"nccl", 2, true};
const tp_layout logical_instream{"logical_instream", 1, false, true};
const tp_layout instream{"instream", 2, false, true};
const tp_layout logical_sp{"logical_sp", 1, false, false, true};
const tp_layout nccl_sp{"nccl_sp", 2, true, false, true};
const tp_layout logical_ce{"logical_ce", 1, false, false, true, true};
const tp_layout copy_engine{"copy_engine", 2, true, false, true, true};

/// `members` devices: GPUs 0..gpus-1 in turn (cuda:0,1,0,1 for 4 members on
/// 2 GPUs: each tensor-parallel group of 2 consecutive devices spans both).
std::string spec_of(const tp_layout& l, int members) {
  std::string s = "cuda:";
  for (int k = 0; k < members; ++k) s += (k ? "," : "") + std::to_string(k % l.gpus);
  return s;
}

runtime_options options_of(const tp_layout& l) {
  runtime_options o;
  o.arenas_per_device = 4;
  o.backend.cuda_nccl_min_bytes = o.backend.cuda_nccl_min_bytes_wide =
      l.nccl || l.copy_engine ? 1 : std::numeric_limits<int64_t>::max();
  o.backend.cuda_copy_engine_collectives = l.copy_engine;
  return o;
}

/// Skips (with the reason) when the machine cannot run `l`.
#define AG_REQUIRE_LAYOUT(l)                                                                              \
  do {                                                                                                    \
    AG_REQUIRE_GPU((l).gpus);                                                                             \
    if ((l).nccl && !gpu::nccl_built()) GTEST_SKIP() << "this build has no NCCL (ACTORGRAPH_HAVE_NCCL unset)"; \
  } while (0)

/// The algorithm each collective step must carry on layout `l`: NCCL runs
/// what the plan calls a ring; the own path and logical devices run one-shot;
/// with the copy engines, reduce-scatters and all-gathers take them.
void expect_paths(const plan& p, const tp_layout& l) {
  int parts = 0;
  for (const auto& s : p.steps()) {
    if (s.kind != step_kind::collective) continue;
    ++parts;
    const op_kind op = p.source().at(s.ops.front()).op;
    if (l.copy_engine && (op == op_kind::reduce_scatter || op == op_kind::all_gather))
      EXPECT_EQ(s.algo, collective_algo::copy_engine) << "step " << s.id;
    else if (l.in_stream && op == op_kind::all_reduce)
      EXPECT_EQ(s.algo, collective_algo::in_stream) << "step " << s.id;
    else
      EXPECT_EQ(s.algo, l.nccl ? collective_algo::ring : collective_algo::one_shot) << "step " << s.id;
  }
  EXPECT_GT(parts, 0) << "the plan has no collective";
}

std::vector<host_tensor> random_inputs(const graph& g, uint64_t seed) {
  std::vector<host_tensor> in;
  for (node_id id : g.inputs()) {
    const auto& n = g.at(id);
    in.push_back(n.type == dtype::i32 ? host_tensor::random_ints(n.dims, seed++, 11)  // ids of 11-row tables
                                      : host_tensor::random_normal(n.type, n.dims, seed++));
  }
  return in;
}

models::transformer_config tiny(models::model_variant v, int layers) {
  models::transformer_config c;
  c.variant = v;
  c.n_layers = layers;
  c.d_model = 64;
  c.n_heads = 8;
  c.n_kv_heads = v == models::model_variant::llama ? 4 : 0;  // grouped-query attention: 2 query heads per kv head
  c.vocab = 101;
  c.seq_len = 16;
  c.batch = 2;
  return c;
}

/// Submits `jobs` jobs of `cfg` planned with `o` on `rt` at once and checks
/// each against the reference (f32 sums in another order: 2e-4 / 2e-3).
/// `every_chain_fused`: also that each attention chain the plan runs (each
/// scores product q k^T, one per layer and device, or per chunk where the
/// plan chunks the batch) is a fused attention kernel.
void run_transformer(runtime& rt, const models::transformer_config& cfg, const plan_options& o, const tp_layout& l,
                     int jobs, const std::string& what, bool every_chain_fused = false) {
  auto g = std::make_shared<const graph>(models::build_transformer(cfg).value());
  plan_options po = o;
  po.in_stream_collectives = l.in_stream ? in_stream_mode::on : in_stream_mode::off;
  if (l.sequence_parallel) po.sequence_parallel = sequence_parallel_mode::on;
  auto p = rt.compile(g, po);
  ASSERT_TRUE(p.has_value()) << what << ": " << p.err().to_string();
  expect_paths(**p, l);
  if (every_chain_fused) {
    std::size_t chains = 0;
    for (const auto& st : (*p)->steps())
      for (node_id id : st.ops) {
        const node& n = (*p)->source().at(id);
        chains += n.op == op_kind::matmul && n.name.find(".attn.qk@") != std::string::npos;
      }
    EXPECT_GE(chains, static_cast<std::size_t>(2 * cfg.n_layers)) << what << ": a chain per layer and device at least";
    EXPECT_EQ((*p)->fusions().size(), chains) << what << ": fused attention chains";
  }
  std::vector<job> js;
  std::vector<std::vector<host_tensor>> ins;
  for (int k = 0; k < jobs; ++k) {
    ins.push_back(models::transformer_inputs(cfg, 300 + static_cast<uint64_t>(k)));
    js.push_back(rt.submit(*p, ins.back()));
  }
  for (int k = 0; k < jobs; ++k) {
    const job& j = js[static_cast<std::size_t>(k)];
    ASSERT_TRUE(j.wait_for(120s)) << what << " job " << k << " did not finish in 120 s";
    const auto& r = j.wait();
    ASSERT_TRUE(r.has_value()) << what << " job " << k << ": " << r.err().to_string();
    auto want = evaluate_reference(*g, ins[static_cast<std::size_t>(k)]).value();
    auto c = cfg.dtype == dtype::f32 ? compare(r->front(), want.front(), 2e-4, 2e-3)
                                     : compare(r->front(), want.front(), 6e-2, 6e-2);
    EXPECT_TRUE(c.ok) << what << " job " << k << ": " << c.message;
  }
}

plan_options tp(int degree, int stages = 1) {
  plan_options o;
  o.tensor_parallel = degree;
  o.pipeline_stages = stages;
  return o;
}

struct CudaTensorParallel : ::testing::TestWithParam<tp_layout> {};

// GPT-2 and LLaMA (grouped-query attention) at degree 2, eight jobs in
// flight (their collectives interleave on both members' queues).
TEST_P(CudaTensorParallel, TransformersAtDegreeTwoEqualTheReference) {
  const tp_layout& l = GetParam();
  AG_REQUIRE_LAYOUT(l);
  auto rt = runtime::create(spec_of(l, 2), options_of(l));
  ASSERT_TRUE(rt.has_value()) << rt.err().to_string();
  for (auto v : {models::model_variant::gpt2, models::model_variant::llama})
    run_transformer(**rt, tiny(v, 2), tp(2), l, 8, std::string(models::to_string(v)) + " 1 x 2 on " + spec_of(l, 2));
}

// The same at 80 positions in bf16 with heads of 64: each device's share
// of the heads (4 query heads, 2 kv heads for LLaMA) runs the flash
// attention kernel, one per layer and device (per chunk where the layouts
// whose reduce-scatters and all-gathers all take the copy engines chunk the
// batch), on its views of q, k and v.
TEST_P(CudaTensorParallel, TransformersWithTheFlashAttentionAtDegreeTwoEqualTheReference) {
  const tp_layout& l = GetParam();
  AG_REQUIRE_LAYOUT(l);
  auto rt = runtime::create(spec_of(l, 2), options_of(l));
  ASSERT_TRUE(rt.has_value()) << rt.err().to_string();
  for (auto v : {models::model_variant::gpt2, models::model_variant::llama}) {
    models::transformer_config cfg = tiny(v, 2);
    cfg.d_model = 512;  // 8 heads of 64
    cfg.seq_len = 80;
    cfg.dtype = dtype::bf16;
    run_transformer(**rt, cfg, tp(2), l, 3, std::string(models::to_string(v)) + " bf16 1 x 2 on " + spec_of(l, 2),
                    /*every_chain_fused=*/true);
  }
}

// Random graphs through every op with a tensor-parallel rule and the gather
// fallback (ops without one), at degree 2.
TEST_P(CudaTensorParallel, RandomGraphsAtDegreeTwoEqualTheReference) {
  const tp_layout& l = GetParam();
  AG_REQUIRE_LAYOUT(l);
  auto rt = runtime::create(spec_of(l, 2), options_of(l));
  ASSERT_TRUE(rt.has_value()) << rt.err().to_string();
  int with_collectives = 0;
  for (uint64_t seed = 1; seed <= 10; ++seed) {
    auto g = test::tp_random_graph(seed, 10 + static_cast<int>(seed % 9));
    ASSERT_TRUE(g);
    const std::string what = "seed " + std::to_string(seed) + " on " + spec_of(l, 2);
    plan_options po = tp(2);
    po.in_stream_collectives = l.in_stream ? in_stream_mode::on : in_stream_mode::off;
    if (l.sequence_parallel) po.sequence_parallel = sequence_parallel_mode::on;
    auto p = (*rt)->compile(g, po);
    ASSERT_TRUE(p.has_value()) << what << ": " << p.err().to_string();
    int parts = 0;
    for (const auto& s : (*p)->steps()) parts += s.kind == step_kind::collective;
    if (parts > 0) expect_paths(**p, l);
    with_collectives += parts > 0;
    const auto in = random_inputs(*g, seed);
    const auto want = evaluate_reference(*g, in).value();
    const job j = (*rt)->submit(*p, in);
    ASSERT_TRUE(j.wait_for(120s)) << what << ": did not finish in 120 s";
    const auto& r = j.wait();
    ASSERT_TRUE(r.has_value()) << what << ": " << r.err().to_string();
    ASSERT_EQ(r->size(), want.size()) << what;
    for (std::size_t i = 0; i < want.size(); ++i) {
      auto c = compare((*r)[i], want[i], 2e-4, 2e-3);
      EXPECT_TRUE(c.ok) << what << " output " << i << ": " << c.message;
    }
  }
  EXPECT_GT(with_collectives, 5) << "the sample must exercise collectives";
}

// Two pipeline stages of two tensor-parallel members each: on two GPUs each
// stage's group spans both GPUs (cuda:0,1,0,1).
TEST_P(CudaTensorParallel, PipelineByTensorTwoByTwoEqualsTheReference) {
  const tp_layout& l = GetParam();
  AG_REQUIRE_LAYOUT(l);
  auto rt = runtime::create(spec_of(l, 4), options_of(l));
  ASSERT_TRUE(rt.has_value()) << rt.err().to_string();
  auto cfg = tiny(models::model_variant::llama, 4);
  run_transformer(**rt, cfg, tp(2, 2), l, 6, "llama 2 x 2 on " + spec_of(l, 4));
}

// Jobs of two plans in flight at once on the same two members (GPT-2 and
// LLaMA at degree 2, 16 jobs alternating): their collectives share each
// member's streams, communicator and in-stream inboxes, so every member
// must take the two plans' jobs in one order (one issue order across plans,
// actors/collective_order.hpp). Each plan numbering its own jobs, as until
// session 89, let one member take plan A's job before plan B's and the
// other the reverse: NCCL pairs their all-reduces, and parts waiting for a
// peer in front of the part that peer waits for hold both streams.
TEST_P(CudaTensorParallel, TwoPlansWithJobsInFlightOnTheSameMembersEqualTheReference) {
  const tp_layout& l = GetParam();
  AG_REQUIRE_LAYOUT(l);
  auto rt = runtime::create(spec_of(l, 2), options_of(l));
  ASSERT_TRUE(rt.has_value()) << rt.err().to_string();
  struct planned {
    models::transformer_config cfg;
    std::shared_ptr<const graph> g;
    std::shared_ptr<const plan> p;
  };
  std::vector<planned> plans;
  for (auto v : {models::model_variant::gpt2, models::model_variant::llama}) {
    planned pl{tiny(v, 2), nullptr, nullptr};
    pl.g = std::make_shared<const graph>(models::build_transformer(pl.cfg).value());
    plan_options po = tp(2);
    po.in_stream_collectives = l.in_stream ? in_stream_mode::on : in_stream_mode::off;
    if (l.sequence_parallel) po.sequence_parallel = sequence_parallel_mode::on;
    auto p = (*rt)->compile(pl.g, po);
    ASSERT_TRUE(p.has_value()) << p.err().to_string();
    expect_paths(**p, l);
    pl.p = *p;
    plans.push_back(std::move(pl));
  }
  std::vector<job> js;
  std::vector<std::vector<host_tensor>> ins;
  for (int k = 0; k < 16; ++k) {
    const planned& pl = plans[static_cast<std::size_t>(k % 2)];
    ins.push_back(models::transformer_inputs(pl.cfg, 700 + static_cast<uint64_t>(k)));
    js.push_back((*rt)->submit(pl.p, ins.back()));
  }
  for (int k = 0; k < 16; ++k) {
    const planned& pl = plans[static_cast<std::size_t>(k % 2)];
    const job& j = js[static_cast<std::size_t>(k)];
    ASSERT_TRUE(j.wait_for(120s)) << "job " << k << " on " << spec_of(l, 2) << " did not finish in 120 s";
    const auto& r = j.wait();
    ASSERT_TRUE(r.has_value()) << "job " << k << " on " << spec_of(l, 2) << ": " << r.err().to_string();
    auto want = evaluate_reference(*pl.g, ins[static_cast<std::size_t>(k)]).value();
    auto c = compare(r->front(), want.front(), 2e-4, 2e-3);
    EXPECT_TRUE(c.ok) << "job " << k << " (" << models::to_string(pl.cfg.variant) << ") on " << spec_of(l, 2) << ": "
                      << c.message;
  }
}

// Jobs cancelled at random points in flight (right after submit, or up to
// 2 ms later) on every layout: every job resolves in bounded time, done and
// equal to the reference or cancelled, and the runtime serves the next jobs.
// (NCCL pairs parts by their place in each member's order alone: a job
// cancelled part-way issues the parts its members owe as void parts,
// docs/ARCHITECTURE.md, "Cancelled jobs and NCCL's pairing"; the NCCL
// layouts here run them.)
TEST_P(CudaTensorParallel, JobsCancelledInFlightResolveAndTheRestEqualTheReference) {
  const tp_layout& l = GetParam();
  AG_REQUIRE_LAYOUT(l);
  auto rt = runtime::create(spec_of(l, 2), options_of(l));
  ASSERT_TRUE(rt.has_value()) << rt.err().to_string();
  auto cfg = tiny(models::model_variant::llama, 2);
  auto g = std::make_shared<const graph>(models::build_transformer(cfg).value());
  plan_options po = tp(2);
  po.in_stream_collectives = l.in_stream ? in_stream_mode::on : in_stream_mode::off;
  if (l.sequence_parallel) po.sequence_parallel = sequence_parallel_mode::on;
  auto p = (*rt)->compile(g, po);
  ASSERT_TRUE(p.has_value()) << p.err().to_string();
  std::mt19937_64 rng(11);
  std::vector<job> js;
  std::vector<std::vector<host_tensor>> ins;
  std::vector<bool> cancelled;
  for (int k = 0; k < 40; ++k) {
    ins.push_back(models::transformer_inputs(cfg, 800 + static_cast<uint64_t>(k)));
    js.push_back((*rt)->submit(*p, ins.back()));
    cancelled.push_back(rng() % 3 == 0);
    if (cancelled.back()) {
      if (rng() % 2) std::this_thread::sleep_for(std::chrono::microseconds(rng() % 2000));
      js.back().cancel();
    }
  }
  int done = 0, gone = 0;
  for (int k = 0; k < 40; ++k) {
    const job& j = js[static_cast<std::size_t>(k)];
    ASSERT_TRUE(j.wait_for(60s)) << "job " << k << " on " << spec_of(l, 2) << " did not resolve in 60 s";
    const auto& r = j.wait();
    if (!r) {
      EXPECT_TRUE(cancelled[static_cast<std::size_t>(k)]) << "job " << k << ": " << r.err().to_string();
      EXPECT_EQ(r.err().code, errc::cancelled) << "job " << k << ": " << r.err().to_string();
      ++gone;
      continue;
    }
    ++done;
    auto c = compare(r->front(), evaluate_reference(*g, ins[static_cast<std::size_t>(k)]).value().front(), 2e-4, 2e-3);
    EXPECT_TRUE(c.ok) << "job " << k << " on " << spec_of(l, 2) << ": " << c.message;
  }
  EXPECT_GE(done, 20);
  for (int k = 0; k < 4; ++k) {
    const auto& r = (*rt)->submit(*p, ins[static_cast<std::size_t>(k)]).wait();
    ASSERT_TRUE(r.has_value()) << "after the cancellations, job " << k << ": " << r.err().to_string();
    EXPECT_TRUE(compare(r->front(), evaluate_reference(*g, ins[static_cast<std::size_t>(k)]).value().front(), 2e-4,
                        2e-3)
                    .ok);
  }
  std::cerr << spec_of(l, 2) << ": " << done << " done, " << gone << " cancelled\n";
}

INSTANTIATE_TEST_SUITE_P(Layouts, CudaTensorParallel,
                         ::testing::Values(logical, oneshot, nccl, instream, logical_instream, logical_sp, nccl_sp,
                                           logical_ce, copy_engine),
                         [](const ::testing::TestParamInfo<tp_layout>& i) { return std::string(i.param.name); });

// In-stream all-reduces of a decode-shaped LLaMA at degree 2 on two GPUs,
// graph replay on (each device's step between its input copies and its
// output replays as one graph): 48 jobs in flight, a third of them
// cancelled as soon as they are submitted. Every job resolves in bounded
// time: done and equal to the reference, or cancelled; a cancelled job's
// parts never leave another member's part waiting (its runtime tells the
// devices, device::abort_collectives). Then the runtime serves on.
TEST(CudaTensorParallelInStream, ManyJobsInFlightWithCancellationsResolveAndEqualTheReference) {
  AG_REQUIRE_GPU(2);
  auto rt = runtime::create(spec_of(instream, 2), options_of(instream));
  ASSERT_TRUE(rt.has_value()) << rt.err().to_string();
  auto cfg = tiny(models::model_variant::llama, 3);
  cfg.seq_len = 1;
  cfg.batch = 1;
  cfg.dtype = dtype::bf16;
  auto g = std::make_shared<const graph>(models::build_transformer(cfg).value());
  plan_options o = tp(2);
  o.graph_replay = graph_replay_mode::on;
  o.in_stream_collectives = in_stream_mode::on;
  auto p = (*rt)->compile(g, o);
  ASSERT_TRUE(p.has_value()) << p.err().to_string();
  expect_paths(**p, instream);
  std::vector<std::vector<host_tensor>> ins;
  std::vector<job> js;
  for (int k = 0; k < 48; ++k) {
    ins.push_back(models::transformer_inputs(cfg, 500 + static_cast<uint64_t>(k)));
    js.push_back((*rt)->submit(*p, ins.back()));
    if (k % 3 == 1) js.back().cancel();
  }
  int done = 0, cancelled = 0;
  for (int k = 0; k < 48; ++k) {
    const job& j = js[static_cast<std::size_t>(k)];
    ASSERT_TRUE(j.wait_for(60s)) << "job " << k << " did not resolve in 60 s";
    const auto& r = j.wait();
    if (!r) {
      EXPECT_EQ(k % 3, 1) << "job " << k << " failed: " << r.err().to_string();
      EXPECT_EQ(r.err().code, errc::cancelled) << "job " << k << ": " << r.err().to_string();
      ++cancelled;
      continue;
    }
    ++done;
    auto want = evaluate_reference(*g, ins[static_cast<std::size_t>(k)]).value();
    auto c = compare(r->front(), want.front(), 2e-2, 2e-2);  // bf16
    EXPECT_TRUE(c.ok) << "job " << k << ": " << c.message;
  }
  EXPECT_GE(done, 32);
  const auto& after = (*rt)->submit(*p, ins.front()).wait();
  ASSERT_TRUE(after.has_value()) << after.err().to_string();
  EXPECT_TRUE(compare(after->front(), evaluate_reference(*g, ins.front()).value().front(), 2e-2, 2e-2).ok);
  std::cerr << "in-stream with cancellations: " << done << " done, " << cancelled << " cancelled\n";
}

// Degree 4 (issue 15): four logical devices of GPU 0, or GPUs 0..3 through
// both paths.
struct CudaTensorParallelFour : ::testing::TestWithParam<tp_layout> {};

TEST_P(CudaTensorParallelFour, TransformersAtDegreeFourEqualTheReference) {
  const tp_layout& l = GetParam();
  AG_REQUIRE_LAYOUT(l);
  auto rt = runtime::create(spec_of(l, 4), options_of(l));
  ASSERT_TRUE(rt.has_value()) << rt.err().to_string();
  for (auto v : {models::model_variant::gpt2, models::model_variant::llama})
    run_transformer(**rt, tiny(v, 2), tp(4), l, 6, std::string(models::to_string(v)) + " 1 x 4 on " + spec_of(l, 4));
}

// Two stages of two members each on four GPUs (issue 15): stage 0 on GPUs
// 0 and 1, stage 1 on GPUs 2 and 3, activations crossing by peer copies.
TEST_P(CudaTensorParallelFour, PipelineByTensorTwoByTwoEqualsTheReference) {
  const tp_layout& l = GetParam();
  AG_REQUIRE_LAYOUT(l);
  auto rt = runtime::create(spec_of(l, 4), options_of(l));
  ASSERT_TRUE(rt.has_value()) << rt.err().to_string();
  for (auto v : {models::model_variant::gpt2, models::model_variant::llama})
    run_transformer(**rt, tiny(v, 4), tp(2, 2), l, 6, std::string(models::to_string(v)) + " 2 x 2 on " + spec_of(l, 4));
}

INSTANTIATE_TEST_SUITE_P(Layouts, CudaTensorParallelFour,
                         ::testing::Values(logical, tp_layout{"oneshot4", 4, false}, tp_layout{"nccl4", 4, true},
                                           logical_sp),
                         [](const ::testing::TestParamInfo<tp_layout>& i) { return std::string(i.param.name); });
INSTANTIATE_TEST_SUITE_P(InStream, CudaTensorParallelFour,
                         ::testing::Values(logical_instream, tp_layout{"instream4", 4, false, true}),
                         [](const ::testing::TestParamInfo<tp_layout>& i) { return std::string(i.param.name); });

}  // namespace
}  // namespace ag
