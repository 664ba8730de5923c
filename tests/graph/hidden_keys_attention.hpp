#pragma once
// An attention chain (q k^T + mask -> softmax -> p v, the shape a decode
// step's fused attention takes) whose mask hides keys (attention_hidden_score,
// graph/attention_mask.hpp, as a generator's mask does), for the
// backends' tests that a fused attention never reads a key its mask hides
// from every query row: the hidden keys' rows of k and v are NaN in the
// `poisoned` inputs, so an output equal to the reference on the `clean`
// inputs (the same values, finite rows there) shows they were never read
// (a NaN score makes the row's softmax NaN).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "graph/attention_mask.hpp"
#include "graph/graph.hpp"
#include "graph/host_tensor.hpp"

namespace ag::test {

struct hidden_keys_attention {
  graph g;
  std::vector<host_tensor> clean, poisoned;  // q, k, v, mask
};

/// q [1, kv_heads, rows, dh] (rows: rows / S query heads of S positions each,
/// GQA's packing), k and v [1, kv_heads, keys, dh], mask [S, keys]: softmax row
/// s sees keys [first_visible, visible_end[s]) except every seventh (holes
/// at attention_hidden_score; the others get random finite values). Rows of k and v below
/// first_visible and from the largest visible_end on are NaN in `poisoned`.
inline hidden_keys_attention make_hidden_keys_attention(dtype t, int64_t kv_heads, int64_t rows, int64_t keys,
                                                        int64_t dh, int64_t first_visible,
                                                        const std::vector<int64_t>& visible_end, uint64_t seed) {
  const auto S = static_cast<int64_t>(visible_end.size());
  graph_builder b;
  auto q = b.input("q", t, {1, kv_heads, rows, dh});
  auto k = b.input("k", t, {1, kv_heads, keys, dh});
  auto v = b.input("v", t, {1, kv_heads, keys, dh});
  auto scores = b.reshape(b.matmul(q, k, false, true, "qk"), {1, kv_heads * (rows / S), S, keys}, "heads");
  auto masked = b.add(scores, b.input("mask", t, {S, keys}), "masked");
  auto probs = b.reshape(b.softmax(masked, false, 0.125f, "softmax"), {1, kv_heads, rows, keys}, "probs");
  b.output(b.matmul(probs, v, false, false, "pv"));
  hidden_keys_attention c{std::move(b).build().value(), {}, {}};

  const host_tensor noise = host_tensor::random_normal(dtype::f32, {S, keys}, seed + 3, 0.5f);
  std::vector<float> mask(static_cast<std::size_t>(S * keys));
  int64_t end_of_all = 0;
  for (int64_t s = 0; s < S; ++s) {
    end_of_all = std::max(end_of_all, visible_end[static_cast<std::size_t>(s)]);
    for (int64_t j = 0; j < keys; ++j) {
      const bool seen = j >= first_visible && j < visible_end[static_cast<std::size_t>(s)] && j % 7 != 3;
      mask[static_cast<std::size_t>(s * keys + j)] =
          seen ? noise.at(s * keys + j) : attention_hidden_score;
    }
  }
  c.clean = {host_tensor::random_normal(t, {1, kv_heads, rows, dh}, seed, 1.0f),
             host_tensor::random_normal(t, {1, kv_heads, keys, dh}, seed + 1, 1.0f),
             host_tensor::random_normal(t, {1, kv_heads, keys, dh}, seed + 2, 1.0f),
             host_tensor::from_floats(t, {S, keys}, mask)};
  c.poisoned = c.clean;
  for (int i : {1, 2})
    for (int64_t h = 0; h < kv_heads; ++h)
      for (int64_t j = 0; j < keys; ++j)
        if (j < first_visible || j >= end_of_all)
          for (int64_t d = 0; d < dh; ++d)
            c.poisoned[static_cast<std::size_t>(i)].set((h * keys + j) * dh + d, std::numeric_limits<float>::quiet_NaN());
  return c;
}

/// Whether every value of `x` is finite.
inline bool all_finite(const host_tensor& x) {
  for (int64_t i = 0; i < x.numel(); ++i)
    if (!std::isfinite(x.at(i))) return false;
  return true;
}

}  // namespace ag::test
