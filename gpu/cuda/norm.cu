#include "gpu/cuda/common.cuh"
#include "gpu/cuda/cuda_check.cuh"
#include "gpu/cuda/norm.cuh"
#include "gpu/cuda/vec.cuh"

namespace ag::gpu::cuda {

AG_CUDA_MODULE_ANCHOR()
namespace {

template <class TI, class TO, bool LAYER>
__global__ void norm_kernel(kt out, kt x, kt w, kt b, bool has_w, bool has_b, float eps) {
  pdl_enter();
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


// Fast path: contiguous, 16-byte aligned rows of a whole number of 8-element
// chunks, same dtype in and out. The row stays in registers between the
// statistics and the normalisation (one read, one write); layer_norm still
// takes mean and variance in two exact passes, over the registers. TPR threads
// share a row: TPR == 32 is one warp per row (4 rows per block, shuffles only),
// otherwise one block per row. Each thread holds up to MAXC chunks.
template <class T, bool LAYER, int TPR, int MAXC>
__global__ void __launch_bounds__(TPR == 32 ? 128 : TPR)
    norm_vec_kernel(kt out, kt x, kt w, kt b, bool has_w, bool w_vec, bool has_b, bool b_vec, int64_t rows,
                    float eps) {
  pdl_enter();
  constexpr int RPB = TPR == 32 ? 4 : 1;
  __shared__ float sh[32];
  const int lane = TPR == 32 ? static_cast<int>(threadIdx.x & 31) : static_cast<int>(threadIdx.x);
  const int64_t row = static_cast<int64_t>(blockIdx.x) * RPB + (TPR == 32 ? threadIdx.x >> 5 : 0);
  if (row >= rows) return;  // whole warps only (TPR == 32), or never (one row per block)
  const int C = static_cast<int>(x.d[3] / kChunk);
  const float inv_d = 1.f / static_cast<float>(x.d[3]);
  const T* xr = static_cast<const T*>(x.p) + row_offset(x, row);
  T* yr = static_cast<T*>(out.p) + row_offset(out, row);
  auto reduce = [&](float v) { return TPR == 32 ? warp_sum(v) : block_sum(v, sh); };
  float v[MAXC][kChunk];
#pragma unroll
  for (int c = 0; c < MAXC; ++c) {
    const int ch = c * TPR + lane;
    if (ch < C) {
      load8(xr + ch * kChunk, v[c]);
    } else {
#pragma unroll
      for (int k = 0; k < kChunk; ++k) v[c][k] = 0.f;
    }
  }
  float mean = 0.f;
  if constexpr (LAYER) {
    float s = 0.f;
#pragma unroll
    for (int c = 0; c < MAXC; ++c)
#pragma unroll
      for (int k = 0; k < kChunk; ++k) s += v[c][k];
    mean = reduce(s) * inv_d;
  }
  float s2 = 0.f;
#pragma unroll
  for (int c = 0; c < MAXC; ++c) {
    if (c * TPR + lane < C) {
#pragma unroll
      for (int k = 0; k < kChunk; ++k) {
        const float d = v[c][k] - mean;
        s2 += d * d;
      }
    }
  }
  const float r = rsqrtf(reduce(s2) * inv_d + eps);
#pragma unroll
  for (int c = 0; c < MAXC; ++c) {
    const int ch = c * TPR + lane;
    if (ch >= C) continue;
    float y[kChunk];
#pragma unroll
    for (int k = 0; k < kChunk; ++k) y[k] = (v[c][k] - mean) * r;
    if (has_w) {
      float wv[kChunk];
      if (w_vec) {
        load8(static_cast<const T*>(w.p) + ch * kChunk, wv);
      } else {
#pragma unroll
        for (int k = 0; k < kChunk; ++k) wv[k] = ld(w.p, w.t, static_cast<int64_t>(ch * kChunk + k) * w.s[3]);
      }
#pragma unroll
      for (int k = 0; k < kChunk; ++k) y[k] *= wv[k];
    }
    if (has_b) {
      float bv[kChunk];
      if (b_vec) {
        load8(static_cast<const T*>(b.p) + ch * kChunk, bv);
      } else {
#pragma unroll
        for (int k = 0; k < kChunk; ++k) bv[k] = ld(b.p, b.t, static_cast<int64_t>(ch * kChunk + k) * b.s[3]);
      }
#pragma unroll
      for (int k = 0; k < kChunk; ++k) y[k] += bv[k];
    }
    store8(yr + ch * kChunk, y);
  }
}

template <class T, bool LAYER, int TPR, int MAXC>
void go_vec_cfg(const launch_ctx& c, const kt& out, const kt& x, const kt* w, const kt* b, bool w_vec, bool b_vec,
                int64_t rows, float eps) {
  constexpr int RPB = TPR == 32 ? 4 : 1;
  const unsigned grid = static_cast<unsigned>((rows + RPB - 1) / RPB);
  launch_kernel(c, norm_vec_kernel<T, LAYER, TPR, MAXC>, grid, TPR * RPB, 0,
      out, x, w ? *w : kt{}, b ? *b : kt{}, w != nullptr, w_vec, b != nullptr, b_vec, rows, eps);
}

// A per-dim parameter vector may be read as chunks when it has the rows' dtype
// and is contiguous and aligned.
bool param_vec(const kt* p, const kt& x) {
  return p && p->t == x.t && aligned16(p->p) && (p->d[3] == 1 || p->s[3] == 1);
}

/// Launches the register-resident kernel when x / out allow it; false otherwise.
template <class T, bool LAYER>
bool go_vec(const launch_ctx& c, const kt& out, const kt& x, const kt* w, const kt* b, float eps) {
  if (out.t != x.t || !rows_vectorisable(x) || !rows_vectorisable(out)) return false;
  const int64_t rows = x.numel() / x.d[3];
  const int64_t C = x.d[3] / kChunk;
  const bool wv = param_vec(w, x), bv = param_vec(b, x);
  // Fewer rows than SMs (a decode step's one token): a row's latency is the
  // kernel's, so spread it over up to 1024 threads, one chunk each, rather
  // than 64 threads of 4 chunks (6.4 us -> measured in docs/BENCHMARKS.md, session 11).
  if (rows < c.sm_count && C > 32 && C <= 1024) {
    if (C <= 128) go_vec_cfg<T, LAYER, 128, 1>(c, out, x, w, b, wv, bv, rows, eps);
    else if (C <= 256) go_vec_cfg<T, LAYER, 256, 1>(c, out, x, w, b, wv, bv, rows, eps);
    else if (C <= 512) go_vec_cfg<T, LAYER, 512, 1>(c, out, x, w, b, wv, bv, rows, eps);
    else go_vec_cfg<T, LAYER, 1024, 1>(c, out, x, w, b, wv, bv, rows, eps);
    return true;
  }
  if (C <= 32) go_vec_cfg<T, LAYER, 32, 1>(c, out, x, w, b, wv, bv, rows, eps);
  else if (C <= 64) go_vec_cfg<T, LAYER, 32, 2>(c, out, x, w, b, wv, bv, rows, eps);
  else if (C <= 128) go_vec_cfg<T, LAYER, 32, 4>(c, out, x, w, b, wv, bv, rows, eps);
  else if (C <= 256) go_vec_cfg<T, LAYER, 64, 4>(c, out, x, w, b, wv, bv, rows, eps);
  else if (C <= 512) go_vec_cfg<T, LAYER, 128, 4>(c, out, x, w, b, wv, bv, rows, eps);
  else if (C <= 1024) go_vec_cfg<T, LAYER, 256, 4>(c, out, x, w, b, wv, bv, rows, eps);
  else if (C <= 2048) go_vec_cfg<T, LAYER, 512, 4>(c, out, x, w, b, wv, bv, rows, eps);
  else if (C <= 4096) go_vec_cfg<T, LAYER, 512, 8>(c, out, x, w, b, wv, bv, rows, eps);
  else return false;  // rows over 32768 elements: the general kernel
  return true;
}

template <bool LAYER, class TI, class TO>
void go(const launch_ctx& c, const kt& out, const kt& x, const kt* w, const kt* b, float eps) {
  const int64_t rows = x.numel() / x.d[3];
  const int64_t D = x.d[3];
  const int block = D >= 4096 ? 1024 : D >= 1024 ? 512 : D >= 256 ? 256 : D > 32 ? 128 : 32;
  launch_kernel(c, norm_kernel<TI, TO, LAYER>, static_cast<unsigned>(rows), block, 0,
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
  bool done = false;
  switch (static_cast<dtype>(x.t)) {
    case dtype::f32: done = go_vec<float, LAYER>(c, out, x, w, b, eps); break;
    case dtype::f16: done = go_vec<__half, LAYER>(c, out, x, w, b, eps); break;
    default: done = go_vec<__nv_bfloat16, LAYER>(c, out, x, w, b, eps); break;
  }
  if (!done) switch (static_cast<dtype>(x.t)) {
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
