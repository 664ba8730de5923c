// infer_node: the per-op arity, dtype, shape and layout rules. Shared by the
// builder (one node at a time) and graph::from_nodes (whole raw lists), so the
// two can never disagree about what a valid node is.
#include <algorithm>
#include <cstdint>
#include <limits>
#include <sstream>

#include "graph/graph.hpp"
#include "graph/validate_util.hpp"

namespace ag {

namespace detail {

std::string label(const node& n) {
  std::string s = to_string(n.op);
  s += " '";
  s += n.name;
  s += "'";
  return s;
}

error node_error(errc c, const node& n, const std::string& what) {
  return error(c, label(n) + ": " + what);
}

}  // namespace detail

namespace {

using detail::node_error;

const char* dname(dtype t) { return to_string(t); }

std::string dims_str(const node& x) { return x.dims.to_string(); }

// Normalises a possibly negative axis against rank; false if out of range.
bool norm_axis(int& axis, int rank) {
  if (axis < -rank || axis >= rank) return false;
  if (axis < 0) axis += rank;
  return true;
}

// Rank 1..4, every dim >= 1, and an element count that fits in int64 (so
// numel() is exact for every shape that passed).
error check_rank(const node& n, const shape& s, const char* what) {
  if (!s.valid_rank())
    return node_error(errc::invalid_shape, n,
                      std::string(what) + " " + s.to_string() + " has " + std::to_string(-s.rank()) +
                          " dimensions, at most " + std::to_string(max_rank) + " are supported");
  if (s.rank() < 1 || s.rank() > max_rank)
    return node_error(errc::invalid_shape, n,
                      std::string(what) + " has rank " + std::to_string(s.rank()) + ", must be 1.." +
                          std::to_string(max_rank));
  for (int i = 0; i < s.rank(); ++i)
    if (s[i] < 1)
      return node_error(errc::invalid_shape, n,
                        std::string(what) + " " + s.to_string() + " has a dimension < 1");
  int64_t count = 0;
  if (!checked_numel(s, count))
    return node_error(errc::invalid_shape, n,
                      std::string(what) + " " + s.to_string() + " has " + numel_string(s) +
                          " elements, more than a 64-bit size can count");
  return {};
}

// The node's tensor (its logical extent: a view's too) is at most
// max_tensor_bytes, so byte sizes, offsets and sums of a few of them never
// overflow downstream (planner, memory plan, devices, host tensors).
error check_size(const node& n) {
  int64_t bytes = 0;
  if (!checked_bytes(n.dims, static_cast<int64_t>(dtype_size(n.type)), bytes) || bytes > max_tensor_bytes)
    return node_error(errc::invalid_shape, n,
                      std::string(dname(n.type)) + " " + n.dims.to_string() + " needs " +
                          numel_string(n.dims, static_cast<int64_t>(dtype_size(n.type))) +
                          " bytes, more than the " + std::to_string(max_tensor_bytes) +
                          " (2^62) a tensor may have");
  return {};
}

error need_float(const node& n, const node& x, const char* role) {
  if (!is_float(x.type))
    return node_error(errc::dtype_mismatch, n,
                      std::string(role) + " '" + x.name + "' is " + dname(x.type) + ", must be a float type");
  return {};
}

error need_same_type(const node& n, const node& a, const node& b, const char* role_b) {
  if (a.type != b.type)
    return node_error(errc::dtype_mismatch, n,
                      std::string(role_b) + " '" + b.name + "' is " + dname(b.type) + " but '" + a.name +
                          "' is " + dname(a.type));
  return {};
}

void make_contiguous(node& n) {
  n.stride = contiguous_strides(n.dims);
  n.offset = 0;
  n.storage = n.id;
}

error arity(const node& n, std::size_t lo, std::size_t hi) {
  const std::size_t k = n.inputs.size();
  auto range = [&] {
    return lo == hi ? std::to_string(lo) : std::to_string(lo) + ".." + std::to_string(hi);
  };
  if (k < lo)
    return node_error(errc::missing_input, n,
                      "has " + std::to_string(k) + " inputs, needs " + range());
  if (k > hi)
    return node_error(errc::invalid_argument, n,
                      "has " + std::to_string(k) + " inputs, takes " + range());
  return {};
}

error infer_matmul(const std::vector<node>& nodes, node& n) {
  const node& a = nodes[static_cast<std::size_t>(n.inputs[0])];
  const node& b = nodes[static_cast<std::size_t>(n.inputs[1])];
  if (auto e = need_float(n, a, "a")) return e;
  if (auto e = need_same_type(n, a, b, "b")) return e;
  if (a.dims.rank() < 2 || b.dims.rank() < 2)
    return node_error(errc::invalid_shape, n,
                      "operands need rank >= 2: a " + dims_str(a) + ", b " + dims_str(b));
  const int64_t M = n.attrs.trans_a ? a.dims[-1] : a.dims[-2];
  const int64_t Ka = n.attrs.trans_a ? a.dims[-2] : a.dims[-1];
  const int64_t Kb = n.attrs.trans_b ? b.dims[-1] : b.dims[-2];
  const int64_t N = n.attrs.trans_b ? b.dims[-2] : b.dims[-1];
  if (Ka != Kb)
    return node_error(errc::invalid_shape, n,
                      "inner dims differ: a " + dims_str(a) + (n.attrs.trans_a ? " (transposed)" : "") +
                          " has K=" + std::to_string(Ka) + ", b " + dims_str(b) +
                          (n.attrs.trans_b ? " (transposed)" : "") + " has K=" + std::to_string(Kb));
  const int ra = a.dims.rank() - 2, rb = b.dims.rank() - 2;
  const int r = std::max(ra, rb);
  shape out;
  out.set_rank(r + 2);
  for (int i = 0; i < r; ++i) {
    // right-aligned batch dims, numpy style
    const int ia = i - (r - ra), ib = i - (r - rb);
    const int64_t da = ia >= 0 ? a.dims[ia] : 1, db = ib >= 0 ? b.dims[ib] : 1;
    if (da != db && da != 1 && db != 1)
      return node_error(errc::invalid_shape, n,
                        "batch dims do not broadcast: a " + dims_str(a) + ", b " + dims_str(b));
    out[i] = std::max(da, db);
  }
  out[r] = M;
  out[r + 1] = N;
  n.dims = out;
  n.type = a.type;
  make_contiguous(n);
  return {};
}

error infer_binary(const std::vector<node>& nodes, node& n) {
  const node& a = nodes[static_cast<std::size_t>(n.inputs[0])];
  const node& b = nodes[static_cast<std::size_t>(n.inputs[1])];
  if (auto e = need_float(n, a, "a")) return e;
  if (auto e = need_same_type(n, a, b, "b")) return e;
  bool ok = b.dims.rank() <= a.dims.rank();
  for (int i = 1; ok && i <= b.dims.rank(); ++i)
    ok = b.dims[-i] == 1 || b.dims[-i] == a.dims[-i];
  if (!ok)
    return node_error(errc::invalid_shape, n,
                      "b " + dims_str(b) + " does not broadcast onto a " + dims_str(a));
  n.dims = a.dims;
  n.type = a.type;
  make_contiguous(n);
  return {};
}

error infer_unary(const std::vector<node>& nodes, node& n) {
  const node& x = nodes[static_cast<std::size_t>(n.inputs[0])];
  if (auto e = need_float(n, x, "x")) return e;
  n.dims = x.dims;
  n.type = x.type;
  make_contiguous(n);
  return {};
}

error infer_norm(const std::vector<node>& nodes, node& n) {
  const node& x = nodes[static_cast<std::size_t>(n.inputs[0])];
  if (auto e = need_float(n, x, "x")) return e;
  const char* roles[] = {"x", "weight", "bias"};
  for (std::size_t i = 1; i < n.inputs.size(); ++i) {
    const node& p = nodes[static_cast<std::size_t>(n.inputs[i])];
    if (auto e = need_same_type(n, x, p, roles[i])) return e;
    if (p.dims.rank() != 1 || p.dims[0] != x.dims[-1])
      return node_error(errc::invalid_shape, n,
                        std::string(roles[i]) + " '" + p.name + "' is " + dims_str(p) + ", must be [" +
                            std::to_string(x.dims[-1]) + "] (last dim of x " + dims_str(x) + ")");
  }
  if (!(n.attrs.eps >= 0.0f))
    return node_error(errc::invalid_argument, n, "eps must be >= 0");
  n.dims = x.dims;
  n.type = x.type;
  make_contiguous(n);
  return {};
}

error infer_softmax(const std::vector<node>& nodes, node& n) {
  if (auto e = infer_unary(nodes, n)) return e;
  if (n.attrs.causal) {
    if (n.dims.rank() < 2)
      return node_error(errc::invalid_shape, n, "causal softmax needs rank >= 2 ([.., Sq, Sk]), got " +
                                                    n.dims.to_string());
    if (n.dims[-1] < n.dims[-2])
      return node_error(errc::invalid_shape, n,
                        "causal softmax needs Sk >= Sq (else whole rows are masked), got " +
                            n.dims.to_string());
  }
  return {};
}

error infer_argmax(const std::vector<node>& nodes, node& n) {
  const node& x = nodes[static_cast<std::size_t>(n.inputs[0])];
  if (auto e = need_float(n, x, "x")) return e;
  if (x.dims.rank() < 1 || x.dims[-1] < 1)
    return node_error(errc::invalid_shape, n, "x " + dims_str(x) + " needs a last dim of at least one element");
  if (x.dims[-1] > std::numeric_limits<int32_t>::max())
    return node_error(errc::invalid_shape, n, "x " + dims_str(x) + ": rows longer than 2^31 - 1 elements have no i32 index");
  n.dims = x.dims;
  n.dims[n.dims.rank() - 1] = 1;
  n.type = dtype::i32;
  make_contiguous(n);
  return {};
}

error infer_range_mask(const std::vector<node>& nodes, node& n) {
  const node& keys = nodes[static_cast<std::size_t>(n.inputs[0])];
  const node& ranges = nodes[static_cast<std::size_t>(n.inputs[1])];
  if (!is_float(n.type))
    return node_error(errc::dtype_mismatch, n, std::string("a mask of ") + dname(n.type) + ": it must be a float type");
  for (const node* in : {&keys, &ranges})
    if (in->type != dtype::i32)
      return node_error(errc::dtype_mismatch, n,
                        std::string(in == &keys ? "key_positions" : "query_ranges") + " '" + in->name + "' are " +
                            dname(in->type) + ", must be i32");
  if (keys.dims.rank() != 1)
    return node_error(errc::invalid_shape, n, "key_positions " + dims_str(keys) + " must be [C]");
  if (ranges.dims.rank() != 2 || ranges.dims[1] != 2)
    return node_error(errc::invalid_shape, n, "query_ranges " + dims_str(ranges) + " must be [T, 2]");
  n.dims = shape{ranges.dims[0], keys.dims[0]};
  make_contiguous(n);
  return {};
}

error infer_rope(const std::vector<node>& nodes, node& n) {
  const node& x = nodes[static_cast<std::size_t>(n.inputs[0])];
  const node& p = nodes[static_cast<std::size_t>(n.inputs[1])];
  if (auto e = need_float(n, x, "x")) return e;
  if (x.dims.rank() < 3)
    return node_error(errc::invalid_shape, n, "x " + dims_str(x) + " must be [.., S, H, D] (rank >= 3)");
  if (x.dims[-1] % 2 != 0)
    return node_error(errc::invalid_shape, n, "x " + dims_str(x) + ": head dim D must be even");
  if (p.type != dtype::i32)
    return node_error(errc::dtype_mismatch, n,
                      "positions '" + p.name + "' are " + dname(p.type) + ", must be i32");
  if (p.dims.rank() != 1 || p.dims[0] != x.dims[-3])
    return node_error(errc::invalid_shape, n,
                      "positions '" + p.name + "' are " + dims_str(p) + ", must be [S] = [" +
                          std::to_string(x.dims[-3]) + "] for x " + dims_str(x));
  if (!(n.attrs.theta > 0.0f)) return node_error(errc::invalid_argument, n, "theta must be > 0");
  if (std::string why = rope_scaling_misfit(n.attrs.rope_scale); !why.empty())
    return node_error(errc::invalid_argument, n, why);
  n.dims = x.dims;
  n.type = x.type;
  make_contiguous(n);
  return {};
}

error infer_store_rows(const std::vector<node>& nodes, node& n) {
  const node& rows = nodes[static_cast<std::size_t>(n.inputs[0])];
  const node& pos = nodes[static_cast<std::size_t>(n.inputs[1])];
  // Floats (a KV cache) or i32 (a token that the next job of the slot reads:
  // transformer_config::token_state_out).
  if (rows.type != dtype::i32)
    if (auto e = need_float(n, rows, "rows")) return e;
  const int r = rows.dims.rank();
  if (n.attrs.axis < 0 || n.attrs.axis >= r)
    return node_error(errc::invalid_argument, n,
                      "axis " + std::to_string(n.attrs.axis) + " is outside rows '" + rows.name + "' " + dims_str(rows));
  if (pos.type != dtype::i32)
    return node_error(errc::dtype_mismatch, n, "positions '" + pos.name + "' are " + dname(pos.type) + ", must be i32");
  const int64_t count = rows.dims[n.attrs.axis];
  if (pos.dims.rank() != 1 || pos.dims[0] != count)
    return node_error(errc::invalid_shape, n,
                      "positions '" + pos.name + "' are " + dims_str(pos) + ", must be [" + std::to_string(count) +
                          "] (one per row along axis " + std::to_string(n.attrs.axis) + " of rows " + dims_str(rows) + ")");
  if (n.attrs.end < 1)
    return node_error(errc::invalid_argument, n, "capacity (attrs.end) must be >= 1, got " + std::to_string(n.attrs.end));
  shape out = rows.dims;
  out[n.attrs.axis] = n.attrs.end;
  if (auto e = check_rank(n, out, "state")) return e;
  n.dims = out;
  n.type = rows.type;
  make_contiguous(n);
  return {};
}

error infer_get_rows(const std::vector<node>& nodes, node& n) {
  const node& t = nodes[static_cast<std::size_t>(n.inputs[0])];
  const node& ids = nodes[static_cast<std::size_t>(n.inputs[1])];
  if (auto e = need_float(n, t, "table")) return e;
  if (t.dims.rank() != 2)
    return node_error(errc::invalid_shape, n, "table '" + t.name + "' is " + dims_str(t) + ", must be [V, D]");
  if (ids.type != dtype::i32)
    return node_error(errc::dtype_mismatch, n,
                      "ids '" + ids.name + "' are " + dname(ids.type) + ", must be i32");
  if (ids.dims.rank() > 3)
    return node_error(errc::invalid_shape, n, "ids '" + ids.name + "' are " + dims_str(ids) + ", rank must be <= 3");
  // A tensor-parallel shard of the table: rows [begin, begin + V) of end rows.
  if (n.attrs.end != 0 && (n.attrs.end < 0 || n.attrs.begin < 0 || n.attrs.begin > n.attrs.end - t.dims[0]))
    // (begin + V is not computed: a fuzzed begin near 2^63 overflows it.)
    return node_error(errc::invalid_argument, n,
                      "table shard of " + std::to_string(t.dims[0]) + " rows from row " + std::to_string(n.attrs.begin) +
                          " does not lie in a vocabulary of " + std::to_string(n.attrs.end) + " rows");
  if (n.attrs.end == 0 && n.attrs.begin != 0)
    return node_error(errc::invalid_argument, n, "a row offset (begin) needs the vocabulary size (end)");
  shape out = ids.dims;
  out.set_rank(ids.dims.rank() + 1);
  out[ids.dims.rank()] = t.dims[1];
  n.dims = out;
  n.type = t.type;
  make_contiguous(n);
  return {};
}

// Collectives: inputs are the group's operands in rank order.
error infer_collective(const std::vector<node>& nodes, node& n) {
  const node& x = nodes[static_cast<std::size_t>(n.inputs[0])];
  const std::size_t members = n.inputs.size();
  if (n.attrs.rank < 0 || static_cast<std::size_t>(n.attrs.rank) >= members)
    return node_error(errc::invalid_argument, n,
                      "rank " + std::to_string(n.attrs.rank) + " is outside its group of " + std::to_string(members));
  if (n.attrs.group < 0) return node_error(errc::invalid_argument, n, "group must be >= 0");
  for (std::size_t i = 1; i < members; ++i) {
    const node& y = nodes[static_cast<std::size_t>(n.inputs[i])];
    if (auto e = need_same_type(n, x, y, ("operand " + std::to_string(i)).c_str())) return e;
    if (n.op != op_kind::all_gather && y.dims != x.dims)
      return node_error(errc::invalid_shape, n,
                        "operand " + std::to_string(i) + " '" + y.name + "' " + dims_str(y) + " differs from '" +
                            x.name + "' " + dims_str(x));
  }
  n.type = x.type;
  if (n.op == op_kind::all_reduce) {
    n.dims = x.dims;
  } else if (n.op == op_kind::reduce_scatter) {
    const int a = n.attrs.axis;
    if (!norm_axis(n.attrs.axis, x.dims.rank()))
      return node_error(errc::invalid_argument, n, "axis " + std::to_string(a) + " out of range for " + dims_str(x));
    if (n.attrs.begin < 0 || n.attrs.end > x.dims[n.attrs.axis] || n.attrs.begin >= n.attrs.end)
      return node_error(errc::invalid_argument, n,
                        "range [" + std::to_string(n.attrs.begin) + ", " + std::to_string(n.attrs.end) +
                            ") is empty or outside dim " + std::to_string(n.attrs.axis) + " of " + dims_str(x));
    n.dims = x.dims;
    n.dims[n.attrs.axis] = n.attrs.end - n.attrs.begin;
  } else {
    // all_gather: the node's dims are given; check them against the operands.
    if (auto e = check_rank(n, n.dims, "gathered shape")) return e;
    const int r = n.dims.rank();
    const int a0 = n.attrs.axis, a1 = n.attrs.axis2;
    if (!norm_axis(n.attrs.axis, r) || !norm_axis(n.attrs.axis2, r) || n.attrs.axis > n.attrs.axis2)
      return node_error(errc::invalid_argument, n,
                        "merged axes [" + std::to_string(a0) + ", " + std::to_string(a1) + "] are not a range of " +
                            n.dims.to_string());
    int64_t merged = 1;
    for (int d = n.attrs.axis; d <= n.attrs.axis2; ++d) merged *= n.dims[d];
    int64_t sum = 0;
    for (std::size_t i = 0; i < members; ++i) {
      const node& y = nodes[static_cast<std::size_t>(n.inputs[i])];
      bool ok = y.dims.rank() == r;
      int64_t part = 1;
      for (int d = 0; ok && d < r; ++d) {
        if (d >= n.attrs.axis && d <= n.attrs.axis2) part *= y.dims[d];
        else ok = y.dims[d] == n.dims[d];
      }
      if (!ok)
        return node_error(errc::invalid_shape, n,
                          "operand " + std::to_string(i) + " '" + y.name + "' " + dims_str(y) + " does not match " +
                              n.dims.to_string() + " outside the merged axes");
      sum += part;
    }
    if (sum != merged)
      return node_error(errc::invalid_shape, n,
                        "operands hold " + std::to_string(sum) + " of the " + std::to_string(merged) +
                            " merged indices of " + n.dims.to_string());
  }
  make_contiguous(n);
  return {};
}

error infer_reshape(const std::vector<node>& nodes, node& n) {
  const node& x = nodes[static_cast<std::size_t>(n.inputs[0])];
  if (auto e = check_rank(n, n.dims, "target shape")) return e;
  if (!x.contiguous())
    return node_error(errc::invalid_shape, n,
                      "source '" + x.name + "' " + dims_str(x) +
                          " is not contiguous; insert contiguous() before reshape");
  if (n.dims.numel() != x.dims.numel())
    return node_error(errc::invalid_shape, n,
                      "cannot reshape " + dims_str(x) + " (" + std::to_string(x.dims.numel()) + " elements) to " +
                          n.dims.to_string() + " (" + std::to_string(n.dims.numel()) + " elements)");
  n.type = x.type;
  n.stride = contiguous_strides(n.dims);
  n.offset = x.offset;
  n.storage = x.storage;
  return {};
}

error infer_view(const std::vector<node>& nodes, node& n) {
  // dims / stride / offset are given on the node, absolute within the storage buffer
  const node& x = nodes[static_cast<std::size_t>(n.inputs[0])];
  if (auto e = check_rank(n, n.dims, "view shape")) return e;
  for (int i = 0; i < n.dims.rank(); ++i)
    if (n.stride[i] < 0) return node_error(errc::invalid_argument, n, "negative stride");
  for (int i = n.dims.rank(); i < max_rank; ++i) n.stride[i] = 0;
  const node& st = nodes[static_cast<std::size_t>(x.storage)];
  int64_t hi = 0;
  if (!checked_max_index(n.dims, n.stride, n.offset, hi)) {
    std::string s = "(";
    for (int i = 0; i < n.dims.rank(); ++i) s += (i ? ", " : "") + std::to_string(n.stride[static_cast<std::size_t>(i)]);
    return node_error(errc::invalid_shape, n,
                      "view " + n.dims.to_string() + " with strides " + s + ") at offset " +
                          std::to_string(n.offset) + " reaches an element index past 64 bits");
  }
  if (n.offset < 0 || hi >= st.dims.numel())
    return node_error(errc::invalid_shape, n,
                      "view " + n.dims.to_string() + " at offset " + std::to_string(n.offset) +
                          " reaches element " + std::to_string(hi) + ", outside storage '" + st.name + "' of " +
                          std::to_string(st.dims.numel()) + " elements");
  n.type = x.type;
  n.storage = x.storage;
  return {};
}

error infer_permute(const std::vector<node>& nodes, node& n) {
  const node& x = nodes[static_cast<std::size_t>(n.inputs[0])];
  const int r = x.dims.rank();
  std::array<bool, max_rank> seen{};
  auto perm_str = [&] {
    std::string s = "(";
    for (int i = 0; i < r; ++i) s += (i ? ", " : "") + std::to_string(n.attrs.perm[static_cast<std::size_t>(i)]);
    return s + ")";
  };
  for (int i = 0; i < r; ++i) {
    int& p = n.attrs.perm[static_cast<std::size_t>(i)];
    const std::string before = perm_str();
    if (!norm_axis(p, r) || seen[static_cast<std::size_t>(p)])
      return node_error(errc::invalid_argument, n,
                        "perm " + before + " is not a permutation of 0.." + std::to_string(r - 1) + " for x " +
                            dims_str(x));
    seen[static_cast<std::size_t>(p)] = true;
  }
  for (int i = r; i < max_rank; ++i) n.attrs.perm[static_cast<std::size_t>(i)] = i;
  shape d;
  d.set_rank(r);
  strides s{};
  for (int i = 0; i < r; ++i) {
    const int p = n.attrs.perm[static_cast<std::size_t>(i)];
    d[i] = x.dims[p];
    s[static_cast<std::size_t>(i)] = x.stride[static_cast<std::size_t>(p)];
  }
  n.dims = d;
  n.stride = s;
  n.offset = x.offset;
  n.storage = x.storage;
  n.type = x.type;
  return {};
}

error infer_transpose(const std::vector<node>& nodes, node& n) {
  const node& x = nodes[static_cast<std::size_t>(n.inputs[0])];
  const int r = x.dims.rank();
  const int a0 = n.attrs.axis, a1 = n.attrs.axis2;
  if (!norm_axis(n.attrs.axis, r) || !norm_axis(n.attrs.axis2, r))
    return node_error(errc::invalid_argument, n,
                      "axes (" + std::to_string(a0) + ", " + std::to_string(a1) + ") out of range for x " +
                          dims_str(x));
  n.dims = x.dims;
  n.stride = x.stride;
  std::swap(n.dims[n.attrs.axis], n.dims[n.attrs.axis2]);
  std::swap(n.stride[static_cast<std::size_t>(n.attrs.axis)], n.stride[static_cast<std::size_t>(n.attrs.axis2)]);
  n.offset = x.offset;
  n.storage = x.storage;
  n.type = x.type;
  return {};
}

error infer_slice(const std::vector<node>& nodes, node& n) {
  const node& x = nodes[static_cast<std::size_t>(n.inputs[0])];
  const int r = x.dims.rank();
  const int a = n.attrs.axis;
  if (!norm_axis(n.attrs.axis, r))
    return node_error(errc::invalid_argument, n,
                      "axis " + std::to_string(a) + " out of range for x " + dims_str(x));
  const int64_t dim = x.dims[n.attrs.axis];
  int64_t b = n.attrs.begin, e = n.attrs.end;
  if (b < 0) b += dim;
  if (e < 0) e += dim;
  if (b < 0 || e > dim || b >= e)
    return node_error(errc::invalid_argument, n,
                      "range [" + std::to_string(n.attrs.begin) + ", " + std::to_string(n.attrs.end) +
                          ") is empty or outside dim " + std::to_string(n.attrs.axis) + " of x " + dims_str(x));
  n.attrs.begin = b;
  n.attrs.end = e;
  n.dims = x.dims;
  n.dims[n.attrs.axis] = e - b;
  n.stride = x.stride;
  n.offset = x.offset + b * x.stride[static_cast<std::size_t>(n.attrs.axis)];
  n.storage = x.storage;
  n.type = x.type;
  return {};
}

error infer_concat(const std::vector<node>& nodes, node& n) {
  const node& x = nodes[static_cast<std::size_t>(n.inputs[0])];
  const int r = x.dims.rank();
  const int a = n.attrs.axis;
  if (!norm_axis(n.attrs.axis, r))
    return node_error(errc::invalid_argument, n,
                      "axis " + std::to_string(a) + " out of range for '" + x.name + "' " + dims_str(x));
  shape out = x.dims;
  for (std::size_t i = 1; i < n.inputs.size(); ++i) {
    const node& y = nodes[static_cast<std::size_t>(n.inputs[i])];
    if (auto e = need_same_type(n, x, y, ("input " + std::to_string(i)).c_str())) return e;
    bool ok = y.dims.rank() == r;
    for (int d = 0; ok && d < r; ++d) ok = d == n.attrs.axis || y.dims[d] == x.dims[d];
    if (!ok)
      return node_error(errc::invalid_shape, n,
                        "input " + std::to_string(i) + " '" + y.name + "' " + dims_str(y) + " does not match '" +
                            x.name + "' " + dims_str(x) + " outside axis " + std::to_string(n.attrs.axis));
    if (!checked_add(out[n.attrs.axis], y.dims[n.attrs.axis], out[n.attrs.axis]))
      return node_error(errc::invalid_shape, n,
                        "the sizes along axis " + std::to_string(n.attrs.axis) + " overflow 64 bits at input " +
                            std::to_string(i) + " '" + y.name + "' " + dims_str(y));
  }
  n.dims = out;
  n.type = x.type;
  make_contiguous(n);
  return {};
}

}  // namespace

error infer_node(const std::vector<node>& nodes, node& n) {
  if (static_cast<int>(n.op) >= op_kind_count)
    return error(errc::invalid_argument, "node '" + n.name + "': unknown op " + std::to_string(int(n.op)));
  for (std::size_t i = 0; i < n.inputs.size(); ++i) {
    const node_id in = n.inputs[i];
    if (in == no_node)
      return node_error(errc::missing_input, n, "input " + std::to_string(i) + " is missing (no node)");
    if (in < 0 || static_cast<std::size_t>(in) >= nodes.size() || nodes[static_cast<std::size_t>(in)].id != in)
      return node_error(errc::unknown_input, n, "input " + std::to_string(i) + " names unknown node id " +
                                                     std::to_string(in));
    if (n.id != no_node && in >= n.id)
      return node_error(errc::cycle, n, "input " + std::to_string(i) + " '" +
                                            nodes[static_cast<std::size_t>(in)].name +
                                            "' does not come before it (inputs must precede consumers)");
  }
  // raw nodes (from_nodes) may carry any byte in an enum field
  if (static_cast<int>(n.type) > static_cast<int>(dtype::i32))
    return node_error(errc::invalid_argument, n, "unknown dtype " + std::to_string(int(n.type)));
  if (static_cast<int>(n.attrs.rope) > 1 || static_cast<int>(n.attrs.gelu) > 1)
    return node_error(errc::invalid_argument, n, "unknown rope or gelu mode");
  error e;
  switch (n.op) {
    case op_kind::input:
      if ((e = arity(n, 0, 0))) return e;
      if ((e = check_rank(n, n.dims, "shape"))) return e;
      if ((e = check_size(n))) return e;
      make_contiguous(n);
      return {};
    case op_kind::weight:
      if ((e = arity(n, 0, 0))) return e;
      if (!n.data) return node_error(errc::missing_input, n, "has no data");
      n.dims = n.data->dims();
      n.type = n.data->type();
      if (static_cast<int>(n.type) > static_cast<int>(dtype::i32))
        return node_error(errc::invalid_argument, n, "data has unknown dtype " + std::to_string(int(n.type)));
      if ((e = check_rank(n, n.dims, "data"))) return e;
      if ((e = check_size(n))) return e;
      if (const host_tensor* t = n.data->in_memory();
          t && t->bytes() != static_cast<std::size_t>(n.dims.numel()) * dtype_size(n.type)) {
        const int64_t need = n.dims.numel() * int64_t(dtype_size(n.type));
        // an empty tensor from a value factory: its size could not be allocated here
        const std::string why = t->bytes() == 0 && need > host_memory_bytes()
                                    ? " (more than this host's " + std::to_string(host_memory_bytes()) +
                                          " bytes of memory: the data could not be made)"
                                    : "";
        return node_error(errc::invalid_argument, n, "data holds " + std::to_string(t->bytes()) +
                                                         " bytes, shape needs " + std::to_string(need) + why);
      }
      make_contiguous(n);
      return {};
    case op_kind::matmul:
      if ((e = arity(n, 2, 2))) return e;
      e = infer_matmul(nodes, n);
      break;
    case op_kind::add:
    case op_kind::mul:
      if ((e = arity(n, 2, 2))) return e;
      e = infer_binary(nodes, n);
      break;
    case op_kind::scale:
    case op_kind::gelu:
    case op_kind::silu:
      if ((e = arity(n, 1, 1))) return e;
      e = infer_unary(nodes, n);
      break;
    case op_kind::rms_norm:
      if ((e = arity(n, 1, 2))) return e;
      e = infer_norm(nodes, n);
      break;
    case op_kind::layer_norm:
      if ((e = arity(n, 1, 3))) return e;
      e = infer_norm(nodes, n);
      break;
    case op_kind::softmax:
      if ((e = arity(n, 1, 1))) return e;
      e = infer_softmax(nodes, n);
      break;
    case op_kind::rope:
      if ((e = arity(n, 2, 2))) return e;
      e = infer_rope(nodes, n);
      break;
    case op_kind::argmax:
      if ((e = arity(n, 1, 1))) return e;
      e = infer_argmax(nodes, n);
      break;
    case op_kind::get_rows:
      if ((e = arity(n, 2, 2))) return e;
      e = infer_get_rows(nodes, n);
      break;
    case op_kind::range_mask:
      if ((e = arity(n, 2, 2))) return e;
      e = infer_range_mask(nodes, n);
      break;
    case op_kind::store_rows:
      if ((e = arity(n, 2, 2))) return e;
      e = infer_store_rows(nodes, n);
      break;
    case op_kind::reshape:
      if ((e = arity(n, 1, 1))) return e;
      e = infer_reshape(nodes, n);
      break;
    case op_kind::view:
      if ((e = arity(n, 1, 1))) return e;
      e = infer_view(nodes, n);
      break;
    case op_kind::permute:
      if ((e = arity(n, 1, 1))) return e;
      e = infer_permute(nodes, n);
      break;
    case op_kind::transpose:
      if ((e = arity(n, 1, 1))) return e;
      e = infer_transpose(nodes, n);
      break;
    case op_kind::slice:
      if ((e = arity(n, 1, 1))) return e;
      e = infer_slice(nodes, n);
      break;
    case op_kind::concat:
      if ((e = arity(n, 1, SIZE_MAX))) return e;
      e = infer_concat(nodes, n);
      break;
    case op_kind::all_reduce:
    case op_kind::all_gather:
    case op_kind::reduce_scatter:
      if ((e = arity(n, 1, SIZE_MAX))) return e;
      e = infer_collective(nodes, n);
      break;
    case op_kind::copy: {
      if ((e = arity(n, 1, 1))) return e;
      const node& x = nodes[static_cast<std::size_t>(n.inputs[0])];
      n.dims = x.dims;  // n.type is the cast target, set by the caller
      make_contiguous(n);
      break;
    }
  }
  if (e) return e;
  if ((e = check_rank(n, n.dims, "result shape"))) return e;
  return check_size(n);
}

}  // namespace ag
