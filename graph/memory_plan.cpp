// Memory pass of ag::compile: weight regions and per-job arena offsets.
//
// Reuse is decided from happens-before over the plan's steps (deps, plus the
// order of steps on one compute lane, plus op order inside a split),
// never from node order: buffer B may take bytes of buffer A only when every
// access of A happens-before B's (single) write. check_hazards (hazards.cpp)
// re-derives all of this independently.

#include <algorithm>
#include <map>
#include <string>
#include <tuple>

#include "graph/planner_internal.hpp"

namespace ag {

namespace {

struct position {
  step_id step = -1;
  int op = 0;  // index into the step's ops (0 for copies)
};

struct buffer {
  node_id node = no_node;
  int64_t bytes = 0;
  position write;
  std::vector<position> reads;
  int64_t offset = -1;
};

class happens_before {
 public:
  explicit happens_before(const std::vector<step>& steps) : anc_(steps.size(), steps.size()) {
    std::map<std::tuple<int, int, int>, step_id> last;  // queue -> last step seen
    for (const step& st : steps) {
      const auto i = static_cast<std::size_t>(st.id);
      auto pred = [&](step_id p) {
        anc_.merge(i, static_cast<std::size_t>(p));
        anc_.set(i, static_cast<std::size_t>(p));
      };
      for (step_id d : st.deps) pred(d);
      // Only compute lanes contribute order: copy queues may be spread over
      // several copy engines by the runtime, so the allocator does not bet on
      // their FIFO order (check_hazards accepts it; we just never need it).
      if (st.kind != step_kind::compute) continue;
      const auto key = std::make_tuple(st.device, static_cast<int>(st.kind), st.lane);
      if (auto it = last.find(key); it != last.end()) pred(it->second);
      last[key] = st.id;
    }
  }
  /// a completes before b starts (same step: op order).
  bool operator()(position a, position b) const {
    if (a.step == b.step) return a.op < b.op;
    return anc_.test(static_cast<std::size_t>(b.step), static_cast<std::size_t>(a.step));
  }

 private:
  bit_matrix anc_;  // anc_(s, p): p happens-before s
};

/// out = align_up(x, plan_alignment); false when that overflows.
bool checked_aligned(int64_t x, int64_t& out) {
  int64_t up = 0;
  if (!checked_add(x, plan_alignment - 1, up)) return false;
  out = up / plan_alignment * plan_alignment;
  return true;
}

error too_big(const plan& p, std::size_t d, const char* what, const node& n) {
  const device_spec& spec = p.devices()[d];
  return error(errc::out_of_memory, "device " + std::to_string(d) + " ('" + spec.name + "'): " + what +
                                        " need more than 2^63 bytes (reached at " + to_string(n.op) + " '" +
                                        n.name + "' " + to_string(n.type) + " " + n.dims.to_string() +
                                        "); it has " + std::to_string(spec.mem_bytes));
}

}  // namespace

error planner::plan_memory(plan& p) {
  const graph& g = *p.graph_;
  const std::size_t ndev = p.devices_.size();
  p.memory_.assign(ndev, device_memory{});
  p.slot_index_.assign(ndev, std::vector<int32_t>(g.size(), -1));
  const happens_before hb(p.steps_);

  // Accesses per device: arena buffers by storage node, and resident weights.
  std::vector<std::map<node_id, buffer>> bufs(ndev);
  std::vector<std::vector<char>> weight_used(ndev, std::vector<char>(g.size(), 0));
  auto read = [&](int dev, node_id id, position pos) {
    const node_id sn = storage_root(g, id);
    if (g.at(sn).op == op_kind::weight) {
      weight_used[static_cast<std::size_t>(dev)][static_cast<std::size_t>(sn)] = 1;
      return;
    }
    buffer& b = bufs[static_cast<std::size_t>(dev)][sn];
    b.node = sn;
    b.reads.push_back(pos);
  };
  auto write = [&](int dev, node_id sn, position pos) {
    buffer& b = bufs[static_cast<std::size_t>(dev)][sn];
    b.node = sn;
    b.write = pos;
  };
  for (const step& st : p.steps_) {
    switch (st.kind) {
      case step_kind::compute:
        for (std::size_t k = 0; k < st.ops.size(); ++k) {
          const node& n = g.at(st.ops[k]);
          if (is_view_op(n.op)) continue;  // views run nothing; their readers access the storage
          const position pos{st.id, static_cast<int>(k)};
          for (node_id i : n.inputs) read(st.device, i, pos);
          write(st.device, n.id, pos);
        }
        break;
      case step_kind::copy_h2d:
        write(st.device, st.ops.at(0), {st.id, 0});
        break;
      case step_kind::copy_peer:
        read(st.src_device, st.ops.at(0), {st.id, 0});
        write(st.device, st.ops.at(0), {st.id, 0});
        break;
      case step_kind::copy_d2h:
        read(st.device, st.ops.at(0), {st.id, 0});
        break;
    }
  }

  for (std::size_t d = 0; d < ndev; ++d) {
    device_memory& mem = p.memory_[d];
    std::vector<buffer*> order;
    for (auto& [id, b] : bufs[d]) {
      if (b.write.step < 0)
        return error(errc::internal, "memory plan: '" + g.at(id).name + "' is read on device " + std::to_string(d) +
                                         " but never written there");
      b.bytes = g.at(id).own_bytes();
      order.push_back(&b);
    }
    std::sort(order.begin(), order.end(), [](const buffer* a, const buffer* b) {
      return std::tie(a->write.step, a->write.op, a->node) < std::tie(b->write.step, b->write.op, b->node);
    });
    // Greedy first fit in first-write order: lowest aligned offset that
    // overlaps no placed buffer this one conflicts with.
    std::vector<const buffer*> placed;
    std::vector<std::pair<int64_t, int64_t>> busy;
    for (buffer* b : order) {
      busy.clear();
      for (const buffer* a : placed) {
        bool a_before_b = hb(a->write, b->write);
        for (std::size_t r = 0; a_before_b && r < a->reads.size(); ++r) a_before_b = hb(a->reads[r], b->write);
        if (!a_before_b) busy.emplace_back(a->offset, a->offset + a->bytes);
      }
      std::sort(busy.begin(), busy.end());
      // Offsets and sums are checked: each buffer is at most max_tensor_bytes
      // (graph validation), but many of them side by side can pass 2^63.
      int64_t off = 0, end = 0;
      bool fits = true;
      for (const auto& [lo, hi] : busy) {
        if (!(fits = checked_add(off, b->bytes, end))) break;
        if (end <= lo) break;
        if (hi > off && !(fits = checked_aligned(hi, off))) break;
      }
      if (fits) fits = checked_add(off, b->bytes, end) && checked_aligned(end, end) &&
                       checked_add(mem.sum_tensor_bytes, b->bytes, mem.sum_tensor_bytes);
      if (!fits) return too_big(p, d, "its activations", g.at(b->node));
      b->offset = off;
      placed.push_back(b);
      mem.arena_bytes = std::max(mem.arena_bytes, end);
      p.slot_index_[d][static_cast<std::size_t>(b->node)] = static_cast<int32_t>(mem.slots.size());
      mem.slots.push_back(buffer_slot{b->node, static_cast<int>(d), region::arena, off, b->bytes});
    }
    // Weights: one slot each, packed, live for the plan's lifetime.
    for (std::size_t id = 0; id < g.size(); ++id) {
      if (!weight_used[d][id]) continue;
      const int64_t bytes = g.at(static_cast<node_id>(id)).own_bytes();
      p.slot_index_[d][id] = static_cast<int32_t>(mem.slots.size());
      mem.slots.push_back(buffer_slot{static_cast<node_id>(id), static_cast<int>(d), region::weights, mem.weight_bytes, bytes});
      int64_t end = 0;
      if (!checked_add(mem.weight_bytes, bytes, end) || !checked_aligned(end, mem.weight_bytes))
        return too_big(p, d, "its weights", g.at(static_cast<node_id>(id)));
    }
    const device_spec& spec = p.devices_[d];
    int64_t total = 0;
    const bool overflow = !checked_add(mem.arena_bytes, mem.weight_bytes, total);
    if (overflow || total > spec.mem_bytes)
      return error(errc::out_of_memory,
                   "device " + std::to_string(d) + " ('" + spec.name + "') needs " +
                       (overflow ? std::string("more than 2^63") : std::to_string(total)) + " bytes (arena " +
                       std::to_string(mem.arena_bytes) + " + weights " + std::to_string(mem.weight_bytes) +
                       ") but has " + std::to_string(spec.mem_bytes));
  }
  return {};
}

}  // namespace ag
