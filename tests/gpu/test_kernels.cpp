// The cpu kernels against graph/reference.hpp: every op kind, on random data,
// odd sizes, broadcast and strided (permuted / transposed / sliced) inputs,
// f32 / f16 / bf16. Each compute node runs in isolation on the reference's
// values of its inputs, read through the node's real storage layout (views
// resolve to their storage buffer + offset + strides, as the runtime does).
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <limits>
#include <random>
#include <cstring>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "gpu/cpu/few_rows.hpp"
#include "gpu/cpu/bf16_gemm.hpp"
#include "gpu/cpu/kernels.hpp"
#include "gpu/cpu/thread_team.hpp"
#include "gpu/cpu/vector_math.hpp"
#include "graph/graph.hpp"
#include "graph/random.hpp"
#include "graph/reference.hpp"

namespace {

using namespace ag;

struct tol {
  double atol, rtol;
};

tol for_type(dtype t, tol f32) {
  if (t == dtype::f16) return {2e-3, 4e-3};
  if (t == dtype::bf16) return {1.5e-2, 1.6e-2};
  return f32;
}

// The launch of node n of g on `storage` (the reference's buffers, by
// storage id; views read through their storage, offset and strides, as the
// runtime does), its output into `out`, poisoned first so that an element
// the kernel forgets cannot pass by luck.
gpu::op_launch launch_on(const graph& g, const node& n, const std::vector<host_tensor>& storage, host_tensor& out) {
  gpu::op_launch l;
  l.op = &n;
  l.source = &g;
  for (node_id in : n.inputs) {
    const node& x = g.at(in);
    const host_tensor& s = storage[static_cast<std::size_t>(x.storage)];
    gpu::tensor_arg a;
    a.data = const_cast<std::byte*>(s.data()) + x.offset * static_cast<int64_t>(dtype_size(x.type));
    a.type = x.type;
    a.dims = x.dims;
    a.stride = x.stride;
    l.inputs.push_back(a);
  }
  std::memset(out.data(), 0x7f, out.bytes());
  l.out.data = out.data();
  l.out.type = n.type;
  l.out.dims = n.dims;
  l.out.stride = n.stride;
  return l;
}

// Runs every compute node of g through the cpu kernels and compares each
// output with the reference. Returns the number of nodes checked.
int check_graph(const graph& g, const std::vector<host_tensor>& inputs, tol f32) {
  auto ref = evaluate_reference_all(g, inputs);
  EXPECT_TRUE(ref.has_value()) << (ref ? "" : ref.err().to_string());
  if (!ref) return 0;
  int checked = 0;
  for (const node& n : g.nodes()) {
    if (is_leaf_op(n.op) || n.is_view()) continue;
    host_tensor out(n.type, n.dims);
    const error e = gpu::cpu::run_op(launch_on(g, n, *ref, out));
    EXPECT_FALSE(e) << n.name << ": " << e.to_string();
    const tol t = for_type(n.type, f32);
    const auto c = compare(out, (*ref)[static_cast<std::size_t>(n.id)], t.atol, t.rtol);
    EXPECT_TRUE(c.ok) << "node '" << n.name << "' (" << to_string(n.op) << ", " << to_string(n.type) << " "
                      << n.dims.to_string() << "): " << c.message << " max_abs " << c.max_abs_err;
    ++checked;
  }
  return checked;
}

host_tensor rnd(dtype t, shape s, uint64_t seed, float sd = 1.0f) {
  return host_tensor::random_normal(t, s, seed, sd, 0.1f);
}

graph must(expected<graph> g) {
  EXPECT_TRUE(g.has_value()) << (g ? "" : g.err().to_string());
  return g ? std::move(*g) : graph();
}

const dtype float_types[] = {dtype::f32, dtype::f16, dtype::bf16};

// input "a" of shape `a` times a random weight "b" of shape `b`: one matmul "mm".
graph one_matmul(dtype t, const shape& a, const shape& b, bool ta, bool tb, uint64_t seed) {
  graph_builder gb;
  auto x = gb.input("a", t, a);
  auto w = gb.weight("b", rnd(t, b, seed));
  gb.output(gb.matmul(x, w, ta, tb, "mm"));
  return must(std::move(gb).build());
}

TEST(CpuKernels, MatmulShapesTransposesAndBatchBroadcast) {
  struct cfg {
    shape a, b;
    bool ta, tb;
  };
  const cfg cases[] = {
      {{1, 1}, {1, 1}, false, false},
      {{7, 13}, {13, 5}, false, false},
      {{13, 7}, {13, 5}, true, false},
      {{7, 13}, {5, 13}, false, true},
      {{13, 7}, {5, 13}, true, true},
      {{3, 5, 9}, {3, 9, 4}, false, false},
      {{2, 3, 5, 6}, {6, 7}, false, false},     // weight broadcast over batches
      {{5, 6}, {2, 6, 7}, false, false},        // a broadcast
      {{2, 1, 5, 6}, {1, 3, 7, 6}, false, true}, // both broadcast
      // A few rows (gpu/cpu/few_rows.hpp): a weight [out, in] used
      // transposed (dot products) and one [in, out] (axpy), k across a
      // 256-element chunk, n not a multiple of 4, A by columns, batches.
      {{1, 300}, {70, 300}, false, true},
      {{1, 300}, {300, 70}, false, false},
      {{3, 517}, {37, 517}, false, true},
      {{300, 2}, {300, 9}, true, false},
      {{2, 4, 5, 300}, {37, 300}, false, true},
      {{8, 33}, {33, 1030}, false, false},
  };
  uint64_t seed = 1;
  for (dtype t : float_types)
    for (const cfg& c : cases) {
      const graph g = one_matmul(t, c.a, c.b, c.ta, c.tb, seed++);
      SCOPED_TRACE(std::string(to_string(t)) + " a " + c.a.to_string() + " b " + c.b.to_string());
      EXPECT_EQ(check_graph(g, {rnd(t, c.a, seed++)}, {1e-4, 1e-4}), 1);
    }
}

TEST(CpuKernels, MatmulOnPermutedAndSlicedViews) {
  for (dtype t : float_types) {
    graph_builder b;
    auto x = b.input("x", t, {4, 6, 9});
    auto w = b.input("w", t, {2, 11, 9});
    auto xs = b.slice(b.transpose(x, 1, 2, "xt"), 2, 1, 5, "xs");  // [4, 9, 4], strided
    auto ws = b.slice(w, 0, 1, 2, "ws");                           // [1, 11, 9]
    b.output(b.matmul(xs, ws, true, true, "mm"));                  // -> [4, 4, 11]
    auto p = b.permute(x, {2, 0, 1, 3}, "p");                      // [9, 4, 6], no unit stride
    b.output(b.matmul(p, b.slice(x, 0, 0, 1, "x0"), false, false, "mm2"));  // [9,4,6] x [1,6,9]
    graph g = must(std::move(b).build());
    SCOPED_TRACE(to_string(t));
    EXPECT_EQ(check_graph(g, {rnd(t, {4, 6, 9}, 11), rnd(t, {2, 11, 9}, 12)}, {1e-4, 1e-4}), 2);
  }
}

TEST(CpuKernels, ElementwiseWithBroadcastAndStrides) {
  uint64_t seed = 100;
  for (dtype t : float_types) {
    graph_builder b;
    auto x = b.input("x", t, {3, 5, 7});
    auto bias = b.input("bias", t, {7});
    auto col = b.input("col", t, {5, 1});
    auto a1 = b.add(x, bias, "add_row");
    auto m1 = b.mul(x, col, "mul_col");
    auto xt = b.transpose(x, 0, 2, "xt");  // [7, 5, 3]
    auto s = b.scale(xt, -1.75f, "scale_t");
    auto g1 = b.gelu(xt, gelu_mode::tanh, "gelu_tanh");
    auto g2 = b.gelu(x, gelu_mode::erf, "gelu_erf");
    auto si = b.silu(b.slice(x, 1, 1, 4, "xs"), "silu_s");
    auto a2 = b.add(xt, b.input("sc", t, {1}), "add_scalar");
    auto m2 = b.mul(x, x, "mul_self");
    for (auto o : {a1, m1, s, g1, g2, si, a2, m2}) b.output(o);
    graph g = must(std::move(b).build());
    SCOPED_TRACE(to_string(t));
    EXPECT_EQ(check_graph(g,
                          {rnd(t, {3, 5, 7}, seed), rnd(t, {7}, seed + 1), rnd(t, {5, 1}, seed + 2),
                           rnd(t, {1}, seed + 3)},
                          {1e-5, 1e-5}),
              8);
    seed += 10;
  }
}

TEST(CpuKernels, Norms) {
  uint64_t seed = 200;
  for (dtype t : float_types) {
    for (int64_t d : {1, 7, 64, 129}) {
      graph_builder b;
      auto x = b.input("x", t, {3, 4, d});
      auto w = b.weight("w", rnd(t, {d}, seed++));
      auto bi = b.weight("b", rnd(t, {d}, seed++));
      b.output(b.rms_norm(x, w, 1e-6f, "rms_w"));
      b.output(b.rms_norm(x, tensor(), 1e-5f, "rms"));
      b.output(b.layer_norm(x, tensor(), tensor(), 1e-5f, "ln"));
      b.output(b.layer_norm(x, w, tensor(), 1e-5f, "ln_w"));
      b.output(b.layer_norm(x, w, bi, 1e-5f, "ln_wb"));
      b.output(b.rms_norm(b.transpose(x, 0, 1, "xt"), w, 1e-6f, "rms_t"));
      b.output(b.layer_norm(b.slice(x, 1, 1, 3, "xs"), w, bi, 1e-5f, "ln_s"));
      graph g = must(std::move(b).build());
      SCOPED_TRACE(std::string(to_string(t)) + " D=" + std::to_string(d));
      EXPECT_EQ(check_graph(g, {rnd(t, {3, 4, d}, seed++, 2.0f)}, {2e-5, 2e-5}), 7);
    }
  }
}

TEST(CpuKernels, SoftmaxPlainCausalScaledStrided) {
  uint64_t seed = 300;
  for (dtype t : float_types) {
    graph_builder b;
    auto x = b.input("x", t, {2, 5, 9});
    b.output(b.softmax(x, false, 1.0f, "sm"));
    b.output(b.softmax(x, true, 0.125f, "sm_causal"));  // Sq 5 < Sk 9: offset Sk - Sq
    auto sq = b.slice(x, 2, 0, 5, "square");             // Sq = Sk = 5, strided rows
    b.output(b.softmax(sq, true, 2.0f, "sm_causal_sq"));
    b.output(b.softmax(b.input("v", t, {11}), false, 0.5f, "sm_vec"));
    auto p = b.permute(b.input("y", t, {9, 2, 5}), {1, 2, 0, 3}, "p");  // [2, 5, 9], inner stride != 1
    b.output(b.softmax(p, true, 1.0f, "sm_perm"));
    graph g = must(std::move(b).build());
    SCOPED_TRACE(to_string(t));
    EXPECT_EQ(check_graph(g, {rnd(t, {2, 5, 9}, seed, 3.0f), rnd(t, {11}, seed + 1), rnd(t, {9, 2, 5}, seed + 2)},
                          {1e-6, 1e-5}),
              5);
    seed += 10;
  }
}

// argmax over contiguous, strided (permuted) and long rows, every float
// dtype: equal to the reference, index for index.
TEST(CpuKernels, ArgmaxOfContiguousStridedAndLongRows) {
  uint64_t seed = 900;
  for (dtype t : float_types) {
    graph_builder b;
    b.output(b.argmax(b.input("x", t, {3, 5, 37}), "am"));
    auto p = b.permute(b.input("y", t, {37, 3, 5}), {1, 2, 0, 3}, "p");  // [3, 5, 37], inner stride != 1
    b.output(b.argmax(p, "am_perm"));
    b.output(b.argmax(b.input("v", t, {32000}), "am_vocab"));
    graph g = must(std::move(b).build());
    SCOPED_TRACE(to_string(t));
    EXPECT_EQ(check_graph(g, {rnd(t, {3, 5, 37}, seed), rnd(t, {37, 3, 5}, seed + 1), rnd(t, {32000}, seed + 2)},
                          {0, 0}),
              3);
    seed += 10;
  }
}

// range_mask: random key positions (some -1: rows holding nothing) and
// random query ranges (some empty: first > last), every float dtype, equal
// to the reference entry for entry.
TEST(CpuKernels, RangeMaskOfRandomKeysAndRanges) {
  std::mt19937 rng(77);
  const auto ints = [&](shape s, int lo, int hi) {
    std::uniform_int_distribution<int> d(lo, hi);
    std::vector<int32_t> v(static_cast<std::size_t>(s.numel()));
    for (int32_t& x : v) x = d(rng);
    return host_tensor::from_ints(s, v);
  };
  for (dtype t : float_types)
    for (const auto& [T, C] : {std::pair<int64_t, int64_t>{1, 16}, {7, 301}, {40, 129}}) {
      graph_builder b;
      tensor keys = b.input("keys", dtype::i32, {C});  // the inputs' order: keys, then ranges
      tensor ranges = b.input("ranges", dtype::i32, {T, 2});
      b.output(b.range_mask(keys, ranges, t, "mask"));
      graph g = must(std::move(b).build());
      SCOPED_TRACE(std::string(to_string(t)) + " T " + std::to_string(T) + " C " + std::to_string(C));
      EXPECT_EQ(check_graph(g, {ints({C}, -1, 60), ints({T, 2}, 0, 60)}, {0, 0}), 1);
    }
}

TEST(CpuKernels, RopeBothPairingsRanks3And4) {
  uint64_t seed = 400;
  for (dtype t : float_types)
    for (rope_mode m : {rope_mode::neox, rope_mode::interleaved}) {
      graph_builder b;
      auto x3 = b.input("x3", t, {5, 3, 8});
      auto x4 = b.input("x4", t, {2, 5, 2, 6});
      auto pos = b.input("pos", dtype::i32, {5});
      b.output(b.rope(x3, pos, 10000.0f, m, "rope3"));
      b.output(b.rope(x4, pos, 500000.0f, m, "rope4"));
      // Llama 3's scaling: D 6 at theta 5e5 has wavelengths 6.3, 498 and
      // 39,500, kept, blended and slowed with an original context of 1000.
      b.output(b.rope(x4, pos, 500000.0f, m, "rope4_llama3", rope_scaling{8.0f, 1.0f, 4.0f, 1000}));
      // strided x: [5, 3, 8] seen through a permute of a [3, 5, 8] tensor
      auto xp = b.permute(b.input("xp", t, {3, 5, 8}), {1, 0, 2, 3}, "xp_perm");
      b.output(b.rope(xp, pos, 10000.0f, m, "rope_perm"));
      graph g = must(std::move(b).build());
      SCOPED_TRACE(std::string(to_string(t)) + (m == rope_mode::neox ? " neox" : " interleaved"));
      EXPECT_EQ(check_graph(g,
                            {rnd(t, {5, 3, 8}, seed), rnd(t, {2, 5, 2, 6}, seed + 1),
                             host_tensor::random_ints({5}, seed + 2, 4096), rnd(t, {3, 5, 8}, seed + 3)},
                            {2e-5, 2e-5}),
                4);
      seed += 10;
    }
}

TEST(CpuKernels, GetRowsConcatCopy) {
  uint64_t seed = 500;
  for (dtype t : float_types) {
    graph_builder b;
    auto table = b.weight("table", rnd(t, {17, 6}, seed++));
    auto ids1 = b.input("ids1", dtype::i32, {9});
    auto ids2 = b.input("ids2", dtype::i32, {2, 3});
    b.output(b.get_rows(table, ids1, "rows1"));
    b.output(b.get_rows(table, ids2, "rows2"));
    b.output(b.get_rows(b.slice(table, 1, 1, 5, "tcols"), ids1, "rows_strided_table"));
    auto a = b.input("a", t, {2, 3, 4});
    auto c = b.input("c", t, {2, 5, 4});
    auto at = b.transpose(b.input("d", t, {2, 4, 2}), 1, 2, "dt");  // [2, 2, 4] strided
    b.output(b.concat({a, c, at}, 1, "cat1"));
    b.output(b.concat({a, a}, -1, "cat_last"));
    b.output(b.concat({a, b.slice(a, 0, 1, 2, "a1")}, 0, "cat0"));
    b.output(b.contiguous(b.permute(c, {2, 0, 1, 3}, "cp"), "contig"));
    for (dtype to : {dtype::f32, dtype::f16, dtype::bf16}) b.output(b.copy(a, to, std::string("cast_") + to_string(to)));
    graph g = must(std::move(b).build());
    SCOPED_TRACE(to_string(t));
    EXPECT_EQ(check_graph(g,
                          {host_tensor::random_ints({9}, seed, 17), host_tensor::random_ints({2, 3}, seed + 1, 17),
                           rnd(t, {2, 3, 4}, seed + 2), rnd(t, {2, 5, 4}, seed + 3), rnd(t, {2, 4, 2}, seed + 4)},
                          {0, 0}),
              10);
    seed += 10;
  }
}

TEST(CpuKernels, CopyCastsToAndFromI32) {
  graph_builder b;
  auto x = b.input("x", dtype::f32, {4, 7});
  auto i = b.copy(b.scale(x, 1000.0f, "big"), dtype::i32, "to_i32");
  b.output(i);
  b.output(b.copy(i, dtype::f32, "back"));
  b.output(b.copy(b.transpose(i, 0, 1, "it"), dtype::i32, "i32_strided"));
  graph g = must(std::move(b).build());
  EXPECT_EQ(check_graph(g, {rnd(dtype::f32, {4, 7}, 77)}, {0, 0}), 4);
}

TEST(CpuKernels, ViewAndLeafLaunchesAreNoOps) {
  graph_builder b;
  auto x = b.input("x", dtype::f32, {2, 3});
  auto v = b.transpose(x, 0, 1, "xt");
  b.output(v);
  graph g = must(std::move(b).build());
  for (const node& n : g.nodes()) {
    gpu::op_launch l;
    l.op = &n;  // no buffers at all: nothing may be touched
    EXPECT_FALSE(gpu::cpu::run_op(l)) << n.name;
  }
}

TEST(CpuKernels, GetRowsIdOutOfRangeFailsNamingTheNode) {
  graph_builder b;
  auto table = b.weight("emb", rnd(dtype::f32, {5, 4}, 1));
  auto ids = b.input("ids", dtype::i32, {3});
  b.output(b.get_rows(table, ids, "lookup"));
  graph g = must(std::move(b).build());
  const node& n = g.at(g.find("lookup"));
  std::vector<int32_t> idv = {1, 5, 0};
  host_tensor out(dtype::f32, n.dims);
  gpu::op_launch l;
  l.op = &n;
  l.inputs.push_back({const_cast<std::byte*>(n.inputs.empty() ? nullptr : g.at(n.inputs[0]).data->in_memory()->data()),
                      dtype::f32, {5, 4}, contiguous_strides({5, 4})});
  l.inputs.push_back({idv.data(), dtype::i32, {3}, contiguous_strides({3})});
  l.out = {out.data(), dtype::f32, n.dims, contiguous_strides(n.dims)};
  const error e = gpu::cpu::run_op(l);
  ASSERT_TRUE(e);
  EXPECT_EQ(e.op, "lookup") << e.to_string();
  // The offending id has no field: the text naming it is the behaviour here.
  EXPECT_NE(e.message.find("5"), std::string::npos) << e.message;
}

TEST(CpuKernels, CheckOpRejectsBadLaunchesNamingTheNode) {
  graph_builder b;
  auto x = b.input("x", dtype::f32, {2, 3});
  b.output(b.add(x, x, "sum"));
  graph g = must(std::move(b).build());
  const node& n = g.at(g.find("sum"));
  std::vector<float> buf(6, 1.0f);
  gpu::tensor_arg a{buf.data(), dtype::f32, {2, 3}, contiguous_strides({2, 3})};
  gpu::op_launch l;
  l.op = &n;
  l.out = a;
  l.inputs = {a};  // one input, add needs two
  error e = gpu::cpu::check_op(l);
  ASSERT_TRUE(e);
  EXPECT_EQ(e.op, "sum") << e.to_string();
  l.inputs = {a, a};
  l.out.dims = {3, 2};
  e = gpu::cpu::check_op(l);
  ASSERT_TRUE(e);
  EXPECT_EQ(e.code, errc::invalid_shape);
  l.out.dims = {2, 3};
  l.inputs[1].data = nullptr;
  EXPECT_TRUE(gpu::cpu::check_op(l));
}

// Both gemm paths, also for one row (BLAS's sgemv there), with beta 0.5
// and with beta 0 over a C full of NaNs (which must not survive).
TEST(CpuKernels, GemmFallbackMatchesBlasPath) {
  rng r(42);
  for (const int64_t m : {37, 1})
    for (const float beta : {0.5f, 0.0f})
      for (int tc = 0; tc < 4; ++tc) {
        SCOPED_TRACE("m " + std::to_string(m) + ", beta " + std::to_string(beta) + ", trans " + std::to_string(tc));
        const bool ta = tc & 1, tb = tc & 2;
        const int64_t n = 29, k = 300;
        std::vector<float> a(static_cast<std::size_t>(m * k)), bb(static_cast<std::size_t>(k * n));
        for (auto& v : a) v = static_cast<float>(r.normal());
        for (auto& v : bb) v = static_cast<float>(r.normal());
        std::vector<float> c1(static_cast<std::size_t>(m * n), beta == 0.0f ? std::nanf("") : 0.5f), c2 = c1;
        const int64_t lda = ta ? m : k, ldb = tb ? k : n;
        gpu::cpu::gemm_f32(ta, tb, m, n, k, 0.75f, a.data(), lda, bb.data(), ldb, beta, c1.data(), n);
        gpu::cpu::gemm_f32_fallback(ta, tb, m, n, k, 0.75f, a.data(), lda, bb.data(), ldb, beta, c2.data(), n);
        // naive double reference for one corner of C
        double ref = 0;
        for (int64_t p = 0; p < k; ++p) ref += double(ta ? a[p * lda] : a[p]) * double(tb ? bb[p] : bb[p * ldb]);
        ref = 0.75 * ref + (beta == 0.0f ? 0.0 : 0.25);
        EXPECT_NEAR(c2[0], ref, 1e-3);
        EXPECT_NEAR(c1[0], ref, 1e-3);
        for (std::size_t i = 0; i < c1.size(); ++i) ASSERT_NEAR(c1[i], c2[i], 1e-3) << i;
      }
}

// few_row_product (AVX2 + FMA where the machine has them) and its portable
// twin against a double-precision sum of the same converted values: every
// dtype, both forms (a weight's columns contiguous: dot products; its rows:
// axpy), 1..8 rows, sizes across every tail (k % 8, n % 4, the 256- and
// 512-element chunks), strides wider than the matrix, A's rows apart. C
// starts as NaNs, so an element left unwritten fails.
TEST(CpuKernels, FewRowProductsEqualADoublePrecisionSum) {
  rng r(7);
  const struct {
    int64_t n, k;
  } sizes[] = {{1, 1}, {5, 7}, {13, 33}, {37, 300}, {70, 1030}, {1031, 9}};
  for (dtype t : float_types)
    for (const bool dot : {true, false})
      for (const auto& sz : sizes)
        for (int64_t m = 1; m <= gpu::cpu::few_rows_max; ++m)
          for (const bool portable : {false, true}) {
            const int64_t n = sz.n, k = sz.k, lda = k + 3;
            // B[p][j] at p * ps + j * js.
            const int64_t ps = dot ? 1 : n + 5, js = dot ? k + 2 : 1;
            const int64_t span = dot ? (n - 1) * js + k : (k - 1) * ps + n;
            host_tensor b = host_tensor::random_normal(t, {span}, r.next(), 1.0f);
            std::vector<float> a(static_cast<std::size_t>(m * lda));
            for (auto& v : a) v = static_cast<float>(r.normal());
            std::vector<float> c(static_cast<std::size_t>(m * (n + 1)), std::nanf(""));
            const int64_t ldc = n + 1;
            const bool ran = portable ? gpu::cpu::few_row_product_portable(m, n, k, a.data(), lda, b.data(), t, ps, js,
                                                                          c.data(), ldc)
                                      : gpu::cpu::few_row_product(m, n, k, a.data(), lda, b.data(), t, ps, js,
                                                                 c.data(), ldc);
            ASSERT_TRUE(ran);
            for (int64_t i = 0; i < m; ++i)
              for (int64_t j = 0; j < n; ++j) {
                double want = 0, mag = 0;
                for (int64_t p = 0; p < k; ++p) {
                  const double x = a[static_cast<std::size_t>(i * lda + p)], y = b.at(p * ps + j * js);
                  want += x * y;
                  mag += std::fabs(x * y);
                }
                const float got = c[static_cast<std::size_t>(i * ldc + j)];
                ASSERT_NEAR(got, want, 1e-5 * mag + 1e-6)
                    << to_string(t) << (dot ? " dot" : " axpy") << (portable ? " portable" : "") << ", m " << m
                    << ", n " << n << ", k " << k << ", C[" << i << "][" << j << "]";
              }
          }
  // Refused: too many rows, i32, neither stride 1.
  float a1[9] = {}, c1[9] = {};
  const float b1[9] = {};
  EXPECT_FALSE(gpu::cpu::few_row_product(9, 1, 1, a1, 1, b1, dtype::f32, 1, 1, c1, 1));
  EXPECT_FALSE(gpu::cpu::few_row_product(1, 1, 1, a1, 1, b1, dtype::i32, 1, 1, c1, 1));
  EXPECT_FALSE(gpu::cpu::few_row_product(1, 2, 2, a1, 2, b1, dtype::f32, 2, 3, c1, 2));
}

// Every f16 bit pattern (normals, subnormals, zeros, infinities, NaNs) read
// by both paths' converters equals half_to_float: one row of ones against
// B [1, 65536].
TEST(CpuKernels, FewRowProductsReadEveryHalfLikeHalfToFloat) {
  std::vector<uint16_t> bits(65536);
  for (std::size_t i = 0; i < bits.size(); ++i) bits[i] = static_cast<uint16_t>(i);
  const float one = 1.0f;
  for (const bool portable : {false, true})
    for (const bool dot : {true, false}) {
      std::vector<float> c(bits.size());
      const int64_t n = static_cast<int64_t>(bits.size());
      // k 1: element (0, j) at j either way.
      const bool ran = portable ? gpu::cpu::few_row_product_portable(1, n, 1, &one, 1, bits.data(), dtype::f16,
                                                                    dot ? 1 : n, 1, c.data(), n)
                                : gpu::cpu::few_row_product(1, n, 1, &one, 1, bits.data(), dtype::f16, dot ? 1 : n,
                                                           1, c.data(), n);
      ASSERT_TRUE(ran);
      for (std::size_t i = 0; i < bits.size(); ++i) {
        const float want = half_to_float(bits[i]);
        if (std::isnan(want)) {
          ASSERT_TRUE(std::isnan(c[i])) << std::hex << i;
        } else {
          ASSERT_EQ(c[i], want) << std::hex << "0x" << i << (portable ? " portable" : "") << (dot ? " dot" : " axpy");
        }
      }
    }
}

}  // namespace

// ---- several threads a kernel (gpu/cpu/thread_team.hpp) ----------------------

namespace {

using namespace ag;

// Every part of every call runs exactly once, with callers on six threads at
// once asking for different thread counts (more threads than parts, one
// part, one thread among them).
TEST(CpuThreadTeam, RunsEveryPartOnceWithManyCallersAtOnce) {
  constexpr int callers = 6, calls = 150;
  std::vector<std::thread> threads;
  std::atomic<int> wrong{0};
  for (int c = 0; c < callers; ++c)
    threads.emplace_back([&, c] {
      rng r(100 + c);
      for (int call = 0; call < calls; ++call) {
        const int parts = 1 + static_cast<int>(r.next() % 40), want = 1 + static_cast<int>(r.next() % 5);
        std::vector<std::atomic<int>> runs(static_cast<std::size_t>(parts));
        gpu::cpu::run_parts(parts, want, [&](int i) { runs[static_cast<std::size_t>(i)].fetch_add(1); });
        for (const auto& n : runs)
          if (n.load() != 1) wrong.fetch_add(1);
      }
    });
  for (auto& t : threads) t.join();
  EXPECT_EQ(wrong.load(), 0);
  EXPECT_GE(gpu::cpu::team_helpers(), 1);
}

// Helpers do take parts: part 0 holds the calling thread until part 1 has
// started, which only a helper can do; each part sees the other on another
// thread. (A caller that ran its parts alone would wait here for ever: the
// wait gives up after 60 s and the test fails.)
TEST(CpuThreadTeam, AHelperRunsPartsBesideTheCaller) {
  std::atomic<int> started{0};
  std::thread::id ran_on[2];
  bool both_seen[2] = {false, false};
  gpu::cpu::run_parts(2, 2, [&](int i) {
    ran_on[i] = std::this_thread::get_id();
    started.fetch_add(1);
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    while (started.load() < 2 && std::chrono::steady_clock::now() < deadline) std::this_thread::yield();
    both_seen[i] = started.load() == 2;
  });
  EXPECT_TRUE(both_seen[0] && both_seen[1]);
  EXPECT_NE(ran_on[0], ran_on[1]);
}

// A part may itself split its work (a helper is then a caller): no deadlock,
// every inner part once.
TEST(CpuThreadTeam, PartsMaySplitTheirWorkAgain) {
  std::vector<std::atomic<int>> runs(8 * 8);
  gpu::cpu::run_parts(8, 3, [&](int i) {
    gpu::cpu::run_parts(8, 3, [&](int j) { runs[static_cast<std::size_t>(i * 8 + j)].fetch_add(1); });
  });
  for (const auto& n : runs) EXPECT_EQ(n.load(), 1);
}

// A part that throws on the calling thread: run_parts throws it once the
// helpers are done, no part runs twice, and the team goes on working.
TEST(CpuThreadTeam, APartThrowingOnTheCallerLeavesRunPartsAndTheTeamWorks) {
  const auto caller = std::this_thread::get_id();
  std::vector<std::atomic<int>> runs(50);
  std::atomic<bool> caller_threw{false};
  EXPECT_THROW(gpu::cpu::run_parts(50, 3,
                                   [&](int i) {
                                     runs[static_cast<std::size_t>(i)].fetch_add(1);
                                     if (std::this_thread::get_id() == caller) {
                                       caller_threw.store(true);
                                       throw std::runtime_error("part failed");
                                     }
                                     // A helper's part waits for the caller's, so parts are left for it.
                                     const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
                                     while (!caller_threw.load() && std::chrono::steady_clock::now() < deadline)
                                       std::this_thread::yield();
                                   }),
               std::runtime_error);
  for (const auto& n : runs) EXPECT_LE(n.load(), 1);
  std::vector<std::atomic<int>> again(50);
  gpu::cpu::run_parts(50, 3, [&](int i) { again[static_cast<std::size_t>(i)].fetch_add(1); });
  for (const auto& n : again) EXPECT_EQ(n.load(), 1);
}

// The graph's (first) output node through run_op with `threads`; its output's bytes.
std::vector<std::byte> output_bytes(const graph& g, const std::vector<host_tensor>& storage, int threads,
                                    int parts = 0) {
  const node& mm = g.at(g.outputs()[0]);
  host_tensor out(mm.type, mm.dims);
  EXPECT_FALSE(gpu::cpu::run_op(launch_on(g, mm, storage, out), threads, parts));
  return std::vector<std::byte>(out.data(), out.data() + out.bytes());
}

// A matmul given 1, 2, 3 or 7 threads gives the same bits, and the
// reference's values: a few rows against weights large enough to be split
// (both forms: [out, in] used transposed, and [in, out]), many rows against
// a bf16 / f16 weight whose conversion to f32 is split, BLAS's products cut
// into columns or rows of C, and batches spread over the threads.
TEST(CpuKernels, MatmulsSplitAmongThreadsGiveTheSameBits) {
  struct cfg {
    shape a, b;
    bool tb;
  };
  const cfg cases[] = {
      {{1, 300}, {1003, 300}, true},   // one row, dot products over 1003 columns
      {{3, 300}, {300, 1003}, false},  // three rows, axpy over rows of 1003
      {{8, 257}, {2050, 257}, true},   // eight rows, 2050 columns: parts of 16 and a tail
      {{40, 300}, {1003, 300}, true},  // many rows: the weight converted by columns in parts
      {{40, 300}, {300, 1003}, false}, // many rows: converted by rows in parts
      {{200, 300}, {300, 1003}, false},  // f32 through BLAS: columns of C in parts
      {{200, 300}, {1003, 300}, true},
      {{300, 200}, {200, 100}, false},   // narrow C: rows in parts
      {{6, 40, 64}, {6, 50, 64}, true},  // batches over the threads, each whole
  };
  uint64_t seed = 900;
  for (dtype t : float_types)
    for (const cfg& c : cases) {
      const graph g = one_matmul(t, c.a, c.b, false, c.tb, seed++);
      SCOPED_TRACE(std::string(to_string(t)) + " a " + c.a.to_string() + " b " + c.b.to_string());
      const std::vector<host_tensor> inputs = {rnd(t, c.a, seed++)};
      auto ref = evaluate_reference_all(g, inputs);
      ASSERT_TRUE(ref.has_value()) << ref.err().to_string();
      const auto one = output_bytes(g, *ref, 1);
      for (const int threads : {2, 3, 7}) EXPECT_TRUE(output_bytes(g, *ref, threads) == one) << threads << " threads";
      EXPECT_EQ(check_graph(g, inputs, {1e-4, 1e-4}), 1);
      // A device's own cut (run_op's parts: its share of the machine): the
      // same bits on any thread count for each cut, the reference's values.
      for (const int parts : {1, 3}) {
        const auto cut = output_bytes(g, *ref, 1, parts);
        for (const int threads : {2, 7}) EXPECT_TRUE(output_bytes(g, *ref, threads, parts) == cut) << parts << " parts";
        host_tensor got(g.at(g.outputs()[0]).type, g.at(g.outputs()[0]).dims);
        std::memcpy(got.data(), cut.data(), cut.size());
        const double tol = t == dtype::f32 ? 1e-4 : 1e-2;  // a half output is rounded
        const auto c = compare(got, (*ref)[static_cast<std::size_t>(g.outputs()[0])], tol, tol);
        EXPECT_TRUE(c.ok) << parts << " parts: " << c.message;
      }
    }
}

// Every compute node of g through run_op with `threads`, on the
// reference's buffers; each node's output bytes, in node order.
std::vector<std::vector<std::byte>> node_bytes(const graph& g, const std::vector<host_tensor>& storage, int threads) {
  std::vector<std::vector<std::byte>> r;
  for (const node& n : g.nodes()) {
    if (is_leaf_op(n.op) || n.is_view()) continue;
    host_tensor out(n.type, n.dims);
    const error e = gpu::cpu::run_op(launch_on(g, n, storage, out), threads);
    EXPECT_FALSE(e) << n.name << ": " << e.to_string();
    r.emplace_back(out.data(), out.data() + out.bytes());
  }
  return r;
}

// Ops over whole rows (softmax, norms, rope, the elementwise ones, copies,
// argmax) large enough to be split give the same bits on 2, 3 or 7 threads as on one, and
// the reference's values; so do a decode step's attention products (a few
// rows against each of many batches: a batch to a thread), also where the
// batches are fewer than the threads (their columns split instead).
TEST(CpuKernels, RowOpsAndBatchedProductsSplitAmongThreadsGiveTheSameBits) {
  uint64_t seed = 950;
  for (dtype t : float_types) {
    SCOPED_TRACE(to_string(t));
    graph_builder gb;
    // 96 rows of 1000: 375 KiB of f32 a tensor, over the split threshold.
    auto x = gb.input("x", t, {2, 48, 1000});
    auto y = gb.input("y", t, {2, 48, 1000});
    auto w = gb.weight("w", rnd(t, {1000}, seed++));
    auto bias = gb.weight("bias", rnd(t, {1000}, seed++));
    gb.output(gb.softmax(x, true, 0.3f, "softmax_causal"));
    gb.output(gb.softmax(y, false, 1.0f, "softmax"));
    gb.output(gb.rms_norm(x, w, 1e-6f, "rms_norm"));
    gb.output(gb.layer_norm(y, w, bias, 1e-5f, "layer_norm"));
    gb.output(gb.gelu(x, gelu_mode::tanh, "gelu"));
    gb.output(gb.silu(y, "silu"));
    gb.output(gb.scale(x, 0.7f, "scale"));
    gb.output(gb.add(x, w, "add_broadcast"));
    gb.output(gb.mul(x, y, "mul"));
    gb.output(gb.copy(y, t == dtype::f32 ? dtype::bf16 : dtype::f32, "cast"));
    gb.output(gb.copy(x, t, "copy"));
    gb.output(gb.argmax(y, "argmax"));
    // rope over [S 64, H 24, D 80] with positions in the thousands
    auto r = gb.input("r", t, {64, 24, 80});
    auto pos = gb.input("pos", dtype::i32, {64});
    gb.output(gb.rope(r, pos, 10000.0f, rope_mode::neox, "rope"));
    // attention-shaped products: 8 kv heads, 4 query rows each, 1030 keys of 64
    auto q = gb.input("q", t, {8, 4, 64});
    auto k = gb.input("k", t, {8, 1030, 64});
    auto v = gb.input("v", t, {8, 1030, 64});
    auto p = gb.input("p", t, {8, 4, 1030});
    gb.output(gb.matmul(q, k, false, true, "qk"));
    gb.output(gb.matmul(p, v, false, false, "pv"));
    // two batches (fewer than 3 or 7 threads), a weight broadcast over them
    auto q2 = gb.input("q2", t, {2, 3, 300});
    auto wb = gb.weight("wb", rnd(t, {1003, 300}, seed++));
    gb.output(gb.matmul(q2, wb, false, true, "two_batches"));
    const graph g = must(std::move(gb).build());
    std::vector<int32_t> positions(64);
    for (int i = 0; i < 64; ++i) positions[static_cast<std::size_t>(i)] = 3000 + 37 * i;
    const std::vector<host_tensor> inputs = {
        rnd(t, {2, 48, 1000}, seed++), rnd(t, {2, 48, 1000}, seed++), rnd(t, {64, 24, 80}, seed++),
        host_tensor::from_ints(shape{64}, positions), rnd(t, {8, 4, 64}, seed++), rnd(t, {8, 1030, 64}, seed++),
        rnd(t, {8, 1030, 64}, seed++), rnd(t, {8, 4, 1030}, seed++), rnd(t, {2, 3, 300}, seed++)};
    auto ref = evaluate_reference_all(g, inputs);
    ASSERT_TRUE(ref.has_value()) << ref.err().to_string();
    const auto one = node_bytes(g, *ref, 1);
    for (const int threads : {2, 3, 7}) {
      const auto many = node_bytes(g, *ref, threads);
      ASSERT_EQ(many.size(), one.size());
      for (std::size_t i = 0; i < one.size(); ++i) EXPECT_TRUE(many[i] == one[i]) << "node " << i << ", " << threads << " threads";
    }
    EXPECT_EQ(check_graph(g, inputs, {2e-4, 2e-4}), static_cast<int>(one.size()));
  }
}

// bf16 products on the CPU's bf16 units (gpu/cpu/bf16_gemm.hpp), where the
// build has oneDNN and the CPU has them: every layout the matmul hands over
// (A by rows or by columns, B [in, out] or [out, in]), a tail block of
// columns, C with a row stride wider than its columns; each element within
// f32 rounding of the exact sum of bf16 products, and the same bits on 1,
// 2, 3 and 7 threads; a bf16 C is the f32 C rounded by float_to_bf16.
TEST(CpuKernels, Bf16ProductsOnTheBf16UnitsMatchTheExactSumOnAnyThreadCount) {
  if (!gpu::cpu::bf16_gemm_available())
    GTEST_SKIP() << "no oneDNN in this build, or a CPU without AVX-512 BF16 / AMX (or AG_CPU_BF16_GEMM=0)";
  const int64_t m = 37, k = 300, n = 2 * gpu::cpu::bf16_gemm_block + 45, ldc = n + 3;
  const host_tensor a = rnd(dtype::bf16, {m * k}, 61), b = rnd(dtype::bf16, {k * n}, 62);
  const auto* ap = reinterpret_cast<const uint16_t*>(a.data());
  const auto* bp = reinterpret_cast<const uint16_t*>(b.data());
  struct layout {
    int64_t ars, acs, brs, bcs;
  };
  for (const layout& l : {layout{k, 1, n, 1}, layout{1, m, 1, k}, layout{k, 1, 1, k}, layout{1, m, n, 1}}) {
    SCOPED_TRACE("A strides " + std::to_string(l.ars) + "," + std::to_string(l.acs) + ", B strides " +
                 std::to_string(l.brs) + "," + std::to_string(l.bcs));
    std::vector<float> one(static_cast<std::size_t>(m * ldc), -7.0f);
    ASSERT_TRUE(gpu::cpu::bf16_gemm(m, n, k, ap, l.ars, l.acs, bp, l.brs, l.bcs, one.data(), false, ldc, 1));
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < n; ++j) {
        double exact = 0, size = 0;
        for (int64_t p = 0; p < k; ++p) {
          const double x = static_cast<double>(bf16_to_float(ap[i * l.ars + p * l.acs])) *
                           bf16_to_float(bp[p * l.brs + j * l.bcs]);
          exact += x;
          size += std::abs(x);
        }
        ASSERT_NEAR(one[static_cast<std::size_t>(i * ldc + j)], exact, 1e-5 * size + 1e-6) << i << "," << j;
      }
    // The padding between rows of C is not written.
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = n; j < ldc; ++j) ASSERT_EQ(one[static_cast<std::size_t>(i * ldc + j)], -7.0f);
    for (const int threads : {2, 3, 7}) {
      std::vector<float> many(static_cast<std::size_t>(m * ldc), -7.0f);
      ASSERT_TRUE(gpu::cpu::bf16_gemm(m, n, k, ap, l.ars, l.acs, bp, l.brs, l.bcs, many.data(), false, ldc, threads));
      EXPECT_TRUE(many == one) << threads << " threads";
    }
    // A bf16 C holds each f32 sum rounded as float_to_bf16 rounds it; its
    // padding stays.
    for (const int threads : {1, 3}) {
      std::vector<uint16_t> rounded(static_cast<std::size_t>(m * ldc), 0xbeef);
      ASSERT_TRUE(gpu::cpu::bf16_gemm(m, n, k, ap, l.ars, l.acs, bp, l.brs, l.bcs, rounded.data(), true, ldc, threads));
      for (int64_t i = 0; i < m; ++i)
        for (int64_t j = 0; j < ldc; ++j) {
          const auto at = static_cast<std::size_t>(i * ldc + j);
          ASSERT_EQ(rounded[at], j < n ? float_to_bf16(one[at]) : uint16_t{0xbeef}) << i << "," << j;
        }
    }
  }
}

// A kernel's bf16 stores (the vectorised loop of contiguous rows) round as
// float_to_bf16 does, value by value: ties to even, NaNs kept quiet with
// their sign, infinities, values that round up to infinity, denormals.
TEST(CpuKernels, Bf16StoresRoundAsFloatToBf16ForEveryKindOfValue) {
  std::vector<uint32_t> bits = {0x3f808000u, 0x3f818000u, 0x3f80ffffu, 0x7f800000u, 0xff800000u, 0x7fc00000u,
                                0xffc00001u, 0x7f800001u, 0xff812345u, 0x7f7fffffu, 0xff7fffffu, 0x7f7f8000u,
                                0x00000001u, 0x80008000u, 0x00018000u, 0x00000000u, 0x80000000u};
  for (uint32_t i = 0; i < 4000; ++i) bits.push_back(i * 1073741u + 12345u);  // every exponent, both signs
  std::vector<float> values(bits.size());
  std::memcpy(values.data(), bits.data(), bits.size() * 4);
  graph_builder gb;
  auto x = gb.input("x", dtype::f32, {static_cast<int64_t>(values.size())});
  gb.output(gb.copy(x, dtype::bf16, "to_bf16"));
  const graph g = must(std::move(gb).build());
  const std::vector<host_tensor> inputs = {host_tensor::from_floats(dtype::f32, {static_cast<int64_t>(values.size())}, values)};
  auto ref = evaluate_reference_all(g, inputs);
  ASSERT_TRUE(ref.has_value());
  const auto out = output_bytes(g, *ref, 1);
  ASSERT_EQ(out.size(), values.size() * 2);
  for (std::size_t i = 0; i < values.size(); ++i) {
    uint16_t got;
    std::memcpy(&got, out.data() + 2 * i, 2);
    ASSERT_EQ(got, float_to_bf16(values[i])) << "input bits 0x" << std::hex << bits[i];
  }
}

// A softmax's exponentials (gpu/cpu/vector_math.hpp): every length across
// the vector width's tails, each value within 3 ulp of std::exp (or, below
// e^-87.3, within 1.2e-38 of it), the sum within 1e-6 of the sum of
// std::exp's values, NaN kept, -inf and far below to 0, the same bits twice.
TEST(CpuKernels, ExpShiftedSumMatchesStdExp) {
  std::mt19937 rng(77);
  std::uniform_real_distribution<float> score(-30.0f, 30.0f);
  for (int64_t n : {0, 1, 7, 8, 9, 15, 16, 17, 37, 1000}) {
    SCOPED_TRACE("n " + std::to_string(n));
    std::vector<float> in(static_cast<std::size_t>(n));
    for (auto& v : in) v = score(rng);
    if (n > 3) {
      in[1] = -std::numeric_limits<float>::infinity();
      in[2] = -1e6f;  // far below: e^x is 0 in float
      in[3] = -87.0f / 0.5f;  // x = -174 - shift
    }
    const float s = 0.5f;
    float shift = -std::numeric_limits<float>::infinity();
    for (float v : in) shift = std::max(shift, v * s);
    std::vector<float> row = in, again = in;
    const double sum = gpu::cpu::exp_shifted_sum(row.data(), n, s, shift);
    EXPECT_EQ(gpu::cpu::exp_shifted_sum(again.data(), n, s, shift), sum);
    EXPECT_TRUE(row == again);
    double want_sum = 0;
    for (int64_t j = 0; j < n; ++j) {
      const float x = in[static_cast<std::size_t>(j)] * s - shift;
      const float want = std::exp(x);
      want_sum += want;
      const float got = row[static_cast<std::size_t>(j)];
      ASSERT_LE(got, 1.0f) << j;
      if (x < -87.3f) ASSERT_NEAR(got, want, 1.2e-38f) << j << " x " << x;
      else ASSERT_NEAR(got, want, 3.6e-7f * want) << j << " x " << x;
    }
    EXPECT_NEAR(sum, want_sum, 1e-6 * want_sum);
  }
  std::vector<float> nan_row = {0.0f, std::numeric_limits<float>::quiet_NaN(), -1.0f};
  gpu::cpu::exp_shifted_sum(nan_row.data(), 3, 1.0f, 0.0f);
  EXPECT_EQ(nan_row[0], 1.0f);
  EXPECT_TRUE(std::isnan(nan_row[1]));
  EXPECT_NEAR(nan_row[2], std::exp(-1.0f), 4e-7f);
}

// GELU (tanh form) and SiLU as x times a sigmoid, against the definitions in
// double: within a few ulp wherever the value is a normal float, plus the
// exponent's own rounding (e^z moves by |z| ulp for each rounding of z;
// the tanh form in float loses up to 1e-3 of it at x = -5 to cancellation),
// signs and NaN kept, the same bits again, every length through the tail.
TEST(CpuKernels, GeluTanhAndSiluMatchTheirDefinitionsInDouble) {
  // 0.5x(1 + tanh(u)) = x / (1 + e^-2u), which keeps its digits in double
  // where 1 + tanh(u) cancels (u < -18).
  const auto gelu = [](double x) { return x / (1.0 + std::exp(-2 * 0.7978845608028654 * (x + 0.044715 * x * x * x))); };
  const auto silu = [](double x) { return x / (1.0 + std::exp(-x)); };
  std::mt19937 rng(78);
  std::uniform_real_distribution<float> wide(-12.0f, 12.0f);
  for (int64_t n : {0, 1, 7, 8, 9, 17, 1000}) {
    SCOPED_TRACE("n " + std::to_string(n));
    std::vector<float> in(static_cast<std::size_t>(n));
    for (auto& v : in) v = wide(rng);
    if (n == 1000) {  // the edges: 0, +-0 results, overflow of e^-z, large x
      const float edges[] = {0.0f, -0.0f, 1e-30f, -1e-30f, -9.0f, -9.5f, -10.5f, -88.0f, -100.0f, 90.0f, 1e6f, -1e6f, 3e38f};
      std::copy(std::begin(edges), std::end(edges), in.begin());
    }
    for (int which = 0; which < 4; ++which) {  // gelu, silu; this machine's path, then the portable one
      SCOPED_TRACE((which % 2 == 0 ? "gelu tanh" : "silu") + std::string(which < 2 ? "" : ", portable"));
      const auto f = which == 0 ? gpu::cpu::gelu_tanh_in_place : which == 1 ? gpu::cpu::silu_in_place
                   : which == 2 ? gpu::cpu::portable::gelu_tanh_in_place : gpu::cpu::portable::silu_in_place;
      std::vector<float> row = in, again = in;
      f(row.data(), n);
      f(again.data(), n);
      // (memcmp of an empty row would pass null pointers: UBSan)
      ASSERT_TRUE(row.empty() || std::memcmp(row.data(), again.data(), row.size() * sizeof(float)) == 0);
      for (std::size_t j = 0; j < row.size(); ++j) {
        const double x = in[j];
        const double want = which % 2 == 0 ? gelu(x) : silu(x);
        const double z = which % 2 == 0 ? 2 * 0.7978845608028654 * x * (1 + 0.044715 * x * x) : x;
        const float got = row[j];
        ASSERT_FALSE(std::isnan(got)) << j << " x " << in[j];
        const double ulps = 4 + 2 * std::min(std::fabs(z), 100.0);  // z rounded a few times
        if (std::fabs(want) >= 1e-36) {
          ASSERT_NEAR(got, want, ulps * 1.2e-7 * std::fabs(want)) << j << " x " << in[j];
        } else {
          ASSERT_LE(std::fabs(got), 1e-36) << j << " x " << in[j];
        }
        if (want != 0.0 && got != 0.0f) {
          ASSERT_EQ(std::signbit(got), std::signbit(want)) << j << " x " << in[j];
        }
      }
    }
  }
  std::vector<float> nan_row = {std::numeric_limits<float>::quiet_NaN(), 1.0f};
  gpu::cpu::gelu_tanh_in_place(nan_row.data(), 2);
  EXPECT_TRUE(std::isnan(nan_row[0]));
  EXPECT_NEAR(nan_row[1], gelu(1.0), 2e-7);
  EXPECT_NEAR(gelu(1.0), 0.5 * (1.0 + std::tanh(0.7978845608028654 * 1.044715)), 1e-15);  // the definition
  nan_row[0] = std::numeric_limits<float>::quiet_NaN();
  gpu::cpu::silu_in_place(nan_row.data(), 1);
  EXPECT_TRUE(std::isnan(nan_row[0]));
}

// A softmax's max and argmax in vector registers equal the one-at-a-time
// loops exactly: NaNs passed over, the first of equal maxima (ties within
// and across vector lanes, -0 and +0), rows of -inf, rows all NaN (-1),
// empty rows, and every length through the tail.
TEST(CpuKernels, MaxAndFirstArgmaxEqualTheirLoopsExactly) {
  std::mt19937 rng(79);
  std::uniform_int_distribution<int> few(-3, 3);  // many ties
  const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
  std::vector<std::vector<float>> rows = {{}, {nan}, {nan, nan, nan, nan, nan, nan, nan, nan, nan},
                                          {-inf, -inf, -inf}, {-0.0f, 0.0f, -0.0f}, {nan, -inf, 2.0f, 2.0f}};
  for (int64_t n : {1, 7, 8, 9, 16, 33, 1000}) {
    std::vector<float> r(static_cast<std::size_t>(n));
    for (auto& v : r) v = static_cast<float>(few(rng));
    rows.push_back(r);
    for (std::size_t j = 0; j < r.size(); j += 5) r[j] = nan;  // NaNs among them
    rows.push_back(r);
    r.back() = 100.0f;  // the maximum in the tail
    rows.push_back(r);
  }
  for (std::size_t c = 0; c < rows.size(); ++c) {
    const auto& r = rows[c];
    const auto n = static_cast<int64_t>(r.size());
    SCOPED_TRACE("row " + std::to_string(c) + " of " + std::to_string(n));
    EXPECT_EQ(gpu::cpu::first_argmax(r.data(), n), gpu::cpu::portable::first_argmax(r.data(), n));
    for (float s : {1.0f, 0.125f, -2.0f}) {
      const float got = gpu::cpu::max_scaled(r.data(), n, s), want = gpu::cpu::portable::max_scaled(r.data(), n, s);
      EXPECT_TRUE(got == want || (std::isnan(got) && std::isnan(want))) << got << " vs " << want << " at s " << s;
    }
  }
  EXPECT_EQ(gpu::cpu::first_argmax(rows[2].data(), 9), -1) << "all NaN";
  EXPECT_EQ(gpu::cpu::first_argmax(rows[3].data(), 3), 0) << "all -inf: the first";
  EXPECT_EQ(gpu::cpu::first_argmax(rows[5].data(), 4), 2) << "the first of equal maxima";
  EXPECT_EQ(gpu::cpu::max_scaled(rows[2].data(), 9, 1.0f), -inf) << "NaNs passed over";
}

// The kernels' scratch stays with their thread and is reused uninitialised:
// a large bf16 product, a smaller one, then the large one again give the
// reference's values and, the second time, the first time's bits (a reused
// block read where it was not written would show).
TEST(CpuKernels, ScratchReusedAcrossOpsLeavesNoStaleValues) {
  const graph big = one_matmul(dtype::bf16, {40, 700}, {1100, 700}, false, true, 990);
  const graph small = one_matmul(dtype::bf16, {33, 90}, {90, 70}, false, false, 991);
  const std::vector<host_tensor> big_in = {rnd(dtype::bf16, {40, 700}, 992)};
  const std::vector<host_tensor> small_in = {rnd(dtype::bf16, {33, 90}, 993)};
  auto big_ref = evaluate_reference_all(big, big_in);
  auto small_ref = evaluate_reference_all(small, small_in);
  ASSERT_TRUE(big_ref.has_value() && small_ref.has_value());
  const auto first = output_bytes(big, *big_ref, 1);
  const auto small_bytes = output_bytes(small, *small_ref, 1);
  const auto again = output_bytes(big, *big_ref, 1);
  EXPECT_TRUE(first == again);
  const tol bt = for_type(dtype::bf16, {1e-4, 1e-4});
  for (const auto* c : {&first, &again}) {
    host_tensor out(dtype::bf16, shape{40, 1100});
    std::memcpy(out.data(), c->data(), c->size());
    const auto cmp = compare(out, (*big_ref)[static_cast<std::size_t>(big.outputs()[0])], bt.atol, bt.rtol);
    EXPECT_TRUE(cmp.ok) << cmp.message;
  }
  host_tensor s(dtype::bf16, shape{33, 70});
  std::memcpy(s.data(), small_bytes.data(), small_bytes.size());
  const auto cmp = compare(s, (*small_ref)[static_cast<std::size_t>(small.outputs()[0])], bt.atol, bt.rtol);
  EXPECT_TRUE(cmp.ok) << cmp.message;
}

}  // namespace
