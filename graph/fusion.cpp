#include "graph/fusion.hpp"

#include <optional>

#include "graph/plan.hpp"

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

/// Every reader of `x` (through views) is `reader`, and neither x nor a view
/// of it is a graph output.
bool only_read_by(const graph& g, node_id x, node_id reader) {
  for (node_id o : g.outputs())
    if (o == x) return false;
  for (node_id c : g.consumers(x)) {
    if (c == reader) continue;
    if (!is_view_op(g.at(c).op) || !only_read_by(g, c, reader)) return false;
  }
  return true;
}

bool same_batch(const shape& a, const shape& b) {
  if (a.rank() != b.rank()) return false;
  for (int d = 0; d + 2 < a.rank(); ++d)
    if (a[d] != b[d]) return false;
  return true;
}

/// The chain starting at ops[i], or nullopt.
std::optional<attention_fusion> match(const graph& g, const std::vector<node_id>& ops, std::size_t i) {
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
  if (M > fused_attention_max_rows || keys < 1 || keys > fused_attention_max_keys ||
      M * keys > fused_attention_max_scores || dh > fused_attention_max_head)
    return std::nullopt;
  const dtype t = q.type;
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

}  // namespace

std::vector<attention_fusion> find_attention_fusions(const graph& g, const std::vector<step>& steps,
                                                     const std::vector<device_spec>& devices) {
  std::vector<attention_fusion> found;
  std::vector<node_id> ops;
  for (const step& st : steps) {
    if (st.kind != step_kind::compute || devices.at(static_cast<std::size_t>(st.device)).kind != device_kind::cuda)
      continue;
    ops.clear();
    for (node_id id : st.ops)
      if (!is_view_op(g.at(id).op) && !is_leaf_op(g.at(id).op)) ops.push_back(id);
    for (std::size_t i = 0; i < ops.size(); ++i) {
      auto f = match(g, ops, i);
      if (!f) continue;
      f->step = st.id;
      found.push_back(*f);
      i += f->mask_add == no_node ? 2 : 3;  // past the chain's last op
    }
  }
  return found;
}

}  // namespace ag
