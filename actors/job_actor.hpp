#pragma once
/// \file job_actor.hpp
/// The job actor: one per job. Acquires an arena on each device the plan
/// uses, in ascending device order (two jobs never wait for each other in
/// opposite orders), sends run_job to every executing actor of the plan at
/// once, counts the completion steps' step_done, then releases the arenas
/// and fulfils the job's shared state (result, trace records).
///
/// Failure (step_failed, a failed step_done, fail_job from the runtime on a
/// device fault) and cancel(): sets the context's cancelled flag, sends
/// cancel_job to every actor of the plan, waits for each cancel_ack (the
/// actor's launched work finished), releases memory, then fails the job with
/// the first error (errc::cancelled for cancel()). While still acquiring,
/// it withdraws its queued request and waits for that device's one answer.

#include <memory>
#include <vector>

#include <caf/actor.hpp>
#include <caf/actor_system.hpp>

#include "actors/internal.hpp"
#include "actors/job_state.hpp"

namespace ag::actors {

caf::actor spawn_job_actor(caf::actor_system& sys, runtime_core* core, std::shared_ptr<job::shared_state> ss,
                           std::shared_ptr<const loaded_plan> lp, std::shared_ptr<const plan> user_plan,
                           std::vector<host_tensor> inputs);

}  // namespace ag::actors
