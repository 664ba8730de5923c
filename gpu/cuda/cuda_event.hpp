#pragma once
// A CUDA event of one device: pooled (timing disabled) or a timing event.
// Only gpu/cuda/ includes it.

#include <cuda_runtime.h>

#include <atomic>
#include <cstdint>
#include <memory>

#include "gpu/cuda/device_core.hpp"
#include "gpu/device.hpp"

namespace ag::gpu::cuda::detail {

/// Thread-safe queries; recorded by the device (cuda_device::record), which
/// may move it to another device's core when it is recorded there.
class cuda_event final : public event {
 public:
  cuda_event(std::shared_ptr<core> c, cudaEvent_t e, bool timing) : core_(std::move(c)), ev_(e), timing_(timing) {}
  /// Timing events are destroyed; others go back to the core's pool.
  ~cuda_event() override;

  bool query() const override;
  void host_wait() const override;
  int64_t completion_ns() const override;

  std::shared_ptr<core> core_;
  cudaEvent_t ev_;
  bool timing_;
  std::atomic<bool> recorded_{false};
};

}  // namespace ag::gpu::cuda::detail
