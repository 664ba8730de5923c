// Tensor-parallel plans run on the runtime (sim with values, and cpu):
// collectives are steps of each member's communication queue, driven by the
// same ready messages as every other step. Every result is checked against
// evaluate_reference of the user's graph.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "actors/actorgraph.hpp"
#include "actors/collective_order.hpp"
#include "gpu/host/collective_sequence.hpp"
#include "gpu/sim/sim_device.hpp"
#include "graph/models/transformer.hpp"
#include "graph/reference.hpp"
#include "../graph/random_dag.hpp"
#include "../graph/tp_random_graph.hpp"

namespace {

using namespace std::chrono_literals;
using ag::dtype;
using ag::host_tensor;

ag::plan_options tp(int degree, std::vector<double> ratios = {}, int stages = 1) {
  ag::plan_options o;
  o.tensor_parallel = degree;
  o.shard_ratios = std::move(ratios);
  o.pipeline_stages = stages;
  return o;
}

ag::runtime_options opts() {
  ag::runtime_options o;
  o.backend.sim.time_scale = 1e-3;  // a simulated ms takes 1 us
  o.backend.sim.jitter = 0.2;       // members reach their collectives at different times
  o.arenas_per_device = 4;
  return o;
}

void expect_outputs(const ag::job& j, const std::vector<host_tensor>& want, double atol, double rtol,
                    const std::string& what) {
  ASSERT_TRUE(j.wait_for(60s)) << what << ": job did not finish";
  const auto& r = j.wait();
  ASSERT_TRUE(r.has_value()) << what << ": " << r.err().to_string();
  ASSERT_EQ(r->size(), want.size()) << what;
  for (std::size_t i = 0; i < want.size(); ++i) {
    auto c = ag::compare((*r)[i], want[i], atol, rtol);
    EXPECT_TRUE(c.ok) << what << " output " << i << ": " << c.message;
  }
}

/// Compiles g on `rt` with `o`, runs it on `in`, compares with the reference
/// of the user's graph. Returns the plan.
std::shared_ptr<const ag::plan> run_and_check(ag::runtime& rt, const std::shared_ptr<const ag::graph>& g,
                                              const ag::plan_options& o, const std::vector<host_tensor>& in,
                                              const std::string& what, double atol = 1e-4, double rtol = 1e-3) {
  auto p = rt.compile(g, o);
  EXPECT_TRUE(p.has_value()) << what << ": " << (p ? "" : p.err().to_string());
  if (!p) return nullptr;
  auto want = ag::evaluate_reference(*g, in);
  EXPECT_TRUE(want.has_value());
  if (!want) return nullptr;
  expect_outputs(rt.submit(*p, in), *want, atol, rtol, what);
  return *p;
}

/// Submits `n` jobs of plan p (of g, a transformer `cfg`: inputs drawn from
/// seeds first_seed, first_seed + 1, ...) all at once, then checks each
/// against the reference.
void expect_jobs_equal_reference(ag::runtime& rt, const std::shared_ptr<const ag::plan>& p, const ag::graph& g,
                                 const ag::models::transformer_config& cfg, uint64_t first_seed, int n,
                                 const std::string& what) {
  std::vector<ag::job> jobs;
  std::vector<std::vector<host_tensor>> want;
  for (int k = 0; k < n; ++k) {
    auto in = ag::models::transformer_inputs(cfg, first_seed + static_cast<uint64_t>(k));
    want.push_back(ag::evaluate_reference(g, in).value());
    jobs.push_back(rt.submit(p, std::move(in)));
  }
  for (std::size_t k = 0; k < jobs.size(); ++k) expect_outputs(jobs[k], want[k], 1e-4, 1e-3, what + " job " + std::to_string(k));
}

/// The collective steps of `p`; with `algo`, only those of that algorithm.
int collective_steps(const ag::plan& p, std::optional<ag::collective_algo> algo = {}) {
  int n = 0;
  for (const auto& s : p.steps()) n += s.kind == ag::step_kind::collective && (!algo || s.algo == *algo);
  return n;
}

ag::models::transformer_config tiny(ag::models::model_variant v, int heads, int kv = 0) {
  ag::models::transformer_config c;
  c.variant = v;
  c.n_layers = 2;
  c.d_model = 8 * heads;
  c.n_heads = heads;
  c.n_kv_heads = kv;
  c.d_ff = 48;
  c.vocab = 41;
  c.seq_len = 6;
  c.batch = 2;
  c.seed = 5;
  c.initializer_range = 0.2f;
  return c;
}

std::shared_ptr<const ag::graph> build(const ag::models::transformer_config& c) {
  return std::make_shared<const ag::graph>(ag::models::build_transformer(c).value());
}

std::vector<host_tensor> random_inputs(const ag::graph& g, uint64_t seed) {
  std::vector<host_tensor> in;
  for (ag::node_id id : g.inputs()) {
    const auto& n = g.at(id);
    in.push_back(n.type == dtype::i32 ? host_tensor::random_ints(n.dims, seed++, 11)  // ids of 11-row tables
                                      : host_tensor::random_normal(n.type, n.dims, seed++));
  }
  return in;
}

struct TensorParallelRun : ::testing::TestWithParam<const char*> {};

// all_reduce, reduce_scatter and all_gather alone, over 2 and 3 members, in
// every dtype: the backends sum in double and round once, as the reference
// does, so results are equal to it exactly.
TEST_P(TensorParallelRun, CollectivesAloneEqualTheReferenceForEveryDtype) {
  auto rt = ag::runtime::create(std::string(GetParam()) + ":3", opts()).value();
  for (int n : {2, 3}) {
    for (dtype t : {dtype::f32, dtype::f16, dtype::bf16, dtype::i32}) {
      const std::string what = std::to_string(n) + " members " + ag::to_string(t);
      auto g = ag::test::user_collectives(t, n, 3, 4 * n);
      ASSERT_TRUE(g);
      auto p = rt->compile(g);
      ASSERT_TRUE(p.has_value()) << what << ": " << p.err().to_string();
      EXPECT_EQ(collective_steps(**p), 3 * n) << what;
      std::vector<host_tensor> in;
      for (int k = 0; k < n; ++k)
        in.push_back(t == dtype::i32 ? host_tensor::random_ints({3, 4 * n}, 10 + k, 1000)
                                     : host_tensor::random_normal(t, {3, 4 * n}, 10 + k));
      auto want = ag::evaluate_reference(*g, in).value();
      expect_outputs(rt->submit(*p, in), want, 0, 0, what);
    }
  }
}

TEST_P(TensorParallelRun, TransformersEqualTheReferenceAtDegreesTwoThreeFour) {
  auto rt = ag::runtime::create(std::string(GetParam()) + ":4", opts()).value();
  using ag::models::model_variant;
  struct model_case {
    ag::models::transformer_config cfg;
    std::string what;
  };
  const std::vector<model_case> cases = {
      {tiny(model_variant::gpt2, 4), "gpt2"},
      {tiny(model_variant::llama, 8, 2), "llama gqa 8/2"},
      {tiny(model_variant::llama, 6, 3), "llama gqa 6/3"},
  };
  for (const auto& mc : cases) {
    auto g = build(mc.cfg);
    for (int degree : {2, 3, 4}) {
      const std::string what = mc.what + " degree " + std::to_string(degree);
      auto p = run_and_check(*rt, g, tp(degree), ag::models::transformer_inputs(mc.cfg, 7), what);
      ASSERT_TRUE(p) << what;
      EXPECT_GT(collective_steps(*p), 0) << what;
    }
  }
}

TEST_P(TensorParallelRun, UnevenRatiosAndPipelineByTensorEqualTheReference) {
  auto rt = ag::runtime::create(std::string(GetParam()) + ":4", opts()).value();
  using ag::models::model_variant;
  for (auto cfg : {tiny(model_variant::gpt2, 4), tiny(model_variant::llama, 8, 2)}) {
    const std::string v = ag::models::to_string(cfg.variant);
    auto in = ag::models::transformer_inputs(cfg, 3);
    ASSERT_TRUE(run_and_check(*rt, build(cfg), tp(2, {3, 1}), in, v + " 3:1"));
    ASSERT_TRUE(run_and_check(*rt, build(cfg), tp(3, {1, 2, 1}), in, v + " 1:2:1"));
    cfg.n_layers = 4;
    auto p = run_and_check(*rt, build(cfg), tp(2, {}, 2), ag::models::transformer_inputs(cfg, 4), v + " 2 x 2");
    ASSERT_TRUE(p);
    EXPECT_EQ(p->tensor_parallel()->stages, 2);
  }
}

// Random DAGs (ops without tensor-parallel rules are gathered: all_gather /
// all_reduce before them) at degrees 2..4, some with uneven ratios.
TEST_P(TensorParallelRun, RandomGraphsWithTheGatherFallbackEqualTheReference) {
  auto rt = ag::runtime::create(std::string(GetParam()) + ":4", opts()).value();
  int with_collectives = 0;
  for (uint64_t seed = 1; seed <= 24; ++seed) {
    std::shared_ptr<const ag::graph> g =
        seed % 4 == 0 ? std::make_shared<const ag::graph>(
                            ag::test::random_dag({.seed = seed, .ops = 20 + static_cast<int>(seed % 12), .outputs = 3}).value())
                      : ag::test::tp_random_graph(seed, 10 + static_cast<int>(seed % 15));
    ASSERT_TRUE(g);
    const int degree = 2 + static_cast<int>(seed % 3);
    std::vector<double> ratios;
    if (seed % 2) ratios.assign(static_cast<std::size_t>(degree), 1.0), ratios[0] = 2.0;
    const std::string what = "seed " + std::to_string(seed) + " degree " + std::to_string(degree);
    auto p = run_and_check(*rt, g, tp(degree, ratios), random_inputs(*g, seed), what, 2e-4, 2e-3);
    ASSERT_TRUE(p) << what;
    with_collectives += collective_steps(*p) > 0;
  }
  EXPECT_GT(with_collectives, 12);  // the sample exercises collectives
}

/// Empty when, on every lane of `lanes`, every two devices ran the jobs they
/// share in one order (the agreed issue order, actors/collective_order.hpp:
/// a lane issues a job's steps only after every job that drew its turns
/// before it, whatever its plan); else the first difference.
std::string lane_orders_disagree(const ag::trace& t, int devices, const std::vector<std::string>& lanes) {
  for (const auto& lane : lanes) {
    std::vector<std::vector<const ag::trace_record*>> on(static_cast<std::size_t>(devices));
    for (const auto& r : t.records)
      if (r.lane == lane) on[static_cast<std::size_t>(r.device)].push_back(&r);
    std::vector<std::vector<uint64_t>> order(on.size());  // jobs in the order the lane's actor enqueued them
    for (std::size_t d = 0; d < on.size(); ++d) {
      std::stable_sort(on[d].begin(), on[d].end(), [](auto* a, auto* b) { return a->enqueue_ns < b->enqueue_ns; });
      for (const auto* r : on[d])
        if (order[d].empty() || order[d].back() != r->job) order[d].push_back(r->job);
    }
    for (std::size_t a = 0; a < order.size(); ++a)
      for (std::size_t b = a + 1; b < order.size(); ++b) {
        const std::set<uint64_t> in_a(order[a].begin(), order[a].end()), in_b(order[b].begin(), order[b].end());
        std::vector<uint64_t> x, y;
        for (uint64_t j : order[a]) if (in_b.count(j)) x.push_back(j);
        for (uint64_t j : order[b]) if (in_a.count(j)) y.push_back(j);
        if (x != y)
          for (std::size_t k = 0; k < std::min(x.size(), y.size()); ++k)
            if (x[k] != y[k])
              return lane + ": device " + std::to_string(a) + " ran job " + std::to_string(x[k]) + " where device " +
                     std::to_string(b) + " ran job " + std::to_string(y[k]) + " (shared job " + std::to_string(k) + ")";
      }
  }
  return {};
}

/// Two plans over the same four devices: LLaMA (GQA) at degree 4, and GPT-2
/// at degree 2 on 2 stages (`job_lanes_b` job lanes; 0: the default).
struct two_plans {
  ag::models::transformer_config cfg_a, cfg_b;
  std::shared_ptr<const ag::graph> ga, gb;
  std::shared_ptr<const ag::plan> pa, pb;
};
two_plans two_plans_over_four(ag::runtime& rt, int job_lanes_b = 0) {
  using ag::models::model_variant;
  two_plans t{tiny(model_variant::llama, 8, 2), tiny(model_variant::gpt2, 4), nullptr, nullptr, nullptr, nullptr};
  t.ga = build(t.cfg_a);
  t.gb = build(t.cfg_b);
  t.pa = rt.compile(t.ga, tp(4)).value();
  ag::plan_options ob = tp(2, {}, 2);
  ob.job_lanes = job_lanes_b;
  t.pb = rt.compile(t.gb, ob).value();
  return t;
}

// Many jobs of two tensor-parallel plans in flight at once (their
// collectives interleave on every member's communication queue): all equal
// the reference, nothing hangs, and every queue of every device took the
// two plans' jobs in one order (one issue order across plans: each plan
// numbering its own jobs let NCCL pair one plan's all-reduce with the
// other's on real GPUs).
TEST_P(TensorParallelRun, ManyConcurrentJobsEqualTheReference) {
  ag::runtime_options o = opts();
  o.trace = true;
  auto rt = ag::runtime::create(std::string(GetParam()) + ":4", o).value();
  auto [cfg_a, cfg_b, ga, gb, pa, pb] = two_plans_over_four(*rt);
  struct pending {
    ag::job j;
    std::vector<host_tensor> want;
    std::string what;
  };
  std::vector<pending> jobs;
  for (uint64_t k = 0; k < 24; ++k) {
    const bool a = k % 3 != 2;
    const auto& cfg = a ? cfg_a : cfg_b;
    auto in = ag::models::transformer_inputs(cfg, 100 + k);
    auto want = ag::evaluate_reference(a ? *ga : *gb, in).value();
    jobs.push_back({rt->submit(a ? pa : pb, std::move(in)), std::move(want), "job " + std::to_string(k)});
  }
  for (auto& pj : jobs) expect_outputs(pj.j, pj.want, 1e-4, 1e-3, pj.what);
  const ag::trace t = rt->take_trace();
  ASSERT_EQ(t.dropped_records, 0u);
  std::set<uint64_t> traced;
  for (const auto& r : t.records)
    if (r.lane == "comm") traced.insert(r.job);
  EXPECT_EQ(traced.size(), jobs.size()) << "every job's collectives ran on the communication queues";
  EXPECT_EQ(lane_orders_disagree(t, 4, {"comm", "compute0"}), "");
}

// Sequence parallelism on (reduce-scatter and all-gather by rows, norms and
// residual adds on a rank's rows): transformers at degrees 2..4, uneven
// ratios, 2 x 2, and jobs of it in flight together, equal to the reference.
TEST_P(TensorParallelRun, SequenceParallelTransformersEqualTheReference) {
  auto rt = ag::runtime::create(std::string(GetParam()) + ":4", opts()).value();
  using ag::models::model_variant;
  for (auto cfg : {tiny(model_variant::gpt2, 8), tiny(model_variant::llama, 8, 2)}) {
    cfg.seq_len = 8;
    const std::string v = ag::models::to_string(cfg.variant);
    auto g = build(cfg);
    auto in = ag::models::transformer_inputs(cfg, 5);
    for (int degree : {2, 3, 4}) {
      auto o = tp(degree);
      o.sequence_parallel = ag::sequence_parallel_mode::on;
      auto p = run_and_check(*rt, g, o, in, v + " degree " + std::to_string(degree));
      ASSERT_TRUE(p);
      int scatters = 0;
      for (const auto& c : p->tensor_parallel()->collectives) scatters += c.op == ag::op_kind::reduce_scatter;
      EXPECT_GT(scatters, 0) << v << " degree " << degree;
    }
    auto o = tp(2, {3, 1});
    o.sequence_parallel = ag::sequence_parallel_mode::on;
    ASSERT_TRUE(run_and_check(*rt, g, o, in, v + " 3:1"));
    o = tp(2, {}, 2);
    o.sequence_parallel = ag::sequence_parallel_mode::on;
    expect_jobs_equal_reference(*rt, rt->compile(g, o).value(), *g, cfg, 60, 8, v + " 2 x 2");
  }
}

// Job lanes (plan_options::job_lanes): the jobs in flight alternate over
// copies of each device's compute lane and communication queue, each copy
// issuing its own jobs in their agreed order. Every job equals the
// reference; each job's steps ran on one copy (its compute lane and its
// communication queue have the same index, from the trace); every copy ran
// jobs. job_lanes 1, and auto on sim and cpu, keep one copy (compute0 and
// comm). Then jobs cancelled while in flight on both copies: the others
// still equal the reference and the runtime keeps serving.
TEST_P(TensorParallelRun, JobLanesSpreadJobsInFlightOverQueueCopies) {
  ag::runtime_options o = opts();
  o.trace = true;
  auto rt = ag::runtime::create(std::string(GetParam()) + ":2", o).value();
  auto cfg = tiny(ag::models::model_variant::llama, 8, 2);
  auto g = build(cfg);
  for (int asked : {0, 1, 2, 3}) {
    const std::string what = std::string(GetParam()) + " job_lanes " + std::to_string(asked);
    ag::plan_options po = tp(2);
    po.job_lanes = asked;
    po.lanes_per_device = 1;  // copy r computes on lane r
    auto p = rt->compile(g, po).value();
    (void)rt->take_trace();
    expect_jobs_equal_reference(*rt, p, *g, cfg, 300, 12, what);
    const ag::trace t = rt->take_trace();
    std::map<uint64_t, std::set<std::string>> lanes_of;
    std::set<std::string> used;
    for (const auto& r : t.records)
      if (r.lane.rfind("compute", 0) == 0 || r.lane.rfind("comm", 0) == 0) {
        lanes_of[r.job].insert(r.lane);
        used.insert(r.lane);
      }
    const int copies = asked >= 2 ? asked : 1;
    std::set<std::string> want;
    for (int c = 0; c < copies; ++c) {
      want.insert("compute" + std::to_string(c));
      want.insert(c == 0 ? std::string("comm") : "comm" + std::to_string(c));
    }
    EXPECT_EQ(used, want) << what;
    EXPECT_EQ(lanes_of.size(), 12u) << what;
    for (const auto& [job, lanes] : lanes_of) {
      ASSERT_EQ(lanes.size(), 2u) << what << " job " << job << " ran on " << lanes.size() << " lanes";
      const std::string comm = *lanes.begin(), compute = *lanes.rbegin();  // "comm.." sorts before "compute.."
      const std::string c = compute.substr(7), m = comm.substr(4);
      EXPECT_EQ(c == "0" ? std::string() : c, m) << what << " job " << job << ": " << comm << " with " << compute;
    }
  }
  // Cancelled in flight: every third job of 18 on two copies.
  ag::plan_options po = tp(2);
  po.job_lanes = 2;
  auto p = rt->compile(g, po).value();
  std::vector<ag::job> jobs;
  std::vector<std::vector<host_tensor>> want;
  for (uint64_t k = 0; k < 18; ++k) {
    auto in = ag::models::transformer_inputs(cfg, 400 + k);
    want.push_back(ag::evaluate_reference(*g, in).value());
    jobs.push_back(rt->submit(p, std::move(in)));
    if (k % 3 == 1) jobs.back().cancel();
  }
  for (std::size_t k = 0; k < jobs.size(); ++k) {
    ASSERT_TRUE(jobs[k].wait_for(60s)) << "job " << k << " hung";
    if (k % 3 == 1) continue;  // cancelled: failed, or done before the cancel arrived
    expect_outputs(jobs[k], want[k], 1e-4, 1e-3, "job " + std::to_string(k) + " beside cancelled ones");
  }
  expect_jobs_equal_reference(*rt, p, *g, cfg, 500, 4, "after the cancellations");
}

// NCCL pairs a communicator's parts by their place in each member's issue
// order, so a job cancelled, timed out or failed after one member issued its
// part and before another did must still have that part issued everywhere:
// left out, the first member's part pairs with the next job's (wrong sums
// on the GPUs, or a wait for ever). It issues void parts for them
// (owe_cancelled_collectives, on by default; the test turns it on in case
// the environment turned it off), and the host backends' check (gpu/host/
// collective_sequence.hpp, off by default, on here) fails any part whose
// place another member filled with another collective, with errc::internal
// (with the owed parts off this test fails 3 of 3 runs on sim). Two plans
// over the same four devices (degree 4
// LLaMA; GPT-2 at degree 2 on 2 stages, two job lanes), 120 jobs in flight,
// a third cancelled at random points (right after submit or up to 300 us
// later) and a tenth with a deadline of 20-200 us; on sim every op may also
// fail (injected op errors). Every job ends: done and equal to the
// reference, or cancelled, timed out or failed by an injected fault; never
// an internal error. No part is left waiting for a member, and the runtime
// serves the next jobs of both plans.
TEST_P(TensorParallelRun, CancelledAndFailedJobsLeaveEveryCommunicatorPaired) {
  struct switches_on {
    bool check = ag::gpu::host::collective_sequence::checking().exchange(true);
    bool owe = ag::actors::owe_cancelled_collectives().exchange(true);
    ~switches_on() {
      ag::gpu::host::collective_sequence::checking().store(check);
      ag::actors::owe_cancelled_collectives().store(owe);
    }
  } on;
  const bool sim = std::string(GetParam()) == "sim";
  ag::runtime_options o = opts();
  if (sim) o.backend.sim.faults.op_error_rate = 0.002;
  auto rt = ag::runtime::create(std::string(GetParam()) + ":4", o).value();
  auto [cfg_a, cfg_b, ga, gb, pa, pb] = two_plans_over_four(*rt, 2);
  const std::size_t open_before = ag::gpu::host::collective_sequence::instance().open_positions();
  std::mt19937_64 rng(7);
  struct pending {
    ag::job j;
    std::vector<host_tensor> want;
    bool cancelled = false, deadline = false;
  };
  std::vector<pending> jobs;
  int done = 0, cancelled = 0, timed_out = 0, faults = 0;
  for (uint64_t k = 0; k < 120; ++k) {
    const bool a = k % 2 == 0;
    const auto& cfg = a ? cfg_a : cfg_b;
    auto in = ag::models::transformer_inputs(cfg, 700 + k);
    pending pj;
    pj.want = ag::evaluate_reference(a ? *ga : *gb, in).value();
    ag::submit_options so;
    pj.deadline = rng() % 10 == 0;
    if (pj.deadline) so.deadline = std::chrono::microseconds(20 + rng() % 180);
    pj.j = rt->submit(a ? pa : pb, std::move(in), so);
    pj.cancelled = !pj.deadline && rng() % 3 == 0;
    if (pj.cancelled) {
      if (rng() % 2) std::this_thread::sleep_for(std::chrono::microseconds(rng() % 300));
      pj.j.cancel();
    }
    jobs.push_back(std::move(pj));
  }
  for (std::size_t k = 0; k < jobs.size(); ++k) {
    const std::string what = "job " + std::to_string(k);
    ASSERT_TRUE(jobs[k].j.wait_for(60s)) << what << " hung";
    const auto& r = jobs[k].j.wait();
    if (r.has_value()) {
      ++done;
      expect_outputs(jobs[k].j, jobs[k].want, 1e-4, 1e-3, what);
      continue;
    }
    const ag::error& e = r.err();
    ASSERT_NE(e.code, ag::errc::internal) << what << ": " << e.to_string();
    if (e.code == ag::errc::cancelled) {
      EXPECT_TRUE(jobs[k].cancelled) << what << ": " << e.to_string();
      ++cancelled;
    } else if (e.code == ag::errc::timeout) {
      EXPECT_TRUE(jobs[k].deadline) << what << ": " << e.to_string();
      ++timed_out;
    } else {
      EXPECT_TRUE(sim) << what << ": " << e.to_string();
      EXPECT_NE(e.message.find("injected fault"), std::string::npos) << what << ": " << e.to_string();
      ++faults;
    }
  }
  EXPECT_GT(done, 30);
  EXPECT_GT(cancelled + timed_out, 10) << "too few jobs were cancelled or timed out to show anything";
  rt->wait_idle();
  EXPECT_EQ(ag::gpu::host::collective_sequence::instance().open_positions(), open_before)
      << "a member's part waits for a part its peers never issued";
  std::cerr << GetParam() << ": " << done << " done, " << cancelled << " cancelled, " << timed_out << " timed out, "
            << faults << " failed by injected faults\n";
  // Both plans serve on (the sim's faults stay on: a job may fail by one).
  for (uint64_t k = 0; k < 6; ++k) {
    const bool a = k % 2 == 0;
    auto in = ag::models::transformer_inputs(a ? cfg_a : cfg_b, 900 + k);
    auto want = ag::evaluate_reference(a ? *ga : *gb, in).value();
    ag::job j = rt->submit(a ? pa : pb, std::move(in));
    ASSERT_TRUE(j.wait_for(60s));
    if (!j.wait().has_value()) {
      EXPECT_NE(j.wait().err().message.find("injected fault"), std::string::npos) << j.wait().err().to_string();
      continue;
    }
    expect_outputs(j, want, 1e-4, 1e-3, "after: job " + std::to_string(k));
  }
}

INSTANTIATE_TEST_SUITE_P(Backends, TensorParallelRun, ::testing::Values("sim", "cpu"));

// Sequence parallelism with overlap on simulated devices whose compute and
// links are slow enough that chunks of rows pay (the cost model splits the
// MLP and the output projection): jobs in flight together, under jitter,
// equal the reference.
/// Four sim devices whose collectives are rings (no one-shot), fast in wall
/// time; by default compute and links slow enough that the cost model splits
/// a tiny transformer's row-parallel matmuls in chunks.
std::unique_ptr<ag::runtime> chunking_sim4(double flops_f32 = 1e8, double link_bandwidth = 2e6,
                                           double collective_latency = 1e-7) {
  ag::runtime_options ro = opts();
  ro.backend.sim.spec.flops_f32 = flops_f32;
  ro.backend.sim.spec.link_bandwidth = link_bandwidth;
  ro.backend.sim.spec.collective_latency = collective_latency;
  ro.backend.sim.spec.oneshot_max_bytes = 0;
  ro.backend.sim.time_scale = 1e-4;
  return ag::runtime::create("sim:4", ro).value();
}

TEST(SequenceParallelRun, ChunksOfRowsOnSimEqualTheReference) {
  auto rt = chunking_sim4();
  auto cfg = tiny(ag::models::model_variant::llama, 8, 2);
  cfg.seq_len = 16;
  auto g = build(cfg);
  for (int degree : {2, 4})
    for (bool by_batch : {true, false}) {  // chunks of the batch (plan_options::tp_batch_chunks), of rows
      const std::string what = "degree " + std::to_string(degree) + (by_batch ? " by batch" : " by rows");
      auto o = tp(degree);  // sequence parallelism and overlap: the defaults
      o.tp_batch_chunks = by_batch ? ag::batch_chunks_mode::on : ag::batch_chunks_mode::off;
      auto p = rt->compile(g, o).value();
      ASSERT_FALSE(p->tensor_parallel()->chunked.empty()) << what;
      EXPECT_EQ(p->tensor_parallel()->chunked_by_batch.empty(), !by_batch) << what;
      // The hand-over ops run on lane 1 (plan_options::hand_over_lane), beside the chunks.
      EXPECT_TRUE(std::any_of(p->steps().begin(), p->steps().end(), [](const ag::step& st) { return st.lane == 1; }))
          << what;
      expect_jobs_equal_reference(*rt, p, *g, cfg, 80, 8, what);
    }
}

// The steps in the order the cost model's search picks
// (plan_options::order_steps_by_model): at degree 4 on these devices it moves
// collectives of the chunked regions ahead of others on the communication
// queues (so the plans differ), and jobs in flight together equal the
// reference either way.
TEST(SequenceParallelRun, StepsOrderedByTheModelEqualTheReference) {
  // Links and compute in the proportions of the d-8192 benchmark layer on
  // H200s: a chunk's reduce-scatter about as long as its matmul.
  auto rt = chunking_sim4(1e9, 3.2e7, 4e-6);
  auto cfg = tiny(ag::models::model_variant::llama, 8, 2);
  cfg.d_model = 128;
  cfg.d_ff = 512;
  cfg.seq_len = 32;
  auto g = build(cfg);
  for (int degree : {4}) {  // (at degree 2 the search finds nothing better here)
    auto o = tp(degree);
    o.tp_batch_chunks = ag::batch_chunks_mode::off;  // chunks of rows (the sample the search was measured on)
    o.order_steps_by_model = false;
    auto built = rt->compile(g, o).value();
    o.order_steps_by_model = true;
    auto ordered = rt->compile(g, o).value();
    std::vector<std::string> a, b;
    for (const ag::step& st : built->steps()) a.push_back(built->source().at(st.ops[0]).name);
    for (const ag::step& st : ordered->steps()) b.push_back(ordered->source().at(st.ops[0]).name);
    const std::string what = "degree " + std::to_string(degree);
    EXPECT_NE(a, b) << what << ": the search kept the builder's order, so the sample shows nothing";
    EXPECT_LT(ordered->modelled_seconds(), built->modelled_seconds()) << what;
    EXPECT_TRUE(ag::check_hazards(*ordered).ok()) << what << ": " << ag::check_hazards(*ordered).to_string();
    expect_jobs_equal_reference(*rt, ordered, *g, cfg, 95, 8, what + ", ordered by the model");
    expect_jobs_equal_reference(*rt, built, *g, cfg, 96, 8, what + ", the builder's order");
  }
}

// The same with a batch of 1: a rank's rows of a chunk are one block of the
// hidden state, so the concats that join the chunks' pieces are written in
// place (plan_options::elide_concats): their producers (reduce-scatter
// parts, residual adds) write straight into the joined tensor. Jobs in
// flight together equal the reference with it on and off.
TEST(SequenceParallelRun, ChunksJoinedInPlaceEqualTheReference) {
  auto rt = chunking_sim4();
  auto cfg = tiny(ag::models::model_variant::llama, 8, 2);  // d 64: a row is 256 bytes
  cfg.seq_len = 16;
  cfg.batch = 1;
  auto g = build(cfg);
  for (int degree : {2, 4}) {
    for (bool elide : {true, false}) {
      const std::string what = "degree " + std::to_string(degree) + (elide ? ", in place" : ", copied");
      auto o = tp(degree);
      o.elide_concats = elide;
      auto p = rt->compile(g, o).value();
      ASSERT_FALSE(p->tensor_parallel()->chunked.empty()) << what;
      EXPECT_EQ(p->elided_concats().empty(), !elide) << what << "\n" << p->describe();
      for (const ag::elided_concat& e : p->elided_concats())
        EXPECT_EQ(p->source().at(e.concat).op, ag::op_kind::concat) << what;
      EXPECT_TRUE(ag::check_hazards(*p).ok()) << what << ": " << ag::check_hazards(*p).to_string();
      expect_jobs_equal_reference(*rt, p, *g, cfg, 90, 8, what);
    }
  }
}

/// The cpu ring (gpu/cpu/ring.hpp) sums in the dtype, in ring order, rounding
/// after each of its t-1 steps: within (t-1) roundings of the partial sums'
/// magnitude (standard-normal operands: partial sums below ~8), i32 exact.
double ring_tolerance(dtype t, int members) {
  switch (t) {
    case dtype::f32: return 1e-5;
    case dtype::f16: return (members - 1) * 8 * 0x1p-11;   // 8 ulp-units of f16 at magnitude 8
    case dtype::bf16: return (members - 1) * 8 * 0x1p-8;   // same for bf16's 8-bit mantissa
    case dtype::i32: return 0;
  }
  return 0;
}

ag::runtime_options ring_opts() {
  ag::runtime_options o = opts();
  o.backend.cpu_oneshot_max_bytes = 0;  // every collective a ring
  return o;
}

// The cpu backend's ring: all_reduce (chunk sizes not dividing by the
// members), reduce_scatter (even and uneven slices, several rows: strided
// chunks) and all_gather over 2, 3 and 4 members, every dtype, equal to the
// reference within the dtype's tolerance; the plan says ring for each.
TEST(CpuRing, CollectivesEqualTheReferenceForEveryDtypeAndMemberCount) {
  auto rt = ag::runtime::create("cpu:4", ring_opts()).value();
  for (int n : {2, 3, 4}) {
    for (dtype t : {dtype::f32, dtype::f16, dtype::bf16, dtype::i32}) {
      for (bool uneven : {false, true}) {
        const std::string what = std::to_string(n) + " members " + ag::to_string(t) + (uneven ? " uneven" : "");
        const int64_t rows = 3, cols = 10 * n + (uneven ? 1 : 0);
        std::vector<int64_t> parts;
        if (uneven) {  // 1, then the rest spread
          parts.assign(static_cast<std::size_t>(n), (cols - 1) / (n - 1));
          parts[0] = cols - (cols - 1) / (n - 1) * (n - 1);
        }
        auto g = ag::test::user_collectives(t, n, rows, cols, parts);
        ASSERT_TRUE(g) << what;
        auto p = rt->compile(g);
        ASSERT_TRUE(p.has_value()) << what << ": " << p.err().to_string();
        int rings = 0;
        for (const auto& s : (*p)->steps()) rings += s.kind == ag::step_kind::collective && s.algo == ag::collective_algo::ring;
        EXPECT_EQ(rings, 3 * n) << what;
        std::vector<host_tensor> in;
        for (int k = 0; k < n; ++k)
          in.push_back(t == dtype::i32 ? host_tensor::random_ints({rows, cols}, 100 + k + 7 * n, 100000)
                                       : host_tensor::random_normal(t, {rows, cols}, 100 + k + 7 * n));
        auto want = ag::evaluate_reference(*g, in).value();
        const double tol = ring_tolerance(t, n);
        expect_outputs(rt->submit(*p, in), want, tol, tol, what);
      }
    }
  }
}

// Tensor-parallel transformers and many concurrent jobs with every
// collective a ring: the parts of concurrent jobs meet their own job's
// parts (no cross-talk), results equal the reference.
TEST(CpuRing, ConcurrentTensorParallelJobsEqualTheReference) {
  auto rt = ag::runtime::create("cpu:4", ring_opts()).value();
  for (int degree : {2, 4}) {
    auto cfg = tiny(ag::models::model_variant::llama, 8, 2);
    auto g = build(cfg);
    auto p = rt->compile(g, tp(degree)).value();
    ASSERT_GT(collective_steps(*p), 0);
    expect_jobs_equal_reference(*rt, p, *g, cfg, 40, 6, "degree " + std::to_string(degree));
  }
}

// A device that dies while tensor-parallel jobs are in flight fails exactly
// the jobs that use it (with its death error), none hangs (the other
// members' parts finish or fail, they do not wait for it), and a plan on
// other devices keeps serving, during and after. `sequence_parallel`: the
// plan's collectives are reduce-scatters and all-gathers on the copy
// engines (what CUDA GPUs plan for large activations by default), with
// their chunked overlap; else all-reduces as rings.
void device_death_during_collectives(bool sequence_parallel) {
  ag::runtime_options o = opts();
  o.backend.sim.time_scale = 1.0;
  o.backend.sim.jitter = 0;
  o.backend.sim.spec.link_bandwidth = 2e6;  // each collective part takes milliseconds
  o.backend.sim.spec.oneshot_max_bytes = 0;
  if (sequence_parallel) {
    o.backend.sim.spec.collectives_overlap_compute = false;
    o.backend.sim.spec.copy_engine_collectives = true;
    o.backend.sim.spec.sequence_parallel_min_bytes = 0;
  }
  auto rt = ag::runtime::create("sim:4", o).value();
  auto cfg = tiny(ag::models::model_variant::llama, 8, 2);
  auto g = build(cfg);
  auto ptp = rt->compile(g, tp(2)).value();  // devices 0 and 1
  ASSERT_GT(collective_steps(*ptp), 0);
  const int copy_engine_parts = collective_steps(*ptp, ag::collective_algo::copy_engine);
  if (sequence_parallel)
    ASSERT_GT(copy_engine_parts, 0) << "no copy-engine collective planned: the case would not test what it names";
  else
    ASSERT_EQ(copy_engine_parts, 0);
  // A plan on device 3 only.
  ag::graph_builder b;
  auto x = b.input("x", dtype::f32, {4, 8});
  auto w = b.weight("w", host_tensor::random_normal(dtype::f32, {8, 8}, 3, 0.3f));
  auto y = b.gelu(b.matmul(x, w, false, false, "fc"), ag::gelu_mode::tanh, "act");
  b.pin(y, 3);
  b.output(y);
  auto gother = std::make_shared<const ag::graph>(std::move(b).build().value());
  auto pother = rt->compile(gother).value();
  auto in = ag::models::transformer_inputs(cfg, 1);
  auto want = ag::evaluate_reference(*g, in).value();
  std::vector<ag::job> tp_jobs;
  for (int k = 0; k < 8; ++k) tp_jobs.push_back(rt->submit(ptp, in));
  auto other_in = std::vector<host_tensor>{host_tensor::random_normal(dtype::f32, {4, 8}, 9)};
  auto other_want = ag::evaluate_reference(*gother, other_in).value();
  std::vector<ag::job> other_jobs;
  for (int k = 0; k < 4; ++k) other_jobs.push_back(rt->submit(pother, other_in));
  // Kill device 1 once the first job's collectives are running (its
  // outputs are ready), while the other seven are in flight.
  ASSERT_TRUE(tp_jobs.front().wait_for(60s));
  auto* sim1 = dynamic_cast<ag::gpu::sim::sim_device*>(rt->device(1).get());
  ASSERT_NE(sim1, nullptr);
  sim1->kill("pulled during a collective (test)");
  for (int k = 0; k < 4; ++k) other_jobs.push_back(rt->submit(pother, other_in));
  int failed = 0;
  for (auto& j : tp_jobs) {
    ASSERT_TRUE(j.wait_for(60s)) << "a tensor-parallel job hangs after its device died";
    if (j.wait().has_value()) {
      auto c = ag::compare(j.wait()->front(), want.front(), 1e-4, 1e-3);
      EXPECT_TRUE(c.ok) << c.message;
    } else {
      ++failed;
      EXPECT_EQ(j.wait().err().code, ag::errc::device_failed) << j.wait().err().to_string();
      EXPECT_NE(j.wait().err().message.find("pulled during a collective"), std::string::npos)
          << j.wait().err().message;
    }
  }
  EXPECT_GT(failed, 0) << "the device died with no job in flight: the test proves nothing";
  for (auto& j : other_jobs) expect_outputs(j, other_want, 1e-4, 1e-3, "plan on device 3");
  // New tensor-parallel jobs on the dead device fail at once; device 3 serves.
  auto late = rt->submit(ptp, in);
  ASSERT_TRUE(late.wait_for(60s));
  EXPECT_FALSE(late.wait().has_value());
  expect_outputs(rt->submit(pother, other_in), other_want, 1e-4, 1e-3, "plan on device 3 after");
}

TEST(TensorParallelFault, DeviceDeathDuringCollectivesFailsOnlyItsJobs) { device_death_during_collectives(false); }

TEST(TensorParallelFault, DeviceDeathDuringSequenceParallelCopyEngineCollectivesFailsOnlyItsJobs) {
  device_death_during_collectives(true);
}

}  // namespace
