#pragma once
// The host clock of the CUDA backend's timestamps and back-off timers.

#include <chrono>
#include <cstdint>

namespace ag::gpu::cuda::detail {

/// Same clock as ag::gpu::host_clock_ns (steady_clock), without a link-time
/// dependency on ag_gpu (which links this library).
inline int64_t now_ns() noexcept {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

}  // namespace ag::gpu::cuda::detail
