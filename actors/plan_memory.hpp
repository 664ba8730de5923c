#pragma once
/// \file plan_memory.hpp
/// One loaded plan's memory on one device: the weight region (uploaded by
/// runtime_core::compile on the compiling thread) and the arena table of its
/// activation arena pool.
///
/// Ownership and threads: built by runtime_core::compile, then shared by the
/// loaded plan (loaded_plan::memory), the device actor (register_plan) and,
/// through the loaded plan, every job of the plan. Frees its memory when the
/// last holder lets go. The arena table is the device actor's: see `arenas`;
/// the free list is shared with submitting threads under its mutex.

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <vector>

#include "gpu/device.hpp"
#include "messages/messages.hpp"

namespace ag::actors {

class plan_memory final : public msg::plan_memory_ref {
 public:
  plan_memory(uint64_t plan_key, gpu::device_ptr dev, int arena_capacity)
      : msg::plan_memory_ref(plan_key),
        dev(std::move(dev)),
        arenas(static_cast<std::size_t>(arena_capacity), nullptr),
        windows(static_cast<std::size_t>(arena_capacity), nullptr) {}
  plan_memory(const plan_memory&) = delete;
  plan_memory& operator=(const plan_memory&) = delete;
  /// Frees the weights and every arena allocated.
  ~plan_memory();

  gpu::device_ptr dev;
  void* weights = nullptr;
  int64_t weight_bytes = 0;
  /// State region (store_rows nodes): state_slots slots of state_bytes each,
  /// zeroed at load; slot s at states + s * state_bytes. Written only by the
  /// kernels of the job whose turn it is on the slot (loaded_plan.hpp slot_table).
  void* states = nullptr;
  int64_t state_bytes = 0;
  /// plan_options::share_state_with: the plan memory that owns `states`
  /// (kept alive by this one; this one then frees no state).
  std::shared_ptr<plan_memory> state_owner;
  /// plan_options::share_weights_with, on a device where the layouts match:
  /// the plan memory that owns `weights` (this one then frees no weights).
  std::shared_ptr<plan_memory> weight_owner;
  int64_t arena_bytes = 0;
  /// Arena bases by handle. Fixed size (runtime_options::arenas_per_device);
  /// entry 0 is allocated by compile(), entry i > 0 is written only by the
  /// device actor, before it first grants handle i, and read by executing
  /// actors that got i through a job (a message orders the write before
  /// the read).
  std::vector<void*> arenas;
  /// Host window of each arena (launch_program::window_bytes, copy_desc::
  /// window_offset): the host side of the job's copies that replay inside
  /// graphs, so it stays put per arena. Same index and lifetime as `arenas`
  /// (allocated with its arena, by the same party); null where the plan
  /// needs none. The holder of the arena owns its window's bytes: the job
  /// writes its inputs there before run_job, its device copies them, and
  /// the completing thread reads the outputs back before the arena is
  /// released.
  int64_t window_bytes = 0;
  std::vector<std::byte*> windows;
  /// Where the windows come from: the device's host_memory() when the plan
  /// was loaded (pinned on CUDA, so their copies can be captured); null: the heap.
  host_memory_resource* window_memory = nullptr;
  /// Allocates arena `a`'s window from window_memory. False when host
  /// memory ran out. No-op without window_bytes.
  bool allocate_window(std::size_t a);

  /// Arena handles free for the taking, shared by the device actor and
  /// submitting threads (job_actor.hpp, take_arenas_now). The device actor
  /// puts a released arena here only when no request waits for one, and a
  /// submit takes one only when no acquire_arena request of this plan is
  /// outstanding at the device actor: a job never overtakes an earlier one.
  /// Returns -1 when it may not take one. `lane`: the job lane the taking
  /// job is expected to run on (-1: any), whose arenas it takes; another
  /// lane's only once the pool is full (until then the device actor
  /// allocates one of `lane`: -1 here).
  int try_take_arena(int lane = -1) {
    std::lock_guard<std::mutex> lk(free_mu_);
    return requests_outstanding_ > 0 ? -1 : pop_free(lane, lane >= 0 && may_grow());
  }
  /// An acquire_arena request of this plan is sent to the device actor
  /// (called by its sender, before sending).
  void note_request() {
    std::lock_guard<std::mutex> lk(free_mu_);
    ++requests_outstanding_;
  }
  /// Device actor only: a request was answered (granted or refused).
  void request_answered() {
    std::lock_guard<std::mutex> lk(free_mu_);
    if (requests_outstanding_ > 0) --requests_outstanding_;
  }
  /// Device actor only: takes a free arena for a request (-1: none): one of
  /// `lane` (-1: any), or when `only_lane` is false and none of it is free,
  /// another.
  int take_for_request(int lane, bool only_lane) {
    std::lock_guard<std::mutex> lk(free_mu_);
    return pop_free(lane, only_lane);
  }
  /// Arenas allocated so far (compile()'s first, then the device actor's,
  /// the only writer after compile): whether the pool may still grow, for
  /// the device actor and submitting threads.
  std::atomic<int> allocated_arenas{0};
  bool may_grow() const noexcept {
    return allocated_arenas.load(std::memory_order_acquire) < static_cast<int>(arenas.size());
  }
  /// The job lane (launch_program::job_lanes) arena `a` belongs to: a %
  /// job_lanes; a job runs on the lane of its first device's arena
  /// (prepare_run in job_actor.cpp). Executing actors keep a replay
  /// segment's graphs per lane and per arena (stream_actor.cpp), so an arena
  /// that always meets the same lane is captured once. (Until 2026-11-30 a
  /// job's lane was its collective number modulo the lanes, and the arenas
  /// it met were whatever the last jobs freed: 8 arenas of a
  /// tensor-parallel plan on two lanes went on capturing for four rounds of
  /// 8 jobs on the sim, docs/BENCHMARKS.md session 41.) Requests prefer the
  /// lane of their submission number (loaded_plan::draw_expected_lane), so
  /// jobs alternate lanes while both have arenas free.
  int lane_of(int a) const noexcept { return job_lanes > 1 ? a % job_lanes : -1; }
  /// The plan's job lanes (launch_program::job_lanes; set at load).
  int job_lanes = 1;
  /// Device actor only (it owns `arenas`): the first handle not allocated
  /// yet, of `lane` where one is left (-1: any); -1 when all are.
  int first_unallocated(int lane) const noexcept {
    int any = -1;
    for (std::size_t k = 0; k < arenas.size(); ++k) {
      if (arenas[k]) continue;
      const int a = static_cast<int>(k);
      if (lane < 0 || lane_of(a) == lane) return a;
      if (any < 0) any = a;
    }
    return any;
  }
  /// Arena `a` is free (no request waits for it): the device actor's, or
  /// compile()'s for the first arena, before the device actor knows the plan.
  void put_free(int a) {
    std::lock_guard<std::mutex> lk(free_mu_);
    free_.push_back(a);
  }

 private:
  int pop_free(int lane, bool only_lane) {  // free_mu_ held; -1 when none is free
    if (free_.empty()) return -1;
    std::size_t at = free_.size();  // the last freed of `lane`, else the last freed
    if (lane >= 0)
      for (std::size_t k = free_.size(); k-- > 0;)
        if (lane_of(free_[k]) == lane) {
          at = k;
          break;
        }
    if (at == free_.size()) {
      if (only_lane && lane >= 0) return -1;
      at = free_.size() - 1;
    }
    const int a = free_[at];
    free_.erase(free_.begin() + static_cast<std::ptrdiff_t>(at));
    return a;
  }

  std::mutex free_mu_;
  std::vector<int> free_;
  int requests_outstanding_ = 0;
};

}  // namespace ag::actors
