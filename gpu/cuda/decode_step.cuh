#pragma once
// A whole LLaMA-family decode step as one persistent kernel (host launcher):
// the record the lowering makes of a single-device decode step
// (gpu::op_launch::fusion::decode_step, actors/launch_program.cpp).
#include <vector>

#include "gpu/cuda/in_stream.cuh"
#include "gpu/cuda/kernel_args.hpp"

namespace ag::gpu::cuda {

/// Bytes of the stream's decode-step workspace (cuda_stream.hpp): the
/// tagged hand-overs between phases, the attention's partial results, the
/// counters and the launch epoch, for every shape decode_step_misfit()
/// accepts on a GPU of up to decode_step_max_blocks SMs. Zeroed once; the
/// kernel leaves its counters zero and the epoch one higher.
inline constexpr int decode_step_max_blocks = 256;
std::size_t decode_step_workspace_bytes() noexcept;

/// Runs the decode step `p` describes with the record's operands (`inputs`
/// in the order gpu::op_launch::decode_step_params documents; `out` the
/// logits f32 [vocab] or, with p.argmax, the greedy token i32) as one
/// cooperative kernel of one block an SM (c.sm_count), on c.stream:
///   - every GEMV (q/k/v, o, gate and up, down, the head) streams its
///     weights into shared memory with bulk copies, each warp its own ring
///     of chunks, as far ahead as the ring reaches and across phases (the
///     weights never depend on x);
///   - the rms_norms are taken into the staging of x, the residual adds
///     into the o and down products' stores, silu(gate) * up into gate and
///     up's (a block takes the same rows of both);
///   - attention: up to 16 blocks a kv head each take a span of the cache's
///     rows (the mask added, as the graph's chain does), rotate q and the
///     new key (neox rope at positions[0]), store the new key and value at
///     cache_positions[0] (-1: none) and use them in place of that row; the
///     last block of a head combines the spans;
///   - the head's blocks keep their best logit; the last block picks the
///     token (the first maximum, as the argmax op does).
/// Phases hand values on through the workspace, each stored with its
/// phase's tag and the launch's epoch in one 8-byte store, and readers spin
/// on the tag: no grid barrier. Values are rounded to bf16 where the
/// unfused ops round them (q, k, v, the attention's output, each product,
/// the residual after each add, silu(gate) * up), so the step computes what
/// the graph's kernels do up to the order of sums.
/// The workspace is the stream's own (kernels of one stream run in order:
/// its counters and epoch need no more); the tags hold the epoch's low 24
/// bits, so a value left unread for 2^24 launches of the stream could pass
/// for a current one (each launch writes every value it reads first). A
/// cooperative launch: the grid's blocks are resident together, which the
/// spinning hand-overs need; another kernel spinning on the GPU beside it
/// for work behind it would wait for it (today only single-device plans
/// are fused, so nothing of the same job spins beside it).
/// Errors (nothing launched): operands of the wrong count, dtype or shape
/// (errc::internal: the lowering checked them), a GPU on which one block an
/// SM cannot be resident, the workspace missing or too small.
/// A tensor-parallel step's rank (decode_step_params::tp_degree > 1): what
/// its kernel needs of the other ranks and of its device's in-stream memory
/// (in_stream.cuh), every array in rank order.
struct decode_step_tp {
  void* exchange[in_stream_members_max] = {};            ///< each rank's decode_exchange (its device's memory)
  const unsigned* dead[in_stream_members_max] = {};       ///< each rank's device's death word (host-mapped)
  int slot[in_stream_members_max] = {};                   ///< each rank's device index
  const unsigned long long* tag_word = nullptr;           ///< this stream's collective tag word
  const unsigned long long* aborted = nullptr;            ///< this device's abort ring
  unsigned long long* faults = nullptr;                   ///< this device's fault ring and detail
  double timeout_s = 0;                                   ///< cuda_collective_timeout_s
  /// Ranks of the step whose kernels run on this GPU (logical devices):
  /// each takes that share of its SMs, so that all are resident together.
  int gpu_share = 1;
};

/// Bytes of a device's tensor-parallel exchange (in_stream_area::
/// decode_exchange): three buffers of every rank's partial rows and the
/// ranks' best logits (decode_step.cu, exchange_layout). Zeroed once.
std::size_t decode_exchange_bytes() noexcept;

/// `tp`: null for a single-device step; for a rank of a tensor-parallel one
/// (p.tp_degree > 1, p.argmax), its peers. The ranks' kernels wait for each
/// other's values on the devices: every rank's record must be launched
/// (each on its own device's stream, after the job's collective tag), and
/// their kernels must be resident together (distinct GPUs, or gpu_share).
/// A rank that never comes makes the others give up after
/// tp->timeout_s (or at once when its device died or the job was
/// cancelled): they note the job in their devices' fault rings
/// (cuda_device::collective_fault) and end; their output is then void.
error launch_decode_step(const launch_ctx& c, const op_launch::decode_step_params& p,
                         const std::vector<tensor_arg>& inputs, const tensor_arg& out, void* workspace,
                         std::size_t workspace_bytes, const decode_step_tp* tp = nullptr);

}  // namespace ag::gpu::cuda
