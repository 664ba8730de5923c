#pragma once
// The factory of the CUDA device object (defined in cuda_device.cpp, used by
// enumerate.cpp). Only gpu/cuda/ includes it.

#include <memory>

#include "gpu/cuda/device_core.hpp"
#include "gpu/device.hpp"

namespace ag::gpu::cuda::detail {

/// Wraps `c` (calibrated, its poller started) into the device object with
/// device index `index`; `sm_count` is the GPU's multiprocessor count and
/// `cc_major` its compute capability's major number (9: Hopper).
device_ptr make_device(std::shared_ptr<core> c, device_spec spec, int index, const backend_options& opts,
                       int sm_count, int cc_major);

}  // namespace ag::gpu::cuda::detail
