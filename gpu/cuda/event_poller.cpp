// The event poller (event_poller.hpp): its thread, back-off and pools.

#include "gpu/cuda/event_poller.hpp"

#include <chrono>

#include "gpu/cuda/cuda_check.cuh"
#include "gpu/cuda/device_core.hpp"
#include "gpu/cuda/device_guard.hpp"
#include "gpu/cuda/host_clock.hpp"
#include "gpu/cuda/slow_call.hpp"

#if defined(__x86_64__) || defined(_M_X64)
#include <immintrin.h>
#define AG_CPU_RELAX() _mm_pause()
#else
#define AG_CPU_RELAX() std::this_thread::yield()
#endif

namespace ag::gpu::cuda::detail {

poller::~poller() {
  device_guard g(ordinal_);
  for (cudaEvent_t e : free_events_) AG_CUDA_ASSERT(cudaEventDestroy(e));
  for (unsigned int* s : slab_) AG_CUDA_ASSERT(cudaFreeHost(s));
}

void poller::start(const std::shared_ptr<poller>& self) {
  thread_ = std::thread([self] { self->run(); });
}

void poller::stop() {
  stop_.store(true, std::memory_order_release);
  wake();
  if (!thread_.joinable()) return;
  if (thread_.get_id() == std::this_thread::get_id()) thread_.detach();
  else thread_.join();
}

void poller::push(poll_item it) {
  q_.enqueue(std::move(it));
  wake();
}

void poller::push_launch(launch_item it) {
  {
    std::lock_guard<std::mutex> lk(launch_mu_);
    launches_.push_back(std::move(it));
    launches_handed_.fetch_add(1, std::memory_order_release);
  }
  wake();
}

void poller::drain_launches() const {
  const uint64_t handed = launches_handed_.load(std::memory_order_acquire);
  if (launches_issued_.load(std::memory_order_acquire) >= handed) return;
  if (thread_id_.load(std::memory_order_relaxed) == std::this_thread::get_id()) return;
  while (launches_issued_.load(std::memory_order_acquire) < handed) AG_CPU_RELAX();
}

bool poller::issue_launches(std::vector<poll_item>& pending) {
  if (launches_issued_.load(std::memory_order_relaxed) == launches_handed_.load(std::memory_order_acquire))
    return false;
  {
    std::lock_guard<std::mutex> lk(launch_mu_);
    issuing_.swap(launches_);
  }
  for (launch_item& l : issuing_) {
    poll_item& it = l.then;
    core& c = *l.owner;
    if (!c.alive.load(std::memory_order_acquire)) {
      it.early = c.dead_error();
    } else if (error e = AG_CORE_CHECK(c, cudaGraphLaunch(l.exec, l.stream), c.name + " graph replay")) {
      it.early = std::move(e).concerning(c.index);
    } else {
      record_notification(c, it, l.stream);
    }
    pending.push_back(std::move(it));
    l.owner.reset();
    // Issued: a device call waiting in drain_launches() may go on.
    launches_issued_.fetch_add(1, std::memory_order_release);
  }
  issuing_.clear();
  return true;
}

void poller::record_notification(core& c, poll_item& it, cudaStream_t s) {
  it.ev = take_event();
  if (!it.ev) {
    it.early = error(errc::device_failed, c.name + ": notify could not create an event");
  } else if (error e = AG_CORE_CHECK(c, cudaEventRecord(it.ev, s), c.name + " notify")) {
    give_event(it.ev);
    it.ev = nullptr;
    it.early = std::move(e);
  }
}

cudaEvent_t poller::take_event() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (!free_events_.empty()) {
      cudaEvent_t e = free_events_.back();
      free_events_.pop_back();
      return e;
    }
  }
  device_guard g(ordinal_);
  cudaEvent_t e = nullptr;
  if (cudaEventCreateWithFlags(&e, cudaEventDisableTiming) != cudaSuccess) {
    (void)cudaGetLastError();
    return nullptr;
  }
  return e;
}

void poller::give_event(cudaEvent_t e) {
  std::lock_guard<std::mutex> lk(mu_);
  free_events_.push_back(e);
}

unsigned int* poller::take_slot() {
  std::lock_guard<std::mutex> lk(mu_);
  if (free_slots_.empty()) {
    device_guard g(ordinal_);
    constexpr int n = 1024;
    void* p = nullptr;
    slow_call probe(name_, "cudaHostAlloc (host-wait flags)");
    if (cudaHostAlloc(&p, n * sizeof(unsigned int), cudaHostAllocMapped | cudaHostAllocPortable) != cudaSuccess) {
      (void)cudaGetLastError();
      return nullptr;
    }
    auto* words = static_cast<unsigned int*>(p);
    slab_.push_back(words);
    for (int i = 0; i < n; ++i) free_slots_.push_back(words + i);
  }
  unsigned int* s = free_slots_.back();
  free_slots_.pop_back();
  __atomic_store_n(s, 0u, __ATOMIC_RELEASE);
  return s;
}

void poller::wake() {
  seq_.fetch_add(1, std::memory_order_release);
  seq_.notify_one();
}

bool poller::poll(poll_item& it) {
  if (it.k == poll_item::kind::foreign_wait) {
    if (!it.released) {
      if (!(stop_.load(std::memory_order_acquire) || dead.load(std::memory_order_acquire) || it.foreign->query()))
        return false;
      __atomic_store_n(it.slot, 1u, __ATOMIC_RELEASE);
      it.released = true;
    }
    // Recycle the flag once the GPU passed it (it stores 2); a dead device never will.
    if (__atomic_load_n(it.slot, __ATOMIC_ACQUIRE) == 2u) {
      std::lock_guard<std::mutex> lk(mu_);
      free_slots_.push_back(it.slot);
      return true;
    }
    return dead.load(std::memory_order_acquire) || stop_.load(std::memory_order_acquire);
  }
  if (it.early) {
    finish(it, it.early);
    return true;
  }
  if (dead.load(std::memory_order_acquire)) {
    finish(it, death);
    return true;
  }
  const cudaError_t r = cudaEventQuery(it.ev);
  if (r == cudaErrorNotReady) return false;
  if (r == cudaSuccess) {
    finish(it, it.fault ? it.fault->take(name_) : error{});
    return true;
  }
  error e = cuda_error(r, name_, "cudaEventQuery", __FILE__, __LINE__);
  if (is_sticky(r)) {
    declare_dead(error(errc::device_failed, e.message));
    finish(it, death);
  } else {
    finish(it, e);
  }
  return true;
}

void poller::declare_dead(error e) {
  if (dead.load(std::memory_order_acquire)) return;
  death = std::move(e);
  dead.store(true, std::memory_order_release);
  if (on_death) on_death(death);
}

void poller::finish(poll_item& it, const error& e) {
  if (it.ev) give_event(it.ev);
  it.ev = nullptr;
  auto done = std::move(it.done);
  if (!done) return;
  // A callback may take long (it runs the job's continuations, the user's
  // code): the launches handed over so far are issued first, and while it
  // runs the thread does not count as awake, so callers launch themselves
  // rather than wait for it. (One handed over in the instant between the
  // caller's awake() and this store still waits for the callback.)
  awake_.store(false, std::memory_order_relaxed);
  issue_launches(issued_in_callbacks_);
  done(e);
  awake_.store(true, std::memory_order_relaxed);
}

void poller::run() {
  // The thread keeps this device current (event queries and launches need no guard).
  if (cudaSetDevice(ordinal_) != cudaSuccess) (void)cudaGetLastError();
  thread_id_.store(std::this_thread::get_id(), std::memory_order_relaxed);
  awake_.store(true, std::memory_order_relaxed);
  std::vector<poll_item> pending;
  int64_t last_progress = now_ns();
  // Back-off: spin while work completed recently, then yield, then sleep;
  // block on the sequence counter when nothing is pending at all.
  constexpr int64_t spin_ns = 200'000, yield_ns = 5'000'000;
  for (;;) {
    const uint32_t seen = seq_.load(std::memory_order_acquire);
    bool progressed = issue_launches(pending);
    poll_item it;
    while (q_.try_dequeue(it)) {
      pending.push_back(std::move(it));
      progressed = true;
    }
    for (std::size_t i = 0; i < pending.size();) {
      if (poll(pending[i])) {
        if (i + 1 != pending.size()) pending[i] = std::move(pending.back());
        pending.pop_back();
        progressed = true;
      } else {
        ++i;
      }
    }
    for (poll_item& f : issued_in_callbacks_) pending.push_back(std::move(f));
    issued_in_callbacks_.clear();
    const int64_t t = now_ns();
    if (progressed) last_progress = t;
    if (pending.empty()) {
      const bool idle = q_.size_approx() == 0 &&
                        launches_issued_.load(std::memory_order_relaxed) ==
                            launches_handed_.load(std::memory_order_acquire);
      if (stop_.load(std::memory_order_acquire) && idle) break;
      if (t - last_progress < spin_ns) {
        AG_CPU_RELAX();
        continue;
      }
      awake_.store(false, std::memory_order_relaxed);
      seq_.wait(seen, std::memory_order_acquire);
      awake_.store(true, std::memory_order_relaxed);
      last_progress = now_ns();
      continue;
    }
    const int64_t idle = t - last_progress;
    if (idle < spin_ns) AG_CPU_RELAX();
    else if (idle < yield_ns) std::this_thread::yield();
    else {
      // Asleep for a while: a launch handed over now would wait for it.
      awake_.store(false, std::memory_order_relaxed);
      std::this_thread::sleep_for(std::chrono::microseconds(20));
      awake_.store(true, std::memory_order_relaxed);
    }
  }
}

}  // namespace ag::gpu::cuda::detail
