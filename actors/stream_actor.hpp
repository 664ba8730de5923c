#pragma once
/// \file stream_actor.hpp
/// The executing actors: one stream actor per compute lane of a device and
/// one copy-engine actor per device and direction (h2d, d2h, peer-in). Both
/// speak the same protocol and share this implementation:
///
///  - run_job{ctx, actor}: the job's steps for this actor are
///    ctx->lp->actors[actor].steps, kept in that (lane) order. Only actors
///    whose first step has no remote dep get one (needs_run_job); for the
///    others the first ready message of the job plays its part;
///  - ready{ctx, actor, steps}: those producer steps finished on another
///    actor's stream; a step launches once all its remote deps arrived
///    (deps on this actor are satisfied by stream order, no message);
///  - launching enqueues waits on the deps' end events, the step's work and
///    its end event, then sends ready (one message per consumer actor and
///    handler run). It never waits for the device; only completion steps
///    (sinks) ask the device for a host notification (step_done);
///  - cancel_job{ctx}: drop the job's unlaunched steps; answer cancel_ack
///    once the work already launched has finished (device.notify).
///
/// State lives in exec_state; one gpu::stream per actor, driven only by it.

#include <caf/actor.hpp>
#include <caf/actor_system.hpp>

#include "actors/internal.hpp"

namespace ag::actors {

/// Spawns the stream actor of lane `lane` of device `dev`.
caf::actor spawn_stream_actor(caf::actor_system& sys, gpu::device_ptr dev, int lane);
/// Spawns an executing actor of any kind (copy_engine_actor.hpp uses it).
caf::actor spawn_exec_actor(caf::actor_system& sys, gpu::device_ptr dev, exec_kind kind, int lane);

}  // namespace ag::actors
