#pragma once
// Host-side kernel arguments shared by the launchers (.cuh) and the device
// code: compiles with g++ and nvcc. Only gpu/cuda/ includes it.

#include <cuda_runtime.h>

#include <cstdint>
#include <string>

#include "gpu/device.hpp"
#include "graph/error.hpp"

namespace ag::gpu::cuda {

/// A tensor as a kernel sees it (passed by value). Dims are right-aligned
/// into 4 slots: d[3] is the innermost dimension, unused outer slots are 1.
struct kt {
  void* p = nullptr;
  int t = 0;              // ag::dtype as int
  int64_t d[4] = {1, 1, 1, 1};
  int64_t s[4] = {0, 0, 0, 0};
  int64_t numel() const { return d[0] * d[1] * d[2] * d[3]; }
};

/// Right-aligns a tensor_arg into a kt (size-1 dims get stride 0).
inline kt to_kt(const tensor_arg& a) {
  kt k;
  k.p = a.data;
  k.t = static_cast<int>(a.type);
  const int r = a.dims.rank();
  for (int i = 0; i < r; ++i) {
    k.d[4 - r + i] = a.dims[i];
    k.s[4 - r + i] = a.dims[i] == 1 ? 0 : a.stride[static_cast<std::size_t>(i)];
  }
  return k;
}

/// What every host launcher needs: the stream, a per-stream fault word in
/// host-mapped memory (kernels set it for data errors such as an id out of
/// range), and a name for error messages.
struct launch_ctx {
  cudaStream_t stream = nullptr;
  bool gemv = true;                    // matmuls of a few rows may take the GEMV kernel (gemv.cuh)
  int gemv_tensor_core_rows = 0;       // GEMVs of f16 / bf16 with at least this many rows take its mma form (0: never)
  // A matmul's right operand is a weight leaf, which no kernel writes
  // (op_launch::weight_inputs): the GEMV kernel may load it before its PDL wait.
  bool b_is_weight = false;
  // op_launch::settled_inputs: bit i when input i is not written by the
  // kernel before this one on the stream, so it may be read before the PDL
  // wait (the fused attention's cache).
  uint32_t settled_inputs = 0;
  // Launch the project's kernels as programmatic dependents of the kernel
  // before them on the stream (launch_kernel, common.cuh; sm_90+ only).
  bool pdl = false;
  // The stream's workspace for attention with keys split over blocks
  // (attention.cu): partial results, and per-group counters that are zero
  // between launches. Kernels on one stream run in order, and a captured
  // graph replays on the stream it was captured on, so one per stream is
  // enough. Null on streams without one (copy streams).
  float* attention_workspace = nullptr;
  int64_t attention_workspace_floats = 0;
  unsigned* attention_counter_words = nullptr;
  int64_t attention_counters = 0;
  unsigned int* fault_word = nullptr;  // device-visible pointer
  std::string where;                   // "cuda0 rms_norm 'ln1'"
  int sm_count = 132;
};

/// Fault codes written to launch_ctx::fault_word (first writer wins).
enum fault_code : unsigned int { fault_none = 0, fault_get_rows_oob = 1 };

inline unsigned int grid_for(int64_t n, int block, int max_blocks) {
  int64_t g = (n + block - 1) / block;
  if (g > max_blocks) g = max_blocks;
  if (g < 1) g = 1;
  return static_cast<unsigned int>(g);
}

}  // namespace ag::gpu::cuda
