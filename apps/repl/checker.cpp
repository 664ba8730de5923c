#include "apps/repl/checker.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>

#include "apps/repl/format.hpp"
#include "graph/reference.hpp"

namespace ag::repl {

// ------------------------------------------------------------ event queue

event_queue::event_queue() {
  int fds[2];
  if (::pipe2(fds, O_NONBLOCK | O_CLOEXEC) == 0) {
    rfd_ = fds[0];
    wfd_ = fds[1];
  }
}

event_queue::~event_queue() {
  if (rfd_ >= 0) ::close(rfd_);
  if (wfd_ >= 0) ::close(wfd_);
}

void event_queue::push(event e) {
  {
    std::lock_guard<std::mutex> g(m_);
    q_.push_back(std::move(e));
  }
  poke();
}

void event_queue::poke() const noexcept {
  const char c = 1;
  [[maybe_unused]] auto r = ::write(wfd_, &c, 1);  // a full pipe is fine: the reader drains all
}

std::deque<event> event_queue::take() {
  if (rfd_ >= 0) {
    char buf[256];
    while (::read(rfd_, buf, sizeof buf) > 0) {
    }
  }
  std::lock_guard<std::mutex> g(m_);
  std::deque<event> out;
  out.swap(q_);
  return out;
}

// ------------------------------------------------------------ speed

double reference_flops_per_second() {
  static const double rate = [] {
    constexpr int64_t n = 128;
    graph_builder b;
    auto x = b.input("x", dtype::f32, {n, n});
    auto w = b.weight("w", host_tensor::random_normal(dtype::f32, {n, n}, 2));
    b.output(b.matmul(x, w));
    auto g = std::move(b).build();
    if (!g) return 1e9;
    const std::vector<host_tensor> in{host_tensor::random_normal(dtype::f32, {n, n}, 3)};
    double best = 1e9;
    for (int rep = 0; rep < 3; ++rep) {
      const auto t0 = std::chrono::steady_clock::now();
      auto r = evaluate_reference(*g, in);
      const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      if (r) best = std::min(best, s);
    }
    return 2.0 * n * n * n / std::max(best, 1e-6);
  }();
  return rate;
}

// ------------------------------------------------------------ checker

checker::checker(std::shared_ptr<event_queue> events) : events_(std::move(events)) {
  thread_ = std::thread([this] { loop(); });
}

checker::~checker() {
  {
    std::lock_guard<std::mutex> g(m_);
    quit_ = true;
  }
  quitting_.store(true);
  cv_.notify_all();
  thread_.join();
}

void checker::post(task t) {
  {
    std::lock_guard<std::mutex> g(m_);
    q_.push_back(std::move(t));
  }
  cv_.notify_one();
}

void checker::stop_all() {
  std::deque<task> dropped;
  {
    std::lock_guard<std::mutex> g(m_);
    generation_.fetch_add(1);
    dropped.swap(q_);
  }
  for (const task& t : dropped) events_->push({event::kind::checked, t.id, check_status::stopped, "check: stopped"});
}

void checker::loop() {
  for (;;) {
    task t;
    {
      std::unique_lock<std::mutex> g(m_);
      cv_.wait(g, [this] { return quit_ || !q_.empty(); });
      if (quit_) return;
      t = std::move(q_.front());
      q_.pop_front();
    }
    event e;
    try {
      e = check(t);
    } catch (const std::exception& ex) {  // bad_alloc on a graph too big for the reference
      e = {event::kind::checked, t.id, check_status::bad, std::string("check: error (") + ex.what() + ")"};
    }
    if (quitting_.load()) return;
    events_->push(std::move(e));
  }
}

event checker::check(const task& t) const {
  event e{event::kind::checked, t.id, check_status::bad, {}};
  auto stopped = [&] {
    e.status = check_status::stopped;
    e.text = "check: stopped";
    return e;
  };
  if (stale(t)) return stopped();
  const job_result& r = t.handle.wait();
  if (!r) {
    e.status = check_status::skipped;
    e.text = "check: skipped (job failed)";
    return e;
  }
  auto ref = evaluate_reference(*t.g, t.inputs, [this, &t] { return quitting_.load() || stale(t); });
  if (!ref && ref.err().code == errc::cancelled) return stopped();
  if (!ref) {
    e.text = "check: reference failed: " + ref.err().to_string();
    return e;
  }
  if (ref->size() != r->size()) {
    e.text = fmt("check: MISMATCH (%zu outputs, reference has %zu)", r->size(), ref->size());
    return e;
  }
  double max_err = 0;
  for (std::size_t i = 0; i < r->size(); ++i) {
    const dtype ty = (*ref)[i].type();
    const double tol = ty == dtype::f32 ? 2e-3 : ty == dtype::f16 ? 3e-2 : ty == dtype::bf16 ? 1e-1 : 0;
    const compare_result c = compare((*r)[i], (*ref)[i], tol, tol);
    max_err = std::max(max_err, c.max_abs_err);
    if (!c.ok) {
      e.text = fmt("check: MISMATCH (output %zu: %s)", i, c.message.c_str());
      return e;
    }
  }
  e.status = check_status::ok;
  e.text = fmt("check: ok (max err %.2g)", max_err);
  return e;
}

}  // namespace ag::repl
