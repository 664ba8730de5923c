// The `actorgraph` executable: as a script reader (stdin pipe, --script) and
// at a terminal (a pseudo-terminal: TAB completion, Ctrl-C, Ctrl-D, reports
// printed above the line being typed).
#include <gtest/gtest.h>

#include <fcntl.h>
#include <poll.h>
#include <pty.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cctype>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "run_program.hpp"

namespace {

bool has(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

// Runs the REPL with `input` on a pipe as standard input.
ag::repl::test_support::program_result run_piped(std::vector<std::string> args, const std::string& input) {
  return ag::repl::test_support::run_program(AG_REPL_BINARY, std::move(args), input);
}

// The REPL on a pseudo-terminal.
class pty_repl {
 public:
  explicit pty_repl(const char* extra = nullptr) {
    winsize ws{};
    ws.ws_row = 40;
    ws.ws_col = 160;
    pid_ = ::forkpty(&fd_, nullptr, nullptr, &ws);
    if (pid_ == 0) {
      ::setenv("AG_REPL_HISTORY", "", 1);  // no history file
      ::setenv("TERM", "xterm", 1);
      ::setenv("INPUTRC", "/dev/null", 1);
      ::execl(AG_REPL_BINARY, AG_REPL_BINARY, "--devices", "sim:2", extra, static_cast<char*>(nullptr));
      ::_exit(127);
    }
  }
  ~pty_repl() {
    if (pid_ > 0 && !exited_) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
    }
    if (fd_ >= 0) ::close(fd_);
  }
  bool started() const { return pid_ > 0 && fd_ >= 0; }
  void send(const std::string& s) { [[maybe_unused]] auto w = ::write(fd_, s.data(), s.size()); }
  // Reads until `pattern` appears after position `from` of everything read;
  // true if it did within the timeout.
  bool read_until(const std::string& pattern, double seconds = 20) {
    const auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
    for (;;) {
      if (all_.find(pattern, mark_) != std::string::npos) {
        mark_ = all_.find(pattern, mark_) + pattern.size();
        return true;
      }
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(end - std::chrono::steady_clock::now()).count();
      if (left <= 0) return false;
      pollfd p{fd_, POLLIN, 0};
      if (::poll(&p, 1, static_cast<int>(std::min<long long>(left, 200))) > 0) {
        char buf[4096];
        const ssize_t n = ::read(fd_, buf, sizeof buf);
        if (n <= 0) return all_.find(pattern, mark_) != std::string::npos;
        // Keep text only: drop carriage returns and readline's bracketed-paste
        // mode switches, so patterns read as plain lines.
        std::string chunk(buf, static_cast<std::size_t>(n));
        for (const char* seq : {"\033[?2004h", "\033[?2004l", "\r"})
          for (std::size_t k; (k = chunk.find(seq)) != std::string::npos;) chunk.erase(k, std::strlen(seq));
        all_ += chunk;
      }
    }
  }
  // Waits for the process to exit; its exit status, or -1 on timeout.
  int wait_exit(double seconds = 20) {
    const auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
    while (std::chrono::steady_clock::now() < end) {
      read_until("\x01never\x01", 0.05);  // keep the pty drained
      int st = 0;
      if (::waitpid(pid_, &st, WNOHANG) == pid_) {
        exited_ = true;
        return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
      }
    }
    return -1;
  }
  const std::string& output() const { return all_; }
  std::string since(std::size_t pos) const { return all_.substr(std::min(pos, all_.size())); }
  std::size_t mark() const { return mark_; }

 private:
  int fd_ = -1;
  pid_t pid_ = -1;
  bool exited_ = false;
  std::string all_;
  std::size_t mark_ = 0;
};

const char* small_gpt2 = "model gpt2 layers=2 d=32 heads=2 ff=64 seq=8 vocab=64";

}  // namespace

TEST(ReplBinary, PipedScriptEchoesCommandsAndFailsOnAnError) {
  const auto r = run_piped({}, "echo hello\nbogus\necho never\n");
  EXPECT_EQ(r.status, 1) << r.output;
  EXPECT_TRUE(has(r.output, "> echo hello\nhello\n")) << r.output;
  EXPECT_TRUE(has(r.output, "error: unknown command 'bogus'")) << r.output;
  EXPECT_FALSE(has(r.output, "never")) << r.output;
  EXPECT_FALSE(has(r.output, "ag> ")) << r.output;  // no prompt noise
}

TEST(ReplBinary, KeepGoingAndCleanScripts) {
  const auto kg = run_piped({"--keep-going"}, "bogus\necho after\n");
  EXPECT_EQ(kg.status, 1);
  EXPECT_TRUE(has(kg.output, "> echo after\nafter")) << kg.output;
  const auto ok = run_piped({}, "help wait\n");
  EXPECT_EQ(ok.status, 0) << ok.output;
  const auto bad = run_piped({"--frobnicate"}, "");
  EXPECT_EQ(bad.status, 2);
  EXPECT_TRUE(has(bad.output, "actorgraph: The following argument was not expected: --frobnicate")) << bad.output;
  EXPECT_TRUE(has(bad.output, "Run 'actorgraph --help' for the flags.")) << bad.output;
}

TEST(ReplBinary, ScriptFileRunsABatchChecksItAndDrawsTheTimeline) {
  const std::string path = ::testing::TempDir() + "repl_script.ag";
  {
    std::ofstream f(path);
    f << "devices sim:2 scale=0.01\n" << small_gpt2 << "\nrun n=3\nwait\ntimeline width=50\n";
  }
  const auto r = run_piped({"--script", path}, "");
  EXPECT_EQ(r.status, 0) << r.output;
  EXPECT_TRUE(has(r.output, "[run 1] 3/3 done")) << r.output;
  EXPECT_TRUE(has(r.output, "check: ok")) << r.output;
  EXPECT_TRUE(has(r.output, "sim1 compute0 |")) << r.output;
  std::remove(path.c_str());
}

TEST(ReplBinary, FaultScriptReportsTheFailedJobAndTheNextRunChecksOk) {
  const std::string path = ::testing::TempDir() + "repl_fault.ag";
  {
    std::ofstream f(path);
    f << "devices cpu:1,sim:1 scale=0.01\n" << small_gpt2
      << "\nset stages=2\nfault sim0 error\nrun n=1\nwait\nfault sim0 off\nrun n=1\nwait\n";
  }
  const auto r = run_piped({"--script", path}, "");
  EXPECT_EQ(r.status, 0) << r.output;  // a failed job is a report, not a failed command
  EXPECT_TRUE(has(r.output, "[job 1] failed: op_failed: device 'sim0' step ")) << r.output;
  EXPECT_TRUE(has(r.output, "(injected fault)")) << r.output;
  EXPECT_TRUE(has(r.output, "[run 1] 0/1 done, 1 failed")) << r.output;
  EXPECT_TRUE(has(r.output, "[run 2] 1/1 done")) << r.output;
  EXPECT_TRUE(has(r.output, "checks: 1 ok, 0 bad")) << r.output;
  std::remove(path.c_str());
}

// The default demo (`scripts/dev.sh demo` runs it with --init): 16 jobs over
// 4 pipeline stages, and a timeline whose last stage idles while the first
// jobs pass through the stages before it (the fill of the pipeline).
TEST(ReplBinary, DefaultDemoRunsAndShowsThePipelineFilling) {
  const auto r = run_piped({"--init", AG_SOURCE_DIR "/examples/demo.ag"}, "");
  EXPECT_EQ(r.status, 0) << r.output;
  EXPECT_TRUE(has(r.output, "plan: 467 nodes, 10 steps over 4 of 4 device(s)")) << r.output;
  EXPECT_TRUE(has(r.output, "[run 1] 16/16 done in ")) << r.output;
  EXPECT_TRUE(has(r.output, "(check skipped: sim values are off)")) << r.output;
  // The pipeline fills: each stage's first busy column comes after the one
  // before it (a stage computes only once the previous one has sent its
  // first job). Which job goes first, and how long the first input copy
  // takes on a loaded machine, are up to the threads: not asserted.
  int previous = -1;
  for (int stage = 0; stage < 4; ++stage) {
    const std::string row = "sim" + std::to_string(stage) + " compute0 |";
    const auto at = r.output.find(row);
    ASSERT_NE(at, std::string::npos) << row << "\n" << r.output;
    const auto line_end = r.output.find('\n', at);
    const std::string cells = r.output.substr(at + row.size(), line_end - at - row.size());
    const auto first_busy = cells.find_first_not_of('.');
    ASSERT_NE(first_busy, std::string::npos) << row << " never busy\n" << r.output;
    EXPECT_GT(static_cast<int>(first_busy), previous) << row << " starts before the stage feeding it\n" << r.output;
    EXPECT_TRUE(std::isxdigit(static_cast<unsigned char>(cells[first_busy]))) << row << "\n" << r.output;
    previous = static_cast<int>(first_busy);
  }
  EXPECT_TRUE(has(r.output, "utilisation over ")) << r.output;
  EXPECT_FALSE(has(r.output, "error")) << r.output;
}

TEST(ReplPty, TabCompletesCommandsAndHelpRuns) {
#ifndef AG_REPL_HAVE_READLINE
  GTEST_SKIP() << "built without GNU readline (libreadline-dev): no completion or line redraw to test";
#endif
  pty_repl p;
  ASSERT_TRUE(p.started());
  ASSERT_TRUE(p.read_until("ag> ")) << p.output();
  p.send("hel\t");
  ASSERT_TRUE(p.read_until("help")) << p.output();
  p.send(" ru\t\r");
  ASSERT_TRUE(p.read_until("example: run n=32")) << p.output();
  ASSERT_TRUE(p.read_until("ag> ")) << p.output();
  // Two candidates: TAB TAB lists both.
  p.send("model llama la\t");
  ASSERT_TRUE(p.read_until("layers=")) << p.output();
  p.send("\x03");  // Ctrl-C clears the line
  ASSERT_TRUE(p.read_until("^C")) << p.output();
  ASSERT_TRUE(p.read_until("ag> ")) << p.output();
  p.send("echo cleared\r");
  ASSERT_TRUE(p.read_until("\ncleared")) << p.output();
  EXPECT_FALSE(has(p.output(), "unknown command")) << p.output();
  // Wait for readline to take the terminal back: a ^D typed while the
  // terminal is in cooked mode (a command running) is the tty's own EOF.
  ASSERT_TRUE(p.read_until("ag> ")) << p.output();
  p.send("\x04");  // Ctrl-D quits
  EXPECT_EQ(p.wait_exit(), 0) << p.output();
}

TEST(ReplPty, TabCompletesTheFaultCommandAndItsKind) {
#ifndef AG_REPL_HAVE_READLINE
  GTEST_SKIP() << "built without GNU readline (libreadline-dev): no completion or line redraw to test";
#endif
  pty_repl p;
  ASSERT_TRUE(p.started());
  ASSERT_TRUE(p.read_until("ag> ")) << p.output();
  p.send("fau\t");
  ASSERT_TRUE(p.read_until("fault")) << p.output();
  p.send(" sim er\t\r");  // the only kind starting with "er"
  ASSERT_TRUE(p.read_until("faults on sim0, sim1: op errors in 100% of ops")) << p.output();
  ASSERT_TRUE(p.read_until("ag> ")) << p.output();
  p.send("\x04");
  EXPECT_EQ(p.wait_exit(), 0) << p.output();
}

TEST(ReplPty, CtrlCDuringWaitReturnsToThePromptAndJobsKeepRunning) {
  pty_repl p;
  ASSERT_TRUE(p.started());
  ASSERT_TRUE(p.read_until("ag> "));
  p.send(std::string("devices sim:2 scale=300 arenas=2\r") + small_gpt2 + "\rrun n=100 check=off\r");
  ASSERT_TRUE(p.read_until("submitted 100 jobs")) << p.output();
  p.send("wait\r");
  ASSERT_TRUE(p.read_until("wait")) << p.output();
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  p.send("\x03");
  ASSERT_TRUE(p.read_until("back to the prompt")) << p.output();
  ASSERT_TRUE(p.read_until("ag> ")) << p.output();
  p.send("jobs\r");
  ASSERT_TRUE(p.read_until("100 jobs:")) << p.output();
  p.send("quit cancel\r");
  EXPECT_EQ(p.wait_exit(30), 0) << p.output();
  EXPECT_TRUE(has(p.output(), "cancelled")) << p.output();
}

TEST(ReplPty, ReportsAppearAboveTheLineBeingTyped) {
#ifndef AG_REPL_HAVE_READLINE
  GTEST_SKIP() << "built without GNU readline (libreadline-dev): no completion or line redraw to test";
#endif
  pty_repl p;
  ASSERT_TRUE(p.started());
  ASSERT_TRUE(p.read_until("ag> "));
  p.send(std::string("devices sim:2 scale=20\r") + small_gpt2 + "\rrun n=2\r");
  ASSERT_TRUE(p.read_until("submitted 2 jobs")) << p.output();
  ASSERT_TRUE(p.read_until("ag> ")) << p.output();
  p.send("ech");  // half a command, no Enter
  ASSERT_TRUE(p.read_until("[run 1] 2/2 done")) << p.output();
  p.send("o typed-on\r");
  // The half-typed line survived the reports: the command runs whole.
  ASSERT_TRUE(p.read_until("\ntyped-on")) << p.output();
  p.send("quit\r");
  EXPECT_EQ(p.wait_exit(), 0) << p.output();
}

TEST(ReplPty, LongRunShowsProgressAndQuitAsksWhatToDoWithRunningJobs) {
  pty_repl p;
  ASSERT_TRUE(p.started());
  ASSERT_TRUE(p.read_until("ag> "));
  p.send(std::string("devices sim:2 scale=300 arenas=2\r") + small_gpt2 + "\rrun n=200 check=off\r");
  ASSERT_TRUE(p.read_until("submitted 200 jobs")) << p.output();
  ASSERT_TRUE(p.read_until("[run 1] [")) << p.output();  // the progress line, above the prompt
  ASSERT_TRUE(p.read_until("jobs/s")) << p.output();
  ASSERT_TRUE(p.read_until("ag> ")) << p.output();
  p.send("quit\r");
  ASSERT_TRUE(p.read_until("[w]ait for them, [c]ancel them, or stay?")) << p.output();
  p.send("s\r");
  ASSERT_TRUE(p.read_until("staying")) << p.output();
  ASSERT_TRUE(p.read_until("ag> ")) << p.output();
  p.send("quit\r");
  ASSERT_TRUE(p.read_until("or stay?")) << p.output();
  p.send("c\r");
  EXPECT_EQ(p.wait_exit(30), 0) << p.output();
  EXPECT_TRUE(has(p.output(), "cancelled")) << p.output();
}

TEST(ReplPty, PlainLineModeWithoutReadlineStillWorks) {
  pty_repl p("--no-readline");
  ASSERT_TRUE(p.started());
  ASSERT_TRUE(p.read_until("plain line input")) << p.output();
  ASSERT_TRUE(p.read_until("ag> ")) << p.output();
  p.send("echo plain\r");
  ASSERT_TRUE(p.read_until("\nplain\n")) << p.output();
  ASSERT_TRUE(p.read_until("ag> ")) << p.output();
  p.send("\x03");
  ASSERT_TRUE(p.read_until("^C")) << p.output();
  ASSERT_TRUE(p.read_until("ag> ")) << p.output();
  p.send("quit\r");
  EXPECT_EQ(p.wait_exit(), 0) << p.output();
}

// Ctrl-C while `wait` waits for a long reference check: back to the prompt at
// once, the check stopped (its job reports "check: stopped"), the REPL usable.
TEST(ReplPty, CtrlCDuringALongReferenceCheckStopsItAndReturnsToThePrompt) {
  pty_repl p;
  ASSERT_TRUE(p.started());
  ASSERT_TRUE(p.read_until("ag> "));
  p.send(
      "devices sim:1 scale=0\r"
      "graph x=input[1536,1536] a=weight[1536,1536] b=weight[1536,1536] c=weight[1536,1536] "
      "y=matmul(matmul(matmul(x,a),b),c) out y\r"
      "run n=1 check=all\r");
  ASSERT_TRUE(p.read_until("note: the reference check of 1 job takes about")) << p.output();
  ASSERT_TRUE(p.read_until("ag> ")) << p.output();
  p.send("wait\r");
  // The job itself is done in a moment; then only the check is left.
  ASSERT_TRUE(p.read_until("waiting for the reference check of 1 job (about ", 60)) << p.output();
  p.send("\x03");
  ASSERT_TRUE(p.read_until("^C\nback to the prompt; 0 jobs still running; stopped the reference check of 1 job")) << p.output();
  ASSERT_TRUE(p.read_until("check: stopped")) << p.output();
  ASSERT_TRUE(p.read_until("ag> ")) << p.output();
  p.send("echo still-here\r");
  ASSERT_TRUE(p.read_until("\nstill-here")) << p.output();
  // Another long check, and `quit wait` right away: it waits for the job
  // but stops the check instead of waiting for it.
  p.send("run n=1 check=all\r");
  ASSERT_TRUE(p.read_until("note: the reference check of 1 job takes about")) << p.output();
  ASSERT_TRUE(p.read_until("ag> ")) << p.output();
  p.send("quit wait\r");
  ASSERT_TRUE(p.read_until("stopping the reference check of 1 job", 60)) << p.output();
  EXPECT_EQ(p.wait_exit(60), 0) << p.output();
}
