#pragma once
/// \file device.hpp
/// The device interface every backend implements (cpu/, sim/, cuda/). It has
/// CUDA's semantics: work is *enqueued* on streams and runs asynchronously in
/// stream order; events mark a point in a stream; a stream can wait for an
/// event of any stream of any device without the host waiting. Names no CAF
/// and no CUDA type.
///
/// Threading: a device object is shared by its device actor and that device's
/// stream / copy-engine actors. Every method is thread-safe, but one stream
/// must be driven by one thread at a time (its owning actor). Callbacks given
/// to notify() run on a backend thread: they must be short and non-blocking
/// (e.g. caf::anon_send).

#include <array>
#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "graph/cost_model.hpp"
#include "graph/error.hpp"
#include "graph/fusion.hpp"
#include "graph/graph.hpp"
#include "graph/step_kind.hpp"

namespace ag::gpu {

/// Nanoseconds on the host's steady clock: the one clock all traces use.
int64_t host_clock_ns() noexcept;

/// An in-order queue of work on one device. Opaque; created by a device for
/// the kind of step it serves (ag::step_kind, graph/step_kind.hpp): copy
/// kinds map to copy engines on CUDA.
class stream {
 public:
  virtual ~stream() = default;
  /// The step kind whose queue this stream serves.
  virtual step_kind kind() const noexcept = 0;
};

/// A point in a stream. `record` re-arms it; `wait` waits for the last record
/// made before the wait was enqueued (CUDA semantics). An event that was never
/// recorded counts as complete.
class event {
 public:
  virtual ~event() = default;
  /// True once the recorded point was reached (non-blocking).
  virtual bool query() const = 0;
  /// Blocks the calling thread until complete. Only for backend worker threads
  /// and tests, never in an actor handler.
  virtual void host_wait() const = 0;
  /// host_clock_ns() at which the recorded point was reached; valid once
  /// query() is true, on events created with timing = true.
  virtual int64_t completion_ns() const = 0;
};

class device;

/// A tensor as a kernel sees it: resolved pointer, dtype, dims, element strides.
struct tensor_arg {
  void* data = nullptr;
  dtype type = dtype::f32;
  shape dims;
  strides stride{};
};

/// One op to run: the graph node (op kind, attrs, output dtype/dims) and its
/// resolved buffers. `inputs` follow node->inputs order (optional norm weight
/// / bias are present only when the node has them).
struct op_launch {
  const node* op = nullptr;
  tensor_arg out;
  std::vector<tensor_arg> inputs;
  /// The graph `op` belongs to, when the caller has it: the sim backend then
  /// costs the op with estimate_seconds(spec, *source, *op), exactly as the
  /// planner did. Null: the sim costs it from the tensor_args (same formula).
  const graph* source = nullptr;
  /// Graph replay (plan_options::graph_replay, graph/replay.hpp): this op is
  /// a kernel of a replayed segment other than its first, so the segment's
  /// one graph launch already paid its launch latency. Set only on the copies
  /// a backend keeps inside a replay_graph (the sim's capture()); the sim
  /// then charges the op spec.kernel_latency (on its own stream) instead of
  /// spec.launch_latency (host time); other backends ignore it.
  bool launch_paid_by_replay = false;
  /// Set by the lowering (actors/launch_program.cpp): this record runs a
  /// chain of the plan's ops as one kernel (see fused_attention). CUDA
  /// devices get every kind; cpu devices get prefill-sized attention only
  /// (graph/fusion.hpp, find_attention_fusions).
  enum class fusion : uint8_t { none = 0, attention = 1, projections = 2, decode_step = 3 };
  fusion fused = fusion::none;
  /// Set by the lowering: bit i when `inputs[i]` is a weight leaf in the
  /// plan's weights region, which no kernel of any job writes (i < 32). A
  /// kernel may read such an input before it waits for the kernel before
  /// it (programmatic dependent launch): the CUDA GEMV does for a plain
  /// product's weight. Backends that do not look at it lose nothing.
  uint32_t weight_inputs = 0;
  /// Set by the lowering: bit i when `inputs[i]` is not written by the
  /// record launched right before this one on its queue (and is not an
  /// in-stream part's peer operand). Our kernels wait for the kernel before
  /// them before they release the next one (gpu/cuda/common.cuh), so a
  /// kernel that starts early under programmatic dependent launch runs
  /// beside that one kernel only, and may read such an input before its
  /// wait: the CUDA decode attention loads its first keys and values of the
  /// cache there. Weights are always settled. A superset of weight_inputs.
  uint32_t settled_inputs = 0;
  /// fusion::projections, in place of a projection group (graph/fusion.hpp,
  /// projection_fusion): `inputs` are {x, w_1, .., w_n} (gated: {x, w_gate,
  /// w_up}; residual: {x, w, r}); `out` is the group's output (shared_input:
  /// the first matmul's, `extra_outs` the others'); `op` is the group's last op.
  projection_kind projection = projection_kind::shared_input;
  std::vector<tensor_arg> extra_outs;
  /// A projection group's rms_norm prologue (projection_fusion::norm_prologue):
  /// `inputs[0]` is the norm's input, which the kernel normalises row by row
  /// (eps) and, when `weighted`, scales by the norm's weight, the last input.
  struct norm_prologue {
    bool on = false;
    bool weighted = false;
    float eps = 0.0f;
  };
  norm_prologue projection_norm{};
  /// A shared-input group's ropes (projection_fusion::ropes): output m
  /// (`out`, then `extra_outs`) is rotated as it is written when bit m of
  /// `roped` is set; the positions i32 [S] are the last input; x's row r is
  /// position r % S; pairs (k, k + D/2) of each head of `head_dim` when
  /// `neox`, else (2k, 2k + 1).
  struct rope_epilogue {
    uint8_t roped = 0;
    bool neox = true;
    int64_t head_dim = 0;
    int64_t seq = 1;
    float theta = 0.0f;
    rope_scaling scaling{};
  };
  rope_epilogue projection_rope{};
  /// fusion::attention, in place of the chain scores = matmul(q, k^T) [->
  /// add(scores, mask)] -> probs = softmax(.. * scale, causal) -> out =
  /// matmul(probs, v) (views between them allowed), whose intermediates
  /// nothing else reads: `op` is the last matmul, `inputs` are {q [.., M, dh],
  /// k [.., keys, dh], v [.., keys, dh]} and, when masked, the mask [S, keys];
  /// `out` is [.., M, dh]. Row r of the rows the softmax saw (in order) is
  /// query row m of batch b (r = b * M + m) and row r % softmax_rows of the
  /// softmax's [.., S, keys] view, which the causal flag and the mask index.
  ///
  /// With a cache prologue (graph/fusion.hpp; `store_new_rows`), `inputs`
  /// go on with {k_new, v_new [.., S, dh] (views), cache_positions i32 [S]}
  /// and, when a rope is fused, the rope positions i32 [S]: the kernel
  /// stores the new rows at cache_positions along k's and v's keys (-1 or
  /// out of range: not stored) and reads them there; `rope_q` / `rope_k`:
  /// q's rows / the new keys are first rotated (neox, `rope_theta`, `rope_scale`) by the
  /// position of their softmax row, rounded to the dtype as a rope op would.
  struct attention_params {
    float scale = 1.0f;
    bool causal = false;
    bool masked = false;
    int64_t softmax_rows = 1;  ///< S: the softmax view's second-last dim
    /// The mask is a range_mask whose rows see keys apart (op_attrs::rows_apart).
    bool rows_apart = false;
    bool store_new_rows = false;
    bool rope_q = false;
    bool rope_k = false;
    float rope_theta = 10000.0f;
    rope_scaling rope_scale{};
  };
  attention_params attention{};
  /// fusion::decode_step, in place of a whole single-device LLaMA-family
  /// decode step (batch 1, one new token, a KV cache; the lowering's
  /// fuse_decode_step, actors/launch_program.cpp): one persistent kernel
  /// runs every layer (gpu/cuda/decode_step.cuh). `inputs`, in order:
  ///   0 the token id (i32, one element: the tokens input or a token state),
  ///   1 the embedding table [vocab, d], 2 the rope positions i32 [1],
  ///   3 the cache positions i32 [1] (-1: the new row is not stored),
  ///   4 the attention mask [1, cache_rows], 5 the head's weight [vocab, d],
  ///   6 the final norm's weight [d] when final_norm_weighted,
  /// then for each layer decode_step_layer_inputs operands (plus 2 when
  /// norm_weighted): w_q [H dh, d], w_k [Hkv dh, d], w_v, the k and v caches
  /// [1, Hkv, cache_rows, dh], w_o [d, H dh], w_gate [ff, d], w_up, w_down
  /// [d, ff], then the attention's and the MLP's norm weights [d], then
  /// with qkv_bias (Qwen2) the biases b_q [H dh], b_k [Hkv dh], b_v, then
  /// with qk_norm (Qwen3) the q and k norms' weights [dh]. `out` is
  /// the logits f32 [1, 1, vocab], or with `argmax` the greedy token (i32,
  /// one element: the argmax output or the token state it is kept in).
  static constexpr std::size_t decode_step_layer_inputs = 9;
  struct decode_step_params {
    int layers = 0;
    int64_t d_model = 0, d_ff = 0, heads = 0, kv_heads = 0, head_dim = 0, vocab = 0, cache_rows = 0;
    float eps = 1e-5f;         ///< every rms_norm's (the lowering checks they agree)
    float rope_theta = 10000.0f;
    rope_scaling rope_scale{};  ///< every layer's (the lowering checks they agree)
    float scale = 1.0f;        ///< the attention's softmax scale
    bool norm_weighted = false;        ///< per-layer norm weights present (not folded into the projections)
    bool final_norm_weighted = false;  ///< the final norm's weight present
    bool argmax = false;               ///< `out` is the greedy token, not the logits
    bool qkv_bias = false;             ///< q/k/v biases (3 operands a layer more)
    bool qk_norm = false;              ///< rms_norms over each head's q and k before RoPE (2 operands a layer more)
    /// Tensor parallelism (plan_options::fuse_tp_decode_step): this record is
    /// rank tp_rank of a step split over tp_degree devices (1: one device,
    /// none of what follows applies). Each rank's record runs its own
    /// kernel over its own shards (the operands above, with heads, kv_heads
    /// and d_ff this rank's; d_model whole), and the ranks' kernels meet on
    /// the devices: they exchange the embedding row, each layer's o and
    /// down partial rows (summed in rank order, so every rank holds the
    /// same bits, as the in-stream all-reduce they replace) and their best
    /// logit. op_launch::collective names the members (rank, members,
    /// device_index; the runtime sets `devices`); the stream's collective
    /// tag (device::set_collective_tag, set before the record) names the
    /// job. Rank 0 adds the residual and writes the greedy token (`argmax`
    /// is required); every rank picks the same token, and a rank past 0
    /// writes it only with tp_token_out (its own copy of the token, a token
    /// state its next step reads), else no output.
    int tp_rank = 0, tp_degree = 1;
    bool tp_token_out = false;
    int64_t embed_rows = 0;   ///< TP: rows of this rank's embedding slice (inputs[1])
    int64_t embed_begin = 0;  ///< TP: the vocabulary index of that slice's first row
    int64_t logit_begin = 0;  ///< TP: the vocabulary index of this rank's first head row (`vocab` rows here)
    int64_t vocab_total = 0;  ///< TP: the whole vocabulary (the token's range)
    /// Operands of each layer, and of the whole record (the order above).
    std::size_t layer_operands() const noexcept {
      return decode_step_layer_inputs + (norm_weighted ? 2u : 0u) + (qkv_bias ? 3u : 0u) + (qk_norm ? 2u : 0u);
    }
    std::size_t global_operands() const noexcept { return final_norm_weighted ? 7u : 6u; }
    std::size_t operands() const noexcept {
      return global_operands() + layer_operands() * static_cast<std::size_t>(layers);
    }
  };
  decode_step_params decode_step{};
  /// An in-stream all-reduce part (collective_algo::in_stream, plan.hpp):
  /// `op` is this member's all_reduce node, `inputs` every member's operand
  /// in rank order (each in its own member's memory), `out` the result here.
  /// The part meets the other members' parts on the devices, under the job
  /// tag its stream was given last (device::set_collective_tag) and `key`,
  /// which names the collective within the job alike on every member.
  struct in_stream_part {
    int rank = -1;  ///< this member's index; -1: not an in-stream part
    int members = 0;
    uint32_t key = 0;
    std::array<int, max_in_stream_members> device_index{};   ///< runtime index of each member
    std::array<device*, max_in_stream_members> devices{};    ///< each member (set by the runtime)
  };
  in_stream_part collective{};
};

/// A captured run of kernels (one replay segment of a plan, with the job's
/// buffers resolved) that its device can launch again as one unit: a CUDA
/// graph on the cuda backend, the recorded launch list on the sim. Made by
/// device::capture, launched by device::replay on a stream of the same
/// device, owned (and destroyed) by the executing actor that made it, after
/// every launch of it completed. Opaque.
class replay_graph {
 public:
  virtual ~replay_graph() = default;
  /// Kernels in it (views and leaves are not captured).
  virtual int kernels() const noexcept = 0;
  /// Kernels its host copies became (CUDA: consecutive copies that touch
  /// none of each other's bytes share one); 0 where copies are not kernels.
  virtual int host_copy_kernels() const noexcept { return 0; }
};

/// One operation of a replay segment handed to device::capture_segment: a
/// kernel (its launch record), or a host copy of the segment (a small input
/// copied in at the start of a lane, an output copied out at its end:
/// plan_options::replay_host_copies).
struct segment_op {
  enum class kind : uint8_t { launch, copy_h2d, copy_d2h };
  kind what = kind::launch;
  const op_launch* launch = nullptr;  ///< kind::launch
  void* dst = nullptr;                ///< copies: device memory (h2d) or host memory (d2h)
  const void* src = nullptr;          ///< copies: host memory (h2d) or device memory (d2h)
  int64_t bytes = 0;                  ///< copies
  /// device::capture_lanes only: the capture lane (index into its streams)
  /// the op runs on, and the ops on other lanes it must follow: indices of
  /// earlier ops of the same segment (`after[0..after_count)`). Ops of one
  /// lane follow each other in segment order; nothing else orders ops of
  /// different lanes, so the graph runs them side by side.
  int lane = 0;
  const int32_t* after = nullptr;
  int after_count = 0;
};

class device;

/// One member's part of a collective step (all_reduce, all_gather,
/// reduce_scatter; graph/graph.hpp defines the results): enqueued on the
/// member's communication stream (step_kind::collective) after waits for
/// every member's operand producer, like any step. The runtime issues the
/// parts of one communicator (the members of a tensor-parallel group) in the
/// same order on every member (actors/collective_order.hpp), every part of
/// a job that started, also once it was cancelled or failed (then with no
/// waits: its sums are void), so a backend whose parts meet by their place
/// in that order (NCCL) never pairs two jobs' parts nor waits for a part
/// that will not come; the host backends check it at every part
/// (gpu/host/collective_sequence.hpp). The parts complete independently
/// (each fires its own events), and a dead member makes the others' parts
/// fail or finish, never wait forever.
struct collective_launch {
  const node* op = nullptr;          ///< this member's collective node (attrs.rank = `rank`)
  int rank = -1;                     ///< this member's index in `members`
  tensor_arg out;                    ///< the result, on this device (contiguous)
  /// Every member's operand in rank order, each in its own member's device
  /// memory (contiguous; the members' producers are complete when the
  /// part's waits are). `inputs[rank]` is this device's own.
  std::vector<tensor_arg> inputs;
  std::vector<device*> members;      ///< device of each member, rank order
  collective_algo algo = collective_algo::ring;  ///< what the plan's cost model picked (by size)
  int64_t bytes = 0;                 ///< message size (the plan's step bytes)
  /// The job's cancellation flag (set by the runtime, which keeps the job
  /// alive through it; null where a test drives a device directly). Parts
  /// that meet the other members' parts (the cpu ring) stop waiting for a
  /// member that will never come once it is set, with errc::cancelled; with
  /// the operand addresses it also tells the parts of one collective from
  /// those of another job's.
  std::shared_ptr<const std::atomic<bool>> cancelled;
  /// Which of the group's communicators runs the part (0 .. the count given
  /// to prepare_collective_group - 1): the job's job lane
  /// (launch_program::job_lanes), so that two lanes' collectives never wait
  /// in one communicator's order. Only NCCL parts use it.
  int communicator = 0;
  /// Each member's device::generation() when the part's job started, rank
  /// order (empty: the current ones; tests that drive devices themselves).
  /// A member revived since then leaves the part without its communicator:
  /// the host backends refuse it (errc::device_failed), so that a job of
  /// before the revival never pairs with one of after.
  std::vector<uint64_t> generations;
  /// The part of a cancelled or failed job, issued only to keep its place
  /// in the communicator's order (actors/collective_order.hpp): its operands
  /// may never have been written and nobody reads its result. A backend
  /// whose parts meet by order (NCCL) still runs it; the host backends take
  /// its place in the order and compute nothing.
  bool void_part = false;
};

/// Faults a simulated device can be told to produce (sim backend; other
/// backends ignore it). Rates are per op, drawn from the device's seeded RNG.
struct fault_config {
  double op_error_rate = 0;     ///< launch() fails with errc::op_failed
  double op_stall_rate = 0;     ///< op takes stall_seconds extra (wall time)
  double stall_seconds = 1.0;
  /// capture() refuses every segment (graph replay then falls back to
  /// plain launches: tests of the fallback).
  bool refuse_capture = false;
  int64_t die_after_ops = -1;   ///< device dies after this many ops (-1: never)
};

/// Options for the simulated backend.
struct sim_options {
  device_spec spec;             ///< per-device parameters (name/ordinal are set per device)
  double time_scale = 1.0;      ///< wall seconds per simulated second (1e-3: a sim ms takes 1 us)
  double jitter = 0.0;          ///< relative stddev of a lognormal factor on every op / copy time
  bool compute_values = true;   ///< false: timing only, outputs are left as garbage
  bool zero_delay = false;      ///< true: no delays and no cost modelling at all (dispatch-cost benchmarks)
  uint64_t seed = 1;
  fault_config faults;
};

struct backend_options {
  sim_options sim;
  /// cpu backend: threads each kernel of a stream may use, the stream's own
  /// worker included (a few-row matmul's columns and a bf16 weight's
  /// conversion split among them, gpu/cpu/thread_team.hpp; and BLAS's
  /// process-wide thread count, which the first cpu device sets). 1: the
  /// stream's thread alone. 0: the machine's hardware threads shared evenly
  /// among the cpu devices of the spec (what the programs use: one cpu
  /// device gets every core, `cpu:2 --tp 2` half each). Results are the same
  /// bits for any count.
  int cpu_threads_per_stream = 1;
  bool cuda_tf32 = false;          ///< cuda: allow TF32 tensor cores for f32 matmul
  /// cuda: matmuls of at most 8 rows against a weight (a decode step's
  /// projections) run on the project's GEMV kernel instead of cuBLAS
  /// (gpu/cuda/gemv.cuh; faster at batch 1: docs/BENCHMARKS.md, session 11).
  bool cuda_gemv = true;
  /// cuda: GEMVs of at least this many rows (2..8) of f16 / bf16 run on the
  /// tensor cores (gpu/cuda/gemv.cu's mma form: a 16-row tile of weights
  /// times up to 8 rows of x per m16n8k16 product, so a weight byte costs
  /// the same instructions for 2 rows as for 8), fewer rows on the FMA
  /// kernel; and plain products of 9 to 16 rows, which otherwise go to
  /// cuBLAS (projection groups stay at most 8 rows). A batched decode step's
  /// products (generator_options::decode_batch) are such GEMVs. 0: never.
  /// 2 by default: on an H200 a batched step of 8 LLaMA-1B rows took 2.66
  /// ms against 5.01 on the FMA kernel (docs/BENCHMARKS.md, session 72).
  int cuda_gemv_tensor_core_rows = 2;
  /// cuda (sm_90 and later): the project's kernels launch as programmatic
  /// dependents of the kernel before them on their stream (PDL). Such a
  /// kernel is launched while its predecessor still runs, waits for it at
  /// `griddepcontrol.wait` before it touches activations, and may read its
  /// weights before that (the GEMV kernel prefetches them into L2): kernel
  /// boundaries stop costing a launch gap. Captured graphs keep it as a
  /// programmatic edge. cuBLAS and copies are unaffected.
  bool cuda_pdl = true;
  /// cpu: collectives of at most this many bytes run one-shot, larger ones
  /// as a ring (gpu/cpu/ring.hpp). It becomes the cpu devices'
  /// spec.oneshot_max_bytes, which the planner's cost model reads to pick
  /// collective_launch::algo. -1: the spec's default (512 KiB).
  int64_t cpu_oneshot_max_bytes = -1;
  /// cuda: collectives of at least this many bytes go through NCCL (when the
  /// build has it and the members are distinct GPUs), smaller ones through
  /// the own one-shot kernel (the crossover; measure it with
  /// `actorgraph-tp-bench --allreduce=cuda:0,1`). The CUDA devices'
  /// spec.oneshot_max_bytes becomes this - 1, so the plan's algorithm
  /// (describe, trace) names the path that runs. Must be >= 1.
  int64_t cuda_nccl_min_bytes = int64_t{256} << 10;
  /// cuda: the crossover for groups of three or more distinct GPUs, where
  /// each member's one-shot part reads n - 1 peers (cuda_nccl_min_bytes is
  /// then for groups of two). On 4 H200s NCCL was faster at every size
  /// measured (8 KiB: 9.9 against 13.2 us of the devices' time per call;
  /// docs/BENCHMARKS.md, session 10), so by default NCCL takes them all.
  /// It becomes the CUDA devices' spec.oneshot_max_bytes_wide (+ 1). >= 1.
  int64_t cuda_nccl_min_bytes_wide = 1;
  /// cuda: reduce-scatters and all-gathers above the one-shot limit move
  /// their data with the copy engines (collective_algo::copy_engine: each
  /// member pulls its peers' pieces with peer copies, then a reduce-scatter
  /// sums them with one local kernel) instead of NCCL's kernels, which wait
  /// for the SMs a GEMM holds. So they run beside the GEMMs, and the planner
  /// turns on sequence parallelism and its chunked overlap on CUDA GPUs
  /// (becomes the devices' spec.copy_engine_collectives). All-reduces keep
  /// their path. On by default since session 42: on two H200s one d-8192
  /// layer at a time runs 2.01x one GPU against 1.82 with NCCL's all-reduces,
  /// and 16 micro-batches of a 24-layer d-4096 LLaMA as 1 x 2 run 2-8%
  /// faster at T 512 / 1024 / 2048 (docs/BENCHMARKS.md, session 42). It
  /// was off while many jobs in flight lost with it (the parts' work that
  /// needs SMs queued behind the other jobs' GEMMs on one communication
  /// queue: 70 ms against 30 as 1 x 4 in session 18); job lanes
  /// (plan_options::job_lanes) give jobs in flight queues of their own. Off:
  /// large collectives are NCCL's all-reduces, without sequence parallelism.
  bool cuda_copy_engine_collectives = true;
  /// cuda: sequence parallelism on the copy-engine collectives
  /// (plan_options::sequence_parallel auto) only for activations of at
  /// least this many bytes in rows of 4096 elements, and of this x 4096 / w
  /// bytes in rows of w (sequence_parallel_pays, graph/cost_model.hpp: a
  /// layer's matmuls, which hide the collectives, do w times the work per
  /// byte of activations); smaller ones keep their all-reduces (in-stream,
  /// one-shot or NCCL's). On two H200s (docs/BENCHMARKS.md, sessions 42-43)
  /// the copy engines lost a single job of a 4-layer d-4096 LLaMA as 1 x 2 by
  /// 38% at 512 KiB of activations, 21% at 1 MiB, 7% at 4 MiB, 2% at 8 MiB
  /// and broke even at 16 MiB; the LLaMA-1B prefill (d 2048) at tensor
  /// degree 2 lost 7% at 8 MiB (2048 tokens), 5% at 16 MiB (4096 tokens) and
  /// broke even at 32 MiB (8192 tokens); 16 jobs in flight of the d-4096
  /// LLaMA won by 1% from 2 MiB and 5-8% at 8 MiB. Below the minimum the fan
  /// of peer copies and events costs a job more than its overlap hides.
  /// It becomes the CUDA devices' spec.sequence_parallel_min_bytes. >= 0.
  int64_t cuda_sequence_parallel_min_bytes = int64_t{16} << 20;
  /// cuda: all-reduces of at most this many bytes run in-stream
  /// (collective_algo::in_stream, plan_options::in_stream_collectives): it
  /// becomes the CUDA devices' spec.in_stream_max_bytes. 0: never.
  int64_t cuda_in_stream_max_bytes = int64_t{256} << 10;
  /// cuda: how long an in-stream part waits for a live member's part before
  /// it gives up and fails its job (collective_fault). Parts of a dead member
  /// or a cancelled job stop waiting at once.
  double cuda_collective_timeout_s = 5.0;
  /// cuda: load every one of the backend's own kernels into each GPU's
  /// context when its devices are made, rather than on first launch (CUDA's
  /// lazy loading). A lazy load may synchronise the whole context; with an
  /// in-stream part spinning on the same GPU for a member whose next kernel
  /// is being loaded, that is a deadlock (gpu/cuda/kernel_preload.hpp).
  bool cuda_preload_kernels = true;
  /// cuda: a replayed segment that ends its job's work on its stream (no
  /// other queue waits for it, no trace) is launched, with its completion
  /// event, by the device's event poller thread (device::replay_and_notify)
  /// while that thread is awake: a thread that launches again and again
  /// keeps the driver warm in its core's caches, where a CAF worker paid
  /// 2-3 us more per graph launch (docs/BENCHMARKS.md, session 35). The
  /// environment variable AG_CUDA_LAUNCH_ON_POLLER=0|1 overrides it (A/B runs).
  bool cuda_launch_on_poller = true;
};

/// One device. Obtained from make_devices(); shared_ptr because the device
/// actor and its stream actors all hold it; destroyed after they stop.
class device {
 public:
  virtual ~device() = default;

  virtual const device_spec& spec() const noexcept = 0;
  /// Index of this device in the runtime's device list (set by make_devices).
  virtual int index() const noexcept = 0;
  virtual bool supports(op_kind k) const noexcept { return spec().supports(k); }

  // --- memory (device memory; never managed memory) ---
  /// Allocates `bytes` of device memory; errc::out_of_memory with the sizes when it does not fit.
  virtual expected<void*> allocate(int64_t bytes) = 0;
  virtual void deallocate(void* p) noexcept = 0;
  /// Host memory suited to fast copies (pinned on CUDA).
  virtual expected<void*> allocate_host(int64_t bytes) = 0;
  virtual void deallocate_host(void* p) noexcept = 0;
  /// Where host buffers that this device copies into or out of should live
  /// (job outputs): the CUDA backend's pinned pool, which its copy engines
  /// write without staging. Null (the default): the heap is as good.
  virtual host_memory_resource* host_memory() noexcept { return nullptr; }
  /// Where a job's outputs that this device copies out should live: by
  /// default host_memory(). A computing host device (cpu, sim with values)
  /// returns a process-wide cache of large buffers on huge pages
  /// (host_output_memory(), gpu/host/host_device.hpp): a fresh buffer's
  /// page faults cost about 0.5 ms a MiB, every job.
  virtual host_memory_resource* output_memory() noexcept { return host_memory(); }
  virtual int64_t memory_capacity() const noexcept = 0;
  virtual int64_t memory_in_use() const noexcept = 0;
  /// Synchronous host -> device copy (weight upload at plan load, tests):
  /// returns once the bytes are in device memory, so that a kernel on any
  /// stream may read them. Never on a hot path.
  virtual error upload(void* dst, const void* src, int64_t bytes) = 0;
  /// Synchronous device -> host copy (tests, debugging).
  virtual error download(void* dst, const void* src, int64_t bytes) = 0;

  // --- streams and events ---
  // Calls that can fail return the error (code, message naming the device,
  // error::device set) to the caller, which fails the step or job that made
  // them; no backend prints an error instead of returning it.
  /// A stream serving the queue of step kind `kind` (copy kinds use copy
  /// engines where the device has them). Fails when the device is dead or
  /// out of resources.
  virtual expected<std::unique_ptr<stream>> create_stream(step_kind kind) = 0;
  virtual expected<std::unique_ptr<event>> create_event(bool timing = false) = 0;
  /// Marks the current end of `s` in `e`. Fails for an event or stream this
  /// device cannot use, or a device error.
  virtual error record(event& e, stream& s) = 0;
  /// Work enqueued on `s` after this waits for `e`, which may belong to any
  /// stream of any device of any backend. The host does not wait. Fails for a
  /// stream of another device, or a device error.
  virtual error wait(stream& s, const event& e) = 0;

  // --- work (all asynchronous, in stream order) ---
  /// Enqueues one op. Returns an error at once for bad arguments, an op this
  /// device does not support, an injected op fault, or a dead device.
  virtual error launch(stream& s, const op_launch& l) = 0;
  /// `src` must stay valid until the stream passes this point.
  virtual error copy_h2d(stream& s, void* dst, const void* src, int64_t bytes) = 0;
  /// `dst` must stay valid until the stream passes this point.
  virtual error copy_d2h(stream& s, void* dst, const void* src, int64_t bytes) = 0;
  /// Copies `blocks` runs of `block_bytes` from contiguous device memory at
  /// `src` to host memory, run k at dst + k * dst_pitch (a piece of a job
  /// output gathered on the host, plan_options::output_pieces); same rules as
  /// copy_d2h. Default: one copy_d2h per run.
  virtual error copy_d2h_blocks(stream& s, void* dst, int64_t dst_pitch, const void* src, int64_t block_bytes,
                                int64_t blocks);
  /// Copies from `src` on device `src_dev` into `dst` on this device; `s` is a
  /// stream of this device.
  virtual error copy_peer(stream& s, void* dst, device& src_dev, const void* src, int64_t bytes) = 0;
  /// Enqueues this member's part of a collective on `s` (a stream of kind
  /// collective). Errors at once for bad arguments, a member this backend
  /// cannot reach, or a dead device; asynchronous failures arrive through
  /// notify like a kernel's. Default: unsupported_op (a backend without
  /// collectives).
  virtual error collective(stream& s, const collective_launch& c);
  /// True when this device's part of `c` waits for the other members' parts
  /// on the device itself (CUDA: NCCL's kernels), so the caller need not make
  /// the part's stream wait for the producers of the other members'
  /// operands: each member's part waits for its own producers before it
  /// joins, and no member touches another's operand before that member
  /// joined. Every member of one collective answers alike. Default false:
  /// the caller orders the members (events).
  virtual bool collective_syncs_members(const collective_launch& c) const {
    (void)c;
    return false;
  }
  /// Called by the runtime when a plan whose collectives run over `members`
  /// (rank order; this device is members[0]) loads, once per group and
  /// plan, from the loading thread: a backend whose parts meet through a
  /// communicator makes it here (CUDA: the group's NCCL communicator, when
  /// its collectives can take that path), so the plan fails to load rather
  /// than its first job; `communicators` of them (collective_launch::
  /// communicator: one per job lane of the plan). Default: nothing to prepare.
  virtual error prepare_collective_group(const std::vector<device*>& members, int communicators = 1) {
    (void)members;
    (void)communicators;
    return {};
  }

  // --- in-stream collectives (collective_algo::in_stream; CUDA only) ---
  /// Enqueues on `s` the job tag under which the in-stream all-reduce parts
  /// enqueued on `s` after it (plainly or in a replayed graph) meet their
  /// peers: the job's id, the same on every member, so parts of different
  /// jobs never pair. Default: unsupported_op.
  virtual error set_collective_tag(stream& s, uint64_t job_tag);
  /// The job `job_tag` was cancelled: its in-stream parts waiting on this
  /// device for a member stop waiting (and report a fault) instead of
  /// waiting for a part that will not come. Default: nothing to stop.
  virtual void abort_collectives(uint64_t job_tag) noexcept { (void)job_tag; }
  /// An error when an in-stream part of job `job_tag` on this device gave up
  /// waiting for a member (a dead member, the job cancelled, or
  /// backend_options::cuda_collective_timeout_s passed): its result is not
  /// the sum. The runtime asks every device of a job before it completes.
  virtual error collective_fault(uint64_t job_tag) const {
    (void)job_tag;
    return {};
  }
  /// One line on what this device did last for in-stream collectives (the
  /// job tag and part its host enqueued last, the parts its GPU started and
  /// finished last), appended to a collective fault's error for every member
  /// so that the report says which member never reached the part. Empty
  /// where no part ever ran. Any thread.
  virtual std::string collective_progress() const { return {}; }

  // --- graph replay (plan_options::graph_replay; actors/stream_actor.cpp) ---
  /// True when capture() can succeed on this device (cuda, sim); false (the
  /// default: cpu) means the runtime always launches kernel by kernel.
  virtual bool captures() const noexcept { return false; }
  /// Records `ops[0..n)` (in order, buffers resolved) as one replay_graph
  /// *without running them*; nothing is enqueued on `s`, whose work so far
  /// is unaffected. An error means the capture was refused (an op that
  /// cannot be captured, a backend limit, an injected refusal): the caller
  /// launches the ops one by one instead, which reports any real error of
  /// the ops themselves. Copies in `ops` move bytes between device memory
  /// and host memory that stays where it is while the graph lives (a job
  /// arena's host window, actors/plan_memory.hpp); a backend that cannot
  /// capture a copy from that memory (CUDA: pageable memory) refuses.
  /// Default: unsupported_op.
  virtual expected<std::unique_ptr<replay_graph>> capture_segment(stream& s, const segment_op* ops, std::size_t n);
  /// capture_segment() of ops spread over `count` streams of this device
  /// (`lanes[0..count)`, segment_op::lane indexes them; lanes[0] is the one
  /// the graph is replayed on): one graph in which each lane's ops follow
  /// each other and ops of different lanes are ordered only by
  /// segment_op::after, so its branches run concurrently on the GPU for one
  /// launch (the compute lanes of a device folded into one queue,
  /// actors/launch_program.hpp). A lane's kernels use that lane's stream
  /// resources (cuBLAS workspace, attention counters): the caller keeps
  /// lanes 1.. for such graphs alone, which replay() on lanes[0] orders one
  /// after another. Errors as capture_segment(). Default: capture_segment()
  /// on lanes[0] when every op is on lane 0, else unsupported_op.
  virtual expected<std::unique_ptr<replay_graph>> capture_lanes(stream* const* lanes, int count, const segment_op* ops,
                                                               std::size_t n);
  /// capture_segment() of kernels only.
  expected<std::unique_ptr<replay_graph>> capture(stream& s, const op_launch* ops, std::size_t n);
  /// Enqueues `g` (made by this device's capture() for a stream of the same
  /// lane) on `s`: the same work, in the same order, as launching its ops one
  /// by one, for one launch. Errors as launch(). Default: unsupported_op.
  virtual error replay(stream& s, replay_graph& g);
  /// replay(s, g), then notify(s, done): the tail of a job's work on `s`,
  /// handed over in one call so that a backend may issue both from a thread
  /// of its own (cuda: the event poller's, backend_options::
  /// cuda_launch_on_poller); the stream's later work is still ordered after
  /// them. An error returned means nothing was enqueued and `done` will not
  /// be called; otherwise `done` is called exactly once, as by notify(),
  /// also with an error of the launch itself. Default: replay, then notify.
  virtual error replay_and_notify(stream& s, replay_graph& g, std::function<void(const error&)> done);
  /// Calls `done` on a backend thread once all work enqueued on `s` so far has
  /// completed: with ok, or with the error that stopped it (device_failed,
  /// op_failed for an asynchronous kernel fault). Called exactly once, also
  /// when the notification cannot be registered (a dead device, no event
  /// left, a stream of another device): `done` then gets that error. So
  /// notify itself never fails, and its caller learns of every failure
  /// through the one path.
  virtual void notify(stream& s, std::function<void(const error&)> done) = 0;
  /// Blocks until `s` is idle. Tests and shutdown only.
  virtual error synchronize(stream& s) = 0;

  // --- health ---
  /// Called (once, from a backend thread) when the device dies. After that every
  /// launch/copy fails with errc::device_failed, pending events complete and
  /// pending notify callbacks fire with that error, so nothing waits forever.
  virtual void on_fault(std::function<void(const error&)> handler) = 0;
  virtual bool alive() const noexcept = 0;
  /// Brings the device back into service: called by runtime::reset_device
  /// (from the device's actor) after the device died or the runtime
  /// quarantined it for a stalled step. A backend that can revive (cpu, sim:
  /// host_device::reset) abandons the work pending on its streams (its
  /// notifications report errc::device_failed) and is alive afterwards.
  /// Default (CUDA): nothing to do on a live device (a stalled kernel keeps
  /// its stream); a dead one stays dead and this returns errc::device_failed
  /// saying so (a sticky CUDA error ends the device's context for the
  /// process; the process itself carries on).
  virtual error reset();
  /// How many times reset() brought this device back (host devices; 0 on
  /// backends that cannot revive). A collective part belongs to the
  /// communicator of its members' generations when its job started
  /// (collective_launch::generations): a revived member is a new
  /// communicator, as NCCL's would be after the abort its death caused.
  virtual uint64_t generation() const noexcept { return 0; }
  /// Wall seconds per second of the cost model's estimates on this device
  /// (sim: sim_options::time_scale; real devices 1). The runtime's stall
  /// limit scales estimates by it.
  virtual double time_scale() const noexcept { return 1.0; }
};

using device_ptr = std::shared_ptr<device>;

/// One item of a device spec as make_devices reads it ("sim:4", "cuda:0,1").
struct device_request {
  device_kind kind = device_kind::sim;
  int count = 0;               ///< sim / cpu: how many devices
  bool all = false;            ///< cuda:all
  std::vector<int> ordinals;   ///< cuda:N[,M...]: the GPUs named
  std::size_t pos = 0;         ///< 0-based offset of the item in the spec
  int item = 0;                ///< 1-based item number (errors name it)
  std::string text;            ///< the item as written (trimmed)
};

/// Parses a device spec (the grammar below) into its items without creating
/// any device: for front ends that check a spec before they replace running
/// devices. Same errors as make_devices' grammar errors; whether CUDA GPUs
/// exist is not checked here. Pure function; no I/O.
expected<std::vector<device_request>> parse_device_spec(const std::string& spec);

/// Parses a device spec string and creates the devices, indexed in order:
///   "sim:4"        four simulated GPUs
///   "cpu:2"        two cpu devices (real compute on host threads)
///   "sim:2,cpu:1"  mixed; indices 0,1 are sim, 2 is cpu
///   "cuda:all"     every CUDA GPU;  "cuda:0,1"  GPUs 0 and 1 (a bare number
///                  after a comma continues the previous item's ordinals);
///                  "cuda:0,0"  two logical devices of GPU 0 ("cuda0",
///                  "cuda0.1": own streams and events, the GPU's memory shared)
/// Errors (errc::bad_device_spec) name the offending item and position, e.g.
/// an unknown kind, a zero count, "cuda" without a GPU or without CUDA support
/// in this build.
expected<std::vector<device_ptr>> make_devices(const std::string& spec,
                                               const backend_options& options = {});

/// True when this build has the CUDA backend and at least one GPU is usable.
bool cuda_available() noexcept;

}  // namespace ag::gpu
