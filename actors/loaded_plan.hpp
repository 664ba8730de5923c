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
#include <memory>
#include <vector>

#include <caf/actor.hpp>

#include "actors/launch_program.hpp"
#include "actors/plan_memory.hpp"
#include "graph/host_tensor.hpp"

namespace ag::actors {

class runtime_core;

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
  std::shared_ptr<std::atomic<bool>[]> state_busy;  ///< shared with plan_options::share_state_with's plan

  /// True when `slot` was free and is now held by the caller.
  bool claim_state_slot(int slot) const noexcept {
    bool expected = false;
    return state_busy[static_cast<std::size_t>(slot)].compare_exchange_strong(expected, true, std::memory_order_acq_rel);
  }

  const plan& source() const noexcept { return program->source(); }
};

}  // namespace ag::actors
