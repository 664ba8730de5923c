#include "gpu/device.hpp"

#include <chrono>

namespace ag::gpu {

int64_t host_clock_ns() noexcept {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

}  // namespace ag::gpu
