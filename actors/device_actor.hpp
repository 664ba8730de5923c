#pragma once
/// \file device_actor.hpp
/// The device actor: one per device. Owns the device's plan memory
/// registrations and hands out activation arenas (FIFO back-pressure when
/// none is free), and turns a backend fault into device_down for the
/// runtime actor. State in device_state (its own); the only writer of
/// plan_memory::arenas entries after compile().
///
/// Protocol: register_plan, unload_plan (from runtime_core); acquire_arena
/// -> arena_reply (now or when one is released), release_arena,
/// withdraw_arena (from job actors); device_fault (from the backend's
/// on_fault handler) -> device_down to the runtime actor, and every queued
/// or later acquire is answered with the device's death error
/// (errc::device_failed, error::device set, the backend's reason kept);
/// device_stalled (from an executing actor of the device) quarantines the
/// device the same way: device_down with the stall's errc::timeout for the
/// jobs using it, and errc::device_failed "quarantined until reset_device"
/// for acquires; reset_device (from runtime_core) calls gpu::device::reset
/// and, when it succeeds, puts the device back in service (device_up to the
/// runtime actor, which answers the caller once the registry agrees). A
/// stall report about a step that began before the last reset is ignored.

#include <caf/actor.hpp>
#include <caf/actor_system.hpp>

#include "gpu/device.hpp"

namespace ag::actors {

caf::actor spawn_device_actor(caf::actor_system& sys, gpu::device_ptr dev, int arenas_per_device,
                              caf::actor runtime_actor);

}  // namespace ag::actors
