#pragma once
/// \file host_stream.hpp
/// The host stream engine shared by the cpu and sim backends: a stream is a
/// worker thread draining a FIFO of tasks; an event is a generation counter.
///
/// Threading: a host_stream is driven (submit) by one thread at a time, its
/// owning actor, which may migrate between threads; its tasks run on its own
/// worker thread, in submission order. host_event is fully thread-safe.
///
/// Why a mutex + condition variable queue and not moodycamel: a CAF actor is
/// not pinned to a thread, so consecutive submits of one stream may come from
/// different threads, and moodycamel orders items per producer thread only.
/// A locked deque is FIFO across threads; the worker takes the whole queue per
/// lock, so a busy stream costs one lock per batch. Measured (Release, 2-core
/// dev machine): 1.8-6.7 M tasks/s through one stream, idle worker wake-up
/// 2.8 us median / 3.5-5.6 us p99 (submit -> task running).

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>

#include "gpu/device.hpp"

namespace ag::gpu::host {

/// The shared state of a host event: a generation counter. record() arms a
/// new generation (at enqueue time, CUDA semantics) and the stream marks it
/// reached when it gets there; wait() snapshots the armed generation at
/// enqueue time. Tasks hold it by shared_ptr, so destroying the event while
/// work that records or waits on it is pending is safe.
class event_state {
 public:
  /// Arms the next generation and returns it (called by record() at enqueue time).
  uint64_t arm() noexcept { return armed_.fetch_add(1, std::memory_order_acq_rel) + 1; }
  /// The last armed generation (what a wait() enqueued now must wait for).
  uint64_t armed() const noexcept { return armed_.load(std::memory_order_acquire); }
  /// Marks generation `gen` (and all before it) reached at time `ns`; wakes waiters.
  void reach(uint64_t gen, int64_t ns) noexcept;
  /// True once generation `gen` was reached.
  bool reached(uint64_t gen) const noexcept { return reached_.load(std::memory_order_acquire) >= gen; }
  /// True once the last armed generation was reached.
  bool complete() const noexcept { return reached(armed()); }
  /// Time the latest reached generation was reached.
  int64_t completion_ns() const noexcept { return completion_ns_.load(std::memory_order_acquire); }
  /// Blocks until generation `gen` is reached.
  void wait_for(uint64_t gen) const;
  /// Blocks until `gen` is reached or `abort()` returns true (polled every
  /// `poll_ns`, and re-checked whenever the event changes). Returns true if reached.
  template <class Abort>
  bool wait_for(uint64_t gen, Abort&& abort, int64_t poll_ns = 2'000'000) const {
    if (reached(gen)) return true;
    std::unique_lock<std::mutex> lk(mutex_);
    const parked p(waiters_);
    while (!reached(gen)) {
      if (abort()) return false;
      cv_.wait_for(lk, std::chrono::nanoseconds(poll_ns));
    }
    return true;
  }
  /// Threads blocked in wait_for() on this event right now. Tests use it to
  /// know that a stream's worker is parked at a wait (so nothing behind the
  /// wait in that stream can have run) instead of sleeping and hoping.
  int waiters() const noexcept { return waiters_.load(std::memory_order_acquire); }

 private:
  /// Counts a blocked waiter for its scope.
  struct parked {
    explicit parked(std::atomic<int>& n) noexcept : n_(n) { n_.fetch_add(1, std::memory_order_acq_rel); }
    ~parked() { n_.fetch_sub(1, std::memory_order_acq_rel); }
    parked(const parked&) = delete;
    parked& operator=(const parked&) = delete;
    std::atomic<int>& n_;
  };

  std::atomic<uint64_t> armed_{0};
  std::atomic<uint64_t> reached_{0};
  std::atomic<int64_t> completion_ns_{0};
  mutable std::atomic<int> waiters_{0};
  mutable std::mutex mutex_;
  mutable std::condition_variable cv_;
};

/// An event of the host backends (cpu, sim): any host device can record it
/// and any device can wait for it. Host events always keep their completion time.
class host_event final : public event {
 public:
  explicit host_event(bool timing = false)
      : state_(std::make_shared<event_state>()), timing_(timing) {}

  bool query() const override { return state_->complete(); }
  void host_wait() const override { state_->wait_for(state_->armed()); }
  int64_t completion_ns() const override { return state_->completion_ns(); }

  const std::shared_ptr<event_state>& state() const noexcept { return state_; }
  bool timing() const noexcept { return timing_; }

 private:
  std::shared_ptr<event_state> state_;
  bool timing_;
};

/// State the worker passes to each task.
struct task_context {
  /// host_clock_ns() at which the task was submitted; 0 on inline streams,
  /// which only instant (untimed) devices use and whose tasks never read it.
  int64_t enqueue_ns = 0;
  /// The stream's timeline: the (virtual) time the previous task finished.
  /// Sim tasks start at max(enqueue_ns, clock_ns) and advance it, so that a
  /// late wake-up does not push back the following ops (no drift).
  int64_t& clock_ns;
  /// True when the stream is being destroyed: tasks must not do their work
  /// (no compute, no sleep, no event wait) but still complete events and call
  /// notify callbacks (with errc::cancelled), so that nothing waits forever.
  bool dropping = false;
};

/// One in-order queue of host work. Created by a host device.
class host_stream final : public stream {
 public:
  using task = std::function<void(task_context&)>;

  /// `inline_mode`: submit() runs the task at once in the calling thread (the
  /// sim backend's instant device); no worker thread is started. Inline
  /// streams are for untimed devices only: their tasks get no enqueue time
  /// (reading the clock per op was a third of the dispatch benchmark's time).
  host_stream(step_kind kind, int index, bool inline_mode);
  /// Drops pending work: the worker runs every pending task with
  /// context.dropping = true (events complete, notify callbacks get
  /// errc::cancelled), finishes the task it is in, and joins. Never hangs on a
  /// wait for an event that never comes (those waits poll `dropping`).
  ~host_stream() override;

  step_kind kind() const noexcept override { return kind_; }
  /// Position of this stream among its device's streams (creation order).
  int index() const noexcept { return index_; }
  bool inline_mode() const noexcept { return inline_; }

  /// Enqueues a task (runs it now in inline mode).
  void submit(task t);
  /// Same, but in inline mode calls `f` without wrapping it in a task (no
  /// allocation: the instant sim device's hot path).
  template <class F>
  void post(F&& f) {
    if (inline_) {
      task_context ctx{0, clock_ns_, dropping()};
      f(ctx);
    } else {
      submit(task(std::forward<F>(f)));
    }
  }
  /// Blocks until every task submitted so far has run.
  void drain();
  /// True once the destructor started (tasks poll it while blocking).
  bool dropping() const noexcept { return stopping_.load(std::memory_order_acquire); }

  /// Sticky asynchronous error: the first error a task reported since the last
  /// take_error(). notify() tasks hand it to their callback.
  void set_error(error e);
  error take_error();

  /// Copy engine this stream is bound to (sim backend; -1: none). Set once by
  /// the device right after creation.
  int engine() const noexcept { return engine_; }
  void set_engine(int e) noexcept { engine_ = e; }

 private:
  struct item {
    task fn;
    int64_t enqueue_ns;
  };
  void run();

  step_kind kind_;
  int index_;
  bool inline_;
  std::mutex mutex_;
  std::condition_variable cv_;
  std::deque<item> queue_;
  bool worker_sleeping_ = false;
  std::atomic<bool> stopping_{false};
  int64_t clock_ns_ = 0;  // worker's timeline (caller's in inline mode)
  std::mutex error_mutex_;
  error error_;
  int engine_ = -1;
  std::thread worker_;
};

}  // namespace ag::gpu::host
