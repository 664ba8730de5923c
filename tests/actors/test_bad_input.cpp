// Bad input never takes the runtime down: each case fails with an error that
// names what was wrong, and the runtime then still runs a good job.
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <string>

#include "actors/actorgraph.hpp"
#include "graph/reference.hpp"
#include "graph/weight_source.hpp"
#include "messages/caf_error.hpp"

#include <caf/make_message.hpp>

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

// A weight whose values cannot be read (a checkpoint's disk gone, a folded
// norm that overflows) fails compile naming the device, the weight and
// where it comes from; what the failed plan allocated is given back (ten
// failures in a row would not fit these devices' memory otherwise), and the
// runtime then compiles and runs a good plan.
class unreadable_weight final : public ag::weight_source {
 public:
  explicit unreadable_weight(ag::shape dims) : dims_(std::move(dims)) {}
  ag::dtype type() const noexcept override { return ag::dtype::f32; }
  const ag::shape& dims() const noexcept override { return dims_; }
  ag::error read_slice(int, int64_t, int64_t, void*) const override {
    return ag::error(ag::errc::op_failed, origin() + ": read failed: the disk went away");
  }
  std::string origin() const override { return "gone.safetensors: 'w1'"; }

 private:
  ag::shape dims_;
};

TEST(BadPlan, AWeightThatCannotBeReadFailsCompileNamingItAndLeavesNothingAllocated) {
  ag::runtime_options o;
  o.backend.sim.spec.mem_bytes = 512 << 10;  // each failed plan allocates 128 KiB of weights on device 1
  auto rt = ag::runtime::create("sim:2", o).value();
  ag::graph_builder b;
  auto x = b.input("x", ag::dtype::f32, {4, 128});
  b.set_layer(0);
  auto w0 = b.weight("w0", ag::host_tensor::random_normal(ag::dtype::f32, {128, 128}, 3, 0.1f));
  auto h = b.gelu(b.matmul(x, w0, false, false, "h0"), ag::gelu_mode::tanh, "h1");
  b.set_layer(1);
  auto w1 = b.weight("w1", std::make_shared<unreadable_weight>(ag::shape{128, 256}));
  b.output(b.matmul(h, w1, false, false, "out"));
  const auto g = std::make_shared<const ag::graph>(std::move(b).build().value());
  ag::plan_options two_stages;
  two_stages.pipeline_stages = 2;
  for (int attempt = 0; attempt < 10; ++attempt) {
    SCOPED_TRACE("attempt " + std::to_string(attempt));
    auto p = rt->compile(g, two_stages);
    ASSERT_FALSE(p.has_value());
    EXPECT_EQ(p.err().code, ag::errc::op_failed) << p.err().to_string();
    for (const char* part : {"device 'sim1'", "uploading weight 'w1'", "gone.safetensors: 'w1'", "the disk went away"})
      EXPECT_NE(p.err().message.find(part), std::string::npos) << part << " in: " << p.err().message;
    EXPECT_EQ(p.err().device, 1);
    EXPECT_EQ(p.err().op, "w1");
  }
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

// ---- issue 13: bad input below the runtime ------------------------------------

// table [4, 8] weight, ids i32 [3] -> get_rows -> (pinned to the last device)
// a matmul, so the get_rows step is not a sink: its kernel error must still
// reach the job.
ag::graph get_rows_graph(int consumer_device) {
  ag::graph_builder b;
  auto table = b.weight("table", ag::host_tensor::random_normal(ag::dtype::f32, {4, 8}, 3));
  auto ids = b.input("ids", ag::dtype::i32, {3});
  auto rows = b.get_rows(table, ids, "rows");
  b.pin(rows, 0);
  auto w = b.weight("w", ag::host_tensor::random_normal(ag::dtype::f32, {8, 2}, 4));
  auto y = b.matmul(rows, w, false, false, "proj");
  b.pin(y, consumer_device);
  b.output(y);
  return std::move(b).build().value();
}

struct KernelError : ::testing::TestWithParam<const char*> {};

TEST_P(KernelError, GetRowsIdOutOfRangeFailsItsJobAndTheNextJobIsRight) {
  auto rt = ag::runtime::create(GetParam()).value();
  const int last = static_cast<int>(rt->devices().size()) - 1;
  auto p = rt->compile(get_rows_graph(last)).value();
  const auto good = [&] {
    std::vector<ag::host_tensor> in{ag::host_tensor::from_ints({3}, {2, 0, 3})};
    auto j = rt->submit(p, in);
    ASSERT_TRUE(j.wait_for(20s));
    ASSERT_TRUE(j.wait().has_value()) << j.wait().err().to_string();
    auto ref = ag::evaluate_reference(p->source(), in).value();
    auto c = ag::compare(j.wait()->front(), ref.front(), 1e-5, 1e-5);
    EXPECT_TRUE(c.ok) << c.message;
  };
  good();
  for (int32_t bad : {16, -1, 2000000000}) {
    auto j = rt->submit(p, {ag::host_tensor::from_ints({3}, {1, bad, 0})});
    // before the fix: done, with the previous job's rows or garbage
    expect_failed(j, ag::errc::op_failed, "rows");
    EXPECT_NE(j.wait().err().message.find("id " + std::to_string(bad)), std::string::npos) << j.wait().err().message;
    good();  // the error belonged to that job only: nothing stale reaches this one
  }
  EXPECT_EQ(rt->jobs_in_flight(), 0);
}

INSTANTIATE_TEST_SUITE_P(Backends, KernelError, ::testing::Values("cpu:1", "sim:1", "sim:2"));

void expect_invalid_option(const ag::error& e, const std::string& option, const std::string& value) {
  EXPECT_EQ(e.code, ag::errc::invalid_argument) << e.to_string();
  EXPECT_NE(e.message.find(option), std::string::npos) << e.message;
  EXPECT_NE(e.message.find(value), std::string::npos) << e.message;
}

TEST(BadOptions, RuntimeOptionsAreRefusedNamingOptionAndValue) {
  const auto refused = [](ag::runtime_options o, const std::string& option, const std::string& value) {
    auto rt = ag::runtime::create("sim:1", o);
    ASSERT_FALSE(rt.has_value()) << option;
    expect_invalid_option(rt.err(), option, value);
  };
  ag::runtime_options o;
  o.arenas_per_device = 0;
  refused(o, "arenas_per_device", "0");
  o.arenas_per_device = -1;
  refused(o, "arenas_per_device", "-1");
  o = {};
  o.scheduler_threads = -3;
  refused(o, "scheduler_threads", "-3");
  o = {};
  o.scheduler_max_throughput = -1;
  refused(o, "scheduler_max_throughput", "-1");
  o = {};
  o.scheduler_idle_steal_us = -10;
  refused(o, "scheduler_idle_steal_us", "-10");
  o = {};
  o.scheduler_spin_polls = -2;
  refused(o, "scheduler_spin_polls", "-2");
  o = {};
  o.spare_job_actors = -1;
  refused(o, "spare_job_actors", "-1");
  o.spare_job_actors = 1025;
  refused(o, "spare_job_actors", "1025");
  o = {};
  o.backend.cuda_nccl_min_bytes_wide = 0;
  refused(o, "cuda_nccl_min_bytes_wide", "0");
  o = {};
  o.backend.cuda_sequence_parallel_min_bytes = -1;
  refused(o, "cuda_sequence_parallel_min_bytes", "-1");
  o = {};
  o.backend.cuda_gemv_tensor_core_rows = 1;
  refused(o, "cuda_gemv_tensor_core_rows", "1");
  o.backend.cuda_gemv_tensor_core_rows = 9;
  refused(o, "cuda_gemv_tensor_core_rows", "9");
  o = {};
  o.upload_chunk_bytes = 0;
  refused(o, "upload_chunk_bytes", "0");
  o = {};
  o.backend.sim.jitter = std::nan("");
  refused(o, "sim.jitter", "nan");
  o = {};
  o.backend.sim.time_scale = -1;
  refused(o, "sim.time_scale", "-1");
  o = {};
  o.backend.sim.faults.op_error_rate = 2;
  refused(o, "sim.faults.op_error_rate", "2");
  // defaults still start
  auto ok = ag::runtime::create("sim:1", ag::runtime_options{});
  ASSERT_TRUE(ok.has_value()) << ok.err().to_string();
}

TEST(BadOptions, PlanOptionsAndEmptyGraphsAreRefusedAtCompile) {
  auto rt = ag::runtime::create("sim:2").value();
  ag::plan_options po;
  po.policy = static_cast<ag::placement_policy>(9);
  auto a = rt->compile(two_input_graph(), po);
  ASSERT_FALSE(a.has_value());
  expect_invalid_option(a.err(), "policy", "9");
  po = {};
  po.lanes_per_device = -1;
  auto b = rt->compile(two_input_graph(), po);
  ASSERT_FALSE(b.has_value());
  expect_invalid_option(b.err(), "lanes_per_device", "-1");
  // an empty graph used to compile to a plan whose jobs finished "done" with no outputs
  auto e = rt->compile(ag::graph{});
  ASSERT_FALSE(e.has_value());
  EXPECT_EQ(e.err().code, ag::errc::invalid_argument);
  EXPECT_NE(e.err().message.find("no outputs"), std::string::npos) << e.err().message;
  expect_good_job(*rt, rt->compile(two_input_graph()).value());
}

TEST(BadPlan, PlanNeedingMoreThanTheHostHasIsRefusedWithTheSize) {
  // sim devices computing values keep their arenas in host memory: input and
  // output (half the host) plus the arena (as much again) cannot fit. Before:
  // compile tried the allocation. Now: out_of_memory with the bytes needed.
  auto rt = ag::runtime::create("sim:1").value();
  const int64_t elems = ag::host_memory_bytes() / 16 + 1;
  ag::graph_builder b;
  auto x = b.input("x", ag::dtype::f32, {elems});
  b.output(b.gelu(x, ag::gelu_mode::tanh, "y"));
  auto p = rt->compile(std::move(b).build().value());
  ASSERT_FALSE(p.has_value());
  EXPECT_EQ(p.err().code, ag::errc::out_of_memory) << p.err().to_string();
  EXPECT_NE(p.err().message.find(std::to_string(2 * elems * 4)), std::string::npos) << p.err().message;
  EXPECT_NE(p.err().message.find("sim0"), std::string::npos) << p.err().message;
  expect_good_job(*rt, rt->compile(two_input_graph()).value());
}

TEST(MessagesFromOutside, AgErrorsWithoutMessageOrWithUnknownCodesStayErrorsThatSaySo) {
  // Found by tests/fuzz/fuzz_messages (corpus/messages/caf_error_without_message):
  // a deserialised caf::error of category "ag" without a string context became
  // an ag::error with an empty message; an unknown code kept a code no one knows.
  const ag::error no_text = ag::msg::from_caf(caf::error{static_cast<uint8_t>(ag::errc::timeout), ag::msg::ag_error_category});
  EXPECT_EQ(no_text.code, ag::errc::timeout);
  EXPECT_NE(no_text.message.find("no message"), std::string::npos) << no_text.message;
  const ag::error unknown = ag::msg::from_caf(caf::error{200, ag::msg::ag_error_category, caf::make_message(std::string("x"))});
  EXPECT_EQ(unknown.code, ag::errc::internal);
  EXPECT_NE(unknown.message.find("unknown actorgraph error code 200: x"), std::string::npos) << unknown.message;
  // the ordinary round trip is untouched
  const ag::error e{ag::errc::op_failed, "device 'sim0': op 'rows' failed"};
  const ag::error back = ag::msg::from_caf(ag::msg::to_caf(e));
  EXPECT_EQ(back.code, e.code);
  EXPECT_EQ(back.message, e.message);
}

}  // namespace
