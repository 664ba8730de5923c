#pragma once
// The GEMV kernel's mma form (gemv.cu, backend_options::
// cuda_gemv_tensor_core_rows): which 16-byte chunks of the weights and of x a
// lane loads, and how they become the operands of one m16n8k16 product
// (mma.cuh). Host and device code, so that a host test
// (tests/gpu/test_gemv_mma_layout.cpp) replays a warp's products against
// PTX's fragment layout without a GPU.
//
// A tile is 16 weight rows by the x rows (at most 8: the product's n). Lane
// 4 g + t of a warp owns tile rows g and g + 8 and x row g. A dot product
// does not care in which order K is summed, so K is not fed in the
// tensor cores' logical order: in pass u, lane quad t loads chunk
// base + 4 u + t (8 elements) of its two weight rows and of its x row, and
// the chunk's elements 0-3 are one product's logical columns (2t, 2t + 1,
// 2t + 8, 2t + 9), elements 4-7 a second product's. Every lane of quad t
// maps the same chunk the same way, so a row's element k always meets x's
// element k. The loaded words are the operands as they are: no shuffles,
// no conversions, and a chunk pair costs two mma instructions for up to 8
// rows of x, where the FMA kernel unpacks and multiplies x once per row.

#include <cstdint>

#if defined(__CUDACC__)
#define AG_MMA_LAYOUT_FN __host__ __device__ __forceinline__
#else
#define AG_MMA_LAYOUT_FN inline
#endif

namespace ag::gpu::cuda::mma_layout {

/// Lane = 4 g + t.
AG_MMA_LAYOUT_FN int group_of(int lane) { return lane >> 2; }
AG_MMA_LAYOUT_FN int quad_of(int lane) { return lane & 3; }

/// Chunks of 8 elements along K that one pass of a warp covers per row.
inline constexpr int chunks_per_pass_step = 4;

/// The chunk lane quad t loads in pass u of a sweep from chunk `base`: the
/// four lanes of a group read 64 contiguous bytes of their row.
AG_MMA_LAYOUT_FN int64_t chunk_of(int64_t base, int u, int t) { return base + chunks_per_pass_step * u + t; }

/// Operands of product s (0 or 1) of one chunk: `wa` and `wb` the chunk of
/// tile rows g and g + 8, `xv` the chunk of x row g, each four 32-bit words
/// of two 16-bit elements (the lower element in the low half).
AG_MMA_LAYOUT_FN void operands(const uint32_t (&wa)[4], const uint32_t (&wb)[4], const uint32_t (&xv)[4], int s,
                               uint32_t (&a)[4], uint32_t (&b)[2]) {
  a[0] = wa[2 * s];      // (g, 2t..2t+1)
  a[1] = wb[2 * s];      // (g + 8, 2t..2t+1)
  a[2] = wa[2 * s + 1];  // (g, 2t+8..2t+9)
  a[3] = wb[2 * s + 1];  // (g + 8, 2t+8..2t+9)
  b[0] = xv[2 * s];      // (k 2t..2t+1, n g)
  b[1] = xv[2 * s + 1];  // (k 2t+8..2t+9, n g)
}

/// Where a lane's accumulator i (0..3) lands: tile row g + 8 (i / 2), x row 2t + i % 2.
AG_MMA_LAYOUT_FN int result_tile_row(int lane, int i) { return group_of(lane) + 8 * (i >> 1); }
AG_MMA_LAYOUT_FN int result_x_row(int lane, int i) { return 2 * quad_of(lane) + (i & 1); }

}  // namespace ag::gpu::cuda::mma_layout
