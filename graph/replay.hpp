#pragma once
/// \file replay.hpp
/// Graph replay segments of a plan (issue 16 item 1, planning side).
///
/// A *replay segment* is a maximal run of compute steps of one (device, lane)
/// queue, in lane order, that a CUDA backend may capture as one CUDA graph and
/// replay per job instead of launching kernel by kernel. A segment ends where
/// the queue must talk to the outside world:
///  - before a step with a dependency that is not an earlier compute step of
///    the same (device, lane) (an event wait on another lane or device, a copy,
///    a collective, a `ready` message);
/// A small host copy inlined at the lane's start or end (a job's input read
/// there, an output written there: plan_options::inline_small_copies) is
/// part of the segment next to it (plan_options::replay_host_copies): its
/// host side is a buffer that stays put per job arena (the arena's host
/// window, actors/plan_memory.hpp), so it can be captured too;
/// In-stream collective parts (collective_algo::in_stream) are steps of
/// compute lane 0 like compute steps, and their deps on other devices are
/// met on the devices (met_on_device, plan.hpp): a segment runs through them,
/// so a tensor-parallel decode step replays as one graph per device. Deps
/// are the ones the queue waits for (waited_deps, plan.hpp): a dep an
/// earlier step of the lane already waited for does not end a segment.
///  - after a step with a consumer that is not a later compute step of the
///    same (device, lane) (an event record another queue or a copy waits on).
/// So events and `ready` messages between devices and copy engines stay as
/// they are; pipeline and tensor parallelism work across captured segments.
///
/// The cost model of replay: a replayed segment pays one launch latency for
/// the whole segment instead of one per kernel (a graph launch); each of its
/// kernels then costs spec.kernel_latency on its own stream instead (device
/// time that lanes overlap, unlike launches), see
/// replay_launch_seconds_saved() and the planner's auto lanes. graph/ knows nothing of CUDA: this file only
/// says *what* may be captured and what it saves.

#include <cstdint>
#include <string>
#include <vector>

#include "graph/cost_model.hpp"

namespace ag {

class plan;
struct step;
using step_id = int32_t;

/// plan_options::graph_replay.
enum class graph_replay_mode : uint8_t {
  off = 0,        ///< plain launches, kernel by kernel
  on = 1,         ///< every segment is replayed
  automatic = 2,  ///< replay where the backend supports it (cuda, sim); cpu: off
};

/// Whether a device of `kind` runs the plan's segments as graphs under mode
/// `m`: on and auto replay on every backend that captures (sim, cuda); cpu
/// devices always launch plainly.
bool replays_on(graph_replay_mode m, device_kind kind) noexcept;

/// "off", "on", "auto".
const char* to_string(graph_replay_mode m) noexcept;
/// Parses "off" / "on" / "auto"; false for anything else.
bool parse_graph_replay_mode(const std::string& text, graph_replay_mode& out) noexcept;

/// One capturable run of compute steps (see the file comment).
struct replay_segment {
  int device = 0;
  int lane = 0;
  /// Compute steps in lane order; with plan_options::replay_host_copies,
  /// also the host copies inlined at the lane's ends that join them
  /// (captures_host_copy).
  std::vector<step_id> steps;
  int kernels = 0;             ///< non-view ops in those steps (kernel launches without replay)
  int copies = 0;              ///< host copies among the steps
  /// Launches the segment makes when run plainly: its kernels and copies
  /// (replayed, one graph launch; a segment of one launch is replayed too,
  /// since a graph launch costs the host less than a kernel's).
  int launches() const noexcept { return kernels + copies; }
};

/// Whether step `s` of `p` is a host copy that joins its lane's replay
/// segment: plan_options::replay_host_copies, inlined on the lane
/// (step::on_compute_stream), and for a d2h one contiguous run into its
/// output (not a piece gathered on the host, not a strided view).
bool captures_host_copy(const plan& p, const step& s);

/// plan_options::fold_lanes: by device, the number of compute lanes of `p`
/// that run from one queue (the device's lane 0) with replay segments
/// spanning them (actors/launch_program.hpp), 0 where none are: a device
/// with two or more compute lanes that replays (replays_on), in a plan
/// without collectives, with the option on.
std::vector<int> folded_lanes(const plan& p);

/// Segments of every (device, lane) queue of `p`, ordered by device, lane,
/// then lane order. Every compute step is in exactly one segment, and so is
/// every host copy that captures_host_copy() accepts.
std::vector<replay_segment> replay_segments(const plan& p);

/// Time a replayed plan saves per job on one lane of `device` (-1: all
/// devices), by the cost model: for every segment with kernels >= 2,
/// (kernels - 1) x max(0, launch_latency - kernel_latency) of that device's
/// spec (one graph launch instead of `kernels` launches, each replayed
/// kernel still holding its stream for kernel_latency).
double replay_launch_seconds_saved(const plan& p, const std::vector<replay_segment>& segments, int device = -1);

}  // namespace ag
