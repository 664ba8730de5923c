#include "gpu/cuda/common.cuh"
#include "gpu/cuda/cuda_check.cuh"
#include "gpu/cuda/norm.cuh"

namespace ag::gpu::cuda {
namespace {

template <class TI, class TO, bool LAYER>
__global__ void norm_kernel(kt out, kt x, kt w, kt b, bool has_w, bool has_b, float eps) {
  __shared__ float sh[32];
  const int64_t row = blockIdx.x;
  const int64_t D = x.d[3];
  const int64_t xs = x.s[3];
  const TI* xr = static_cast<const TI*>(x.p) + row_offset(x, row);
  TO* yr = static_cast<TO*>(out.p) + row_offset(out, row);
  const int64_t ys = out.s[3];
  float mean = 0.f;
  if constexpr (LAYER) {
    float s = 0.f;
    for (int64_t j = threadIdx.x; j < D; j += blockDim.x) s += to_f(xr[j * xs]);
    mean = block_sum(s, sh) / static_cast<float>(D);
  }
  float s2 = 0.f;
  for (int64_t j = threadIdx.x; j < D; j += blockDim.x) {
    const float v = to_f(xr[j * xs]) - mean;
    s2 += v * v;
  }
  const float r = rsqrtf(block_sum(s2, sh) / static_cast<float>(D) + eps);
  for (int64_t j = threadIdx.x; j < D; j += blockDim.x) {
    float v = (to_f(xr[j * xs]) - mean) * r;
    if (has_w) v *= ld(w.p, w.t, j * w.s[3]);
    if (has_b) v += ld(b.p, b.t, j * b.s[3]);
    yr[j * ys] = from_f<TO>(v);
  }
}

template <bool LAYER, class TI, class TO>
void go(const launch_ctx& c, const kt& out, const kt& x, const kt* w, const kt* b, float eps) {
  const int64_t rows = x.numel() / x.d[3];
  const int64_t D = x.d[3];
  const int block = D >= 4096 ? 1024 : D >= 1024 ? 512 : D >= 256 ? 256 : D > 32 ? 128 : 32;
  norm_kernel<TI, TO, LAYER><<<static_cast<unsigned>(rows), block, 0, c.stream>>>(
      out, x, w ? *w : kt{}, b ? *b : kt{}, w != nullptr, b != nullptr, eps);
}

template <bool LAYER, class TI>
void go_out(const launch_ctx& c, const kt& out, const kt& x, const kt* w, const kt* b, float eps) {
  switch (static_cast<dtype>(out.t)) {
    case dtype::f32: go<LAYER, TI, float>(c, out, x, w, b, eps); break;
    case dtype::f16: go<LAYER, TI, __half>(c, out, x, w, b, eps); break;
    default: go<LAYER, TI, __nv_bfloat16>(c, out, x, w, b, eps); break;
  }
}

template <bool LAYER>
error launch(const launch_ctx& c, const kt& out, const kt& x, const kt* w, const kt* b, float eps) {
  if (x.numel() == 0) return {};
  if (x.t == static_cast<int>(dtype::i32) || out.t == static_cast<int>(dtype::i32))
    return error(errc::dtype_mismatch, c.where + ": norm needs float tensors");
  if (x.numel() / x.d[3] > 0x7fffffffLL) return error(errc::invalid_shape, c.where + ": too many rows");
  switch (static_cast<dtype>(x.t)) {
    case dtype::f32: go_out<LAYER, float>(c, out, x, w, b, eps); break;
    case dtype::f16: go_out<LAYER, __half>(c, out, x, w, b, eps); break;
    default: go_out<LAYER, __nv_bfloat16>(c, out, x, w, b, eps); break;
  }
  AG_CUDA_TRY_LAUNCH(c.where);
  return {};
}

}  // namespace

error launch_rms_norm(const launch_ctx& c, const kt& out, const kt& x, const kt* w, float eps) {
  return launch<false>(c, out, x, w, nullptr, eps);
}
error launch_layer_norm(const launch_ctx& c, const kt& out, const kt& x, const kt* w, const kt* b, float eps) {
  return launch<true>(c, out, x, w, b, eps);
}

}  // namespace ag::gpu::cuda
