#pragma once
/// \file job_actor.hpp
/// The job actor: one per job, spawned lazily (it first runs on its first
/// message, normally the first arena_reply). runtime_core::submit registers
/// the job in the runtime's job_registry (device faults reach it from
/// there) and may start it itself (take_arenas_now, start_from_submit). Otherwise it acquires an arena on
/// each device the plan uses, in ascending device order (two jobs never wait
/// for each other in opposite orders; the first request is sent by
/// runtime_core::submit so that jobs queue in submission order), sends
/// run_job at once to the actor of every queue whose first step has no
/// remote dep (launch_queue::starts_itself; ready messages start the
/// others), counts the completion steps' step_done, then releases the
/// arenas and unregisters. State: job_actor_state (its own) and the job
/// context it builds (job_context.hpp), shared read-only afterwards.
/// The handle itself is normally fulfilled earlier, by
/// complete_from_backend() on the backend thread that saw the last completion.
///
/// Failure (step_failed, a failed step_done, fail_job from the runtime on a
/// device fault) and cancel(): sets the context's cancelled flag, sends
/// cancel_job to every queue's actor, waits for each cancel_ack (the
/// actor's launched work finished), releases memory, then fails the job with
/// the first error (errc::cancelled for cancel()). While still acquiring,
/// it withdraws its queued request and waits for that device's one answer.

#include <memory>
#include <vector>

#include <caf/actor.hpp>
#include <caf/actor_system.hpp>

#include "actors/job_context.hpp"
#include "actors/job_state.hpp"
#include "actors/loaded_plan.hpp"

namespace ag::actors {

class runtime_core;

/// Host completion fast path, called by the notify callback of a completion
/// step that finished without error, on the backend thread that observed it
/// (e.g. the CUDA event poller), before it sends step_done. The call that
/// completes the last completion step fulfils the job handle there and then:
/// trace records, outputs, continuations. The job actor, on that last
/// step_done, only releases the arenas. Does nothing for a cancelled job.
void complete_from_backend(const job_context& ctx) noexcept;

/// The death error of the first device the job's plan uses that is dead, or
/// ok. A completion step's notify that finished without error is checked
/// with it before the job may complete: a dead device skips the work still
/// queued on its streams but fires their events (device.hpp: nothing waits
/// forever), so a live device downstream runs on values that were never
/// written and would report "done" with wrong outputs (found by
/// actorgraph-soak). Conservative: a job whose part on the dead device was
/// already finished fails too, as the runtime's device_down fails every job
/// in flight that touches the device.
error dead_device_error(const job_context& ctx);

/// The fault of an in-stream collective part of the job that gave up waiting
/// for a member (gpu::device::collective_fault), on the first device of the
/// job's plan that reports one, or ok (always ok for plans without in-stream
/// parts). Checked with dead_device_error before the job may complete.
error in_stream_fault(const job_context& ctx);

/// Builds a job's context (job_context.hpp) on the submitting thread: its
/// plan, inputs, state slot and handle; no arena yet.
std::shared_ptr<job_context> make_job_context(runtime_core* core, const std::shared_ptr<job::shared_state>& ss,
                                              std::shared_ptr<const loaded_plan> lp,
                                              std::shared_ptr<const plan> user_plan, std::vector<host_tensor> inputs,
                                              int state_slot);

/// Spawns the job actor of `ctx`, lazily: it first runs on its first
/// message and begins as ctx->start says (but for job_start::no_devices: at
/// once). The caller sets ctx->job_actor, registers the job and settles
/// ctx->start before anything can message the actor.
caf::actor spawn_job_actor(caf::actor_system& sys, runtime_core* core, std::shared_ptr<job::shared_state> ss,
                           std::shared_ptr<job_context> ctx);

/// A job actor spawned ahead of its job (lazy, not yet bound to one), so
/// that submit() does not pay CAF's spawn (4.3-4.7 us on an H200 host) before
/// it sends the job's first message. runtime_core keeps a few (its spare
/// pool) and spawns the replacement after the job it bound one to has been
/// sent. bind_spare_job_actor() hands it the job; its first message then
/// starts it as spawn_job_actor's actor would start. A spare never bound
/// quits on its first message (runtime_core::shutdown sends it an exit).
struct job_binding;
struct spare_job_actor {
  caf::actor actor;
  std::shared_ptr<job_binding> binding;
};
spare_job_actor spawn_spare_job_actor(caf::actor_system& sys, runtime_core* core);

/// Binds `spare` to the job of `ctx` and returns its actor; the same
/// contract as spawn_job_actor (the caller sets ctx->job_actor, registers
/// the job and settles ctx->start before anything can message the actor),
/// except that a plan without devices needs spawn_job_actor (a spare starts
/// on a message only).
caf::actor bind_spare_job_actor(spare_job_actor spare, std::shared_ptr<job::shared_state> ss,
                                std::shared_ptr<job_context> ctx);

/// The submit fast path, on the submitting thread, before the job is
/// registered (nothing can reach its actor yet): when every device the
/// job's plan uses has an arena free and no earlier request of the plan
/// waits there (plan_memory::try_take_arena, so jobs keep their submission
/// order), takes them, readies the job (its buffers, its collective number)
/// and sets ctx.start to job_start::running; start_from_submit() then sends
/// run_job to its starting queues: two actor hops (device actor, job actor)
/// fewer between submit and the first launch. Returns false, holding
/// nothing, otherwise: the job then asks the device actors as usual.
bool take_arenas_now(job_context& ctx);

/// Sends a job readied by take_arenas_now() to its starting queues, once it
/// is registered. A job whose registration failed is not sent: its actor,
/// told by fail_job, cancels it on its queues (as any running job).
void start_from_submit(const job_context& ctx);

}  // namespace ag::actors
