#include "gpu/device.hpp"

#include <chrono>

namespace ag::gpu {

int64_t host_clock_ns() noexcept {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

const char* to_string(stream_role r) noexcept {
  switch (r) {
    case stream_role::compute: return "compute";
    case stream_role::h2d: return "h2d";
    case stream_role::d2h: return "d2h";
    case stream_role::peer: return "peer";
  }
  return "?";
}

}  // namespace ag::gpu
