#include <cmath>

#include "gpu/cuda/common.cuh"
#include "gpu/cuda/cuda_check.cuh"
#include "gpu/cuda/rope.cuh"

namespace ag::gpu::cuda {

AG_CUDA_MODULE_ANCHOR()
namespace {

/// f_k for k < D/2 (graph/rope_frequencies.hpp), computed once on the host (f64), passed by
/// value: heads up to D = 512 (4 KiB of kernel parameters at most).
constexpr int max_rope_pairs = 256;
struct rope_freqs {
  double inv[max_rope_pairs];
};

/// Rotates the pair (j0, j1) of the row at xo in x into the row at yo in out:
/// (a, b) -> (a cos - b sin, a sin + b cos).
__device__ __forceinline__ void rotate_pair(const kt& out, const kt& x, int64_t xo, int64_t yo, int64_t j0, int64_t j1,
                                            float fc, float fs) {
  const float a = ld(x.p, x.t, xo + j0 * x.s[3]);
  const float b = ld(x.p, x.t, xo + j1 * x.s[3]);
  st(out.p, out.t, yo + j0 * out.s[3], a * fc - b * fs);
  st(out.p, out.t, yo + j1 * out.s[3], a * fs + b * fc);
}

/// Heads one thread rotates with one angle, where there is work enough for
/// every SM without it (else 1: a decode step's one position).
constexpr int64_t rope_heads_per_thread = 4;

/// One thread per (position row group, pair k, run of up to 4 heads): x
/// viewed as rows of [groups, H] (a group: one [b, s]); the angle
/// pos[s] * inv[k] and its sin / cos in f64 once, then the pair rotated in
/// each head of the run. (The angle depends on s and k only: per element it
/// cost an f64 pow and sincos, 200 us for a [2, 2048, 32, 128] bf16 tensor
/// on an H200. All heads in one thread was as slow for a decode step's one
/// position: 64 threads, 32 heads each in series.)
__global__ void rope_kernel(kt out, kt x, kt pos, bool neox, int64_t work, int64_t heads_per_thread, rope_freqs f) {
  pdl_enter();
  const int64_t D = x.d[3], half = D / 2, H = x.d[2];
  const int64_t runs = (H + heads_per_thread - 1) / heads_per_thread;
  for (int64_t p = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; p < work; p += (int64_t)gridDim.x * blockDim.x) {
    const int64_t k = p % half, run = (p / half) % runs, group = p / (half * runs);
    const int64_t s = group % x.d[1];
    const int64_t j0 = neox ? k : 2 * k;
    const int64_t j1 = neox ? k + half : 2 * k + 1;
    const int64_t h0 = run * heads_per_thread, n = (h0 + heads_per_thread < H ? h0 + heads_per_thread : H) - h0;
    const int64_t xo = row_offset(x, group * H + h0), yo = row_offset(out, group * H + h0);
    // The pairs first, then the position: their loads are independent, so
    // they wait for memory once, not twice (a decode step's rope is latency).
    float a[rope_heads_per_thread], b[rope_heads_per_thread];
#pragma unroll
    for (int h = 0; h < rope_heads_per_thread; ++h)
      if (h < n) {
        a[h] = ld(x.p, x.t, xo + h * x.s[2] + j0 * x.s[3]);
        b[h] = ld(x.p, x.t, xo + h * x.s[2] + j1 * x.s[3]);
      }
    const double position = static_cast<double>(static_cast<const int32_t*>(pos.p)[s * pos.s[3]]);
    float fs, fc;
    rope_sincos(position, f.inv[k], fs, fc);
#pragma unroll
    for (int h = 0; h < rope_heads_per_thread; ++h)
      if (h < n) {
        st(out.p, out.t, yo + h * out.s[2] + j0 * out.s[3], a[h] * fc - b[h] * fs);
        st(out.p, out.t, yo + h * out.s[2] + j1 * out.s[3], a[h] * fs + b[h] * fc);
      }
  }
}

/// Heads wider than 512: the frequency per element (f64 pow), as before.
__global__ void rope_wide_kernel(kt out, kt x, kt pos, float theta, rope_scaling scaling, bool neox, int64_t pairs) {
  pdl_enter();
  const int64_t D = x.d[3], half = D / 2;
  for (int64_t p = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; p < pairs; p += (int64_t)gridDim.x * blockDim.x) {
    const int64_t row = p / half, k = p % half;
    const int64_t s = (row / x.d[2]) % x.d[1];
    const int64_t j0 = neox ? k : 2 * k;
    const int64_t j1 = neox ? k + half : 2 * k + 1;
    const double position = static_cast<double>(static_cast<const int32_t*>(pos.p)[s * pos.s[3]]);
    const double ang = position * rope_frequency(theta, scaling, k, D);
    double sn, cs;
    sincos(ang, &sn, &cs);
    rotate_pair(out, x, row_offset(x, row), row_offset(out, row), j0, j1, static_cast<float>(cs), static_cast<float>(sn));
  }
}

}  // namespace

void rope_inverse_frequencies(float theta, const rope_scaling& scaling, int64_t D, double* inv) {
  rope_frequencies(theta, scaling, D, inv);
}

error launch_rope(const launch_ctx& c, const kt& out, const kt& x, const kt& pos, float theta,
                  const rope_scaling& scaling, bool neox) {
  if (x.d[3] % 2 != 0) return error(errc::invalid_shape, c.where + ": rope needs an even last dim");
  if (pos.t != static_cast<int>(dtype::i32)) return error(errc::dtype_mismatch, c.where + ": rope positions must be i32");
  const int64_t pairs = x.numel() / 2;
  if (pairs == 0) return {};
  const int block = 256;
  const int64_t half = x.d[3] / 2;
  if (half <= max_rope_pairs) {
    rope_freqs f{};
    rope_inverse_frequencies(theta, scaling, x.d[3], f.inv);
    // (row groups) x (runs of heads) x (pairs of a row). A decode step's
    // 32 heads x 32 pairs ran as 256 threads of 4 heads each: one block, 8 us
    // of dependent loads (ncu, H100); a thread per head there.
    const int64_t hpt = pairs >= static_cast<int64_t>(c.sm_count) * block * rope_heads_per_thread ? rope_heads_per_thread : 1;
    const int64_t work = pairs / x.d[2] * ((x.d[2] + hpt - 1) / hpt);
    launch_kernel(c, rope_kernel, grid_for(work, block, c.sm_count * 16), block, 0, out, x, pos, neox, work, hpt, f);
  } else {
    launch_kernel(c, rope_wide_kernel, grid_for(pairs, block, c.sm_count * 16), block, 0, out, x, pos, theta, scaling,
                  neox, pairs);
  }
  AG_CUDA_TRY_LAUNCH(c.where);
  return {};
}

}  // namespace ag::gpu::cuda
