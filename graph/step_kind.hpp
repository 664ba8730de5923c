#pragma once
/// \file step_kind.hpp
/// The one name of what a plan step does, and so of the queue that runs it:
/// the planner makes steps of these kinds (graph/plan.hpp), the lowering
/// groups them into one queue per (device, kind, lane) (actors/
/// launch_program.hpp), and a device creates the stream that serves such a
/// queue for its kind (gpu::device::create_stream: copy kinds map to copy
/// engines). Pure data: no threads, no CAF, no CUDA.

#include <cstdint>

namespace ag {

enum class step_kind : uint8_t {
  compute = 0,    ///< a split: ops on (device, lane)
  copy_h2d = 1,   ///< job input host -> device
  copy_d2h = 2,   ///< job output device -> host
  copy_peer = 3,  ///< device -> device (queued on the destination)
  collective = 4, ///< one device's part of a collective (all_reduce, all_gather, reduce_scatter)
};

/// Number of step kinds (tables indexed by kind).
inline constexpr int step_kind_count = 5;

/// Short stable name: "compute", "h2d", "d2h", "peer", "collective".
const char* to_string(step_kind k) noexcept;

/// Name of the queue (stream) of kind `k` and lane `lane` on a device, as
/// traces show it: "compute0", "compute1", ... for compute lanes (lane 16 and
/// above: "compute"), to_string(k) for the copy kinds, which have one queue
/// per device, and "comm" for a device's communication queue (collectives;
/// "comm1" .. "comm7" for its copies on job lanes 1-7).
const char* lane_name(step_kind k, int lane) noexcept;

/// True for the kinds a copy engine runs on CUDA (host and peer copies).
constexpr bool is_copy(step_kind k) noexcept {
  return k == step_kind::copy_h2d || k == step_kind::copy_d2h || k == step_kind::copy_peer;
}

}  // namespace ag
