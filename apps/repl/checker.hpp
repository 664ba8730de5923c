#pragma once
/// \file checker.hpp
/// Compares finished jobs with the CPU reference evaluator off the main
/// thread (a reference run of a model can take seconds, of a large one
/// minutes), and the queue through which job callbacks and the checker
/// report to the session's main thread.
///
/// Threading: job callbacks (runtime threads) and the checker thread push
/// events; the session's main thread takes them. A check can be stopped:
/// stop_all() (the main thread, on Ctrl-C during `wait`) makes the check
/// running now give up within a node or a matmul row, and every check posted
/// for runs submitted before it is dropped; each reports "stopped".

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "actors/actorgraph.hpp"

namespace ag::repl {

/// The outcome of a job's reference check.
enum class check_status : uint8_t {
  none,     ///< no check was asked for
  pending,  ///< asked for, not finished
  ok,       ///< outputs match the reference within tolerance
  bad,      ///< a mismatch, or the reference failed
  skipped,  ///< nothing to compare (the job failed)
  stopped,  ///< given up (Ctrl-C)
};

/// Something for the main thread: a job finished, or its check did.
struct event {
  enum class kind : uint8_t { done, checked } k = kind::done;
  uint64_t job = 0;
  check_status status = check_status::none;
  std::string text;  ///< "check: ok (max err 3e-07)" and the like
};

/// Written by runtime threads and the checker, read by the main thread. Job
/// callbacks share it, so it (and its pipe) lives until the last callback
/// has run, even if that is after the session is gone.
class event_queue {
 public:
  event_queue();
  ~event_queue();
  event_queue(const event_queue&) = delete;
  event_queue& operator=(const event_queue&) = delete;
  /// Any thread.
  void push(event e);
  /// Makes notify_fd() readable. Async-signal-safe.
  void poke() const noexcept;
  /// Main thread: everything pushed so far, and the pipe emptied.
  std::deque<event> take();
  /// Readable when take() has something (or after poke()).
  int notify_fd() const noexcept { return rfd_; }

 private:
  std::mutex m_;
  std::deque<event> q_;
  int rfd_ = -1, wfd_ = -1;
};

/// Reference evaluator speed on this host in graph flops per second
/// (measured once, on a small matmul, the first time it is asked: a few ms).
double reference_flops_per_second();

class checker {
 public:
  struct task {
    uint64_t id = 0;                     ///< the REPL's job id
    job handle;                          ///< finished when posted
    std::shared_ptr<const graph> g;
    std::vector<host_tensor> inputs;
    uint64_t generation = 0;             ///< generation() when its run was submitted
  };
  explicit checker(std::shared_ptr<event_queue> events);
  /// Stops the check running now (it gives up within a node or a matmul
  /// row) and drops queued ones, then joins the thread.
  ~checker();
  checker(const checker&) = delete;
  checker& operator=(const checker&) = delete;

  /// Any thread: queues a check; its result arrives as an event.
  void post(task t);
  /// The current generation: a run's tasks carry it, and stop_all() stops
  /// every task of an older one.
  uint64_t generation() const noexcept { return generation_.load(); }
  /// Main thread: stops the running check and all checks of runs submitted
  /// so far (queued, or still to be posted by their jobs).
  void stop_all();

 private:
  void loop();
  bool stale(const task& t) const noexcept { return t.generation < generation_.load(); }
  event check(const task& t) const;

  std::shared_ptr<event_queue> events_;
  std::mutex m_;
  std::condition_variable cv_;
  std::deque<task> q_;
  bool quit_ = false;
  std::atomic<bool> quitting_{false};
  std::atomic<uint64_t> generation_{1};
  std::thread thread_;
};

}  // namespace ag::repl
