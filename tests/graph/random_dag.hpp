#pragma once
/// \file random_dag.hpp
/// Random valid graphs for tests (planner, memory plan, runtime stress):
/// 2-D f32 tensors joined by add / mul / matmul / gelu / softmax / concat and
/// views (transpose, slice, reshape), with job inputs, weights, several
/// outputs and some dead nodes (so pruning is exercised). Deterministic from
/// the seed. Header-only; any test may include it.
///
///     ag::expected<ag::graph> g = ag::test::random_dag({.seed = 7, .ops = 30});

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "graph/graph.hpp"
#include "graph/host_tensor.hpp"
#include "graph/random.hpp"

namespace ag::test {

struct random_dag_options {
  uint64_t seed = 1;
  int ops = 24;             ///< compute / view ops to add (leaves not counted)
  int inputs = 2;           ///< job inputs (each [d, d'] with d, d' from `dims`)
  int outputs = 2;          ///< extra outputs besides the last node
  bool layers = true;       ///< tag nodes with layers (ops / 4 per layer)
  std::vector<int64_t> dims{4, 8, 16};
};

/// Builds a random graph; fails only if the builder rejects an op (a bug).
inline expected<graph> random_dag(const random_dag_options& o) {
  rng r(o.seed);
  auto pick = [&](std::size_t n) { return static_cast<std::size_t>(r.next() % n); };
  graph_builder b;
  std::vector<tensor> pool;
  for (int i = 0; i < o.inputs; ++i)
    pool.push_back(b.input("in" + std::to_string(i), dtype::f32,
                           {o.dims[pick(o.dims.size())], o.dims[pick(o.dims.size())]}));
  int weights = 0;
  auto new_weight = [&](int64_t rows, int64_t cols) {
    const int k = weights++;
    return b.weight("w" + std::to_string(k),
                    host_tensor::random_normal(dtype::f32, {rows, cols}, o.seed * 1000 + static_cast<uint64_t>(k), 0.1f));
  };
  // Prefer recent tensors so chains form (and some early ones die).
  auto recent = [&]() -> tensor {
    const std::size_t n = pool.size();
    const std::size_t window = std::min<std::size_t>(n, 6);
    return pool[n - 1 - pick(window)];
  };
  auto same_shape = [&](tensor a) -> tensor {
    std::vector<tensor> c;
    for (tensor t : pool)
      if (b.info(t).dims == b.info(a).dims && t.id() != a.id()) c.push_back(t);
    return c.empty() ? a : c[pick(c.size())];
  };
  for (int i = 0; i < o.ops; ++i) {
    if (o.layers) b.set_layer(i / 4);
    const tensor a = recent();
    const node& ai = b.info(a);
    const int64_t rows = ai.dims[0], cols = ai.dims[1];
    const std::string name = "op" + std::to_string(i);
    tensor out;
    switch (pick(9)) {
      case 0: out = b.add(a, same_shape(a), name); break;
      case 1: out = b.mul(a, same_shape(a), name); break;
      case 2: {
        tensor w;
        for (tensor t : pool)
          if (b.info(t).dims[0] == cols && pick(2) == 0) w = t;
        if (!w.valid()) w = new_weight(cols, o.dims[pick(o.dims.size())]);
        out = b.matmul(a, w, false, false, name);
        break;
      }
      case 3: out = b.gelu(a, gelu_mode::tanh, name); break;
      case 4: out = b.softmax(a, cols >= rows && pick(2) == 0, 0.5f, name); break;
      case 5: out = b.transpose(a, 0, 1, name); break;
      case 6: {
        const int axis = static_cast<int>(pick(2));
        const int64_t len = ai.dims[axis];
        const int64_t begin = static_cast<int64_t>(pick(static_cast<std::size_t>(len / 2) + 1));
        out = b.slice(a, axis, begin, len, name);
        break;
      }
      case 7:
        if (ai.contiguous()) out = b.reshape(a, {cols, rows}, name);
        else out = b.contiguous(a, name);
        break;
      default: {
        tensor c = same_shape(a);
        out = b.concat({a, c}, static_cast<int>(pick(2)), name);
        break;
      }
    }
    if (!out.valid()) break;
    pool.push_back(out);
  }
  b.output(pool.back());
  std::vector<node_id> outs{pool.back().id()};
  for (int i = 0; i < o.outputs && pool.size() > 1; ++i) {
    tensor t = pool[pool.size() / 2 + pick(pool.size() - pool.size() / 2)];
    if (std::find(outs.begin(), outs.end(), t.id()) != outs.end()) continue;
    outs.push_back(t.id());
    b.output(t);
  }
  return std::move(b).build();
}

/// `chains` independent chains of `depth` matmul + gelu ([rows, d] x [d, d],
/// ops named "c<chain>.<k>.mm" / ".act") from one input x, summed one after
/// another as they finish ("join<chain>"): issue 16's branchy graph, whose
/// chains the planner gives compute lanes of their own (planner, lanes and
/// folded-lanes tests).
inline graph chains_graph(int chains, int depth, int64_t rows = 4, int64_t d = 32) {
  graph_builder b;
  auto x = b.input("x", dtype::f32, {rows, d});
  tensor sum;
  for (int c = 0; c < chains; ++c) {
    tensor h = x;
    for (int k = 0; k < depth; ++k) {
      const std::string n = "c" + std::to_string(c) + "." + std::to_string(k);
      auto w = b.weight(n + ".w", host_tensor::random_normal(dtype::f32, {d, d}, static_cast<uint64_t>(100 * c + k + 1),
                                                             1.5f / std::sqrt(static_cast<float>(d))));
      h = b.gelu(b.matmul(h, w, false, false, n + ".mm"), gelu_mode::tanh, n + ".act");
    }
    sum = sum.valid() ? b.add(sum, h, "join" + std::to_string(c)) : h;
  }
  b.output(sum);
  return std::move(b).build().value();
}

}  // namespace ag::test
