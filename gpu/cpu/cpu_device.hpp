#pragma once
/// \file cpu_device.hpp
/// The cpu backend: real compute on host threads. Each stream is a worker
/// thread (gpu/host/host_stream.hpp) running gpu/cpu/kernels.hpp; device
/// memory is aligned host memory, counted against a logical capacity
/// (spec.mem_bytes); copies of every kind are memcpy tasks.

#include "gpu/device.hpp"

namespace ag::gpu::cpu {

/// Logical memory capacity of a cpu device unless the spec says otherwise.
constexpr int64_t default_capacity = 16LL << 30;

/// The spec make_devices gives "cpu<ordinal>": a modest host (f32 ~ 100
/// GFLOP/s, 20 GB/s memory, memcpy "links"), capacity default_capacity.
device_spec default_cpu_spec(int ordinal);

/// Creates a cpu device with this spec (its kind is forced to cpu) and index.
/// With OpenBLAS, the first call sets its (process-wide) thread count to
/// options.cpu_threads_per_stream.
device_ptr make_cpu_device(device_spec spec, int index, const backend_options& options = {});

}  // namespace ag::gpu::cpu
