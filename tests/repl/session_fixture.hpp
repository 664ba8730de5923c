#pragma once
// Shared by the in-process REPL session tests: a session on simulated GPUs
// writing into a string, and small text helpers for asserting on its output.
#include <gtest/gtest.h>

#include <initializer_list>
#include <sstream>
#include <string>

#include "apps/repl/session.hpp"

namespace ag::repl::test_support {

inline bool has(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

/// Every occurrence of `part` in `s`, overlapping ones included.
inline int count(const std::string& s, const std::string& part) {
  int n = 0;
  for (std::size_t p = s.find(part); p != std::string::npos; p = s.find(part, p + 1)) ++n;
  return n;
}

/// A 2-layer GPT-2 small enough for the sim's reference checks to be quick.
inline const char* const small_gpt2 = "model gpt2 layers=2 d=32 heads=2 ff=64 seq=8 vocab=64";

struct fixture {
  std::ostringstream out;
  session s{out, opts()};
  /// 2 sim GPUs at 1/100 of real time, 2 scheduler threads.
  static session_options opts() {
    session_options o;
    o.default_devices = "sim:2";
    o.default_time_scale = 0.01;
    o.scheduler_threads = 2;
    return o;
  }
  /// Runs one line; returns its status and leaves its output in `text`.
  exec_status run(const std::string& line) {
    out.str("");
    const exec_status st = s.execute(line);
    text = out.str();
    return st;
  }
  /// Runs lines, failing the test at the first one that fails.
  void ok(std::initializer_list<const char*> lines) {
    for (const char* l : lines) ASSERT_EQ(run(l), exec_status::ok) << l << "\n" << text;
  }
  /// Whether `line` is refused (exec_status::failed) with `message` in its
  /// output; the failure names the line and shows what it printed.
  ::testing::AssertionResult rejects(const std::string& line, const std::string& message) {
    const exec_status st = run(line);
    if (st != exec_status::failed) return ::testing::AssertionFailure() << "'" << line << "' was not refused:\n" << text;
    if (!has(text, message))
      return ::testing::AssertionFailure() << "'" << line << "' did not say '" << message << "':\n" << text;
    return ::testing::AssertionSuccess();
  }
  std::string text;
};

}  // namespace ag::repl::test_support
