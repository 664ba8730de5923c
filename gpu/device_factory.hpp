#pragma once
/// \file device_factory.hpp
/// The parts of gpu::make_devices (device.hpp) that create nothing: parsing a
/// device spec string and validating backend options. Separate so that a
/// spec can be checked (and fuzzed) without touching a GPU or starting a
/// thread. Pure functions, safe from any thread.

#include <cstddef>
#include <string>
#include <vector>

#include "graph/cost_model.hpp"
#include "graph/error.hpp"
#include "gpu/device.hpp"

namespace ag::gpu {

/// One item of a device spec ("sim:4", "cuda:0,1" ...), parsed.
struct device_request {
  device_kind kind = device_kind::sim;
  int count = 0;              ///< sim / cpu: how many (1..1024)
  bool all = false;           ///< cuda:all
  std::vector<int> ordinals;  ///< cuda:N[,M...]: GPU ordinals, no repeats
  std::string text;           ///< the item as written (trimmed)
  std::size_t pos = 0;        ///< its character offset in the spec
  int number = 0;             ///< 1-based item number
};

/// Parses a spec with make_devices' grammar (device.hpp) without creating
/// anything and without asking whether a GPU exists. Errors
/// (errc::bad_device_spec) name the item, its position and what is wrong.
expected<std::vector<device_request>> parse_device_spec(const std::string& spec);

/// Refuses backend options no device can run with, naming the option and
/// the value (errc::invalid_argument): sim time_scale outside [0, 1e6] or
/// NaN, jitter outside [0, 100] or NaN, fault rates outside [0, 1],
/// stall_seconds outside [0, 1e6], die_after_ops < -1, a sim device spec
/// that validate(device_spec) refuses, cpu_threads_per_stream outside
/// 0..1024. make_devices calls it first.
error validate(const backend_options& options);

}  // namespace ag::gpu
