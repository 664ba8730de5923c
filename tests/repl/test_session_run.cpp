// The REPL's commands against a real runtime on simulated GPUs: runs,
// reports with reference checks, timeline, trace export, cancel, quit.
#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <sstream>

#include "session_fixture.hpp"

using namespace ag::repl;
using namespace ag::repl::test_support;

TEST(ReplRun, BatchReportsEveryJobWithAReferenceCheck) {
  fixture f;
  f.ok({"devices sim:2 scale=0.01", small_gpt2});
  ASSERT_EQ(f.run("run n=3"), exec_status::ok) << f.text;
  EXPECT_TRUE(has(f.text, "submitted 3 jobs")) << f.text;
  ASSERT_EQ(f.run("wait"), exec_status::ok);
  EXPECT_EQ(count(f.text, "check: ok (max err"), 3) << f.text;
  EXPECT_TRUE(has(f.text, "[run 1] 3/3 done")) << f.text;
  EXPECT_TRUE(has(f.text, "checks: 3 ok, 0 bad")) << f.text;
  EXPECT_EQ(f.s.jobs_running(), 0);
  ASSERT_EQ(f.run("jobs"), exec_status::ok);
  EXPECT_TRUE(has(f.text, "3 jobs: 0 queued, 0 running, 3 done")) << f.text;
}

TEST(ReplRun, LlamaWithGroupedQueryAttentionChecksOk) {
  fixture f;
  f.ok({"model llama layers=2 d=32 heads=4 kv=2 ff=48 seq=8 vocab=64", "run n=2", "wait"});
  EXPECT_EQ(count(f.text, "check: ok"), 2) << f.text;
}

TEST(ReplRun, CustomGraphWithTokenIdsRunsAndChecks) {
  fixture f;
  f.ok({"graph t=weight[50,16] ids=input[6]:i32 e=get_rows(t,ids) w=weight[16,16] y=silu(matmul(e,w)) out y",
        "run n=2 check=all", "wait"});
  EXPECT_EQ(count(f.text, "check: ok"), 2) << f.text;
}

TEST(ReplRun, PlanShowsBothStagesAndSetChangesIt) {
  fixture f;
  f.ok({small_gpt2});
  ASSERT_EQ(f.run("plan stages=2"), exec_status::ok) << f.text;
  EXPECT_TRUE(has(f.text, "sim0")) << f.text;
  EXPECT_TRUE(has(f.text, "sim1")) << f.text;
  EXPECT_TRUE(has(f.text, "peer '")) << f.text;  // the activation crosses devices
  ASSERT_EQ(f.run("plan stages=1"), exec_status::ok) << f.text;
  EXPECT_FALSE(has(f.text, "peer '")) << f.text;
  ASSERT_EQ(f.run("set"), exec_status::ok);
  EXPECT_TRUE(has(f.text, "stages=1")) << f.text;
}

TEST(ReplRun, TimelineUtilAndTraceShowTheLastRun) {
  fixture f;
  f.ok({"devices sim:2 scale=0.5", small_gpt2, "set stages=2", "run n=4 check=off", "wait"});
  ASSERT_EQ(f.run("timeline width=60"), exec_status::ok);
  EXPECT_TRUE(has(f.text, "sim0 compute0 |")) << f.text;
  EXPECT_TRUE(has(f.text, "sim1 compute0 |")) << f.text;
  EXPECT_TRUE(has(f.text, "4 jobs")) << f.text;
  ASSERT_EQ(f.run("util"), exec_status::ok);
  EXPECT_TRUE(has(f.text, "sim1 compute")) << f.text;
  const ag::trace t = f.s.last_trace();
  ASSERT_FALSE(t.records.empty());
  for (const auto& r : t.records) {
    EXPECT_GE(r.end_ns, r.start_ns);
    EXPECT_LT(r.device, 2);
  }
  const std::string path = ::testing::TempDir() + "repl_trace.json";
  ASSERT_EQ(f.run("trace " + path), exec_status::ok) << f.text;
  std::ifstream in(path);
  std::stringstream body;
  body << in.rdbuf();
  EXPECT_EQ(body.str(), t.to_chrome_json());
  EXPECT_FALSE(body.str().empty());
  std::remove(path.c_str());
  EXPECT_TRUE(f.rejects("trace /nonexistent-dir/x.json", "cannot write '/nonexistent-dir/x.json'"));
  EXPECT_TRUE(f.rejects("timeline batch=7", "no run 7"));
}

TEST(ReplRun, CancelAllStopsALongBatchAndTheRuntimeKeepsServing) {
  fixture f;
  f.ok({"devices sim:2 scale=200 arenas=2", small_gpt2, "run n=60 check=off"});
  ASSERT_EQ(f.run("devices sim:3"), exec_status::failed);  // jobs are running
  EXPECT_TRUE(has(f.text, "jobs are running")) << f.text;
  ASSERT_EQ(f.run("cancel all"), exec_status::ok);
  EXPECT_TRUE(has(f.text, "cancelling")) << f.text;
  ASSERT_EQ(f.run("wait"), exec_status::ok);
  EXPECT_TRUE(has(f.text, "cancelled")) << f.text;
  EXPECT_EQ(f.s.jobs_running(), 0);
  f.ok({"devices sim:2 scale=0.01", "run n=2", "wait"});
  EXPECT_EQ(count(f.text, "check: ok"), 2) << f.text;
}

TEST(ReplRun, CancelOneJobAndShowIt) {
  fixture f;
  f.ok({"devices sim:1 scale=200 arenas=1", small_gpt2, "run n=4 check=off"});
  ASSERT_EQ(f.run("cancel 4"), exec_status::ok) << f.text;
  f.ok({"wait"});
  ASSERT_EQ(f.run("job 4"), exec_status::ok);
  EXPECT_TRUE(has(f.text, "job 4 (run 1, #3)")) << f.text;
  ASSERT_EQ(f.run("job 1"), exec_status::ok);
  EXPECT_TRUE(has(f.text, "output 0: f32 [1, 8, 64]")) << f.text;
}

TEST(ReplRun, LargeBatchShowsProgressInsteadOfEveryJob) {
  fixture f;
  f.ok({"devices sim:2 scale=0.01", small_gpt2, "run n=40 check=off", "wait"});
  EXPECT_GE(count(f.text, "[run 1] ["), 1) << f.text;  // a progress line
  EXPECT_EQ(count(f.text, "[job "), 0) << f.text;
  EXPECT_TRUE(has(f.text, "[run 1] 40/40 done")) << f.text;
}

TEST(ReplRun, QuitWaitsForRunningJobsWhenNotInteractive) {
  fixture f;
  f.ok({small_gpt2, "run n=3 check=off"});
  EXPECT_EQ(f.run("quit"), exec_status::quit);
  EXPECT_EQ(f.s.jobs_running(), 0);
  EXPECT_TRUE(has(f.text, "[run 1] 3/3 done")) << f.text;
}

TEST(ReplRun, JobIdsStayUniqueWhenTheDevicesChange) {
  fixture f;
  f.ok({"devices sim:2 scale=0.01", small_gpt2, "run n=2 check=off", "wait", "devices sim:3 scale=0.01", "run n=2 check=off",
        "wait"});
  ASSERT_EQ(f.run("jobs"), exec_status::ok);
  EXPECT_TRUE(has(f.text, "4 jobs:")) << f.text;
  for (const char* id : {"job 1 ", "job 2 ", "job 3 ", "job 4 "}) EXPECT_TRUE(has(f.text, id)) << f.text;
  // The second run's timeline holds its own two jobs on the new devices only.
  ASSERT_EQ(f.run("timeline"), exec_status::ok);
  EXPECT_TRUE(has(f.text, "0=3 1=4")) << f.text;
  ASSERT_EQ(f.run("timeline batch=1"), exec_status::ok);
  EXPECT_TRUE(has(f.text, "0=1 1=2")) << f.text;
  for (const auto& r : f.s.last_trace().records) EXPECT_TRUE(r.job == 3 || r.job == 4) << r.job;
}

TEST(ReplRun, CudaWithoutAGpuIsAnErrorAndTheOldDevicesStay) {
  if (ag::gpu::cuda_available()) GTEST_SKIP() << "a GPU is usable here: 'devices cuda:all' would succeed";
  fixture f;
  f.ok({"devices sim:2 scale=0.01"});
  EXPECT_TRUE(f.rejects("devices cuda:all", "error: bad_device_spec"));
  f.ok({small_gpt2, "run n=1", "wait"});
  EXPECT_TRUE(has(f.text, "check: ok")) << f.text;
}

// Tensor parallelism from the REPL: `set tp=2` (and ratios, and stages x tp)
// changes the plan, `plan` shows split states and collectives, a run checks
// ok against the reference, `timeline` has the communication lanes, and the
// Chrome trace names each collective with its bytes and algorithm.
TEST(ReplRun, TensorParallelSetPlanRunTimelineAndTrace) {
  fixture f;
  f.ok({"model llama layers=2 d=32 heads=4 kv=2 ff=48 seq=8 vocab=64"});
  ASSERT_EQ(f.run("set tp=2"), exec_status::ok) << f.text;
  EXPECT_TRUE(has(f.text, "tp=2")) << f.text;
  ASSERT_EQ(f.run("plan"), exec_status::ok) << f.text;
  EXPECT_TRUE(has(f.text, "tensor parallel: 1 stage(s) x 2 device(s)")) << f.text;
  EXPECT_TRUE(has(f.text, "sharded dim 0")) << f.text;
  EXPECT_TRUE(has(f.text, "coll  #")) << f.text;
  EXPECT_TRUE(has(f.text, "all_reduce 'l1.attn.o_proj'")) << f.text;
  ASSERT_EQ(f.run("run n=2 check=all"), exec_status::ok) << f.text;
  ASSERT_EQ(f.run("wait"), exec_status::ok);
  EXPECT_EQ(count(f.text, "check: ok"), 2) << f.text;
  ASSERT_EQ(f.run("timeline width=60"), exec_status::ok);
  EXPECT_TRUE(has(f.text, "sim0 comm")) << f.text;
  EXPECT_TRUE(has(f.text, "sim1 comm")) << f.text;
  const ag::trace t = f.s.last_trace();
  int collectives = 0;
  for (const auto& r : t.records)
    if (r.lane == "comm") {
      ++collectives;
      EXPECT_TRUE(has(r.label, "(all_reduce, ")) << r.label;
      EXPECT_TRUE(has(r.label, " B)")) << r.label;
      EXPECT_TRUE(has(r.label, "one-shot") || has(r.label, "ring")) << r.label;
    }
  EXPECT_GT(collectives, 0);
  EXPECT_TRUE(has(t.to_chrome_json(), "all_reduce, ")) << "the Chrome trace names the collectives";
  // Uneven shares, and 2 x 2 pipeline x tensor on four devices.
  ASSERT_EQ(f.run("set ratios=3,1"), exec_status::ok) << f.text;
  EXPECT_TRUE(has(f.text, "ratios=3,1")) << f.text;
  ASSERT_EQ(f.run("plan"), exec_status::ok) << f.text;
  EXPECT_TRUE(has(f.text, "shares 0.75 0.25")) << f.text;
  ASSERT_EQ(f.run("set ratios=1,2,3"), exec_status::failed);
  EXPECT_TRUE(has(f.text, "3 entries for tp=2")) << f.text;
  ASSERT_EQ(f.run("set ratios=3,x"), exec_status::failed);
  EXPECT_TRUE(has(f.text, "'x'")) << f.text;
  f.ok({"devices sim:4 scale=0.01", "model gpt2 layers=4 d=32 heads=4 ff=64 seq=8 vocab=64", "set stages=2 tp=2"});
  ASSERT_EQ(f.run("plan"), exec_status::ok) << f.text;
  EXPECT_TRUE(has(f.text, "tensor parallel: 2 stage(s) x 2 device(s)")) << f.text;
  f.ok({"run n=2 check=all", "wait"});
  EXPECT_EQ(count(f.text, "check: ok"), 2) << f.text;
  // A degree the devices cannot hold is refused at compile time, naming it.
  ASSERT_EQ(f.run("plan stages=1 tp=8"), exec_status::failed) << f.text;
  EXPECT_TRUE(has(f.text, "8")) << f.text;
}

// set sp=on: the blocks reduce-scatter and all-gather by rows (plan and
// trace say so) and the results still check; a bad value is refused.
TEST(ReplRun, SequenceParallelSetPlanRunAndTrace) {
  fixture f;
  f.ok({"model llama layers=2 d=32 heads=4 kv=2 ff=48 seq=8 vocab=64"});
  ASSERT_EQ(f.run("set tp=2 sp=on"), exec_status::ok) << f.text;
  EXPECT_TRUE(has(f.text, "tp=2 sp=on")) << f.text;
  ASSERT_EQ(f.run("plan"), exec_status::ok) << f.text;
  EXPECT_TRUE(has(f.text, "reduce_scatter 'l1.attn.o_proj'")) << f.text;
  EXPECT_TRUE(has(f.text, "all_gather 'l1.mlp_norm'")) << f.text;
  EXPECT_FALSE(has(f.text, "all_reduce 'l1.attn.o_proj'")) << f.text;
  ASSERT_EQ(f.run("run n=2 check=all"), exec_status::ok) << f.text;
  ASSERT_EQ(f.run("wait"), exec_status::ok);
  EXPECT_EQ(count(f.text, "check: ok"), 2) << f.text;
  int scatters = 0;
  for (const auto& r : f.s.last_trace().records) scatters += has(r.label, "(reduce_scatter, ");
  EXPECT_GT(scatters, 0);
  ASSERT_EQ(f.run("set sp=maybe"), exec_status::failed) << f.text;
  EXPECT_TRUE(has(f.text, "sp: 'maybe' is not on, off or auto")) << f.text;
  ASSERT_EQ(f.run("set sp=off"), exec_status::ok) << f.text;
  ASSERT_EQ(f.run("plan"), exec_status::ok) << f.text;
  EXPECT_TRUE(has(f.text, "all_reduce 'l1.attn.o_proj'")) << f.text;
}
