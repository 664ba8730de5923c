#pragma once
/// \file launch_program.hpp
/// The lowering: a plan (graph/plan.hpp) becomes a *launch program*, the
/// immutable tables the executing actors read while they run a job. Built
/// once per loaded plan (runtime_core::compile), on the compiling thread,
/// then shared read-only (shared_ptr<const launch_program>) by every job and
/// actor, on any thread. No CAF and no runtime state in here: the runtime
/// binds each queue to an actor handle afterwards (loaded_plan.hpp), and
/// per-job pointers are patched in the executing actor's own scratch copy of
/// the launch records (launch_records()).
///
/// What the program says:
///  - the *queues* the plan needs, one per (device, step kind, lane): each
///    is run by one executing actor on one gpu::stream, and lists its steps
///    in launch order (lane_seq, then id);
///  - per step: its queue and position there, its deps run by other queues
///    (remote deps: the actor waits for their end events), the other queues
///    that consume it (where `ready` goes) and at which positions, whether it
///    is a completion step (host notification), its resolved operands
///    (region + byte offset + tensor_arg prototype) or copy descriptor, and
///    its trace label.
///
/// Adding a step kind (captured CUDA-graph segments): add it to
/// ag::step_kind, lower it in lower_step() (launch_program.cpp: one case
/// that fills the step's queue lane and its own descriptor), and execute it
/// in launch_step() (stream_actor.cpp: one case). Queues, deps, consumers,
/// completion, launch-order checking and tracing need no change.

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "gpu/device.hpp"
#include "graph/error.hpp"
#include "graph/plan.hpp"

namespace ag::actors {

/// A tensor operand resolved up to its region base: the executing actor adds
/// the job's base of `where` on the step's device (job_context::base).
struct operand {
  region where = region::arena;
  int64_t byte_offset = 0;
  gpu::tensor_arg proto;  ///< data == nullptr; dtype, dims and strides set
  /// The device whose base the actor adds: -1, the step's own; an in-stream
  /// collective part's operands of other members name their member's.
  int device = -1;
  /// byte_offset is into the job arena's host window on the step's device
  /// (job_context::window), not into `where`: a small input a kernel reads,
  /// or an output it writes, in the window itself (copy_desc::in_place).
  bool in_window = false;
};

/// One op of a compute step (views and leaves are dropped: they cost nothing).
struct lowered_op {
  const node* op = nullptr;     ///< lives in the plan's graph
  operand out;
  std::vector<operand> inputs;  ///< node->inputs order (a fused record: the fusion's, see gpu::op_launch)
  gpu::op_launch::fusion fused = gpu::op_launch::fusion::none;
  gpu::op_launch::attention_params attention{};
  projection_kind projection = projection_kind::shared_input;  ///< fusion::projections
  gpu::op_launch::norm_prologue projection_norm{};             ///< fusion::projections
  gpu::op_launch::rope_epilogue projection_rope{};             ///< fusion::projections, shared_input
  std::vector<operand> extra_outs;                             ///< fusion::projections, shared_input
  gpu::op_launch::decode_step_params decode_step{};            ///< fusion::decode_step
  /// An in-stream collective part's record (its step's only op): rank,
  /// members and key; the member devices' handles are set by the actor.
  gpu::op_launch::in_stream_part collective{};
};

/// What a copy step moves.
struct copy_desc {
  operand src;          ///< on src_device (d2h, peer); unused for h2d
  operand dst;          ///< on the step's device (h2d, peer); unused for d2h
  int src_device = -1;  ///< peer: the source device; else the step's device
  int64_t bytes = 0;
  int io_index = -1;    ///< h2d: job input index; d2h: job output index
  /// d2h of a non-contiguous view output: the storage's whole buffer is
  /// copied (into the job's staging buffer) and gathered on the host.
  bool gather = false;
  /// d2h: where the bytes land in the host output (step::host_offset):
  /// host_blocks runs of bytes / host_blocks, host_pitch apart.
  int64_t host_offset = 0;
  int64_t host_blocks = 1;
  int64_t host_pitch = 0;
  /// h2d / d2h of a replay segment (plan_options::replay_host_copies): the
  /// host side is the job arena's host window on the step's device at this
  /// byte offset (job_context::window), not the job's input or output
  /// buffer; the job copies its input in when it holds its arenas and its
  /// output out when it completes. -1: the job's own buffer.
  int64_t window_offset = -1;
  /// A windowed copy whose tensor the segment's kernels read (h2d) or write
  /// (d2h) in the window itself (operand::in_window): the copy moves
  /// nothing, it only keeps its place in the step order (notification,
  /// `ready`). Only where every reader (and for an output, its producer) is
  /// a kernel of the segment that reads or writes it element by element
  /// (plan_options::host_windows_in_place).
  bool in_place = false;
};

/// What a collective step's part does (plan.hpp's step of kind collective).
struct collective_desc {
  operand out;                       ///< the result, on the step's device
  std::vector<operand> inputs;       ///< each member's operand, on that member's device, rank order
  std::vector<int> member_devices;   ///< device of each member, rank order
  int rank = -1;                     ///< this part's member index
  collective_algo algo = collective_algo::none;
  int64_t bytes = 0;
  /// The remote deps that another member's part orders before itself: on
  /// that member's device, and a dep of that part or earlier on its queue.
  /// Where the backend pairs the members on the device
  /// (gpu::device::collective_syncs_members), this part need not wait for
  /// their events: that member joins only after them.
  std::vector<step_id> peer_ordered_deps;
};

/// A queue position: (queue index, position in that queue's steps).
struct queue_pos {
  int queue = -1;
  int pos = -1;
};

/// One step as the executing actors see it.
struct lowered_step {
  step_id id = -1;
  step_kind kind = step_kind::compute;
  int device = -1;                      ///< the device whose queue runs it
  int queue = -1;                       ///< index into launch_program::queues()
  int pos = -1;                         ///< position in that queue's steps
  std::vector<step_id> remote_deps;     ///< deps run by other queues (their end events are waited for)
  std::vector<int> consumer_queues;     ///< distinct other queues consuming this step (ready goes there)
  std::vector<queue_pos> remote_consumers;  ///< each consumer on another queue
  bool completion = false;              ///< host notification when done (sinks, dead ends)
  std::vector<lowered_op> ops;          ///< compute
  int first_launch = 0;                 ///< compute: index of ops[0]'s record in launch_records(queue)
  /// Graph replay (plan_options::graph_replay, graph/replay.hpp): on the
  /// first step of a replay segment of kernels (and host copies) on a non-cpu
  /// device, the segment's steps (this one and the next replay_steps - 1 of
  /// the queue, which have no remote deps and, but the last, no consumers on
  /// other queues), their launch records (from first_launch on) and kernels;
  /// 0 on every other step. The executing actor launches such a segment as
  /// one replay_graph where the device captures (stream_actor.cpp).
  int replay_steps = 0;
  int replay_records = 0;
  int replay_kernels = 0;
  /// The segment holds in-stream collective parts: the actor gives the
  /// stream the job's collective tag before it launches the segment.
  bool replay_in_stream = false;
  /// Folded lanes (launch_program::folded_lanes): the plan's compute lane
  /// of this step, which its queue (the device's lane 0) no longer says;
  /// inside a captured segment, the capture lane its kernels run on. 0
  /// elsewhere.
  int capture_lane = 0;
  /// On the first step of a replay segment of a folded queue: the capture
  /// lanes its steps use (their highest capture_lane + 1); 1 elsewhere.
  int replay_lanes = 1;
  /// On every step of a replay segment of a folded queue: its deps among
  /// the segment's steps, which the capture orders before it
  /// (gpu::segment_op::after); empty elsewhere.
  std::vector<step_id> segment_deps;
  /// A tensor-parallel decode step run as one kernel a rank
  /// (plan_options::fuse_tp_decode_step): the compute step whose
  /// decode-step record does this step's work, on the same device; -1 for
  /// every other step. Such a step keeps its place, deps, consumers and
  /// events, so the order around it is the one lower() built, but launches
  /// nothing: a compute step or an in-stream part has no ops left, and a
  /// collective part of the communication queue (the logits' all-gather,
  /// which the kernels' exchange of their best logit replaces) is not
  /// issued.
  step_id absorbed_into = -1;
  /// The actor gives the stream the job's collective tag
  /// (gpu::device::set_collective_tag) before it launches this compute
  /// step's records, as before an in-stream part: set on each rank's
  /// decode-step record of a tensor-parallel step, whose kernels meet on
  /// the devices under that tag.
  bool job_tag = false;
  copy_desc copy;                       ///< copies
  collective_desc coll;                 ///< collectives
  /// The node an error of this step concerns when no op does (a copy's
  /// tensor); compute steps name the op that failed instead.
  const node* subject = nullptr;
  std::string label;                    ///< trace label: "first..last" op, or the copied tensor
};

/// One executing queue: (device, kind, lane), run by one actor on one stream.
struct launch_queue {
  int device = -1;
  step_kind kind = step_kind::compute;
  int lane = 0;
  std::vector<step_id> steps;             ///< launch order
  std::vector<int> remote_dep_counts;     ///< by position: remote deps of steps[pos]
  int launch_records = 0;                 ///< op records of its compute steps (launch_records())
  /// Its first step has no remote dep: the job actor starts this queue with
  /// run_job. The others start on their first ready message.
  bool starts_itself = false;
  /// It runs in-stream collective parts (compute lane 0).
  bool in_stream_parts = false;
  /// It issues jobs in their agreed order (job_context::turns on its issue
  /// line, actors/collective_order.hpp: one order across plans): a later
  /// turn's steps only once every earlier turn issued all of its steps here. Every queue of a
  /// plan with collectives. A collective's parts wait for each other on the
  /// devices (NCCL's kernels, in-stream parts) or by events; if one queue
  /// took a later job's step before an earlier job's, its stream would hold
  /// the later job's wait in front of the earlier job's work, and a member
  /// waiting the other way round would close a cycle on the GPUs that no
  /// host message breaks. Seen on 4 H100s with in-stream all-reduces and
  /// jobs in flight: device 0's peer-copy stream took job 6's copy of a
  /// peer's logits (waiting for that peer's job 6, whose parts waited for
  /// device 0's) before job 5's, which device 0's job 5, and so its job 6
  /// parts, waited for (docs/ARCHITECTURE.md "Issue order").
  bool in_job_order = false;
};

/// The lowered plan. Immutable; see the file comment.
class launch_program {
 public:
  const plan& source() const noexcept { return *plan_; }
  const std::shared_ptr<const plan>& source_ptr() const noexcept { return plan_; }
  const std::vector<launch_queue>& queues() const noexcept { return queues_; }
  const launch_queue& queue(int q) const { return queues_.at(static_cast<std::size_t>(q)); }
  /// Indexed by step id.
  const std::vector<lowered_step>& steps() const noexcept { return steps_; }
  const lowered_step& step(step_id s) const { return steps_.at(static_cast<std::size_t>(s)); }
  /// Steps the host is notified of (job done when all of them completed).
  const std::vector<step_id>& completion_steps() const noexcept { return completion_; }
  /// Devices the plan touches, ascending (arena acquisition order).
  const std::vector<int>& used_devices() const noexcept { return used_devices_; }
  /// Index of the queue (device, kind, lane), or -1 when the plan has none.
  int find_queue(int device, step_kind kind, int lane) const noexcept;
  /// Some queue runs in-stream collective parts (launch_queue::in_stream_parts).
  bool has_in_stream_parts() const noexcept { return has_in_stream_; }
  /// Job lanes (plan_options::job_lanes): copies of every device's compute
  /// lanes and communication queue; a job runs on the copy of its first
  /// device's arena (plan_memory::lane_of, job_context::job_lane). 1: one copy.
  int job_lanes() const noexcept { return job_lanes_; }
  /// Why the plan runs on one copy although plan_options::job_lanes asked
  /// for more (empty otherwise).
  const std::string& job_lanes_note() const noexcept { return job_lanes_note_; }
  /// Compute lanes of the plan on device `d` that run from one queue, the
  /// device's lane 0 (plan_options::fold_lanes): the lanes' steps in one
  /// order that keeps each lane's order and every dep, so a plain run issues
  /// them one after another on one stream, and replay segments span the
  /// lanes (lowered_step::capture_lane, replay_lanes, segment_deps). 0 where
  /// the device's lanes are not folded (one lane, replay off, a cpu device,
  /// a plan with collectives, or the option off).
  int folded_lanes(int d) const noexcept {
    return d >= 0 && static_cast<std::size_t>(d) < folded_lanes_.size() ? folded_lanes_[static_cast<std::size_t>(d)] : 0;
  }
  /// Whether the plan's decode step runs as one record
  /// (gpu::op_launch::fusion::decode_step, plan_options::fuse_decode_step):
  /// then its one compute step holds that record alone. A tensor-parallel
  /// step (plan_options::fuse_tp_decode_step) runs as one such record a
  /// rank, in the rank's first compute step of records; the rank's other
  /// steps of the decode step are absorbed into it (lowered_step::
  /// absorbed_into).
  bool decode_step_fused() const noexcept { return decode_step_fused_; }
  /// One line on the decode-step fusion: "decode step: one kernel (L
  /// layers)" or "decode step: one kernel a rank (L layers, tensor degree
  /// R)" when it applied, else "decode step not fused: " and the first
  /// condition that failed (the option off, not one CUDA device, a record
  /// outside the pattern, a shape the kernel does not take, ...).
  const std::string& decode_step_note() const noexcept { return decode_step_note_; }
  /// Whether queue `q` has a copy per job lane: a compute or communication
  /// queue when job_lanes() > 1. The copy queues (h2d, d2h, peer) are shared.
  bool copied(int q) const noexcept {
    const step_kind k = queues_[static_cast<std::size_t>(q)].kind;
    return job_lanes_ > 1 && (k == step_kind::compute || k == step_kind::collective);
  }
  /// The lane of queue `q` on job lane `copy`: a compute queue's lane plus
  /// `copy` times its device's compute lanes (copy 1 of a device with lanes
  /// 0 and 1 runs on lanes 2 and 3), a communication queue's `copy`, a
  /// shared queue's own lane.
  int lane_on_copy(int q, int copy) const noexcept;
  /// Bytes of the host window each arena of device `d` needs (0: none; see
  /// copy_desc::window_offset).
  int64_t window_bytes(int d) const noexcept {
    return d >= 0 && static_cast<std::size_t>(d) < window_bytes_.size() ? window_bytes_[static_cast<std::size_t>(d)] : 0;
  }
  /// The h2d steps whose host side is a window (copied in by the job when it
  /// holds its arenas), and the d2h ones (copied out when it completes).
  const std::vector<step_id>& window_inputs() const noexcept { return window_inputs_; }
  const std::vector<step_id>& window_outputs() const noexcept { return window_outputs_; }

  /// The launch records of queue `q`'s compute steps, in order (step
  /// first_launch + k holds ops[k]): node, source graph and tensor_arg
  /// prototypes filled, data pointers null. The executing actor keeps one
  /// copy per loaded plan and patches only the data pointers per job, so a
  /// launch copies no shapes or strides and allocates nothing.
  std::vector<gpu::op_launch> launch_records(int q) const;

 private:
  friend expected<std::shared_ptr<const launch_program>> lower(std::shared_ptr<const plan> p);
  friend void mark_replay_segments(const plan& pl, launch_program& prog);
  friend void mark_peer_ordered_deps(const plan& pl, launch_program& prog);
  friend void choose_job_lanes(const plan& pl, bool has_collectives, launch_program& prog);
  std::shared_ptr<const plan> plan_;
  std::vector<launch_queue> queues_;
  std::vector<lowered_step> steps_;
  std::vector<step_id> completion_;
  std::vector<int> used_devices_;
  bool has_in_stream_ = false;
  int job_lanes_ = 1;
  std::string job_lanes_note_;
  bool decode_step_fused_ = false;
  std::string decode_step_note_;
  std::vector<int> compute_lanes_;  ///< by device: its highest compute lane + 1
  std::vector<int> folded_lanes_;   ///< by device (folded_lanes())
  std::vector<int64_t> window_bytes_;  ///< by device
  std::vector<step_id> window_inputs_, window_outputs_;
};

/// Part of lower(): sets the replay_* fields of `prog`'s steps (see lowered_step).
void mark_replay_segments(const plan& pl, launch_program& prog);
/// Part of lower(): sets collective_desc::peer_ordered_deps of the
/// collective parts (see there).
void mark_peer_ordered_deps(const plan& pl, launch_program& prog);
/// Part of lower(), last: the plan's job lanes (launch_program::job_lanes).
void choose_job_lanes(const plan& pl, bool has_collectives, launch_program& prog);

/// Lowers `p` (valid plans from ag::compile; it checks what it relies on).
/// Errors (errc::internal, with error::device / step / op set): a step on a
/// device out of range, an operand not resident where a step reads it, a copy
/// of a non-contiguous tensor that is not a d2h view output, an input or
/// output index out of range, and a launch order that deadlocks
/// (check_launch_order).
expected<std::shared_ptr<const launch_program>> lower(std::shared_ptr<const plan> p);

/// Simulates the queues' launch order: each queue launches its steps in
/// order, a step only after all its deps. A plan whose lane orders
/// contradict its deps would hang every job; it is refused with an error
/// naming the first stuck step, its queue and its device (error::device and
/// error::step set). `queues` as lower() builds them.
error check_launch_order(const plan& p, const std::vector<launch_queue>& queues);

}  // namespace ag::actors
