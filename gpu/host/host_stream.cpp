#include "gpu/host/host_stream.hpp"

#include <utility>

namespace ag::gpu::host {

void event_state::reach(uint64_t gen, int64_t ns) noexcept {
  uint64_t cur = reached_.load(std::memory_order_acquire);
  if (cur >= gen) return;  // a later record already completed (re-record replaced this one)
  completion_ns_.store(ns, std::memory_order_release);
  while (cur < gen && !reached_.compare_exchange_weak(cur, gen, std::memory_order_acq_rel)) {
  }
  // Taking the lock orders this notify after a waiter's check-then-wait.
  { std::lock_guard<std::mutex> lk(mutex_); }
  cv_.notify_all();
}

void event_state::wait_for(uint64_t gen) const {
  if (reached(gen)) return;
  std::unique_lock<std::mutex> lk(mutex_);
  const parked p(waiters_);
  cv_.wait(lk, [&] { return reached(gen); });
}

host_stream::host_stream(step_kind kind, int index, bool inline_mode)
    : kind_(kind), index_(index), inline_(inline_mode) {
  if (!inline_) worker_ = std::thread([this] { run(); });
}

host_stream::~host_stream() {
  {
    std::lock_guard<std::mutex> lk(mutex_);
    stopping_.store(true, std::memory_order_release);
  }
  cv_.notify_all();
  if (worker_.joinable()) worker_.join();
}

void host_stream::submit(task t) {
  if (inline_) {
    task_context ctx{0, clock_ns_, dropping()};  // untimed: no enqueue time (header)
    t(ctx);
    return;
  }
  const int64_t now = host_clock_ns();
  bool wake;
  {
    std::lock_guard<std::mutex> lk(mutex_);
    queue_.push_back(item{std::move(t), now});
    wake = worker_sleeping_;
  }
  if (wake) cv_.notify_one();
}

void host_stream::drain() {
  if (inline_) return;
  std::mutex m;
  std::condition_variable cv;
  bool done = false;
  submit([&](task_context&) {
    std::lock_guard<std::mutex> lk(m);
    done = true;
    cv.notify_one();
  });
  std::unique_lock<std::mutex> lk(m);
  cv.wait(lk, [&] { return done; });
}

void host_stream::set_error(error e) {
  std::lock_guard<std::mutex> lk(error_mutex_);
  if (!error_) error_ = std::move(e);
}

error host_stream::take_error() {
  std::lock_guard<std::mutex> lk(error_mutex_);
  return std::exchange(error_, error{});
}

void host_stream::run() {
  std::deque<item> batch;
  for (;;) {
    {
      std::unique_lock<std::mutex> lk(mutex_);
      while (queue_.empty() && !stopping_.load(std::memory_order_relaxed)) {
        worker_sleeping_ = true;
        cv_.wait(lk);
        worker_sleeping_ = false;
      }
      if (queue_.empty()) return;  // stopping and nothing left
      batch.swap(queue_);
    }
    for (auto& it : batch) {
      task_context ctx{it.enqueue_ns, clock_ns_, dropping()};
      it.fn(ctx);
    }
    batch.clear();
  }
}

}  // namespace ag::gpu::host
