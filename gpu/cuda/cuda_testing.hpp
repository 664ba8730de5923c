#pragma once
/// \file cuda_testing.hpp
/// Hooks for tests and benchmarks of the CUDA backend (tests/cuda,
/// apps/cuda_bench). Names no CUDA type. Each returns errc::invalid_argument
/// when `d` / `s` are not a CUDA device and one of its streams.

#include <cstdint>

#include "graph/error.hpp"
#include "gpu/device.hpp"

namespace ag::gpu::cuda::testing {

/// Enqueues on `s` a kernel that holds the stream until the host stores a
/// nonzero value in *flag (memory from d.allocate_host(), which is mapped into
/// the GPU's address space); the kernel then stores 2 there.
error launch_spin_gate(device& d, stream& s, volatile uint32_t* flag);

/// Enqueues on `s` a kernel that stores `value` at `dst` (device memory or
/// memory from allocate_host()).
error launch_write_value(device& d, stream& s, uint32_t* dst, uint32_t value);

/// Enqueues on `s` a kernel that traps: once it runs, the GPU's context has a
/// sticky error for the rest of the process (every CUDA call on that GPU
/// fails), as after a kernel's illegal address. Use it only in a process of
/// its own (a death test): no later test in the process can use that GPU.
error launch_trap(device& d, stream& s);

/// The GPU's free memory in bytes as CUDA counts it (cudaMemGetInfo on the
/// device's ordinal): memory given back but not yet freed (deallocate
/// defers cudaFree) counts as used there.
expected<int64_t> free_gpu_memory(device& d);

/// How many of the backend's own kernels are not loaded in GPU `ordinal`'s
/// context (kernel_preload.hpp): 0 once its devices were made with
/// backend_options::cuda_preload_kernels; -1 when the driver cannot tell
/// (before CUDA 12.4). `modules` receives how many modules hold them.
expected<int> unloaded_kernels(int ordinal, int* modules = nullptr);

/// How many replayed graphs the poller thread of `d` launched
/// (device::replay_and_notify; backend_options::cuda_launch_on_poller).
expected<uint64_t> launches_on_poller(device& d);

}  // namespace ag::gpu::cuda::testing
