#pragma once
/// \file messages.hpp
/// Every message the runtime's actors exchange: plain structs with a free
/// inspect(). Messages that carry process-local handles (the shared job
/// context, a device's per-plan memory) are allowed as unsafe message types:
/// they never leave the process, so they have no inspect() and are not
/// registered for serialization.
///
/// Protocol (actors/ implements it; docs/ARCHITECTURE.md has the picture):
///   job -> device:          acquire_arena, withdraw_arena, release_arena
///   device -> job:          arena_reply
///   job -> stream/copy:     run_job (one per actor per job whose first step
///                           has no remote dep), cancel_job (one per actor)
///   stream -> stream/copy:  ready (one per consumer actor, batched)
///   stream -> job:          step_failed; via device.notify: step_done, cancel_ack
///   device -> runtime:      device_down;  runtime -> job: fail_job

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <caf/actor.hpp>
#include <caf/allowed_unsafe_message_type.hpp>
#include <caf/meta/type_name.hpp>

#include "graph/error.hpp"
#include "graph/plan.hpp"

namespace ag::actors {
struct job_context;   // actors/job_context.hpp
struct device_plan;   // actors/internal.hpp
}  // namespace ag::actors

namespace ag {
/// Serializes an ag::error (code, message and the device, step and op it
/// concerns) in CAF messages.
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, error& x) {
  return f(caf::meta::type_name("ag.error"), x.code, x.message, x.device, x.step, x.op);
}
}  // namespace ag

namespace ag::msg {

using job_ctx_ptr = std::shared_ptr<const actors::job_context>;

// --- job <-> device actor (arenas) ---------------------------------------

/// Asks for one activation arena of plan `plan_key` on the receiving device
/// for job `job`; answered by arena_reply to `reply_to`, at once or when an
/// arena is released (FIFO back-pressure).
struct acquire_arena {
  uint64_t plan_key = 0;
  uint64_t job = 0;
  caf::actor reply_to;
};
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, acquire_arena& x) {
  return f(caf::meta::type_name("acquire_arena"), x.plan_key, x.job, x.reply_to);
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

/// Registers a loaded plan's memory on its device actor (local only).
struct register_plan {
  std::shared_ptr<actors::device_plan> plan;
};
/// Forgets a plan: its pool stops granting arenas; memory is freed when the
/// last job holding it lets go.
struct unload_plan {
  uint64_t plan_key = 0;
};
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, unload_plan& x) {
  return f(caf::meta::type_name("unload_plan"), x.plan_key);
}

// --- job -> stream / copy-engine actors ------------------------------------

/// Runs this actor's steps of a job (the actor finds them in the context's
/// plan tables). Sent only to the actors whose first step has no remote dep
/// (actors::needs_run_job); the others start on their first ready message.
struct run_job {
  job_ctx_ptr ctx;
  int actor = -1;  ///< the receiver's index in the plan's actor table
};

/// Steps of a job completed on another actor's stream (their end events are
/// in the job context). One message per (producer handler run, consumer actor)
/// and up to `max_steps` steps, held inline: no heap allocation per message
/// (a producer with more steps for one consumer sends several).
struct ready {
  static constexpr int max_steps = 6;
  job_ctx_ptr ctx;
  int actor = -1;  ///< the receiver's index in the plan's actor table
  int count = 0;   ///< steps[0, count) are valid
  std::array<step_id, max_steps> steps{};
};

/// Drop the job's steps not yet launched; answer cancel_ack once the
/// launched ones finished on the device.
struct cancel_job {
  job_ctx_ptr ctx;
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

/// From a device actor to the runtime actor: fail every job on `device`.
struct device_down {
  int device = -1;
  ag::error err;
};
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, device_down& x) {
  return f(caf::meta::type_name("device_down"), x.device, x.err);
}

}  // namespace ag::msg

// Local-only payloads: they hold pointers into this process (the job context
// shares host buffers and device events; a device_plan owns device memory),
// so they must never be serialized.
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(ag::msg::register_plan)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(ag::msg::run_job)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(ag::msg::ready)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(ag::msg::cancel_job)
