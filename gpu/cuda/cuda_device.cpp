// The CUDA device object: memory, streams, events, copies and notify(), on
// top of the shared core (device_core.hpp). The parts with one job each live
// beside it: the event poller (event_poller.cpp), the clock anchor
// (clock_anchor.cpp), pinned staging (staging.cpp), op dispatch
// (op_dispatch.cpp), streams and events (cuda_stream.cpp, cuda_event.cpp) and
// enumeration / the factory (enumerate.cpp).

#include <cuda_runtime.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <map>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "gpu/collective_path.hpp"
#include "gpu/cuda/collective.cuh"
#include "gpu/cuda/nccl_group.hpp"
#include "gpu/cuda/cuda_backend.hpp"
#include "gpu/cuda/cuda_check.cuh"
#include "gpu/cuda/cuda_device.hpp"
#include "gpu/cuda/cuda_event.hpp"
#include "gpu/cuda/cuda_stream.hpp"
#include "gpu/cuda/cuda_testing.hpp"
#include "gpu/cuda/decode_step.cuh"
#include "gpu/cuda/device_core.hpp"
#include "gpu/cuda/device_guard.hpp"
#include "gpu/cuda/elementwise.cuh"
#include "gpu/cuda/event_poller.hpp"
#include "gpu/cuda/in_stream.cuh"
#include "gpu/cuda/op_dispatch.hpp"
#include "gpu/cuda/staging.hpp"
#include "gpu/cuda/slow_call.hpp"
#include "gpu/cuda/sync.cuh"

namespace ag::gpu::cuda {
namespace {

using namespace detail;

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

/// A CUDA graph captured from one replay segment (cuda_device::capture):
/// its executable, destroyed on the owning device's GPU. The executing actor
/// destroys it only after every launch of it completed (its plan unloaded,
/// or the actor stopped after its streams drained).
class cuda_replay_graph final : public replay_graph {
 public:
  cuda_replay_graph(std::shared_ptr<core> c, cudaGraphExec_t exec, int kernels, int copy_kernels)
      : core_(std::move(c)), exec_(exec), kernels_(kernels), copy_kernels_(copy_kernels) {}
  ~cuda_replay_graph() override {
    core_->poll->drain_launches();  // no launch of it still waits on the poller
    device_guard g(core_->ordinal);
    slow_call probe(core_->name, "cudaGraphExecDestroy");
    AG_CUDA_ASSERT(cudaGraphExecDestroy(exec_));
  }
  int kernels() const noexcept override { return kernels_; }
  int host_copy_kernels() const noexcept override { return copy_kernels_; }

  std::shared_ptr<core> core_;
  cudaGraphExec_t exec_ = nullptr;
  int kernels_ = 0;
  int copy_kernels_ = 0;
};

/// backend_options::cuda_launch_on_poller, or AG_CUDA_LAUNCH_ON_POLLER=0|1.
bool launch_on_poller(const backend_options& opts) {
  if (const char* v = std::getenv("AG_CUDA_LAUNCH_ON_POLLER"); v && *v) return std::string(v) != "0";
  return opts.cuda_launch_on_poller;
}

uint64_t next_device_uid() {
  static std::atomic<uint64_t> next{1};
  return next.fetch_add(1, std::memory_order_relaxed);
}

/// Device memory given back while jobs may run (a plan unloaded) is freed
/// later, per GPU: cudaFree waits for all of the GPU's work, so a plan
/// dropped beside another plan's jobs stalled them, and on logical devices
/// of one GPU it deadlocked with in-stream collective parts spinning on
/// their peers (whose next launch then waited behind the free) until the
/// parts gave up after cuda_collective_timeout_s (an H100, session 15:
/// "cudaFree blocked the host for 5000 ms"). The memory is freed when an
/// allocation on that GPU runs short (it is then retried once) and when a
/// device of that GPU is destroyed. Shared by the logical devices of a GPU:
/// keyed by CUDA ordinal.
class deferred_frees {
 public:
  static deferred_frees& instance() {
    static auto* d = new deferred_frees;  // never destroyed: devices may outlive statics
    return *d;
  }
  void add(int ordinal, void* p) {
    std::lock_guard<std::mutex> lk(mu_);
    pending_[ordinal].push_back(p);
  }
  /// Frees every pointer deferred on `ordinal` (the caller made it current);
  /// false when there was none.
  bool flush(int ordinal, const std::string& who) {
    std::vector<void*> mine;
    {
      std::lock_guard<std::mutex> lk(mu_);
      auto it = pending_.find(ordinal);
      if (it == pending_.end() || it->second.empty()) return false;
      mine.swap(it->second);
    }
    slow_call probe(who, "cudaFree (deferred)");
    for (void* q : mine) AG_CUDA_ASSERT(cudaFree(q));
    return true;
  }
 private:
  std::mutex mu_;
  std::map<int, std::vector<void*>> pending_;
};

class cuda_device final : public device {
 public:
  cuda_device(std::shared_ptr<core> c, device_spec spec, int index, const backend_options& opts, int sm_count,
              int cc_major)
      : core_(std::move(c)),
        spec_(std::move(spec)),
        index_(index),
        // Programmatic dependent launch needs sm_90 (griddepcontrol).
        kernels_{opts.cuda_tf32, opts.cuda_gemv, opts.cuda_pdl && cc_major >= 9, opts.cuda_gemv_tensor_core_rows},
        sm_count_(sm_count),
        nccl_min_bytes_(opts.cuda_nccl_min_bytes),
        nccl_min_bytes_wide_(opts.cuda_nccl_min_bytes_wide),
        collective_timeout_s_(opts.cuda_collective_timeout_s),
        launch_on_poller_(launch_on_poller(opts)) {
    if (const char* skip = std::getenv("AG_CUDA_DEBUG_SKIP")) {
      const std::string v = skip;
      kernels_.skip_attention = v.find("attention") != std::string::npos;
      kernels_.skip_residual = v.find("residual") != std::string::npos;
      kernels_.skip_gated = v.find("gated") != std::string::npos;
      kernels_.skip_shared = v.find("shared") != std::string::npos;
      kernels_.skip_in_stream = v.find("instream") != std::string::npos;
      kernels_.skip_rope = v.find("rope") != std::string::npos;
      kernels_.skip_tp_rank1 = v.find("tprank1") != std::string::npos;
    }
  }

  ~cuda_device() override {
    device_guard g(core_->ordinal);
    std::lock_guard<std::mutex> lk(mem_mu_);
    if (profiling_) print_op_profile();
    for (auto& [p, n] : allocs_) AG_CUDA_ASSERT(cudaFree(p));
    (void)deferred_frees::instance().flush(core_->ordinal, spec_.name);
    for (void* p : host_allocs_) AG_CUDA_ASSERT(cudaFreeHost(p));
    // In-stream memory: peers' parts read it only while a job of a plan on
    // this device runs, and the runtime stops those before its devices go.
    if (area_.arrive) AG_CUDA_ASSERT(cudaFree(area_.arrive));
    if (area_.aborted_host) AG_CUDA_ASSERT(cudaFreeHost(area_.aborted_host));
    // Staged copies (and their host functions) may still be in flight, also
    // on streams already destroyed: wait for all of them before freeing the
    // staging buffers. No pool lock is held here (host functions take one).
    AG_CUDA_ASSERT(cudaDeviceSynchronize());
    staging_->release_all(*core_->poll);
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
    cudaError_t r = cudaSuccess;
    {
      slow_call probe(spec_.name, "cudaMalloc");
      r = cudaMalloc(&p, n);
    }
    if (r == cudaErrorMemoryAllocation && deferred_frees::instance().flush(core_->ordinal, spec_.name)) {
      (void)cudaGetLastError();
      slow_call probe(spec_.name, "cudaMalloc (after the deferred frees)");
      r = cudaMalloc(&p, n);
    }
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
    deferred_frees::instance().add(core_->ordinal, p);  // freed when the GPU runs short, or with the device
  }
  expected<void*> allocate_host(int64_t bytes) override {
    if (bytes < 0) return error(errc::invalid_argument, spec_.name + ": allocate_host of negative size");
    device_guard g(core_->ordinal);
    void* p = nullptr;
    // Portable + mapped: usable by every device's copies and readable by kernels.
    slow_call probe(spec_.name, "cudaHostAlloc");
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
    if (error e = AG_CORE_CHECK(*core_, cudaMemcpy(dst, src, static_cast<size_t>(bytes), cudaMemcpyHostToDevice),
                                spec_.name + " upload"))
      return e;
    // From pageable memory cudaMemcpy returns once the source is staged, its
    // last DMA still queued on the default stream, which the runtime's
    // non-blocking streams do not wait for: wait for it here.
    return AG_CORE_CHECK(*core_, cudaStreamSynchronize(nullptr), spec_.name + " upload");
  }
  error download(void* dst, const void* src, int64_t bytes) override {
    if (!alive()) return core_->dead_error();
    if (bytes <= 0) return {};
    device_guard g(core_->ordinal);
    return AG_CORE_CHECK(*core_, cudaMemcpy(dst, src, static_cast<size_t>(bytes), cudaMemcpyDeviceToHost),
                         spec_.name + " download");
  }

  // --- streams and events ---
  expected<std::unique_ptr<stream>> create_stream(step_kind kind) override {
    if (!alive()) return core_->dead_error();
    auto s = std::make_unique<cuda_stream>(core_, kind);
    if (error e = s->init()) return std::move(e).concerning(index_);
    return std::unique_ptr<stream>(std::move(s));
  }
  expected<std::unique_ptr<event>> create_event(bool timing) override {
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
      if (error err = AG_CORE_CHECK(*core_, cudaEventCreateWithFlags(&e, timing ? cudaEventDefault : cudaEventDisableTiming),
                                    spec_.name + " create_event"))
        return std::move(err).concerning(index_);
    }
    return std::unique_ptr<event>(std::make_unique<cuda_event>(core_, e, timing));
  }
  error record(event& e, stream& s) override {
    auto* ce = dynamic_cast<cuda_event*>(&e);
    auto* cs = own(s);
    if (!ce || !cs || !ce->ev_)
      return error(errc::invalid_argument, spec_.name + ": record() needs a CUDA event and a stream of this device",
                   index_);
    if (ce->core_->ordinal != core_->ordinal) {
      // Recorded on another device's stream: move the event to this device.
      device_guard g(core_->ordinal);
      cudaEvent_t fresh = nullptr;
      if (error err = AG_CORE_CHECK(*core_,
                                    cudaEventCreateWithFlags(&fresh, ce->timing_ ? cudaEventDefault : cudaEventDisableTiming),
                                    spec_.name + " record (moving an event to this device)"))
        return std::move(err).concerning(index_);
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
      return std::move(err).concerning(index_);
    ce->recorded_.store(true, std::memory_order_release);
    return {};
  }
  error wait(stream& s, const event& e) override {
    auto* cs = own(s);
    if (!cs) return error(errc::invalid_argument, spec_.name + ": wait() on a stream of another device", index_);
    device_guard g(core_->ordinal);
    if (auto* ce = dynamic_cast<const cuda_event*>(&e)) {
      if (!ce->recorded_.load(std::memory_order_acquire) || !ce->ev_) return {};
      if (error err = AG_CORE_CHECK(*core_, cudaStreamWaitEvent(cs->s_, ce->ev_, 0), spec_.name + " wait"))
        return std::move(err).concerning(index_);
      return {};
    }
    // A host backend's event: the GPU must wait without the host waiting. A
    // one-thread kernel spins on a host-mapped flag that the poller sets once
    // e.query() is true. Trade-off: it occupies one block slot of one SM while
    // it waits; the alternative, cudaLaunchHostFunc blocking in e.host_wait(),
    // would stall CUDA's single host-callback thread for every stream of the
    // process. `e` must stay alive until the wait has been satisfied.
    if (e.query()) return {};
    unsigned int* slot = core_->poll->take_slot();
    void* dev = slot;
    if (slot && cudaHostGetDevicePointer(&dev, slot, 0) != cudaSuccess) {
      (void)cudaGetLastError();
      dev = slot;  // mapped pinned memory has the same address on the GPU (UVA)
    }
    if (!slot)
      return error(errc::device_failed, spec_.name + ": no host-mapped flag left for a wait on a host event", index_);
    if (error err = launch_wait_flag(cs->s_, static_cast<unsigned int*>(dev), spec_.name + " wait(host event)"))
      return std::move(err).concerning(index_);
    poll_item it;
    it.k = poll_item::kind::foreign_wait;
    it.foreign = &e;
    it.slot = slot;
    core_->poll->push(std::move(it));
    return {};
  }

  // --- work ---
  error launch(stream& s, const op_launch& l) override {
    auto us = usable(s, "launch");
    if (!us) return us.err();
    if (!profiling_) return run_op(**us, l);
    device_guard g(core_->ordinal);
    op_sample smp;
    smp.name = l.op ? l.op->name : std::string("?");
    smp.kind = l.op ? std::string(to_string(l.op->op)) : std::string("?");
    if (error e = AG_CORE_CHECK(*core_, cudaEventCreate(&smp.before), spec_.name + " op profile")) return e;
    if (error e = AG_CORE_CHECK(*core_, cudaEventCreate(&smp.after), spec_.name + " op profile")) return e;
    if (error e = AG_CORE_CHECK(*core_, cudaEventRecord(smp.before, (*us)->s_), spec_.name + " op profile")) return e;
    error e = run_op(**us, l);
    if (error re = AG_CORE_CHECK(*core_, cudaEventRecord(smp.after, (*us)->s_), spec_.name + " op profile"); re && !e)
      e = re;
    std::lock_guard<std::mutex> lk(mem_mu_);
    profile_.push_back(std::move(smp));
    return e;
  }

  // --- graph replay ---
  bool captures() const noexcept override { return true; }

  /// Stream capture of the ops on `s` itself (thread-local mode: only this
  /// thread's calls are checked, other actors keep using the GPU), then
  /// instantiation. Capture enqueues nothing, so a refused capture leaves `s`
  /// as it was and the caller launches the ops plainly. Ops whose launchers
  /// allocate (cudaMallocAsync scratch) become graph memory nodes; the cuBLAS
  /// handle of the stream already has its workspace (made by the segment's
  /// first, plain run), so cuBLAS allocates nothing while capturing.
  expected<std::unique_ptr<replay_graph>> capture_segment(stream& s, const segment_op* ops, std::size_t n) override {
    stream* one = &s;
    return capture_streams(&one, 1, ops, n);
  }

  /// Several lanes (device::capture_lanes): the capture starts on lanes[0];
  /// each other lane joins it at its first op by waiting for a fork event
  /// recorded on lanes[0] at the start (so its branch follows everything the
  /// replaying stream ran before), an op with segment_op::after waits for
  /// the events recorded after those ops, and every lane joins lanes[0]
  /// again before the capture ends. The graph holds the branches side by
  /// side; lanes 1.. are only capture streams, whose resources the kernels
  /// of their branch use.
  expected<std::unique_ptr<replay_graph>> capture_lanes(stream* const* lanes, int count, const segment_op* ops,
                                                       std::size_t n) override {
    if (count < 1 || !lanes) return error(errc::invalid_argument, spec_.name + ": capture_lanes without a stream", index_);
    return capture_streams(lanes, count, ops, n);
  }

  expected<std::unique_ptr<replay_graph>> capture_streams(stream* const* lanes, int count, const segment_op* ops,
                                                         std::size_t n) {
    thread_local std::vector<cuda_stream*> css;
    css.clear();
    for (int l = 0; l < count; ++l) {
      if (!lanes[l]) return error(errc::invalid_argument, spec_.name + ": capture lane without a stream", index_);
      auto us = usable(*lanes[l], "capture");
      if (!us) return us.err();
      css.push_back(*us);
    }
    cuda_stream* cs = css[0];
    device_guard g(core_->ordinal);
    const auto refused = [&](const std::string& why) {
      return error(errc::unsupported_op, spec_.name + ": graph capture refused: " + why, index_);
    };
    slow_call probe(spec_.name, "graph capture and instantiation");
    if (cudaError_t r = cudaStreamBeginCapture(cs->s_, cudaStreamCaptureModeThreadLocal); r != cudaSuccess) {
      (void)cudaGetLastError();
      return refused(std::string("cudaStreamBeginCapture: ") + cudaGetErrorString(r));
    }
    error launch_err;
    int kernels = 0, copy_kernels = 0;
    // Lanes: events made for this capture (fork, per-op signals, joins),
    // destroyed once it ended; which lanes joined; whether a lane's next
    // kernel may launch as a programmatic dependent (not right after a fork
    // or a wait for another lane: its predecessor is then an event, not the
    // kernel before it).
    thread_local std::vector<cudaEvent_t> made;
    thread_local std::vector<cudaEvent_t> signal;  // by op: recorded after it (others follow it)
    thread_local std::vector<char> joined, pdl_ok;
    made.clear();
    joined.assign(static_cast<std::size_t>(count), 0);
    pdl_ok.assign(static_cast<std::size_t>(count), 1);
    joined[0] = 1;
    signal.assign(n, nullptr);
    const auto new_event = [&](cudaEvent_t& e) -> bool {
      if (cudaEventCreateWithFlags(&e, cudaEventDisableTiming) != cudaSuccess) {
        (void)cudaGetLastError();
        launch_err = error(errc::unsupported_op, "cudaEventCreate for a capture lane failed", index_);
        return false;
      }
      made.push_back(e);
      return true;
    };
    const auto captured = [&](cudaError_t r, const char* what) {
      if (r == cudaSuccess || launch_err) return;
      (void)cudaGetLastError();
      launch_err = error(errc::unsupported_op, std::string(what) + ": " + cudaGetErrorString(r), index_);
    };
    for (std::size_t i = 0; i < n && !launch_err; ++i)
      for (int a = 0; a < ops[i].after_count; ++a) {
        const auto from = static_cast<std::size_t>(ops[i].after[a]);
        if (ops[i].after[a] < 0 || from >= i) {
          launch_err = error(errc::invalid_argument, "a capture op follows op " + std::to_string(ops[i].after[a]) +
                                                         ", not an earlier one", index_);
          break;
        }
        if (ops[from].lane == ops[i].lane) continue;  // the lane's own order
        if (!signal[from]) (void)new_event(signal[from]);
      }
    cudaEvent_t fork = nullptr;
    if (count > 1 && new_event(fork)) captured(cudaEventRecord(fork, cs->s_), "cudaEventRecord (capture fork)");
    int copy_lane = 0;  // the lane of the copies waiting in the batch
    // Host copies waiting to become one kernel (launch_byte_copies): a run
    // of consecutive copies none of which touches another's bytes. `as_given`
    // keeps their pointers as the segment gave them, for the independence
    // check (host and device memory are disjoint in the unified address
    // space); `mapped_copies`, the pointers the kernel uses (a host side
    // as its device alias).
    thread_local std::vector<gpu::byte_copy> as_given, mapped_copies;
    as_given.clear();
    mapped_copies.clear();
    const auto flush_copies = [&] {
      if (mapped_copies.empty() || launch_err) return;
      thread_local launch_ctx c;
      c.stream = css[static_cast<std::size_t>(copy_lane)]->s_;
      c.pdl = kernels_.pdl && pdl_ok[static_cast<std::size_t>(copy_lane)];
      c.sm_count = sm_count_;
      c.where = spec_.name + " host copies (a kernel in a graph)";
      launch_err = launch_byte_copies(c, mapped_copies.data(), static_cast<int>(mapped_copies.size()));
      if (launch_err) (void)cudaGetLastError();
      pdl_ok[static_cast<std::size_t>(copy_lane)] = 1;
      ++copy_kernels;
      as_given.clear();
      mapped_copies.clear();
    };
    for (std::size_t i = 0; i < n && !launch_err; ++i) {
      const segment_op& o = ops[i];
      if (o.lane < 0 || o.lane >= count) {
        launch_err = error(errc::invalid_argument, "capture lane " + std::to_string(o.lane) + " out of range", index_);
        break;
      }
      const auto lane = static_cast<std::size_t>(o.lane);
      cuda_stream& on = *css[lane];
      // A new lane forks off the capture; a wait for another lane's op
      // follows the event recorded after it. Copies batched so far go first.
      bool waits = !joined[lane];
      for (int a = 0; a < o.after_count && !waits; ++a) waits = signal[static_cast<std::size_t>(o.after[a])] != nullptr;
      if (waits || (!mapped_copies.empty() && copy_lane != o.lane)) flush_copies();
      if (launch_err) break;
      if (!joined[lane]) {
        captured(cudaStreamWaitEvent(on.s_, fork, 0), "cudaStreamWaitEvent (capture fork)");
        joined[lane] = 1;
        pdl_ok[lane] = 0;
      }
      for (int a = 0; a < o.after_count; ++a)
        if (cudaEvent_t e = signal[static_cast<std::size_t>(o.after[a])]) {
          captured(cudaStreamWaitEvent(on.s_, e, 0), "cudaStreamWaitEvent (capture lane)");
          pdl_ok[lane] = 0;
        }
      if (launch_err) break;
      const bool signals = signal[i] != nullptr;
      if (o.what == segment_op::kind::launch) {
        flush_copies();
        if (launch_err) break;
        const op_launch& l = *o.launch;
        if (l.op && !is_view_op(l.op->op) && !is_leaf_op(l.op->op)) ++kernels;
        launch_err = run_op(on, l, pdl_ok[lane] != 0);
        pdl_ok[lane] = 1;
        if (signals && !launch_err) captured(cudaEventRecord(signal[i], on.s_), "cudaEventRecord (capture lane)");
        continue;
      }
      copy_lane = o.lane;
      // A host copy becomes a kernel node that reads (h2d) or writes (d2h)
      // the pinned host memory directly: on an H200 a tiny job's graph with
      // memcpy nodes cost its host 10.3 us to launch against 4.7 with copy
      // kernels, and each copy engine hand-over cost GPU time (a tiny job's
      // round trip 28.9-32.4 us against 24.2-28.9; a LLaMA-1B decode step
      // 0.834 ms against 0.818; docs/BENCHMARKS.md, session 33). Only from
      // memory the GPU reads directly: pageable memory goes through staging,
      // which a graph cannot.
      const bool h2d = o.what == segment_op::kind::copy_h2d;
      if (o.bytes <= 0) continue;
      void* host = h2d ? const_cast<void*>(o.src) : o.dst;
      if (pageable(host)) {
        launch_err = error(errc::unsupported_op, "a host copy of the segment is from pageable memory", index_);
        continue;
      }
      void* mapped = nullptr;
      if (graph_copy_kernels_ && cudaHostGetDevicePointer(&mapped, host, 0) == cudaSuccess && mapped) {
        const gpu::byte_copy given{o.dst, o.src, o.bytes};
        const bool joins = std::all_of(as_given.begin(), as_given.end(),
                                       [&](const gpu::byte_copy& b) { return gpu::copies_independent(b, given); });
        if (!joins || mapped_copies.size() == static_cast<std::size_t>(max_batched_copies)) flush_copies();
        as_given.push_back(given);
        mapped_copies.push_back({h2d ? o.dst : mapped, h2d ? mapped : o.src, o.bytes});
        if (signals) {
          flush_copies();
          if (!launch_err) captured(cudaEventRecord(signal[i], on.s_), "cudaEventRecord (capture lane)");
        }
        continue;
      }
      (void)cudaGetLastError();  // a refused cudaHostGetDevicePointer: a memcpy node instead
      flush_copies();
      if (launch_err) break;
      if (cudaError_t r = cudaMemcpyAsync(o.dst, o.src, static_cast<size_t>(o.bytes),
                                          h2d ? cudaMemcpyHostToDevice : cudaMemcpyDeviceToHost, on.s_);
          r != cudaSuccess) {
        (void)cudaGetLastError();
        launch_err = error(errc::unsupported_op, std::string("cudaMemcpyAsync: ") + cudaGetErrorString(r), index_);
      }
      pdl_ok[lane] = 0;  // a memcpy node before: no programmatic edge
      if (signals && !launch_err) captured(cudaEventRecord(signal[i], on.s_), "cudaEventRecord (capture lane)");
    }
    flush_copies();
    // Every lane that forked joins the replaying stream again (also after an
    // error: the capture must end with no lane left in it).
    for (int l = 1; l < count; ++l) {
      if (!joined[static_cast<std::size_t>(l)]) continue;
      cudaEvent_t join = nullptr;
      const bool ok = !launch_err;
      if (cudaEventCreateWithFlags(&join, cudaEventDisableTiming) != cudaSuccess) {
        (void)cudaGetLastError();
        if (!launch_err) launch_err = error(errc::unsupported_op, "cudaEventCreate for a capture join failed", index_);
        continue;
      }
      made.push_back(join);
      if (cudaEventRecord(join, css[static_cast<std::size_t>(l)]->s_) != cudaSuccess ||
          cudaStreamWaitEvent(cs->s_, join, 0) != cudaSuccess) {
        (void)cudaGetLastError();
        if (ok) launch_err = error(errc::unsupported_op, "joining capture lane " + std::to_string(l) + " failed", index_);
      }
    }
    cudaGraph_t graph = nullptr;
    const cudaError_t ended = cudaStreamEndCapture(cs->s_, &graph);  // always: leaves capture mode
    if (ended != cudaSuccess) (void)cudaGetLastError();
    for (cudaEvent_t e : made) AG_CUDA_ASSERT(cudaEventDestroy(e));
    made.clear();
    const auto drop = [&] {
      if (graph) AG_CUDA_ASSERT(cudaGraphDestroy(graph));
    };
    if (launch_err) {
      drop();
      if (!alive()) return core_->dead_error();
      return refused(launch_err.message);
    }
    if (ended != cudaSuccess || !graph) {
      drop();
      return refused(std::string("cudaStreamEndCapture: ") + cudaGetErrorString(ended));
    }
    cudaGraphExec_t exec = nullptr;
    const cudaError_t inst = cudaGraphInstantiateWithFlags(&exec, graph, 0);
    drop();
    if (inst != cudaSuccess) {
      (void)cudaGetLastError();
      return refused(std::string("cudaGraphInstantiate: ") + cudaGetErrorString(inst));
    }
    return std::unique_ptr<replay_graph>(std::make_unique<cuda_replay_graph>(core_, exec, kernels, copy_kernels));
  }

  error replay(stream& s, replay_graph& rg) override {
    auto us = usable(s, "replay");
    if (!us) return us.err();
    auto* g = own_graph(rg);
    if (!g) return foreign_graph_error();
    device_guard dg(core_->ordinal);
    slow_call probe(spec_.name, "cudaGraphLaunch");
    if (error e = AG_CORE_CHECK(*core_, cudaGraphLaunch(g->exec_, (*us)->s_), spec_.name + " graph replay"))
      return std::move(e).concerning(index_);
    return {};
  }

  /// On the poller thread while it is awake (backend_options::
  /// cuda_launch_on_poller; event_poller.hpp says why and how the stream's
  /// order is kept); a sleeping poller would make the launch wait for its
  /// wake-up, so then here, as replay() and notify().
  error replay_and_notify(stream& s, replay_graph& rg, std::function<void(const error&)> done) override {
    if (!launch_on_poller_ || mode_.load(std::memory_order_relaxed) != notify_mode::poller || !core_->poll->awake())
      return device::replay_and_notify(s, rg, std::move(done));
    // No drain: the hand-over queue keeps the order of the launches before it.
    auto us = usable(s, "replay", /*drain=*/false);
    if (!us) return us.err();
    auto* g = own_graph(rg);
    if (!g) return foreign_graph_error();
    launch_item it;
    it.owner = core_;
    it.exec = g->exec_;
    it.stream = (*us)->s_;
    it.then.done = std::move(done);
    it.then.fault = (*us)->fault_;
    core_->poll->push_launch(std::move(it));
    return {};
  }

  /// The members' GPUs, device ids and operand sizes; an error naming the
  /// first member that is not a live CUDA device or whose operand does not fit.
  /// With `abort_for_dead`, a dead member also aborts its NCCL groups (the
  /// enqueue path, so the other members' parts do not wait for it); a query
  /// (collective_syncs_members) leaves that to the enqueue.
  struct member_list {
    std::vector<int> gpus;
    std::vector<uint64_t> uids;
    std::vector<int64_t> elements;
  };
  expected<member_list> members_of(const collective_launch& l, const std::string& where, bool abort_for_dead) const {
    const auto refuse = [&](errc code, const std::string& what) {
      return error(code, where + ": " + what, index_, -1, l.op->name);
    };
    if (l.members.size() != l.inputs.size() || l.rank < 0 || static_cast<std::size_t>(l.rank) >= l.inputs.size())
      return refuse(errc::invalid_argument, "members, operands and rank do not agree");
    member_list m;
    for (std::size_t k = 0; k < l.members.size(); ++k) {
      auto* peer = dynamic_cast<cuda_device*>(l.members[k]);
      if (!peer)
        return refuse(errc::unsupported_op, "member " + std::to_string(k) + " ('" +
                                                (l.members[k] ? l.members[k]->spec().name : std::string("null")) +
                                                "') is not a CUDA device");
      if (!peer->alive()) {
        error why = peer->core_->dead_error();
        if (abort_for_dead) abort_nccl_groups_of(peer->core_->ordinal, why.message);
        return why;
      }
      if (l.inputs[k].type != l.op->type || (!l.inputs[k].data && l.inputs[k].dims.numel() > 0))
        return refuse(errc::invalid_argument, "operand of rank " + std::to_string(k) + " is null or of another dtype");
      m.gpus.push_back(peer->core_->ordinal);
      m.uids.push_back(peer->uid_);
      m.elements.push_back(l.inputs[k].dims.numel());
    }
    return m;
  }

  collective_path_choice path_of(const collective_launch& l, const member_list& m) const {
    return choose_cuda_collective_path(l.op->op, l.bytes, m.gpus, m.elements,
                                       nccl_crossover_for(m.gpus, nccl_min_bytes_, nccl_min_bytes_wide_), nccl_built(),
                                       l.algo);
  }

  /// NCCL's kernels pair the ranks themselves; the own one-shot reads the
  /// other members' operands once the caller's waits say they are written.
  bool collective_syncs_members(const collective_launch& l) const override {
    if (!l.op) return false;
    auto m = members_of(l, spec_.name, false);
    return m && path_of(l, *m).path == collective_path::nccl;
  }

  /// Picks the path by collective_path.hpp's rule (the same on every
  /// member): NCCL over the group's communicator (nccl_group.hpp) for large
  /// messages on distinct GPUs, else the own one-shot over peer-mapped
  /// buffers (collective.cuh), for which every member must be a CUDA device
  /// this GPU can read (the same GPU, or peer access), else unsupported_op
  /// naming the member. A dead member aborts the group's communicator, so
  /// the other members' NCCL parts do not wait for it.
  error collective(stream& s, const collective_launch& l) override {
    auto us = usable(s, "collective");
    if (!us) return us.err();
    if (!l.op) return error(errc::invalid_argument, spec_.name + ": collective without a node", index_);
    std::string where = spec_.name + " " + to_string(l.op->op) + " '" + l.op->name + "'";
    const auto refuse = [&](errc code, const std::string& what) {
      return error(code, where + ": " + what, index_, -1, l.op->name);
    };
    if (!l.out.data && l.out.dims.numel() > 0) return refuse(errc::invalid_argument, "no output buffer");
    auto m = members_of(l, where, true);
    if (!m) return m.err();
    const collective_path_choice path = path_of(l, *m);
    where += " (" + path.reason + ")";  // errors say which path ran and why
    device_guard g(core_->ordinal);
    // A void part (collective_launch::void_part) matters only where parts
    // pair by order: the one-shot and copy-engine paths read the members'
    // operands themselves after their waits, so nothing waits for it there.
    if (l.void_part && path.path != collective_path::nccl) return {};
    if (path.path == collective_path::nccl) {
      error e = nccl_part(**us, l, m->gpus, m->uids, where);
      if (!e) return {};
      if (e.code == errc::device_failed) {
        core_->mark_dead(e);
        abort_nccl_groups_of(core_->ordinal, e.message);
      }
      return std::move(e).concerning(index_, -1, l.op->name);
    }
    for (std::size_t k = 0; k < l.members.size(); ++k) {
      auto* peer = static_cast<cuda_device*>(l.members[k]);
      if (peer->core_->ordinal != core_->ordinal) {
        int can = 0;
        AG_CUDA_TRY(cudaDeviceCanAccessPeer(&can, core_->ordinal, peer->core_->ordinal), where);
        if (!can)
          return refuse(errc::unsupported_op, "no peer access from " + spec_.name + " to member '" + peer->spec_.name +
                                                  "': the " + std::string(to_string(path.path)) +
                                                  " collective reads the members' memory");
      }
    }
    launch_ctx c;
    c.stream = (*us)->s_;
    c.fault_word = (*us)->fault_ ? (*us)->fault_->dev : nullptr;
    c.where = where;
    c.sm_count = sm_count_;
    error e = path.path == collective_path::copy_engine ? copy_engine_part(c, l, **us) : launch_collective(c, l);
    if (!e) return {};
    if (e.code == errc::device_failed) core_->mark_dead(e);
    return std::move(e).concerning(index_, -1, l.op->name);
  }

  /// A copy-engine part (collective.cuh) with its scratch allocated and
  /// freed in the order of c.stream (the pool's memory, no device sync).
  error copy_engine_part(const launch_ctx& c, const collective_launch& l, const cuda_stream& cs) {
    const int64_t bytes = copy_engine_scratch_bytes(l);
    void* scratch = nullptr;
    if (bytes > 0)
      if (error e = AG_CORE_CHECK(*core_, cudaMallocAsync(&scratch, static_cast<size_t>(bytes), c.stream),
                                  c.where + " scratch"))
        return e;
    copy_lanes lanes;
    if (cs.fork_) lanes = {cs.side_, cs.fork_, cs.join_, cuda_stream::side_streams};
    error e = launch_copy_engine_collective(c, l, scratch, lanes);
    if (scratch)
      if (error fe = AG_CORE_CHECK(*core_, cudaFreeAsync(scratch, c.stream), c.where + " scratch free"); fe && !e)
        e = fe;
    return e;
  }

  /// Makes the group's NCCL communicator now when its members are distinct
  /// GPUs (the NCCL path is possible) and the build has NCCL; the device
  /// keeps it for its lifetime. Same-GPU groups run one-shot: nothing to make.
  error prepare_collective_group(const std::vector<device*>& members, int communicators) override {
    std::vector<int> gpus;
    std::vector<uint64_t> uids;
    for (device* m : members) {
      auto* peer = dynamic_cast<cuda_device*>(m);
      if (!peer) return {};  // mixed backends: collective() refuses it, naming the member
      // Every member's in-stream memory exists before any part is captured.
      if (peer->spec_.in_stream_max_bytes > 0)
        if (auto a = peer->in_stream_memory(); !a) return a.err();
      gpus.push_back(peer->core_->ordinal);
      uids.push_back(peer->uid_);
    }
    if (!nccl_built()) return {};
    const auto choice = choose_cuda_collective_path(op_kind::all_reduce, std::numeric_limits<int64_t>::max(), gpus, {},
                                                    nccl_min_bytes_, true);
    if (choice.path != collective_path::nccl) return {};
    // One communicator per job lane, kept by the device (the process's
    // cache holds them weakly).
    for (int k = 0; k < std::max(1, communicators); ++k) {
      auto grp = nccl_group::get(gpus, uids, k);
      if (!grp) return error(grp.err()).concerning(index_);
      std::lock_guard<std::mutex> lk(mem_mu_);
      groups_.push_back(std::move(*grp));
    }
    return {};
  }

  // --- in-stream collectives (in_stream.cuh) ---
  error set_collective_tag(stream& s, uint64_t job_tag) override {
    auto us = usable(s, "set_collective_tag");
    if (!us) return us.err();
    auto area = in_stream_memory();
    if (!area) return area.err();
    launch_ctx c;
    c.stream = (*us)->s_;
    c.where = spec_.name + " in-stream collective tag";
    device_guard g(core_->ordinal);
    slow_call probe(spec_.name, "the in-stream tag's launch");
    if (error e = launch_set_in_stream_tag(c, (*us)->in_stream_tag_, job_tag)) return std::move(e).concerning(index_);
    tag_enqueued_.store(job_tag, std::memory_order_relaxed);
    return {};
  }
  std::string collective_progress() const override {
    std::lock_guard<std::mutex> lk(area_mu_);
    if (!area_.progress_host) return {};
    // Copied out on a stream of its own (the copy engine runs beside parts
    // spinning on this GPU); a GPU that cannot copy any more says so.
    std::string gpu_side;
    {
      device_guard g(core_->ordinal);
      cudaStream_t s = nullptr;
      cudaError_t r = cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
      if (r == cudaSuccess) {
        r = cudaMemcpyAsync(area_.progress_host, area_.progress_dev, in_stream_progress * sizeof(unsigned long long),
                            cudaMemcpyDeviceToHost, s);
        if (r == cudaSuccess) r = cudaStreamSynchronize(s);
        (void)cudaStreamDestroy(s);
      }
      if (r != cudaSuccess) {
        gpu_side = std::string("; what the GPU did last is unreadable (") + cudaGetErrorString(r) + ")";
        (void)cudaGetLastError();
      }
    }
    const auto* p = reinterpret_cast<const volatile unsigned long long*>(area_.progress_host);
    // A part's tag (in_stream.cuh) as "job J key K".
    const auto part = [](unsigned long long tag) {
      if (tag == 0) return std::string("none");
      return "job " + std::to_string((tag >> in_stream_key_bits) - 1) + " key " +
             std::to_string(tag & ((1ull << in_stream_key_bits) - 1));
    };
    return spec_.name + ": the host set job " + std::to_string(tag_enqueued_.load(std::memory_order_relaxed)) +
           "'s tag last, launched " + part(part_enqueued_.load(std::memory_order_relaxed)) +
           " as its last plain part" +
           (gpu_side.empty() ? "; the GPU started " + part(p[0]) + " last and finished " + part(p[1]) : gpu_side);
  }
  void abort_collectives(uint64_t job_tag) noexcept override {
    std::lock_guard<std::mutex> lk(area_mu_);
    if (!area_.aborted_host) return;  // no part ever ran here
    const uint32_t at = abort_next_++ % static_cast<uint32_t>(in_stream_aborts);
    __atomic_store_n(&area_.aborted_host[at], in_stream_job_word(job_tag), __ATOMIC_RELEASE);
  }
  error collective_fault(uint64_t job_tag) const override {
    std::lock_guard<std::mutex> lk(area_mu_);
    if (!area_.faults_host) return {};
    const unsigned long long w = in_stream_job_word(job_tag);
    if (__atomic_load_n(&area_.faults_host[w % in_stream_faults], __ATOMIC_ACQUIRE) != w) return {};
    const unsigned long long* d = area_.faults_host + in_stream_faults;
    char detail[200];
    if ((d[3] >> 62) == 1) {  // a tensor-parallel decode step (decode_step.cu, tp_gave_up)
      std::snprintf(detail, sizeof detail, " (first give-up here: wanted tag %#llx from rank %llu on device %llu in "
                    "block %llu, saw %#llx)", d[0], d[3] & 0xffull, d[2] >> 32, d[2] & 0xffffffffull, d[1]);
      return error(errc::timeout,
                   spec_.name + ": a tensor-parallel decode step of job " + std::to_string(job_tag) +
                       " gave up waiting for another rank (its device died, the job was cancelled, or it waited past "
                       "cuda_collective_timeout_s = " + std::to_string(collective_timeout_s_) +
                       " s); its token is not the step's" + detail,
                   index_);
    }
    if (d[3] >> 63)  // the push path (in_stream.cuh): line flags, not announcements
      std::snprintf(detail, sizeof detail, " (first give-up here: wanted tag %#llx from device %llu in block %llu, its "
                    "pushed lines' flag %#llx, saw %#llx)", d[0], d[2] >> 32, d[2] & 0xffffffffull,
                    d[3] & 0xffffffffull, d[1]);
    else
      std::snprintf(detail, sizeof detail, " (first give-up here: wanted tag %#llx from device %llu in block %llu, saw "
                    "%#llx; previous announcement %#llx)", d[0], d[2] >> 32, d[2] & 0xffffffffull, d[1], d[3]);
    return error(errc::timeout,
                 spec_.name + ": an in-stream all_reduce part of job " + std::to_string(job_tag) +
                     " gave up waiting for a member (the member died, the job was cancelled, or it waited past "
                     "cuda_collective_timeout_s = " + std::to_string(collective_timeout_s_) +
                     " s); its result is not the sum" + detail,
                 index_);
  }

  // Pageable host memory goes through pinned staging (see staging_pool);
  // pinned / registered host memory is copied directly. The pinned pool's
  // buffers (job inputs and outputs) are known without asking the driver:
  // cudaPointerGetAttributes cost about a microsecond of every small copy.
  static bool pageable(const void* p) { return !in_pinned_pool(p) && is_pageable_host(p); }
  error copy_h2d(stream& s, void* dst, const void* src, int64_t bytes) override {
    if (bytes > 0 && src && pageable(src)) return staged_copy_h2d(s, dst, src, bytes);
    return copy(s, dst, src, bytes, cudaMemcpyHostToDevice, "copy_h2d");
  }
  error copy_d2h(stream& s, void* dst, const void* src, int64_t bytes) override {
    if (bytes > 0 && dst && pageable(dst)) return staged_copy_d2h(s, dst, src, bytes);
    return copy(s, dst, src, bytes, cudaMemcpyDeviceToHost, "copy_d2h");
  }

  /// Pinned destination: one 2-D copy (cudaMemcpy2DAsync); pageable: a
  /// staged copy per run.
  error copy_d2h_blocks(stream& s, void* dst, int64_t dst_pitch, const void* src, int64_t block_bytes,
                        int64_t blocks) override {
    if (blocks <= 1 || block_bytes <= 0 || !dst || pageable(dst))
      return device::copy_d2h_blocks(s, dst, dst_pitch, src, block_bytes, blocks);
    auto us = usable(s, "copy_d2h");
    if (!us) return us.err();
    device_guard g(core_->ordinal);
    slow_call probe(spec_.name, "copy_d2h");
    return AG_CORE_CHECK(*core_,
                         cudaMemcpy2DAsync(dst, static_cast<size_t>(dst_pitch), src, static_cast<size_t>(block_bytes),
                                           static_cast<size_t>(block_bytes), static_cast<size_t>(blocks),
                                           cudaMemcpyDeviceToHost, (*us)->s_),
                         spec_.name + " copy_d2h (" + std::to_string(blocks) + " runs)");
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
    core_->poll->record_notification(*core_, it, cs->s_);
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
  uint64_t launches_on_poller() const noexcept { return core_->poll->launches_issued(); }

  /// Test hooks (cuda_testing.hpp).
  /// `s` as this device's stream (null if it is not), once the launches
  /// handed to the poller (replay_and_notify) were issued: every call that
  /// enqueues on a stream comes through here, so it lands after them.
  cuda_stream* own(stream& s) {
    core_->poll->drain_launches();
    return own_undrained(s);
  }
  cuda_stream* own_undrained(stream& s) {
    auto* cs = dynamic_cast<cuda_stream*>(&s);
    return cs && cs->core_ == core_ && cs->s_ ? cs : nullptr;
  }
  /// The stream to enqueue `what` on: the device's death error if it is
  /// dead, invalid_argument if `s` belongs to another device.
  /// `s` as this device's live stream, or the error `what` meets; with
  /// `drain` (own) after the launches handed to the poller were issued.
  expected<cuda_stream*> usable(stream& s, const char* what, bool drain = true) {
    if (!alive()) return core_->dead_error();
    auto* cs = drain ? own(s) : own_undrained(s);
    if (!cs) return error(errc::invalid_argument, spec_.name + ": " + what + " on a stream of another device");
    return cs;
  }

  /// `rg` as a graph this device captured (null if it is not).
  cuda_replay_graph* own_graph(replay_graph& rg) const {
    auto* g = dynamic_cast<cuda_replay_graph*>(&rg);
    return g && g->core_ == core_ ? g : nullptr;
  }
  error foreign_graph_error() const {
    return error(errc::invalid_argument, spec_.name + ": replay of a graph another device captured", index_);
  }

 private:
  /// One op of a launch record: an in-stream collective part here, every
  /// other op through dispatch_op.
  /// `pdl`: false where the kernel before it on the stream is not its
  /// predecessor (a capture lane right after a fork or a wait): it then
  /// launches as a plain dependent.
  error run_op(cuda_stream& cs, const op_launch& l, bool pdl = true) {
    if (l.fused == op_launch::fusion::decode_step && l.decode_step.tp_degree > 1) return tp_decode_step(cs, l);
    if (l.collective.rank >= 0) return in_stream_part(cs, l);
    if (!pdl && kernels_.pdl) {
      kernel_choices plain = kernels_;
      plain.pdl = false;
      return dispatch_op(*core_, cs, l, spec_.name, sm_count_, plain);
    }
    return dispatch_op(*core_, cs, l, spec_.name, sm_count_, kernels_);
  }

  /// Zeroes `bytes` at `d` on a temporary non-blocking stream and waits for it.
  error zero_and_wait(void* d, std::size_t bytes, const std::string& what) {
    cudaStream_t s = nullptr;
    if (error e = AG_CORE_CHECK(*core_, cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), what)) return e;
    error e = AG_CORE_CHECK(*core_, cudaMemsetAsync(d, 0, bytes, s), what);
    if (!e) e = AG_CORE_CHECK(*core_, cudaStreamSynchronize(s), what);
    AG_CUDA_ASSERT(cudaStreamDestroy(s));
    return e;
  }

  /// This device's in-stream memory (in_stream.cuh), made on first use
  /// (then read without the lock: area_ does not change once published).
  expected<const in_stream_area*> in_stream_memory() {
    if (const in_stream_area* a = area_ready_.load(std::memory_order_acquire)) return a;
    std::lock_guard<std::mutex> lk(area_mu_);
    if (area_.arrive) return &area_;
    const auto refuse = [&](const std::string& why) {
      return error(errc::unsupported_op, spec_.name + ": in-stream collectives: " + why, index_);
    };
    if (index_ < 0 || index_ >= in_stream_slots)
      return refuse("device index " + std::to_string(index_) + " outside 0.." + std::to_string(in_stream_slots - 1));
    device_guard g(core_->ordinal);
    constexpr std::size_t flags = std::size_t{in_stream_blocks} * in_stream_slots;
    // The flag arrays, the tag word, the push parities, the progress words,
    // then the inboxes (16 MiB: 64 senders x 2 parities x 128 KiB of lines),
    // then the tensor-parallel decode step's exchange (3 MiB).
    const std::size_t words_bytes = (4 * flags + 2 + in_stream_progress) * sizeof(unsigned long long);
    const std::size_t inbox_bytes = std::size_t{in_stream_slots} * 2 * in_stream_inbox_lines * 16;
    const std::size_t dev_bytes = words_bytes + inbox_bytes + decode_exchange_bytes();
    void* d = nullptr;
    if (error e = AG_CORE_CHECK(*core_, cudaMalloc(&d, dev_bytes), spec_.name + " in-stream flags")) return e;
    // Zeroed on a stream of its own and waited for: a memset on the default
    // stream would not be ordered before the parts, which run on
    // non-blocking streams (and a device-wide sync could wait for another
    // group's parts spinning on this GPU).
    if (error e = zero_and_wait(d, dev_bytes, spec_.name + " in-stream flags")) {
      AG_CUDA_ASSERT(cudaFree(d));
      return e;
    }
    void* h = nullptr;
    const std::size_t host_bytes =
        (in_stream_aborts + in_stream_faults + in_stream_fault_detail + in_stream_progress) * sizeof(unsigned long long);
    if (error e = AG_CORE_CHECK(*core_, cudaHostAlloc(&h, host_bytes, cudaHostAllocMapped | cudaHostAllocPortable),
                                spec_.name + " in-stream rings")) {
      AG_CUDA_ASSERT(cudaFree(d));
      return e;
    }
    std::memset(h, 0, host_bytes);
    const unsigned int* dead = core_->dead_word_for_kernels();
    if (!dead) {
      AG_CUDA_ASSERT(cudaFree(d));
      AG_CUDA_ASSERT(cudaFreeHost(h));
      return refuse("no host-mapped death word");
    }
    auto* words = static_cast<unsigned long long*>(d);
    area_.arrive = words;
    area_.ack = words + flags;
    area_.last = words + 2 * flags;
    // words + 3 * flags: the device's tag word until 2026-11-28 (now one per
    // stream, cuda_stream::in_stream_tag_), left in place.
    area_.push_parity = words + 3 * flags + 2;  // 16-byte aligned, as the inboxes after it
    area_.progress_dev = words + 4 * flags + 2;
    area_.inbox = reinterpret_cast<unsigned int*>(static_cast<char*>(d) + words_bytes);
    area_.decode_exchange = static_cast<char*>(d) + words_bytes + inbox_bytes;
    // Mapped pinned memory has the same address on every GPU (UVA).
    area_.aborted_host = area_.aborted_dev = static_cast<unsigned long long*>(h);
    area_.faults_host = area_.faults_dev = area_.aborted_host + in_stream_aborts;
    area_.progress_host = area_.faults_host + in_stream_faults + in_stream_fault_detail;  // the readback's
    area_.dead_dev = dead;
    area_.slot = index_;
    area_ready_.store(&area_, std::memory_order_release);
    return &area_;
  }

  /// This member's in-stream all-reduce part (op_launch::in_stream_part):
  /// every member must be a live CUDA device this GPU can read.
  error in_stream_part(cuda_stream& cs, const op_launch& l) {
    if (kernels_.skip_in_stream) return {};  // AG_CUDA_DEBUG_SKIP=instream: diagnosis only, values wrong
    const auto& part = l.collective;
    // Reused per thread, as dispatch_op's: `where` keeps its capacity.
    thread_local launch_ctx c;
    c.where.clear();
    c.where.append(spec_.name).append(" ").append(to_string(l.op->op)).append(" '").append(l.op->name).append("' (in-stream)");
    const auto refuse = [&](errc code, const std::string& what) {
      return error(code, c.where + ": " + what, index_, -1, l.op->name);
    };
    if (part.members < 2 || part.members > in_stream_members_max || part.rank >= part.members ||
        l.inputs.size() != static_cast<std::size_t>(part.members))
      return refuse(errc::invalid_argument, "members, operands and rank do not agree");
    std::array<in_stream_member, in_stream_members_max> members{};
    std::array<int, in_stream_members_max> gpus{};
    bool own_gpus = true;  // no two members on one GPU: the kernel may release the next one early
    for (int k = 0; k < part.members; ++k) {
      auto* peer = dynamic_cast<cuda_device*>(part.devices[static_cast<std::size_t>(k)]);
      if (!peer) return refuse(errc::unsupported_op, "member " + std::to_string(k) + " is not a CUDA device");
      if (!peer->alive()) return peer->core_->dead_error();
      if (peer->core_->ordinal != core_->ordinal && !can_read(peer->core_->ordinal))
        return refuse(errc::unsupported_op, "no peer access from " + spec_.name + " to member '" + peer->spec_.name +
                                                "': the part reads the members' memory");
      auto area = peer->in_stream_memory();
      if (!area) return area.err();
      members[static_cast<std::size_t>(k)] = {l.inputs[static_cast<std::size_t>(k)].data, *area};
      gpus[static_cast<std::size_t>(k)] = peer->core_->ordinal;
      for (int j = 0; j < k; ++j) own_gpus = own_gpus && gpus[static_cast<std::size_t>(j)] != peer->core_->ordinal;
    }
    c.stream = cs.s_;
    c.pdl = kernels_.pdl;
    c.sm_count = sm_count_;
    device_guard g(core_->ordinal);
    error e = launch_in_stream_all_reduce(c, l.out, members.data(), part.members, part.rank,
                                          *members[static_cast<std::size_t>(part.rank)].area, cs.in_stream_tag_, part.key,
                                          collective_timeout_s_, own_gpus);
    if (!e) {
      // As the kernel forms it (in_stream.cu): the job word, then the key.
      part_enqueued_.store((in_stream_job_word(tag_enqueued_.load(std::memory_order_relaxed)) << in_stream_key_bits) | part.key,
                           std::memory_order_relaxed);
      return {};
    }
    if (e.code == errc::device_failed) core_->mark_dead(e);
    return std::move(e).concerning(index_, -1, l.op->name);
  }

  /// A tensor-parallel decode step's rank (decode_step_params::tp_degree >
  /// 1): every rank must be a live CUDA device whose memory this GPU can
  /// write (the kernel pushes into each rank's exchange); ranks on this
  /// same GPU share its SMs.
  error tp_decode_step(cuda_stream& cs, const op_launch& l) {
    // AG_CUDA_DEBUG_SKIP=tprank1: the peers must give up (tests only).
    if (kernels_.skip_tp_rank1 && l.decode_step.tp_rank == 1) return {};
    const auto& part = l.collective;
    const auto refuse = [&](errc code, const std::string& what) {
      return error(code, spec_.name + " decode step '" + (l.op ? l.op->name : std::string()) + "' (tensor-parallel): " + what,
                   index_, -1, l.op ? l.op->name : std::string());
    };
    if (part.members != l.decode_step.tp_degree || part.rank != l.decode_step.tp_rank || part.members > in_stream_members_max)
      return refuse(errc::invalid_argument, "its members and rank do not agree with its step's");
    auto mine = in_stream_memory();
    if (!mine) return mine.err();
    decode_step_tp tp;
    for (int k = 0; k < part.members; ++k) {
      auto* peer = dynamic_cast<cuda_device*>(part.devices[static_cast<std::size_t>(k)]);
      if (!peer) return refuse(errc::unsupported_op, "rank " + std::to_string(k) + " is not a CUDA device");
      if (!peer->alive()) return peer->core_->dead_error();
      if (peer->core_->ordinal != core_->ordinal && !can_read(peer->core_->ordinal))
        return refuse(errc::unsupported_op, "no peer access from " + spec_.name + " to rank '" + peer->spec_.name +
                                                "': the step writes into every rank's memory");
      auto area = peer->in_stream_memory();
      if (!area) return area.err();
      tp.exchange[k] = (*area)->decode_exchange;
      tp.dead[k] = (*area)->dead_dev;
      tp.slot[k] = (*area)->slot;
      tp.gpu_share += k != part.rank && peer->core_->ordinal == core_->ordinal;
    }
    tp.tag_word = cs.in_stream_tag_;
    tp.aborted = (*mine)->aborted_dev;
    tp.faults = (*mine)->faults_dev;
    tp.timeout_s = collective_timeout_s_;
    error e = dispatch_op(*core_, cs, l, spec_.name, sm_count_, kernels_, &tp);
    if (e) return e;
    // A give-up reads as this job's (collective_fault), as a part's does.
    part_enqueued_.store(in_stream_job_word(tag_enqueued_.load(std::memory_order_relaxed)) << in_stream_key_bits,
                         std::memory_order_relaxed);
    return {};
  }

  /// Whether this GPU can read GPU `ordinal`'s memory (asked once per GPU,
  /// then read without a lock).
  bool can_read(int ordinal) {
    if (ordinal < 0 || ordinal >= static_cast<int>(peer_readable_.size())) return false;
    auto& known = peer_readable_[static_cast<std::size_t>(ordinal)];
    int8_t v = known.load(std::memory_order_relaxed);
    if (v == 0) {
      int can = 0;
      if (cudaDeviceCanAccessPeer(&can, core_->ordinal, ordinal) != cudaSuccess) (void)cudaGetLastError();
      v = can != 0 ? 2 : 1;
      known.store(v, std::memory_order_relaxed);
    }
    return v == 2;
  }

  /// This member's NCCL part on its communication stream. all_reduce: one
  /// ncclAllReduce. all_gather: ncclAllGather, straight into the output when
  /// the gathered axis is outermost, else into a stream-ordered scratch
  /// buffer that one 2D copy per rank scatters to the output's rows.
  /// reduce_scatter: ncclAllReduce into scratch, then a 2D copy of this
  /// rank's slice (every rank must make the same NCCL call, and a rank knows
  /// only its own slice, so ncclReduceScatter's even split cannot be
  /// assumed). The current device is this one (caller's guard).
  error nccl_part(cuda_stream& cs, const collective_launch& l, const std::vector<int>& gpus,
                  const std::vector<uint64_t>& uids, const std::string& where) {
    auto grp = nccl_group::get(gpus, uids, l.communicator);
    if (!grp) return grp.err();
    nccl_group& g = **grp;
    if (l.void_part) return nccl_void_part(g, l, static_cast<int>(gpus.size()), cs.s_, where);
    const node& n = *l.op;
    const int r = l.rank;
    const auto es = static_cast<int64_t>(dtype_size(n.type));
    const cudaStream_t st = cs.s_;
    const void* mine = l.inputs[static_cast<std::size_t>(r)].data;
    int64_t outer = 1, inner = 1;
    const int axis = n.attrs.axis;
    if (n.op == op_kind::all_reduce) {
      if (error e = g.all_reduce(r, mine, l.out.data, l.out.dims.numel(), n.type, st, where)) return e;
      return g.async_error(r, where);
    }
    const shape& full = n.op == op_kind::all_gather ? n.dims : l.inputs[0].dims;
    for (int d = 0; d < axis; ++d) outer *= full[d];
    for (int d = axis + 1; d < full.rank(); ++d) inner *= full[d];
    if (n.op == op_kind::all_gather && outer == 1) {
      if (error e = g.all_gather(r, mine, l.out.data, l.inputs[static_cast<std::size_t>(r)].dims.numel(), n.type, st,
                                 where))
        return e;
      return g.async_error(r, where);
    }
    const int64_t scratch_elems = n.op == op_kind::all_gather ? n.dims.numel() : full.numel();
    void* scratch = nullptr;
    if (error e = AG_CORE_CHECK(*core_, cudaMallocAsync(&scratch, static_cast<size_t>(scratch_elems * es), st),
                                where + " scratch"))
      return e;
    error e;
    if (n.op == op_kind::all_gather) {
      // scratch: rank k's operand ([outer, part]) at k * outer * part; out: per row, the ranks' parts in order.
      const int64_t part = l.inputs[0].dims.numel() / outer, row = n.dims.numel() / outer;
      e = g.all_gather(r, mine, scratch, l.inputs[static_cast<std::size_t>(r)].dims.numel(), n.type, st, where);
      for (int64_t k = 0; !e && k < static_cast<int64_t>(gpus.size()); ++k)
        e = AG_CORE_CHECK(*core_,
                          cudaMemcpy2DAsync(static_cast<std::byte*>(l.out.data) + k * part * es,
                                            static_cast<size_t>(row * es),
                                            static_cast<const std::byte*>(scratch) + k * outer * part * es,
                                            static_cast<size_t>(part * es), static_cast<size_t>(part * es),
                                            static_cast<size_t>(outer), cudaMemcpyDeviceToDevice, st),
                          where + " gather rows");
    } else {
      const int64_t len = n.attrs.end - n.attrs.begin;
      e = g.all_reduce(r, mine, scratch, full.numel(), n.type, st, where);
      if (!e)
        e = AG_CORE_CHECK(*core_,
                          cudaMemcpy2DAsync(l.out.data, static_cast<size_t>(len * inner * es),
                                            static_cast<const std::byte*>(scratch) + n.attrs.begin * inner * es,
                                            static_cast<size_t>(full[axis] * inner * es),
                                            static_cast<size_t>(len * inner * es), static_cast<size_t>(outer),
                                            cudaMemcpyDeviceToDevice, st),
                          where + " slice");
    }
    // Freed in stream order after the copies (also after a failed enqueue).
    if (error fe = AG_CORE_CHECK(*core_, cudaFreeAsync(scratch, st), where + " scratch free"); fe && !e) e = fe;
    if (e) return e;
    return g.async_error(r, where);
  }

  /// A void part (collective_launch::void_part): the NCCL call nccl_part
  /// would make for `l` (the same op and count: the other members' parts
  /// pair with it by their place in the order alone), made in place on
  /// scratch from the stream's pool. It touches none of the job's memory:
  /// the job failed, the part has no waits, and its operand's and result's
  /// bytes may still hold other tensors of the job that steps launched
  /// before the failure use (the memory plan orders those through waits).
  /// The peers' parts get a void sum, which is their failed job's too.
  error nccl_void_part(nccl_group& g, const collective_launch& l, int members, cudaStream_t st,
                       const std::string& where) {
    const node& n = *l.op;
    const int r = l.rank;
    const auto es = static_cast<int64_t>(dtype_size(n.type));
    const bool gather = n.op == op_kind::all_gather;
    // nccl_part's counts: all_reduce of the result, all_gather of this
    // member's operand, reduce_scatter as an all_reduce of the full operand.
    const int64_t send = gather                       ? l.inputs[static_cast<std::size_t>(r)].dims.numel()
                         : n.op == op_kind::all_reduce ? l.out.dims.numel()
                                                       : l.inputs[0].dims.numel();
    const int64_t elems = gather ? send * members : send;
    void* scratch = nullptr;
    if (error e = AG_CORE_CHECK(*core_, cudaMallocAsync(&scratch, static_cast<size_t>(std::max<int64_t>(elems, 1) * es), st),
                                where + " void part scratch"))
      return e;
    auto* buf = static_cast<std::byte*>(scratch);
    // In place: an all_gather's operand is its own slot of the result.
    error e = gather ? g.all_gather(r, buf + r * send * es, buf, send, n.type, st, where)
                     : g.all_reduce(r, buf, buf, send, n.type, st, where);
    if (error fe = AG_CORE_CHECK(*core_, cudaFreeAsync(scratch, st), where + " void part scratch free"); fe && !e)
      e = fe;
    if (e) return e;
    return g.async_error(r, where);
  }

  /// Device -> pageable host without blocking the caller (see staging_pool).
  error staged_copy_d2h(stream& s, void* dst, const void* src, int64_t bytes) {
    auto us = usable(s, "copy_d2h");
    if (!us) return us.err();
    device_guard g(core_->ordinal);
    return staging_->copy_d2h(*core_, spec_.name, (*us)->s_, dst, src, static_cast<std::size_t>(bytes));
  }

  /// Pageable host -> device without the driver's own staging (see staging_pool).
  error staged_copy_h2d(stream& s, void* dst, const void* src, int64_t bytes) {
    auto us = usable(s, "copy_h2d");
    if (!us) return us.err();
    device_guard g(core_->ordinal);
    return staging_->copy_h2d(*core_, spec_.name, (*us)->s_, dst, src, static_cast<std::size_t>(bytes));
  }

  error copy(stream& s, void* dst, const void* src, int64_t bytes, cudaMemcpyKind kind, const char* what) {
    auto us = usable(s, what);
    if (!us) return us.err();
    cuda_stream* cs = *us;
    if (bytes <= 0) return {};
    device_guard g(core_->ordinal);
    slow_call probe(spec_.name, what);
    return AG_CORE_CHECK(*core_, cudaMemcpyAsync(dst, src, static_cast<size_t>(bytes), kind, cs->s_),
                         spec_.name + " " + what);
  }

  std::shared_ptr<core> core_;
  device_spec spec_;
  /// AG_CUDA_OP_PROFILE set: every plain launch (not replayed segments) is
  /// timed with an event pair; the destructor prints each op's time to
  /// stderr ("op_profile" lines). A diagnosis aid (actorgraph-tp-bench
  /// --op-profile), never on by default: two event records per op.
  struct op_sample {
    std::string name, kind;
    cudaEvent_t before = nullptr, after = nullptr;
  };
  const bool profiling_ = std::getenv("AG_CUDA_OP_PROFILE") != nullptr;
  std::vector<op_sample> profile_;  // under mem_mu_

  /// Sums the samples by op name and prints them, largest first; frees the
  /// events. Called with mem_mu_ held, from the destructor.
  void print_op_profile() {
    if (profile_.empty() || !alive()) return;
    (void)cudaDeviceSynchronize();
    struct total {
      std::string kind;
      int count = 0;
      double us = 0;
    };
    std::map<std::string, total> by_name;
    double all = 0;
    for (auto& smp : profile_) {
      float ms = 0;
      if (cudaEventElapsedTime(&ms, smp.before, smp.after) != cudaSuccess) (void)cudaGetLastError();
      auto& t = by_name[smp.name];
      t.kind = smp.kind;
      ++t.count;
      t.us += 1000.0 * ms;
      all += 1000.0 * ms;
      (void)cudaEventDestroy(smp.before);
      (void)cudaEventDestroy(smp.after);
    }
    std::vector<std::pair<std::string, total>> rows(by_name.begin(), by_name.end());
    std::sort(rows.begin(), rows.end(), [](const auto& a, const auto& b) { return a.second.us > b.second.us; });
    std::fprintf(stderr, "op_profile %s: %zu launches, %.1f us in all\n", spec_.name.c_str(), profile_.size(), all);
    for (const auto& [name, t] : rows)
      std::fprintf(stderr, "op_profile %s %10.1f us %5d x %-14s %s\n", spec_.name.c_str(), t.us, t.count, t.kind.c_str(),
                   name.c_str());
    profile_.clear();
  }

  int index_;
  /// Process-unique: names this logical device in its NCCL groups' keys
  /// (index_ repeats across runtimes; an address can be reused).
  const uint64_t uid_ = next_device_uid();
  kernel_choices kernels_;
  /// A replayed segment's host copies are captured as copy kernels on the
  /// pinned host memory (capture_segment); AG_CUDA_GRAPH_COPY=memcpy (a
  /// diagnosis switch, for A/B runs) captures memcpy nodes instead.
  const bool graph_copy_kernels_ = [] {
    const char* v = std::getenv("AG_CUDA_GRAPH_COPY");
    return !(v && std::string(v) == "memcpy");
  }();
  int sm_count_;
  int64_t nccl_min_bytes_;
  int64_t nccl_min_bytes_wide_;
  std::vector<std::shared_ptr<nccl_group>> groups_;  // communicators of loaded plans' groups (under mem_mu_)
  double collective_timeout_s_;
  const bool launch_on_poller_;
  // In-stream collectives: this device's flags and rings (in_stream_memory),
  // the abort ring's cursor and which GPUs this one can read.
  mutable std::mutex area_mu_;
  in_stream_area area_{};
  std::atomic<const in_stream_area*> area_ready_{nullptr};  // &area_ once made
  // What the host enqueued last (collective_progress): the job whose tag,
  // and the tag of the last part launched plainly (a replayed one is not seen).
  std::atomic<uint64_t> tag_enqueued_{0};
  std::atomic<unsigned long long> part_enqueued_{0};
  uint32_t abort_next_ = 0;
  std::array<std::atomic<int8_t>, 64> peer_readable_{};  // by GPU ordinal: 0 not asked, 1 no, 2 yes
  std::atomic<notify_mode> mode_{notify_mode::poller};
  mutable std::mutex mem_mu_;
  std::shared_ptr<staging_pool> staging_ = std::make_shared<staging_pool>();
  std::unordered_map<void*, int64_t> allocs_;
  std::vector<void*> host_allocs_;
  int64_t in_use_ = 0;
};

}  // namespace

device_ptr detail::make_device(std::shared_ptr<core> c, device_spec spec, int index, const backend_options& opts,
                               int sm_count, int cc_major) {
  return device_ptr(std::make_shared<cuda_device>(std::move(c), std::move(spec), index, opts, sm_count, cc_major));
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

expected<uint64_t> launches_on_poller(device& d) {
  auto* cd = dynamic_cast<cuda_device*>(&d);
  if (!cd) return error(errc::invalid_argument, "launches_on_poller needs a CUDA device");
  return cd->launches_on_poller();
}

expected<int64_t> free_gpu_memory(device& d) {
  auto* cd = dynamic_cast<cuda_device*>(&d);
  if (!cd) return error(errc::invalid_argument, "free_gpu_memory needs a CUDA device");
  device_guard g(d.spec().ordinal);
  size_t free_b = 0, total_b = 0;
  AG_CUDA_TRY(cudaMemGetInfo(&free_b, &total_b), d.spec().name + " free_gpu_memory");
  return static_cast<int64_t>(free_b);
}

error launch_trap(device& d, stream& s) {
  auto* cd = dynamic_cast<cuda_device*>(&d);
  cuda_stream* cs = cd ? cd->own(s) : nullptr;
  if (!cs) return error(errc::invalid_argument, "launch_trap needs a CUDA device and one of its streams");
  device_guard g(cs->core_->ordinal);
  return cuda::launch_trap(cs->s_, d.spec().name + " trap (test)");
}

}  // namespace testing

}  // namespace ag::gpu::cuda
