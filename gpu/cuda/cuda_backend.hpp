#pragma once
/// \file cuda_backend.hpp
/// Entry points of the CUDA backend. Names no CUDA type: gpu/device_factory.cpp
/// includes it (under #ifdef ACTORGRAPH_HAVE_CUDA) without CUDA headers.
///
/// A CUDA device (ag::gpu::device) owns one GPU ordinal: cudaMalloc'd memory
/// (never managed memory), non-blocking streams, an event pool, a cuBLAS
/// handle per compute stream and a poller thread that turns GPU completion
/// into notify() callbacks without cudaLaunchHostFunc's ~100 us latency.
/// Every method is thread-safe and sets / restores the calling thread's
/// current CUDA device around its CUDA calls.

#include <vector>

#include "gpu/host/caching_host_memory.hpp"
#include "graph/error.hpp"
#include "gpu/device.hpp"

namespace ag::gpu::cuda {

/// Number of usable CUDA devices; 0 (never a crash) without a driver or GPU.
int device_count() noexcept;

/// Creates devices for these CUDA ordinals (empty = all), with device indices
/// first_index, first_index + 1, ... in the order given. Enables peer access
/// between every pair of created devices that cudaDeviceCanAccessPeer allows.
/// Errors: errc::bad_device_spec for an ordinal out of range, a duplicate, or
/// no GPU at all; errc::device_failed when a CUDA call fails (named in the message).
expected<std::vector<device_ptr>> make_cuda_devices(const std::vector<int>& ordinals,
                                                    const backend_options& options,
                                                    int first_index);

/// The process's pool of pinned (page-locked, portable) host buffers: what
/// a CUDA device's host_memory() returns, so job outputs land in memory the
/// copy engines write directly (no staging copy, no page faults of fresh
/// memory). Every buffer, however small, is pinned (pinned_host_pool.cpp says
/// why) and cached when its last host_tensor is destroyed (up to 4 GiB;
/// beyond it they are freed); buffers come from the heap only when pinning
/// fails (printed once). Thread-safe; lives until the process exits.
host_memory_resource& pinned_host_memory() noexcept;
/// Whether `p` points into a buffer that pool handed out (pinned: a device
/// copies it directly, without asking the driver what the pointer is).
bool in_pinned_pool(const void* p);

/// Counters of that pool (tests, benchmarks); raw_allocations counts cudaHostAlloc calls.
host::host_cache_stats pinned_host_pool_stats();

/// How notify() turns GPU completion into a host callback.
enum class notify_mode : uint8_t {
  poller = 0,       ///< default: record an event, a poller thread spins on cudaEventQuery
  host_func = 1,    ///< cudaLaunchHostFunc (CUDA's own host callback; ~10x slower wake-up)
};

/// Switches the notify() path of a device made by make_cuda_devices (benchmarks
/// compare both). No-op for devices of other backends. Thread-safe; affects
/// notify() calls made after it.
void set_notify_mode(device& d, notify_mode mode) noexcept;

}  // namespace ag::gpu::cuda
