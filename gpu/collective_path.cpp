#include "gpu/collective_path.hpp"

#include <algorithm>

namespace ag::gpu {

const char* to_string(collective_path p) noexcept {
  switch (p) {
    case collective_path::one_shot: return "one-shot";
    case collective_path::nccl: return "nccl";
    case collective_path::copy_engine: return "copy-engine";
  }
  return "unknown";
}

collective_path_choice choose_cuda_collective_path(op_kind op, int64_t bytes, const std::vector<int>& member_gpus,
                                                   const std::vector<int64_t>& operand_elements,
                                                   int64_t nccl_min_bytes, bool built, collective_algo algo) {
  if (algo == collective_algo::copy_engine && (op == op_kind::reduce_scatter || op == op_kind::all_gather))
    return {collective_path::copy_engine,
            "copy-engine: the plan's algorithm for " + std::to_string(bytes) + " bytes (peer copies, no SMs)"};
  const auto one_shot = [](std::string why) { return collective_path_choice{collective_path::one_shot, "one-shot: " + why}; };
  if (!built) return one_shot("this build has no NCCL");
  std::vector<int> sorted = member_gpus;
  std::sort(sorted.begin(), sorted.end());
  if (auto d = std::adjacent_find(sorted.begin(), sorted.end()); d != sorted.end())
    return one_shot("two members share GPU " + std::to_string(*d) + " (NCCL refuses a GPU twice)");
  if (bytes < nccl_min_bytes)
    return one_shot(std::to_string(bytes) + " bytes < crossover " + std::to_string(nccl_min_bytes));
  if (op == op_kind::all_gather && !operand_elements.empty() &&
      std::any_of(operand_elements.begin(), operand_elements.end(),
                  [&](int64_t e) { return e != operand_elements.front(); }))
    return one_shot("uneven all_gather operands (ncclAllGather takes one count)");
  return {collective_path::nccl,
          "nccl: " + std::to_string(bytes) + " bytes >= crossover " + std::to_string(nccl_min_bytes)};
}

int64_t nccl_crossover_for(const std::vector<int>& member_gpus, int64_t narrow, int64_t wide) {
  // Distinct GPUs counted in place (a group has a handful of members): no
  // copy to sort on every collective's enqueue.
  int distinct = 0;
  for (std::size_t i = 0; i < member_gpus.size() && distinct < 3; ++i)
    if (std::find(member_gpus.begin(), member_gpus.begin() + static_cast<std::ptrdiff_t>(i), member_gpus[i]) ==
        member_gpus.begin() + static_cast<std::ptrdiff_t>(i))
      ++distinct;
  return distinct >= 3 ? wide : narrow;
}

bool nccl_built() noexcept {
#ifdef ACTORGRAPH_HAVE_NCCL
  return true;
#else
  return false;
#endif
}

}  // namespace ag::gpu
