// Matrix-vector products for a few rows (gemv.cuh): a decode step's
// projections. Measured on an H100 (docs/BENCHMARKS.md, session 11): cuBLAS
// runs a 1 x 2048 x 2048 bf16 product as a 64x8-tile GEMM and the 1 x 2048 x
// 8192 one as split-K plus a reduce kernel, at about half the HBM bandwidth;
// a decode step is those products, so their bandwidth is the step's.

#include "gpu/cuda/gemv.cuh"

#include "gpu/cuda/common.cuh"
#include "gpu/cuda/cuda_check.cuh"
#include "gpu/cuda/gemv_mma_layout.hpp"
#include "gpu/cuda/mma.cuh"
#include "gpu/cuda/rope.cuh"
#include "gpu/cuda/vec.cuh"

namespace ag::gpu::cuda {

AG_CUDA_MODULE_ANCHOR()
namespace {

constexpr int kThreads = 256;     // 8 warps
constexpr int kWarpsPerRow = 2;   // each takes half of the row's K (summed through shared memory)
constexpr int kRowsPerBlock = kThreads / 32 / kWarpsPerRow;
constexpr int kInFlight = 8;      // 16-byte weight loads per lane issued before the arithmetic

struct row_offsets {
  int64_t off[gemv_mma_max_rows];  // element offset of each x row
};

// Offsets of the d0 x d1 x M rows of x (batch strides x.s[0], x.s[1]: 0
// where x broadcasts, as to_kt makes them; row stride `row_stride`) into
// xr; false when one is not a whole number of 16-byte vectors
// (`per_vec` elements).
bool x_row_offsets(const kt& x, int64_t d0, int64_t d1, int64_t M, int64_t row_stride, int64_t per_vec,
                   row_offsets& xr) {
  int r = 0;
  for (int64_t i0 = 0; i0 < d0; ++i0)
    for (int64_t i1 = 0; i1 < d1; ++i1)
      for (int64_t m = 0; m < M; ++m, ++r) {
        xr.off[r] = i0 * x.s[0] + i1 * x.s[1] + m * row_stride;
        if (xr.off[r] % per_vec != 0) return false;
      }
  return true;
}

// 16 bytes of T as 16 / sizeof(T) floats (kChunk = 8 for 16-bit types, 4 for f32).
template <class T> struct vec16;
template <> struct vec16<float> {
  static constexpr int n = 4;
  __device__ __forceinline__ static void unpack(const uint4& u, float (&f)[4]) {
    f[0] = __uint_as_float(u.x), f[1] = __uint_as_float(u.y), f[2] = __uint_as_float(u.z), f[3] = __uint_as_float(u.w);
  }
};
template <> struct vec16<__nv_bfloat16> {
  static constexpr int n = 8;
  __device__ __forceinline__ static void unpack(const uint4& u, float (&f)[8]) {
    const unsigned w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
    for (int k = 0; k < 4; ++k) f[2 * k] = __uint_as_float(w[k] << 16), f[2 * k + 1] = __uint_as_float(w[k] & 0xffff0000u);
  }
};
template <> struct vec16<__half> {
  static constexpr int n = 8;
  __device__ __forceinline__ static void unpack(const uint4& u, float (&f)[8]) {
    const __half2* h = reinterpret_cast<const __half2*>(&u);
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      const float2 p = __half22float2(h[k]);
      f[2 * k] = p.x, f[2 * k + 1] = p.y;
    }
  }
};

// What one launch computes (gemv.cuh): up to 3 weight matrices of K
// columns, stacked: the warp for global row n works on matrix m where
// n_end[m - 1] <= n < n_end[m] (plain), or on row n of both w[0] and w[1]
// (gated), writing y[m][r * N_m + local row].
template <class T, class TO>
struct gemv_targets {
  const T* w[3] = {nullptr, nullptr, nullptr};
  TO* y[3] = {nullptr, nullptr, nullptr};
  int64_t n_end[3] = {0, 0, 0};
  int count = 1;
  const T* residual = nullptr;  // residual mode: [R, N] contiguous, added to the product
  // rms_norm prologue (gemv_norm, the kernel's NORM): x's rows normalised
  // (and scaled by norm_w [K] when it is set) as they are read.
  const T* norm_w = nullptr;
  float eps = 0.0f;
  // The w[] are weight leaves, which no kernel writes, so the first chunk
  // may be read before the PDL wait. Projection groups say so (the planner
  // checks their operands are weights), and a plain product whose b the
  // lowering marked a weight (launch_ctx::b_is_weight); any other b may be
  // the output of the kernel right before it.
  bool weights_immutable = false;
  // The ROPE epilogue (gemv_rope): matrix m's outputs are rotated when
  // roped<m>. The kernel then works in pairs of rows, the two rows a rope
  // rotates together (k and k + D/2 of a head under neox, else 2k and
  // 2k + 1; in matrices without a rope, 2k and 2k + 1): each warp takes
  // both rows of a pair, as a gated warp takes gate's and up's rows.
  const int32_t* rope_pos = nullptr;
  int rope_seq = 1, rope_dim = 2;
  float rope_theta = 0.0f;
  rope_scaling rope_scale{};
  bool rope_neox = true, roped0 = false, roped1 = false, roped2 = false;
};

enum gemv_mode : int { plain = 0, gated = 1, residual = 2 };

// Two warps per weight row, each over half of K (grid-stride over groups of
// kRowsPerBlock rows, so every warp of a block takes the same trip count);
// each lane keeps its 16-byte loads of the row in flight (the weights
// stream through once: no L1 allocation), reads the matching x vectors
// through L1 (every warp of the SM reads the same x); the two warps' sums
// meet in shared memory. Gated: the row of w[0] (gate) and of w[1] (up)
// together, then silu(gate) * up. Measured on an H100 against one warp per
// row (docs/BENCHMARKS.md, session 12): faster for every decode shape, e.g.
// 2048 x 8192 17.4 -> 15.1 us. One x row (a decode step) fits 64 registers:
// four blocks per SM instead of three.
// The ROPE kernels' frequencies f_k (graph/rope_frequencies.hpp), computed on the host in f64
// (rope_inverse_frequencies, as the rope kernel takes them), passed by value:
// a pow per pair in each block before its first loads cost more than the
// rope kernels it replaced (3 us a layer of the LLaMA-7B decode step: every
// block of the q/k/v group paid it). Other kernels take an empty one.
struct rope_freqs {
  double inv[gemv_rope_max_pairs];
};
struct no_rope_freqs {};
template <bool ROPE>
using rope_freqs_t = std::conditional_t<ROPE, rope_freqs, no_rope_freqs>;

// What the kernels compute, unit by unit: a row (ROPE: a pair of rows, the
// two a rope rotates together) of the stacked matrices; total() of them.
template <class T, class TO>
struct unit_place {
  int64_t row, partner, N;  // the row in its matrix (and the pair's other), that matrix's rows
  const T* w;
  TO* y;
};
template <class T, class TO, int MODE, bool ROPE>
struct unit_map {
  const gemv_targets<T, TO>& tg;
  __device__ explicit unit_map(const gemv_targets<T, TO>& targets) : tg(targets) {}
  __device__ int64_t end_of(int m) const { return ROPE ? tg.n_end[m] / 2 : tg.n_end[m]; }
  __device__ int64_t total() const {
    const int64_t rows_in_all = tg.count == 3 ? tg.n_end[2] : tg.count == 2 ? tg.n_end[1] : tg.n_end[0];
    return ROPE ? rows_in_all / 2 : rows_in_all;
  }
  __device__ bool roped_at(int64_t n) const {
    const bool in1 = tg.count > 1 && n >= end_of(0), in2 = tg.count > 2 && n >= end_of(1);
    return ROPE && (in2 ? tg.roped2 : in1 ? tg.roped1 : tg.roped0);
  }
  // Where unit n is: which of the (up to 3) matrices, its row there (and
  // the pair's other row), that matrix's rows, weights and output. Selects,
  // not tg.x[m]: indexing the parameter arrays by a runtime m copies tg to
  // local memory in every thread (an 88-byte stack frame, up to 1.6x slower
  // on large grids).
  __device__ unit_place<T, TO> locate(int64_t n) const {
    const bool in1 = MODE == plain && tg.count > 1 && n >= end_of(0);
    const bool in2 = MODE == plain && tg.count > 2 && n >= end_of(1);
    const int64_t start = in2 ? end_of(1) : in1 ? end_of(0) : 0;
    int64_t row = n - start, partner = row;
    if constexpr (ROPE) {
      if (tg.rope_neox && roped_at(n)) {  // pair k of head h: rows h D + k and h D + k + D / 2 (32-bit: fewer than 2^31 rows)
        const int half = tg.rope_dim >> 1, k = static_cast<int>(row) % half;
        row = (row - k) * 2 + k;
        partner = row + half;
      } else {
        row *= 2;
        partner = row + 1;
      }
    }
    const int64_t count = (in2 ? end_of(2) : in1 ? end_of(1) : end_of(0)) - start;
    return unit_place<T, TO>{row, partner, ROPE ? 2 * count : count, in2 ? tg.w[2] : in1 ? tg.w[1] : tg.w[0],
                             in2 ? tg.y[2] : in1 ? tg.y[1] : tg.y[0]};
  }
};

// The ROPE epilogue of one pair (s: row `row`'s product, up: its partner's)
// of an x row at `position`: rotated when the pair's matrix has a rope
// (rounded first, as the rope would read them; the angle reduced as
// rope_sincos reduces it, to [-pi, pi], where the fast sincos is within
// 1e-6: the accurate one's slow path for large arguments kept registers from
// the main loop, spills), else both as they are.
template <class T, class TO>
__device__ __forceinline__ void rope_pair(const gemv_targets<T, TO>& tg, const rope_freqs& freqs, bool roped,
                                          int64_t row, int32_t position, float& s, float& up) {
  if (!roped) return;
  const float a = to_f(from_f<TO>(s)), b = to_f(from_f<TO>(up));
  const int within = static_cast<int>(row) % tg.rope_dim;  // the pair's index: within (neox) or within / 2
  float fs, fc;
  __sincosf(rope_reduced_angle(static_cast<double>(position), freqs.inv[tg.rope_neox ? within : within >> 1]), &fs,
            &fc);
  s = a * fc - b * fs;
  up = a * fs + b * fc;
}

template <class T, class TO, int R, int MODE, bool NORM, bool ROPE>
__global__ void __launch_bounds__(kThreads, R == 1 ? 4 : 1)
    gemv_kernel(gemv_targets<T, TO> tg, const T* __restrict__ x, row_offsets xr, int rows, int64_t ldw, int64_t vecs,
                rope_freqs_t<ROPE> freqs) {
  static_assert(!ROPE || MODE == plain, "the rope epilogue is a shared-input group's");
  constexpr int V = vec16<T>::n;
  constexpr bool TWO = MODE == gated || ROPE;  // two weight rows per warp: gate's and up's, or a rope's pair
  constexpr int F = TWO ? kInFlight / 2 : kInFlight;  // loads per row in flight
  constexpr int kWarps = kThreads / 32;
  __shared__ float part[kWarps][R], part_up[TWO ? kWarps : 1][R];
  const int lane = static_cast<int>(threadIdx.x & 31), warp = static_cast<int>(threadIdx.x >> 5);
  const int slice = warp % kWarpsPerRow;
  const int64_t per_slice = (vecs + kWarpsPerRow - 1) / kWarpsPerRow;
  const int64_t v_begin = slice * per_slice, v_end = v_begin + per_slice < vecs ? v_begin + per_slice : vecs;
  const unit_map<T, TO, MODE, ROPE> units(tg);
  const int64_t total = units.total();
  const auto roped_at = [&](int64_t n) { return units.roped_at(n); };
  const auto locate = [&](int64_t n) { return units.locate(n); };
  // With weights_immutable, the warp's first chunk of its first row is
  // loaded before waiting for the kernel before this one (PDL, common.cuh),
  // which cannot write weights: the loads overlap that kernel's tail. One
  // set of registers serves every chunk. (16 layers of back-to-back decode
  // GEMVs replayed as a graph on an H100: 785 us plain, 767 with PDL, 700
  // with PDL and this.)
  uint4 wv[F], uv[TWO ? F : 1];
  const int64_t first = static_cast<int64_t>(blockIdx.x) * kRowsPerBlock + warp / kWarpsPerRow;
  const bool preloaded = tg.weights_immutable && first < total;
  // The lane's F 16-byte loads, from vector v0 on, of unit `at`'s row of
  // its w (and, gated, of w[1]; ROPE, of the pair's other row).
  const auto load_chunk = [&](const unit_place<T, TO>& at, int64_t v0) {
    const uint4* wr = reinterpret_cast<const uint4*>(at.w + at.row * ldw);
    const uint4* ur = MODE == gated ? reinterpret_cast<const uint4*>(tg.w[1] + at.row * ldw)
                      : ROPE        ? reinterpret_cast<const uint4*>(at.w + at.partner * ldw)
                                    : nullptr;
#pragma unroll
    for (int u = 0; u < F; ++u) {
      const int64_t v = v0 + 32 * u;
      if (v < v_end) {
        wv[u] = __ldcs(wr + v);
        if constexpr (TWO) uv[u] = __ldcs(ur + v);
      }
    }
  };
  if (preloaded) load_chunk(locate(first), v_begin + lane);
  pdl_enter();
  __shared__ int32_t positions[ROPE ? R : 1];  // x row r's (read after the first barrier)
  if (ROPE && threadIdx.x < rows) positions[threadIdx.x] = tg.rope_pos[threadIdx.x % tg.rope_seq];
  // Vector v (16 bytes) of x row r, as floats.
  const auto x_vec = [&](int r, int64_t v, float (&xf)[V]) {
    vec16<T>::unpack(__ldg(reinterpret_cast<const uint4*>(x + xr.off[r]) + v), xf);
  };
  // NORM (the group's rms_norm prologue), folded into the products: row r's
  // output is (sum_k w_k x_k g_k) / rms(x_r), so each warp multiplies x by
  // the norm's weight g as it reads it, sums the squares of its half of x_r
  // beside the products of its first weight row (the same x for every
  // row), and the two halves' sums of squares meet in shared memory with
  // the partial products. No pass over x before the first product and no
  // barrier: a block that normalised x into shared memory first made the
  // LLaMA-7B decode step's GEMV chain 17% slower than plain GEMVs, this
  // form 5% (scripts/cuda-experiments/persistent_chain.cu, docs/BENCHMARKS.md
  // session 39).
  __shared__ float sum_sq[NORM ? kWarps : 1][R];
  float ss[NORM ? R : 1];
#pragma unroll
  for (int r = 0; r < (NORM ? R : 1); ++r) ss[r] = 0.f;
  for (int64_t base = static_cast<int64_t>(blockIdx.x) * kRowsPerBlock; base < total;
       base += static_cast<int64_t>(gridDim.x) * kRowsPerBlock) {
    const int64_t n = base + warp / kWarpsPerRow;
    const unit_place<T, TO> at = locate(n);
    const int64_t row = at.row, N = at.N;
    TO* ym = at.y;
    float acc[R], acc_up[R];
#pragma unroll
    for (int r = 0; r < R; ++r) acc[r] = 0.f, acc_up[r] = 0.f;
    if (n < total) {
      for (int64_t v0 = v_begin + lane; v0 < v_end; v0 += 32 * F) {
        if (!preloaded || n != first || v0 != v_begin + lane) load_chunk(at, v0);
#pragma unroll
        for (int u = 0; u < F; ++u) {
          const int64_t v = v0 + 32 * u;
          if (v >= v_end) break;
          float wf[V], uf[V];
          vec16<T>::unpack(wv[u], wf);
          if constexpr (TWO) vec16<T>::unpack(uv[u], uf);
#pragma unroll
          for (int r = 0; r < R; ++r) {
            if (r >= rows) break;  // R is the unroll bound: rows <= R
            float xf[V];
            x_vec(r, v, xf);
            if constexpr (NORM) {
              if (n == first)
#pragma unroll
                for (int e = 0; e < V; ++e) ss[r] = fmaf(xf[e], xf[e], ss[r]);
              if (tg.norm_w) {
                float gf[V];
                vec16<T>::unpack(__ldg(reinterpret_cast<const uint4*>(tg.norm_w) + v), gf);
#pragma unroll
                for (int e = 0; e < V; ++e) xf[e] *= gf[e];
              }
            }
#pragma unroll
            for (int e = 0; e < V; ++e) {
              acc[r] = fmaf(wf[e], xf[e], acc[r]);
              if constexpr (TWO) acc_up[r] = fmaf(uf[e], xf[e], acc_up[r]);
            }
          }
        }
      }
    }
#pragma unroll
    for (int r = 0; r < R; ++r) {
      if (r >= rows) break;
      acc[r] = warp_sum(acc[r]);
      if constexpr (TWO) acc_up[r] = warp_sum(acc_up[r]);
      if constexpr (NORM)
        if (n == first) ss[r] = warp_sum(ss[r]);
      if (lane == 0) {
        part[warp][r] = acc[r];
        if constexpr (TWO) part_up[warp][r] = acc_up[r];
        if constexpr (NORM)
          if (n == first) sum_sq[warp][r] = ss[r];
      }
    }
    __syncthreads();
    if (slice == 0 && lane < rows && n < total) {
      // Lane r writes x row r's output (no row past the output's last).
      const int r = lane;
      float s = 0.f, up = 0.f;
#pragma unroll
      for (int k = 0; k < kWarpsPerRow; ++k) {
        s += part[warp + k][r];
        if constexpr (TWO) up += part_up[warp + k][r];
      }
      if constexpr (NORM) {
        // Written at this warp's first row (n == first), kept since.
        float t = 0.f;
#pragma unroll
        for (int k = 0; k < kWarpsPerRow; ++k) t += sum_sq[warp + k][r];
        const float inv_rms = rsqrtf(t / static_cast<float>(vecs * V) + tg.eps);
        s *= inv_rms;
        if constexpr (TWO) up *= inv_rms;
      }
      if constexpr (MODE == gated) s = s / (1.f + __expf(-s)) * up;
      if constexpr (MODE == residual) s += to_f(tg.residual[r * N + row]);
      if constexpr (ROPE) {
        rope_pair(tg, freqs, roped_at(n), row, positions[r], s, up);
        ym[r * N + at.partner] = from_f<TO>(up);
      }
      ym[r * N + row] = from_f<TO>(s);
    }
    __syncthreads();  // part is rewritten by the next group
  }
}

// The mma form (backend_options::cuda_gemv_tensor_core_rows; the operand
// mapping and why it needs no shuffles: gemv_mma_layout.hpp). A block takes a
// tile of 16 weight rows (ROPE: 8 pairs, a pair's rows as the tile's rows g
// and g + 8, so one lane holds both outputs a rotation needs) at a time,
// grid-stride; its 8 warps each sweep an eighth of K, F chunks of each of
// the lane's weight rows in flight, and their 16 x 8 partial products meet
// in shared memory, where warp 0 applies the epilogue (norm, silu * up,
// residual, rope) and writes. 16-bit weights and x only; the norm prologue
// without a weight (folded or absent: norm_w would need x g rounded to the
// dtype before the tensor cores, a rounding the FMA kernel does not make).
constexpr int kMmaWarps = kThreads / 32;

template <class T>
__device__ __forceinline__ const uint32_t (&words_of(const uint4& v))[4] {
  return *reinterpret_cast<const uint32_t(*)[4]>(&v);
}

// NT: tiles of 8 x rows (1 or 2); DEEP: twice the chunks in flight a pass
// (one weight, 8 rows of x at most), for products of few tiles and long K.
template <class T, class TO, int MODE, bool NORM, bool ROPE, int NT, bool DEEP = false>
__global__ void __launch_bounds__(kThreads)
    gemv_mma_kernel(gemv_targets<T, TO> tg, const T* __restrict__ x, row_offsets xr, int rows, int64_t ldw,
                    int64_t vecs, rope_freqs_t<ROPE> freqs) {
  static_assert(sizeof(T) == 2, "the tensor cores take 16-bit operands");
  static_assert(NT == 1 || NT == 2, "8 or 16 rows of x");
  static_assert(!ROPE || MODE == plain, "the rope epilogue is a shared-input group's");
  static_assert(!DEEP || (MODE != gated && NT == 1), "deep passes: one weight, one tile of x rows");
  constexpr bool TWO = MODE == gated;  // gate's and up's rows
  constexpr int NA = TWO ? 2 : 1;      // accumulators: the product, and up's
  constexpr int F = TWO ? 2 : (DEEP ? 8 : 4);  // chunks of each weight row a lane has in flight per pass
  constexpr int U = ROPE ? 8 : 16;     // units a tile: rows, or pairs
  const unit_map<T, TO, MODE, ROPE> units(tg);
  const int64_t total = units.total(), tiles = (total + U - 1) / U;
  const int lane = static_cast<int>(threadIdx.x & 31), warp = static_cast<int>(threadIdx.x >> 5);
  const int g = mma_layout::group_of(lane), t = mma_layout::quad_of(lane);
  // The warp's share of K, in 16-byte chunks.
  const int64_t per = (vecs + kMmaWarps - 1) / kMmaWarps;
  const int64_t k_begin = min(vecs, warp * per), k_end = min(vecs, k_begin + per);
  // x rows g and g + 8 (tile nt's row g + 8 nt; zeros past `rows`): their
  // offsets picked by selects (xr is a kernel parameter).
  const uint4* xg[NT];
  bool x_live[NT];
#pragma unroll
  for (int nt = 0; nt < NT; ++nt) {
    int64_t x_off = 0;
#pragma unroll
    for (int r = 0; r < 8; ++r)
      if (r == g) x_off = xr.off[8 * nt + r];
    x_live[nt] = g + 8 * nt < rows;
    xg[nt] = reinterpret_cast<const uint4*>(x + x_off);
  }
  constexpr int XR = 8 * NT;  // x rows the tiles hold
  __shared__ float partial[kMmaWarps][NA * NT * 4][32];
  __shared__ float sum_sq[NORM ? kMmaWarps : 1][XR], inv_rms[NORM ? XR : 1];
  __shared__ int32_t positions[ROPE ? XR : 1];
  pdl_enter();
  if (ROPE && threadIdx.x < rows) positions[threadIdx.x] = tg.rope_pos[threadIdx.x % tg.rope_seq];
  const uint4 zero = make_uint4(0u, 0u, 0u, 0u);
  bool first_tile = true;
  for (int64_t tile = blockIdx.x; tile < tiles; tile += gridDim.x) {
    // The lane's tile rows g and g + 8: units tile U + g and + 8, or pair tile U + g's two rows.
    const int64_t na = tile * U + g, nb = ROPE ? na : na + 8;
    const bool live_a = na < total, live_b = nb < total;
    const unit_place<T, TO> pa = units.locate(live_a ? na : 0);
    const unit_place<T, TO> pb = ROPE ? pa : units.locate(live_b ? nb : 0);
    const uint4* wa_row = reinterpret_cast<const uint4*>(pa.w + pa.row * ldw);
    const uint4* wb_row = reinterpret_cast<const uint4*>(ROPE ? pa.w + pa.partner * ldw : pb.w + pb.row * ldw);
    const uint4* ua_row = TWO ? reinterpret_cast<const uint4*>(tg.w[1] + pa.row * ldw) : nullptr;
    const uint4* ub_row = TWO ? reinterpret_cast<const uint4*>(tg.w[1] + pb.row * ldw) : nullptr;
    float c[NA][NT][4];
#pragma unroll
    for (int a = 0; a < NA; ++a)
#pragma unroll
      for (int nt = 0; nt < NT; ++nt)
#pragma unroll
        for (int i = 0; i < 4; ++i) c[a][nt][i] = 0.f;
    float ss[NT] = {};  // NORM, first tile: x rows g's and g + 8's sums of squares over the lane's chunks
    // Passes of the warp's share: uniform over the warp (mma.sync needs every lane).
    for (int64_t base = k_begin; base < k_end; base += mma_layout::chunks_per_pass_step * F) {
      uint4 wa[F], wb[F], ua[TWO ? F : 1], ub[TWO ? F : 1], xv[NT][F];
#pragma unroll
      for (int u = 0; u < F; ++u) {
        const int64_t v = mma_layout::chunk_of(base, u, t);
        const bool in = v < k_end;
        wa[u] = in && live_a ? __ldcs(wa_row + v) : zero;
        wb[u] = in && live_b ? __ldcs(wb_row + v) : zero;
        if constexpr (TWO) {
          ua[u] = in && live_a ? __ldcs(ua_row + v) : zero;
          ub[u] = in && live_b ? __ldcs(ub_row + v) : zero;
        }
#pragma unroll
        for (int nt = 0; nt < NT; ++nt) xv[nt][u] = in && x_live[nt] ? __ldg(xg[nt] + v) : zero;
      }
#pragma unroll
      for (int u = 0; u < F; ++u) {
        if constexpr (NORM) {
          if (first_tile)
#pragma unroll
            for (int nt = 0; nt < NT; ++nt) {
              float xf[8];
              vec16<T>::unpack(xv[nt][u], xf);
#pragma unroll
              for (int e = 0; e < 8; ++e) ss[nt] = fmaf(xf[e], xf[e], ss[nt]);
            }
        }
#pragma unroll
        for (int s = 0; s < 2; ++s)
#pragma unroll
          for (int nt = 0; nt < NT; ++nt) {
            uint32_t a[4], b[2];
            mma_layout::operands(words_of<T>(wa[u]), words_of<T>(wb[u]), words_of<T>(xv[nt][u]), s, a, b);
            mma16816<T>(c[0][nt], a, b[0], b[1]);
            if constexpr (TWO) {
              mma_layout::operands(words_of<T>(ua[u]), words_of<T>(ub[u]), words_of<T>(xv[nt][u]), s, a, b);
              mma16816<T>(c[NA - 1][nt], a, b[0], b[1]);
            }
          }
      }
    }
#pragma unroll
    for (int a = 0; a < NA; ++a)
#pragma unroll
      for (int nt = 0; nt < NT; ++nt)
#pragma unroll
        for (int i = 0; i < 4; ++i) partial[warp][(a * NT + nt) * 4 + i][lane] = c[a][nt][i];
    if constexpr (NORM) {
      if (first_tile)  // x row g + 8 nt's share: the group's four lanes, then the warps
#pragma unroll
        for (int nt = 0; nt < NT; ++nt) {
          float v = ss[nt];
          v += __shfl_xor_sync(0xffffffffu, v, 1);
          v += __shfl_xor_sync(0xffffffffu, v, 2);
          if (t == 0) sum_sq[warp][g + 8 * nt] = v;
        }
    }
    __syncthreads();
    if (warp == 0) {
      if constexpr (NORM) {
        if (first_tile) {  // kept for the block's later tiles (only warp 0 reads it)
          if (lane < XR) {
            float tot = 0.f;
#pragma unroll
            for (int w = 0; w < kMmaWarps; ++w) tot += sum_sq[w][lane];
            inv_rms[lane] = rsqrtf(tot / static_cast<float>(vecs * 8) + tg.eps);
          }
          __syncwarp();
        }
      }
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) {
        // Tile nt's accumulators, summed over the warps.
        float sum[NA][4];
#pragma unroll
        for (int a = 0; a < NA; ++a)
#pragma unroll
          for (int i = 0; i < 4; ++i) {
            float v = 0.f;
#pragma unroll
            for (int w = 0; w < kMmaWarps; ++w) v += partial[w][(a * NT + nt) * 4 + i][lane];
            sum[a][i] = v;
          }
        if constexpr (ROPE) {
          // Accumulators j and 2 + j: x row 8 nt + 2t + j's outputs of the pair's two rows.
#pragma unroll
          for (int j = 0; j < 2; ++j) {
            const int r = 8 * nt + mma_layout::result_x_row(lane, j);
            if (!live_a || r >= rows) continue;
            float s = sum[0][j], up = sum[0][2 + j];
            if constexpr (NORM) s *= inv_rms[r], up *= inv_rms[r];
            rope_pair(tg, freqs, units.roped_at(na), pa.row, positions[r], s, up);
            pa.y[r * pa.N + pa.row] = from_f<TO>(s);
            pa.y[r * pa.N + pa.partner] = from_f<TO>(up);
          }
        } else {
#pragma unroll
          for (int i = 0; i < 4; ++i) {
            const int r = 8 * nt + mma_layout::result_x_row(lane, i);
            const bool second = mma_layout::result_tile_row(lane, i) >= 8;
            if (!(second ? live_b : live_a) || r >= rows) continue;
            const unit_place<T, TO>& at = second ? pb : pa;
            float s = sum[0][i];
            if constexpr (NORM) s *= inv_rms[r];
            if constexpr (MODE == gated) {
              float up = sum[NA - 1][i];
              if constexpr (NORM) up *= inv_rms[r];
              s = s / (1.f + __expf(-s)) * up;
            }
            if constexpr (MODE == residual) s += to_f(tg.residual[r * at.N + at.row]);
            at.y[r * at.N + at.row] = from_f<TO>(s);
          }
        }
      }
    }
    __syncthreads();  // partial is rewritten by the next tile
    first_tile = false;
  }
}

template <class T, class TO, int MODE, bool NORM, bool ROPE>
void go_mma(const launch_ctx& c, const gemv_targets<T, TO>& tg, const void* x, const row_offsets& xr, int rows,
            int64_t ldw, int64_t K) {
  const int64_t vecs = K / vec16<T>::n;
  const int64_t units = ROPE ? tg.n_end[tg.count - 1] / 2 : tg.n_end[tg.count - 1];
  const unsigned grid = grid_for(units, ROPE ? 8 : 16, c.sm_count * 4);  // a block a tile, grid-stride
  rope_freqs_t<ROPE> freqs{};
  if constexpr (ROPE) rope_inverse_frequencies(tg.rope_theta, tg.rope_scale, tg.rope_dim, freqs.inv);
  const auto launch = [&](auto kernel) {
    launch_kernel(c, kernel, grid, kThreads, 0, tg, static_cast<const T*>(x), xr, rows, ldw, vecs, freqs);
  };
  if constexpr (MODE != gated && !ROPE) {
    // Fewer tiles than two an SM (LLaMA-1B's o and down: 128 tiles of 16
    // rows) leave few warps to keep loads in flight: each pass of a warp's
    // share waits for its loads once, so take twice the chunks a pass.
    if (rows <= 8 && static_cast<int64_t>(grid) < 2 * c.sm_count && vecs >= 32 * kMmaWarps)
      return launch(gemv_mma_kernel<T, TO, MODE, NORM, ROPE, 1, true>);
  }
  if (rows > 8) return launch(gemv_mma_kernel<T, TO, MODE, NORM, ROPE, 2>);
  launch(gemv_mma_kernel<T, TO, MODE, NORM, ROPE, 1>);
}

template <class T, class TO, int R, int MODE, bool NORM, bool ROPE>
void go_rows(const launch_ctx& c, const gemv_targets<T, TO>& tg, const void* x, const row_offsets& xr, int rows,
             int64_t ldw, int64_t K) {
  const int64_t vecs = K / vec16<T>::n;
  const int64_t units = ROPE ? tg.n_end[tg.count - 1] / 2 : tg.n_end[tg.count - 1];  // ROPE: pairs of rows
  const unsigned grid = grid_for(units, kRowsPerBlock, c.sm_count * 64);
  rope_freqs_t<ROPE> freqs{};
  if constexpr (ROPE) rope_inverse_frequencies(tg.rope_theta, tg.rope_scale, tg.rope_dim, freqs.inv);
  launch_kernel(c, gemv_kernel<T, TO, R, MODE, NORM, ROPE>, grid, kThreads, 0, tg, static_cast<const T*>(x), xr, rows,
                ldw, vecs, freqs);
}

// Whether `rows` rows of x of elements of `esize` bytes take the GEMV's
// tensor-core form (launch_ctx::gemv_tensor_core_rows; 16-bit types, at
// most gemv_mma_max_rows).
bool on_tensor_cores(const launch_ctx& c, int esize, int64_t rows) {
  return esize == 2 && c.gemv_tensor_core_rows > 0 && rows >= c.gemv_tensor_core_rows && rows <= gemv_mma_max_rows;
}

template <class T, class TO, int MODE = plain, bool NORM = false, bool ROPE = false>
void go(const launch_ctx& c, int rows, const gemv_targets<T, TO>& tg, const void* x, const row_offsets& xr,
        int64_t ldw, int64_t K) {
  // The tensor cores from backend_options::cuda_gemv_tensor_core_rows rows
  // (16-bit types; a norm whose weight the kernel would read stays on FMAs).
  // Callers pass more than gemv_max_rows rows only where on_tensor_cores.
  if constexpr (sizeof(T) == 2) {
    if (on_tensor_cores(c, static_cast<int>(sizeof(T)), rows) && !(NORM && tg.norm_w)) {
      go_mma<T, TO, MODE, NORM, ROPE>(c, tg, x, xr, rows, ldw, K);
      return;
    }
  }
  // Unrolled for the next of 1, 2, 4, 8 rows; the kernel stops at `rows`.
  switch (rows) {
    case 1: go_rows<T, TO, 1, MODE, NORM, ROPE>(c, tg, x, xr, rows, ldw, K); break;
    case 2: go_rows<T, TO, 2, MODE, NORM, ROPE>(c, tg, x, xr, rows, ldw, K); break;
    case 3: case 4: go_rows<T, TO, 4, MODE, NORM, ROPE>(c, tg, x, xr, rows, ldw, K); break;
    default: go_rows<T, TO, 8, MODE, NORM, ROPE>(c, tg, x, xr, rows, ldw, K); break;
  }
}

template <class T, class TO>
void go_one(const launch_ctx& c, int rows, void* y, const void* x, const row_offsets& xr, const void* w, int64_t ldw,
            int64_t N, int64_t K) {
  gemv_targets<T, TO> tg;
  tg.w[0] = static_cast<const T*>(w);
  tg.y[0] = static_cast<TO*>(y);
  tg.n_end[0] = N;
  tg.weights_immutable = c.b_is_weight;
  go<T, TO>(c, rows, tg, x, xr, ldw, K);
}

}  // namespace

bool try_launch_gemv(const launch_ctx& c, const kt& out, const kt& a, const kt& b, bool trans_a, bool trans_b,
                     error& result) {
  // Weights shared by every row: b has no batch dims.
  if (b.d[0] != 1 || b.d[1] != 1 || a.t != b.t) return false;
  if (out.t != a.t && out.t != static_cast<int>(dtype::f32)) return false;
  const int64_t M = out.d[2], N = out.d[3], K = trans_a ? a.d[2] : a.d[3];
  const int64_t rows = out.d[0] * out.d[1] * M;
  const int t = a.t;
  const int64_t esz = static_cast<int64_t>(dtype_size(static_cast<dtype>(t)));
  if (rows < 1 || (rows > gemv_max_rows && !on_tensor_cores(c, static_cast<int>(esz), rows)) || N < 1 || K < 1)
    return false;
  const int64_t per_vec = 16 / esz;
  if (t != static_cast<int>(dtype::f32) && t != static_cast<int>(dtype::f16) && t != static_cast<int>(dtype::bf16))
    return false;
  if (K % per_vec != 0) return false;
  // w[n, k] at b.p + n * ldw + k: a unit stride along K.
  const int64_t w_k = trans_b ? b.s[3] : b.s[2], w_n = trans_b ? b.s[2] : b.s[3];
  if (K > 1 && w_k != 1) return false;
  const int64_t ldw = N == 1 ? K : w_n;
  if (!aligned16(b.p) || ldw % per_vec != 0) return false;
  // x rows (i0, i1, m) at a.p + i0 a.s[0] + i1 a.s[1] + m a_m, a unit stride along K.
  const int64_t a_k = trans_a ? a.s[2] : a.s[3], a_m = trans_a ? a.s[3] : a.s[2];
  if (K > 1 && a_k != 1) return false;
  if (!aligned16(a.p)) return false;
  row_offsets xr{};
  if (!x_row_offsets(a, out.d[0], out.d[1], M, a_m, per_vec, xr)) return false;
  const int rn = static_cast<int>(rows);
  const bool f32_out = out.t == static_cast<int>(dtype::f32);
  switch (static_cast<dtype>(t)) {
    case dtype::f32: go_one<float, float>(c, rn, out.p, a.p, xr, b.p, ldw, N, K); break;
    case dtype::f16:
      if (f32_out) go_one<__half, float>(c, rn, out.p, a.p, xr, b.p, ldw, N, K);
      else go_one<__half, __half>(c, rn, out.p, a.p, xr, b.p, ldw, N, K);
      break;
    default:
      if (f32_out) go_one<__nv_bfloat16, float>(c, rn, out.p, a.p, xr, b.p, ldw, N, K);
      else go_one<__nv_bfloat16, __nv_bfloat16>(c, rn, out.p, a.p, xr, b.p, ldw, N, K);
      break;
  }
  if (cudaError_t e = cudaGetLastError(); e != cudaSuccess)
    result = cuda_error(e, c.where, "gemv_kernel", __FILE__, __LINE__);
  return true;
}

namespace {

// x's rows as element offsets (rows over d[0], d[1], d[2]), false when a row
// is not K-contiguous and 16-byte aligned or there are too many.
template <class T>
bool x_rows(const kt& x, int64_t& rows, row_offsets& xr) {
  constexpr int V = vec16<T>::n;
  const int64_t K = x.d[3];
  rows = x.d[0] * x.d[1] * x.d[2];
  if (rows < 1 || rows > gemv_max_rows || K % V != 0 || (K > 1 && x.s[3] != 1) || !aligned16(x.p)) return false;
  return x_row_offsets(x, x.d[0], x.d[1], x.d[2], x.s[2], V, xr);
}

// A weight leaf [N, K], contiguous and aligned.
bool weight_ok(const kt& w, int64_t K) {
  return w.d[0] == 1 && w.d[1] == 1 && w.d[3] == K && (w.d[2] == 1 || w.s[2] == K) && (K == 1 || w.s[3] == 1) &&
         aligned16(w.p);
}

// `y` holds rows x N elements contiguously.
bool dense(const kt& y, int64_t rows, int64_t N) {
  if (y.d[0] * y.d[1] * y.d[2] * y.d[3] != rows * N) return false;
  int64_t expect = 1;
  for (int k = 3; k >= 0; --k) {
    if (y.d[k] != 1 && y.s[k] != expect) return false;
    expect *= y.d[k];
  }
  return true;
}

template <class T>
error go_projections(const launch_ctx& c, projection_kind kind, const kt& out, const kt* extra_outs, int n_extra,
                     const kt& x, const kt* w, int n_w, const kt* resid, const gemv_norm* norm, const gemv_rope* rope) {
  const auto refuse = [&](const char* why) {
    return error(errc::internal, c.where + ": fused projections outside the GEMV kernel's limits: " + why);
  };
  int64_t rows = 0;
  row_offsets xr{};
  if (!x_rows<T>(x, rows, xr)) return refuse("x's rows (at most 8, K-contiguous, 16-byte aligned)");
  const int64_t K = x.d[3];
  gemv_targets<T, T> tg;
  tg.count = kind == projection_kind::shared_input ? n_w : 1;
  if (n_w < 1 || n_w > 3 || (kind != projection_kind::shared_input && n_w != (kind == projection_kind::gated ? 2 : 1)) ||
      (kind == projection_kind::shared_input && n_extra != n_w - 1))
    return refuse("operand count");
  int64_t end = 0;
  for (int m = 0; m < n_w; ++m) {
    if (!weight_ok(w[m], K)) return refuse("a weight is not a contiguous, aligned [N, K]");
    tg.w[m] = static_cast<const T*>(w[m].p);
  }
  for (int m = 0; m < tg.count; ++m) {
    const kt& y = m == 0 ? out : extra_outs[m - 1];
    const int64_t N = w[m].d[2];
    if (!dense(y, rows, N)) return refuse("an output is not [rows, N] contiguous");
    tg.y[m] = static_cast<T*>(y.p);
    tg.n_end[m] = end += N;
  }
  if (kind == projection_kind::gated && w[1].d[2] != w[0].d[2]) return refuse("gate and up differ in N");
  if (kind == projection_kind::residual) {
    if (!resid || !dense(*resid, rows, w[0].d[2])) return refuse("the residual is not [rows, N] contiguous");
    tg.residual = static_cast<const T*>(resid->p);
  }
  if (norm) {
    if (kind == projection_kind::residual) return refuse("a norm prologue on a residual group");
    tg.eps = norm->eps;
    if (norm->weight) {
      const kt& g = *norm->weight;
      if (g.numel() != K || (K > 1 && g.s[3] != 1) || !aligned16(g.p))
        return refuse("the norm's weight is not a contiguous, aligned [K]");
      tg.norm_w = static_cast<const T*>(g.p);
    }
  }
  const bool roped = rope && rope->roped != 0;
  if (roped) {
    if (kind != projection_kind::shared_input) return refuse("a rope epilogue outside a shared-input group");
    if ((rope->roped >> tg.count) != 0) return refuse("ropes of outputs the group does not have");
    const int64_t D = rope->head_dim;
    if (D < 2 || D % 2 != 0 || D / 2 > gemv_rope_max_pairs || rope->seq < 1 || rows % rope->seq != 0)
      return refuse("the rope's head dim or positions");
    if (!rope->positions || rope->positions->t != static_cast<int>(dtype::i32) || rope->positions->numel() != rope->seq ||
        (rope->seq > 1 && rope->positions->s[3] != 1))
      return refuse("the rope's positions are not a contiguous i32 [S]");
    for (int m = 0; m < tg.count; ++m) {
      const int64_t N = w[m].d[2];
      if (N % 2 != 0 || (((rope->roped >> m) & 1u) && N % D != 0))
        return refuse("a roped output is not a whole number of heads, or an output's N is odd");
    }
    tg.rope_pos = static_cast<const int32_t*>(rope->positions->p);
    tg.rope_seq = static_cast<int>(rope->seq);
    tg.rope_dim = static_cast<int>(D);
    tg.rope_theta = rope->theta;
    tg.rope_scale = rope->scaling;
    tg.rope_neox = rope->neox;
    tg.roped0 = (rope->roped & 1u) != 0;
    tg.roped1 = (rope->roped & 2u) != 0;
    tg.roped2 = (rope->roped & 4u) != 0;
  }
  tg.weights_immutable = true;  // is_gemv_projection: every w is a weight leaf
  const int rn = static_cast<int>(rows);
  switch (kind) {
    case projection_kind::shared_input:
      if (norm && roped) go<T, T, plain, true, true>(c, rn, tg, x.p, xr, K, K);
      else if (roped) go<T, T, plain, false, true>(c, rn, tg, x.p, xr, K, K);
      else if (norm) go<T, T, plain, true>(c, rn, tg, x.p, xr, K, K);
      else go<T, T, plain>(c, rn, tg, x.p, xr, K, K);
      break;
    case projection_kind::gated:
      if (norm) go<T, T, gated, true>(c, rn, tg, x.p, xr, K, K);
      else go<T, T, gated>(c, rn, tg, x.p, xr, K, K);
      break;
    case projection_kind::residual: go<T, T, residual>(c, rn, tg, x.p, xr, K, K); break;
  }
  AG_CUDA_TRY_LAUNCH(c.where);
  return {};
}

}  // namespace

error launch_gemv_projections(const launch_ctx& c, projection_kind kind, const kt& out, const kt* extra_outs,
                              int n_extra, const kt& x, const kt* weights, int n_weights, const kt* residual,
                              const gemv_norm* norm, const gemv_rope* rope) {
  const int t = x.t;
  if (out.t != t) return error(errc::dtype_mismatch, c.where + ": fused projections need one dtype");
  for (int m = 0; m < n_weights; ++m)
    if (weights[m].t != t) return error(errc::dtype_mismatch, c.where + ": fused projections need one dtype");
  for (int m = 0; m < n_extra; ++m)
    if (extra_outs[m].t != t) return error(errc::dtype_mismatch, c.where + ": fused projections need one dtype");
  if (residual && residual->t != t) return error(errc::dtype_mismatch, c.where + ": fused projections need one dtype");
  if (norm && norm->weight && norm->weight->t != t)
    return error(errc::dtype_mismatch, c.where + ": fused projections need one dtype");
  const auto go = [&]<class T>() {
    return go_projections<T>(c, kind, out, extra_outs, n_extra, x, weights, n_weights, residual, norm, rope);
  };
  switch (static_cast<dtype>(t)) {
    case dtype::f32: return go.template operator()<float>();
    case dtype::f16: return go.template operator()<__half>();
    case dtype::bf16: return go.template operator()<__nv_bfloat16>();
    default: return error(errc::dtype_mismatch, c.where + ": fused projections need f32, f16 or bf16");
  }
}

}  // namespace ag::gpu::cuda
