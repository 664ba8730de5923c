#pragma once
/// \file device_factory.hpp
/// The part of gpu::make_devices (device.hpp) that creates nothing:
/// validating backend options (device.hpp's parse_device_spec is the other),
/// so that options can be checked (and fuzzed) without touching a GPU or
/// starting a thread. Pure functions, safe from any thread.

#include <cstddef>
#include <string>
#include <vector>

#include "graph/cost_model.hpp"
#include "graph/error.hpp"
#include "gpu/device.hpp"

namespace ag::gpu {

/// Refuses backend options no device can run with, naming the option and
/// the value (errc::invalid_argument): sim time_scale outside [0, 1e6] or
/// NaN, jitter outside [0, 100] or NaN, fault rates outside [0, 1],
/// stall_seconds outside [0, 1e6], die_after_ops < -1, a sim device spec
/// that validate(device_spec) refuses, cpu_threads_per_stream outside
/// 0..1024. make_devices calls it first.
error validate(const backend_options& options);

}  // namespace ag::gpu
