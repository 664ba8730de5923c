#include "graph/fusion.hpp"

#include <algorithm>
#include <optional>

#include "graph/plan.hpp"
#include "graph/planner_internal.hpp"

namespace ag {
namespace {

/// The non-view node `id` is read as, through reshapes only (nullopt when a
/// permute, transpose, slice or view is in the way: the row order changes).
std::optional<node_id> through_reshapes(const graph& g, node_id id) {
  while (is_view_op(g.at(id).op)) {
    if (g.at(id).op != op_kind::reshape) return std::nullopt;
    id = g.at(id).inputs.at(0);
  }
  return id;
}

/// Every reader of `x` (through views) is in `readers`, and neither x nor a
/// view of it is a graph output.
bool only_read_by_any(const graph& g, node_id x, const std::vector<node_id>& readers) {
  for (node_id o : g.outputs())
    if (o == x) return false;
  for (node_id c : g.consumers(x)) {
    if (std::find(readers.begin(), readers.end(), c) != readers.end()) continue;
    if (!is_view_op(g.at(c).op) || !only_read_by_any(g, c, readers)) return false;
  }
  return true;
}

/// Every reader of `x` (through views) is `reader`, and x is no graph output.
bool only_read_by(const graph& g, node_id x, node_id reader) { return only_read_by_any(g, x, {reader}); }

bool same_batch(const shape& a, const shape& b) {
  if (a.rank() != b.rank()) return false;
  for (int d = 0; d + 2 < a.rank(); ++d)
    if (a[d] != b[d]) return false;
  return true;
}

/// The chain starting at ops[i], or nullopt.
std::optional<attention_fusion> match(const graph& g, const std::vector<node_id>& ops, std::size_t i,
                                      device_kind kind) {
  const node& qk = g.at(ops[i]);
  if (qk.op != op_kind::matmul || qk.attrs.trans_a || !qk.attrs.trans_b) return std::nullopt;
  std::size_t k = i + 1;
  const node* add = nullptr;
  if (k < ops.size() && g.at(ops[k]).op == op_kind::add) add = &g.at(ops[k++]);
  if (k + 1 >= ops.size()) return std::nullopt;
  const node& sm = g.at(ops[k]);
  const node& pv = g.at(ops[k + 1]);
  if (sm.op != op_kind::softmax || pv.op != op_kind::matmul || pv.attrs.trans_a || pv.attrs.trans_b) return std::nullopt;
  if (add) {
    if (through_reshapes(g, add->inputs[0]) != qk.id || !only_read_by(g, qk.id, add->id)) return std::nullopt;
    if (through_reshapes(g, sm.inputs[0]) != add->id || !only_read_by(g, add->id, sm.id)) return std::nullopt;
  } else if (through_reshapes(g, sm.inputs[0]) != qk.id || !only_read_by(g, qk.id, sm.id)) {
    return std::nullopt;
  }
  if (through_reshapes(g, pv.inputs[0]) != sm.id || !only_read_by(g, sm.id, pv.id)) return std::nullopt;
  const node& q = g.at(qk.inputs[0]);
  const node& kk = g.at(qk.inputs[1]);
  const node& v = g.at(pv.inputs[1]);
  const int r = q.dims.rank();
  if (r < 3 || r > 4 || !same_batch(q.dims, kk.dims) || !same_batch(q.dims, v.dims) || !same_batch(q.dims, pv.dims))
    return std::nullopt;
  const int64_t M = q.dims[-2], dh = q.dims[-1], keys = kk.dims[-2];
  if (kk.dims[-1] != dh || v.dims[-1] != dh || v.dims[-2] != keys || pv.dims[-2] != M || pv.dims[-1] != dh)
    return std::nullopt;
  const dtype t = q.type;
  const int64_t batch_entries = M * dh > 0 ? q.dims.numel() / (M * dh) : 0;
  if (kind == device_kind::cpu) {
    // The cpu kernel takes any sizes; decode-sized queries keep the separate
    // ops' few-row products (gpu/cpu/few_rows.hpp) except over a long masked
    // cache, whose rows past the sequence the fused kernel does not read.
    const bool long_cache = add && kk.op == op_kind::store_rows && v.op == op_kind::store_rows &&
                            keys >= cpu_fused_cache_min_keys;
    if ((M <= fused_attention_max_rows && !long_cache) || keys < 1) return std::nullopt;
  } else {
    // A long KV cache: the split kernel, whatever the keys; and whatever
    // the query rows up to fused_attention_split_max_rows when they are a
    // few softmax rows of several heads (a batched decode step).
    const bool cache = kk.op == op_kind::store_rows && v.op == op_kind::store_rows && fused_attention_any_keys(dh);
    const bool split_rows = cache && fused_attention_split_rows_fit(M, sm.dims[-2], dh);
    const bool flash = M > fused_attention_max_rows && !split_rows && keys >= 1 &&
                       fused_flash_attention_fits(t, dh, batch_entries);
    if (!flash && ((M > fused_attention_max_rows && !split_rows) || keys < 1 || dh > fused_attention_max_head ||
                   (!cache && (keys > fused_attention_max_keys || M * keys > fused_attention_max_scores))))
      return std::nullopt;
  }
  if ((t != dtype::f32 && t != dtype::bf16 && t != dtype::f16) || kk.type != t || v.type != t || pv.type != t ||
      qk.type != t || sm.type != t)
    return std::nullopt;
  if (sm.dims.rank() < 2 || sm.dims[-1] != keys) return std::nullopt;
  const int64_t S = sm.dims[-2];
  if (S < 1 || M % S != 0) return std::nullopt;
  attention_fusion f;
  if (add) {
    // scores [.., S, keys] + mask [S, keys] (leading dims 1), nothing else.
    const node& mask = g.at(add->inputs[1]);
    if (mask.type != t || add->type != t || add->dims != g.at(add->inputs[0]).dims || mask.dims.rank() < 2 ||
        mask.dims[-1] != keys || mask.dims[-2] != S || mask.dims.numel() != S * keys)
      return std::nullopt;
    f.mask_add = add->id;
  }
  f.scores = qk.id;
  f.softmax = sm.id;
  f.out = pv.id;
  return f;
}

/// A neox rope of [.., S, H, dh] rows by positions i32 [S], same dtype in and out.
bool is_fusable_rope(const graph& g, const node& r, int64_t dh, dtype t) {
  if (r.op != op_kind::rope || r.attrs.rope != rope_mode::neox || r.inputs.size() != 2 || r.type != t) return false;
  const node& x = g.at(r.inputs[0]);
  return x.type == t && x.dims == r.dims && r.dims.rank() >= 3 && r.dims[-1] == dh &&
         g.at(r.inputs[1]).type == dtype::i32;
}

/// The cache prologue of chain `f` (graph/fusion.hpp), filled in when its
/// ops are the compute ops right before ops[i] (the chain's scores).
void match_prologue(const graph& g, const std::vector<node_id>& ops, std::size_t i, attention_fusion& f) {
  const node& qk = g.at(f.scores);
  const node& pv = g.at(f.out);
  const node& q = g.at(qk.inputs[0]);
  const int64_t dh = q.dims[-1];
  const dtype t = q.type;
  if (!fused_attention_any_keys(dh)) return;  // the prologue runs in the split kernel only
  const node& ks = g.at(qk.inputs[1]);
  const node& vs = g.at(pv.inputs[1]);
  if (ks.op != op_kind::store_rows || vs.op != op_kind::store_rows || !only_read_by(g, ks.id, qk.id) ||
      !only_read_by(g, vs.id, pv.id))
    return;
  const node& k_rows = g.at(ks.inputs[0]);
  const node& v_rows = g.at(vs.inputs[0]);
  const int rank = ks.dims.rank();
  // Both caches [.., keys, dh] along the keys, the same positions, S <= 16
  // new rows of k and v alike, one per softmax row position.
  if (ks.attrs.axis != rank - 2 || vs.attrs.axis != rank - 2 || ks.inputs[1] != vs.inputs[1] || ks.dims != vs.dims ||
      k_rows.dims != v_rows.dims || k_rows.type != t || v_rows.type != t || ks.type != t || vs.type != t ||
      k_rows.dims.rank() != rank || k_rows.dims[-2] > fused_attention_max_new_rows ||
      k_rows.dims[-2] != g.at(f.softmax).dims[-2])
    return;
  for (int d = 0; d < rank; ++d)
    if (d != rank - 2 && k_rows.dims[d] != ks.dims[d]) return;
  const int64_t S = k_rows.dims[-2];
  // The ropes: neox, S positions, read by nothing but the chain.
  const auto rope_of = [&](node_id viewed, node_id reader) {
    const node_id r = storage_root(g, viewed);
    const node& n = g.at(r);
    return is_fusable_rope(g, n, dh, t) && g.at(n.inputs[1]).dims.numel() == S && only_read_by(g, r, reader) ? r
                                                                                                             : no_node;
  };
  attention_fusion p = f;
  p.k_store = ks.id;
  p.v_store = vs.id;
  p.k_rope = rope_of(ks.inputs[0], ks.id);
  p.q_rope = rope_of(qk.inputs[0], qk.id);
  if (p.q_rope != no_node && p.k_rope != no_node &&
      (g.at(p.q_rope).inputs[1] != g.at(p.k_rope).inputs[1] || g.at(p.q_rope).attrs.theta != g.at(p.k_rope).attrs.theta ||
       !(g.at(p.q_rope).attrs.rope_scale == g.at(p.k_rope).attrs.rope_scale)))
    p.q_rope = no_node;
  // Its ops must be the ones right before the scores (any order): with q's
  // rope, else without it.
  const auto right_before = [&](const attention_fusion& c) {
    const auto n = static_cast<std::size_t>(c.prologue_ops());
    if (n > i) return false;
    for (std::size_t back = 1; back <= n; ++back) {
      const node_id id = ops[i - back];
      if (id != c.k_store && id != c.v_store && id != c.k_rope && id != c.q_rope) return false;
    }
    return true;
  };
  if (!right_before(p)) {
    if (p.q_rope == no_node) return;
    p.q_rope = no_node;
    if (!right_before(p)) return;
  }
  f = p;
}

/// x [.., K] (read as rows of K) times the weight leaf w [N, K] transposed,
/// within the GEMV kernel's limits (graph/fusion.hpp, projection_fusion).
bool is_gemv_projection(const graph& g, const node& mm) {
  if (mm.op != op_kind::matmul || mm.attrs.trans_a || !mm.attrs.trans_b || mm.inputs.size() != 2) return false;
  const node& x = g.at(mm.inputs[0]);
  const node& w = g.at(mm.inputs[1]);
  if (w.op != op_kind::weight || w.dims.rank() != 2 || x.dims.rank() < 2) return false;
  const dtype t = x.type;
  if ((t != dtype::f32 && t != dtype::f16 && t != dtype::bf16) || w.type != t || mm.type != t) return false;
  const int64_t K = w.dims[1], esz = static_cast<int64_t>(dtype_size(t));
  if (x.dims[-1] != K || (K * esz) % 16 != 0 || x.dims.numel() / K > fused_gemv_max_rows) return false;
  return x.contiguous() && (x.offset * esz) % 16 == 0 && mm.dims[-1] == w.dims[0];
}

/// The elementwise op `n` (add / mul) has the inputs {a, b} in either order, and its dims.
bool binary_of(const graph& g, const node& n, node_id a, node_id b) {
  if (n.inputs.size() != 2) return false;
  const bool ab = n.inputs[0] == a && n.inputs[1] == b, ba = n.inputs[0] == b && n.inputs[1] == a;
  return (ab || ba) && g.at(a).dims == n.dims && g.at(b).dims == n.dims && g.at(b).type == n.type &&
         g.at(a).type == n.type;
}

/// A gated group starts at ops[i]: gate = x w_g^T, up = x w_u^T (same x and
/// dims), silu(gate), mul(silu, up), each intermediate read only by the next.
bool gated_at(const graph& g, const std::vector<node_id>& ops, std::size_t i) {
  if (i + 3 >= ops.size()) return false;
  const node &gate = g.at(ops[i]), &up = g.at(ops[i + 1]), &act = g.at(ops[i + 2]), &mul = g.at(ops[i + 3]);
  return is_gemv_projection(g, gate) && is_gemv_projection(g, up) && up.inputs[0] == gate.inputs[0] &&
         up.dims == gate.dims && act.op == op_kind::silu && act.inputs.size() == 1 && act.inputs[0] == gate.id &&
         act.dims == gate.dims && act.type == gate.type && mul.op == op_kind::mul && binary_of(g, mul, act.id, up.id) &&
         only_read_by(g, gate.id, act.id) && only_read_by(g, act.id, mul.id) && only_read_by(g, up.id, mul.id);
}

/// The projection group starting at ops[i], or nullopt.
std::optional<projection_fusion> match_projection(const graph& g, const std::vector<node_id>& ops, std::size_t i) {
  const node& first = g.at(ops[i]);
  if (!is_gemv_projection(g, first)) return std::nullopt;
  auto at = [&](std::size_t k) -> const node* { return k < ops.size() ? &g.at(ops[k]) : nullptr; };
  auto same_x = [&](const node* n) {
    return n && is_gemv_projection(g, *n) && n->inputs[0] == first.inputs[0];
  };
  projection_fusion f;
  if (gated_at(g, ops, i)) {
    f.kind = projection_kind::gated;
    f.ops = {ops[i], ops[i + 1], ops[i + 2], ops[i + 3]};
    return f;
  }
  // residual: m = x w^T, add(r, m)
  if (const node* add = at(i + 1); add && add->op == op_kind::add && add->inputs.size() == 2 &&
                                   (add->inputs[0] == first.id) != (add->inputs[1] == first.id)) {
    const node_id r = add->inputs[0] == first.id ? add->inputs[1] : add->inputs[0];
    if (binary_of(g, *add, first.id, r) && g.at(r).contiguous() && only_read_by(g, first.id, add->id)) {
      f.kind = projection_kind::residual;
      f.ops = {first.id, add->id};
      return f;
    }
  }
  // shared_input: 2-3 consecutive projections of one x
  f.kind = projection_kind::shared_input;
  f.ops = {first.id};
  for (std::size_t k = i + 1; k < i + 3 && same_x(at(k)); ++k) {
    if (gated_at(g, ops, k)) break;  // a gated group further on keeps its gate (gate and up share x too)
    f.ops.push_back(ops[k]);
  }
  if (f.ops.size() < 2) return std::nullopt;
  return f;
}

/// ops[i - 1] is an rms_norm that group `f` (shared_input or gated, found at
/// ops[i]) can take in as its prologue: the norm's output is the matmuls' x
/// and nothing else reads it; its input has x's dims, dtype and layout
/// limits, its weight (if any) is a contiguous, 16-byte aligned [K] of that
/// dtype.
bool norm_prologue_at(const graph& g, const std::vector<node_id>& ops, std::size_t i, const projection_fusion& f) {
  if (i == 0 || f.kind == projection_kind::residual) return false;
  const node& norm = g.at(ops[i - 1]);
  const node& mm = g.at(f.ops.front());
  if (norm.op != op_kind::rms_norm || mm.inputs.at(0) != norm.id || norm.inputs.empty()) return false;
  std::vector<node_id> matmuls;
  for (node_id id : f.ops)
    if (g.at(id).op == op_kind::matmul) matmuls.push_back(id);
  if (!only_read_by_any(g, norm.id, matmuls)) return false;
  const node& x = g.at(norm.inputs[0]);
  const int64_t esz = static_cast<int64_t>(dtype_size(norm.type));
  if (x.type != norm.type || x.dims != norm.dims || !x.contiguous() || (x.offset * esz) % 16 != 0)
    return false;
  if (norm.inputs.size() < 2) return true;
  const node& w = g.at(norm.inputs[1]);
  return w.type == norm.type && w.dims.rank() == 1 && w.dims[0] == norm.dims[-1] && w.contiguous() &&
         (w.offset * esz) % 16 == 0;
}

/// The rope `r` can be the epilogue of matmul `mm` of a shared-input group:
/// its input is mm's output reshaped to [.., S, H, D] (mm's storage from its
/// first element, contiguous, the same elements; H x D its N, so that x's
/// row r is position r % S), mm's output read by nothing else, D even,
/// positions i32 [S], one dtype.
bool rope_epilogue_of(const graph& g, const node& r, const node& mm) {
  if (r.op != op_kind::rope || r.inputs.size() != 2 || r.type != mm.type || r.dims.rank() < 3) return false;
  const node& x = g.at(r.inputs[0]);
  const int64_t D = r.dims[-1];
  if (x.storage != mm.id || x.offset != 0 || !x.contiguous() || x.dims != r.dims || x.type != mm.type ||
      x.dims.numel() != mm.dims.numel() || D < 2 || D % 2 != 0 || D > fused_gemv_rope_max_head ||
      r.dims[-2] * D != mm.dims[-1] || !r.contiguous())
    return false;
  const node& pos = g.at(r.inputs[1]);
  return pos.type == dtype::i32 && pos.dims.numel() == r.dims[-3] && only_read_by(g, mm.id, r.id);
}

/// How many of the ops right after a shared-input group (ops[i] on) are
/// ropes it can take in as epilogues (projection_fusion::ropes): each of a
/// different matmul of the group, one positions input, theta and mode, none
/// taken by an attention chain; none where an output of the group has an
/// odd N (the kernel then works in pairs of rows).
int rope_epilogues_at(const graph& g, const std::vector<node_id>& ops, std::size_t i, const projection_fusion& f,
                      const std::vector<char>& taken) {
  for (node_id id : f.ops)
    if (g.at(id).op == op_kind::matmul && g.at(id).dims[-1] % 2 != 0) return 0;
  std::vector<node_id> roped;
  const node* first = nullptr;
  for (std::size_t k = i; k < ops.size() && roped.size() < 3; ++k) {
    const node& r = g.at(ops[k]);
    if (r.op != op_kind::rope || taken[static_cast<std::size_t>(r.id)]) break;
    const auto mm = std::find_if(f.ops.begin(), f.ops.end(), [&](node_id id) {
      return g.at(id).op == op_kind::matmul && rope_epilogue_of(g, r, g.at(id));
    });
    if (mm == f.ops.end() || std::find(roped.begin(), roped.end(), *mm) != roped.end()) break;
    if (first && (r.inputs[1] != first->inputs[1] || r.attrs.theta != first->attrs.theta ||
                  !(r.attrs.rope_scale == first->attrs.rope_scale) ||
                  r.attrs.rope != first->attrs.rope || r.dims[-1] != first->dims[-1]))
      break;
    if (!first) first = &r;
    roped.push_back(*mm);
  }
  return static_cast<int>(roped.size());
}

/// The non-view, non-leaf ops of a compute step on a CUDA device (or, with
/// `cpu_too`, a cpu device), in order (empty otherwise).
void compute_ops(const graph& g, const step& st, const std::vector<device_spec>& devices, std::vector<node_id>& ops,
                 bool cpu_too = false) {
  ops.clear();
  const device_kind kind = devices.at(static_cast<std::size_t>(st.device)).kind;
  if (st.kind != step_kind::compute || !(kind == device_kind::cuda || (cpu_too && kind == device_kind::cpu)))
    return;
  for (node_id id : st.ops)
    if (!is_view_op(g.at(id).op) && !is_leaf_op(g.at(id).op)) ops.push_back(id);
}

}  // namespace

std::vector<node_id> projection_group_inputs(const graph& g, const projection_fusion& f) {
  std::vector<node_id> in;
  const auto in_group = [&](node_id id) { return std::find(f.ops.begin(), f.ops.end(), id) != f.ops.end(); };
  for (node_id op : f.ops)
    for (node_id i : g.at(op).inputs)
      if (!in_group(i) && !in_group(g.at(i).storage)) in.push_back(i);  // a rope reads its matmul through a view
  return in;
}

node_id projection_rope_of(const graph& g, const projection_fusion& f, node_id mm) {
  for (std::size_t k = f.ops.size() - static_cast<std::size_t>(f.ropes); k < f.ops.size(); ++k)
    if (g.at(g.at(f.ops[k]).inputs.at(0)).storage == mm) return f.ops[k];
  return no_node;
}

std::vector<node_id> projection_group_outputs(const graph& g, const projection_fusion& f) {
  if (f.kind != projection_kind::shared_input) return {f.ops.back()};
  std::vector<node_id> out;
  for (node_id id : f.ops)
    if (g.at(id).op == op_kind::matmul) {
      const node_id r = projection_rope_of(g, f, id);
      out.push_back(r != no_node ? r : id);
    }
  return out;
}

std::vector<projection_fusion> find_projection_fusions(const graph& g, const std::vector<step>& steps,
                                                       const std::vector<device_spec>& devices,
                                                       const std::vector<attention_fusion>& attention) {
  std::vector<char> taken(g.size(), 0);
  for (const attention_fusion& a : attention)
    for (node_id id : a.ops()) taken[static_cast<std::size_t>(id)] = 1;
  std::vector<projection_fusion> found;
  std::vector<node_id> ops;
  for (const step& st : steps) {
    compute_ops(g, st, devices, ops);
    for (std::size_t i = 0; i < ops.size(); ++i) {
      auto f = match_projection(g, ops, i);
      if (!f) continue;
      f->step = st.id;
      const std::size_t start = i;
      i += f->ops.size() - 1;  // past the group's last op
      if (norm_prologue_at(g, ops, start, *f)) {
        f->ops.insert(f->ops.begin(), ops[start - 1]);
        f->norm_prologue = true;
      }
      if (f->kind == projection_kind::shared_input) {
        f->ropes = rope_epilogues_at(g, ops, i + 1, *f, taken);
        for (int k = 0; k < f->ropes; ++k) f->ops.push_back(ops[++i]);
      }
      found.push_back(std::move(*f));
    }
  }
  return found;
}

std::vector<node_id> attention_fusion::ops() const {
  std::vector<node_id> all;
  for (node_id id : {k_store, v_store, k_rope, q_rope, scores, mask_add, softmax, out})
    if (id != no_node) all.push_back(id);
  return all;
}

std::vector<node_id> attention_fusion::inputs(const graph& g) const {
  std::vector<node_id> in{q_rope != no_node ? g.at(q_rope).inputs[0] : g.at(scores).inputs[0], g.at(scores).inputs[1],
                          g.at(out).inputs[1]};
  if (mask_add != no_node) in.push_back(g.at(mask_add).inputs[1]);
  if (k_store != no_node) {
    in.push_back(k_rope != no_node ? g.at(k_rope).inputs[0] : g.at(k_store).inputs[0]);
    in.push_back(g.at(v_store).inputs[0]);
    in.push_back(g.at(k_store).inputs[1]);
    if (q_rope != no_node || k_rope != no_node) in.push_back(g.at(q_rope != no_node ? q_rope : k_rope).inputs[1]);
  }
  return in;
}

std::vector<node_id> attention_chain_late_operands(const graph& g, node_id qk) {
  // The single reader of x, through views; no_node when x has several.
  const auto only_reader = [&g](node_id x) {
    for (;;) {
      const auto& cs = g.consumers(x);
      if (cs.size() != 1) return no_node;
      if (!is_view_op(g.at(cs.front()).op)) return cs.front();
      x = cs.front();
    }
  };
  const node& scores = g.at(qk);
  if (scores.op != op_kind::matmul || scores.attrs.trans_a || !scores.attrs.trans_b) return {};
  std::vector<node_id> operands;
  node_id at = only_reader(qk);
  if (at != no_node && g.at(at).op == op_kind::add) {
    const node& add = g.at(at);
    operands.push_back(through_reshapes(g, add.inputs[0]) == qk ? add.inputs[1] : add.inputs[0]);
    at = only_reader(add.id);
  }
  if (at == no_node || g.at(at).op != op_kind::softmax) return {};
  const node_id pv = only_reader(at);
  if (pv == no_node || g.at(pv).op != op_kind::matmul || g.at(pv).inputs.size() != 2) return {};
  operands.push_back(g.at(pv).inputs[1]);
  return operands;
}

std::vector<attention_fusion> find_attention_fusions(const graph& g, const std::vector<step>& steps,
                                                     const std::vector<device_spec>& devices) {
  std::vector<attention_fusion> found;
  std::vector<node_id> ops;
  for (const step& st : steps) {
    compute_ops(g, st, devices, ops, true);
    const device_kind kind = devices.at(static_cast<std::size_t>(st.device)).kind;
    for (std::size_t i = 0; i < ops.size(); ++i) {
      auto f = match(g, ops, i, kind);
      if (!f) continue;
      f->step = st.id;
      // Only CUDA's decode kernels take a cache prologue (not the flash
      // kernel's longer runs, nor the cpu kernel): the split kernel's rows.
      const node& q = g.at(g.at(f->scores).inputs[0]);
      if (kind == device_kind::cuda &&
          (q.dims[-2] <= fused_attention_max_rows ||
           fused_attention_split_rows_fit(q.dims[-2], g.at(f->softmax).dims[-2], q.dims[-1])))
        match_prologue(g, ops, i, *f);
      found.push_back(*f);
      i += f->mask_add == no_node ? 2 : 3;  // past the chain's last op
    }
  }
  return found;
}

namespace {

/// A weight leaf with its own buffer (no view).
bool is_weight_leaf(const node& n) { return n.op == op_kind::weight && !n.is_view() && n.data != nullptr; }

/// The weights norm `n` folds into (see fold_norm_weights), each once; empty
/// when it does not qualify.
std::vector<node_id> foldable_projection_weights(const graph& g, const node& n) {
  if (n.op != op_kind::rms_norm || n.inputs.size() != 2) return {};
  const node& w = g.at(n.inputs[1]);
  if (!is_weight_leaf(w) || !is_float(w.type) || w.dims.rank() != 1) return {};
  for (node_id o : g.outputs())
    if (o == n.id) return {};
  const auto reads_norm = [&](node_id c) {
    const node& mm = g.at(c);
    return mm.op == op_kind::matmul && mm.inputs.at(0) == n.id && mm.inputs.at(1) != n.id && !mm.attrs.trans_a;
  };
  std::vector<node_id> weights;
  for (node_id c : g.consumers(n.id)) {
    if (!reads_norm(c)) return {};
    const node& b = g.at(g.at(c).inputs[1]);
    if (!is_weight_leaf(b) || !is_float(b.type) || b.dims.rank() != 2) return {};
    for (node_id o : g.outputs())
      if (o == b.id) return {};
    for (node_id r : g.consumers(b.id))  // every reader takes W the same way round: one K dim to scale
      if (!reads_norm(r) || g.at(r).attrs.trans_b != g.at(c).attrs.trans_b) return {};
    if (std::find(weights.begin(), weights.end(), b.id) == weights.end()) weights.push_back(b.id);
  }
  return weights;
}

}  // namespace

expected<std::shared_ptr<const graph>> fold_norm_weights(const graph& g) {
  std::vector<node> nodes;
  for (const node& n : g.nodes()) {
    const std::vector<node_id> weights = foldable_projection_weights(g, n);
    if (weights.empty()) continue;
    if (nodes.empty()) nodes = g.nodes();
    const node& scale = g.at(n.inputs[1]);
    // The norm's weight is read once, here ([K]: small), not again for every
    // chunk of every weight it scales.
    weight_source_ptr factors = scale.data;
    if (factors->has_values() && !factors->in_memory()) {
      auto values = read_all(*factors);
      if (!values) return error(values.err().code, "fold_norm_weights: norm weight '" + scale.name + "' (" +
                                                       factors->origin() + "): " + values.err().message);
      factors = make_host_weight(std::move(*values), factors->origin());
    }
    for (node_id b : weights) {
      node& w = nodes[static_cast<std::size_t>(b)];
      // K, the dim that meets x's last: W [K, N], or [N, K] read transposed.
      const node& mm = g.at(g.consumers(b).front());
      const int k_dim = mm.attrs.trans_b ? 1 : 0;
      if (w.dims[k_dim] != scale.dims[0])
        return error(errc::internal, "fold_norm_weights: '" + w.name + "' " + w.dims.to_string() + " against norm weight '" +
                                         scale.name + "' " + scale.dims.to_string());
      auto scaled = make_scaled_weight(w.data, factors, k_dim);
      if (!scaled) return error(scaled.err().code, "fold_norm_weights: '" + w.name + "': " + scaled.err().message);
      w.data = std::move(*scaled);
    }
    nodes[static_cast<std::size_t>(n.id)].inputs.resize(1);
  }
  if (nodes.empty()) return std::shared_ptr<const graph>();
  auto folded = graph::from_nodes(std::move(nodes), g.inputs(), g.outputs());
  if (!folded) return error(folded.err().code, "fold_norm_weights: " + folded.err().message);
  return std::shared_ptr<const graph>(std::make_shared<graph>(std::move(*folded)));
}

}  // namespace ag
