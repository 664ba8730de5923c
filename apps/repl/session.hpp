#pragma once
/// \file session.hpp
/// The REPL's command interpreter, independent of how lines are read (a
/// terminal with readline, a script, a test). It owns the runtime, the
/// current model and plan, and the jobs it submitted.
///
/// Threading: a session is driven by one thread (the "main" thread): execute(),
/// drain(), complete() and the destructor. Jobs finish on runtime threads;
/// their callbacks only queue an event and make notify_fd() readable, and the
/// main thread turns events into reports in drain(). interrupt() may be called
/// from a signal handler.

#include <atomic>
#include <cstdint>
#include <functional>
#include <iosfwd>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "actors/actorgraph.hpp"
#include "apps/repl/args.hpp"

namespace ag::repl {

struct session_options {
  /// A person at a terminal: `wait` draws a live progress line with '\r',
  /// `quit` with running jobs asks (through `ask`).
  bool interactive = false;
  /// Device spec used when a command first needs devices and none were
  /// chosen; empty: "cuda:all" when a GPU is usable, else "sim:4".
  std::string default_devices;
  /// Wall seconds per simulated second for sim devices, unless `devices`
  /// says scale=. Chosen so that a job of the default model takes tens of ms.
  double default_time_scale = 20.0;
  /// Columns for `timeline` (the time area).
  int width = 96;
  /// Runtime options passed to runtime::create (tests shrink them).
  int scheduler_threads = 0;
};

enum class exec_status : uint8_t { ok, failed, quit };

/// One line of output produced asynchronously (a job report, a progress line).
struct report {
  std::string text;        ///< without the trailing newline
  bool progress = false;   ///< a progress line: a terminal may overwrite the previous one
};

/// Names, usage, summary and an example of one command.
struct command_info {
  const char* name;
  const char* usage;
  const char* summary;
  const char* example;
  std::vector<std::string> keys;     ///< key= parameters, for completion
  std::vector<std::string> words;    ///< positional words, for completion
  const char* details = nullptr;     ///< more lines for `help <command>`, or null
  bool own_syntax = false;           ///< parses the text after its name itself (graph, echo)
};
const std::vector<command_info>& commands();
const command_info* find_command(const std::string& name);

/// What completion of the word at the cursor offers.
struct completion {
  std::vector<std::string> candidates;  ///< full replacements of the current word
  bool filenames = false;               ///< complete file names instead
};

class session {
 public:
  session(std::ostream& out, session_options options = {});
  /// Cancels nothing: waits for jobs still in flight, then stops the runtime.
  ~session();
  session(const session&) = delete;
  session& operator=(const session&) = delete;

  /// Runs one command line. Errors print "error: <reason>" and the usage.
  /// Never throws; nothing typed can end the session except `quit`.
  exec_status execute(const std::string& line);

  /// Reports queued by finished jobs since the last call (main thread).
  std::vector<report> drain();
  /// Becomes readable when drain() has something; drain() empties it.
  int notify_fd() const noexcept;
  /// Async-signal-safe: makes a running `wait` return to the prompt; that
  /// `wait` also stops the reference checks of the runs submitted so far
  /// (they report "check: stopped"). The jobs keep running.
  void interrupt() noexcept;

  /// Completion of the word that starts at `word_start` in `line` (the text
  /// before the cursor).
  completion complete(const std::string& line, std::size_t word_start) const;

  /// Jobs submitted by this session and not finished.
  int64_t jobs_running() const;
  /// Blocks until every job finished and was reported (printing reports as
  /// they come) or until interrupt(); true if all finished.
  bool wait_all();
  /// Cancels every running job.
  void cancel_all();

  /// Asked by `quit` with running jobs in interactive mode; returns the
  /// user's answer ("w"/"wait", "c"/"cancel", or anything else to stay).
  std::function<std::string(const std::string& question)> ask;
  /// Set by the front end for `source` nesting: keep going after errors.
  bool keep_going = false;

  /// For tests: the trace of the last batch (records gathered so far).
  trace last_trace() const;

  struct impl;

 private:
  std::unique_ptr<impl> impl_;
};

/// Runs commands from `in` (a script or a pipe): each echoed as "> cmd"
/// (blank lines and '#' comment lines are skipped),
/// reports printed between commands; at the end of input waits for running
/// jobs (as `quit wait`). Stops at the first failing command unless
/// `keep_going`. Returns the process exit status: 0, or 1 if a command failed.
/// Lines longer than 1 MiB end the script with an error (`actorgraph < /dev/zero`).
int run_script(session& s, std::istream& in, std::ostream& out, bool keep_going);
/// run_script on a file read whole first (at most 16 MiB, no NUL bytes);
/// a file that cannot be read prints the error and returns 1.
int run_script_file(session& s, const std::string& path, std::ostream& out, bool keep_going);

}  // namespace ag::repl
