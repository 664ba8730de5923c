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
  /// Returns -1 when it may not take one.
  int try_take_arena() {
    std::lock_guard<std::mutex> lk(free_mu_);
    return requests_outstanding_ > 0 ? -1 : pop_free();
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
  /// Device actor only: takes a free arena for a request (-1: none).
  int take_for_request() {
    std::lock_guard<std::mutex> lk(free_mu_);
    return pop_free();
  }
  /// Arena `a` is free (no request waits for it): the device actor's, or
  /// compile()'s for the first arena, before the device actor knows the plan.
  void put_free(int a) {
    std::lock_guard<std::mutex> lk(free_mu_);
    free_.push_back(a);
  }

 private:
  int pop_free() {  // free_mu_ held; -1 when none is free
    if (free_.empty()) return -1;
    const int a = free_.back();
    free_.pop_back();
    return a;
  }

  std::mutex free_mu_;
  std::vector<int> free_;
  int requests_outstanding_ = 0;
};

}  // namespace ag::actors
