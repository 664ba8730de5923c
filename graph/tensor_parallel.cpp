// The tensor-parallel rewrite (see tensor_parallel.hpp and
// docs/ARCHITECTURE.md, "Tensor parallelism").
//
// Passes, on the user's graph:
//  1. split fused matmuls whose output is only read through disjoint column
//     slices (GPT-2's c_attn into q, k, v) into one matmul per slice;
//  2. stages: pipeline placement of the compute nodes over the groups;
//  3. granules: a backward pass finds, per tensor dimension, the units a
//     shard must respect downstream (a reshape into heads of 64 wants
//     multiples of 64; regrouping query heads by kv head wants whole groups
//     first) and whether the dimension is only read as the right-hand,
//     batch side of a matmul (kv heads, which may stay replicated);
//  4. states: a forward pass applies the per-op rules, emitting each node's
//     local nodes per rank and the collectives and slices that convert
//     states where a rule needs another one;
//  5. outputs are brought whole onto rank 0 of their stage.

#include "graph/tensor_parallel.hpp"

#include <algorithm>
#include <array>
#include <cmath>
#include <functional>
#include <map>
#include <numeric>
#include <optional>
#include <set>
#include <sstream>
#include <unordered_map>
#include <unordered_set>

#include "graph/plan.hpp"
#include "graph/planner_internal.hpp"
#include "graph/validate_util.hpp"

namespace ag {

std::string split_state::to_string() const {
  switch (k) {
    case kind::replicated: return "replicated";
    case kind::partial: return "partial";
    case kind::sharded: break;
  }
  std::string s = axis == axis2 ? "sharded dim " + std::to_string(axis)
                                : "sharded dims " + std::to_string(axis) + ".." + std::to_string(axis2);
  for (std::size_t r = 0; r < begin.size(); ++r)
    s += " [" + std::to_string(begin[r]) + ", " + std::to_string(end[r]) + ")";
  return s;
}

std::vector<int64_t> apportion(int64_t total, const std::vector<double>& ratios) {
  const std::size_t n = ratios.size();
  if (n == 0 || total < static_cast<int64_t>(n)) return {};
  const double sum = std::accumulate(ratios.begin(), ratios.end(), 0.0);
  std::vector<double> ideal(n);
  std::vector<int64_t> c(n);
  int64_t have = 0;
  for (std::size_t k = 0; k < n; ++k) {
    ideal[k] = static_cast<double>(total) * ratios[k] / sum;
    c[k] = std::max<int64_t>(1, static_cast<int64_t>(std::floor(ideal[k])));
    have += c[k];
  }
  // Largest remainder, ties to the lower rank (deterministic: equal inputs
  // give equal splits, which is what keeps q and kv heads aligned).
  while (have > total) {
    std::size_t best = n;
    for (std::size_t k = 0; k < n; ++k)
      if (c[k] > 1 && (best == n || c[k] - ideal[k] > c[best] - ideal[best])) best = k;
    --c[best];
    --have;
  }
  while (have < total) {
    std::size_t best = 0;
    for (std::size_t k = 1; k < n; ++k)
      if (ideal[k] - static_cast<double>(c[k]) > ideal[best] - static_cast<double>(c[best])) best = k;
    ++c[best];
    ++have;
  }
  return c;
}

namespace {

using skind = split_state::kind;
using detail::label;

/// An internal bug or an impossible layout found deep inside the pass; caught
/// at the library boundary (rewrite_tensor_parallel) and returned as an error.
struct tp_failure {
  error e;
};

[[noreturn]] void fail(errc c, std::string msg) { throw tp_failure{error(c, std::move(msg))}; }

int64_t prod(const shape& d, int from, int to) {  // dims [from, to)
  int64_t p = 1;
  for (int i = from; i < to; ++i) p *= d[i];
  return p;
}

// ------------------------------------------------------------- state math --

struct box {
  std::array<int64_t, max_rank> lo{}, hi{};
};

/// The box that range [b, e) of the row-major merge of dims [a0, a1] covers,
/// or false if it is not a box (it would cross an outer index partially).
bool range_box(const shape& dims, int a0, int a1, int64_t b, int64_t e, box& out) {
  for (int d = 0; d < dims.rank(); ++d) {
    out.lo[static_cast<std::size_t>(d)] = 0;
    out.hi[static_cast<std::size_t>(d)] = dims[d];
  }
  if (b >= e) return false;
  for (int d = a0; d <= a1; ++d) {
    const int64_t inner = prod(dims, d + 1, a1 + 1);
    const auto i = static_cast<std::size_t>(d);
    if (b / inner == (e - 1) / inner) {  // within one index of dim d
      out.lo[i] = b / inner;
      out.hi[i] = out.lo[i] + 1;
      b -= out.lo[i] * inner;
      e -= out.lo[i] * inner;
      if (d == a1) return true;
      continue;
    }
    if (b % inner != 0 || e % inner != 0) return false;
    out.lo[i] = b / inner;
    out.hi[i] = e / inner;
    return true;  // inner dims full
  }
  return true;
}

box rank_box(const shape& dims, const split_state& s, int k) {
  box bx;
  if (!s.sharded()) {
    range_box(dims, 0, dims.rank() - 1, 0, dims.numel(), bx);
    return bx;
  }
  if (!range_box(dims, s.axis, s.axis2, s.begin[static_cast<std::size_t>(k)], s.end[static_cast<std::size_t>(k)], bx))
    fail(errc::internal, "tensor parallel: a shard is not a box");
  return bx;
}

shape local_dims(const shape& full, const split_state& s, int k) {
  if (!s.sharded()) return full;
  const box bx = rank_box(full, s, k);
  shape d = full;
  for (int i = 0; i < full.rank(); ++i) d[i] = bx.hi[static_cast<std::size_t>(i)] - bx.lo[static_cast<std::size_t>(i)];
  return d;
}

/// Shrinks the merged group to its smallest form and checks that the ranges
/// partition it in rank order with every rank's piece a non-empty box.
bool normalise(split_state& s, const shape& dims) {
  if (!s.sharded()) return true;
  if (s.axis < 0 || s.axis2 >= dims.rank() || s.axis > s.axis2) return false;
  auto all_divisible = [&](int64_t q) {
    for (std::size_t r = 0; r < s.begin.size(); ++r)
      if (s.begin[r] % q != 0 || s.end[r] % q != 0) return false;
    return true;
  };
  while (s.axis2 > s.axis && all_divisible(dims[s.axis2])) {
    const int64_t q = dims[s.axis2];
    for (std::size_t r = 0; r < s.begin.size(); ++r) {
      s.begin[r] /= q;
      s.end[r] /= q;
    }
    --s.axis2;
  }
  while (s.axis < s.axis2 && dims[s.axis] == 1) ++s.axis;
  const int64_t merged = prod(dims, s.axis, s.axis2 + 1);
  int64_t at = 0;
  for (std::size_t r = 0; r < s.begin.size(); ++r) {
    if (s.begin[r] != at || s.end[r] <= s.begin[r]) return false;
    box bx;
    if (!range_box(dims, s.axis, s.axis2, s.begin[r], s.end[r], bx)) return false;
    at = s.end[r];
  }
  return at == merged;
}

/// A sharded state of a tensor of dims `from` seen through a reshape to `to`.
std::optional<split_state> map_reshape(const split_state& s, const shape& from, const shape& to) {
  if (!s.sharded()) return s;
  const int64_t outer = prod(from, 0, s.axis);
  int j0 = -1;
  for (int j = 0; j < to.rank(); ++j)
    if (prod(to, 0, j) == outer) {
      j0 = j;
      break;
    }
  if (j0 < 0) return std::nullopt;
  // Widen the group to the right until its inner boundary is one of `to`'s too.
  for (int b = s.axis2; b < from.rank(); ++b) {
    const int64_t inner = prod(from, b + 1, from.rank());
    const int64_t widen = prod(from, s.axis2 + 1, b + 1);
    for (int j1 = j0; j1 < to.rank(); ++j1) {
      if (prod(to, j1 + 1, to.rank()) != inner) continue;
      split_state r = s;
      r.axis = j0;
      r.axis2 = j1;
      for (std::size_t k = 0; k < r.begin.size(); ++k) {
        r.begin[k] *= widen;
        r.end[k] *= widen;
      }
      if (normalise(r, to)) return r;
      return std::nullopt;
    }
  }
  return std::nullopt;
}

/// A sharded state carried through a permutation (out dim i = in dim perm[i]).
std::optional<split_state> map_permute(const split_state& s, const std::array<int, max_rank>& perm, int rank) {
  if (!s.sharded()) return s;
  std::array<int, max_rank> pos{};
  for (int i = 0; i < rank; ++i) pos[static_cast<std::size_t>(perm[static_cast<std::size_t>(i)])] = i;
  for (int d = s.axis; d < s.axis2; ++d)
    if (pos[static_cast<std::size_t>(d + 1)] != pos[static_cast<std::size_t>(d)] + 1) return std::nullopt;
  split_state r = s;
  r.axis = pos[static_cast<std::size_t>(s.axis)];
  r.axis2 = pos[static_cast<std::size_t>(s.axis2)];
  return r;
}

/// A state moved by `offset` dims (broadcast alignment); nullopt when a group
/// dim falls outside `to` or has another size there.
std::optional<split_state> shift_state(const split_state& s, const shape& from, const shape& to, int offset) {
  if (!s.sharded()) return s;
  split_state r = s;
  r.axis += offset;
  r.axis2 += offset;
  if (r.axis < 0 || r.axis2 >= to.rank()) return std::nullopt;
  for (int d = s.axis; d <= s.axis2; ++d)
    if (from[d] != to[d + offset]) return std::nullopt;
  return r;
}

std::vector<int64_t> merge_chain(std::vector<int64_t> a, const std::vector<int64_t>& b) {
  a.insert(a.end(), b.begin(), b.end());
  std::sort(a.begin(), a.end(), std::greater<>());
  a.erase(std::unique(a.begin(), a.end()), a.end());
  std::vector<int64_t> r;
  for (int64_t g : a)
    if (g > 1 && (r.empty() || r.back() % g == 0)) r.push_back(g);
  return r;
}

/// Refinement of two shapes of equal numel into common factors; for each dim
/// of each shape, the [first, last] factor indices. False if the shapes'
/// boundaries interleave without a common refinement (e.g. [4, 6] vs [6, 4]).
struct refinement {
  std::vector<int64_t> f;
  std::array<std::pair<int, int>, max_rank> of_a{}, of_b{};
};

bool refine(const shape& a, const shape& b, refinement& r) {
  std::vector<int64_t> cuts;
  for (int i = 0; i <= a.rank(); ++i) cuts.push_back(prod(a, 0, i));
  for (int i = 0; i <= b.rank(); ++i) cuts.push_back(prod(b, 0, i));
  std::sort(cuts.begin(), cuts.end());
  cuts.erase(std::unique(cuts.begin(), cuts.end()), cuts.end());
  for (std::size_t i = 1; i < cuts.size(); ++i) {
    if (cuts[i] % cuts[i - 1] != 0) return false;
    r.f.push_back(cuts[i] / cuts[i - 1]);
  }
  auto spans = [&](const shape& s, std::array<std::pair<int, int>, max_rank>& out) {
    for (int i = 0; i < s.rank(); ++i) {
      const int64_t lo = prod(s, 0, i), hi = prod(s, 0, i + 1);
      int first = -1, last = -1;
      for (std::size_t k = 1; k < cuts.size(); ++k) {
        if (cuts[k - 1] >= lo && cuts[k] <= hi && cuts[k] > cuts[k - 1]) {
          if (first < 0) first = static_cast<int>(k - 1);
          last = static_cast<int>(k - 1);
        }
      }
      out[static_cast<std::size_t>(i)] = {first, last};  // (-1, -1) for a dim of size 1
    }
  };
  spans(a, r.of_a);
  spans(b, r.of_b);
  return true;
}

// ------------------------------------------------------------ the passes --

bool is_elementwise_unary(op_kind k) {
  return k == op_kind::scale || k == op_kind::gelu || k == op_kind::silu;
}

/// Pass 1: fused matmuls read only through disjoint column slices become one
/// matmul per slice over a slice of the weight (see the file comment). The
/// chain between matmul and slices may hold elementwise ops (whose second
/// operand, if any, broadcasts along the columns) and one reshape that splits
/// the columns into [P, Q]; slices then cut P.
expected<graph> split_fused_matmuls(const graph& g, const std::vector<char>& needed, int& splits) {
  splits = 0;
  struct plan_one {
    node_id mm;
    std::vector<node_id> chain;     // elementwise ops after mm
    node_id reshape = no_node;
    std::vector<node_id> slices;
    std::vector<std::pair<int64_t, int64_t>> cols;
  };
  std::vector<plan_one> found;
  std::vector<char> is_output(g.size(), 0);
  for (node_id o : g.outputs()) is_output[static_cast<std::size_t>(o)] = 1;
  auto live_consumers = [&](node_id id) {
    std::vector<node_id> c;
    for (node_id x : g.consumers(id))
      if (needed[static_cast<std::size_t>(x)]) c.push_back(x);
    return c;
  };
  for (const node& m : g.nodes()) {
    if (!needed[static_cast<std::size_t>(m.id)] || m.op != op_kind::matmul) continue;
    const node& w = g.at(m.inputs[1]);
    if (w.op != op_kind::weight || w.dims.rank() != 2 || m.dims.rank() < 2) continue;
    const int64_t N = m.dims[-1];
    plan_one p;
    p.mm = m.id;
    node_id cur = m.id;
    bool ok = true;
    for (;;) {
      if (is_output[static_cast<std::size_t>(cur)]) { ok = false; break; }
      auto cs = live_consumers(cur);
      if (cs.size() != 1) break;
      const node& c = g.at(cs[0]);
      bool step = false;
      if (is_elementwise_unary(c.op)) step = true;
      if ((c.op == op_kind::add || c.op == op_kind::mul) && c.inputs[0] == cur && c.inputs[1] != cur) {
        const node& o = g.at(c.inputs[1]);
        step = o.dims[-1] == N && o.dims.numel() == N;  // [N] or [1, .., N]
      }
      if (!step) break;
      p.chain.push_back(c.id);
      cur = c.id;
    }
    if (!ok) continue;
    auto cs = live_consumers(cur);
    int slice_axis = g.at(cur).dims.rank() - 1;
    int64_t unit = 1;  // columns per index of the sliced axis
    if (cs.size() == 1 && g.at(cs[0]).op == op_kind::reshape) {
      const node& r = g.at(cs[0]);
      const node& src = g.at(cur);
      bool lead = r.dims.rank() == src.dims.rank() + 1;
      for (int d = 0; lead && d < src.dims.rank() - 1; ++d) lead = r.dims[d] == src.dims[d];
      if (!lead || is_output[static_cast<std::size_t>(r.id)]) continue;
      p.reshape = r.id;
      slice_axis = r.dims.rank() - 2;
      unit = r.dims[-1];
      cs = live_consumers(r.id);
    }
    if (cs.size() < 2) continue;
    for (node_id c : cs) {
      const node& sl = g.at(c);
      if (sl.op != op_kind::slice || sl.attrs.axis != slice_axis) { ok = false; break; }
      p.slices.push_back(c);
      p.cols.emplace_back(sl.attrs.begin * unit, sl.attrs.end * unit);
    }
    if (!ok) continue;
    auto sorted = p.cols;
    std::sort(sorted.begin(), sorted.end());
    for (std::size_t i = 1; i < sorted.size() && ok; ++i) ok = sorted[i].first >= sorted[i - 1].second;
    if (ok) found.push_back(std::move(p));
  }
  if (found.empty()) return graph(g);

  // Rebuild the node list: the new per-slice nodes go where the chain's last
  // node was; the old chain and slices go away; readers of a slice read its
  // replacement, which takes the slice's name.
  std::vector<node> nodes;
  nodes.reserve(g.size() + found.size() * 8);
  std::vector<char> dropped(g.size(), 0);
  std::unordered_map<node_id, node_id> replace;
  std::unordered_map<node_id, const plan_one*> emit_at;
  node_id next_id = static_cast<node_id>(g.size());
  for (const plan_one& p : found) {
    dropped[static_cast<std::size_t>(p.mm)] = 1;
    for (node_id c : p.chain) dropped[static_cast<std::size_t>(c)] = 1;
    if (p.reshape != no_node) dropped[static_cast<std::size_t>(p.reshape)] = 1;
    for (node_id sl : p.slices) dropped[static_cast<std::size_t>(sl)] = 1;
    emit_at[p.reshape != no_node ? p.reshape : (p.chain.empty() ? p.mm : p.chain.back())] = &p;
  }
  std::unordered_set<std::string> names;
  for (const node& n : g.nodes()) names.insert(n.name);
  auto fresh = [&](std::string base) {
    std::string s = base;
    for (int i = 2; names.count(s); ++i) s = base + "#" + std::to_string(i);
    names.insert(s);
    return s;
  };
  auto col_slice_of = [&](node_id operand, int64_t c0, int64_t c1, int layer) -> node_id {
    const node& o = g.at(operand);
    if (o.op == op_kind::weight) {
      auto src = make_slice_weight(o.data, o.dims.rank() - 1, c0, c1);
      if (!src) fail(errc::internal, src.err().message);
      node w;
      w.id = next_id++;
      w.op = op_kind::weight;
      w.name = fresh(o.name + "[" + std::to_string(c0) + ":" + std::to_string(c1) + ")");
      w.data = *src;
      w.layer = o.layer;
      nodes.push_back(std::move(w));
      return nodes.back().id;
    }
    node v;
    v.id = next_id++;
    v.op = op_kind::slice;
    v.name = fresh(o.name + "[" + std::to_string(c0) + ":" + std::to_string(c1) + ")");
    v.inputs = {operand};
    v.attrs.axis = o.dims.rank() - 1;
    v.attrs.begin = c0;
    v.attrs.end = c1;
    v.layer = layer;
    nodes.push_back(std::move(v));
    return nodes.back().id;
  };
  for (const node& n : g.nodes()) {
    if (!dropped[static_cast<std::size_t>(n.id)]) nodes.push_back(n);
    auto it = emit_at.find(n.id);
    if (it == emit_at.end()) continue;
    const plan_one& p = *it->second;
    const node& m = g.at(p.mm);
    const node& w = g.at(m.inputs[1]);
    const int wdim = m.attrs.trans_b ? 0 : 1;
    for (std::size_t j = 0; j < p.slices.size(); ++j) {
      const auto [c0, c1] = p.cols[j];
      const node& sl = g.at(p.slices[j]);
      auto src = make_slice_weight(w.data, wdim, c0, c1);
      if (!src) return src.err();
      node wj;
      wj.id = next_id++;
      wj.op = op_kind::weight;
      wj.name = fresh(w.name + "[" + std::to_string(c0) + ":" + std::to_string(c1) + ")");
      wj.data = *src;
      wj.layer = w.layer;
      nodes.push_back(wj);
      node mj = m;
      mj.id = next_id++;
      mj.name = fresh(m.name + "[" + std::to_string(c0) + ":" + std::to_string(c1) + ")");
      mj.inputs = {m.inputs[0], wj.id};
      nodes.push_back(mj);
      node_id cur = mj.id;
      for (node_id cid : p.chain) {
        const node& c = g.at(cid);
        node cj = c;
        cj.id = next_id++;
        cj.name = fresh(c.name + "[" + std::to_string(c0) + ":" + std::to_string(c1) + ")");
        cj.inputs = {cur};
        if (c.inputs.size() > 1) cj.inputs.push_back(col_slice_of(c.inputs[1], c0, c1, c.layer));
        nodes.push_back(cj);
        cur = cj.id;
      }
      if (p.reshape != no_node) {
        const node& r = g.at(p.reshape);
        node rj = r;
        rj.id = next_id++;
        rj.name = "";
        rj.inputs = {cur};
        rj.dims[-2] = (c1 - c0) / rj.dims[-1];
        nodes.push_back(rj);
        cur = rj.id;
      }
      // The replacement takes the slice's name (its readers and errors name it).
      nodes.back().name = sl.name;
      replace[sl.id] = cur;
    }
    ++splits;
  }
  for (node& n : nodes)
    for (node_id& i : n.inputs)
      if (auto it = replace.find(i); it != replace.end()) i = it->second;
  std::vector<node_id> outputs = g.outputs();
  for (node_id& o : outputs)
    if (auto it = replace.find(o); it != replace.end()) o = it->second;
  return graph::from_nodes(std::move(nodes), g.inputs(), std::move(outputs));
}

// The forward pass and everything it needs.
class rewriter {
 public:
  rewriter(const graph& g, const std::vector<device_spec>& devices, const plan_options& opt, int degree, int stages,
           std::vector<double> ratios)
      : g_(g), devices_(devices), opt_(opt), t_(degree), stages_(stages), ratios_(std::move(ratios)) {
    groups_.assign(static_cast<std::size_t>(stages_), std::vector<int>(static_cast<std::size_t>(t_)));
    for (int s = 0; s < stages_; ++s)
      for (int k = 0; k < t_; ++k) groups_[static_cast<std::size_t>(s)][static_cast<std::size_t>(k)] = s * t_ + k;
  }

  tp_rewrite run(std::shared_ptr<const graph> original, std::shared_ptr<const graph> analysed) {
    prune();
    assign_stages();
    granules();
    info_.resize(g_.size());
    for (const node& n : g_.nodes()) names_.insert(n.name);
    // Every job input keeps its place in the job interface, needed or not.
    for (node_id i : g_.inputs()) {
      const node& n = g_.at(i);
      node x;
      x.op = op_kind::input;
      x.name = n.name;
      x.type = n.type;
      x.dims = n.dims;
      x.layer = n.layer;
      x.pinned_device = pin_of_leaf(n);
      const node_id id = emit(std::move(x), false);
      inputs_.push_back(id);
      info_[static_cast<std::size_t>(i)].loc.assign(static_cast<std::size_t>(t_), id);
    }
    for (const node& n : g_.nodes()) {
      if (!needed_[static_cast<std::size_t>(n.id)] || n.op == op_kind::input) continue;
      apply(n);
    }
    for (node_id o : g_.outputs()) outputs_.push_back(whole_output(o));

    out_size_ = out_.size();
    auto rew = graph::from_nodes(std::move(out_), inputs_, outputs_);
    if (!rew) fail(errc::internal, "tensor parallel rewrite built an invalid graph: " + rew.err().to_string());
    rewritten_ = std::make_shared<const graph>(std::move(*rew));
    auto info = std::make_shared<tensor_parallel_info>();
    info->original = std::move(original);
    info->analysed = std::move(analysed);
    info->degree = t_;
    info->stages = stages_;
    const double sum = std::accumulate(ratios_.begin(), ratios_.end(), 0.0);
    for (double r : ratios_) info->ratios.push_back(r / sum);
    info->devices = groups_;
    info->stage_of = stage_;
    info->state.resize(g_.size());
    info->local.resize(g_.size());
    for (std::size_t i = 0; i < g_.size(); ++i) {
      info->state[i] = info_[i].st;
      info->local[i] = info_[i].loc;  // empty for a matmul computed in chunks only
    }
    // A weight's state is how its devices hold it: the slices made of it
    // along one dim (a partition in rank order), or replicated when its whole
    // node is read.
    {
      std::vector<char> read(out_size_, 0);
      const graph& rg = *rewritten_;
      for (const node& x : rg.nodes())
        for (node_id in : x.inputs) read[static_cast<std::size_t>(in)] = 1;
      for (node_id o : rg.outputs()) read[static_cast<std::size_t>(o)] = 1;
      std::map<node_id, std::vector<std::tuple<int, int64_t, int64_t, node_id>>> slices;
      for (const auto& [key, id] : weight_slices_)
        if (read[static_cast<std::size_t>(id)])
          slices[std::get<0>(key)].emplace_back(std::get<1>(key), std::get<2>(key), std::get<3>(key), id);
      for (auto& [w, v] : slices) {
        if (read[static_cast<std::size_t>(info_[static_cast<std::size_t>(w)].loc[0])]) continue;
        std::sort(v.begin(), v.end());
        split_state st;
        st.k = skind::sharded;
        st.axis = st.axis2 = std::get<0>(v[0]);
        int64_t at = 0;
        bool ok = static_cast<int>(v.size()) == t_;
        for (const auto& [d, b, e, id] : v) {
          ok = ok && d == st.axis && b == at;
          at = e;
          st.begin.push_back(b);
          st.end.push_back(e);
        }
        if (ok && at == g_.at(w).dims[st.axis]) info->state[static_cast<std::size_t>(w)] = st;
      }
    }
    // Collectives that nothing needs (an all-gather whose readers a chunked
    // reduce-scatter emitted again per chunk) are pruned by the planner:
    // they are not the plan's.
    {
      std::vector<char> live(out_size_, 0);
      const graph& rg = *rewritten_;
      for (node_id o : rg.outputs()) live[static_cast<std::size_t>(o)] = 1;
      for (std::size_t id = out_size_; id-- > 0;) {
        if (!live[id]) continue;
        const node& x = rg.at(static_cast<node_id>(id));
        for (node_id in : x.inputs) live[static_cast<std::size_t>(in)] = 1;
        if (x.storage != no_node) live[static_cast<std::size_t>(x.storage)] = 1;
      }
      std::erase_if(collectives_, [&](const tp_collective& c) {
        return std::none_of(c.parts.begin(), c.parts.end(), [&](node_id p) { return live[static_cast<std::size_t>(p)] != 0; });
      });
    }
    info->collectives = std::move(collectives_);
    info->chunked = std::move(chunked_);
    info->chunked_by_batch = std::move(chunked_by_batch_);
    info->hand_over = std::move(hand_over_);
    return tp_rewrite{rewritten_, std::move(info)};
  }

 private:
  struct tensor_info {
    split_state st;                 // native state
    std::vector<node_id> loc;       // native locals per rank (empty while pending)
    std::vector<node_id> repl;      // replicated locals, once made
    std::vector<std::pair<split_state, std::vector<node_id>>> shards;  // other sharded versions made
    bool pending = false;           // a row-parallel matmul not emitted yet (see as_replicated)
    std::vector<node_id> pa, pb;    // its operands per rank
  };

  const graph& g_;
  const std::vector<device_spec>& devices_;
  const plan_options& opt_;
  int t_, stages_;
  std::vector<double> ratios_;
  std::vector<std::vector<int>> groups_;

  std::vector<char> needed_;
  std::vector<int> stage_;
  std::vector<std::array<std::vector<int64_t>, max_rank>> chain_;
  std::vector<std::array<char, max_rank>> bside_;

  std::vector<node> out_;
  std::vector<node_id> inputs_, outputs_;
  std::vector<tensor_info> info_;
  std::unordered_set<std::string> names_;
  std::map<std::tuple<node_id, int, int64_t, int64_t>, node_id> weight_slices_;
  std::vector<tp_collective> collectives_;
  std::vector<std::pair<std::string, int>> chunked_;
  std::vector<std::string> chunked_by_batch_;
  /// batch_chunks_mode::automatic: stage -> chunks of the batch there.
  std::map<int, bool> batch_stage_;
  std::vector<node_id> hand_over_;
  /// A replicated local (tensor_info::repl) -> the tensor of g_ it holds.
  std::unordered_map<node_id, node_id> repl_owner_;
  /// rows_piece's results: (local, axis, begin, end) -> the piece.
  std::map<std::tuple<node_id, int, int64_t, int64_t>, node_id> rows_pieces_;
  /// Concats of a chunked reduce-scatter's pieces (and of pieces rows_piece
  /// made from them): piece_bounds looks for these.
  std::unordered_set<node_id> chunk_concats_;
  std::size_t out_size_ = 0;
  std::shared_ptr<const graph> rewritten_;

  int dev(int stage, int k) const { return groups_[static_cast<std::size_t>(stage)][static_cast<std::size_t>(k)]; }
  int stage(node_id x) const { return stage_[static_cast<std::size_t>(x)]; }
  tensor_info& ti(node_id x) { return info_[static_cast<std::size_t>(x)]; }

  // ------------------------------------------------------------ analysis --

  void prune() {
    needed_.assign(g_.size(), 0);
    std::vector<node_id> stack = pruning_roots(g_);
    while (!stack.empty()) {
      const node_id id = stack.back();
      stack.pop_back();
      if (needed_[static_cast<std::size_t>(id)]) continue;
      needed_[static_cast<std::size_t>(id)] = 1;
      const node& n = g_.at(id);
      for (node_id i : n.inputs) stack.push_back(i);
      if (n.storage != no_node && n.storage != id) stack.push_back(n.storage);
    }
  }

  /// A pinned leaf keeps its pin (checked in assign_stages).
  int pin_of_leaf(const node& n) const { return n.pinned_device; }

  void assign_stages() {
    stage_.assign(g_.size(), -1);
    std::vector<node_id> free_nodes;
    // Pins are checked on every node, pruned or not (as the planner does).
    for (const node& n : g_.nodes())
      if (n.pinned_device != -1 && (n.pinned_device < 0 || n.pinned_device >= stages_ * t_))
        fail(errc::invalid_argument,
             label(n) + " is pinned to device " + std::to_string(n.pinned_device) + ", outside the " +
                 std::to_string(stages_) + " x " + std::to_string(t_) + " tensor-parallel layout");
    for (const node& n : g_.nodes()) {
      if (!needed_[static_cast<std::size_t>(n.id)] || is_leaf_op(n.op) || is_view_op(n.op)) continue;
      if (n.pinned_device >= 0) {
        stage_[static_cast<std::size_t>(n.id)] = n.pinned_device / t_;
      } else {
        free_nodes.push_back(n.id);
      }
    }
    std::vector<device_spec> stage_devs;
    for (int s = 0; s < stages_; ++s) stage_devs.push_back(devices_[static_cast<std::size_t>(dev(s, 0))]);
    const int k = opt_.policy == placement_policy::single ? 1 : stages_;
    const std::vector<int> st = partition_pipeline(g_, free_nodes, stage_devs, k);
    for (std::size_t i = 0; i < free_nodes.size(); ++i) stage_[static_cast<std::size_t>(free_nodes[i])] = st[i];
    // Views live with what they view.
    for (const node& n : g_.nodes())
      if (is_view_op(n.op) && needed_[static_cast<std::size_t>(n.id)]) stage_[static_cast<std::size_t>(n.id)] = stage_[static_cast<std::size_t>(n.inputs[0])];
  }

  // Backward pass: granule chains and "b side only" flags per (node, dim).
  void granules() {
    const std::size_t n = g_.size();
    chain_.assign(n, {});
    bside_.assign(n, {});
    std::vector<std::array<char, max_rank>> seen(n);
    std::vector<char> is_output(n, 0);
    for (node_id o : g_.outputs()) is_output[static_cast<std::size_t>(o)] = 1;
    for (std::size_t i = 0; i < n; ++i) bside_[i].fill(1);
    auto give = [&](node_id x, int d, const std::vector<int64_t>& ch, bool b) {
      auto& c = chain_[static_cast<std::size_t>(x)][static_cast<std::size_t>(d)];
      c = merge_chain(c, ch);
      char& f = bside_[static_cast<std::size_t>(x)][static_cast<std::size_t>(d)];
      f = static_cast<char>(f && b);
      seen[static_cast<std::size_t>(x)][static_cast<std::size_t>(d)] = 1;
    };
    auto mark_all = [&](node_id x) {  // read in a way that takes no shard hint
      for (int d = 0; d < g_.at(x).dims.rank(); ++d) give(x, d, {}, false);
    };
    for (std::size_t ii = n; ii-- > 0;) {
      const node& c = g_.at(static_cast<node_id>(ii));
      if (!needed_[ii]) continue;
      if (is_output[ii]) mark_all(c.id);
      const auto& cc = chain_[ii];
      const auto& cb = bside_[ii];
      auto same = [&](node_id x, int offset) {  // x's dim d <-> c's dim d + offset
        const node& xn = g_.at(x);
        for (int d = 0; d < xn.dims.rank(); ++d) {
          const int o = d + offset;
          if (o < 0 || o >= c.dims.rank() || xn.dims[d] != c.dims[o]) give(x, d, {}, false);
          else give(x, d, cc[static_cast<std::size_t>(o)], cb[static_cast<std::size_t>(o)]);
        }
      };
      switch (c.op) {
        case op_kind::input:
        case op_kind::weight:
          break;
        case op_kind::add:
        case op_kind::mul:
          same(c.inputs[0], 0);
          same(c.inputs[1], c.dims.rank() - g_.at(c.inputs[1]).dims.rank());
          break;
        case op_kind::scale: case op_kind::gelu: case op_kind::silu: case op_kind::copy:
        case op_kind::softmax: case op_kind::argmax:  // argmax: the last dim differs (1), so it is never shared
          same(c.inputs[0], 0);
          break;
        case op_kind::rms_norm: case op_kind::layer_norm: case op_kind::rope: case op_kind::store_rows:
          same(c.inputs[0], 0);  // store_rows: every dim but the stored axis (capacity vs rows)
          for (std::size_t i = 1; i < c.inputs.size(); ++i) mark_all(c.inputs[i]);
          break;
        case op_kind::matmul: {
          const node& a = g_.at(c.inputs[0]);
          const node& b = g_.at(c.inputs[1]);
          const int ro = c.dims.rank(), ra = a.dims.rank(), rb = b.dims.rank();
          for (int d = 0; d < ra; ++d) {
            const bool batch = d < ra - 2;
            const bool m_dim = d == (c.attrs.trans_a ? ra - 1 : ra - 2);
            const int o = batch ? d + ro - ra : ro - 2;
            if ((batch || m_dim) && a.dims[d] == c.dims[o]) give(a.id, d, cc[static_cast<std::size_t>(o)], false);
            else give(a.id, d, {}, false);
          }
          for (int d = 0; d < rb; ++d) {
            const bool batch = d < rb - 2;
            const int o = d + ro - rb;
            if (batch && b.dims[d] == c.dims[o] && b.dims[d] > 1) give(b.id, d, cc[static_cast<std::size_t>(o)], true);
            else give(b.id, d, {}, false);
          }
          break;
        }
        case op_kind::get_rows: {
          mark_all(c.inputs[0]);
          same(c.inputs[1], 0);
          break;
        }
        case op_kind::range_mask:  // every rank builds the whole mask from the small inputs
          mark_all(c.inputs[0]);
          mark_all(c.inputs[1]);
          break;
        case op_kind::permute:
        case op_kind::transpose: {
          const node& x = g_.at(c.inputs[0]);
          for (int o = 0; o < c.dims.rank(); ++o) {
            int d = o;
            if (c.op == op_kind::permute) d = c.attrs.perm[static_cast<std::size_t>(o)];
            else if (o == c.attrs.axis) d = c.attrs.axis2;
            else if (o == c.attrs.axis2) d = c.attrs.axis;
            give(x.id, d, cc[static_cast<std::size_t>(o)], cb[static_cast<std::size_t>(o)]);
          }
          break;
        }
        case op_kind::slice:
        case op_kind::concat: {
          for (node_id in : c.inputs) {
            const node& x = g_.at(in);
            for (int d = 0; d < x.dims.rank(); ++d) {
              if (d == c.attrs.axis) give(in, d, {}, false);
              else give(in, d, cc[static_cast<std::size_t>(d)], cb[static_cast<std::size_t>(d)]);
            }
          }
          break;
        }
        case op_kind::reshape: {
          const node& x = g_.at(c.inputs[0]);
          refinement r;
          if (!refine(x.dims, c.dims, r)) {
            mark_all(x.id);
            break;
          }
          for (int d = 0; d < x.dims.rank(); ++d) {
            const auto [fa, fb] = r.of_a[static_cast<std::size_t>(d)];
            if (fa < 0) {
              give(x.id, d, {}, false);
              continue;
            }
            // New dim j whose factors start at fa (a clean mapping), if any.
            int j = -1;
            for (int o = 0; o < c.dims.rank(); ++o)
              if (r.of_b[static_cast<std::size_t>(o)].first == fa) j = o;
            if (j < 0) {
              give(x.id, d, {}, false);
              continue;
            }
            const int fd = r.of_b[static_cast<std::size_t>(j)].second;
            std::vector<int64_t> ch;
            if (fd <= fb) {  // old dim splits: units of the new dim times the rest of the old one
              int64_t p = 1;
              for (int f = fd + 1; f <= fb; ++f) p *= r.f[static_cast<std::size_t>(f)];
              for (int64_t gr : cc[static_cast<std::size_t>(j)]) ch.push_back(gr * p);
              if (p > 1) ch.push_back(p);
            } else {  // old dims merge into the new one
              int64_t q = 1;
              for (int f = fb + 1; f <= fd; ++f) q *= r.f[static_cast<std::size_t>(f)];
              for (int64_t gr : cc[static_cast<std::size_t>(j)])
                if (gr % q == 0) ch.push_back(gr / q);
            }
            give(x.id, d, ch, cb[static_cast<std::size_t>(j)]);
          }
          break;
        }
        default:
          for (node_id in : c.inputs) mark_all(in);
          break;
      }
    }
    // Dims nobody read (dead, or only outputs) are not "b side".
    for (std::size_t i = 0; i < n; ++i)
      for (int d = 0; d < max_rank; ++d)
        if (!seen[i][static_cast<std::size_t>(d)]) bside_[i][static_cast<std::size_t>(d)] = 0;
  }

  // ------------------------------------------------------------ emission --

  std::string fresh(const std::string& base) {
    std::string s = base;
    for (int i = 2; names_.count(s); ++i) s = base + "#" + std::to_string(i);
    names_.insert(s);
    return s;
  }

  node_id emit(node n, bool rename = true) {
    n.id = static_cast<node_id>(out_.size());
    if (rename) n.name = fresh(n.name);
    else names_.insert(n.name);
    if (auto e = infer_node(out_, n))
      fail(errc::internal, "tensor parallel rewrite made an invalid node: " + e.to_string());
    out_.push_back(std::move(n));
    return out_.back().id;
  }

  const node& at(node_id id) const { return out_[static_cast<std::size_t>(id)]; }

  /// "<name>@<device>"; "<name>#r<rank>" for views of leaves (no stage).
  std::string local_name(const std::string& base, int stage, int k) const {
    if (stage < 0) return base + "#r" + std::to_string(k);
    return base + "@" + std::to_string(dev(stage, k));
  }

  /// A compute node of rank k of stage `s` (pinned there).
  node_id emit_compute(node n, int s, int k) {
    n.pinned_device = dev(s, k);
    return emit(std::move(n));
  }

  node_id emit_view(op_kind op, const std::string& base, node_id in, int s, int k, int layer,
                    const std::function<void(node&)>& set) {
    node v;
    v.op = op;
    v.name = local_name(base, s, k);
    v.inputs = {in};
    v.layer = layer;
    set(v);
    return emit(std::move(v));
  }

  node_id slice_view(node_id in, int axis, int64_t b, int64_t e, const std::string& base, int s, int k, int layer) {
    if (b == 0 && e == at(in).dims[axis]) return in;
    return emit_view(op_kind::slice, base + ".slice", in, s, k, layer, [&](node& v) {
      v.attrs.axis = axis;
      v.attrs.begin = b;
      v.attrs.end = e;
    });
  }

  node_id contiguous(node_id in, int s, int k, int layer) {
    if (at(in).contiguous()) return in;
    node c;
    c.op = op_kind::copy;
    c.type = at(in).type;
    c.name = at(in).name + ".contiguous";
    c.inputs = {in};
    c.layer = layer;
    return emit_compute(std::move(c), s, k);
  }

  /// A collective storage operand: its own buffer (never a view).
  node_id operand(node_id in, int s, int k, int layer) {
    if (!at(in).is_view()) return in;
    node c;
    c.op = op_kind::copy;
    c.type = at(in).type;
    c.name = at(in).name + ".buffer";
    c.inputs = {in};
    c.layer = layer;
    return emit_compute(std::move(c), s, k);
  }

  /// Concatenation of `inputs` along `axis` on rank k of stage s.
  node_id emit_concat(std::vector<node_id> inputs, int axis, std::string name, int s, int k, int layer) {
    node c;
    c.op = op_kind::concat;
    c.name = std::move(name);
    c.inputs = std::move(inputs);
    c.attrs.axis = axis;
    c.layer = layer;
    return emit_compute(std::move(c), s, k);
  }

  /// Rank k's part of row-parallel matmul n (a sharded on K, b its slice of
  /// the weight): whole, or one chunk of its rows (`base` names it).
  node_id emit_row_parallel_part(const node& n, node_id a, node_id b, const std::string& base, int s, int k) {
    node m = n;
    m.name = local_name(base, s, k);
    m.inputs = {a, b};
    m.pinned_device = -1;
    return emit_compute(std::move(m), s, k);
  }

  /// The devices of stage s's group, in rank order.
  std::vector<const device_spec*> group_members(int s) const {
    std::vector<const device_spec*> members;
    for (int k = 0; k < t_; ++k) members.push_back(&devices_[static_cast<std::size_t>(dev(std::max(0, s), k))]);
    return members;
  }

  /// Whether every member runs a collective beside a compute kernel
  /// (device_spec::collectives_overlap_compute): where chunks can overlap.
  static bool collectives_beside_compute(const std::vector<const device_spec*>& members) {
    return std::all_of(members.begin(), members.end(),
                       [](const device_spec* m) { return m->collectives_overlap_compute; });
  }

  /// Whether a reduce-scatter or all-gather (`op`) of `bytes` runs beside
  /// compute on every member: their collectives do, or it moves by the copy
  /// engines (collective_algo::copy_engine: no SMs; CUDA GPUs).
  static bool beside_compute(const std::vector<const device_spec*>& members, op_kind op, int64_t bytes) {
    return collectives_beside_compute(members) ||
           choose_collective_algo(members, bytes, op) == collective_algo::copy_engine;
  }

  node_id weight_slice(node_id w, int dim, int64_t b, int64_t e) {
    const node& wn = g_.at(w);
    const node_id full = ti(w).loc[0];
    if (b == 0 && e == wn.dims[dim]) return full;
    auto key = std::make_tuple(w, dim, b, e);
    if (auto it = weight_slices_.find(key); it != weight_slices_.end()) return it->second;
    auto src = make_slice_weight(wn.data, dim, b, e);
    if (!src) fail(errc::internal, src.err().message);
    node x;
    x.op = op_kind::weight;
    x.name = wn.name + "[" + std::to_string(dim) + ":" + std::to_string(b) + ".." + std::to_string(e) + ")";
    x.data = *src;
    x.layer = wn.layer;
    const node_id id = emit(std::move(x));
    weight_slices_[key] = id;
    return id;
  }

  /// Rank k's box of replicated tensor x, as nodes (weight slices for a weight).
  node_id box_of_replicated(node_id x, node_id local, const box& bx, int s, int k) {
    const node& xn = g_.at(x);
    std::vector<int> cut;
    for (int d = 0; d < xn.dims.rank(); ++d)
      if (bx.lo[static_cast<std::size_t>(d)] != 0 || bx.hi[static_cast<std::size_t>(d)] != xn.dims[d]) cut.push_back(d);
    if (cut.empty()) return local;
    node_id cur = local;
    std::size_t first = 0;
    if (xn.op == op_kind::weight) {
      const int d = cut[0];
      cur = weight_slice(x, d, bx.lo[static_cast<std::size_t>(d)], bx.hi[static_cast<std::size_t>(d)]);
      first = 1;
    }
    for (std::size_t i = first; i < cut.size(); ++i) {
      const int d = cut[i];
      cur = slice_view(cur, d, bx.lo[static_cast<std::size_t>(d)], bx.hi[static_cast<std::size_t>(d)], xn.name, s, k,
                       xn.layer);
    }
    return cur;
  }

  // ---------------------------------------------------------- collectives --

  std::vector<node_id> collective(op_kind op, node_id x, const std::vector<node_id>& operands, const shape& gathered,
                                  const std::string& base, const std::function<void(node&, int)>& set = {}) {
    const int s = stage(x);
    const int layer = g_.at(x).layer;
    std::vector<node_id> ops(operands.size());
    for (int k = 0; k < t_; ++k) ops[static_cast<std::size_t>(k)] = operand(operands[static_cast<std::size_t>(k)], s, k, layer);
    tp_collective rec;
    rec.op = op;
    rec.name = base;
    rec.group = s;
    rec.layer = layer;
    std::vector<node_id> parts;
    for (int k = 0; k < t_; ++k) {
      node c;
      c.op = op;
      c.name = local_name(base + "." + to_string(op), s, k);
      c.inputs = ops;
      c.layer = layer;
      c.attrs.group = s;
      c.attrs.rank = k;
      c.dims = gathered;
      if (set) set(c, k);
      parts.push_back(emit_compute(std::move(c), s, k));
    }
    const node& first = at(ops[0]);
    rec.bytes = op == op_kind::all_gather ? at(parts[0]).own_bytes() : first.own_bytes();
    rec.parts = parts;
    collectives_.push_back(std::move(rec));
    return parts;
  }

  // ------------------------------------------------------ state requests --

  bool has_replicated(node_id x) {
    const tensor_info& i = ti(x);
    return i.st.k == skind::replicated || !i.repl.empty();
  }

  bool cheap(node_id x, const split_state& want) {
    const tensor_info& i = ti(x);
    if (want.k == skind::replicated) return has_replicated(x);
    if (want.k == skind::partial) return i.st.k == skind::partial;
    if (i.st == want && !i.pending) return true;
    for (const auto& [st, l] : i.shards)
      if (st == want) return true;
    return has_replicated(x);
  }

  const std::vector<node_id>& native(node_id x) {
    tensor_info& i = ti(x);
    if (i.pending) {
      // The row-parallel matmul, unchunked.
      const node& n = g_.at(x);
      const int s = stage(x);
      for (int k = 0; k < t_; ++k)
        i.loc.push_back(
            emit_row_parallel_part(n, i.pa[static_cast<std::size_t>(k)], i.pb[static_cast<std::size_t>(k)], n.name, s, k));
      i.pending = false;
    }
    return i.loc;
  }

  std::vector<node_id> as_replicated(node_id x) {
    tensor_info& i = ti(x);
    if (i.st.k == skind::replicated) return native(x);
    if (!i.repl.empty()) return i.repl;
    const node& xn = g_.at(x);
    if (i.st.k == skind::partial) {
      if (i.pending) {
        auto r = chunked_all_reduce(x);
        if (!r.empty()) return remember_replicated(x, std::move(r));
      }
      return remember_replicated(x, collective(op_kind::all_reduce, x, native(x), {}, xn.name));
    }
    // sharded: all_gather along the merged dims
    const split_state st = i.st;
    return remember_replicated(x, collective(op_kind::all_gather, x, native(x), xn.dims, xn.name, [&](node& c, int) {
                                 c.attrs.axis = st.axis;
                                 c.attrs.axis2 = st.axis2;
                               }));
  }

  const std::vector<node_id>& remember_replicated(node_id x, std::vector<node_id> r) {
    for (node_id l : r) repl_owner_[l] = x;
    return ti(x).repl = std::move(r);
  }

  std::vector<node_id> as_state(node_id x, const split_state& want) {
    if (want.k == skind::replicated) return as_replicated(x);
    if (want.k == skind::partial) {
      if (ti(x).st.k != skind::partial) fail(errc::internal, "tensor parallel: partial requested of a non-partial tensor");
      return native(x);
    }
    {
      tensor_info& i = ti(x);
      if (i.st == want) return native(x);
      for (const auto& [st, l] : i.shards)
        if (st == want) return l;
    }
    const node& xn = g_.at(x);
    const int s = stage(x);
    // A partial is reduce-scattered once: a second reduce-scatter of the
    // same operands by the same ranks is not a collective of its own (the
    // planner refuses it); another shard comes from the all-reduce.
    std::vector<node_id> r;
    const bool first_scatter = ti(x).st.k == skind::partial && !has_replicated(x) && ti(x).shards.empty();
    if (first_scatter && ti(x).pending) r = chunked_reduce_scatter(x, want);  // empty: not in chunks
    if (r.empty() && first_scatter && want.axis == want.axis2) {
      r = collective(op_kind::reduce_scatter, x, native(x), {}, xn.name, [&](node& c, int k) {
        c.attrs.axis = want.axis;
        c.attrs.begin = want.begin[static_cast<std::size_t>(k)];
        c.attrs.end = want.end[static_cast<std::size_t>(k)];
      });
    } else if (r.empty()) {
      const std::vector<node_id> full = as_replicated(x);
      for (int k = 0; k < t_; ++k)
        r.push_back(box_of_replicated(x, full[static_cast<std::size_t>(k)], rank_box(xn.dims, want, k), s, k));
    }
    ti(x).shards.emplace_back(want, r);
    return r;
  }

  void set_state(node_id x, split_state st, std::vector<node_id> loc) {
    tensor_info& i = ti(x);
    i.st = std::move(st);
    i.loc = std::move(loc);
  }

  // ---------------------------------------------------------- chunking --

  /// Chunks of rows the all-reduce of pending row-parallel matmul x goes
  /// in: more than 1 where the cost model says a chunk's all-reduce beside
  /// the next chunk's product pays (chunked_all_reduce), else 1.
  int all_reduce_chunks(node_id x) {
    tensor_info& i = ti(x);
    const node& n = g_.at(x);
    if (!opt_.tp_overlap || n.attrs.trans_a) return 1;
    const int s = stage(x);
    for (int k = 0; k < t_; ++k)
      if (at(i.pb[static_cast<std::size_t>(k)]).dims.rank() != 2 || !at(i.pa[static_cast<std::size_t>(k)]).contiguous())
        return 1;
    const int64_t N = n.dims[-1];
    const int64_t rows = n.dims.numel() / N;
    int64_t kmax = 0;
    for (int k = 0; k < t_; ++k) kmax = std::max(kmax, at(i.pa[static_cast<std::size_t>(k)]).dims[-1]);
    const int64_t es = static_cast<int64_t>(dtype_size(n.type));
    const std::vector<const device_spec*> members = group_members(s);
    // Chunks pay only where a chunk's all-reduce runs beside the next chunk.
    if (!collectives_beside_compute(members)) return 1;
    const device_spec& d0 = *members[0];
    auto mm = [&](int64_t m) {
      op_cost c;
      c.flops = 2.0 * static_cast<double>(m) * static_cast<double>(N) * static_cast<double>(kmax);
      c.bytes = static_cast<double>((m * kmax + kmax * N + m * N) * es);
      return estimate_seconds(d0, c, n.type);
    };
    auto ar = [&](int64_t m) {
      const int64_t b = m * N * es;
      const collective_algo algo = choose_collective_algo(members, b, op_kind::all_reduce);
      return estimate_collective_seconds(op_kind::all_reduce, algo, members, b);
    };
    op_cost cat;
    cat.bytes = 2.0 * static_cast<double>(rows * N * es);
    const double t1 = mm(rows) + ar(rows);
    int best = 1;
    double best_t = t1;
    for (int c : {2, 4, 8}) {
      if (c > rows) break;
      const int64_t m = (rows + c - 1) / c;
      const double tc = mm(m) + (c - 1) * std::max(mm(m), ar(m)) + ar(m) + estimate_seconds(d0, cat, n.type);
      if (tc < best_t * 0.98) {
        best = c;
        best_t = tc;
      }
    }
    return best;
  }

  /// The all-reduce of a pending row-parallel matmul, split in chunks of rows
  /// when the cost model says overlap pays; empty when it does not.
  std::vector<node_id> chunked_all_reduce(node_id x) {
    const int best = all_reduce_chunks(x);
    if (best == 1) return {};
    tensor_info& i = ti(x);
    const node& n = g_.at(x);
    const int s = stage(x);
    const int64_t N = n.dims[-1];
    const int64_t rows = n.dims.numel() / N;
    const std::vector<int64_t> counts = apportion(rows, std::vector<double>(static_cast<std::size_t>(best), 1.0));
    std::vector<node_id> flat(static_cast<std::size_t>(t_));
    for (int k = 0; k < t_; ++k) {
      const node_id a = i.pa[static_cast<std::size_t>(k)];
      flat[static_cast<std::size_t>(k)] = emit_view(op_kind::reshape, n.name + ".rows", a, s, k, n.layer, [&](node& v) {
        v.dims = shape{rows, at(a).dims[-1]};
      });
    }
    std::vector<std::vector<node_id>> reduced(static_cast<std::size_t>(t_));
    int64_t r0 = 0;
    for (int c = 0; c < best; ++c) {
      const int64_t r1 = r0 + counts[static_cast<std::size_t>(c)];
      std::vector<node_id> parts;
      for (int k = 0; k < t_; ++k) {
        const node_id a = slice_view(flat[static_cast<std::size_t>(k)], 0, r0, r1, n.name + ".chunk" + std::to_string(c),
                                     s, k, n.layer);
        parts.push_back(
            emit_row_parallel_part(n, a, i.pb[static_cast<std::size_t>(k)], n.name + ".chunk" + std::to_string(c), s, k));
      }
      // Collective of this chunk, recorded under the tensor's name.
      const std::string base = n.name + ".chunk" + std::to_string(c);
      const int layer = n.layer;
      tp_collective rec;
      rec.op = op_kind::all_reduce;
      rec.name = base;
      rec.group = s;
      rec.layer = layer;
      for (int k = 0; k < t_; ++k) {
        node ar_node;
        ar_node.op = op_kind::all_reduce;
        ar_node.name = local_name(base + ".all_reduce", s, k);
        ar_node.inputs = parts;
        ar_node.layer = layer;
        ar_node.attrs.group = s;
        ar_node.attrs.rank = k;
        const node_id id = emit_compute(std::move(ar_node), s, k);
        rec.parts.push_back(id);
        reduced[static_cast<std::size_t>(k)].push_back(id);
      }
      rec.bytes = at(parts[0]).own_bytes();
      collectives_.push_back(std::move(rec));
      r0 = r1;
    }
    std::vector<node_id> result;
    for (int k = 0; k < t_; ++k) {
      const node_id c = emit_concat(reduced[static_cast<std::size_t>(k)], 0, local_name(n.name + ".chunks", s, k), s, k, n.layer);
      result.push_back(emit_view(op_kind::reshape, n.name + ".reduced", c, s, k, n.layer, [&](node& v) { v.dims = n.dims; }));
    }
    chunked_.emplace_back(n.name, best);
    return result;
  }

  /// Device time of local node `id` of the rewritten graph on `d` (the
  /// planner's cost model, from the local shapes).
  double local_seconds(const device_spec& d, node_id id) const {
    const node& m = at(id);
    op_cost c;
    for (node_id in : m.inputs) c.bytes += static_cast<double>(at(in).dims.numel() * static_cast<int64_t>(dtype_size(at(in).type)));
    c.bytes += static_cast<double>(m.dims.numel() * static_cast<int64_t>(dtype_size(m.type)));
    c.flops = static_cast<double>(m.dims.numel());
    if (m.op == op_kind::matmul) {
      const shape& a = at(m.inputs[0]).dims;
      c.flops *= 2.0 * static_cast<double>(m.attrs.trans_a ? a[-2] : a[-1]);
    }
    return estimate_seconds(d, c, m.type);
  }

  /// True for a weight, or a view of one: nothing of it depends on rows.
  bool row_free(node_id id) const {
    while (at(id).is_view()) id = at(id).inputs[0];
    return at(id).op == op_kind::weight;
  }

  /// The op of local node `o` (kind, attributes, type, layer), named
  /// o.name + tag, with no inputs yet: `o` computed again on other operands
  /// (a chunk's, a piece's).
  static node tagged_copy(const node& o, const std::string& tag) {
    node m;
    m.op = o.op;
    m.attrs = o.attrs;
    m.type = o.type;
    m.layer = o.layer;
    m.name = o.name + tag;
    return m;
  }

  /// Whether `in` has `m`'s dims up to and including `ax` (its rows there).
  bool same_rows(node_id in, const node& m, int ax) const {
    const shape& d = at(in).dims;
    if (d.rank() != m.dims.rank()) return false;
    for (int j = 0; j <= ax; ++j)
      if (d[j] != m.dims[j]) return false;
    return true;
  }

  /// Whether op m computes each row along `ax` from the same rows of its
  /// operands alone: a norm of the last dim, an elementwise op, a matmul of
  /// rows by a weight.
  bool row_wise(const node& m, int ax) const {
    if (m.is_view() || ax >= m.dims.rank() - 1) return false;
    switch (m.op) {
      case op_kind::rms_norm: case op_kind::layer_norm: case op_kind::add: case op_kind::mul:
      case op_kind::scale: case op_kind::silu: case op_kind::gelu: case op_kind::copy: return true;
      case op_kind::matmul: return !m.attrs.trans_a && row_free(m.inputs[1]);
      default: return false;
    }
  }

  /// The row boundaries along `ax` of the chunked pieces rank k's local `id`
  /// is made of (a chunked reduce-scatter's concat, reached through row-wise
  /// ops), e.g. {0, 171, 512, 853, 1024}; empty where it is not so made.
  std::vector<int64_t> piece_bounds(node_id id, int ax) const {
    for (;;) {
      const node& m = at(id);
      if (m.op == op_kind::concat && m.attrs.axis == ax && chunk_concats_.count(id)) {
        std::vector<int64_t> b{0};
        for (node_id in : m.inputs) b.push_back(b.back() + at(in).dims[ax]);
        return b;
      }
      if (!row_wise(m, ax) || !same_rows(m.inputs[0], m, ax)) return {};
      id = m.inputs[0];
    }
  }

  /// Rows [b, e) along `ax` of rank k's local node `id`, made from the
  /// pieces its rows were made of, where they were made in pieces: the input
  /// of a concat along ax that holds those rows, or a row-wise op (row_wise)
  /// emitted again on its operands' rows [b, e), themselves made so or else
  /// sliced. No node where no concat's piece lies underneath (then the rows
  /// are better sliced out of `id` than computed again). The row-wise locals
  /// computed again are added to `again` (rank k's, once each); pieces are
  /// memoised.
  node_id rows_piece(node_id id, int ax, int64_t b, int64_t e, const std::string& tag, int s, int k,
                     std::vector<node_id>& again) {
    // A copy: the pieces made below grow out_, which moves its nodes.
    const node m = at(id);
    if (m.dims.rank() <= ax + 1 || (b == 0 && e == m.dims[ax])) return no_node;
    const auto key = std::make_tuple(id, ax, b, e);
    if (const auto it = rows_pieces_.find(key); it != rows_pieces_.end()) return it->second;
    node_id r = no_node;
    if (m.op == op_kind::concat && m.attrs.axis == ax) {
      // Within one input: that input (or its slice); on inputs' boundaries:
      // their concat.
      int64_t o = 0;
      std::vector<node_id> span;
      for (node_id in : m.inputs) {
        const int64_t len = at(in).dims[ax];
        if (b >= o && e <= o + len) {
          r = (b == o && e == o + len) ? in : slice_view(in, ax, b - o, e - o, at(in).name + tag, s, k, m.layer);
          break;
        }
        if (o >= b && o + len <= e) span.push_back(in);
        o += len;
      }
      int64_t covered = 0;
      for (node_id in : span) covered += at(in).dims[ax];
      if (r == no_node && span.size() > 1 && covered == e - b) r = emit_concat(span, ax, m.name + tag, s, k, m.layer);
    } else if (row_wise(m, ax)) {
      node c = tagged_copy(m, tag);
      bool found = false;
      for (node_id in : m.inputs) {
        const shape& d = at(in).dims;
        if (row_free(in) || d.rank() < m.dims.rank() - ax) {
          c.inputs.push_back(in);  // broadcast along the rows: the same for every piece
        } else if (m.op == op_kind::matmul ? same_rows(in, m, ax) : d == m.dims) {
          const node_id p = rows_piece(in, ax, b, e, tag, s, k, again);
          found = found || p != no_node;
          c.inputs.push_back(p != no_node ? p : slice_view(in, ax, b, e, at(in).name + tag, s, k, m.layer));
        } else {
          return no_node;
        }
      }
      if (!found) return no_node;
      r = emit_compute(std::move(c), s, k);
      if (std::find(again.begin(), again.end(), id) == again.end()) again.push_back(id);
    }
    if (r != no_node) rows_pieces_[key] = r;
    return r;
  }

  /// Every tensor of g_ that a rank held as a `moves` key now holds its
  /// value (the same values): later readers take the value, and the key,
  /// unread, is pruned. One pass over the infos for all of them (a pass per
  /// moved node made the 80-layer 8 x 8 plan's rewrite quadratic in its
  /// layers).
  void redirect(const std::unordered_map<node_id, node_id>& moves) {
    if (moves.empty()) return;
    const auto move = [&](node_id& l) {
      if (const auto it = moves.find(l); it != moves.end()) l = it->second;
    };
    for (tensor_info& i : info_) {
      for (node_id& l : i.loc) move(l);
      for (node_id& l : i.repl) move(l);
      for (auto& sh : i.shards)
        for (node_id& l : sh.second) move(l);
    }
  }

  /// The compute nodes emitted from id `first` on hand rows over between
  /// chunks (tensor_parallel_info::hand_over).
  void mark_hand_over(node_id first) {
    for (auto id = static_cast<std::size_t>(first); id < out_.size(); ++id)
      if (!is_leaf_op(out_[id].op) && !is_view_op(out_[id].op)) hand_over_.push_back(static_cast<node_id>(id));
  }

  /// A chunked region of one rank (chunked_reduce_scatter): the local nodes
  /// emitted again per chunk (ascending ids), the all-gathered tensors of g_
  /// they read (gathered per chunk instead), and the locals they read whole
  /// (cut into the chunk's rows).
  struct chunk_region {
    std::vector<node_id> clone;
    std::set<node_id> gathered;
    std::set<node_id> whole;
  };

  /// Device time on `d` of rank 0's part of pending row-parallel matmul x
  /// (rows x K_local x N), for `share` of its rows.
  double row_parallel_seconds(node_id x, const device_spec& d, double share) {
    const node& n = g_.at(x);
    const shape& a = at(ti(x).pa[0]).dims;
    op_cost c;
    c.flops = 2.0 * share * static_cast<double>(n.dims.numel()) * static_cast<double>(a[-1]);
    c.bytes = (share * static_cast<double>(a.numel() + n.dims.numel()) + static_cast<double>(at(ti(x).pb[0]).dims.numel())) *
              static_cast<double>(dtype_size(n.type));
    return estimate_seconds(d, c, n.type);
  }

  /// Rank k's part of one chunk of region `rg` for pending row-parallel
  /// matmul x: the region's ops emitted again (named with `tag`) on the
  /// chunk's operands (the chunk's parts of the all-gathered tensors in
  /// `gathered`, the whole locals cut by `cut`), then x's product of them.
  /// `batch` > 0 (chunks of the batch): a reshape's dim 0 is that count.
  node_id chunk_part(node_id x, const chunk_region& rg, int k, const std::string& tag,
                     const std::map<node_id, std::vector<node_id>>& gathered, const std::function<node_id(node_id)>& cut,
                     int64_t batch) {
    const node& n = g_.at(x);
    const int s = stage(x);
    std::unordered_map<node_id, node_id> now;  // local node -> its chunk's version
    for (node_id e : rg.gathered) now[ti(e).repl[static_cast<std::size_t>(k)]] = gathered.at(e)[static_cast<std::size_t>(k)];
    for (node_id w : rg.whole) now[w] = cut(w);
    const auto mapped = [&](node_id in) {
      const auto it = now.find(in);
      return it == now.end() ? in : it->second;
    };
    for (node_id id : rg.clone) {
      const node& o = at(id);
      node m = tagged_copy(o, tag);
      for (node_id in : o.inputs) m.inputs.push_back(mapped(in));
      if (o.op == op_kind::reshape && batch > 0) {
        m.dims = o.dims;
        m.dims[0] = batch;
      }
      const bool view = o.is_view();  // (o moves as nodes are emitted)
      now[id] = view ? emit(std::move(m)) : emit_compute(std::move(m), s, k);
    }
    return emit_row_parallel_part(n, mapped(ti(x).pa[static_cast<std::size_t>(k)]), ti(x).pb[static_cast<std::size_t>(k)],
                                  n.name + tag, s, k);
  }

  /// Each rank's chunk outputs `reduced` concatenated along `axis` (marked
  /// for piece_bounds / rows_piece), x recorded as chunked: a chunked
  /// reduce-scatter's result.
  std::vector<node_id> join_chunks(node_id x, const std::vector<std::vector<node_id>>& reduced, int axis) {
    const node& n = g_.at(x);
    const int s = stage(x);
    std::vector<node_id> result;
    for (int k = 0; k < t_; ++k) {
      result.push_back(emit_concat(reduced[static_cast<std::size_t>(k)], axis, local_name(n.name + ".chunks", s, k), s, k, n.layer));
      chunk_concats_.insert(result.back());
    }
    chunked_.emplace_back(n.name, static_cast<int>(reduced[0].size()));
    return result;
  }

  /// Modelled seconds of collective `op` of `bytes` over `members` (0 for none).
  static double coll_seconds(const std::vector<const device_spec*>& members, op_kind op, int64_t bytes) {
    return bytes <= 0 ? 0.0 : estimate_collective_seconds(op, choose_collective_algo(members, bytes, op), members, bytes);
  }

  /// Modelled span of a region in chunks of relative sizes `w`: `comp`
  /// seconds of compute in `kernels` kernels per chunk on the first member,
  /// all-gathers of `gather_bytes` and a reduce-scatter of `scatter_bytes`
  /// in all. The first chunk's all-gather, then each chunk's compute beside
  /// the next chunk's all-gather and its own reduce-scatter, the last chunk's
  /// reduce-scatter, and the concat of the pieces.
  double chunked_seconds(const std::vector<const device_spec*>& members, double comp, int kernels, int64_t gather_bytes,
                         int64_t scatter_bytes, const std::vector<double>& w, dtype type) const {
    const device_spec& d0 = *members[0];
    const int c = static_cast<int>(w.size());
    const double sum = std::accumulate(w.begin(), w.end(), 0.0);
    const auto part = [&](int i) { return w[static_cast<std::size_t>(i)] / sum; };
    const auto scaled = [&](int64_t bytes, int i) { return static_cast<int64_t>(static_cast<double>(bytes) * part(i)); };
    const auto ag = [&](int i) { return coll_seconds(members, op_kind::all_gather, scaled(gather_bytes, i)); };
    const auto rs = [&](int i) { return coll_seconds(members, op_kind::reduce_scatter, scaled(scatter_bytes, i)); };
    const auto step = [&](int i) { return comp * part(i) + kernels * d0.kernel_latency; };
    op_cost cat;
    cat.bytes = 2.0 * static_cast<double>(scatter_bytes / t_);
    double t = ag(0) + step(c - 1) + rs(c - 1) + estimate_seconds(d0, cat, type);
    for (int i = 0; i + 1 < c; ++i) t += std::max(step(i), ag(i + 1) + rs(i));
    return t;
  }

  /// Rows [lo(k, c), hi(k, c)) of rank k's chunk c along the chunk axis.
  using chunk_rows = std::function<int64_t(int, int)>;

  /// Every chunk's all-gathers of the region's gathered tensors (emitted
  /// first, so that a communication queue never holds one behind a
  /// reduce-scatter that waits for compute): rank k sends rows [lo(k, c),
  /// hi(k, c)) along `cax` of its local, gathered along the tensor's sharded
  /// axis `ax` into dims gathered_dims(tensor, c). The pieces they send are
  /// made first, all of them (a piece that is not a whole buffer is copied
  /// into one): one run of compute, not one between each two collectives. A
  /// piece whose rows were made in pieces already (the reduce-scatter of an
  /// earlier chunked region, then a residual add and a norm) is made from
  /// those (rows_piece): it need not wait for all of them, nor be copied out
  /// of their concat. Returns [chunk][tensor] -> the gathered parts per rank.
  std::vector<std::map<node_id, std::vector<node_id>>> chunk_all_gathers(
      node_id x, const std::set<node_id>& gathered, int chunks, int cax, int ax, const chunk_rows& lo,
      const chunk_rows& hi, const std::function<shape(node_id, int)>& gathered_dims) {
    const int s = stage(x);
    std::vector<std::map<node_id, std::vector<node_id>>> ag(static_cast<std::size_t>(chunks));
    std::vector<std::vector<node_id>> again(static_cast<std::size_t>(t_));
    for (int c = 0; c < chunks; ++c)
      for (node_id e : gathered)
        for (int k = 0; k < t_; ++k) {
          const node& en = g_.at(e);
          const node_id local = native(e)[static_cast<std::size_t>(k)];
          const auto first = static_cast<node_id>(out_.size());
          node_id piece = rows_piece(local, cax, lo(k, c), hi(k, c), ".chunk" + std::to_string(c), s, k,
                                     again[static_cast<std::size_t>(k)]);
          if (piece == no_node) piece = slice_view(local, cax, lo(k, c), hi(k, c), en.name, s, k, en.layer);
          ag[static_cast<std::size_t>(c)][e].push_back(operand(piece, s, k, en.layer));
          mark_hand_over(first);
        }
    // The locals computed again in pieces are read from their pieces' concat
    // from now on, so that the whole (which waits for every piece) is not
    // computed ahead of the chunks on the compute lane. (The targets are new
    // nodes, never another move's source: one pass applies them all.)
    std::unordered_map<node_id, node_id> moves;
    for (int k = 0; k < t_; ++k)
      for (node_id l : again[static_cast<std::size_t>(k)]) {
        std::vector<node_id> parts;
        for (int c = 0; c < chunks; ++c) {
          const auto it = rows_pieces_.find(std::make_tuple(l, cax, lo(k, c), hi(k, c)));
          if (it == rows_pieces_.end()) break;
          parts.push_back(it->second);
        }
        if (static_cast<int>(parts.size()) != chunks) continue;
        const node_id whole = emit_concat(std::move(parts), cax, at(l).name + ".pieces", s, k, at(l).layer);
        chunk_concats_.insert(whole);
        moves.emplace(l, whole);
      }
    redirect(moves);
    for (int c = 0; c < chunks; ++c)
      for (node_id e : gathered) {
        auto& parts = ag[static_cast<std::size_t>(c)][e];
        parts = collective(op_kind::all_gather, x, parts, gathered_dims(e, c), g_.at(e).name + ".chunk" + std::to_string(c),
                           [&](node& v, int) {
                             v.attrs.axis = ax;
                             v.attrs.axis2 = ax;
                           });
      }
    return ag;
  }

  /// Whether op m (a local node whose dim 0 is a batch) computes each index
  /// of dim 0 from the same index of its operands' dim 0 alone: an op on
  /// the inner dims (a norm, softmax, rope, a matmul whose batch dims lead),
  /// an elementwise op, or a view that keeps dim 0 where it is.
  bool batch_wise(const node& m) const {
    switch (m.op) {
      case op_kind::matmul: case op_kind::rms_norm: case op_kind::layer_norm: case op_kind::softmax:
      case op_kind::rope: case op_kind::add: case op_kind::mul: case op_kind::scale: case op_kind::silu:
      case op_kind::gelu: case op_kind::copy:
        return m.dims.rank() >= 2;
      case op_kind::reshape: return at(m.inputs[0]).dims.rank() >= 2 && at(m.inputs[0]).dims[0] == m.dims[0];
      case op_kind::permute: return m.attrs.perm[0] == 0;
      case op_kind::transpose: return m.attrs.axis != 0 && m.attrs.axis2 != 0;
      case op_kind::slice: return m.attrs.axis != 0;
      default: return false;
    }
  }

  /// Whether operand `in` of batch-wise op m is the same for every batch
  /// chunk of m: a weight, or an operand that broadcasts along m's dim 0
  /// (fewer dims: a bias, rope's positions, a mask; or 1 there).
  bool batch_shared(const node& m, node_id in) const {
    if (row_free(in)) return true;
    if (m.is_view()) return false;
    const shape& d = at(in).dims;
    return d.rank() < m.dims.rank() || (d[0] == 1 && m.dims[0] != 1);
  }

  /// Sequence parallelism with overlap in chunks of the batch (dim 0), where
  /// the rows are sharded along a later dim (the sequence) and the batch
  /// holds 2 or more. A batch chunk is a whole part of the computation, not
  /// only of its row-wise ops: the region grows back from the row-parallel
  /// matmul x through every op that treats dim 0 as a batch (attention's
  /// projections, rope, scores, softmax, and their views) to the all-gathers
  /// that fed it or to locals it cuts by batch. So chunk c's reduce-scatter
  /// (and the next region's all-gather of chunk c's rows) runs beside chunk
  /// c + 1's attention, where chunks of rows overlap o_proj alone. Returns
  /// rank k's rows (the chunks' outputs concatenated along dim 0) or empty
  /// where the region cannot be cut by batch or the cost model says it does
  /// not pay.
  std::vector<node_id> batch_chunked_reduce_scatter(node_id x, const split_state& want,
                                                    const std::vector<const device_spec*>& members) {
    const node& n = g_.at(x);
    const int s = stage(x);
    const int ax = want.axis;
    const int64_t batch = n.dims[0];
    if (ax < 1 || batch < 2) return {};
    const std::vector<node_id>& pa = ti(x).pa;
    const std::vector<node_id>& pb = ti(x).pb;
    std::vector<chunk_region> reg(static_cast<std::size_t>(t_));
    for (int k = 0; k < t_; ++k) {
      chunk_region& rg = reg[static_cast<std::size_t>(k)];
      if (!row_free(pb[static_cast<std::size_t>(k)])) return {};
      std::set<node_id> seen;
      std::vector<node_id> stack{pa[static_cast<std::size_t>(k)]};
      while (!stack.empty()) {
        const node_id id = stack.back();
        stack.pop_back();
        if (!seen.insert(id).second) continue;
        const node& m = at(id);
        if (m.dims.rank() < 2 || m.dims[0] != batch) return {};
        if (const auto it = repl_owner_.find(id); it != repl_owner_.end()) {
          const node_id e = it->second;
          const shape& ed = g_.at(e).dims;
          if (ti(e).st == want && ed.rank() > ax && ed[0] == batch) {
            rg.gathered.insert(e);
            continue;
          }
        }
        if (batch_wise(m)) {
          rg.clone.push_back(id);
          for (node_id in : m.inputs)
            if (!batch_shared(m, in)) stack.push_back(in);
        } else if (m.contiguous()) {
          rg.whole.insert(id);  // cut by batch with a slice: still contiguous
        } else {
          return {};
        }
      }
      std::sort(rg.clone.begin(), rg.clone.end());
      if (reg[0].gathered != rg.gathered || reg[0].clone.size() != rg.clone.size()) return {};
    }
    // The cost model: the region's compute (its kernels, not its views) and
    // the row-parallel matmul, beside the chunks' collectives.
    const device_spec& d0 = *members[0];
    double comp = 0;
    int kernels = 1;
    for (node_id id : reg[0].clone)
      if (!at(id).is_view()) {
        comp += local_seconds(d0, id);
        ++kernels;
      }
    comp += row_parallel_seconds(x, d0, 1.0);
    int64_t gather_bytes = 0;
    for (node_id e : reg[0].gathered) gather_bytes += bytes_of(g_.at(e));
    const int64_t scatter_bytes = bytes_of(n);
    const double t1 = coll_seconds(members, op_kind::all_gather, gather_bytes) + comp + kernels * d0.kernel_latency +
                      coll_seconds(members, op_kind::reduce_scatter, scatter_bytes);
    int most_chunks = 4;
    for (const device_spec* m : members) most_chunks = std::min(most_chunks, m->max_overlap_chunks);
    int chunks = 1;
    double best = t1;
    if (opt_.tp_batch_chunks == batch_chunks_mode::automatic) {
      // Decided once per stage, at its first chunked region (see
      // batch_chunks_mode::automatic): the hand-over of chunks of rows is
      // the first half's reduce-scatter and the next region's all-gather of
      // the same rows, beside the product of the last half.
      auto [it, fresh] = batch_stage_.try_emplace(s, false);
      if (fresh) {
        const double hand_over = coll_seconds(members, op_kind::reduce_scatter, scatter_bytes / 2) +
                                 coll_seconds(members, op_kind::all_gather, scatter_bytes / 2);
        it->second = hand_over > row_parallel_seconds(x, d0, 0.5) + d0.kernel_latency;
      }
      // Two chunks, or the count plan_options::tp_overlap_chunks forces
      // (chunks of rows where the batch has too few).
      const int c = opt_.tp_overlap_chunks != 0 ? opt_.tp_overlap_chunks : 2;
      if (!it->second || c > batch || (opt_.tp_overlap_chunks == 0 && c > most_chunks) ||
          !beside_compute(members, op_kind::reduce_scatter, scatter_bytes / c) ||
          (gather_bytes > 0 && !beside_compute(members, op_kind::all_gather, gather_bytes / c)))
        return {};
      chunks = c;
    }
    for (int c : {2, 4}) {
      if (chunks > 1 || c > batch) break;
      const std::vector<double> w(static_cast<std::size_t>(c), 1.0);
      if (!beside_compute(members, op_kind::reduce_scatter, scatter_bytes / c) ||
          (gather_bytes > 0 && !beside_compute(members, op_kind::all_gather, gather_bytes / c)))
        continue;
      if (opt_.tp_overlap_chunks != 0) {
        if (c == opt_.tp_overlap_chunks) chunks = c;
        continue;
      }
      if (c > most_chunks) break;
      const double tc = chunked_seconds(members, comp, kernels, gather_bytes, scatter_bytes, w, n.type);
      if (tc < best && tc < t1 * 0.99) {
        chunks = c;
        best = tc;
      }
    }
    if (chunks == 1) return {};
    const std::vector<int64_t> counts = apportion(batch, std::vector<double>(static_cast<std::size_t>(chunks), 1.0));
    std::vector<int64_t> first{0};
    for (int64_t v : counts) first.push_back(first.back() + v);
    const auto lo = [&](int, int c) { return first[static_cast<std::size_t>(c)]; };
    const auto hi = [&](int, int c) { return first[static_cast<std::size_t>(c) + 1]; };
    const std::vector<std::map<node_id, std::vector<node_id>>> ag =
        chunk_all_gathers(x, reg[0].gathered, chunks, 0, ax, lo, hi, [&](node_id e, int c) {
          shape gathered = g_.at(e).dims;
          gathered[0] = hi(0, c) - lo(0, c);
          return gathered;
        });
    std::vector<std::vector<node_id>> reduced(static_cast<std::size_t>(t_));
    for (int c = 0; c < chunks; ++c) {
      const std::string tag = ".chunk" + std::to_string(c);
      const int64_t b = lo(0, c), e = hi(0, c);
      std::vector<node_id> parts;
      for (int k = 0; k < t_; ++k)
        parts.push_back(chunk_part(x, reg[static_cast<std::size_t>(k)], k, tag, ag[static_cast<std::size_t>(c)],
                                   [&](node_id w) { return slice_view(w, 0, b, e, at(w).name + tag, s, k, n.layer); },
                                   e - b));
      const auto rs = collective(op_kind::reduce_scatter, x, parts, {}, n.name + tag, [&](node& v, int k) {
        v.attrs.axis = ax;
        v.attrs.begin = want.begin[static_cast<std::size_t>(k)];
        v.attrs.end = want.end[static_cast<std::size_t>(k)];
      });
      for (int k = 0; k < t_; ++k) reduced[static_cast<std::size_t>(k)].push_back(rs[static_cast<std::size_t>(k)]);
    }
    chunked_by_batch_.push_back(n.name);
    return join_chunks(x, reduced, 0);
  }

  /// Sequence parallelism with overlap (plan_options::sequence_parallel and
  /// tp_overlap): the reduce-scatter by rows `want` of the pending
  /// row-parallel matmul x, pipelined in chunks of rows. Chunk c holds piece
  /// c of every rank's rows. The row-wise ops between x and the all-gathers
  /// that fed them (an MLP's gate, up, silu and product) are emitted once per
  /// chunk, reading chunk c's all-gather, so chunk c's reduce-scatter and the
  /// next chunks' all-gathers run on the communication queue while later
  /// chunks compute; an operand that holds every row on every rank
  /// (attention's output before o_proj) is cut into the chunk's rows by
  /// slices and a concat. The all-gathers of all chunks are emitted first, so
  /// a queue never holds one behind a reduce-scatter that waits for compute.
  /// Returns rank k's rows (the chunks' reduce-scatter outputs, concatenated)
  /// or empty where the rows do not split or the cost model says it does not
  /// pay; the unchunked nodes it replaces are left unread (pruned).
  std::vector<node_id> chunked_reduce_scatter(node_id x, const split_state& want) {
    const node& n = g_.at(x);
    const int s = stage(x);
    if (!opt_.tp_overlap || !sequence_parallel(s, n.dims, n.type) || !ti(x).pending || n.attrs.trans_a ||
        want.axis != want.axis2 || want.axis >= n.dims.rank() - 1)
      return {};
    const int ax = want.axis, r = n.dims.rank();
    const std::vector<const device_spec*> members = group_members(s);
    if (!beside_compute(members, op_kind::reduce_scatter, bytes_of(n))) return {};
    const auto rows_prefix = [&](const shape& d) {
      if (d.rank() != r) return false;
      for (int j = 0; j <= ax; ++j)
        if (d[j] != n.dims[j]) return false;
      return true;
    };
    // All-gathered tensors whose rows the region may read per chunk instead:
    // the replicated local of rank k -> the tensor.
    const auto gathered_of = [&](node_id l) -> node_id {
      const auto it = repl_owner_.find(l);
      if (it == repl_owner_.end()) return no_node;
      const tensor_info& te = ti(it->second);
      return te.st == want && rows_prefix(g_.at(it->second).dims) ? it->second : no_node;
    };
    if (opt_.tp_batch_chunks != batch_chunks_mode::off)
      if (std::vector<node_id> by_batch = batch_chunked_reduce_scatter(x, want, members); !by_batch.empty())
        return by_batch;
    // Per rank: the local nodes to emit per chunk (ascending ids), the
    // all-gathered tensors and the every-row operands they read.
    std::vector<chunk_region> reg(static_cast<std::size_t>(t_));
    const std::vector<node_id>& pa = ti(x).pa;
    const std::vector<node_id>& pb = ti(x).pb;
    for (int k = 0; k < t_; ++k) {
      chunk_region& rg = reg[static_cast<std::size_t>(k)];
      std::set<node_id> seen;
      std::vector<node_id> stack{pa[static_cast<std::size_t>(k)]};
      if (!row_free(pb[static_cast<std::size_t>(k)])) return {};
      while (!stack.empty()) {
        const node_id id = stack.back();
        stack.pop_back();
        if (!seen.insert(id).second) continue;
        const node& m = at(id);
        if (const node_id e = gathered_of(id); e != no_node) {
          rg.gathered.insert(e);
          continue;
        }
        if (row_free(id)) continue;
        bool clone = !m.is_view() && rows_prefix(m.dims);
        switch (m.op) {
          case op_kind::matmul: clone = clone && !m.attrs.trans_a && row_free(m.inputs[1]); break;
          case op_kind::scale: case op_kind::gelu: case op_kind::silu: case op_kind::add: case op_kind::mul:
          case op_kind::copy: break;
          default: clone = false;
        }
        if (clone) {
          rg.clone.push_back(id);
          for (node_id in : m.inputs) stack.push_back(in);
        } else if (rows_prefix(m.dims)) {
          rg.whole.insert(id);
        } else {
          return {};
        }
      }
      std::sort(rg.clone.begin(), rg.clone.end());
      if (reg[0].gathered != rg.gathered || reg[0].clone.size() != rg.clone.size()) return {};
    }
    // Pieces: rank k's rows [want.begin[k], want.end[k]) in `chunks` runs.
    int64_t fewest = INT64_MAX;
    for (int k = 0; k < t_; ++k) fewest = std::min(fewest, want.end[static_cast<std::size_t>(k)] - want.begin[static_cast<std::size_t>(k)]);
    const device_spec& d0 = *members[0];
    double comp = 0;
    for (node_id id : reg[0].clone) comp += local_seconds(d0, id);
    comp += row_parallel_seconds(x, d0, 1.0);
    int64_t gather_bytes = 0;
    for (node_id e : reg[0].gathered) gather_bytes += bytes_of(g_.at(e));
    const int64_t scatter_bytes = bytes_of(n);
    const int kernels = static_cast<int>(reg[0].clone.size()) + 1;
    const double t1 = coll_seconds(members, op_kind::all_gather, gather_bytes) + comp + kernels * d0.kernel_latency +
                      coll_seconds(members, op_kind::reduce_scatter, scatter_bytes);
    // Chunk sizes: the first and the last half as large as the others, since
    // only the first chunk's all-gather and the last one's reduce-scatter
    // have no compute beside them.
    const auto weights_of = [](int c) {
      std::vector<double> w(static_cast<std::size_t>(c), 2.0);
      w.front() = w.back() = 1.0;
      return w;
    };
    const auto time_of = [&](int c) {
      return chunked_seconds(members, comp, kernels, gather_bytes, scatter_bytes, weights_of(c), n.type);
    };
    int chunks = 1;
    double best = t1;
    // Chunks pay only where their collectives run beside compute: on CUDA
    // GPUs, the smallest chunk's still moves by the copy engines.
    const auto chunks_beside = [&](int c) {
      const std::vector<double> w = weights_of(c);
      const double first = w.front() / std::accumulate(w.begin(), w.end(), 0.0);
      const auto piece_of = [&](int64_t b) { return static_cast<int64_t>(static_cast<double>(b) * first); };
      return beside_compute(members, op_kind::reduce_scatter, piece_of(scatter_bytes)) &&
             (gather_bytes <= 0 || beside_compute(members, op_kind::all_gather, piece_of(gather_bytes)));
    };
    int most_chunks = 4;
    for (const device_spec* m : members) most_chunks = std::min(most_chunks, m->max_overlap_chunks);
    for (int c : {2, 4}) {
      if (2 * c > fewest) break;  // a middle chunk takes two rows of every rank at least
      if (!chunks_beside(c)) continue;
      if (opt_.tp_overlap_chunks != 0) {
        if (c == opt_.tp_overlap_chunks) chunks = c;
        continue;
      }
      if (c > most_chunks) break;
      const double tc = time_of(c);
      if (tc < best && tc < t1 * 0.99) {
        chunks = c;
        best = tc;
      }
    }
    if (chunks == 1) return {};
    // Each rank's piece of a chunk in whole units of `align` rows where the
    // rows allow: a chunk's matmul then has a multiple of the devices' GEMM
    // tile in rows (outer dims x every rank's piece), not a last partial wave.
    int64_t outer = 1;
    for (int j = 0; j < ax; ++j) outer *= n.dims[j];
    int64_t tile = 1;
    for (const device_spec* m : members) tile = std::max(tile, m->gemm_row_tile);
    const int64_t align = tile / std::gcd(tile, outer * t_);
    std::vector<std::vector<int64_t>> piece(static_cast<std::size_t>(t_)), at_row(static_cast<std::size_t>(t_));
    for (int k = 0; k < t_; ++k) {
      const int64_t rows_k = want.end[static_cast<std::size_t>(k)] - want.begin[static_cast<std::size_t>(k)];
      std::vector<int64_t>& pk = piece[static_cast<std::size_t>(k)];
      if (align > 1 && rows_k / align >= chunks) {
        pk = apportion(rows_k / align, weights_of(chunks));
        for (int64_t& v : pk) v *= align;
        pk.back() += rows_k - rows_k / align * align;
      } else {
        pk = apportion(rows_k, weights_of(chunks));
      }
      int64_t o = 0;
      for (int64_t p : piece[static_cast<std::size_t>(k)]) {
        at_row[static_cast<std::size_t>(k)].push_back(o);
        o += p;
      }
    }
    const auto P = [&](int k, int c) { return piece[static_cast<std::size_t>(k)][static_cast<std::size_t>(c)]; };
    const auto O = [&](int k, int c) { return at_row[static_cast<std::size_t>(k)][static_cast<std::size_t>(c)]; };
    const auto lo = [&](int k, int c) { return O(k, c); };
    const auto hi = [&](int k, int c) { return O(k, c) + P(k, c); };
    const std::vector<std::map<node_id, std::vector<node_id>>> ag =
        chunk_all_gathers(x, reg[0].gathered, chunks, ax, ax, lo, hi, [&](node_id e, int c) {
          shape gathered = g_.at(e).dims;
          gathered[ax] = 0;
          for (int k = 0; k < t_; ++k) gathered[ax] += P(k, c);
          return gathered;
        });
    std::vector<std::vector<node_id>> reduced(static_cast<std::size_t>(t_));
    for (int c = 0; c < chunks; ++c) {
      const std::string tag = ".chunk" + std::to_string(c);
      std::vector<node_id> parts;
      for (int k = 0; k < t_; ++k)
        parts.push_back(chunk_part(x, reg[static_cast<std::size_t>(k)], k, tag, ag[static_cast<std::size_t>(c)],
                                   [&](node_id w) {
                                     // Chunk c's rows of every rank, in rank order, cut from all the rows.
                                     std::vector<node_id> cut;
                                     for (int j = 0; j < t_; ++j) {
                                       const int64_t b = want.begin[static_cast<std::size_t>(j)] + O(j, c);
                                       cut.push_back(slice_view(w, ax, b, b + P(j, c), at(w).name + tag, s, k, n.layer));
                                     }
                                     return emit_concat(std::move(cut), ax, at(w).name + tag, s, k, n.layer);
                                   },
                                   0));
      const auto rs = collective(op_kind::reduce_scatter, x, parts, {}, n.name + tag, [&](node& v, int k) {
        int64_t b = 0;
        for (int j = 0; j < k; ++j) b += P(j, c);
        v.attrs.axis = ax;
        v.attrs.begin = b;
        v.attrs.end = b + P(k, c);
      });
      for (int k = 0; k < t_; ++k) reduced[static_cast<std::size_t>(k)].push_back(rs[static_cast<std::size_t>(k)]);
    }
    return join_chunks(x, reduced, ax);
  }

  // ---------------------------------------------------------------- rules --

  /// Emits n on every rank with per-rank inputs; `adjust` edits the node.
  std::vector<node_id> each_rank(const node& n, const std::function<std::vector<node_id>(int)>& inputs,
                                 const std::function<void(node&, int)>& adjust = {}) {
    std::vector<node_id> r;
    const int s = stage(n.id);
    for (int k = 0; k < t_; ++k) {
      node m;
      m.op = n.op;
      m.attrs = n.attrs;
      m.type = n.type;
      m.layer = n.layer;
      m.name = local_name(n.name, s, k);
      m.inputs = inputs(k);
      if (adjust) adjust(m, k);
      if (is_view_op(n.op)) r.push_back(emit(std::move(m)));
      else r.push_back(emit_compute(std::move(m), s, k));
    }
    return r;
  }

  static std::vector<node_id> pick(const std::vector<std::vector<node_id>>& per_input, int k) {
    std::vector<node_id> r;
    for (const auto& v : per_input) r.push_back(v[static_cast<std::size_t>(k)]);
    return r;
  }

  void replicated_op(const node& n) {
    std::vector<std::vector<node_id>> ins;
    for (node_id i : n.inputs) ins.push_back(as_replicated(i));
    set_state(n.id, {}, each_rank(n, [&](int k) { return pick(ins, k); }));
  }

  /// Whether stage s's group runs sequence parallel (plan_options::sequence_parallel)
  /// for tensors of `dims` and `type`: auto wants a reduce-scatter that
  /// moves by the copy engines (CUDA GPUs) and tensors that reach every
  /// member's sequence_parallel_min_bytes at their row width
  /// (sequence_parallel_pays), or members that run collectives beside
  /// compute and a ring for that size (a one-shot reduce-scatter and
  /// all-gather pay two synchronisations where the all-reduce pays one).
  bool sequence_parallel(int s, const shape& dims, dtype type) const {
    const int64_t bytes = dims.numel() * static_cast<int64_t>(dtype_size(type));
    switch (opt_.sequence_parallel) {
      case sequence_parallel_mode::off: return false;
      case sequence_parallel_mode::on: return true;
      case sequence_parallel_mode::automatic: break;
    }
    const std::vector<const device_spec*> members = group_members(s);
    const collective_algo algo = choose_collective_algo(members, bytes, op_kind::reduce_scatter);
    if (algo == collective_algo::copy_engine)  // beside compute, as many bytes as a ring
      return std::all_of(members.begin(), members.end(), [&](const device_spec* m) {
        return sequence_parallel_pays(*m, bytes, dims.rank() > 0 ? dims[dims.rank() - 1] : 0);
      });
    if (!collectives_beside_compute(members)) return false;
    return algo == collective_algo::ring;
  }
  static int64_t bytes_of(const node& v) { return v.dims.numel() * static_cast<int64_t>(dtype_size(v.type)); }

  /// Sequence parallelism (plan_options::sequence_parallel): the rows state
  /// of a tensor of `dims`, sharded along its rows (the dim before the last,
  /// else the outermost other dim that has at least one row per rank) by
  /// the shard ratios; nullopt when sequence parallelism is off or no such
  /// dim splits over the ranks (a one-token decode step).
  std::optional<split_state> rows_state(const shape& dims, dtype type, int s) const {
    if (dims.rank() < 2 || !sequence_parallel(s, dims, type))
      return std::nullopt;
    std::vector<int> order{dims.rank() - 2};
    for (int d = 0; d < dims.rank() - 2; ++d) order.push_back(d);
    for (int d : order) {
      if (dims[d] < t_) continue;
      split_state st = sharded_on(d, {});
      int64_t at = 0;
      for (int64_t c : apportion(dims[d], ratios_)) {
        st.begin.push_back(at);
        st.end.push_back(at += c);
      }
      if (normalise(st, dims)) return st;
    }
    return std::nullopt;
  }

  /// Ops that keep x's state when `shard_ok` accepts it (and a partial one
  /// when `partial_ok`); their other inputs are replicated. Under sequence
  /// parallelism a partial x the op cannot take is reduce-scattered by rows
  /// where `shard_ok` accepts that state (a norm after a row-parallel
  /// matmul), instead of all-reduced.
  void same_state_op(const node& n, bool partial_ok, const std::function<bool(const split_state&)>& shard_ok) {
    const node_id x = n.inputs[0];
    const split_state st = ti(x).st;
    std::vector<std::vector<node_id>> ins(n.inputs.size());
    split_state out;
    const auto rows = st.k == skind::partial ? rows_state(g_.at(x).dims, g_.at(x).type, stage(n.id)) : std::nullopt;
    if (st.sharded() && !ti(x).pending && shard_ok(st)) {
      ins[0] = native(x);
      out = st;
    } else if (has_replicated(x)) {
      ins[0] = as_replicated(x);
    } else if (st.k == skind::partial && partial_ok) {
      ins[0] = native(x);
      out.k = skind::partial;
    } else if (rows && shard_ok(*rows)) {
      ins[0] = as_state(x, *rows);
      out = *rows;
    } else {
      ins[0] = as_replicated(x);
    }
    for (std::size_t i = 1; i < n.inputs.size(); ++i) ins[i] = as_replicated(n.inputs[i]);
    set_state(n.id, out, each_rank(n, [&](int k) { return pick(ins, k); }));
  }

  /// The state operand `y` (rank ry) must be in for an output state `so` of
  /// an op whose output dims `out` align y right (broadcast); nullopt when
  /// the shard's dims are partly broadcast in y.
  std::optional<split_state> need_for(node_id y, const shape& out, const split_state& so) {
    if (!so.sharded()) return so;
    const shape& yd = g_.at(y).dims;
    const int off = out.rank() - yd.rank();
    int bcast = 0, full = 0;
    for (int d = so.axis; d <= so.axis2; ++d) {
      const int j = d - off;
      if (j < 0 || yd[j] == 1) ++bcast;
      else if (yd[j] == out[d]) ++full;
      else return std::nullopt;
    }
    if (full == 0) return split_state{};
    if (bcast != 0) return std::nullopt;
    split_state r = so;
    r.axis -= off;
    r.axis2 -= off;
    return r;
  }

  void binary_op(const node& n) {
    const node_id a = n.inputs[0], b = n.inputs[1];
    const split_state sa = ti(a).pending ? split_state{} : ti(a).st;
    const split_state sb = ti(b).pending ? split_state{} : ti(b).st;
    const shape& od = n.dims;
    auto with = [&](const split_state& so) -> bool {
      auto na = need_for(a, od, so), nb = need_for(b, od, so);
      if (!na || !nb) return false;
      // A pending operand first: its reduce-scatter in chunks may redirect
      // the other operand's locals to pieces (chunked_reduce_scatter).
      std::vector<node_id> va, vb;
      if (ti(b).pending && !ti(a).pending) {
        vb = as_state(b, *nb);
        va = as_state(a, *na);
      } else {
        va = as_state(a, *na);
        vb = as_state(b, *nb);
      }
      set_state(n.id, so, each_rank(n, [&](int k) {
                  return std::vector<node_id>{va[static_cast<std::size_t>(k)], vb[static_cast<std::size_t>(k)]};
                }));
      return true;
    };
    if (sa.sharded() && ti(a).st.k == skind::sharded && !ti(a).pending && with(sa)) return;
    if (sb.sharded() && !ti(b).pending) {
      auto so = shift_state(sb, g_.at(b).dims, od, od.rank() - g_.at(b).dims.rank());
      if (so && normalise(*so, od) && with(*so)) return;
    }
    const bool ra = has_replicated(a), rb = has_replicated(b);
    const bool pa = ti(a).st.k == skind::partial, pb = ti(b).st.k == skind::partial;
    if (ra && rb) return (void)with(split_state{});
    split_state partial;
    partial.k = skind::partial;
    auto emit_with = [&](const std::vector<node_id>& va, const std::vector<node_id>& vb, const split_state& so) {
      set_state(n.id, so, each_rank(n, [&](int k) {
                  return std::vector<node_id>{va[static_cast<std::size_t>(k)], vb[static_cast<std::size_t>(k)]};
                }));
    };
    if (n.op == op_kind::add) {
      // partial + replicated: reduce first (Megatron: the residual stream
      // stays replicated, the all-reduce follows the row-parallel matmul).
      // Under sequence parallelism the residual stream is sharded by rows:
      // a partial is reduce-scattered, a replicated operand sliced. Two
      // partials stay partial (no collective) unless one of them has its rows
      // already (the embedding's, reduce-scattered for the first norm).
      const auto rows = rows_state(od, n.type, stage(n.id));
      auto has_rows = [&](node_id y) {
        const auto want = rows ? need_for(y, od, *rows) : std::nullopt;
        return want && want->sharded() && cheap(y, *want);
      };
      if (pa && pb && !ra && !rb && !has_rows(a) && !has_rows(b)) return emit_with(native(a), native(b), partial);
      if (rows && (pa || pb) && with(*rows)) return;
      if (fold_into_all_reduce(n)) return;
      return (void)with(split_state{});
    }
    // mul is linear in each operand: partial x replicated stays partial.
    if (pa && (rb || !pb)) return emit_with(native(a), as_replicated(b), partial);
    if (pb) return emit_with(as_replicated(a), native(b), partial);
    with(split_state{});
  }

  /// add(x, y) of a pending row-parallel matmul x (its all-reduce whole, not
  /// in chunks) that feeds nothing else and a replicated y of the same dims
  /// and dtype: rank 0 adds y to its part and the all-reduce of the parts is
  /// the sum, so no rank runs the add after the all-reduce. A residual add
  /// after the row-parallel o and down projections is one kernel fewer per
  /// rank, and rank 0's add joins its product as a residual projection
  /// (graph/fusion.hpp). The sum is rounded in another order than the
  /// reference's (rank 0's part and y first), as every all-reduce already is.
  bool fold_into_all_reduce(const node& n) {
    for (int side = 0; side < 2; ++side) {
      const node_id x = n.inputs[static_cast<std::size_t>(side)], y = n.inputs[static_cast<std::size_t>(1 - side)];
      if (x == y || ti(x).st.k != skind::partial || !ti(x).pending || !has_replicated(y)) continue;
      const node& xn = g_.at(x);
      const node& yn = g_.at(y);
      if (xn.dims != n.dims || yn.dims != n.dims || xn.type != n.type || yn.type != n.type) continue;
      if (g_.consumers(x).size() != 1) continue;
      if (std::find(g_.outputs().begin(), g_.outputs().end(), x) != g_.outputs().end()) continue;
      if (all_reduce_chunks(x) > 1) continue;
      std::vector<node_id> parts = native(x);
      const std::vector<node_id> ys = as_replicated(y);
      const int s = stage(n.id);
      node add;
      add.op = op_kind::add;
      add.attrs = n.attrs;
      add.type = n.type;
      add.layer = n.layer;
      add.name = local_name(n.name + ".into_part", s, 0);
      add.inputs = side == 0 ? std::vector<node_id>{parts[0], ys[0]} : std::vector<node_id>{ys[0], parts[0]};
      parts[0] = emit_compute(std::move(add), s, 0);
      // Named after the product it reduces, as the all-reduce it replaces.
      set_state(n.id, split_state{}, collective(op_kind::all_reduce, x, parts, {}, xn.name));
      return true;
    }
    return false;
  }

  /// Column ranges of `total` for a column-parallel split with granule chain
  /// `chain` (coarse to fine). Empty when no level has enough units.
  std::vector<std::pair<int64_t, int64_t>> column_ranges(int64_t total, std::vector<int64_t> chain) {
    std::vector<int64_t> ch;
    for (int64_t gr : chain)
      if (total % gr == 0) ch.push_back(gr);
    if (ch.empty()) ch.push_back(1);  // no structure downstream: any column count
    std::vector<std::pair<int64_t, int64_t>> r;
    for (std::size_t lvl = 0; lvl < ch.size(); ++lvl) {
      const int64_t gr = ch[lvl];
      const int64_t units = total / gr;
      if (units < t_) continue;
      if (lvl == 0) {
        const auto c = apportion(units, ratios_);
        int64_t at = 0;
        for (int64_t x : c) {
          r.emplace_back(at * gr, (at + x) * gr);
          at += x;
        }
        return r;
      }
      // Too few coarse blocks for the ranks: give each block a run of
      // consecutive ranks and split the block's fine units among them, so no
      // rank's range crosses a block boundary.
      const int64_t block = ch[lvl - 1];
      const int64_t blocks = total / block;
      const auto per_block = apportion(t_, std::vector<double>(static_cast<std::size_t>(blocks), 1.0));
      int rank = 0;
      for (int64_t bl = 0; bl < blocks; ++bl) {
        const int64_t nr = per_block[static_cast<std::size_t>(bl)];
        std::vector<double> sub(ratios_.begin() + rank, ratios_.begin() + rank + nr);
        const auto c = apportion(block / gr, sub);
        if (c.empty()) {
          r.clear();
          break;
        }
        int64_t at = bl * block / gr;
        for (int64_t x : c) {
          r.emplace_back(at * gr, (at + x) * gr);
          at += x;
        }
        rank += static_cast<int>(nr);
      }
      if (!r.empty()) return r;
    }
    return {};
  }

  static split_state sharded_on(int axis, const std::vector<std::pair<int64_t, int64_t>>& ranges) {
    split_state s;
    s.k = skind::sharded;
    s.axis = s.axis2 = axis;
    for (const auto& [b, e] : ranges) {
      s.begin.push_back(b);
      s.end.push_back(e);
    }
    return s;
  }

  void matmul_op(const node& n) {
    const node_id a = n.inputs[0], b = n.inputs[1];
    const node& an = g_.at(a);
    const node& bn = g_.at(b);
    const int ro = n.dims.rank(), ra = an.dims.rank(), rb = bn.dims.rank();
    const int ka = n.attrs.trans_a ? ra - 2 : ra - 1, ma = n.attrs.trans_a ? ra - 1 : ra - 2;
    const int kb = n.attrs.trans_b ? rb - 1 : rb - 2, nb = n.attrs.trans_b ? rb - 2 : rb - 1;
    const int s = stage(n.id);
    auto emit_pair = [&](const std::vector<node_id>& va, const std::vector<node_id>& vb, const split_state& so) {
      set_state(n.id, so, each_rank(n, [&](int k) {
                  return std::vector<node_id>{va[static_cast<std::size_t>(k)], vb[static_cast<std::size_t>(k)]};
                }));
    };
    // Partial operands are reduced first: a column-parallel matmul after the
    // reduction computes 1/t of the work; a partial one would compute it t times.
    const split_state sa = ti(a).st.k == skind::partial || ti(a).pending ? split_state{} : ti(a).st;
    const split_state sb = ti(b).st.k == skind::partial || ti(b).pending ? split_state{} : ti(b).st;

    // Rank k's piece of b (or a) matching the other operand's batch box.
    auto batch_slices = [&](node_id y, int ry, const shape& full_out, const split_state& so) {
      // y's batch dims j <-> out dims j + ro - ry
      const std::vector<node_id> full = as_replicated(y);
      std::vector<node_id> r;
      for (int k = 0; k < t_; ++k) {
        const box ob = rank_box(full_out, so, k);
        box yb;
        range_box(g_.at(y).dims, 0, ry - 1, 0, g_.at(y).dims.numel(), yb);
        for (int j = 0; j < ry - 2; ++j) {
          const int o = j + ro - ry;
          if (g_.at(y).dims[j] == 1) continue;
          yb.lo[static_cast<std::size_t>(j)] = ob.lo[static_cast<std::size_t>(o)];
          yb.hi[static_cast<std::size_t>(j)] = ob.hi[static_cast<std::size_t>(o)];
        }
        r.push_back(box_of_replicated(y, full[static_cast<std::size_t>(k)], yb, s, k));
      }
      return r;
    };
    auto in_batch_or = [](const split_state& st, int r, int extra) {
      for (int d = st.axis; d <= st.axis2; ++d)
        if (!(d < r - 2 || d == extra)) return false;
      return true;
    };

    // Sequence parallelism: rows of a (its M or batch dims) meet a weight
    // that the column-parallel rule splits: gather the rows (the all-gather
    // half of Megatron's all-reduce) rather than keep the rows sharded and
    // hold the whole weight on every rank. A weight whose columns cannot
    // split (kv heads fewer than ranks) reads the rows gathered already for
    // its neighbours (q), if any. A product narrower than its rows whose
    // weight is no larger than them (a small vocabulary's head) keeps the
    // rows instead, its weight replicated as a small embedding table is:
    // each rank multiplies its own rows, and what is gathered later (the
    // logits) is smaller than the rows would have been.
    const bool keep_rows = bytes_of(bn) <= bytes_of(an) && bytes_of(n) < bytes_of(an);
    const bool gather_rows =
        opt_.sequence_parallel != sequence_parallel_mode::off && sa.sharded() && !(sa.axis <= ka && ka <= sa.axis2) &&
        bn.op == op_kind::weight && rb == 2 && !sb.sharded() &&
        (has_replicated(a) ||
         (!keep_rows &&
          !column_ranges(bn.dims[nb], chain_[static_cast<std::size_t>(n.id)][static_cast<std::size_t>(ro - 1)]).empty()));
    if (gather_rows) (void)as_replicated(a);
    if (sa.sharded() && !gather_rows) {
      // Row-parallel: a sharded on K alone.
      if (sa.axis == ka && sa.axis2 == ka) {
        split_state want_b = sa;
        want_b.axis = want_b.axis2 = kb;
        auto vb = as_state(b, want_b);
        tensor_info& i = ti(n.id);
        i.st.k = skind::partial;
        i.pending = true;
        i.pa = native(a);
        i.pb = vb;
        return;
      }
      // a sharded on batch dims and/or M: out sharded alike; b sliced to match.
      if (in_batch_or(sa, ra, ma) && (n.attrs.trans_a ? (sa.axis == sa.axis2) : true)) {
        split_state so = sa;
        so.axis = sa.axis == ma ? ro - 2 : sa.axis + ro - ra;
        so.axis2 = sa.axis2 == ma ? ro - 2 : sa.axis2 + ro - ra;
        if (normalise(so, n.dims)) {
          bool b_batch = false;
          for (int d = sa.axis; d <= sa.axis2; ++d) {
            const int o = d == ma ? ro - 2 : d + ro - ra;
            const int j = o - (ro - rb);
            if (d != ma && j >= 0 && j < rb - 2 && bn.dims[j] != 1) b_batch = true;
          }
          std::vector<node_id> vb;
          if (!b_batch) {
            vb = as_replicated(b);
          } else {
            std::optional<split_state> mapped;
            if (so.axis2 < ro - 2) mapped = shift_state(so, n.dims, bn.dims, -(ro - rb));
            if (mapped && sb == *mapped && !ti(b).pending) vb = native(b);
            else vb = batch_slices(b, rb, n.dims, so);
          }
          return emit_pair(native(a), vb, so);
        }
      }
    }
    if (!sa.sharded() || has_replicated(a)) {
      // a replicated (or available so): follow b's shard, or split b's columns.
      if (sb.sharded()) {
        if (sb.axis == nb && sb.axis2 == nb) {
          split_state so = sb;
          so.axis = so.axis2 = ro - 1;
          return emit_pair(as_replicated(a), native(b), so);
        }
        if (sb.axis == kb && sb.axis2 == kb) {
          split_state want_a = sb;
          want_a.axis = want_a.axis2 = ka;
          split_state partial;
          partial.k = skind::partial;
          tensor_info& i = ti(n.id);
          i.st = partial;
          i.pending = true;
          i.pa = as_state(a, want_a);
          i.pb = native(b);
          return;
        }
        if (in_batch_or(sb, rb, -1)) {
          split_state so = sb;
          so.axis += ro - rb;
          so.axis2 += ro - rb;
          if (normalise(so, n.dims)) {
            bool a_batch = false;
            for (int d = sb.axis; d <= sb.axis2; ++d) {
              const int j = d + ro - rb - (ro - ra);
              if (j >= 0 && j < ra - 2 && an.dims[j] != 1) a_batch = true;
            }
            std::vector<node_id> va = a_batch ? batch_slices(a, ra, n.dims, so) : as_replicated(a);
            return emit_pair(va, native(b), so);
          }
        }
      }
      if (bn.op == op_kind::weight && rb == 2) {
        // Column-parallel: split the weight's output columns.
        const int64_t N = bn.dims[nb];
        const auto& chain = chain_[static_cast<std::size_t>(n.id)][static_cast<std::size_t>(ro - 1)];
        auto ranges = column_ranges(N, chain);
        if (!ranges.empty()) {
          const auto va = as_replicated(a);
          std::vector<node_id> vb;
          for (int k = 0; k < t_; ++k)
            vb.push_back(weight_slice(b, nb, ranges[static_cast<std::size_t>(k)].first, ranges[static_cast<std::size_t>(k)].second));
          return emit_pair(va, vb, sharded_on(ro - 1, ranges));
        }
        const int64_t fine = chain.empty() ? 1 : chain.back();
        if (fine > 1 && !bside_[static_cast<std::size_t>(n.id)][static_cast<std::size_t>(ro - 1)])
          fail(errc::invalid_argument,
               "tensor parallel degree " + std::to_string(t_) + ": cannot split " + label(n) + " (weight '" + bn.name +
                   "' dim " + std::to_string(nb) + ", " + std::to_string(N) + " = " + std::to_string(N / fine) +
                   " units of " + std::to_string(fine) + " that a reshape downstream splits into heads) over " +
                   std::to_string(t_) + " devices: fewer units than devices");
      }
    }
    replicated_op(n);
  }

  void get_rows_op(const node& n) {
    const node_id table = n.inputs[0], ids = n.inputs[1];
    const node& tn = g_.at(table);
    const split_state si = ti(ids).pending ? split_state{} : ti(ids).st;
    if (si.sharded()) {
      // ids sharded (batch): rows follow them.
      return set_state(n.id, si, each_rank(n, [&](int k) {
                         return std::vector<node_id>{as_replicated(table)[static_cast<std::size_t>(k)], native(ids)[static_cast<std::size_t>(k)]};
                       }));
    }
    const int64_t table_bytes = tn.dims.numel() * static_cast<int64_t>(dtype_size(tn.type));
    const int64_t out_bytes = n.dims.numel() * static_cast<int64_t>(dtype_size(n.type));
    if (tn.op == op_kind::weight && n.attrs.end == 0 && table_bytes <= out_bytes) {
      // A table no larger than its lookup's output (a prompt-sized lookup of a
      // small vocabulary): replicated. A vocabulary-parallel lookup writes as
      // many bytes per rank and then all-reduces the whole output (64 MiB at
      // d 8192, T 2048, B 2: ~280 us on 4 H200s), while the extra memory of
      // the copies is at most the activation that all-reduce would move.
      const auto ti_ = as_replicated(table);
      const auto vi = as_replicated(ids);
      return set_state(n.id, split_state{}, each_rank(n, [&](int k) {
        return std::vector<node_id>{ti_[static_cast<std::size_t>(k)], vi[static_cast<std::size_t>(k)]};
      }));
    }
    if (tn.op == op_kind::weight && n.attrs.end == 0 && tn.dims[0] >= t_) {
      // Vocabulary-parallel: each rank looks up the ids its rows hold (zeros
      // elsewhere); the sum over ranks is the lookup.
      const auto c = apportion(tn.dims[0], ratios_);
      const auto vi = as_replicated(ids);
      std::vector<int64_t> lo;
      int64_t at = 0;
      for (int64_t x : c) {
        lo.push_back(at);
        at += x;
      }
      split_state partial;
      partial.k = skind::partial;
      return set_state(n.id, partial, each_rank(n, [&](int k) {
        return std::vector<node_id>{weight_slice(table, 0, lo[static_cast<std::size_t>(k)], lo[static_cast<std::size_t>(k)] + c[static_cast<std::size_t>(k)]),
                                    vi[static_cast<std::size_t>(k)]};
      }, [&](node& m, int k) {
        m.attrs.begin = lo[static_cast<std::size_t>(k)];
        m.attrs.end = tn.dims[0];
      }));
    }
    replicated_op(n);
  }

  void concat_op(const node& n) {
    const node_id x0 = n.inputs[0];
    const split_state s0 = ti(x0).pending ? split_state{} : ti(x0).st;
    bool all_same = s0.k != skind::replicated;
    for (node_id in : n.inputs) all_same = all_same && !ti(in).pending && ti(in).st == s0;
    if (all_same && s0.k == skind::partial) {
      std::vector<std::vector<node_id>> ins;
      for (node_id in : n.inputs) ins.push_back(native(in));
      return set_state(n.id, s0, each_rank(n, [&](int k) { return pick(ins, k); }));
    }
    if (all_same && s0.sharded() && (n.attrs.axis < s0.axis || n.attrs.axis > s0.axis2)) {
      // Concatenating along a dim outside the shard's group: the group has
      // the same sizes in every input and the output, so the ranges carry.
      std::vector<std::vector<node_id>> ins;
      for (node_id in : n.inputs) ins.push_back(native(in));
      return set_state(n.id, s0, each_rank(n, [&](int k) { return pick(ins, k); }));
    }
    replicated_op(n);
  }

  // ----------------------------------------------------------------- views --

  void view_op(const node& n) {
    const node_id x = n.inputs[0];
    const int s = stage(n.id);
    if (n.op == op_kind::view) {
      // Arbitrary strides into the storage: apply them to the whole storage.
      const node_id root = storage_root(g_, x);
      const auto full = as_replicated(root);
      return set_state(n.id, {}, each_rank(n, [&](int k) { return std::vector<node_id>{full[static_cast<std::size_t>(k)]}; },
                                           [&](node& v, int) {
                                             v.dims = n.dims;
                                             v.stride = n.stride;
                                             v.offset = n.offset;
                                           }));
    }
    const split_state st = ti(x).pending ? split_state{} : ti(x).st;
    const shape& xd = g_.at(x).dims;
    std::optional<split_state> so;
    if (st.k == skind::partial) so = st;  // views are linear: a partial view is the view of the partial
    else if (st.sharded()) {
      switch (n.op) {
        case op_kind::reshape: so = map_reshape(st, xd, n.dims); break;
        case op_kind::permute: so = map_permute(st, n.attrs.perm, xd.rank()); break;
        case op_kind::transpose: {
          std::array<int, max_rank> perm{0, 1, 2, 3};
          std::swap(perm[static_cast<std::size_t>(n.attrs.axis)], perm[static_cast<std::size_t>(n.attrs.axis2)]);
          so = map_permute(st, perm, xd.rank());
          break;
        }
        case op_kind::slice: {
          const int ax = n.attrs.axis;
          if (ax < st.axis || ax > st.axis2) {
            so = st;
          } else if (st.axis == st.axis2) {
            split_state r = st;
            for (std::size_t k = 0; k < r.begin.size(); ++k) {
              r.begin[k] = std::clamp(st.begin[k], n.attrs.begin, n.attrs.end) - n.attrs.begin;
              r.end[k] = std::clamp(st.end[k], n.attrs.begin, n.attrs.end) - n.attrs.begin;
            }
            if (normalise(r, n.dims)) so = r;
          }
          break;
        }
        default: break;
      }
      if (so && !normalise(*so, n.dims)) so.reset();
    }
    if (!so && has_replicated(x)) so = split_state{};
    std::vector<node_id> in;
    if (so && so->k != skind::replicated) {
      in = native(x);
    } else {
      so = split_state{};
      in = as_replicated(x);
    }
    const split_state out = *so;
    std::vector<node_id> loc;
    for (int k = 0; k < t_; ++k) {
      node_id src = in[static_cast<std::size_t>(k)];
      node v;
      v.op = n.op;
      v.attrs = n.attrs;
      v.layer = n.layer;
      v.name = local_name(n.name, s, k);
      if (n.op == op_kind::reshape) {
        src = contiguous(src, s < 0 ? 0 : s, k, n.layer);
        v.dims = local_dims(n.dims, out, k);
      } else if (n.op == op_kind::slice && out.sharded() && n.attrs.axis >= st.axis && n.attrs.axis <= st.axis2) {
        // The slice cuts the shard's own dim: rank k keeps its overlap.
        const int64_t lo = st.begin[static_cast<std::size_t>(k)];
        v.attrs.begin = std::max(n.attrs.begin, lo) - lo;
        v.attrs.end = std::min(n.attrs.end, st.end[static_cast<std::size_t>(k)]) - lo;
        if (v.attrs.begin == 0 && v.attrs.end == at(src).dims[n.attrs.axis]) {
          loc.push_back(src);
          continue;
        }
      }
      v.inputs = {src};
      loc.push_back(emit(std::move(v)));
    }
    set_state(n.id, out, std::move(loc));
  }

  // ------------------------------------------------------------- dispatch --

  void apply(const node& n) {
    tensor_info& i = ti(n.id);
    switch (n.op) {
      case op_kind::input:
        return;
      case op_kind::weight: {
        node w;
        w.op = op_kind::weight;
        w.name = n.name;
        w.data = n.data;
        w.layer = n.layer;
        w.pinned_device = pin_of_leaf(n);
        i.loc.assign(static_cast<std::size_t>(t_), emit(std::move(w), false));
        return;
      }
      case op_kind::matmul: return matmul_op(n);
      case op_kind::add:
      case op_kind::mul: return binary_op(n);
      case op_kind::scale:
        return same_state_op(n, true, [](const split_state&) { return true; });
      case op_kind::gelu:
      case op_kind::silu:
        return same_state_op(n, false, [](const split_state&) { return true; });
      case op_kind::copy: {
        const bool cast = n.type != g_.at(n.inputs[0]).type;
        return same_state_op(n, !cast, [](const split_state&) { return true; });
      }
      case op_kind::rms_norm:
      case op_kind::layer_norm: {
        const int last = n.dims.rank() - 1;
        return same_state_op(n, false, [last](const split_state& st) { return st.axis2 < last; });
      }
      case op_kind::softmax: {
        const int keep = n.attrs.causal ? n.dims.rank() - 2 : n.dims.rank() - 1;
        return same_state_op(n, false, [keep](const split_state& st) { return st.axis2 < keep; });
      }
      case op_kind::argmax: {
        // Over whole rows: shards of the leading dims only.
        const int last = n.dims.rank() - 1;
        return same_state_op(n, false, [last](const split_state& st) { return st.axis2 < last; });
      }
      case op_kind::rope: {
        const int r = n.dims.rank();
        // Per head: shards of H (dim -2) or of the leading (batch) dims.
        return same_state_op(n, false, [r](const split_state& st) {
          return (st.axis == r - 2 && st.axis2 == r - 2) || st.axis2 < r - 3;
        });
      }
      case op_kind::get_rows: return get_rows_op(n);
      case op_kind::range_mask:
        // Replicated: its inputs are a few KiB, so every rank builds the
        // whole mask rather than receive shards of it.
        return same_state_op(n, false, [](const split_state&) { return false; });
      case op_kind::store_rows: {
        // State is kept per device: each rank stores its shard of the rows
        // (a KV cache by kv head) when the shard leaves the stored axis whole.
        const int axis = n.attrs.axis;
        return same_state_op(n, false, [axis](const split_state& st) { return st.axis2 < axis || st.axis > axis; });
      }
      case op_kind::concat: return concat_op(n);
      case op_kind::reshape:
      case op_kind::view:
      case op_kind::permute:
      case op_kind::transpose:
      case op_kind::slice: return view_op(n);
      case op_kind::all_reduce:
      case op_kind::all_gather:
      case op_kind::reduce_scatter:
        fail(errc::invalid_argument, label(n) + ": the graph already holds collectives; tensor parallelism rewrites "
                                                "graphs without them");
    }
  }

  /// Output o whole on one device (rank 0 of its stage).
  node_id whole_output(node_id o) {
    const node& n = g_.at(o);
    const int s = std::max(0, stage(o));
    node_id id = no_node;
    const split_state st = ti(o).st;
    if (has_replicated(o) || !st.sharded()) {
      id = as_replicated(o)[0];
    } else if (st.axis == st.axis2) {
      // Gather onto rank 0 only: a concat there (the planner copies the
      // shards, or each rank copies its own to the host: output_pieces). A
      // rank's rows made from chunks of rows are given in two pieces: the
      // last chunk's, and the others' together, so only the last chunk's
      // last ops and copy to the host follow the last reduce-scatter (the
      // others' run beside it), without a launch per chunk.
      std::vector<node_id> parts;
      for (int k = 0; k < t_; ++k) {
        const node_id local = native(o)[static_cast<std::size_t>(k)];
        std::vector<int64_t> bounds = opt_.output_pieces ? piece_bounds(local, st.axis) : std::vector<int64_t>{};
        if (bounds.size() > 3) bounds.erase(bounds.begin() + 1, bounds.end() - 2);
        std::vector<node_id> pieces, again;
        const auto first = static_cast<node_id>(out_.size());
        for (std::size_t c = 0; c + 1 < bounds.size(); ++c) {
          const node_id p = rows_piece(local, st.axis, bounds[c], bounds[c + 1], ".piece" + std::to_string(c), s, k, again);
          if (p == no_node) break;
          pieces.push_back(p);
        }
        mark_hand_over(first);
        if (pieces.size() + 1 != bounds.size() || pieces.empty()) pieces = {local};
        parts.insert(parts.end(), pieces.begin(), pieces.end());
      }
      id = emit_concat(std::move(parts), st.axis, n.name + ".gathered", s, 0, n.layer);
    } else {
      id = as_replicated(o)[0];
    }
    // The output keeps the user's name (job outputs, describe, traces). A
    // state store keeps its rank's name ("<state>@<device>", the name other
    // plans sharing the state find it by: plan_options::share_state_with),
    // and the output is a view of it under the user's name.
    if (is_state_op(at(id).op)) {
      const shape dims = at(id).dims;
      id = emit_view(op_kind::reshape, n.name + ".output", id, s, 0, n.layer, [&](node& v) { v.dims = dims; });
    } else if (std::find(outputs_.begin(), outputs_.end(), id) != outputs_.end()) {
      // Two outputs resolved to one node (a view that kept its source): copy.
      node c;
      c.op = op_kind::copy;
      c.type = at(id).type;
      c.name = n.name + ".output";
      c.inputs = {id};
      c.layer = n.layer;
      id = emit_compute(std::move(c), s, 0);
    }
    // (Bare names of the user's graph are reserved for it: only leaves use
    // them, and an output that is not a leaf gets its own back here.)
    node& on = out_[static_cast<std::size_t>(id)];
    if (!is_leaf_op(on.op)) on.name = n.name;
    return id;
  }
};

}  // namespace

expected<tp_rewrite> rewrite_tensor_parallel(std::shared_ptr<const graph> gp, const std::vector<device_spec>& devices,
                                             const plan_options& options) {
  if (!gp) return error(errc::invalid_argument, "tensor parallel: graph is null");
  const int ndev = static_cast<int>(devices.size());
  const int t = options.tensor_parallel;
  if (t < 1) return error(errc::invalid_argument, "tensor_parallel must be >= 1, got " + std::to_string(t));
  if (t > ndev)
    return error(errc::invalid_argument, "tensor_parallel degree " + std::to_string(t) + " is larger than the " +
                                             std::to_string(ndev) + " device(s) given");
  int stages = options.pipeline_stages > 0 ? options.pipeline_stages : ndev / t;
  if (options.policy == placement_policy::single) stages = 1;
  if (stages * t > ndev)
    return error(errc::invalid_argument, "layout " + std::to_string(stages) + " stages x " + std::to_string(t) +
                                             " tensor-parallel needs " + std::to_string(stages * t) + " devices, " +
                                             std::to_string(ndev) + " given");
  std::vector<double> ratios = options.shard_ratios;
  if (ratios.empty()) ratios.assign(static_cast<std::size_t>(t), 1.0);
  if (static_cast<int>(ratios.size()) != t)
    return error(errc::invalid_argument, "shard_ratios has " + std::to_string(ratios.size()) + " entries, the tensor-parallel degree is " +
                                             std::to_string(t));
  for (std::size_t k = 0; k < ratios.size(); ++k)
    if (!std::isfinite(ratios[k]) || !(ratios[k] > 0))
      return error(errc::invalid_argument, "shard ratio " + std::to_string(k) + " is " + std::to_string(ratios[k]) +
                                               ": ratios must be finite and > 0");
  try {
    const graph& g = *gp;
    std::vector<char> needed(g.size(), 0);
    {
      std::vector<node_id> stack = pruning_roots(g);
      while (!stack.empty()) {
        const node_id id = stack.back();
        stack.pop_back();
        if (needed[static_cast<std::size_t>(id)]) continue;
        needed[static_cast<std::size_t>(id)] = 1;
        for (node_id i : g.at(id).inputs) stack.push_back(i);
        if (g.at(id).storage != id) stack.push_back(g.at(id).storage);
      }
    }
    int splits = 0;
    auto split = split_fused_matmuls(g, needed, splits);
    if (!split) return split.err();
    auto analysed = splits > 0 ? std::make_shared<const graph>(std::move(*split)) : gp;
    rewriter r(*analysed, devices, options, t, stages, std::move(ratios));
    return r.run(gp, analysed);
  } catch (const tp_failure& f) {
    return f.e;
  }
}

}  // namespace ag
