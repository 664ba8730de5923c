#pragma once
/// \file job_context.hpp
/// One job's state shared by its job actor, the executing actors that run
/// its steps, and the backend thread that completes it. Messages carry it as
/// a msg::job_ref (messages.hpp); executing actors downcast with job_of().
///
/// Ownership and threads: built by runtime_core::submit (make_job_context)
/// and readied by whoever takes its last arena (the job actor, or submit's
/// take_arenas_now) before run_job is sent; then shared read-only by
/// shared_ptr<const job_context>.
/// The mutable parts are each written by one party and read after a message
/// or device notification that orders the write before the read:
///  - slots[s]: by the executing actor that runs step s; read by the
///    executing actors of its consumers (after `ready`) and by whoever
///    collects the trace (after the completion steps' notifications);
///  - outputs / staging: written by the d2h copies on the device, read by
///    the completing thread after the completion notifications;
///  - arenas: by the job actor or the submitting thread, before run_job;
///  - cancelled: set by the job actor before it sends cancel_job (atomic).

#include <atomic>
#include <cstdint>
#include <memory>
#include <vector>

#include <caf/actor.hpp>

#include "actors/job_state.hpp"
#include "actors/loaded_plan.hpp"
#include "gpu/device.hpp"
#include "messages/messages.hpp"

namespace ag::actors {

class runtime_core;

/// How the executing actor ran a replay segment (launch_program.hpp's
/// lowered_step::replay_steps), on the segment's first step; none elsewhere.
enum class replay_outcome : uint8_t {
  none = 0,   ///< not the first step of a replay segment
  plain,      ///< launched kernel by kernel: the segment's first run on this actor, or no graph slot left
  captured,   ///< captured now (for this job's buffers) and launched as one graph
  replayed,   ///< a graph captured by an earlier job with the same buffers, launched again
  fallback,   ///< launched kernel by kernel because the device refused the capture
};
/// "plain", "captured", ... (trace labels).
const char* to_string(replay_outcome o) noexcept;

/// Per step and job: the events the step recorded and when it was enqueued.
struct step_slot {
  std::shared_ptr<gpu::event> start;  ///< timing runs only
  /// A replayed segment's first step holds the segment's end event here
  /// too (the trace shows the segment as one record).
  std::shared_ptr<gpu::event> end;
  int64_t enqueue_ns = 0;
  replay_outcome replay = replay_outcome::none;
};

/// How a job actor begins (job_context::start), settled by
/// runtime_core::submit before the actor's first message.
enum class job_start : uint8_t {
  asked,         ///< submit sent the first device's acquire_arena; the actor asks the next ones
  waiting_slot,  ///< queued for its state slot; msg::slot_atom starts the acquiring
  running,       ///< take_arenas_now readied it; submit sends run_job (start_from_submit)
  failing,       ///< submit sent it a fail_job (a device it uses is dead)
  no_devices,    ///< its plan uses no device: it runs at once
};

struct job_context final : msg::job_ref, std::enable_shared_from_this<job_context> {
  explicit job_context(uint64_t id) noexcept : msg::job_ref(id) {}

  uint64_t id() const noexcept { return job_id(); }
  const launch_program& program() const noexcept { return *lp->program; }

  std::shared_ptr<const loaded_plan> lp;
  std::shared_ptr<const plan> user_plan;  ///< keeps the plan loaded while the job lives
  std::vector<int> arenas;                ///< arena handle by device index (-1 unused)
  std::vector<host_tensor> inputs;
  caf::actor job_actor;
  job_start start = job_start::asked;  ///< read once, by the job actor's first run
  bool timing = false;
  /// Its place in the runtime's order of jobs with collectives
  /// (issue_lines::draw, once it holds all its arenas): for logs.
  uint64_t collective_seq = 0;
  /// The job lane it runs on (launch_program::job_lanes): its first
  /// device's arena's (plan_memory::lane_of), set with collective_seq.
  int job_lane = 0;
  /// Its turn on each queue's issue line (collective_order.hpp), by queue;
  /// drawn with collective_seq, empty where the plan orders nothing. Read by
  /// the queues' actors after a message.
  std::vector<uint64_t> turns;
  /// Each plan device's gpu::device::generation() when it drew its turns
  /// (by plan device; empty where the plan orders nothing): its collective
  /// parts belong to the communicators of then (collective_launch::generations).
  std::vector<uint64_t> generations;
  /// The job lane it will probably run on (loaded_plan::draw_expected_lane,
  /// at submit; -1: one lane): its arena requests prefer that lane's arenas.
  int expected_lane = -1;
  /// The actors of its queues (loaded_plan::actors_of its job lane).
  const std::vector<caf::actor>& queue_actors() const { return lp->actors_of(job_lane); }
  /// The stream lane queue `q` runs this job on (launch_program::lane_on_copy).
  int lane_of(int q) const { return program().lane_on_copy(q, job_lane); }
  /// Its turn on queue `q`'s issue line: the line is the stream lane_of(q)
  /// of the queue's actor, shared with every plan's queues there.
  uint64_t turn_on(int q) const { return turns[static_cast<std::size_t>(q)]; }
  mutable std::vector<step_slot> slots;      ///< by step id
  mutable std::vector<host_tensor> outputs;
  mutable std::vector<host_tensor> staging;  ///< by output index, gathered outputs only
  mutable std::atomic<bool> cancelled{false};

  // Host completion fast path (complete_from_backend, job_actor.hpp): the
  // notify callback of the last completion step to finish without error
  // fulfils the handle directly on the backend thread, so "GPU done ->
  // future ready" costs no actor-scheduler wake-up. The job actor still
  // releases the arenas after.
  runtime_core* core = nullptr;
  std::shared_ptr<job::shared_state> handle;
  mutable std::atomic<int> completions_left{0};   ///< set before run_job is sent
  mutable std::atomic<bool> fulfilled_early{false};

  /// The plan's state slot this job reads and stores (submit_options::
  /// state_slot); -1: none. Entered by runtime_core::submit (held, or
  /// waited for), left once (release_state_slot) when the job's work is
  /// over, or earlier, when the plan runs on one stream, as soon as every
  /// step is issued there (leave_slot_issued).
  int state_slot = -1;
  mutable std::atomic<bool> in_slot_table{false};

  /// Leaves the job's state slot: the slot's next job gets its turn (or this
  /// job leaves the queue, if it never got one). The first call does it,
  /// later ones nothing. Called before the handle is fulfilled (the job's
  /// kernels are done or drained by then) and by the destructor as a last
  /// resort.
  void release_state_slot() const noexcept {
    if (in_slot_table.exchange(false, std::memory_order_acq_rel)) lp->slots->leave(state_slot, id());
  }
  /// Every step of the job is issued on its plan's one stream
  /// (loaded_plan::stream_key): the slot's next job of that stream may start
  /// now (slot_table::leave_issued; a job that ended already changes
  /// nothing there). Executing actor only.
  void leave_slot_issued() const noexcept {
    if (state_slot >= 0 && lp->stream_key != 0 && in_slot_table.load(std::memory_order_acquire))
      lp->slots->leave_issued(state_slot, id(), lp->stream_key);
  }
  ~job_context() { release_state_slot(); }

  /// The host window of the job's arena on `device` (plan_memory::windows;
  /// the job must hold an arena there); null where the plan needs none.
  std::byte* window(int device) const noexcept {
    const auto& m = *lp->memory[static_cast<std::size_t>(device)];
    return m.windows[static_cast<std::size_t>(arenas[static_cast<std::size_t>(device)])];
  }
  /// The host side of windowed copy step `ls` (copy_desc::window_offset):
  /// its place in the window of the job's arena on the step's device.
  std::byte* window_of(const lowered_step& ls) const noexcept { return window(ls.device) + ls.copy.window_offset; }
  /// Base of `where` on `device` for this job (the device must be used by the
  /// plan; for the arena, the job must hold one there).
  /// For the state region, the job's slot there (nullptr without one).
  std::byte* base(region where, int device) const noexcept {
    const auto& m = *lp->memory[static_cast<std::size_t>(device)];
    if (where == region::state)
      return state_slot < 0 || !m.states ? nullptr : static_cast<std::byte*>(m.states) + state_slot * m.state_bytes;
    return static_cast<std::byte*>(where == region::weights
                                       ? m.weights
                                       : m.arenas[static_cast<std::size_t>(arenas[static_cast<std::size_t>(device)])]);
  }
};

/// The job context behind a job named in a message. Every job_ref in this
/// process is a job_context (only the job actor makes them).
inline const job_context& job_of(const msg::job_ref& r) noexcept { return static_cast<const job_context&>(r); }

}  // namespace ag::actors
