#pragma once
/// \file planner_internal.hpp
/// Internal to graph/ (not part of the public contract): the passes of
/// ag::compile, split over planner.cpp (placement, lanes, steps) and
/// memory_plan.cpp (arena offsets). `planner` is the friend of `plan` that
/// fills its private members.

#include <cstdint>
#include <memory>
#include <vector>

#include "graph/plan.hpp"

namespace ag {

/// Byte alignment of every arena and weight slot.
constexpr int64_t plan_alignment = 256;

inline int64_t align_up(int64_t x, int64_t a) noexcept { return (x + a - 1) / a * a; }

/// The node whose own buffer holds `id`'s data (follows view chains).
node_id storage_root(const graph& g, node_id id);

/// Pipeline placement: the compute nodes `free_nodes` (topological order)
/// grouped into units by node::layer (untagged nodes join the unit before
/// them; an untagged graph has one unit per node), split into contiguous
/// stages over devices[0..k-1] minimising the slowest stage's cost-model
/// time. Returns the stage of each entry of free_nodes.
std::vector<int> partition_pipeline(const graph& g, const std::vector<node_id>& free_nodes,
                                    const std::vector<device_spec>& devices, int k);

class planner {
 public:
  /// One planning pass. `auto_lane_cap` > 0: auto lanes (options.lanes_per_device
  /// == 0) with at most that many lanes per device, spread only where the cost
  /// model predicts a gain; ag::compile calls it again with a smaller cap when
  /// the lanes cost more arena than max_lane_memory_ratio allows.
  static expected<std::shared_ptr<const plan>> compile(std::shared_ptr<const graph> g,
                                                       std::vector<device_spec> devices,
                                                       plan_options options, int auto_lane_cap);
  /// Memory pass: fills p.memory_ and p.slot_index_ from the steps
  /// (memory_plan.cpp). Errors: out_of_memory, internal.
  static error plan_memory(plan& p);
  /// Picks the concats whose inputs their producers can write in place
  /// (plan_options::elide_concats; elided_concat says which), fills
  /// p.elided_concats_ and p.elided_, and takes their cost out of their
  /// steps' estimates. Runs after the fusions, before plan_memory.
  static void elide_concats(plan& p);
  /// Marks in p.elided_ the store_rows ops that store nothing: their
  /// positions a constant (an in-memory weight) with every value outside
  /// [0, capacity), as a read of state that another job or plan keeps
  /// (graph/models/transformer.cpp's token_state_in). They run no kernel;
  /// their readers read the state slot as earlier jobs left it. Runs after
  /// elide_concats.
  static void elide_empty_stores(plan& p);
  /// Fills step::peers of collective steps: the steps whose nodes share op
  /// and operands, in rank order. Error: two parts claiming one rank.
  static error group_collectives(plan& p);
  /// plan_options::order_steps_by_model (graph/schedule.cpp): renumbers
  /// p.steps_ (ids, deps, consumers, peers) in the order a simulation of one
  /// job with the searched order of collectives starts them. Runs after
  /// group_collectives and the collectives' estimates, before small copies
  /// are inlined and lane_seq is set.
  static void order_steps(plan& p);
};

/// Dense bitset rows: one row of `words` 64-bit words per element.
class bit_matrix {
 public:
  bit_matrix() = default;
  bit_matrix(std::size_t rows, std::size_t cols)
      : words_((cols + 63) / 64), bits_(rows * words_, 0) {}
  /// All zero, `rows` x `cols`, keeping the memory held (one matrix reused
  /// for many shapes touches its pages once).
  void reset(std::size_t rows, std::size_t cols) {
    words_ = (cols + 63) / 64;
    bits_.assign(rows * words_, 0);
  }
  bool test(std::size_t r, std::size_t c) const noexcept {
    return (bits_[r * words_ + c / 64] >> (c % 64)) & 1u;
  }
  void set(std::size_t r, std::size_t c) noexcept { bits_[r * words_ + c / 64] |= uint64_t{1} << (c % 64); }
  /// row r |= row s
  void merge(std::size_t r, std::size_t s) noexcept {
    for (std::size_t w = 0; w < words_; ++w) bits_[r * words_ + w] |= bits_[s * words_ + w];
  }
  /// Set bits of row r.
  std::size_t count_row(std::size_t r) const noexcept {
    std::size_t n = 0;
    for (std::size_t w = 0; w < words_; ++w) n += static_cast<std::size_t>(__builtin_popcountll(bits_[r * words_ + w]));
    return n;
  }
  /// into &= row r (`into` holds a row's words).
  void and_row_into(std::size_t r, std::vector<uint64_t>& into) const noexcept {
    for (std::size_t w = 0; w < words_ && w < into.size(); ++w) into[w] &= bits_[r * words_ + w];
  }

 private:
  std::size_t words_ = 0;
  std::vector<uint64_t> bits_;
};

}  // namespace ag
