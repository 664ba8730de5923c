// Graph replay segments (graph/replay.hpp): every compute step is in exactly
// one segment, a segment never spans a cross-queue wait or record, the
// replay mode is validated and shown by describe(), and the modelled saving
// is (kernels - 1) launches per segment.
#include <gtest/gtest.h>

#include <algorithm>
#include <set>

#include "graph/replay.hpp"
#include "plan_test_util.hpp"
#include "random_dag.hpp"

using namespace ag;
using ag::test_util::must_compile;

namespace {

std::vector<device_spec> sims(int n) {
  std::vector<device_spec> v(static_cast<std::size_t>(n));
  for (int i = 0; i < n; ++i) {
    v[static_cast<std::size_t>(i)].name = "sim" + std::to_string(i);
    v[static_cast<std::size_t>(i)].ordinal = i;
  }
  return v;
}

// Compute steps, in-stream parts and inlined copies share their lane's queue.
bool same_queue(const step& a, const step& b) {
  return on_compute_lane(a) && on_compute_lane(b) && a.device == b.device && a.lane == b.lane;
}

// The segment rules of replay.hpp, checked independently of how they were built.
void check_segments(const plan& p, const std::vector<replay_segment>& segs) {
  std::set<step_id> seen;
  int in_segments = 0;  // compute steps, and the host copies that join segments
  for (const step& s : p.steps()) in_segments += s.kind == step_kind::compute || captures_host_copy(p, s);
  for (const replay_segment& seg : segs) {
    ASSERT_FALSE(seg.steps.empty());
    int kernels = 0, copies = 0;
    for (std::size_t i = 0; i < seg.steps.size(); ++i) {
      const step& s = p.at(seg.steps[i]);
      if (s.kind != step_kind::compute) {
        // A host copy inlined at the lane's start (nothing before it) or end
        // (nothing after it).
        ++copies;
        EXPECT_TRUE(captures_host_copy(p, s)) << "step " << s.id;
        bool lane_after = false;
        for (const step& e : p.steps()) lane_after |= same_queue(e, s) && e.lane_seq > s.lane_seq && !e.on_compute_stream;
        if (s.kind == step_kind::copy_d2h) {
          EXPECT_FALSE(lane_after) << "an output copy before the lane's end, step " << s.id;
        }
        if (s.kind == step_kind::copy_h2d) {
          bool lane_before = false;
          for (const step& e : p.steps())
            lane_before |= same_queue(e, s) && e.lane_seq < s.lane_seq && e.kind == step_kind::compute;
          EXPECT_FALSE(lane_before) << "an input copy after the lane's start, step " << s.id;
        }
      }
      EXPECT_EQ(s.device, seg.device);
      EXPECT_EQ(s.lane, seg.lane);
      EXPECT_TRUE(seen.insert(s.id).second) << "step " << s.id << " in two segments";
      for (node_id id : s.ops)
        kernels += s.kind == step_kind::compute && !is_view_op(p.source().at(id).op) && !is_leaf_op(p.source().at(id).op) &&
                   !std::any_of(p.elided_concats().begin(), p.elided_concats().end(),
                                [&](const elided_concat& e) { return e.concat == id; });
      if (i > 0) {
        EXPECT_GT(s.lane_seq, p.at(seg.steps[i - 1]).lane_seq);
        // A dep on another queue needs a wait, unless an earlier step of the
        // lane waited for it already (stream order then covers this one).
        for (step_id d : s.deps) {
          if (same_queue(p.at(d), s)) continue;
          bool waited_before = false;
          for (const step& e : p.steps())
            if (same_queue(e, s) && e.lane_seq < s.lane_seq && std::count(e.deps.begin(), e.deps.end(), d))
              waited_before = true;
          EXPECT_TRUE(waited_before) << "segment spans a wait at step " << s.id << " (for step " << d << ")";
        }
      }
      if (i + 1 < seg.steps.size()) {
        for (step_id c : s.consumers) EXPECT_TRUE(same_queue(p.at(c), s)) << "segment spans a record at step " << s.id;
      }
    }
    EXPECT_EQ(kernels, seg.kernels);
    EXPECT_EQ(copies, seg.copies);
  }
  EXPECT_EQ(static_cast<int>(seen.size()), in_segments);
}

}  // namespace

TEST(GraphReplay, SegmentsOfRandomGraphsFollowTheRules) {
  for (uint64_t seed = 1; seed <= 60; ++seed) {
    auto gr = test::random_dag({.seed = seed, .ops = 24});
    ASSERT_TRUE(gr.has_value()) << gr.err().to_string();
    auto g = std::make_shared<const graph>(std::move(*gr));
    plan_options o;
    o.lanes_per_device = 1 + static_cast<int>(seed % 3);
    o.min_branch_seconds = 0;
    o.graph_replay = graph_replay_mode::on;
    auto p = must_compile(g, sims(1 + static_cast<int>(seed % 4)), o);
    ASSERT_TRUE(p);
    SCOPED_TRACE("seed " + std::to_string(seed));
    check_segments(*p, replay_segments(*p));
  }
}

// Each replayed kernel but the first saves its launch latency and costs the
// device's kernel latency instead.
TEST(GraphReplay, OneDeviceOneLaneIsOneSegmentAndSavesAllButOneLaunch) {
  auto gr = test::random_dag({.seed = 3, .ops = 30, .layers = false});
  ASSERT_TRUE(gr.has_value());
  auto g = std::make_shared<const graph>(std::move(*gr));
  plan_options o;
  o.graph_replay = graph_replay_mode::on;
  auto p = must_compile(g, sims(1), o);
  ASSERT_TRUE(p);
  const auto segs = replay_segments(*p);
  ASSERT_EQ(segs.size(), 1u) << p->describe();
  ASSERT_GE(segs[0].kernels, 2);
  const device_spec& d = p->devices()[0];
  ASSERT_GT(d.launch_latency, d.kernel_latency);
  EXPECT_DOUBLE_EQ(replay_launch_seconds_saved(*p, segs), (segs[0].kernels - 1) * (d.launch_latency - d.kernel_latency));
  EXPECT_NE(p->describe().find("graph replay on: 1 segment(s)"), std::string::npos) << p->describe();
}

TEST(GraphReplay, ModeIsValidatedAndShown) {
  plan_options o;
  o.graph_replay = static_cast<graph_replay_mode>(7);
  const error e = validate(o);
  ASSERT_FALSE(e.ok());
  EXPECT_NE(e.to_string().find("graph_replay 7"), std::string::npos) << e.to_string();
  graph_replay_mode m{};
  EXPECT_TRUE(parse_graph_replay_mode("auto", m));
  EXPECT_EQ(m, graph_replay_mode::automatic);
  EXPECT_STREQ(to_string(m), "auto");
  EXPECT_FALSE(parse_graph_replay_mode("yes", m));
  // Auto by default (replay where the backend captures); off: describe()
  // says nothing of replay.
  EXPECT_EQ(plan_options{}.graph_replay, graph_replay_mode::automatic);
  auto gr = test::random_dag({.seed = 5, .ops = 12});
  ASSERT_TRUE(gr.has_value());
  auto g = std::make_shared<const graph>(std::move(*gr));
  plan_options off;
  off.graph_replay = graph_replay_mode::off;
  auto p = must_compile(g, sims(1), off);
  ASSERT_TRUE(p);
  EXPECT_EQ(p->describe().find("graph replay"), std::string::npos);
  auto p_auto = must_compile(g, sims(1), plan_options{});
  ASSERT_TRUE(p_auto);
  EXPECT_NE(p_auto->describe().find("graph replay auto"), std::string::npos) << p_auto->describe();
}

TEST(GraphReplay, CpuDevicesAreNotReplayed) {
  auto gr = test::random_dag({.seed = 9, .ops = 16});
  ASSERT_TRUE(gr.has_value());
  auto g = std::make_shared<const graph>(std::move(*gr));
  auto d = sims(1);
  d[0].kind = device_kind::cpu;
  d[0].name = "cpu0";
  plan_options o;
  o.graph_replay = graph_replay_mode::on;
  auto p = must_compile(g, d, o);
  ASSERT_TRUE(p);
  EXPECT_NE(p->describe().find("not applied on cpu"), std::string::npos) << p->describe();
}

// A tiny job (input copied in, one add, output copied out): its copies are
// inlined on the lane and, with replay_host_copies (the default), join the
// add's segment, which then holds 1 kernel and 2 copies and is replayed as
// one graph; off, the copies stay out and the lone kernel is not a segment
// worth a graph. Lanes without inlined copies are as before.
TEST(GraphReplay, InlinedHostCopiesJoinTheirLanesSegment) {
  graph_builder b;
  auto x = b.input("x", dtype::f32, {256});
  auto w = b.weight("w", host_tensor::random_normal(dtype::f32, {256}, 3, 1.0f));
  b.output(b.add(x, w, "y"));
  auto g = std::make_shared<const graph>(std::move(b).build().value());
  plan_options o;
  o.graph_replay = graph_replay_mode::on;
  auto p = must_compile(g, sims(1), o);
  ASSERT_TRUE(p);
  const auto segs = replay_segments(*p);
  ASSERT_EQ(segs.size(), 1u) << p->describe();
  EXPECT_EQ(segs[0].kernels, 1);
  EXPECT_EQ(segs[0].copies, 2);
  EXPECT_EQ(segs[0].launches(), 3);
  ASSERT_EQ(segs[0].steps.size(), 3u);
  EXPECT_EQ(p->at(segs[0].steps.front()).kind, step_kind::copy_h2d);
  EXPECT_EQ(p->at(segs[0].steps.back()).kind, step_kind::copy_d2h);
  EXPECT_NE(p->describe().find("1 kernels, 2 host copies"), std::string::npos) << p->describe();
  check_segments(*p, segs);

  plan_options apart = o;
  apart.replay_host_copies = false;
  auto q = must_compile(g, sims(1), apart);
  ASSERT_TRUE(q);
  const auto alone = replay_segments(*q);
  ASSERT_EQ(alone.size(), 1u) << q->describe();
  EXPECT_EQ(alone[0].copies, 0);
  EXPECT_EQ(alone[0].launches(), 1);
  for (const step& s : q->steps()) EXPECT_FALSE(captures_host_copy(*q, s));
  check_segments(*q, alone);

  // Copies on their copy queue (inline_small_copies off) never join.
  plan_options queued = o;
  queued.inline_small_copies = false;
  auto r = must_compile(g, sims(1), queued);
  ASSERT_TRUE(r);
  for (const replay_segment& seg : replay_segments(*r)) EXPECT_EQ(seg.copies, 0);
}
