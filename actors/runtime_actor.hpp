#pragma once
/// \file runtime_actor.hpp
/// The runtime actor: on device_down tells exactly the jobs on that device
/// to fail (fail_job), from the job registry (job_registry.hpp) where job actors
/// add and remove themselves; jobs on other devices are untouched. A job
/// that registers after its device died fails at once (job_registry::add).

#include <caf/actor.hpp>
#include <caf/actor_system.hpp>

#include <memory>

#include "actors/job_registry.hpp"

namespace ag::actors {

caf::actor spawn_runtime_actor(caf::actor_system& sys, std::shared_ptr<job_registry> jobs);

}  // namespace ag::actors
