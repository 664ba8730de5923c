// An rms_norm's weight folded into the projections that read it
// (fold_norm_weights, plan_options::fold_norm_weights): scaled weight
// sources hold W diag(g) along the right dim, slice like any source and
// compare by value; the fold applies only where every reader of the norm is
// a projection with a weight of its own; the folded graph evaluates to the
// user's within one rounding of the scaled weights.
#include <gtest/gtest.h>

#include <cmath>

#include "graph/fusion.hpp"
#include "graph/models/transformer.hpp"
#include "graph/plan.hpp"
#include "graph/reference.hpp"
#include "graph/weight_source.hpp"
#include "plan_test_util.hpp"

using namespace ag;

namespace {

models::transformer_config tiny_llama(dtype type, models::head_tying head = models::head_tying::variant_default) {
  models::transformer_config c;
  c.variant = models::model_variant::llama;
  c.n_layers = 2;
  c.d_model = 32;
  c.n_heads = 4;
  c.n_kv_heads = 2;
  c.d_ff = 48;
  c.vocab = 41;
  c.seq_len = 6;
  c.batch = 2;
  c.seed = 9;
  c.initializer_range = 0.2f;
  c.dtype = type;
  c.head = head;
  return c;
}

std::shared_ptr<const graph> build(const models::transformer_config& c) {
  auto g = models::build_transformer(c);
  EXPECT_TRUE(g.has_value()) << (g ? "" : g.err().to_string());
  return g ? std::make_shared<const graph>(std::move(*g)) : nullptr;
}

using test_util::max_rel_diff;

int norms_with_weights(const graph& g) {
  int n = 0;
  for (const node& x : g.nodes()) n += x.op == op_kind::rms_norm && x.inputs.size() > 1 ? 1 : 0;
  return n;
}

// norm(x, g) read by the matmuls of `readers` (each with its own weight
// [K, N], or [N, K] with trans_b), plus whatever `extra` adds.
struct small_norm_graph {
  graph_builder b;
  tensor x, g, n;
  small_norm_graph() {
    x = b.input("x", dtype::f32, {3, 8});
    g = b.weight("g", host_tensor::random_normal(dtype::f32, {8}, 2, 0.3f, 1.0f));
    n = b.rms_norm(x, g, 1e-5f, "norm");
  }
  tensor weight(const std::string& name, shape dims, uint64_t seed) {
    return b.weight(name, host_tensor::random_normal(dtype::f32, dims, seed));
  }
  std::shared_ptr<const graph> done() { return test_util::finish(std::move(b)); }
};

}  // namespace

TEST(ScaledWeight, HoldsTheWeightTimesTheScaleAlongItsDim) {
  const host_tensor w = host_tensor::random_normal(dtype::f32, {3, 5}, 4);
  for (int dim : {0, 1}) {
    SCOPED_TRACE("dim " + std::to_string(dim));
    const host_tensor s = host_tensor::random_normal(dtype::f32, {w.dims()[dim]}, 7, 0.5f, 1.0f);
    auto scaled = make_scaled_weight(make_host_weight(w), make_host_weight(s), dim);
    ASSERT_TRUE(scaled.has_value()) << scaled.err().to_string();
    auto all = read_all(**scaled);
    ASSERT_TRUE(all.has_value());
    for (int64_t r = 0; r < 3; ++r)
      for (int64_t c = 0; c < 5; ++c)
        ASSERT_EQ(all->at(r * 5 + c), w.at(r * 5 + c) * s.at(dim == 0 ? r : c)) << r << "," << c;
    // A slice along either dim holds those elements of the product (the
    // scale's slice too when the slice is along the scaled dim).
    for (int along : {0, 1}) {
      const int64_t begin = 1, end = along == 0 ? 3 : 4;
      std::vector<float> got(static_cast<std::size_t>((along == 0 ? 5 : 3) * (end - begin)));
      ASSERT_FALSE((*scaled)->read_slice(along, begin, end, got.data()));
      std::size_t k = 0;
      for (int64_t r = along == 0 ? begin : 0; r < (along == 0 ? end : 3); ++r)
        for (int64_t c = along == 1 ? begin : 0; c < (along == 1 ? end : 5); ++c, ++k)
          ASSERT_EQ(got[k], all->at(r * 5 + c)) << "slice along " << along << " at " << r << "," << c;
    }
  }
}

TEST(ScaledWeight, RoundsOnceToTheWeightsDtype) {
  const host_tensor w = host_tensor::random_normal(dtype::bf16, {4, 6}, 5);
  const host_tensor s = host_tensor::random_normal(dtype::bf16, {6}, 6, 0.4f, 1.0f);
  auto scaled = make_scaled_weight(make_host_weight(w), make_host_weight(s), 1);
  ASSERT_TRUE(scaled.has_value());
  auto all = read_all(**scaled);
  ASSERT_TRUE(all.has_value());
  ASSERT_EQ(all->type(), dtype::bf16);
  for (int64_t i = 0; i < w.numel(); ++i)
    ASSERT_EQ(all->at(i), bf16_to_float(float_to_bf16(w.at(i) * s.at(i % 6)))) << i;
}

TEST(ScaledWeight, BadOperandsAndOverflowAreErrorsNamingThem) {
  auto w = make_host_weight(host_tensor::random_normal(dtype::f32, {4, 6}, 3), "w.safetensors: 'q'");
  auto s6 = make_host_weight(host_tensor::random_normal(dtype::f32, {6}, 3), "w.safetensors: 'norm'");
  const auto fails_with = [](const expected<weight_source_ptr>& r, const std::string& what) {
    ASSERT_FALSE(r.has_value()) << what;
    EXPECT_EQ(r.err().code, errc::invalid_argument);
    EXPECT_NE(r.err().message.find(what), std::string::npos) << r.err().message;
  };
  fails_with(make_scaled_weight(w, s6, 0), "expected [4]");
  fails_with(make_scaled_weight(w, s6, 2), "dim 2 of a rank-2 weight");
  fails_with(make_scaled_weight(make_host_weight(host_tensor::from_ints({6}, {1, 2, 3, 4, 5, 6})), s6, 0),
             "both must be float types");
  // f16 holds at most 65504: 300 x 300 does not fit.
  host_tensor big = host_tensor::uninitialized(dtype::f16, {2, 2});
  for (int64_t i = 0; i < 4; ++i) store_from_float(big.data(), dtype::f16, static_cast<std::size_t>(i), i == 3 ? 300.f : 1.f);
  host_tensor factor = host_tensor::uninitialized(dtype::f16, {2});
  for (int64_t i = 0; i < 2; ++i) store_from_float(factor.data(), dtype::f16, static_cast<std::size_t>(i), 300.f);
  auto over = make_scaled_weight(make_host_weight(big, "m.safetensors: 'up'"), make_host_weight(factor, "m.safetensors: 'ln'"), 1);
  ASSERT_TRUE(over.has_value());
  std::vector<uint16_t> out(4);
  const error e = (*over)->read_slice(0, 0, 2, out.data());
  EXPECT_EQ(e.code, errc::invalid_argument);
  for (const char* part : {"'up'", "'ln'", "element 3", "overflows f16"})
    EXPECT_NE(e.message.find(part), std::string::npos) << part << " in: " << e.message;
}

TEST(ScaledWeight, SameValuesWhenBothOperandsAre) {
  const host_tensor w = host_tensor::random_normal(dtype::f32, {4, 6}, 3);
  const host_tensor s = host_tensor::random_normal(dtype::f32, {6}, 4);
  auto a = make_scaled_weight(make_host_weight(w), make_host_weight(s), 1);
  auto b = make_scaled_weight(make_host_weight(w), make_host_weight(s), 1);  // other objects, equal values
  auto other_scale = make_scaled_weight(make_host_weight(w), make_host_weight(host_tensor::random_normal(dtype::f32, {6}, 5)), 1);
  ASSERT_TRUE(a && b && other_scale);
  EXPECT_TRUE(same_values(**a, **b));
  EXPECT_FALSE(same_values(**a, **other_scale));
  EXPECT_FALSE(same_values(**a, *make_host_weight(w))) << "scaled against unscaled";
  auto sa = make_slice_weight(*a, 0, 1, 3), sb = make_slice_weight(*b, 0, 1, 3), sc = make_slice_weight(*b, 0, 0, 2);
  ASSERT_TRUE(sa && sb && sc);
  EXPECT_TRUE(same_values(**sa, **sb)) << "a shard of each: one upload serves both plans";
  EXPECT_FALSE(same_values(**sa, **sc));
}

TEST(NormWeightFold, LlamaNormsLoseTheirWeightsToTheirProjections) {
  auto g = build(tiny_llama(dtype::f32));
  ASSERT_TRUE(g);
  ASSERT_EQ(norms_with_weights(*g), 5) << "attention and MLP norms of 2 layers, and the final norm";
  auto folded = fold_norm_weights(*g);
  ASSERT_TRUE(folded.has_value()) << folded.err().to_string();
  ASSERT_TRUE(*folded);
  const graph& f = **folded;
  EXPECT_EQ(norms_with_weights(f), 0) << "the separate head takes the final norm's weight";
  ASSERT_EQ(f.size(), g->size());
  int scaled = 0;
  for (const node& n : f.nodes()) {
    ASSERT_EQ(n.name, g->at(n.id).name) << "ids and names are kept";
    ASSERT_EQ(n.dims, g->at(n.id).dims) << n.name;
    if (n.op == op_kind::weight && n.data != g->at(n.id).data) {
      ++scaled;
      EXPECT_NE(n.data->origin().find("scaled along dim 1 by"), std::string::npos) << n.name << ": " << n.data->origin();
    }
  }
  EXPECT_EQ(scaled, 2 * 5 + 1) << "q, k, v, gate, up of 2 layers and the head";
  const auto in = models::transformer_inputs(tiny_llama(dtype::f32), 3);
  auto want = evaluate_reference(*g, in), got = evaluate_reference(f, in);
  ASSERT_TRUE(want && got);
  EXPECT_LE(max_rel_diff(*got, *want), 1e-5);
}

TEST(NormWeightFold, Bf16StaysWithinTheModelsOwnRounding) {
  auto g32 = build(tiny_llama(dtype::f32));
  auto g = build(tiny_llama(dtype::bf16));
  ASSERT_TRUE(g && g32);
  auto folded = fold_norm_weights(*g);
  ASSERT_TRUE(folded.has_value() && *folded);
  const auto in = models::transformer_inputs(tiny_llama(dtype::f32), 3);
  auto r32 = evaluate_reference(*g32, in), r16 = evaluate_reference(*g, in), f16 = evaluate_reference(**folded, in);
  ASSERT_TRUE(r32 && r16 && f16);
  const double rounding = max_rel_diff(*r16, *r32), fold = max_rel_diff(*f16, *r16), fold32 = max_rel_diff(*f16, *r32);
  std::printf("bf16 against f32: %.4f; folded bf16 against bf16: %.4f, against f32: %.4f\n", rounding, fold, fold32);
  EXPECT_GT(fold, 0.0) << "the scaled weights are rounded: the results move";
  EXPECT_LE(fold32, 1.5 * rounding) << "the folded model is about as far from f32 as the bf16 model";
}

TEST(NormWeightFold, OnlyWhereEveryReaderIsAProjectionWithAWeightOfItsOwn) {
  {  // the fold's case: two projections, one of them transposed
    small_norm_graph s;
    s.b.output(s.b.matmul(s.n, s.weight("wa", {8, 5}, 3), false, false, "a"));
    s.b.output(s.b.matmul(s.n, s.weight("wb", {6, 8}, 4), false, true, "b"));
    auto g = s.done();
    auto f = fold_norm_weights(*g);
    ASSERT_TRUE(f.has_value() && *f);
    EXPECT_EQ(norms_with_weights(**f), 0);
    EXPECT_NE((*f)->at((*f)->find("wa")).data->origin().find("dim 0"), std::string::npos);
    EXPECT_NE((*f)->at((*f)->find("wb")).data->origin().find("dim 1"), std::string::npos);
    const std::vector<host_tensor> in{host_tensor::random_normal(dtype::f32, {3, 8}, 8)};
    auto want = evaluate_reference(*g, in), got = evaluate_reference(**f, in);
    ASSERT_TRUE(want && got);
    EXPECT_LE(max_rel_diff(*got, *want), 1e-5);
  }
  const auto not_folded = [](const std::shared_ptr<const graph>& g, const char* why) {
    auto f = fold_norm_weights(*g);
    ASSERT_TRUE(f.has_value());
    EXPECT_FALSE(*f) << why;
  };
  {  // the weight is also read by a matmul of another input (a tied weight)
    small_norm_graph s;
    auto w = s.weight("w", {8, 5}, 3);
    s.b.output(s.b.matmul(s.n, w, false, false, "a"));
    s.b.output(s.b.matmul(s.b.input("y", dtype::f32, {2, 8}), w, false, false, "other"));
    not_folded(s.done(), "w is read by a matmul of y");
  }
  {  // the norm is read by an add too
    small_norm_graph s;
    s.b.output(s.b.matmul(s.n, s.weight("w", {8, 5}, 3), false, false, "a"));
    s.b.output(s.b.add(s.n, s.x, "residual"));
    not_folded(s.done(), "an add reads the norm");
  }
  {  // the norm is a graph output
    small_norm_graph s;
    s.b.output(s.b.matmul(s.n, s.weight("w", {8, 5}, 3), false, false, "a"));
    s.b.output(s.n);
    not_folded(s.done(), "the norm is an output");
  }
  {  // the projection's b is the norm's output, its weight is a's
    small_norm_graph s;
    s.b.output(s.b.matmul(s.b.input("y", dtype::f32, {8, 3}), s.n, false, false, "n_as_b"));
    not_folded(s.done(), "the norm is b");
  }
  {  // a tied head: the final norm keeps its weight, the layers' fold
    auto g = build(tiny_llama(dtype::f32, models::head_tying::tied));
    auto f = fold_norm_weights(*g);
    ASSERT_TRUE(f.has_value() && *f);
    EXPECT_EQ(norms_with_weights(**f), 1) << "the embedding is read by get_rows too";
  }
}

TEST(NormWeightFold, ThePlanOptionDecidesAndOriginalIsTheUsersGraph) {
  auto g = build(tiny_llama(dtype::f32));
  ASSERT_TRUE(g);
  for (bool fold : {true, false}) {
    SCOPED_TRACE(fold ? "fold" : "no fold");
    plan_options o;
    o.fold_norm_weights = fold;
    auto p = test_util::must_compile(g, {device_spec{}}, o);
    ASSERT_TRUE(p);
    EXPECT_EQ(&p->original(), g.get());
    EXPECT_EQ(norms_with_weights(p->source()), fold ? 0 : 5);
    o.tensor_parallel = 2;
    auto tp = test_util::must_compile(g, {device_spec{}, device_spec{}}, o);
    ASSERT_TRUE(tp);
    EXPECT_EQ(&tp->original(), g.get());
    EXPECT_EQ(norms_with_weights(tp->source()), fold ? 0 : 10) << "each rank's copy of the 5 norms";
    const auto in = models::transformer_inputs(tiny_llama(dtype::f32), 4);
    auto want = evaluate_reference(*g, in), got = evaluate_reference(tp->source(), in);
    ASSERT_TRUE(want && got);
    EXPECT_LE(max_rel_diff(*got, *want), 1e-4);
  }
}

// No cpu kernel takes a norm in, so a plan over cpu devices alone keeps its
// norms' weights whatever the option says; one other device folds them.
TEST(NormWeightFold, PlansOfCpuDevicesAloneKeepTheirNormWeights) {
  auto g = build(tiny_llama(dtype::f32));
  ASSERT_TRUE(g);
  device_spec cpu;
  cpu.kind = device_kind::cpu;
  plan_options o;
  ASSERT_TRUE(o.fold_norm_weights);
  auto one = test_util::must_compile(g, {cpu}, o);
  ASSERT_TRUE(one);
  EXPECT_EQ(&one->source(), g.get()) << "nothing to rewrite: the user's graph runs";
  EXPECT_EQ(norms_with_weights(one->source()), 5);
  o.tensor_parallel = 2;
  auto tp = test_util::must_compile(g, {cpu, cpu}, o);
  ASSERT_TRUE(tp);
  EXPECT_EQ(norms_with_weights(tp->source()), 10) << "each rank's copy of the 5 norms, weighted";
  o.tensor_parallel = 1;
  auto mixed = test_util::must_compile(g, {cpu, device_spec{}}, o);
  ASSERT_TRUE(mixed);
  EXPECT_EQ(norms_with_weights(mixed->source()), 0) << "a sim device (it models CUDA's kernels) folds";
}
