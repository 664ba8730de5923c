#include "gpu/cuda/flash_attention.cuh"

#include <string>

#include "gpu/cuda/common.cuh"
#include "gpu/cuda/cuda_check.cuh"
#include "gpu/cuda/mask_visibility.cuh"
#include "gpu/cuda/mma.cuh"
#include "graph/attention_mask.hpp"
#include "graph/fusion.hpp"

namespace ag::gpu::cuda {

AG_CUDA_MODULE_ANCHOR()
namespace {

// A block: 4 warps, 64 query rows (16 a warp, the rows of one m16n8k16
// product), key tiles of 64. Shared memory: the block's q rows, one tile of
// keys and one of values, each row padded by 16 bytes so that the 8 rows a
// fragment load touches fall in different banks.
constexpr int kRows = 64;
constexpr int kKeys = 64;
constexpr int kThreads = 128;
constexpr float kLog2e = 1.4426950408889634f;
// Masked attention over this many keys or more finds each mask row's
// visible keys first (mask_row_bounds_kernel).
constexpr int64_t kBoundsMinKeys = 256;

template <int HD>
constexpr int row_stride() {
  return HD + 8;  // elements (2 bytes each)
}
template <int HD>
constexpr int tile_elems() {
  return kRows * row_stride<HD>();
}
// q, then two buffers of a key tile and a value tile (the next tile loads
// while this one is used).
template <int HD>
constexpr std::size_t shared_bytes() {
  return static_cast<std::size_t>(5 * tile_elems<HD>()) * 2;
}

// Two floats as the dtype's pair, the first in the low half (the lower column).
template <class T>
__device__ __forceinline__ uint32_t pack2(float lo, float hi);
template <>
__device__ __forceinline__ uint32_t pack2<__nv_bfloat16>(float lo, float hi) {
  __nv_bfloat162 p = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<uint32_t*>(&p);
}
template <>
__device__ __forceinline__ uint32_t pack2<__half>(float lo, float hi) {
  __half2 p = __floats2half2_rn(lo, hi);
  return *reinterpret_cast<uint32_t*>(&p);
}

__device__ __forceinline__ float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));  // 2^-inf = +0
  return y;
}

__device__ __forceinline__ uint32_t lds32(const void* p) { return *static_cast<const uint32_t*>(p); }

// Four 8x8 matrices of 2-byte elements from shared memory, transposed: lane
// 8 i + r gives the address of row r of matrix i; each lane receives, per
// matrix, the elements (row 2t, column g) and (row 2t + 1, column g).
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t& r0, uint32_t& r1, uint32_t& r2, uint32_t& r3,
                                                  const void* p) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  const auto a = static_cast<uint32_t>(__cvta_generic_to_shared(p));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];"
               : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
               : "r"(a));
#endif
}

// Four 8x8 matrices, not transposed: lane 8 i + r gives the address of row
// r of matrix i; each lane receives, per matrix, (row g, columns 2t, 2t + 1).
__device__ __forceinline__ void ldmatrix_x4(uint32_t& r0, uint32_t& r1, uint32_t& r2, uint32_t& r3, const void* p) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  const auto a = static_cast<uint32_t>(__cvta_generic_to_shared(p));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
               : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
               : "r"(a));
#endif
}

// Rows [first, first + kRows) of x (row r at base + r * s2, element c at
// + c * s3; rows at or past `limit` as zeros) into shared rows of HD + 8:
// asynchronously with 16-byte rows (VEC), else element by element.
template <class T, int HD, bool VEC>
__device__ __forceinline__ void load_rows(T* dst, const T* base, int64_t s2, int64_t s3, int64_t first,
                                          int64_t limit) {
  if constexpr (VEC) {
    constexpr int chunks = HD / 8;  // 16 bytes each
    for (int i = threadIdx.x; i < kRows * chunks; i += kThreads) {
      const int r = i / chunks, c = (i % chunks) * 8;
      const int64_t row = first + r;
      cp_async16(dst + r * row_stride<HD>() + c, row < limit ? base + row * s2 + c : base, row < limit);
    }
  } else {
    for (int i = threadIdx.x; i < kRows * HD; i += kThreads) {
      const int r = i / HD, c = i % HD;
      const int64_t row = first + r;
      dst[r * row_stride<HD>() + c] = row < limit ? base[row * s2 + c * s3] : from_f<T>(0.f);
    }
  }
}

// Per mask row r < S, the keys from the first to the last it leaves
// visible (above attention_hidden_limit, graph/attention_mask.hpp):
// bounds[r] = {first, last + 1, clear}, or {keys, 0, 0} when it hides them
// all; clear = 1 when every value from first to last is zero (a
// generator's mask: no hidden key and nothing to add between them). A
// warp a row, 16-byte vectors where the rows allow. The flash kernel after
// it on the stream (its PDL wait orders the two) computes only the key
// tiles its rows' bounds span: a prefill chunk of 512 tokens in a cache of
// 16,384 positions computes 512 keys a query, not 16,384. It reads the
// mask once per launch, where every flash block would otherwise read its
// rows' whole mask (a block of 64 rows in such a cache: 2 MiB), and where
// its rows are clear it reads no mask value in the tiles they all see
// whole: only the tiles at the rows' ends.
constexpr int kBoundsWarps = 8;
// Zero values (+0 or -0) among the elements of a 32-bit word.
template <class T>
__device__ __forceinline__ int zeros_in(uint32_t w) {
  if constexpr (sizeof(T) == 2) return __popc(__vcmpeq2(w & 0x7fff7fffu, 0u)) >> 4;
  else return (w & 0x7fffffffu) == 0u ? 1 : 0;
}
template <class T>
__global__ void __launch_bounds__(kBoundsWarps * 32)
    mask_row_bounds_kernel(kt mask, int64_t S, int64_t keys, int4* bounds) {
  pdl_enter();
  constexpr int E = 16 / sizeof(T);
  const int lane = threadIdx.x & 31;
  const int64_t r = static_cast<int64_t>(blockIdx.x) * kBoundsWarps + (threadIdx.x >> 5);
  if (r >= S) return;
  const T* row = static_cast<const T*>(mask.p) + r * mask.s[2];
  const bool vectors = mask.s[3] == 1 && (reinterpret_cast<uintptr_t>(row) & 15) == 0;
  const int64_t vecs = vectors ? keys / E : 0;
  unsigned first = 0xffffffffu, end = 0u, zeros = 0u;  // zeros: visible values that are 0 (hidden ones never are)
  for (int64_t i = lane; i < vecs; i += 32) {
    const uint4 x = *reinterpret_cast<const uint4*>(row + i * E);
    const uint32_t v[4] = {visible_lanes<T>(x.x), visible_lanes<T>(x.y), visible_lanes<T>(x.z), visible_lanes<T>(x.w)};
    if (v[0] | v[1] | v[2] | v[3]) {
      first = min(first, static_cast<unsigned>(i * E + first_visible_in<T>(v)));
      end = static_cast<unsigned>(i * E + visible_end_in<T>(v));  // i grows: the lane's last one
      zeros += zeros_in<T>(x.x) + zeros_in<T>(x.y) + zeros_in<T>(x.z) + zeros_in<T>(x.w);
    }
  }
  for (int64_t j = vecs * E + lane; j < keys; j += 32) {
    const float m = to_f(row[j * mask.s[3]]);
    if (m > attention_hidden_limit) {
      first = min(first, static_cast<unsigned>(j));
      end = static_cast<unsigned>(j + 1);
      zeros += m == 0.f ? 1u : 0u;
    }
  }
  first = __reduce_min_sync(0xffffffffu, first);
  end = __reduce_max_sync(0xffffffffu, end);
  zeros = __reduce_add_sync(0xffffffffu, zeros);
  if (lane == 0)
    bounds[r] = end > 0 ? make_int4(static_cast<int>(first), static_cast<int>(end), zeros == end - first ? 1 : 0, 0)
                        : make_int4(static_cast<int>(keys), 0, 0, 0);
}

// Grid (row blocks, batch entries), the heaviest causal row blocks first.
template <class T, int HD, bool VEC>
__global__ void __launch_bounds__(kThreads)
    flash_attention_kernel(kt out, kt q, kt k, kt v, kt mask, bool masked, float scale, bool causal, int64_t S,
                           const int4* row_bounds) {
  extern __shared__ __align__(16) unsigned char smem_raw[];
  T* qs = reinterpret_cast<T*>(smem_raw);
  T* kbuf = qs + tile_elems<HD>();      // [2] key tiles
  T* vbuf = kbuf + 2 * tile_elems<HD>();  // [2] value tiles
  const int64_t group = blockIdx.y;
  const int64_t b0 = group / q.d[1], b1 = group % q.d[1];
  const int64_t M = q.d[2], keys = k.d[2];
  const int64_t m0 = static_cast<int64_t>(gridDim.x - 1 - blockIdx.x) * kRows;
  const T* qb = static_cast<const T*>(q.p) + b0 * q.s[0] + b1 * q.s[1];
  const T* kb = static_cast<const T*>(k.p) + b0 * k.s[0] + b1 * k.s[1];
  const T* vb = static_cast<const T*>(v.p) + b0 * v.s[0] + b1 * v.s[1];
  T* ob = static_cast<T*>(out.p) + b0 * out.s[0] + b1 * out.s[1];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;

  // The keys this block's rows see: all, or under `causal` up to its last
  // row's (the block's rows may wrap around S in a grouped-query layout).
  const int64_t last = (m0 + kRows < M ? m0 + kRows : M) - 1;
  int64_t kv_end = keys;
  if (causal) {
    const int64_t top = (m0 / S == last / S) ? last % S : S - 1;
    kv_end = top + (keys - S) + 1;
    if (kv_end > keys) kv_end = keys;
  }

  // Tiles wholly in [clear_begin, clear_end) need no per-key check: every row of the
  // block exists and sees every key there (no mask; under a mask, set below
  // from the rows' bounds where every row is clear there).
  int64_t clear_end = 0;
  if (!masked && m0 + kRows <= M) {
    const int64_t low = (m0 / S == last / S) ? m0 % S : 0;  // the block's first softmax row
    clear_end = causal ? low + (keys - S) + 1 : keys;
    clear_end = clear_end < keys ? clear_end : keys;
  }

  pdl_enter();
  // Under a mask with row bounds (mask_row_bounds_kernel): only the keys
  // from the first that a row of the block sees to the last; every key when
  // one of its rows hides them all (the reference's softmax then runs over
  // the hidden keys' scores, and so does this kernel).
  int64_t kv_begin = 0, clear_begin = 0;
  if (row_bounds) {
    // span: the rows' least first and greatest end; then their greatest
    // first and least end, and whether every row is clear: the keys
    // between those two every row sees with a mask value of 0.
    __shared__ int span[5];
    if (threadIdx.x == 0) span[0] = 0x7fffffff, span[1] = 0, span[2] = 0, span[3] = 0x7fffffff, span[4] = 1;
    __syncthreads();
    if (threadIdx.x < kRows && m0 + threadIdx.x < M) {
      int4 b = row_bounds[(m0 + threadIdx.x) % S];
      if (b.y <= b.x) b = make_int4(0, static_cast<int>(keys), 0, 0);
      atomicMin(&span[0], b.x);
      atomicMax(&span[1], b.y);
      atomicMax(&span[2], b.x);
      atomicMin(&span[3], b.y);
      if (!b.z) atomicAnd(&span[4], 0);
    }
    __syncthreads();
    kv_begin = span[0];
    kv_end = kv_end < span[1] ? kv_end : span[1];
    if (span[4] && m0 + kRows <= M && !causal) clear_begin = span[2], clear_end = span[3];
  }
  load_rows<T, HD, VEC>(qs, qb, q.s[2], q.s[3], m0, M);
  // Key and value rows at or past kv_end load as zeros: none of the block's
  // rows sees them, and a key no row reads may hold anything (a NaN in a
  // cache row the sequence has not reached would make a score NaN).
  load_rows<T, HD, VEC>(kbuf, kb, k.s[2], k.s[3], kv_begin, kv_end);
  load_rows<T, HD, VEC>(vbuf, vb, v.s[2], v.s[3], kv_begin, kv_end);
  cp_async_commit();
  cp_async_wait_all();
  __syncthreads();
  // This warp's 16 rows as a fragments, kept for the whole kernel.
  uint32_t qa[HD / 16][4];
  {
    const T* r0 = qs + (warp * 16 + g) * row_stride<HD>();
    const T* r1 = r0 + 8 * row_stride<HD>();
#pragma unroll
    for (int kk = 0; kk < HD / 16; ++kk) {
      qa[kk][0] = lds32(r0 + kk * 16 + 2 * t);
      qa[kk][1] = lds32(r1 + kk * 16 + 2 * t);
      qa[kk][2] = lds32(r0 + kk * 16 + 8 + 2 * t);
      qa[kk][3] = lds32(r1 + kk * 16 + 8 + 2 * t);
    }
  }
  // The thread's two rows: flat row, softmax row, whether it exists.
  const int64_t rowf[2] = {m0 + warp * 16 + g, m0 + warp * 16 + g + 8};
  const int64_t srow[2] = {rowf[0] % S, rowf[1] % S};
  const bool live[2] = {rowf[0] < M, rowf[1] < M};
  const float x_scale = scale * kLog2e;  // scores go to the base-2 domain once
  float o[HD / 8][4];
#pragma unroll
  for (int n = 0; n < HD / 8; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.f;
  float row_max[2] = {-INFINITY, -INFINITY}, row_sum[2] = {0.f, 0.f};

  int buf = 0;
  for (int64_t k0 = kv_begin; k0 < kv_end; k0 += kKeys, buf ^= 1) {
    // The next tile loads into the other buffers while this one is used
    // (every warp finished with them at the barrier ending the last round).
    if (k0 + kKeys < kv_end) {
      load_rows<T, HD, VEC>(kbuf + (buf ^ 1) * tile_elems<HD>(), kb, k.s[2], k.s[3], k0 + kKeys, kv_end);
      load_rows<T, HD, VEC>(vbuf + (buf ^ 1) * tile_elems<HD>(), vb, v.s[2], v.s[3], k0 + kKeys, kv_end);
    }
    cp_async_commit();
    const T* ks = kbuf + buf * tile_elems<HD>();
    const T* vs = vbuf + buf * tile_elems<HD>();
    // Scores of the warp's 16 rows and the tile's 64 keys: 8 products of 8
    // keys, their b fragments two products at a time (ldmatrix: keys
    // 16 np + 8 (i / 2) + r, head dims 16 kk + 8 (i % 2) for matrix i).
    float s[kKeys / 8][4];
#pragma unroll
    for (int n = 0; n < kKeys / 8; ++n) s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.f;
    {
      const int mi = lane >> 3, r = lane & 7;
      const T* krow = ks + ((mi >> 1) * 8 + r) * row_stride<HD>() + (mi & 1) * 8;
#pragma unroll
      for (int np = 0; np < kKeys / 16; ++np)
#pragma unroll
        for (int kk = 0; kk < HD / 16; ++kk) {
          uint32_t b0, b1, b2, b3;
          ldmatrix_x4(b0, b1, b2, b3, krow + np * 16 * row_stride<HD>() + kk * 16);
          mma16816<T>(s[2 * np], qa[kk], b0, b1);
          mma16816<T>(s[2 * np + 1], qa[kk], b2, b3);
        }
    }
    // Mask, visibility and scale; the rows' new maxima.
    float tile_max[2] = {-INFINITY, -INFINITY};
    if (k0 >= clear_begin && k0 + kKeys <= clear_end) {
#pragma unroll
      for (int n = 0; n < kKeys / 8; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          s[n][e] *= x_scale;
          tile_max[e >> 1] = fmaxf(tile_max[e >> 1], s[n][e]);
        }
    } else {
#pragma unroll
      for (int n = 0; n < kKeys / 8; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int h = e >> 1;
          const int64_t j = k0 + n * 8 + 2 * t + (e & 1);
          const bool seen = live[h] && j < keys && (!causal || j <= srow[h] + (keys - S));
          float x = s[n][e];
          if (seen && masked) x += to_f(static_cast<const T*>(mask.p)[srow[h] * mask.s[2] + j * mask.s[3]]);
          x = seen ? x * x_scale : -INFINITY;
          s[n][e] = x;
          tile_max[h] = fmaxf(tile_max[h], x);
        }
    }
    float alpha[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      float mx = tile_max[h];
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
      const float m_new = fmaxf(row_max[h], mx);
      // Nothing seen yet: the running sums are zero, any factor will do.
      alpha[h] = m_new == -INFINITY ? 1.f : fast_exp2(row_max[h] - m_new);
      row_max[h] = m_new;
      row_sum[h] *= alpha[h];
    }
    // Probabilities (unnormalised), the thread's share of the row sums.
#pragma unroll
    for (int n = 0; n < kKeys / 8; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int h = e >> 1;
        const float p = row_max[h] == -INFINITY ? 0.f : fast_exp2(s[n][e] - row_max[h]);
        s[n][e] = p;
        row_sum[h] += p;
      }
#pragma unroll
    for (int n = 0; n < HD / 8; ++n) {
      o[n][0] *= alpha[0];
      o[n][1] *= alpha[0];
      o[n][2] *= alpha[1];
      o[n][3] *= alpha[1];
    }
    // out += p v: the scores' result fragments are the next product's a
    // fragments (keys 16 kk .. 16 kk + 15 are score products 2 kk, 2 kk + 1).
#pragma unroll
    for (int kk = 0; kk < kKeys / 16; ++kk) {
      uint32_t pa[4] = {pack2<T>(s[2 * kk][0], s[2 * kk][1]), pack2<T>(s[2 * kk][2], s[2 * kk][3]),
                        pack2<T>(s[2 * kk + 1][0], s[2 * kk + 1][1]), pack2<T>(s[2 * kk + 1][2], s[2 * kk + 1][3])};
      const int mi = lane >> 3, r = lane & 7;
      const T* vrow = vs + (kk * 16 + (mi & 1) * 8 + r) * row_stride<HD>() + (mi >> 1) * 8;
#pragma unroll
      for (int p2 = 0; p2 < HD / 16; ++p2) {
        uint32_t v0, v1, v2, v3;
        ldmatrix_x4_trans(v0, v1, v2, v3, vrow + p2 * 16);
        mma16816<T>(o[2 * p2], pa, v0, v1);
        mma16816<T>(o[2 * p2 + 1], pa, v2, v3);
      }
    }
    cp_async_wait_all();
    __syncthreads();  // the next tile is in; every warp is done with this one
  }
  // Each row's sum over its quad; out = o / sum (zeros for a row that saw nothing).
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    row_sum[h] += __shfl_xor_sync(0xffffffffu, row_sum[h], 1);
    row_sum[h] += __shfl_xor_sync(0xffffffffu, row_sum[h], 2);
  }
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    if (!live[h]) continue;
    const float inv = row_sum[h] > 0.f ? 1.f / row_sum[h] : 0.f;
    T* orow = ob + rowf[h] * out.s[2];
#pragma unroll
    for (int n = 0; n < HD / 8; ++n) {
      const int d = n * 8 + 2 * t;
      const float a = o[n][2 * h] * inv, b = o[n][2 * h + 1] * inv;
      if constexpr (VEC) {
        *reinterpret_cast<uint32_t*>(orow + d) = pack2<T>(a, b);
      } else {
        orow[d * out.s[3]] = from_f<T>(a);
        orow[(d + 1) * out.s[3]] = from_f<T>(b);
      }
    }
  }
}

template <class T, int HD, bool VEC>
error go(const launch_ctx& c, const kt& out, const kt& q, const kt& k, const kt& v, const kt& mask, bool masked,
         float scale, bool causal, int64_t S, int64_t groups) {
  static std::atomic<bool> done[kMaxSharedOrdinals];
  const auto kernel = flash_attention_kernel<T, HD, VEC>;
  constexpr std::size_t shared = shared_bytes<HD>();
  AG_CUDA_TRY(allow_shared(kernel, shared, shared, done), c.where + " (shared memory for flash attention)");
  const auto row_blocks = static_cast<unsigned>((q.d[2] + kRows - 1) / kRows);
  // The mask rows' bounds in the stream's attention workspace (free between
  // kernels: every kernel that uses it does so after its PDL wait). Short
  // key runs skip it: their tiles cost less than the scan.
  int4* bounds = nullptr;
  const int64_t keys = k.d[2];
  if (masked && !causal && keys >= kBoundsMinKeys && c.attention_workspace && 4 * S <= c.attention_workspace_floats &&
      keys <= 0x7fffffffLL) {
    bounds = reinterpret_cast<int4*>(c.attention_workspace);
    launch_kernel(c, mask_row_bounds_kernel<T>, dim3(static_cast<unsigned>((S + kBoundsWarps - 1) / kBoundsWarps)),
                  kBoundsWarps * 32, 0, mask, S, keys, bounds);
  }
  launch_kernel(c, kernel, dim3(row_blocks, static_cast<unsigned>(groups)), kThreads, shared, out, q, k, v, mask,
                masked, scale, causal, S, static_cast<const int4*>(bounds));
  return {};
}

// 16-byte rows: unit stride along dh, row and batch strides of whole 16-byte
// units, a 16-byte aligned start (out: 4-byte pairs).
bool rows_of_vectors(const kt& x) {
  return x.s[3] == 1 && x.s[0] % 8 == 0 && x.s[1] % 8 == 0 && x.s[2] % 8 == 0 &&
         reinterpret_cast<uintptr_t>(x.p) % 16 == 0;
}
bool rows_of_pairs(const kt& x) {
  return x.s[3] == 1 && x.s[0] % 2 == 0 && x.s[1] % 2 == 0 && x.s[2] % 2 == 0 &&
         reinterpret_cast<uintptr_t>(x.p) % 4 == 0;
}

template <class T, int HD>
error go_vec(const launch_ctx& c, const kt& out, const kt& q, const kt& k, const kt& v, const kt& mask, bool masked,
             float scale, bool causal, int64_t S, int64_t groups) {
  if (rows_of_vectors(q) && rows_of_vectors(k) && rows_of_vectors(v) && rows_of_pairs(out))
    return go<T, HD, true>(c, out, q, k, v, mask, masked, scale, causal, S, groups);
  return go<T, HD, false>(c, out, q, k, v, mask, masked, scale, causal, S, groups);
}

template <class T>
error go_head(const launch_ctx& c, const kt& out, const kt& q, const kt& k, const kt& v, const kt& mask, bool masked,
              float scale, bool causal, int64_t S, int64_t groups) {
  if (q.d[3] == 64) return go_vec<T, 64>(c, out, q, k, v, mask, masked, scale, causal, S, groups);
  return go_vec<T, 128>(c, out, q, k, v, mask, masked, scale, causal, S, groups);
}

}  // namespace

bool flash_attention_fits(int dtype_code, int64_t dh) {
  return (dtype_code == static_cast<int>(dtype::bf16) || dtype_code == static_cast<int>(dtype::f16)) &&
         (dh == 64 || dh == 128);
}

error launch_flash_attention(const launch_ctx& c, const kt& out, const kt& q, const kt& k, const kt& v,
                             const kt* mask, float scale, bool causal, int64_t softmax_rows) {
  const int64_t groups = q.d[0] * q.d[1], M = q.d[2], dh = q.d[3], keys = k.d[2];
  if (groups * M == 0) return {};
  const int t = q.t;
  if (k.t != t || v.t != t || out.t != t || (mask && mask->t != t))
    return error(errc::dtype_mismatch, c.where + ": flash attention needs one dtype for q, k, v, mask and output");
  if (!flash_attention_fits(t, dh))
    return error(errc::invalid_shape, c.where + ": flash attention needs f16 or bf16 and a head dim of 64 or 128 (" +
                                          std::to_string(dh) + ")");
  if (keys < 1 || k.d[3] != dh || v.d[3] != dh || v.d[2] != keys || out.d[2] != M || out.d[3] != dh ||
      softmax_rows < 1 || M % softmax_rows != 0 || (mask && (mask->d[2] != softmax_rows || mask->d[3] != keys)))
    return error(errc::invalid_shape, c.where + ": flash attention shapes do not match (rows " + std::to_string(M) +
                                          ", keys " + std::to_string(keys) + ", head " + std::to_string(dh) + ")");
  for (int i = 0; i < 2; ++i)
    if (k.d[i] != q.d[i] || v.d[i] != q.d[i] || out.d[i] != q.d[i])
      return error(errc::invalid_shape, c.where + ": flash attention needs equal batch dims");
  if (groups > fused_flash_max_batch || (M + kRows - 1) / kRows > 0x7fffffffLL)
    return error(errc::invalid_shape, c.where + ": flash attention takes at most " +
                                          std::to_string(fused_flash_max_batch) + " batch entries (" +
                                          std::to_string(groups) + ")");
  const kt none{};
  const kt& mk = mask ? *mask : none;
  error e = t == static_cast<int>(dtype::bf16)
                ? go_head<__nv_bfloat16>(c, out, q, k, v, mk, mask != nullptr, scale, causal, softmax_rows, groups)
                : go_head<__half>(c, out, q, k, v, mk, mask != nullptr, scale, causal, softmax_rows, groups);
  if (e) return e;
  AG_CUDA_TRY_LAUNCH(c.where);
  return {};
}

}  // namespace ag::gpu::cuda
