#pragma once
/// \file copy_engine_actor.hpp
/// Copy-engine actors: one per device and direction (h2d: job inputs in,
/// d2h: job outputs out, peer: copies from other devices into this one), on
/// their own streams so transfers overlap compute and each other. Same
/// protocol as the stream actor (stream_actor.hpp).

#include "actors/stream_actor.hpp"

namespace ag::actors {

/// `kind` is h2d, d2h or peer.
caf::actor spawn_copy_engine(caf::actor_system& sys, gpu::device_ptr dev, step_kind kind, stall_watch watch = {});

}  // namespace ag::actors
