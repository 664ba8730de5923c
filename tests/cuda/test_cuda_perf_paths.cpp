// The fast code paths of the CUDA kernels (gpu/cuda/vec.cuh users) and their
// fallbacks, against the CPU reference: 16-byte vectorised rows of every
// thread layout (warp per row, block per row, up to 8 chunks per thread), the
// split-row softmax for long rows, misaligned and strided views that must take
// the general kernels, broadcast-vector elementwise ops, and matmul batches
// looped over the inner batch dim.
#include <gtest/gtest.h>

#include <cmath>

#include "cuda/cuda_test_util.hpp"

namespace ag {
namespace {

using test::check_against_reference;
using test::label;
using test::tol_for;

const dtype kFloatTypes[] = {dtype::f32, dtype::f16, dtype::bf16};

uint64_t seed_counter = 5000;
host_tensor rnd(dtype t, shape s, float stddev = 1.0f) { return host_tensor::random_normal(t, s, ++seed_counter, stddev); }

// Row lengths that pick each register layout of the vectorised norm / softmax
// (8 .. 32768 elements, multiples of 8), and one past it (general kernel).
const shape kVecShapes[] = {{5, 8},   {9, 256},  {6, 512},  {3, 1024}, {2, 3, 2048},
                            {2, 4096}, {3, 8192}, {2, 16384}, {2, 32768}, {2, 32776}};

TEST(CudaPerfPaths, VectorisedNormsMatchReferenceAtEveryRowLayout) {
  AG_REQUIRE_GPU(1);
  for (dtype t : kFloatTypes)
    for (const shape& s : kVecShapes) {
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
      host_tensor xv = host_tensor::random_normal(t, s, ++seed_counter, 1.5f, 0.7f);
      check_against_reference(*g, {xv, rnd(t, {D}), rnd(t, {D})}, tol_for(t, 8), "vec norm " + label(t, s));
    }
}

TEST(CudaPerfPaths, NormsOnMisalignedAndStridedViewsMatchReference) {
  AG_REQUIRE_GPU(1);
  for (dtype t : kFloatTypes) {
    graph_builder b;
    auto x = b.input("x", t, {7, 1040});
    auto w = b.input("w", t, {1040});
    auto off1 = b.slice(x, 1, 1, 1025);   // rows start 1 element in: not 16-byte aligned
    auto off8 = b.slice(x, 1, 8, 1032);   // aligned start, row stride 1040: vectorised on a view
    auto odd = b.slice(x, 1, 0, 1036);    // length not a multiple of 8
    auto wv = b.slice(w, 0, 1, 1025);     // misaligned weight with aligned rows
    auto xt = b.transpose(x, 0, 1);       // [1040, 7], strided last dim
    b.output(b.rms_norm(off1, tensor()));
    b.output(b.layer_norm(off8, tensor(), tensor()));
    b.output(b.rms_norm(b.slice(x, 1, 16, 1040), wv));
    b.output(b.layer_norm(odd, tensor(), tensor()));
    b.output(b.rms_norm(xt, tensor()));
    auto g = std::move(b).build();
    ASSERT_TRUE(g) << g.err().to_string();
    check_against_reference(*g, {host_tensor::random_normal(t, {7, 1040}, ++seed_counter, 1.2f, 0.3f), rnd(t, {1040})},
                            tol_for(t, 8), std::string("norm views ") + to_string(t));
  }
}

TEST(CudaPerfPaths, VectorisedSoftmaxMatchesReferenceWithMask) {
  AG_REQUIRE_GPU(1);
  // Square-ish [.., Sq, Sk] so the causal mask cuts rows at every position.
  const shape shapes[] = {{8, 8},     {3, 40, 64},  {512, 512}, {2, 9, 1024}, {5, 2048},
                          {3, 16384}, {2, 3, 32768}, {2, 40000}, {300, 40000}};
  for (dtype t : kFloatTypes)
    for (const shape& s : shapes) {
      // 300 x 40000 goes through the split path with many rows: once is enough.
      if (s[0] == 300 && t != dtype::bf16) continue;
      graph_builder b;
      auto x = b.input("x", t, s);
      b.output(b.softmax(x, false, 1.0f));
      b.output(b.softmax(x, true, 0.125f));
      auto g = std::move(b).build();
      ASSERT_TRUE(g) << g.err().to_string();
      check_against_reference(*g, {rnd(t, s, 3.0f)}, tol_for(t, 2), "vec softmax " + label(t, s));
    }
}

TEST(CudaPerfPaths, SplitRowSoftmaxOnStridedAndOddRowsMatchesReference) {
  AG_REQUIRE_GPU(1);
  for (dtype t : kFloatTypes) {
    graph_builder b;
    auto x = b.input("x", t, {3, 20001});     // few long rows, odd length: scalar split path
    auto y = b.input("y", t, {20000, 2});
    auto yt = b.transpose(y, 0, 1);           // [2, 20000], last-dim stride 2: scalar split path
    auto xs = b.slice(x, 1, 1, 19993);        // misaligned rows, length % 8 == 0
    b.output(b.softmax(x, false, 0.5f));
    b.output(b.softmax(x, true, 1.0f));
    b.output(b.softmax(yt, true, 2.0f));
    b.output(b.softmax(xs, false, 1.0f));
    auto g = std::move(b).build();
    ASSERT_TRUE(g) << g.err().to_string();
    check_against_reference(*g, {rnd(t, {3, 20001}, 3.0f), rnd(t, {20000, 2}, 3.0f)}, tol_for(t, 2),
                            std::string("split softmax ") + to_string(t));
  }
}

TEST(CudaPerfPaths, VectorisedElementwiseWithBroadcastVectorMatchesReference) {
  AG_REQUIRE_GPU(1);
  const shape shapes[] = {{8}, {33, 64}, {2, 5, 7, 16}, {3, 4104}, {1001}};
  for (dtype t : kFloatTypes)
    for (const shape& s : shapes) {
      const int64_t D = s[-1];
      graph_builder b;
      auto x = b.input("x", t, s);
      auto y = b.input("y", t, s);
      auto r = b.input("r", t, {D});
      b.output(b.add(x, y));
      b.output(b.add(x, r));
      b.output(b.mul(y, r));
      b.output(b.mul(x, r));
      b.output(b.silu(x));
      b.output(b.scale(y, 0.3f));
      b.output(b.gelu(x, gelu_mode::tanh));
      auto g = std::move(b).build();
      ASSERT_TRUE(g) << g.err().to_string();
      check_against_reference(*g, {rnd(t, s, 2.0f), rnd(t, s), rnd(t, {D})}, tol_for(t, 4), "vec ew " + label(t, s));
    }
}

TEST(CudaPerfPaths, ElementwiseOnMisalignedViewsMatchesReference) {
  AG_REQUIRE_GPU(1);
  for (dtype t : kFloatTypes) {
    graph_builder b;
    auto x = b.input("x", t, {9, 72});
    auto r = b.input("r", t, {72});
    auto xs = b.slice(x, 1, 1, 65);    // misaligned, strided rows
    auto x8 = b.slice(x, 0, 1, 9);     // contiguous, starts one row (72 elements) in
    auto rs = b.slice(r, 0, 3, 67);    // misaligned broadcast vector
    auto x1 = b.reshape(b.slice(b.reshape(x, {648}), 0, 1, 577), {9, 64});  // contiguous, off by one element
    b.output(b.add(xs, rs));
    b.output(b.mul(x8, r));
    b.output(b.add(x1, rs));
    b.output(b.silu(x1));
    b.output(b.add(x1, x1));
    auto g = std::move(b).build();
    ASSERT_TRUE(g) << g.err().to_string();
    check_against_reference(*g, {rnd(t, {9, 72}), rnd(t, {72})}, tol_for(t, 4), std::string("ew views ") + to_string(t));
  }
}

// Slices of rows out of a larger tensor (a chunk of a sequence-parallel
// region: rows of every batch, so no one contiguous run): each row aligned
// and contiguous, the rows vectorised path of the elementwise kernels.
TEST(CudaPerfPaths, ElementwiseOnSlicesOfRowsMatchesReference) {
  AG_REQUIRE_GPU(1);
  for (dtype t : kFloatTypes) {
    graph_builder b;
    auto x = b.input("x", t, {2, 40, 64});
    auto y = b.input("y", t, {2, 16, 64});
    auto z = b.input("z", t, {2, 3, 10, 72});
    auto rows_a = b.slice(x, 1, 8, 24);   // [2, 16, 64], batch stride 2560
    auto rows_b = b.slice(x, 1, 16, 32);  // overlaps rows_a: reads only
    auto rows_z = b.slice(z, 2, 2, 9);    // [2, 3, 7, 72], two strided outer dims
    b.output(b.add(rows_a, y));
    b.output(b.add(y, rows_b));
    b.output(b.mul(rows_a, rows_b));
    b.output(b.silu(rows_a));
    b.output(b.scale(rows_z, 0.5f));
    b.output(b.add(rows_z, rows_z));
    auto g = std::move(b).build();
    ASSERT_TRUE(g) << g.err().to_string();
    check_against_reference(*g, {rnd(t, {2, 40, 64}), rnd(t, {2, 16, 64}), rnd(t, {2, 3, 10, 72})}, tol_for(t, 4),
                            std::string("ew rows ") + to_string(t));
  }
}

TEST(CudaPerfPaths, AttentionMatmulOnPermutedHeadsMatchesReference) {
  AG_REQUIRE_GPU(1);
  // [B, S, H, Dh] permuted to [B, H, S, Dh] with B > H and B < H: the batch
  // dims do not collapse, so the launcher loops over the smaller one.
  for (dtype t : kFloatTypes)
    for (auto [B, H] : {std::pair<int64_t, int64_t>{6, 2}, {2, 5}}) {
      const int64_t S = 24, Dh = 16;
      graph_builder b;
      auto q = b.input("q", t, {B, S, H, Dh});
      auto k = b.input("k", t, {B, S, H, Dh});
      auto qh = b.permute(q, {0, 2, 1, 3});
      auto kh = b.permute(k, {0, 2, 1, 3});
      auto sc = b.matmul(qh, kh, false, true);  // [B, H, S, S]
      b.output(sc);
      b.output(b.matmul(b.softmax(sc, true, 0.25f), kh));  // [B, H, S, Dh], b strided
      auto g = std::move(b).build();
      ASSERT_TRUE(g) << g.err().to_string();
      const double kk = 4.0;
      check_against_reference(*g, {rnd(t, {B, S, H, Dh}), rnd(t, {B, S, H, Dh})},
                              t == dtype::f32   ? test::tol{1e-4 * kk, 1e-4}
                              : t == dtype::f16 ? test::tol{2e-3 * kk, 4e-3}
                                                : test::tol{4e-3 * kk, 2e-2},
                              "attention views " + std::string(to_string(t)) + " B " + std::to_string(B) + " H " +
                                  std::to_string(H));
    }
}

}  // namespace
}  // namespace ag
