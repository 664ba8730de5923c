// Memory pass of ag::compile: weight regions and per-job arena offsets.
//
// Reuse is decided from happens-before over the plan's steps (deps, plus the
// order of steps on one compute lane, plus op order inside a split),
// never from node order: buffer B may take bytes of buffer A only when every
// access of A happens-before B's write (every one of B's writes, for the
// output of an elided concat, whose pieces its producers write in place).
// check_hazards (hazards.cpp) re-derives all of this independently.

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
  position write;                      // the first write (step order)
  std::vector<position> later_writes;  // an elided concat's other pieces' writes
  std::vector<position> reads;
  int64_t offset = -1;
};

bool before_in_step_order(position a, position b) { return std::tie(a.step, a.op) < std::tie(b.step, b.op); }

/// Happens-before over the plan's steps: the transitive closure of deps and
/// compute-lane order. Only compute lanes contribute order: copy queues may
/// be spread over several copy engines by the runtime (and collectives run
/// on their own queue), so the allocator does not bet on their FIFO order
/// (check_hazards accepts it; we just never need it).
///
/// Vector clocks over a chain decomposition, not a reachability matrix:
/// walking the steps in id (topological) order, each step extends a chain
/// whose last step happens-before it (else starts one), and clock[s][c] is
/// the last position of chain c that happens-before s (or is s). a
/// happens-before b iff clock[b][chain(a)] >= position(a). The chains number
/// about the plan's width (its lanes, copy queues and collective members at
/// once), so time and memory grow linearly with the steps where a matrix
/// grows quadratically (an 8 x 8 layout of an 80-layer model has thousands
/// of steps). The parts of one collective share their deps: their clock is
/// merged once.
class happens_before {
 public:
  explicit happens_before(const std::vector<step>& steps) {
    const std::size_t n = steps.size();
    chain_.assign(n, -1);
    pos_.assign(n, -1);
    before_self_.assign(n, -1);
    clock_.resize(n);
    std::vector<int32_t> last;                          // per chain: position of its last step
    std::map<std::tuple<int, int, int>, step_id> lane;  // compute lane -> its last step
    for (const step& st : steps) {
      const auto s = static_cast<std::size_t>(st.id);
      auto& c = clock_[s];
      const step_id twin = st.kind == step_kind::collective && !st.peers.empty()
                               ? *std::min_element(st.peers.begin(), st.peers.end())
                               : st.id;
      if (twin < st.id) {
        // The first part's clock, without the first part itself.
        const auto t = static_cast<std::size_t>(twin);
        c = clock_[t];
        c[static_cast<std::size_t>(chain_[t])] = before_self_[t];
      } else {
        auto merge = [&](step_id p) {
          const auto& pc = clock_[static_cast<std::size_t>(p)];
          if (pc.size() > c.size()) c.resize(pc.size(), -1);
          for (std::size_t k = 0; k < pc.size(); ++k) c[k] = std::max(c[k], pc[k]);
        };
        for (step_id d : st.deps) merge(d);
        if (st.kind == step_kind::compute) {
          const auto key = std::make_tuple(st.device, 0, st.lane);
          if (auto it = lane.find(key); it != lane.end()) merge(it->second);
          lane[key] = st.id;
        }
      }
      std::size_t chosen = last.size();
      for (std::size_t k = 0; k < c.size(); ++k)
        if (c[k] >= 0 && c[k] == last[k]) {
          chosen = k;
          break;
        }
      if (chosen == last.size()) last.push_back(-1);
      if (c.size() <= chosen) c.resize(chosen + 1, -1);
      before_self_[s] = c[chosen];
      pos_[s] = ++last[chosen];
      chain_[s] = static_cast<int32_t>(chosen);
      c[chosen] = pos_[s];
    }
  }
  /// a completes before b starts (same step: op order).
  bool operator()(position a, position b) const {
    if (a.step == b.step) return a.op < b.op;
    const auto& c = clock_[static_cast<std::size_t>(b.step)];
    const auto k = static_cast<std::size_t>(chain_[static_cast<std::size_t>(a.step)]);
    return k < c.size() && c[k] >= pos_[static_cast<std::size_t>(a.step)];
  }

 private:
  std::vector<int32_t> chain_, pos_, before_self_;
  std::vector<std::vector<int32_t>> clock_;
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

/// Where `other` keeps each of `p`'s weights on device `d` (by p's weight
/// slot, in slot order), when it keeps every one of them there under the
/// same name with the same values (same_values); empty when one is missing
/// or differs, or `other` shares its own weights. `other` may hold more
/// weights than p (a generator's plans that read a token from state carry
/// two small constants the others lack): p then reads its weights inside
/// other's region, at other's offsets.
std::vector<int64_t> offsets_in(const plan& p, std::size_t d, const device_memory& mine, const plan& other) {
  if (other.memory().size() <= d || other.devices().size() != p.devices().size()) return {};
  const device_memory& theirs = other.memory()[d];
  if (theirs.weights_shared) return {};
  std::vector<int64_t> at;
  for (const buffer_slot& s : mine.slots) {
    if (s.where != region::weights) continue;
    const node& n = p.source().at(s.node);
    const node_id o = other.source().find(n.name);
    if (o == no_node) return {};
    const node& on = other.source().at(o);
    if (on.op != op_kind::weight || on.type != n.type || on.dims != n.dims || !n.data || !on.data ||
        !same_values(*n.data, *on.data))
      return {};
    auto loc = other.locate(o, static_cast<int>(d));
    if (!loc || loc->where != region::weights) return {};
    at.push_back(loc->byte_offset);
  }
  return at;
}

}  // namespace

void planner::elide_concats(plan& p) {
  const graph& g = *p.graph_;
  p.elided_.assign(g.size(), 0);
  p.elided_concats_.clear();
  if (!p.options_.elide_concats) return;
  // What writes each node, on the node's device: the compute step holding
  // its op, or the collective part whose node it is (an in-stream part
  // keeps its own buffer: its kernel runs where the members meet).
  std::vector<const step*> writer(g.size(), nullptr);
  for (const step& st : p.steps_) {
    if (st.kind == step_kind::compute) {
      for (node_id id : st.ops)
        if (!is_view_op(g.at(id).op) && !is_leaf_op(g.at(id).op)) writer[static_cast<std::size_t>(id)] = &st;
    } else if (st.kind == step_kind::collective && !runs_in_stream(st)) {
      writer[static_cast<std::size_t>(st.ops.at(0))] = &st;
    }
  }
  // Nodes inside a fused kernel may never be written as nodes: not pieces.
  std::vector<char> taken(g.size(), 0);
  for (const attention_fusion& f : p.fusions_)
    for (node_id id : f.ops()) taken[static_cast<std::size_t>(id)] = 1;
  for (const projection_fusion& f : p.projection_fusions_)
    for (node_id id : f.ops) taken[static_cast<std::size_t>(id)] = 1;
  for (step& st : p.steps_) {
    if (st.kind != step_kind::compute) continue;
    for (node_id id : st.ops) {
      const node& n = g.at(id);
      if (n.op != op_kind::concat || taken[static_cast<std::size_t>(id)]) continue;
      // Each input a contiguous block of the output: every dim before the axis is 1.
      const int axis = n.attrs.axis;
      bool ok = axis >= 0 && axis < n.dims.rank();
      for (int k = 0; ok && k < axis; ++k) ok = n.dims[k] == 1;
      elided_concat e;
      e.concat = id;
      e.device = st.device;
      int64_t offset = 0;
      for (std::size_t k = 0; ok && k < n.inputs.size(); ++k) {
        const node_id in = n.inputs[k];
        const node& pn = g.at(in);
        const step* w = writer[static_cast<std::size_t>(in)];
        // Written on this device by an op or a collective part (so its own
        // storage: views and leaves have no writer), not state, a piece of
        // nothing else, at an aligned offset (kernels take 16-byte loads
        // where their pointers allow).
        ok = w && w->device == st.device && pn.op != op_kind::concat && !is_state_op(pn.op) &&
             std::find(e.pieces.begin(), e.pieces.end(), in) == e.pieces.end() &&
             !taken[static_cast<std::size_t>(in)] && pn.type == n.type && offset % plan_alignment == 0;
        if (!ok) break;
        e.pieces.push_back(in);
        e.offsets.push_back(offset);
        offset += pn.own_bytes();
      }
      if (!ok || offset != n.own_bytes()) continue;
      for (node_id in : e.pieces) taken[static_cast<std::size_t>(in)] = 1;
      taken[static_cast<std::size_t>(id)] = 1;
      p.elided_[static_cast<std::size_t>(id)] = 1;
      st.est_seconds = std::max(0.0, st.est_seconds - estimate_seconds(p.devices_[static_cast<std::size_t>(st.device)], g, n));
      p.elided_concats_.push_back(std::move(e));
    }
  }
}

void planner::elide_empty_stores(plan& p) {
  const graph& g = *p.graph_;
  for (step& st : p.steps_) {
    if (st.kind != step_kind::compute) continue;
    for (node_id id : st.ops) {
      const node& n = g.at(id);
      if (n.op != op_kind::store_rows || n.inputs.size() != 2) continue;
      const node& pos = g.at(storage_root(g, n.inputs[1]));
      const host_tensor* values = pos.op == op_kind::weight && pos.data ? pos.data->in_memory() : nullptr;
      if (!values || values->type() != dtype::i32) continue;
      const int64_t cap = n.dims[n.attrs.axis];
      const auto* at = reinterpret_cast<const int32_t*>(values->data());
      bool stores = false;
      for (int64_t k = 0; k < values->dims().numel() && !stores; ++k) stores = at[k] >= 0 && at[k] < cap;
      if (stores) continue;
      p.elided_[static_cast<std::size_t>(id)] = 1;
      st.est_seconds = std::max(0.0, st.est_seconds - estimate_seconds(p.devices_[static_cast<std::size_t>(st.device)], g, n));
    }
  }
}

error planner::plan_memory(plan& p) {
  const graph& g = *p.graph_;
  const std::size_t ndev = p.devices_.size();
  p.memory_.assign(ndev, device_memory{});
  p.slot_index_.assign(ndev, std::vector<int32_t>(g.size(), -1));
  const happens_before hb(p.steps_);

  // Accesses per device: arena buffers by storage node, and resident weights.
  std::vector<std::map<node_id, buffer>> bufs(ndev);
  std::vector<std::vector<char>> weight_used(ndev, std::vector<char>(g.size(), 0));
  // State (store_rows) on the device that computes it: its state region, one
  // copy per state slot, kept across jobs. A copy of it on another device is
  // an ordinary arena buffer there.
  std::vector<std::vector<char>> state_used(ndev, std::vector<char>(g.size(), 0));
  auto in_state_region = [&](int dev, node_id sn) {
    if (!is_state_op(g.at(sn).op) || p.placement_[static_cast<std::size_t>(sn)] != dev) return false;
    state_used[static_cast<std::size_t>(dev)][static_cast<std::size_t>(sn)] = 1;
    return true;
  };
  // An elided concat's pieces live inside its output on its device: their
  // accesses there are the output buffer's.
  std::vector<std::map<node_id, node_id>> piece_of(ndev);
  for (const elided_concat& e : p.elided_concats_)
    for (node_id piece : e.pieces) piece_of[static_cast<std::size_t>(e.device)][piece] = e.concat;
  auto buffer_node = [&](int dev, node_id sn) {
    const auto& m = piece_of[static_cast<std::size_t>(dev)];
    const auto it = m.find(sn);
    return it == m.end() ? sn : it->second;
  };
  auto read = [&](int dev, node_id id, position pos) {
    const node_id sn = buffer_node(dev, storage_root(g, id));
    if (g.at(sn).op == op_kind::weight) {
      weight_used[static_cast<std::size_t>(dev)][static_cast<std::size_t>(sn)] = 1;
      return;
    }
    if (in_state_region(dev, sn)) return;
    buffer& b = bufs[static_cast<std::size_t>(dev)][sn];
    b.node = sn;
    b.reads.push_back(pos);
  };
  auto write = [&](int dev, node_id id, position pos) {
    if (in_state_region(dev, id)) return;
    const node_id sn = buffer_node(dev, id);
    buffer& b = bufs[static_cast<std::size_t>(dev)][sn];
    b.node = sn;
    if (b.write.step < 0) {
      b.write = pos;
    } else if (before_in_step_order(pos, b.write)) {
      b.later_writes.push_back(b.write);
      b.write = pos;
    } else {
      b.later_writes.push_back(pos);
    }
  };
  for (const step& st : p.steps_) {
    switch (st.kind) {
      case step_kind::compute:
        for (std::size_t k = 0; k < st.ops.size(); ++k) {
          const node& n = g.at(st.ops[k]);
          // Views and elided concats run nothing; their readers access the
          // storage. A store of nothing keeps its state's place all the same
          // (plans sharing the state find it by name).
          if (p.runs_nothing(n.id)) {
            if (is_state_op(n.op)) (void)in_state_region(st.device, n.id);
            continue;
          }
          // Inside a fused attention chain: the kernel writes none of it
          // (plan::materialised), and the chain's last op reads its inputs
          // from outside at its place (below).
          if (!p.materialised(n.id)) continue;
          const position pos{st.id, static_cast<int>(k)};
          for (node_id i : n.inputs)
            if (p.materialised(i)) read(st.device, i, pos);
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
      case step_kind::collective: {
        // Like a peer copy's source: each operand is read where it lives, by
        // this member's step (which no later step on that device need wait
        // for), so its buffer stays busy until an ordering path says otherwise.
        const node& n = g.at(st.ops.at(0));
        for (node_id i : n.inputs) read(p.placement_[static_cast<std::size_t>(storage_root(g, i))], i, {st.id, 0});
        write(st.device, n.id, {st.id, 0});
        break;
      }
    }
  }

  // A fused chain's kernel reads q, k, v, the mask and its prologue's inputs
  // at the chain's last op (graph/fusion.hpp): they stay live until then.
  for (const attention_fusion& f : p.fusions_) {
    const step& st = p.steps_[static_cast<std::size_t>(f.step)];
    const auto at = std::find(st.ops.begin(), st.ops.end(), f.out);
    if (at == st.ops.end()) return error(errc::internal, "memory plan: a fusion's last op is not in its step");
    const position pos{st.id, static_cast<int>(at - st.ops.begin())};
    for (node_id i : f.inputs(g)) read(st.device, i, pos);
  }
  // A projection group's kernel reads the group's inputs from outside it at
  // its last op.
  for (const projection_fusion& f : p.projection_fusions_) {
    const step& st = p.steps_[static_cast<std::size_t>(f.step)];
    const auto at = std::find(st.ops.begin(), st.ops.end(), f.ops.back());
    if (at == st.ops.end()) return error(errc::internal, "memory plan: a projection group's last op is not in its step");
    const position pos{st.id, static_cast<int>(at - st.ops.begin())};
    for (node_id i : projection_group_inputs(g, f)) read(st.device, i, pos);
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
    // overlaps no placed buffer this one conflicts with. One sweep over the
    // placed buffers in offset order, asking happens-before only of those
    // that overlap the candidate range: a conflicting one moves the range
    // past its end; the sweep stops at the first gap that fits.
    // Every access of a (writes, reads) happens-before every write of b.
    const auto all_accesses_before = [&](const buffer& a, const buffer& b) {
      const auto before_all_writes = [&](position x) {
        if (!hb(x, b.write)) return false;
        for (const position& w : b.later_writes)
          if (!hb(x, w)) return false;
        return true;
      };
      if (!before_all_writes(a.write)) return false;
      for (const position& w : a.later_writes)
        if (!before_all_writes(w)) return false;
      for (const position& r : a.reads)
        if (!before_all_writes(r)) return false;
      return true;
    };
    std::vector<const buffer*> placed;  // sorted by offset
    for (buffer* b : order) {
      // Offsets and sums are checked: each buffer is at most max_tensor_bytes
      // (graph validation), but many of them side by side can pass 2^63.
      int64_t off = 0, end = 0;
      bool fits = true;
      for (const buffer* a : placed) {
        if (!(fits = checked_add(off, b->bytes, end))) break;
        if (a->offset >= end) break;
        if (a->offset + a->bytes <= off) continue;  // placed buffers' ends were checked
        if (all_accesses_before(*a, *b)) continue;
        int64_t past_a = 0;
        if (!(fits = checked_aligned(a->offset + a->bytes, past_a))) break;
        off = std::max(off, past_a);
      }
      if (fits) fits = checked_add(off, b->bytes, end) && checked_aligned(end, end) &&
                       checked_add(mem.sum_tensor_bytes, b->bytes, mem.sum_tensor_bytes);
      if (!fits) return too_big(p, d, "its activations", g.at(b->node));
      b->offset = off;
      // Placed buffers inside b's bytes can never again move a later buffer:
      // each of them overlapped b and every access of it happens-before b's
      // writes (else b would lie past it), so a later buffer that overlaps
      // one overlaps b, and either lies past b's end too or comes after b's
      // writes, and so after all of that buffer's accesses. Dropping them
      // keeps the sweep to the buffers that still matter (it was quadratic
      // in the buffers a device reuses one place for: 8 million checks for
      // an 8 x 8 plan of 80 layers).
      {
        const auto first = std::lower_bound(placed.begin(), placed.end(), off,
                                            [](const buffer* x, int64_t at) { return x->offset < at; });
        auto last = first;
        while (last != placed.end() && (*last)->offset < off + b->bytes) ++last;
        placed.erase(std::remove_if(first, last, [&](const buffer* a) { return a->bytes > 0 && a->offset + a->bytes <= off + b->bytes; }),
                     last);
      }
      placed.insert(std::upper_bound(placed.begin(), placed.end(), b,
                                     [](const buffer* x, const buffer* y) { return x->offset < y->offset; }),
                    b);
      mem.arena_bytes = std::max(mem.arena_bytes, end);
      p.slot_index_[d][static_cast<std::size_t>(b->node)] = static_cast<int32_t>(mem.slots.size());
      mem.slots.push_back(buffer_slot{b->node, static_cast<int>(d), region::arena, off, b->bytes});
    }
    // An elided concat's pieces: slots inside its output's.
    for (const elided_concat& e : p.elided_concats_) {
      if (static_cast<std::size_t>(e.device) != d) continue;
      const int32_t at = p.slot_index_[d][static_cast<std::size_t>(e.concat)];
      if (at < 0) return error(errc::internal, "memory plan: elided concat '" + g.at(e.concat).name + "' has no buffer");
      const int64_t base = mem.slots[static_cast<std::size_t>(at)].offset;
      for (std::size_t k = 0; k < e.pieces.size(); ++k) {
        p.slot_index_[d][static_cast<std::size_t>(e.pieces[k])] = static_cast<int32_t>(mem.slots.size());
        mem.slots.push_back(buffer_slot{e.pieces[k], static_cast<int>(d), region::arena, base + e.offsets[k],
                                        g.at(e.pieces[k]).own_bytes()});
      }
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
    if (const plan* w = p.options_.share_weights_with.get(); w && mem.weight_bytes > 0) {
      const std::vector<int64_t> at = offsets_in(p, d, mem, *w);
      if (!at.empty()) {
        std::size_t k = 0;
        for (buffer_slot& s : mem.slots)
          if (s.where == region::weights) s.offset = at[k++];
        mem.weight_bytes = w->memory()[d].weight_bytes;
        mem.weights_shared = true;
      }
    }
    // State: one slot's nodes packed; the device keeps state_slots slots.
    // Shared with another plan: at that plan's offsets (pin_shared_state put
    // each node on the device the other plan keeps it on).
    const plan* other = p.options_.share_state_with.get();
    if (other) mem.state_bytes = other->memory()[d].state_bytes;
    for (std::size_t id = 0; id < g.size(); ++id) {
      if (!state_used[d][id]) continue;
      const node& n = g.at(static_cast<node_id>(id));
      const int64_t bytes = n.own_bytes();
      int64_t offset = mem.state_bytes;
      if (other) {
        const node_id o = other->source().find(n.name);
        auto loc = o == no_node ? expected<tensor_location>(error(errc::invalid_argument, "not there"))
                                : other->locate(o, static_cast<int>(d));
        if (!loc || loc->where != region::state)
          return error(errc::invalid_argument, "compile: plan_options::share_state_with: state '" + n.name +
                                                   "' is not in the other plan's state on device " + std::to_string(d));
        offset = loc->byte_offset;
      } else {
        int64_t end = 0;
        if (!checked_add(mem.state_bytes, bytes, end) || !checked_aligned(end, mem.state_bytes))
          return too_big(p, d, "its state", n);
      }
      p.slot_index_[d][id] = static_cast<int32_t>(mem.slots.size());
      mem.slots.push_back(buffer_slot{static_cast<node_id>(id), static_cast<int>(d), region::state, offset, bytes});
    }
    const device_spec& spec = p.devices_[d];
    int64_t total = 0, states = 0;
    const bool overflow = !checked_mul(mem.state_bytes, int64_t{p.options_.state_slots}, states) ||
                          !checked_add(mem.arena_bytes, mem.weights_shared ? 0 : mem.weight_bytes, total) ||
                          !checked_add(total, states, total);
    if (overflow || total > spec.mem_bytes)
      return error(errc::out_of_memory,
                   "device " + std::to_string(d) + " ('" + spec.name + "') needs " +
                       (overflow ? std::string("more than 2^63") : std::to_string(total)) + " bytes (arena " +
                       std::to_string(mem.arena_bytes) + " + weights " + std::to_string(mem.weight_bytes) +
                       (mem.state_bytes > 0 ? " + state " + std::to_string(p.options_.state_slots) + " x " +
                                                  std::to_string(mem.state_bytes)
                                            : std::string()) +
                       ") but has " + std::to_string(spec.mem_bytes),
                   static_cast<int>(d));
  }
  return {};
}

}  // namespace ag
