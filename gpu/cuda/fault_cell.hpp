#pragma once
// The per-stream fault word through which kernels report data errors.

#include <cuda_runtime.h>

#include <string>

#include "gpu/cuda/cuda_check.cuh"
#include "gpu/cuda/kernel_args.hpp"
#include "graph/error.hpp"

namespace ag::gpu::cuda::detail {

/// A per-stream fault word in host-mapped pinned memory (kernels report data
/// errors there); shared by the stream and its pending notifications.
struct fault_cell {
  unsigned int* host = nullptr;
  unsigned int* dev = nullptr;
  ~fault_cell() {
    if (host) AG_CUDA_ASSERT(cudaFreeHost(host));
  }
  /// Reads and clears the word; an error for a nonzero code.
  error take(const std::string& where) {
    if (!host) return {};
    const unsigned int code = __atomic_exchange_n(host, 0u, __ATOMIC_ACQ_REL);
    if (code == fault_none) return {};
    if (code == fault_get_rows_oob)
      return error(errc::op_failed, where + ": get_rows met an id outside [0, V) (that row was written as zeros)");
    return error(errc::op_failed, where + ": kernel fault code " + std::to_string(code));
  }
};

}  // namespace ag::gpu::cuda::detail
