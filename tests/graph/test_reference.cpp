// The reference evaluator against hand-computed values (small cases you can
// check on paper) and against naive formulas written out here on random data.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "graph/graph.hpp"
#include "graph/reference.hpp"

namespace ag {
namespace {

// Builds the graph, evaluates it, returns the outputs (fails the test on error).
std::vector<host_tensor> run(graph_builder&& b, const std::vector<host_tensor>& inputs) {
  auto g = std::move(b).build();
  EXPECT_TRUE(g.has_value()) << (g ? "" : g.err().to_string());
  if (!g) return {};
  auto out = evaluate_reference(*g, inputs);
  EXPECT_TRUE(out.has_value()) << (out ? "" : out.err().to_string());
  if (!out) return {};
  return std::move(*out);
}

void expect_close(const host_tensor& got, const std::vector<double>& want, double tol) {
  ASSERT_EQ(got.numel(), static_cast<int64_t>(want.size()));
  for (int64_t i = 0; i < got.numel(); ++i)
    EXPECT_NEAR(got.at(i), want[static_cast<std::size_t>(i)], tol) << "at flat index " << i;
}

TEST(Reference, MatmulHandComputed) {
  graph_builder b;
  auto a = b.input("a", dtype::f32, {2, 2});
  auto w = b.weight("w", host_tensor::from_floats(dtype::f32, {2, 3}, {5, 6, 7, 8, 9, 10}));
  b.output(b.matmul(a, w));
  auto out = run(std::move(b), {host_tensor::from_floats(dtype::f32, {2, 2}, {1, 2, 3, 4})});
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].dims(), (shape{2, 3}));
  // [1 2; 3 4] x [5 6 7; 8 9 10]
  expect_close(out[0], {1 * 5 + 2 * 8, 1 * 6 + 2 * 9, 1 * 7 + 2 * 10, 3 * 5 + 4 * 8, 3 * 6 + 4 * 9, 3 * 7 + 4 * 10},
               0);
}

// Naive batched matmul on row-major floats: a [B.., M, K], b [K, N] shared.
TEST(Reference, MatmulBatchedSharedWeight) {
  graph_builder b;
  auto x = b.input("x", dtype::f32, {2, 3, 4, 5});
  auto wt = host_tensor::random_normal(dtype::f32, {5, 6}, 11);
  auto w = b.weight("w", wt);
  b.output(b.matmul(x, w, false, false, "y"));
  auto xt = host_tensor::random_normal(dtype::f32, {2, 3, 4, 5}, 12);
  auto out = run(std::move(b), {xt});
  ASSERT_EQ(out.size(), 1u);
  ASSERT_EQ(out[0].dims(), (shape{2, 3, 4, 6}));
  for (int64_t bm = 0; bm < 24; ++bm)
    for (int64_t n = 0; n < 6; ++n) {
      double acc = 0;
      for (int64_t k = 0; k < 5; ++k) acc += double(xt.at(bm * 5 + k)) * wt.at(k * 6 + n);
      EXPECT_NEAR(out[0].at(bm * 6 + n), acc, 1e-5);
    }
}

TEST(Reference, MatmulBothTransposesMatchExplicitTranspose) {
  const int64_t M = 3, K = 4, N = 5;
  auto at = host_tensor::random_normal(dtype::f32, {2, K, M}, 21);  // stored transposed
  auto bt = host_tensor::random_normal(dtype::f32, {N, K}, 22);     // stored transposed, shared
  graph_builder b;
  auto a = b.input("a", dtype::f32, {2, K, M});
  auto w = b.input("b", dtype::f32, {N, K});
  b.output(b.matmul(a, w, true, true, "tt"));
  b.output(b.matmul(b.transpose(a, -1, -2), w, false, true, "nt"));
  auto out = run(std::move(b), {at, bt});
  ASSERT_EQ(out.size(), 2u);
  ASSERT_EQ(out[0].dims(), (shape{2, M, N}));
  for (int64_t bi = 0; bi < 2; ++bi)
    for (int64_t m = 0; m < M; ++m)
      for (int64_t n = 0; n < N; ++n) {
        double acc = 0;
        for (int64_t k = 0; k < K; ++k) acc += double(at.at(bi * K * M + k * M + m)) * bt.at(n * K + k);
        EXPECT_NEAR(out[0].at((bi * M + m) * N + n), acc, 1e-5);
        EXPECT_NEAR(out[1].at((bi * M + m) * N + n), acc, 1e-5);
      }
}

TEST(Reference, MatmulBatchDimsBroadcastBothWays) {
  // a [2, 1, 3, 4] x b [3, 4, 2] -> [2, 3, 3, 2]
  auto at = host_tensor::random_normal(dtype::f32, {2, 1, 3, 4}, 31);
  auto bt = host_tensor::random_normal(dtype::f32, {3, 4, 2}, 32);
  graph_builder b;
  auto a = b.input("a", dtype::f32, {2, 1, 3, 4});  // separate statements: argument order is unspecified
  b.output(b.matmul(a, b.input("b", dtype::f32, {3, 4, 2})));
  auto out = run(std::move(b), {at, bt});
  ASSERT_EQ(out.size(), 1u);
  ASSERT_EQ(out[0].dims(), (shape{2, 3, 3, 2}));
  for (int64_t i = 0; i < 2; ++i)
    for (int64_t j = 0; j < 3; ++j)
      for (int64_t m = 0; m < 3; ++m)
        for (int64_t n = 0; n < 2; ++n) {
          double acc = 0;
          for (int64_t k = 0; k < 4; ++k) acc += double(at.at(i * 12 + m * 4 + k)) * bt.at(j * 8 + k * 2 + n);
          EXPECT_NEAR(out[0].at(((i * 3 + j) * 3 + m) * 2 + n), acc, 1e-5);
        }
}

TEST(Reference, MatmulF16RoundsOnceFromExactSum) {
  auto at = host_tensor::random_normal(dtype::f16, {4, 64}, 41);
  auto bt = host_tensor::random_normal(dtype::f16, {64, 3}, 42);
  graph_builder b;
  auto a = b.input("a", dtype::f16, {4, 64});
  b.output(b.matmul(a, b.input("b", dtype::f16, {64, 3})));
  auto out = run(std::move(b), {at, bt});
  ASSERT_EQ(out.size(), 1u);
  ASSERT_EQ(out[0].type(), dtype::f16);
  for (int64_t m = 0; m < 4; ++m)
    for (int64_t n = 0; n < 3; ++n) {
      double acc = 0;
      for (int64_t k = 0; k < 64; ++k) acc += double(at.at(m * 64 + k)) * bt.at(k * 3 + n);
      EXPECT_EQ(out[0].at(m * 3 + n), half_to_float(float_to_half(static_cast<float>(acc))));
    }
}

TEST(Reference, AddMulBroadcast) {
  auto at = host_tensor::random_normal(dtype::f32, {2, 3, 4}, 51);
  auto row = host_tensor::random_normal(dtype::f32, {4}, 52);
  auto col = host_tensor::random_normal(dtype::f32, {3, 1}, 53);
  auto one = host_tensor::random_normal(dtype::f32, {1}, 54);
  graph_builder b;
  auto a = b.input("a", dtype::f32, {2, 3, 4});
  auto r = b.input("row", dtype::f32, {4});
  auto c = b.input("col", dtype::f32, {3, 1});
  auto o = b.input("one", dtype::f32, {1});
  b.output(b.add(a, r));
  b.output(b.mul(a, c));
  b.output(b.add(a, o));
  b.output(b.mul(a, a));
  auto out = run(std::move(b), {at, row, col, one});
  ASSERT_EQ(out.size(), 4u);
  for (int64_t i = 0; i < 2; ++i)
    for (int64_t j = 0; j < 3; ++j)
      for (int64_t k = 0; k < 4; ++k) {
        const int64_t f = (i * 3 + j) * 4 + k;
        const float x = at.at(f);
        EXPECT_FLOAT_EQ(out[0].at(f), x + row.at(k));
        EXPECT_FLOAT_EQ(out[1].at(f), x * col.at(j));
        EXPECT_FLOAT_EQ(out[2].at(f), x + one.at(0));
        EXPECT_FLOAT_EQ(out[3].at(f), x * x);
      }
}

TEST(Reference, ScaleGeluSiluKnownValues) {
  graph_builder b;
  auto x = b.input("x", dtype::f32, {4});
  b.output(b.scale(x, -2.5f));
  b.output(b.gelu(x, gelu_mode::tanh));
  b.output(b.gelu(x, gelu_mode::erf));
  b.output(b.silu(x));
  auto out = run(std::move(b), {host_tensor::from_floats(dtype::f32, {4}, {1.0f, -1.0f, 0.0f, 3.0f})});
  ASSERT_EQ(out.size(), 4u);
  expect_close(out[0], {-2.5, 2.5, 0, -7.5}, 0);
  // published values: GELU_tanh(1) = 0.841192, GELU_erf(1) = 0.841345, GELU(-1) = -0.158808 / -0.158655,
  // GELU_tanh(3) = 2.996363, GELU_erf(3) = 2.995950; silu(1) = 0.731059, silu(-1) = -0.268941, silu(3) = 2.857722
  expect_close(out[1], {0.841192, -0.158808, 0, 2.996363}, 2e-6);
  expect_close(out[2], {0.841345, -0.158655, 0, 2.995950}, 2e-6);
  expect_close(out[3], {0.731059, -0.268941, 0, 2.857722}, 2e-6);
}

TEST(Reference, RmsNormHandComputedAndRandom) {
  graph_builder b;
  auto x = b.input("x", dtype::f32, {1, 2});
  auto w = b.weight("w", host_tensor::from_floats(dtype::f32, {2}, {2.0f, 0.5f}));
  b.output(b.rms_norm(x, w, 0.0f));
  b.output(b.rms_norm(x, tensor(), 0.0f));
  auto out = run(std::move(b), {host_tensor::from_floats(dtype::f32, {1, 2}, {3, 4})});
  ASSERT_EQ(out.size(), 2u);
  // mean(x^2) = 12.5
  const double r = std::sqrt(12.5);
  expect_close(out[0], {3 / r * 2, 4 / r * 0.5}, 1e-6);
  expect_close(out[1], {3 / r, 4 / r}, 1e-6);

  auto xt = host_tensor::random_normal(dtype::f32, {3, 16}, 61, 2.0f);
  auto wt = host_tensor::random_normal(dtype::f32, {16}, 62);
  graph_builder b2;
  b2.output(b2.rms_norm(b2.input("x", dtype::f32, {3, 16}), b2.weight("w", wt), 1e-6f));
  auto out2 = run(std::move(b2), {xt});
  ASSERT_EQ(out2.size(), 1u);
  for (int64_t r2 = 0; r2 < 3; ++r2) {
    double ss = 0;
    for (int64_t i = 0; i < 16; ++i) ss += double(xt.at(r2 * 16 + i)) * xt.at(r2 * 16 + i);
    const double inv = 1 / std::sqrt(ss / 16 + 1e-6);
    for (int64_t i = 0; i < 16; ++i) EXPECT_NEAR(out2[0].at(r2 * 16 + i), xt.at(r2 * 16 + i) * inv * wt.at(i), 1e-5);
  }
}

TEST(Reference, LayerNormBiasedVarianceWeightBias) {
  graph_builder b;
  auto x = b.input("x", dtype::f32, {2, 4});
  auto w = b.weight("w", host_tensor::from_floats(dtype::f32, {4}, {1, 2, 3, 4}));
  auto bias = b.weight("b", host_tensor::from_floats(dtype::f32, {4}, {0.5f, 0, 0, -1}));
  b.output(b.layer_norm(x, w, bias, 0.0f, "ln"));
  b.output(b.layer_norm(x, tensor(), bias, 0.0f, "ln_bias_only"));
  b.output(b.layer_norm(x, tensor(), tensor(), 0.0f, "ln_plain"));
  auto out = run(std::move(b), {host_tensor::from_floats(dtype::f32, {2, 4}, {1, 2, 3, 4, 2, 2, 2, 6})});
  ASSERT_EQ(out.size(), 3u);
  // row 0: mean 2.5, biased var 1.25; row 1: mean 3, var (1+1+1+9)/4 = 3
  const double s0 = std::sqrt(1.25), s1 = std::sqrt(3.0);
  const std::vector<double> n = {-1.5 / s0, -0.5 / s0, 0.5 / s0, 1.5 / s0, -1 / s1, -1 / s1, -1 / s1, 3 / s1};
  const double wv[4] = {1, 2, 3, 4}, bv[4] = {0.5, 0, 0, -1};
  std::vector<double> full, bias_only;
  for (std::size_t i = 0; i < 8; ++i) {
    full.push_back(n[i] * wv[i % 4] + bv[i % 4]);
    bias_only.push_back(n[i] + bv[i % 4]);
  }
  expect_close(out[0], full, 1e-6);
  expect_close(out[1], bias_only, 1e-6);
  expect_close(out[2], n, 1e-6);
}

TEST(Reference, SoftmaxPlainScaledAndCausalWithShortQuery) {
  graph_builder b;
  auto x = b.input("x", dtype::f32, {2, 4});  // Sq = 2, Sk = 4
  b.output(b.softmax(x));
  b.output(b.softmax(x, true, 0.5f));
  auto xt = host_tensor::random_normal(dtype::f32, {2, 4}, 71, 3.0f);
  auto out = run(std::move(b), {xt});
  ASSERT_EQ(out.size(), 2u);
  for (int64_t i = 0; i < 2; ++i) {
    double sum = 0, sum_c = 0;
    for (int64_t j = 0; j < 4; ++j) sum += std::exp(double(xt.at(i * 4 + j)));
    // causal: row i sees j <= i + (Sk - Sq) = i + 2
    for (int64_t j = 0; j <= i + 2; ++j) sum_c += std::exp(0.5 * xt.at(i * 4 + j));
    for (int64_t j = 0; j < 4; ++j) {
      EXPECT_NEAR(out[0].at(i * 4 + j), std::exp(double(xt.at(i * 4 + j))) / sum, 1e-6);
      const double want = j <= i + 2 ? std::exp(0.5 * xt.at(i * 4 + j)) / sum_c : 0.0;
      EXPECT_NEAR(out[1].at(i * 4 + j), want, 1e-6) << "row " << i << " col " << j;
    }
  }
  EXPECT_EQ(out[1].at(3), 0.0f);  // row 0, j = 3 > 0 + 2: masked exactly
}

// argmax: the first maximum of each row; NaNs never win, a row of NaNs
// gives 0; i32 [.., 1] in every float dtype (the rows below are exact in
// each, so every dtype picks the same).
TEST(Reference, ArgmaxFirstMaximumSkipsNaNs) {
  const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
  const std::vector<std::vector<float>> rows = {
      {1, 3, 3, 2}, {nan, 2, nan, 2}, {nan, nan, nan, nan}, {-inf, -inf, -inf, -inf}, {-1, nan, 5, 5}, {4, -inf, inf, 0}};
  const std::vector<double> want = {1, 1, 0, 0, 2, 2};
  for (dtype t : {dtype::f32, dtype::f16, dtype::bf16}) {
    SCOPED_TRACE(to_string(t));
    host_tensor x = host_tensor::uninitialized(t, {static_cast<int64_t>(rows.size()), 4});
    for (std::size_t r = 0; r < rows.size(); ++r)
      for (std::size_t j = 0; j < 4; ++j) x.set(static_cast<int64_t>(r * 4 + j), rows[r][j]);
    graph_builder b;
    b.output(b.argmax(b.input("x", t, {static_cast<int64_t>(rows.size()), 4}), "pick"));
    auto out = run(std::move(b), {x});
    ASSERT_EQ(out.size(), 1u);
    EXPECT_EQ(out[0].type(), dtype::i32);
    EXPECT_EQ(out[0].dims(), (shape{static_cast<int64_t>(rows.size()), 1}));
    expect_close(out[0], want, 0.0);
  }
}

TEST(Reference, SoftmaxLargeLogitsDoNotOverflow) {
  graph_builder b;
  b.output(b.softmax(b.input("x", dtype::f32, {1, 3})));
  auto out = run(std::move(b), {host_tensor::from_floats(dtype::f32, {1, 3}, {1000, 1000, 999})});
  ASSERT_EQ(out.size(), 1u);
  const double e = std::exp(-1.0), s = 2 + e;
  expect_close(out[0], {1 / s, 1 / s, e / s}, 1e-6);
}

// rope at positions {0, 1, 3}, D = 4: pair 0 turns by pos, pair 1 by pos * 10000^(-1/2) = pos / 100.
void check_rope(rope_mode mode) {
  graph_builder b;
  auto x = b.input("x", dtype::f32, {3, 2, 4});  // [S, H, D]
  auto p = b.input("pos", dtype::i32, {3});
  b.output(b.rope(x, p, 10000.0f, mode));
  auto xt = host_tensor::random_normal(dtype::f32, {3, 2, 4}, 81);
  const int pos[3] = {0, 1, 3};
  auto out = run(std::move(b), {xt, host_tensor::from_ints({3}, {0, 1, 3})});
  ASSERT_EQ(out.size(), 1u);
  for (int s = 0; s < 3; ++s)
    for (int h = 0; h < 2; ++h) {
      const int64_t base = (s * 2 + h) * 4;
      for (int i = 0; i < 2; ++i) {
        const double ang = pos[s] * (i == 0 ? 1.0 : 0.01);
        const int64_t pi = mode == rope_mode::neox ? i : 2 * i;
        const int64_t qi = mode == rope_mode::neox ? i + 2 : 2 * i + 1;
        const double a = xt.at(base + pi), c = xt.at(base + qi);
        EXPECT_NEAR(out[0].at(base + pi), a * std::cos(ang) - c * std::sin(ang), 1e-6);
        EXPECT_NEAR(out[0].at(base + qi), a * std::sin(ang) + c * std::cos(ang), 1e-6);
        if (pos[s] == 0) {
          EXPECT_EQ(out[0].at(base + pi), xt.at(base + pi));
          EXPECT_EQ(out[0].at(base + qi), xt.at(base + qi));
        }
      }
    }
}

TEST(Reference, RopeNeoxPairsHalves) { check_rope(rope_mode::neox); }
TEST(Reference, RopeInterleavedPairsNeighbours) { check_rope(rope_mode::interleaved); }

// Llama 3's scaling (HF rope_type "llama3"), D = 8, theta 10^4: the pairs'
// frequencies 1, 0.1, 0.01, 0.001 have wavelengths 2 pi, 62.8, 628, 6283.
// With an original context of 1000, low_freq_factor 1 and high_freq_factor
// 4, wavelengths under 250 keep their frequency, those over 1000 are slowed
// by the factor (8), and 628 is blended: s = (1000 / 628.3 - 1) / 3.
TEST(Reference, RopeLlama3ScalingKeepsBlendsAndSlowsThePairs) {
  const rope_scaling scaling{8.0f, 1.0f, 4.0f, 1000};
  const double pi = 3.14159265358979323846;
  const double s = (1000.0 / (2 * pi / 0.01) - 1.0) / 3.0;
  const double want[4] = {1.0, 0.1, (1 - s) * 0.01 / 8 + s * 0.01, 0.001 / 8};
  for (int k = 0; k < 4; ++k) EXPECT_NEAR(rope_frequency(10000.0, scaling, k, 8), want[k], 1e-15 + 1e-12 * want[k]) << k;
  EXPECT_GT(s, 0.19);
  EXPECT_LT(s, 0.20);
  EXPECT_DOUBLE_EQ(rope_frequency(10000.0, rope_scaling{}, 3, 8), 0.001) << "factor 0: plain RoPE";
  // The op at position 7 turns pair k by 7 f_k.
  graph_builder b;
  auto x = b.input("x", dtype::f32, {1, 1, 8});
  b.output(b.rope(x, b.input("pos", dtype::i32, {1}), 10000.0f, rope_mode::neox, "r", scaling));
  auto xt = host_tensor::random_normal(dtype::f32, {1, 1, 8}, 83);
  auto out = run(std::move(b), {xt, host_tensor::from_ints({1}, {7})});
  ASSERT_EQ(out.size(), 1u);
  for (int k = 0; k < 4; ++k) {
    const double ang = 7 * want[k], a = xt.at(k), c = xt.at(k + 4);
    EXPECT_NEAR(out[0].at(k), a * std::cos(ang) - c * std::sin(ang), 1e-6) << k;
    EXPECT_NEAR(out[0].at(k + 4), a * std::sin(ang) + c * std::cos(ang), 1e-6) << k;
  }
}

// Linear scaling (HF rope_type "linear") turns every pair `factor` times
// slower: position 4 p with factor 4 is plain RoPE's position p.
TEST(Reference, RopeLinearScalingIsPlainRopeAtThePositionOverTheFactor) {
  rope_scaling linear;
  linear.kind = rope_scaling_kind::linear;
  linear.factor = 4.0f;
  EXPECT_TRUE(rope_scaling_misfit(linear).empty()) << rope_scaling_misfit(linear);
  for (int k = 0; k < 4; ++k)
    EXPECT_DOUBLE_EQ(rope_frequency(10000.0, linear, k, 8), rope_frequency(10000.0, rope_scaling{}, k, 8) / 4) << k;
  auto xt = host_tensor::random_normal(dtype::f32, {1, 4, 2, 8}, 84);  // [B, S, H, D]
  auto rotate = [&](const rope_scaling& s, std::vector<int32_t> pos) {
    graph_builder b;
    auto x = b.input("x", dtype::f32, {1, 4, 2, 8});
    b.output(b.rope(x, b.input("pos", dtype::i32, {4}), 10000.0f, rope_mode::neox, "r", s));
    return run(std::move(b), {xt, host_tensor::from_ints({4}, std::move(pos))});
  };
  auto scaled = rotate(linear, {0, 4, 8, 36});
  auto plain = rotate(rope_scaling{}, {0, 1, 2, 9});
  ASSERT_EQ(scaled.size(), 1u);
  ASSERT_EQ(plain.size(), 1u);
  for (int64_t i = 0; i < xt.numel(); ++i) EXPECT_NEAR(scaled[0].at(i), plain[0].at(i), 1e-6) << i;
  rope_scaling bad = linear;
  bad.factor = -1.0f;
  EXPECT_NE(rope_scaling_misfit(bad).find("finite value > 0"), std::string::npos) << rope_scaling_misfit(bad);
}

TEST(Reference, RopeBatchedUsesSequenceIndexForPosition) {
  graph_builder b;
  auto x = b.input("x", dtype::f32, {2, 2, 1, 2});  // [B, S, H, D]
  b.output(b.rope(x, b.input("pos", dtype::i32, {2}), 10000.0f, rope_mode::neox));
  auto xt = host_tensor::random_normal(dtype::f32, {2, 2, 1, 2}, 82);
  auto out = run(std::move(b), {xt, host_tensor::from_ints({2}, {5, 2})});
  ASSERT_EQ(out.size(), 1u);
  for (int bi = 0; bi < 2; ++bi)
    for (int s = 0; s < 2; ++s) {
      const double ang = s == 0 ? 5 : 2;
      const int64_t f = (bi * 2 + s) * 2;
      EXPECT_NEAR(out[0].at(f), xt.at(f) * std::cos(ang) - xt.at(f + 1) * std::sin(ang), 1e-6);
    }
}

TEST(Reference, GetRowsGathersAndRejectsOutOfRangeIds) {
  auto table = host_tensor::random_normal(dtype::f32, {4, 3}, 91);
  graph_builder b;
  auto ids = b.input("ids", dtype::i32, {2, 2});
  b.output(b.get_rows(b.weight("table", table), ids, "embed"));
  auto g = std::move(b).build();
  ASSERT_TRUE(g) << g.err().to_string();
  EXPECT_EQ(g->at(g->outputs()[0]).dims, (shape{2, 2, 3}));
  auto out = evaluate_reference(*g, {host_tensor::from_ints({2, 2}, {2, 0, 3, 2})});
  ASSERT_TRUE(out) << out.err().to_string();
  const int want[4] = {2, 0, 3, 2};
  for (int i = 0; i < 4; ++i)
    for (int d = 0; d < 3; ++d) EXPECT_EQ((*out)[0].at(i * 3 + d), table.at(want[i] * 3 + d));

  auto bad = evaluate_reference(*g, {host_tensor::from_ints({2, 2}, {2, 0, 4, 1})});
  ASSERT_FALSE(bad);
  EXPECT_EQ(bad.err().code, errc::invalid_argument);
  EXPECT_NE(bad.err().message.find("embed"), std::string::npos) << bad.err().message;
  EXPECT_NE(bad.err().message.find("id 4"), std::string::npos) << bad.err().message;
  auto neg = evaluate_reference(*g, {host_tensor::from_ints({2, 2}, {-1, 0, 1, 1})});
  ASSERT_FALSE(neg);
  EXPECT_NE(neg.err().message.find("id -1"), std::string::npos) << neg.err().message;
}

TEST(Reference, ComposedViewsPermuteSliceCopy) {
  auto xt = host_tensor::random_normal(dtype::f32, {2, 3, 4}, 101);
  graph_builder b;
  auto x = b.input("x", dtype::f32, {2, 3, 4});
  auto p = b.permute(x, {2, 0, 1, 3}, "p");    // [4, 2, 3]: p[i][j][k] = x[j][k][i]
  auto s = b.slice(p, -1, 1, 3, "s");          // [4, 2, 2]: s[i][j][k] = x[j][k+1][i]
  auto s2 = b.slice(s, 0, 2, 4, "s2");         // [2, 2, 2]: s2[i][j][k] = x[j][k+1][i+2]
  auto c = b.contiguous(s2, "c");
  auto r = b.reshape(c, {8}, "r");
  b.output(c);
  b.output(r);
  b.output(s2);  // a view as an output comes back materialised
  auto out = run(std::move(b), {xt});
  ASSERT_EQ(out.size(), 3u);
  ASSERT_EQ(out[0].dims(), (shape{2, 2, 2}));
  for (int i = 0; i < 2; ++i)
    for (int j = 0; j < 2; ++j)
      for (int k = 0; k < 2; ++k) {
        const float want = xt.at((j * 3 + (k + 1)) * 4 + (i + 2));
        EXPECT_EQ(out[0].at((i * 2 + j) * 2 + k), want);
        EXPECT_EQ(out[1].at((i * 2 + j) * 2 + k), want);
        EXPECT_EQ(out[2].at((i * 2 + j) * 2 + k), want);
      }
}

TEST(Reference, TransposeThenMatmulAndExplicitView) {
  auto xt = host_tensor::random_normal(dtype::f32, {3, 4}, 111);
  graph_builder b;
  auto x = b.input("x", dtype::f32, {3, 4});
  // every second element of rows 1..2: dims [2, 2], strides [4, 2], offset 4 (row 1)
  b.output(b.view(x, {2, 2}, {4, 2, 0, 0}, 4, "v"));
  b.output(b.contiguous(b.transpose(x, 0, 1)));
  auto out = run(std::move(b), {xt});
  ASSERT_EQ(out.size(), 2u);
  expect_close(out[0], {xt.at(4), xt.at(6), xt.at(8), xt.at(10)}, 0);
  ASSERT_EQ(out[1].dims(), (shape{4, 3}));
  for (int i = 0; i < 4; ++i)
    for (int j = 0; j < 3; ++j) EXPECT_EQ(out[1].at(i * 3 + j), xt.at(j * 4 + i));
}

TEST(Reference, ConcatMiddleAxisAndSizeOneDims) {
  auto at = host_tensor::random_normal(dtype::f32, {2, 1, 3}, 121);
  auto bt = host_tensor::random_normal(dtype::f32, {2, 2, 3}, 122);
  graph_builder b;
  auto a = b.input("a", dtype::f32, {2, 1, 3});
  auto c = b.input("b", dtype::f32, {2, 2, 3});
  b.output(b.concat({a, c}, 1));
  b.output(b.concat({c, a}, -2));
  auto out = run(std::move(b), {at, bt});
  ASSERT_EQ(out.size(), 2u);
  ASSERT_EQ(out[0].dims(), (shape{2, 3, 3}));
  for (int i = 0; i < 2; ++i)
    for (int j = 0; j < 3; ++j)
      for (int k = 0; k < 3; ++k) {
        const float w0 = j == 0 ? at.at(i * 3 + k) : bt.at((i * 2 + j - 1) * 3 + k);
        const float w1 = j < 2 ? bt.at((i * 2 + j) * 3 + k) : at.at(i * 3 + k);
        EXPECT_EQ(out[0].at((i * 3 + j) * 3 + k), w0);
        EXPECT_EQ(out[1].at((i * 3 + j) * 3 + k), w1);
      }
}

TEST(Reference, CopyCastsWithRounding) {
  auto xt = host_tensor::random_normal(dtype::f32, {16}, 131, 100.0f);
  graph_builder b;
  auto x = b.input("x", dtype::f32, {16});
  b.output(b.copy(x, dtype::f16));
  b.output(b.copy(x, dtype::bf16));
  b.output(b.copy(x, dtype::i32));
  b.output(b.copy(b.copy(x, dtype::f16), dtype::f32));
  auto out = run(std::move(b), {xt});
  ASSERT_EQ(out.size(), 4u);
  EXPECT_EQ(out[0].type(), dtype::f16);
  EXPECT_EQ(out[2].type(), dtype::i32);
  for (int64_t i = 0; i < 16; ++i) {
    const float v = xt.at(i);
    EXPECT_EQ(out[0].at(i), half_to_float(float_to_half(v)));
    EXPECT_EQ(out[1].at(i), bf16_to_float(float_to_bf16(v)));
    EXPECT_EQ(out[2].at(i), std::trunc(v));
    EXPECT_EQ(out[3].at(i), half_to_float(float_to_half(v)));
  }
}

TEST(Reference, EvaluateAllReturnsEveryNodeWithViewsMaterialised) {
  auto xt = host_tensor::random_normal(dtype::f32, {2, 3}, 141);
  graph_builder b;
  auto x = b.input("x", dtype::f32, {2, 3});
  auto t = b.transpose(x, 0, 1, "t");
  auto y = b.scale(t, 2.0f, "y");
  b.output(y);
  auto g = std::move(b).build();
  ASSERT_TRUE(g);
  auto all = evaluate_reference_all(*g, {xt});
  ASSERT_TRUE(all) << all.err().to_string();
  ASSERT_EQ(all->size(), g->size());
  const auto& tv = (*all)[static_cast<std::size_t>(g->find("t"))];
  const auto& yv = (*all)[static_cast<std::size_t>(g->find("y"))];
  ASSERT_EQ(tv.dims(), (shape{3, 2}));
  for (int i = 0; i < 3; ++i)
    for (int j = 0; j < 2; ++j) {
      EXPECT_EQ(tv.at(i * 2 + j), xt.at(j * 3 + i));
      EXPECT_EQ(yv.at(i * 2 + j), 2.0f * xt.at(j * 3 + i));
    }
}

TEST(Reference, SizeOneDimsAndSquareCausalMask) {
  auto at = host_tensor::random_normal(dtype::f32, {1, 1, 5}, 151);
  auto wt = host_tensor::random_normal(dtype::f32, {5, 1}, 152);
  auto st = host_tensor::random_normal(dtype::f32, {3, 3}, 153);
  auto lt = host_tensor::random_normal(dtype::f32, {2, 1}, 154);
  auto bias = host_tensor::random_normal(dtype::f32, {1}, 155);
  graph_builder b;
  auto a = b.input("a", dtype::f32, {1, 1, 5});
  auto w = b.input("w", dtype::f32, {5, 1});
  auto sq = b.input("s", dtype::f32, {3, 3});
  auto l = b.input("l", dtype::f32, {2, 1});
  auto bi = b.input("bias", dtype::f32, {1});
  b.output(b.matmul(a, w));                                // [1, 1, 1]
  b.output(b.softmax(sq, true));                           // lower-triangular
  b.output(b.layer_norm(l, tensor(), bi, 1e-5f, "ln1"));   // D = 1: x - mean = 0, so just the bias
  auto out = run(std::move(b), {at, wt, st, lt, bias});
  ASSERT_EQ(out.size(), 3u);
  ASSERT_EQ(out[0].dims(), (shape{1, 1, 1}));
  double dot = 0;
  for (int k = 0; k < 5; ++k) dot += double(at.at(k)) * wt.at(k);
  EXPECT_NEAR(out[0].at(0), dot, 1e-6);
  for (int i = 0; i < 3; ++i) {
    double sum = 0;
    for (int j = 0; j <= i; ++j) sum += std::exp(double(st.at(i * 3 + j)));
    for (int j = 0; j < 3; ++j)
      EXPECT_NEAR(out[1].at(i * 3 + j), j <= i ? std::exp(double(st.at(i * 3 + j))) / sum : 0.0, 1e-6);
  }
  EXPECT_EQ(out[1].at(0), 1.0f);  // first row sees only itself
  expect_close(out[2], {bias.at(0), bias.at(0)}, 1e-7);
}

TEST(Reference, CheckInputsNamesTheInput) {
  graph_builder b;
  auto x = b.input("tokens", dtype::i32, {4});
  auto y = b.input("hidden", dtype::f32, {4, 8});
  b.output(b.get_rows(b.weight("emb", host_tensor::random_normal(dtype::f32, {10, 8}, 1)), x));
  b.output(b.scale(y, 2));
  auto g = std::move(b).build();
  ASSERT_TRUE(g);
  auto ids = host_tensor::random_ints({4}, 2, 10);
  auto h = host_tensor::random_normal(dtype::f32, {4, 8}, 3);
  EXPECT_TRUE(check_inputs(*g, {ids, h}).ok());

  auto e = check_inputs(*g, {ids});
  EXPECT_EQ(e.code, errc::missing_input);
  EXPECT_NE(e.message.find("hidden"), std::string::npos) << e.message;

  e = check_inputs(*g, {ids, h, h});
  EXPECT_EQ(e.code, errc::invalid_argument);

  e = check_inputs(*g, {ids, h.cast(dtype::f16)});
  EXPECT_EQ(e.code, errc::dtype_mismatch);
  EXPECT_NE(e.message.find("input 1 'hidden'"), std::string::npos) << e.message;
  EXPECT_NE(e.message.find("f16"), std::string::npos) << e.message;

  e = check_inputs(*g, {ids, host_tensor::random_normal(dtype::f32, {8, 4}, 4)});
  EXPECT_EQ(e.code, errc::invalid_shape);
  EXPECT_NE(e.message.find("[4, 8]"), std::string::npos) << e.message;
  EXPECT_NE(e.message.find("[8, 4]"), std::string::npos) << e.message;

  auto r = evaluate_reference(*g, {ids});
  ASSERT_FALSE(r);
  EXPECT_EQ(r.err().code, errc::missing_input);
}

TEST(Reference, GraphLargerThanTheHostIsAnErrorNotAnException) {
  // A valid graph whose values cannot fit this host (a [2^30, 2^30] f32
  // broadcast, materialised): evaluate_reference used to throw
  // std::length_error / std::bad_alloc; now out_of_memory naming the node.
  const int64_t g30 = int64_t{1} << 30;
  graph_builder b;
  auto x = b.input("x", dtype::f32, {1});
  auto big = b.contiguous(b.view(x, {g30, g30}, {0, 0, 0, 0}, 0, "bcast"), "big");
  b.output(b.slice(b.slice(big, 0, 0, 1), 1, 0, 1, "corner"));
  auto g = std::move(b).build();
  ASSERT_TRUE(g.has_value()) << g.err().to_string();
  auto r = evaluate_reference(*g, {host_tensor::from_floats(dtype::f32, {1}, {2.0f})});
  ASSERT_FALSE(r.has_value());
  EXPECT_EQ(r.err().code, errc::out_of_memory);
  EXPECT_NE(r.err().message.find("[1073741824, 1073741824]"), std::string::npos) << r.err().message;
  EXPECT_NE(r.err().message.find(std::to_string(host_memory_bytes())), std::string::npos) << r.err().message;
}

// The stop hook: asked between nodes and matmul rows; a stop in the middle of
// a matmul fails the evaluation with errc::cancelled, and a hook that never
// says stop gives the same outputs as the plain call.
TEST(Reference, StopHookCancelsInsideAMatmulAndIsInertOtherwise) {
  graph_builder b;
  auto x = b.input("x", dtype::f32, {64, 32});
  auto w = b.weight("w", host_tensor::random_normal(dtype::f32, {32, 16}, 5));
  b.output(b.gelu(b.matmul(x, w, false, false, "mm"), gelu_mode::tanh, "y"));
  auto g = std::move(b).build();
  ASSERT_TRUE(g);
  const std::vector<host_tensor> in{host_tensor::random_normal(dtype::f32, {64, 32}, 6)};

  int asked = 0;
  auto never = evaluate_reference(*g, in, [&] { ++asked; return false; });
  ASSERT_TRUE(never) << never.err().to_string();
  auto plain = evaluate_reference(*g, in);
  ASSERT_TRUE(plain);
  EXPECT_EQ((*never)[0].to_floats(), (*plain)[0].to_floats());
  EXPECT_GE(asked, 64);  // at least once per matmul row

  // Say stop at the 10th question: inside the matmul's rows.
  int calls = 0;
  auto stopped = evaluate_reference(*g, in, [&] { return ++calls >= 10; });
  ASSERT_FALSE(stopped);
  EXPECT_EQ(stopped.err().code, errc::cancelled);
  EXPECT_LT(calls, 20);  // it gave up right away, not after the remaining rows
}

}  // namespace
}  // namespace ag
