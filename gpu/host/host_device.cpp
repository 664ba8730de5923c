#include "gpu/host/host_device.hpp"

#include "gpu/host/collective_sequence.hpp"

#include <sys/mman.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <cstdint>
#include <cstddef>
#include <string>
#include <typeinfo>
#include <utility>

#include "gpu/cpu/collective.hpp"
#include "gpu/cpu/ring.hpp"
#include "gpu/cpu/kernels.hpp"

namespace ag::gpu::host {

namespace {

constexpr std::size_t alignment = 64;

std::size_t padded(int64_t bytes) {
  const auto b = static_cast<std::size_t>(std::max<int64_t>(bytes, 1));
  return (b + alignment - 1) / alignment * alignment;
}

// Device memory of at least a huge page (2 MiB) comes from its own mapping,
// aligned to huge pages and marked MADV_HUGEPAGE, where the kernel's
// transparent huge pages are "madvise" (Debian's and Ubuntu's default is
// that or "always"): a model's weights and a prefill's activations then
// fault in a huge page at a time (one fault and one zeroing per 2 MiB
// instead of 512) and a kernel streaming them crosses a page, and misses
// the TLB, 512 times less often.
constexpr std::size_t huge_page = std::size_t{2} << 20;

bool use_huge_pages(std::size_t bytes) { return huge_pages_enabled() && bytes >= huge_page; }

// `bytes` (a multiple of the 64-byte alignment) of fresh memory starting on
// a huge page: a mapping of bytes + 2 MiB, its unaligned head and its tail
// past the 4 KiB page that holds the last byte returned to the kernel. A
// last part shorter than a huge page gets ordinary pages.
constexpr std::size_t small_page = 4096;
std::size_t mapped_length(std::size_t bytes) { return (bytes + small_page - 1) / small_page * small_page; }

void* map_huge(std::size_t bytes) {
  const std::size_t len = mapped_length(bytes);
  void* raw = ::mmap(nullptr, len + huge_page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (raw == MAP_FAILED) return nullptr;
  auto* base = static_cast<std::byte*>(raw);
  const std::size_t head = (huge_page - reinterpret_cast<std::uintptr_t>(base) % huge_page) % huge_page;
  if (head > 0) ::munmap(base, head);
  ::munmap(base + head + len, huge_page - head);
  ::madvise(base + head, len, MADV_HUGEPAGE);  // advice: where THP is off the pages stay ordinary ones
  return base + head;
}

void unmap_huge(void* p, std::size_t bytes) { ::munmap(p, mapped_length(bytes)); }

// Host memory of `bytes` (a multiple of the 64-byte alignment) for a
// computing device's own memory and the output cache: huge pages from 2 MiB
// up, the heap below (or always, with AG_CPU_HUGE_PAGES=0).
void* allocate_block(std::size_t bytes) {
  return use_huge_pages(bytes) ? map_huge(bytes) : std::aligned_alloc(alignment, bytes);
}

void free_block(void* p, std::size_t bytes) {
  if (use_huge_pages(bytes)) unmap_huge(p, bytes);
  else std::free(p);
}

host::caching_host_memory& output_pool() {
  // The cache asks for multiples of its 64 KiB granule: already padded.
  static auto* pool = new host::caching_host_memory(
      "host outputs",
      [](std::size_t n, std::string& why) -> void* {
        void* p = allocate_block(n);
        if (!p) why = "allocating " + std::to_string(n) + " bytes failed";
        return p;
      },
      [](void* p, std::size_t n) { free_block(p, n); }, host_output_min_bytes, host_output_cache_bytes);
  return *pool;
}

std::string op_label(const op_launch& l) {
  if (!l.op) return "op <null>";
  return "op '" + l.op->name + "' (" + to_string(l.op->op) + ")";
}

}  // namespace

bool huge_pages_enabled() noexcept {
  static const bool on = [] {
    const char* e = std::getenv("AG_CPU_HUGE_PAGES");
    return !(e && std::strcmp(e, "0") == 0);
  }();
  return on;
}

host_memory_resource& host_output_memory() noexcept { return output_pool(); }

host_cache_stats host_output_memory_stats() { return output_pool().stats(); }

host_memory_resource* host_device::output_memory() noexcept {
  return cfg_.lazy_memory ? nullptr : &output_pool();
}

host_device::host_device(device_spec spec, int index, host_device_config cfg)
    : spec_(std::move(spec)), index_(index), cfg_(cfg) {
  // Device memory of a computing host device is host memory: it cannot hold
  // more than the host has, so the planner refuses a plan that would need it
  // (naming the bytes) instead of an allocation that overcommits and gets the
  // process killed on first touch. Timing-only memory is untouched address space.
  if (!cfg_.lazy_memory) {
    spec_.mem_bytes = std::min(spec_.mem_bytes, host_memory_bytes());
    spec_.in_host_memory = true;
  }
  const int n = std::max(1, spec_.copy_engines);
  for (int i = 0; i < n; ++i) engines_.push_back(std::make_unique<engine_clock>());
}

host_device::~host_device() {
  std::lock_guard<std::mutex> lk(mem_mutex_);
  for (auto& [p, bytes] : allocations_) {
    if (cfg_.lazy_memory) ::munmap(p, padded(bytes));
    else free_block(p, padded(bytes));
  }
  for (auto& [p, bytes] : host_allocations_) std::free(p);
}

error host_device::dead_error(const char* what) const {
  // The device's own death error (what on_fault reported, with its reason),
  // whichever path reaches a job first: this refusal or the fault notice.
  // Read under the lock: reset() clears death_error_ (a revived device).
  std::string why;
  {
    std::lock_guard<std::mutex> lk(death_mutex_);
    why = death_error_.message;
  }
  return error(errc::device_failed, "device '" + spec_.name + "' is dead, cannot " + what + " (" + why + ")", index_);
}

expected<void*> host_device::allocate(int64_t bytes) {
  if (bytes < 0)
    return error(errc::invalid_argument,
                 "device '" + spec_.name + "': allocate of a negative size (" + std::to_string(bytes) + ")", index_);
  if (!alive()) return dead_error("allocate");
  // Reserve first so that concurrent allocations cannot both pass the check.
  const int64_t before = in_use_.fetch_add(bytes, std::memory_order_relaxed);
  if (before + bytes > spec_.mem_bytes) {
    in_use_.fetch_sub(bytes, std::memory_order_relaxed);
    return error(errc::out_of_memory,
                 "device '" + spec_.name + "': cannot allocate " + std::to_string(bytes) +
                     " bytes: " + std::to_string(before) + " of " + std::to_string(spec_.mem_bytes) + " in use",
                 index_);
  }
  void* p = nullptr;
  if (cfg_.lazy_memory) {
    // Timing-only: address space without committed pages (never touched).
    p = ::mmap(nullptr, padded(bytes), PROT_READ | PROT_WRITE,
               MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) p = nullptr;
  } else {
    p = allocate_block(padded(bytes));
  }
  if (!p) {
    in_use_.fetch_sub(bytes, std::memory_order_relaxed);
    return error(errc::out_of_memory,
                 "device '" + spec_.name + "': host allocation of " + std::to_string(bytes) + " bytes failed", index_);
  }
  std::lock_guard<std::mutex> lk(mem_mutex_);
  allocations_.emplace(p, bytes);
  return p;
}

void host_device::deallocate(void* p) noexcept {
  if (!p) return;
  int64_t bytes = 0;
  {
    std::lock_guard<std::mutex> lk(mem_mutex_);
    auto it = allocations_.find(p);
    if (it == allocations_.end()) return;  // not ours: ignore rather than corrupt the heap
    bytes = it->second;
    allocations_.erase(it);
  }
  if (cfg_.lazy_memory) ::munmap(p, padded(bytes));
  else free_block(p, padded(bytes));
  in_use_.fetch_sub(bytes, std::memory_order_relaxed);
}

expected<void*> host_device::allocate_host(int64_t bytes) {
  if (bytes < 0)
    return error(errc::invalid_argument, "device '" + spec_.name + "': allocate_host of a negative size", index_);
  void* p = std::aligned_alloc(alignment, padded(bytes));
  if (!p)
    return error(errc::out_of_memory,
                 "device '" + spec_.name + "': host allocation of " + std::to_string(bytes) + " bytes failed", index_);
  std::lock_guard<std::mutex> lk(mem_mutex_);
  host_allocations_.emplace(p, bytes);
  return p;
}

void host_device::deallocate_host(void* p) noexcept {
  if (!p) return;
  {
    std::lock_guard<std::mutex> lk(mem_mutex_);
    if (host_allocations_.erase(p) == 0) return;
  }
  std::free(p);
}

error host_device::upload(void* dst, const void* src, int64_t bytes) {
  if (!alive()) return dead_error("upload");
  if (bytes < 0 || (bytes > 0 && (!dst || !src)))
    return error(errc::invalid_argument, "device '" + spec_.name + "': upload with a null pointer or negative size",
                 index_);
  if (cfg_.compute && bytes > 0) std::memcpy(dst, src, static_cast<std::size_t>(bytes));
  return {};
}

error host_device::download(void* dst, const void* src, int64_t bytes) {
  if (!alive()) return dead_error("download");
  if (bytes < 0 || (bytes > 0 && (!dst || !src)))
    return error(errc::invalid_argument, "device '" + spec_.name + "': download with a null pointer or negative size",
                 index_);
  if (cfg_.compute && bytes > 0) std::memcpy(dst, src, static_cast<std::size_t>(bytes));
  return {};
}

expected<std::unique_ptr<stream>> host_device::create_stream(step_kind kind) {
  if (!alive()) return dead_error((std::string("create a ") + to_string(kind) + " stream").c_str());
  std::unique_ptr<host_stream> s;
  try {
    s = std::make_unique<host_stream>(kind, streams_created_.fetch_add(1), cfg_.inline_streams);
  } catch (const std::exception& x) {  // std::thread could not start a worker
    return error(errc::device_failed,
                 "device '" + spec_.name + "': cannot start a " + to_string(kind) + " stream: " + x.what(), index_);
  }
  if (is_copy(kind))
    s->set_engine(copy_streams_created_.fetch_add(1) % static_cast<int>(engines_.size()));
  return std::unique_ptr<stream>(std::move(s));
}

expected<std::unique_ptr<event>> host_device::create_event(bool timing) {
  return std::unique_ptr<event>(std::make_unique<host_event>(timing));
}

error host_device::record(event& e, stream& s) {
  // host_event is final: a typeid compare, cheaper than dynamic_cast's
  // hierarchy walk on this per-step path.
  auto* he = typeid(e) == typeid(host_event) ? static_cast<host_event*>(&e) : nullptr;
  if (!he)
    return error(errc::invalid_argument,
                 "device '" + spec_.name + "': record() needs an event of a cpu or sim device", index_);
  std::shared_ptr<event_state> st = he->state();
  const uint64_t gen = st->arm();
  const bool timed = cfg_.timed;
  as_host(s).post([st = std::move(st), gen, timed](task_context& ctx) {
    const int64_t now = host_clock_ns();
    // A timed stream reached this point at its modelled time, which may be a
    // little before the worker woke up.
    const int64_t at = timed ? std::min(now, std::max(ctx.enqueue_ns, ctx.clock_ns)) : now;
    st->reach(gen, at);
  });
  return {};
}

error host_device::wait(stream& s, const event& e) {
  host_stream& hs = as_host(s);
  if (const auto* he = typeid(e) == typeid(host_event) ? static_cast<const host_event*>(&e) : nullptr) {
    std::shared_ptr<event_state> st = he->state();
    const uint64_t gen = st->armed();
    if (gen == 0) return {};  // never recorded: complete
    hs.post([st = std::move(st), gen, &hs](task_context& ctx) {
      // Held across a death or a reset of this device: only the stream's
      // destruction ends it early. The wait is what orders this stream's
      // later records after the work `e` marks, which may still be running
      // on another, live device; a dead device skips its own work but its
      // events go on to live devices, and the memory plan relies on the
      // order passing through it (a live device's copy must not overwrite
      // bytes its own kernel still reads because a dead device in between
      // fired early: TensorParallelFault under ThreadSanitizer). It does not
      // wait forever: `gen` was armed by a record() enqueued before this
      // wait, so waits never form a cycle, and every enqueued record fires
      // (a dead or reset device skips its work and cuts its stalls short, a
      // dropped stream completes its events).
      if (!ctx.dropping && !st->reached(gen)) st->wait_for(gen, [&] { return hs.dropping(); });
      if (st->reached(gen)) ctx.clock_ns = std::max(ctx.clock_ns, st->completion_ns());
    });
    return {};
  }
  // A foreign event (another backend): its own blocking wait, on our worker.
  // The event must outlive this wait (as it must on CUDA's side).
  hs.submit([&e](task_context& ctx) {
    if (ctx.dropping) return;
    e.host_wait();
    ctx.clock_ns = std::max(ctx.clock_ns, host_clock_ns());
  });
  return {};
}

void host_device::sleep_until(int64_t deadline_ns, const host_stream& hs, uint64_t ep) {
  std::unique_lock<std::mutex> lk(death_mutex_);
  for (;;) {
    const int64_t now = host_clock_ns();
    if (now >= deadline_ns || stale(ep) || hs.dropping()) return;
    // Chunks of at most 2 ms so a dropped stream notices without a notify.
    const int64_t step = std::min<int64_t>(deadline_ns - now, 2'000'000);
    death_cv_.wait_for(lk, std::chrono::nanoseconds(step));
  }
}

int64_t host_device::occupy(task_context& ctx, host_stream& hs, const work_timing& t,
                            int64_t kernel_end_ns, uint64_t ep, bool kernel) {
  // Clamped before the conversion (a double past int64 converts to undefined
  // behaviour): about 30 years, far beyond any validated option.
  const auto to_ns = [](double s) { return static_cast<int64_t>(std::clamp(s * 1e9, 0.0, 1e18)); };
  const int64_t dur = to_ns(t.seconds * cfg_.time_scale);
  const int64_t extra = to_ns(t.extra_wall_seconds);
  int64_t start = std::max(ctx.enqueue_ns, ctx.clock_ns);
  int64_t end;
  if (hs.engine() >= 0) {
    // Copy streams share the device's copy engines: a copy starts when both
    // its stream and its engine are free.
    auto& eng = *engines_[static_cast<std::size_t>(hs.engine())];
    std::lock_guard<std::mutex> lk(eng.mutex);
    start = std::max(start, eng.busy_until);
    end = start + dur + extra;
    eng.busy_until = end;
  } else if (kernel) {
    const int64_t launch = std::min(dur, to_ns(t.launch_seconds * cfg_.time_scale));
    const int64_t latency = std::min(dur - launch, to_ns(t.latency_seconds * cfg_.time_scale));
    const int64_t tail = std::min(dur - launch - latency, to_ns(t.tail_seconds * cfg_.time_scale));
    std::scoped_lock lk(launch_clock_.mutex, compute_clock_.mutex);
    // A kernel without a launch of its own (replayed in a graph) does not
    // queue behind the host's launches of the other lanes.
    const int64_t launch_start = launch > 0 ? std::max(start, launch_clock_.busy_until) : start;
    if (launch > 0) launch_clock_.busy_until = launch_start + launch;
    const int64_t body_start = std::max(launch_start + launch + latency, compute_clock_.busy_until);
    compute_clock_.busy_until = body_start + (dur - launch - latency - tail);
    end = compute_clock_.busy_until + tail + extra;  // the tail: this stream only
  } else {
    end = start + dur + extra;
  }
  sleep_until(end, hs, ep);
  // Cut short by a death or a reset: the stream's timeline ends now, not at
  // the modelled end (a 600 s stall would otherwise delay the revived
  // device's next work by the rest of it).
  if (stale(ep)) end = std::min(end, host_clock_ns());
  // With values computed, the work completes at the later of model and kernel.
  ctx.clock_ns = std::max(end, kernel_end_ns);
  return ctx.clock_ns;
}

error host_device::launch(stream& s, const op_launch& l) {
  if (!l.op) return error(errc::invalid_argument, "device '" + spec_.name + "': launch without an op", index_);
  if (!alive()) return dead_error(("launch " + op_label(l)).c_str()).concerning(index_, -1, l.op->name);
  if (!supports(l.op->op))
    return error(errc::unsupported_op, "device '" + spec_.name + "' does not support " + op_label(l), index_, -1,
                 l.op->name);
  if (cfg_.compute) {
    if (error e = cpu::check_op(l)) {
      e.message = "device '" + spec_.name + "': " + e.message;
      return std::move(e).concerning(index_, -1, l.op->name);
    }
  }
  host_stream& hs = as_host(s);
  work_timing t;
  if (error e = admit_op(hs, l, t)) return std::move(e).concerning(index_, -1, l.op->name);
  const bool compute = cfg_.compute && !is_view_op(l.op->op) && !is_leaf_op(l.op->op);
  auto work = [this, &hs, t, compute, ep = epoch()](task_context& ctx, const op_launch& op) {
    if (ctx.dropping || stale(ep)) return;
    // Counted only where work takes modelled time: the instant device's
    // per-op cost is what dispatch benchmarks measure.
    if (cfg_.timed) ops_begun_.fetch_add(1, std::memory_order_relaxed);
    int64_t kernel_end = 0;
    if (compute) {
      if (error e = cpu::run_op(op, cfg_.kernel_threads, cfg_.kernel_parts)) {
        e.code = errc::op_failed;
        e.message = "device '" + spec_.name + "': " + op_label(op) + " failed: " + e.message;
        hs.set_error(std::move(e).concerning(index_, -1, op.op->name));
      }
      kernel_end = host_clock_ns();
    }
    // An untimed stream's timeline is read by nobody (record() stamps events
    // with the clock itself): no clock read per op.
    if (cfg_.timed) occupy(ctx, hs, t, kernel_end, ep, /*kernel=*/true);
    op_executed(ops_run_.fetch_add(1, std::memory_order_relaxed) + 1);
  };
  if (hs.inline_mode()) hs.post([&](task_context& ctx) { work(ctx, l); });  // no copy of `l`
  else hs.submit([work, l](task_context& ctx) { work(ctx, l); });
  return {};
}

collective_sequence::ticket host_device::checked_place(const collective_launch& c, const std::string& label) const {
  if (!collective_sequence::checking().load(std::memory_order_relaxed)) return {};
  collective_sequence::identity id{c.cancelled.get(), {}};
  id.operands.reserve(c.inputs.size());
  for (const tensor_arg& in : c.inputs) id.operands.push_back(in.data);
  std::vector<collective_sequence::member> group;
  group.reserve(c.members.size());
  for (std::size_t k = 0; k < c.members.size(); ++k) {
    const auto* hm = static_cast<const host_device*>(c.members[k]);
    const uint64_t now = hm->epoch();
    const uint64_t then = k < c.generations.size() ? c.generations[k] : now;
    if (then != now)
      return {nullptr, error(errc::device_failed,
                             "device '" + spec_.name + "': " + label + ": member '" + hm->spec_.name +
                                 "' was reset since this job started: the members' communicator of then is gone",
                             hm->index_, -1, c.op->name)};
    group.push_back({hm->instance_id_, then});
  }
  return collective_sequence::instance().issue(group, c.communicator, c.rank, std::move(id),
                                               "'" + c.op->name + "' of device '" + spec_.name + "'");
}

error host_device::collective(stream& s, const collective_launch& c) {
  if (!c.op) return error(errc::invalid_argument, "device '" + spec_.name + "': collective without an op", index_);
  const std::string label = "collective '" + c.op->name + "' (" + to_string(c.op->op) + ")";
  if (!alive()) return dead_error(label.c_str()).concerning(index_, -1, c.op->name);
  for (device* m : c.members)
    if (!m || !dynamic_cast<host_device*>(m))
      return error(errc::unsupported_op,
                   "device '" + spec_.name + "': " + label + " has a member that is not a cpu or sim device (" +
                       (m ? m->spec().name : std::string("null")) + "): host collectives read the members' memory",
                   index_, -1, c.op->name);
  if (cfg_.compute && !c.void_part) {  // a void part reads nothing (below)
    if (error e = cpu::check_collective(c)) {
      e.message = "device '" + spec_.name + "': " + e.message;
      return std::move(e).concerning(index_, -1, c.op->name);
    }
  }
  // NCCL's pairing rule (collective_sequence.hpp; when checking): this
  // member's part takes the next position of its communicator; another
  // collective there is an error now, or when the part runs if a later
  // member's part breaks it. The communicator is the members as they were
  // when the job started (collective_launch::generations): one revived
  // since is not in it.
  auto ticket = checked_place(c, label);
  if (ticket.found) return std::move(ticket.found).concerning(index_, -1, c.op->name);
  // A void part only keeps its place in the order (checked above): host
  // parts read the members' operands themselves once their waits say they
  // are written, so nothing pairs with it. And a void part has no waits:
  // its result's bytes may still be another tensor of its job that a step
  // launched before the failure reads (the memory plan orders the two
  // through the waits). Writing it there gave wrong tokens to other
  // sequences of a batched decode state (session 91: the generation soak;
  // writing to scratch instead gave none).
  if (c.void_part) return {};
  host_stream& hs = as_host(s);
  const work_timing t = collective_timing(hs, c);
  const bool compute = cfg_.compute;
  const bool ring = compute && cfg_.ring_collectives && !hs.inline_mode() && c.algo == collective_algo::ring &&
                    c.members.size() > 1;
  hs.submit([this, &hs, t, compute, ring, c, label, ep = epoch(), paired = std::move(ticket.position)](
                task_context& ctx) {
    if (ctx.dropping || stale(ep)) return;
    if (paired && paired->broken.load(std::memory_order_acquire)) {
      hs.set_error(error(errc::internal, "device '" + spec_.name + "': " + label + ": " + paired->why, index_, -1,
                         c.op->name));
      return;
    }
    // A member that died may never have written its operand: fail the part
    // (its job is failed by the runtime too), do not read or wait for it.
    const auto dead_member = [&]() -> error {
      for (device* m : c.members)
        if (!m->alive()) {
          // The member's own death error (a dead device refuses an empty
          // download with it) says why it died: the job's error names the
          // fault, not only the device (found by actorgraph-soak).
          const error why = m->download(nullptr, nullptr, 0);
          return error(errc::device_failed,
                       "device '" + spec_.name + "': " + label + ": member '" + m->spec().name + "' died" +
                           (why ? " (" + why.message + ")" : std::string{}),
                       m->index(), -1, c.op->name);
        }
      return {};
    };
    if (error e = dead_member()) {
      hs.set_error(std::move(e));
      return;
    }
    int64_t end = 0;
    if (ring) {
      // Polled while the part waits for a neighbour: this device or stream
      // going away, or a member dying, stops it (never a hang).
      const auto abort = [&]() -> error {
        if (hs.dropping())
          return error(errc::cancelled, "device '" + spec_.name + "': " + label + ": stream destroyed", index_, -1,
                       c.op->name);
        if (!alive()) return dead_error(label.c_str()).concerning(index_, -1, c.op->name);
        return dead_member();
      };
      if (error e = cpu::run_ring_collective(c, abort)) {
        if (e.code != errc::device_failed && e.code != errc::cancelled) e.code = errc::op_failed;
        if (e.message.rfind("device '", 0) != 0) e.message = "device '" + spec_.name + "': " + e.message;
        if (e.device < 0) e = std::move(e).concerning(index_, -1, c.op->name);
        hs.set_error(std::move(e));
      }
      end = host_clock_ns();
    } else if (compute) {
      if (error e = cpu::run_collective(c)) {
        e.code = errc::op_failed;
        e.message = "device '" + spec_.name + "': " + e.message;
        hs.set_error(std::move(e).concerning(index_, -1, c.op->name));
      }
      end = host_clock_ns();
    }
    if (cfg_.timed) occupy(ctx, hs, t, end, ep);
    else ctx.clock_ns = host_clock_ns();
  });
  return {};
}

error host_device::enqueue_copy(stream& s, copy_kind k, void* dst, const void* src, int64_t bytes,
                                device* src_dev, int64_t blocks, int64_t dst_pitch) {
  static const char* names[] = {"copy_h2d", "copy_d2h", "copy_peer"};
  const char* name = names[static_cast<int>(k)];
  if (!alive()) return dead_error(name);
  if (bytes < 0 || (bytes > 0 && (!dst || !src)))
    return error(errc::invalid_argument,
                 "device '" + spec_.name + "': " + name + " with a null pointer or negative size (" +
                     std::to_string(bytes) + " bytes)",
                 index_);
  host_stream& hs = as_host(s);
  const work_timing t = copy_timing(hs, k, bytes, src_dev);
  const bool compute = cfg_.compute && bytes > 0;
  const bool timed = cfg_.timed;
  // A source device of another backend is read through its synchronous download.
  device* foreign = (src_dev && !dynamic_cast<host_device*>(src_dev)) ? src_dev : nullptr;
  if (blocks < 1 || bytes % blocks != 0 || (blocks > 1 && dst_pitch < bytes / blocks))
    return error(errc::invalid_argument,
                 "device '" + spec_.name + "': " + name + " of " + std::to_string(bytes) + " bytes in " +
                     std::to_string(blocks) + " runs " + std::to_string(dst_pitch) + " bytes apart",
                 index_);
  hs.submit([this, &hs, dst, src, bytes, t, compute, timed, foreign, name, blocks, dst_pitch,
             ep = epoch()](task_context& ctx) {
    if (ctx.dropping || stale(ep)) return;
    int64_t copy_end = 0;
    if (compute) {
      if (foreign) {
        if (error e = foreign->download(dst, src, bytes)) {
          e.message = "device '" + spec_.name + "': " + name + " from '" + foreign->spec().name +
                      "' failed: " + e.message;
          hs.set_error(std::move(e).concerning(index_));
        }
      } else if (blocks == 1) {
        std::memcpy(dst, src, static_cast<std::size_t>(bytes));
      } else {
        const int64_t run = bytes / blocks;
        for (int64_t b = 0; b < blocks; ++b)
          std::memcpy(static_cast<char*>(dst) + b * dst_pitch, static_cast<const char*>(src) + b * run,
                      static_cast<std::size_t>(run));
      }
      copy_end = host_clock_ns();
    }
    if (timed) occupy(ctx, hs, t, copy_end, ep);
  });
  return {};
}

error host_device::copy_h2d(stream& s, void* dst, const void* src, int64_t bytes) {
  return enqueue_copy(s, copy_kind::h2d, dst, src, bytes, nullptr);
}

error host_device::copy_d2h(stream& s, void* dst, const void* src, int64_t bytes) {
  return enqueue_copy(s, copy_kind::d2h, dst, src, bytes, nullptr);
}

error host_device::copy_d2h_blocks(stream& s, void* dst, int64_t dst_pitch, const void* src, int64_t block_bytes,
                                   int64_t blocks) {
  return enqueue_copy(s, copy_kind::d2h, dst, src, block_bytes * blocks, nullptr, blocks, dst_pitch);
}

error host_device::copy_peer(stream& s, void* dst, device& src_dev, const void* src, int64_t bytes) {
  return enqueue_copy(s, copy_kind::peer, dst, src, bytes, &src_dev);
}

void host_device::notify(stream& s, std::function<void(const error&)> done) {
  host_stream& hs = as_host(s);
  hs.submit([this, &hs, done = std::move(done), ep = epoch()](task_context& ctx) {
    if (alive() && ep != epoch()) {
      // Work enqueued before a reset() was abandoned, not run: whoever waits
      // for it must not take its outputs for results.
      done(error(errc::device_failed,
                 "device '" + spec_.name + "' was reset with this work pending: it did not run", index_));
    } else if (!alive()) {
      error why;
      {
        std::lock_guard<std::mutex> lk(death_mutex_);
        why = death_error_;
      }
      done(why);
    } else if (ctx.dropping) {
      done(error(errc::cancelled, "device '" + spec_.name + "': stream destroyed with work pending", index_));
    } else {
      done(hs.take_error());
    }
  });
}

error host_device::synchronize(stream& s) {
  as_host(s).drain();
  if (!alive()) return dead_error("synchronize");
  return as_host(s).take_error();
}

void host_device::on_fault(std::function<void(const error&)> handler) {
  std::unique_lock<std::mutex> lk(death_mutex_);
  if (fault_reported_ || !dead_.load()) {
    fault_handler_ = std::move(handler);
    return;
  }
  // Died before anyone listened: report now, once.
  fault_reported_ = true;
  error why = death_error_;
  lk.unlock();
  if (handler) handler(why);
}

void host_device::die(error why) {
  if (why.code != errc::device_failed) {
    why.code = errc::device_failed;
  }
  // The fault names this device, in its text and in error::device (the device
  // actor then reports it as is). A caller that set the field named it already.
  if (why.device != index_) {
    why.message = "device '" + spec_.name + "' died" + (why.message.empty() ? "" : ": " + why.message);
    why.device = index_;
  }
  std::function<void(const error&)> handler;
  {
    std::lock_guard<std::mutex> lk(death_mutex_);
    if (dead_.load()) return;
    death_error_ = why;
    dead_.store(true, std::memory_order_release);
    if (fault_handler_) {
      fault_reported_ = true;
      handler = fault_handler_;
    }
  }
  death_cv_.notify_all();
  if (handler) handler(why);
}

error host_device::reset() {
  {
    std::lock_guard<std::mutex> lk(death_mutex_);
    // Before dead_ clears: a task that sees the device alive again also sees
    // the new epoch, so nothing enqueued before the reset runs after it.
    epoch_.fetch_add(1, std::memory_order_acq_rel);
    death_error_ = {};
    fault_reported_ = false;  // the next death is reported again
    dead_.store(false, std::memory_order_release);
  }
  death_cv_.notify_all();  // stalled work (sleep_until) gives up now
  revived();
  return {};
}

}  // namespace ag::gpu::host
