// End-to-end runs through the public API (actorgraph.hpp), checked against
// the reference evaluator (graph/reference.hpp).
#include <gtest/gtest.h>

#include <chrono>

#include "actors/actorgraph.hpp"
#include "graph/models/transformer.hpp"
#include "graph/reference.hpp"

namespace {

using namespace std::chrono_literals;

// f32 compute on different kernels (BLAS vs double accumulation): relative
// error of a few ulps per op, compounded over a handful of ops.
constexpr double atol = 1e-4, rtol = 1e-3;

ag::graph small_mlp(uint64_t seed) {
  ag::graph_builder b;
  auto x = b.input("x", ag::dtype::f32, {4, 16});
  b.set_layer(0);
  auto w1 = b.weight("w1", ag::host_tensor::random_normal(ag::dtype::f32, {16, 32}, seed, 0.2f));
  auto h = b.gelu(b.matmul(x, w1, false, false, "fc1"), ag::gelu_mode::tanh, "act");
  b.set_layer(1);
  auto w2 = b.weight("w2", ag::host_tensor::random_normal(ag::dtype::f32, {32, 16}, seed + 1, 0.2f));
  auto y = b.add(b.matmul(h, w2, false, false, "fc2"), x, "resid");
  b.output(y);
  return std::move(b).build().value();
}

void expect_matches_reference(const ag::graph& g, const std::vector<ag::host_tensor>& in, const ag::job_result& r) {
  ASSERT_TRUE(r.has_value()) << r.err().to_string();
  auto ref = ag::evaluate_reference(g, in);
  ASSERT_TRUE(ref.has_value()) << ref.err().to_string();
  ASSERT_EQ(r->size(), ref->size());
  for (std::size_t i = 0; i < ref->size(); ++i) {
    auto c = ag::compare((*r)[i], (*ref)[i], atol, rtol);
    EXPECT_TRUE(c.ok) << "output " << i << ": " << c.message;
  }
}

void run_mlp(const std::string& spec) {
  auto rt = ag::runtime::create(spec);
  ASSERT_TRUE(rt.has_value()) << rt.err().to_string();
  auto g = small_mlp(3);
  auto p = (*rt)->compile(g);
  ASSERT_TRUE(p.has_value()) << p.err().to_string();
  std::vector<ag::host_tensor> in{ag::host_tensor::random_normal(ag::dtype::f32, {4, 16}, 11)};
  ag::job j = (*rt)->submit(*p, in);
  ASSERT_TRUE(j.wait_for(20s)) << "job did not finish";
  EXPECT_EQ(j.state(), ag::job_state::done);
  expect_matches_reference(g, in, j.wait());
}

TEST(EndToEnd, MlpOnCpu1) { run_mlp("cpu:1"); }
TEST(EndToEnd, MlpOnSim2) { run_mlp("sim:2"); }

}  // namespace
