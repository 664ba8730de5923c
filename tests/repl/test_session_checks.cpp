// Reference checks that take long: the run says so up front with an
// estimate, `wait` says what it is waiting for, and an interrupt during
// `wait` (Ctrl-C) stops waiting and stops the checks; the session goes on.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <thread>

#include "session_fixture.hpp"

using namespace ag::repl;
using namespace ag::repl::test_support;

namespace {

// Three 1536^3 matmuls: 21.7 GFLOP per job. The sim computes them with BLAS
// in a second or so; the reference evaluator (double accumulation, one
// thread, a few GFLOP/s at best) needs many seconds for them.
const char* const heavy_graph =
    "graph x=input[1536,1536] a=weight[1536,1536] b=weight[1536,1536] c=weight[1536,1536] "
    "y=matmul(matmul(matmul(x,a),b),c) out y";

}  // namespace

TEST(ReplChecks, ALongCheckSaysSoUpFrontAndAnInterruptedWaitStopsIt) {
  fixture f;
  f.ok({"devices sim:1 scale=0", heavy_graph});
  ASSERT_EQ(f.run("run n=1 check=all"), exec_status::ok) << f.text;
  EXPECT_TRUE(has(f.text, "note: the reference check of 1 job takes about ")) << f.text;
  EXPECT_TRUE(has(f.text, "21.7 GFLOP per job")) << f.text;
  EXPECT_TRUE(has(f.text, "Ctrl-C stops waiting and the check")) << f.text;

  // Ctrl-C during `wait`: interrupt() until the wait returns (the first one
  // may come before the wait started, which clears it).
  std::atomic<bool> returned{false};
  std::thread ctrl_c([&] {
    const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    while (!returned.load() && std::chrono::steady_clock::now() < give_up) {
      f.s.interrupt();
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  });
  f.out.str("");
  const bool all_done = f.s.wait_all();
  returned.store(true);
  ctrl_c.join();
  const std::string waited = f.out.str();
  EXPECT_FALSE(all_done) << waited;
  EXPECT_TRUE(has(waited, "^C: back to the prompt; ")) << waited;
  EXPECT_TRUE(has(waited, "stopped the reference check of 1 job")) << waited;

  // The stopped check reports at once; nothing waits for the reference now.
  ASSERT_TRUE(f.s.wait_all()) << f.out.str();
  ASSERT_EQ(f.run("jobs"), exec_status::ok);
  EXPECT_TRUE(has(f.text, "1 done")) << f.text;
  EXPECT_TRUE(has(f.text, "check: stopped")) << f.text;
  EXPECT_FALSE(has(f.text, "check: ok")) << f.text;
}

TEST(ReplChecks, AStoppedCheckCountsAsNeitherOkNorBadAndLaterRunsAreCheckedAgain) {
  fixture f;
  f.ok({"devices sim:1 scale=0", heavy_graph, "run n=1 check=all"});
  std::atomic<bool> returned{false};
  std::thread ctrl_c([&] {
    const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    while (!returned.load() && std::chrono::steady_clock::now() < give_up) {
      f.s.interrupt();
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  });
  f.s.wait_all();
  returned.store(true);
  ctrl_c.join();
  f.out.str("");
  ASSERT_TRUE(f.s.wait_all());
  EXPECT_TRUE(has(f.out.str(), "checks: 0 ok, 0 bad, 1 stopped")) << f.out.str();
  // A new run's checks are not stopped by the old Ctrl-C.
  f.ok({small_gpt2, "run n=2", "wait"});
  EXPECT_EQ(count(f.text, "check: ok"), 2) << f.text;
}

TEST(ReplChecks, QuickChecksSayNothingUpFront) {
  fixture f;
  f.ok({small_gpt2});
  ASSERT_EQ(f.run("run n=2"), exec_status::ok);
  EXPECT_FALSE(has(f.text, "note:")) << f.text;
  ASSERT_EQ(f.run("wait"), exec_status::ok);
  EXPECT_FALSE(has(f.text, "waiting for the reference check")) << f.text;
  EXPECT_EQ(count(f.text, "check: ok"), 2) << f.text;
}
