#pragma once
// A CUDA stream of one device: its non-blocking cudaStream_t, its fault word
// and its cuBLAS handle. Only gpu/cuda/ includes it.

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <memory>

#include "gpu/cuda/device_core.hpp"
#include "gpu/cuda/fault_cell.hpp"
#include "gpu/device.hpp"
#include "graph/error.hpp"

namespace ag::gpu::cuda::detail {

/// Used by one executing actor at a time (the device interface's rule for
/// streams); holds the device core, so it may outlive the device object.
class cuda_stream final : public stream {
 public:
  cuda_stream(std::shared_ptr<core> c, step_kind kind) : core_(std::move(c)), role_(kind) {}
  ~cuda_stream() override;
  step_kind kind() const noexcept override { return role_; }

  /// Creates the CUDA stream and the fault word. On an error the stream keeps
  /// a null handle: every device call on it then fails cleanly.
  error init();

  /// The stream's cuBLAS handle, created on first use with its own workspace
  /// (cuBLAS's advice for handles used on one stream each).
  expected<cublasHandle_t> blas(bool tf32);

  std::shared_ptr<core> core_;
  step_kind role_;
  cudaStream_t s_ = nullptr;
  std::shared_ptr<fault_cell> fault_;
  cublasHandle_t blas_ = nullptr;
  void* workspace_ = nullptr;
  /// Compute streams: the split attention's workspace (launch_ctx), made by
  /// init(); null where that allocation failed (the kernel then runs unsplit).
  static constexpr int64_t attention_workspace_floats = int64_t{1} << 20;  // 4 MiB
  static constexpr int64_t attention_counters = 4096;
  float* attention_ws_ = nullptr;
  unsigned* attention_counters_ = nullptr;
  /// Compute streams: the decode-step kernel's workspace
  /// (decode_step_workspace_bytes(), decode_step.cuh), made by init(); null
  /// where that allocation failed. One per stream for the same reason as the
  /// attention's: its counters and launch epoch follow the stream's order.
  void* decode_step_ws_ = nullptr;
  /// Compute streams: the job tag of the in-stream collective parts launched
  /// on this stream (device memory, job + 1; in_stream.cuh), set by
  /// cuda_device::set_collective_tag before them. One per stream, not per
  /// device: parts of different jobs on two lanes of one device would
  /// otherwise read each other's tag. Made by init(); null where that failed
  /// (parts on this stream then fail, saying so).
  unsigned long long* in_stream_tag_ = nullptr;
  /// Communication streams: side streams and events on which a copy-engine
  /// part's peer pulls fan out (copy_lanes, collective.cuh), so that pulls
  /// from different peers run at once on different copy engines; made by
  /// init(). Null elsewhere, or where making them failed (pulls then run
  /// one after another on s_).
  static constexpr int side_streams = 3;
  cudaStream_t side_[side_streams] = {};
  cudaEvent_t fork_ = nullptr;
  cudaEvent_t join_[side_streams] = {};
};

}  // namespace ag::gpu::cuda::detail
