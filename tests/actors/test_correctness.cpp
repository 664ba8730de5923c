// Results of the actor runtime equal the reference evaluator: random DAGs and
// transformers on cpu and sim devices, 1 to 4 devices with pipeline placement.
#include <gtest/gtest.h>

#include <chrono>

#include "actors/actorgraph.hpp"
#include "graph/models/transformer.hpp"
#include "graph/reference.hpp"
#include "../graph/random_dag.hpp"

namespace {

using namespace std::chrono_literals;

// The backends compute in f32 (BLAS or plain loops), the reference in double
// rounded to f32 per node: errors of a few f32 ulps per op, compounded over
// the graph's depth (up to ~40 ops here).
constexpr double atol = 2e-4, rtol = 2e-3;

ag::runtime_options fast_sim() {
  ag::runtime_options o;
  o.backend.sim.time_scale = 1e-2;  // a simulated ms takes 10 us of wall time
  o.backend.sim.jitter = 0.2;
  return o;
}

void check_outputs(const ag::graph& g, const std::vector<ag::host_tensor>& in, const ag::job_result& r,
                   const std::string& what, double a = atol, double rel = rtol) {
  ASSERT_TRUE(r.has_value()) << what << ": " << r.err().to_string();
  auto ref = ag::evaluate_reference(g, in);
  ASSERT_TRUE(ref.has_value()) << ref.err().to_string();
  ASSERT_EQ(r->size(), ref->size());
  for (std::size_t i = 0; i < ref->size(); ++i) {
    auto c = ag::compare((*r)[i], (*ref)[i], a, rel);
    EXPECT_TRUE(c.ok) << what << " output " << i << ": " << c.message;
  }
}

std::vector<ag::host_tensor> inputs_for(const ag::graph& g, uint64_t seed) {
  std::vector<ag::host_tensor> in;
  for (ag::node_id id : g.inputs()) {
    const auto& n = g.at(id);
    in.push_back(ag::host_tensor::random_normal(n.type, n.dims, seed++, 1.0f));
  }
  return in;
}

void run_random_dags(const std::string& spec, ag::runtime_options opts, int lanes,
                     ag::graph_replay_mode replay = ag::graph_replay_mode::off) {
  auto rt = ag::runtime::create(spec, opts);
  ASSERT_TRUE(rt.has_value()) << rt.err().to_string();
  for (uint64_t seed = 1; seed <= 6; ++seed) {
    auto g = ag::test::random_dag({.seed = seed, .ops = 30});
    ASSERT_TRUE(g.has_value()) << g.err().to_string();
    ag::plan_options po;
    po.lanes_per_device = lanes;
    po.min_branch_seconds = 0;  // make the planner use every lane it may
    po.graph_replay = replay;
    auto p = (*rt)->compile(*g, po);
    ASSERT_TRUE(p.has_value()) << "seed " << seed << ": " << p.err().to_string();
    std::vector<ag::job> jobs;
    std::vector<std::vector<ag::host_tensor>> ins;
    for (int k = 0; k < 3; ++k) {
      ins.push_back(inputs_for(*g, seed * 100 + static_cast<uint64_t>(k)));
      jobs.push_back((*rt)->submit(*p, ins.back()));
    }
    for (std::size_t k = 0; k < jobs.size(); ++k) {
      ASSERT_TRUE(jobs[k].wait_for(30s)) << "seed " << seed << " job " << k << " hung";
      check_outputs(*g, ins[k], jobs[k].wait(), spec + " seed " + std::to_string(seed));
    }
  }
}

TEST(Correctness, RandomDagsCpu1) { run_random_dags("cpu:1", {}, 1); }
TEST(Correctness, RandomDagsCpu2TwoLanes) { run_random_dags("cpu:2", {}, 2); }
TEST(Correctness, RandomDagsSim4TwoLanes) { run_random_dags("sim:4", fast_sim(), 2); }
// Lanes of one device share one executing actor by default; the layout with
// an actor per lane (runtime_options::actor_per_lane) stays correct too.
TEST(Correctness, RandomDagsSim2ThreeLanesOneActorPerDevice) { run_random_dags("sim:2", fast_sim(), 3); }
TEST(Correctness, RandomDagsSim2ThreeLanesActorPerLane) {
  auto o = fast_sim();
  o.actor_per_lane = true;
  run_random_dags("sim:2", o, 3);
}
TEST(Correctness, RandomDagsMixedSimCpu) { run_random_dags("sim:1,cpu:1", fast_sim(), 1); }

void run_transformer(const std::string& spec, int devices, ag::models::model_variant v,
                     ag::graph_replay_mode replay = ag::graph_replay_mode::off) {
  auto rt = ag::runtime::create(spec, fast_sim());
  ASSERT_TRUE(rt.has_value()) << rt.err().to_string();
  ag::models::transformer_config cfg;
  cfg.variant = v;
  cfg.n_layers = 4;
  auto g = ag::models::build_transformer(cfg);
  ASSERT_TRUE(g.has_value()) << g.err().to_string();
  ag::plan_options po;
  po.pipeline_stages = devices;
  po.graph_replay = replay;
  auto p = (*rt)->compile(*g, po);
  ASSERT_TRUE(p.has_value()) << p.err().to_string();
  EXPECT_EQ(static_cast<int>((*p)->used_devices().size()), devices) << (*p)->describe();
  std::vector<std::vector<ag::host_tensor>> ins;
  std::vector<ag::job> jobs;
  for (uint64_t k = 0; k < 4; ++k) {  // micro-batches in flight together
    ins.push_back(ag::models::transformer_inputs(cfg, 17 + k));
    jobs.push_back((*rt)->submit(*p, ins.back()));
  }
  for (std::size_t k = 0; k < jobs.size(); ++k) {
    ASSERT_TRUE(jobs[k].wait_for(60s)) << "job " << k << " hung";
    check_outputs(*g, ins[k], jobs[k].wait(), spec + " job " + std::to_string(k), 1e-3, 1e-2);
  }
}

TEST(Correctness, Gpt2OnSim1) { run_transformer("sim:1", 1, ag::models::model_variant::gpt2); }
TEST(Correctness, Gpt2PipelineSim2) { run_transformer("sim:2", 2, ag::models::model_variant::gpt2); }
TEST(Correctness, Gpt2PipelineSim4) { run_transformer("sim:4", 4, ag::models::model_variant::gpt2); }
TEST(Correctness, LlamaPipelineSim3) { run_transformer("sim:3", 3, ag::models::model_variant::llama); }
TEST(Correctness, LlamaPipelineCpu2) { run_transformer("cpu:2", 2, ag::models::model_variant::llama); }

// Graph replay on (sim: modelled as one launch per segment; cpu: not applied)
// leaves every result equal to the reference, jobs in flight together.
TEST(Correctness, ReplayRandomDagsSim3TwoLanes) {
  run_random_dags("sim:3", fast_sim(), 2, ag::graph_replay_mode::on);
}
TEST(Correctness, ReplayRandomDagsCpu2) { run_random_dags("cpu:2", {}, 1, ag::graph_replay_mode::on); }
TEST(Correctness, ReplayGpt2PipelineSim2) {
  run_transformer("sim:2", 2, ag::models::model_variant::gpt2, ag::graph_replay_mode::on);
}
TEST(Correctness, ReplayLlamaPipelineCpu2) {
  run_transformer("cpu:2", 2, ag::models::model_variant::llama, ag::graph_replay_mode::automatic);
}

// plan_options::output_pieces: an output concatenated from pieces computed on
// several devices (two runs each: the concat axis is not the outermost)
// comes back equal to the reference, each device copying its pieces into
// their places, on sim (values on, under jitter) and cpu, many jobs in
// flight, with the pieces and with the gather they replace.
TEST(Correctness, OutputsCopiedPieceByPieceFromSeveralDevicesEqualTheReference) {
  ag::graph_builder b;
  auto x = b.input("x", ag::dtype::f32, {3, 8, 128});  // runs of 4 KiB
  auto w = b.weight("w", ag::host_tensor::random_normal(ag::dtype::f32, {128, 128}, 7, 0.1f));
  auto p0 = b.silu(b.matmul(x, w, false, false, "m0"), "p0");
  auto p1 = b.gelu(x, ag::gelu_mode::tanh, "p1");
  auto p2 = b.matmul(x, w, false, false, "p2");
  b.pin(p0, 0);
  b.pin(p1, 1);
  b.pin(p2, 2);
  b.output(b.concat({p0, p1, p2}, 1, "out"));
  b.output(p1);  // a piece that is an output on its own too
  auto gr = std::move(b).build();
  ASSERT_TRUE(gr.has_value()) << gr.err().to_string();
  const auto g = std::make_shared<const ag::graph>(std::move(*gr));
  for (const char* spec : {"sim:3", "cpu:3"}) {
    auto opts = std::string(spec).rfind("sim", 0) == 0 ? fast_sim() : ag::runtime_options{};
    auto rt = ag::runtime::create(spec, opts);
    ASSERT_TRUE(rt.has_value()) << rt.err().to_string();
    for (const bool pieces : {true, false}) {
      ag::plan_options po;
      po.output_pieces = pieces;
      auto p = (*rt)->compile(g, po);
      ASSERT_TRUE(p.has_value()) << p.err().to_string();
      int d2h = 0;
      for (const auto& s : (*p)->steps()) d2h += s.kind == ag::step_kind::copy_d2h;
      EXPECT_EQ(d2h, pieces ? 4 : 2) << spec;
      std::vector<ag::job> jobs;
      std::vector<std::vector<ag::host_tensor>> ins;
      for (int k = 0; k < 6; ++k) {
        ins.push_back(inputs_for(*g, 50 + static_cast<uint64_t>(k)));
        jobs.push_back((*rt)->submit(*p, ins.back()));
      }
      for (std::size_t k = 0; k < jobs.size(); ++k) {
        ASSERT_TRUE(jobs[k].wait_for(30s)) << spec << " job " << k << " hung";
        check_outputs(*g, ins[k], jobs[k].wait(), std::string(spec) + (pieces ? " pieces" : " gathered"));
      }
    }
  }
}

TEST(Correctness, TraceHasEveryStepAndExportsChromeJson) {
  auto rt = ag::runtime::create("sim:2", fast_sim());
  ASSERT_TRUE(rt.has_value()) << rt.err().to_string();
  auto g = ag::test::random_dag({.seed = 3, .ops = 20});
  ASSERT_TRUE(g.has_value());
  auto p = (*rt)->compile(*g);
  ASSERT_TRUE(p.has_value()) << p.err().to_string();
  auto j = (*rt)->submit(*p, inputs_for(*g, 5));
  ASSERT_TRUE(j.wait_for(30s));
  ASSERT_TRUE(j.wait().has_value()) << j.wait().err().to_string();
  auto t = (*rt)->take_trace();
  EXPECT_EQ(t.records.size(), (*p)->steps().size());
  for (const auto& r : t.records) {
    EXPECT_EQ(r.job, j.id());
    EXPECT_LE(r.enqueue_ns, r.end_ns);
    EXPECT_LE(r.start_ns, r.end_ns) << r.label;
  }
  const std::string json = t.to_chrome_json();
  EXPECT_NE(json.find("\"ph\":\"X\""), std::string::npos);
  EXPECT_NE(json.find("process_name"), std::string::npos);
  EXPECT_TRUE((*rt)->take_trace().records.empty()) << "take_trace must clear";
  const auto times = j.times();
  EXPECT_LE(times.submitted_ns, times.started_ns);
  EXPECT_LE(times.started_ns, times.finished_ns);
}

}  // namespace
