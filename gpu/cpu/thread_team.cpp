#include "gpu/cpu/thread_team.hpp"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <deque>
#include <exception>
#include <mutex>
#include <thread>

namespace ag::gpu::cpu {

namespace {

// How long a thread that ran out of work polls before it blocks: a helper
// for the next call's parts, a caller for its helpers to leave. A kernel
// follows a kernel within microseconds in a job; a futex wake-up costs tens
// of them, and left BLAS's spinning threads faster on a decode step.
// AG_CPU_SPIN_US overrides it (0: block at once).
std::chrono::nanoseconds spin_time() {
  static const std::chrono::nanoseconds t = [] {
    long us = 100;
    if (const char* e = std::getenv("AG_CPU_SPIN_US")) us = std::max(0L, std::strtol(e, nullptr, 10));
    return std::chrono::nanoseconds(std::chrono::microseconds(us));
  }();
  return t;
}

// Polls ready() until it holds (true) or spin_time() passes (false).
template <class Ready>
bool spin_until(Ready&& ready) {
  const auto limit = spin_time();
  if (limit.count() == 0) return ready();
  const auto start = std::chrono::steady_clock::now();
  for (int round = 0;; ++round) {
    if (ready()) return true;
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
    if ((round & 63) == 63 && std::chrono::steady_clock::now() - start > limit) return ready();
  }
}

// One run_parts call's parts. Lives on the caller's stack: the caller
// returns only after taking it off the open list (under the team's mutex)
// and after every helper that joined it has left (`inside` 0, which a
// helper's last act on it makes so), so no helper touches it afterwards.
struct batch {
  const std::function<void(int)>* part;
  int parts;
  int helpers_wanted;          // at most this many helpers join
  std::atomic<int> next{0};    // the next part to claim
  int joined = 0;              // helpers that joined (under the mutex)
  std::atomic<int> inside{0};  // helpers still running its parts (changed under the mutex)
};

// Claims and runs parts until none is left.
void run_claimed(batch& b) {
  for (int i; (i = b.next.fetch_add(1, std::memory_order_relaxed)) < b.parts;) (*b.part)(i);
}

class team {
 public:
  // Never destroyed: helpers sleep on its condition variable until the
  // process ends (a static destructor joining them could run while another
  // thread still calls run_parts during exit).
  static team& get() {
    static team* t = new team;
    return *t;
  }

  void run(int parts, int threads, const std::function<void(int)>& part) {
    int wake = 0;
    batch b;
    b.part = &part;
    b.parts = parts;
    b.helpers_wanted = std::min(threads - 1, parts - 1);
    {
      std::lock_guard<std::mutex> lock(mutex_);
      for (int have = started_.load(std::memory_order_relaxed); have < b.helpers_wanted; ++have) {
        try {
          std::thread([this] { helper_loop(); }).detach();
        } catch (const std::system_error&) {
          break;  // no more threads: the parts run on those there are
        }
        started_.store(have + 1, std::memory_order_relaxed);
      }
      open_.push_back(&b);
      open_count_.store(static_cast<int>(open_.size()), std::memory_order_release);
      wake = std::min(b.helpers_wanted, sleeping_);
    }
    // Helpers still polling take the batch without a wake-up.
    for (int i = 0; i < wake; ++i) work_.notify_one();
    std::exception_ptr thrown;
    try {
      run_claimed(b);
    } catch (...) {  // a part on this thread threw: stop handing parts out, then let the helpers leave
      thrown = std::current_exception();
      b.next.store(b.parts, std::memory_order_relaxed);
    }
    {
      std::unique_lock<std::mutex> lock(mutex_);
      // Every part is claimed: no helper may join from here on.
      if (auto it = std::find(open_.begin(), open_.end(), &b); it != open_.end()) open_.erase(it);
      open_count_.store(static_cast<int>(open_.size()), std::memory_order_release);
    }
    // The helpers inside are running its last parts: poll, then block.
    if (!spin_until([&] { return b.inside.load(std::memory_order_acquire) == 0; })) {
      std::unique_lock<std::mutex> lock(mutex_);
      left_.wait(lock, [&] { return b.inside.load(std::memory_order_relaxed) == 0; });
    }
    // A helper touches `b` no more once its decrement is seen: `b` may go.
    if (thrown) std::rethrow_exception(thrown);
  }

  int started() const noexcept { return started_.load(std::memory_order_relaxed); }

 private:
  void helper_loop() {
    std::unique_lock<std::mutex> lock(mutex_);
    for (;;) {
      if (open_.empty()) {
        lock.unlock();
        spin_until([&] { return open_count_.load(std::memory_order_acquire) > 0; });
        lock.lock();
        ++sleeping_;
        work_.wait(lock, [&] { return !open_.empty(); });
        --sleeping_;
      }
      batch* b = open_.front();
      if (++b->joined >= b->helpers_wanted) {  // as many helpers as it asked for
        open_.pop_front();
        open_count_.store(static_cast<int>(open_.size()), std::memory_order_release);
      }
      b->inside.fetch_add(1, std::memory_order_relaxed);
      lock.unlock();
      run_claimed(*b);
      lock.lock();
      // Its caller polls `inside`, or blocks on left_ once it stops polling.
      if (b->inside.fetch_sub(1, std::memory_order_release) == 1) left_.notify_all();
    }
  }

  std::mutex mutex_;
  std::condition_variable work_;  // helpers wait for an open batch
  std::condition_variable left_;  // callers wait for their helpers to leave
  std::deque<batch*> open_;       // batches that still take helpers
  std::atomic<int> open_count_{0};  // open_.size(), for helpers polling without the mutex
  int sleeping_ = 0;              // helpers blocked on work_ (under the mutex)
  std::atomic<int> started_{0};   // helpers started (written under the mutex)
};

}  // namespace

void run_parts(int parts, int threads, const std::function<void(int)>& part) {
  if (parts <= 0) return;
  threads = std::min(threads, team_threads_max);
  if (threads <= 1 || parts == 1) {
    for (int i = 0; i < parts; ++i) part(i);
    return;
  }
  team::get().run(parts, threads, part);
}

int team_helpers() noexcept { return team::get().started(); }

int machine_parts() noexcept {
  static const int parts = std::clamp(static_cast<int>(std::thread::hardware_concurrency()), 1, 64);
  return parts;
}

}  // namespace ag::gpu::cpu
