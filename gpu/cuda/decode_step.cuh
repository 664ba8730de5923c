#pragma once
// A whole LLaMA-family decode step as one persistent kernel (host launcher):
// the record the lowering makes of a single-device decode step
// (gpu::op_launch::fusion::decode_step, actors/launch_program.cpp).
#include <vector>

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
error launch_decode_step(const launch_ctx& c, const op_launch::decode_step_params& p,
                         const std::vector<tensor_arg>& inputs, const tensor_arg& out, void* workspace,
                         std::size_t workspace_bytes);

}  // namespace ag::gpu::cuda
