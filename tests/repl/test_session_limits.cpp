// What the REPL refuses before it allocates anything, with the size it would
// need: inputs too big for the host or the devices, shapes whose byte size
// overflows 64 bits, weights too big to draw, graph and script files that
// never end; and the syntax error of `input(4, 8)`.
#include <gtest/gtest.h>

#include <sstream>
#include <string>

#include "apps/repl/memory_budget.hpp"
#include "session_fixture.hpp"

using namespace ag::repl;
using namespace ag::repl::test_support;

namespace {

// Elements of an f32 tensor as big as this host's memory: a job with it as
// input and output can never fit, whatever the host.
std::string host_sized_elements() {
  return std::to_string(static_cast<long long>(host_memory_bytes() / 4) + 1);
}

}  // namespace

TEST(ReplLimits, InputTooBigForTheHostIsRefusedAtRunWithTheSizeItWouldNeed) {
  fixture f;
  // Devices with room for it (1 PB each) and timing only: only the host's
  // side of the jobs (their input and output tensors) is too big. One job
  // (input and output, a third of the host each) fits; four do not.
  f.ok({"devices sim:2 mem=1000T values=off"});
  const std::string third = std::to_string(static_cast<long long>(host_memory_bytes() / 12) + 1);
  ASSERT_EQ(f.run("graph x=input[" + third + "] y=gelu(x) out y"), exec_status::ok) << f.text;
  EXPECT_TRUE(f.rejects("run n=4", "run n=4 would take "));
  EXPECT_TRUE(has(f.text, "of host memory (job inputs ")) << f.text;
  EXPECT_TRUE(has(f.text, "nothing was allocated")) << f.text;
  EXPECT_FALSE(has(f.text, "usage:")) << f.text;  // not a typing mistake
  ASSERT_EQ(f.run("jobs"), exec_status::ok);
  EXPECT_TRUE(has(f.text, "0 jobs:")) << f.text;
  // A job that cannot fit the host even alone is refused by the planner,
  // with the bytes it needs and the largest tensor.
  ASSERT_EQ(f.run("graph x=input[" + host_sized_elements() + "] y=gelu(x) out y"), exec_status::ok) << f.text;
  EXPECT_TRUE(f.rejects("run n=1", "bytes of host memory, more than this host's " + std::to_string(ag::host_memory_bytes())));
  EXPECT_TRUE(has(f.text, "the largest is input 0 'x' f32 [" + host_sized_elements() + "]")) << f.text;
  // The session goes on.
  f.ok({small_gpt2, "run n=1", "wait"});
  EXPECT_TRUE(has(f.text, "[run 1] 1/1 done")) << f.text;
}

TEST(ReplLimits, DevicesInHostMemoryThatWouldNotFitAreRefusedBeforeThePlanLoads) {
  fixture f;
  // Sim devices that compute values keep their arenas in host memory, so
  // their memory is capped at the host's whatever `mem=` says: the planner
  // refuses the plan with the bytes it needs and the bytes there are.
  f.ok({"devices sim:2 mem=1000T"});
  ASSERT_EQ(f.run("graph x=input[" + host_sized_elements() + "] y=gelu(x) out y"), exec_status::ok) << f.text;
  EXPECT_TRUE(f.rejects("plan", "error: device 0 ('sim0') needs "));
  EXPECT_TRUE(has(f.text, "but has " + std::to_string(ag::host_memory_bytes()))) << f.text;
  EXPECT_TRUE(f.rejects("run", "error: device 0 ('sim0') needs "));
}

TEST(ReplLimits, InputTooBigForTheDevicesIsRefusedByThePlannerWithTheBytes) {
  fixture f;
  // 48 GB per tensor on 40 GB timing-only sim devices: x and y do not fit together.
  f.ok({"devices sim:2 mem=40G values=off"});
  ASSERT_EQ(f.run("graph x=input[12000000000] y=gelu(x) out y"), exec_status::ok) << f.text;
  EXPECT_TRUE(f.rejects("run", "error: device 0 ('sim0') needs 96000000000 bytes"));
  EXPECT_TRUE(has(f.text, "but has 40000000000")) << f.text;
}

TEST(ReplLimits, ShapesWhoseByteSizeOverflows64BitsAreErrorsNotCrashes) {
  fixture f;
  EXPECT_EQ(f.run("graph x=input[2147483648,2147483648] y=gelu(x) out y"), exec_status::failed);
  EXPECT_TRUE(has(f.text, "col 9: 'input' of 2147483648 x 2147483648 f32 = 16.00 EiB, more than a 64-bit byte count holds"))
      << f.text;
  EXPECT_TRUE(f.rejects("graph w=weight[4294967296,4294967296]:f16 out w", "more than a 64-bit byte count holds"));
  // Leaves that fit, a product that does not: 2^61 elements of 4 bytes.
  EXPECT_EQ(f.run("graph a=input[2147483648,1] b=input[1,1073741824] y=matmul(a,b) out y"), exec_status::failed);
  EXPECT_TRUE(has(f.text, "matmul 'y': f32 [2147483648, 1073741824] needs 9223372036854775808 bytes, more than the"))
      << f.text;
  // A dimension no int64 holds.
  EXPECT_TRUE(f.rejects("graph x=input[99999999999999999999] out x", "col 15: dimension 99999999999999999999 does not fit in 64 bits"));
  EXPECT_EQ(f.run("help"), exec_status::ok);
}

TEST(ReplLimits, WeightsTooBigToDrawAreRefusedBeforeDrawingThem) {
  fixture f;
  const std::string n = std::to_string(static_cast<long long>(host_memory_bytes() / 8) + 1);  // half the host in f32
  EXPECT_TRUE(f.rejects("graph x=input[1," + n + "] w=weight[" + n + "] y=mul(x,w) out y", "weight 'w' [" + n + "] f32 takes "));
  EXPECT_TRUE(has(f.text, "more than this host can build")) << f.text;
}

TEST(ReplLimits, InputWithParenthesesShowsTheBracketSyntax) {
  fixture f;
  EXPECT_TRUE(f.rejects("graph x = input(4, 8)", "error: col 11: 'input' takes its dims in square brackets: input[4,8], not input(...)"));
  EXPECT_TRUE(has(f.text, "usage: graph <name=expr ...> out <name> | graph @<file>")) << f.text;
  EXPECT_TRUE(has(f.text, "example: graph x=input[8,64] w=weight[64,64] y=gelu(matmul(x,w)) out y")) << f.text;
  EXPECT_TRUE(f.rejects("graph w = weight y=gelu(w) out y", "'weight' needs its dims in square brackets, e.g. weight[8,64]"));
  EXPECT_EQ(f.run("help graph"), exec_status::ok);
  EXPECT_TRUE(has(f.text, "input[d0,d1,...]")) << f.text;
}

TEST(ReplLimits, GraphAndScriptFilesThatNeverEndAreRefusedWithTheLimit) {
  fixture f;
  EXPECT_TRUE(f.rejects("graph @/dev/zero", "'/dev/zero' is larger than 1.00 MiB: not a script or graph file"));
  EXPECT_TRUE(f.rejects("source /dev/zero", "'/dev/zero' is larger than 16.00 MiB"));
  EXPECT_TRUE(f.rejects("graph @/", "'/' is a directory"));
  // A pipe that sends one endless line (`actorgraph < /dev/zero`).
  std::ostringstream out;
  session s(out, fixture::opts());
  std::istringstream in("echo before\n" + std::string(2u << 20, 'x') + "\necho after\n");
  EXPECT_EQ(run_script(s, in, out, true), 1);
  EXPECT_TRUE(has(out.str(), "before\n")) << out.str().substr(0, 200);
  EXPECT_TRUE(has(out.str(), "error: line 2 is longer than 1.00 MiB: not a script; stopping")) << out.str().substr(0, 400);
  EXPECT_FALSE(has(out.str(), "after")) << out.str().substr(0, 400);
}
