// Bad input never takes the runtime down: each case fails with an error that
// names what was wrong, and the runtime then still runs a good job.
#include <gtest/gtest.h>

#include <chrono>

#include "actors/actorgraph.hpp"
#include "graph/reference.hpp"

namespace {

using namespace std::chrono_literals;

ag::graph two_input_graph(int64_t weight_rows = 8) {
  ag::graph_builder b;
  auto x = b.input("x", ag::dtype::f32, {4, 8});
  auto y = b.input("y", ag::dtype::f32, {4, 8});
  auto w = b.weight("w", ag::host_tensor::random_normal(ag::dtype::f32, {8, weight_rows}, 1, 0.3f));
  b.output(b.matmul(b.add(x, y, "sum"), w, false, false, "proj"));
  return std::move(b).build().value();
}

std::vector<ag::host_tensor> good_inputs(uint64_t seed) {
  return {ag::host_tensor::random_normal(ag::dtype::f32, {4, 8}, seed),
          ag::host_tensor::random_normal(ag::dtype::f32, {4, 8}, seed + 1)};
}

void expect_good_job(ag::runtime& rt, const std::shared_ptr<const ag::plan>& p) {
  auto in = good_inputs(77);
  auto j = rt.submit(p, in);
  ASSERT_TRUE(j.wait_for(20s));
  ASSERT_TRUE(j.wait().has_value()) << j.wait().err().to_string();
  auto ref = ag::evaluate_reference(p->source(), in).value();
  auto c = ag::compare(j.wait()->front(), ref.front(), 1e-4, 1e-3);
  EXPECT_TRUE(c.ok) << c.message;
}

void expect_failed(const ag::job& j, ag::errc code, const std::string& needle) {
  ASSERT_TRUE(j.wait_for(20s));
  EXPECT_EQ(j.state(), ag::job_state::failed);
  ASSERT_FALSE(j.wait().has_value());
  EXPECT_EQ(j.wait().err().code, code) << j.wait().err().to_string();
  EXPECT_NE(j.wait().err().message.find(needle), std::string::npos) << j.wait().err().message;
}

struct BadInput : ::testing::TestWithParam<const char*> {};

TEST_P(BadInput, WrongCountShapeAndDtypeFailTheJobOnly) {
  auto rt = ag::runtime::create(GetParam()).value();
  auto p = rt->compile(two_input_graph()).value();
  auto in = good_inputs(1);
  expect_failed(rt->submit(p, {in[0]}), ag::errc::missing_input, "y");
  auto bad_shape = good_inputs(2);
  bad_shape[1] = ag::host_tensor::random_normal(ag::dtype::f32, {4, 9}, 3);
  expect_failed(rt->submit(p, bad_shape), ag::errc::invalid_shape, "y");
  auto bad_type = good_inputs(4);
  bad_type[0] = ag::host_tensor::random_normal(ag::dtype::f16, {4, 8}, 5);
  expect_failed(rt->submit(p, bad_type), ag::errc::dtype_mismatch, "x");
  auto too_many = good_inputs(6);
  too_many.push_back(too_many[0]);
  auto j = rt->submit(p, too_many);
  ASSERT_TRUE(j.wait_for(20s));
  EXPECT_EQ(j.state(), ag::job_state::failed);
  expect_good_job(*rt, p);
  EXPECT_EQ(rt->jobs_in_flight(), 0);
}

INSTANTIATE_TEST_SUITE_P(Backends, BadInput, ::testing::Values("cpu:1", "sim:2"));

TEST(BadSpec, UnknownDeviceKindIsAnError) {
  auto rt = ag::runtime::create("tpu:2");
  ASSERT_FALSE(rt.has_value());
  EXPECT_EQ(rt.err().code, ag::errc::bad_device_spec);
  EXPECT_NE(rt.err().message.find("tpu"), std::string::npos) << rt.err().message;
  auto ok = ag::runtime::create("sim:1");
  ASSERT_TRUE(ok.has_value());
  expect_good_job(**ok, (*ok)->compile(two_input_graph()).value());
}

TEST(BadPlan, PlanLargerThanDeviceMemoryFailsCompile) {
  ag::runtime_options o;
  o.backend.sim.spec.mem_bytes = 64 << 10;  // 64 KiB devices
  auto rt = ag::runtime::create("sim:1", o).value();
  auto big = rt->compile(two_input_graph(8192));  // 8 x 8192 f32 weight = 256 KiB
  ASSERT_FALSE(big.has_value());
  EXPECT_EQ(big.err().code, ag::errc::out_of_memory) << big.err().to_string();
  EXPECT_EQ(big.err().device, 0) << big.err().to_string();
  expect_good_job(*rt, rt->compile(two_input_graph()).value());
}

// A tensor-parallel plan whose shards meet only at the output (a
// column-parallel matmul, gathered by peer copies) runs, and so does one that
// needs a collective (a row-parallel matmul's all-reduce); a degree larger
// than the devices is refused at compile time and the runtime keeps serving.
TEST(BadPlan, TensorParallelPlansRunAndTooLargeDegreeIsRefused) {
  auto rt = ag::runtime::create("sim:2").value();
  ag::plan_options o;
  o.tensor_parallel = 2;
  auto col = rt->compile(two_input_graph(), o);
  ASSERT_TRUE(col.has_value()) << col.err().to_string();
  ASSERT_NE((*col)->tensor_parallel(), nullptr);
  expect_good_job(*rt, *col);

  ag::graph_builder b;
  auto x = b.input("x", ag::dtype::f32, {4, 8});
  auto w1 = b.weight("w1", ag::host_tensor::random_normal(ag::dtype::f32, {8, 8}, 1, 0.3f));
  auto w2 = b.weight("w2", ag::host_tensor::random_normal(ag::dtype::f32, {8, 8}, 2, 0.3f));
  b.output(b.matmul(b.matmul(x, w1, false, false, "up"), w2, false, false, "down"));
  auto rowg = std::make_shared<const ag::graph>(std::move(b).build().value());
  auto row = rt->compile(rowg, o);
  ASSERT_TRUE(row.has_value()) << row.err().to_string();
  ag::host_tensor xin = ag::host_tensor::random_normal(ag::dtype::f32, {4, 8}, 7, 1.0f);
  auto ref = ag::evaluate_reference(*rowg, {xin});
  ASSERT_TRUE(ref.has_value());
  auto j = rt->submit(*row, {xin});
  ASSERT_TRUE(j.wait_for(20s));
  ASSERT_TRUE(j.wait().has_value()) << j.wait().err().to_string();
  auto c = ag::compare(j.wait()->front(), ref->front(), 1e-4, 1e-3);
  EXPECT_TRUE(c.ok) << c.message;
  o.tensor_parallel = 3;
  auto three = rt->compile(rowg, o);
  ASSERT_FALSE(three.has_value());
  EXPECT_NE(three.err().message.find("3"), std::string::npos) << three.err().message;
  expect_good_job(*rt, rt->compile(two_input_graph()).value());
}

TEST(BadPlan, PlanOfAnotherRuntimeIsRefused) {
  auto a = ag::runtime::create("sim:1").value();
  auto b = ag::runtime::create("sim:1").value();
  auto pa = a->compile(two_input_graph()).value();
  expect_failed(b->submit(pa, good_inputs(1)), ag::errc::invalid_argument, "runtime");
  expect_good_job(*a, pa);
}

TEST(Lifecycle, PlanOutlivesRuntimeAndJobsCanBeAwaitedAfterwards) {
  std::shared_ptr<const ag::plan> p;
  ag::job j;
  {
    auto rt = ag::runtime::create("sim:2").value();
    p = rt->compile(two_input_graph()).value();
    j = rt->submit(p, good_inputs(3));
  }  // ~runtime waits for the job
  ASSERT_TRUE(j.ready());
  EXPECT_TRUE(j.wait().has_value());
  bool ran = false;
  j.then([&](const ag::job_result& r) { ran = r.has_value(); });
  EXPECT_TRUE(ran);
  j.cancel();  // no-op once ready
  EXPECT_EQ(j.state(), ag::job_state::done);
}

}  // namespace
