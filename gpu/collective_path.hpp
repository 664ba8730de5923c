#pragma once
/// \file collective_path.hpp
/// Which implementation runs a CUDA collective part: the backend's own
/// one-shot kernel over peer-mapped buffers (gpu/cuda/collective.cuh) or
/// NCCL (gpu/cuda/nccl_group.hpp). A pure function of the part, so that the
/// rule is tested without a GPU and every member of a group, deciding on
/// its own, decides the same (NCCL hangs if one rank enqueues and another
/// does not): it reads only what every member's part carries alike (op,
/// message size, member GPUs, operand sizes), never this rank's own slice.
/// Names no CUDA type.

#include <cstdint>
#include <string>
#include <vector>

#include "graph/cost_model.hpp"
#include "graph/graph.hpp"

namespace ag::gpu {

enum class collective_path : uint8_t {
  one_shot,  ///< own kernel reading every member's operand in place
  nccl,      ///< ncclAllReduce / ncclAllGather (+ a strided copy) on the member's stream
  /// reduce_scatter / all_gather whose member pulls its peers' pieces with
  /// peer copies (the copy engines, no SMs); a reduce_scatter then sums them
  /// with one local kernel (collective_algo::copy_engine)
  copy_engine,
};
const char* to_string(collective_path p) noexcept;

/// The choice and why, for describe()/trace labels and errors.
struct collective_path_choice {
  collective_path path = collective_path::one_shot;
  std::string reason;  ///< e.g. "nccl: 1048576 bytes >= crossover 262144"
};

/// Picks the path of a CUDA collective part:
///  - copy-engine when the plan's algorithm (`algo`, the same in every
///    member's part) is collective_algo::copy_engine and `op` is a
///    reduce_scatter or all_gather;
///  - one-shot when this build has no NCCL (`nccl_built` false);
///  - one-shot when two members are logical devices of one GPU (spec
///    "cuda:0,0"): NCCL refuses a communicator with a GPU twice;
///  - one-shot when `bytes` < `nccl_min_bytes` (the measured crossover,
///    backend_options::cuda_nccl_min_bytes): small messages are latency-bound
///    and the one-shot's single kernel wins there (TP-NOTES.md);
///  - one-shot for an all_gather whose operands differ in size (uneven
///    shards: ncclAllGather takes one count per rank);
///  - else NCCL.
/// `member_gpus`: the CUDA ordinal of each member, rank order;
/// `operand_elements`: each member's operand size (all_gather), rank order.
collective_path_choice choose_cuda_collective_path(op_kind op, int64_t bytes, const std::vector<int>& member_gpus,
                                                   const std::vector<int64_t>& operand_elements,
                                                   int64_t nccl_min_bytes, bool nccl_built,
                                                   collective_algo algo = collective_algo::ring);

/// The crossover of a group: `wide` (backend_options::
/// cuda_nccl_min_bytes_wide) for three or more distinct GPUs, else `narrow`
/// (cuda_nccl_min_bytes). Like the rule above, alike on every member.
int64_t nccl_crossover_for(const std::vector<int>& member_gpus, int64_t narrow, int64_t wide);

/// True when this build links NCCL (CMake found it: ACTORGRAPH_HAVE_NCCL).
bool nccl_built() noexcept;

}  // namespace ag::gpu
