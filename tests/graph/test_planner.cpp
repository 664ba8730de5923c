// Planner: placement (pipeline DP, pins, fallback), steps (copies at device
// boundaries, deps/consumers), lanes, pruning, view copies.

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <cmath>
#include <map>
#include <set>
#include <string>

#include "graph/host_tensor.hpp"
#include "graph/models/transformer.hpp"
#include "graph/plan.hpp"
#include "graph/random.hpp"
#include "graph/replay.hpp"
#include "plan_test_util.hpp"
#include "random_dag.hpp"

namespace {

using namespace ag;

std::vector<device_spec> sim_devices(int n) {
  std::vector<device_spec> v(static_cast<std::size_t>(n));
  for (int i = 0; i < n; ++i) {
    v[static_cast<std::size_t>(i)].name = "sim" + std::to_string(i);
    v[static_cast<std::size_t>(i)].ordinal = i;
  }
  return v;
}

// Slow devices so costs are dominated by flops (easy to reason about).
std::vector<device_spec> slow_devices(int n) {
  auto v = sim_devices(n);
  for (auto& d : v) {
    d.flops_f32 = 1e9;
    d.mem_bandwidth = 1e15;
    d.launch_latency = 0;
  }
  return v;
}

using test_util::finish;
using test_util::must_compile;

// x [16, d] through `per_layer[l]` matmuls per layer l; matmuls named "l<l>.mm<m>".
std::shared_ptr<const graph> layered(const std::vector<int>& per_layer, int64_t d = 32, uint64_t seed = 1) {
  graph_builder b;
  b.set_layer(0);
  auto x = b.input("x", dtype::f32, {16, d});
  for (std::size_t l = 0; l < per_layer.size(); ++l) {
    b.set_layer(static_cast<int>(l));
    for (int m = 0; m < per_layer[l]; ++m) {
      auto w = b.weight("w" + std::to_string(l) + "_" + std::to_string(m),
                        host_tensor::random_normal(dtype::f32, {d, d}, seed + l * 10 + static_cast<uint64_t>(m), 0.1f));
      x = b.matmul(x, w, false, false, "l" + std::to_string(l) + ".mm" + std::to_string(m));
    }
  }
  b.set_layer(-1);
  b.output(x);
  return finish(std::move(b));
}

std::vector<const step*> steps_of(const plan& p, step_kind k) {
  std::vector<const step*> r;
  for (const step& s : p.steps())
    if (s.kind == k) r.push_back(&s);
  return r;
}

// Invariants every plan must satisfy (deps/consumers, coverage, queues, locate).
void check_structure(const plan& p) {
  const graph& g = p.source();
  std::map<node_id, int> computed;
  std::set<std::pair<node_id, int>> h2d, peer;
  std::map<int, std::vector<step_id>> d2h_of;  // output index -> its d2h steps
  std::map<std::tuple<int, int, int>, int> next_seq;
  for (std::size_t i = 0; i < p.steps().size(); ++i) {
    const step& s = p.steps()[i];
    ASSERT_EQ(s.id, static_cast<step_id>(i));
    ASSERT_TRUE(std::is_sorted(s.deps.begin(), s.deps.end()));
    ASSERT_EQ(std::adjacent_find(s.deps.begin(), s.deps.end()), s.deps.end());
    for (step_id d : s.deps) {
      ASSERT_LT(d, s.id);
      const auto& c = p.at(d).consumers;
      EXPECT_NE(std::find(c.begin(), c.end(), s.id), c.end()) << "step " << d << " lacks consumer " << s.id;
    }
    for (step_id c : s.consumers) {
      const auto& d = p.at(c).deps;
      EXPECT_NE(std::find(d.begin(), d.end(), s.id), d.end());
    }
    EXPECT_EQ(s.deps.empty(), std::count(p.sources().begin(), p.sources().end(), s.id) == 1);
    // Compute lanes hold compute steps, in-stream collective parts and copies
    // inlined there (step::on_compute_stream); copies queue per kind otherwise.
    const bool lane = on_compute_lane(s);
    const int queue = lane ? s.lane : -1;
    const int expected_seq = next_seq[{s.device, static_cast<int>(lane ? step_kind::compute : s.kind), queue}]++;
    EXPECT_EQ(s.lane_seq, expected_seq);
    if (s.on_compute_stream) {
      ASSERT_TRUE(s.kind == step_kind::copy_h2d || s.kind == step_kind::copy_d2h) << "step " << s.id;
      EXPECT_LE(s.bytes, p.devices()[static_cast<std::size_t>(s.device)].inline_copy_max_bytes) << "step " << s.id;
      // At the lane's start (h2d, read only there) or end (d2h of that lane's step).
      for (const step& o : p.steps()) {
        if (o.on_compute_stream || !on_compute_lane(o) || o.device != s.device || o.lane != s.lane) continue;
        if (s.kind == step_kind::copy_h2d) EXPECT_GT(o.id, s.id) << "inlined h2d " << s.id << " after lane step " << o.id;
        else EXPECT_LT(o.id, s.id) << "inlined d2h " << s.id << " before lane step " << o.id;
      }
      // Read on its lane only, or on any lane of a device whose lanes run
      // from one queue (plan_options::fold_lanes, graph/replay.hpp).
      const bool folded = folded_lanes(p)[static_cast<std::size_t>(s.device)] > 0;
      for (step_id c : s.consumers) {
        EXPECT_EQ(p.at(c).device, s.device);
        if (!folded || s.kind == step_kind::copy_d2h) { EXPECT_EQ(p.at(c).lane, s.lane); }
      }
      for (step_id d : s.deps) EXPECT_EQ(p.at(d).lane, s.lane);
    }
    if (s.kind == step_kind::compute) {
      node_id prev = -1;
      for (node_id id : s.ops) {
        const node& n = g.at(id);
        if (is_view_op(n.op)) continue;
        EXPECT_GT(id, prev) << "ops not in topological order in step " << s.id;
        prev = id;
        EXPECT_EQ(computed.count(id), 0u) << n.name << " computed twice";
        computed[id] = s.device;
        EXPECT_EQ(p.placement()[static_cast<std::size_t>(id)], s.device);
        EXPECT_TRUE(p.devices()[static_cast<std::size_t>(s.device)].supports(n.op));
        for (node_id in : n.inputs) {
          auto loc = p.locate(in, s.device);
          EXPECT_TRUE(loc.has_value()) << n.name << " reads '" << g.at(in).name << "' not resident on device " << s.device;
        }
        EXPECT_TRUE(p.locate(id, s.device).has_value());
      }
    } else {
      ASSERT_EQ(s.ops.size(), 1u);
      if (s.kind == step_kind::copy_h2d) {
        EXPECT_TRUE(h2d.insert({s.ops[0], s.device}).second) << "duplicate h2d";
        EXPECT_EQ(g.inputs().at(static_cast<std::size_t>(s.io_index)), s.ops[0]);
      } else if (s.kind == step_kind::copy_peer) {
        EXPECT_TRUE(peer.insert({s.ops[0], s.device}).second) << "duplicate peer copy";
        EXPECT_FALSE(g.at(s.ops[0]).is_view()) << "peer copies copy storage nodes";
        EXPECT_NE(s.src_device, s.device);
        EXPECT_EQ(p.placement()[static_cast<std::size_t>(s.ops[0])], s.src_device);
      } else {
        d2h_of[s.io_index].push_back(s.id);
        EXPECT_TRUE(p.locate(s.ops[0], s.device).has_value());
      }
    }
  }
  // Each output: one d2h of the output itself, or (plan_options::
  // output_pieces) one per input of an uncomputed concat, each from the
  // device that computed it, together covering the output's bytes once.
  std::set<node_id> pieced;
  std::size_t d2h_steps = 0;
  for (std::size_t k = 0; k < g.outputs().size(); ++k) {
    const node& o = g.at(g.outputs()[k]);
    const auto& ds = d2h_of[static_cast<int>(k)];
    d2h_steps += ds.size();
    ASSERT_FALSE(ds.empty()) << "output " << k << " has no d2h";
    if (ds.size() == 1 && p.at(ds[0]).ops[0] == o.id) {
      EXPECT_EQ(p.at(ds[0]).host_offset, 0);
      EXPECT_EQ(p.at(ds[0]).host_blocks, 1);
      continue;
    }
    pieced.insert(o.id);
    ASSERT_EQ(o.op, op_kind::concat) << "output " << k << " copied in pieces";
    EXPECT_EQ(p.placement()[static_cast<std::size_t>(o.id)], -1) << "a pieced output is not computed";
    ASSERT_EQ(ds.size(), o.inputs.size());
    int64_t bytes = 0;
    std::set<int64_t> offsets;
    for (std::size_t i = 0; i < ds.size(); ++i) {
      const step& s = p.at(ds[i]);
      EXPECT_EQ(std::count(o.inputs.begin(), o.inputs.end(), s.ops[0]), 1) << "piece " << g.at(s.ops[0]).name;
      EXPECT_EQ(p.placement()[static_cast<std::size_t>(s.ops[0])], s.device);
      EXPECT_EQ(s.bytes % s.host_blocks, 0);
      EXPECT_LE(s.host_offset + (s.host_blocks - 1) * s.host_pitch + s.bytes / s.host_blocks, o.own_bytes());
      EXPECT_TRUE(offsets.insert(s.host_offset).second) << "two pieces at byte " << s.host_offset;
      bytes += s.bytes;
    }
    EXPECT_EQ(bytes, o.own_bytes()) << "output " << k << "'s pieces cover it";
  }
  EXPECT_EQ(p.sinks().size(), d2h_steps);
  for (step_id s : p.sinks()) EXPECT_EQ(p.at(s).kind, step_kind::copy_d2h);
  // Every compute node an output needs is computed exactly once.
  std::vector<char> needed(g.size(), 0);
  std::vector<node_id> stack(g.outputs().begin(), g.outputs().end());
  while (!stack.empty()) {
    node_id id = stack.back();
    stack.pop_back();
    if (needed[static_cast<std::size_t>(id)]) continue;
    needed[static_cast<std::size_t>(id)] = 1;
    for (node_id i : g.at(id).inputs) stack.push_back(i);
  }
  for (const node& n : g.nodes()) {
    const bool compute = !is_leaf_op(n.op) && !is_view_op(n.op);
    if (compute) {
      EXPECT_EQ(computed.count(n.id), needed[static_cast<std::size_t>(n.id)] && !pieced.count(n.id) ? 1u : 0u) << n.name;
    }
    if (!needed[static_cast<std::size_t>(n.id)]) {
      EXPECT_EQ(p.placement()[static_cast<std::size_t>(n.id)], -1) << n.name;
    }
  }
}

TEST(Planner, EightEqualLayersOverFourDevices) {
  auto g = layered(std::vector<int>(8, 1));
  auto p = must_compile(g, sim_devices(4));
  ASSERT_TRUE(p);
  check_structure(*p);
  for (int l = 0; l < 8; ++l)
    EXPECT_EQ(p->placement()[static_cast<std::size_t>(g->find("l" + std::to_string(l) + ".mm0"))], l / 2) << "layer " << l;
  auto peers = steps_of(*p, step_kind::copy_peer);
  ASSERT_EQ(peers.size(), 3u);
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(peers[static_cast<std::size_t>(i)]->src_device, i);
    EXPECT_EQ(peers[static_cast<std::size_t>(i)]->device, i + 1);
    EXPECT_EQ(p->source().at(peers[static_cast<std::size_t>(i)]->ops[0]).name, "l" + std::to_string(2 * i + 1) + ".mm0");
    EXPECT_EQ(peers[static_cast<std::size_t>(i)]->bytes, 16 * 32 * 4);
  }
  auto h2d = steps_of(*p, step_kind::copy_h2d);
  ASSERT_EQ(h2d.size(), 1u);
  EXPECT_EQ(h2d[0]->device, 0);
  auto d2h = steps_of(*p, step_kind::copy_d2h);
  ASSERT_EQ(d2h.size(), 1u);
  EXPECT_EQ(d2h[0]->device, 3);
  EXPECT_EQ(steps_of(*p, step_kind::compute).size(), 4u);
  EXPECT_EQ(p->used_devices(), (std::vector<int>{0, 1, 2, 3}));
  // Each device holds exactly its two layers' weights.
  for (int d = 0; d < 4; ++d) EXPECT_EQ(p->memory()[static_cast<std::size_t>(d)].weight_bytes, 2 * 32 * 32 * 4);
  EXPECT_EQ(p->bytes_moved(), 5 * 16 * 32 * 4);
  EXPECT_TRUE(check_hazards(*p).ok());
}

TEST(Planner, UnequalLayersBalancedByCost) {
  // Layer 0 costs 4 units, layers 1..4 one each: the best 2-way split is {0} | {1..4}.
  auto g = layered({4, 1, 1, 1, 1});
  auto p = must_compile(g, slow_devices(2));
  ASSERT_TRUE(p);
  EXPECT_EQ(p->placement()[static_cast<std::size_t>(g->find("l0.mm3"))], 0);
  for (int l = 1; l < 5; ++l) EXPECT_EQ(p->placement()[static_cast<std::size_t>(g->find("l" + std::to_string(l) + ".mm0"))], 1);
  EXPECT_NEAR(p->est_seconds(0), p->est_seconds(1), 1e-12);
}

// The DP's worst stage equals the brute-force optimum over all contiguous splits.
TEST(Planner, PipelineDpMatchesBruteForce) {
  rng r(99);
  for (int trial = 0; trial < 12; ++trial) {
    std::vector<int> per_layer(7);
    for (int& c : per_layer) c = 1 + static_cast<int>(r.next() % 4);
    auto g = layered(per_layer, 16, static_cast<uint64_t>(trial));
    auto devs = slow_devices(3);
    auto p = must_compile(g, devs);
    ASSERT_TRUE(p);
    check_structure(*p);
    std::vector<double> layer_cost(per_layer.size(), 0.0);
    for (const node& n : g->nodes())
      if (n.op == op_kind::matmul) layer_cost[static_cast<std::size_t>(n.layer)] += estimate_seconds(devs[0], *g, n);
    double best = 1e300;
    const std::size_t L = layer_cost.size();
    for (std::size_t i = 0; i <= L; ++i)
      for (std::size_t j = i; j <= L; ++j) {
        double a = 0, b = 0, c = 0;
        for (std::size_t k = 0; k < L; ++k) (k < i ? a : k < j ? b : c) += layer_cost[k];
        best = std::min(best, std::max({a, b, c}));
      }
    const double got = std::max({p->est_seconds(0), p->est_seconds(1), p->est_seconds(2)});
    EXPECT_NEAR(got, best, best * 1e-9) << "trial " << trial;
    // Layers stay whole and in order: device index never decreases along the chain.
    int prev = 0;
    for (const node& n : g->nodes())
      if (n.op == op_kind::matmul) {
        const int d = p->placement()[static_cast<std::size_t>(n.id)];
        EXPECT_GE(d, prev);
        prev = d;
      }
  }
}

TEST(Planner, PipelineStagesLimitsDevices) {
  auto g = layered(std::vector<int>(6, 1));
  plan_options o;
  o.pipeline_stages = 2;
  auto p = must_compile(g, sim_devices(4), o);
  ASSERT_TRUE(p);
  EXPECT_EQ(p->used_devices(), (std::vector<int>{0, 1}));
  o.policy = placement_policy::single;
  o.pipeline_stages = 0;
  auto q = must_compile(g, sim_devices(4), o);
  ASSERT_TRUE(q);
  EXPECT_EQ(q->used_devices(), (std::vector<int>{0}));
  EXPECT_EQ(steps_of(*q, step_kind::copy_peer).size(), 0u);
  EXPECT_EQ(steps_of(*q, step_kind::compute).size(), 1u);
}

TEST(Planner, PinsRespected) {
  graph_builder b;
  auto x = b.input("x", dtype::f32, {8, 8});
  auto w = b.weight("w", host_tensor::random_normal(dtype::f32, {8, 8}, 5));
  b.set_layer(0);
  auto a = b.matmul(x, w, false, false, "a");
  b.set_layer(1);
  auto c = b.gelu(a, gelu_mode::tanh, "c");
  b.pin(c, 3);
  b.set_layer(2);
  auto d = b.matmul(c, w, false, false, "d");
  b.output(d);
  auto g = finish(std::move(b));
  auto p = must_compile(g, sim_devices(4));
  ASSERT_TRUE(p);
  check_structure(*p);
  EXPECT_EQ(p->placement()[static_cast<std::size_t>(g->find("c"))], 3);
  int into3 = 0, outof3 = 0;
  for (const step* s : steps_of(*p, step_kind::copy_peer)) {
    into3 += s->device == 3;
    outof3 += s->src_device == 3;
  }
  EXPECT_EQ(into3, 1);
  EXPECT_EQ(outof3, p->placement()[static_cast<std::size_t>(g->find("d"))] == 3 ? 0 : 1);
  EXPECT_TRUE(check_hazards(*p).ok());
}

TEST(Planner, PinOutOfRangeIsInvalidArgument) {
  graph_builder b;
  auto x = b.input("x", dtype::f32, {4, 4});
  auto y = b.gelu(x, gelu_mode::tanh, "the_pinned_one");
  b.pin(y, 7);
  b.output(y);
  auto g = finish(std::move(b));
  auto p = compile(g, sim_devices(4));
  ASSERT_FALSE(p.has_value());
  EXPECT_EQ(p.err().code, errc::invalid_argument);
  EXPECT_NE(p.err().message.find("the_pinned_one"), std::string::npos) << p.err().message;
}

std::shared_ptr<const graph> matmul_gelu_layers(int layers) {
  graph_builder b;
  auto x = b.input("x", dtype::f32, {8, 16});
  for (int l = 0; l < layers; ++l) {
    b.set_layer(l);
    auto w = b.weight("w" + std::to_string(l), host_tensor::random_normal(dtype::f32, {16, 16}, static_cast<uint64_t>(l) + 1));
    x = b.gelu(b.matmul(x, w, false, false, "mm" + std::to_string(l)), gelu_mode::tanh, "gelu" + std::to_string(l));
  }
  b.output(x);
  return finish(std::move(b));
}

TEST(Planner, FallbackToNearestSupportingDevice) {
  auto g = matmul_gelu_layers(8);
  auto devs = sim_devices(4);
  devs[1].unsupported = {op_kind::gelu};
  auto p = must_compile(g, devs);
  ASSERT_TRUE(p);
  check_structure(*p);
  // Layers 2 and 3 go to device 1 by the DP; their gelus move to device 0 (nearest, lower on ties).
  EXPECT_EQ(p->placement()[static_cast<std::size_t>(g->find("mm2"))], 1);
  EXPECT_EQ(p->placement()[static_cast<std::size_t>(g->find("gelu2"))], 0);
  EXPECT_EQ(p->placement()[static_cast<std::size_t>(g->find("gelu3"))], 0);
  for (const node& n : g->nodes()) {
    if (n.op == op_kind::gelu) {
      EXPECT_NE(p->placement()[static_cast<std::size_t>(n.id)], 1);
    }
  }
  EXPECT_TRUE(check_hazards(*p).ok());
}

TEST(Planner, UnsupportedEverywhereIsAnError) {
  auto g = matmul_gelu_layers(2);
  auto devs = sim_devices(3);
  for (auto& d : devs) d.unsupported = {op_kind::gelu};
  auto p = compile(g, devs);
  ASSERT_FALSE(p.has_value());
  EXPECT_EQ(p.err().code, errc::unsupported_op);
  EXPECT_NE(p.err().message.find("gelu0"), std::string::npos) << p.err().message;
  EXPECT_NE(p.err().message.find("gelu"), std::string::npos);
}

TEST(Planner, BadArgumentsAreErrors) {
  auto g = matmul_gelu_layers(1);
  EXPECT_EQ(compile(g, {}).err().code, errc::invalid_argument);
  EXPECT_EQ(compile(nullptr, sim_devices(1)).err().code, errc::invalid_argument);
  plan_options o;
  o.lanes_per_device = -1;
  EXPECT_EQ(compile(g, sim_devices(1), o).err().code, errc::invalid_argument);
}

TEST(Planner, PrunesDeadNodesAndUnusedInputs) {
  graph_builder b;
  auto x = b.input("x", dtype::f32, {4, 8});
  auto unused = b.input("unused", dtype::f32, {4, 8});
  auto dead = b.gelu(x, gelu_mode::tanh, "dead");
  auto dead2 = b.add(dead, unused, "dead2");
  (void)dead2;
  auto y = b.silu(x, "y");
  b.output(y);
  auto g = finish(std::move(b));
  auto p = must_compile(g, sim_devices(2));
  ASSERT_TRUE(p);
  check_structure(*p);
  for (const step* s : steps_of(*p, step_kind::copy_h2d)) EXPECT_EQ(s->ops[0], g->find("x"));
  EXPECT_EQ(steps_of(*p, step_kind::copy_h2d).size(), 1u);
  EXPECT_EQ(p->placement()[static_cast<std::size_t>(g->find("dead"))], -1);
  EXPECT_EQ(p->placement()[static_cast<std::size_t>(g->find("unused"))], -1);
}

TEST(Planner, CopiesDedupedPerTensorAndDevice) {
  graph_builder b;
  auto x = b.input("x", dtype::f32, {8, 8});
  auto a = b.gelu(x, gelu_mode::tanh, "a");
  b.pin(a, 0);
  auto c1 = b.silu(a, "c1");
  auto c2 = b.mul(a, c1, "c2");
  auto c3 = b.add(a, c2, "c3");
  b.pin(c1, 1);
  b.pin(c2, 1);
  b.pin(c3, 2);
  b.output(c3);
  auto g = finish(std::move(b));
  auto p = must_compile(g, sim_devices(3));
  ASSERT_TRUE(p);
  check_structure(*p);
  std::map<std::pair<std::string, int>, int> copies;
  for (const step* s : steps_of(*p, step_kind::copy_peer)) ++copies[{g->at(s->ops[0]).name, s->device}];
  EXPECT_EQ(copies.size(), 3u);  // a -> 1, a -> 2, c2 -> 2
  EXPECT_EQ((copies[{"a", 1}]), 1);
  EXPECT_EQ((copies[{"a", 2}]), 1);
  EXPECT_EQ((copies[{"c2", 2}]), 1);
  EXPECT_TRUE(check_hazards(*p).ok());
}

TEST(Planner, ViewAcrossDevicesCopiesStorageAndResolvesThere) {
  graph_builder b;
  auto x = b.input("x", dtype::f32, {8, 12});
  auto a = b.gelu(x, gelu_mode::tanh, "a");
  b.pin(a, 0);
  auto t = b.transpose(a, 0, 1, "t");                 // [12, 8], non-contiguous
  auto s = b.slice(a, 0, 2, 6, "s");                  // rows 2..5, contiguous with an offset
  auto w = b.weight("w", host_tensor::random_normal(dtype::f32, {8, 4}, 3));
  auto m = b.matmul(t, w, false, false, "m");
  b.pin(m, 1);
  b.output(m);
  b.output(t);
  b.output(s);
  auto g = finish(std::move(b));
  auto p = must_compile(g, sim_devices(2));
  ASSERT_TRUE(p);
  check_structure(*p);
  auto peers = steps_of(*p, step_kind::copy_peer);
  ASSERT_EQ(peers.size(), 1u);
  EXPECT_EQ(peers[0]->ops[0], g->find("a"));
  EXPECT_EQ(peers[0]->bytes, 8 * 12 * 4);
  const node& tn = g->at(g->find("t"));
  auto lt = p->locate(tn.id, 1);
  auto la = p->locate(g->find("a"), 1);
  ASSERT_TRUE(lt.has_value());
  ASSERT_TRUE(la.has_value());
  EXPECT_EQ(lt->stride, tn.stride);
  EXPECT_EQ(lt->byte_offset, la->byte_offset + tn.offset * 4);
  const node& sn = g->at(g->find("s"));
  auto ls = p->locate(sn.id, 0);
  auto la0 = p->locate(g->find("a"), 0);
  ASSERT_TRUE(ls.has_value());
  EXPECT_EQ(ls->byte_offset, la0->byte_offset + 2 * 12 * 4);
  // d2h: the non-contiguous view ships its storage whole, the contiguous slice only itself.
  for (const step* d : steps_of(*p, step_kind::copy_d2h)) {
    if (d->ops[0] == tn.id) {
      EXPECT_EQ(d->bytes, 8 * 12 * 4);
    }
    if (d->ops[0] == sn.id) {
      EXPECT_EQ(d->bytes, 4 * 12 * 4);
    }
    if (d->ops[0] != g->find("m")) {
      EXPECT_EQ(d->device, 0);
    }
  }
  EXPECT_FALSE(p->locate(g->find("m"), 0).has_value());
  EXPECT_EQ(p->locate(g->find("m"), 0).err().code, errc::internal);
  EXPECT_TRUE(check_hazards(*p).ok());
}

// Two independent matmul chains joined by an add, on one device.
std::shared_ptr<const graph> two_chains(int64_t m, int64_t k) {
  graph_builder b;
  auto x = b.input("x", dtype::f32, {m, k});
  tensor chain[2];
  for (int c = 0; c < 2; ++c) {
    tensor t = x;
    for (int i = 0; i < 2; ++i) {
      auto w = b.weight("w" + std::to_string(c) + std::to_string(i),
                        host_tensor::random_normal(dtype::f32, {k, k}, static_cast<uint64_t>(c * 10 + i + 1), 0.05f));
      t = b.matmul(t, w, false, false, std::string(1, static_cast<char>('a' + c)) + std::to_string(i));
    }
    chain[c] = t;
  }
  b.output(b.add(chain[0], chain[1], "join"));
  return finish(std::move(b));
}

std::vector<device_spec> teraflop_device() {
  auto v = sim_devices(1);
  v[0].flops_f32 = 1e12;  // 64x256x256 matmul ~ 8.4 us + 4.5 us launch
  return v;
}

TEST(Planner, HeavyIndependentBranchesGetTheirOwnLanes) {
  auto g = two_chains(64, 256);
  plan_options o;
  o.lanes_per_device = 2;
  auto p = must_compile(g, teraflop_device(), o);
  ASSERT_TRUE(p);
  check_structure(*p);
  std::set<int> lanes;
  for (const step* s : steps_of(*p, step_kind::compute)) lanes.insert(s->lane);
  EXPECT_EQ(lanes, (std::set<int>{0, 1}));
  // a0, a1 share a split; b0, b1 share another on the other lane.
  auto split_of = [&](const std::string& name) {
    for (const step* s : steps_of(*p, step_kind::compute))
      if (std::count(s->ops.begin(), s->ops.end(), g->find(name))) return s;
    return static_cast<const step*>(nullptr);
  };
  ASSERT_TRUE(split_of("a0") && split_of("b0"));
  EXPECT_EQ(split_of("a0"), split_of("a1"));
  EXPECT_EQ(split_of("b0"), split_of("b1"));
  EXPECT_NE(split_of("a0")->lane, split_of("b0")->lane);
  // Neither branch waits for the other.
  for (step_id d : split_of("a0")->deps) EXPECT_NE(d, split_of("b0")->id);
  for (step_id d : split_of("b0")->deps) EXPECT_NE(d, split_of("a0")->id);
  EXPECT_TRUE(check_hazards(*p).ok());
  // Same graph with one lane: one split.
  o.lanes_per_device = 1;
  auto q = must_compile(g, teraflop_device(), o);
  ASSERT_TRUE(q);
  EXPECT_EQ(steps_of(*q, step_kind::compute).size(), 1u);
}

TEST(Planner, LightBranchesStayOnOneLane) {
  auto g = two_chains(4, 16);
  plan_options o;
  o.lanes_per_device = 2;
  auto p = must_compile(g, teraflop_device(), o);
  ASSERT_TRUE(p);
  check_structure(*p);
  auto comp = steps_of(*p, step_kind::compute);
  ASSERT_EQ(comp.size(), 1u);
  EXPECT_EQ(comp[0]->lane, 0);
}

// Issue 16's branchy graph (random_dag.hpp chains_graph): the sums join the
// chains, they do not merge them.
std::shared_ptr<const graph> summed_chains(int chains, int depth, int64_t rows, int64_t d) {
  return std::make_shared<const graph>(test::chains_graph(chains, depth, rows, d));
}

int lanes_used(const plan& p) {
  int n = 1;
  for (const step* s : steps_of(p, step_kind::compute)) n = std::max(n, s->lane + 1);
  return n;
}

TEST(Planner, JoinsOfBranchResultsDoNotMergeTheBranches) {
  auto g = summed_chains(4, 3, 16, 64);
  plan_options o;
  o.lanes_per_device = 4;
  o.min_branch_seconds = 0;
  auto p = must_compile(g, sim_devices(1), o);
  ASSERT_TRUE(p);
  check_structure(*p);
  EXPECT_EQ(lanes_used(*p), 4);
  // each chain on one lane, the chains on four different lanes, the sums on lane 0
  std::set<int> chain_lanes;
  for (int c = 0; c < 4; ++c) {
    std::set<int> mine;
    for (const step* s : steps_of(*p, step_kind::compute))
      for (node_id id : s->ops)
        if (g->at(id).name.rfind("c" + std::to_string(c) + ".", 0) == 0) mine.insert(s->lane);
    ASSERT_EQ(mine.size(), 1u) << "chain " << c << " spans lanes";
    chain_lanes.insert(*mine.begin());
  }
  EXPECT_EQ(chain_lanes.size(), 4u);
  for (const step* s : steps_of(*p, step_kind::compute))
    for (node_id id : s->ops)
      if (g->at(id).name.rfind("join", 0) == 0) { EXPECT_EQ(s->lane, 0) << g->at(id).name; }
  EXPECT_TRUE(check_hazards(*p).ok());
}

// Auto lanes (the default) on branches that are all launch-bound, without
// graph replay: launches of every lane come one after another (one actor
// launches them), so the cost model predicts no gain and the planner keeps
// one lane, however much arena it may use. (Measured on an H100: 4 lanes ran
// these 1.07x faster than one.)
TEST(Planner, AutoLanesKeepLaunchBoundBranchesOnOneLane) {
  auto g = summed_chains(8, 8, 16, 256);
  plan_options roomy;  // lanes_per_device 0: auto
  EXPECT_EQ(roomy.lanes_per_device, 0);
  roomy.graph_replay = graph_replay_mode::off;  // plain launches (replay is the next test)
  roomy.max_lane_memory_ratio = 4;
  auto p = must_compile(g, sim_devices(1), roomy);
  ASSERT_TRUE(p);
  EXPECT_EQ(lanes_used(*p), 1) << (*p).describe();
  EXPECT_NE((*p).describe().find("auto lanes: 1 used"), std::string::npos) << (*p).describe();
}

// The same launch-bound chains under graph replay: a replayed kernel has no
// launch of its own, only the kernel latency, which lanes overlap (measured
// on an H100: 4 lanes ran these chains 1.49x faster than one under replay).
// Lanes pay by the model now: the planner spreads the chains, and the
// hazard checker proves the lane plan's memory. Not on a cpu device (it never
// replays), nor with replay off (the test above).
TEST(Planner, AutoLanesSpreadLaunchBoundBranchesUnderGraphReplay) {
  auto g = summed_chains(8, 8, 16, 256);
  plan_options o;  // default memory limits: 1.1 x the one-lane arena, or 1 MiB more
  o.graph_replay = graph_replay_mode::on;
  auto p = must_compile(g, sim_devices(1), o);
  ASSERT_TRUE(p);
  check_structure(*p);
  EXPECT_TRUE(check_hazards(*p).ok());
  EXPECT_EQ(lanes_used(*p), sim_devices(1)[0].max_lanes) << (*p).describe();
  o.graph_replay = graph_replay_mode::automatic;
  auto pa = must_compile(g, sim_devices(1), o);
  ASSERT_TRUE(pa);
  EXPECT_EQ(lanes_used(*pa), lanes_used(*p));
  auto cpu = sim_devices(1);
  cpu[0].kind = device_kind::cpu;
  auto q = must_compile(g, cpu, o);
  ASSERT_TRUE(q);
  EXPECT_EQ(lanes_used(*q), 1) << (*q).describe();
  // Four chains at once keep four chains' buffers live: the lane arena is
  // over 1.1x the one-lane one, admitted by the slack (a few hundred KiB);
  // without the slack, one lane.
  const int64_t one_lane = q->memory()[0].arena_bytes, lanes = p->memory()[0].arena_bytes;
  EXPECT_GT(static_cast<double>(lanes), 1.1 * static_cast<double>(one_lane));
  EXPECT_LE(lanes - one_lane, o.lane_memory_slack_bytes);
  plan_options tight = o;
  tight.lane_memory_slack_bytes = 0;
  auto r = must_compile(g, sim_devices(1), tight);
  ASSERT_TRUE(r);
  EXPECT_EQ(lanes_used(*r), 1) << (*r).describe();
}

// A throughput-bound branch (one large matmul) next to a launch-bound one (a
// chain of small elementwise ops): lanes overlap the second's launches with
// the first's work, the model predicts about half the time, and the small
// branch's buffers keep the arena within max_lane_memory_ratio: two lanes.
// With a ratio the lane plan cannot meet, one lane.
TEST(Planner, AutoLanesOverlapALaunchBoundBranchWithAThroughputBoundOne) {
  graph_builder b;
  auto x = b.input("x", dtype::f32, {1024, 2048});
  auto w = b.weight("w", host_tensor::random_normal(dtype::f32, {2048, 2048}, 3, 0.02f));
  auto big = b.matmul(x, w, false, false, "big");  // ~143 us at 60 TFLOP/s
  auto s = b.input("s", dtype::f32, {16, 256});
  tensor h = s;
  for (int k = 0; k < 32; ++k) h = b.gelu(h, gelu_mode::tanh, "small" + std::to_string(k));  // 4.5 us launches
  b.output(big);
  b.output(h);
  auto g = finish(std::move(b));
  plan_options one;
  one.lanes_per_device = 1;
  auto p1 = must_compile(g, sim_devices(1), one);
  ASSERT_TRUE(p1);
  auto p = must_compile(g, sim_devices(1), plan_options{});
  ASSERT_TRUE(p);
  check_structure(*p);
  EXPECT_EQ(lanes_used(*p), 2) << (*p).describe();
  EXPECT_LE(static_cast<double>(p->memory()[0].arena_bytes), 1.1 * static_cast<double>(p1->memory()[0].arena_bytes));
  EXPECT_TRUE(check_hazards(*p).ok());
  plan_options strict;
  strict.max_lane_memory_ratio = 1.0;
  strict.lane_memory_slack_bytes = 0;
  auto q = must_compile(g, sim_devices(1), strict);
  ASSERT_TRUE(q);
  if (p->memory()[0].arena_bytes > p1->memory()[0].arena_bytes) { EXPECT_EQ(lanes_used(*q), 1); }
}

// Throughput-bound branches (large matmuls) gain nothing from lanes in the
// cost model (their kernels share the device's throughput): one lane.
TEST(Planner, AutoLanesLeaveThroughputBoundBranchesOnOneLane) {
  auto g = two_chains(1024, 2048);  // ~290 us per matmul at 60 TFLOP/s f32, 4.5 us launch
  plan_options o;
  o.max_lane_memory_ratio = 100;
  auto p = must_compile(g, sim_devices(1), o);
  ASSERT_TRUE(p);
  EXPECT_EQ(lanes_used(*p), 1) << (*p).describe();
  // the same branches, lanes asked for explicitly: spread (the caller decided)
  o.lanes_per_device = 2;
  auto q = must_compile(g, sim_devices(1), o);
  ASSERT_TRUE(q);
  EXPECT_EQ(lanes_used(*q), 2);
}

// Folded lanes (plan_options::fold_lanes, the default under replay) are one
// graph: one launch for every lane and a graph edge for a fork or a join.
// On a device whose launches are dear (10 us) and replayed kernels cheap
// (3.5 us), two chains of 4 tiny kernels (2 links of a product and an
// activation) gain from a second lane only when folded: about 14 + 7 us
// against 28 on one lane, where unfolded lanes pay a launch each and an
// event record and wait for the fork and the join (about 20 + 20 us).
TEST(Planner, AutoLanesChargeFoldedLanesOneLaunchAndAnEdgeAFork) {
  auto g = summed_chains(2, 2, 16, 256);
  auto devices = sim_devices(1);
  devices[0].launch_latency = 10e-6;
  devices[0].kernel_latency = 3.5e-6;
  plan_options o;
  o.graph_replay = graph_replay_mode::on;
  o.min_branch_seconds = 0;
  o.max_lane_memory_ratio = 100;
  ASSERT_TRUE(o.fold_lanes);
  auto folded = must_compile(g, devices, o);
  ASSERT_TRUE(folded);
  EXPECT_EQ(lanes_used(*folded), 2) << (*folded).describe();
  EXPECT_EQ(folded_lanes(*folded)[0], 2);
  EXPECT_TRUE(check_hazards(*folded).ok());
  o.fold_lanes = false;
  auto unfolded = must_compile(g, devices, o);
  ASSERT_TRUE(unfolded);
  EXPECT_EQ(lanes_used(*unfolded), 1) << (*unfolded).describe();
  o.fold_lanes = true;
  o.graph_replay = graph_replay_mode::off;  // plain launches: eight of them back to back either way
  auto plain = must_compile(g, devices, o);
  ASSERT_TRUE(plain);
  EXPECT_EQ(lanes_used(*plain), 1) << (*plain).describe();
}

// LLaMA's gate and up products at B 8, T 128, d 2048, ff 5632 (the shape
// session 79 measured on an H100: 1.122 ms a 4-layer job on one lane, 1.087
// on two forced lanes) on a device of an H100's rates. Each product is 352
// tiles of 128 over 132 SMs, 2.67 waves that take 3: its last wave leaves a
// third of the SMs idle, which the other product fills. Auto lanes put them
// side by side once that tail counts (device_spec::gemm_sms), and keep one
// lane without it, where the two products' summed throughput time is all
// the model sees.
TEST(Planner, AutoLanesSetGatedProductsSideBySideWhereTheirLastWavesLeaveSMsIdle) {
  ag::models::transformer_config cfg;
  cfg.variant = ag::models::model_variant::llama;
  cfg.n_layers = 1;
  cfg.d_model = 2048;
  cfg.n_heads = 16;
  cfg.d_ff = 5632;
  cfg.vocab = 4096;
  cfg.seq_len = 128;
  cfg.batch = 8;
  cfg.dtype = dtype::bf16;
  cfg.weight_values = false;  // planned, not run
  auto built = ag::models::build_transformer(cfg);
  ASSERT_TRUE(built) << built.err().to_string();
  auto g = std::make_shared<const graph>(std::move(*built));
  device_spec h100 = sim_devices(1)[0];
  h100.flops_bf16 = 1070e12;
  h100.compute_efficiency = 0.76;
  h100.memory_efficiency = 0.86;
  h100.gemm_row_tile = 128;
  plan_options o;  // auto lanes
  o.graph_replay = graph_replay_mode::on;
  o.max_lane_memory_ratio = 4;
  const auto lane_of = [&](const plan& p, const std::string& name) {
    for (const step* st : steps_of(p, step_kind::compute))
      for (node_id id : st->ops)
        if (p.source().at(id).name == name) return st->lane;  // the planned graph (fused, norms folded)
    return -1;
  };
  h100.gemm_sms = 132;
  auto waves = must_compile(g, {h100}, o);
  ASSERT_TRUE(waves);
  check_structure(*waves);
  EXPECT_TRUE(check_hazards(*waves).ok());
  const int gate = lane_of(*waves, "l1.mlp.gate"), up = lane_of(*waves, "l1.mlp.up");
  ASSERT_GE(gate, 0) << (*waves).describe();
  ASSERT_GE(up, 0);
  EXPECT_NE(gate, up) << (*waves).describe();
  h100.gemm_sms = 0;
  auto linear = must_compile(g, {h100}, o);
  ASSERT_TRUE(linear);
  EXPECT_EQ(lane_of(*linear, "l1.mlp.gate"), lane_of(*linear, "l1.mlp.up")) << (*linear).describe();
}

TEST(Planner, RandomDagsAreWellFormed) {
  for (uint64_t seed = 1; seed <= 60; ++seed) {
    auto gr = test::random_dag({.seed = seed, .ops = 20});
    ASSERT_TRUE(gr.has_value()) << gr.err().to_string();
    auto g = std::make_shared<const graph>(std::move(*gr));
    plan_options o;
    o.lanes_per_device = 1 + static_cast<int>(seed % 3);
    o.min_branch_seconds = 0;
    auto p = must_compile(g, sim_devices(1 + static_cast<int>(seed % 4)), o);
    ASSERT_TRUE(p) << "seed " << seed;
    SCOPED_TRACE("seed " + std::to_string(seed));
    check_structure(*p);
  }
}

// Auto lanes with wave tails on every product (slow compute, tiles of 4 on
// 3 SMs): whatever lanes the model picks, the plan is well formed and its
// memory plan has no hazard. The sweep counts the graphs whose lanes the
// tails changed, so that it cannot pass on one-lane plans alone.
TEST(Planner, AutoLanesWithWaveTailsPlanRandomDagsWithoutHazards) {
  int changed = 0;
  for (uint64_t seed = 1; seed <= 100; ++seed) {
    auto gr = test::random_dag({.seed = seed, .ops = 40});
    ASSERT_TRUE(gr.has_value()) << gr.err().to_string();
    auto g = std::make_shared<const graph>(std::move(*gr));
    auto devices = sim_devices(1 + static_cast<int>(seed % 2));
    for (auto& d : devices) {
      d.flops_f32 = 1e7;  // products bound by compute and longer than launches: their tails count
      d.gemm_row_tile = 4;
    }
    plan_options o;  // auto lanes
    o.graph_replay = graph_replay_mode::on;
    o.min_branch_seconds = 0;
    o.max_lane_memory_ratio = 100;
    auto linear = must_compile(g, devices, o);
    ASSERT_TRUE(linear) << "seed " << seed;
    for (auto& d : devices) d.gemm_sms = 3;
    auto p = must_compile(g, devices, o);
    ASSERT_TRUE(p) << "seed " << seed;
    SCOPED_TRACE("seed " + std::to_string(seed));
    check_structure(*p);
    EXPECT_TRUE(check_hazards(*p).ok());
    const auto lanes_of = [](const plan& q) {
      std::map<std::string, int> lane;
      for (const step* st : steps_of(q, step_kind::compute))
        for (node_id id : st->ops) lane[q.source().at(id).name] = st->lane;
      return lane;
    };
    changed += lanes_of(*p) != lanes_of(*linear);
  }
  std::printf("random graphs whose lanes the tails changed: %d of 100\n", changed);
  EXPECT_GT(changed, 0) << "the sweep never planned a lane choice that the tails made";
}

TEST(Planner, LeavesAsOutputs) {
  graph_builder b;
  auto x = b.input("x", dtype::f32, {4, 6});
  auto w = b.weight("w", host_tensor::random_normal(dtype::f32, {6, 4}, 8));
  auto y = b.input("y", dtype::f32, {4, 4});
  auto wt = b.transpose(w, 0, 1, "wt");
  b.output(x);
  b.output(wt);
  b.output(b.add(y, y, "yy"));
  b.pin(x, 1);
  auto g = finish(std::move(b));
  auto p = must_compile(g, sim_devices(2));
  ASSERT_TRUE(p);
  check_structure(*p);
  auto d2h = steps_of(*p, step_kind::copy_d2h);
  ASSERT_EQ(d2h.size(), 3u);
  // The pinned, unread input is uploaded to its pin and read back from there.
  EXPECT_EQ(d2h[0]->ops[0], g->find("x"));
  EXPECT_EQ(d2h[0]->device, 1);
  ASSERT_EQ(d2h[0]->deps.size(), 1u);
  EXPECT_EQ(p->at(d2h[0]->deps[0]).kind, step_kind::copy_h2d);
  EXPECT_EQ(p->at(d2h[0]->deps[0]).device, 1);
  // A view of a weight is read from the weight region, its storage whole.
  const step* wd = d2h[1];
  EXPECT_EQ(wd->ops[0], g->find("wt"));
  EXPECT_TRUE(wd->deps.empty());
  EXPECT_EQ(wd->bytes, 6 * 4 * 4);
  auto loc = p->locate(g->find("wt"), wd->device);
  ASSERT_TRUE(loc.has_value());
  EXPECT_EQ(loc->where, region::weights);
  EXPECT_TRUE(check_hazards(*p).ok()) << check_hazards(*p).to_string();
}

TEST(Planner, DescribeAndDotNameStepsAndTotals) {
  auto g = layered(std::vector<int>(4, 1));
  auto p = must_compile(g, sim_devices(2));
  ASSERT_TRUE(p);
  const std::string text = p->describe();
  EXPECT_NE(text.find("l0.mm0 .. l1.mm0"), std::string::npos) << text;
  EXPECT_NE(text.find("peer 'l1.mm0'"), std::string::npos) << text;
  EXPECT_NE(text.find("arena"), std::string::npos);
  EXPECT_NE(text.find("weights"), std::string::npos);
  const std::string dot = p->to_dot();
  EXPECT_EQ(dot.rfind("digraph", 0), 0u);
  EXPECT_NE(dot.find("cluster_dev1"), std::string::npos);
  EXPECT_STREQ(to_string(step_kind::copy_peer), "peer");
}

// ---- bad input (issue 13) ----------------------------------------------------

bool mentions(const error& e, const std::string& what) { return e.message.find(what) != std::string::npos; }

TEST(PlannerBadInput, OptionsAreValidatedNamingOptionAndValue) {
  auto g = matmul_gelu_layers(1);
  const auto refused = [&](plan_options o, const std::string& name, const std::string& value) {
    auto p = compile(g, sim_devices(2), o);
    ASSERT_FALSE(p.has_value()) << name;
    EXPECT_EQ(p.err().code, errc::invalid_argument);
    EXPECT_TRUE(mentions(p.err(), name) && mentions(p.err(), value)) << p.err().message;
    EXPECT_EQ(validate(o).code, errc::invalid_argument);
  };
  plan_options o;
  EXPECT_TRUE(validate(o).ok());
  o.lanes_per_device = -1;
  refused(o, "lanes_per_device", "-1");
  o.lanes_per_device = 65;
  refused(o, "lanes_per_device", "65");
  o = {};
  o.max_lane_memory_ratio = 0.5;
  refused(o, "max_lane_memory_ratio", "0.5");
  o.max_lane_memory_ratio = std::nan("");
  refused(o, "max_lane_memory_ratio", "nan");
  o = {};
  o.lane_memory_slack_bytes = -1;
  refused(o, "lane_memory_slack_bytes", "-1");
  o = {};
  o.pipeline_stages = -2;
  refused(o, "pipeline_stages", "-2");
  o = {};
  o.policy = static_cast<placement_policy>(7);
  refused(o, "policy", "7");
  o = {};
  o.min_branch_seconds = std::nan("");
  refused(o, "min_branch_seconds", "nan");
  o.min_branch_seconds = -1e-6;
  refused(o, "min_branch_seconds", "-0.000001");
  o.min_branch_seconds = INFINITY;
  refused(o, "min_branch_seconds", "inf");
}

TEST(PlannerBadInput, DeviceSpecsAreValidatedNamingDeviceAndField) {
  auto g = matmul_gelu_layers(1);
  auto devs = sim_devices(2);
  EXPECT_TRUE(validate(devs[0]).ok());
  devs[1].mem_bandwidth = 0;
  auto p = compile(g, devs);
  ASSERT_FALSE(p.has_value());
  EXPECT_EQ(p.err().code, errc::invalid_argument);
  EXPECT_TRUE(mentions(p.err(), "sim1") && mentions(p.err(), "mem_bandwidth")) << p.err().message;
  devs = sim_devices(1);
  devs[0].host_latency = std::nan("");
  EXPECT_TRUE(mentions(validate(devs[0]), "host_latency"));
  devs = sim_devices(1);
  devs[0].mem_bytes = -1;
  EXPECT_TRUE(mentions(validate(devs[0]), "mem_bytes"));
  devs = sim_devices(1);
  devs[0].copy_engines = 0;
  EXPECT_TRUE(mentions(validate(devs[0]), "copy_engines"));
  devs = sim_devices(1);
  devs[0].sequence_parallel_min_bytes = -1;
  EXPECT_TRUE(mentions(validate(devs[0]), "sequence_parallel_min_bytes"));
  for (double bad : {0.0, -0.5, 1.5, std::nan("")}) {
    devs = sim_devices(1);
    devs[0].compute_efficiency = bad;
    EXPECT_TRUE(mentions(validate(devs[0]), "compute_efficiency")) << bad;
    devs = sim_devices(1);
    devs[0].memory_efficiency = bad;
    EXPECT_TRUE(mentions(validate(devs[0]), "memory_efficiency")) << bad;
  }
}

// The cost model divides by the share of the peaks kernels reach: a matmul
// bound by compute takes 1/compute_efficiency as long (less its launch), a
// copy bound by memory 1/memory_efficiency.
TEST(CostModel, EfficienciesStretchTheBoundingTerm) {
  device_spec d;
  d.launch_latency = 0;
  op_cost mm{2e12, 1e6};    // compute bound
  op_cost copy{1e3, 1e10};  // memory bound
  const double mm_peak = estimate_seconds(d, mm, dtype::bf16), copy_peak = estimate_seconds(d, copy, dtype::bf16);
  d.compute_efficiency = 0.5;
  EXPECT_DOUBLE_EQ(estimate_seconds(d, mm, dtype::bf16), 2 * mm_peak);
  EXPECT_DOUBLE_EQ(estimate_seconds(d, copy, dtype::bf16), copy_peak);
  d.memory_efficiency = 0.25;
  EXPECT_DOUBLE_EQ(estimate_seconds(d, copy, dtype::bf16), 4 * copy_peak);
}

TEST(PlannerBadInput, EmptyGraphIsRefusedAtCompile) {
  // a default-constructed graph has no outputs: its jobs would finish "done"
  // with nothing
  auto p = compile(std::make_shared<const graph>(), sim_devices(1));
  ASSERT_FALSE(p.has_value());
  EXPECT_EQ(p.err().code, errc::invalid_argument);
  EXPECT_TRUE(mentions(p.err(), "no outputs")) << p.err().message;
  // and the builder refuses a graph without outputs too
  graph_builder b;
  b.input("x", dtype::f32, {4});
  auto g = std::move(b).build();
  ASSERT_FALSE(g.has_value());
  EXPECT_TRUE(mentions(g.err(), "no outputs")) << g.err().message;
}

TEST(PlannerBadInput, JobLargerThanHostMemoryIsRefusedWithTheSizeBeforeAllocating) {
  // An input of more bytes than this host has (3e9 f32 elements on a 8 GiB
  // host): compile says how much a job needs instead of trying.
  const int64_t elems = host_memory_bytes() / 4 + 1;
  graph_builder b;
  auto x = b.input("x", dtype::f32, {elems});
  b.output(b.gelu(x, gelu_mode::tanh, "y"));
  auto g = finish(std::move(b));
  // A device with room for it (1 PiB), so that only the host's side is too
  // big whatever this host's memory (an 80 GiB device on a 128 GiB host
  // refused the arena first).
  auto devices = sim_devices(1);
  devices[0].mem_bytes = int64_t{1} << 50;
  auto p = compile(g, devices);
  ASSERT_FALSE(p.has_value());
  EXPECT_EQ(p.err().code, errc::out_of_memory);
  EXPECT_TRUE(mentions(p.err(), std::to_string(2 * elems * 4)))  // input + output
      << p.err().message;
  EXPECT_TRUE(mentions(p.err(), "input 0 'x'")) << p.err().message;
  EXPECT_TRUE(mentions(p.err(), std::to_string(host_memory_bytes()))) << p.err().message;
}

TEST(PlannerBadInput, DevicesInHostMemoryCountTheirArenasAgainstTheHost) {
  // input + output are half of the host; a device in host memory (cpu, sim
  // computing values) needs as much again for its arena: 3e9 elements on a
  // host of 24 GB. Refused with the sizes, before anything is allocated.
  const int64_t elems = host_memory_bytes() / 16 + 1;
  graph_builder b;
  auto x = b.input("x", dtype::f32, {elems});
  b.output(b.gelu(x, gelu_mode::tanh, "y"));
  auto g = finish(std::move(b));
  auto devs = sim_devices(1);
  devs[0].mem_bytes = host_memory_bytes();
  ASSERT_TRUE(compile(g, devs).has_value());  // a GPU's own memory: fits
  devs[0].in_host_memory = true;
  auto p = compile(g, devs);
  ASSERT_FALSE(p.has_value());
  EXPECT_EQ(p.err().code, errc::out_of_memory);
  EXPECT_TRUE(mentions(p.err(), "inputs and outputs " + std::to_string(2 * elems * 4))) << p.err().message;
  EXPECT_TRUE(mentions(p.err(), "sim0 arena ")) << p.err().message;
}

TEST(PlannerBadInput, ArenaLargerThan2To63IsRefusedNotWrapped) {
  // Three live [2^30, 2^30] f32 tensors (2^62 bytes each, the most a tensor
  // may have) on one device: the arena passes 2^63 and must not wrap to a
  // small size that "fits". The job's own inputs and outputs are tiny.
  const int64_t g30 = int64_t{1} << 30;
  graph_builder b;
  auto x = b.input("x", dtype::f32, {1});
  auto bcast = b.view(x, {g30, g30}, {0, 0, 0, 0}, 0, "bcast");
  auto a = b.contiguous(bcast, "a");
  auto s = b.scale(bcast, 2.0f, "s");
  auto c = b.add(a, s, "c");
  b.output(b.slice(b.slice(c, 0, 0, 1), 1, 0, 1, "corner"));
  auto g = finish(std::move(b));
  auto p = compile(g, sim_devices(1));
  ASSERT_FALSE(p.has_value());
  EXPECT_EQ(p.err().code, errc::out_of_memory);
  EXPECT_TRUE(mentions(p.err(), "sim0") && mentions(p.err(), "2^63")) << p.err().message;
}

}  // namespace

// plan_options::inline_small_copies: a host copy of at most its device's
// inline_copy_max_bytes runs on the compute lane that reads it (first on it)
// or wrote it (last on it); a larger one keeps its copy queue; off, or a
// device whose limit is 0, keeps every copy on its queue.
// plan_options::output_pieces: an output that concatenates tensors computed
// on several devices is copied to the host by each of them, each piece into
// its place (here two runs per piece: the concat axis is not the outermost);
// the concat is never computed and nothing is peer-copied. Off, or with runs
// too short for a copy engine: gathered on one device and copied whole.
TEST(Planner, AnOutputConcatenatedFromSeveralDevicesIsCopiedToTheHostPieceByPiece) {
  const auto build = [](int64_t width) {
    graph_builder b;
    auto x = b.input("x", dtype::f32, {2, 6, width});
    auto p0 = b.silu(x, "p0");
    auto p1 = b.gelu(x, gelu_mode::tanh, "p1");
    auto p2 = b.scale(x, 2.0f, "p2");
    b.pin(p0, 0);
    b.pin(p1, 1);
    b.pin(p2, 0);
    b.output(b.concat({p0, p1, p2}, 1, "out"));
    return finish(std::move(b));
  };
  const auto g = build(256);
  auto p = must_compile(g, sim_devices(2));
  ASSERT_TRUE(p);
  check_structure(*p);
  EXPECT_EQ(p->placement()[static_cast<std::size_t>(g->find("out"))], -1);
  EXPECT_TRUE(steps_of(*p, step_kind::copy_peer).empty());
  const auto d2h = steps_of(*p, step_kind::copy_d2h);
  ASSERT_EQ(d2h.size(), 3u);
  const int64_t run = 6 * 256 * 4, pitch = 3 * run;
  for (const step* s : d2h) {
    const std::string& piece = g->at(s->ops[0]).name;
    const int at = piece == "p0" ? 0 : piece == "p1" ? 1 : 2;
    EXPECT_EQ(s->device, at == 1 ? 1 : 0) << piece;
    EXPECT_EQ(s->host_offset, at * run) << piece;
    EXPECT_EQ(s->host_blocks, 2) << piece;
    EXPECT_EQ(s->host_pitch, pitch) << piece;
    EXPECT_EQ(s->bytes, 2 * run) << piece;
  }
  EXPECT_NE(p->describe().find("piece of output 'out' at byte " + std::to_string(run) + ", 2 runs"), std::string::npos)
      << p->describe();
  EXPECT_TRUE(check_hazards(*p).ok());

  plan_options off;
  off.output_pieces = false;
  const auto gather = [&](const std::shared_ptr<const plan>& q) {
    check_structure(*q);
    const auto d = steps_of(*q, step_kind::copy_d2h);
    ASSERT_EQ(d.size(), 1u);
    EXPECT_EQ(g->at(d[0]->ops[0]).name, "out");
    EXPECT_GE(q->placement()[static_cast<std::size_t>(q->source().find("out"))], 0);
    EXPECT_FALSE(steps_of(*q, step_kind::copy_peer).empty());
  };
  auto q = must_compile(g, sim_devices(2), off);
  ASSERT_TRUE(q);
  gather(q);
  // Runs of 1.5 KiB: gathered on a device too.
  const auto narrow = build(64);
  auto r = must_compile(narrow, sim_devices(2));
  ASSERT_TRUE(r);
  check_structure(*r);
  ASSERT_EQ(steps_of(*r, step_kind::copy_d2h).size(), 1u);
  EXPECT_GE(r->placement()[static_cast<std::size_t>(narrow->find("out"))], 0);
}

TEST(Planner, SmallHostCopiesRunOnTheComputeLaneThatUsesThem) {
  graph_builder b;
  auto tiny = b.input("tiny", dtype::f32, {4, 8});      // 128 bytes
  auto large = b.input("large", dtype::f32, {256, 128});  // 128 KiB
  auto w = b.weight("w", host_tensor::random_normal(dtype::f32, {8, 128}, 5));
  auto h = b.matmul(tiny, w, false, false, "h");          // [4, 128]
  b.output(b.gelu(h, gelu_mode::tanh, "small_out"));      // 2 KiB
  b.output(b.add(large, large, "large_out"));             // 128 KiB
  auto g = finish(std::move(b));
  auto named = [&](const plan& p, step_kind k, const std::string& n) -> const step& {
    for (const step& st : p.steps())
      if (st.kind == k && g->at(st.ops.at(0)).name == n) return st;
    ADD_FAILURE() << "no " << to_string(k) << " of " << n;
    return p.steps().front();
  };
  {
    auto p = must_compile(g, sim_devices(1));
    ASSERT_TRUE(p);
    check_structure(*p);
    EXPECT_TRUE(check_hazards(*p).ok());
    const step& in_tiny = named(*p, step_kind::copy_h2d, "tiny");
    EXPECT_TRUE(in_tiny.on_compute_stream);
    EXPECT_EQ(in_tiny.lane, 0);
    EXPECT_FALSE(named(*p, step_kind::copy_h2d, "large").on_compute_stream);
    EXPECT_TRUE(named(*p, step_kind::copy_d2h, "small_out").on_compute_stream);
    EXPECT_FALSE(named(*p, step_kind::copy_d2h, "large_out").on_compute_stream);
    EXPECT_NE(p->describe().find("inline on lane 0"), std::string::npos) << p->describe();
    // Inlined copies never split a replayed run of compute steps: they
    // join one only at its ends (first its input copies, last its outputs').
    for (const replay_segment& seg : replay_segments(*p)) {
      std::size_t first_compute = seg.steps.size(), last_compute = 0;
      for (std::size_t i = 0; i < seg.steps.size(); ++i)
        if (p->at(seg.steps[i]).kind == step_kind::compute) {
          first_compute = std::min(first_compute, i);
          last_compute = i;
        }
      for (std::size_t i = 0; i < seg.steps.size(); ++i) {
        const step& s = p->at(seg.steps[i]);
        if (s.kind == step_kind::compute) continue;
        EXPECT_TRUE(s.on_compute_stream);
        if (first_compute == seg.steps.size()) continue;  // a segment of copies alone (never replayed)
        if (s.kind == step_kind::copy_h2d) EXPECT_LT(i, first_compute) << "step " << s.id;
        else EXPECT_GT(i, last_compute) << "step " << s.id;
      }
    }
  }
  plan_options off;
  off.inline_small_copies = false;
  auto no_limit = sim_devices(1);
  no_limit[0].inline_copy_max_bytes = 0;
  for (auto [devices, options] : {std::pair{sim_devices(1), off}, std::pair{no_limit, plan_options{}}}) {
    auto p = must_compile(g, devices, options);
    ASSERT_TRUE(p);
    check_structure(*p);
    for (const step& st : p->steps()) EXPECT_FALSE(st.on_compute_stream) << "step " << st.id;
  }
}
