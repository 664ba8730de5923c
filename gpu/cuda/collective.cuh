#pragma once
// The CUDA backend's collectives, one-shot over peer-mapped buffers: the
// member's kernel (or, for all_gather, its copies) reads every member's
// operand in place, through peer access (different GPUs) or directly (two
// logical devices of one GPU, spec "cuda:0,0", where NCCL cannot run). The
// caller (cuda_device::collective) makes the device current, checks the
// members can be reached and passes the member's communication stream.
// Only gpu/cuda/ includes it.

#include "gpu/cuda/kernel_args.hpp"

namespace ag::gpu::cuda {

/// Most members of one collective the kernel takes (pointers by value).
constexpr int max_collective_members = 8;

/// Enqueues the part `l` on c.stream: all_reduce / reduce_scatter as one
/// kernel summing in f32 (i32 in 64-bit integers, saturated), all_gather as
/// one strided copy per member. Errors name c.where.
error launch_collective(const launch_ctx& c, const collective_launch& l);

/// Side streams of a communication stream (cuda_stream::side_) on which a
/// copy-engine part's peer pulls fan out: pull j runs on side[j % n] after
/// `fork` (recorded on c.stream), and c.stream waits for join[j % n] before
/// what follows. n == 0: the pulls run one after another on c.stream.
struct copy_lanes {
  const cudaStream_t* side = nullptr;
  cudaEvent_t fork = nullptr;
  const cudaEvent_t* join = nullptr;
  int n = 0;
};

/// Bytes of scratch the copy-engine part `l` needs on its device: the
/// peers' pieces of a reduce_scatter ((members - 1) x this rank's output);
/// 0 for an all_gather.
int64_t copy_engine_scratch_bytes(const collective_launch& l);

/// Enqueues the copy-engine part `l` (collective_algo::copy_engine) on
/// c.stream: all_gather as one strided copy per member, straight into the
/// output (its own part first, then the peers from the next rank on, the
/// pulls fanned out over `lanes`);
/// reduce_scatter as one strided peer copy per peer (from the next rank on) of its piece of
/// this rank's slice into `scratch` (copy_engine_scratch_bytes(l), valid in
/// stream order until the part ends), then one kernel that sums them with
/// this rank's own piece in rank order, in f32 rounded once (i32 exact,
/// saturated): the one-shot's result. The copies need no SM, so the part
/// runs beside a GEMM of its device; the sum (a pass over (members + 1) /
/// members x the output's bytes) and an all_gather's own part (a copy within
/// the GPU) take SMs. AG_CUDA_CE_PROFILE set: each copy's time on stderr
/// ("ce_profile" lines; the calling thread waits for the part). Errors name
/// c.where.
error launch_copy_engine_collective(const launch_ctx& c, const collective_launch& l, void* scratch,
                                    const copy_lanes& lanes = {});

}  // namespace ag::gpu::cuda
