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

}  // namespace ag::gpu::cuda
