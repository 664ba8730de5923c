// The lowering (actors/launch_program.hpp), without actors: random plans
// lower into consistent tables; plans whose queue order would deadlock, or
// that name what does not exist, are refused with the step, queue and
// device named in the error's fields.
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <map>
#include <set>

#include "../graph/plan_test_util.hpp"
#include "../graph/random_dag.hpp"
#include "actors/launch_program.hpp"
#include "graph/models/transformer.hpp"
#include "graph/plan.hpp"
#include "graph/replay.hpp"

namespace {

using namespace ag;
using actors::launch_program;
using actors::lower;
using actors::collective_desc;
using actors::launch_queue;
using actors::lowered_step;

std::vector<device_spec> sims(int n) {
  std::vector<device_spec> v(static_cast<std::size_t>(n));
  for (int i = 0; i < n; ++i) {
    v[static_cast<std::size_t>(i)].name = "sim" + std::to_string(i);
    v[static_cast<std::size_t>(i)].max_lanes = 4;
  }
  return v;
}

std::shared_ptr<const plan> random_plan(uint64_t seed, int devices, int lanes,
                                        graph_replay_mode replay = graph_replay_mode::off, bool fold_lanes = true) {
  auto g = test::random_dag({.seed = seed, .ops = 12 + static_cast<int>(seed % 30)});
  EXPECT_TRUE(g.has_value()) << g.err().to_string();
  plan_options o;
  o.lanes_per_device = lanes;
  o.min_branch_seconds = 0;
  o.graph_replay = replay;
  o.fold_lanes = fold_lanes;
  auto p = compile(std::make_shared<const graph>(std::move(*g)), sims(devices), o);
  EXPECT_TRUE(p.has_value()) << p.err().to_string();
  return *p;
}

/// Every table of `prog` agrees with its plan.
void expect_consistent(const launch_program& prog) {
  const plan& p = prog.source();
  ASSERT_EQ(prog.steps().size(), p.steps().size());
  std::set<step_id> seen;
  std::set<std::tuple<int, step_kind, int>> keys;
  const bool collectives =
      std::any_of(p.steps().begin(), p.steps().end(), [](const step& s) { return s.kind == step_kind::collective; });
  for (std::size_t q = 0; q < prog.queues().size(); ++q) {
    const auto& lq = prog.queues()[q];
    // Every queue of a plan with collectives issues jobs in the agreed order.
    EXPECT_EQ(lq.in_job_order, collectives) << "queue " << q;
    EXPECT_TRUE(keys.insert({lq.device, lq.kind, lq.lane}).second) << "two queues for one (device, kind, lane)";
    EXPECT_EQ(prog.find_queue(lq.device, lq.kind, lq.lane), static_cast<int>(q));
    ASSERT_EQ(lq.remote_dep_counts.size(), lq.steps.size());
    int records = 0;
    // A folded queue (launch_program::folded_lanes) holds its device's lanes:
    // each keeps its own order in it (the previous step of the same lane).
    const bool folded = lq.kind == step_kind::compute && prog.folded_lanes(lq.device) > 0;
    std::map<int, step_id> previous_on_lane;
    for (std::size_t i = 0; i < lq.steps.size(); ++i) {
      const step_id s = lq.steps[i];
      EXPECT_TRUE(seen.insert(s).second) << "step " << s << " is in two queues";
      const auto& ls = prog.step(s);
      const step& ps = p.at(s);
      EXPECT_EQ(ls.queue, static_cast<int>(q));
      EXPECT_EQ(ls.pos, static_cast<int>(i));
      EXPECT_EQ(ls.kind, ps.kind);
      EXPECT_EQ(lq.device, ps.device);
      // In-stream collective parts and inlined copies run on compute lanes (plan.hpp, step).
      EXPECT_EQ(lq.kind, on_compute_lane(ps) ? step_kind::compute : ps.kind);
      if (on_compute_lane(ps)) { EXPECT_EQ(folded ? ls.capture_lane : lq.lane, ps.lane); }
      if (folded) { EXPECT_EQ(lq.lane, 0); }
      if (runs_in_stream(ps)) { EXPECT_TRUE(lq.in_stream_parts); }
      const int lane = folded ? ps.lane : 0;
      if (previous_on_lane.count(lane)) {
        EXPECT_LT(p.at(previous_on_lane[lane]).lane_seq, ps.lane_seq) << "queue " << q << " out of lane order";
      }
      previous_on_lane[lane] = s;
      EXPECT_EQ(lq.remote_dep_counts[i], static_cast<int>(ls.remote_deps.size()));
      EXPECT_EQ(ls.first_launch, records);
      records += static_cast<int>(ls.ops.size());
    }
    EXPECT_EQ(lq.launch_records, records);
    EXPECT_EQ(lq.starts_itself, lq.steps.empty() || lq.remote_dep_counts.front() == 0);
    // The launch records follow the steps' ops, prototypes filled, pointers not.
    const auto recs = prog.launch_records(static_cast<int>(q));
    ASSERT_EQ(static_cast<int>(recs.size()), records);
    for (step_id s : lq.steps) {
      const auto& ls = prog.step(s);
      for (std::size_t k = 0; k < ls.ops.size(); ++k) {
        const auto& r = recs[static_cast<std::size_t>(ls.first_launch) + k];
        EXPECT_EQ(r.op, ls.ops[k].op);
        EXPECT_EQ(r.source, &p.source());
        EXPECT_EQ(r.out.data, nullptr);
        EXPECT_EQ(r.out.dims, ls.ops[k].out.proto.dims);
        ASSERT_EQ(r.inputs.size(), ls.ops[k].inputs.size());
        for (const auto& in : r.inputs) EXPECT_EQ(in.data, nullptr);
      }
    }
  }
  EXPECT_EQ(seen.size(), p.steps().size()) << "a step is in no queue";
  std::set<step_id> completion(prog.completion_steps().begin(), prog.completion_steps().end());
  for (const auto& ps : p.steps()) {
    const auto& ls = prog.step(ps.id);
    std::set<step_id> remote;
    const auto waited = waited_deps(p);
    const auto& mine = waited[static_cast<std::size_t>(ps.id)];
    for (step_id d : mine)
      if (prog.step(d).queue != ls.queue) remote.insert(d);
    // A dep left out is met on the devices or waited for earlier on the lane.
    for (step_id d : ps.deps)
      if (std::find(mine.begin(), mine.end(), d) == mine.end()) {
        bool earlier = met_on_device(p, ps, d);
        for (step_id y : prog.queue(ls.queue).steps) {
          if (prog.step(y).pos >= ls.pos) break;
          const auto& wy = waited[static_cast<std::size_t>(y)];
          earlier = earlier || std::find(wy.begin(), wy.end(), d) != wy.end();
        }
        EXPECT_TRUE(earlier) << "step " << ps.id << " leaves dep " << d << " to nobody";
      }
    EXPECT_EQ(std::set<step_id>(ls.remote_deps.begin(), ls.remote_deps.end()), remote) << "step " << ps.id;
    std::set<int> cq;
    std::set<std::pair<int, int>> cpos;
    for (step_id c : ps.consumers)
      if (prog.step(c).queue != ls.queue && waits_for(waited, c, ps.id)) {
        cq.insert(prog.step(c).queue);
        cpos.insert({prog.step(c).queue, prog.step(c).pos});
      }
    EXPECT_EQ(std::set<int>(ls.consumer_queues.begin(), ls.consumer_queues.end()), cq) << "step " << ps.id;
    EXPECT_EQ(ls.consumer_queues.size(), cq.size()) << "step " << ps.id << " lists a consumer queue twice";
    std::set<std::pair<int, int>> got;
    for (const auto& qp : ls.remote_consumers) got.insert({qp.queue, qp.pos});
    EXPECT_EQ(got, cpos) << "step " << ps.id;
    // A step whose ops can fail on their values (a lookup's ids) also
    // reports completion, so that the job sees the error.
    const bool sink = ps.kind == step_kind::copy_d2h || ps.consumers.empty() || may_fail_on_values(p, ps);
    EXPECT_EQ(ls.completion, sink) << "step " << ps.id;
    EXPECT_EQ(completion.count(ps.id) == 1, sink) << "step " << ps.id;
    // A tensor-parallel decode step (plan_options::fuse_tp_decode_step): a
    // rank's record sits in a compute step that sets the job's tag, and the
    // steps it absorbed stay where they were, on its device, with nothing to
    // launch: its later compute steps and in-stream parts on its queue, its
    // part of the logits' all-gather on the communication queue.
    const bool tp_record = ls.ops.size() == 1 && ls.ops[0].fused == gpu::op_launch::fusion::decode_step &&
                           ls.ops[0].decode_step.tp_degree > 1;
    EXPECT_EQ(ls.job_tag, tp_record) << "step " << ps.id;
    if (ls.absorbed_into >= 0) {
      EXPECT_TRUE(ls.ops.empty()) << "step " << ps.id;
      const auto& into = prog.step(ls.absorbed_into);
      EXPECT_EQ(into.device, ls.device) << "step " << ps.id;
      EXPECT_TRUE(into.job_tag) << "step " << ps.id;
      EXPECT_EQ(into.absorbed_into, -1);
      if (on_compute_lane(ps)) {
        EXPECT_EQ(into.queue, ls.queue) << "step " << ps.id;
        EXPECT_LT(into.pos, ls.pos) << "step " << ps.id << " comes before the record that does its work";
      } else {
        EXPECT_EQ(ps.kind, step_kind::collective) << "step " << ps.id;
      }
    }
    if (ps.kind == step_kind::compute) {
      for (const auto& op : ls.ops) {
        EXPECT_FALSE(is_view_op(op.op->op) || is_leaf_op(op.op->op)) << op.op->name;
        // A rank's decode-step record stands at its last op, which may lie
        // in a step it absorbed.
        int holders = 0;
        for (const step& y : p.steps())
          if (y.id == ps.id || (tp_record && prog.step(y.id).absorbed_into == ps.id))
            holders += static_cast<int>(std::count(y.ops.begin(), y.ops.end(), op.op->id));
        EXPECT_EQ(holders, 1) << op.op->name;
        // A fused record lists the fusion's operands (gpu::op_launch::fusion).
        if (op.fused == gpu::op_launch::fusion::none) EXPECT_EQ(op.inputs.size(), op.op->inputs.size());
        else if (op.fused == gpu::op_launch::fusion::attention)
          EXPECT_EQ(op.inputs.size(), (op.attention.masked ? 4u : 3u) +
                                          (op.attention.store_new_rows
                                               ? (op.attention.rope_q || op.attention.rope_k ? 4u : 3u)
                                               : 0u));
        else if (op.fused == gpu::op_launch::fusion::decode_step) {
          const auto& ds = op.decode_step;
          EXPECT_EQ(ls.ops.size(), 1u) << "a decode-step record is its step's only one";
          EXPECT_EQ(op.inputs.size(), 6u + (ds.final_norm_weighted ? 1u : 0u) +
                                          static_cast<std::size_t>(ds.layers) *
                                              (gpu::op_launch::decode_step_layer_inputs + (ds.norm_weighted ? 2u : 0u) +
                                               (ds.qkv_bias ? 3u : 0u) + (ds.qk_norm ? 2u : 0u)));
          EXPECT_EQ(op.inputs.size(), ds.operands());
        } else EXPECT_GE(op.inputs.size(), 3u) << "x and at least two weights, or x, a weight and the residual";
        if (op.fused != gpu::op_launch::fusion::projections) { EXPECT_TRUE(op.extra_outs.empty()) << op.op->name; }
      }
    } else if (runs_in_stream(ps) && ls.absorbed_into < 0) {
      ASSERT_EQ(ls.ops.size(), 1u) << "an in-stream part is one launch record";
      EXPECT_EQ(ls.ops[0].op, ls.subject);
      EXPECT_EQ(ls.ops[0].collective.rank, ls.coll.rank);
      EXPECT_EQ(ls.ops[0].collective.members, static_cast<int>(ps.peers.size()));
      EXPECT_EQ(ls.ops[0].collective.key, static_cast<uint32_t>(*std::min_element(ps.peers.begin(), ps.peers.end())));
      ASSERT_EQ(ls.ops[0].inputs.size(), ps.peers.size());
      for (std::size_t k = 0; k < ps.peers.size(); ++k) {
        EXPECT_EQ(ls.ops[0].inputs[k].device, p.at(ps.peers[k]).device);
        EXPECT_EQ(ls.ops[0].inputs[k].byte_offset, ls.coll.inputs[k].byte_offset);
      }
    } else if (ps.kind == step_kind::collective) {
      EXPECT_TRUE(ls.ops.empty());
    } else {
      EXPECT_TRUE(ls.ops.empty());
      EXPECT_EQ(ls.copy.io_index, ps.io_index);
      EXPECT_GT(ls.copy.bytes, 0);
      EXPECT_EQ(ls.copy.src_device, ps.kind == step_kind::copy_peer ? ps.src_device : ps.device);
      ASSERT_NE(ls.subject, nullptr);
      EXPECT_EQ(ls.label, ls.subject->name);
    }
  }
  EXPECT_TRUE(std::is_sorted(prog.used_devices().begin(), prog.used_devices().end()));
}

TEST(LaunchProgram, RandomPlansLowerIntoConsistentTables) {
  int multi_queue_devices = 0, cross_queue = 0;
  for (uint64_t seed = 1; seed <= 60; ++seed) {
    auto p = random_plan(seed, 1 + static_cast<int>(seed % 4), 1 + static_cast<int>(seed % 3));
    ASSERT_TRUE(p);
    auto prog = lower(p);
    ASSERT_TRUE(prog.has_value()) << "seed " << seed << ": " << prog.err().to_string();
    expect_consistent(**prog);
    EXPECT_FALSE(actors::check_launch_order(*p, (*prog)->queues())) << "seed " << seed;
    std::map<int, int> compute_queues;
    for (const auto& q : (*prog)->queues()) compute_queues[q.device] += q.kind == step_kind::compute;
    for (const auto& [d, n] : compute_queues) multi_queue_devices += n > 1;
    for (const auto& s : (*prog)->steps()) cross_queue += !s.remote_deps.empty();
  }
  EXPECT_GT(multi_queue_devices, 0) << "no plan used two lanes of a device";
  EXPECT_GT(cross_queue, 0);
}

// plan_options::host_windows_in_place: a small input read only by
// elementwise kernels of its segment is read by them in the arena's host
// window (the copy moves nothing), and an output written by one and read by
// no other kernel is written there; a matmul reading the input, or writing
// the output, keeps the copy; off, every copy moves its bytes.
TEST(LaunchProgram, SmallTensorsReadOrWrittenElementwiseStayInTheHostWindow) {
  const auto build = [](bool matmul) {
    graph_builder b;
    auto x = b.input("x", dtype::f32, {16, 16});
    auto w = b.weight("w", host_tensor::random_normal(dtype::f32, {16, 16}, 3, 1.0f));
    auto y = matmul ? b.matmul(x, w, false, false, "y") : b.add(x, w, "y");
    b.output(b.gelu(y, gelu_mode::tanh, "z"));
    return std::make_shared<const graph>(std::move(b).build().value());
  };
  const auto copies = [](const launch_program& prog) {
    std::vector<const lowered_step*> v;
    for (const auto& ls : prog.steps())
      if (ls.kind == step_kind::copy_h2d || ls.kind == step_kind::copy_d2h) v.push_back(&ls);
    return v;
  };
  plan_options o;
  o.graph_replay = graph_replay_mode::on;
  {
    auto prog = lower(test_util::must_compile(build(false), sims(1), o)).value();
    const auto cs = copies(*prog);
    ASSERT_EQ(cs.size(), 2u);
    int in_window = 0;
    for (const auto& ls : prog->steps())
      for (const auto& op : ls.ops) {
        for (const auto& a : op.inputs) in_window += a.in_window;
        in_window += op.out.in_window;
        if (op.op->name == "y") {
          EXPECT_TRUE(op.inputs[0].in_window) << "add reads x in the window";
          EXPECT_FALSE(op.inputs[1].in_window) << "the weight stays where it is";
          EXPECT_FALSE(op.out.in_window);
        }
        if (op.op->name == "z") {
          EXPECT_TRUE(op.out.in_window) << "gelu writes the output in the window";
        }
      }
    EXPECT_EQ(in_window, 2);
    for (const lowered_step* c : cs) {
      EXPECT_TRUE(c->copy.in_place) << c->label;
      EXPECT_GE(c->copy.window_offset, 0);
    }
    expect_consistent(*prog);
  }
  {
    // A matmul reads x: its copy moves; gelu still writes the output in place.
    auto prog = lower(test_util::must_compile(build(true), sims(1), o)).value();
    for (const lowered_step* c : copies(*prog))
      EXPECT_EQ(c->copy.in_place, c->kind == step_kind::copy_d2h) << c->label;
  }
  {
    plan_options off = o;
    off.host_windows_in_place = false;
    auto prog = lower(test_util::must_compile(build(false), sims(1), off)).value();
    for (const lowered_step* c : copies(*prog)) {
      EXPECT_FALSE(c->copy.in_place) << c->label;
      EXPECT_GE(c->copy.window_offset, 0) << "still through the window, as a copy";
    }
    for (const auto& ls : prog->steps())
      for (const auto& op : ls.ops) EXPECT_FALSE(op.out.in_window);
  }
}

// Graph replay on: the first step of every replay segment (one kernel or
// host copy is enough) on a non-cpu device carries the segment (its
// steps, consecutive in one queue; their launch records; its kernels),
// every other step nothing; off: no step does. The host copies of a marked
// segment, and only they, have disjoint places in their device's host
// window. Launch records never claim a paid launch (only a backend's
// captured copies do). Lanes unfolded (plan_options::fold_lanes off): the
// segments are graph/replay.hpp's, one lane each (folded ones: next test).
TEST(LaunchProgram, ReplaySegmentsAreMarkedOnTheirFirstStep) {
  int marked_total = 0, windowed_total = 0;
  for (uint64_t seed = 1; seed <= 20; ++seed) {
    const int devices = 1 + static_cast<int>(seed % 3), lanes = 1 + static_cast<int>(seed % 2);
    for (graph_replay_mode mode : {graph_replay_mode::off, graph_replay_mode::on}) {
      auto p = random_plan(seed, devices, lanes, mode, /*fold_lanes=*/false);
      auto prog = lower(p).value();
      for (std::size_t q = 0; q < prog->queues().size(); ++q)
        for (const auto& l : prog->launch_records(static_cast<int>(q))) EXPECT_FALSE(l.launch_paid_by_replay);
      std::vector<int> marked_steps(prog->steps().size(), 0);
      for (const auto& seg : replay_segments(*p)) {
        const auto& first = prog->step(seg.steps.front());
        if (mode == graph_replay_mode::off || seg.launches() < 1) {
          EXPECT_EQ(first.replay_steps, 0) << "seed " << seed;
          for (step_id s : seg.steps) EXPECT_EQ(prog->step(s).copy.window_offset, -1) << "seed " << seed;
          continue;
        }
        ++marked_total;
        ASSERT_EQ(first.replay_steps, static_cast<int>(seg.steps.size())) << "seed " << seed;
        EXPECT_EQ(first.replay_kernels, seg.kernels) << "seed " << seed;
        int records = 0;
        for (std::size_t i = 0; i < seg.steps.size(); ++i) {
          const auto& ls = prog->step(seg.steps[i]);
          ++marked_steps[static_cast<std::size_t>(ls.id)];
          EXPECT_EQ(ls.queue, first.queue) << "seed " << seed;
          EXPECT_EQ(ls.pos, first.pos + static_cast<int>(i)) << "seed " << seed;
          EXPECT_EQ(ls.first_launch, first.first_launch + records) << "seed " << seed;
          if (i > 0) {
            EXPECT_TRUE(ls.remote_deps.empty()) << "seed " << seed << ": a segment step inside waits on another queue";
            EXPECT_EQ(ls.replay_steps, 0) << "seed " << seed;
          }
          if (i + 1 < seg.steps.size()) {
            EXPECT_TRUE(ls.consumer_queues.empty()) << "seed " << seed << ": a segment step inside feeds another queue";
          }
          records += static_cast<int>(ls.ops.size());
          // A host copy of the segment has its own place in the device's
          // host window; nothing else has one.
          const bool host_copy = ls.kind == step_kind::copy_h2d || ls.kind == step_kind::copy_d2h;
          EXPECT_EQ(ls.copy.window_offset >= 0, host_copy) << "seed " << seed << " step " << ls.id;
          if (host_copy) {
            ++windowed_total;
            EXPECT_LE(ls.copy.window_offset + ls.copy.bytes, prog->window_bytes(ls.device)) << "seed " << seed;
            for (step_id o : seg.steps)
              if (o != ls.id && prog->step(o).copy.window_offset >= 0) {
                const auto& oc = prog->step(o).copy;
                EXPECT_TRUE(oc.window_offset >= ls.copy.window_offset + ls.copy.bytes ||
                            ls.copy.window_offset >= oc.window_offset + oc.bytes)
                    << "seed " << seed << ": host copies " << ls.id << " and " << o << " overlap in the window";
              }
          }
        }
        EXPECT_EQ(first.replay_records, records) << "seed " << seed;
      }
      for (const auto& ls : prog->steps())
        if (ls.replay_steps > 0) { EXPECT_EQ(marked_steps[static_cast<std::size_t>(ls.id)], 1) << "seed " << seed; }
    }
  }
  EXPECT_GT(marked_total, 0) << "no random plan had a replay segment of two kernels";
  EXPECT_GT(windowed_total, 0) << "no random plan had a host copy inside a replay segment";
}

TEST(LaunchProgram, LaunchRecordsAreTheCallersCopy) {
  auto p = random_plan(3, 1, 1);
  auto prog = lower(p).value();
  const int q = prog->find_queue(0, step_kind::compute, 0);
  ASSERT_GE(q, 0);
  auto mine = prog->launch_records(q);
  ASSERT_FALSE(mine.empty());
  int dummy = 0;
  mine.front().out.data = &dummy;  // what an executing actor does per job
  EXPECT_EQ(prog->launch_records(q).front().out.data, nullptr) << "a caller's patch reached the program";
}

/// A two-device plan whose device 0 runs two splits on one lane: g0, then
/// (after g1 on device 1) g2.
std::shared_ptr<const plan> ping_pong_plan() {
  graph_builder b;
  auto x = b.input("x", dtype::f32, {4, 8});
  auto g0 = b.gelu(x, gelu_mode::tanh, "g0");
  auto g1 = b.gelu(g0, gelu_mode::tanh, "g1");
  auto g2 = b.gelu(g1, gelu_mode::tanh, "g2");
  b.pin(g0, 0);
  b.pin(g1, 1);
  b.pin(g2, 0);
  b.output(g2);
  return compile(std::make_shared<const graph>(std::move(b).build().value()), sims(2)).value();
}

TEST(LaunchProgram, ALaneOrderThatDeadlocksIsRefusedNamingStepQueueAndDevice) {
  auto good = ping_pong_plan();
  std::vector<step_id> compute0;
  for (const auto& s : good->steps())
    if (s.kind == step_kind::compute && s.device == 0) compute0.push_back(s.id);
  ASSERT_EQ(compute0.size(), 2u) << "device 0 should run g0 and g2 as two splits";
  ASSERT_TRUE(lower(good).has_value());
  // Plant: g2's split is queued before g0's, which it needs (through device 1).
  plan bad = *good;
  auto& steps = plan_test_hook::steps(bad);
  const step_id first = compute0[0], second = compute0[1];
  std::swap(steps[static_cast<std::size_t>(first)].lane_seq, steps[static_cast<std::size_t>(second)].lane_seq);
  auto r = lower(std::make_shared<const plan>(std::move(bad)));
  ASSERT_FALSE(r.has_value());
  const error& e = r.err();
  EXPECT_EQ(e.code, errc::internal);
  EXPECT_EQ(e.step, second) << e.to_string();
  EXPECT_EQ(e.device, 0) << e.to_string();
  // The queue is named in the text (it has no field of its own).
  EXPECT_NE(e.message.find("compute0"), std::string::npos) << e.message;
}

TEST(LaunchProgram, QueuesWaitingForEachOthersLaterStepsAreRefused) {
  // No dependency cycle, only contradicting queue orders: h2d [a1, a2] and
  // d2h [b1, b2] with a1 after b2 and b1 after a2.
  graph_builder b;
  auto x = b.input("x", dtype::f32, {4, 8});
  auto y = b.input("y", dtype::f32, {4, 8});
  b.output(b.gelu(x, gelu_mode::tanh, "gx"));
  b.output(b.gelu(y, gelu_mode::tanh, "gy"));
  auto good = compile(std::make_shared<const graph>(std::move(b).build().value()), sims(1)).value();
  std::vector<step_id> h2d, d2h;
  for (const auto& s : good->steps()) {
    if (s.kind == step_kind::copy_h2d) h2d.push_back(s.id);
    if (s.kind == step_kind::copy_d2h) d2h.push_back(s.id);
  }
  ASSERT_EQ(h2d.size(), 2u);
  ASSERT_EQ(d2h.size(), 2u);
  plan bad = *good;
  auto& steps = plan_test_hook::steps(bad);
  for (auto& s : steps) s.deps.clear();
  steps[static_cast<std::size_t>(h2d[0])].deps = {d2h[1]};
  steps[static_cast<std::size_t>(d2h[0])].deps = {h2d[1]};
  const auto planted = std::make_shared<const plan>(std::move(bad));
  auto r = lower(planted);
  ASSERT_FALSE(r.has_value());
  EXPECT_EQ(r.err().code, errc::internal);
  EXPECT_TRUE(r.err().step == h2d[0] || r.err().step == d2h[0]) << r.err().to_string();
  EXPECT_EQ(r.err().device, 0);
  // The same order with the dependencies the other way round is fine.
  plan ok = *good;
  auto& ok_steps = plan_test_hook::steps(ok);
  for (auto& s : ok_steps) s.deps.clear();
  ok_steps[static_cast<std::size_t>(h2d[1])].deps = {d2h[0]};
  std::vector<actors::launch_queue> queues(2);
  queues[0].device = queues[1].device = 0;
  queues[0].kind = step_kind::copy_h2d;
  queues[0].steps = h2d;
  queues[1].kind = step_kind::copy_d2h;
  queues[1].steps = d2h;
  EXPECT_FALSE(actors::check_launch_order(ok, queues));
  EXPECT_TRUE(actors::check_launch_order(*planted, queues));
}

TEST(LaunchProgram, AStepOnADeviceOutOfRangeIsRefusedNamingIt) {
  auto good = ping_pong_plan();
  plan bad = *good;
  auto& steps = plan_test_hook::steps(bad);
  steps.back().device = 7;
  const step_id planted = steps.back().id;
  auto r = lower(std::make_shared<const plan>(std::move(bad)));
  ASSERT_FALSE(r.has_value());
  EXPECT_EQ(r.err().code, errc::internal);
  EXPECT_EQ(r.err().step, planted);
  EXPECT_EQ(r.err().device, 7);
}

TEST(LaunchProgram, ACopyOfANodeNotResidentOnItsSourceIsRefusedNamingTheTensor) {
  graph_builder b;
  auto x = b.input("x", dtype::f32, {4, 8});
  auto g0 = b.gelu(x, gelu_mode::tanh, "g0");
  auto g1 = b.gelu(g0, gelu_mode::tanh, "g1");
  b.pin(g0, 0);
  b.pin(g1, 1);
  b.output(g1);
  auto good = compile(std::make_shared<const graph>(std::move(b).build().value()), sims(2)).value();
  plan bad = *good;
  auto& steps = plan_test_hook::steps(bad);
  auto it = std::find_if(steps.begin(), steps.end(), [](const step& s) { return s.kind == step_kind::copy_d2h; });
  ASSERT_NE(it, steps.end());
  ASSERT_EQ(it->device, 1);
  it->device = 0;  // g1 lives on device 1 only
  const step_id planted = it->id;
  auto r = lower(std::make_shared<const plan>(std::move(bad)));
  ASSERT_FALSE(r.has_value());
  EXPECT_EQ(r.err().code, errc::internal);
  EXPECT_EQ(r.err().step, planted);
  EXPECT_EQ(r.err().device, 0);
  EXPECT_EQ(r.err().op, "g1");
}

// up then down matmul planned at tensor-parallel degree 2 on 2 sims: the
// row-parallel `down` needs one all-reduce, a collective part per device.
expected<std::shared_ptr<const plan>> two_matmuls_at_tensor_degree_2() {
  graph_builder b;
  auto x = b.input("x", dtype::f32, {4, 8});
  auto w1 = b.weight("w1", host_tensor::random_normal(dtype::f32, {8, 8}, 1, 0.3f));
  auto w2 = b.weight("w2", host_tensor::random_normal(dtype::f32, {8, 8}, 2, 0.3f));
  b.output(b.matmul(b.matmul(x, w1, false, false, "up"), w2, false, false, "down"));
  plan_options o;
  o.tensor_parallel = 2;
  return compile(std::make_shared<const graph>(std::move(b).build().value()), sims(2), o);
}

// Collective steps (tensor parallelism) lower to a descriptor per part: the
// part's own output on its device, every member's operand resolved on that
// member's device in rank order (never peer-copied), the algorithm and size
// the plan chose, on the device's communication queue; the label names the
// collective with its op, algorithm and bytes (traces).
TEST(LaunchProgram, CollectiveStepsLowerToMembersOperandsOnTheirDevices) {
  auto p = two_matmuls_at_tensor_degree_2();
  ASSERT_TRUE(p.has_value()) << p.err().to_string();
  auto r = lower(*p);
  ASSERT_TRUE(r.has_value()) << r.err().to_string();
  const launch_program& prog = **r;
  int parts = 0;
  for (const auto& s : (*p)->steps()) {
    if (s.kind != step_kind::collective) continue;
    ++parts;
    const lowered_step& ls = prog.step(s.id);
    const launch_queue& q = prog.queue(ls.queue);
    EXPECT_EQ(q.kind, step_kind::collective);
    EXPECT_EQ(q.device, s.device);
    const node& n = (*p)->source().at(s.ops.front());
    ASSERT_EQ(ls.subject, &n);
    EXPECT_TRUE(is_collective_op(n.op));
    const collective_desc& c = ls.coll;
    EXPECT_EQ(c.rank, n.attrs.rank);
    EXPECT_EQ(c.algo, s.algo);
    EXPECT_EQ(c.bytes, s.bytes);
    ASSERT_EQ(c.inputs.size(), n.inputs.size());
    ASSERT_EQ(c.member_devices.size(), s.peers.size());
    for (std::size_t k = 0; k < s.peers.size(); ++k) {
      const int dev = (*p)->at(s.peers[k]).device;
      EXPECT_EQ(c.member_devices[k], dev);
      auto loc = (*p)->locate(n.inputs[k], dev);
      ASSERT_TRUE(loc.has_value()) << loc.err().to_string();
      EXPECT_EQ(c.inputs[k].byte_offset, loc->byte_offset);
      EXPECT_EQ(c.inputs[k].where, loc->where);
    }
    auto out = (*p)->locate(n.id, s.device);
    ASSERT_TRUE(out.has_value());
    EXPECT_EQ(c.out.byte_offset, out->byte_offset);
    EXPECT_NE(ls.label.find(n.name), std::string::npos) << ls.label;
    EXPECT_NE(ls.label.find(to_string(s.algo)), std::string::npos) << ls.label;
    EXPECT_NE(ls.label.find(std::to_string(s.bytes) + " B"), std::string::npos) << ls.label;
  }
  EXPECT_EQ(parts, 2) << "a row-parallel matmul needs one all-reduce, one part per device";
}

// The deps a collective part may leave to its backend's pairing
// (collective_desc::peer_ordered_deps): in GPT-2 and LLaMA plans at degrees
// 2 and 4, each is one of the part's remote deps, on another member's
// device, and that member's part waits for it (a dep of its own) or runs
// after it on the same queue, so that part joins only after it. Every
// part has some (the producers of the other members' operands), and
// none is on the part's own device, whose producers it must still wait for.
TEST(LaunchProgram, CollectivePartsLeaveOnlyDepsAnotherMembersPartOrdersToThePairing) {
  for (auto variant : {models::model_variant::gpt2, models::model_variant::llama})
    for (int degree : {2, 4}) {
      SCOPED_TRACE(std::string(models::to_string(variant)) + " at degree " + std::to_string(degree));
      models::transformer_config cfg;
      cfg.variant = variant;
      cfg.n_layers = 2;
      cfg.d_model = 64;
      cfg.n_heads = 8;
      cfg.n_kv_heads = variant == models::model_variant::llama ? 4 : 0;
      cfg.vocab = 96;
      cfg.seq_len = 8;
      cfg.batch = 2;
      auto g = models::build_transformer(cfg);
      ASSERT_TRUE(g.has_value()) << g.err().to_string();
      plan_options o;
      o.tensor_parallel = degree;
      auto p = compile(std::make_shared<const graph>(std::move(*g)), sims(degree), o);
      ASSERT_TRUE(p.has_value()) << p.err().to_string();
      auto r = lower(*p);
      ASSERT_TRUE(r.has_value()) << r.err().to_string();
      const launch_program& prog = **r;
      int parts = 0;
      for (const auto& s : (*p)->steps()) {
        if (s.kind != step_kind::collective) continue;
        ++parts;
        const lowered_step& ls = prog.step(s.id);
        const collective_desc& c = ls.coll;
        EXPECT_FALSE(c.peer_ordered_deps.empty()) << "part " << s.id << " waits for no other member's producer";
        for (step_id d : c.peer_ordered_deps) {
          ASSERT_NE(std::find(ls.remote_deps.begin(), ls.remote_deps.end(), d), ls.remote_deps.end())
              << "step " << d << " is not a remote dep of part " << s.id;
          const lowered_step& ld = prog.step(d);
          EXPECT_NE(ld.device, ls.device) << "part " << s.id << " skips a producer on its own device";
          bool ordered = false;
          for (std::size_t j = 0; j < s.peers.size(); ++j) {
            if (static_cast<int>(j) == c.rank || c.member_devices[j] != ld.device) continue;
            const step_id peer = s.peers[j];
            const auto& deps = (*p)->at(peer).deps;
            const lowered_step& lp = prog.step(peer);
            ordered = ordered || std::find(deps.begin(), deps.end(), d) != deps.end() ||
                      (ld.queue == lp.queue && ld.pos < lp.pos);
          }
          EXPECT_TRUE(ordered) << "no member's part orders step " << d << " before it joins";
        }
      }
      EXPECT_GT(parts, 0);
    }
}

// A collective part whose peer list does not name it is refused by the
// lowering, naming the step, its device and the collective node.
TEST(LaunchProgram, CollectiveWithBrokenPeersIsRefusedNamingIt) {
  auto good = two_matmuls_at_tensor_degree_2();
  ASSERT_TRUE(good.has_value()) << good.err().to_string();
  plan bad = **good;
  auto& steps = plan_test_hook::steps(bad);
  auto it = std::find_if(steps.begin(), steps.end(), [](const step& s) { return s.kind == step_kind::collective; });
  ASSERT_NE(it, steps.end());
  std::reverse(it->peers.begin(), it->peers.end());
  const step_id planted = it->id;
  const int device = it->device;
  const std::string op = (*good)->source().at(it->ops.front()).name;
  auto r = lower(std::make_shared<const plan>(std::move(bad)));
  ASSERT_FALSE(r.has_value());
  EXPECT_EQ(r.err().code, errc::internal) << r.err().to_string();
  EXPECT_EQ(r.err().step, planted);
  EXPECT_EQ(r.err().device, device);
  EXPECT_EQ(r.err().op, op);
}

// Attention fusion (CUDA devices only): a decode step's scores -> [mask] ->
// softmax -> weighted sum chain becomes one record per layer, carrying q, k,
// v (and the mask in cache mode) and the softmax's scale, causal flag and
// rows; a prefill's queries (more rows than the decode kernels take) keep
// the ops where the flash kernel does not fit (f32, heads of 8 here), and
// so does every non-CUDA device.
struct fused_count {
  int fused = 0, masked = 0, records = 0;
  int cache_prologues = 0, ropes = 0;  ///< records with a cache prologue; ropes fused into them
};

/// Bytes [first, last] an operand spans in its region.
std::pair<int64_t, int64_t> span_of(const actors::operand& o) {
  int64_t far = 0;
  for (int d = 0; d < o.proto.dims.rank(); ++d) far += (o.proto.dims[d] - 1) * o.proto.stride[static_cast<std::size_t>(d)];
  return {o.byte_offset, o.byte_offset + (far + 1) * static_cast<int64_t>(dtype_size(o.proto.type)) - 1};
}

struct compiled_and_lowered {
  std::shared_ptr<const plan> p;
  std::shared_ptr<const launch_program> prog;
};
/// A decode step of `cfg` compiled for the devices `specs` with `o` (for a
/// tensor-parallel plan, its degree and in-stream all-reduces), checked by
/// the independent hazard checker (which sees fused kernels' reads too),
/// and lowered; null where a step failed (a test failure).
compiled_and_lowered compile_tp(const models::transformer_config& cfg, const std::vector<device_spec>& specs,
                                const plan_options& o) {
  auto g = models::build_transformer(cfg);
  EXPECT_TRUE(g.has_value()) << g.err().to_string();
  if (!g) return {};
  auto p = compile(std::make_shared<const graph>(std::move(*g)), specs, o);
  EXPECT_TRUE(p.has_value()) << p.err().to_string();
  if (!p) return {};
  EXPECT_TRUE(check_hazards(**p).ok()) << check_hazards(**p).to_string();
  auto prog = lower(*p);
  EXPECT_TRUE(prog.has_value()) << prog.err().to_string();
  if (!prog) return {*p, nullptr};
  expect_consistent(**prog);
  return {*p, *prog};
}
/// The same on `devices` devices of `kind`.
compiled_and_lowered compile_and_lower(const models::transformer_config& cfg, device_kind kind, const plan_options& o,
                                       int devices = 1) {
  std::vector<device_spec> specs;
  for (int k = 0; k < devices; ++k) {
    device_spec d;
    d.name = std::string(to_string(kind)) + std::to_string(k);
    d.kind = kind;
    specs.push_back(d);
  }
  return compile_tp(cfg, specs, o);
}

fused_count count_fused(const models::transformer_config& cfg, device_kind kind, bool fuse_ops = true,
                        int tensor_degree = 1) {
  plan_options o;
  o.fuse_ops = fuse_ops;
  o.fuse_projections = false;  // counted on their own below
  o.tensor_parallel = tensor_degree;
  const auto [p, prog] = compile_and_lower(cfg, kind, o, tensor_degree);
  fused_count c;
  if (!prog) return c;
  for (const lowered_step& ls : prog->steps())
    for (const auto& op : ls.ops) {
      ++c.records;
      if (op.fused != gpu::op_launch::fusion::attention) continue;
      ++c.fused;
      c.masked += op.attention.masked;
      EXPECT_EQ(op.op->op, op_kind::matmul) << "the record stands at the chain's last matmul";
      const bool rope = op.attention.rope_q || op.attention.rope_k;
      c.cache_prologues += op.attention.store_new_rows;
      c.ropes += op.attention.rope_q + op.attention.rope_k;
      EXPECT_EQ(op.inputs.size(), (op.attention.masked ? 4u : 3u) + (op.attention.store_new_rows ? (rope ? 4u : 3u) : 0u))
          << "q, k, v, the mask, then the new rows of k and v, their cache positions and the rope positions";
      if (op.attention.store_new_rows) {
        const std::size_t at = op.attention.masked ? 4 : 3;
        EXPECT_EQ(op.inputs[at].proto.dims, op.inputs[at + 1].proto.dims) << "new rows of k and of v";
        EXPECT_EQ(op.inputs[at].proto.dims[-2], cfg.seq_len) << "one new row per position";
        EXPECT_EQ(op.inputs[at + 2].proto.type, dtype::i32) << "cache positions";
        if (rope) { EXPECT_EQ(op.inputs[at + 3].proto.type, dtype::i32) << "rope positions"; }
        if (op.attention.rope_q) { EXPECT_FLOAT_EQ(op.attention.rope_theta, cfg.rope_theta); }
      }
      EXPECT_FLOAT_EQ(op.attention.scale, 1.0f / std::sqrt(static_cast<float>(cfg.head_dim())));
      EXPECT_EQ(op.attention.causal, cfg.kv_cache_capacity == 0);
      EXPECT_EQ(op.attention.softmax_rows, cfg.seq_len);
      // The memory plan kept q, k and the mask out of the output's bytes:
      // the kernel reads them while it writes.
      for (const auto& in : op.inputs) {
        if (in.where != op.out.where) continue;
        const auto a = span_of(in), b = span_of(op.out);
        EXPECT_TRUE(a.second < b.first || b.second < a.first)
            << op.op->name << ": an input at [" << a.first << ", " << a.second << "] under the output at [" << b.first
            << ", " << b.second << "]";
      }
    }
  EXPECT_EQ(c.fused, static_cast<int>(p->fusions().size()));
  return c;
}

/// A 3-layer decode step (batch 2, one position) of 8 heads of d_model / 8,
/// LLaMA with 2 kv heads (4 query rows per kv head), shapes only.
models::transformer_config decode_step(models::model_variant variant, int64_t d_model) {
  models::transformer_config cfg;
  cfg.variant = variant;
  cfg.n_layers = 3;
  cfg.d_model = d_model;
  cfg.n_heads = 8;
  cfg.n_kv_heads = variant == models::model_variant::llama ? 2 : 0;
  cfg.vocab = 50;
  cfg.batch = 2;
  cfg.seq_len = 1;
  cfg.weight_values = false;
  return cfg;
}

// Longer query runs (a prefill of 80 positions) fuse into the flash kernel
// (graph/fusion.hpp, fused_flash_attention_fits): one record per layer for
// f16 and bf16 heads of 64 and 128, causal without a cache and masked with
// one, never with a cache prologue; f32 and heads of 32 keep their four
// kernels, as do sim devices.
TEST(LaunchProgram, LongQueryRunsFuseIntoTheFlashKernelForHalfTypesAndHeadsOf64Or128) {
  for (auto variant : {models::model_variant::llama, models::model_variant::gpt2})
    for (dtype t : {dtype::f32, dtype::f16, dtype::bf16})
      for (int64_t head : {int64_t{32}, int64_t{64}, int64_t{128}})
        for (int64_t cache : {int64_t{0}, int64_t{96}}) {
          SCOPED_TRACE(std::string(models::to_string(variant)) + " " + to_string(t) + " heads of " +
                       std::to_string(head) + " cache " + std::to_string(cache));
          models::transformer_config cfg = decode_step(variant, 8 * head);
          cfg.seq_len = 80;
          cfg.dtype = t;
          cfg.kv_cache_capacity = cache;
          const bool flash = t != dtype::f32 && (head == 64 || head == 128);
          const auto cuda = count_fused(cfg, device_kind::cuda);
          EXPECT_EQ(cuda.fused, flash ? 3 : 0);
          EXPECT_EQ(cuda.masked, flash && cache > 0 ? 3 : 0);
          EXPECT_EQ(cuda.cache_prologues, 0);
          EXPECT_EQ(count_fused(cfg, device_kind::sim).fused, 0);
        }
}

// A batched decode step's attention (generator_options::decode_batch: S
// rows, one sequence each, over a cache of several lanes): S = 8 rows of 4
// query heads a kv head are 32 query rows, which fuse into the split kernel
// (graph/fusion.hpp, fused_attention_split_rows_fit) in every dtype, not
// into the flash kernel (before: bf16 fused into flash, 8 blocks a layer;
// f32 kept four kernels). The cache's stores stay records of their own: q's
// copy into heads (S > 1) stands between them and the scores. S = 32 (128
// query rows) is a prompt chunk: flash, as before; f32 unfused.
TEST(LaunchProgram, BatchedDecodeRowsFuseIntoTheSplitKernel) {
  for (dtype t : {dtype::f32, dtype::bf16})
    for (int64_t rows : {int64_t{8}, int64_t{32}}) {
      SCOPED_TRACE(std::string(to_string(t)) + ", " + std::to_string(rows) + " rows");
      models::transformer_config cfg = decode_step(models::model_variant::llama, 8 * 64);
      cfg.batch = 1;
      cfg.seq_len = rows;
      cfg.dtype = t;
      cfg.kv_cache_capacity = 8 * 96;  // 8 lanes of 96 rows
      cfg.mask_from_positions = true;
      cfg.last_row_logits = false;
      const auto cuda = count_fused(cfg, device_kind::cuda);
      const bool split = rows == 8;
      EXPECT_EQ(cuda.fused, split || t == dtype::bf16 ? 3 : 0);
      EXPECT_EQ(cuda.masked, split || t == dtype::bf16 ? 3 : 0);
      EXPECT_EQ(cuda.cache_prologues, 0);
    }
}

// The flash kernel's grid takes at most fused_flash_max_batch (65535) batch
// entries: a long query run over 65535 of them fuses, one over 65536 keeps
// its four kernels instead of failing at launch.
TEST(LaunchProgram, FlashFusionStopsAtTheKernelsBatchLimit) {
  for (int64_t batch : {fused_flash_max_batch, fused_flash_max_batch + 1}) {
    SCOPED_TRACE("batch entries " + std::to_string(batch));
    graph_builder b;
    auto q = b.input("q", dtype::bf16, {1, batch, 17, 64});
    auto k = b.input("k", dtype::bf16, {1, batch, 17, 64});
    auto v = b.input("v", dtype::bf16, {1, batch, 17, 64});
    auto probs = b.softmax(b.matmul(q, k, false, true, "qk"), true, 0.125f, "softmax");
    b.output(b.matmul(probs, v, false, false, "pv"));
    auto g = std::move(b).build();
    ASSERT_TRUE(g) << g.err().to_string();
    device_spec d;
    d.name = "cuda0";
    d.kind = device_kind::cuda;
    auto p = compile(std::make_shared<const graph>(std::move(*g)), {d}, plan_options{});
    ASSERT_TRUE(p) << p.err().to_string();
    EXPECT_EQ((*p)->fusions().size(), batch <= fused_flash_max_batch ? 1u : 0u);
  }
}

/// A LLaMA of d 64 (8 heads, 2 kv heads, ff 96, vocab 50), batch 2, without
/// weight values: what the fusion and lowering tests below plan.
models::transformer_config small_llama(int layers, int64_t seq_len) {
  models::transformer_config cfg;
  cfg.variant = models::model_variant::llama;
  cfg.n_layers = layers;
  cfg.d_model = 64;
  cfg.n_heads = 8;
  cfg.n_kv_heads = 2;
  cfg.d_ff = 96;
  cfg.vocab = 50;
  cfg.batch = 2;
  cfg.seq_len = seq_len;
  cfg.weight_values = false;
  return cfg;
}

/// A 2-layer prefill of 16 positions (64 query rows per kv head).
models::transformer_config small_llama_prefill() { return small_llama(2, 16); }

TEST(LaunchProgram, DecodeAttentionIsOneFusedRecordPerLayerOnCudaOnly) {
  for (auto variant : {models::model_variant::llama, models::model_variant::gpt2}) {
    models::transformer_config cfg = decode_step(variant, 64);
    SCOPED_TRACE(models::to_string(variant));
    // A decode step without a cache (causal over the one key) and with one
    // (masked over the cache's 32 positions).
    for (int64_t cache : {int64_t{0}, int64_t{32}}) {
      cfg.kv_cache_capacity = cache;
      const auto cuda = count_fused(cfg, device_kind::cuda);
      const auto sim = count_fused(cfg, device_kind::sim);
      EXPECT_EQ(cuda.fused, 3) << "cache " << cache;
      EXPECT_EQ(cuda.masked, cache > 0 ? 3 : 0) << "cache " << cache;
      EXPECT_EQ(sim.fused, 0);
      EXPECT_EQ(count_fused(cfg, device_kind::cuda, /*fuse_ops=*/false).fused, 0);
      // Each fusion replaces 3 records (4 with the mask add) by one.
      EXPECT_EQ(sim.records - cuda.records, 3 * (cache > 0 ? 3 : 2)) << "cache " << cache;
    }
  }
  // Heads of 32 with a cache: the cache prologue goes into the kernel too
  // (graph/fusion.hpp): LLaMA's q rope, k rope and the two store_rows,
  // GPT-2's two store_rows; none without a cache or on sim devices.
  for (auto variant : {models::model_variant::llama, models::model_variant::gpt2}) {
    models::transformer_config cfg = decode_step(variant, 256);
    const bool llama = variant == models::model_variant::llama;
    SCOPED_TRACE(std::string(models::to_string(variant)) + " heads of 32");
    for (int64_t cache : {int64_t{0}, int64_t{32}}) {
      cfg.kv_cache_capacity = cache;
      const auto cuda = count_fused(cfg, device_kind::cuda);
      const auto sim = count_fused(cfg, device_kind::sim);
      EXPECT_EQ(cuda.fused, 3) << "cache " << cache;
      EXPECT_EQ(cuda.cache_prologues, cache > 0 ? 3 : 0) << "cache " << cache;
      EXPECT_EQ(cuda.ropes, cache > 0 && llama ? 6 : 0) << "cache " << cache;
      EXPECT_EQ(sim.cache_prologues, 0);
      const int per_layer = cache > 0 ? 3 + (llama ? 4 : 2) : 2;
      EXPECT_EQ(sim.records - cuda.records, 3 * per_layer) << "cache " << cache;
      // At tensor degree 2 each device's share of the heads (and of the
      // cache, by kv head) is fused the same way.
      const auto tp2 = count_fused(cfg, device_kind::cuda, true, 2);
      EXPECT_EQ(tp2.fused, 6) << "cache " << cache;
      EXPECT_EQ(tp2.cache_prologues, cache > 0 ? 6 : 0) << "cache " << cache;
      EXPECT_EQ(tp2.ropes, cache > 0 && llama ? 12 : 0) << "cache " << cache;
    }
  }
  // A cache longer than the 8192 keys of the kernel that holds a row's
  // scores in shared memory: heads of 32 still fuse, with their prologue
  // (the split kernel takes any number of keys: 9000 here, 16,512 for a
  // 16k context's decode); heads of 8, which only that kernel takes, keep
  // their ops.
  for (auto variant : {models::model_variant::llama, models::model_variant::gpt2}) {
    SCOPED_TRACE(std::string(models::to_string(variant)) + ", a cache of 9000");
    models::transformer_config cfg = decode_step(variant, 256);
    cfg.kv_cache_capacity = 9000;
    const auto cuda = count_fused(cfg, device_kind::cuda);
    EXPECT_EQ(cuda.fused, 3);
    EXPECT_EQ(cuda.cache_prologues, 3);
    cfg = decode_step(variant, 64);
    cfg.kv_cache_capacity = 9000;
    EXPECT_EQ(count_fused(cfg, device_kind::cuda).fused, 0) << "heads of 8";
  }
  // A prefill of 16 positions: 64 query rows per kv head, more than the
  // decode kernels take, in f32 with heads of 8 (no flash kernel either:
  // LongQueryRuns... below); the chain stays as it is.
  EXPECT_EQ(count_fused(small_llama_prefill(), device_kind::cuda).fused, 0);
}

// On cpu devices a prefill's attention (more than fused_attention_max_rows
// query rows) is one record per layer, causal without a cache and masked
// over it, never with a cache prologue; a decode step keeps its ops (the
// few-row products) unless its cache is long, and fuse_ops off keeps every
// chain.
TEST(LaunchProgram, PrefillAttentionIsOneFusedRecordPerLayerOnCpu) {
  models::transformer_config prefill = small_llama_prefill();
  for (int64_t cache : {int64_t{0}, int64_t{32}}) {
    prefill.kv_cache_capacity = cache;
    const auto cpu = count_fused(prefill, device_kind::cpu);
    EXPECT_EQ(cpu.fused, 2) << "cache " << cache;
    EXPECT_EQ(cpu.masked, cache > 0 ? 2 : 0) << "cache " << cache;
    EXPECT_EQ(cpu.cache_prologues, 0) << "cache " << cache;
    EXPECT_EQ(count_fused(prefill, device_kind::cpu, /*fuse_ops=*/false).fused, 0);
  }
  for (auto variant : {models::model_variant::llama, models::model_variant::gpt2}) {
    models::transformer_config cfg = decode_step(variant, 256);
    cfg.kv_cache_capacity = 32;
    EXPECT_EQ(count_fused(cfg, device_kind::cpu).fused, 0) << models::to_string(variant);
    // Over a cache of cpu_fused_cache_min_keys rows or more the fused kernel
    // reads only the rows up to the last the mask shows: one masked record
    // a layer, without the cache prologue.
    cfg.kv_cache_capacity = cpu_fused_cache_min_keys;
    const auto long_cache = count_fused(cfg, device_kind::cpu);
    EXPECT_EQ(long_cache.fused, 3) << models::to_string(variant);
    EXPECT_EQ(long_cache.masked, 3) << models::to_string(variant);
    EXPECT_EQ(long_cache.cache_prologues, 0) << models::to_string(variant);
    cfg.kv_cache_capacity = cpu_fused_cache_min_keys - 1;
    EXPECT_EQ(count_fused(cfg, device_kind::cpu).fused, 0) << models::to_string(variant);
  }
}

// Projection groups (CUDA devices only, plan_options::fuse_projections): in
// a LLaMA decode step q, k and v become one record (with q's and k's ropes
// where no attention chain takes them), gate, up, silu and their product
// one, and o and down each one with the residual add after it; GPT-2
// (biases between its matmuls and the residual adds), a prefill (more than 8
// rows) and sim devices keep their ops. The hazard checker passes, and no
// group's output shares bytes with what the kernel reads.
struct projection_count {
  int shared = 0, gated = 0, residual = 0, records = 0, norm_prologues = 0, ropes = 0, rope_records = 0;
};

projection_count count_projections(const models::transformer_config& cfg, device_kind kind, bool fuse = true,
                                   bool fuse_attention = false, bool fold_norm_weights = true) {
  plan_options o;
  o.fuse_projections = fuse;
  o.fold_norm_weights = fold_norm_weights;
  o.fuse_ops = fuse_attention;  // off: attention chains apart, describe() below names only projection groups
  const auto [p, prog] = compile_and_lower(cfg, kind, o);
  projection_count c;
  if (!prog) return c;
  auto apart = [](const actors::operand& a, const actors::operand& b) {
    if (a.where != b.where) return true;
    const auto x = span_of(a), y = span_of(b);
    return x.second < y.first || y.second < x.first;
  };
  for (const lowered_step& ls : prog->steps())
    for (const auto& op : ls.ops) {
      ++c.records;
      c.rope_records += op.fused == gpu::op_launch::fusion::none && op.op->op == op_kind::rope;
      if (op.fused != gpu::op_launch::fusion::projections) continue;
      switch (op.projection) {
        case projection_kind::shared_input: {
          ++c.shared;
          const int roped = std::popcount(op.projection_rope.roped);
          c.ropes += roped;
          EXPECT_EQ(op.op->op, roped > 0 ? op_kind::rope : op_kind::matmul) << "the group's last op";
          EXPECT_EQ(op.inputs.size(), 2 + op.extra_outs.size() + (op.projection_norm.weighted ? 1 : 0) + (roped > 0))
              << "x, a weight per output, the norm's weight, the ropes' positions";
          if (roped > 0) {
            EXPECT_EQ(op.inputs.back().proto.type, dtype::i32) << "the positions come last";
            EXPECT_EQ(op.projection_rope.head_dim, cfg.head_dim());
            EXPECT_EQ(op.projection_rope.seq, cfg.seq_len);
            EXPECT_TRUE(op.projection_rope.neox);
            EXPECT_EQ(op.projection_rope.theta, cfg.rope_theta);
          }
          break;
        }
        case projection_kind::gated:
          ++c.gated;
          EXPECT_EQ(op.op->op, op_kind::mul);
          EXPECT_EQ(op.inputs.size(), 3u + (op.projection_norm.weighted ? 1 : 0)) << "x, w_gate, w_up, the norm's weight";
          break;
        case projection_kind::residual:
          ++c.residual;
          EXPECT_EQ(op.op->op, op_kind::add);
          EXPECT_EQ(op.inputs.size(), 3u) << "x, w, the residual";
          break;
      }
      if (op.projection_norm.on) {
        ++c.norm_prologues;
        // LLaMA's norms have weights, folded into the projections' unless
        // the plan says not to (plan_options::fold_norm_weights).
        EXPECT_EQ(op.projection_norm.weighted, !fold_norm_weights);
        EXPECT_GT(op.projection_norm.eps, 0.0f);
        if (op.projection_norm.weighted) {
          EXPECT_EQ(op.inputs.back().proto.dims.rank(), 1) << "the norm's weight [K] comes last";
        }
      }
      // x (and the residual) are read while the outputs are written.
      std::vector<actors::operand> outs{op.out};
      outs.insert(outs.end(), op.extra_outs.begin(), op.extra_outs.end());
      for (const auto& out : outs) {
        EXPECT_TRUE(apart(op.inputs.front(), out)) << op.op->name << ": x under an output";
        if (op.projection == projection_kind::residual) {
          EXPECT_TRUE(apart(op.inputs.back(), out)) << op.op->name << ": the residual under the output";
        }
      }
      for (std::size_t i = 0; i < outs.size(); ++i)
        for (std::size_t j = i + 1; j < outs.size(); ++j) EXPECT_TRUE(apart(outs[i], outs[j])) << op.op->name;
    }
  EXPECT_EQ(c.shared + c.gated + c.residual, static_cast<int>(p->projection_fusions().size()));
  // describe() names the groups (and says nothing of fusion without any).
  const std::string text = p->describe();
  if (c.shared + c.gated + c.residual > 0) {
    EXPECT_NE(text.find(std::to_string(c.shared) + " shared-input projection group(s), " + std::to_string(c.gated) +
                        " gated-MLP group(s), " + std::to_string(c.residual) + " projection + residual group(s)"),
              std::string::npos)
        << text;
  } else {
    EXPECT_EQ(text.find("fused:"), std::string::npos) << text;
  }
  return c;
}

// Job lanes (plan_options::job_lanes, launch_program::job_lanes): auto gives
// a tensor-parallel plan on CUDA devices two copies and one on sim; an asked
// count is taken by a plan with collectives and neither state nor in-stream
// parts, and refused with a note naming why otherwise; lane_on_copy moves a
// compute queue past its device's compute lanes, a communication queue to
// its copy's index, and keeps a copy queue where it is. 9 is out of range.
TEST(LaunchProgram, JobLanesCopyTheComputeAndCommunicationQueuesOfCollectivePlans) {
  models::transformer_config cfg = small_llama(2, 4);
  plan_options o;
  o.tensor_parallel = 2;
  EXPECT_EQ(compile_and_lower(cfg, device_kind::cuda, o, 2).prog->job_lanes(), 2) << "auto on CUDA";
  EXPECT_EQ(compile_and_lower(cfg, device_kind::sim, o, 2).prog->job_lanes(), 1) << "auto on sim";
  o.job_lanes = 3;
  const auto [p, prog] = compile_and_lower(cfg, device_kind::sim, o, 2);
  ASSERT_TRUE(prog);
  EXPECT_EQ(prog->job_lanes(), 3);
  EXPECT_TRUE(prog->job_lanes_note().empty()) << prog->job_lanes_note();
  std::map<int, int> compute_lanes;  // by device: highest compute lane + 1
  for (const launch_queue& q : prog->queues())
    if (q.kind == step_kind::compute) compute_lanes[q.device] = std::max(compute_lanes[q.device], q.lane + 1);
  int collective_queues = 0;
  for (int q = 0; q < static_cast<int>(prog->queues().size()); ++q) {
    const launch_queue& lq = prog->queue(q);
    for (int c = 0; c < 3; ++c) {
      const int want = lq.kind == step_kind::compute      ? lq.lane + c * compute_lanes[lq.device]
                       : lq.kind == step_kind::collective ? c
                                                          : lq.lane;
      EXPECT_EQ(prog->lane_on_copy(q, c), want) << to_string(lq.kind) << " queue " << q << " copy " << c;
    }
    EXPECT_EQ(prog->copied(q), lq.kind == step_kind::compute || lq.kind == step_kind::collective);
    collective_queues += lq.kind == step_kind::collective;
  }
  EXPECT_EQ(collective_queues, 2) << "one communication queue per member";
  // Refused: no collectives (two pipeline stages), and state (a KV cache).
  plan_options stages;
  stages.pipeline_stages = 2;
  stages.job_lanes = 2;
  const auto [p2, pipeline] = compile_and_lower(cfg, device_kind::cuda, stages, 2);
  ASSERT_TRUE(pipeline);
  EXPECT_EQ(pipeline->job_lanes(), 1);
  EXPECT_NE(pipeline->job_lanes_note().find("no collectives"), std::string::npos) << pipeline->job_lanes_note();
  models::transformer_config decode = cfg;
  decode.seq_len = 1;
  decode.batch = 1;
  decode.kv_cache_capacity = 16;
  o.job_lanes = 2;
  const auto [p3, cached] = compile_and_lower(decode, device_kind::cuda, o, 2);
  ASSERT_TRUE(cached);
  EXPECT_EQ(cached->job_lanes(), 1);
  EXPECT_NE(cached->job_lanes_note().find("state"), std::string::npos) << cached->job_lanes_note();
  plan_options bad;
  bad.job_lanes = 9;
  auto g = models::build_transformer(cfg);
  ASSERT_TRUE(g.has_value());
  auto refused = compile(std::make_shared<const graph>(std::move(*g)), sims(1), bad);
  ASSERT_FALSE(refused.has_value());
  EXPECT_EQ(refused.err().code, errc::invalid_argument);
  EXPECT_NE(refused.err().message.find("job_lanes"), std::string::npos) << refused.err().message;
}

TEST(LaunchProgram, DecodeProjectionsAreGroupedIntoGemvRecordsOnCudaOnly) {
  models::transformer_config cfg = small_llama(3, 1);
  for (dtype t : {dtype::f32, dtype::bf16})
    for (int64_t cache : {int64_t{0}, int64_t{32}}) {
      cfg.dtype = t;
      cfg.kv_cache_capacity = cache;
      SCOPED_TRACE(std::string(to_string(t)) + " cache " + std::to_string(cache));
      const auto cuda = count_projections(cfg, device_kind::cuda);
      EXPECT_EQ(cuda.shared, 3) << "q, k, v of each layer";
      EXPECT_EQ(cuda.gated, 3) << "gate, up, silu, mul of each layer";
      EXPECT_EQ(cuda.residual, 6) << "o and down of each layer, each with its residual add";
      const auto off = count_projections(cfg, device_kind::cuda, /*fuse=*/false);
      EXPECT_EQ(off.shared + off.gated + off.residual, 0);
      EXPECT_EQ(cuda.norm_prologues, 6) << "the rms_norm before q/k/v and before gate/up of each layer";
      const auto weighted = count_projections(cfg, device_kind::cuda, true, false, /*fold_norm_weights=*/false);
      EXPECT_EQ(weighted.norm_prologues, 6) << "the same groups with the norms' weights read by the kernel";
      EXPECT_EQ(weighted.records, cuda.records);
      EXPECT_EQ(cuda.ropes, 6) << "q's and k's ropes of each layer (no attention chain takes them here)";
      EXPECT_EQ(cuda.rope_records, 0);
      EXPECT_EQ(off.rope_records, 6);
      EXPECT_EQ(off.records - cuda.records, 11 * 3) << "15 records of a layer become 4";
      const auto sim = count_projections(cfg, device_kind::sim);
      EXPECT_EQ(sim.shared + sim.gated + sim.residual, 0);
      EXPECT_EQ(sim.rope_records, 6);
      // With attention chains fused, a KV cache's chain takes both ropes
      // into its prologue (graph/fusion.hpp) where its kernel takes the
      // head dim (32 here, not 8), and the q/k/v group none.
      for (int64_t d : {int64_t{64}, int64_t{256}}) {
        models::transformer_config fused = cfg;
        fused.d_model = d;
        const bool prologue = cache > 0 && d == 256;
        SCOPED_TRACE("attention chains fused, head dim " + std::to_string(fused.head_dim()));
        const auto both = count_projections(fused, device_kind::cuda, /*fuse=*/true, /*fuse_attention=*/true);
        EXPECT_EQ(both.shared, 3);
        EXPECT_EQ(both.ropes, prologue ? 0 : 6);
        EXPECT_EQ(both.rope_records, 0);
      }
    }
  // Eight rows of 2048: more x than a block's shared memory held when the
  // kernel staged the normalised rows there (the prologue had a limit of
  // 10240 elements until the norm was folded into the products).
  models::transformer_config wide = cfg;
  wide.dtype = dtype::bf16;
  wide.kv_cache_capacity = 0;
  wide.d_model = 2048;
  wide.batch = 8;
  EXPECT_EQ(count_projections(wide, device_kind::cuda).norm_prologues, 6) << "8 x 2048 elements of x";
  // GPT-2: a bias add between each matmul and what follows; a LLaMA prefill
  // of 16 positions: more rows than the kernel takes.
  models::transformer_config gpt2 = cfg;
  gpt2.variant = models::model_variant::gpt2;
  gpt2.n_kv_heads = 0;
  const auto g2 = count_projections(gpt2, device_kind::cuda);
  EXPECT_EQ(g2.shared + g2.gated + g2.residual, 0);
  models::transformer_config prefill = cfg;
  prefill.kv_cache_capacity = 0;
  prefill.seq_len = 16;
  const auto pf = count_projections(prefill, device_kind::cuda);
  EXPECT_EQ(pf.shared + pf.gated + pf.residual, 0);
}

/// `n` CUDA-kind specs (the planner needs no GPU) that take in-stream
/// all-reduces of up to `in_stream_max` bytes.
std::vector<device_spec> cuda_specs(int n, int64_t in_stream_max) {
  std::vector<device_spec> v(static_cast<std::size_t>(n));
  for (int i = 0; i < n; ++i) {
    auto& d = v[static_cast<std::size_t>(i)];
    d.name = "cuda" + std::to_string(i);
    d.kind = device_kind::cuda;
    d.ordinal = i;
    d.in_stream_max_bytes = in_stream_max;
  }
  return v;
}

// A rope joins a q/k/v group only where x's row r is its position r % S
// (its input the matmul's output as [.., S, H, D], H x D the matmul's N)
// and every output of the group has an even N (the kernel then works in
// pairs of rows). A reshape that folds part of N into the positions ([2,
// 128] as [4, 1, 64]), or a v of 63 columns, keeps the rope apart; the
// same rope over [1, 2, 2, 64] beside a v of 64 joins.
TEST(LaunchProgram, RopesJoinAProjectionGroupOnlyWhereItsRowsArePositionsAndPairs) {
  struct rope_case {
    bool rows_are_positions;
    int64_t v_columns;
    int ropes;
  };
  for (const rope_case& c : {rope_case{true, 64, 1}, rope_case{false, 64, 0}, rope_case{true, 63, 0}}) {
    SCOPED_TRACE(std::string(c.rows_are_positions ? "[1, 2, 2, 64]" : "[4, 1, 64]") + ", v of " +
                 std::to_string(c.v_columns));
    graph_builder b;
    auto x = b.input("x", dtype::f32, {2, 64});
    auto pos = b.input("pos", dtype::i32, {c.rows_are_positions ? 2 : 4});
    auto w = [&](const std::string& name, int64_t n) {
      return b.weight(name, host_tensor::random_normal(dtype::f32, {n, 64}, static_cast<uint64_t>(n), 0.1f));
    };
    auto q = b.matmul(x, w("wq", 128), false, true, "q");
    auto k = b.matmul(x, w("wk", 64), false, true, "k");
    b.output(b.matmul(x, w("wv", c.v_columns), false, true, "v"));
    const shape heads = c.rows_are_positions ? shape{1, 2, 2, 64} : shape{4, 1, 64};
    b.output(b.rope(b.reshape(q, heads, "q.heads"), pos, 10000.0f, rope_mode::neox, "q.rope"));
    b.output(k);
    auto g = std::move(b).build();
    ASSERT_TRUE(g) << g.err().to_string();
    plan_options o;
    o.graph_replay = graph_replay_mode::off;
    auto p = compile(std::make_shared<const graph>(std::move(*g)), cuda_specs(1, 0), o);
    ASSERT_TRUE(p) << p.err().to_string();
    ASSERT_EQ((*p)->projection_fusions().size(), 1u) << (*p)->describe();
    EXPECT_EQ((*p)->projection_fusions()[0].ropes, c.ropes) << (*p)->describe();
    EXPECT_TRUE(check_hazards(**p).ok()) << check_hazards(**p).to_string();
    auto prog = lower(*p);
    ASSERT_TRUE(prog) << prog.err().to_string();
  }
}

/// A LLaMA decode step (batch 1, one token, a KV cache) of `layers` small
/// layers, shapes only.
models::transformer_config decode_step_config(int layers) {
  models::transformer_config cfg;
  cfg.variant = models::model_variant::llama;
  cfg.n_layers = layers;
  cfg.d_model = 64;
  cfg.n_heads = 8;
  cfg.n_kv_heads = 4;
  cfg.d_ff = 128;
  cfg.vocab = 96;
  cfg.batch = 1;
  cfg.seq_len = 1;
  cfg.kv_cache_capacity = 16;
  cfg.dtype = dtype::bf16;
  cfg.weight_values = false;
  return cfg;
}

// Two logical devices of one GPU (ordinal 0 twice: "cuda:0,0"): the decode
// step's all-reduces still run in-stream, but no replay segment holds an
// in-stream part; those segments launch kernel by kernel (replayed, parts
// of one GPU timed out on an H100; mark_replay_segments). On two GPUs every
// part lies in a replayed segment.
TEST(LaunchProgram, InStreamPartsOfLogicalDevicesOfOneGpuAreNeverReplayed) {
  const models::transformer_config cfg = decode_step_config(2);
  for (bool one_gpu : {false, true}) {
    SCOPED_TRACE(one_gpu ? "cuda:0,0" : "cuda:0,1");
    auto g = models::build_transformer(cfg);
    ASSERT_TRUE(g.has_value()) << g.err().to_string();
    plan_options o;
    o.tensor_parallel = 2;
    o.lanes_per_device = 1;
    o.graph_replay = graph_replay_mode::on;
    o.in_stream_collectives = in_stream_mode::on;
    auto specs = cuda_specs(2, 256 << 10);
    if (one_gpu) {
      specs[1].ordinal = 0;
      specs[1].name = "cuda0.1";
    }
    auto p = compile(std::make_shared<const graph>(std::move(*g)), specs, o);
    ASSERT_TRUE(p.has_value()) << p.err().to_string();
    auto r = lower(*p);
    ASSERT_TRUE(r.has_value()) << r.err().to_string();
    const launch_program& prog = **r;
    expect_consistent(prog);
    int parts = 0, replayed_parts = 0, segments = 0;
    std::set<step_id> in_segment;
    for (const auto& ls : prog.steps()) {
      if (ls.replay_steps == 0) continue;
      ++segments;
      for (int i = 0; i < ls.replay_steps; ++i)
        in_segment.insert(prog.queue(ls.queue).steps[static_cast<std::size_t>(ls.pos + i)]);
    }
    for (const auto& s : (*p)->steps()) {
      if (!runs_in_stream(s)) continue;
      ++parts;
      replayed_parts += in_segment.count(s.id) > 0;
    }
    EXPECT_GE(parts, 2 * cfg.n_layers * 2);
    EXPECT_TRUE(prog.has_in_stream_parts());
    if (one_gpu) {
      EXPECT_EQ(replayed_parts, 0);
    } else {
      EXPECT_EQ(replayed_parts, parts);
      EXPECT_GT(segments, 0);
    }
  }
}

// A tensor-parallel decode step on CUDA devices: every all-reduce small
// enough runs in-stream (collective_algo::in_stream). Its parts are steps of
// their device's compute lane 0, one launch record each naming every
// member's operand on its member's device; they neither wait for nor are
// announced to the other devices' producers (met on the devices), and the
// lane's replay segments run through them: the whole step between its input
// copies and its output is one segment per device, so it replays as one
// graph with no host between its layers. The hazard checker accepts the
// plan. Without in-stream collectives (the option off, or messages past the
// devices' limit) the parts take the communication queue, and each one
// splits the lane's segments.
TEST(LaunchProgram, InStreamAllReducesRunOnComputeLaneZeroAndADecodeStepReplaysAsOneSegmentPerDevice) {
  const models::transformer_config cfg = decode_step_config(3);
  for (int degree : {2, 4})
    for (int mode = 0; mode < 3; ++mode) {  // in-stream; option off; limit below the messages
      SCOPED_TRACE("degree " + std::to_string(degree) + " mode " + std::to_string(mode));
      auto g = models::build_transformer(cfg);
      ASSERT_TRUE(g.has_value()) << g.err().to_string();
      plan_options o;
      o.tensor_parallel = degree;
      o.lanes_per_device = 1;
      o.graph_replay = graph_replay_mode::on;
      o.in_stream_collectives = mode != 1 ? in_stream_mode::on : in_stream_mode::off;
      auto p = compile(std::make_shared<const graph>(std::move(*g)), cuda_specs(degree, mode == 2 ? 8 : 256 << 10), o);
      ASSERT_TRUE(p.has_value()) << p.err().to_string();
      EXPECT_TRUE(check_hazards(**p).ok()) << check_hazards(**p).to_string();
      auto r = lower(*p);
      ASSERT_TRUE(r.has_value()) << r.err().to_string();
      const launch_program& prog = **r;
      expect_consistent(prog);
      int all_reduces = 0, in_stream = 0;
      for (const auto& s : (*p)->steps()) {
        if (s.kind != step_kind::collective) continue;
        const node& n = (*p)->source().at(s.ops.front());
        all_reduces += n.op == op_kind::all_reduce;
        if (!runs_in_stream(s)) continue;
        ++in_stream;
        EXPECT_EQ(n.op, op_kind::all_reduce);
        const lowered_step& ls = prog.step(s.id);
        const launch_queue& q = prog.queue(ls.queue);
        EXPECT_EQ(q.kind, step_kind::compute);
        EXPECT_EQ(q.lane, 0);
        EXPECT_TRUE(q.in_stream_parts);
        for (step_id d : ls.remote_deps) EXPECT_EQ(prog.step(d).device, s.device) << "part " << s.id << " waits for another device";
        for (step_id d : s.deps) {
          const auto& cq = prog.step(d).consumer_queues;
          if (prog.step(d).device != s.device) {
            EXPECT_EQ(std::find(cq.begin(), cq.end(), ls.queue), cq.end()) << "step " << d << " announces itself to part " << s.id;
          }
        }
        EXPECT_NE(ls.label.find("in-stream"), std::string::npos) << ls.label;
      }
      EXPECT_GE(all_reduces, 2 * cfg.n_layers * degree) << "two all-reduces per layer, one part per device";
      EXPECT_EQ(prog.has_in_stream_parts(), in_stream > 0);
      if (mode == 0) {
        EXPECT_EQ(in_stream, all_reduces) << "every all-reduce of a decode step is small";
        EXPECT_NE((*p)->describe().find("in-stream"), std::string::npos);
      } else {
        EXPECT_EQ(in_stream, 0);
      }
      // Replay segments: which one holds each step (by its first step).
      std::map<step_id, step_id> segment_of;
      std::map<int, int> segments;  // device -> replayed segments
      for (const auto& ls : prog.steps()) {
        if (ls.replay_steps == 0) continue;
        ++segments[ls.device];
        bool parts = false;
        for (int i = 0; i < ls.replay_steps; ++i) {
          const step_id x = prog.queue(ls.queue).steps[static_cast<std::size_t>(ls.pos + i)];
          segment_of[x] = ls.id;
          parts = parts || runs_in_stream((*p)->at(x));
        }
        EXPECT_EQ(ls.replay_in_stream, parts) << "segment at step " << ls.id;
      }
      for (int d = 0; d < degree; ++d) {
        if (mode != 0) {
          EXPECT_GE(segments[d], 2 * cfg.n_layers) << "device " << d << ": each collective ends a segment";
          continue;
        }
        // The embedding's all-reduce may close a segment of its own (the
        // layers wait for the position input); every layer's lies in one.
        std::vector<step_id> parts;
        for (const auto& s : (*p)->steps())
          if (runs_in_stream(s) && s.device == d) parts.push_back(s.id);
        ASSERT_EQ(static_cast<int>(parts.size()), 2 * cfg.n_layers + 1) << "device " << d;
        for (step_id x : parts) EXPECT_EQ(segment_of.count(x), 1u) << "part " << x << " is not replayed";
        for (std::size_t i = 2; i < parts.size(); ++i)
          EXPECT_EQ(segment_of[parts[i]], segment_of[parts[1]]) << "device " << d << ": the layers are not one segment";
        EXPECT_LE(segments[d], 2) << "device " << d;
      }
    }
}
}  // namespace

// The lowering marks the inputs that are weight leaves (gpu::op_launch::
// weight_inputs), which the CUDA GEMV may read before its PDL wait: a
// product's weight, a norm's weight; never an activation or the KV cache.
// At tensor degree 2 rank 0's o and down products take in the residual add
// before their all-reduce (one residual projection each), rank 1's stay
// plain products of a marked weight.
static void check_weight_inputs_marked(bool fold) {
  SCOPED_TRACE(fold ? "norm weights folded into the projections" : "norms with their weights");
  models::transformer_config cfg = decode_step(models::model_variant::llama, 256);
  cfg.kv_cache_capacity = 32;
  cfg.dtype = dtype::bf16;
  plan_options o;
  o.fuse_ops = false;  // the scores product stays a matmul of the cache
  o.tensor_parallel = 2;
  o.sequence_parallel = sequence_parallel_mode::off;
  o.fold_norm_weights = fold;  // folded, the final norm has no weight: the head's is scaled by it
  const auto [p, prog] = compile_and_lower(cfg, device_kind::cuda, o, 2);
  ASSERT_TRUE(prog);
  int weight_products = 0, activation_products = 0, residual_groups = 0, norms = 0;
  for (std::size_t q = 0; q < prog->queues().size(); ++q) {
    const auto records = prog->launch_records(static_cast<int>(q));
    for (const gpu::op_launch& l : records) {
      if (l.op->op == op_kind::rms_norm && l.fused == gpu::op_launch::fusion::none) {
        ++norms;
        EXPECT_EQ(l.weight_inputs, fold ? 0u : 0b10u) << l.op->name << (fold ? ": {x}" : ": {x, weight}");
      }
      if (l.fused == gpu::op_launch::fusion::projections && l.projection == projection_kind::residual) {
        ++residual_groups;
        EXPECT_EQ(l.op->pinned_device, 0) << l.op->name << ": only rank 0 adds the residual";
        EXPECT_EQ(l.weight_inputs, 0b010u) << l.op->name << ": {x, w, residual}";
        continue;
      }
      if (l.fused != gpu::op_launch::fusion::none || l.op->op != op_kind::matmul) continue;
      const node& b = p->source().at(l.op->inputs[1]);
      node_id root = b.id;
      while (p->source().at(root).is_view()) root = p->source().at(root).inputs[0];
      const bool weight = p->source().at(root).op == op_kind::weight;
      EXPECT_EQ(l.weight_inputs, weight ? 0b10u : 0u) << l.op->name;
      (weight ? weight_products : activation_products) += 1;
    }
  }
  // Per layer: rank 1's o and down (rank 0's are residual groups), and
  // the head on each rank; the scores and weighted sums of each rank.
  EXPECT_EQ(residual_groups, 2 * cfg.n_layers);
  EXPECT_EQ(weight_products, 2 * cfg.n_layers + 2);
  EXPECT_EQ(activation_products, 2 * 2 * cfg.n_layers);
  EXPECT_EQ(norms, 2) << "the final norm on each rank (the others are projection prologues)";
}

TEST(LaunchProgram, WeightInputsAreMarkedForTheKernels) {
  check_weight_inputs_marked(/*fold=*/false);
  check_weight_inputs_marked(/*fold=*/true);
}

// The lowering marks the inputs that the record launched right before on
// the same queue does not write (gpu::op_launch::settled_inputs): a kernel
// that starts early under programmatic dependent launch runs beside that
// one only. The CUDA decode attention then loads its first keys and values
// of the cache before its wait. In a decode step with a cache: the fused
// attention's k and v (the cache) and mask are settled, its q (the q/k/v
// projection's output, the record before) is not; without fusion the
// attention's product reads the cache right after the store_rows that wrote
// it, which is not settled. Weights are always settled.
TEST(LaunchProgram, InputsTheRecordBeforeDoesNotWriteAreSettled) {
  for (const bool fuse : {true, false})
    for (const int degree : {1, 2}) {
      SCOPED_TRACE(std::string(fuse ? "fused" : "unfused") + ", tensor degree " + std::to_string(degree));
      models::transformer_config cfg = decode_step(models::model_variant::llama, 256);
      cfg.kv_cache_capacity = 32;
      cfg.dtype = dtype::bf16;
      plan_options o;
      o.fuse_ops = fuse;
      o.tensor_parallel = degree;
      const auto [p, prog] = compile_and_lower(cfg, device_kind::cuda, o, degree);
      ASSERT_TRUE(prog);
      const graph& g = p->source();
      const auto root = [&](node_id n) {
        while (g.at(n).is_view()) n = g.at(n).inputs[0];
        return n;
      };
      int attentions = 0, after_producer = 0;
      for (std::size_t q = 0; q < prog->queues().size(); ++q) {
        const auto records = prog->launch_records(static_cast<int>(q));
        for (std::size_t r = 0; r < records.size(); ++r) {
          const gpu::op_launch& l = records[r];
          EXPECT_EQ(l.settled_inputs & l.weight_inputs, l.weight_inputs) << l.op->name << ": weights are settled";
          if (l.fused == gpu::op_launch::fusion::attention) {
            ++attentions;
            ASSERT_TRUE(l.attention.masked && l.attention.store_new_rows) << l.op->name;
            EXPECT_EQ(l.settled_inputs & 0b1111u, 0b1110u) << l.op->name << ": {q, k, v, mask}";
          }
          // A plain record that reads the previous plain record's output.
          if (r == 0 || l.fused != gpu::op_launch::fusion::none || records[r - 1].fused != gpu::op_launch::fusion::none)
            continue;
          for (std::size_t i = 0; i < l.op->inputs.size() && i < l.inputs.size(); ++i)
            if (root(l.op->inputs[i]) == records[r - 1].op->id) {
              ++after_producer;
              EXPECT_EQ((l.settled_inputs >> i) & 1u, 0u)
                  << l.op->name << " input " << i << " is " << records[r - 1].op->name << "'s output";
            }
        }
      }
      EXPECT_EQ(attentions, fuse ? cfg.n_layers * degree : 0);
      EXPECT_GT(after_producer, 0);
    }
}

// The job's input copies get the first step ids, so each is the first step
// of its queue: a decode step's positions under tensor parallelism, read
// from the first layer on (after the embedding and its all-reduce), is
// inlined on the compute lane like the tokens. With in-stream all-reduces a
// device's whole step (embedding, all-reduce, layers, head) is then one
// replay segment, one graph launch per job and device.
TEST(LaunchProgram, InputCopiesComeFirstSoADecodeStepAtDegreeTwoIsOneSegmentPerDevice) {
  models::transformer_config cfg = decode_step(models::model_variant::llama, 256);
  cfg.dtype = dtype::bf16;
  plan_options o;
  o.tensor_parallel = 2;
  o.in_stream_collectives = in_stream_mode::on;
  auto g = models::build_transformer(cfg);
  ASSERT_TRUE(g.has_value()) << g.err().to_string();
  std::vector<device_spec> specs(2);
  for (int k = 0; k < 2; ++k) {
    specs[static_cast<std::size_t>(k)].name = "cuda" + std::to_string(k);
    specs[static_cast<std::size_t>(k)].kind = device_kind::cuda;
    specs[static_cast<std::size_t>(k)].in_stream_max_bytes = 256 * 1024;  // the CUDA backend's default
  }
  auto compiled = compile(std::make_shared<const graph>(std::move(*g)), specs, o);
  ASSERT_TRUE(compiled.has_value()) << compiled.err().to_string();
  const std::shared_ptr<const plan> p = *compiled;
  EXPECT_TRUE(check_hazards(*p).ok()) << check_hazards(*p).to_string();
  int in_stream = 0;
  for (const step& st : p->steps()) in_stream += st.kind == step_kind::collective && st.algo == collective_algo::in_stream;
  EXPECT_GT(in_stream, 0);
  int h2d = 0;
  for (const step& st : p->steps()) {
    if (st.kind != step_kind::copy_h2d) continue;
    ++h2d;
    EXPECT_TRUE(st.on_compute_stream) << "input copy step " << st.id << " on device " << st.device;
    for (const step& c : p->steps())
      if (on_compute_lane(c) && c.device == st.device && c.lane == st.lane && c.kind != step_kind::copy_h2d) {
        EXPECT_LT(st.lane_seq, c.lane_seq) << "input copy step " << st.id << " before step " << c.id;
      }
  }
  EXPECT_EQ(h2d, 4) << "tokens and positions on each device";
  // The segment that starts with a device's embedding runs through every
  // layer, its all-reduces included, to the final norm (device 0 then
  // gathers the logits: a segment of its own, after a peer copy).
  int whole = 0;
  for (const replay_segment& seg : replay_segments(*p)) {
    std::set<std::string> names;
    int parts = 0;
    for (step_id x : seg.steps) {
      for (node_id op : p->at(x).ops) names.insert(p->source().at(op).name);
      parts += p->at(x).kind == step_kind::collective;
    }
    const std::string at = "@" + std::to_string(seg.device);
    if (!names.count("embed" + at)) continue;
    ++whole;
    EXPECT_TRUE(names.count("norm" + at)) << "device " << seg.device << ": the body is not one segment";
    EXPECT_EQ(parts, 1 + 2 * cfg.n_layers) << "device " << seg.device << ": the embedding's and each layer's all-reduces";
  }
  EXPECT_EQ(whole, 2);
  // Without in-stream all-reduces (NCCL's queue) the segments end at each
  // all-reduce, but the copies are still inlined.
  o.in_stream_collectives = in_stream_mode::off;
  const auto [q, qprog] = compile_and_lower(cfg, device_kind::cuda, o, 2);
  ASSERT_TRUE(q);
  ASSERT_TRUE(qprog);
  for (const step& st : q->steps())
    if (st.kind == step_kind::copy_h2d) { EXPECT_TRUE(st.on_compute_stream) << "input copy step " << st.id; }
}

// The decode-step fusion (plan_options::fuse_decode_step, gpu::op_launch::
// fusion::decode_step): a whole LLaMA decode step (batch 1, one token, a KV
// cache, bf16) on one CUDA device lowers to one record whose inputs follow
// gpu::op_launch's order; anything else keeps its records and the launch
// program says why.
namespace {

/// The shape the kernel takes: d 256, 4 heads of 64, 2 kv heads, ff 512,
/// vocab 1000, a cache of 80 rows, bf16, batch 1, one token; shapes only.
models::transformer_config whole_decode_step(int layers) {
  models::transformer_config cfg = decode_step_config(layers);
  cfg.d_model = 256;
  cfg.n_heads = 4;
  cfg.n_kv_heads = 2;
  cfg.d_ff = 512;
  cfg.vocab = 1000;
  cfg.kv_cache_capacity = 80;
  return cfg;
}

/// What the generator's plans hold (state_slots 2 as it plans them).
plan_options decode_step_options(bool fuse = true) {
  plan_options o;
  o.state_slots = 2;
  o.fuse_decode_step = fuse;
  return o;
}

/// Every compute record of `prog`, in step order: node name and fusion.
std::vector<std::pair<std::string, gpu::op_launch::fusion>> compute_records(const launch_program& prog) {
  std::vector<std::pair<std::string, gpu::op_launch::fusion>> r;
  for (const lowered_step& ls : prog.steps())
    for (const auto& op : ls.ops) r.emplace_back(op.op->name, op.fused);
  return r;
}

/// The one record of `prog`'s fused decode step; null when the step is not
/// fused or the program has more records than that one.
const actors::lowered_op* decode_step_record(const launch_program& prog) {
  if (!prog.decode_step_fused()) return nullptr;
  const actors::lowered_op* one = nullptr;
  for (const lowered_step& ls : prog.steps()) {
    if (ls.ops.empty()) continue;
    if (one || ls.ops.size() != 1) return nullptr;
    one = &ls.ops.front();
  }
  return one;
}

/// The greedy forms of the generator's step plans (actors/generator.cpp);
/// token_state_rows: token_states in row 0 of states of 4 rows (a batched
/// generator's one-token steps, transformer_config::token_state_rows).
enum class step_form { logits, argmax, token_state_out, token_states, token_state_rows };


// Folded lanes (plan_options::fold_lanes, on by default under replay): a
// device whose plan uses several compute lanes runs them from one queue,
// its lane 0, in an order that keeps every lane's own order and every dep;
// each step keeps its plan lane as its capture lane. Its replay segments are
// runs of that queue whose inner steps wait for no remote step their first
// did not, and feed no other queue but at their end; each step lists its
// deps inside the segment, and the first step the lanes the segment uses.
// With the option off, or replay off, every lane has its own queue.
TEST(LaunchProgram, FoldedLanesRunFromOneQueueInDepOrder) {
  int folded_devices = 0, spanning_segments = 0;
  for (uint64_t seed = 1; seed <= 24; ++seed) {
    const int devices = 1 + static_cast<int>(seed % 2), lanes = 2 + static_cast<int>(seed % 3);
    auto p = random_plan(seed, devices, lanes, graph_replay_mode::on);
    auto prog = lower(p).value();
    expect_consistent(*prog);
    std::map<int, int> plan_lanes;  // by device: its highest compute lane + 1
    std::set<std::pair<int, int>> used_lanes;  // (device, lane)
    for (const step& s : p->steps())
      if (on_compute_lane(s)) {
        plan_lanes[s.device] = std::max(plan_lanes[s.device], s.lane + 1);
        used_lanes.insert({s.device, s.lane});
      }
    for (int d = 0; d < devices; ++d) {
      const int want = plan_lanes[d] >= 2 ? plan_lanes[d] : 0;
      ASSERT_EQ(prog->folded_lanes(d), want) << "seed " << seed << " device " << d;
      if (want == 0) continue;
      ++folded_devices;
      int compute_queues = 0;
      for (const auto& q : prog->queues()) compute_queues += q.device == d && q.kind == step_kind::compute;
      EXPECT_EQ(compute_queues, 1) << "seed " << seed << ": a folded device has one compute queue";
      const int q = prog->find_queue(d, step_kind::compute, 0);
      ASSERT_GE(q, 0);
      const auto& order = prog->queue(q).steps;
      std::map<int, int> last_seq;  // by plan lane: lane_seq of its last step so far
      std::set<step_id> issued;
      for (step_id s : order) {
        const step& ps = p->at(s);
        EXPECT_EQ(prog->step(s).capture_lane, ps.lane) << "seed " << seed << " step " << s;
        if (last_seq.count(ps.lane)) { EXPECT_LT(last_seq[ps.lane], ps.lane_seq) << "seed " << seed << ": lane order lost"; }
        last_seq[ps.lane] = ps.lane_seq;
        for (step_id dep : ps.deps)
          if (prog->step(dep).queue == q) { EXPECT_TRUE(issued.count(dep)) << "seed " << seed << ": step " << s << " before its dep " << dep; }
        issued.insert(s);
      }
      // Segments: consecutive runs of the queue.
      for (std::size_t i = 0; i < order.size(); ++i) {
        const lowered_step& first = prog->step(order[i]);
        if (first.replay_steps == 0) {
          EXPECT_TRUE(first.segment_deps.empty());
          continue;
        }
        int top_lane = 0;
        std::set<step_id> members;
        for (int k = 0; k < first.replay_steps; ++k) members.insert(order[i + static_cast<std::size_t>(k)]);
        for (int k = 0; k < first.replay_steps; ++k) {
          const lowered_step& ls = prog->step(order[i + static_cast<std::size_t>(k)]);
          top_lane = std::max(top_lane, ls.capture_lane);
          if (k > 0) {
            EXPECT_EQ(ls.replay_steps, 0);
            for (step_id r : ls.remote_deps)
              EXPECT_NE(std::find(first.remote_deps.begin(), first.remote_deps.end(), r), first.remote_deps.end())
                  << "seed " << seed << ": step " << ls.id << " waits for a remote step its segment's launch does not";
          }
          if (k + 1 < first.replay_steps) { EXPECT_TRUE(ls.consumer_queues.empty()) << "seed " << seed; }
          std::set<step_id> want_deps;
          for (step_id dep : p->at(ls.id).deps)
            if (members.count(dep)) want_deps.insert(dep);
          EXPECT_EQ(std::set<step_id>(ls.segment_deps.begin(), ls.segment_deps.end()), want_deps) << "seed " << seed;
        }
        EXPECT_EQ(first.replay_lanes, top_lane + 1) << "seed " << seed;
        spanning_segments += top_lane > 0;
        i += static_cast<std::size_t>(first.replay_steps) - 1;
      }
    }
    // Unfolded: a queue per lane, as the plan says.
    for (auto [mode, fold] : {std::pair{graph_replay_mode::on, false}, std::pair{graph_replay_mode::off, true}}) {
      auto unfolded = lower(random_plan(seed, devices, lanes, mode, fold)).value();
      for (int d = 0; d < devices; ++d) EXPECT_EQ(unfolded->folded_lanes(d), 0);
      int compute_queues = 0;
      for (const auto& q : unfolded->queues()) compute_queues += q.kind == step_kind::compute;
      EXPECT_EQ(compute_queues, static_cast<int>(used_lanes.size())) << "seed " << seed;
    }
  }
  EXPECT_GT(folded_devices, 10);
  EXPECT_GT(spanning_segments, 5) << "no segment spanned two lanes";
}

}  // namespace

TEST(LaunchProgram, AWholeLlamaDecodeStepIsOneRecordOnOneCudaDevice) {
  using fusion = gpu::op_launch::fusion;
  for (int layers : {2, 3})
    for (step_form form : {step_form::logits, step_form::argmax, step_form::token_state_out, step_form::token_states,
                           step_form::token_state_rows})
      for (bool fold : {true, false}) {
        SCOPED_TRACE(std::to_string(layers) + " layers, form " + std::to_string(static_cast<int>(form)) +
                     (fold ? ", norm weights folded" : ", norm weights read"));
        models::transformer_config cfg = whole_decode_step(layers);
        cfg.argmax_output = form != step_form::logits;
        const bool in_state = form == step_form::token_states || form == step_form::token_state_rows;
        if (form == step_form::token_state_out || in_state) cfg.token_state_out = "token_state_b";
        if (in_state) cfg.token_state_in = "token_state_a";
        if (form == step_form::token_state_rows) cfg.token_state_rows = 4;
        plan_options o = decode_step_options();
        o.fold_norm_weights = fold;
        const auto [p, prog] = compile_and_lower(cfg, device_kind::cuda, o);  // hazards checked there
        ASSERT_TRUE(prog);
        EXPECT_TRUE(prog->decode_step_fused()) << prog->decode_step_note();
        EXPECT_EQ(prog->decode_step_note(), "decode step: one kernel (" + std::to_string(layers) + " layers)");
        EXPECT_NE(p->describe().find("decode step: may run as one kernel"), std::string::npos) << p->describe();
        const auto records = compute_records(*prog);
        ASSERT_EQ(records.size(), 1u) << "the step's records become one";
        const lowered_step* step = nullptr;
        for (const lowered_step& ls : prog->steps())
          if (!ls.ops.empty()) step = &ls;
        ASSERT_NE(step, nullptr);
        const actors::lowered_op& r = step->ops.front();
        ASSERT_EQ(r.fused, fusion::decode_step);
        const auto& ds = r.decode_step;
        EXPECT_EQ(ds.layers, layers);
        EXPECT_EQ(ds.d_model, 256);
        EXPECT_EQ(ds.d_ff, 512);
        EXPECT_EQ(ds.heads, 4);
        EXPECT_EQ(ds.kv_heads, 2);
        EXPECT_EQ(ds.head_dim, 64);
        EXPECT_EQ(ds.vocab, 1000);
        EXPECT_EQ(ds.cache_rows, 80);
        EXPECT_FLOAT_EQ(ds.eps, cfg.eps);
        EXPECT_FLOAT_EQ(ds.rope_theta, cfg.rope_theta);
        EXPECT_FLOAT_EQ(ds.scale, 1.0f / std::sqrt(64.0f));
        EXPECT_EQ(ds.argmax, cfg.argmax_output);
        EXPECT_EQ(ds.norm_weighted, !fold);
        EXPECT_EQ(ds.final_norm_weighted, !fold);
        const std::size_t per_layer = gpu::op_launch::decode_step_layer_inputs + (fold ? 0u : 2u);
        const std::size_t first_layer = fold ? 6u : 7u;
        ASSERT_EQ(r.inputs.size(), first_layer + static_cast<std::size_t>(layers) * per_layer);
        const auto expect = [&](std::size_t i, region where, dtype t, const shape& dims, const char* what) {
          SCOPED_TRACE("input " + std::to_string(i) + ": " + what);
          EXPECT_EQ(r.inputs[i].where, where);
          EXPECT_EQ(r.inputs[i].proto.type, t);
          if (dims.rank() > 0) {
            EXPECT_EQ(r.inputs[i].proto.dims, dims);
          } else {
            EXPECT_EQ(r.inputs[i].proto.dims.numel(), 1);
          }
        };
        // The token: the job's input (in the arena), or the state the
        // slot's previous job kept it in.
        expect(0, in_state ? region::state : region::arena, dtype::i32, {}, "the token");
        expect(1, region::weights, dtype::bf16, {1000, 256}, "the embedding");
        expect(2, region::arena, dtype::i32, {}, "the rope positions");
        expect(3, region::arena, dtype::i32, {}, "the cache positions");
        expect(4, region::arena, dtype::bf16, {1, 80}, "the mask");
        expect(5, region::weights, dtype::bf16, {1000, 256}, "the head");
        if (!fold) expect(6, region::weights, dtype::bf16, {256}, "the final norm's weight");
        for (int l = 0; l < layers; ++l) {
          const std::size_t b = first_layer + static_cast<std::size_t>(l) * per_layer;
          SCOPED_TRACE("layer " + std::to_string(l + 1));
          expect(b + 0, region::weights, dtype::bf16, {256, 256}, "w_q");
          expect(b + 1, region::weights, dtype::bf16, {128, 256}, "w_k");
          expect(b + 2, region::weights, dtype::bf16, {128, 256}, "w_v");
          expect(b + 3, region::state, dtype::bf16, {1, 2, 80, 64}, "the k cache");
          expect(b + 4, region::state, dtype::bf16, {1, 2, 80, 64}, "the v cache");
          EXPECT_NE(r.inputs[b + 3].byte_offset, r.inputs[b + 4].byte_offset);
          expect(b + 5, region::weights, dtype::bf16, {256, 256}, "w_o");
          expect(b + 6, region::weights, dtype::bf16, {512, 256}, "w_gate");
          expect(b + 7, region::weights, dtype::bf16, {512, 256}, "w_up");
          expect(b + 8, region::weights, dtype::bf16, {256, 512}, "w_down");
          if (!fold) {
            expect(b + 9, region::weights, dtype::bf16, {256}, "the attention's norm weight");
            expect(b + 10, region::weights, dtype::bf16, {256}, "the MLP's norm weight");
          }
        }
        // The output: the step's last op's, the logits or the greedy token.
        const std::string last = form == step_form::logits   ? "logits"
                                 : form == step_form::argmax ? "next_token"
                                                             : "token_state_b";
        EXPECT_EQ(r.op->name, last);
        EXPECT_EQ(r.out.proto.type, cfg.argmax_output ? dtype::i32 : dtype::f32);
        EXPECT_EQ(r.out.proto.dims.numel(), form == step_form::token_state_rows ? 4 : cfg.argmax_output ? 1 : 1000);
        EXPECT_EQ(r.out.where, form == step_form::logits || form == step_form::argmax ? region::arena : region::state);
        // Its launch record carries the parameters; the weight mask has
        // bits for inputs below 32 only (the embedding and the head, the
        // first layers' weights), never for the token or the caches.
        for (std::size_t q = 0; q < prog->queues().size(); ++q)
          for (const gpu::op_launch& l : prog->launch_records(static_cast<int>(q))) {
            ASSERT_EQ(l.fused, fusion::decode_step);
            EXPECT_EQ(l.decode_step.layers, layers);
            EXPECT_EQ(l.decode_step.vocab, 1000);
            EXPECT_EQ(l.inputs.size(), r.inputs.size());
            for (std::size_t i = 0; i < 32 && i < r.inputs.size(); ++i)
              EXPECT_EQ((l.weight_inputs >> i) & 1u, r.inputs[i].where == region::weights ? 1u : 0u) << "input " << i;
          }
        // Replayed as a segment of that one record.
        int replayed = 0;
        for (const lowered_step& ls : prog->steps())
          if (ls.replay_steps > 0) {
            ++replayed;
            EXPECT_EQ(ls.replay_records, 1);
          }
        EXPECT_GT(replayed, 0);
      }
  // A head tied to the embedding: inputs 1 and 5 are the one table (the
  // final norm keeps its weight: the table is not scaled by it).
  models::transformer_config tied = whole_decode_step(2);
  tied.head = models::head_tying::tied;
  const auto [p, prog] = compile_and_lower(tied, device_kind::cuda, decode_step_options());
  ASSERT_TRUE(prog);
  ASSERT_TRUE(prog->decode_step_fused()) << prog->decode_step_note();
  for (const lowered_step& ls : prog->steps()) {
    if (ls.ops.empty()) continue;
    const actors::lowered_op& r = ls.ops.front();
    EXPECT_EQ(r.inputs[1].where, r.inputs[5].where);
    EXPECT_EQ(r.inputs[1].byte_offset, r.inputs[5].byte_offset);
    EXPECT_EQ(r.inputs.size(), (r.decode_step.final_norm_weighted ? 7u : 6u) + 2u * 9u);
  }
  // Llama 3.1 8B's widths (d_ff 14336, heads of 128) fuse (two chunks a warp).
  models::transformer_config wide = whole_decode_step(2);
  wide.d_model = 512;
  wide.n_heads = 4;
  wide.d_ff = 14336;
  const auto [pw, progw] = compile_and_lower(wide, device_kind::cuda, decode_step_options());
  ASSERT_TRUE(progw);
  EXPECT_TRUE(progw->decode_step_fused()) << progw->decode_step_note();
  // Llama 3's steps: the RoPE scaling travels in the record, and 128,256
  // logits are within the kernel's vocabulary (its head goes in parts).
  models::transformer_config llama3 = whole_decode_step(2);
  llama3.vocab = 128256;
  llama3.head = models::head_tying::tied;
  llama3.rope_scale = {32.0f, 1.0f, 4.0f, 8192};
  const auto [p3, prog3] = compile_and_lower(llama3, device_kind::cuda, decode_step_options());
  ASSERT_TRUE(prog3);
  ASSERT_TRUE(prog3->decode_step_fused()) << prog3->decode_step_note();
  for (const lowered_step& ls : prog3->steps())
    if (!ls.ops.empty()) {
      EXPECT_EQ(ls.ops.front().decode_step.vocab, 128256);
      EXPECT_EQ(ls.ops.front().decode_step.rope_scale, llama3.rope_scale);
    }
}

// Heads of another width than d_model / heads (HF's head_dim: 4 heads of
// 128 on d_model 256) and a d_ff of 5 x 128 (as half of LLaMA-2-7B's 11008
// is 43 x 128) still make the one-kernel step, with the heads' width taken
// from the caches and q's weight, not from d_model.
// The whole step takes caches of up to decode_step_max_cache_rows (2048)
// rows; a longer one (a 16k context's 16,384 + 128) keeps its records, the
// attention fused with its cache prologue all the same (the split kernel
// takes any number of keys), and the note says why.
TEST(LaunchProgram, ADecodeStepOverACacheOfMoreThan2048RowsKeepsItsRecords) {
  for (int64_t rows : {int64_t{2048}, int64_t{16512}}) {
    SCOPED_TRACE(std::to_string(rows) + " cache rows");
    models::transformer_config cfg = whole_decode_step(2);
    cfg.kv_cache_capacity = rows;
    const auto [p, prog] = compile_and_lower(cfg, device_kind::cuda, decode_step_options());
    ASSERT_TRUE(prog);
    const bool whole = rows <= decode_step_max_cache_rows;
    EXPECT_EQ(prog->decode_step_fused(), whole) << prog->decode_step_note();
    int fused = 0;
    for (const lowered_step& ls : prog->steps())
      for (const auto& op : ls.ops) {
        if (op.fused == gpu::op_launch::fusion::decode_step) { EXPECT_EQ(op.decode_step.cache_rows, rows); }
        fused += op.fused == gpu::op_launch::fusion::attention && op.attention.store_new_rows;
      }
    if (whole) {
      EXPECT_EQ(compute_records(*prog).size(), 1u);
    } else {
      EXPECT_EQ(fused, 2) << "each layer's attention one record with its prologue";
      EXPECT_NE(prog->decode_step_note().find("a cache of 16512 rows (more than 2048"), std::string::npos)
          << prog->decode_step_note();
    }
  }
}

// plan_options::decode_step_max_cache_rows raised to the cache's rows (what
// the generator does for its short-sequence twins) makes the one-kernel
// step over 16,512 rows; one row less than the cache keeps the records;
// 0 is refused naming the option.
TEST(LaunchProgram, ARaisedCacheRowLimitMakesTheOneKernelStepOverALongCache) {
  models::transformer_config cfg = whole_decode_step(2);
  cfg.kv_cache_capacity = 16512;
  for (const int64_t limit : {int64_t{16512}, int64_t{16511}}) {
    SCOPED_TRACE("limit " + std::to_string(limit));
    plan_options o = decode_step_options();
    o.decode_step_max_cache_rows = limit;
    const auto [p, prog] = compile_and_lower(cfg, device_kind::cuda, o);
    ASSERT_TRUE(prog);
    EXPECT_EQ(prog->decode_step_fused(), limit >= 16512) << prog->decode_step_note();
    if (prog->decode_step_fused()) {
      EXPECT_EQ(compute_records(*prog).size(), 1u);
      for (const lowered_step& ls : prog->steps())
        for (const auto& op : ls.ops)
          if (op.fused == gpu::op_launch::fusion::decode_step) {
            EXPECT_EQ(op.decode_step.cache_rows, 16512);
          }
    } else {
      EXPECT_NE(prog->decode_step_note().find("more than 16511"), std::string::npos) << prog->decode_step_note();
    }
  }
  auto g = models::build_transformer(cfg);
  ASSERT_TRUE(g) << g.err().to_string();
  plan_options bad = decode_step_options();
  bad.decode_step_max_cache_rows = 0;
  device_spec cuda;
  cuda.name = "cuda0";
  cuda.kind = device_kind::cuda;
  auto refused = compile(std::make_shared<const graph>(std::move(*g)), {cuda}, bad);
  ASSERT_FALSE(refused);
  EXPECT_NE(refused.err().message.find("decode_step_max_cache_rows"), std::string::npos) << refused.err().message;
}

TEST(LaunchProgram, ADecodeStepWithHeadsOfAnotherWidthIsOneKernel) {
  models::transformer_config cfg = whole_decode_step(2);
  cfg.explicit_head_dim = 128;
  cfg.d_ff = 640;
  const auto [p, prog] = compile_and_lower(cfg, device_kind::cuda, decode_step_options());
  ASSERT_TRUE(prog);
  ASSERT_TRUE(prog->decode_step_fused()) << prog->decode_step_note();
  int steps = 0;
  for (const lowered_step& ls : prog->steps()) {
    if (ls.ops.empty()) continue;
    ++steps;
    const auto& ds = ls.ops.front().decode_step;
    EXPECT_EQ(ds.d_model, 256);
    EXPECT_EQ(ds.heads, 4);
    EXPECT_EQ(ds.kv_heads, 2);
    EXPECT_EQ(ds.head_dim, 128);
    EXPECT_EQ(ds.d_ff, 640);
    EXPECT_FLOAT_EQ(ds.scale, 1.0f / std::sqrt(128.0f));
  }
  EXPECT_EQ(steps, 1);
}

// Qwen2's q/k/v biases (three add records after each layer's q/k/v) are
// part of the one-kernel step: 3 more operands a layer, the biases of q, k
// and v in that order; Qwen2.5-0.5B's widths (d_model 896, 14 heads of 64
// over 2 kv heads, d_ff 4864: multiples of 128, not of 256) fit.
TEST(LaunchProgram, ADecodeStepWithQwen2BiasesIsOneKernel) {
  models::transformer_config cfg = whole_decode_step(2);
  cfg.attn_bias = models::attention_bias::qkv;
  cfg.n_heads = 14;
  cfg.n_kv_heads = 2;
  cfg.d_model = 896;
  cfg.d_ff = 4864;
  const auto [p, prog] = compile_and_lower(cfg, device_kind::cuda, decode_step_options());
  ASSERT_TRUE(prog);
  const actors::lowered_op* one = decode_step_record(*prog);
  ASSERT_NE(one, nullptr) << "one fused record: " << prog->decode_step_note();
  const actors::lowered_op& op = *one;
  EXPECT_TRUE(op.decode_step.qkv_bias);
  EXPECT_EQ(op.decode_step.d_model, 896);
  EXPECT_EQ(op.decode_step.heads, 14);
  const std::size_t globals = 6 + (op.decode_step.final_norm_weighted ? 1 : 0);
  const std::size_t per_layer = gpu::op_launch::decode_step_layer_inputs + (op.decode_step.norm_weighted ? 2 : 0) + 3;
  ASSERT_EQ(op.inputs.size(), globals + 2 * per_layer);
  for (std::size_t l = 0; l < 2; ++l) {
    const std::size_t b = globals + per_layer * (l + 1) - 3;
    EXPECT_EQ(op.inputs[b].proto.dims.numel(), 14 * 64) << "q's bias, layer " << l;
    EXPECT_EQ(op.inputs[b + 1].proto.dims.numel(), 2 * 64) << "k's bias, layer " << l;
    EXPECT_EQ(op.inputs[b + 2].proto.dims.numel(), 2 * 64) << "v's bias, layer " << l;
  }
  // Without the fusion: 8 records a layer (q/k/v, its three bias adds, attention, o, MLP, down).
  const auto [p_off, off] = compile_and_lower(cfg, device_kind::cuda, decode_step_options(false));
  ASSERT_TRUE(off);
  EXPECT_EQ(compute_records(*off).size(), 1u + 8u * 2u + 3u);
}

// Qwen3's q/k norms (two rms_norm records after each layer's q/k/v, or
// after its bias adds) are part of the one-kernel step too: 2 more operands
// a layer, q's then k's norm weight [dh], after the biases. Qwen3-0.6B's
// widths (d_model 1024, 16 heads of 128 over 8 kv heads: the heads' width
// 2048 twice d_model, d_ff 3072), and a step with both biases and norms.
TEST(LaunchProgram, ADecodeStepWithQwen3QkNormsIsOneKernel) {
  for (const bool biased : {false, true}) {
    SCOPED_TRACE(biased ? "q/k/v biases and q/k norms" : "q/k norms");
    models::transformer_config cfg = whole_decode_step(2);
    cfg.qk_norm = true;
    if (biased) cfg.attn_bias = models::attention_bias::qkv;
    cfg.d_model = 1024;
    cfg.n_heads = 16;
    cfg.n_kv_heads = 8;
    cfg.explicit_head_dim = 128;
    cfg.d_ff = 3072;
    const auto [p, prog] = compile_and_lower(cfg, device_kind::cuda, decode_step_options());
    ASSERT_TRUE(prog);
    const actors::lowered_op* one = decode_step_record(*prog);
    ASSERT_NE(one, nullptr) << "one fused record: " << prog->decode_step_note();
    const actors::lowered_op& op = *one;
    const auto& ds = op.decode_step;
    EXPECT_TRUE(ds.qk_norm);
    EXPECT_EQ(ds.qkv_bias, biased);
    EXPECT_EQ(ds.heads, 16);
    EXPECT_EQ(ds.head_dim, 128);
    EXPECT_EQ(ds.d_model, 1024);
    const std::size_t per_layer = ds.layer_operands();
    EXPECT_EQ(per_layer, gpu::op_launch::decode_step_layer_inputs + (ds.norm_weighted ? 2u : 0u) + (biased ? 5u : 2u));
    ASSERT_EQ(op.inputs.size(), ds.global_operands() + 2 * per_layer);
    for (std::size_t l = 0; l < 2; ++l) {
      const std::size_t last = ds.global_operands() + per_layer * (l + 1);
      for (std::size_t i : {last - 2, last - 1}) {
        EXPECT_EQ(op.inputs[i].proto.dims, shape({128})) << "layer " << l << ", operand " << i;
        EXPECT_EQ(op.inputs[i].where, region::weights) << "layer " << l << ", operand " << i;
      }
      if (biased) {
        EXPECT_EQ(op.inputs[last - 5].proto.dims.numel(), 16 * 128) << "q's bias before the norms";
      }
    }
    // Without the fusion: 7 records a layer (q/k/v, the q and k norms,
    // attention, o, MLP, down), 10 with the bias adds.
    const auto [p_off, off] = compile_and_lower(cfg, device_kind::cuda, decode_step_options(false));
    ASSERT_TRUE(off);
    EXPECT_EQ(compute_records(*off).size(), 1u + (biased ? 10u : 7u) * 2u + 3u);
  }
}

// Not the kernel's step: the records stay as they are without the fusion
// and the note names why.
// The kernel writes its greedy token at its output's first element: a step
// that keeps it in a state of several rows fuses only when the row is 0
// (its store position a constant 0). The same step with the positions'
// constant changed to start at row 2 keeps its records.
TEST(LaunchProgram, ADecodeStepKeepingItsTokenPastRowZeroOfItsStateKeepsItsRecords) {
  models::transformer_config cfg = whole_decode_step(2);
  cfg.argmax_output = true;
  cfg.token_state_in = "token_state_a";
  cfg.token_state_out = "token_state_b";
  cfg.token_state_rows = 4;
  for (const int32_t first_row : {0, 2}) {
    SCOPED_TRACE("row " + std::to_string(first_row));
    auto g = models::build_transformer(cfg);
    ASSERT_TRUE(g.has_value()) << g.err().to_string();
    std::vector<node> nodes(g->nodes().begin(), g->nodes().end());
    bool found = false;
    for (node& n : nodes)
      if (n.name == "token_state.rows") {
        n.data = make_host_weight(host_tensor::from_ints({4}, {first_row, first_row + 1, first_row + 2, first_row + 3}));
        found = true;
      }
    ASSERT_TRUE(found) << "no constant token_state.rows";
    std::vector<node_id> ins(g->inputs().begin(), g->inputs().end()), outs(g->outputs().begin(), g->outputs().end());
    auto changed = graph::from_nodes(std::move(nodes), std::move(ins), std::move(outs));
    ASSERT_TRUE(changed.has_value()) << changed.err().to_string();
    device_spec d;
    d.name = "cuda0";
    d.kind = device_kind::cuda;
    auto p = compile(std::make_shared<const graph>(std::move(*changed)), {d}, decode_step_options());
    ASSERT_TRUE(p.has_value()) << p.err().to_string();
    auto prog = lower(*p);
    ASSERT_TRUE(prog.has_value()) << prog.err().to_string();
    EXPECT_EQ((*prog)->decode_step_fused(), first_row == 0) << (*prog)->decode_step_note();
    if (first_row != 0) {
      EXPECT_NE((*prog)->decode_step_note().find("keeps no greedy token of its own"), std::string::npos)
          << (*prog)->decode_step_note();
    }
  }
}

TEST(LaunchProgram, ADecodeStepOutsideTheKernelsPatternOrShapesKeepsItsRecords) {
  struct refused {
    std::string what;
    models::transformer_config cfg;
    device_kind kind = device_kind::cuda;
    int tensor_parallel = 1;
    bool fuse = true;
    std::string why;  ///< a part of the note
  };
  const models::transformer_config llama = whole_decode_step(2);
  std::vector<refused> cases;
  cases.push_back({"the option off", llama, device_kind::cuda, 1, false, "fuse_decode_step off"});
  cases.push_back({"a sim device", llama, device_kind::sim, 1, true, "not on a CUDA device"});
  models::transformer_config c = llama;
  c.batch = 2;
  cases.push_back({"batch 2", c, device_kind::cuda, 1, true, "batch 1"});
  c = llama;
  c.dtype = dtype::f32;
  cases.push_back({"f32", c, device_kind::cuda, 1, true, "not bf16"});
  c = llama;
  c.variant = models::model_variant::gpt2;
  c.n_kv_heads = 0;
  cases.push_back({"GPT-2", c, device_kind::cuda, 1, true, "not fused: "});
  c = llama;
  c.d_model = 128;  // 4 heads of 32
  c.d_ff = 256;
  cases.push_back({"heads of 32", c, device_kind::cuda, 1, true, "heads of 32"});
  cases.push_back({"tensor parallel 2", llama, device_kind::cuda, 2, true, "tensor parallel"});
  c = llama;
  c.d_model = 320;  // 5 heads of 64
  c.n_heads = 5;
  c.n_kv_heads = 5;
  cases.push_back({"d_model 320", c, device_kind::cuda, 1, true,
                   "d_model, d_ff or the heads' width not a multiple of 128"});
  c = llama;
  c.d_ff = 4096 + 64;
  cases.push_back({"d_ff 4160", c, device_kind::cuda, 1, true, "d_model, d_ff or the heads' width not a multiple of 128"});
  c = llama;
  c.attn_bias = models::attention_bias::qkv_o;  // LLaMA's attention_bias: o's bias too
  cases.push_back({"q/k/v/o biases", c, device_kind::cuda, 1, true, "8 a layer"});
  c = llama;
  c.qk_norm = true;  // Qwen3's q/k norms with heads of 32: the pattern matches, the shape does not
  c.d_model = 128;
  c.d_ff = 256;
  cases.push_back({"q/k norms, heads of 32", c, device_kind::cuda, 1, true, "heads of 32"});
  c = llama;
  c.kv_cache_capacity = 0;
  cases.push_back({"no KV cache", c, device_kind::cuda, 1, true, "KV cache"});
  c = llama;
  c.d_ff = 8448;  // over 8192 with heads of 64: the wide kernel takes heads of 128 only
  cases.push_back({"d_ff 8448, heads of 64", c, device_kind::cuda, 1, true, "with heads of 64"});
  c = llama;
  c.vocab = decode_step_max_vocab + 1;
  cases.push_back({"a vocabulary over the kernel's", c, device_kind::cuda, 1, true, "a vocabulary of"});
  for (const refused& k : cases) {
    SCOPED_TRACE(k.what);
    plan_options o = decode_step_options(k.fuse);
    o.tensor_parallel = k.tensor_parallel;
    const auto [p, prog] = compile_and_lower(k.cfg, k.kind, o, k.tensor_parallel);
    ASSERT_TRUE(prog);
    EXPECT_FALSE(prog->decode_step_fused());
    EXPECT_EQ(prog->decode_step_note().rfind("decode step not fused: ", 0), 0u) << prog->decode_step_note();
    EXPECT_NE(prog->decode_step_note().find(k.why), std::string::npos) << prog->decode_step_note();
    if (k.kind != device_kind::cuda || !k.fuse || k.tensor_parallel > 1) {
      EXPECT_EQ(p->describe().find("decode step:"), std::string::npos) << "describe() says nothing of it";
    }
    o.fuse_decode_step = false;
    const auto [p_off, off] = compile_and_lower(k.cfg, k.kind, o, k.tensor_parallel);
    ASSERT_TRUE(off);
    const auto records = compute_records(*prog);
    EXPECT_EQ(records, compute_records(*off)) << "the records are those without the fusion";
    EXPECT_GT(records.size(), 1u);
    for (const auto& [name, f] : records) EXPECT_NE(f, gpu::op_launch::fusion::decode_step) << name;
  }
  // Without the fusion the step has the pattern's records: the embedding,
  // 5 a layer (q/k/v, attention, o + residual, gated MLP, down + residual)
  // and the final norm, the head and the logits' copy.
  const auto [p, off] = compile_and_lower(llama, device_kind::cuda, decode_step_options(false));
  ASSERT_TRUE(off);
  EXPECT_EQ(compute_records(*off).size(), 1u + 5u * 2u + 3u);
}

// The tensor-parallel decode step (plan_options::fuse_tp_decode_step): a
// decode step split over one group of CUDA devices, its all-reduces
// in-stream, lowers to one decode-step record a rank, over the rank's
// shards. The record sits in the rank's first compute step of records (its
// embedding's), sets the job's tag, and names every rank's device; every
// other compute step and in-stream part of the rank, and its part of the
// logits' all-gather, stay in their queues with nothing to launch
// (lowered_step::absorbed_into). Anything the pattern does not take keeps
// its records, and the note says why.
namespace {

/// A decode step of 2 layers that splits over 2 or 4 ranks with every
/// rank's share inside the kernel's limits (widths of whole 128s): d 1024,
/// 8 heads of 128 over 8 kv heads (a head a unit, so ratios split them
/// unevenly), ff 1024, vocab 1000, a cache of 80 rows; shapes only.
models::transformer_config tp_decode_step_config() {
  models::transformer_config cfg = whole_decode_step(2);
  cfg.d_model = 1024;
  cfg.n_heads = 8;
  cfg.n_kv_heads = 8;
  cfg.d_ff = 1024;
  return cfg;
}

/// The options of a tensor-parallel decode step on `degree` ranks, its
/// all-reduces in-stream, one compute lane, replayed.
plan_options tp_decode_step_options(int degree, bool fuse_tp = true) {
  plan_options o = decode_step_options();
  o.fuse_tp_decode_step = fuse_tp;
  o.tensor_parallel = degree;
  o.in_stream_collectives = in_stream_mode::on;
  o.lanes_per_device = 1;
  o.graph_replay = graph_replay_mode::on;
  return o;
}

/// The steps of `prog` that hold a decode-step record, by device.
std::map<int, const lowered_step*> decode_step_steps(const launch_program& prog) {
  std::map<int, const lowered_step*> r;
  for (const lowered_step& ls : prog.steps())
    for (const auto& op : ls.ops)
      if (op.fused == gpu::op_launch::fusion::decode_step) {
        EXPECT_EQ(r.count(ls.device), 0u) << "two decode-step records on device " << ls.device;
        r[ls.device] = &ls;
      }
  return r;
}

/// Replay segments by the steps they hold: step -> the segment's first step.
std::map<step_id, step_id> replay_segment_of(const launch_program& prog) {
  std::map<step_id, step_id> r;
  for (const lowered_step& ls : prog.steps())
    for (int i = 0; i < ls.replay_steps; ++i) r[prog.queue(ls.queue).steps[static_cast<std::size_t>(ls.pos + i)]] = ls.id;
  return r;
}

}  // namespace

TEST(LaunchProgram, ATensorParallelDecodeStepIsOneRecordARank) {
  using fusion = gpu::op_launch::fusion;
  struct split {
    std::string what;
    models::transformer_config cfg;
    int degree;
    std::vector<double> ratios;
    bool uneven_heads;
  };
  const std::vector<split> splits = {
      {"degree 2, even, 2 query heads a kv head", whole_decode_step(2), 2, {}, false},
      {"degree 2, 3:1", tp_decode_step_config(), 2, {3, 1}, true},
      {"degree 4, even", tp_decode_step_config(), 4, {}, false},
      {"degree 4, 5:1:1:1", tp_decode_step_config(), 4, {5, 1, 1, 1}, true},
  };
  for (const split& sp : splits)
    for (step_form form : {step_form::argmax, step_form::token_state_out, step_form::token_states}) {
      SCOPED_TRACE(sp.what + ", form " + std::to_string(static_cast<int>(form)));
      models::transformer_config cfg = sp.cfg;
      cfg.argmax_output = true;
      const bool keeps_token = form != step_form::argmax;
      const bool in_state = form == step_form::token_states;
      if (keeps_token) cfg.token_state_out = "token_state_b";
      if (in_state) cfg.token_state_in = "token_state_a";
      plan_options o = tp_decode_step_options(sp.degree);
      o.shard_ratios = sp.ratios;
      const auto [p, prog] = compile_tp(cfg, cuda_specs(sp.degree, 256 << 10), o);  // hazards, consistency checked there
      ASSERT_TRUE(prog);
      ASSERT_TRUE(prog->decode_step_fused()) << prog->decode_step_note();
      EXPECT_EQ(prog->decode_step_note(),
                "decode step: one kernel a rank (2 layers, tensor degree " + std::to_string(sp.degree) + ")");
      const std::vector<int>& ranks = p->tensor_parallel()->devices.front();
      ASSERT_EQ(static_cast<int>(ranks.size()), sp.degree);
      const auto records = decode_step_steps(*prog);
      ASSERT_EQ(static_cast<int>(records.size()), sp.degree) << "one decode-step record a rank";
      const int64_t dh = cfg.head_dim();
      int64_t heads = 0, kv_heads = 0, ff = 0, vocab = 0, embed_rows = 0;
      std::set<int64_t> rank_heads;
      const auto segment_of = replay_segment_of(*prog);
      for (int k = 0; k < sp.degree; ++k) {
        SCOPED_TRACE("rank " + std::to_string(k));
        const int dev = ranks[static_cast<std::size_t>(k)];
        ASSERT_EQ(records.count(dev), 1u);
        const lowered_step& first = *records.at(dev);
        ASSERT_EQ(first.ops.size(), 1u);
        const actors::lowered_op& r = first.ops.front();
        ASSERT_EQ(r.fused, fusion::decode_step);
        const auto& ds = r.decode_step;
        EXPECT_EQ(ds.tp_rank, k);
        EXPECT_EQ(ds.tp_degree, sp.degree);
        EXPECT_TRUE(ds.argmax) << "every rank picks the token";
        EXPECT_EQ(ds.tp_token_out, k > 0 && keeps_token) << "a rank past 0 writes only a token it keeps";
        EXPECT_EQ(ds.layers, 2);
        EXPECT_EQ(ds.d_model, cfg.d_model) << "d_model whole";
        EXPECT_EQ(ds.head_dim, dh);
        EXPECT_EQ(ds.cache_rows, cfg.kv_cache_capacity);
        EXPECT_EQ(ds.vocab_total, cfg.vocab);
        // The rank's slices: contiguous, in rank order, covering the vocabulary.
        EXPECT_EQ(ds.logit_begin, vocab) << "the head's rows follow rank k - 1's";
        EXPECT_EQ(ds.embed_begin, embed_rows) << "the table's rows follow rank k - 1's";
        heads += ds.heads;
        kv_heads += ds.kv_heads;
        ff += ds.d_ff;
        vocab += ds.vocab;
        embed_rows += ds.embed_rows;
        rank_heads.insert(ds.heads);
        // The collective: this rank of every rank's device, one record a job.
        EXPECT_EQ(r.collective.rank, k);
        EXPECT_EQ(r.collective.members, sp.degree);
        EXPECT_EQ(r.collective.key, 0u);
        for (int j = 0; j < sp.degree; ++j)
          EXPECT_EQ(r.collective.device_index[static_cast<std::size_t>(j)], ranks[static_cast<std::size_t>(j)]);
        EXPECT_TRUE(first.job_tag);
        EXPECT_NE(first.label.find("decode step, rank " + std::to_string(k)), std::string::npos) << first.label;
        // Its operands, the single device's order over the rank's slices.
        ASSERT_EQ(r.inputs.size(), ds.operands());
        const std::size_t g0 = ds.global_operands(), per_layer = ds.layer_operands();
        const int64_t d = cfg.d_model, q_rows = ds.heads * dh, kv_rows = ds.kv_heads * dh;
        EXPECT_EQ(r.inputs[0].proto.type, dtype::i32);
        EXPECT_EQ(r.inputs[0].where, in_state ? region::state : region::arena) << "the token";
        EXPECT_EQ(r.inputs[1].proto.dims, shape({ds.embed_rows, d})) << "the table's slice";
        EXPECT_EQ(r.inputs[4].proto.dims, shape({1, cfg.kv_cache_capacity})) << "the mask";
        EXPECT_EQ(r.inputs[5].proto.dims, shape({ds.vocab, d})) << "the head's slice";
        for (int l = 0; l < 2; ++l) {
          SCOPED_TRACE("layer " + std::to_string(l + 1));
          const std::size_t b = g0 + static_cast<std::size_t>(l) * per_layer;
          EXPECT_EQ(r.inputs[b + 0].proto.dims, shape({q_rows, d})) << "w_q";
          EXPECT_EQ(r.inputs[b + 1].proto.dims, shape({kv_rows, d})) << "w_k";
          EXPECT_EQ(r.inputs[b + 2].proto.dims, shape({kv_rows, d})) << "w_v";
          EXPECT_EQ(r.inputs[b + 3].proto.dims, shape({1, ds.kv_heads, cfg.kv_cache_capacity, dh})) << "k cache";
          EXPECT_EQ(r.inputs[b + 4].proto.dims, shape({1, ds.kv_heads, cfg.kv_cache_capacity, dh})) << "v cache";
          EXPECT_EQ(r.inputs[b + 3].where, region::state);
          EXPECT_EQ(r.inputs[b + 5].proto.dims, shape({d, q_rows})) << "w_o";
          EXPECT_EQ(r.inputs[b + 6].proto.dims, shape({ds.d_ff, d})) << "w_gate";
          EXPECT_EQ(r.inputs[b + 7].proto.dims, shape({ds.d_ff, d})) << "w_up";
          EXPECT_EQ(r.inputs[b + 8].proto.dims, shape({d, ds.d_ff})) << "w_down";
        }
        // Its output: rank 0's greedy token (or the state keeping it); a
        // rank past 0 its own kept token, or its head's rows it never writes.
        if (k == 0 || keeps_token) {
          EXPECT_EQ(r.out.proto.type, dtype::i32);
          EXPECT_EQ(r.out.proto.dims.numel(), 1);
          EXPECT_EQ(r.out.where, keeps_token ? region::state : region::arena);
        } else {
          EXPECT_EQ(r.op->op, op_kind::matmul) << "the head's product, the rank's last record";
        }
        // Its launch record carries it all.
        const auto launches = prog->launch_records(first.queue);
        const gpu::op_launch& l = launches.at(static_cast<std::size_t>(first.first_launch));
        EXPECT_EQ(l.fused, fusion::decode_step);
        EXPECT_EQ(l.decode_step.tp_rank, k);
        EXPECT_EQ(l.decode_step.logit_begin, ds.logit_begin);
        EXPECT_EQ(l.collective.members, sp.degree);
        // Every other step of the rank's decode step is absorbed: its later
        // compute steps and in-stream parts on its lane, its part of the
        // logits' all-gather on the communication queue.
        int absorbed_compute = 0, absorbed_parts = 0, absorbed_gathers = 0;
        for (const step& s : p->steps()) {
          if (s.device != dev || s.id == first.id) continue;
          const lowered_step& ls = prog->step(s.id);
          const bool later_compute = s.kind == step_kind::compute && ls.queue == first.queue && ls.pos > first.pos;
          if (later_compute || s.kind == step_kind::collective) {
            EXPECT_EQ(ls.absorbed_into, first.id) << "step " << s.id << " (" << ls.label << ")";
            EXPECT_TRUE(ls.ops.empty()) << "step " << s.id;
            EXPECT_NE(ls.label.find("(in the decode step)"), std::string::npos) << ls.label;
          } else {
            EXPECT_EQ(ls.absorbed_into, -1) << "step " << s.id << " (" << ls.label << ")";
          }
          absorbed_compute += later_compute;
          absorbed_parts += runs_in_stream(s);
          if (s.kind == step_kind::collective && !runs_in_stream(s)) {
            ++absorbed_gathers;
            EXPECT_EQ(p->source().at(s.ops.front()).op, op_kind::all_gather);
          }
        }
        EXPECT_GE(absorbed_compute, 2 * 2 + 1) << "each layer's two steps (q/k/v to o, the MLP to down) and the head's";
        EXPECT_EQ(absorbed_parts, 1 + 2 * 2) << "the embedding's all-reduce and o's and down's a layer";
        EXPECT_EQ(absorbed_gathers, 1) << "the logits' all-gather";
        // On distinct GPUs the record's step replays, under the job's tag.
        ASSERT_EQ(segment_of.count(first.id), 1u) << "the record's step is in no replay segment";
        EXPECT_TRUE(prog->step(segment_of.at(first.id)).replay_in_stream);
      }
      EXPECT_EQ(heads, cfg.n_heads);
      EXPECT_EQ(kv_heads, cfg.kv_heads());
      EXPECT_EQ(ff, cfg.d_ff);
      EXPECT_EQ(vocab, cfg.vocab);
      EXPECT_EQ(embed_rows, cfg.vocab);
      EXPECT_EQ(rank_heads.size() > 1, sp.uneven_heads) << "the ratios split the heads unevenly, or evenly";
      // The output's copy still follows rank 0's last step of the decode
      // step: by stream order on its queue, or by that step's event.
      const lowered_step& first0 = *records.at(ranks.front());
      int output_copies = 0;
      for (const step& s : p->steps()) {
        if (s.kind != step_kind::copy_d2h) continue;
        ++output_copies;
        EXPECT_EQ(s.device, ranks.front());
        const lowered_step& ls = prog->step(s.id);
        EXPECT_FALSE(ls.copy.in_place) << "the kernel writes the output in the arena, not the window";
        ASSERT_FALSE(s.deps.empty());
        for (step_id d : s.deps) {
          const lowered_step& ld = prog->step(d);
          EXPECT_TRUE(ld.absorbed_into == first0.id || d == first0.id) << "the copy reads step " << d;
          const bool ordered = (ld.queue == ls.queue && ld.pos < ls.pos) ||
                               std::find(ls.remote_deps.begin(), ls.remote_deps.end(), d) != ls.remote_deps.end();
          EXPECT_TRUE(ordered) << "the copy does not wait for step " << d;
        }
      }
      EXPECT_EQ(output_copies, 1);
    }
}

TEST(LaunchProgram, ATensorParallelDecodeStepKeepsItsRecordsOutsideThePattern) {
  struct refused {
    std::string what;
    models::transformer_config cfg;
    std::vector<device_spec> specs;
    plan_options o;
    std::string why;  ///< a part of the note
  };
  models::transformer_config greedy = tp_decode_step_config();
  greedy.argmax_output = true;
  std::vector<refused> cases;
  cases.push_back({"the option off (the default)", greedy, cuda_specs(2, 256 << 10), tp_decode_step_options(2, false),
                   "tensor parallel (collectives), and plan_options::fuse_tp_decode_step off"});
  EXPECT_FALSE(plan_options{}.fuse_tp_decode_step);
  cases.push_back({"the logits as the output", tp_decode_step_config(), cuda_specs(2, 256 << 10),
                   tp_decode_step_options(2), "the logits are an output"});
  std::vector<device_spec> sim = cuda_specs(2, 256 << 10);
  for (device_spec& d : sim) d.kind = device_kind::sim;
  cases.push_back({"sim devices", greedy, sim, tp_decode_step_options(2), "rank 0 not on a CUDA device"});
  plan_options staged = tp_decode_step_options(2);
  staged.pipeline_stages = 2;
  cases.push_back({"2 stages x 2 ranks", greedy, cuda_specs(4, 256 << 10), staged, "over 2 pipeline stages"});
  plan_options queued = tp_decode_step_options(2);
  queued.in_stream_collectives = in_stream_mode::off;
  cases.push_back({"all-reduces on the communication queue", greedy, cuda_specs(2, 256 << 10), queued,
                   "runs on the communication queue"});
  cases.push_back({"all-reduces past the in-stream limit", greedy, cuda_specs(2, 8), tp_decode_step_options(2),
                   "runs on the communication queue"});
  // The layers' inputs (positions, mask) on the copy queue: the steps that
  // waited for them are absorbed, and the record's step waits for the
  // token's copy only.
  plan_options copied = tp_decode_step_options(2);
  copied.inline_small_copies = false;
  cases.push_back({"input copies on the copy queue", greedy, cuda_specs(2, 256 << 10), copied,
                   "which the decode-step record's step"});
  models::transformer_config qk = greedy;
  qk.qk_norm = true;
  cases.push_back({"q/k norms", qk, cuda_specs(2, 256 << 10), tp_decode_step_options(2), "q/k norms"});
  for (const refused& k : cases) {
    SCOPED_TRACE(k.what);
    const auto [p, prog] = compile_tp(k.cfg, k.specs, k.o);
    ASSERT_TRUE(prog);
    EXPECT_FALSE(prog->decode_step_fused());
    EXPECT_EQ(prog->decode_step_note().rfind("decode step not fused: ", 0), 0u) << prog->decode_step_note();
    EXPECT_NE(prog->decode_step_note().find(k.why), std::string::npos) << prog->decode_step_note();
    for (const lowered_step& ls : prog->steps()) {
      EXPECT_EQ(ls.absorbed_into, -1) << ls.label;
      EXPECT_FALSE(ls.job_tag) << ls.label;
    }
    // The records are those of the plan without the decode-step fusion.
    plan_options off = k.o;
    off.fuse_decode_step = false;
    const auto [p_off, prog_off] = compile_tp(k.cfg, k.specs, off);
    ASSERT_TRUE(prog_off);
    const auto records = compute_records(*prog);
    EXPECT_EQ(records, compute_records(*prog_off));
    EXPECT_GT(records.size(), 1u);
    for (const auto& [name, f] : records) EXPECT_NE(f, gpu::op_launch::fusion::decode_step) << name;
  }
}

// Where ranks are logical devices of one GPU ("cuda:0,0": each rank's
// kernel spins on the other's, and a host call that instantiates or
// launches a graph there blocks behind them), no replay segment holds a
// rank's decode-step record: it launches plainly, under the job's tag. On
// distinct GPUs each rank's record replays in a segment that sets the tag.
TEST(LaunchProgram, ATensorParallelDecodeStepOnOneGpuIsNeverReplayed) {
  models::transformer_config cfg = whole_decode_step(2);
  cfg.argmax_output = true;
  for (bool one_gpu : {false, true}) {
    SCOPED_TRACE(one_gpu ? "cuda:0,0" : "cuda:0,1");
    auto specs = cuda_specs(2, 256 << 10);
    if (one_gpu) specs[1].ordinal = 0;
    const auto [p, prog] = compile_tp(cfg, specs, tp_decode_step_options(2));
    ASSERT_TRUE(prog);
    ASSERT_TRUE(prog->decode_step_fused()) << prog->decode_step_note();
    const auto records = decode_step_steps(*prog);
    ASSERT_EQ(records.size(), 2u);
    const auto segment_of = replay_segment_of(*prog);
    for (const auto& [dev, ls] : records) {
      EXPECT_TRUE(ls->job_tag);
      if (one_gpu) {
        EXPECT_EQ(segment_of.count(ls->id), 0u) << "device " << dev << ": its record is replayed";
      } else {
        ASSERT_EQ(segment_of.count(ls->id), 1u) << "device " << dev;
        EXPECT_TRUE(prog->step(segment_of.at(ls->id)).replay_in_stream);
      }
    }
    if (!one_gpu) { EXPECT_FALSE(segment_of.empty()); }
  }
}

// The decode-step kernel streams q/k/v's rows in half chunks only where the
// block's busiest warp then streams less: LLaMA-1B's widths on 132 SMs (24
// rows a block: two chunks for half the warps, three halves for each), not
// Llama 3.1 8B's (94 chunks a block, six a warp either way), nor rows narrower
// than a whole chunk of 2048, nor rows that fill the warps evenly.
TEST(DecodeStepKernel, QkvRowsStreamInHalfChunksOnlyWhereTheBusiestWarpStreamsLess) {
  const int64_t llama_1b_rows = (32 + 2 * 8) * 64, llama_8b_rows = (32 + 2 * 8) * 128;
  EXPECT_EQ(decode_step_chunk(2048), 2048);
  EXPECT_EQ(decode_step_qkv_chunk(2048, llama_1b_rows, 132), 1024);
  EXPECT_EQ(decode_step_qkv_chunk(4096, llama_8b_rows, 132), 2048);
  EXPECT_EQ(decode_step_qkv_chunk(1024, 16 * 64 + 2 * 8 * 64, 132), 1024);  // Qwen3-0.6B: one chunk of 1024 already
  EXPECT_EQ(decode_step_qkv_chunk(896, 14 * 64 + 2 * 2 * 64, 132), 896);    // Qwen2.5-0.5B: chunks of 896
  // 16 rows a block are one chunk for every warp: halves would take two.
  EXPECT_EQ(decode_step_qkv_chunk(2048, 16 * 132, 132), 2048);
  // 17 rows: two chunks for one warp, at most three halves in halves.
  EXPECT_EQ(decode_step_qkv_chunk(2048, 17 * 132, 132), 1024);
  // 32 rows: two chunks each either way.
  EXPECT_EQ(decode_step_qkv_chunk(2048, 32 * 132, 132), 2048);
  // LLaMA-1B's rows on a GPU of 78 SMs: 40 a block, three chunks for 8 warps against five halves for each.
  EXPECT_EQ(decode_step_qkv_chunk(2048, llama_1b_rows, 78), 1024);
  EXPECT_EQ(decode_step_qkv_chunk(2048, llama_1b_rows, 0), 2048);  // no SMs: the plain chunk
}

// A warp's walk over its items of a decode-step GEMV (the kernel's weight
// loads) steps row and chunk by a carry, and lands where division would:
// item j is chunk j % chunks of row j / chunks, for rows of 1 to 20 chunks
// (LLaMA-1B's 1, 2 and 4; 3 and 5 carry across a row; more chunks than
// warps step no whole row) and every warp of 16.
TEST(DecodeStepKernel, ItemWalkStepsToTheRowAndChunkDivisionGives) {
  constexpr int warps = static_cast<int>(decode_step_warps);
  for (int chunks = 1; chunks <= 20; ++chunks)
    for (int warp = 0; warp < warps; ++warp) {
      decode_step_item_walk w{};
      w.start(warp, warps, chunks);
      for (int k = 0; k < 300; ++k, w.next(warps)) {
        const int j = warp + k * warps;
        ASSERT_EQ(w.item, j) << chunks << " chunks a row, warp " << warp << ", step " << k;
        ASSERT_EQ(w.row, j / chunks) << chunks << " chunks a row, warp " << warp << ", item " << j;
        ASSERT_EQ(w.chunk, j % chunks) << chunks << " chunks a row, warp " << warp << ", item " << j;
      }
    }
}
