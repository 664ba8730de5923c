// The actor runtime on real GPUs, through the public API: transformer jobs on
// one GPU and pipelined over two match the CPU reference, their outputs come
// from the CUDA pinned pool (copied into directly, reused across jobs), and
// runtime_options::pinned_outputs = false gives heap outputs with the same values.
#include <gtest/gtest.h>

#include "../graph/random_dag.hpp"

#include <cstring>
#include <memory>
#include <vector>

#include "actors/actorgraph.hpp"
#include "cuda/cuda_test_util.hpp"
#include "graph/models/transformer.hpp"
#include "graph/reference.hpp"

namespace ag {
namespace {

models::transformer_config small_llama() {
  models::transformer_config cfg;
  cfg.variant = models::model_variant::llama;
  cfg.n_layers = 4;
  cfg.d_model = 64;
  cfg.vocab = 1024;  // logits [batch, seq, vocab] f32: 128 KiB, over the pool's 64 KiB floor
  cfg.seq_len = 16;
  cfg.batch = 2;
  return cfg;
}

std::unique_ptr<runtime> make(const std::string& spec, bool pinned_outputs = true) {
  runtime_options o;
  o.pinned_outputs = pinned_outputs;
  auto rt = runtime::create(spec, o);
  if (!rt) ADD_FAILURE() << rt.err().to_string();
  return rt ? std::move(*rt) : nullptr;
}

/// Runs `jobs` micro-batches of `cfg` with `options` and checks every output
/// against the reference evaluator (f32, no TF32: tight tolerance) and that it
/// lives in `want_memory`.
void run_and_check(runtime& rt, const models::transformer_config& cfg, const plan_options& options, int jobs,
                   host_memory_resource* want_memory) {
  auto g = models::build_transformer(cfg);
  ASSERT_TRUE(g) << g.err().to_string();
  const graph model = *g;
  auto p = rt.compile(model, options);
  ASSERT_TRUE(p) << p.err().to_string();
  std::vector<std::vector<host_tensor>> in;
  for (int i = 0; i < jobs; ++i) in.push_back(models::transformer_inputs(cfg, 500 + static_cast<uint64_t>(i)));
  auto handles = rt.submit_batch(*p, in);
  for (int i = 0; i < jobs; ++i) {
    const auto& r = handles[static_cast<std::size_t>(i)].wait();
    ASSERT_TRUE(r) << "job " << i << ": " << r.err().to_string();
    auto want = evaluate_reference(model, in[static_cast<std::size_t>(i)]);
    ASSERT_TRUE(want) << want.err().to_string();
    ASSERT_EQ(r->size(), want->size());
    for (std::size_t k = 0; k < r->size(); ++k) {
      auto c = compare((*r)[k], (*want)[k], 2e-4, 2e-3);
      EXPECT_TRUE(c.ok) << "job " << i << " output " << k << ": " << c.message;
      EXPECT_EQ((*r)[k].memory(), want_memory) << "job " << i << " output " << k;
    }
  }
}

TEST(CudaRuntime, TransformerOnOneGpuMatchesReferenceWithPinnedOutputs) {
  AG_REQUIRE_GPU(1);
  auto rt = make("cuda:0");
  ASSERT_TRUE(rt);
  run_and_check(*rt, small_llama(), plan_options{.policy = placement_policy::single}, 6,
                &gpu::cuda::pinned_host_memory());
}

// Folded lanes on a GPU (plan_options::fold_lanes, under replay): the
// device's lanes run from one queue, each replay segment is captured as one
// CUDA graph whose branches run on capture streams of their own (fork, join
// and cross-lane edges from events in the capture), and jobs in flight over
// several arenas get the reference's values, plain on their first run,
// then captured and replayed (the trace names the lanes); unfolded, the same.
TEST(CudaRuntime, FoldedLanesReplayAsOneGraphAndMatchTheReference) {
  AG_REQUIRE_GPU(1);
  const graph g = test::chains_graph(6, 4, 16, 128);
  for (bool fold : {true, false}) {
    auto rt = make("cuda:0");
    ASSERT_TRUE(rt);
    plan_options po;
    po.lanes_per_device = 6;
    po.min_branch_seconds = 0;
    po.graph_replay = graph_replay_mode::on;
    po.fold_lanes = fold;
    auto p = rt->compile(g, po);
    ASSERT_TRUE(p) << p.err().to_string();
    EXPECT_EQ((*p)->describe().find("compute lanes run from one queue") != std::string::npos, fold) << (*p)->describe();
    for (int wave = 0; wave < 3; ++wave) {
      std::vector<std::vector<host_tensor>> in;
      for (int k = 0; k < 8; ++k)
        in.push_back({host_tensor::random_normal(dtype::f32, {16, 128}, 900 + static_cast<uint64_t>(wave * 8 + k), 1.0f)});
      auto handles = rt->submit_batch(*p, in);
      for (std::size_t k = 0; k < in.size(); ++k) {
        const auto& r = handles[k].wait();
        ASSERT_TRUE(r) << "wave " << wave << " job " << k << ": " << r.err().to_string();
        auto want = evaluate_reference(g, in[k]);
        ASSERT_TRUE(want) << want.err().to_string();
        auto c = compare((*r)[0], (*want)[0], 2e-4, 2e-3);
        EXPECT_TRUE(c.ok) << (fold ? "folded" : "unfolded") << " wave " << wave << " job " << k << ": " << c.message;
      }
    }
    const replay_stats st = rt->replay_statistics();
    EXPECT_EQ(st.fallbacks, 0) << st.last_fallback;
    EXPECT_GT(st.replayed, 0);
    int lanes_replayed = 0;
    for (const auto& r : rt->take_trace().records)
      lanes_replayed += r.label.find("[graph replay: replayed") != std::string::npos && r.label.find(" lanes]") != std::string::npos;
    EXPECT_EQ(lanes_replayed > 0, fold) << "replayed segments of several lanes in the trace: " << lanes_replayed;
  }
}

TEST(CudaRuntime, TransformerPipelinedOverTwoGpusMatchesReference) {
  AG_REQUIRE_GPU(2);
  auto rt = make("cuda:0,1");
  ASSERT_TRUE(rt);
  run_and_check(*rt, small_llama(), plan_options{.pipeline_stages = 2}, 8, &gpu::cuda::pinned_host_memory());
}

// The same pipeline over two logical devices of GPU 0 (cuda:0,0): the peer
// copies, cross-device event waits and per-device arenas of a 2-stage plan,
// runnable on a 1-GPU machine.
TEST(CudaRuntime, TransformerPipelinedOverTwoLogicalDevicesOfOneGpuMatchesReference) {
  AG_REQUIRE_GPU(1);
  auto rt = make("cuda:0,0");
  ASSERT_TRUE(rt);
  run_and_check(*rt, small_llama(), plan_options{.pipeline_stages = 2}, 8, &gpu::cuda::pinned_host_memory());
}

TEST(CudaRuntime, PinnedOutputsOffGivesHeapOutputsWithTheSameValues) {
  AG_REQUIRE_GPU(1);
  auto rt = make("cuda:0", /*pinned_outputs=*/false);
  ASSERT_TRUE(rt);
  run_and_check(*rt, small_llama(), plan_options{.policy = placement_policy::single}, 3, nullptr);
}

// runtime::input_memory on CUDA is the pinned pool the device copies from
// directly (no staging copy); jobs whose 1 MiB input was built there equal
// the reference, replayed or not, several in flight.
TEST(CudaRuntime, InputsBuiltInInputMemoryArePinnedAndMatchReference) {
  AG_REQUIRE_GPU(1);
  graph_builder b;
  auto x = b.input("x", dtype::f32, {1024, 256});
  auto w = b.weight("w", host_tensor::random_normal(dtype::f32, {256, 64}, 17, 0.1f));
  b.output(b.silu(b.matmul(x, w, false, false, "m"), "y"));
  auto built = std::move(b).build();
  ASSERT_TRUE(built) << built.err().to_string();
  const graph model = std::move(*built);
  auto rt = make("cuda:0");
  ASSERT_TRUE(rt);
  for (const graph_replay_mode replay : {graph_replay_mode::off, graph_replay_mode::on}) {
    SCOPED_TRACE(replay == graph_replay_mode::on ? "replayed" : "plain launches");
    plan_options o;
    o.graph_replay = replay;
    auto p = rt->compile(model, o);
    ASSERT_TRUE(p) << p.err().to_string();
    host_memory_resource* memory = rt->input_memory(*p, 0);
    ASSERT_EQ(memory, &gpu::cuda::pinned_host_memory());
    std::vector<host_tensor> values;
    std::vector<job> jobs;
    for (int i = 0; i < 4; ++i) {
      values.push_back(host_tensor::random_normal(dtype::f32, {1024, 256}, 60 + static_cast<uint64_t>(i), 1.0f));
      host_tensor in = host_tensor::uninitialized(dtype::f32, {1024, 256}, memory);
      std::memcpy(in.data(), values.back().data(), values.back().bytes());
      jobs.push_back(rt->submit(*p, {std::move(in)}));
    }
    for (int i = 0; i < 4; ++i) {
      const job_result& r = jobs[static_cast<std::size_t>(i)].wait();
      ASSERT_TRUE(r.has_value()) << r.err().to_string();
      auto ref = evaluate_reference(model, {values[static_cast<std::size_t>(i)]});
      ASSERT_TRUE(ref.has_value()) << ref.err().to_string();
      const auto c = compare((*r)[0], (*ref)[0], 2e-4, 2e-3);
      EXPECT_TRUE(c.ok) << "job " << i << ": " << c.message;
    }
  }
}

// plan_options::output_pieces on CUDA: an output concatenated from pieces on
// three logical devices of GPU 0, each piece three runs of the host output
// (the concat axis is not the outermost), is copied by each device into its
// place: one 2-D copy into pinned outputs, a staged copy per run into heap
// ones. Equal to the reference both ways, jobs in flight together.
TEST(CudaRuntime, OutputsCopiedPieceByPieceFromSeveralDevicesMatchReference) {
  AG_REQUIRE_GPU(1);
  graph_builder b;
  auto x = b.input("x", dtype::f32, {3, 8, 128});  // runs of 4 KiB
  auto w = b.weight("w", host_tensor::random_normal(dtype::f32, {128, 128}, 7, 0.1f));
  auto p0 = b.silu(b.matmul(x, w, false, false, "m0"), "p0");
  auto p1 = b.gelu(x, gelu_mode::tanh, "p1");
  auto p2 = b.matmul(x, w, false, false, "p2");
  b.pin(p0, 0);
  b.pin(p1, 1);
  b.pin(p2, 2);
  b.output(b.concat({p0, p1, p2}, 1, "out"));
  auto built = std::move(b).build();
  ASSERT_TRUE(built) << built.err().to_string();
  const graph model = std::move(*built);
  for (const bool pinned : {true, false}) {
    SCOPED_TRACE(pinned ? "pinned outputs" : "heap outputs");
    auto rt = make("cuda:0,0,0", pinned);
    ASSERT_TRUE(rt);
    auto p = rt->compile(model, {});
    ASSERT_TRUE(p) << p.err().to_string();
    int pieces = 0;
    for (const step& s : (*p)->steps()) pieces += s.kind == step_kind::copy_d2h && s.host_blocks == 3;
    ASSERT_EQ(pieces, 3) << (*p)->describe();
    std::vector<std::vector<host_tensor>> in;
    for (int i = 0; i < 6; ++i) in.push_back({host_tensor::random_normal(dtype::f32, {3, 8, 128}, 900 + static_cast<uint64_t>(i))});
    auto handles = rt->submit_batch(*p, in);
    for (int i = 0; i < 6; ++i) {
      const auto& r = handles[static_cast<std::size_t>(i)].wait();
      ASSERT_TRUE(r) << "job " << i << ": " << r.err().to_string();
      auto want = evaluate_reference(model, in[static_cast<std::size_t>(i)]);
      ASSERT_TRUE(want) << want.err().to_string();
      auto c = compare((*r)[0], (*want)[0], 2e-4, 2e-3);
      EXPECT_TRUE(c.ok) << "job " << i << ": " << c.message;
    }
  }
}

// Jobs one after another, each result dropped before the next: after the
// first job, outputs come from buffers given back, not from fresh pinning.
TEST(CudaRuntime, OutputBuffersAreReusedAcrossJobs) {
  AG_REQUIRE_GPU(1);
  auto rt = make("cuda:0");
  ASSERT_TRUE(rt);
  const auto cfg = small_llama();
  auto p = rt->compile(models::build_transformer(cfg).value(), plan_options{.policy = placement_policy::single});
  ASSERT_TRUE(p) << p.err().to_string();
  const auto in = models::transformer_inputs(cfg, 7);
  {
    auto j = rt->submit(*p, in);
    ASSERT_TRUE(j.wait()) << j.wait().err().to_string();
  }
  rt->wait_idle();
  const auto before = gpu::cuda::pinned_host_pool_stats();
  constexpr int rounds = 5;
  for (int i = 0; i < rounds; ++i) {
    auto j = rt->submit(*p, in);
    const auto& r = j.wait();
    ASSERT_TRUE(r) << r.err().to_string();
    EXPECT_EQ(r->front().memory(), &gpu::cuda::pinned_host_memory());
  }
  rt->wait_idle();
  const auto after = gpu::cuda::pinned_host_pool_stats();
  EXPECT_EQ(after.raw_allocations, before.raw_allocations) << "outputs were pinned afresh instead of reused";
  EXPECT_GE(after.reuses - before.reuses, rounds);
}

// Graph replay on real GPUs (issue 16 item 1): segments run plainly on their
// first job, are then captured as CUDA graphs per arena and replayed; values
// stay equal to the reference with jobs of several arenas in flight, on one
// GPU and pipelined over two logical devices of it.
void run_replayed(const std::string& spec, plan_options po) {
  runtime_options o;
  o.arenas_per_device = 3;
  auto rt = runtime::create(spec, o);
  ASSERT_TRUE(rt) << rt.err().to_string();
  po.graph_replay = graph_replay_mode::on;
  for (int round = 0; round < 3; ++round)
    run_and_check(**rt, small_llama(), po, 6, &gpu::cuda::pinned_host_memory());
  const replay_stats s = (*rt)->replay_statistics();
  EXPECT_GT(s.plain, 0);
  EXPECT_GT(s.captured, 0);
  EXPECT_GT(s.replayed, 0);
  EXPECT_EQ(s.fallbacks, 0) << s.last_fallback;
}

TEST(CudaRuntime, GraphReplayOnOneGpuMatchesReference) {
  AG_REQUIRE_GPU(1);
  run_replayed("cuda:0", plan_options{.policy = placement_policy::single});
}

TEST(CudaRuntime, GraphReplayPipelinedOverTwoLogicalDevicesMatchesReference) {
  AG_REQUIRE_GPU(1);
  run_replayed("cuda:0,0", plan_options{.pipeline_stages = 2});
}

// Random DAGs (branches, views, concats; one lane) captured and replayed:
// values equal the reference over many jobs of several arenas, and no
// capture is refused.
TEST(CudaRuntime, ReplayedBranchyGraphsMatchReference) {
  AG_REQUIRE_GPU(1);
  runtime_options o;
  o.arenas_per_device = 3;
  auto rt = runtime::create("cuda:0", o);
  ASSERT_TRUE(rt) << rt.err().to_string();
  for (uint64_t seed = 1; seed <= 6; ++seed) {
    auto g = test::random_dag({.seed = seed, .ops = 40});
    ASSERT_TRUE(g.has_value()) << g.err().to_string();
    plan_options po;
    po.policy = placement_policy::single;
    po.lanes_per_device = 1;
    po.graph_replay = graph_replay_mode::on;
    auto p = (*rt)->compile(*g, po);
    ASSERT_TRUE(p.has_value()) << p.err().to_string();
    std::vector<std::vector<host_tensor>> ins;
    std::vector<job> jobs;
    for (int k = 0; k < 8; ++k) {
      std::vector<host_tensor> in;
      uint64_t s = seed * 1000 + static_cast<uint64_t>(k) * 10;
      for (node_id id : g->inputs()) in.push_back(host_tensor::random_normal(g->at(id).type, g->at(id).dims, s++, 1.0f));
      ins.push_back(in);
      jobs.push_back((*rt)->submit(*p, std::move(in)));
    }
    for (std::size_t k = 0; k < jobs.size(); ++k) {
      const job_result& r = jobs[k].wait();
      ASSERT_TRUE(r.has_value()) << "seed " << seed << " job " << k << ": " << r.err().to_string();
      auto want = evaluate_reference(*g, ins[k]);
      ASSERT_TRUE(want.has_value());
      for (std::size_t i = 0; i < want->size(); ++i) {
        auto c = compare((*r)[i], (*want)[i], 2e-3, 2e-2);
        EXPECT_TRUE(c.ok) << "seed " << seed << " job " << k << " output " << i << ": " << c.message;
      }
    }
  }
  const replay_stats s = (*rt)->replay_statistics();
  EXPECT_GT(s.replayed, 0);
  EXPECT_EQ(s.fallbacks, 0) << s.last_fallback;
}

/// The tiny job's graph: y = x + w over 256 floats (1 KiB in, 1 KiB out).
graph tiny_add_graph() {
  graph_builder b;
  auto x = b.input("x", dtype::f32, {256});
  auto w = b.weight("w", host_tensor::random_normal(dtype::f32, {256}, 3, 1.0f));
  b.output(b.add(x, w, "y"));
  return std::move(b).build().value();
}

// A tiny job (1 KiB in, one add, 1 KiB out) replays as one CUDA graph with
// its input and output copies inside (memcpy nodes from and to its arena's
// pinned host window): 32 jobs, 8 in flight over 4 arenas, each its own sum;
// no capture refused; the trace shows each replayed job as one record of 3 steps.
TEST(CudaRuntime, TinyJobsReplayTheirHostCopiesInsideTheGraph) {
  AG_REQUIRE_GPU(1);
  runtime_options o;
  o.arenas_per_device = 4;
  o.trace = true;
  auto rt = runtime::create("cuda:0", o);
  ASSERT_TRUE(rt) << rt.err().to_string();
  const graph g = tiny_add_graph();
  plan_options po;
  po.policy = placement_policy::single;
  po.graph_replay = graph_replay_mode::on;
  auto p = (*rt)->compile(g, po);
  ASSERT_TRUE(p.has_value()) << p.err().to_string();
  ASSERT_NE((*p)->describe().find("2 host copies"), std::string::npos) << (*p)->describe();
  for (int wave = 0; wave < 4; ++wave) {
    std::vector<std::vector<host_tensor>> ins;
    for (int k = 0; k < 8; ++k)
      ins.push_back({host_tensor::random_normal(dtype::f32, {256}, 500 + static_cast<uint64_t>(wave * 8 + k), 1.0f)});
    auto jobs = (*rt)->submit_batch(*p, ins);
    for (std::size_t k = 0; k < jobs.size(); ++k) {
      const job_result& r = jobs[k].wait();
      ASSERT_TRUE(r.has_value()) << "wave " << wave << " job " << k << ": " << r.err().to_string();
      auto want = evaluate_reference(g, ins[k]);
      ASSERT_TRUE(want.has_value());
      auto c = compare(r->front(), want->front(), 1e-6, 1e-6);
      EXPECT_TRUE(c.ok) << "wave " << wave << " job " << k << ": " << c.message;
    }
  }
  const replay_stats s = (*rt)->replay_statistics();
  EXPECT_EQ(s.fallbacks, 0) << s.last_fallback;
  EXPECT_GT(s.replayed, 20);
  int one_record = 0;
  for (const auto& r : (*rt)->take_trace().records)
    one_record += r.label.find("[graph replay: replayed, 3 steps, 1 kernels]") != std::string::npos;
  EXPECT_EQ(one_record, s.replayed);
}

// A segment of one kernel is replayed too: the tiny job with its host copies
// launched on their own leaves one add in its segment; 24 jobs over 2
// arenas, each its own sum, the replayed ones one record of one step.
TEST(CudaRuntime, SegmentsOfOneKernelAreReplayedToo) {
  AG_REQUIRE_GPU(1);
  runtime_options o;
  o.arenas_per_device = 2;
  o.trace = true;
  auto rt = runtime::create("cuda:0", o);
  ASSERT_TRUE(rt) << rt.err().to_string();
  const graph g = tiny_add_graph();
  plan_options po;
  po.policy = placement_policy::single;
  po.graph_replay = graph_replay_mode::on;
  po.replay_host_copies = false;
  auto p = (*rt)->compile(g, po);
  ASSERT_TRUE(p.has_value()) << p.err().to_string();
  for (int k = 0; k < 24; ++k) {
    const std::vector<host_tensor> in{host_tensor::random_normal(dtype::f32, {256}, 900 + static_cast<uint64_t>(k), 1.0f)};
    auto j = (*rt)->submit(*p, in);
    const job_result& r = j.wait();
    ASSERT_TRUE(r.has_value()) << "job " << k << ": " << r.err().to_string();
    auto want = evaluate_reference(g, in);
    ASSERT_TRUE(want.has_value());
    auto c = compare(r->front(), want->front(), 1e-6, 1e-6);
    EXPECT_TRUE(c.ok) << "job " << k << ": " << c.message;
  }
  const replay_stats s = (*rt)->replay_statistics();
  EXPECT_EQ(s.fallbacks, 0) << s.last_fallback;
  EXPECT_GT(s.replayed, 18);
  int one_record = 0;
  for (const auto& r : (*rt)->take_trace().records)
    one_record += r.label.find("[graph replay: replayed, 1 steps, 1 kernels]") != std::string::npos;
  EXPECT_EQ(one_record, s.replayed);
}

}  // namespace
/// `model` compiled for cuda:0 alone with graph replay on, in a runtime with
/// `arenas` arenas and backend_options::cuda_pdl = `pdl` (the PDL tests).
struct replayed_on_gpu0 {
  std::unique_ptr<runtime> rt;
  std::shared_ptr<const plan> p;
  replayed_on_gpu0(const graph& model, bool pdl, int arenas) {
    runtime_options o;
    o.arenas_per_device = arenas;
    o.backend.cuda_pdl = pdl;
    auto r = runtime::create("cuda:0", o);
    if (!r) {
      ADD_FAILURE() << r.err().to_string();
      return;
    }
    rt = std::move(*r);
    plan_options po;
    po.policy = placement_policy::single;
    po.graph_replay = graph_replay_mode::on;
    auto compiled = rt->compile(model, po);
    if (!compiled) {
      ADD_FAILURE() << compiled.err().to_string();
      return;
    }
    p = *compiled;
  }
  bool ok() const { return rt && p; }
};

// Programmatic dependent launch (backend_options::cuda_pdl, on by default on
// sm_90): each kernel may launch while the one before it runs and must wait
// for it before touching activations; the GEMV kernel reads its weights
// before that wait. A chain of 48 kernels that each read the previous one's
// output (row norms, one-row products on the GEMV kernel, adds, silu), replayed
// over many jobs of several arenas, equals the reference with PDL on and off:
// a kernel that read before its wait would see the previous job's values.
TEST(CudaRuntime, KernelChainsEqualTheReferenceWithProgrammaticDependentLaunchOnAndOff) {
  AG_REQUIRE_GPU(1);
  constexpr int64_t D = 1024;
  graph_builder b;
  auto x = b.input("x", dtype::f32, {1, D});
  tensor h = x;
  for (int l = 0; l < 12; ++l) {
    const std::string n = std::to_string(l);
    auto g = b.weight("g" + n, host_tensor::random_normal(dtype::f32, {D}, 70 + static_cast<uint64_t>(l), 1.0f));
    auto w = b.weight("w" + n, host_tensor::random_normal(dtype::f32, {D, D}, 90 + static_cast<uint64_t>(l), 0.03f));
    h = b.rms_norm(h, g, 1e-6f, "norm" + n);
    h = b.matmul(h, w, false, true, "proj" + n);
    h = b.silu(h, "act" + n);
    h = b.add(h, x, "res" + n);
  }
  b.output(h);
  auto model = std::move(b).build();
  ASSERT_TRUE(model) << model.err().to_string();
  for (bool pdl : {true, false}) {
    replayed_on_gpu0 run(*model, pdl, 3);
    ASSERT_TRUE(run.ok());
    std::vector<std::vector<host_tensor>> ins;
    std::vector<job> jobs;
    for (int k = 0; k < 24; ++k) {
      ins.push_back({host_tensor::random_normal(dtype::f32, {1, D}, 4000 + static_cast<uint64_t>(k), 1.0f)});
      jobs.push_back(run.rt->submit(run.p, ins.back()));
    }
    for (std::size_t k = 0; k < jobs.size(); ++k) {
      const job_result& r = jobs[k].wait();
      ASSERT_TRUE(r) << "pdl " << pdl << " job " << k << ": " << r.err().to_string();
      auto want = evaluate_reference(*model, ins[k]);
      ASSERT_TRUE(want) << want.err().to_string();
      auto c = compare((*r)[0], (*want)[0], 1e-3, 1e-2);
      EXPECT_TRUE(c.ok) << "pdl " << pdl << " job " << k << ": " << c.message;
    }
    EXPECT_GT(run.rt->replay_statistics().replayed, 0) << "pdl " << pdl;
  }
}

// A product of a few rows whose right operand is not a weight but the output
// of the kernel right before it (here silu(z), new values every job): the
// GEMV kernel may read weights before its PDL wait, never such an operand.
TEST(CudaRuntime, FewRowProductsOfAFreshOperandEqualTheReferenceWithProgrammaticDependentLaunch) {
  AG_REQUIRE_GPU(1);
  constexpr int64_t K = 512, N = 384;
  graph_builder b;
  auto x = b.input("x", dtype::f32, {4, K});
  auto z = b.input("z", dtype::f32, {N, K});
  auto y = b.silu(z, "y");
  b.output(b.matmul(x, y, false, true, "xy"));
  auto model = std::move(b).build();
  ASSERT_TRUE(model) << model.err().to_string();
  for (bool pdl : {true, false}) {
    replayed_on_gpu0 run(*model, pdl, 2);
    ASSERT_TRUE(run.ok());
    for (int k = 0; k < 12; ++k) {
      std::vector<host_tensor> in{host_tensor::random_normal(dtype::f32, {4, K}, 5000 + static_cast<uint64_t>(k), 1.0f),
                                  host_tensor::random_normal(dtype::f32, {N, K}, 6000 + static_cast<uint64_t>(k), 1.0f)};
      auto want = evaluate_reference(*model, in);
      ASSERT_TRUE(want) << want.err().to_string();
      const job_result& r = run.rt->submit(run.p, in).wait();
      ASSERT_TRUE(r) << "pdl " << pdl << " job " << k << ": " << r.err().to_string();
      auto c = compare((*r)[0], (*want)[0], 1e-4, 1e-3);
      EXPECT_TRUE(c.ok) << "pdl " << pdl << " job " << k << ": " << c.message;
    }
  }
}


}  // namespace ag
