#pragma once
// Op dispatch: one graph op of a launch record to its CUDA host launcher.
// Only gpu/cuda/ includes it.

#include <string>

#include "gpu/cuda/cuda_stream.hpp"
#include "gpu/cuda/device_core.hpp"
#include "gpu/device.hpp"
#include "graph/error.hpp"

namespace ag::gpu::cuda::detail {

/// Enqueues the op of `l` on `cs` (a live stream of the device `dev_core`), making
/// the device current for the call. Views and leaves enqueue nothing. Errors
/// name the device, op and node; a device_failed error from a launcher marks
/// the device dead. `device_name` names the device, `sm_count` sizes grids,
/// `tf32` lets f32 matmuls use TF32 tensor cores.
error dispatch_op(core& dev_core, cuda_stream& cs, const op_launch& l, const std::string& device_name, int sm_count,
                  bool tf32);

}  // namespace ag::gpu::cuda::detail
