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

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <mutex>
#include <memory>
#include <vector>

#include <caf/actor.hpp>
#include <caf/send.hpp>

#include "actors/collective_order.hpp"
#include "actors/launch_program.hpp"
#include "actors/plan_memory.hpp"
#include "messages/atoms.hpp"
#include "graph/host_tensor.hpp"

namespace ag::actors {

class runtime_core;

/// Who holds each state slot of a plan (and of the plans sharing its state),
/// and the jobs waiting for it in submission order. Jobs of one slot run one
/// after another, in the order they were submitted, each seeing what the
/// previous one stored. A job holds its slot from its turn until either
/// - it ended (leave), or
/// - its plan runs on one stream (loaded_plan::stream_key) and the job has
///   been issued there in full (leave_issued): from then on the stream
///   itself orders it before anything issued later. A waiting job of a plan
///   on the same stream gets its turn at once; a job of any other plan
///   waits until every such issued job ended (leave). This is what
///   lets a generator queue a sequence's next decode step behind the one
///   running (generator.hpp, pipelined greedy decoding).
/// Thread-safe: runtime_core::submit (submitting threads), job actors,
/// executing actors and backend threads (job_context::release_state_slot)
/// call it.
class slot_table {
 public:
  explicit slot_table(int slots) : slots_(static_cast<std::size_t>(slots)) {}

  /// Job `job`, of a plan on stream `stream` (0: not on one stream), wants
  /// `slot`: calls spawn(true) when it may take the slot now (the job holds
  /// it), else spawn(false) and queues the actor spawn returns, which gets
  /// msg::slot_atom when its turn comes. spawn runs under the table's lock,
  /// so no turn can come before the actor exists.
  caf::actor acquire(int slot, uint64_t job, uint64_t stream, const std::function<caf::actor(bool)>& spawn) {
    std::lock_guard<std::mutex> lk(m_);
    entry& e = slots_[static_cast<std::size_t>(slot)];
    if (e.waiting.empty() && e.may_take(stream)) {
      e.held = true;
      e.holder = job;
      return spawn(true);
    }
    caf::actor a = spawn(false);
    e.waiting.push_back(waiter{job, stream, a});
    return a;
  }

  /// Job `job` is done with `slot` (it ended, or failed or was cancelled
  /// while it waited): it leaves the queue if it waits there; if it holds
  /// the slot, the oldest waiter may take it.
  void leave(int slot, uint64_t job) {
    caf::actor next;
    {
      std::lock_guard<std::mutex> lk(m_);
      entry& e = slots_[static_cast<std::size_t>(slot)];
      if (e.held && e.holder == job) {
        e.held = false;
      } else if (auto it = std::find(e.issued.begin(), e.issued.end(), job); it != e.issued.end()) {
        e.issued.erase(it);
      } else {
        for (auto w = e.waiting.begin(); w != e.waiting.end(); ++w)
          if (w->job == job) {
            e.waiting.erase(w);
            break;
          }
      }
      next = e.grant_front();
    }
    if (next) caf::anon_send(next, msg::slot_atom::value);
  }

  /// Job `job`, which holds `slot`, has every step issued on stream
  /// `stream` (non-zero): later jobs of that stream may take the slot now;
  /// the job still counts until it leaves (ended). Changes nothing when the
  /// job does not hold the slot (it ended already).
  void leave_issued(int slot, uint64_t job, uint64_t stream) {
    caf::actor next;
    {
      std::lock_guard<std::mutex> lk(m_);
      entry& e = slots_[static_cast<std::size_t>(slot)];
      if (!e.held || e.holder != job || stream == 0 || (!e.issued.empty() && e.stream != stream)) return;
      e.held = false;
      e.stream = stream;
      e.issued.push_back(job);
      next = e.grant_front();
    }
    if (next) caf::anon_send(next, msg::slot_atom::value);
  }

 private:
  struct waiter {
    uint64_t job = 0;
    uint64_t stream = 0;
    caf::actor actor;
  };
  struct entry {
    bool held = false;
    uint64_t holder = 0;
    uint64_t stream = 0;            ///< the stream of the issued jobs (while there are any)
    std::vector<uint64_t> issued;   ///< jobs that left by leave_issued and have not ended
    std::deque<waiter> waiting;

    /// Whether a job of a plan on `s` (0: none) may take the slot now.
    bool may_take(uint64_t s) const noexcept { return !held && (issued.empty() || (s != 0 && s == stream)); }
    /// The oldest waiter, now the holder, when it may take the slot (its
    /// actor is to be told, outside the lock); else null.
    caf::actor grant_front() {
      if (waiting.empty() || !may_take(waiting.front().stream)) return {};
      held = true;
      holder = waiting.front().job;
      caf::actor a = std::move(waiting.front().actor);
      waiting.pop_front();
      return a;
    }
  };
  std::mutex m_;
  std::vector<entry> slots_;
};

struct loaded_plan {
  uint64_t key = 0;  ///< unique per runtime process; names the plan in messages
  std::shared_ptr<const launch_program> program;
  /// The executing actor of each queue of the program (by queue index),
  /// bound once when the plan is loaded: job lane 0's.
  std::vector<caf::actor> queue_actors;
  /// Job lanes 1, 2, ... (launch_program::job_lanes): the actor of each
  /// queue for the jobs of that lane, at [lane - 1]. A copied queue's actor
  /// (launch_program::copied) is the one of its lane on that copy (a
  /// device's compute lanes share one actor, which keeps a stream per lane;
  /// each copy of a communication queue is an actor of its own), a shared
  /// queue's is lane 0's.
  std::vector<std::vector<caf::actor>> other_lanes_actors;
  /// The actors of job lane `job_lane`'s queues (0: queue_actors).
  const std::vector<caf::actor>& actors_of(int job_lane) const {
    return job_lane == 0 ? queue_actors : other_lanes_actors[static_cast<std::size_t>(job_lane) - 1];
  }
  /// By device index: this plan's memory there; null for devices it does not use.
  std::vector<std::shared_ptr<plan_memory>> memory;
  /// By output: where its host buffer comes from (the output_memory() of the
  /// device that copies it out, when runtime_options::pinned_outputs); null: heap.
  std::vector<host_memory_resource*> output_memory;
  /// By input: the host memory submit() copies it into first (the
  /// host_memory() of a device that copies it in, for inputs of at most
  /// runtime_options::pinned_inputs_max_bytes); null: used where it is.
  std::vector<host_memory_resource*> input_memory;
  /// By input: where a caller best builds it (runtime::input_memory): the
  /// output_memory() of the first device that copies it in, whatever its
  /// size; null where no device copies it (a window takes it, or nothing reads it).
  std::vector<host_memory_resource*> input_home;
  runtime_core* core = nullptr;
  /// The issue line of each queue (actors/collective_order.hpp), by job
  /// lane and queue: its actor and stream lane where the queue issues in the
  /// agreed order (launch_queue::in_job_order), none elsewhere. Set at load;
  /// a job draws its turns on them from core's issue_lines once it holds all
  /// its arenas (job_actor.cpp, prepare_run). Empty: the plan orders nothing.
  std::vector<std::vector<issue_line>> order_lines;
  /// Submissions of this plan so far, counted as they are made (by
  /// draw_expected_lane).
  mutable std::atomic<uint64_t> next_submission{0};
  /// The job lane (launch_program::job_lanes) a job submitted now will
  /// probably run on: its submission number modulo the lanes, since jobs
  /// draw their collective numbers (which decide the lane) mostly in
  /// submission order. What its arena requests prefer (plan_memory::lane_of);
  /// only a preference, so a guess that is off costs a capture, nothing
  /// else. -1 with one lane. Called once per job, at submit.
  int draw_expected_lane() const noexcept {
    const int lanes = program->job_lanes();
    if (lanes <= 1) return -1;
    return static_cast<int>(next_submission.fetch_add(1, std::memory_order_relaxed) % static_cast<uint64_t>(lanes));
  }
  /// State slots (plan_options::state_slots) when the plan has store_rows
  /// nodes, else 0. A job names one at submit and holds it until it ends:
  /// jobs of one slot never overlap, since each reads what the previous one
  /// stored. Busy flags by slot, claimed by runtime_core::submit, released
  /// once by release_state_slot (job_context.hpp) before the job's handle is
  /// fulfilled, so a continuation may submit the slot's next job.
  int state_slots = 0;
  std::shared_ptr<slot_table> slots;  ///< shared with plan_options::share_state_with's plan
  /// Non-zero when every step of the plan queues on one compute lane of one
  /// device (single_lane_of): names that lane's stream, the same for every
  /// plan on it. A job of a state slot then passes its slot's turn on as
  /// soon as its steps are issued (slot_table::leave_issued).
  uint64_t stream_key = 0;

  const plan& source() const noexcept { return program->source(); }
};

}  // namespace ag::actors
