#pragma once
/// \file validate_options.hpp
/// validate(runtime_options): what runtime::create refuses before it starts
/// anything. Header-only so that the check stays next to the option list it
/// guards without a new translation unit in ag_actors.

#include <string>

#include "actors/actorgraph.hpp"
#include "gpu/device_factory.hpp"

namespace ag {

/// Refuses options no runtime can run with, naming the option and the value
/// (errc::invalid_argument): arenas_per_device outside 1..65536, a negative
/// trace_max_records,
/// scheduler_threads outside 0 (auto) .. 1024,
/// scheduler_max_throughput < 0 (0: CAF's default, unlimited),
/// scheduler_spin_polls < -1, scheduler_idle_steal_us outside 0 (CAF's default) .. 60 s,
/// spare_job_actors outside 0..1024,
/// upload_chunk_bytes < 1, stall_factor outside 0..1e9 or NaN,
/// stall_min_seconds outside 0.001..1e6 or NaN, and every
/// backend option gpu::validate(backend_options) refuses.
inline error validate(const runtime_options& o) {
  const auto bad = [](const char* name, long long v, const char* range) {
    return error(errc::invalid_argument,
                 std::string("runtime option ") + name + " = " + std::to_string(v) + ": must be " + range);
  };
  if (o.arenas_per_device < 1 || o.arenas_per_device > 65536)
    return bad("arenas_per_device", o.arenas_per_device, "1..65536 (jobs of one plan holding memory on a device)");
  if (o.trace_max_records < 0)
    return bad("trace_max_records", o.trace_max_records, "0 or more (trace records kept until take_trace)");
  if (o.scheduler_threads < 0 || o.scheduler_threads > 1024)
    return bad("scheduler_threads", o.scheduler_threads, "0 (auto) .. 1024");
  if (o.scheduler_max_throughput < 0)
    return bad("scheduler_max_throughput", o.scheduler_max_throughput, ">= 0 (0: CAF's default, unlimited)");
  if (o.scheduler_spin_polls < -1)
    return bad("scheduler_spin_polls", o.scheduler_spin_polls, ">= -1 (-1: by core count, 0: CAF's default)");
  if (o.scheduler_idle_steal_us < 0 || o.scheduler_idle_steal_us > 60'000'000)
    return bad("scheduler_idle_steal_us", o.scheduler_idle_steal_us, "0 (CAF's default) .. 60000000 (60 s)");
  if (o.spare_job_actors < 0 || o.spare_job_actors > 1024)
    return bad("spare_job_actors", o.spare_job_actors, "0..1024 (job actors spawned ahead of their jobs)");
  if (o.upload_chunk_bytes < 1)
    return bad("upload_chunk_bytes", static_cast<long long>(o.upload_chunk_bytes), ">= 1 (bytes per weight upload chunk)");
  if (!(o.stall_factor >= 0) || o.stall_factor > 1e9)
    return error(errc::invalid_argument, "runtime option stall_factor = " + std::to_string(o.stall_factor) +
                                             ": must be 0 (stall detection off) .. 1e9");
  if (!(o.stall_min_seconds >= 1e-3) || o.stall_min_seconds > 1e6)
    return error(errc::invalid_argument, "runtime option stall_min_seconds = " + std::to_string(o.stall_min_seconds) +
                                             ": must be 0.001 .. 1e6 (the stall limit's floor)");
  return gpu::validate(o.backend);
}

}  // namespace ag
