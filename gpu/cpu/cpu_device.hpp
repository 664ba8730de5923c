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

/// The threads each kernel of a cpu device may use (its stream's worker and
/// helpers, gpu/cpu/thread_team.hpp): options.cpu_threads_per_stream, or
/// where that is 0 the machine's hardware threads shared evenly among the
/// `cpu_devices` cpu devices being made (at least 1).
int cpu_threads_for(const backend_options& options, int cpu_devices);

/// Creates a cpu device with this spec (its kind is forced to cpu) and index,
/// one of `cpu_devices` made together (cpu_threads_for). Its kernels use
/// cpu_threads_for(options, cpu_devices) threads; with OpenBLAS, the first
/// call also sets BLAS's (process-wide) thread count to it, unless the
/// environment variable OPENBLAS_NUM_THREADS is set (then that count holds).
device_ptr make_cpu_device(device_spec spec, int index, const backend_options& options = {}, int cpu_devices = 1);

}  // namespace ag::gpu::cpu
