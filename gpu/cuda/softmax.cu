#include "gpu/cuda/common.cuh"
#include "gpu/cuda/cuda_check.cuh"
#include "gpu/cuda/softmax.cuh"

namespace ag::gpu::cuda {
namespace {

template <class TI, class TO>
__global__ void softmax_kernel(kt out, kt x, float scale, bool causal) {
  __shared__ float sh[32];
  const int64_t row = blockIdx.x;
  const int64_t Sk = x.d[3], Sq = x.d[2];
  const int64_t xs = x.s[3], ys = out.s[3];
  const TI* xr = static_cast<const TI*>(x.p) + row_offset(x, row);
  TO* yr = static_cast<TO*>(out.p) + row_offset(out, row);
  // Elements j < n are live; j >= n are masked.
  int64_t n = Sk;
  if (causal) {
    const int64_t i = row % Sq;
    n = i + (Sk - Sq) + 1;
    if (n < 0) n = 0;
    if (n > Sk) n = Sk;
  }
  float m = -INFINITY, s = 0.f;
  for (int64_t j = threadIdx.x; j < n; j += blockDim.x) {
    const float v = to_f(xr[j * xs]) * scale;
    if (v > m) {
      s = s * expf(m - v) + 1.f;
      m = v;
    } else {
      s += expf(v - m);
    }
  }
  const float M = block_max(m, sh);
  const float total = block_sum(m == -INFINITY ? 0.f : s * expf(m - M), sh);
  const float inv = total > 0.f ? 1.f / total : 0.f;
  for (int64_t j = threadIdx.x; j < Sk; j += blockDim.x) {
    const float v = j < n ? expf(to_f(xr[j * xs]) * scale - M) * inv : 0.f;
    yr[j * ys] = from_f<TO>(v);
  }
}

template <class TI, class TO>
void go(const launch_ctx& c, const kt& out, const kt& x, float scale, bool causal) {
  const int64_t rows = x.numel() / x.d[3];
  const int64_t D = x.d[3];
  const int block = D >= 8192 ? 1024 : D >= 2048 ? 512 : D >= 256 ? 256 : D > 32 ? 128 : 32;
  softmax_kernel<TI, TO><<<static_cast<unsigned>(rows), block, 0, c.stream>>>(out, x, scale, causal);
}

template <class TI>
void go_out(const launch_ctx& c, const kt& out, const kt& x, float scale, bool causal) {
  switch (static_cast<dtype>(out.t)) {
    case dtype::f32: go<TI, float>(c, out, x, scale, causal); break;
    case dtype::f16: go<TI, __half>(c, out, x, scale, causal); break;
    default: go<TI, __nv_bfloat16>(c, out, x, scale, causal); break;
  }
}

}  // namespace

error launch_softmax(const launch_ctx& c, const kt& out, const kt& x, float scale, bool causal) {
  if (x.numel() == 0) return {};
  if (x.t == static_cast<int>(dtype::i32) || out.t == static_cast<int>(dtype::i32))
    return error(errc::dtype_mismatch, c.where + ": softmax needs float tensors");
  if (x.numel() / x.d[3] > 0x7fffffffLL) return error(errc::invalid_shape, c.where + ": too many rows");
  switch (static_cast<dtype>(x.t)) {
    case dtype::f32: go_out<float>(c, out, x, scale, causal); break;
    case dtype::f16: go_out<__half>(c, out, x, scale, causal); break;
    default: go_out<__nv_bfloat16>(c, out, x, scale, causal); break;
  }
  AG_CUDA_TRY_LAUNCH(c.where);
  return {};
}

}  // namespace ag::gpu::cuda
