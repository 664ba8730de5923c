#include "gpu/cuda/argmax.cuh"

#include <climits>

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

template <class T>
__global__ void __launch_bounds__(kThreads) argmax_kernel(kt out, kt x) {
  pdl_enter();
  __shared__ best_of warps[kThreads / 32];
  const int64_t row = blockIdx.x, n = x.d[3], xs = x.s[3];
  const T* xr = static_cast<const T*>(x.p) + row_offset(x, row);
  // Each thread scans its elements in increasing order: a strict > keeps the first maximum.
  best_of b{0.f, -1};
  for (int64_t j = threadIdx.x; j < n; j += kThreads) {
    const float v = to_f(xr[j * xs]);
    if (!isnan(v) && (b.i < 0 || v > b.v)) b = {v, static_cast<int>(j)};
  }
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
