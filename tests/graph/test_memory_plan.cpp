// Memory plan and hazard checker: random DAGs are hazard-free, reuse happens,
// reuse follows happens-before (lanes) and not node order, the checker
// rejects planted overlaps, out-of-memory is reported.

#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <string>

#include "graph/fusion.hpp"
#include "graph/models/transformer.hpp"
#include "graph/plan.hpp"
#include "plan_test_util.hpp"
#include "random_dag.hpp"

namespace {

using namespace ag;

std::vector<device_spec> sim_devices(int n) {
  std::vector<device_spec> v(static_cast<std::size_t>(n));
  for (int i = 0; i < n; ++i) v[static_cast<std::size_t>(i)].name = "sim" + std::to_string(i);
  return v;
}

using test_util::finish;
using test_util::must_compile;

buffer_slot* slot_of(std::vector<device_memory>& mem, int dev, node_id id) {
  for (auto& s : mem[static_cast<std::size_t>(dev)].slots)
    if (s.node == id) return &s;
  return nullptr;
}

bool overlap(const buffer_slot& a, const buffer_slot& b) {
  return a.offset < b.offset + b.bytes && b.offset < a.offset + a.bytes;
}

TEST(MemoryPlan, RandomDagsAreHazardFree) {
  int with_reuse = 0, plans = 0, multi_lane = 0, peer = 0, elided = 0;
  for (uint64_t seed = 1; seed <= 300; ++seed) {
    test::random_dag_options ro;
    ro.seed = seed;
    ro.ops = 8 + static_cast<int>(seed % 33);
    ro.inputs = 1 + static_cast<int>(seed % 3);
    ro.layers = seed % 5 != 0;
    auto gr = test::random_dag(ro);
    ASSERT_TRUE(gr.has_value()) << "seed " << seed << ": " << gr.err().to_string();
    auto g = std::make_shared<const graph>(std::move(*gr));
    plan_options o;
    o.lanes_per_device = 1 + static_cast<int>((seed / 4) % 3);
    o.min_branch_seconds = seed % 2 ? 0.0 : 5e-6;  // lanes used freely on odd seeds
    if (seed % 7 == 0) o.policy = placement_policy::single;
    auto p = must_compile(g, sim_devices(1 + static_cast<int>(seed % 4)), o);
    ASSERT_TRUE(p) << "seed " << seed;
    const error e = check_hazards(*p);
    EXPECT_TRUE(e.ok()) << "seed " << seed << ": " << e.to_string() << "\n" << p->describe();
    ++plans;
    for (int d : p->used_devices()) {
      const device_memory& m = p->memory()[static_cast<std::size_t>(d)];
      EXPECT_LE(m.arena_bytes, m.sum_tensor_bytes + 256 * static_cast<int64_t>(m.slots.size()));
      if (m.arena_bytes < m.sum_tensor_bytes) ++with_reuse;
      for (const buffer_slot& s : m.slots) EXPECT_EQ(s.offset % 256, 0) << "seed " << seed;
    }
    for (const step& s : p->steps()) {
      multi_lane += s.kind == step_kind::compute && s.lane > 0;
      peer += s.kind == step_kind::copy_peer;
    }
    elided += static_cast<int>(p->elided_concats().size());
  }
  EXPECT_EQ(plans, 300);
  // The sample must exercise what it claims to: reuse, several lanes, peer
  // copies, concats whose inputs are written in place.
  EXPECT_GT(with_reuse, 50);
  EXPECT_GT(multi_lane, 10);
  EXPECT_GT(peer, 50);
  EXPECT_GT(elided, 10);
}

std::shared_ptr<const graph> gelu_chain(int n, int64_t d) {
  graph_builder b;
  auto x = b.input("x", dtype::f32, {d, d});
  for (int i = 0; i < n; ++i) x = b.gelu(x, gelu_mode::tanh, "g" + std::to_string(i));
  b.output(x);
  return finish(std::move(b));
}

// x -> three row blocks (gelu, scale, mul) -> concat by rows -> matmul to 8 columns.
std::shared_ptr<const graph> row_blocks_concat(int axis, bool leaf_piece = false) {
  graph_builder b;
  auto x = b.input("x", dtype::f32, {64, 64});
  auto a = b.gelu(x, gelu_mode::tanh, "a");
  auto s = b.scale(x, 2.0f, "s");
  auto m = leaf_piece ? x : b.mul(x, x, "m");
  auto c = b.concat({a, s, m}, axis, "c");
  auto w = b.weight("w", host_tensor::random_normal(dtype::f32, {axis == 0 ? 64 : 192, 8}, 7, 0.1f));
  b.output(b.matmul(c, w, false, false, "out"));
  return finish(std::move(b));
}

TEST(MemoryPlan, ConcatOfComputedRowBlocksIsWrittenInPlace) {
  const int64_t t = 64 * 64 * 4;
  auto g = row_blocks_concat(0);
  auto p = must_compile(g, sim_devices(1));
  ASSERT_TRUE(p);
  ASSERT_EQ(p->elided_concats().size(), 1u) << p->describe();
  const elided_concat& e = p->elided_concats()[0];
  EXPECT_EQ(e.concat, g->find("c"));
  EXPECT_EQ(e.pieces, (std::vector<node_id>{g->find("a"), g->find("s"), g->find("m")}));
  EXPECT_EQ(e.offsets, (std::vector<int64_t>{0, t, 2 * t}));
  EXPECT_TRUE(p->runs_nothing(g->find("c")));
  // Each piece lives at its place inside the concat's buffer.
  const auto c = p->locate(g->find("c"), 0);
  ASSERT_TRUE(c);
  for (std::size_t k = 0; k < e.pieces.size(); ++k) {
    const auto piece = p->locate(e.pieces[k], 0);
    ASSERT_TRUE(piece);
    EXPECT_EQ(piece->byte_offset, c->byte_offset + e.offsets[k]) << "piece " << k;
  }
  EXPECT_TRUE(check_hazards(*p).ok()) << check_hazards(*p).to_string();
  EXPECT_NE(p->describe().find("1 concat(s) elided"), std::string::npos) << p->describe();
  // Without elision the concat is a kernel that copies its inputs, and the
  // pieces and its output are live together.
  plan_options off;
  off.elide_concats = false;
  auto q = must_compile(g, sim_devices(1), off);
  ASSERT_TRUE(q);
  EXPECT_TRUE(q->elided_concats().empty());
  EXPECT_FALSE(q->runs_nothing(g->find("c")));
  EXPECT_LT(p->memory()[0].arena_bytes, q->memory()[0].arena_bytes);
  EXPECT_LT(p->est_seconds(0), q->est_seconds(0));
}

TEST(MemoryPlan, ConcatsWhosePiecesCannotBeInPlaceStayKernels) {
  // Along columns a piece is not a contiguous block of the output.
  auto cols = must_compile(row_blocks_concat(1), sim_devices(1));
  ASSERT_TRUE(cols);
  EXPECT_TRUE(cols->elided_concats().empty());
  // A job input is written by its copy, not by an op.
  auto leaf = must_compile(row_blocks_concat(0, /*leaf_piece=*/true), sim_devices(1));
  ASSERT_TRUE(leaf);
  EXPECT_TRUE(leaf->elided_concats().empty());
  // A view (slice) is not its own storage; a tensor twice in one concat
  // cannot sit in two places.
  graph_builder b;
  auto x = b.input("x", dtype::f32, {64, 64});
  auto a = b.gelu(x, gelu_mode::tanh, "a");
  auto v = b.slice(a, 0, 0, 32, "v");
  auto c1 = b.concat({v, b.scale(v, 2.0f, "s")}, 0, "c1");
  auto c2 = b.concat({a, a}, 0, "c2");
  b.output(c1);
  b.output(c2);
  auto g = finish(std::move(b));
  auto p = must_compile(g, sim_devices(1));
  ASSERT_TRUE(p);
  EXPECT_TRUE(p->elided_concats().empty()) << p->describe();
  EXPECT_TRUE(check_hazards(*p).ok());
}

TEST(MemoryPlan, MisplacedPieceOfAnElidedConcatIsRejected) {
  auto g = row_blocks_concat(0);
  auto p = must_compile(g, sim_devices(1));
  ASSERT_TRUE(p);
  ASSERT_EQ(p->elided_concats().size(), 1u);
  plan bad = *p;
  auto& mem = plan_test_hook::memory(bad);
  buffer_slot* s = slot_of(mem, 0, g->find("s"));
  ASSERT_TRUE(s);
  s->offset += 256;
  const error e = check_hazards(bad);
  ASSERT_FALSE(e.ok());
  EXPECT_NE(e.message.find("'s'"), std::string::npos) << e.message;
  EXPECT_NE(e.message.find("'c'"), std::string::npos) << e.message;
}

TEST(MemoryPlan, ChainReusesBuffers) {
  auto g = gelu_chain(10, 64);
  auto p = must_compile(g, sim_devices(1));
  ASSERT_TRUE(p);
  const device_memory& m = p->memory()[0];
  const int64_t t = 64 * 64 * 4;
  EXPECT_EQ(m.sum_tensor_bytes, 11 * t);
  EXPECT_EQ(m.arena_bytes, 2 * t);  // ping-pong between two buffers
  EXPECT_TRUE(check_hazards(*p).ok());
}

TEST(MemoryPlan, PlantedOverlapIsRejected) {
  auto g = gelu_chain(3, 16);
  auto p = must_compile(g, sim_devices(1));
  ASSERT_TRUE(p);
  ASSERT_TRUE(check_hazards(*p).ok());
  plan bad = *p;
  auto& mem = plan_test_hook::memory(bad);
  buffer_slot* a = slot_of(mem, 0, g->find("g0"));
  buffer_slot* b = slot_of(mem, 0, g->find("g1"));  // g1 reads g0: both live at once
  ASSERT_TRUE(a && b);
  ASSERT_FALSE(overlap(*a, *b));
  b->offset = a->offset;
  const error e = check_hazards(bad);
  ASSERT_FALSE(e.ok());
  EXPECT_NE(e.message.find("'g0'"), std::string::npos) << e.message;
  EXPECT_NE(e.message.find("'g1'"), std::string::npos) << e.message;
  EXPECT_NE(e.message.find("sim0"), std::string::npos) << e.message;
}

TEST(MemoryPlan, SlotOutsideArenaIsRejected) {
  auto g = gelu_chain(3, 16);
  auto p = must_compile(g, sim_devices(1));
  ASSERT_TRUE(p);
  plan bad = *p;
  auto& mem = plan_test_hook::memory(bad);
  slot_of(mem, 0, g->find("g2"))->offset = mem[0].arena_bytes;
  const error e = check_hazards(bad);
  ASSERT_FALSE(e.ok());
  EXPECT_NE(e.message.find("outside the arena"), std::string::npos) << e.message;
}

// Two inputs, two weights, a chain between them on one device: the plan the
// hazard checker's sweep below breaks one invariant at a time.
std::shared_ptr<const graph> two_weight_chain() {
  graph_builder b;
  auto x = b.input("x", dtype::f32, {16, 32});
  auto y = b.input("y", dtype::f32, {16, 32});
  auto w1 = b.weight("w1", host_tensor::random_normal(dtype::f32, {32, 32}, 11, 0.1f));
  auto w2 = b.weight("w2", host_tensor::random_normal(dtype::f32, {32, 32}, 12, 0.1f));
  auto h = b.gelu(b.matmul(b.add(x, y, "xy"), w1, false, false, "h0"), gelu_mode::tanh, "h1");
  b.output(b.matmul(h, w2, false, false, "out"));
  return finish(std::move(b));
}

// Every invariant the checker states, broken alone in an otherwise good
// plan, is rejected with a message that names what broke: a checker whose
// branches never fire could accept a bad plan without anyone knowing.
TEST(MemoryPlan, EachBrokenInvariantIsRejectedByTheHazardCheckWithItsName) {
  auto g = two_weight_chain();
  auto good = must_compile(g, sim_devices(1));
  ASSERT_TRUE(good);
  ASSERT_TRUE(check_hazards(*good).ok()) << check_hazards(*good).to_string();
  auto concat_graph = row_blocks_concat(0);
  auto with_concat = must_compile(concat_graph, sim_devices(1));
  ASSERT_TRUE(with_concat);
  ASSERT_EQ(with_concat->elided_concats().size(), 1u);
  ASSERT_TRUE(check_hazards(*with_concat).ok());
  const auto step_of_kind = [](plan& p, step_kind k, int nth) -> step* {
    for (step& s : plan_test_hook::steps(p))
      if (s.kind == k && nth-- == 0) return &s;
    return nullptr;
  };
  const auto compute_step_of = [](plan& p, node_id id) -> step* {
    for (step& s : plan_test_hook::steps(p))
      if (s.kind == step_kind::compute && std::find(s.ops.begin(), s.ops.end(), id) != s.ops.end()) return &s;
    return nullptr;
  };
  const auto drop_slots_of = [](plan& p, node_id id) {
    auto& slots = plan_test_hook::memory(p)[0].slots;
    slots.erase(std::remove_if(slots.begin(), slots.end(), [&](const buffer_slot& s) { return s.node == id; }),
                slots.end());
    return true;
  };
  struct breakage {
    const char* what;
    bool concat_plan;
    std::function<bool(plan&)> apply;  // false: the plan has nothing to break this way
    std::string says;
  };
  const std::vector<breakage> cases = {
      {"a step id that is not its index", false,
       [](plan& p) { plan_test_hook::steps(p)[0].id = 7; return true; }, "id is not its index 0"},
      {"a step on a device the plan does not have", false,
       [](plan& p) { plan_test_hook::steps(p)[0].device = 3; return true; }, "device out of range"},
      {"a dependency on a step that does not exist", false,
       [](plan& p) { plan_test_hook::steps(p).back().deps.push_back(99); return true; }, "dep out of range"},
      {"an op id outside the graph", false,
       [&](plan& p) {
         step* s = step_of_kind(p, step_kind::compute, 0);
         if (!s) return false;
         s->ops.push_back(static_cast<node_id>(g->size()));
         return true;
       },
       "op id out of range"},
      {"two input copies in one place of their queue", false,
       [&](plan& p) {
         step* a = step_of_kind(p, step_kind::copy_h2d, 0);
         step* b = step_of_kind(p, step_kind::copy_h2d, 1);
         if (!a || !b) return false;
         b->lane_seq = a->lane_seq;
         return true;
       },
       "shares lane_seq"},
      {"a memory plan for another number of devices", false,
       [](plan& p) { plan_test_hook::memory(p).push_back({}); return true; }, "memory plan has 2 devices, plan has 1"},
      {"a slot naming a node outside the graph", false,
       [&](plan& p) { plan_test_hook::memory(p)[0].slots[0].node = static_cast<node_id>(g->size()); return true; },
       "slot names node"},
      {"two slots for one node", false,
       [&](plan& p) {
         auto& slots = plan_test_hook::memory(p)[0].slots;
         slots.push_back(*slot_of(plan_test_hook::memory(p), 0, g->find("h1")));
         return true;
       },
       "'h1' has two slots"},
      {"a node accessed without a slot", false,
       [&](plan& p) { return drop_slots_of(p, g->find("h1")); },
       "'h1' is accessed on"},
      {"a slot smaller than its tensor", false,
       [&](plan& p) { slot_of(plan_test_hook::memory(p), 0, g->find("h1"))->bytes -= 4; return true; },
       "slot of 'h1'"},
      {"a node written twice", false,
       [&](plan& p) {
         step* s = compute_step_of(p, g->find("h1"));
         if (!s) return false;
         s->ops.push_back(g->find("h1"));
         return true;
       },
       "'h1' is written 2 times"},
      {"two weights in one place", false,
       [&](plan& p) {
         auto& mem = plan_test_hook::memory(p);
         slot_of(mem, 0, g->find("w2"))->offset = slot_of(mem, 0, g->find("w1"))->offset;
         return true;
       },
       "weights 'w1' and 'w2' overlap"},
      {"an elided concat without a slot", true,
       [&](plan& p) { return drop_slots_of(p, concat_graph->find("c")); },
       "elided concat 'c' has no slot"},
      {"an elided concat that lists a piece too few", true,
       [](plan& p) {
         auto& e = plan_test_hook::elided_concats(p)[0];
         e.pieces.pop_back();
         e.offsets.pop_back();
         return true;
       },
       "elided concat 'c' does not list each input once"},
      {"an elided concat whose piece is read before it is written", true,
       [&](plan& p) {
         // The reader of the concat ('out') in a step of its own, ordered
         // before the pieces' step: put it first in the queue.
         step* s = compute_step_of(p, concat_graph->find("out"));
         if (!s) return false;
         step* first = compute_step_of(p, concat_graph->find("a"));
         if (s != first) return false;
         const node_id out = concat_graph->find("out");
         s->ops.erase(std::find(s->ops.begin(), s->ops.end(), out));
         s->ops.insert(s->ops.begin(), out);
         return true;
       },
       "elided concat 'c' is read by step"},
  };
  for (const breakage& b : cases) {
    SCOPED_TRACE(b.what);
    plan bad = b.concat_plan ? *with_concat : *good;
    ASSERT_TRUE(b.apply(bad)) << "the plan has nothing to break this way:\n" << bad.describe();
    const error e = check_hazards(bad);
    ASSERT_FALSE(e.ok()) << "accepted";
    EXPECT_EQ(e.code, errc::internal);
    EXPECT_NE(e.message.find(b.says), std::string::npos) << e.message;
  }
}

// Two heavy chains on two lanes: a node-order allocator would give b0 the
// bytes of a0 (a0's last reader a1 comes first in node order), but nothing
// orders lane 1 after lane 0. With one lane the same reuse is legal.
std::shared_ptr<const graph> two_chains() {
  graph_builder b;
  auto x = b.input("x", dtype::f32, {64, 256});
  tensor ends[2];
  for (int c = 0; c < 2; ++c) {
    tensor t = x;
    for (int i = 0; i < 2; ++i) {
      auto w = b.weight("w" + std::to_string(c) + std::to_string(i),
                        host_tensor::random_normal(dtype::f32, {256, 256}, static_cast<uint64_t>(c * 10 + i + 1), 0.05f));
      t = b.matmul(t, w, false, false, std::string(1, static_cast<char>('a' + c)) + std::to_string(i));
    }
    ends[c] = t;
  }
  b.output(b.add(ends[0], ends[1], "join"));
  return finish(std::move(b));
}

TEST(MemoryPlan, ReuseFollowsHappensBeforeNotNodeOrder) {
  auto g = two_chains();
  auto devs = sim_devices(1);
  devs[0].flops_f32 = 1e12;  // each chain ~26 us: worth its own lane
  plan_options o;
  o.lanes_per_device = 2;
  auto p2 = must_compile(g, devs, o);
  ASSERT_TRUE(p2);
  ASSERT_TRUE(check_hazards(*p2).ok());
  const node_id a0 = g->find("a0"), b0 = g->find("b0");
  {
    plan copy = *p2;
    auto& mem = plan_test_hook::memory(copy);
    ASSERT_FALSE(overlap(*slot_of(mem, 0, a0), *slot_of(mem, 0, b0)));
    // Plant the node-order reuse: rejected, the lanes race.
    slot_of(mem, 0, b0)->offset = slot_of(mem, 0, a0)->offset;
    const error e = check_hazards(copy);
    ASSERT_FALSE(e.ok());
    EXPECT_NE(e.message.find("'a0'"), std::string::npos) << e.message;
    EXPECT_NE(e.message.find("'b0'"), std::string::npos) << e.message;
  }
  o.lanes_per_device = 1;
  auto p1 = must_compile(g, devs, o);
  ASSERT_TRUE(p1);
  ASSERT_TRUE(check_hazards(*p1).ok());
  plan copy = *p1;
  auto& mem = plan_test_hook::memory(copy);
  EXPECT_TRUE(overlap(*slot_of(mem, 0, a0), *slot_of(mem, 0, b0))) << "one lane orders a1 before b0: b0 may reuse a0";
  EXPECT_LT(p1->memory()[0].arena_bytes, p2->memory()[0].arena_bytes);
}

TEST(MemoryPlan, OutOfMemoryNamesDevice) {
  auto g = gelu_chain(4, 64);
  auto devs = sim_devices(2);
  devs[0].name = "tiny0";
  devs[0].mem_bytes = 4096;
  auto p = compile(g, devs, {});
  ASSERT_FALSE(p.has_value());
  EXPECT_EQ(p.err().code, errc::out_of_memory);
  EXPECT_NE(p.err().message.find("tiny0"), std::string::npos) << p.err().message;
  EXPECT_NE(p.err().message.find("4096"), std::string::npos) << p.err().message;
}

TEST(MemoryPlan, WeightResidentOnEveryDeviceUsingIt) {
  graph_builder b;
  auto x = b.input("x", dtype::f32, {8, 16});
  auto w = b.weight("shared_w", host_tensor::random_normal(dtype::f32, {16, 16}, 4));
  b.set_layer(0);
  auto y = b.matmul(x, w, false, false, "y");
  b.set_layer(1);
  auto z = b.matmul(y, w, false, false, "z");
  b.output(z);
  auto g = finish(std::move(b));
  auto p = must_compile(g, sim_devices(2));
  ASSERT_TRUE(p);
  ASSERT_EQ(p->placement()[static_cast<std::size_t>(g->find("y"))], 0);
  ASSERT_EQ(p->placement()[static_cast<std::size_t>(g->find("z"))], 1);
  for (int d = 0; d < 2; ++d) {
    auto loc = p->locate(g->find("shared_w"), d);
    ASSERT_TRUE(loc.has_value()) << "device " << d;
    EXPECT_EQ(loc->where, region::weights);
    EXPECT_EQ(p->memory()[static_cast<std::size_t>(d)].weight_bytes, 16 * 16 * 4);
  }
  EXPECT_TRUE(check_hazards(*p).ok());
}

TEST(MemoryPlan, TransformerPipelineIsHazardFree) {
  models::transformer_config cfg;
  cfg.n_layers = 4;
  auto gr = models::build_transformer(cfg);
  ASSERT_TRUE(gr.has_value()) << gr.err().to_string();
  auto g = std::make_shared<const graph>(std::move(*gr));
  for (int lanes = 1; lanes <= 2; ++lanes) {
    plan_options o;
    o.lanes_per_device = lanes;
    o.min_branch_seconds = 0;
    auto p = must_compile(g, sim_devices(3), o);
    ASSERT_TRUE(p);
    EXPECT_TRUE(check_hazards(*p).ok()) << check_hazards(*p).to_string();
    EXPECT_EQ(p->used_devices().size(), 3u);
    for (int d : p->used_devices())
      EXPECT_LT(p->memory()[static_cast<std::size_t>(d)].arena_bytes, p->memory()[static_cast<std::size_t>(d)].sum_tensor_bytes);
  }
}

// A fused attention chain's scores, masked scores and probabilities are
// never written (the fused kernel keeps them in registers and shared
// memory): they hold no memory (plan::materialised), and the arena of a
// prompt chunk over a long cache is a fraction of one layer's scores. With
// fusion off the same plan holds them. Both plans are hazard-free.
TEST(MemoryPlan, FusedAttentionChainsHoldNoMemoryForTheirScores) {
  models::transformer_config cfg;
  cfg.variant = models::model_variant::llama;
  cfg.n_layers = 2;
  cfg.d_model = 64;
  cfg.n_heads = 4;
  cfg.n_kv_heads = 2;
  cfg.d_ff = 128;
  cfg.vocab = 100;
  cfg.seq_len = 64;
  cfg.kv_cache_capacity = 4096;
  cfg.mask_from_positions = true;
  cfg.last_row_logits = true;
  cfg.weight_values = false;
  auto gr = models::build_transformer(cfg);
  ASSERT_TRUE(gr.has_value()) << gr.err().to_string();
  auto g = std::make_shared<const graph>(std::move(*gr));
  std::vector<device_spec> cpu(1);
  cpu[0].name = "cpu0";
  cpu[0].kind = device_kind::cpu;
  // One layer's scores: [1, heads, 64 rows, 4096 keys] of f32.
  const int64_t scores_bytes = 4 * 64 * 4096 * 4;
  plan_options fused;
  fused.fuse_ops = true;
  auto p = must_compile(g, cpu, fused);
  ASSERT_TRUE(p);
  ASSERT_EQ(p->fusions().size(), 2u) << "one fused chain a layer";
  for (const attention_fusion& f : p->fusions()) {
    for (node_id id : {f.scores, f.mask_add, f.softmax}) {
      ASSERT_NE(id, no_node);
      EXPECT_FALSE(p->materialised(id)) << g->at(id).name;
      EXPECT_FALSE(p->locate(id, 0)) << g->at(id).name << " has no buffer";
    }
    EXPECT_TRUE(p->materialised(f.out));
    EXPECT_TRUE(p->locate(f.out, 0));
  }
  EXPECT_TRUE(check_hazards(*p).ok()) << check_hazards(*p).to_string();
  const int64_t with = p->memory()[0].arena_bytes;
  EXPECT_LT(with, scores_bytes) << "the arena holds no scores";
  plan_options unfused = fused;
  unfused.fuse_ops = false;
  auto q = must_compile(g, cpu, unfused);
  ASSERT_TRUE(q);
  EXPECT_TRUE(q->fusions().empty());
  EXPECT_TRUE(check_hazards(*q).ok()) << check_hazards(*q).to_string();
  EXPECT_GE(q->memory()[0].arena_bytes, scores_bytes) << "the separate ops write the scores";
  std::printf("arena with the chains fused %lld bytes, with the separate ops %lld\n", static_cast<long long>(with),
              static_cast<long long>(q->memory()[0].arena_bytes));
}

}  // namespace
