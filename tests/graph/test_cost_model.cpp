// Cost model: numbers worked out by hand from the documented formulas.

#include <gtest/gtest.h>

#include "graph/cost_model.hpp"
#include "graph/graph.hpp"

namespace {

using namespace ag;

// A device whose rates make the arithmetic easy: 1 GFLOP/s f32, 4 GFLOP/s
// bf16, 1 GB/s memory, 1 us launch.
device_spec easy_device() {
  device_spec d;
  d.flops_f32 = 1e9;
  d.flops_bf16 = 4e9;
  d.mem_bandwidth = 1e9;
  d.launch_latency = 1e-6;
  d.link_bandwidth = 2e9;
  d.link_latency = 3e-6;
  d.host_bandwidth = 0.5e9;
  d.host_latency = 7e-6;
  return d;
}

graph build(graph_builder&& b) {
  auto g = std::move(b).build();
  EXPECT_TRUE(g.has_value()) << (g ? "" : g.err().to_string());
  return std::move(*g);
}

TEST(CostModel, MatmulFlopsAndBytes) {
  graph_builder b;
  auto x = b.input("x", dtype::f32, {8, 16});
  auto w = b.weight("w", host_tensor::random_normal(dtype::f32, {16, 32}, 1));
  auto y = b.matmul(x, w, false, false, "y");
  auto wt = b.weight("wt", host_tensor::random_normal(dtype::f32, {32, 16}, 2));
  auto z = b.matmul(x, wt, false, true, "z");  // K = 16 from x, N = 32 from wt's rows
  b.output(y);
  b.output(z);
  graph g = build(std::move(b));
  const op_cost c = cost_of(g, g.at(g.find("y")));
  EXPECT_DOUBLE_EQ(c.flops, 2.0 * 8 * 32 * 16);
  EXPECT_DOUBLE_EQ(c.bytes, (8 * 16 + 16 * 32 + 8 * 32) * 4.0);
  const op_cost ct = cost_of(g, g.at(g.find("z")));
  EXPECT_DOUBLE_EQ(ct.flops, 2.0 * 8 * 32 * 16);
}

TEST(CostModel, BatchedMatmulCountsBatch) {
  graph_builder b;
  auto x = b.input("x", dtype::f32, {3, 8, 16});
  auto y = b.input("y", dtype::f32, {3, 16, 4});
  b.output(b.matmul(x, y, false, false, "xy"));
  graph g = build(std::move(b));
  EXPECT_DOUBLE_EQ(cost_of(g, g.at(g.find("xy"))).flops, 2.0 * 3 * 8 * 4 * 16);
}

TEST(CostModel, ElementwiseNormsViewsLeaves) {
  graph_builder b;
  auto x = b.input("x", dtype::f16, {10, 6});
  auto y = b.input("y", dtype::f16, {10, 6});
  auto s = b.add(x, y, "s");
  auto sm = b.softmax(s, false, 1.0f, "sm");
  auto t = b.transpose(sm, 0, 1, "t");
  b.output(t);
  graph g = build(std::move(b));
  const op_cost add = cost_of(g, g.at(g.find("s")));
  EXPECT_DOUBLE_EQ(add.bytes, 3 * 60 * 2.0);  // two inputs + output, f16
  EXPECT_DOUBLE_EQ(add.flops, 60.0);
  const op_cost soft = cost_of(g, g.at(g.find("sm")));
  EXPECT_DOUBLE_EQ(soft.flops, 5 * 60.0);
  EXPECT_DOUBLE_EQ(soft.bytes, 2 * 60 * 2.0);
  EXPECT_EQ(cost_of(g, g.at(g.find("t"))).flops, 0.0);
  EXPECT_EQ(cost_of(g, g.at(g.find("t"))).bytes, 0.0);
  EXPECT_EQ(cost_of(g, g.at(g.find("x"))).bytes, 0.0);
  const device_spec d = easy_device();
  EXPECT_EQ(estimate_seconds(d, g, g.at(g.find("t"))), 0.0);
  EXPECT_EQ(estimate_seconds(d, g, g.at(g.find("x"))), 0.0);
  // add: memory bound, 360 B at 1 GB/s + launch.
  EXPECT_DOUBLE_EQ(estimate_seconds(d, g, g.at(g.find("s"))), 1e-6 + 360 / 1e9);
}

TEST(CostModel, EstimateUsesDtypeRateAndMax) {
  const device_spec d = easy_device();
  const op_cost compute_bound{8e6, 1e3};
  EXPECT_DOUBLE_EQ(estimate_seconds(d, compute_bound, dtype::f32), 1e-6 + 8e6 / 1e9);
  EXPECT_DOUBLE_EQ(estimate_seconds(d, compute_bound, dtype::bf16), 1e-6 + 8e6 / 4e9);
  EXPECT_DOUBLE_EQ(estimate_seconds(d, compute_bound, dtype::f16), 1e-6 + 8e6 / 4e9);
  const op_cost memory_bound{1e3, 5e6};
  EXPECT_DOUBLE_EQ(estimate_seconds(d, memory_bound, dtype::f32), 1e-6 + 5e6 / 1e9);
}

TEST(CostModel, MatmulBf16UsesTensorRate) {
  graph_builder b;
  auto x = b.input("x", dtype::bf16, {64, 64});
  auto w = b.weight("w", host_tensor::random_normal(dtype::bf16, {64, 64}, 3));
  b.output(b.matmul(x, w, false, false, "y"));
  graph g = build(std::move(b));
  const device_spec d = easy_device();
  const double flops = 2.0 * 64 * 64 * 64, bytes = 3 * 64 * 64 * 2.0;
  EXPECT_DOUBLE_EQ(estimate_seconds(d, g, g.at(g.find("y"))), 1e-6 + std::max(flops / 4e9, bytes / 1e9));
}

// A product's last wave of tiles: tiles of 4 rows and columns dealt over 4
// SMs. x [3, 8, 16] x w [16, 12] (a weight the batch shares) is one product
// of 24 rows: 6 x 3 = 18 tiles in ceil(18 / 4) = 5 waves, 20 SM-slots for 18
// tiles, so its compute time x (20 / 18 - 1). x [3, 8, 16] x y [3, 16, 4] is
// three products of 2 x 1 tiles: 6 in 2 waves, x (8 / 6 - 1). Fewer tiles
// than SMs count nothing (cuBLAS deals them in smaller pieces).
TEST(CostModel, WaveTailIsTheLastWavesIdleShareOfAComputeBoundProduct) {
  graph_builder b;
  auto x = b.input("x", dtype::f32, {3, 8, 16});
  auto w = b.weight("w", host_tensor::random_normal(dtype::f32, {16, 12}, 4));
  auto y = b.input("y", dtype::f32, {3, 16, 4});
  b.output(b.matmul(x, w, false, false, "xw"));
  b.output(b.matmul(x, y, false, false, "xy"));
  b.output(b.add(x, x, "xx"));
  graph g = build(std::move(b));
  device_spec d = easy_device();
  const node &xw = g.at(g.find("xw")), &xy = g.at(g.find("xy")), &xx = g.at(g.find("xx"));
  EXPECT_EQ(estimate_wave_tail_seconds(d, g, xw), 0.0);  // gemm_sms 0: no waves
  d.gemm_row_tile = 4;
  d.gemm_sms = 4;
  const double xw_compute = 2.0 * 24 * 12 * 16 / 1e9, xy_compute = 2.0 * 3 * 8 * 4 * 16 / 1e9;
  ASSERT_GT(xw_compute, (3 * 8 * 16 + 16 * 12 + 24 * 12) * 4.0 / 1e9);  // both bound by compute
  ASSERT_GT(xy_compute, (3 * 8 * 16 + 3 * 16 * 4 + 3 * 8 * 4) * 4.0 / 1e9);
  EXPECT_NEAR(estimate_wave_tail_seconds(d, g, xw), xw_compute * (20.0 / 18.0 - 1.0), 1e-15);
  EXPECT_NEAR(estimate_wave_tail_seconds(d, g, xy), xy_compute * (8.0 / 6.0 - 1.0), 1e-15);
  EXPECT_EQ(estimate_wave_tail_seconds(d, g, xx), 0.0);  // not a product
  d.gemm_sms = 6;  // 18 tiles: three full waves
  EXPECT_EQ(estimate_wave_tail_seconds(d, g, xw), 0.0);
  d.gemm_sms = 32;  // fewer tiles than SMs: dealt in smaller pieces, not modelled
  EXPECT_EQ(estimate_wave_tail_seconds(d, g, xw), 0.0);
  d.gemm_sms = 4;
  d.mem_bandwidth = 1e8;  // now bound by memory: the tiles' count does not decide its time
  EXPECT_EQ(estimate_wave_tail_seconds(d, g, xw), 0.0);
  d.gemm_sms = -1;
  EXPECT_FALSE(validate(d).ok());
}

TEST(CostModel, CopyEstimates) {
  device_spec a = easy_device(), b = easy_device();
  b.link_bandwidth = 1e9;
  b.link_latency = 1e-6;
  EXPECT_DOUBLE_EQ(estimate_peer_copy_seconds(a, b, 4000), 3e-6 + 4000 / 1e9);
  EXPECT_DOUBLE_EQ(estimate_host_copy_seconds(a, 5000), 7e-6 + 5000 / 0.5e9);
}

TEST(CostModel, SupportsAndNames) {
  device_spec d;
  EXPECT_TRUE(d.supports(op_kind::gelu));
  d.unsupported = {op_kind::gelu, op_kind::rope};
  EXPECT_FALSE(d.supports(op_kind::gelu));
  EXPECT_FALSE(d.supports(op_kind::rope));
  EXPECT_TRUE(d.supports(op_kind::matmul));
  EXPECT_STREQ(to_string(device_kind::sim), "sim");
  EXPECT_STREQ(to_string(device_kind::cpu), "cpu");
  EXPECT_STREQ(to_string(device_kind::cuda), "cuda");
}

}  // namespace
