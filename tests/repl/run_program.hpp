#pragma once
// Runs a program with arguments and standard input from a pipe, collecting
// its standard output and error: for the tests of the executables.
#include <gtest/gtest.h>

#include <sys/wait.h>
#include <unistd.h>

#include <string>
#include <vector>

namespace ag::repl::test_support {

struct program_result {
  int status = -1;     ///< exit status, or -1 when it did not exit normally
  std::string output;  ///< stdout and stderr together
};

/// Runs `path` with `args`, `input` on standard input.
inline program_result run_program(const std::string& path, std::vector<std::string> args, const std::string& input = "") {
  int in[2], out[2];
  EXPECT_EQ(::pipe(in), 0);
  EXPECT_EQ(::pipe(out), 0);
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::dup2(in[0], 0);
    ::dup2(out[1], 1);
    ::dup2(out[1], 2);
    ::close(in[1]);
    ::close(out[0]);
    std::vector<char*> argv{const_cast<char*>(path.c_str())};
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    ::execv(path.c_str(), argv.data());
    ::_exit(127);
  }
  ::close(in[0]);
  ::close(out[1]);
  [[maybe_unused]] auto w = ::write(in[1], input.data(), input.size());
  ::close(in[1]);
  program_result r;
  char buf[4096];
  ssize_t n;
  while ((n = ::read(out[0], buf, sizeof buf)) > 0) r.output.append(buf, static_cast<std::size_t>(n));
  ::close(out[0]);
  int st = 0;
  ::waitpid(pid, &st, 0);
  r.status = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  return r;
}

}  // namespace ag::repl::test_support
