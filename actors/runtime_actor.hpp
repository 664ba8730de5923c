#pragma once
/// \file runtime_actor.hpp
/// The runtime actor: knows the jobs in flight and the devices each one
/// touches (job_started / job_gone_atom from job actors), and on device_down
/// tells exactly the jobs on that device to fail (fail_job). Jobs on other
/// devices are untouched.

#include <caf/actor.hpp>
#include <caf/actor_system.hpp>

namespace ag::actors {

caf::actor spawn_runtime_actor(caf::actor_system& sys);

}  // namespace ag::actors
