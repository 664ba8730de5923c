#include "gpu/cuda/common.cuh"
#include "gpu/cuda/cuda_check.cuh"
#include "gpu/cuda/rope.cuh"

namespace ag::gpu::cuda {
namespace {

__global__ void rope_kernel(kt out, kt x, kt pos, float theta, bool neox, int64_t pairs) {
  const int64_t D = x.d[3], half = D / 2;
  for (int64_t p = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; p < pairs; p += (int64_t)gridDim.x * blockDim.x) {
    const int64_t row = p / half, k = p % half;
    const int64_t s = (row / x.d[2]) % x.d[1];
    const int64_t j0 = neox ? k : 2 * k;
    const int64_t j1 = neox ? k + half : 2 * k + 1;
    const int64_t xo = row_offset(x, row), yo = row_offset(out, row);
    const float a = ld(x.p, x.t, xo + j0 * x.s[3]);
    const float b = ld(x.p, x.t, xo + j1 * x.s[3]);
    const double position = static_cast<double>(static_cast<const int32_t*>(pos.p)[s * pos.s[3]]);
    const double ang = position * pow(static_cast<double>(theta), -2.0 * static_cast<double>(k) / static_cast<double>(D));
    double sn, cs;
    sincos(ang, &sn, &cs);
    const float fc = static_cast<float>(cs), fs = static_cast<float>(sn);
    st(out.p, out.t, yo + j0 * out.s[3], a * fc - b * fs);
    st(out.p, out.t, yo + j1 * out.s[3], a * fs + b * fc);
  }
}

}  // namespace

error launch_rope(const launch_ctx& c, const kt& out, const kt& x, const kt& pos, float theta, bool neox) {
  if (x.d[3] % 2 != 0) return error(errc::invalid_shape, c.where + ": rope needs an even last dim");
  if (pos.t != static_cast<int>(dtype::i32)) return error(errc::dtype_mismatch, c.where + ": rope positions must be i32");
  const int64_t pairs = x.numel() / 2;
  if (pairs == 0) return {};
  const int block = 256;
  rope_kernel<<<grid_for(pairs, block, c.sm_count * 16), block, 0, c.stream>>>(out, x, pos, theta, neox, pairs);
  AG_CUDA_TRY_LAUNCH(c.where);
  return {};
}

}  // namespace ag::gpu::cuda
