// The REPL's commands driven in-process: every error path of the command
// parser, help, completion and script mode (no devices needed for these).
#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <sstream>

#include "session_fixture.hpp"

using namespace ag::repl;
using namespace ag::repl::test_support;

TEST(ReplCommands, UnknownCommandSaysSoAndSuggests) {
  fixture f;
  EXPECT_TRUE(f.rejects("frobnicate 3", "error: unknown command 'frobnicate'"));
  EXPECT_TRUE(has(f.text, "'help'")) << f.text;
  EXPECT_TRUE(f.rejects("modle gpt2", "did you mean 'model'"));
}

TEST(ReplCommands, MissingParameterPrintsReasonAndUsage) {
  fixture f;
  EXPECT_TRUE(f.rejects("model", "error: which model? gpt2 or llama"));
  EXPECT_TRUE(has(f.text, "usage: model gpt2|llama")) << f.text;
  EXPECT_TRUE(f.rejects("job", "one job id expected"));
  EXPECT_TRUE(f.rejects("trace", "one file name expected"));
  EXPECT_TRUE(f.rejects("graph", "no expression"));
  EXPECT_TRUE(has(f.text, "usage: graph")) << f.text;
}

TEST(ReplCommands, BadNumbersAndUnknownParametersAreRejected) {
  fixture f;
  EXPECT_TRUE(f.rejects("set stages=abc", "error: stages: 'abc' is not a number"));
  EXPECT_TRUE(has(f.text, "usage: set")) << f.text;
  EXPECT_TRUE(f.rejects("set microbatches=0", "out of range"));
  EXPECT_TRUE(f.rejects("set lanes=1.5", "whole number"));
  EXPECT_TRUE(f.rejects("run bogus=1", "unknown parameter 'bogus'"));
  EXPECT_TRUE(f.rejects("run 16", "did you mean n=16"));
  EXPECT_TRUE(f.rejects("set check=sometimes", "not one of auto, all, first, off"));
  EXPECT_TRUE(f.rejects("devices sim:2 jitter=-1", "jitter"));
  EXPECT_TRUE(f.rejects("devices sim:2 latency=5parsecs", "latency"));
  EXPECT_TRUE(f.rejects("run n=", "no value after '='"));
  // Settings survive the failed attempts.
  EXPECT_EQ(f.run("set"), exec_status::ok);
  EXPECT_TRUE(has(f.text, "microbatches=16 lanes=auto")) << f.text;
}

// lanes=auto (the default) and lanes=N reach the plan's options.
TEST(ReplCommands, SetLanesAutoOrACountReachesThePlan) {
  fixture f;
  ASSERT_EQ(f.run("devices sim:1"), exec_status::ok) << f.text;
  ASSERT_EQ(f.run("model gpt2 layers=1 d=64 heads=2 ff=128 seq=8 batch=1"), exec_status::ok) << f.text;
  ASSERT_EQ(f.run("plan"), exec_status::ok) << f.text;
  EXPECT_TRUE(has(f.text, "auto lanes")) << f.text;
  ASSERT_EQ(f.run("set lanes=2"), exec_status::ok) << f.text;
  ASSERT_EQ(f.run("plan"), exec_status::ok) << f.text;
  EXPECT_TRUE(has(f.text, "2 lane(s) per device allowed")) << f.text;
  ASSERT_EQ(f.run("set lanes=auto"), exec_status::ok) << f.text;
  ASSERT_EQ(f.run("set"), exec_status::ok);
  EXPECT_TRUE(has(f.text, "lanes=auto")) << f.text;
  EXPECT_TRUE(f.rejects("set lanes=0", "out of range"));
}

// joblanes=auto (the default) and joblanes=N reach the plan's options
// (describe() says what was asked), and a run with them equals the reference.
TEST(ReplCommands, SetJobLanesReachesThePlanAndRunsEqualTheReference) {
  fixture f;
  ASSERT_EQ(f.run("devices sim:2"), exec_status::ok) << f.text;
  ASSERT_EQ(f.run("model llama layers=1 d=64 heads=4 ff=128 seq=8 batch=1"), exec_status::ok) << f.text;
  ASSERT_EQ(f.run("set tp=2 joblanes=2 microbatches=6 check=all"), exec_status::ok) << f.text;
  ASSERT_EQ(f.run("set"), exec_status::ok);
  EXPECT_TRUE(has(f.text, "lanes=auto joblanes=2")) << f.text;
  ASSERT_EQ(f.run("plan"), exec_status::ok) << f.text;
  EXPECT_TRUE(has(f.text, "job lanes: 2 asked")) << f.text;
  ASSERT_EQ(f.run("run"), exec_status::ok) << f.text;
  ASSERT_EQ(f.run("wait"), exec_status::ok) << f.text;
  EXPECT_TRUE(has(f.text, "6/6 done")) << f.text;
  EXPECT_TRUE(has(f.text, "checks: 6 ok, 0 bad")) << f.text;
  ASSERT_EQ(f.run("set joblanes=auto"), exec_status::ok) << f.text;
  ASSERT_EQ(f.run("set"), exec_status::ok);
  EXPECT_TRUE(has(f.text, "joblanes=auto")) << f.text;
  EXPECT_TRUE(f.rejects("set joblanes=9", "out of range"));
}

// Device specs are read by the library's own parser (gpu::parse_device_spec,
// make_devices' grammar): its message, after the column of the spec word.
TEST(ReplCommands, UnknownDeviceIsRejectedWithTheItem) {
  fixture f;
  EXPECT_TRUE(f.rejects("devices tpu:4", "error: col 9: device spec item 1 'tpu:4' at position 0: unknown device kind 'tpu'"));
  EXPECT_TRUE(has(f.text, "usage: devices")) << f.text;
  EXPECT_TRUE(f.rejects("devices sim:2,gpu:1", "device spec item 2 'gpu:1' at position 6: unknown device kind 'gpu'"));
  EXPECT_TRUE(f.rejects("devices sim", "'sim' at position 0: expected kind:count"));
  EXPECT_TRUE(f.rejects("devices sim:0", "zero count"));
  EXPECT_TRUE(f.rejects("devices sim:1,sim:2", "duplicate kind 'sim'"));
  EXPECT_TRUE(f.rejects("devices cpu:2 scale=5", "col 15: scale= applies to sim devices only"));
  EXPECT_TRUE(f.rejects("devices sim:2 cpu:2", "one device spec"));
}

TEST(ReplCommands, ModelWithBadDimsIsRejected) {
  fixture f;
  EXPECT_TRUE(f.rejects("model bert", "unknown model 'bert'"));
  EXPECT_TRUE(f.rejects("model gpt2 d=100 heads=3", "d_model 100"));
  EXPECT_TRUE(has(f.text, "usage: model")) << f.text;
  EXPECT_TRUE(f.rejects("model gpt2 layers=0", "layers: 0 is out of range"));
  EXPECT_TRUE(f.rejects("model llama heads=4 kv=3 d=64", "error:"));
  EXPECT_TRUE(f.rejects("model gpt2 dtype=q4", "dtype: 'q4'"));
  EXPECT_TRUE(f.rejects("model gpt2 dtype=i32", "cannot hold weights"));
  EXPECT_TRUE(f.rejects("model gpt2 layers=2 d=32 heads=2 head_dim=8 ff=64", "gpt2's heads split d_model"));
  EXPECT_TRUE(f.rejects("model llama layers=2 d=30 heads=4 head_dim=7", "head_dim 7 must be even"));
  EXPECT_EQ(f.run("model llama layers=2 d=30 heads=4 kv=2 head_dim=12 ff=64 seq=8 vocab=64"), exec_status::ok) << f.text;
  EXPECT_TRUE(has(f.text, "llama: 2 layers, d 30, 4 heads of 12 (2 kv)")) << f.text;
  EXPECT_EQ(f.run("model gpt2 layers=2 d=32 heads=2 ff=64 seq=8 vocab=64"), exec_status::ok) << f.text;
  EXPECT_TRUE(has(f.text, "gpt2: 2 layers, d 32")) << f.text;
  // Attention biases: llama's only, by name.
  EXPECT_TRUE(f.rejects("model llama layers=2 d=32 heads=2 bias=qkv_o_x", "bias: 'qkv_o_x' is not one of none, qkv"));
  EXPECT_TRUE(f.rejects("model gpt2 layers=2 d=32 heads=2 bias=qkv", "attn_bias is for llama models"));
  EXPECT_EQ(f.run("model llama layers=2 d=32 heads=4 kv=2 bias=qkv ff=64 seq=8 vocab=64"), exec_status::ok) << f.text;
  EXPECT_TRUE(has(f.text, "4 heads (2 kv) with q/k/v biases")) << f.text;
  EXPECT_EQ(f.run("model llama layers=2 d=32 heads=4 kv=2 qk_norm=1 ff=64 seq=8 vocab=64"), exec_status::ok) << f.text;
  EXPECT_TRUE(has(f.text, "4 heads (2 kv) with q/k norms")) << f.text;
  EXPECT_EQ(f.run("model llama layers=2 d=32 heads=4 qk_norm=2"), exec_status::failed);
  // A sliding window (Mistral's): llama's only.
  EXPECT_EQ(f.run("model llama layers=2 d=32 heads=4 kv=2 window=4 ff=64 seq=8 vocab=64"), exec_status::ok) << f.text;
  EXPECT_TRUE(has(f.text, "4 heads (2 kv) with a sliding window of 4")) << f.text;
  EXPECT_TRUE(f.rejects("model gpt2 layers=2 d=32 heads=2 window=4", "sliding_window is for llama models"));
}

// set replay= follows plan_options::graph_replay: refused when not
// on/off/auto, shown by set (auto by default), and the plan's description
// shows the segments (nothing with replay off).
TEST(ReplCommands, SetReplayIsValidatedAndReachesThePlan) {
  fixture f;
  EXPECT_TRUE(f.rejects("set replay=maybe", "replay: 'maybe' is not on, off or auto"));
  EXPECT_EQ(f.run("set"), exec_status::ok);
  EXPECT_TRUE(has(f.text, "replay=auto")) << f.text;
  EXPECT_EQ(f.run("model gpt2 layers=2 d=32 heads=2 ff=64 seq=8 vocab=64"), exec_status::ok) << f.text;
  EXPECT_EQ(f.run("plan"), exec_status::ok) << f.text;
  EXPECT_TRUE(has(f.text, "graph replay auto:")) << f.text;
  EXPECT_EQ(f.run("set replay=off"), exec_status::ok) << f.text;
  EXPECT_EQ(f.run("plan"), exec_status::ok) << f.text;
  EXPECT_FALSE(has(f.text, "graph replay")) << f.text;
  EXPECT_EQ(f.run("set replay=on"), exec_status::ok) << f.text;
  EXPECT_TRUE(has(f.text, "replay=on")) << f.text;
  EXPECT_EQ(f.run("plan"), exec_status::ok) << f.text;
  EXPECT_TRUE(has(f.text, "graph replay on:")) << f.text;
}

TEST(ReplCommands, GraphSyntaxErrorsGiveTheColumnOfTheTypedLine) {
  fixture f;
  EXPECT_EQ(f.run("graph x=input[8,64] y=gelu(x"), exec_status::failed);
  EXPECT_TRUE(has(f.text, "col 27")) << f.text;  // the '(' that is never closed
  EXPECT_TRUE(has(f.text, "usage: graph")) << f.text;
  EXPECT_TRUE(f.rejects("graph x=input[8,64] w=weight[64,64] y=gelu(matmul(x,v)) out y", "col 53: unknown name 'v'"));
  EXPECT_TRUE(f.rejects("graph @/nonexistent/file.ag", "cannot read"));
  EXPECT_EQ(f.run("graph x=input[8,64] w=weight[64,64] y=gelu(matmul(x,w)) out y"), exec_status::ok) << f.text;
  EXPECT_TRUE(has(f.text, "x[8, 64] -> y[8, 64]")) << f.text;
}

TEST(ReplCommands, CommandsThatNeedAModelOrARunSaySo) {
  fixture f;
  EXPECT_TRUE(f.rejects("run", "no graph"));
  EXPECT_TRUE(f.rejects("plan", "no graph"));
  EXPECT_TRUE(f.rejects("timeline", "nothing has run yet"));
  EXPECT_TRUE(f.rejects("job 12345", "no job 12345"));
  EXPECT_TRUE(f.rejects("cancel x", "job id: 'x' is not a number"));
  EXPECT_TRUE(f.rejects("quit later", "quit wait"));
}

TEST(ReplCommands, HelpListsEveryCommandAndShowsAnExample) {
  fixture f;
  EXPECT_EQ(f.run("help"), exec_status::ok);
  for (const auto& c : commands()) EXPECT_TRUE(has(f.text, std::string("  ") + c.name)) << c.name;
  for (const auto& c : commands()) {
    EXPECT_EQ(f.run(std::string("help ") + c.name), exec_status::ok);
    EXPECT_TRUE(has(f.text, std::string("example: ") + c.example)) << f.text;
    EXPECT_TRUE(has(f.text, std::string("usage:   ") + c.usage)) << f.text;
  }
  EXPECT_TRUE(f.rejects("help nosuch", "no command 'nosuch'"));
}

// Every command of the table reaches its own handler: a parameter no
// command takes is refused by that command (with its usage), never as an
// unknown command.
TEST(ReplCommands, EveryCommandInTheTableIsDispatched) {
  fixture f;
  for (const auto& c : commands()) {
    const std::string name = c.name;
    f.run(name + " zzz=1");
    EXPECT_FALSE(has(f.text, "unknown command")) << name << "\n" << f.text;
    EXPECT_FALSE(has(f.text, "internal")) << name << "\n" << f.text;
    if (!c.own_syntax && name != "source") { EXPECT_TRUE(has(f.text, "usage: " + std::string(c.usage))) << name << "\n" << f.text; }
  }
}

TEST(ReplCommands, NothingTypedEndsTheSession) {
  fixture f;
  for (const char* line : {"", "   ", "#", "=", "\"", "run n=1e99", "set stages=-1", "devices ,", "devices sim:",
                           "graph )", "graph x=", "graph x=input[", "graph x=input[8]:", "model gpt2 d=", "job -1",
                           "timeline width=5", "source", "echo", "\x01\x02\x7f", "model llama layers=99999999999"})
    f.run(line);
  EXPECT_EQ(f.run("help"), exec_status::ok);
  EXPECT_TRUE(has(f.text, "commands")) << f.text;
}

TEST(ReplCompletion, CompletesCommandsKeysValuesAndFunctions) {
  fixture f;
  auto cands = [&](const std::string& line, std::size_t start) { return f.s.complete(line, start).candidates; };
  EXPECT_EQ(cands("mo", 0), std::vector<std::string>{"model"});
  auto m = cands("model ", 6);
  EXPECT_NE(std::find(m.begin(), m.end(), "gpt2"), m.end());
  EXPECT_NE(std::find(m.begin(), m.end(), "llama"), m.end());
  EXPECT_NE(std::find(m.begin(), m.end(), "layers="), m.end());
  EXPECT_EQ(cands("run check=a", 4), (std::vector<std::string>{"check=auto", "check=all"}));
  EXPECT_EQ(cands("help ru", 5), std::vector<std::string>{"run"});
  EXPECT_EQ(cands("graph x=input[8] y=gel", 17), std::vector<std::string>{"y=gelu("});
  EXPECT_EQ(cands("quit c", 5), std::vector<std::string>{"cancel"});
  // Keys already given are not offered again.
  auto s = cands("set stages=2 ", 13);
  EXPECT_EQ(std::find(s.begin(), s.end(), "stages="), s.end());
  EXPECT_NE(std::find(s.begin(), s.end(), "lanes="), s.end());
  EXPECT_TRUE(f.s.complete("source ex", 7).filenames);
  EXPECT_TRUE(cands("nosuch ", 7).empty());
}

TEST(ReplScript, EchoesCommandsAndStopsAtTheFirstFailure) {
  std::ostringstream out;
  session s(out, fixture::opts());
  std::istringstream in("echo one\n\nbogus\necho three\n");
  EXPECT_EQ(run_script(s, in, out, false), 1);
  const std::string t = out.str();
  EXPECT_TRUE(has(t, "> echo one\none\n")) << t;
  EXPECT_TRUE(has(t, "> bogus\nerror: unknown command 'bogus'")) << t;
  EXPECT_FALSE(has(t, "three")) << t;
  EXPECT_TRUE(has(t, "--keep-going")) << t;
}

TEST(ReplScript, KeepGoingRunsEverythingButStillFails) {
  std::ostringstream out;
  session s(out, fixture::opts());
  std::istringstream in("echo one\nbogus\necho three\n");
  EXPECT_EQ(run_script(s, in, out, true), 1);
  EXPECT_TRUE(has(out.str(), "> echo three\nthree\n")) << out.str();
}

TEST(ReplScript, CleanScriptExitsZeroAndQuitStopsReading) {
  std::ostringstream out;
  session s(out, fixture::opts());
  std::istringstream in("echo a\nquit\necho after\n");
  EXPECT_EQ(run_script(s, in, out, false), 0);
  EXPECT_FALSE(has(out.str(), "after")) << out.str();
}

TEST(ReplScript, SourceRunsAFileStopsAtErrorsAndPassesQuitOn) {
  const std::string path = ::testing::TempDir() + "repl_source.ag";
  {
    std::ofstream f(path);
    f << "echo from-file\nset microbatches=3\nbogus\necho never\n";
  }
  fixture f;
  EXPECT_TRUE(f.rejects("source " + path, "> echo from-file\nfrom-file"));
  EXPECT_TRUE(has(f.text, ":3: command failed")) << f.text;
  EXPECT_FALSE(has(f.text, "never")) << f.text;
  EXPECT_EQ(f.run("set"), exec_status::ok);
  EXPECT_TRUE(has(f.text, "microbatches=3")) << f.text;
  {
    std::ofstream q(path);
    q << "echo bye\nquit\necho never\n";
  }
  EXPECT_EQ(f.run("source " + path), exec_status::quit);
  EXPECT_FALSE(has(f.text, "never")) << f.text;
  EXPECT_TRUE(f.rejects("source /nonexistent/x.ag", "cannot read"));
  std::remove(path.c_str());
}

TEST(ReplCommands, ModelTooBigForThisHostIsRefusedBeforeBuilding) {
  fixture f;
  // 4096 layers at d 16384: terabytes of weights.
  EXPECT_TRUE(f.rejects("model llama layers=4096 d=16384 heads=128 ff=65536", "too big to build on this host"));
  EXPECT_EQ(f.run("help"), exec_status::ok);
}
