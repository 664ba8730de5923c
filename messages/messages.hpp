#pragma once
/// \file messages.hpp
/// Every message the runtime's actors exchange: plain structs with a free
/// inspect(). Depends on graph/ and CAF only: it names no actor type.
/// Messages that carry process-local handles (a job, a plan's per-device
/// memory: job_ref, plan_memory_ref below) are allowed as unsafe message
/// types: they never leave the process, so they have no inspect() and are
/// not registered for serialization.
///
/// Protocol (actors/ implements it; docs/ARCHITECTURE.md has the picture):
///   job -> device:          acquire_arena, withdraw_arena, release_arena
///   device -> job:          arena_reply
///   job -> stream/copy:     run_job (one per queue per job whose first step
///                           has no remote dep), cancel_job (one per queue)
///   stream -> stream/copy:  ready (one per consumer queue, batched)
///   runtime -> device, stream/copy: register_plan (device), unload_plan
///   stream -> job:          step_failed; via device.notify: step_done, cancel_ack
///   device -> runtime:      device_down;  runtime -> job: fail_job
///   stream/copy -> device:  device_stalled (a step ran past its stall limit)
///   user -> device:         reset_device;  device -> runtime: device_up

#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <caf/actor.hpp>
#include <caf/allowed_unsafe_message_type.hpp>
#include <caf/meta/type_name.hpp>

#include "graph/error.hpp"
#include "graph/plan.hpp"

namespace ag {
/// Serializes an ag::error (code, message and the device, step and op it
/// concerns) in CAF messages.
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, error& x) {
  return f(caf::meta::type_name("ag.error"), x.code, x.message, x.device, x.step, x.op);
}
}  // namespace ag

namespace ag::msg {

// --- process-local payloads ---------------------------------------------------
// Messages name a job and a plan's device memory through these opaque bases:
// the layer above (actors/) derives its own types from them and is the only
// one that looks inside. No virtual function: a receiver that knows what it
// gets downcasts statically (static_cast), so a message costs no extra
// allocation or indirect call. The destructors are protected: only the
// derived types, held by shared_ptr created as such, are ever destroyed.

/// A running job, shared by the messages about it (run_job, ready,
/// cancel_job). actors::job_context derives from it.
class job_ref {
 public:
  uint64_t job_id() const noexcept { return job_id_; }

 protected:
  explicit job_ref(uint64_t id = 0) noexcept : job_id_(id) {}
  job_ref(const job_ref&) = default;
  job_ref& operator=(const job_ref&) = default;
  ~job_ref() = default;
  uint64_t job_id_;
};
using job_ref_ptr = std::shared_ptr<const job_ref>;

/// One loaded plan's memory on one device (register_plan).
/// actors::plan_memory derives from it.
class plan_memory_ref {
 public:
  uint64_t plan_key() const noexcept { return plan_key_; }

 protected:
  explicit plan_memory_ref(uint64_t key = 0) noexcept : plan_key_(key) {}
  plan_memory_ref(const plan_memory_ref&) = default;
  plan_memory_ref& operator=(const plan_memory_ref&) = default;
  ~plan_memory_ref() = default;
  uint64_t plan_key_;
};

// --- job <-> device actor (arenas) ---------------------------------------

/// Asks for one activation arena of plan `plan_key` on the receiving device
/// for job `job`; answered by arena_reply to `reply_to`, at once or when an
/// arena is released (FIFO back-pressure).
struct acquire_arena {
  uint64_t plan_key = 0;
  uint64_t job = 0;
  caf::actor reply_to;
  /// The job lane the job is expected to run on (loaded_plan::draw_expected_lane,
  /// -1: no preference): the device prefers to grant an arena of that lane
  /// (plan_memory::lane_of), so that each arena keeps meeting the same lane's
  /// captured graphs.
  int expected_lane = -1;
};
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, acquire_arena& x) {
  return f(caf::meta::type_name("acquire_arena"), x.plan_key, x.job, x.reply_to, x.expected_lane);
}

/// Answer to acquire_arena: an arena handle (index into the device's arena
/// pool of that plan), or an error (device dead, out of memory).
struct arena_reply {
  uint64_t job = 0;
  int device = -1;
  int arena = -1;
  ag::error err;
};
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, arena_reply& x) {
  return f(caf::meta::type_name("arena_reply"), x.job, x.device, x.arena, x.err);
}

/// Returns an arena to the pool (the job's work on it has completed).
struct release_arena {
  uint64_t plan_key = 0;
  int arena = -1;
};
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, release_arena& x) {
  return f(caf::meta::type_name("release_arena"), x.plan_key, x.arena);
}

/// Drops a queued acquire of `job` (the job was cancelled while waiting).
struct withdraw_arena {
  uint64_t plan_key = 0;
  uint64_t job = 0;
};
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, withdraw_arena& x) {
  return f(caf::meta::type_name("withdraw_arena"), x.plan_key, x.job);
}

/// Registers a loaded plan's memory on its device actor (local only). The
/// device actor becomes the writer of its arena table.
struct register_plan {
  std::shared_ptr<plan_memory_ref> memory;
};
/// Forgets a plan. Device actors: the pool stops granting arenas; memory is
/// freed when the last job holding it lets go. Executing actors: drop their
/// scratch copy of the plan's launch records. Sent when the last user
/// handle of the plan is gone (no job of it runs any more).
struct unload_plan {
  uint64_t plan_key = 0;
};
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, unload_plan& x) {
  return f(caf::meta::type_name("unload_plan"), x.plan_key);
}

// --- job -> stream / copy-engine actors ------------------------------------

/// Runs the receiver's steps of a job: those of queue `queue` of the job's
/// launch program. Sent only for queues whose first step has no remote dep
/// (launch_queue::starts_itself); the others start on their first ready.
struct run_job {
  job_ref_ptr job;
  int queue = -1;  ///< the receiver's queue in the job's launch program
};

/// Steps of a job completed on another queue's stream (their end events are
/// in the job's state). One message per (producer handler run, consumer
/// queue) and up to `max_steps` steps, held inline: no heap allocation per
/// message (a producer with more steps for one consumer sends several).
struct ready {
  static constexpr int max_steps = 6;
  job_ref_ptr job;
  int queue = -1;  ///< the receiver's queue in the job's launch program
  int count = 0;   ///< steps[0, count) are valid
  std::array<step_id, max_steps> steps{};
};

/// Drop the job's steps not yet launched (but issue, in the job's turn, the
/// paired collective parts its queues there still owe: stream_actor.hpp);
/// answer cancel_ack once the launched ones finished on the device.
struct cancel_job {
  job_ref_ptr job;
};

// --- to the job actor ------------------------------------------------------

/// A completion step (sink) finished on the device, or failed asynchronously.
struct step_done {
  uint64_t job = 0;
  step_id step = -1;
  ag::error err;
};
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, step_done& x) {
  return f(caf::meta::type_name("step_done"), x.job, x.step, x.err);
}

/// Launching a step failed (the error names device, step and op).
struct step_failed {
  uint64_t job = 0;
  step_id step = -1;
  ag::error err;
};
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, step_failed& x) {
  return f(caf::meta::type_name("step_failed"), x.job, x.step, x.err);
}

/// An actor dropped a cancelled job and its launched work has finished.
struct cancel_ack {
  uint64_t job = 0;
};
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, cancel_ack& x) {
  return f(caf::meta::type_name("cancel_ack"), x.job);
}

/// The runtime tells a job to fail (a device it uses died).
struct fail_job {
  ag::error err;
};
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, fail_job& x) {
  return f(caf::meta::type_name("fail_job"), x.err);
}

// --- device faults ---------------------------------------------------------

/// From the backend's on_fault handler to the device actor.
struct device_fault {
  ag::error err;
};
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, device_fault& x) {
  return f(caf::meta::type_name("device_fault"), x.err);
}

/// From a device actor to the runtime actor: fail every job on `device`
/// with `err`, and refuse jobs that register later with `refuse` (when set;
/// else with `err`). `plan_key`: the loaded plan whose step `err.step`
/// names (0: none); jobs of other plans get the error without that step id.
struct device_down {
  int device = -1;
  ag::error err;
  ag::error refuse;
  uint64_t plan_key = 0;
};
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, device_down& x) {
  return f(caf::meta::type_name("device_down"), x.device, x.err, x.refuse, x.plan_key);
}

/// From an executing actor to its device actor: step `err.step` of loaded
/// plan `plan_key` has been running since `since_ns` (the actor clock, ns
/// since its epoch) and passed its stall limit (`err`: errc::timeout naming
/// device and step). The device actor quarantines the device, unless it was
/// reset after `since_ns` (the report is then about abandoned work).
struct device_stalled {
  ag::error err;
  uint64_t plan_key = 0;
  int64_t since_ns = 0;
};
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, device_stalled& x) {
  return f(caf::meta::type_name("device_stalled"), x.err, x.plan_key, x.since_ns);
}

/// From runtime_core::reset_device to a device actor: lift the quarantine /
/// revive the device (gpu::device::reset), then `done` once the job registry
/// takes jobs on it again (or with the error that refused the reset).
/// Local-only: `done` is a callback into the caller.
struct reset_device {
  std::function<void(const ag::error&)> done;
};

/// From a device actor to the runtime actor: `device` serves again (after
/// device_down, which it follows in order); `done` once the registry knows.
struct device_up {
  int device = -1;
  std::function<void(const ag::error&)> done;
};

}  // namespace ag::msg

// Local-only payloads: they hold pointers into this process (a job_ref
// shares host buffers and device events; a plan_memory_ref owns device
// memory), so they must never be serialized.
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(ag::msg::register_plan)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(ag::msg::run_job)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(ag::msg::ready)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(ag::msg::cancel_job)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(ag::msg::reset_device)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(ag::msg::device_up)
