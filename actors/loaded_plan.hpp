#pragma once
/// \file loaded_plan.hpp
/// A plan loaded on a runtime: its launch program (launch_program.hpp, the
/// lowered plan) bound to this runtime's actors and memory.
///
/// Ownership and threads: built by runtime_core::compile on the compiling
/// thread, immutable afterwards, shared (shared_ptr<const loaded_plan>) by
/// the plan handle's deleter, every job context of the plan and the job
/// registry; read on any thread. The mutable part of plan_memory (its arena
/// table) is the device actor's (plan_memory.hpp).

#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <mutex>
#include <memory>
#include <vector>

#include <caf/actor.hpp>
#include <caf/send.hpp>

#include "actors/launch_program.hpp"
#include "actors/plan_memory.hpp"
#include "messages/atoms.hpp"
#include "graph/host_tensor.hpp"

namespace ag::actors {

class runtime_core;

/// Who holds each state slot of a plan (and of the plans sharing its state),
/// and the jobs waiting for it in submission order. A job holds its slot
/// from its turn to its end: jobs of one slot run one after another, in the
/// order they were submitted, each seeing what the previous one stored.
/// Thread-safe: runtime_core::submit (submitting threads), job actors and
/// backend threads (job_context::release_state_slot) call it.
class slot_table {
 public:
  explicit slot_table(int slots) : slots_(static_cast<std::size_t>(slots)) {}

  /// Job `job` wants `slot`: calls spawn(true) when the slot is free (the
  /// job holds it now), else spawn(false) and queues the actor spawn
  /// returns, which gets msg::slot_atom when its turn comes. spawn runs
  /// under the table's lock, so no turn can come before the actor exists.
  caf::actor acquire(int slot, uint64_t job, const std::function<caf::actor(bool)>& spawn) {
    std::lock_guard<std::mutex> lk(m_);
    entry& e = slots_[static_cast<std::size_t>(slot)];
    if (!e.held) {
      e.held = true;
      e.holder = job;
      return spawn(true);
    }
    caf::actor a = spawn(false);
    e.waiting.emplace_back(job, a);
    return a;
  }

  /// Job `job` is done with `slot`: it leaves the queue if it waits there;
  /// if it holds the slot, the oldest waiter holds it now and is told.
  void leave(int slot, uint64_t job) {
    caf::actor next;
    {
      std::lock_guard<std::mutex> lk(m_);
      entry& e = slots_[static_cast<std::size_t>(slot)];
      if (e.held && e.holder == job) {
        if (e.waiting.empty()) {
          e.held = false;
        } else {
          e.holder = e.waiting.front().first;
          next = std::move(e.waiting.front().second);
          e.waiting.pop_front();
        }
      } else {
        for (auto it = e.waiting.begin(); it != e.waiting.end(); ++it)
          if (it->first == job) {
            e.waiting.erase(it);
            break;
          }
      }
    }
    if (next) caf::anon_send(next, msg::slot_atom::value);
  }

 private:
  struct entry {
    bool held = false;
    uint64_t holder = 0;
    std::deque<std::pair<uint64_t, caf::actor>> waiting;
  };
  std::mutex m_;
  std::vector<entry> slots_;
};

struct loaded_plan {
  uint64_t key = 0;  ///< unique per runtime process; names the plan in messages
  std::shared_ptr<const launch_program> program;
  /// The executing actor of each queue of the program (by queue index),
  /// bound once when the plan is loaded.
  std::vector<caf::actor> queue_actors;
  /// By device index: this plan's memory there; null for devices it does not use.
  std::vector<std::shared_ptr<plan_memory>> memory;
  /// By output: where its host buffer comes from (the host_memory() of the
  /// device that copies it out, when runtime_options::pinned_outputs); null: heap.
  std::vector<host_memory_resource*> output_memory;
  /// By input: the host memory submit() copies it into first (the
  /// host_memory() of a device that copies it in, for inputs of at most
  /// runtime_options::pinned_inputs_max_bytes); null: used where it is.
  std::vector<host_memory_resource*> input_memory;
  runtime_core* core = nullptr;
  /// Issue order of collectives (actors/stream_actor.cpp, communication
  /// queues): each job of this plan draws the next number when it starts
  /// running (all its arenas held), and every communication queue issues the
  /// collectives of this plan's jobs in (number, queue position) order. The
  /// only mutable member: an atomic counter, drawn by job actors.
  mutable std::atomic<uint64_t> next_collective_seq{0};
  /// State slots (plan_options::state_slots) when the plan has store_rows
  /// nodes, else 0. A job names one at submit and holds it until it ends:
  /// jobs of one slot never overlap, since each reads what the previous one
  /// stored. Busy flags by slot, claimed by runtime_core::submit, released
  /// once by release_state_slot (job_context.hpp) before the job's handle is
  /// fulfilled, so a continuation may submit the slot's next job.
  int state_slots = 0;
  std::shared_ptr<slot_table> slots;  ///< shared with plan_options::share_state_with's plan

  const plan& source() const noexcept { return program->source(); }
};

}  // namespace ag::actors
