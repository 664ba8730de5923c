// The GEMV kernel's mma form (gpu/cuda/gemv_mma_layout.hpp) replayed on the
// host: a warp's loads and operands exactly as gemv_mma_kernel makes them,
// multiplied the way PTX's m16n8k16 defines it ("Matrix fragments for
// mma.m16n8k16": each lane's registers placed in the 16x16 A, 16x8 B and
// 16x8 C by the ISA's table, written out here independently of the header),
// must give every tile row's dot product with every x row. This checks the
// K permutation on a machine without a GPU; the CUDA tests check the kernel.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "gpu/cuda/gemv_mma_layout.hpp"

namespace {

namespace ml = ag::gpu::cuda::mma_layout;

// bf16 as the upper half of an f32: a value exactly representable in both.
uint16_t to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return static_cast<uint16_t>(u >> 16);
}
float from_bf16(uint16_t h) {
  const uint32_t u = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
float lo_of(uint32_t w) { return from_bf16(static_cast<uint16_t>(w & 0xffffu)); }
float hi_of(uint32_t w) { return from_bf16(static_cast<uint16_t>(w >> 16)); }

// One m16n8k16 product, c += a b, from the 32 lanes' registers, by PTX's
// fragment table for .bf16 / .f16 A (row) and B (col) and f32 C:
//   A: reg 0 = (g, 2t), (g, 2t+1); reg 1 = (g+8, 2t..); reg 2 = (g, 2t+8..); reg 3 = (g+8, 2t+8..)
//   B: reg 0 = (k 2t, n g), (k 2t+1, n g); reg 1 = (k 2t+8, n g), (k 2t+9, n g)
//   C: c0 = (g, 2t), c1 = (g, 2t+1), c2 = (g+8, 2t), c3 = (g+8, 2t+1)
void mma_by_the_isa(const uint32_t (&a)[32][4], const uint32_t (&b)[32][2], float (&c)[32][4]) {
  float A[16][16] = {}, B[16][8] = {};
  for (int lane = 0; lane < 32; ++lane) {
    const int g = lane / 4, t = lane % 4;
    const int arow[4] = {g, g + 8, g, g + 8}, acol[4] = {2 * t, 2 * t, 2 * t + 8, 2 * t + 8};
    for (int r = 0; r < 4; ++r) {
      A[arow[r]][acol[r]] = lo_of(a[lane][r]);
      A[arow[r]][acol[r] + 1] = hi_of(a[lane][r]);
    }
    for (int r = 0; r < 2; ++r) {
      B[2 * t + 8 * r][g] = lo_of(b[lane][r]);
      B[2 * t + 8 * r + 1][g] = hi_of(b[lane][r]);
    }
  }
  for (int lane = 0; lane < 32; ++lane) {
    const int g = lane / 4, t = lane % 4;
    const int crow[4] = {g, g, g + 8, g + 8}, ccol[4] = {2 * t, 2 * t + 1, 2 * t, 2 * t + 1};
    for (int i = 0; i < 4; ++i)
      for (int k = 0; k < 16; ++k) c[lane][i] += A[crow[i]][k] * B[k][ccol[i]];
  }
}

// A chunk of 8 bf16 as four words, the lower element in the low half (as a
// 16-byte load of memory puts them), or zeros.
void chunk_words(const std::vector<uint16_t>& row, int64_t chunk, bool live, uint32_t (&w)[4]) {
  for (int i = 0; i < 4; ++i) {
    w[i] = 0;
    if (!live) continue;
    const std::size_t e = static_cast<std::size_t>(chunk * 8 + 2 * i);
    w[i] = static_cast<uint32_t>(row[e]) | (static_cast<uint32_t>(row[e + 1]) << 16);
  }
}

// A warp's sweep of chunks [k_begin, k_end) of 16 weight rows against
// `rows` x rows, F chunks per row a pass, as gemv_mma_kernel does it.
void sweep(const std::vector<std::vector<uint16_t>>& w, const std::vector<std::vector<uint16_t>>& x, int rows,
           int64_t k_begin, int64_t k_end, int F, float (&c)[32][4]) {
  for (int64_t base = k_begin; base < k_end; base += ml::chunks_per_pass_step * F)
    for (int u = 0; u < F; ++u) {
      uint32_t wa[32][4], wb[32][4], xv[32][4];
      for (int lane = 0; lane < 32; ++lane) {
        const int g = ml::group_of(lane), t = ml::quad_of(lane);
        const int64_t v = ml::chunk_of(base, u, t);
        const bool in = v < k_end;
        chunk_words(w[static_cast<std::size_t>(g)], v, in, wa[lane]);
        chunk_words(w[static_cast<std::size_t>(g + 8)], v, in, wb[lane]);
        chunk_words(x[static_cast<std::size_t>(g)], v, in && g < rows, xv[lane]);
      }
      for (int s = 0; s < 2; ++s) {
        uint32_t a[32][4], b[32][2];
        for (int lane = 0; lane < 32; ++lane) ml::operands(wa[lane], wb[lane], xv[lane], s, a[lane], b[lane]);
        mma_by_the_isa(a, b, c);
      }
    }
}

TEST(GemvMmaLayout, AWarpsProductsAreEveryTileRowDotEveryXRow) {
  std::mt19937 gen(20261204);
  std::normal_distribution<float> nd(0.f, 1.f);
  // K in chunks: a pass's multiple, a share that ends inside a pass, one chunk.
  for (const int64_t chunks : {int64_t{32}, int64_t{13}, int64_t{1}, int64_t{44}})
    for (const int F : {2, 4})
      for (const int rows : {2, 5, 8}) {
        SCOPED_TRACE("chunks " + std::to_string(chunks) + " F " + std::to_string(F) + " rows " + std::to_string(rows));
        const int64_t K = chunks * 8;
        auto random_row = [&] {
          std::vector<uint16_t> r(static_cast<std::size_t>(K));
          for (auto& e : r) e = to_bf16(nd(gen));
          return r;
        };
        std::vector<std::vector<uint16_t>> w(16), x(8);
        for (auto& r : w) r = random_row();
        for (auto& r : x) r = random_row();  // rows past `rows` hold values the products must not see
        float c[32][4] = {};
        // Two warps' shares, as the kernel splits K, summed.
        const int64_t half = (chunks + 1) / 2;
        sweep(w, x, rows, 0, half, F, c);
        sweep(w, x, rows, half, chunks, F, c);
        for (int lane = 0; lane < 32; ++lane)
          for (int i = 0; i < 4; ++i) {
            const int tr = ml::result_tile_row(lane, i), xr = ml::result_x_row(lane, i);
            double want = 0.0;
            if (xr < rows)
              for (int64_t k = 0; k < K; ++k)
                want += static_cast<double>(from_bf16(w[static_cast<std::size_t>(tr)][static_cast<std::size_t>(k)])) *
                        from_bf16(x[static_cast<std::size_t>(xr)][static_cast<std::size_t>(k)]);
            EXPECT_NEAR(c[lane][i], want, 1e-3 * (1.0 + std::sqrt(static_cast<double>(K))))
                << "lane " << lane << " accumulator " << i << " (tile row " << tr << ", x row " << xr << ")";
          }
      }
}

// Every chunk of a share is loaded by exactly one lane quad in exactly one
// pass, and no pass of one warp reads past its share.
TEST(GemvMmaLayout, ASweepCoversItsShareOnce) {
  for (const int64_t begin : {int64_t{0}, int64_t{7}})
    for (const int64_t len : {int64_t{1}, int64_t{15}, int64_t{16}, int64_t{33}})
      for (const int F : {2, 4}) {
        std::vector<int> seen(static_cast<std::size_t>(len), 0);
        for (int64_t base = begin; base < begin + len; base += ml::chunks_per_pass_step * F)
          for (int u = 0; u < F; ++u)
            for (int t = 0; t < 4; ++t) {
              const int64_t v = ml::chunk_of(base, u, t);
              if (v < begin + len) {
                ASSERT_GE(v, begin);
                ++seen[static_cast<std::size_t>(v - begin)];
              }
            }
        for (std::size_t i = 0; i < seen.size(); ++i)
          EXPECT_EQ(seen[i], 1) << "begin " << begin << " len " << len << " F " << F << " chunk " << i;
      }
}

}  // namespace
