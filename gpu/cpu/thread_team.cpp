#include "gpu/cpu/thread_team.hpp"

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <deque>
#include <exception>
#include <mutex>
#include <thread>

namespace ag::gpu::cpu {

namespace {

// One run_parts call's parts. Lives on the caller's stack: the caller
// returns only after taking it off the open list and after every helper
// that joined it has left (`inside` 0), both under the team's mutex, so no
// helper touches it afterwards.
struct batch {
  const std::function<void(int)>* part;
  int parts;
  int helpers_wanted;          // at most this many helpers join
  std::atomic<int> next{0};    // the next part to claim
  int joined = 0;              // helpers that joined (under the mutex)
  int inside = 0;              // helpers still running its parts (under the mutex)
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
    }
    for (int i = 0; i < b.helpers_wanted; ++i) work_.notify_one();
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
      left_.wait(lock, [&] { return b.inside == 0; });
    }
    if (thrown) std::rethrow_exception(thrown);
  }

  int started() const noexcept { return started_.load(std::memory_order_relaxed); }

 private:
  void helper_loop() {
    std::unique_lock<std::mutex> lock(mutex_);
    for (;;) {
      work_.wait(lock, [&] { return !open_.empty(); });
      batch* b = open_.front();
      if (++b->joined >= b->helpers_wanted) open_.pop_front();  // as many helpers as it asked for
      ++b->inside;
      lock.unlock();
      run_claimed(*b);
      lock.lock();
      if (--b->inside == 0) left_.notify_all();  // its caller may be waiting
    }
  }

  std::mutex mutex_;
  std::condition_variable work_;  // helpers wait for an open batch
  std::condition_variable left_;  // callers wait for their helpers to leave
  std::deque<batch*> open_;       // batches that still take helpers
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

}  // namespace ag::gpu::cpu
