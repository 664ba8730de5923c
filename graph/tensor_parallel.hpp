#pragma once
/// \file tensor_parallel.hpp
/// The tensor-parallel rewrite: the user's graph becomes a per-device graph.
///
/// ag::compile runs it before placement when plan_options::tensor_parallel > 1.
/// Devices form `stages` groups of `degree` devices (pipeline x tensor); the
/// pipeline planner assigns each node of the user's graph to a stage, and the
/// rewrite gives every tensor a *split state* over its stage's group:
///  - replicated: every rank holds the whole tensor;
///  - sharded: rank k holds the range [begin[k], end[k]) of the row-major
///    merge of dims [axis, axis2] (usually one dim: axis == axis2; a merged
///    range appears where a reshape regroups a sharded dim, e.g. query heads
///    regrouped by kv head under grouped-query attention) and everything of
///    the other dims; the ranges follow each other in rank order;
///  - partial: every rank holds a tensor of the full shape and the value is
///    their sum.
/// States follow per-op rules (see tensor_parallel.cpp and
/// docs/ARCHITECTURE.md); an op without a rule for its inputs' states gets
/// them gathered (all_gather, all_reduce for a partial) and runs replicated,
/// so any graph plans at any degree. The result is an ordinary, valid graph:
/// every compute node is pinned to one device and has its shard's shape;
/// sharded weights are weight nodes whose source reads only that device's
/// slice of the original (make_slice_weight); collectives are all_reduce /
/// all_gather / reduce_scatter nodes. Its reference evaluation equals the
/// user's graph's: that is how the rewrite is tested.
///
/// Pure function of its arguments; no threads.

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "graph/cost_model.hpp"
#include "graph/graph.hpp"

namespace ag {

struct plan_options;

/// Split state of one tensor over its group (see the file comment).
struct split_state {
  enum class kind : uint8_t { replicated = 0, sharded = 1, partial = 2 };
  kind k = kind::replicated;
  int axis = -1, axis2 = -1;          ///< sharded: merged dims [axis, axis2]
  std::vector<int64_t> begin, end;    ///< sharded: per rank, range of the merged index

  bool sharded() const noexcept { return k == kind::sharded; }
  bool operator==(const split_state&) const = default;
  /// "replicated", "partial", "sharded dim 0 [0, 512) [512, 1024)",
  /// "sharded dims 1..2 [0, 24) [24, 48)".
  std::string to_string() const;
};

/// One collective of the rewritten graph: its parts, one per rank.
struct tp_collective {
  op_kind op = op_kind::all_reduce;
  std::string name;                 ///< the tensor it converts, e.g. "l3.attn.o_proj"
  int group = 0;                    ///< stage
  int layer = -1;                   ///< layer tag of that tensor
  std::vector<node_id> parts;       ///< nodes of the rewritten graph, in rank order
  int64_t bytes = 0;                ///< message size (see step::bytes)
};

/// What the rewrite decided, for describe(), tests and the runtime.
struct tensor_parallel_info {
  /// The graph the rewrite was given: the user's, with its norm weights
  /// folded (plan_options::fold_norm_weights; the same node ids and names).
  /// plan::original() is the user's own.
  std::shared_ptr<const graph> original;
  /// The graph the states refer to: the user's, with fused matmuls that are
  /// only read through disjoint column slices split into one per slice (the
  /// same object as `original` when there were none).
  std::shared_ptr<const graph> analysed;
  int degree = 1;                            ///< devices per group
  int stages = 1;                            ///< groups (pipeline stages)
  std::vector<double> ratios;                ///< share of each rank (sums to 1)
  std::vector<std::vector<int>> devices;     ///< [stage][rank] -> device index
  /// Per node of `analysed` (index = node id): its stage (-1 for leaves and
  /// pruned nodes), its split state (for a weight: how its devices hold it,
  /// sharded when only slices of it are read), and the rewritten graph's
  /// node holding rank k's piece in that state ([id][k]; empty for pruned
  /// nodes and for a row-parallel matmul computed only in chunks).
  std::vector<int> stage_of;
  std::vector<split_state> state;
  std::vector<std::vector<node_id>> local;
  std::vector<tp_collective> collectives;    ///< in creation order
  /// Row-parallel matmuls split into chunks for overlap: (name, chunks).
  std::vector<std::pair<std::string, int>> chunked;
  /// The names in `chunked` whose chunks are parts of the batch (dim 0), each
  /// with the whole region before it (plan_options::tp_batch_chunks), not
  /// runs of rows.
  std::vector<std::string> chunked_by_batch;
  /// Nodes of the rewritten graph that hand rows over between chunks: the
  /// ops that make a chunk's all-gather operand, or a piece of an output,
  /// from an earlier chunk's reduce-scatter (the residual add and norm of
  /// those rows, a copy into a buffer). With plan_options::hand_over_lane
  /// the planner runs them on compute lane 1, beside the chunk lane 0
  /// computes. Ascending ids.
  std::vector<node_id> hand_over;
};

/// The rewritten graph and what was decided.
struct tp_rewrite {
  std::shared_ptr<const graph> rewritten;
  std::shared_ptr<const tensor_parallel_info> info;
};

/// Rewrites `g` for options.tensor_parallel devices per stage over `devices`
/// (see the file comment). Errors (invalid_argument, naming what is wrong):
/// a degree < 1 or larger than the devices, stages x degree more than the
/// devices, shard ratios of the wrong count or not finite and > 0, a
/// dimension that must be split by heads (a reshape cuts it into units of a
/// head) with fewer heads than ranks and no replicated alternative (names
/// the tensor, the dimension and the head size), a node pinned to a device
/// outside every group.
expected<tp_rewrite> rewrite_tensor_parallel(std::shared_ptr<const graph> g, const std::vector<device_spec>& devices,
                                             const plan_options& options);

/// Splits `total` units over ranks by `ratios` (proportions): every rank
/// gets at least one unit, the counts sum to `total` and follow the ratios
/// as closely as whole units allow (largest remainder). Empty when total <
/// ratios.size().
std::vector<int64_t> apportion(int64_t total, const std::vector<double>& ratios);

}  // namespace ag
