#pragma once
/// \file scheduler_options.hpp
/// runtime_options' CAF scheduler settings (scheduler_threads,
/// tuned_scheduler, scheduler_max_throughput, scheduler_idle_steal_us) and
/// why they matter: docs/ARCHITECTURE.md, "Actors and messages".

#include <caf/actor_system_config.hpp>

#include "actors/actorgraph.hpp"

namespace ag::actors {

/// Writes the scheduler settings of `o` into `cfg`, before the actor system
/// is built from it (the public runtime does this on the creating thread).
void apply_scheduler_options(const runtime_options& o, caf::actor_system_config& cfg);

}  // namespace ag::actors
