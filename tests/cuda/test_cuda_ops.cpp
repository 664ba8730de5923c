// Every op of the CUDA backend against the CPU reference evaluator, on random
// data, at odd and large shapes, in f32 / f16 / bf16.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "cuda/cuda_test_util.hpp"

namespace ag {
namespace {

using test::check_against_reference;
using test::label;
using test::tol_for;

const dtype kFloatTypes[] = {dtype::f32, dtype::f16, dtype::bf16};
const shape kShapes[] = {{1, 1}, {7, 13}, {129, 257}, {3, 4097}, {2, 3, 5, 33}};

uint64_t seed_counter = 1000;
host_tensor rnd(dtype t, shape s, float stddev = 1.0f) { return host_tensor::random_normal(t, s, ++seed_counter, stddev); }

TEST(CudaOps, UnaryOpsMatchReference) {
  AG_REQUIRE_GPU(1);
  for (dtype t : kFloatTypes)
    for (const shape& s : kShapes) {
      graph_builder b;
      auto x = b.input("x", t, s);
      b.output(b.scale(x, -0.75f));
      b.output(b.gelu(x, gelu_mode::tanh));
      b.output(b.gelu(x, gelu_mode::erf));
      b.output(b.silu(x));
      b.output(b.contiguous(x));
      auto g = std::move(b).build();
      ASSERT_TRUE(g) << g.err().to_string();
      check_against_reference(*g, {rnd(t, s, 2.0f)}, tol_for(t, 2), "unary " + label(t, s));
    }
}

TEST(CudaOps, BinaryOpsWithBroadcastMatchReference) {
  AG_REQUIRE_GPU(1);
  for (dtype t : kFloatTypes)
    for (const shape& s : kShapes) {
      const int64_t D = s[-1];
      shape row{D}, col = s;
      col[-1] = 1;
      graph_builder b;
      auto x = b.input("x", t, s);
      auto y = b.input("y", t, s);
      auto r = b.input("r", t, row);
      auto c = b.input("c", t, col);
      b.output(b.add(x, y));
      b.output(b.mul(x, y));
      b.output(b.add(x, r));
      b.output(b.mul(x, c));
      auto g = std::move(b).build();
      ASSERT_TRUE(g) << g.err().to_string();
      check_against_reference(*g, {rnd(t, s), rnd(t, s), rnd(t, row), rnd(t, col)}, tol_for(t, 4),
                              "binary " + label(t, s));
    }
}

TEST(CudaOps, ElementwiseOnTransposedViewsMatchReference) {
  AG_REQUIRE_GPU(1);
  for (dtype t : kFloatTypes) {
    graph_builder b;
    auto x = b.input("x", t, {37, 19});
    auto y = b.input("y", t, {19, 37});
    auto xt = b.transpose(x, 0, 1);  // [19, 37], strided
    b.output(b.add(xt, y));
    b.output(b.silu(xt));
    b.output(b.copy(xt, dtype::f32));
    auto g = std::move(b).build();
    ASSERT_TRUE(g) << g.err().to_string();
    check_against_reference(*g, {rnd(t, {37, 19}), rnd(t, {19, 37})}, tol_for(t, 4), "strided " + label(t, {37, 19}));
  }
}

TEST(CudaOps, NormsMatchReference) {
  AG_REQUIRE_GPU(1);
  // kShapes, and rows a decode step normalises (fewer rows than SMs, 8-element
  // chunks: one chunk per thread, 128 to 1024 threads a row).
  std::vector<shape> shapes(std::begin(kShapes), std::end(kShapes));
  for (const shape& s : {shape{1, 2048}, shape{3, 1, 520}, shape{2, 8192}, shape{1, 4096}}) shapes.push_back(s);
  for (dtype t : kFloatTypes)
    for (const shape& s : shapes) {
      const int64_t D = s[-1];
      graph_builder b;
      auto x = b.input("x", t, s);
      auto w = b.input("w", t, {D});
      auto bias = b.input("bias", t, {D});
      b.output(b.rms_norm(x, w, 1e-6f));
      b.output(b.rms_norm(x, tensor(), 1e-5f));
      b.output(b.layer_norm(x, w, bias, 1e-5f));
      b.output(b.layer_norm(x, tensor(), tensor(), 1e-5f));
      auto g = std::move(b).build();
      ASSERT_TRUE(g) << g.err().to_string();
      // x with a nonzero mean so layer_norm's centring matters.
      host_tensor xv = host_tensor::random_normal(t, s, ++seed_counter, 1.5f, 0.7f);
      // A single element normalises to ~0 with an eps-dominated scale: loosen a bit for D = 1.
      check_against_reference(*g, {xv, rnd(t, {D}), rnd(t, {D})}, tol_for(t, D == 1 ? 50 : 8), "norm " + label(t, s));
    }
}

TEST(CudaOps, SoftmaxMatchesReferenceWithScaleAndCausalMask) {
  AG_REQUIRE_GPU(1);
  // Causal softmax needs Sk >= Sq (validation rejects fully masked rows).
  const shape shapes[] = {{1, 1}, {7, 13}, {9, 9}, {2, 64, 64}, {4, 4097}, {2, 3, 17, 129}, {2, 20000}};
  for (dtype t : kFloatTypes)
    for (const shape& s : shapes) {
      graph_builder b;
      auto x = b.input("x", t, s);
      b.output(b.softmax(x, false, 1.0f));
      b.output(b.softmax(x, true, 0.125f));
      b.output(b.softmax(x, true, 2.0f));
      auto g = std::move(b).build();
      ASSERT_TRUE(g) << g.err().to_string();
      check_against_reference(*g, {rnd(t, s, 3.0f)}, tol_for(t, 2), "softmax " + label(t, s));
    }
}

// argmax on the GPU: the reference's index for every row, random rows
// (a vocabulary-long one too, and rows of 16-bit values, where ties at the
// maximum happen) and rows with ties, NaNs and infinities.
TEST(CudaOps, ArgmaxMatchesReferenceWithTiesAndNaNs) {
  AG_REQUIRE_GPU(1);
  const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
  const std::vector<float> crafted = {1, 3, 3, 2, nan, 2, nan, 2, nan, nan, nan, nan, -inf, -inf, -inf, -inf,
                                      -1, nan, 5, 5, 4, -inf, inf, 0};
  for (dtype t : kFloatTypes) {
    for (const shape& s : {shape{1, 32000}, shape{7, 13}, shape{3, 4097}, shape{2, 3, 5, 33}, shape{64, 1}}) {
      graph_builder b;
      b.output(b.argmax(b.input("x", t, s)));
      auto g = std::move(b).build();
      ASSERT_TRUE(g) << g.err().to_string();
      check_against_reference(*g, {rnd(t, s, 2.0f)}, test::tol{0, 0}, "argmax " + label(t, s));
    }
    host_tensor x = host_tensor::uninitialized(t, {6, 4});
    for (std::size_t i = 0; i < crafted.size(); ++i) x.set(static_cast<int64_t>(i), crafted[i]);
    graph_builder b;
    b.output(b.argmax(b.input("x", t, {6, 4})));
    auto g = std::move(b).build();
    ASSERT_TRUE(g) << g.err().to_string();
    check_against_reference(*g, {x}, test::tol{0, 0}, std::string("argmax of crafted rows ") + to_string(t));
    // Long rows, read in 16-byte vectors where a row is contiguous and
    // aligned (8200 elements: every row; 8203: a tail past the last whole
    // vector, and rows that start unaligned, read element by element): the
    // maximum more than once (the first wins: in one vector, in two threads,
    // in two vectors of one thread), NaNs before it, a row of NaNs (0), a row of -inf
    // with a NaN (0), the maximum in the last element.
    for (const int64_t n : {int64_t{8200}, int64_t{8203}}) {
      host_tensor y = rnd(t, {6, n}, 2.0f);
      const auto put = [&](int64_t r, int64_t j, float v) { y.set(r * n + j, v); };
      put(0, 100, nan), put(0, 5000, 100.f), put(0, 7000, 100.f);
      put(1, 9, 100.f), put(1, 12, 100.f), put(1, 3, nan);  // one vector of 16-bit values
      put(2, 17, 100.f), put(2, 25, 100.f), put(2, 17 + 8 * 1024, 100.f);  // two threads; one thread's two vectors
      for (int64_t j = 0; j < n; ++j) put(3, j, nan);
      for (int64_t j = 0; j < n; ++j) put(4, j, -inf);
      put(4, 0, nan);
      put(5, n - 1, 100.f);
      graph_builder bl;
      bl.output(bl.argmax(bl.input("x", t, {6, n})));
      auto gl = std::move(bl).build();
      ASSERT_TRUE(gl) << gl.err().to_string();
      check_against_reference(*gl, {y}, test::tol{0, 0},
                              "argmax of crafted rows of " + std::to_string(n) + " " + to_string(t));
    }
  }
}

// range_mask on the GPU: random key positions (some -1) and query ranges
// (some empty), tiles of rows and columns cut at odd sizes, every float
// dtype; entry for entry the reference's mask.
TEST(CudaOps, RangeMaskMatchesReferenceOnRandomKeysAndRanges) {
  AG_REQUIRE_GPU(1);
  uint32_t state = 12345;
  const auto ints = [&](shape s, int lo, int hi) {
    std::vector<int32_t> v(static_cast<std::size_t>(s.numel()));
    for (int32_t& x : v) {
      state = state * 1664525u + 1013904223u;
      x = lo + static_cast<int32_t>((state >> 8) % static_cast<uint32_t>(hi - lo + 1));
    }
    return host_tensor::from_ints(s, v);
  };
  for (dtype t : kFloatTypes)
    for (const shape& s : {shape{1, 16}, shape{7, 1000}, shape{33, 4099}, shape{300, 257}}) {
      graph_builder b;
      tensor keys = b.input("keys", dtype::i32, {s[1]});  // the inputs' order: keys, then ranges
      tensor ranges = b.input("ranges", dtype::i32, {s[0], 2});
      b.output(b.range_mask(keys, ranges, t));
      auto g = std::move(b).build();
      ASSERT_TRUE(g) << g.err().to_string();
      check_against_reference(*g, {ints({s[1]}, -1, 500), ints({s[0], 2}, 0, 500)}, test::tol{0, 0},
                              "range_mask " + label(t, s));
    }
}

TEST(CudaOps, RopeMatchesReferenceInBothPairings) {
  AG_REQUIRE_GPU(1);
  // The small shapes rotate one head per thread; the last has more pairs
  // than 4 x 256 threads per SM (4 heads per thread), 30 heads per position
  // (the last run of heads is short).
  const shape shapes[] = {{1, 1, 2}, {7, 3, 64}, {2, 33, 4, 128}, {1, 160, 30, 128}};
  for (dtype t : kFloatTypes)
    for (const shape& s : shapes)
      for (rope_mode m : {rope_mode::neox, rope_mode::interleaved}) {
        const int64_t S = s[-3];
        graph_builder b;
        auto x = b.input("x", t, s);
        auto pos = b.input("pos", dtype::i32, {S});
        b.output(b.rope(x, pos, 10000.0f, m));
        b.output(b.rope(x, pos, 500000.0f, m));
        // Llama 3.1's scaling: a head of 64 or 128 has pairs in all three regimes.
        b.output(b.rope(x, pos, 500000.0f, m, {}, rope_scaling{8.0f, 1.0f, 4.0f, 8192}));
        auto g = std::move(b).build();
        ASSERT_TRUE(g) << g.err().to_string();
        check_against_reference(*g, {rnd(t, s), host_tensor::random_ints({S}, ++seed_counter, 8192)},
                                test::tol{t == dtype::f32 ? 2e-5 : tol_for(t).atol * 4, tol_for(t, 4).rtol},
                                std::string("rope ") + (m == rope_mode::neox ? "neox " : "interleaved ") + label(t, s));
      }
}

TEST(CudaOps, GetRowsMatchesReference) {
  AG_REQUIRE_GPU(1);
  for (dtype t : kFloatTypes) {
    graph_builder b;
    auto table = b.input("table", t, {1000, 67});
    auto ids = b.input("ids", dtype::i32, {3, 11});
    b.output(b.get_rows(table, ids));
    auto g = std::move(b).build();
    ASSERT_TRUE(g) << g.err().to_string();
    check_against_reference(*g, {rnd(t, {1000, 67}), host_tensor::random_ints({3, 11}, ++seed_counter, 1000)},
                            test::tol{0, 0}, std::string("get_rows ") + to_string(t));
  }
}

TEST(CudaOps, GetRowsWithIdOutOfRangeFailsTheStreamNotTheProcess) {
  AG_REQUIRE_GPU(1);
  graph_builder b;
  auto table = b.input("table", dtype::f32, {10, 4});
  auto ids = b.input("ids", dtype::i32, {3});
  b.output(b.get_rows(table, ids, "embed"));
  auto g = std::move(b).build();
  ASSERT_TRUE(g) << g.err().to_string();
  auto dev = test::gpu0();
  ASSERT_TRUE(dev);
  auto got = test::run_on(*dev, *g, {host_tensor::random_normal(dtype::f32, {10, 4}, 5),
                                     host_tensor::from_ints({3}, {1, 10, 2})});
  ASSERT_FALSE(got) << "an id equal to V must be reported";
  EXPECT_EQ(got.err().code, errc::op_failed) << got.err().to_string();
  EXPECT_NE(got.err().message.find("get_rows"), std::string::npos) << got.err().to_string();
  EXPECT_TRUE(dev->alive());
  // The fault word was consumed: the next run on the device is clean.
  auto ok = test::run_on(*dev, *g, {host_tensor::random_normal(dtype::f32, {10, 4}, 6),
                                    host_tensor::from_ints({3}, {0, 9, 2})});
  EXPECT_TRUE(ok) << ok.err().to_string();
}

TEST(CudaOps, ConcatAndCastCopiesMatchReference) {
  AG_REQUIRE_GPU(1);
  for (dtype t : kFloatTypes) {
    for (int axis : {0, 1, 2}) {
      shape a{4, 5, 6}, c{4, 5, 6};
      a[axis] = 3;
      c[axis] = 7;
      graph_builder b;
      auto x = b.input("x", t, {4, 5, 6});
      auto y = b.input("y", t, a);
      auto z = b.input("z", t, c);
      b.output(b.concat({x, y, z}, axis));
      auto g = std::move(b).build();
      ASSERT_TRUE(g) << g.err().to_string();
      check_against_reference(*g, {rnd(t, {4, 5, 6}), rnd(t, a), rnd(t, c)}, test::tol{0, 0},
                              "concat axis " + std::to_string(axis) + " " + to_string(t));
    }
    for (dtype to : {dtype::f32, dtype::f16, dtype::bf16, dtype::i32}) {
      graph_builder b;
      auto x = b.input("x", t, {129, 33});
      auto xt = b.transpose(x, 0, 1);
      b.output(b.copy(x, to));
      b.output(b.copy(xt, to));
      auto g = std::move(b).build();
      ASSERT_TRUE(g) << g.err().to_string();
      check_against_reference(*g, {rnd(t, {129, 33}, 50.0f)}, test::tol{0, 0},
                              std::string("copy ") + to_string(t) + " -> " + to_string(to));
    }
  }
}

TEST(CudaOps, I32CopyIsExact) {
  AG_REQUIRE_GPU(1);
  graph_builder b;
  auto x = b.input("x", dtype::i32, {7, 300});
  b.output(b.copy(b.transpose(x, 0, 1), dtype::i32));
  auto g = std::move(b).build();
  ASSERT_TRUE(g) << g.err().to_string();
  // Large ids (beyond 2^24) must survive bit-exactly.
  check_against_reference(*g, {host_tensor::random_ints({7, 300}, 77, 2000000000)}, test::tol{0, 0}, "i32 copy");
}

struct mm_case {
  shape a, b;
  bool ta, tb;
};

// Products accumulate in f32 on both sides; 16-bit results differ from the
// (double, then rounded) reference by about one rounding of the output, and
// the sum's error grows with sqrt(K).
test::tol matmul_tol(dtype t, const mm_case& mc) {
  const double k = std::sqrt(static_cast<double>(mc.ta ? mc.a[-2] : mc.a[-1]));
  return t == dtype::f32 ? test::tol{1e-4 * k, 1e-4} : t == dtype::f16 ? test::tol{2e-3 * k, 4e-3} : test::tol{4e-3 * k, 2e-2};
}

/// matmul(a, b) of the case's inputs "a" and "b", its only output.
graph matmul_graph(dtype t, const mm_case& mc) {
  graph_builder b;
  auto x = b.input("a", t, mc.a);
  auto y = b.input("b", t, mc.b);
  b.output(b.matmul(x, y, mc.ta, mc.tb));
  return std::move(b).build().value();
}

std::string matmul_label(dtype t, const mm_case& mc) {
  return label(t, mc.a) + (mc.ta ? "^T" : "") + " x " + mc.b.to_string() + (mc.tb ? "^T" : "");
}

TEST(CudaOps, MatmulMatchesReferenceWithTransposesAndBatches) {
  AG_REQUIRE_GPU(1);
  const mm_case cases[] = {
      {{1, 1}, {1, 1}, false, false},
      {{7, 13}, {13, 5}, false, false},
      {{13, 7}, {13, 5}, true, false},
      {{7, 13}, {5, 13}, false, true},
      {{13, 7}, {5, 13}, true, true},
      {{129, 257}, {257, 65}, false, false},
      {{3, 17, 33}, {33, 9}, false, false},          // 2-D b shared by every batch
      {{3, 17, 33}, {3, 33, 9}, false, false},       // batched
      {{2, 3, 17, 33}, {3, 9, 33}, false, true},     // two batch dims, b broadcast on the outer one
      {{2, 1, 33, 17}, {1, 4, 33, 9}, true, false},  // both broadcast
  };
  for (dtype t : kFloatTypes)
    for (const mm_case& mc : cases)
      check_against_reference(matmul_graph(t, mc), {rnd(t, mc.a), rnd(t, mc.b)}, matmul_tol(t, mc),
                              "matmul " + matmul_label(t, mc));
}

// Products of at most 8 rows against a weight take the GEMV kernel
// (gpu/cuda/gemv.cuh) where K and the rows allow 16-byte loads, cuBLAS
// otherwise; all against the reference, on devices with the kernel off, on,
// and on with its tensor-core form from 2 rows (f16 / bf16, up to 16 rows;
// f32 and one row stay on its FMA form).
TEST(CudaOps, MatmulOfFewRowsMatchesReferenceOnTheGemvKernelAndOnCublas) {
  AG_REQUIRE_GPU(1);
  const mm_case cases[] = {
      {{1, 256}, {1000, 256}, false, true},          // one row: a decode step's projection
      {{3, 512}, {77, 512}, false, true},            // 3 rows, N not a multiple of the block's warps
      {{2, 1, 1024}, {300, 1024}, false, true},      // batch 2 of one row each
      {{2, 4, 64}, {5, 64}, false, true},            // 8 rows: the most the kernel takes
      {{1, 8200}, {64, 8200}, false, true},          // K not a multiple of a warp's 256-element sweep
      {{1, 4096}, {1, 4096}, false, true},           // N = 1
      {{1, 24}, {5, 24}, false, true},               // K of 3 bf16 / 6 f32 vectors
      {{64, 1}, {33, 64}, true, true},               // trans_a: a column of a [K, 1] tensor
      {{1, 64}, {64, 33}, false, false},             // w not K-contiguous: cuBLAS
      {{9, 64}, {16, 64}, false, true},              // 9 rows: cuBLAS
      {{1, 13}, {7, 13}, false, true},               // K = 13: no 16-byte rows, cuBLAS
      {{8, 2048}, {2051, 2048}, false, true},        // 8 rows, tiles past N's end, K over 8 warps' shares
      {{5, 8200}, {40, 8200}, false, true},          // 5 rows (x rows 5-7 of a tile empty), K not 8 x 64-aligned
      {{16, 2048}, {300, 2048}, false, true},        // 16 rows: two tiles of x rows on the tensor cores, else cuBLAS
      {{3, 4, 1024}, {129, 1024}, false, true},      // 12 rows in batch dims: the second tile half empty
  };
  struct form {
    bool gemv;
    int tensor_core_rows;
    const char* label;
  };
  for (const form& f : {form{true, 0, "gemv on: "}, form{false, 0, "gemv off: "}, form{true, 2, "gemv mma: "}}) {
    gpu::backend_options o;
    o.cuda_gemv = f.gemv;
    o.cuda_gemv_tensor_core_rows = f.tensor_core_rows;
    auto made = gpu::cuda::make_cuda_devices({0}, o, 0);
    ASSERT_TRUE(made) << made.err().to_string();
    for (dtype t : kFloatTypes)
      for (const mm_case& mc : cases) {
        const graph g = matmul_graph(t, mc);
        test::check_against_reference_on(*(*made)[0], g, {rnd(t, mc.a), rnd(t, mc.b)}, matmul_tol(t, mc),
                                         std::string(f.label) + matmul_label(t, mc));
      }
  }
}

TEST(CudaOps, MatmulOnStridedViewsMatchesReference) {
  AG_REQUIRE_GPU(1);
  for (dtype t : kFloatTypes) {
    graph_builder b;
    auto x = b.input("x", t, {2, 24, 8, 16});  // [B, S, H, D]
    auto q = b.permute(x, {0, 2, 1, 3});       // [B, H, S, D]: no unit stride on rows -> batch strides
    auto k = b.permute(x, {0, 2, 3, 1});       // [B, H, D, S]: unit stride on the row dim (flipped op)
    b.output(b.matmul(q, k));                  // [B, H, S, S]
    auto sl = b.slice(x, 3, 3, 11);            // [2, 24, 8, 8], row stride 16
    b.output(b.matmul(sl, sl, false, true));   // [2, 24, 8, 8]
    auto p = b.permute(x, {3, 0, 1, 2});       // [D, B, S, H]: no unit stride at all -> scratch copy
    b.output(b.matmul(p, p, false, true));     // [16, 2, 24, 24]
    auto g = std::move(b).build();
    ASSERT_TRUE(g) << g.err().to_string();
    const double kk = 4.0;
    check_against_reference(*g, {rnd(t, {2, 24, 8, 16})},
                            t == dtype::f32   ? test::tol{1e-4 * kk, 1e-4}
                            : t == dtype::f16 ? test::tol{2e-3 * kk, 4e-3}
                                              : test::tol{4e-3 * kk, 2e-2},
                            std::string("matmul views ") + to_string(t));
  }
}

TEST(CudaOps, MatmulTf32IsCloseToF32) {
  AG_REQUIRE_GPU(1);
  graph_builder b;
  auto x = b.input("a", dtype::f32, {65, 513});
  auto y = b.input("b", dtype::f32, {513, 31});
  b.output(b.matmul(x, y));
  auto g = std::move(b).build();
  ASSERT_TRUE(g) << g.err().to_string();
  // TF32 keeps 10 mantissa bits: ~5e-4 relative per product.
  check_against_reference(*g, {rnd(dtype::f32, {65, 513}), rnd(dtype::f32, {513, 31})},
                          test::tol{2e-3 * std::sqrt(513.0), 1e-2}, "matmul tf32", /*tf32=*/true);
}

TEST(CudaOps, TransformerBlockChainMatchesReference) {
  AG_REQUIRE_GPU(1);
  // A chain of ops on one stream: checks stream order and buffer hand-off.
  for (dtype t : {dtype::f32, dtype::bf16}) {
    const int64_t S = 17, H = 4, Dh = 16, D = H * Dh;
    graph_builder b;
    auto x = b.input("x", t, {S, D});
    auto pos = b.input("pos", dtype::i32, {S});
    auto wq = b.weight("wq", host_tensor::random_normal(t, {D, D}, 11, 0.1f));
    auto wk = b.weight("wk", host_tensor::random_normal(t, {D, D}, 12, 0.1f));
    auto wv = b.weight("wv", host_tensor::random_normal(t, {D, D}, 13, 0.1f));
    auto n1 = b.rms_norm(x, tensor());
    auto q = b.rope(b.reshape(b.matmul(n1, wq), {S, H, Dh}), pos);
    auto k = b.rope(b.reshape(b.matmul(n1, wk), {S, H, Dh}), pos);
    auto v = b.reshape(b.matmul(n1, wv), {S, H, Dh});
    auto qh = b.permute(q, {1, 0, 2, 3});
    auto kh = b.permute(k, {1, 0, 2, 3});
    auto vh = b.permute(v, {1, 0, 2, 3});
    auto att = b.softmax(b.matmul(qh, kh, false, true), true, 0.25f);
    auto o = b.matmul(att, vh);  // [H, S, Dh]
    auto y = b.add(x, b.reshape(b.contiguous(b.permute(o, {1, 0, 2, 3})), {S, D}));
    b.output(b.gelu(y));
    auto g = std::move(b).build();
    ASSERT_TRUE(g) << g.err().to_string();
    check_against_reference(*g, {rnd(t, {S, D}), host_tensor::random_ints({S}, 3, 100)},
                            t == dtype::f32 ? test::tol{1e-4, 1e-4} : test::tol{6e-2, 6e-2},
                            "block " + std::string(to_string(t)));
  }
}

}  // namespace
}  // namespace ag
