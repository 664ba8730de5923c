#pragma once
/// \file stream_actor.hpp
/// The executing actors: one stream actor per device for all its compute
/// lanes (or one per lane with runtime_options::actor_per_lane) and one
/// copy-engine actor per device and direction (h2d, d2h, peer-in). Each runs
/// the steps of its queues of each loaded plan's launch program
/// (launch_program.hpp) on its gpu::streams (one per lane it serves), which
/// only it drives. A ready for a queue the actor runs itself is not sent: the
/// consumer advances in the same turn. Both kinds speak the same protocol and
/// share this implementation:
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
///  - cancel_job{job}: drop the job's unlaunched steps, but for the paired
///    collective parts its ordered queues here had not issued yet (NCCL
///    pairs a communicator's parts by their place in each member's order
///    alone): those are issued in the job's turn on their line, with no
///    waits, before the line moves on; answer cancel_ack once they are and
///    the work launched here has finished (device.notify);
///  - unload_plan{key}: drop this actor's launch records of that plan.
///
///  - stall watch (runtime_options::stall_factor > 0): every launched step
///    records an end event and is kept, per stream, until it completed. A
///    delayed stall_atom to itself (every stall_min_seconds / 2, only while
///    something is kept) finds each stream's oldest unfinished step; once
///    its remote deps completed it is running (from that check on), and
///    when it has run past max(stall_min_seconds, stall_factor x estimate x
///    device time_scale) the actor sends device_stalled (errc::timeout
///    naming device and step) to its device actor, once per step.
///
/// State (exec_state, stream_actor.cpp) is the actor's own: the streams, the
/// jobs it holds (per job and queue), its event pools and, per loaded plan and
/// queue, a scratch copy of the queue's launch records whose data pointers it patches per job (the launch
/// program itself is never written).

#include <caf/actor.hpp>
#include <caf/actor_system.hpp>

#include "gpu/device.hpp"
#include "graph/step_kind.hpp"

namespace ag::actors {

/// Stall detection of an executing actor (runtime_options::stall_factor).
struct stall_watch {
  double factor = 0;          ///< 0: off
  double min_seconds = 1.0;   ///< the limit's floor; checks run every min_seconds / 2
  caf::actor device_actor;    ///< where device_stalled goes
};

/// Spawns a stream actor of device `dev`, its stream of lane `lane` made at
/// once (it makes the other lanes' streams on their first step).
caf::actor spawn_stream_actor(caf::actor_system& sys, gpu::device_ptr dev, int lane, stall_watch watch = {});
/// Spawns the executing actor of queue (dev, kind, lane); it creates its
/// stream (a failure there fails every step sent to it, naming the device).
caf::actor spawn_exec_actor(caf::actor_system& sys, gpu::device_ptr dev, step_kind kind, int lane,
                            stall_watch watch = {});

}  // namespace ag::actors
