// The programs' one flag parser (apps/common/flags.hpp): --help lists the
// flags and exits 0; an unknown flag, a bad value or a stray word is named on
// standard error with exit status 2; flags keep their names and meanings.
#include <gtest/gtest.h>

#include <fstream>
#include <string>
#include <vector>

#include "run_program.hpp"

namespace {

using ag::repl::test_support::program_result;
using ag::repl::test_support::run_program;

bool has(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

struct program {
  const char* name;
  std::string path;
  std::vector<std::string> some_flags;  ///< flags its --help must list
  std::string bad_value;                ///< a known flag with a value it must refuse
};

std::vector<program> programs() {
  std::vector<program> p = {{"actorgraph", AG_REPL_BINARY, {"--script", "--init", "--keep-going", "--devices", "--no-readline", "-c"}, "--devices=tpu:1"}};
#ifdef AG_BIN_ACTORGRAPH_BENCH
  p.push_back({"actorgraph-bench", AG_BIN_ACTORGRAPH_BENCH, {"--devices", "--micro", "--stage-ms", "--dispatch-only"}, "--micro=abc"});
#endif
#ifdef AG_BIN_ACTORGRAPH_E2E_BENCH
  p.push_back({"actorgraph-e2e-bench", AG_BIN_ACTORGRAPH_E2E_BENCH, {"--devices", "--small", "--runs", "--skip-pipeline"}, "--dtype=q4"});
#endif
#ifdef AG_BIN_ACTORGRAPH_PLAN_DEMO
  p.push_back({"actorgraph-plan-demo", AG_BIN_ACTORGRAPH_PLAN_DEMO, {"--layers", "--devices", "--variant", "--dot"}, "--layers=0"});
#endif
#ifdef AG_BIN_ACTORGRAPH_TP_BENCH
  p.push_back({"actorgraph-tp-bench", AG_BIN_ACTORGRAPH_TP_BENCH, {"--devices", "--small", "--jobs", "--trace"}, "--jobs=abc"});
#endif
#ifdef AG_BIN_ACTORGRAPH_CUDA_BENCH
  p.push_back({"actorgraph-cuda-bench", AG_BIN_ACTORGRAPH_CUDA_BENCH, {"--quick"}, "--quick=maybe"});
#endif
  return p;
}

TEST(AppFlags, HelpListsTheFlagsAndExitsZero) {
  for (const auto& p : programs()) {
    const program_result r = run_program(p.path, {"--help"});
    EXPECT_EQ(r.status, 0) << p.name << "\n" << r.output;
    for (const auto& f : p.some_flags) EXPECT_TRUE(has(r.output, f)) << p.name << " --help lacks " << f << "\n" << r.output;
  }
}

TEST(AppFlags, AnUnknownFlagABadValueOrAStrayWordExitsTwoNamingIt) {
  for (const auto& p : programs()) {
    const program_result unknown = run_program(p.path, {"--frobnicate=3"});
    EXPECT_EQ(unknown.status, 2) << p.name << "\n" << unknown.output;
    EXPECT_TRUE(has(unknown.output, std::string(p.name) + ": ")) << unknown.output;
    EXPECT_TRUE(has(unknown.output, "--frobnicate")) << unknown.output;
    EXPECT_TRUE(has(unknown.output, "Run '" + std::string(p.name) + " --help' for the flags.")) << unknown.output;

    const program_result bad = run_program(p.path, {p.bad_value});
    EXPECT_EQ(bad.status, 2) << p.name << " " << p.bad_value << "\n" << bad.output;

    const program_result stray = run_program(p.path, {"stray-word"});
    EXPECT_EQ(stray.status, 2) << p.name << "\n" << stray.output;
    EXPECT_TRUE(has(stray.output, "stray-word")) << stray.output;
  }
}

TEST(AppFlags, ReplFlagsKeepTheirMeanings) {
  // -c in order, --keep-going, --devices (checked by the library's parser).
  const program_result c = run_program(AG_REPL_BINARY, {"-c", "echo one", "-c", "bogus", "-c", "echo two", "--keep-going"});
  EXPECT_EQ(c.status, 1) << c.output;
  EXPECT_TRUE(has(c.output, "> echo one\none\n> bogus\n")) << c.output;
  EXPECT_TRUE(has(c.output, "> echo two\ntwo\n")) << c.output;
  const program_result dev = run_program(AG_REPL_BINARY, {"--devices", "sim:3", "-c", "devices"});
  EXPECT_EQ(dev.status, 0) << dev.output;
  EXPECT_TRUE(has(dev.output, "devices (sim:3):")) << dev.output;
  const program_result bad_dev = run_program(AG_REPL_BINARY, {"--devices", "sim:1,tpu:2"});
  EXPECT_EQ(bad_dev.status, 2) << bad_dev.output;
  EXPECT_TRUE(has(bad_dev.output, "actorgraph: --devices: device spec item 2 'tpu:2' at position 6: unknown device kind 'tpu'"))
      << bad_dev.output;
  const program_result missing = run_program(AG_REPL_BINARY, {"--script"});
  EXPECT_EQ(missing.status, 2) << missing.output;
  EXPECT_TRUE(has(missing.output, "--script")) << missing.output;
}

TEST(AppFlags, InitRunsAScriptFirstAndThenTheInput) {
  const std::string path = ::testing::TempDir() + "repl_init.ag";
  {
    std::ofstream f(path);
    f << "echo from-init\n";
  }
  const program_result r = run_program(AG_REPL_BINARY, {"--init", path}, "echo from-stdin\n");
  EXPECT_EQ(r.status, 0) << r.output;
  EXPECT_TRUE(has(r.output, "> echo from-init\nfrom-init\n> echo from-stdin\nfrom-stdin\n")) << r.output;
  const program_result missing = run_program(AG_REPL_BINARY, {"--init", "/nonexistent/x.ag"}, "echo never\n");
  EXPECT_EQ(missing.status, 1) << missing.output;
  EXPECT_TRUE(has(missing.output, "cannot read '/nonexistent/x.ag'")) << missing.output;
  EXPECT_FALSE(has(missing.output, "never")) << missing.output;
  std::remove(path.c_str());
}

}  // namespace
