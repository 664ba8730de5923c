#pragma once
// Op dispatch: one graph op of a launch record to its CUDA host launcher.
// Only gpu/cuda/ includes it.

#include <string>

#include "gpu/cuda/cuda_stream.hpp"
#include "gpu/cuda/device_core.hpp"
#include "gpu/device.hpp"
#include "graph/error.hpp"

namespace ag::gpu::cuda {
struct decode_step_tp;  // decode_step.cuh
}

namespace ag::gpu::cuda::detail {

/// Enqueues the op of `l` on `cs` (a live stream of the device `dev_core`), making
/// the device current for the call. Views and leaves enqueue nothing. Errors
/// name the device, op and node; a device_failed error from a launcher marks
/// the device dead. `device_name` names the device, `sm_count` sizes grids,
/// `kernels` picks among kernels (backend_options' cuda_* choices).
struct kernel_choices {
  bool tf32 = false;  ///< f32 matmuls may use TF32 tensor cores
  bool gemv = true;   ///< matmuls of at most gemv_max_rows rows take the GEMV kernel (gemv.cuh)
  bool pdl = false;   ///< own kernels launch as programmatic dependents (common.cuh launch_kernel)
  int gemv_tensor_core_rows = 0;  ///< GEMVs of f16 / bf16 with at least this many rows take the tensor cores (0: never)
  /// Diagnosis only (AG_CUDA_DEBUG_SKIP): fused records of these kinds are
  /// not launched, so a replayed step without them measures what they cost
  /// in the chain. Results are wrong while it is set.
  bool skip_attention = false, skip_residual = false, skip_gated = false, skip_shared = false;
  bool skip_in_stream = false;  ///< in-stream all-reduce parts (cuda_device::in_stream_part)
  bool skip_rope = false;       ///< rope kernels that no fused record took in
  /// A tensor-parallel decode step's rank 1 is not launched
  /// (AG_CUDA_DEBUG_SKIP=tprank1): its peers' waits must give up in bounded
  /// time (tests/cuda/test_cuda_generate.cpp).
  bool skip_tp_rank1 = false;
};
/// `tp`: a tensor-parallel decode step's rank (launch_decode_step), else null.
error dispatch_op(core& dev_core, cuda_stream& cs, const op_launch& l, const std::string& device_name, int sm_count,
                  const kernel_choices& kernels, const decode_step_tp* tp = nullptr);

}  // namespace ag::gpu::cuda::detail
