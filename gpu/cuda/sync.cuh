#pragma once
// Tiny kernels for stream synchronisation with the host (host launchers).
#include "gpu/cuda/kernel_args.hpp"

namespace ag::gpu::cuda {

/// Enqueues one thread that spins (with __nanosleep) until *flag, in
/// host-mapped pinned memory, is nonzero, then sets it to 2 ("passed") so the
/// host may recycle the flag. Holds `stream` without blocking the host; uses
/// one resident block of one SM while it waits.
error launch_wait_flag(cudaStream_t stream, unsigned int* flag, const std::string& where);
/// Enqueues one thread that stores `value` at `dst` (device or mapped host memory).
error launch_write_value(cudaStream_t stream, unsigned int* dst, unsigned int value, const std::string& where);
/// Enqueues one thread that executes a trap instruction: when it runs, the
/// context gets a sticky error (cudaErrorLaunchFailure) that every later call
/// in the process reports for this GPU. Tests of device death only.
error launch_trap(cudaStream_t stream, const std::string& where);

}  // namespace ag::gpu::cuda
