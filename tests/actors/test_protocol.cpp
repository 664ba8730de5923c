// Protocol tests of the runtime's actors on CAF's deterministic test
// coordinator with inline fake devices (fake_device.hpp): every message is
// stepped by the test, so orderings are reproducible.
#include <gtest/gtest.h>

#include <caf/all.hpp>
#include <caf/scheduler/test_coordinator.hpp>

#include <algorithm>
#include <cstdio>
#include <functional>
#include <map>
#include <optional>
#include <set>

#include "actors/collective_order.hpp"
#include "actors/runtime_core.hpp"
#include "actors/job_state.hpp"
#include "fake_device.hpp"
#include "../graph/counting_host_memory.hpp"
#include "graph/models/transformer.hpp"
#include "graph/random.hpp"
#include "graph/reference.hpp"
#include "messages/atoms.hpp"
#include "messages/messages.hpp"
#include "actors/launch_program.hpp"
#include "messages/registration.hpp"
#include "../graph/random_dag.hpp"

namespace {

struct Protocol : ::testing::Test {
  caf::actor_system_config cfg;
  std::unique_ptr<caf::actor_system> sys;
  caf::scheduler::test_coordinator* sched = nullptr;
  std::vector<std::shared_ptr<ag::test::fake_device>> devs;
  std::unique_ptr<ag::actors::runtime_core> core;

  /// `configure` runs on each fake device before the runtime (and so its
  /// actors and streams) is built.
  bool actor_per_lane = false;  ///< runtime_options::actor_per_lane of the next start()
  double stall_factor = 0;      ///< runtime_options::stall_factor of the next start()
  double stall_min_seconds = 1.0;
  bool start_on_submit = true;  ///< runtime_options::start_jobs_on_submit of the next start()
  int64_t pinned_inputs_max_bytes = int64_t{64} << 10;  ///< runtime_options::pinned_inputs_max_bytes
  int spare_job_actors = ag::runtime_options{}.spare_job_actors;  ///< runtime_options::spare_job_actors

  void start(int n, int arenas, int64_t mem = 1LL << 30, bool pinned_outputs = true,
             const std::function<void(ag::test::fake_device&)>& configure = {}) {
    cfg.set("scheduler.policy", caf::atom("testing"));
    ag::msg::register_message_types(cfg);
    sys = std::make_unique<caf::actor_system>(cfg);
    sched = &dynamic_cast<caf::scheduler::test_coordinator&>(sys->scheduler());
    std::vector<ag::gpu::device_ptr> d;
    for (int i = 0; i < n; ++i) {
      devs.push_back(std::make_shared<ag::test::fake_device>(i, mem));
      if (configure) configure(*devs.back());
      d.push_back(devs.back());
    }
    ag::runtime_options o;
    o.arenas_per_device = arenas;
    o.pinned_outputs = pinned_outputs;
    o.actor_per_lane = actor_per_lane;
    o.stall_factor = stall_factor;
    o.stall_min_seconds = stall_min_seconds;
    o.start_jobs_on_submit = start_on_submit;
    o.pinned_inputs_max_bytes = pinned_inputs_max_bytes;
    o.spare_job_actors = spare_job_actors;
    core = std::make_unique<ag::actors::runtime_core>(*sys, d, o);
    sched->run();
  }
  void TearDown() override {
    if (core) {
      sched->run();
      core->shutdown();
      sched->run();
      core.reset();
    }
    if (sched) sched->run();
    sys.reset();
  }
  /// Runs the next message of `who` (false when it has none).
  bool run_next_of(const caf::actor& who) { return sched->prioritize(who) && sched->try_run_once(); }
  /// Runs one message at a time until `pred` holds; false if the system ran dry first.
  template <class Pred>
  bool run_until(Pred pred) {
    while (!pred())
      if (!sched->try_run_once()) return false;
    return true;
  }
};

std::vector<ag::host_tensor> inputs_for(const ag::graph& g, uint64_t seed) {
  std::vector<ag::host_tensor> in;
  for (ag::node_id id : g.inputs()) in.push_back(ag::host_tensor::random_normal(g.at(id).type, g.at(id).dims, seed++));
  return in;
}

void expect_reference(const ag::graph& g, const std::vector<ag::host_tensor>& in, const ag::job& j) {
  ASSERT_TRUE(j.ready());
  const auto& r = j.wait();
  ASSERT_TRUE(r.has_value()) << r.err().to_string();
  auto ref = ag::evaluate_reference(g, in).value();
  ASSERT_EQ(r->size(), ref.size());
  for (std::size_t i = 0; i < ref.size(); ++i) {
    auto c = ag::compare((*r)[i], ref[i], 2e-4, 2e-3);
    EXPECT_TRUE(c.ok) << "output " << i << ": " << c.message;
  }
}

/// up (column-parallel) -> gelu -> down (row-parallel): one all-reduce per
/// job at tensor-parallel degree 2 (tensor_degree_2: no chunking).
std::shared_ptr<const ag::graph> up_act_down() {
  ag::graph_builder b;
  auto x = b.input("x", ag::dtype::f32, {4, 8});
  auto w1 = b.weight("w1", ag::host_tensor::random_normal(ag::dtype::f32, {8, 16}, 1, 0.3f));
  auto w2 = b.weight("w2", ag::host_tensor::random_normal(ag::dtype::f32, {16, 8}, 2, 0.3f));
  b.output(b.matmul(b.gelu(b.matmul(x, w1, false, false, "up"), ag::gelu_mode::tanh, "act"), w2, false, false, "down"));
  return std::make_shared<const ag::graph>(std::move(b).build().value());
}
ag::plan_options tensor_degree_2() {
  ag::plan_options o;
  o.tensor_parallel = 2;
  o.tp_overlap = false;
  return o;
}

/// An MLP whose compute nodes are pinned to `device`.
ag::graph pinned_mlp(int device, uint64_t seed) {
  ag::graph_builder b;
  auto x = b.input("x", ag::dtype::f32, {4, 8});
  auto w = b.weight("w", ag::host_tensor::random_normal(ag::dtype::f32, {8, 8}, seed, 0.3f));
  auto h = b.matmul(x, w, false, false, "fc");
  auto y = b.gelu(h, ag::gelu_mode::tanh, "act");
  auto z = b.add(y, x, "resid");
  for (auto t : {h, y, z}) b.pin(t, device);
  b.output(z);
  return std::move(b).build().value();
}

/// fc0 (+ gelu) pinned to device 0, fc1 to device 1; outputs: act0 (copied
/// out of device 0), fc1 (out of device 1) and fc1's transpose (a
/// non-contiguous view on device 1).
ag::graph two_device_mlp() {
  ag::graph_builder b;
  auto x = b.input("x", ag::dtype::f32, {6, 10});
  auto w = b.weight("w", ag::host_tensor::random_normal(ag::dtype::f32, {10, 10}, 3, 0.3f));
  auto h0 = b.gelu(b.matmul(x, w, false, false, "fc0"), ag::gelu_mode::tanh, "act0");
  auto h1 = b.matmul(h0, w, false, false, "fc1");
  b.pin(h0, 0);
  b.pin(h1, 1);
  b.output(h0);
  b.output(h1);
  b.output(b.transpose(h1, 0, 1, "h1_t"));
  return std::move(b).build().value();
}

TEST_F(Protocol, StepsLaunchOnlyAfterAllDepsAndInLaneOrder) {
  start(2, 4);
  auto g = std::make_shared<const ag::graph>(ag::test::random_dag({.seed = 11, .ops = 40}).value());
  ag::plan_options po;
  po.lanes_per_device = 2;
  po.min_branch_seconds = 0;
  auto p = core->compile(g, po);
  ASSERT_TRUE(p.has_value()) << p.err().to_string();
  const auto& plan = **p;
  auto in = inputs_for(*g, 5);
  auto j = core->submit(*p, in);
  sched->run();
  expect_reference(*g, in, j);

  // Where each compute step's first and last op ran (fake device clocks are
  // per device; steps on different devices are ordered through copies, so
  // compare only within a device plus the copy chain checked by values).
  std::map<ag::node_id, int64_t> when[2];
  for (int d = 0; d < 2; ++d)
    for (const auto& e : devs[static_cast<std::size_t>(d)]->log) when[d][e.node] = e.seq;
  auto first_last = [&](const ag::step& s, int64_t& lo, int64_t& hi) {
    lo = INT64_MAX;
    hi = INT64_MIN;
    for (ag::node_id id : s.ops) {
      auto it = when[s.device].find(id);
      if (it == when[s.device].end()) continue;
      lo = std::min(lo, it->second);
      hi = std::max(hi, it->second);
    }
    return lo != INT64_MAX;
  };
  int checked = 0;
  for (const auto& s : plan.steps()) {
    if (s.kind != ag::step_kind::compute) continue;
    int64_t lo, hi;
    if (!first_last(s, lo, hi)) continue;
    for (ag::step_id d : s.deps) {
      const auto& ds = plan.at(d);
      int64_t dlo, dhi;
      if (ds.kind != ag::step_kind::compute || ds.device != s.device || !first_last(ds, dlo, dhi)) continue;
      EXPECT_LT(dhi, lo) << "step " << s.id << " ran before its dep " << d;
      ++checked;
    }
  }
  // Lane order: steps of one (device, lane) ran in lane_seq order.
  std::map<std::pair<int, int>, std::vector<const ag::step*>> lanes;
  for (const auto& s : plan.steps())
    if (s.kind == ag::step_kind::compute) lanes[{s.device, s.lane}].push_back(&s);
  for (auto& [key, v] : lanes) {
    std::sort(v.begin(), v.end(), [](auto* a, auto* b) { return a->lane_seq < b->lane_seq; });
    int64_t prev = INT64_MIN;
    for (auto* s : v) {
      int64_t lo, hi;
      if (!first_last(*s, lo, hi)) continue;
      EXPECT_GT(lo, prev) << "lane order broken at step " << s->id;
      prev = hi;
    }
  }
  EXPECT_GT(checked, 0) << "the graph gave no same-device dependent compute steps";
}

TEST_F(Protocol, SecondJobWaitsForTheOnlyArena) {
  start(1, 1);
  auto g = std::make_shared<const ag::graph>(ag::test::random_dag({.seed = 4, .ops = 12}).value());
  auto p = core->compile(g, {}).value();
  auto in1 = inputs_for(*g, 1), in2 = inputs_for(*g, 2);
  auto j1 = core->submit(p, in1);
  auto j2 = core->submit(p, in2);
  // Until the first job is ready, the second must not have started.
  while (!j1.ready()) {
    ASSERT_TRUE(sched->try_run_once()) << "ran dry before job 1 finished";
    ASSERT_EQ(j2.times().started_ns, 0) << "job 2 got an arena while job 1 held the only one";
    ASSERT_EQ(j2.state(), ag::job_state::queued);
  }
  sched->run();
  expect_reference(*g, in1, j1);
  expect_reference(*g, in2, j2);
  EXPECT_GE(j2.times().started_ns, j1.times().finished_ns);
}

TEST_F(Protocol, CancelInFlightDropsStepsAndReleasesTheArena) {
  start(2, 1);
  auto g = std::make_shared<const ag::graph>(ag::test::random_dag({.seed = 9, .ops = 30}).value());
  auto p = core->compile(g, {}).value();
  ASSERT_EQ(p->used_devices().size(), 2u);
  // A full run first: how many ops one job launches.
  auto in0 = inputs_for(*g, 2);
  auto j0 = core->submit(p, in0);
  sched->run();
  expect_reference(*g, in0, j0);
  const int64_t full = devs[0]->launches + devs[1]->launches;
  ASSERT_GT(full, 2);
  const int64_t base = full;

  auto j = core->submit(p, inputs_for(*g, 3));
  // Cancel as soon as the first op of the job ran: the rest is in flight.
  ASSERT_TRUE(run_until([&] { return devs[0]->launches + devs[1]->launches > base; }));
  j.cancel();
  // Let the job actor take the cancel before the executing actors go on.
  caf::actor job_actor;
  {
    auto& ss = *ag::actors::job_access::state(j);
    std::lock_guard<std::mutex> lk(ss.m);
    job_actor = ss.actor;
  }
  ASSERT_TRUE(job_actor);
  ASSERT_TRUE(sched->prioritize(job_actor));
  sched->run_once();
  sched->run();
  ASSERT_TRUE(j.ready());
  EXPECT_EQ(j.state(), ag::job_state::cancelled);
  ASSERT_FALSE(j.wait().has_value());
  EXPECT_EQ(j.wait().err().code, ag::errc::cancelled);
  EXPECT_LT(devs[0]->launches + devs[1]->launches - base, full) << "no step was dropped";
  EXPECT_EQ(core->jobs_in_flight(), 0);
  // The arenas came back: a new job (one arena per device) runs.
  auto in = inputs_for(*g, 4);
  auto j2 = core->submit(p, in);
  sched->run();
  expect_reference(*g, in, j2);
}

TEST_F(Protocol, CancelBeforeTheJobActorStarted) {
  start_on_submit = false;  // else submit starts the job itself (AJobWhoseArenasAreFreeIsStartedBySubmit)
  start(1, 1);
  auto g = std::make_shared<const ag::graph>(ag::test::random_dag({.seed = 5, .ops = 10}).value());
  auto p = core->compile(g, {}).value();
  auto j = core->submit(p, inputs_for(*g, 1));
  j.cancel();
  sched->run();
  EXPECT_EQ(j.state(), ag::job_state::cancelled);
  EXPECT_EQ(devs[0]->launches, 0);
  EXPECT_EQ(core->jobs_in_flight(), 0);
}

TEST_F(Protocol, CancelWhileWaitingForAnArena) {
  start(1, 1);
  auto g = std::make_shared<const ag::graph>(ag::test::random_dag({.seed = 2, .ops = 10}).value());
  auto p = core->compile(g, {}).value();
  // j1 holds the only arena and stalls in its last compute op until released.
  for (const auto& s : p->steps())
    if (s.kind == ag::step_kind::compute) devs[0]->hold_op = g->at(s.ops.back()).name;
  ASSERT_FALSE(devs[0]->hold_op.empty());
  auto in1 = inputs_for(*g, 1);
  auto j1 = core->submit(p, in1);
  sched->run();
  ASSERT_TRUE(devs[0]->held());
  ASSERT_EQ(j1.state(), ag::job_state::running);
  // j2 asks the device actor for the arena: queued behind j1.
  auto j2 = core->submit(p, inputs_for(*g, 2));
  sched->run();
  ASSERT_FALSE(j2.ready());
  j2.cancel();
  sched->run();
  EXPECT_EQ(j2.state(), ag::job_state::cancelled);
  ASSERT_FALSE(j1.ready());
  devs[0]->hold_op.clear();  // j3 runs through
  devs[0]->release();
  sched->run();
  expect_reference(*g, in1, j1);
  auto in3 = inputs_for(*g, 3);
  auto j3 = core->submit(p, in3);
  sched->run();
  expect_reference(*g, in3, j3);
}

// runtime_options::start_jobs_on_submit: a job that finds its arenas free
// is running when submit() returns (submit took the arenas and sent run_job;
// no device or job actor ran); one that must wait is queued behind it, and
// starts, in order, when the arenas come back. Off, every job waits for its
// device actors' answers.
void start_on_submit_case(Protocol& t, bool on) {
  t.start_on_submit = on;
  t.start(2, 1);
  auto g = std::make_shared<const ag::graph>(two_device_mlp());
  auto p = t.core->compile(g, {}).value();
  ASSERT_EQ(p->used_devices().size(), 2u);
  auto in1 = inputs_for(*g, 1), in2 = inputs_for(*g, 2);
  auto j1 = t.core->submit(p, in1);
  EXPECT_EQ(j1.state(), on ? ag::job_state::running : ag::job_state::queued);
  auto j2 = t.core->submit(p, in2);
  EXPECT_EQ(j2.state(), ag::job_state::queued);  // j1 holds the only arenas
  t.sched->run();
  expect_reference(*g, in1, j1);
  expect_reference(*g, in2, j2);
  EXPECT_LE(j1.times().started_ns, j2.times().started_ns);
  auto in3 = inputs_for(*g, 3);
  auto j3 = t.core->submit(p, in3);  // the arenas are back in the free lists
  EXPECT_EQ(j3.state(), on ? ag::job_state::running : ag::job_state::queued);
  t.sched->run();
  expect_reference(*g, in3, j3);
}

TEST_F(Protocol, AJobWhoseArenasAreFreeIsStartedBySubmit) { start_on_submit_case(*this, true); }

TEST_F(Protocol, WithStartOnSubmitOffEveryJobAsksItsDeviceActors) { start_on_submit_case(*this, false); }

// runtime_options::spare_job_actors: submit binds a job actor spawned ahead
// and spawns its replacement after sending the job, so the spares stay at
// their count; a bound spare that has not run yet still takes a cancel; the
// jobs equal the reference with spares and without; shutdown dismisses the
// unbound spares (no actor keeps running, or the actor system would wait
// for it forever at teardown).
void spare_job_actors_case(Protocol& t, int spares) {
  t.spare_job_actors = spares;
  t.start(2, 1);
  EXPECT_EQ(t.core->spare_job_actors(), static_cast<std::size_t>(spares));
  auto g = std::make_shared<const ag::graph>(two_device_mlp());
  auto p = t.core->compile(g, {}).value();
  auto in1 = inputs_for(*g, 1), in2 = inputs_for(*g, 2), in3 = inputs_for(*g, 3);
  auto j1 = t.core->submit(p, in1);
  EXPECT_EQ(j1.state(), ag::job_state::running);
  EXPECT_EQ(t.core->spare_job_actors(), static_cast<std::size_t>(spares));
  auto j2 = t.core->submit(p, in2);  // waits for j1's arenas; its actor has not run
  auto j3 = t.core->submit(p, in3);
  EXPECT_EQ(t.core->spare_job_actors(), static_cast<std::size_t>(spares));
  j2.cancel();
  t.sched->run();
  expect_reference(*g, in1, j1);
  ASSERT_TRUE(j2.ready());
  EXPECT_EQ(j2.state(), ag::job_state::cancelled);
  EXPECT_EQ(j2.wait().err().code, ag::errc::cancelled);
  expect_reference(*g, in3, j3);
  t.core->shutdown();
  t.sched->run();
  EXPECT_EQ(t.core->spare_job_actors(), 0u);
  EXPECT_EQ(t.sys->registry().running(), 0u) << "an actor is still running after shutdown";
}

TEST_F(Protocol, SpareJobActorsRunJobsAndAreReplacedAndDismissed) { spare_job_actors_case(*this, 2); }

TEST_F(Protocol, WithoutSpareJobActorsEverySubmitSpawnsItsActor) { spare_job_actors_case(*this, 0); }

TEST_F(Protocol, DeviceDeathFailsOnlyTheJobsOnThatDevice) {
  start(2, 2);
  ag::plan_options single;
  single.policy = ag::placement_policy::single;
  auto ga = std::make_shared<const ag::graph>(pinned_mlp(0, 1));
  auto gb = std::make_shared<const ag::graph>(pinned_mlp(1, 2));
  auto pa = core->compile(ga, single).value();
  auto pb = core->compile(gb, single).value();
  ASSERT_EQ(pa->used_devices(), std::vector<int>{0});
  ASSERT_EQ(pb->used_devices(), std::vector<int>{1});
  auto ina = inputs_for(*ga, 1), inb = inputs_for(*gb, 2);
  auto ja = core->submit(pa, ina);
  auto jb = core->submit(pb, inb);
  ASSERT_TRUE(run_until([&] { return ja.state() == ag::job_state::running && jb.state() == ag::job_state::running; }));
  devs[0]->kill("test kill");
  sched->run();
  ASSERT_TRUE(ja.ready());
  ASSERT_TRUE(jb.ready());
  EXPECT_EQ(ja.state(), ag::job_state::failed);
  ASSERT_FALSE(ja.wait().has_value());
  EXPECT_EQ(ja.wait().err().code, ag::errc::device_failed) << ja.wait().err().to_string();
  EXPECT_EQ(ja.wait().err().device, 0) << ja.wait().err().to_string();
  expect_reference(*gb, inb, jb);
  // Afterwards: jobs on the dead device fail at once, the other device serves.
  auto ja2 = core->submit(pa, ina);
  auto jb2 = core->submit(pb, inb);
  sched->run();
  EXPECT_EQ(ja2.state(), ag::job_state::failed);
  // It fails with the device's own death error: by name, with the reason, wrapped once.
  ASSERT_FALSE(ja2.wait().has_value());
  EXPECT_EQ(ja2.wait().err().code, ag::errc::device_failed);
  EXPECT_EQ(ja2.wait().err().device, 0);
  EXPECT_EQ(ja2.wait().err().message, "device 'fake0' failed: test kill");
  expect_reference(*gb, inb, jb2);
  EXPECT_EQ(core->jobs_in_flight(), 0);
}

// Stall detection on virtual time: fake0 stalls at op 'act' (its events stay
// incomplete), the executing actor's timer sees the step running past its
// limit and the device is quarantined; fake1 keeps serving; reset lifts it.
TEST_F(Protocol, AStalledStepFailsItsJobsWithTimeoutAndQuarantinesTheDeviceUntilReset) {
  stall_factor = 10;
  stall_min_seconds = 2;
  start(2, 2);
  ag::plan_options single;
  single.policy = ag::placement_policy::single;
  auto ga = std::make_shared<const ag::graph>(pinned_mlp(0, 1));
  auto gb = std::make_shared<const ag::graph>(pinned_mlp(1, 2));
  auto pa = core->compile(ga, single).value();
  auto pb = core->compile(gb, single).value();
  devs[0]->hold_op = "act";
  auto ina = inputs_for(*ga, 1), inb = inputs_for(*gb, 2);
  auto ja = core->submit(pa, ina);
  auto jb = core->submit(pb, inb);
  sched->run();
  ASSERT_TRUE(devs[0]->held());
  expect_reference(*gb, inb, jb);
  // No virtual time passed: nothing is reported before its limit.
  EXPECT_FALSE(ja.ready());
  EXPECT_TRUE(core->device_in_service(0));
  // Advance virtual time check by check (each re-arms while a step runs).
  int checks = 0;
  while (!ja.ready() && checks < 50) {
    checks += static_cast<int>(sched->trigger_timeouts());
    sched->run();
  }
  ASSERT_TRUE(ja.ready()) << "the stall was never reported";
  // Running counts from the first check that sees the step running; the
  // limit (2 s floor) is 4 periods of 1 s: at least 4 checks, well under 50.
  EXPECT_GE(checks, 4);
  ASSERT_FALSE(ja.wait().has_value());
  const auto& e = ja.wait().err();
  EXPECT_EQ(e.code, ag::errc::timeout) << e.to_string();
  EXPECT_EQ(e.device, 0) << e.to_string();
  ASSERT_GE(e.step, 0) << e.to_string();
  const auto& ops = pa->at(e.step).ops;
  EXPECT_NE(std::find(ops.begin(), ops.end(), ga->find("act")), ops.end()) << "step " << e.step << " does not run 'act'";
  EXPECT_NE(e.message.find("fake0"), std::string::npos) << e.to_string();
  EXPECT_NE(e.message.find("stalled"), std::string::npos) << e.to_string();
  // Quarantined: a new job on fake0 fails at once, fake1 serves.
  EXPECT_FALSE(core->device_in_service(0));
  EXPECT_TRUE(core->device_in_service(1));
  auto ja2 = core->submit(pa, ina);
  auto jb2 = core->submit(pb, inb);
  sched->run();
  ASSERT_TRUE(ja2.ready());
  ASSERT_FALSE(ja2.wait().has_value());
  EXPECT_EQ(ja2.wait().err().code, ag::errc::device_failed) << ja2.wait().err().to_string();
  EXPECT_EQ(ja2.wait().err().device, 0);
  EXPECT_NE(ja2.wait().err().message.find("quarantined"), std::string::npos) << ja2.wait().err().to_string();
  expect_reference(*gb, inb, jb2);
  // Reset: the held work is abandoned, the device serves again.
  std::optional<ag::error> reset;
  core->reset_device(0, [&reset](const ag::error& r) { reset = r; });
  sched->run();
  ASSERT_TRUE(reset.has_value()) << "reset_device never answered";
  EXPECT_FALSE(*reset) << reset->to_string();
  EXPECT_EQ(devs[0]->resets, 1);
  EXPECT_TRUE(core->device_in_service(0));
  auto in3 = inputs_for(*ga, 3);
  auto ja3 = core->submit(pa, in3);
  sched->run();
  expect_reference(*ga, in3, ja3);
  EXPECT_EQ(core->jobs_in_flight(), 0);
  EXPECT_EQ(core->jobs().size(), 0u);
  // Idle: the stall timers stop re-arming once nothing runs.
  sched->trigger_timeouts();
  sched->run();
  EXPECT_EQ(sched->trigger_timeouts(), 0u) << "an idle executing actor keeps a stall timer";
}

// Without stall detection (the default) a stalled job just waits: nothing
// fails it and no timer runs.
TEST_F(Protocol, StallDetectionOffLeavesAStalledJobWaitingWithoutTimers) {
  start(1, 1);
  auto g = std::make_shared<const ag::graph>(pinned_mlp(0, 1));
  auto p = core->compile(g, {}).value();
  devs[0]->hold_op = "act";
  auto in = inputs_for(*g, 1);
  auto j = core->submit(p, in);
  sched->run();
  ASSERT_TRUE(devs[0]->held());
  EXPECT_EQ(sched->trigger_timeouts(), 0u);
  sched->run();
  EXPECT_FALSE(j.ready());
  devs[0]->release();
  sched->run();
  expect_reference(*g, in, j);
}

// A device whose backend cannot revive it (gpu::device's default reset, as
// CUDA after a sticky error) refuses the reset with a clear error and stays
// out of service; a device that can is revived and serves correct values;
// an index out of range is refused.
TEST_F(Protocol, ResetRevivesADeadDeviceThatCanBeRevivedAndRefusesOneThatCannot) {
  start(2, 2);
  ag::plan_options single;
  single.policy = ag::placement_policy::single;
  auto ga = std::make_shared<const ag::graph>(pinned_mlp(0, 1));
  auto gb = std::make_shared<const ag::graph>(pinned_mlp(1, 2));
  auto pa = core->compile(ga, single).value();
  auto pb = core->compile(gb, single).value();
  devs[0]->revivable = false;
  devs[0]->kill("sticky");
  devs[1]->kill("transient");
  sched->run();
  EXPECT_FALSE(core->device_in_service(0));
  EXPECT_FALSE(core->device_in_service(1));
  std::map<int, ag::error> answers;
  for (int d : {0, 1, 2, -1}) core->reset_device(d, [&answers, d](const ag::error& r) { answers[d] = r; });
  sched->run();
  ASSERT_EQ(answers.size(), 4u);
  EXPECT_EQ(answers[0].code, ag::errc::device_failed) << answers[0].to_string();
  EXPECT_NE(answers[0].message.find("cannot revive"), std::string::npos) << answers[0].to_string();
  EXPECT_FALSE(answers[1]) << answers[1].to_string();
  for (int d : {2, -1}) {
    EXPECT_EQ(answers[d].code, ag::errc::invalid_argument) << answers[d].to_string();
    EXPECT_NE(answers[d].message.find("no such device"), std::string::npos) << answers[d].to_string();
  }
  EXPECT_FALSE(core->device_in_service(0));
  EXPECT_TRUE(core->device_in_service(1));
  auto ina = inputs_for(*ga, 1), inb = inputs_for(*gb, 2);
  auto ja = core->submit(pa, ina);
  auto jb = core->submit(pb, inb);
  sched->run();
  ASSERT_TRUE(ja.ready());
  ASSERT_FALSE(ja.wait().has_value());
  EXPECT_EQ(ja.wait().err().code, ag::errc::device_failed);
  expect_reference(*gb, inb, jb);
}

TEST_F(Protocol, LaunchFailureNamesDeviceStepAndOp) {
  start(1, 1);
  auto g = std::make_shared<const ag::graph>(pinned_mlp(0, 3));
  auto p = core->compile(g, {}).value();
  devs[0]->fail_op = "act";
  auto j = core->submit(p, inputs_for(*g, 1));
  sched->run();
  ASSERT_TRUE(j.ready());
  ASSERT_FALSE(j.wait().has_value());
  const auto& e = j.wait().err();
  EXPECT_EQ(e.code, ag::errc::op_failed);
  EXPECT_EQ(e.device, 0) << e.to_string();
  EXPECT_EQ(e.op, "act") << e.to_string();
  ASSERT_GE(e.step, 0) << e.to_string();
  const auto& ops = p->at(e.step).ops;
  EXPECT_NE(std::find(ops.begin(), ops.end(), g->find("act")), ops.end()) << "step " << e.step << " does not run 'act'";
  devs[0]->fail_op.clear();
  auto in = inputs_for(*g, 2);
  auto j2 = core->submit(p, in);
  sched->run();
  expect_reference(*g, in, j2);
}

// Actors whose first step waits for another actor get no run_job: the first
// ready message of the job starts them. Several jobs in flight still match
// the reference, and afterwards no actor holds state for any of them and the
// job registry is empty (nothing started by ready is left behind).
TEST_F(Protocol, ActorsStartedByReadyRunAndForgetEveryJob) {
  start(2, 4);
  auto g = std::make_shared<const ag::graph>(ag::test::random_dag({.seed = 11, .ops = 40}).value());
  ag::plan_options po;
  po.lanes_per_device = 2;
  po.min_branch_seconds = 0;
  auto p = core->compile(g, po);
  ASSERT_TRUE(p.has_value()) << p.err().to_string();
  auto lp = ag::actors::runtime_core::loaded(*p);
  ASSERT_NE(lp, nullptr);
  int without_run = 0;
  for (const auto& q : lp->program->queues()) without_run += !q.starts_itself;
  ASSERT_GT(without_run, 0) << "the plan gave no queue whose first step waits for another queue";

  std::vector<std::vector<ag::host_tensor>> ins;
  std::vector<ag::job> jobs;
  for (uint64_t i = 0; i < 3; ++i) {
    ins.push_back(inputs_for(*g, 100 + 10 * i));
    jobs.push_back(core->submit(*p, ins.back()));
  }
  sched->run();
  for (std::size_t i = 0; i < jobs.size(); ++i) expect_reference(*g, ins[i], jobs[i]);
  EXPECT_EQ(core->jobs().size(), 0u);
  caf::scoped_actor self{*sys};
  for (const auto& a : core->exec_actors()) {
    self->send(a, ag::msg::stats_atom::value);
    sched->run();
    bool answered = false;
    self->receive([&](int64_t held) {
      answered = true;
      EXPECT_EQ(held, 0) << "an executing actor still holds job state";
    }, caf::after(std::chrono::seconds(1)) >> [] {});
    EXPECT_TRUE(answered);
  }
}

// One handler run that makes more steps ready for one consumer than a ready
// message holds (msg::ready::max_steps): here the h2d actor launches the
// copies of 9 inputs in one go, all consumed by one compute lane, so the
// batch goes out as several messages and the job still matches the reference.
TEST_F(Protocol, ReadyBatchesLargerThanOneMessageArriveComplete) {
  start(1, 2);
  constexpr int n = 9;
  static_assert(n > ag::msg::ready::max_steps);
  ag::graph_builder b;
  ag::tensor acc;
  for (int i = 0; i < n; ++i) {
    auto x = b.input("x" + std::to_string(i), ag::dtype::f32, {4, 8});
    acc = acc.valid() ? b.add(acc, x, "sum" + std::to_string(i)) : x;
  }
  b.output(b.gelu(acc, ag::gelu_mode::tanh, "act"));
  auto g = std::make_shared<const ag::graph>(std::move(b).build().value());
  ag::plan_options copy_queues;
  copy_queues.inline_small_copies = false;  // the copies take the h2d queue, the sums a compute lane
  auto p = core->compile(g, copy_queues).value();
  auto lp = ag::actors::runtime_core::loaded(p);
  ASSERT_NE(lp, nullptr);
  // The h2d steps of one queue with consumers on one other queue.
  std::map<std::pair<int, int>, int> fan;
  for (const auto& s : p->steps())
    if (s.kind == ag::step_kind::copy_h2d) {
      const auto& ls = lp->program->step(s.id);
      for (int cq : ls.consumer_queues) ++fan[{ls.queue, cq}];
    }
  int widest = 0;
  for (const auto& [k, v] : fan) widest = std::max(widest, v);
  ASSERT_GT(widest, ag::msg::ready::max_steps) << "the plan does not feed one actor from enough copies";
  for (uint64_t seed = 1; seed <= 2; ++seed) {
    auto in = inputs_for(*g, 10 * seed);
    auto j = core->submit(p, in);
    sched->run();
    expect_reference(*g, in, j);
  }
}

// A device that offers host memory of its own (gpu::device::host_memory(),
// CUDA's pinned pool) gets the job outputs it copies out allocated there, also
// a non-contiguous output's storage copy; the values still match the
// reference, and each buffer goes back when the result is dropped. With
// runtime_options::pinned_outputs off, outputs are heap memory. (Copies
// that replay inside graphs go through the arenas' host windows instead:
// replay_host_copies off here, see the next test.)
TEST_F(Protocol, OutputsComeFromTheCopyingDevicesHostMemory) {
  ag::test::counting_host_memory mem;
  start(2, 2);
  devs[1]->host_mem = &mem;  // device 0 offers none: its outputs stay on the heap
  auto g = std::make_shared<const ag::graph>(two_device_mlp());
  ag::plan_options own_buffers;
  own_buffers.replay_host_copies = false;
  auto p = core->compile(g, own_buffers).value();
  auto in = inputs_for(*g, 21);
  {
    auto j = core->submit(p, in);
    sched->run();
    expect_reference(*g, in, j);
    const auto& out = *j.wait();
    EXPECT_EQ(out[0].memory(), nullptr);
    EXPECT_EQ(out[1].memory(), &mem);
    EXPECT_TRUE(mem.owns(out[1].data()));
    EXPECT_EQ(out[2].memory(), &mem);
    // Output 2's storage copy came from `mem` too and went back after the gather.
    EXPECT_EQ(mem.allocations(), 3);
  }
  sched->run();
  EXPECT_EQ(mem.live(), 0u) << "a job's output buffers outlived its handles";
  EXPECT_EQ(mem.bad_deallocations(), 0);
}

// Under graph replay, a lane's inlined input and output copies go through
// the host window of the job's arena (plan_options::replay_host_copies): one
// buffer per arena from the device's host memory, made with the arena and
// kept for the plan's life, not one per job. Jobs in flight on different
// arenas, and later jobs reusing them, all get their own values; the
// windows go back when the plan is unloaded.
TEST_F(Protocol, ReplayedHostCopiesGoThroughOneHostWindowPerArena) {
  ag::test::counting_host_memory mem;
  start(1, 3, 1LL << 30, /*pinned_outputs=*/false);
  devs[0]->host_mem = &mem;
  auto g = std::make_shared<const ag::graph>(pinned_mlp(0, 5));
  auto p = core->compile(g, {}).value();
  auto lp = ag::actors::runtime_core::loaded(p);
  ASSERT_NE(lp, nullptr);
  ASSERT_FALSE(lp->program->window_inputs().empty()) << p->describe();
  ASSERT_FALSE(lp->program->window_outputs().empty()) << p->describe();
  ASSERT_GT(lp->program->window_bytes(0), 0);
  EXPECT_EQ(mem.allocations(), 1) << "the first arena's window is made with it, at load";
  for (int round = 0; round < 3; ++round) {
    std::vector<std::vector<ag::host_tensor>> ins;
    std::vector<ag::job> jobs;
    for (int k = 0; k < 5; ++k) {  // more jobs than arenas: some wait for one
      ins.push_back(inputs_for(*g, 1000 + 10 * round + k));
      jobs.push_back(core->submit(p, ins.back()));
    }
    sched->run();
    for (std::size_t k = 0; k < jobs.size(); ++k) {
      SCOPED_TRACE("round " + std::to_string(round) + " job " + std::to_string(k));
      expect_reference(*g, ins[k], jobs[k]);
      EXPECT_EQ(jobs[k].wait()->front().memory(), nullptr) << "an output copied out of a window is the job's own";
    }
  }
  EXPECT_EQ(mem.allocations(), 3) << "one window per arena, whatever the number of jobs";
  EXPECT_EQ(mem.live(), 3u);
  lp.reset();
  p.reset();
  sched->run();
  EXPECT_EQ(mem.live(), 0u) << "the windows outlived their plan";
  EXPECT_EQ(mem.bad_deallocations(), 0);
}

/// One job of pinned_mlp(0) on a device that offers `mem` as its host
/// memory, with pinned outputs off and runtime_options::
/// pinned_inputs_max_bytes = `pinned_inputs_limit`; checked against the
/// reference. Returns how many buffers `mem` handed out by the time submit()
/// returned (before any actor ran) and whether the output is heap memory.
std::pair<int, bool> mlp_job_on_host_memory(Protocol& t, ag::test::counting_host_memory& mem,
                                            int64_t pinned_inputs_limit) {
  t.pinned_inputs_max_bytes = pinned_inputs_limit;
  t.start(1, 2, 1LL << 30, /*pinned_outputs=*/false);
  t.devs[0]->host_mem = &mem;
  auto g = std::make_shared<const ag::graph>(pinned_mlp(0, 5));
  ag::plan_options own_buffers;  // the job's own input and output buffers, no arena host windows
  own_buffers.replay_host_copies = false;
  auto p = t.core->compile(g, own_buffers).value();
  auto in = inputs_for(*g, 8);
  auto j = t.core->submit(p, in);
  const int at_submit = mem.allocations();
  t.sched->run();
  expect_reference(*g, in, j);
  return {at_submit, j.ready() && j.wait().has_value() && j.wait()->front().memory() == nullptr};
}

TEST_F(Protocol, PinnedOutputsOffKeepsOutputsOnTheHeap) {
  ag::test::counting_host_memory mem;
  const auto [at_submit, heap_output] = mlp_job_on_host_memory(*this, mem, 0);  // inputs stay where they are too
  EXPECT_TRUE(heap_output);
  EXPECT_EQ(at_submit, 0);
  EXPECT_EQ(mem.allocations(), 0);
}

// runtime_options::pinned_inputs_max_bytes: submit() copies an input of at
// most that size into the host memory of the device that copies it in, so
// the device copies it without staging; the values still match, and the
// buffer goes back when the job ends. A larger input stays where it is.
TEST_F(Protocol, SmallInputsAreCopiedIntoTheCopyingDevicesHostMemoryBySubmit) {
  ag::test::counting_host_memory mem;
  // x of pinned_mlp: [4, 8] f32, 128 bytes
  EXPECT_EQ(mlp_job_on_host_memory(*this, mem, 4 * 8 * 4).first, 1);
  sched->run();
  EXPECT_EQ(mem.live(), 0u) << "the pinned input outlived its job";
  EXPECT_EQ(mem.bad_deallocations(), 0);
}

TEST_F(Protocol, InputsLargerThanThePinnedLimitStayWhereTheyAre) {
  ag::test::counting_host_memory mem;
  EXPECT_EQ(mlp_job_on_host_memory(*this, mem, 4 * 8 * 4 - 1).first, 0);
  EXPECT_EQ(mem.allocations(), 0);
}

// Device calls other than launches can fail too (gpu::device returns their
// errors): each failure fails the job that made it, with an error naming the
// device and the step, and the runtime keeps serving once the device does.
TEST_F(Protocol, FailingStreamAndEventCallsFailTheJobNamingDeviceAndStep) {
  start(1, 2);
  auto g = std::make_shared<const ag::graph>(pinned_mlp(0, 4));
  ag::plan_options copy_queues;
  copy_queues.inline_small_copies = false;  // copies on their queues: the compute step waits for them
  auto p = core->compile(g, copy_queues).value();
  // create_event first: the actors' event pools are still empty.
  for (const char* call : {"create_event", "record", "wait"}) {
    SCOPED_TRACE(call);
    devs[0]->fail_call = call;
    auto j = core->submit(p, inputs_for(*g, 1));
    sched->run();
    ASSERT_TRUE(j.ready());
    ASSERT_FALSE(j.wait().has_value());
    const auto& e = j.wait().err();
    EXPECT_EQ(e.code, ag::errc::device_failed) << e.to_string();
    EXPECT_EQ(e.device, 0) << e.to_string();
    ASSERT_GE(e.step, 0) << e.to_string();
    EXPECT_EQ(p->at(e.step).device, 0);
    if (std::string(call) == "wait") {  // only steps with a dep on another queue wait
      EXPECT_EQ(p->at(e.step).kind, ag::step_kind::compute) << e.to_string();
    }
    devs[0]->fail_call.clear();
    auto in = inputs_for(*g, 2);
    auto ok = core->submit(p, in);
    sched->run();
    expect_reference(*g, in, ok);
  }
  EXPECT_EQ(core->jobs_in_flight(), 0);
  EXPECT_EQ(core->jobs().size(), 0u);
}

TEST_F(Protocol, AStreamThatCannotBeCreatedFailsTheJobsOnItsDeviceOnly) {
  start(2, 2, 1LL << 30, true, [](ag::test::fake_device& d) {
    if (d.index() == 0) d.fail_call = "create_stream";
  });
  ag::plan_options single;
  single.policy = ag::placement_policy::single;
  auto ga = std::make_shared<const ag::graph>(pinned_mlp(0, 1));
  auto gb = std::make_shared<const ag::graph>(pinned_mlp(1, 2));
  auto pa = core->compile(ga, single).value();
  auto pb = core->compile(gb, single).value();
  auto inb = inputs_for(*gb, 2);
  auto ja = core->submit(pa, inputs_for(*ga, 1));
  auto jb = core->submit(pb, inb);
  sched->run();
  ASSERT_TRUE(ja.ready()) << "a job on a queue without a stream never finished";
  ASSERT_FALSE(ja.wait().has_value());
  EXPECT_EQ(ja.wait().err().code, ag::errc::device_failed) << ja.wait().err().to_string();
  EXPECT_EQ(ja.wait().err().device, 0);
  EXPECT_GE(ja.wait().err().step, 0);
  expect_reference(*gb, inb, jb);
  EXPECT_EQ(core->jobs_in_flight(), 0);
}

// A device dies while a job is between steps. The job hears of it twice: its
// next step is refused by the dead device, and the device's fault notice
// comes through the device and runtime actors (fail_job). Whichever comes
// first decides the job's error, so both must carry the same facts: code,
// device and the device's own reason (before, a refusal said only "is dead",
// and which text a job showed depended on the race: the flaky
// ReplFault.DeadDeviceFailsItsJobsUntilFaultsAreTurnedOff).
void expect_death_of_fake0(const ag::job& j) {
  ASSERT_TRUE(j.ready());
  ASSERT_FALSE(j.wait().has_value());
  const auto& e = j.wait().err();
  EXPECT_EQ(e.code, ag::errc::device_failed) << e.to_string();
  EXPECT_EQ(e.device, 0) << e.to_string();
  // The reason is what this test is about: it is text, given by the test.
  EXPECT_NE(e.message.find("pulled the plug"), std::string::npos) << e.message;
}

TEST_F(Protocol, DeviceDeathReachesAJobWithItsReasonWhenTheRefusalComesFirst) {
  start(1, 2);
  auto g = std::make_shared<const ag::graph>(pinned_mlp(0, 6));
  auto p = core->compile(g, {}).value();
  auto j = core->submit(p, inputs_for(*g, 1));
  ASSERT_TRUE(run_until([&] { return j.state() == ag::job_state::running; }));
  devs[0]->kill("pulled the plug", /*report=*/false);  // the notice is late
  sched->run();
  expect_death_of_fake0(j);
  EXPECT_GE(j.wait().err().step, 0) << "the refused step is named";
  devs[0]->report_fault();
  sched->run();
  auto late = core->submit(p, inputs_for(*g, 2));
  sched->run();
  expect_death_of_fake0(late);
  EXPECT_EQ(core->jobs_in_flight(), 0);
}

TEST_F(Protocol, DeviceDeathReachesAJobWithItsReasonWhenTheNoticeComesFirst) {
  start(1, 2);
  auto g = std::make_shared<const ag::graph>(pinned_mlp(0, 6));
  auto p = core->compile(g, {}).value();
  sched->run();  // the device actor registers the plan: the fault notice is its next message
  auto j = core->submit(p, inputs_for(*g, 1));
  ASSERT_TRUE(run_until([&] { return j.state() == ag::job_state::running; }));
  caf::actor job_actor;
  {
    auto& ss = *ag::actors::job_access::state(j);
    std::lock_guard<std::mutex> lk(ss.m);
    job_actor = ss.actor;
  }
  ASSERT_TRUE(job_actor);
  devs[0]->kill("pulled the plug");
  // The notice overtakes the job's steps: device actor, runtime actor, job.
  ASSERT_TRUE(run_next_of(core->device_actor(0)));
  ASSERT_TRUE(run_next_of(core->runtime_actor()));
  ASSERT_TRUE(run_next_of(job_actor));  // fail_job: the job cancels its queues
  sched->run();
  expect_death_of_fake0(j);
  EXPECT_EQ(devs[0]->launches, 0) << "a step ran although the job failed before it";
  EXPECT_EQ(core->jobs_in_flight(), 0);
}

// Compute lanes of one device share one executing actor by default
// (runtime_options::actor_per_lane = false): a step that feeds another lane of
// its device sends no ready message. The same 3-lane plan on one device runs
// with fewer messages than with an actor per lane, both match the reference,
// and no executing actor keeps job state.
/// A Protocol harness usable inside one test body (two runtimes in one test).
struct LaneRun : Protocol {
  void TestBody() override {}
};

int messages_for_one_job(LaneRun& t, bool actor_per_lane) {
  t.actor_per_lane = actor_per_lane;
  t.start(1, 2);
  auto g = std::make_shared<const ag::graph>(ag::test::random_dag({.seed = 5, .ops = 40}).value());
  ag::plan_options po;
  po.lanes_per_device = 3;
  po.min_branch_seconds = 0;
  po.fold_lanes = false;  // a queue per lane, joined by events and ready messages: what this test counts
  auto p = t.core->compile(g, po);
  EXPECT_TRUE(p.has_value()) << p.err().to_string();
  if (!p) return -1;
  auto lp = ag::actors::runtime_core::loaded(*p);
  const auto& prog = *lp->program;
  int cross_lane = 0;  // ready batches a lane-to-lane message would carry
  for (const auto& ls : prog.steps())
    for (int q : ls.consumer_queues)
      cross_lane += prog.queues()[static_cast<std::size_t>(ls.queue)].kind == ag::step_kind::compute &&
                    prog.queues()[static_cast<std::size_t>(q)].kind == ag::step_kind::compute;
  EXPECT_GT(cross_lane, 0) << "the plan has no step feeding another lane: " << (*p)->describe();
  auto in = inputs_for(*g, 7);
  t.sched->run();
  auto j = t.core->submit(*p, in);
  int n = 0;
  while (t.sched->try_run_once()) ++n;
  expect_reference(*g, in, j);
  {
    caf::scoped_actor self{*t.sys};  // gone before TearDown: the system waits for it
    for (const auto& a : t.core->exec_actors()) {
      self->send(a, ag::msg::stats_atom::value);
      t.sched->run();
      self->receive([&](int64_t held) { EXPECT_EQ(held, 0) << "an executing actor still holds job state"; },
                    caf::after(std::chrono::seconds(1)) >> [] { ADD_FAILURE() << "no answer"; });
    }
  }
  t.TearDown();
  return n;
}

TEST(LaneActors, OneActorPerDeviceSendsNoReadyBetweenItsLanes) {
  LaneRun per_lane, shared;
  const int with_actor_per_lane = messages_for_one_job(per_lane, true);
  const int with_one_actor = messages_for_one_job(shared, false);
  ASSERT_GT(with_actor_per_lane, 0);
  ASSERT_GT(with_one_actor, 0);
  EXPECT_LT(with_one_actor, with_actor_per_lane) << "sharing one actor per device saved no message";
  std::printf("messages for one 3-lane job: %d with an actor per lane, %d with one actor per device\n",
              with_actor_per_lane, with_one_actor);
}

}  // namespace

namespace {

/// Runs one pending message chosen by `r` (any actor's), so that messages
/// arrive in orders a FIFO scheduler would not produce. False when none is pending.
bool run_random_once(caf::scheduler::test_coordinator& sched, ag::rng& r) {
  if (sched.jobs.empty()) return false;
  const auto k = static_cast<std::size_t>(r.next() % sched.jobs.size());
  std::swap(sched.jobs[0], sched.jobs[k]);
  return sched.try_run_once();
}

}  // namespace

// NCCL's rule: every member issues one communicator's collectives in the
// same order. Jobs of a tensor-parallel plan run concurrently; under random
// message orders (any pending actor runs next) they start in different
// orders, and on both members the communication queues issue the
// collectives in the agreed order: by job number, drawn when a job starts
// running (all arenas held). Every result equals the reference.
TEST_F(Protocol, CollectivesIssueInOneAgreedOrderOnEveryMemberAcrossConcurrentJobs) {
  start(2, 4);
  auto g = up_act_down();
  auto p = core->compile(g, tensor_degree_2());
  ASSERT_TRUE(p.has_value()) << p.err().to_string();
  int parts = 0;
  for (const auto& s : (*p)->steps()) parts += s.kind == ag::step_kind::collective;
  ASSERT_EQ(parts, 2) << "one all-reduce per job, a part per device";
  int reordered = 0;
  for (uint64_t seed = 1; seed <= 40; ++seed) {
    SCOPED_TRACE("seed " + std::to_string(seed));
    for (auto& d : devs) d->collectives.clear();
    ag::rng r(seed);
    std::vector<std::vector<ag::host_tensor>> ins;
    std::vector<ag::job> jobs;
    for (int k = 0; k < 4; ++k) {
      ins.push_back(inputs_for(*g, seed * 10 + static_cast<uint64_t>(k)));
      jobs.push_back(core->submit(*p, ins.back()));
    }
    while (run_random_once(*sched, r)) {
    }
    std::vector<std::pair<int64_t, double>> started;  // (start time, the job's all-reduce checksum)
    for (int k = 0; k < 4; ++k) {
      expect_reference(*g, ins[static_cast<std::size_t>(k)], jobs[static_cast<std::size_t>(k)]);
      // The job's all-reduce result, summed, identifies it on both members.
      const auto& out = jobs[static_cast<std::size_t>(k)].wait()->front();
      double sum = 0;
      for (int64_t i = 0; i < out.numel(); ++i) sum += out.at(i);
      started.push_back({jobs[static_cast<std::size_t>(k)].times().started_ns, sum});
    }
    std::vector<double> order[2];
    for (int d = 0; d < 2; ++d)
      for (const auto& c : devs[static_cast<std::size_t>(d)]->collectives) order[d].push_back(c.checksum);
    ASSERT_EQ(order[0].size(), 4u);
    EXPECT_EQ(order[0], order[1]) << "members issued the collectives in different orders";
    // The agreed order is the order in which the jobs started running.
    std::vector<std::pair<int64_t, double>> by_start = started;
    std::stable_sort(by_start.begin(), by_start.end(), [](auto& a, auto& c) { return a.first < c.first; });
    reordered += by_start != started;
    ASSERT_EQ(by_start.size(), order[0].size());
    for (std::size_t k = 0; k < by_start.size(); ++k)
      EXPECT_NEAR(order[0][k], by_start[k].second, 1e-3 * std::max(1.0, std::abs(by_start[k].second))) << "position " << k;
  }
  // The random schedules did start jobs out of submission order.
  EXPECT_GT(reordered, 0);
}

// A collective part whose backend pairs the members on the device
// (gpu::device::collective_syncs_members, as NCCL's kernels do) leaves out
// exactly the waits for deps another member's part orders before it joins
// (collective_desc::peer_ordered_deps), and keeps every other wait; the
// results still equal the reference.
TEST_F(Protocol, PairedCollectivePartsSkipOnlyTheWaitsAnotherMembersPartOrders) {
  start(2, 2);
  auto g = up_act_down();
  auto p = core->compile(g, tensor_degree_2());
  ASSERT_TRUE(p.has_value()) << p.err().to_string();
  auto prog = ag::actors::lower(*p);
  ASSERT_TRUE(prog.has_value()) << prog.err().to_string();
  int64_t skippable = 0;
  for (const auto& s : (*p)->steps())
    if (s.kind == ag::step_kind::collective) skippable += static_cast<int64_t>((*prog)->step(s.id).coll.peer_ordered_deps.size());
  ASSERT_GT(skippable, 0) << "each part waits for the other member's operand producer";
  int64_t waits[2] = {0, 0};
  for (bool paired : {false, true}) {
    SCOPED_TRACE(paired ? "paired on the device" : "ordered by events");
    for (auto& d : devs) {
      d->pairs_collectives = paired;
      d->collective_stream_waits = 0;
    }
    const auto in = inputs_for(*g, paired ? 11 : 7);
    const ag::job j = core->submit(*p, in);
    sched->run();
    expect_reference(*g, in, j);
    for (auto& d : devs) waits[paired] += d->collective_stream_waits;
  }
  EXPECT_EQ(waits[0] - waits[1], skippable) << "event-ordered " << waits[0] << " waits, paired " << waits[1];
}

// Two collectives per job: a job's second collective needs its first's
// result, so under random schedules a later job's first collective becomes
// ready before an earlier job's second, and the order parks it: each member
// issues job by job, in start order. With the order off (the test hook) the
// jobs' collectives interleave (A1 B1 A2 ...), which the check below sees, so
// this test fails without the order. (Members still agree here: on the
// coordinator each `ready` goes to every member in one handler, so their
// mailboxes see one sequence; crossed orders, which need two threads, are
// tested on the order itself in test_collective_order.cpp.)
TEST_F(Protocol, LaterJobsCollectivesWaitTheirTurnSoEachMemberIssuesJobByJob) {
  start(2, 4);
  ag::graph_builder b;
  auto x = b.input("x", ag::dtype::f32, {4, 8});
  auto h = x;
  for (int l = 0; l < 2; ++l) {
    const auto s = static_cast<uint64_t>(10 * l);
    auto w1 = b.weight("w1_" + std::to_string(l), ag::host_tensor::random_normal(ag::dtype::f32, {8, 16}, s + 1, 0.3f));
    auto w2 = b.weight("w2_" + std::to_string(l), ag::host_tensor::random_normal(ag::dtype::f32, {16, 8}, s + 2, 0.3f));
    h = b.matmul(b.gelu(b.matmul(h, w1, false, false, "up" + std::to_string(l)), ag::gelu_mode::tanh,
                        "act" + std::to_string(l)),
                 w2, false, false, "down" + std::to_string(l));
  }
  b.output(h);
  auto g = std::make_shared<const ag::graph>(std::move(b).build().value());
  ag::plan_options o;
  o.tensor_parallel = 2;
  o.tp_overlap = false;
  struct restore_hook {
    ~restore_hook() { ag::actors::collective_order_enforced_for_testing() = true; }
  } restore;
  // Seeds where some member did not issue job by job in start order.
  auto interleaved = [&](bool enforce) {
    ag::actors::collective_order_enforced_for_testing() = enforce;
    auto p = core->compile(g, o);  // every line follows the hook while it is set
    EXPECT_TRUE(p.has_value()) << p.err().to_string();
    if (!p) return -1;
    int parts = 0;
    for (const auto& s : (*p)->steps()) parts += s.kind == ag::step_kind::collective;
    EXPECT_EQ(parts, 4) << "two all-reduces per job, a part per device";
    int count = 0;
    for (uint64_t seed = 1; seed <= 30; ++seed) {
      SCOPED_TRACE("seed " + std::to_string(seed) + (enforce ? " (order on)" : " (order off)"));
      for (auto& d : devs) d->collectives.clear();
      ag::rng r(seed);
      std::vector<std::vector<ag::host_tensor>> ins;
      std::vector<ag::job> jobs;
      for (int k = 0; k < 4; ++k) {
        ins.push_back(inputs_for(*g, seed * 10 + static_cast<uint64_t>(k)));
        jobs.push_back(core->submit(*p, ins.back()));
      }
      while (run_random_once(*sched, r)) {
      }
      // The second all-reduce's result is the job's output: its checksum
      // names the job (jobs by start time).
      std::vector<std::pair<int64_t, double>> started;
      for (int k = 0; k < 4; ++k) {
        expect_reference(*g, ins[static_cast<std::size_t>(k)], jobs[static_cast<std::size_t>(k)]);
        const auto& out = jobs[static_cast<std::size_t>(k)].wait()->front();
        double sum = 0;
        for (int64_t i = 0; i < out.numel(); ++i) sum += out.at(i);
        started.push_back({jobs[static_cast<std::size_t>(k)].times().started_ns, sum});
      }
      std::stable_sort(started.begin(), started.end(), [](auto& a, auto& c) { return a.first < c.first; });
      auto same = [](double a, double c) { return std::abs(a - c) <= 1e-3 * std::max(1.0, std::abs(c)); };
      bool job_by_job = true;
      for (int d = 0; d < 2; ++d) {
        const auto& log = devs[static_cast<std::size_t>(d)]->collectives;
        EXPECT_EQ(log.size(), 8u);
        // Job by job: the k-th job's second collective is the (2k+1)-th issued.
        for (std::size_t k = 0; k < 4 && 2 * k + 1 < log.size(); ++k)
          job_by_job = job_by_job && same(log[2 * k + 1].checksum, started[k].second);
      }
      count += !job_by_job;
    }
    return count;
  };
  EXPECT_EQ(interleaved(true), 0);
  EXPECT_GT(interleaved(false), 0) << "the schedules never interleaved jobs: this test could not catch a missing order";
}

// Every queue of a plan with collectives issues the plan's jobs one after
// another in the agreed order (launch_queue::in_job_order), not only the
// communication queues. At degree 4 device 0 gathers the logits from the
// other three by peer copies, one step of its peer queue per member, each
// made ready by that member: under random schedules a later job's first
// copy becomes ready before an earlier job's last. A stream that took it
// first would hold that job's wait (for a member whose collective parts wait
// for device 0's) in front of the earlier job's copies, which device 0's
// next parts wait for: on 4 H100s with in-stream all-reduces the jobs then
// waited for each other on the GPUs until the parts timed out. With the
// order off (the test hook) the copies interleave, so this test fails
// without it.
TEST_F(Protocol, EveryQueueOfAPlanWithCollectivesIssuesJobByJob) {
  start(4, 4);
  ag::models::transformer_config cfg;
  cfg.n_layers = 2;
  cfg.d_model = 64;
  cfg.n_heads = 8;
  cfg.vocab = 101;
  cfg.seq_len = 8;
  cfg.batch = 1;
  auto g = std::make_shared<const ag::graph>(ag::models::build_transformer(cfg).value());
  ag::plan_options o;
  o.tensor_parallel = 4;
  struct restore_hook {
    ~restore_hook() { ag::actors::collective_order_enforced_for_testing() = true; }
  } restore;
  // Seeds where device 0's peer copies were not job by job in start order.
  auto interleaved = [&](bool enforce) {
    ag::actors::collective_order_enforced_for_testing() = enforce;
    auto p = core->compile(g, o);  // every line follows the hook while it is set
    EXPECT_TRUE(p.has_value()) << p.err().to_string();
    if (!p) return -1;
    int gathers = 0;
    for (const auto& s : (*p)->steps()) gathers += s.kind == ag::step_kind::copy_peer && s.device == 0;
    EXPECT_EQ(gathers, 3) << "device 0 gathers the logits of the other three members";
    int count = 0;
    for (uint64_t seed = 1; seed <= 30; ++seed) {
      SCOPED_TRACE("seed " + std::to_string(seed) + (enforce ? " (order on)" : " (order off)"));
      for (auto& d : devs) d->peer_copies.clear();
      ag::rng r(seed);
      std::vector<std::vector<ag::host_tensor>> ins;
      std::vector<ag::job> jobs;
      for (int k = 0; k < 4; ++k) {
        ins.push_back(ag::models::transformer_inputs(cfg, seed * 10 + static_cast<uint64_t>(k)));
        jobs.push_back(core->submit(*p, ins.back()));
      }
      while (run_random_once(*sched, r)) {
      }
      // Jobs by start time; a copy belongs to the job whose logits hold its
      // last floats (a member's block of the last position's logits, which
      // depend on every token: the first position's depend on one).
      std::vector<std::pair<int64_t, int>> started;
      for (int k = 0; k < 4; ++k) {
        expect_reference(*g, ins[static_cast<std::size_t>(k)], jobs[static_cast<std::size_t>(k)]);
        started.push_back({jobs[static_cast<std::size_t>(k)].times().started_ns, k});
      }
      std::stable_sort(started.begin(), started.end());
      std::vector<int> rank_of(4);
      for (int i = 0; i < 4; ++i) rank_of[static_cast<std::size_t>(started[static_cast<std::size_t>(i)].second)] = i;
      const auto job_of_copy = [&](const std::vector<float>& tail) {
        for (int k = 0; k < 4; ++k) {
          const auto& out = jobs[static_cast<std::size_t>(k)].wait()->front();
          const auto* f = reinterpret_cast<const float*>(out.data());
          for (int64_t i = 0; i + static_cast<int64_t>(tail.size()) <= out.numel(); ++i)
            if (std::equal(tail.begin(), tail.end(), f + i)) return k;
        }
        return -1;
      };
      const auto& log = devs[0]->peer_copies;
      EXPECT_EQ(log.size(), 12u);
      int last = 0;
      bool job_by_job = true;
      for (const auto& c : log) {
        const int k = job_of_copy(c.tail);
        EXPECT_GE(k, 0) << "a peer copy whose data is in no job's logits";
        if (k < 0) continue;
        job_by_job = job_by_job && rank_of[static_cast<std::size_t>(k)] >= last;
        last = std::max(last, rank_of[static_cast<std::size_t>(k)]);
      }
      count += !job_by_job;
    }
    return count;
  };
  EXPECT_EQ(interleaved(true), 0);
  EXPECT_GT(interleaved(false), 0) << "the schedules never interleaved jobs: this test could not catch a missing order";
}
