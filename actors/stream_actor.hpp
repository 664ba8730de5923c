#pragma once
/// \file stream_actor.hpp
/// The executing actors: one stream actor per compute lane of a device and
/// one copy-engine actor per device and direction (h2d, d2h, peer-in). Each
/// runs the steps of one queue of each loaded plan's launch program
/// (launch_program.hpp) on its one gpu::stream, which only it drives. Both
/// kinds speak the same protocol and share this implementation:
///
///  - run_job{job, queue}: run the job's steps of queue `queue`, in order.
///    Only queues whose first step has no remote dep get one
///    (launch_queue::starts_itself); for the others the job's first ready
///    message plays its part;
///  - ready{job, queue, steps}: those producer steps finished on another
///    queue's stream; a step launches once all its remote deps arrived
///    (deps on the same queue are satisfied by stream order, no message);
///  - launching enqueues waits on the deps' end events, the step's work and
///    its end event, then sends ready (one message per consumer queue and
///    handler run). It never waits for the device; only completion steps
///    (sinks) ask the device for a host notification (step_done). A device
///    call that fails fails the job (step_failed, naming device, step, op);
///  - cancel_job{job}: drop the job's unlaunched steps; answer cancel_ack
///    once the work already launched has finished (device.notify);
///  - unload_plan{key}: drop this actor's launch records of that plan.
///
/// State (exec_state, stream_actor.cpp) is the actor's own: the stream, the
/// jobs it holds, its event pools and, per loaded plan, a scratch copy of its
/// queue's launch records whose data pointers it patches per job (the launch
/// program itself is never written).

#include <caf/actor.hpp>
#include <caf/actor_system.hpp>

#include "gpu/device.hpp"
#include "graph/step_kind.hpp"

namespace ag::actors {

/// Spawns the stream actor of lane `lane` of device `dev`.
caf::actor spawn_stream_actor(caf::actor_system& sys, gpu::device_ptr dev, int lane);
/// Spawns the executing actor of queue (dev, kind, lane); it creates its
/// stream (a failure there fails every step sent to it, naming the device).
caf::actor spawn_exec_actor(caf::actor_system& sys, gpu::device_ptr dev, step_kind kind, int lane);

}  // namespace ag::actors
