// Matrix-vector products for a few rows (gemv.cuh): a decode step's
// projections. Measured on an H100 (docs/BENCHMARKS.md, session 11): cuBLAS
// runs a 1 x 2048 x 2048 bf16 product as a 64x8-tile GEMM and the 1 x 2048 x
// 8192 one as split-K plus a reduce kernel, at about half the HBM bandwidth;
// a decode step is those products, so their bandwidth is the step's.

#include "gpu/cuda/gemv.cuh"

#include "gpu/cuda/common.cuh"
#include "gpu/cuda/cuda_check.cuh"
#include "gpu/cuda/vec.cuh"

namespace ag::gpu::cuda {
namespace {

constexpr int kThreads = 256;  // 8 warps, a weight row each at a time
constexpr int kInFlight = 8;   // 16-byte weight loads per lane issued before the arithmetic

struct row_offsets {
  int64_t off[gemv_max_rows];  // element offset of each x row
};

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

// y[r * N + n] = sum_k x[off[r] + k] * w[n * ldw + k], for r < R. A warp per
// weight row n (grid-stride); each lane keeps kInFlight 16-byte loads of the
// row in flight (the weights stream through once: no L1 allocation), reads
// the matching x vectors through L1 (every warp of the SM reads the same x),
// and the warp sums its lanes at the end.
template <class T, class TO, int R>
__global__ void __launch_bounds__(kThreads)
    gemv_kernel(TO* __restrict__ y, const T* __restrict__ x, row_offsets xr, const T* __restrict__ w, int64_t ldw,
                int64_t N, int64_t vecs) {
  constexpr int V = vec16<T>::n;
  const int lane = static_cast<int>(threadIdx.x & 31);
  const int64_t warps = (static_cast<int64_t>(gridDim.x) * blockDim.x) >> 5;
  for (int64_t n = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) >> 5; n < N; n += warps) {
    const uint4* wr = reinterpret_cast<const uint4*>(w + n * ldw);
    float acc[R];
#pragma unroll
    for (int r = 0; r < R; ++r) acc[r] = 0.f;
    for (int64_t v0 = lane; v0 < vecs; v0 += 32 * kInFlight) {
      uint4 wv[kInFlight];
#pragma unroll
      for (int u = 0; u < kInFlight; ++u) {
        const int64_t v = v0 + 32 * u;
        if (v < vecs) wv[u] = __ldcs(wr + v);
      }
#pragma unroll
      for (int u = 0; u < kInFlight; ++u) {
        const int64_t v = v0 + 32 * u;
        if (v >= vecs) break;
        float wf[V];
        vec16<T>::unpack(wv[u], wf);
#pragma unroll
        for (int r = 0; r < R; ++r) {
          float xf[V];
          vec16<T>::unpack(__ldg(reinterpret_cast<const uint4*>(x + xr.off[r]) + v), xf);
#pragma unroll
          for (int e = 0; e < V; ++e) acc[r] = fmaf(wf[e], xf[e], acc[r]);
        }
      }
    }
#pragma unroll
    for (int r = 0; r < R; ++r) {
      const float s = warp_sum(acc[r]);
      if (lane == 0) y[r * N + n] = from_f<TO>(s);
    }
  }
}

template <class T, class TO, int R>
void go_rows(const launch_ctx& c, void* y, const void* x, const row_offsets& xr, const void* w, int64_t ldw, int64_t N,
             int64_t K) {
  const int64_t vecs = K / vec16<T>::n;
  const unsigned grid = grid_for(N * 32, kThreads, c.sm_count * 64);
  gemv_kernel<T, TO, R><<<grid, kThreads, 0, c.stream>>>(static_cast<TO*>(y), static_cast<const T*>(x), xr,
                                                         static_cast<const T*>(w), ldw, N, vecs);
}

template <class T, class TO>
void go(const launch_ctx& c, int rows, void* y, const void* x, const row_offsets& xr, const void* w, int64_t ldw,
        int64_t N, int64_t K) {
  switch (rows) {
    case 1: go_rows<T, TO, 1>(c, y, x, xr, w, ldw, N, K); break;
    case 2: go_rows<T, TO, 2>(c, y, x, xr, w, ldw, N, K); break;
    case 3: case 4: go_rows<T, TO, 4>(c, y, x, xr, w, ldw, N, K); break;
    default: go_rows<T, TO, 8>(c, y, x, xr, w, ldw, N, K); break;
  }
}

}  // namespace

bool try_launch_gemv(const launch_ctx& c, const kt& out, const kt& a, const kt& b, bool trans_a, bool trans_b,
                     error& result) {
  // Weights shared by every row: b has no batch dims.
  if (b.d[0] != 1 || b.d[1] != 1 || a.t != b.t) return false;
  if (out.t != a.t && out.t != static_cast<int>(dtype::f32)) return false;
  const int64_t M = out.d[2], N = out.d[3], K = trans_a ? a.d[2] : a.d[3];
  const int64_t rows = out.d[0] * out.d[1] * M;
  if (rows < 1 || rows > gemv_max_rows || N < 1 || K < 1) return false;
  const int t = a.t;
  const int64_t esz = static_cast<int64_t>(dtype_size(static_cast<dtype>(t)));
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
  int r = 0;
  for (int64_t i0 = 0; i0 < out.d[0]; ++i0)
    for (int64_t i1 = 0; i1 < out.d[1]; ++i1)
      for (int64_t m = 0; m < M; ++m, ++r) {
        const int64_t off = (a.d[0] == 1 ? 0 : i0 * a.s[0]) + (a.d[1] == 1 ? 0 : i1 * a.s[1]) + m * a_m;
        if (off % per_vec != 0) return false;
        xr.off[r] = off;
      }
  const int rn = static_cast<int>(rows);
  const bool f32_out = out.t == static_cast<int>(dtype::f32);
  switch (static_cast<dtype>(t)) {
    case dtype::f32: go<float, float>(c, rn, out.p, a.p, xr, b.p, ldw, N, K); break;
    case dtype::f16:
      if (f32_out) go<__half, float>(c, rn, out.p, a.p, xr, b.p, ldw, N, K);
      else go<__half, __half>(c, rn, out.p, a.p, xr, b.p, ldw, N, K);
      break;
    default:
      if (f32_out) go<__nv_bfloat16, float>(c, rn, out.p, a.p, xr, b.p, ldw, N, K);
      else go<__nv_bfloat16, __nv_bfloat16>(c, rn, out.p, a.p, xr, b.p, ldw, N, K);
      break;
  }
  if (cudaError_t e = cudaGetLastError(); e != cudaSuccess)
    result = cuda_error(e, c.where, "gemv_kernel", __FILE__, __LINE__);
  return true;
}

}  // namespace ag::gpu::cuda
