#pragma once
/// \file tp_random_graph.hpp
/// Random graphs for tensor-parallel tests (planner and runtime): [B, S, d]
/// activations through the ops tensor parallelism has rules for and ops it
/// gathers for. Deterministic per seed.

#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "graph/graph.hpp"
#include "graph/host_tensor.hpp"
#include "graph/random.hpp"

namespace ag::test {

// Random graphs of [B, S, d] activations through the ops tensor parallelism
// has rules for (matmuls with weights either way round, elementwise ops with
// broadcast biases, norms, softmax, attention-like head reshapes and batched
// matmuls, slices, concats, transposes, lookups) and ops it gathers for.
inline std::shared_ptr<const graph> tp_random_graph(uint64_t seed, int ops) {
  rng r(seed);
  auto pick = [&](std::size_t n) { return static_cast<std::size_t>(r.next() % n); };
  const int64_t B = 2, S = 4;
  graph_builder b;
  auto ids = b.input("ids", dtype::i32, {B, S});
  std::vector<tensor> pool{b.input("x", dtype::f32, {B, S, 8})};
  int w = 0;
  auto weight = [&](shape d) {
    const int k = w++;
    return b.weight("w" + std::to_string(k), host_tensor::random_normal(dtype::f32, d, seed * 100 + static_cast<uint64_t>(k), 0.3f));
  };
  auto dim = [&](tensor t) { return b.info(t).dims[-1]; };
  auto same = [&](tensor t) {
    std::vector<tensor> c;
    for (tensor u : pool)
      if (b.info(u).dims == b.info(t).dims && u.id() != t.id()) c.push_back(u);
    return c.empty() ? t : c[pick(c.size())];
  };
  for (int i = 0; i < ops; ++i) {
    b.set_layer(i / 3);
    const tensor x = pool[pool.size() - 1 - pick(std::min<std::size_t>(pool.size(), 4))];
    const int64_t d = dim(x);
    const std::string nm = "op" + std::to_string(i);
    const int64_t widths[] = {8, 12, 16};
    tensor y;
    switch (pick(12)) {
      case 0: {
        const int64_t d2 = widths[pick(3)];
        const bool tb = pick(2) == 0;
        y = b.matmul(x, weight(tb ? shape{d2, d} : shape{d, d2}), false, tb, nm);
        break;
      }
      case 1: y = pick(2) ? b.add(x, same(x), nm) : b.add(x, weight({d}), nm); break;
      case 2: y = b.mul(x, same(x), nm); break;
      case 3: y = pick(3) == 0 ? b.gelu(x, gelu_mode::tanh, nm) : pick(2) ? b.silu(x, nm) : b.scale(x, 0.5f, nm); break;
      case 4: y = pick(2) ? b.rms_norm(x, weight({d}), 1e-5f, nm) : b.layer_norm(x, weight({d}), weight({d}), 1e-5f, nm); break;
      case 5: y = b.softmax(x, pick(2) == 0 && d >= S, 0.7f, nm); break;
      case 6: {  // attention over heads of 2 (at least 4 heads: degree 4 splits them)
        if (d % 2 != 0 || d < 8 || !b.info(x).contiguous()) { y = b.gelu(x, gelu_mode::tanh, nm); break; }
        const std::array<int, max_rank> bhsd{0, 2, 1, 3};
        auto heads = [&](tensor t, const std::string& n) { return b.permute(b.reshape(t, {B, S, d / 2, 2}, n + ".r"), bhsd, n + ".p"); };
        tensor k = same(x);
        if (!b.info(k).contiguous()) k = x;
        auto q = heads(x, nm + ".q"), kh = heads(k, nm + ".k");
        auto sc = b.softmax(b.matmul(q, kh, false, true, nm + ".qk"), true, 0.5f, nm + ".sm");
        auto o = b.matmul(sc, kh, false, false, nm + ".pv");
        y = b.reshape(b.contiguous(b.permute(o, bhsd, nm + ".m"), nm + ".c"), {B, S, d}, nm);
        break;
      }
      case 7: {
        if (d < 4) { y = b.scale(x, 1.5f, nm); break; }
        const int64_t e = d - static_cast<int64_t>(pick(static_cast<std::size_t>(d / 2)));
        y = b.contiguous(b.slice(x, 2, static_cast<int64_t>(pick(2)), e, nm + ".s"), nm);
        break;
      }
      case 8: y = dim(x) <= 16 ? b.concat({x, same(x)}, 2, nm) : b.scale(x, 2.0f, nm); break;
      case 9: y = b.transpose(b.gelu(b.transpose(x, 1, 2, nm + ".t"), gelu_mode::erf, nm + ".g"), 1, 2, nm); break;
      case 10:
        if (pick(2) || d < 4) {
          y = b.add(x, b.get_rows(weight({11, d}), ids, nm + ".lookup"), nm);
        } else {  // every other column, through an arbitrary strided view
          const strides st = b.info(x).stride;
          y = b.contiguous(b.view(x, {B, S, d / 2}, {st[0], st[1], 2 * st[2], 0}, 0, nm + ".v"), nm);
        }
        break;
      default: {  // activation x activation
        tensor z = same(x);
        y = b.matmul(b.softmax(b.matmul(x, z, false, true, nm + ".xz"), false, 0.3f, nm + ".sm"), z, false, false, nm);
        break;
      }
    }
    if (!y.valid()) break;
    pool.push_back(y);
  }
  b.output(pool.back());
  std::set<node_id> outs{pool.back().id()};
  for (int k = 0; k < 2; ++k) {
    tensor t = pool[pool.size() / 2 + pick(pool.size() - pool.size() / 2)];
    if (outs.insert(t.id()).second) b.output(t);
  }
  auto g = std::move(b).build();
  EXPECT_TRUE(g.has_value()) << (g ? "" : g.err().to_string());
  return g ? std::make_shared<const graph>(std::move(*g)) : nullptr;
}

/// A graph of user collectives over `n` members for dtype t: member k
/// computes copy(x_k) ([rows, cols]) on device k (a storage node there),
/// then all_reduce, reduce_scatter (of dim 1, cols / n each) and all_gather
/// (dim 1, [rows, cols * n]) parts on every member. `cols` divides by n,
/// unless `scatter_parts` (n column counts summing to cols) gives the
/// reduce_scatter's uneven slices.
inline std::shared_ptr<const graph> user_collectives(dtype t, int n, int64_t rows, int64_t cols,
                                                     std::vector<int64_t> scatter_parts = {}) {
  std::vector<node> nodes;
  auto add = [&](node nd) {
    nd.id = static_cast<node_id>(nodes.size());
    nodes.push_back(std::move(nd));
    return nodes.back().id;
  };
  std::vector<node_id> ins, own, outs;
  for (int k = 0; k < n; ++k) {
    node x;
    x.op = op_kind::input;
    x.name = "x" + std::to_string(k);
    x.type = t;
    x.dims = shape{rows, cols};
    ins.push_back(add(x));
  }
  for (int k = 0; k < n; ++k) {
    node c;
    c.op = op_kind::copy;
    c.name = "own" + std::to_string(k);
    c.type = t;
    c.dims = shape{rows, cols};
    c.inputs = {ins[static_cast<std::size_t>(k)]};
    c.pinned_device = k;
    own.push_back(add(c));
  }
  const int64_t part = cols / n;
  for (int k = 0; k < n; ++k) {
    node ar;
    ar.op = op_kind::all_reduce;
    ar.name = "sum" + std::to_string(k);
    ar.inputs = own;
    ar.attrs.group = 0;
    ar.attrs.rank = k;
    ar.pinned_device = k;
    outs.push_back(add(ar));
    node rs;
    rs.op = op_kind::reduce_scatter;
    rs.name = "scatter" + std::to_string(k);
    rs.inputs = own;
    rs.attrs.group = 1;
    rs.attrs.rank = k;
    rs.attrs.axis = 1;
    rs.attrs.begin = part * k;
    rs.attrs.end = part * (k + 1);
    if (!scatter_parts.empty()) {
      rs.attrs.begin = 0;
      for (int j = 0; j < k; ++j) rs.attrs.begin += scatter_parts[static_cast<std::size_t>(j)];
      rs.attrs.end = rs.attrs.begin + scatter_parts[static_cast<std::size_t>(k)];
    }
    rs.pinned_device = k;
    outs.push_back(add(rs));
    node gth;
    gth.op = op_kind::all_gather;
    gth.name = "gather" + std::to_string(k);
    gth.inputs = own;
    gth.dims = shape{rows, cols * n};
    gth.attrs.group = 2;
    gth.attrs.rank = k;
    gth.attrs.axis = 1;
    gth.attrs.axis2 = 1;
    gth.pinned_device = k;
    outs.push_back(add(gth));
  }
  auto g = graph::from_nodes(nodes, ins, outs);
  EXPECT_TRUE(g.has_value()) << (g ? "" : g.err().to_string());
  return g ? std::make_shared<const graph>(std::move(*g)) : nullptr;
}

}  // namespace ag::test
