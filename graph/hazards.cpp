// check_hazards: an independent proof of a plan's memory plan. It uses only
// the plan's public view (steps, deps, lane_seq, slots, graph) and shares no
// code or data with the allocator in memory_plan.cpp, so a bug there cannot
// hide itself here.

#include <algorithm>
#include <map>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "graph/plan.hpp"

namespace ag {

namespace {

struct access_pos {
  step_id step;
  int op;
};

struct accesses {
  std::vector<access_pos> writes;
  std::vector<access_pos> reads;
};

node_id root_of(const graph& g, node_id id) {
  for (std::size_t guard = 0; guard <= g.size(); ++guard) {
    const node& n = g.at(id);
    if (n.storage == no_node || n.storage == id) return id;
    id = n.storage;
  }
  return id;
}

std::string where(const plan& p, int d) {
  return "device " + std::to_string(d) + " ('" + p.devices()[static_cast<std::size_t>(d)].name + "')";
}

// A collective step: one collective node; its peers are the steps of the
// same collective (same op and operands), in rank order, each listing the
// same peers.
error check_collective(const plan& p, const step& s) {
  const graph& g = p.source();
  const node& nd = g.at(s.ops[0]);
  auto bad = [&](const std::string& what) {
    return error(errc::internal, "hazard check: collective step #" + std::to_string(s.id) + " ('" + nd.name + "'): " + what);
  };
  if (!is_collective_op(nd.op)) return bad("its node is a " + std::string(to_string(nd.op)) + ", not a collective");
  if (s.peers.empty() || std::find(s.peers.begin(), s.peers.end(), s.id) == s.peers.end())
    return bad("is not among its own peers");
  for (std::size_t k = 0; k < s.peers.size(); ++k) {
    const step_id q = s.peers[k];
    if (q < 0 || static_cast<std::size_t>(q) >= p.steps().size()) return bad("peer out of range");
    const step& ps = p.at(q);
    if (ps.kind != step_kind::collective || ps.ops.size() != 1 || ps.peers != s.peers)
      return bad("peer #" + std::to_string(q) + " does not list the same peers");
    const node& pn = g.at(ps.ops[0]);
    if (pn.op != nd.op || pn.inputs != nd.inputs) return bad("peer #" + std::to_string(q) + " is another collective");
    if (k > 0 && g.at(p.at(s.peers[k - 1]).ops[0]).attrs.rank >= pn.attrs.rank) return bad("peers are not in rank order");
  }
  return {};
}

}  // namespace

error check_hazards(const plan& p) {
  const graph& g = p.source();
  const auto& steps = p.steps();
  const std::size_t n = steps.size();
  const int ndev = static_cast<int>(p.devices().size());
  auto step_err = [&](const step& s, const std::string& what) {
    return error(errc::internal, "hazard check: step #" + std::to_string(s.id) + " (" + to_string(s.kind) + "): " + what);
  };

  // 1. Structure, and the happens-before edges: deps plus queue order.
  std::vector<std::vector<step_id>> preds(n);
  std::map<std::tuple<int, int, int>, std::vector<std::pair<int, step_id>>> queues;
  for (std::size_t i = 0; i < n; ++i) {
    const step& s = steps[i];
    if (s.id != static_cast<step_id>(i)) return step_err(s, "id is not its index " + std::to_string(i));
    if (s.device < 0 || s.device >= ndev) return step_err(s, "device out of range");
    if (s.kind == step_kind::copy_peer && (s.src_device < 0 || s.src_device >= ndev))
      return step_err(s, "peer copy source device out of range");
    if (s.kind != step_kind::compute && s.ops.size() != 1) return step_err(s, "a copy must name exactly one node");
    for (node_id id : s.ops)
      if (id < 0 || static_cast<std::size_t>(id) >= g.size()) return step_err(s, "op id out of range");
    if (s.kind == step_kind::collective) {
      if (auto e = check_collective(p, s)) return e;
    }
    for (step_id d : s.deps) {
      if (d < 0 || static_cast<std::size_t>(d) >= n) return step_err(s, "dep out of range");
      preds[i].push_back(d);
    }
    // In-stream collective parts and inlined copies queue on compute lanes (plan.hpp, step).
    const bool compute_lane = on_compute_lane(s);
    queues[{s.device, static_cast<int>(compute_lane ? step_kind::compute : s.kind), compute_lane ? s.lane : -1}]
        .emplace_back(s.lane_seq, s.id);
  }
  for (auto& [key, q] : queues) {
    std::sort(q.begin(), q.end());
    for (std::size_t k = 1; k < q.size(); ++k) {
      if (q[k].first == q[k - 1].first)
        return step_err(steps[static_cast<std::size_t>(q[k].second)],
                        "shares lane_seq " + std::to_string(q[k].first) + " with step #" + std::to_string(q[k - 1].second));
      preds[static_cast<std::size_t>(q[k].second)].push_back(q[k - 1].second);
    }
  }
  // Topological order of the combined relation (a cycle would deadlock the runtime).
  std::vector<int> indeg(n, 0);
  std::vector<std::vector<step_id>> succ(n);
  for (std::size_t i = 0; i < n; ++i)
    for (step_id pr : preds[i]) {
      succ[static_cast<std::size_t>(pr)].push_back(static_cast<step_id>(i));
      ++indeg[i];
    }
  std::vector<step_id> topo;
  for (std::size_t i = 0; i < n; ++i)
    if (indeg[i] == 0) topo.push_back(static_cast<step_id>(i));
  for (std::size_t k = 0; k < topo.size(); ++k)
    for (step_id y : succ[static_cast<std::size_t>(topo[k])])
      if (--indeg[static_cast<std::size_t>(y)] == 0) topo.push_back(y);
  if (topo.size() != n)
    return error(errc::internal, "hazard check: deps and lane order form a cycle (the plan would deadlock)");
  // Collectives: every device issues them in one global order (a collective
  // is ordered by its first part's id), which NCCL and in-stream parts need
  // of each group.
  for (const auto& [key, q] : queues) {
    step_id prev = -1;
    for (const auto& [seq, id] : q) {
      if (steps[static_cast<std::size_t>(id)].kind != step_kind::collective) continue;
      const step_id first = *std::min_element(steps[static_cast<std::size_t>(id)].peers.begin(),
                                              steps[static_cast<std::size_t>(id)].peers.end());
      if (first < prev)
        return step_err(steps[static_cast<std::size_t>(id)],
                        "device " + std::to_string(std::get<0>(key)) +
                            " issues collectives in another order than its peers do");
      prev = first;
    }
  }
  const std::size_t words = (n + 63) / 64;
  std::vector<std::vector<uint64_t>> before(n, std::vector<uint64_t>(words, 0));  // before[s]: steps hb s
  for (step_id s : topo)
    for (step_id pr : preds[static_cast<std::size_t>(s)]) {
      auto& row = before[static_cast<std::size_t>(s)];
      const auto& prow = before[static_cast<std::size_t>(pr)];
      for (std::size_t w = 0; w < words; ++w) row[w] |= prow[w];
      row[static_cast<std::size_t>(pr) / 64] |= uint64_t{1} << (static_cast<std::size_t>(pr) % 64);
    }
  auto hb = [&](access_pos a, access_pos b) {
    if (a.step == b.step) return a.op < b.op;
    return ((before[static_cast<std::size_t>(b.step)][static_cast<std::size_t>(a.step) / 64] >>
             (static_cast<std::size_t>(a.step) % 64)) & 1u) != 0;
  };

  // 2. Accesses per (device, storage node).
  std::vector<std::map<node_id, accesses>> acc(static_cast<std::size_t>(ndev));
  for (const step& s : steps) {
    auto dev = static_cast<std::size_t>(s.device);
    if (s.kind == step_kind::compute) {
      for (std::size_t k = 0; k < s.ops.size(); ++k) {
        const node& nd = g.at(s.ops[k]);
        if (p.runs_nothing(nd.id)) continue;  // a view, or an elided concat: it copies nothing
        if (!p.materialised(nd.id)) continue;  // inside a fused attention chain: never written
        for (node_id in : nd.inputs)
          if (p.materialised(in)) acc[dev][root_of(g, in)].reads.push_back({s.id, static_cast<int>(k)});
        acc[dev][nd.id].writes.push_back({s.id, static_cast<int>(k)});
      }
      // A fused chain's kernel reads q, k, v, the mask and its prologue's
      // inputs at the chain's last op (graph/fusion.hpp).
      for (const attention_fusion& f : p.fusions()) {
        if (f.step != s.id) continue;
        const auto at = std::find(s.ops.begin(), s.ops.end(), f.out);
        if (at == s.ops.end()) return step_err(s, "a fusion's last op is not in its step");
        const int k = static_cast<int>(at - s.ops.begin());
        for (node_id in : f.inputs(g)) acc[dev][root_of(g, in)].reads.push_back({s.id, k});
      }
      // A projection group's kernel reads the group's inputs from outside it
      // at its last op, and writes every output there (a shared-input
      // group's earlier outputs move their one write; gated and residual
      // groups write only the last op's). A norm prologue's output, and a
      // roped matmul's, are never written: their writes stay at their ops,
      // before the reads of the ops after them in the group.
      for (const projection_fusion& f : p.projection_fusions()) {
        if (f.step != s.id) continue;
        const auto at = std::find(s.ops.begin(), s.ops.end(), f.ops.back());
        if (at == s.ops.end()) return step_err(s, "a projection group's last op is not in its step");
        const int k = static_cast<int>(at - s.ops.begin());
        for (node_id in : projection_group_inputs(g, f)) acc[dev][root_of(g, in)].reads.push_back({s.id, k});
        if (f.kind == projection_kind::shared_input)
          for (node_id out : projection_group_outputs(g, f))
            for (access_pos& w : acc[dev][out].writes)
              if (w.step == s.id) w.op = k;
      }
    } else if (s.kind == step_kind::copy_h2d) {
      acc[dev][root_of(g, s.ops[0])].writes.push_back({s.id, 0});
    } else if (s.kind == step_kind::copy_d2h) {
      acc[dev][root_of(g, s.ops[0])].reads.push_back({s.id, 0});
    } else if (s.kind == step_kind::collective) {
      // Every member's operand, read on the device its storage was placed on.
      const node& nd = g.at(s.ops[0]);
      for (node_id in : nd.inputs) {
        const node_id r = root_of(g, in);
        const int home = p.placement()[static_cast<std::size_t>(r)];
        if (home < 0 || home >= ndev)
          return step_err(s, "operand '" + g.at(r).name + "' has no device");
        acc[static_cast<std::size_t>(home)][r].reads.push_back({s.id, 0});
      }
      acc[dev][nd.id].writes.push_back({s.id, 0});
    } else {
      acc[static_cast<std::size_t>(s.src_device)][root_of(g, s.ops[0])].reads.push_back({s.id, 0});
      acc[dev][root_of(g, s.ops[0])].writes.push_back({s.id, 0});
    }
  }

  // 3. Slots: inside their region, one per node and region.
  if (p.memory().size() != static_cast<std::size_t>(ndev))
    return error(errc::internal, "hazard check: memory plan has " + std::to_string(p.memory().size()) +
                                     " devices, plan has " + std::to_string(ndev));
  for (int d = 0; d < ndev; ++d) {
    const device_memory& mem = p.memory()[static_cast<std::size_t>(d)];
    std::map<std::pair<node_id, int>, const buffer_slot*> slot_of;
    std::vector<const buffer_slot*> arena, weights, states;
    const char* region_name[] = {"arena", "weight region", "state region"};
    for (const buffer_slot& sl : mem.slots) {
      if (static_cast<int>(sl.where) > static_cast<int>(region::state))
        return error(errc::internal, "hazard check: a slot on " + where(p, d) + " names an unknown region");
      const int64_t limit = sl.where == region::arena     ? mem.arena_bytes
                            : sl.where == region::weights ? mem.weight_bytes
                                                          : mem.state_bytes;
      if (sl.node < 0 || static_cast<std::size_t>(sl.node) >= g.size())
        return error(errc::internal, "hazard check: slot names node " + std::to_string(sl.node) + " on " + where(p, d));
      if (sl.offset < 0 || sl.bytes < 0 || sl.offset + sl.bytes > limit)
        return error(errc::internal, "hazard check: slot of '" + g.at(sl.node).name + "' [" + std::to_string(sl.offset) +
                                         ", " + std::to_string(sl.offset + sl.bytes) + ") lies outside the " +
                                         region_name[static_cast<int>(sl.where)] + " of " +
                                         std::to_string(limit) + " bytes on " + where(p, d));
      if (!slot_of.emplace(std::make_pair(sl.node, static_cast<int>(sl.where)), &sl).second)
        return error(errc::internal, "hazard check: '" + g.at(sl.node).name + "' has two slots on " + where(p, d));
      (sl.where == region::arena ? arena : sl.where == region::weights ? weights : states).push_back(&sl);
    }
    // 3b. An elided concat's pieces lie in its output's slot at their
    // offsets; the output is written by its pieces' writes only, each read
    // of it comes after all of them, and for overlaps with other buffers
    // the output stands for its pieces (their accesses merged into it).
    std::map<node_id, accesses> merged;
    std::set<const buffer_slot*> piece_slots;
    for (const elided_concat& e : p.elided_concats()) {
      if (e.device != d) continue;
      const node& cn = g.at(e.concat);
      const auto cs = slot_of.find({e.concat, static_cast<int>(region::arena)});
      if (cs == slot_of.end())
        return error(errc::internal, "hazard check: elided concat '" + cn.name + "' has no slot on " + where(p, d));
      if (e.pieces.size() != e.offsets.size() || e.pieces.size() != cn.inputs.size())
        return error(errc::internal, "hazard check: elided concat '" + cn.name + "' does not list each input once");
      accesses& m = merged[e.concat];
      const auto own = acc[static_cast<std::size_t>(d)].find(e.concat);
      if (own != acc[static_cast<std::size_t>(d)].end()) {
        if (!own->second.writes.empty())
          return error(errc::internal, "hazard check: elided concat '" + cn.name + "' is written on " + where(p, d));
        m.reads = own->second.reads;
      }
      const std::vector<access_pos> concat_reads = m.reads;
      for (std::size_t k = 0; k < e.pieces.size(); ++k) {
        const node& pn = g.at(e.pieces[k]);
        const auto ps = slot_of.find({e.pieces[k], static_cast<int>(region::arena)});
        if (e.pieces[k] != cn.inputs[k] || ps == slot_of.end() ||
            ps->second->offset != cs->second->offset + e.offsets[k] ||
            e.offsets[k] + pn.own_bytes() > cs->second->bytes)
          return error(errc::internal, "hazard check: piece '" + pn.name + "' of elided concat '" + cn.name +
                                           "' is not at its place in the concat's slot on " + where(p, d));
        piece_slots.insert(ps->second);
        const auto pa = acc[static_cast<std::size_t>(d)].find(e.pieces[k]);
        if (pa == acc[static_cast<std::size_t>(d)].end() || pa->second.writes.size() != 1)
          return error(errc::internal, "hazard check: piece '" + pn.name + "' of elided concat '" + cn.name +
                                           "' is not written once on " + where(p, d));
        for (const access_pos& r : concat_reads)
          if (!hb(pa->second.writes[0], r))
            return error(errc::internal, "hazard check: elided concat '" + cn.name + "' is read by step #" +
                                             std::to_string(r.step) + " on " + where(p, d) + " before its piece '" +
                                             pn.name + "' is written");
        m.writes.push_back(pa->second.writes[0]);
        m.reads.insert(m.reads.end(), pa->second.reads.begin(), pa->second.reads.end());
      }
    }
    // 4. Every accessed buffer has a slot big enough, and one writer.
    for (const auto& [id, a] : acc[static_cast<std::size_t>(d)]) {
      if (merged.count(id)) continue;  // an elided concat: checked above
      const node& nd = g.at(id);
      const bool is_weight = nd.op == op_kind::weight;
      // State lives in the state region of the device that computes it.
      const bool is_state = is_state_op(nd.op) && p.placement()[static_cast<std::size_t>(id)] == d;
      auto it = slot_of.find({id, static_cast<int>(is_weight ? region::weights : is_state ? region::state : region::arena)});
      if (it == slot_of.end())
        return error(errc::internal, "hazard check: '" + nd.name + "' is accessed on " + where(p, d) + " but has no slot");
      if (it->second->bytes < nd.own_bytes())
        return error(errc::internal, "hazard check: slot of '" + nd.name + "' on " + where(p, d) + " holds " +
                                         std::to_string(it->second->bytes) + " of " + std::to_string(nd.own_bytes()) + " bytes");
      if (is_weight) {
        if (!a.writes.empty()) return error(errc::internal, "hazard check: weight '" + nd.name + "' is written on " + where(p, d));
        continue;
      }
      // State that no op of this plan writes (its store_rows stores
      // nothing: planner::elide_empty_stores) is read as earlier jobs left
      // the slot; jobs of one slot never overlap (the slot table).
      if (is_state && a.writes.empty()) continue;
      if (a.writes.size() != 1)
        return error(errc::internal, "hazard check: '" + nd.name + "' is written " + std::to_string(a.writes.size()) +
                                         " times on " + where(p, d) + " (expected once)");
      for (const access_pos& r : a.reads)
        if (!hb(a.writes[0], r))
          return error(errc::internal, "hazard check: '" + nd.name + "' is read by step #" + std::to_string(r.step) +
                                           " on " + where(p, d) + " before its write is ordered before it");
    }
    // 5. Overlapping buffers must be ordered one after the other.
    auto overlapping = [](const std::vector<const buffer_slot*>& v, auto&& fn) -> error {
      std::vector<const buffer_slot*> s(v);
      std::sort(s.begin(), s.end(), [](auto* a, auto* b) { return a->offset < b->offset; });
      for (std::size_t i = 0; i < s.size(); ++i)
        for (std::size_t j = i + 1; j < s.size() && s[j]->offset < s[i]->offset + s[i]->bytes; ++j)
          if (s[i]->bytes > 0 && s[j]->bytes > 0)
            if (auto e = fn(*s[i], *s[j])) return e;
      return {};
    };
    if (auto e = overlapping(weights, [&](const buffer_slot& a, const buffer_slot& b) {
          return error(errc::internal, "hazard check: weights '" + g.at(a.node).name + "' and '" + g.at(b.node).name +
                                           "' overlap on " + where(p, d));
        }))
      return e;
    if (auto e = overlapping(states, [&](const buffer_slot& a, const buffer_slot& b) {
          return error(errc::internal, "hazard check: states '" + g.at(a.node).name + "' and '" + g.at(b.node).name +
                                           "' overlap on " + where(p, d));
        }))
      return e;
    const auto& dacc = acc[static_cast<std::size_t>(d)];
    auto all_before = [&](const accesses& a, const accesses& b) {
      for (const access_pos& w : b.writes) {
        for (const access_pos& x : a.writes) if (!hb(x, w)) return false;
        for (const access_pos& x : a.reads) if (!hb(x, w)) return false;
      }
      return true;
    };
    // Pieces are checked through their concat's slot and merged accesses.
    std::vector<const buffer_slot*> arena_buffers;
    for (const buffer_slot* sl : arena)
      if (!piece_slots.count(sl)) arena_buffers.push_back(sl);
    const auto accesses_of = [&](node_id id) -> const accesses* {
      if (const auto m = merged.find(id); m != merged.end()) return &m->second;
      const auto a = dacc.find(id);
      return a == dacc.end() ? nullptr : &a->second;
    };
    if (auto e = overlapping(arena_buffers, [&](const buffer_slot& a, const buffer_slot& b) -> error {
          const accesses* ia = accesses_of(a.node);
          const accesses* ib = accesses_of(b.node);
          if (!ia || !ib) return {};  // a slot nobody touches cannot race
          if (all_before(*ia, *ib) || all_before(*ib, *ia)) return {};
          return error(errc::internal,
                       "hazard check: '" + g.at(a.node).name + "' [" + std::to_string(a.offset) + ", " +
                           std::to_string(a.offset + a.bytes) + ") and '" + g.at(b.node).name + "' [" +
                           std::to_string(b.offset) + ", " + std::to_string(b.offset + b.bytes) + ") share arena bytes on " +
                           where(p, d) + " but neither's accesses all happen-before the other's write");
        }))
      return e;
  }
  return {};
}

}  // namespace ag
