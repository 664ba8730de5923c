// The CUDA device: memory, streams, events, op dispatch, and the poller that
// turns GPU completion into host callbacks.
//
// Ownership: a cuda_device holds a shared `core` (ordinal, event pool, poller,
// death state); its streams and events hold the core too, so they may outlive
// the device object. The poller thread owns its own state through a
// shared_ptr, so dropping the last device reference from inside a notify
// callback (on the poller thread) is safe.

#include <cuda_runtime.h>
#include <cublas_v2.h>

#if __has_include(<concurrentqueue/moodycamel/concurrentqueue.h>)
#include <concurrentqueue/moodycamel/concurrentqueue.h>
#else
#include <concurrentqueue/concurrentqueue.h>
#endif

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <thread>
#include <map>
#include <unordered_map>

#include "gpu/cuda/cuda_backend.hpp"
#include "gpu/cuda/cuda_check.cuh"
#include "gpu/cuda/cuda_testing.hpp"
#include "gpu/cuda/elementwise.cuh"
#include "gpu/cuda/gemm.cuh"
#include "gpu/cuda/get_rows.cuh"
#include "gpu/cuda/kernel_args.hpp"
#include "gpu/cuda/norm.cuh"
#include "gpu/cuda/rope.cuh"
#include "gpu/cuda/softmax.cuh"
#include "gpu/cuda/sync.cuh"

#if defined(__x86_64__) || defined(_M_X64)
#include <immintrin.h>
#define AG_CPU_RELAX() _mm_pause()
#else
#define AG_CPU_RELAX() std::this_thread::yield()
#endif

namespace ag::gpu::cuda {
namespace {

// Same clock as ag::gpu::host_clock_ns (steady_clock), without a link-time
// dependency on ag_gpu (which links this library).
int64_t now_ns() noexcept {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

/// Sets the calling thread's current device for its scope and restores it.
class device_guard {
 public:
  explicit device_guard(int ordinal) noexcept {
    if (cudaGetDevice(&prev_) != cudaSuccess) {
      (void)cudaGetLastError();
      prev_ = -1;
    }
    if (prev_ != ordinal) {
      if (cudaSetDevice(ordinal) == cudaSuccess) changed_ = true;
      else (void)cudaGetLastError();
    }
  }
  ~device_guard() {
    if (changed_ && prev_ >= 0) AG_CUDA_LOG(cudaSetDevice(prev_));
  }
  device_guard(const device_guard&) = delete;
  device_guard& operator=(const device_guard&) = delete;

 private:
  int prev_ = -1;
  bool changed_ = false;
};

/// A per-stream fault word in host-mapped pinned memory (kernels report data
/// errors there); shared by the stream and its pending notifications.
struct fault_cell {
  unsigned int* host = nullptr;
  unsigned int* dev = nullptr;
  ~fault_cell() {
    if (host) AG_CUDA_ASSERT(cudaFreeHost(host));
  }
  /// Reads and clears the word; an error for a nonzero code.
  error take(const std::string& where) {
    if (!host) return {};
    const unsigned int code = __atomic_exchange_n(host, 0u, __ATOMIC_ACQ_REL);
    if (code == fault_none) return {};
    if (code == fault_get_rows_oob)
      return error(errc::op_failed, where + ": get_rows met an id outside [0, V) (that row was written as zeros)");
    return error(errc::op_failed, where + ": kernel fault code " + std::to_string(code));
  }
};

// ---------------------------------------------------------------------------
// Poller: one thread per device serving notify() and host-event waits.

struct poll_item {
  enum class kind : uint8_t { notify, foreign_wait } k = kind::notify;
  cudaEvent_t ev = nullptr;                     // notify: recorded after the stream's work
  std::shared_ptr<fault_cell> fault;            // notify: the stream's fault word
  std::function<void(const error&)> done;       // notify
  error early;                                  // notify: failed already at enqueue
  const event* foreign = nullptr;               // foreign_wait: a non-CUDA event
  unsigned int* slot = nullptr;                 // foreign_wait: host-mapped flag
  bool released = false;                        // foreign_wait: flag set to 1
};

class poller {
 public:
  poller(int ordinal, std::string name) : ordinal_(ordinal), name_(std::move(name)) {}
  ~poller() {
    device_guard g(ordinal_);
    for (cudaEvent_t e : free_events_) AG_CUDA_ASSERT(cudaEventDestroy(e));
    for (unsigned int* s : slab_) AG_CUDA_ASSERT(cudaFreeHost(s));
  }

  void start(const std::shared_ptr<poller>& self) {
    thread_ = std::thread([self] { self->run(); });
  }
  /// Stops the thread once pending work has drained. Safe on the poller thread.
  void stop() {
    stop_.store(true, std::memory_order_release);
    wake();
    if (!thread_.joinable()) return;
    if (thread_.get_id() == std::this_thread::get_id()) thread_.detach();
    else thread_.join();
  }

  void push(poll_item it) {
    q_.enqueue(std::move(it));
    wake();
  }

  /// A notification event (timing disabled) from the pool; nullptr on failure.
  cudaEvent_t take_event() {
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
  void give_event(cudaEvent_t e) {
    std::lock_guard<std::mutex> lk(mu_);
    free_events_.push_back(e);
  }

  /// A host-mapped flag word, zeroed; nullptr on failure.
  unsigned int* take_slot() {
    std::lock_guard<std::mutex> lk(mu_);
    if (free_slots_.empty()) {
      device_guard g(ordinal_);
      constexpr int n = 1024;
      void* p = nullptr;
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

  /// Called once from the poller thread when an event query reports a sticky error.
  std::function<void(const error&)> on_death;
  std::atomic<bool> dead{false};
  error death;  // written once before `dead` is set

 private:
  void wake() {
    seq_.fetch_add(1, std::memory_order_release);
    seq_.notify_one();
  }

  // Returns true when the item is finished (and its callback ran).
  bool poll(poll_item& it) {
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

  void declare_dead(error e) {
    if (dead.load(std::memory_order_acquire)) return;
    death = std::move(e);
    dead.store(true, std::memory_order_release);
    if (on_death) on_death(death);
  }

  void finish(poll_item& it, const error& e) {
    if (it.ev) give_event(it.ev);
    it.ev = nullptr;
    auto done = std::move(it.done);
    if (done) done(e);
  }

  void run() {
    // The thread keeps this device current (event queries need no guard).
    if (cudaSetDevice(ordinal_) != cudaSuccess) (void)cudaGetLastError();
    std::vector<poll_item> pending;
    int64_t last_progress = now_ns();
    // Back-off: spin while work completed recently, then yield, then sleep;
    // block on the sequence counter when nothing is pending at all.
    constexpr int64_t spin_ns = 200'000, yield_ns = 5'000'000;
    for (;;) {
      const uint32_t seen = seq_.load(std::memory_order_acquire);
      bool progressed = false;
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
      const int64_t t = now_ns();
      if (progressed) last_progress = t;
      if (pending.empty()) {
        if (stop_.load(std::memory_order_acquire) && q_.size_approx() == 0) break;
        if (t - last_progress < spin_ns) {
          AG_CPU_RELAX();
          continue;
        }
        seq_.wait(seen, std::memory_order_acquire);
        last_progress = now_ns();
        continue;
      }
      const int64_t idle = t - last_progress;
      if (idle < spin_ns) AG_CPU_RELAX();
      else if (idle < yield_ns) std::this_thread::yield();
      else std::this_thread::sleep_for(std::chrono::microseconds(20));
    }
  }

  int ordinal_;
  std::string name_;
  moodycamel::ConcurrentQueue<poll_item> q_;
  std::atomic<uint32_t> seq_{0};
  std::atomic<bool> stop_{false};
  std::thread thread_;
  std::mutex mu_;
  std::vector<cudaEvent_t> free_events_;
  std::vector<unsigned int*> free_slots_;
  std::vector<unsigned int*> slab_;
};

// ---------------------------------------------------------------------------

/// State shared by a device, its streams and its events.
struct core {
  int ordinal = 0;
  std::string name;
  std::shared_ptr<poller> poll;
  std::atomic<bool> alive{true};
  std::mutex fault_mu;
  std::function<void(const error&)> fault_handler;
  bool fault_reported = false;
  error death;

  // Event pool (timing disabled) for create_event().
  std::mutex pool_mu;
  std::vector<cudaEvent_t> pool;

  // Host-clock mapping of timing events (see calibrate()): ref_event was
  // reached at host time ref_ns; GPU time advances `rate` host ns per GPU ns.
  std::mutex clock_mu;
  cudaEvent_t ref_event = nullptr;
  cudaEvent_t spare_event = nullptr;  // the other sample / the previous anchor
  int64_t ref_ns = 0;
  int64_t anchored_at_ns = 0;         // host time of the last calibration
  double rate = 1.0;
  // Created by the first calibrate() and kept: stream creation can hold the
  // driver lock for long, and calibrate() runs again every second.
  cudaStream_t clock_stream = nullptr;

  ~core() {
    if (poll) poll->stop();
    device_guard g(ordinal);
    for (cudaEvent_t e : pool) AG_CUDA_ASSERT(cudaEventDestroy(e));
    if (ref_event) AG_CUDA_ASSERT(cudaEventDestroy(ref_event));
    if (spare_event) AG_CUDA_ASSERT(cudaEventDestroy(spare_event));
    if (clock_stream) AG_CUDA_ASSERT(cudaStreamDestroy(clock_stream));
  }

  error dead_error() const {
    return error(errc::device_failed, name + " is dead" + (death.message.empty() ? "" : ": " + death.message));
  }

  /// Marks the device dead once and reports it to the fault handler.
  void mark_dead(const error& e) {
    std::function<void(const error&)> h;
    {
      std::lock_guard<std::mutex> lk(fault_mu);
      if (fault_reported) return;
      fault_reported = true;
      death = e;
      alive.store(false, std::memory_order_release);
      h = fault_handler;
    }
    if (h) h(e);
  }

  /// Checks a CUDA result: sticky errors kill the device.
  error check(cudaError_t r, const std::string& where, const char* call, const char* file, int line) {
    if (r == cudaSuccess) return {};
    error e = cuda_error(r, where, call, file, line);
    if (is_sticky(r)) mark_dead(e);
    return e;
  }

  /// (Re)anchors timing events to the host clock. Caller holds clock_mu (or
  /// no other thread can see the core yet).
  ///
  /// One sample: note the host time t0, record an event on an idle private
  /// stream, spin on cudaEventQuery until it completes, note t1. The GPU
  /// reached the event inside [t0, t1], most of which is launch latency; it
  /// was reached at most one query round trip (~1 us) before t1. Of several
  /// samples the one with the narrowest bracket becomes the anchor (ref_ns =
  /// its t1), so a sample disturbed by preemption or a busy PCIe link is not.
  /// With a previous anchor at least 0.2 s older, the GPU-vs-host clock rate
  /// is re-estimated from the pair: GPU and host oscillators differ by some
  /// ppm, which over seconds is tens of us, more than a completion latency.
  /// completion_ns() re-anchors every second, so errors stay at ~1 us.
  error calibrate() {
    device_guard g(ordinal);
    if (!ref_event) AG_CUDA_TRY(cudaEventCreate(&ref_event), name);
    if (!spare_event) AG_CUDA_TRY(cudaEventCreate(&spare_event), name);
    if (!clock_stream) AG_CUDA_TRY(cudaStreamCreateWithFlags(&clock_stream, cudaStreamNonBlocking), name);
    cudaStream_t s = clock_stream;
    // The previous anchor, if any, moves to `spare_event` only once a better
    // one exists; samples go into `candidate`.
    const bool had_anchor = anchored_at_ns != 0;
    const int64_t old_ns = ref_ns;
    cudaEvent_t candidate = nullptr;
    error err;
    if (cudaError_t r = cudaEventCreate(&candidate); r != cudaSuccess)
      err = cuda_error(r, name + " clock calibration", "cudaEventCreate", __FILE__, __LINE__);
    cudaEvent_t best = nullptr;
    int64_t best_window = INT64_MAX, best_t1 = 0;
    constexpr int samples = 8;
    for (int i = 0; i < samples && !err; ++i) {
      const int64_t t0 = now_ns();
      cudaError_t r = cudaEventRecord(candidate, s);
      if (r == cudaSuccess)
        while ((r = cudaEventQuery(candidate)) == cudaErrorNotReady) {
        }
      const int64_t t1 = now_ns();
      if (r != cudaSuccess) {
        err = cuda_error(r, name + " clock calibration", "cudaEventRecord/Query", __FILE__, __LINE__);
        break;
      }
      if (t1 - t0 < best_window) {
        best_window = t1 - t0;
        best_t1 = t1;
        std::swap(best, candidate);
        if (!candidate) {
          if (cudaError_t c = cudaEventCreate(&candidate); c != cudaSuccess)
            err = cuda_error(c, name + " clock calibration", "cudaEventCreate", __FILE__, __LINE__);
        }
      }
    }
    if (candidate) AG_CUDA_ASSERT(cudaEventDestroy(candidate));
    if (err || !best) {
      if (best) AG_CUDA_ASSERT(cudaEventDestroy(best));
      return err ? err : error(errc::device_failed, name + ": clock calibration took no sample");
    }
    if (had_anchor) {
      float ms = 0;
      const int64_t host_dt = best_t1 - old_ns;
      if (host_dt > 200'000'000 && cudaEventElapsedTime(&ms, ref_event, best) == cudaSuccess && ms > 0) {
        const double r = static_cast<double>(host_dt) / (static_cast<double>(ms) * 1e6);
        if (r > 0.9999 && r < 1.0001) rate = r;  // beyond 100 ppm a sample was bad, not the clock
      } else {
        (void)cudaGetLastError();
      }
    }
    // best becomes the anchor; the old anchor event is reused as the spare.
    AG_CUDA_ASSERT(cudaEventDestroy(spare_event));
    spare_event = ref_event;
    ref_event = best;
    ref_ns = best_t1;
    anchored_at_ns = best_t1;
    return {};
  }
};

#define AG_CORE_CHECK(core_, call, where) (core_).check((call), (where), #call, __FILE__, __LINE__)

class cuda_stream final : public stream {
 public:
  cuda_stream(std::shared_ptr<core> c, stream_role role) : core_(std::move(c)), role_(role) {}
  ~cuda_stream() override {
    device_guard g(core_->ordinal);
    if (blas_) {
      if (cublasDestroy(blas_) != CUBLAS_STATUS_SUCCESS)
        std::fprintf(stderr, "actorgraph cuda: cublasDestroy failed on %s\n", core_->name.c_str());
    }
    // cudaStreamDestroy returns at once; cuBLAS work may still use the
    // workspace, so drain the stream before freeing it.
    if (s_ && workspace_ && core_->alive.load()) AG_CUDA_ASSERT(cudaStreamSynchronize(s_));
    if (s_) AG_CUDA_ASSERT(cudaStreamDestroy(s_));
    if (workspace_) AG_CUDA_ASSERT(cudaFree(workspace_));
  }
  stream_role role() const noexcept override { return role_; }

  error init() {
    device_guard g(core_->ordinal);
    // One priority for all roles: the driver picks copy engines by direction.
    AG_CUDA_TRY(cudaStreamCreateWithFlags(&s_, cudaStreamNonBlocking), core_->name + " create_stream");
    fault_ = std::make_shared<fault_cell>();
    void* p = nullptr;
    AG_CUDA_TRY(cudaHostAlloc(&p, sizeof(unsigned int), cudaHostAllocMapped | cudaHostAllocPortable),
                core_->name + " create_stream");
    fault_->host = static_cast<unsigned int*>(p);
    *fault_->host = 0;
    void* d = nullptr;
    AG_CUDA_TRY(cudaHostGetDevicePointer(&d, p, 0), core_->name + " create_stream");
    fault_->dev = static_cast<unsigned int*>(d);
    return {};
  }

  /// The stream's cuBLAS handle, created on first use with its own workspace
  /// (cuBLAS's advice for handles used on one stream each).
  expected<cublasHandle_t> blas(bool tf32) {
    if (!blas_) {
      if (cublasStatus_t st = cublasCreate(&blas_); st != CUBLAS_STATUS_SUCCESS) {
        blas_ = nullptr;
        return error(errc::device_failed, core_->name + ": cublasCreate failed: " + cublas_status_name(st));
      }
      cublasSetStream(blas_, s_);
      constexpr size_t ws = 32u << 20;
      if (cudaMalloc(&workspace_, ws) == cudaSuccess) cublasSetWorkspace(blas_, workspace_, ws);
      else (void)cudaGetLastError(), workspace_ = nullptr;
      cublasSetMathMode(blas_, CUBLAS_DEFAULT_MATH);
    }
    (void)tf32;  // the compute type of each call selects TF32 (gemm.cu)
    return blas_;
  }

  std::shared_ptr<core> core_;
  stream_role role_;
  cudaStream_t s_ = nullptr;
  std::shared_ptr<fault_cell> fault_;
  cublasHandle_t blas_ = nullptr;
  void* workspace_ = nullptr;
};

class cuda_event final : public event {
 public:
  cuda_event(std::shared_ptr<core> c, cudaEvent_t e, bool timing) : core_(std::move(c)), ev_(e), timing_(timing) {}
  ~cuda_event() override {
    if (!ev_) return;
    if (timing_) {
      device_guard g(core_->ordinal);
      AG_CUDA_ASSERT(cudaEventDestroy(ev_));
    } else {
      std::lock_guard<std::mutex> lk(core_->pool_mu);
      core_->pool.push_back(ev_);
    }
  }

  bool query() const override {
    if (!recorded_.load(std::memory_order_acquire) || !core_->alive.load(std::memory_order_acquire)) return true;
    const cudaError_t r = cudaEventQuery(ev_);
    if (r == cudaSuccess) return true;
    if (r == cudaErrorNotReady) return false;
    (void)cudaGetLastError();
    if (is_sticky(r)) core_->mark_dead(cuda_error(r, core_->name, "cudaEventQuery", __FILE__, __LINE__));
    return true;  // a failed event never completes otherwise: nothing may wait forever
  }
  void host_wait() const override {
    if (!recorded_.load(std::memory_order_acquire)) return;
    // Poll rather than cudaEventSynchronize so a dying device cannot hang us.
    while (!query()) std::this_thread::yield();
  }
  int64_t completion_ns() const override {
    if (!timing_ || !recorded_.load(std::memory_order_acquire)) return 0;
    std::lock_guard<std::mutex> lk(core_->clock_mu);
    // Re-anchor once a second: keeps clock-rate drift and float-ms rounding
    // of the elapsed time far below a microsecond (see core::calibrate()).
    if (now_ns() - core_->anchored_at_ns > 1'000'000'000) (void)core_->calibrate();
    float ms = 0;
    if (cudaEventElapsedTime(&ms, core_->ref_event, ev_) != cudaSuccess) {
      (void)cudaGetLastError();
      return 0;
    }
    return core_->ref_ns + static_cast<int64_t>(static_cast<double>(ms) * 1e6 * core_->rate);
  }

  std::shared_ptr<core> core_;
  cudaEvent_t ev_;
  bool timing_;
  std::atomic<bool> recorded_{false};
};

enum class notify_kind : uint8_t { poller, host_func };

struct host_func_payload {
  std::function<void(const error&)> done;
  std::shared_ptr<fault_cell> fault;
  std::shared_ptr<core> c;
};

void CUDART_CB host_func_trampoline(void* p) {
  std::unique_ptr<host_func_payload> pl(static_cast<host_func_payload*>(p));
  // No CUDA calls are allowed here (host function rules).
  error e = pl->c->alive.load() ? (pl->fault ? pl->fault->take(pl->c->name) : error{}) : pl->c->dead_error();
  pl->done(e);
}

/// Pinned staging buffers for copies between the device and pageable host
/// memory (std::vector storage of host tensors).
///
/// Why: cudaMemcpyAsync into pageable memory returns only once the copy has
/// completed, i.e. after everything queued before it on the stream, so the
/// copy-engine actor would block until the job's GPU work is done; from
/// pageable memory the driver may also synchronise with the stream while it
/// stages. So:
///   d2h: device -> pinned staging (asynchronous), then a host function
///        (cudaLaunchHostFunc) copies staging -> user memory in stream order;
///        it returns the buffer to `free`. Work enqueued after it, including
///        the event a later notify() records, runs only once it has returned.
///   h2d: the calling thread copies user memory -> staging, then an
///        asynchronous staging -> device copy and an event recorded after it;
///        the buffer sits in `pending` until a later take() sees that event
///        complete (no host function, so the h2d stream never waits for a
///        callback thread).
/// Ownership: buffers are cudaHostAlloc'd by the enqueuing thread and listed in
/// `all`; each is at any time in `free`, in `pending`, or owned by exactly one
/// in-flight copy. Only the device's destructor frees them (cudaFreeHost),
/// after cudaDeviceSynchronize; the host function never calls CUDA. The pool
/// is a shared_ptr because in-flight host functions hold it.
/// Locks: `m` guards free/all (taken by host functions, never held across a
/// CUDA call); `pending_mu` guards pending (never taken by host functions,
/// held across cudaEventQuery, which does not block). Order: pending_mu, m.
struct staging_pool {
  std::mutex m;
  std::multimap<std::size_t, void*> free;  // capacity -> buffer
  std::vector<void*> all;                  // every buffer, for the destructor

  struct in_flight {
    cudaEvent_t done;  // recorded after the staging -> device copy
    void* buf;
    std::size_t capacity;
  };
  std::mutex pending_mu;
  std::vector<in_flight> pending;

  void give(void* buf, std::size_t capacity) {
    std::lock_guard<std::mutex> lk(m);
    free.emplace(capacity, buf);
  }
  /// A free buffer of at least n bytes (and not much larger), or {nullptr, 0}.
  std::pair<void*, std::size_t> take_free(std::size_t n) {
    std::lock_guard<std::mutex> lk(m);
    auto it = free.lower_bound(n);
    if (it == free.end() || it->first > 2 * n + (std::size_t{1} << 20)) return {nullptr, 0};
    std::pair<void*, std::size_t> r{it->second, it->first};
    free.erase(it);
    return r;
  }
};

struct staged_d2h {
  void* dst;
  void* staging;
  std::size_t bytes;
  std::size_t capacity;
  std::shared_ptr<staging_pool> pool;
};

/// memcpy split over a few threads for large buffers: this runs on CUDA's
/// host-callback thread, in stream order, so one thread copying 16-64 MiB of
/// logits per job at ~6 GB/s became the pipeline's bottleneck.
void parallel_memcpy(void* dst, const void* src, std::size_t n) {
  constexpr std::size_t chunk_min = std::size_t{4} << 20;
  const std::size_t hw = std::max(1u, std::thread::hardware_concurrency());
  const std::size_t parts = std::min<std::size_t>({n / chunk_min, 8, hw});
  if (parts < 2) {
    std::memcpy(dst, src, n);
    return;
  }
  // ceil(n / parts) rounded up to a cache line: the parts cover all n bytes.
  const std::size_t step = ((n + parts - 1) / parts + 63) & ~std::size_t{63};
  std::vector<std::thread> helpers;
  helpers.reserve(parts - 1);
  for (std::size_t i = 1; i < parts; ++i) {
    const std::size_t off = i * step;
    if (off >= n) break;
    const std::size_t len = std::min(step, n - off);
    helpers.emplace_back([=] { std::memcpy(static_cast<char*>(dst) + off, static_cast<const char*>(src) + off, len); });
  }
  std::memcpy(dst, src, std::min(step, n));
  for (auto& t : helpers) t.join();
}

// A host function: no CUDA calls here (cudaLaunchHostFunc's rules).
void CUDART_CB finish_staged_d2h(void* p) {
  std::unique_ptr<staged_d2h> s(static_cast<staged_d2h*>(p));
  parallel_memcpy(s->dst, s->staging, s->bytes);
  s->pool->give(s->staging, s->capacity);
}

/// True for host memory CUDA does not know (pageable: malloc / std::vector).
/// Pinned or registered host memory (cudaMemoryTypeHost), device and managed
/// memory keep the direct cudaMemcpyAsync (which also reports misuse, e.g. a
/// device pointer as the host side, as an error instead of a host memcpy).
bool is_pageable_host(const void* p) {
  cudaPointerAttributes a{};
  if (cudaPointerGetAttributes(&a, p) != cudaSuccess) {
    (void)cudaGetLastError();
    return true;  // older runtimes report unknown (pageable) pointers as an error
  }
  return a.type == cudaMemoryTypeUnregistered;
}

class cuda_device final : public device {
 public:
  cuda_device(std::shared_ptr<core> c, device_spec spec, int index, const backend_options& opts, int sm_count)
      : core_(std::move(c)), spec_(std::move(spec)), index_(index), tf32_(opts.cuda_tf32), sm_count_(sm_count) {}

  ~cuda_device() override {
    device_guard g(core_->ordinal);
    std::lock_guard<std::mutex> lk(mem_mu_);
    for (auto& [p, n] : allocs_) AG_CUDA_ASSERT(cudaFree(p));
    for (void* p : host_allocs_) AG_CUDA_ASSERT(cudaFreeHost(p));
    // Staged copies (and their host functions) may still be in flight, also
    // on streams already destroyed: wait for all of them before freeing the
    // staging buffers. Neither pool lock is held here (host functions take `m`).
    AG_CUDA_ASSERT(cudaDeviceSynchronize());
    {
      std::lock_guard<std::mutex> plk(staging_->pending_mu);
      for (const auto& f : staging_->pending) core_->poll->give_event(f.done);  // the poller destroys them
      staging_->pending.clear();
    }
    std::lock_guard<std::mutex> slk(staging_->m);
    for (void* p : staging_->all) AG_CUDA_ASSERT(cudaFreeHost(p));
    staging_->all.clear();
    staging_->free.clear();
  }

  const device_spec& spec() const noexcept override { return spec_; }
  int index() const noexcept override { return index_; }

  // --- memory ---
  expected<void*> allocate(int64_t bytes) override {
    if (bytes < 0) return error(errc::invalid_argument, spec_.name + ": allocate of negative size");
    if (!alive()) return core_->dead_error();
    device_guard g(core_->ordinal);
    void* p = nullptr;
    const size_t n = static_cast<size_t>(std::max<int64_t>(bytes, 256));
    const cudaError_t r = cudaMalloc(&p, n);
    if (r == cudaErrorMemoryAllocation) {
      (void)cudaGetLastError();
      size_t free_b = 0, total_b = 0;
      if (cudaMemGetInfo(&free_b, &total_b) != cudaSuccess) (void)cudaGetLastError();
      return error(errc::out_of_memory, spec_.name + ": cudaMalloc of " + std::to_string(bytes) + " bytes failed: " +
                                            std::to_string(free_b) + " bytes free of " + std::to_string(total_b));
    }
    if (error e = AG_CORE_CHECK(*core_, r, spec_.name + " allocate " + std::to_string(bytes))) return e;
    std::lock_guard<std::mutex> lk(mem_mu_);
    allocs_[p] = static_cast<int64_t>(n);
    in_use_ += static_cast<int64_t>(n);
    return p;
  }
  void deallocate(void* p) noexcept override {
    if (!p) return;
    {
      std::lock_guard<std::mutex> lk(mem_mu_);
      auto it = allocs_.find(p);
      if (it == allocs_.end()) {
        std::fprintf(stderr, "actorgraph cuda: %s: deallocate of an unknown pointer %p ignored\n", spec_.name.c_str(), p);
        return;
      }
      in_use_ -= it->second;
      allocs_.erase(it);
    }
    device_guard g(core_->ordinal);
    AG_CUDA_ASSERT(cudaFree(p));
  }
  expected<void*> allocate_host(int64_t bytes) override {
    if (bytes < 0) return error(errc::invalid_argument, spec_.name + ": allocate_host of negative size");
    device_guard g(core_->ordinal);
    void* p = nullptr;
    // Portable + mapped: usable by every device's copies and readable by kernels.
    const cudaError_t r = cudaHostAlloc(&p, static_cast<size_t>(std::max<int64_t>(bytes, 64)),
                                        cudaHostAllocPortable | cudaHostAllocMapped);
    if (r == cudaErrorMemoryAllocation) {
      (void)cudaGetLastError();
      return error(errc::out_of_memory, spec_.name + ": cudaHostAlloc of " + std::to_string(bytes) + " bytes failed");
    }
    if (error e = AG_CORE_CHECK(*core_, r, spec_.name + " allocate_host")) return e;
    std::lock_guard<std::mutex> lk(mem_mu_);
    host_allocs_.push_back(p);
    return p;
  }
  void deallocate_host(void* p) noexcept override {
    if (!p) return;
    {
      std::lock_guard<std::mutex> lk(mem_mu_);
      auto it = std::find(host_allocs_.begin(), host_allocs_.end(), p);
      if (it == host_allocs_.end()) return;
      host_allocs_.erase(it);
    }
    AG_CUDA_ASSERT(cudaFreeHost(p));
  }
  int64_t memory_capacity() const noexcept override { return spec_.mem_bytes; }
  host_memory_resource* host_memory() noexcept override { return &pinned_host_memory(); }
  int64_t memory_in_use() const noexcept override {
    std::lock_guard<std::mutex> lk(mem_mu_);
    return in_use_;
  }
  error upload(void* dst, const void* src, int64_t bytes) override {
    if (!alive()) return core_->dead_error();
    if (bytes <= 0) return {};
    device_guard g(core_->ordinal);
    return AG_CORE_CHECK(*core_, cudaMemcpy(dst, src, static_cast<size_t>(bytes), cudaMemcpyHostToDevice),
                         spec_.name + " upload");
  }
  error download(void* dst, const void* src, int64_t bytes) override {
    if (!alive()) return core_->dead_error();
    if (bytes <= 0) return {};
    device_guard g(core_->ordinal);
    return AG_CORE_CHECK(*core_, cudaMemcpy(dst, src, static_cast<size_t>(bytes), cudaMemcpyDeviceToHost),
                         spec_.name + " download");
  }

  // --- streams and events ---
  std::unique_ptr<stream> create_stream(stream_role role) override {
    auto s = std::make_unique<cuda_stream>(core_, role);
    if (error e = s->init()) {
      std::fprintf(stderr, "actorgraph cuda: %s\n", e.to_string().c_str());
      // A stream without a CUDA stream handle: every call on it fails cleanly.
    }
    return s;
  }
  std::unique_ptr<event> create_event(bool timing) override {
    cudaEvent_t e = nullptr;
    if (!timing) {
      std::lock_guard<std::mutex> lk(core_->pool_mu);
      if (!core_->pool.empty()) {
        e = core_->pool.back();
        core_->pool.pop_back();
      }
    }
    if (!e) {
      device_guard g(core_->ordinal);
      if (cudaEventCreateWithFlags(&e, timing ? cudaEventDefault : cudaEventDisableTiming) != cudaSuccess) {
        AG_CUDA_LOG(cudaGetLastError());
        e = nullptr;
      }
    }
    return std::make_unique<cuda_event>(core_, e, timing);
  }
  void record(event& e, stream& s) override {
    auto* ce = dynamic_cast<cuda_event*>(&e);
    auto* cs = own(s);
    if (!ce || !cs || !ce->ev_) {
      std::fprintf(stderr, "actorgraph cuda: %s: record() needs a CUDA event and a stream of this device\n",
                   spec_.name.c_str());
      return;
    }
    if (ce->core_->ordinal != core_->ordinal) {
      // Recorded on another device's stream: move the event to this device.
      device_guard g(core_->ordinal);
      cudaEvent_t fresh = nullptr;
      if (cudaEventCreateWithFlags(&fresh, ce->timing_ ? cudaEventDefault : cudaEventDisableTiming) != cudaSuccess) {
        AG_CUDA_LOG(cudaGetLastError());
        return;
      }
      {
        device_guard g2(ce->core_->ordinal);
        AG_CUDA_ASSERT(cudaEventDestroy(ce->ev_));
      }
      ce->ev_ = fresh;
      ce->timing_ = ce->timing_;
      ce->core_ = core_;
    }
    device_guard g(core_->ordinal);
    if (error err = AG_CORE_CHECK(*core_, cudaEventRecord(ce->ev_, cs->s_), spec_.name + " record"))
      std::fprintf(stderr, "actorgraph cuda: %s\n", err.to_string().c_str());
    else
      ce->recorded_.store(true, std::memory_order_release);
  }
  void wait(stream& s, const event& e) override {
    auto* cs = own(s);
    if (!cs) return;
    device_guard g(core_->ordinal);
    if (auto* ce = dynamic_cast<const cuda_event*>(&e)) {
      if (!ce->recorded_.load(std::memory_order_acquire) || !ce->ev_) return;
      if (error err = AG_CORE_CHECK(*core_, cudaStreamWaitEvent(cs->s_, ce->ev_, 0), spec_.name + " wait"))
        std::fprintf(stderr, "actorgraph cuda: %s\n", err.to_string().c_str());
      return;
    }
    // A host backend's event: the GPU must wait without the host waiting. A
    // one-thread kernel spins on a host-mapped flag that the poller sets once
    // e.query() is true. Trade-off: it occupies one block slot of one SM while
    // it waits; the alternative, cudaLaunchHostFunc blocking in e.host_wait(),
    // would stall CUDA's single host-callback thread for every stream of the
    // process. `e` must stay alive until the wait has been satisfied.
    if (e.query()) return;
    unsigned int* slot = core_->poll->take_slot();
    void* dev = slot;
    if (slot && cudaHostGetDevicePointer(&dev, slot, 0) != cudaSuccess) {
      (void)cudaGetLastError();
      dev = slot;  // mapped pinned memory has the same address on the GPU (UVA)
    }
    if (!slot) {
      std::fprintf(stderr, "actorgraph cuda: %s: no flag for a host-event wait; waiting on the host\n",
                   spec_.name.c_str());
      e.host_wait();
      return;
    }
    if (error err = launch_wait_flag(cs->s_, static_cast<unsigned int*>(dev), spec_.name + " wait(host event)")) {
      std::fprintf(stderr, "actorgraph cuda: %s\n", err.to_string().c_str());
      e.host_wait();
      return;
    }
    poll_item it;
    it.k = poll_item::kind::foreign_wait;
    it.foreign = &e;
    it.slot = slot;
    core_->poll->push(std::move(it));
  }

  // --- work ---
  error launch(stream& s, const op_launch& l) override {
    auto us = usable(s, "launch");
    if (!us) return us.err();
    cuda_stream* cs = *us;
    if (!l.op) return error(errc::invalid_argument, spec_.name + ": launch without a node");
    const node& n = *l.op;
    launch_ctx c;
    c.stream = cs->s_;
    c.fault_word = cs->fault_ ? cs->fault_->dev : nullptr;
    c.where = spec_.name + " " + to_string(n.op) + " '" + n.name + "'";
    c.sm_count = sm_count_;
    auto need = [&](std::size_t k) -> error {
      if (l.inputs.size() < k)
        return error(errc::missing_input, c.where + ": needs " + std::to_string(k) + " inputs, got " +
                                              std::to_string(l.inputs.size()));
      for (std::size_t i = 0; i < k; ++i)
        if (!l.inputs[i].data && l.inputs[i].dims.numel() > 0)
          return error(errc::invalid_argument, c.where + ": input " + std::to_string(i) + " has no buffer");
      if (!l.out.data && l.out.dims.numel() > 0) return error(errc::invalid_argument, c.where + ": no output buffer");
      return {};
    };
    device_guard g(core_->ordinal);
    const kt out = to_kt(l.out);
    error e;
    switch (n.op) {
      case op_kind::input:
      case op_kind::weight:
      case op_kind::reshape:
      case op_kind::view:
      case op_kind::permute:
      case op_kind::transpose:
      case op_kind::slice:
        return {};  // leaves are uploaded, views alias their source
      case op_kind::all_reduce:
      case op_kind::all_gather:
      case op_kind::reduce_scatter:
        return error(errc::unsupported_op, c.where + ": a collective runs as a collective step, not as a kernel");
      case op_kind::matmul: {
        if ((e = need(2))) return e;
        auto h = cs->blas(tf32_);
        if (!h) return h.err();
        e = launch_matmul(c, *h, l.out, l.inputs[0], l.inputs[1], n.attrs.trans_a, n.attrs.trans_b, tf32_);
        break;
      }
      case op_kind::add:
      case op_kind::mul: {
        if ((e = need(2))) return e;
        const kt a = to_kt(l.inputs[0]), b = to_kt(l.inputs[1]);
        e = launch_elementwise(c, n.op == op_kind::add ? ew_op::add : ew_op::mul, out, a, &b, 1.f);
        break;
      }
      case op_kind::scale:
        if ((e = need(1))) return e;
        e = launch_elementwise(c, ew_op::scale, out, to_kt(l.inputs[0]), nullptr, n.attrs.scale);
        break;
      case op_kind::gelu:
        if ((e = need(1))) return e;
        e = launch_elementwise(c, n.attrs.gelu == gelu_mode::erf ? ew_op::gelu_erf : ew_op::gelu_tanh, out,
                               to_kt(l.inputs[0]), nullptr, 1.f);
        break;
      case op_kind::silu:
        if ((e = need(1))) return e;
        e = launch_elementwise(c, ew_op::silu, out, to_kt(l.inputs[0]), nullptr, 1.f);
        break;
      case op_kind::rms_norm: {
        if ((e = need(1))) return e;
        kt w;
        if (l.inputs.size() > 1) w = to_kt(l.inputs[1]);
        e = launch_rms_norm(c, out, to_kt(l.inputs[0]), l.inputs.size() > 1 ? &w : nullptr, n.attrs.eps);
        break;
      }
      case op_kind::layer_norm: {
        if ((e = need(1))) return e;
        kt w, b;
        if (l.inputs.size() > 1) w = to_kt(l.inputs[1]);
        if (l.inputs.size() > 2) b = to_kt(l.inputs[2]);
        e = launch_layer_norm(c, out, to_kt(l.inputs[0]), l.inputs.size() > 1 ? &w : nullptr,
                              l.inputs.size() > 2 ? &b : nullptr, n.attrs.eps);
        break;
      }
      case op_kind::softmax:
        if ((e = need(1))) return e;
        e = launch_softmax(c, out, to_kt(l.inputs[0]), n.attrs.scale, n.attrs.causal);
        break;
      case op_kind::rope:
        if ((e = need(2))) return e;
        e = launch_rope(c, out, to_kt(l.inputs[0]), to_kt(l.inputs[1]), n.attrs.theta, n.attrs.rope == rope_mode::neox);
        break;
      case op_kind::get_rows:
        if ((e = need(2))) return e;
        e = launch_get_rows(c, out, to_kt(l.inputs[0]), to_kt(l.inputs[1]));
        break;
      case op_kind::concat: {
        if ((e = need(1))) return e;
        const int rank = l.out.dims.rank();
        const int axis = n.attrs.axis < 0 ? n.attrs.axis + rank : n.attrs.axis;
        if (axis < 0 || axis >= rank) return error(errc::invalid_argument, c.where + ": concat axis out of range");
        int64_t at = 0;
        const int64_t esz = static_cast<int64_t>(dtype_size(l.out.type));
        for (const tensor_arg& in : l.inputs) {
          tensor_arg dst;
          dst.data = static_cast<char*>(l.out.data) + at * l.out.stride[static_cast<std::size_t>(axis)] * esz;
          dst.type = l.out.type;
          dst.dims = in.dims;
          dst.stride = l.out.stride;
          if ((e = launch_strided_copy(c, to_kt(dst), to_kt(in)))) break;
          at += in.dims[axis];
        }
        break;
      }
      case op_kind::copy:
        if ((e = need(1))) return e;
        if (l.inputs[0].dims.numel() != l.out.dims.numel())
          return error(errc::invalid_shape, c.where + ": copy changes the element count");
        if (l.inputs[0].dims != l.out.dims) {
          // Same count, other dims: read the source in its own index order.
          tensor_arg dst = l.out;
          dst.dims = l.inputs[0].dims;
          dst.stride = contiguous_strides(dst.dims);
          e = launch_strided_copy(c, to_kt(dst), to_kt(l.inputs[0]));
        } else {
          e = launch_strided_copy(c, out, to_kt(l.inputs[0]));
        }
        break;
    }
    if (e.code == errc::device_failed) core_->mark_dead(e);
    return e;
  }

  // Pageable host memory goes through pinned staging (see staging_pool);
  // pinned / registered host memory is copied directly.
  error copy_h2d(stream& s, void* dst, const void* src, int64_t bytes) override {
    if (bytes > 0 && src && is_pageable_host(src)) return staged_copy_h2d(s, dst, src, bytes);
    return copy(s, dst, src, bytes, cudaMemcpyHostToDevice, "copy_h2d");
  }
  error copy_d2h(stream& s, void* dst, const void* src, int64_t bytes) override {
    if (bytes > 0 && dst && is_pageable_host(dst)) return staged_copy_d2h(s, dst, src, bytes);
    return copy(s, dst, src, bytes, cudaMemcpyDeviceToHost, "copy_d2h");
  }
  error copy_peer(stream& s, void* dst, device& src_dev, const void* src, int64_t bytes) override {
    auto us = usable(s, "copy_peer");
    if (!us) return us.err();
    cuda_stream* cs = *us;
    if (bytes <= 0) return {};
    device_guard g(core_->ordinal);
    if (auto* peer = dynamic_cast<cuda_device*>(&src_dev)) {
      if (!peer->alive()) return peer->core_->dead_error();
      return AG_CORE_CHECK(*core_,
                           cudaMemcpyPeerAsync(dst, core_->ordinal, src, peer->core_->ordinal,
                                               static_cast<size_t>(bytes), cs->s_),
                           spec_.name + " copy_peer from " + peer->spec_.name);
    }
    // Another backend's memory is host memory: UVA tells the driver its kind.
    return AG_CORE_CHECK(*core_, cudaMemcpyAsync(dst, src, static_cast<size_t>(bytes), cudaMemcpyDefault, cs->s_),
                         spec_.name + " copy_peer from " + src_dev.spec().name);
  }

  void notify(stream& s, std::function<void(const error&)> done) override {
    auto* cs = own(s);
    poll_item it;
    it.done = std::move(done);
    if (!cs) {
      it.early = error(errc::invalid_argument, spec_.name + ": notify on a stream of another device");
      core_->poll->push(std::move(it));
      return;
    }
    it.fault = cs->fault_;
    if (!alive()) {
      it.early = core_->dead_error();
      core_->poll->push(std::move(it));
      return;
    }
    device_guard g(core_->ordinal);
    if (mode_.load(std::memory_order_relaxed) == notify_mode::host_func) {
      auto* pl = new host_func_payload{std::move(it.done), cs->fault_, core_};
      const cudaError_t r = cudaLaunchHostFunc(cs->s_, &host_func_trampoline, pl);
      if (r == cudaSuccess) return;
      it.done = std::move(pl->done);
      delete pl;
      it.early = AG_CORE_CHECK(*core_, r, spec_.name + " notify");
      core_->poll->push(std::move(it));
      return;
    }
    it.ev = core_->poll->take_event();
    if (!it.ev) {
      it.early = error(errc::device_failed, spec_.name + ": notify could not create an event");
    } else if (error e = AG_CORE_CHECK(*core_, cudaEventRecord(it.ev, cs->s_), spec_.name + " notify")) {
      core_->poll->give_event(it.ev);
      it.ev = nullptr;
      it.early = e;
    }
    core_->poll->push(std::move(it));
  }

  error synchronize(stream& s) override {
    auto* cs = own(s);
    if (!cs) return error(errc::invalid_argument, spec_.name + ": synchronize on a stream of another device");
    if (!alive()) return core_->dead_error();
    device_guard g(core_->ordinal);
    if (error e = AG_CORE_CHECK(*core_, cudaStreamSynchronize(cs->s_), spec_.name + " synchronize")) return e;
    return cs->fault_ ? cs->fault_->take(spec_.name) : error{};
  }

  void on_fault(std::function<void(const error&)> handler) override {
    bool dead_now = false;
    error death;
    {
      std::lock_guard<std::mutex> lk(core_->fault_mu);
      core_->fault_handler = handler;
      dead_now = core_->fault_reported;
      death = core_->death;
    }
    if (dead_now && handler) handler(death);
  }
  bool alive() const noexcept override { return core_->alive.load(std::memory_order_acquire); }

  void set_mode(notify_mode m) noexcept { mode_.store(m, std::memory_order_relaxed); }

  /// Test hooks (cuda_testing.hpp).
  cuda_stream* own(stream& s) {
    auto* cs = dynamic_cast<cuda_stream*>(&s);
    return cs && cs->core_ == core_ && cs->s_ ? cs : nullptr;
  }
  /// The stream to enqueue `what` on: the device's death error if it is
  /// dead, invalid_argument if `s` belongs to another device.
  expected<cuda_stream*> usable(stream& s, const char* what) {
    if (!alive()) return core_->dead_error();
    auto* cs = own(s);
    if (!cs) return error(errc::invalid_argument, spec_.name + ": " + what + " on a stream of another device");
    return cs;
  }

 private:
  /// A pinned staging buffer of at least n bytes: a free one, one whose
  /// staged h2d copy has completed, or a new one. Called with no pool lock
  /// held; never waits for the GPU.
  expected<std::pair<void*, std::size_t>> take_staging(std::size_t n, const char* what) {
    reclaim_staging();
    auto got = staging_->take_free(n);
    if (got.first) return got;
    const std::size_t cap = std::max<std::size_t>(n, 4096);
    void* buf = nullptr;
    const cudaError_t r = cudaHostAlloc(&buf, cap, cudaHostAllocPortable);
    if (r == cudaErrorMemoryAllocation) {
      (void)cudaGetLastError();
      return error(errc::out_of_memory,
                   spec_.name + ": pinned staging of " + std::to_string(n) + " bytes for " + what + " failed");
    }
    if (error e = AG_CORE_CHECK(*core_, r, spec_.name + " " + what + " staging")) return e;
    std::lock_guard<std::mutex> lk(staging_->m);
    staging_->all.push_back(buf);
    return std::pair<void*, std::size_t>{buf, cap};
  }

  /// Moves the buffers of completed staged h2d copies back to the free list.
  /// A query error leaves the buffer pending (the copy may still read it; the
  /// destructor frees it).
  void reclaim_staging() {
    std::lock_guard<std::mutex> lk(staging_->pending_mu);
    auto& pend = staging_->pending;
    for (std::size_t i = 0; i < pend.size();) {
      const cudaError_t r = cudaEventQuery(pend[i].done);
      if (r != cudaSuccess) {
        if (r != cudaErrorNotReady) (void)cudaGetLastError();
        ++i;
        continue;
      }
      core_->poll->give_event(pend[i].done);
      staging_->give(pend[i].buf, pend[i].capacity);
      pend[i] = pend.back();
      pend.pop_back();
    }
  }

  /// Device -> pageable host without blocking the caller (see staging_pool).
  error staged_copy_d2h(stream& s, void* dst, const void* src, int64_t bytes) {
    auto us = usable(s, "copy_d2h");
    if (!us) return us.err();
    cuda_stream* cs = *us;
    const auto n = static_cast<std::size_t>(bytes);
    device_guard g(core_->ordinal);
    auto st = take_staging(n, "copy_d2h");
    if (!st) return st.err();
    auto [buf, cap] = *st;
    if (error e = AG_CORE_CHECK(*core_, cudaMemcpyAsync(buf, src, n, cudaMemcpyDeviceToHost, cs->s_),
                                spec_.name + " copy_d2h (to staging)")) {
      staging_->give(buf, cap);  // nothing was enqueued
      return e;
    }
    auto* job = new staged_d2h{dst, buf, n, cap, staging_};
    if (error e = AG_CORE_CHECK(*core_, cudaLaunchHostFunc(cs->s_, &finish_staged_d2h, job),
                                spec_.name + " copy_d2h (staging to host)")) {
      delete job;  // the copy above may still write the buffer: it stays out of `free` (the destructor frees it)
      return e;
    }
    return {};
  }

  /// Pageable host -> device without the driver's own staging (which may
  /// synchronise with the stream): the caller's thread fills a pinned buffer,
  /// the DMA reads it asynchronously, an event tells when it may be reused.
  error staged_copy_h2d(stream& s, void* dst, const void* src, int64_t bytes) {
    auto us = usable(s, "copy_h2d");
    if (!us) return us.err();
    cuda_stream* cs = *us;
    const auto n = static_cast<std::size_t>(bytes);
    device_guard g(core_->ordinal);
    cudaEvent_t done = core_->poll->take_event();
    if (!done) return error(errc::device_failed, spec_.name + ": copy_h2d could not create an event");
    auto st = take_staging(n, "copy_h2d");
    if (!st) {
      core_->poll->give_event(done);
      return st.err();
    }
    auto [buf, cap] = *st;
    parallel_memcpy(buf, src, n);
    if (error e = AG_CORE_CHECK(*core_, cudaMemcpyAsync(dst, buf, n, cudaMemcpyHostToDevice, cs->s_),
                                spec_.name + " copy_h2d (from staging)")) {
      staging_->give(buf, cap);  // nothing was enqueued
      core_->poll->give_event(done);
      return e;
    }
    if (error e = AG_CORE_CHECK(*core_, cudaEventRecord(done, cs->s_), spec_.name + " copy_h2d (staging release)")) {
      // The copy may still read the buffer: it stays out of `free` (the destructor frees it).
      core_->poll->give_event(done);
      return e;
    }
    std::lock_guard<std::mutex> lk(staging_->pending_mu);
    staging_->pending.push_back({done, buf, cap});
    return {};
  }

  error copy(stream& s, void* dst, const void* src, int64_t bytes, cudaMemcpyKind kind, const char* what) {
    auto us = usable(s, what);
    if (!us) return us.err();
    cuda_stream* cs = *us;
    if (bytes <= 0) return {};
    device_guard g(core_->ordinal);
    return AG_CORE_CHECK(*core_, cudaMemcpyAsync(dst, src, static_cast<size_t>(bytes), kind, cs->s_),
                         spec_.name + " " + what);
  }

  std::shared_ptr<core> core_;
  device_spec spec_;
  int index_;
  bool tf32_;
  int sm_count_;
  std::atomic<notify_mode> mode_{notify_mode::poller};
  mutable std::mutex mem_mu_;
  std::shared_ptr<staging_pool> staging_ = std::make_shared<staging_pool>();
  std::unordered_map<void*, int64_t> allocs_;
  std::vector<void*> host_allocs_;
  int64_t in_use_ = 0;
};

int attr(cudaDeviceAttr a, int ordinal) {
  int v = 0;
  if (cudaDeviceGetAttribute(&v, a, ordinal) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  return v;
}

expected<device_ptr> make_one(int ordinal, int index, const backend_options& opts) {
  device_guard g(ordinal);
  cudaDeviceProp prop{};
  AG_CUDA_TRY(cudaGetDeviceProperties(&prop, ordinal), "cuda" + std::to_string(ordinal));
  device_spec spec;
  spec.name = "cuda" + std::to_string(ordinal);
  spec.kind = device_kind::cuda;
  spec.ordinal = ordinal;
  const double sms = prop.multiProcessorCount;
  const double clock_hz = attr(cudaDevAttrClockRate, ordinal) * 1e3;            // kHz
  const double mem_clock_hz = attr(cudaDevAttrMemoryClockRate, ordinal) * 1e3;  // kHz
  const double bus_bits = attr(cudaDevAttrGlobalMemoryBusWidth, ordinal);
  // FP32: 128 lanes x FMA (2 flops) per SM per clock on sm_80+/sm_90.
  // Dense bf16 tensor cores: 4096 flops per SM per clock on sm_90 (H100 SXM:
  // 132 SMs x 1.83 GHz x 4096 = 989 TFLOP/s); 2048 on sm_80; 1024 before.
  const double tc_per_sm = prop.major >= 9 ? 4096 : prop.major == 8 ? 2048 : 1024;
  if (sms > 0 && clock_hz > 0) {
    spec.flops_f32 = sms * clock_hz * 256.0;
    spec.flops_bf16 = sms * clock_hz * tc_per_sm;
  }
  if (mem_clock_hz > 0 && bus_bits > 0) spec.mem_bandwidth = 2.0 * mem_clock_hz * bus_bits / 8.0;  // DDR
  spec.mem_bytes = static_cast<int64_t>(prop.totalGlobalMem);
  spec.copy_engines = std::max(1, prop.asyncEngineCount);

  auto c = std::make_shared<core>();
  c->ordinal = ordinal;
  c->name = spec.name;
  if (error e = c->calibrate()) return e;
  c->poll = std::make_shared<poller>(ordinal, spec.name);
  std::weak_ptr<core> weak = c;
  c->poll->on_death = [weak](const error& e) {
    if (auto cc = weak.lock()) cc->mark_dead(e);
  };
  c->poll->start(c->poll);
  return device_ptr(std::make_shared<cuda_device>(std::move(c), std::move(spec), index, opts,
                                                  prop.multiProcessorCount));
}

}  // namespace

int device_count() noexcept {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  return n;
}

expected<std::vector<device_ptr>> make_cuda_devices(const std::vector<int>& ordinals, const backend_options& options,
                                                    int first_index) {
  const int count = device_count();
  if (count <= 0) return error(errc::bad_device_spec, "no usable CUDA GPU (cudaGetDeviceCount found none)");
  std::vector<int> ords = ordinals;
  if (ords.empty())
    for (int i = 0; i < count; ++i) ords.push_back(i);
  for (std::size_t i = 0; i < ords.size(); ++i) {
    if (ords[i] < 0 || ords[i] >= count)
      return error(errc::bad_device_spec, "CUDA ordinal " + std::to_string(ords[i]) + " out of range (" +
                                              std::to_string(count) + " GPUs)");
    for (std::size_t j = 0; j < i; ++j)
      if (ords[j] == ords[i])
        return error(errc::bad_device_spec, "duplicate CUDA ordinal " + std::to_string(ords[i]));
  }
  std::vector<device_ptr> out;
  for (std::size_t i = 0; i < ords.size(); ++i) {
    auto d = make_one(ords[i], first_index + static_cast<int>(i), options);
    if (!d) {
      error e = d.err();
      if (e.code != errc::out_of_memory) e.code = errc::device_failed;
      return e;
    }
    out.push_back(std::move(*d));
  }
  // Peer access both ways between every pair that allows it (copies between
  // others still work: the driver stages them through the host).
  for (int a : ords) {
    device_guard g(a);
    for (int b : ords) {
      if (a == b) continue;
      int can = 0;
      if (cudaDeviceCanAccessPeer(&can, a, b) != cudaSuccess) (void)cudaGetLastError();
      if (!can) continue;
      const cudaError_t r = cudaDeviceEnablePeerAccess(b, 0);
      if (r != cudaSuccess && r != cudaErrorPeerAccessAlreadyEnabled) AG_CUDA_LOG(r);
      (void)cudaGetLastError();
    }
  }
  return out;
}

void set_notify_mode(device& d, notify_mode mode) noexcept {
  if (auto* cd = dynamic_cast<cuda_device*>(&d)) cd->set_mode(mode);
}

namespace testing {

error launch_spin_gate(device& d, stream& s, volatile uint32_t* flag) {
  auto* cd = dynamic_cast<cuda_device*>(&d);
  cuda_stream* cs = cd ? cd->own(s) : nullptr;
  if (!cs) return error(errc::invalid_argument, "launch_spin_gate needs a CUDA device and one of its streams");
  device_guard g(cs->core_->ordinal);
  void* dev = const_cast<uint32_t*>(flag);
  if (cudaHostGetDevicePointer(&dev, const_cast<uint32_t*>(flag), 0) != cudaSuccess) {
    (void)cudaGetLastError();
    dev = const_cast<uint32_t*>(flag);  // UVA: same address on the GPU
  }
  return launch_wait_flag(cs->s_, static_cast<unsigned int*>(dev), d.spec().name + " spin gate");
}

error launch_write_value(device& d, stream& s, uint32_t* dst, uint32_t value) {
  auto* cd = dynamic_cast<cuda_device*>(&d);
  cuda_stream* cs = cd ? cd->own(s) : nullptr;
  if (!cs) return error(errc::invalid_argument, "launch_write_value needs a CUDA device and one of its streams");
  device_guard g(cs->core_->ordinal);
  void* target = dst;
  cudaPointerAttributes pa{};
  if (cudaPointerGetAttributes(&pa, dst) == cudaSuccess && pa.type == cudaMemoryTypeHost) {
    if (cudaHostGetDevicePointer(&target, dst, 0) != cudaSuccess) target = dst;  // UVA: same address
  }
  (void)cudaGetLastError();
  return cuda::launch_write_value(cs->s_, static_cast<unsigned int*>(target), value, d.spec().name + " write value");
}

}  // namespace testing

}  // namespace ag::gpu::cuda
