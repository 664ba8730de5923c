// Host completion and fairness: the handle is fulfilled by the backend thread
// that saw the last completion (no actor hop), memory is still released by
// the job actor afterwards, and jobs start in submission order under
// back-pressure.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <thread>

#include "actors/actorgraph.hpp"
#include "graph/reference.hpp"

namespace {

using namespace std::chrono_literals;

std::shared_ptr<const ag::plan> small_plan(ag::runtime& rt) {
  ag::graph_builder b;
  auto x = b.input("x", ag::dtype::f32, {16, 32});
  auto w = b.weight("w", ag::host_tensor::random_normal(ag::dtype::f32, {32, 32}, 3, 0.2f));
  b.output(b.gelu(b.matmul(x, w, false, false, "proj"), ag::gelu_mode::tanh, "act"));
  return rt.compile(std::move(b).build().value()).value();
}

TEST(Completion, ContinuationSeesOutputsAndTheArenaIsStillReleased) {
  ag::runtime_options o;
  o.arenas_per_device = 1;  // every job needs the arena the previous one released
  auto rt = ag::runtime::create("cpu:1", o).value();
  auto p = small_plan(*rt);
  std::atomic<int> good{0};
  for (uint64_t i = 0; i < 40; ++i) {
    auto in = std::vector<ag::host_tensor>{ag::host_tensor::random_normal(ag::dtype::f32, {16, 32}, 100 + i)};
    auto ref = ag::evaluate_reference(p->source(), in).value();
    auto j = rt->submit(p, in);
    j.then([&good, ref](const ag::job_result& r) {
      if (r && ag::compare(r->front(), ref.front(), 1e-4, 1e-3).ok) good.fetch_add(1);
    });
    ASSERT_TRUE(j.wait_for(20s)) << "job " << i << " never finished: the arena was not released";
    ASSERT_TRUE(j.wait().has_value()) << j.wait().err().to_string();
  }
  rt->wait_idle();
  EXPECT_EQ(good.load(), 40);
  EXPECT_EQ(rt->jobs_in_flight(), 0);
}

// wait() on a temporary handle (the job's only one) returns a copy: binding
// it to a reference keeps the result alive after the temporary, and its
// state, are gone (a reference into the freed state was a use-after-free:
// ASan sees it, and a GPU test crashed on it).
TEST(Completion, WaitOnATemporaryHandleKeepsTheResultAlive) {
  auto rt = ag::runtime::create("cpu:1").value();
  auto p = small_plan(*rt);
  const std::vector<ag::host_tensor> in{ag::host_tensor::random_normal(ag::dtype::f32, {16, 32}, 11)};
  const ag::job_result& r = rt->submit(p, in).wait();
  ASSERT_TRUE(r.has_value()) << r.err().to_string();
  rt->wait_idle();  // the job actor has let go of its state too
  const auto ref = ag::evaluate_reference(p->source(), in).value();
  const auto c = ag::compare(r->front(), ref.front(), 1e-4, 1e-3);
  EXPECT_TRUE(c.ok) << c.message;
}

// The last handle's wait() && moves the outputs out: the bytes it returns
// are the ones the job wrote (a continuation saw them), not a copy. A loop of
// `rt.submit(p, in).wait()` paid a copy of every output (4 MiB of logits, 2 ms
// a job on a 2-core host, in actorgraph-tp-bench's figures).
TEST(Completion, WaitOnTheLastHandleMovesTheOutputsOut) {
  auto rt = ag::runtime::create("cpu:1").value();
  auto p = small_plan(*rt);
  const auto ref_of = [&](const std::vector<ag::host_tensor>& in) { return ag::evaluate_reference(p->source(), in).value(); };
  for (uint64_t i = 0; i < 20; ++i) {
    const std::vector<ag::host_tensor> in{ag::host_tensor::random_normal(ag::dtype::f32, {16, 32}, 40 + i)};
    ag::job j = rt->submit(p, in);
    std::atomic<const std::byte*> written{nullptr};
    j.then([&written](const ag::job_result& r) {
      if (r) written = r->front().data();
    });
    const ag::job_result r = std::move(j).wait();
    ASSERT_TRUE(r.has_value()) << r.err().to_string();
    EXPECT_EQ(r->front().data(), written.load()) << "job " << i << ": the outputs were copied, not moved";
    const auto c = ag::compare(r->front(), ref_of(in).front(), 1e-4, 1e-3);
    EXPECT_TRUE(c.ok) << c.message;
  }
}

// With another handle alive, wait() && copies: the other handle still reads
// the whole result afterwards.
TEST(Completion, WaitOnAHandleWithCopiesAliveLeavesTheResultToThem) {
  auto rt = ag::runtime::create("cpu:1").value();
  auto p = small_plan(*rt);
  const std::vector<ag::host_tensor> in{ag::host_tensor::random_normal(ag::dtype::f32, {16, 32}, 77)};
  ag::job j = rt->submit(p, in);
  const ag::job kept = j;
  const ag::job_result r = std::move(j).wait();
  ASSERT_TRUE(r.has_value()) << r.err().to_string();
  const ag::job_result& still = kept.wait();
  ASSERT_TRUE(still.has_value()) << still.err().to_string();
  ASSERT_EQ(still->size(), 1u);
  EXPECT_NE(r->front().data(), still->front().data()) << "the result was moved from under a live handle";
  const auto ref = ag::evaluate_reference(p->source(), in).value();
  EXPECT_TRUE(ag::compare(still->front(), ref.front(), 1e-4, 1e-3).ok);
  EXPECT_TRUE(ag::compare(r->front(), ref.front(), 1e-4, 1e-3).ok);
  // A handle assigned over and a moved-from one count right: the last one
  // left moves again.
  ag::job a = rt->submit(p, in);
  ag::job b;
  b = a;                  // two handles
  ag::job c = std::move(a);  // still two (a is empty)
  b = ag::job{};          // one
  std::atomic<const std::byte*> written{nullptr};
  c.then([&written](const ag::job_result& res) {
    if (res) written = res->front().data();
  });
  const ag::job_result moved = std::move(c).wait();
  ASSERT_TRUE(moved.has_value()) << moved.err().to_string();
  EXPECT_EQ(moved->front().data(), written.load());
}

TEST(Completion, RuntimeTornDownRightAfterTheLastWait) {
  // The handle becomes ready before the job actor has released its memory;
  // destroying the runtime at once must wait for that, not race it (ASan).
  for (int round = 0; round < 10; ++round) {
    auto rt = ag::runtime::create("sim:2").value();
    auto p = small_plan(*rt);
    auto j = rt->submit(p, {ag::host_tensor::random_normal(ag::dtype::f32, {16, 32}, 7)});
    ASSERT_TRUE(j.wait_for(20s));
    ASSERT_TRUE(j.wait().has_value()) << j.wait().err().to_string();
    rt.reset();
    EXPECT_EQ(j.state(), ag::job_state::done);
  }
}

TEST(Completion, JobsStartInSubmissionOrderUnderBackPressure) {
  ag::runtime_options o;
  o.arenas_per_device = 1;
  o.backend.sim.time_scale = 0.05;  // each job holds the arena for a moment
  auto rt = ag::runtime::create("sim:2", o).value();
  auto p = small_plan(*rt);
  std::vector<std::vector<ag::host_tensor>> ins;
  for (uint64_t i = 0; i < 12; ++i) ins.push_back({ag::host_tensor::random_normal(ag::dtype::f32, {16, 32}, i)});
  auto jobs = rt->submit_batch(p, ins);
  for (auto& j : jobs) ASSERT_TRUE(j.wait_for(30s));
  for (std::size_t i = 1; i < jobs.size(); ++i) {
    ASSERT_TRUE(jobs[i].wait().has_value()) << jobs[i].wait().err().to_string();
    EXPECT_LT(jobs[i - 1].times().started_ns, jobs[i].times().started_ns)
        << "job " << i << " started before job " << i - 1 << " although submitted after it";
  }
}

}  // namespace
