// The `fault` command: faults injected into a simulated GPU fail the jobs that
// use it with a report naming device, step and op, jobs on healthy devices
// still run and check against the reference, and the session stays usable.
// Also its parser errors (with columns), help and completion.
#include <gtest/gtest.h>

#include <algorithm>
#include <regex>
#include <sstream>

#include "session_fixture.hpp"

using namespace ag::repl;
using namespace ag::repl::test_support;

namespace {

bool contains(const std::vector<std::string>& v, const std::string& x) { return std::find(v.begin(), v.end(), x) != v.end(); }

// The first line of `text` that contains `part` (empty if none).
std::string line_with(const std::string& text, const std::string& part) {
  std::istringstream in(text);
  for (std::string l; std::getline(in, l);)
    if (has(l, part)) return l;
  return {};
}

}  // namespace

// cpu0 is device 0 and sim0 device 1, so `stages=2` pipelines over the faulty
// sim0 and `stages=1` keeps jobs on the healthy cpu0.
TEST(ReplFault, OpErrorFailsJobsNamingDeviceStepAndOpWhileHealthyJobsCheckOk) {
  std::ostringstream out;
  session s(out, fixture::opts());
  std::istringstream script(std::string("devices cpu:1,sim:1 scale=0.01\n") + small_gpt2 +
                            "\n"
                            "fault sim0 error\n"
                            "set stages=2\n"
                            "plan\n"
                            "run n=2\n"
                            "set stages=1\n"
                            "run n=3\n"
                            "wait\n"
                            "job 1\n"
                            "fault sim0 off\n"
                            "set stages=2\n"
                            "run n=2\n"
                            "wait\n");
  EXPECT_EQ(run_script(s, script, out, false), 0) << out.str();
  const std::string t = out.str();
  EXPECT_TRUE(has(t, "> fault sim0 error\nfaults on sim0: op errors in 100% of ops (devices cpu:1,sim:1 created again)")) << t;

  // The split that runs on sim0, as the plan describes it.
  std::smatch split;
  ASSERT_TRUE(std::regex_search(t, split, std::regex("device 1 'sim0' \\(sim\\)\n(?:  copy .*\n)*  split #(\\d+) lane 0 seq 0: (\\S+) \\.\\. (\\S+) ")))
      << t;
  const std::string step = split[1], first_op = split[2], last_op = split[3];
  // Every op on sim0 fails, so each job of run 1 fails at the split's first op.
  const std::string report = "failed: op_failed: device 'sim0' step " + step + " (compute0, " + first_op + ".." + last_op +
                             ") op '" + first_op + "' (";
  EXPECT_EQ(count(t, report), 2) << report << "\n" << t;
  EXPECT_EQ(count(t, "(injected fault)"), 3) << t;  // two reports and `job 1`
  EXPECT_TRUE(has(line_with(t, "[job 1] failed"), report)) << t;
  EXPECT_TRUE(has(line_with(t, "[job 2] failed"), report)) << t;
  // Failed jobs had nothing to compare: not counted as bad checks.
  const std::string run1 = line_with(t, "[run 1] ");
  EXPECT_TRUE(has(run1, "[run 1] 0/2 done, 2 failed in")) << t;
  EXPECT_FALSE(has(run1, "bad")) << run1;

  // Run 2, on the healthy cpu0 alone, at the same time: every job checks ok.
  for (const char* id : {"[job 3] done", "[job 4] done", "[job 5] done"})
    EXPECT_TRUE(has(line_with(t, id), "check: ok (max err")) << id << "\n" << t;
  EXPECT_TRUE(has(t, "[run 2] 3/3 done in")) << t;
  EXPECT_TRUE(has(line_with(t, "[run 2] 3/3"), "checks: 3 ok, 0 bad")) << t;

  // `job 1` shows the same error.
  EXPECT_TRUE(has(t, "job 1 (run 1, #0): failed\n")) << t;
  EXPECT_TRUE(has(line_with(t, "  error: "), "op_failed: device 'sim0' step " + step)) << t;
  EXPECT_TRUE(has(t, "  check: skipped (job failed)")) << t;

  // Faults off: the same pipeline over both devices runs and checks ok.
  EXPECT_TRUE(has(t, "> fault sim0 off\nfaults: none (devices cpu:1,sim:1 created again)")) << t;
  EXPECT_TRUE(has(line_with(t, "[run 3] "), "[run 3] 2/2 done in")) << t;
  EXPECT_TRUE(has(line_with(t, "[run 3] "), "checks: 2 ok, 0 bad")) << t;
  EXPECT_EQ(count(t, " failed: "), 2) << t;
}

TEST(ReplFault, DeadDeviceFailsItsJobsUntilFaultsAreTurnedOff) {
  fixture f;
  // sim0 runs 2 ops per job (ln_f, logits): it dies during the second job.
  f.ok({"devices cpu:1,sim:1 scale=0.01", small_gpt2, "set stages=2", "fault sim0 die 3", "run n=4"});
  ASSERT_EQ(f.run("wait"), exec_status::ok);
  std::smatch m;
  ASSERT_TRUE(std::regex_search(f.text, m, std::regex("\\[run 1\\] (\\d)/4 done, (\\d) failed in"))) << f.text;
  EXPECT_GE(std::stoi(m[2]), 2) << f.text;  // at least the jobs whose ops come after the third
  EXPECT_EQ(std::stoi(m[1]) + std::stoi(m[2]), 4) << f.text;
  // A job fails either at its step on sim0 or through the device's death notice: both name sim0.
  EXPECT_EQ(count(f.text, "] failed: device_failed: device 'sim0'"), std::stoi(m[2])) << f.text;
  EXPECT_EQ(count(f.text, "device 'sim0' died: died after 3 ops (injected fault)"), std::stoi(m[2])) << f.text;
  // A job submitted to a dead device fails at once; the prompt keeps working.
  f.ok({"run n=1"});
  ASSERT_EQ(f.run("wait"), exec_status::ok);
  EXPECT_TRUE(has(f.text, "[run 2] 0/1 done, 1 failed")) << f.text;
  EXPECT_TRUE(has(f.text, "failed: device_failed")) << f.text;
  // `die` without a count kills the device at once: the plan cannot load.
  f.ok({"fault sim0 die"});
  EXPECT_TRUE(has(f.text, "dies after 0 ops")) << f.text;
  EXPECT_TRUE(f.rejects("plan", "device 'sim0'"));
  EXPECT_TRUE(has(f.text, "dead")) << f.text;
  f.ok({"fault sim0 off", "run n=2", "wait"});
  EXPECT_TRUE(has(f.text, "[run 3] 2/2 done")) << f.text;
  EXPECT_TRUE(has(f.text, "checks: 2 ok, 0 bad")) << f.text;
}

TEST(ReplFault, StallDelaysEveryOpAndJobsStillCheckOk) {
  fixture f;
  f.ok({"devices cpu:1,sim:1 scale=0.01", small_gpt2, "set stages=2", "fault sim0 stall 1 seconds=25ms"});
  EXPECT_TRUE(has(f.text, "faults on sim0: stalls of 25 ms in 100% of ops")) << f.text;
  f.ok({"run n=1", "wait"});
  std::smatch m;
  ASSERT_TRUE(std::regex_search(f.text, m, std::regex("\\[job 1\\] done in ([0-9.]+) ms"))) << f.text;
  EXPECT_GE(std::stod(m[1]), 50.0) << f.text;  // two ops on sim0, each 25 ms late
  EXPECT_TRUE(has(f.text, "check: ok")) << f.text;
  // Kinds add up: a stall plus an error rate, shown by `fault` and `devices`.
  f.ok({"fault sim0 error 0.25", "fault"});
  EXPECT_EQ(f.text, "faults on sim0: op errors in 25% of ops; stalls of 25 ms in 100% of ops\n");
  f.ok({"devices"});
  EXPECT_TRUE(has(f.text, "\n  faults on sim0: op errors in 25% of ops; stalls of 25 ms in 100% of ops")) << f.text;
  // New devices start healthy.
  f.ok({"devices cpu:1,sim:1 scale=0.01"});
  EXPECT_FALSE(has(f.text, "faults")) << f.text;
  f.ok({"fault"});
  EXPECT_EQ(f.text, "faults: none\n");
}

TEST(ReplFault, SimMeansEverySimDeviceAndOneOfSeveralIsRefused) {
  fixture f;
  f.ok({"devices sim:2 scale=0.01"});
  EXPECT_TRUE(f.rejects("fault sim1 error", "error: col 7: 'sim1' is one of 2 sim devices"));
  EXPECT_TRUE(has(f.text, "'fault sim ...'")) << f.text;
  EXPECT_TRUE(has(f.text, "usage: fault")) << f.text;
  f.ok({"fault sim error", small_gpt2, "run n=2", "wait"});
  EXPECT_TRUE(has(f.text, "[run 1] 0/2 done, 2 failed")) << f.text;
  EXPECT_EQ(count(f.text, "failed: op_failed: device 'sim0' step "), 2) << f.text;
  f.ok({"fault"});
  EXPECT_EQ(f.text, "faults on sim0, sim1: op errors in 100% of ops\n");
}

TEST(ReplFault, BadInputSaysWhatWasWrongAndWhere) {
  fixture f;
  f.ok({"devices cpu:1,sim:1 scale=0.01"});
  struct bad_case {
    const char* line;
    const char* message;
  };
  for (const bad_case& c : {
           bad_case{"fault gpu9 error", "error: col 7: no device 'gpu9' (devices: cpu0, sim0; 'sim' = every sim device)"},
           bad_case{"fault cpu0 error", "error: col 7: 'cpu0' is a cpu device: faults can be injected into sim devices only"},
           bad_case{"fault sim0", "error: col 12: which fault? error, stall, die or off"},
           bad_case{"fault sim0 explode", "error: col 12: unknown fault kind 'explode' (expected error, stall, die or off)"},
           bad_case{"fault sim0 error 1.5", "error: col 18: rate: 1.5 is out of range [0, 1]"},
           bad_case{"fault  sim0 error lots", "error: col 19: rate: 'lots' is not a number"},
           bad_case{"fault sim0 stall -0.1", "error: col 18: rate: -0.1 is out of range [0, 1]"},
           bad_case{"fault sim0 die -1", "error: col 16: ops: -1 is out of range"},
           bad_case{"fault sim0 die 2.5", "error: col 16: ops: '2.5' is not a whole number"},
           bad_case{"fault sim0 off 3", "error: col 16: 'off' takes no value"},
           bad_case{"fault sim0 stall 0.5 1", "error: col 22: unexpected '1'"},
           bad_case{"fault sim0 error 0.5 seconds=1ms", "error: col 22: seconds= applies to 'stall' only"},
           bad_case{"fault sim0 stall 0.5 seconds=soon", "error: col 30: seconds: 'soon' is not a number"},
           bad_case{"fault sim0 error bogus=1", "error: unknown parameter 'bogus' (expected one of: seconds)"},
           bad_case{"fault seconds=1", "error: which device?"},
       }) {
    EXPECT_EQ(f.run(c.line), exec_status::failed) << c.line;
    EXPECT_TRUE(has(f.text, c.message)) << c.line << "\n" << f.text;
    EXPECT_TRUE(has(f.text, "usage: fault ")) << c.line << "\n" << f.text;
  }
  // None of them changed anything.
  f.ok({"fault"});
  EXPECT_EQ(f.text, "faults: none\n");
  f.ok({"devices cpu:2"});
  EXPECT_TRUE(f.rejects("fault sim error", "error: col 7: no sim devices here (devices: cpu0, cpu1)"));
}

TEST(ReplFault, RefusedWhileJobsRun) {
  fixture f;
  f.ok({"devices cpu:1,sim:1 scale=2000 arenas=1", small_gpt2, "set stages=2", "run n=20 check=off"});
  EXPECT_TRUE(f.rejects("fault sim0 error", "jobs are running: 'wait' or 'cancel all' before injecting faults"));
  EXPECT_FALSE(has(f.text, "usage:")) << f.text;  // not a usage error
  f.ok({"cancel all", "wait", "fault"});
  EXPECT_EQ(f.text, "faults: none\n");
}

TEST(ReplFault, HelpExplainsWhenFaultsApplyAndCompletionOffersDevicesAndKinds) {
  fixture f;
  f.ok({"help fault"});
  EXPECT_TRUE(has(f.text, "example: fault sim0 error 0.5")) << f.text;
  EXPECT_TRUE(has(f.text, "creates the\ndevices again")) << f.text;
  EXPECT_TRUE(has(f.text, "  die [ops] ")) << f.text;
  auto cands = [&](const std::string& line, std::size_t start) { return f.s.complete(line, start).candidates; };
  EXPECT_EQ(cands("fa", 0), std::vector<std::string>{"fault"});
  EXPECT_EQ(cands("help fa", 5), std::vector<std::string>{"fault"});
  f.ok({"devices cpu:1,sim:1 scale=0.01"});
  const auto devs = cands("fault ", 6);
  EXPECT_TRUE(contains(devs, "sim")) << devs.size();
  EXPECT_TRUE(contains(devs, "sim0")) << devs.size();
  EXPECT_FALSE(contains(devs, "cpu0")) << devs.size();  // faults go into sim devices only
  EXPECT_EQ(cands("fault sim0 ", 11), (std::vector<std::string>{"error", "stall", "die", "off"}));
  EXPECT_EQ(cands("fault sim0 st", 11), std::vector<std::string>{"stall"});
  EXPECT_EQ(cands("fault sim0 stall 0.5 ", 21), std::vector<std::string>{"seconds="});
  EXPECT_TRUE(cands("fault sim0 error 0.5 ", 21).empty());
  EXPECT_TRUE(cands("fault sim0 stall seconds=1 ", 27).empty());
}
