#pragma once
/// \file plan.hpp
/// A plan: a graph compiled for a list of devices. Placement -> steps
/// (splits of compute on one device lane, and copies) -> a memory plan per
/// device. Immutable once compiled and shared (shared_ptr<const plan>) by all
/// jobs that run it, on any thread.
///
/// Execution model the plan assumes (the runtime guarantees it):
///  - a compute step runs its ops in order on one stream (lane) of its device;
///  - steps of one job on one (device, lane) are enqueued in `lane_seq` order;
///  - a step starts only after every step in `deps` completed (event waits);
///  - each job has its own activation arena per device; weights live in a
///    per-device weight region uploaded once when the plan is loaded.

#include <algorithm>
#include <cstdint>
#include <iosfwd>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "graph/cost_model.hpp"
#include "graph/graph.hpp"
#include "graph/fusion.hpp"
#include "graph/replay.hpp"
#include "graph/step_kind.hpp"
#include "graph/tensor_parallel.hpp"

namespace ag {

using step_id = int32_t;

/// One unit the actors schedule.
///
/// What copies carry (views are never copied on their own):
///  - copy_h2d: ops[0] is the job input node (a leaf, contiguous); one step
///    per (input, device that reads it). An input no output needs gets none.
///  - copy_peer: ops[0] is always a *storage* node (never a view). A compute
///    op that reads a view whose storage was computed on another device makes
///    that storage be copied whole (`bytes` = its buffer); the view is then
///    resolved on the destination with its own strides/offset, exactly as on
///    the source (see plan::locate). One step per (storage, destination).
///  - copy_d2h: ops[0] is the job output node as listed in graph.outputs()
///    (it may be a view), or one piece of an output gathered on the host
///    piece by piece (see host_offset); `device` is the device its storage lives on. If the
///    node is contiguous, `bytes` = its own bytes, read from
///    locate(ops[0], device).byte_offset. If it is a non-contiguous view,
///    `bytes` = its storage's whole buffer, read from locate(storage, device),
///    and the view (node.offset, node.stride, in elements of the storage) is
///    gathered on the host.
///  - collective: ops[0] is the collective node of this member (its inputs
///    are all members' operands in rank order, attrs.rank its own index);
///    one step per member, on that member's device. `deps` are the steps
///    producing *every* member's operand, on the operand's own device (so a
///    one-shot algorithm reading the peers' buffers directly, and NCCL, both
///    find every operand ready); the operands are never peer-copied. `peers`
///    lists the parts of the same collective in rank order (this one
///    included), `bytes` its message size (all_reduce / reduce_scatter: one
///    operand; all_gather: the gathered result) and `algo` the algorithm the
///    cost model picked (ring or one-shot, by size, see device_spec). The
///    parts of one collective have consecutive step ids, so every device's
///    communication queue issues collectives in the same order (what NCCL
///    needs; check_hazards proves it).
///    An in-stream part (algo collective_algo::in_stream) runs on its
///    device's compute lane 0 instead, in step id order among that lane's
///    compute steps (its lane_seq counts there), and meets the other parts
///    on the devices: its deps on other devices are met there, not waited
///    for by the host (met_on_device()).
/// Queues: compute steps are ordered per (device, lane); copies per
/// (device, kind) — a peer copy is queued on its destination device — but
/// for small host copies inlined on a compute lane (on_compute_stream);
/// collectives per device (its communication queue; in-stream parts: compute
/// lane 0).
/// lane_seq always increases with the step id inside a queue. The memory
/// plan relies on the FIFO order of compute lanes only; copies and
/// collectives may run in any order their deps allow.
struct step {
  step_id id = -1;
  step_kind kind = step_kind::compute;
  int device = 0;       ///< compute / collective: its device; h2d / peer: destination; d2h: source
  int src_device = -1;  ///< peer: source device; else -1
  int lane = 0;         ///< compute: lane (stream) index on `device`
  int lane_seq = 0;     ///< order among this job's steps on the same (device, lane) / copy queue
  std::vector<node_id> ops;      ///< compute: ops in execution order (views included, they cost nothing);
                                 ///< copies: exactly one node, the tensor copied
  int io_index = -1;             ///< h2d: index into graph.inputs(); d2h: index into graph.outputs()
  std::vector<step_id> deps;     ///< steps that must complete first (all steps, compute or copy)
  std::vector<step_id> consumers;///< steps whose deps contain this one
  int64_t bytes = 0;             ///< copies: bytes moved; collective: message size
  double est_seconds = 0;        ///< cost-model estimate
  collective_algo algo = collective_algo::none;  ///< collective: ring or one-shot
  std::vector<step_id> peers;    ///< collective: all parts of this collective in rank order
  /// h2d / d2h only: the copy runs on compute lane `lane` of its device, in
  /// that lane's order (lane_seq counts there), not on the copy queue: a
  /// copy of at most device_spec::inline_copy_max_bytes, first on the lane
  /// that reads it (h2d) or last on the lane that wrote it (d2h), where
  /// handing it over between streams costs more than the transfer
  /// (plan_options::inline_small_copies).
  bool on_compute_stream = false;
  /// d2h only: where its bytes land in the job's host output `io_index`:
  /// `host_blocks` runs of bytes / host_blocks bytes, the first at byte
  /// `host_offset`, each `host_pitch` bytes after the one before. A whole
  /// output: offset 0, one block. A piece of an output gathered on the host
  /// (plan_options::output_pieces): ops[0] is the piece (a concat's input,
  /// contiguous on `device`), and the output's pieces together cover it once.
  int64_t host_offset = 0;
  int64_t host_blocks = 1;
  int64_t host_pitch = 0;
};

/// Whether `s` is an in-stream collective part (see step).
inline bool runs_in_stream(const step& s) noexcept {
  return s.kind == step_kind::collective && s.algo == collective_algo::in_stream;
}

/// Whether `s` queues on a compute lane (device, lane): compute steps,
/// in-stream collective parts and copies inlined there (step::on_compute_stream).
inline bool on_compute_lane(const step& s) noexcept {
  return s.kind == step_kind::compute || runs_in_stream(s) || s.on_compute_stream;
}

/// The compute lane every step of a plan's jobs queues on, when there is one.
struct single_lane {
  int device = 0;
  int lane = 0;
};
class plan;
/// Whether every step of `p` queues on one compute lane (on_compute_lane:
/// compute steps, host copies inlined there) of one device: then a job's
/// whole work is issued on that lane's stream, in the order its actor takes
/// the jobs. A state slot's next job may then start as soon as this one is
/// issued (actors/loaded_plan.hpp slot_table). nullopt for plans with
/// copies on copy queues, collectives, several lanes or devices.
std::optional<single_lane> single_lane_of(const plan& p);

/// Which region of a device a tensor lives in.
/// arena: per job; weights: per plan, uploaded at load; state: per state
/// slot, kept across the jobs of the slot (store_rows nodes, a KV cache).
enum class region : uint8_t { arena = 0, weights = 1, state = 2 };

/// Where node `node` lives on `device`: byte offset of its first element in
/// the region, and its element strides there. A node copied to another device
/// lands there contiguous.
struct tensor_location {
  node_id node = no_node;
  int device = -1;
  region where = region::arena;
  int64_t byte_offset = 0;
  strides stride{};
};

/// A buffer the memory planner placed (one per storage node per device).
struct buffer_slot {
  node_id node = no_node;   ///< storage node (its own buffer, not a view)
  int device = -1;
  region where = region::arena;
  int64_t offset = 0;       ///< bytes into the region
  int64_t bytes = 0;
};

/// Memory plan of one device.
struct device_memory {
  int64_t arena_bytes = 0;        ///< per-job activation arena size (peak)
  int64_t weight_bytes = 0;       ///< weight region size
  /// One state slot's size (the store_rows nodes computed here); the device
  /// holds plan_options::state_slots of them, slot s at s * state_bytes.
  int64_t state_bytes = 0;
  /// plan_options::share_weights_with: this device's weight region is the
  /// other plan's (each weight at the other plan's offset; weight_bytes is
  /// the other's region), so loading uploads nothing here and the weights do
  /// not count again against the device's memory.
  bool weights_shared = false;
  int64_t sum_tensor_bytes = 0;   ///< sum of all arena tensors' sizes (no reuse)
  std::vector<buffer_slot> slots; ///< arena, weight and state slots on this device
};

/// Placement policy.
enum class placement_policy : uint8_t {
  automatic = 0,  ///< pipeline over `pipeline_stages` devices balanced by cost, pins respected
  single = 1,     ///< everything on device 0 (pins respected)
};

/// A concat that runs nothing (plan_options::elide_concats): the memory plan
/// places each of its inputs inside its output's buffer, at the input's
/// byte offset there, so whatever writes an input (a compute op or a
/// collective part on `device`) writes it straight into its place in the
/// output. Only a concat whose inputs are contiguous blocks of its output
/// (every dim before the axis is 1) and are each its own storage, written
/// on `device` by one op or collective part and a piece of no other concat.
struct elided_concat {
  node_id concat = no_node;
  int device = -1;
  std::vector<node_id> pieces;   ///< the concat's inputs, in order
  std::vector<int64_t> offsets;  ///< byte offset of each piece in the concat's output
};

class plan;

/// plan_options::sequence_parallel.
enum class sequence_parallel_mode : uint8_t {
  off = 0,
  on = 1,
  /// On for a tensor-parallel group whose members all run collectives beside
  /// compute (device_spec::collectives_overlap_compute: sim, cpu), where the
  /// chunked pipeline hides them; off on CUDA GPUs, where NCCL waits for a
  /// GEMM's SMs and a reduce-scatter of rows that are not outermost runs as
  /// an all-reduce and a copy (gpu/cuda), so the all-gather would be extra.
  automatic = 2,
};
/// "off", "on", "auto".
const char* to_string(sequence_parallel_mode m) noexcept;
/// Parses "off" / "on" / "auto"; false for anything else.
bool parse_sequence_parallel_mode(const std::string& text, sequence_parallel_mode& out) noexcept;

/// plan_options::tp_batch_chunks.
enum class batch_chunks_mode : uint8_t {
  /// Chunks of rows only.
  off = 0,
  /// Chunks of the batch wherever a region can be cut so and its own cost
  /// model says chunks pay.
  on = 1,
  /// Per pipeline stage, decided at its first chunked region: chunks of the
  /// batch where the hand-over does not fit beside chunks of rows (the
  /// modelled chunk-0 reduce-scatter and the next region's first all-gather,
  /// of half the rows each, take longer than the row-parallel product of
  /// the last half), then in every region of that stage that can be cut so,
  /// since the gain is the hand-over between regions, which a region's own
  /// model does not see. On 4 H200s that is chunks of the batch, on 2 chunks
  /// of rows, as measured (docs/BENCHMARKS.md, session 37).
  automatic = 2,
};
/// "off", "on", "auto".
const char* to_string(batch_chunks_mode m) noexcept;
/// Parses "off" / "on" / "auto"; false for anything else.
bool parse_batch_chunks_mode(const std::string& text, batch_chunks_mode& out) noexcept;

struct plan_options {
  placement_policy policy = placement_policy::automatic;
  /// Pipeline stages to spread layers over; 0 = as many as the devices allow
  /// (all devices, or devices / tensor_parallel).
  int pipeline_stages = 0;
  /// Tensor-parallel degree: devices per stage. The layout is pipeline_stages
  /// x tensor_parallel over the devices in order: stage s runs on devices
  /// [s * tensor_parallel, (s + 1) * tensor_parallel) (e.g. 2 x 2 over 4
  /// devices). 1 = no tensor parallelism. See graph/tensor_parallel.hpp.
  int tensor_parallel = 1;
  /// Share of each rank of a group in every sharded dimension, as
  /// proportions (llama.cpp's --tensor-split 3,1: {3, 1}); empty = even.
  /// Shares are rounded to the dimension's granularity (a head, a kv group).
  std::vector<double> shard_ratios{};
  /// Split row-parallel matmuls in chunks so that each chunk's all-reduce
  /// runs on the communication queue while the next chunk computes, where
  /// the cost model says it pays and every member's collectives run beside
  /// compute (device_spec::collectives_overlap_compute: not on CUDA GPUs,
  /// where NCCL waits for a GEMM's SMs). Off: one matmul, then one all-reduce.
  bool tp_overlap = true;
  /// With tp_overlap under sequence parallelism: 0 (the default) lets the
  /// cost model pick the chunks of a region (1, 2 or 4); 2 or 4 uses that
  /// many wherever a region can be chunked at all (its collectives run
  /// beside compute and its rows split), to measure a choice against it.
  int tp_overlap_chunks = 0;
  /// With tp_overlap under sequence parallelism, where the rows are sharded
  /// along the sequence and the batch holds 2 or more: chunks may be parts
  /// of the batch (dim 0), and then a chunk is the whole computation of its
  /// part back to the region's all-gathers (attention's projections, scores
  /// and softmax, not only o_proj), so one chunk's reduce-scatter and the
  /// next region's all-gather of its rows run beside the next chunk's
  /// attention. It costs half-batch attention kernels (slower per row) and
  /// the output's pieces; with the hand-over lane it took the d-8192 layer
  /// on 4 H200s from 3.57-3.60 to 3.41-3.45 ms, and on 2 from 6.14-6.17 to
  /// 6.29-6.33 ms (docs/BENCHMARKS.md, session 37): see batch_chunks_mode.
  batch_chunks_mode tp_batch_chunks = batch_chunks_mode::automatic;
  /// With chunks under sequence parallelism: the ops that hand rows over
  /// from one chunk's reduce-scatter to a later all-gather or output piece
  /// (a residual add and a norm of those rows; tensor_parallel_info::
  /// hand_over) run on compute lane 1 where the devices have a second lane
  /// and lanes_per_device allows it, so that they run beside the chunk lane
  /// 0 computes instead of after it. Off: on lane 0.
  bool hand_over_lane = true;
  /// Sequence parallelism (Megatron's; see sequence_parallel_mode): where a
  /// partial result (a row-parallel matmul's) meets row-wise work (a residual
  /// add, a norm), it is reduce-scattered by rows instead of all-reduced; the
  /// row-wise ops run on each rank's rows, and the rows are all-gathered
  /// where a matmul with a weight reads them. The links carry the same bytes
  /// (a ring all-reduce is a reduce-scatter and an all-gather), while each
  /// device does 1/degree of the norms and residual adds and holds 1/degree
  /// of the activations between layers; with tp_overlap the region between
  /// an all-gather and its reduce-scatter (an MLP, o_proj) runs in chunks of
  /// rows whose collectives overlap the next chunk. Applies only where a
  /// tensor's rows split over the ranks (a prompt, not a one-token decode
  /// step).
  sequence_parallel_mode sequence_parallel = sequence_parallel_mode::automatic;
  /// Compute streams (lanes) per device the planner may use.
  ///  - 0 (auto, the default): up to each device's max_lanes, and only where
  ///    the cost model predicts the branches finish sooner spread over lanes
  ///    than on one (launches of all lanes come one after another, and so do
  ///    the throughput-bound parts of kernels: lanes overlap one branch's
  ///    launches with another's work, and under graph replay the kernels'
  ///    device-side latency (device_spec::kernel_latency) less its issue
  ///    interval; each extra lane pays a fork/join of two launch latencies;
  ///    a product's partly filled last wave of tiles, device_spec::gemm_sms,
  ///    holds its own lane but not the device's throughput)
  ///    and the device's arena stays within
  ///    max_lane_memory_ratio of the one-lane plan's, or within
  ///    lane_memory_slack_bytes of it (else fewer lanes);
  ///  - N >= 1: up to N lanes, independent branches spread over them whenever
  ///    at least two each exceed min_branch_seconds (the caller decided).
  int lanes_per_device = 0;
  /// Job lanes: copies of each device's compute lanes and communication
  /// queue (with its own NCCL communicator), the runtime putting every
  /// job_lanes-th job of the plan on each copy (by the job's number in the
  /// agreed order, actors/collective_order.hpp), so that one job's
  /// collectives run beside another job's compute. Each copy issues its
  /// jobs in the agreed order on its own; the copy queues (h2d, d2h, peer)
  /// stay shared. Only plans with collectives, no in-stream parts (one
  /// in-stream memory area per device) and no state (a sequence's jobs
  /// follow each other on one stream) take copies; any other plan runs on
  /// one (launch_program::job_lanes() says what a plan got).
  ///  - 0 (auto, the default): 2 where every device of the plan is a CUDA
  ///    GPU (2 H200s, a 24-layer LLaMA as 1 x 2 with 16 micro-batches: the
  ///    all-reduces, a quarter of the round, ran beside no compute with one
  ///    copy; docs/BENCHMARKS.md, session 39), else 1 (the sim runs two
  ///    lanes' kernels at full speed each, which a GPU does not);
  ///  - 1: off; 2..8: that many copies where the plan takes them.
  int job_lanes = 0;
  /// Independent branches get their own lane only when each branch's
  /// estimated time exceeds this (fork/join costs an event pair).
  double min_branch_seconds = 20e-6;
  /// Auto lanes only: the largest per-device arena of the plan with lanes
  /// over the one-lane plan's that the planner accepts (branches running at
  /// once keep their buffers live at once); >= 1.
  double max_lane_memory_ratio = 1.1;
  /// Auto lanes only: a lane plan whose per-device arena exceeds the
  /// one-lane plan's by at most this many bytes is accepted whatever the
  /// ratio (small branches' buffers, a few hundred KiB, weigh nothing next to
  /// a device's memory, and their lanes are where lanes pay most); >= 0.
  int64_t lane_memory_slack_bytes = int64_t{1} << 20;
  /// Capture each (device, lane) run of compute steps between cross-queue
  /// waits/records (graph/replay.hpp) and replay it per job. describe() shows
  /// the segments and the launch time the model says replay saves; the cpu
  /// backend never replays. Auto by default (on cuda and sim: a captured
  /// segment is one launch per job, 3x faster on the GPT-2-small shape and
  /// 1.6x on decode on an H100); off launches kernel by kernel. Replay is
  /// skipped while runtime_options::stall_factor watches steps.
  graph_replay_mode graph_replay = graph_replay_mode::automatic;
  /// Under graph replay, a host copy inlined at a lane's start or end
  /// (inline_small_copies: a job's small input or output) joins that lane's
  /// replay segment (graph/replay.hpp): its host side is then the job
  /// arena's host window, pinned memory per arena that the job's input is
  /// copied into when the job holds its arenas and its output copied out of
  /// when it completes (actors/plan_memory.hpp), so a tiny job or a decode
  /// step is one graph launch. Off: such copies launch on their own, from
  /// and into the job's own buffers.
  bool replay_host_copies = true;
  /// Under graph replay, a device whose plan uses several compute lanes
  /// (and no collectives) runs them from one queue: the lanes' steps are
  /// issued in one order that keeps every lane's order and every dep, and a
  /// replay segment then spans the lanes, captured as one graph whose
  /// branches are the lanes (device::capture_lanes), so a fork and a join
  /// cost no event, no `ready` message and no launch per lane
  /// (actors/launch_program.hpp, launch_program::folded_lanes). A first run
  /// and a refused capture run the queue's steps one after another on one
  /// stream. Off: one queue and one stream per lane, joined by events.
  bool fold_lanes = true;
  /// With replay_host_copies: a small input whose every reader is an
  /// elementwise kernel of the same replay segment (add, mul, scale, gelu,
  /// silu, copy, get_rows' ids, store_rows) is read by those kernels from the
  /// host window itself, and an output such a kernel (or argmax) writes, read
  /// by no other, is written there: the copy then moves nothing, and a tiny
  /// job is one kernel. Off: the copies run as copy kernels in the graph.
  bool host_windows_in_place = true;
  /// Let a backend run a chain of the plan's ops as one kernel where it has
  /// one (graph/fusion.hpp; plan::fusions() lists them); the steps are the
  /// same either way, and the memory plan keeps the chain's inputs until the
  /// fused kernel reads them. Today: on CUDA devices, a decode step's
  /// attention (scores, mask add, softmax, weighted sum: 4 kernels per
  /// layer) as one kernel, its keys split over blocks. On by default since
  /// session 21: 8.0 us on an H100 where the four kernels take 9.2
  /// (docs/BENCHMARKS.md); off runs the four kernels.
  bool fuse_ops = true;
  /// On CUDA devices, run a decode step's projections of at most 8 rows
  /// together on the GEMV kernel (graph/fusion.hpp, projection_fusion;
  /// plan::projection_fusions() lists them): q, k and v of one input as one
  /// kernel, gate, up, silu and their product as one, and a projection with
  /// the residual add after it as one. Same steps and memory rules as
  /// fuse_ops. On by default (measured in docs/BENCHMARKS.md, session 11).
  bool fuse_projections = true;
  /// On a CUDA device, run a whole LLaMA-family decode step (batch 1, one
  /// new token over a KV cache, bf16, one device, no tensor parallelism) as
  /// one persistent kernel (gpu::op_launch::fusion::decode_step,
  /// gpu/cuda/decode_step.cuh): the lowering (actors/launch_program.cpp)
  /// replaces the step's records (the embedding's gather, each layer's
  /// fused q/k/v, attention, o + residual, gated MLP and down + residual
  /// records, the final norm, the head and the logits' copy or argmax) by
  /// one record where they match that pattern exactly and the shapes fit
  /// the kernel (graph/fusion.hpp, decode_step_misfit); anything else keeps
  /// its records. Needs fuse_ops and fuse_projections (it starts from their
  /// records). Same steps and memory plan either way.
  /// actors::launch_program::decode_step_note() says whether and why not.
  /// On by default.
  bool fuse_decode_step = true;
  /// With fuse_decode_step: run a tensor-parallel decode step of the same
  /// pattern (one group of 2..8 CUDA devices, every all-reduce in-stream,
  /// no pipeline stages) as one such kernel a rank: the lowering replaces
  /// each rank's records by one decode-step record over its shards
  /// (gpu::op_launch::decode_step_params::tp_rank), whose kernels meet on
  /// the devices where the all-reduces did and exchange their best logits
  /// where the logits' all-gather did; the rank's later compute steps, its
  /// all-reduce parts and its all-gather part stay in their queues with
  /// nothing to launch (actors::lowered_step::absorbed_into). Needs
  /// inline_small_copies (the inputs on the compute lane before it). Off by
  /// default: the kernel has not been measured on two GPUs, and each
  /// rank's kernel fills its GPU and spins on its peers', so work of
  /// another plan's job spinning on one rank's GPU (plans are not ordered
  /// against each other, see in_stream_collectives) could hold the SMs a
  /// rank's kernel needs until cuda_collective_timeout_s fails the job
  /// (docs/ARCHITECTURE.md). actors::launch_program::decode_step_note()
  /// says whether it applied.
  bool fuse_tp_decode_step = false;
  /// The most KV-cache rows a fused decode step takes
  /// (decode_step_misfit): the kernel's attention time grows with the rows
  /// its mask shows about three times as fast as a kernel per record's, so
  /// past ag::decode_step_max_cache_rows (2048) a step keeps its records.
  /// The generator raises it for twins of its decode plans that it uses
  /// only while a sequence holds at most 2048 positions (a short sequence
  /// in a cache slot of 16,384 or 65,536 rows).
  int64_t decode_step_max_cache_rows = 2048;
  /// Fold an rms_norm's weight into the weights of the projections that
  /// read it (graph/fusion.hpp, fold_norm_weights): the plan's graph
  /// (plan::source()) then has norms without weights and projection weights
  /// scaled by them, which every backend runs as it is; the GEMV that takes
  /// the norm in reads x alone (LLaMA-1B decode on an H200 0.811 -> 0.790 ms
  /// a token, docs/BENCHMARKS.md session 44). Results differ from the
  /// unfolded plan's by one rounding of each scaled weight, and loading
  /// computes the products on the host (a 1B model 0.2 -> 0.36 s). On by
  /// default; a plan whose devices are all cpu devices never folds (no cpu
  /// kernel takes a norm in: LLaMA-1B's first 4 layers loaded in 0.30-0.35
  /// s unfolded against 0.46 s folded, docs/BENCHMARKS.md session 61).
  bool fold_norm_weights = true;
  /// All-reduces small enough for every member's
  /// device_spec::in_stream_max_bytes (CUDA: 256 KiB by default) run
  /// in-stream (collective_algo::in_stream): one kernel per member on its
  /// compute lane 0, the members meeting on the devices, so a
  /// tensor-parallel decode step is one replayed graph per device with no
  /// host between its layers (LLaMA 7B-shaped decode on 2 H100s: 3.7 ms
  /// against 4.1-4.2 on NCCL's queue; on 4: 2.7 against 4.7-5.4 ms,
  /// docs/BENCHMARKS.md). Only devices that set in_stream_max_bytes (CUDA)
  /// take it. By default (distinct_gpus) only where every member is a GPU
  /// of its own; `on` also between logical devices of one GPU (see
  /// in_stream_mode); `off`: the communication queue (NCCL or the own
  /// one-shot). A part spins on its GPU while it waits for the others:
  /// every queue of the plan issues jobs in one agreed order, so that no
  /// stream holds a later job's work in front of an earlier one's
  /// (launch_queue::in_job_order), but parts of two plans running at once on
  /// the same devices are not ordered against each other (nor are NCCL's
  /// collectives of two plans); a part that waits past
  /// backend_options::cuda_collective_timeout_s gives up and its job fails
  /// with a timeout.
  in_stream_mode in_stream_collectives = in_stream_mode::distinct_gpus;
  /// Run a host copy of at most its device's device_spec::inline_copy_max_bytes
  /// (64 KiB by default) on the compute lane that reads it (h2d, when the
  /// lane starts with it) or wrote it (d2h, when the lane ends with it)
  /// instead of the device's copy queue (step::on_compute_stream): the
  /// transfer takes a microsecond or two, while a hand-off between streams
  /// costs an event record, a wait and a message between actors on the host
  /// (a tiny job's round trip, the token and position of a decode step).
  /// Larger copies keep their copy engine, beside compute. Off: every copy
  /// takes its copy queue.
  bool inline_small_copies = true;
  /// Copy an output that is a concat of tensors computed on several devices
  /// (a tensor-parallel output sharded by rows or columns, branches of a
  /// pipeline joined at the end) to the host piece by piece: each device
  /// copies its own pieces straight into their place in the job's output
  /// (step::host_offset), side by side on their own copy engines, and the
  /// concat is never computed. Off: the pieces are peer-copied to one device,
  /// concatenated there and copied to the host from it.
  bool output_pieces = true;
  /// Let producers write a concat's inputs straight into its output where
  /// they can (elided_concat, plan::elided_concats()), so the concat copies
  /// nothing: the chunks of a tensor-parallel row-parallel matmul, the
  /// pieces of a sequence-parallel hidden state. Off: every concat is a
  /// kernel that copies its inputs.
  bool elide_concats = true;
  /// Order the steps of a plan with collectives by the cost model: a
  /// simulation of one job lets each compute lane take the first step whose
  /// inputs are ready and each communication queue run its collectives in
  /// the order searched (waiting for the next, as the runtime's queue does),
  /// and a search swaps neighbouring collectives on the
  /// communication queues while the modelled span shrinks (the next chunked
  /// region's first all-gather ahead of the last reduce-scatter of the one
  /// before, so its first chunk starts sooner). The order is kept only when
  /// it models at least 0.1% faster than the step builder's; every member of
  /// a collective sees the same order of collectives (NCCL's rule). Off: the
  /// builder's order, close to the graph's.
  bool order_steps_by_model = true;
  /// Copies of the plan's state (its store_rows nodes, e.g. one KV cache per
  /// sequence) each device keeps: a job names one (submit_options::
  /// state_slot) and sees what the previous job of that slot stored. The
  /// memory plan counts state_slots x device_memory::state_bytes. 1..65536;
  /// a plan without store_rows nodes ignores it.
  int state_slots = 1;
  /// Another plan (compiled for the same devices) whose state this plan
  /// reads and stores: its store_rows nodes are matched by name, pinned to
  /// the devices the other plan keeps them on, and laid out at the same
  /// offsets, and the runtime gives both plans one state region and one set
  /// of slots (a generator's prefill and decode plans share one KV cache).
  /// Each of this plan's store_rows nodes must exist there with the same
  /// dims and dtype; state_slots is taken from it. Null: own state.
  std::shared_ptr<const plan> share_state_with;
  /// Another plan (same devices) whose uploaded weights this plan uses on
  /// every device where the other holds each of this plan's weights (same
  /// name, dims, dtype and values: weight_source same_values; it may hold
  /// more), read at the other's offsets, instead of uploading its own copy
  /// (device_memory::weights_shared; describe() says where). Elsewhere it
  /// uploads its own. Null: own weights everywhere.
  std::shared_ptr<const plan> share_weights_with;
};

/// Refuses options no plan can be made with, naming the option and the
/// value (errc::invalid_argument): a policy other than automatic / single,
/// pipeline_stages < 0 or > 4096, lanes_per_device outside 0..64,
/// job_lanes outside 0..8, max_lane_memory_ratio below 1 or not finite, lane_memory_slack_bytes < 0,
/// min_branch_seconds negative, infinite or NaN, tensor_parallel outside
/// 1..4096, graph_replay not off / on / auto, state_slots outside 1..65536.
/// compile() calls it.
error validate(const plan_options& options);

/// The compiled plan. Steps are in a topological order (deps have smaller ids).
class plan {
 public:
  /// The graph the steps run: the user's graph with its norm weights folded
  /// into their projections (plan_options::fold_norm_weights), or with tensor
  /// parallelism its per-device rewrite (every node pinned to one device, with
  /// its shard shape; same job inputs and outputs, in the same order).
  const graph& source() const noexcept { return *graph_; }
  std::shared_ptr<const graph> source_ptr() const noexcept { return graph_; }
  /// The graph given to compile() (== source() when no rewrite applied).
  const graph& original() const noexcept { return *original_; }
  /// Split states, groups and collectives of a tensor-parallel plan; null when
  /// tensor_parallel == 1.
  const tensor_parallel_info* tensor_parallel() const noexcept { return tp_.get(); }
  /// The layout as planned: pipeline stages (without tensor parallelism a
  /// stage per used device) and devices per stage.
  int stage_count() const noexcept { return tp_ ? tp_->stages : static_cast<int>(used_devices_.size()); }
  int tensor_degree() const noexcept { return tp_ ? tp_->degree : 1; }
  const std::vector<device_spec>& devices() const noexcept { return devices_; }
  /// Op chains a backend runs as one kernel (plan_options::fuse_ops,
  /// graph/fusion.hpp), in step order; the memory plan keeps their inputs
  /// until the kernel that reads them.
  const std::vector<attention_fusion>& fusions() const noexcept { return fusions_; }
  /// Projection groups one GEMV kernel runs (plan_options::fuse_projections),
  /// in step order; the memory plan keeps their inputs until the group's last op.
  const std::vector<projection_fusion>& projection_fusions() const noexcept { return projection_fusions_; }
  /// Concats that run nothing (plan_options::elide_concats), in step order.
  const std::vector<elided_concat>& elided_concats() const noexcept { return elided_concats_; }
  /// Whether op `id` runs no kernel: a view, a leaf, an elided concat or a
  /// store_rows that stores nothing (its positions a constant outside its
  /// capacity: a read of the state slot).
  bool runs_nothing(node_id id) const;
  /// Whether node `id` (or, for a view, its storage) holds memory when the
  /// plan runs: false inside a fused attention chain (its scores, masked
  /// scores and probabilities), which the fused kernel never writes, so the
  /// memory plan gives them no buffer and no step reads or writes them (a
  /// prefill chunk of 1024 tokens over 65,536 cache rows: 8 GiB of scores
  /// and probabilities that would otherwise sit in its arena).
  bool materialised(node_id id) const;
  const plan_options& options() const noexcept { return options_; }
  /// Device of each node (index = node id); leaves take their first consumer's device.
  /// Views take their first compute reader's device (else their storage's).
  /// Nodes no output needs were pruned: -1.
  const std::vector<int>& placement() const noexcept { return placement_; }
  const std::vector<step>& steps() const noexcept { return steps_; }
  const step& at(step_id id) const { return steps_.at(static_cast<std::size_t>(id)); }
  const std::vector<device_memory>& memory() const noexcept { return memory_; }
  /// Steps with no deps (h2d copies and splits fed by weights only).
  const std::vector<step_id>& sources() const noexcept { return sources_; }
  /// The d2h steps; a job is complete when all of them completed.
  const std::vector<step_id>& sinks() const noexcept { return sinks_; }
  /// Devices this plan touches.
  const std::vector<int>& used_devices() const noexcept { return used_devices_; }

  /// Location of `node` on `device` (where a compute step there reads or
  /// writes it). Views resolve through their storage. Fails with
  /// errc::internal if the node is not resident there.
  expected<tensor_location> locate(node_id node, int device) const;

  /// Totals for printing and tests.
  int64_t bytes_moved() const;                 ///< all copies, host and peer
  double est_seconds(int device) const;        ///< compute on that device
  /// The modelled span of one job on this plan (seconds): its steps run on
  /// their queues (compute lanes, communication and copy queues) in program
  /// order, each when its inputs are done, taking its step::est_seconds (the
  /// simulation plan_options::order_steps_by_model plans with; kernels timed
  /// plainly, not replayed).
  double modelled_seconds() const;
  /// Human-readable summary: devices, splits (ops, est time), copies (bytes),
  /// collectives (bytes, algorithm, est time), per-device est time, peak
  /// arena vs sum of tensor sizes, weight bytes; with tensor parallelism also
  /// the layout, each weight's and each collective's split state and the
  /// weight bytes per device.
  std::string describe() const;
  /// DOT of the steps (splits as boxes per device cluster, copies as edges).
  std::string to_dot() const;

 private:
  friend class planner;
  friend struct plan_test_hook;  // defined only by tests (to plant faulty plans)
  void describe_tensor_parallel(std::ostream& os) const;
  std::shared_ptr<const graph> graph_;
  std::shared_ptr<const graph> original_;
  std::shared_ptr<const tensor_parallel_info> tp_;
  std::vector<attention_fusion> fusions_;
  std::vector<projection_fusion> projection_fusions_;
  std::vector<elided_concat> elided_concats_;
  /// plan_options::order_steps_by_model: the modelled span of one job in the
  /// step builder's order and in the order kept (seconds); 0 when the pass
  /// did not run, equal when it kept the builder's order.
  double builder_order_seconds_ = 0, kept_order_seconds_ = 0;
  std::vector<char> elided_;  // [node] -> 1 for an elided concat or a store_rows that stores nothing
  std::vector<char> fused_inside_;  // [node] -> 1 inside a fused attention chain (materialised())
  std::vector<device_spec> devices_;
  plan_options options_;
  std::vector<int> placement_;
  std::vector<step> steps_;
  std::vector<device_memory> memory_;
  std::vector<step_id> sources_, sinks_;
  std::vector<int> used_devices_;
  // (node, device) -> slot index lookup, built by the planner
  std::vector<std::vector<int32_t>> slot_index_;  // [device][node] -> index into memory_[device].slots or -1
};

/// Whether dep `d` of step `s` is met on the devices rather than waited for
/// by `s`'s queue: `s` is an in-stream collective part and `d` runs on
/// another device. Every such dep is a dep of that device's own part (the
/// parts of one collective share their deps), which waits for it before it
/// joins, and `s` reads that member's operand only once it joined. The
/// lowering drops these edges (no event wait, no `ready`), and a replay
/// segment runs through them (graph/replay.hpp).
bool met_on_device(const plan& p, const step& s, step_id d);

/// For each step (index = id), the deps its queue waits for: its deps but
/// those met on the devices (met_on_device) and, on a compute lane, those an
/// earlier step of the same (device, lane) already waits for (the lane's
/// stream order implies them: a decode step's layers all read its position
/// input, whose copy the first of them waited for). Deps on the step's own
/// queue stay in (the lowering and replay segments skip them). The lowering
/// (remote deps and consumers) and replay_segments() both use it.
std::vector<std::vector<step_id>> waited_deps(const plan& p);

/// Whether step `c` waits for its dep `d` in `waited` (waited_deps' result).
inline bool waits_for(const std::vector<std::vector<step_id>>& waited, step_id c, step_id d) {
  const auto& w = waited[static_cast<std::size_t>(c)];
  return std::find(w.begin(), w.end(), d) != w.end();
}

/// Compiles `g` for `devices`.
///
/// Passes (graph/planner.cpp, graph/memory_plan.cpp):
///  0. tensor parallelism (options.tensor_parallel > 1): the graph is
///     rewritten per device (graph/tensor_parallel.hpp) and the passes below
///     plan the rewrite, whose nodes are all pinned;
///  1. prune nodes no output needs (placement -1, no steps, no h2d); every
///     part of a needed collective is needed;
///  2. place: pins; then `single` (device 0) or `automatic`: compute nodes in
///     topological order grouped into units by `node::layer` (untagged nodes
///     join the unit before them, or the first), split into contiguous stages
///     over devices 0..k-1 minimising the slowest stage (linear-partition DP
///     on estimate_seconds per device; ties leave trailing devices empty);
///     untagged graphs use one unit per node. An op its device does not
///     support moves to the nearest device that does (index distance, lower
///     index on ties); a pinned one is an error;
///  3. lanes (lanes_per_device != 1): between two nodes that every other node
///     of the device is ordered against, the rest form groups with no path
///     between them; groups exceeding min_branch_seconds are spread over the
///     lanes (heaviest first onto the least loaded lane) when there are >= 2
///     of them and (auto lanes) the cost model predicts a gain, else lane 0;
///     auto lanes then keep each device's arena within max_lane_memory_ratio
///     of the one-lane plan's by planning again with fewer lanes;
///  4. splits: ops in topological order join the open split of their
///     (device, lane) unless that adds a wait the split does not already have
///     (job input uploads excepted); a split ends after an op whose value
///     another (device, lane) reads, so readers wait only for what they need.
///  5. memory: see check_hazards; greedy first fit in first-write order,
///     256-byte aligned.
///  6. collectives: one step per member (see step), the algorithm and time
///     from estimate_collective_seconds.
/// Errors: options or device specs that validate() refuses (invalid_argument),
/// a graph with no outputs (invalid_argument: an empty or default-constructed
/// graph has nothing to compute), a job whose inputs and outputs together need
/// more host memory than this host has (out_of_memory, host_memory_bytes():
/// names the bytes needed and the largest input or output), an op no device supports
/// (unsupported_op, names the node), a pin to a device index out of range
/// (invalid_argument), a memory plan that does not fit a device
/// (out_of_memory, names the device and the bytes needed vs available), a
/// bad tensor-parallel layout (invalid_argument, see rewrite_tensor_parallel),
/// two collective nodes claiming one rank of the same operands.
expected<std::shared_ptr<const plan>> compile(std::shared_ptr<const graph> g,
                                              std::vector<device_spec> devices,
                                              plan_options options = {});

/// True when compute step `s` holds an op that may_fail_on_values (graph.hpp):
/// its failure is only known once it ran, so the runtime must ask the device
/// to report on it (a host notification), or the job could finish "done"
/// with whatever the failed op left in memory.
bool may_fail_on_values(const plan& p, const step& s);

/// Proves the memory plan: for every pair of buffers on one device whose
/// byte ranges overlap, every access (write or read) of one happens-before
/// the first write of the other, where happens-before is the transitive
/// closure of step deps, lane order of one job and op order inside a step.
/// Independent of the allocator. Returns ok, or an error naming both nodes.
error check_hazards(const plan& p);

}  // namespace ag
