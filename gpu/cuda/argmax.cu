#include "gpu/cuda/argmax.cuh"

#include <climits>
#include <cstdint>

#include "gpu/cuda/common.cuh"
#include "gpu/cuda/cuda_check.cuh"

namespace ag::gpu::cuda {

AG_CUDA_MODULE_ANCHOR()
namespace {

constexpr int kThreads = 1024;

// A candidate: its value and index; index < 0 is none (only NaNs seen).
struct best_of {
  float v;
  int i;
};

// Whether a beats b: a larger value, or the same value at a smaller index.
__device__ __forceinline__ bool beats(const best_of& a, const best_of& b) {
  if (a.i < 0) return false;
  if (b.i < 0) return true;
  return a.v > b.v || (a.v == b.v && a.i < b.i);
}

__device__ __forceinline__ best_of warp_best(best_of b) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    best_of other{__shfl_xor_sync(0xffffffffu, b.v, o), __shfl_xor_sync(0xffffffffu, b.i, o)};
    if (beats(other, b)) b = other;
  }
  return b;
}

// The thread's candidate after element j of value v (a strict > keeps the
// first maximum: each thread visits its indices in increasing order).
__device__ __forceinline__ void consider(best_of& b, float v, int64_t j) {
  if (!isnan(v) && (b.i < 0 || v > b.v)) b = {v, static_cast<int>(j)};
}

// A row's 16-byte vectors (contiguous, aligned rows): each thread takes
// vectors tid, tid + kThreads, ..., kUnroll of them loaded before any is
// compared, so a thread's loads of a decode step's 32,000 logits overlap
// (LLaMA's vocabulary on an H200 under ncu: 10.3 us element by element,
// 7.45 this way; docs/BENCHMARKS.md session 45).
// Returns how many of the row's n elements it covered (the rest, past the
// last whole vector, is the element loop's).
constexpr int kUnroll = 4;
template <class T>
__device__ __forceinline__ int64_t scan_vectors(best_of& b, const T* xr, int64_t n) {
  constexpr int V = 16 / sizeof(T);
  const int64_t vecs = n / V;
  const uint4* xv = reinterpret_cast<const uint4*>(xr);
  for (int64_t base = threadIdx.x; base < vecs; base += static_cast<int64_t>(kThreads) * kUnroll) {
    uint4 u[kUnroll];
#pragma unroll
    for (int k = 0; k < kUnroll; ++k) {
      const int64_t at = base + static_cast<int64_t>(k) * kThreads;
      if (at < vecs) u[k] = __ldg(xv + at);
    }
#pragma unroll
    for (int k = 0; k < kUnroll; ++k) {
      const int64_t at = base + static_cast<int64_t>(k) * kThreads;
      if (at >= vecs) break;
      const T* e = reinterpret_cast<const T*>(&u[k]);
#pragma unroll
      for (int i = 0; i < V; ++i) consider(b, to_f(e[i]), at * V + i);
    }
  }
  return vecs * V;
}

template <class T>
__global__ void __launch_bounds__(kThreads) argmax_kernel(kt out, kt x) {
  pdl_enter();
  __shared__ best_of warps[kThreads / 32];
  const int64_t row = blockIdx.x, n = x.d[3], xs = x.s[3];
  const T* xr = static_cast<const T*>(x.p) + row_offset(x, row);
  best_of b{0.f, -1};
  // Contiguous, aligned rows in vectors; the rest (or every element of
  // another row) element by element.
  const int64_t scalar_from = xs == 1 && reinterpret_cast<uintptr_t>(xr) % 16 == 0 ? scan_vectors(b, xr, n) : 0;
  for (int64_t j = scalar_from + threadIdx.x; j < n; j += kThreads) consider(b, to_f(xr[j * xs]), j);
  b = warp_best(b);
  const int lane = static_cast<int>(threadIdx.x & 31), warp = static_cast<int>(threadIdx.x >> 5);
  if (lane == 0) warps[warp] = b;
  __syncthreads();
  if (warp == 0) {
    b = lane < kThreads / 32 ? warps[lane] : best_of{0.f, -1};
    b = warp_best(b);
    if (lane == 0) static_cast<int32_t*>(out.p)[row_offset(out, row)] = b.i < 0 ? 0 : b.i;
  }
}

}  // namespace

error launch_argmax(const launch_ctx& c, const kt& out, const kt& x) {
  if (out.t != static_cast<int>(dtype::i32))
    return error(errc::dtype_mismatch, c.where + ": argmax writes i32");
  const int64_t rows = x.d[0] * x.d[1] * x.d[2];
  if (out.d[3] != 1 || out.d[0] * out.d[1] * out.d[2] != rows || x.d[3] < 1)
    return error(errc::invalid_shape, c.where + ": argmax needs x [.., N] and out [.., 1] of the same rows");
  if (x.d[3] > INT_MAX) return error(errc::invalid_shape, c.where + ": argmax rows longer than 2^31 - 1");
  if (rows == 0) return {};
  if (rows > 0x7fffffffLL) return error(errc::invalid_shape, c.where + ": too many rows");
  const auto grid = static_cast<unsigned>(rows);
  switch (static_cast<dtype>(x.t)) {
    case dtype::f32: launch_kernel(c, argmax_kernel<float>, grid, kThreads, 0, out, x); break;
    case dtype::f16: launch_kernel(c, argmax_kernel<__half>, grid, kThreads, 0, out, x); break;
    case dtype::bf16: launch_kernel(c, argmax_kernel<__nv_bfloat16>, grid, kThreads, 0, out, x); break;
    default: return error(errc::dtype_mismatch, c.where + ": argmax reads f32, f16 or bf16");
  }
  AG_CUDA_TRY_LAUNCH(c.where);
  return {};
}

}  // namespace ag::gpu::cuda
