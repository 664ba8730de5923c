#include "gpu/cuda/common.cuh"
#include "gpu/cuda/cuda_check.cuh"
#include "gpu/cuda/softmax.cuh"
#include "gpu/cuda/vec.cuh"

namespace ag::gpu::cuda {

AG_CUDA_MODULE_ANCHOR()
namespace {

template <class TI, class TO>
__global__ void softmax_kernel(kt out, kt x, float scale, bool causal) {
  pdl_enter();
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


// Number of live (unmasked) elements of a row: j < n.
__device__ __forceinline__ int64_t live_count(const kt& x, int64_t row, bool causal) {
  const int64_t Sk = x.d[3];
  if (!causal) return Sk;
  const int64_t Sq = x.d[2];
  int64_t n = row % Sq + (Sk - Sq) + 1;
  if (n < 0) n = 0;
  if (n > Sk) n = Sk;
  return n;
}

// Combines per-thread (max, sum of exp(v - max)) pairs over TPR threads.
template <int TPR>
__device__ __forceinline__ void reduce_ms(float& m, float& s, float* sh) {
  const float M = TPR == 32 ? warp_max(m) : block_max(m, sh);
  const float part = m == -INFINITY ? 0.f : s * __expf(m - M);
  s = TPR == 32 ? warp_sum(part) : block_sum(part, sh);
  m = M;
}

// Fast path: contiguous, aligned rows of whole 8-element chunks that fit in
// registers (one read, one write). Same thread layout as norm_vec_kernel.
// Masked chunks of a causal row are written as zeros without being read.
template <class T, int TPR, int MAXC>
__global__ void __launch_bounds__(TPR == 32 ? 128 : TPR)
    softmax_vec_kernel(kt out, kt x, float scale, bool causal, int64_t rows) {
  pdl_enter();
  constexpr int RPB = TPR == 32 ? 4 : 1;
  __shared__ float sh[32];
  const int lane = TPR == 32 ? static_cast<int>(threadIdx.x & 31) : static_cast<int>(threadIdx.x);
  const int64_t row = static_cast<int64_t>(blockIdx.x) * RPB + (TPR == 32 ? threadIdx.x >> 5 : 0);
  if (row >= rows) return;
  const int C = static_cast<int>(x.d[3] / kChunk);
  const int n = static_cast<int>(live_count(x, row, causal));
  const T* xr = static_cast<const T*>(x.p) + row_offset(x, row);
  T* yr = static_cast<T*>(out.p) + row_offset(out, row);
  float v[MAXC][kChunk];
  float m = -INFINITY;
#pragma unroll
  for (int c = 0; c < MAXC; ++c) {
    const int ch = c * TPR + lane;
    if (ch < C && ch * kChunk < n) {
      load8(xr + ch * kChunk, v[c]);
#pragma unroll
      for (int k = 0; k < kChunk; ++k) {
        v[c][k] = ch * kChunk + k < n ? v[c][k] * scale : -INFINITY;
        m = fmaxf(m, v[c][k]);
      }
    } else {
#pragma unroll
      for (int k = 0; k < kChunk; ++k) v[c][k] = -INFINITY;
    }
  }
  const float M = TPR == 32 ? warp_max(m) : block_max(m, sh);
  float s = 0.f;
  if (M != -INFINITY) {
#pragma unroll
    for (int c = 0; c < MAXC; ++c)
#pragma unroll
      for (int k = 0; k < kChunk; ++k) {
        v[c][k] = expf(v[c][k] - M);  // exp(-inf) = 0 for masked and padding
        s += v[c][k];
      }
  }
  const float total = TPR == 32 ? warp_sum(s) : block_sum(s, sh);
  const float inv = total > 0.f ? 1.f / total : 0.f;
#pragma unroll
  for (int c = 0; c < MAXC; ++c) {
    const int ch = c * TPR + lane;
    if (ch >= C) continue;
    float y[kChunk];
#pragma unroll
    for (int k = 0; k < kChunk; ++k) y[k] = M == -INFINITY ? 0.f : v[c][k] * inv;
    store8(yr + ch * kChunk, y);
  }
}

template <class T, int TPR, int MAXC>
void go_vec_cfg(const launch_ctx& c, const kt& out, const kt& x, float scale, bool causal, int64_t rows) {
  constexpr int RPB = TPR == 32 ? 4 : 1;
  const unsigned grid = static_cast<unsigned>((rows + RPB - 1) / RPB);
  launch_kernel(c, softmax_vec_kernel<T, TPR, MAXC>, grid, TPR * RPB, 0, out, x, scale, causal, rows);
}

// Split-row path for rows too long for registers, or too few rows to fill the
// GPU: grid (splits, rows); pass 1 writes each segment's (max, sum) to scratch,
// pass 2 merges a row's pairs and writes its segment (2 reads, 1 write).
// VEC: rows vectorisable and the segment length a multiple of 8.
constexpr int kSplitThreads = 512;

template <class T, bool VEC>
__device__ __forceinline__ void segment_bounds(const kt& x, int64_t seg, int64_t& lo, int64_t& hi) {
  lo = static_cast<int64_t>(blockIdx.x) * seg;
  hi = lo + seg;
  if (hi > x.d[3]) hi = x.d[3];
}

template <class T, bool VEC>
__global__ void __launch_bounds__(kSplitThreads)
    softmax_split_stats(kt x, float scale, bool causal, int64_t seg, float2* partial) {
  pdl_enter();
  __shared__ float sh[32];
  const int64_t row = blockIdx.y;
  int64_t lo, hi;
  segment_bounds<T, VEC>(x, seg, lo, hi);
  const int64_t n = live_count(x, row, causal);
  if (hi > n) hi = n;
  const T* xr = static_cast<const T*>(x.p) + row_offset(x, row);
  float m = -INFINITY, s = 0.f;
  auto add = [&](float v) {
    if (v > m) {
      s = s * __expf(m - v) + 1.f;
      m = v;
    } else {
      s += __expf(v - m);
    }
  };
  if constexpr (VEC) {
    // lo is a multiple of 8; a partial last chunk (causal n) is read whole but
    // only its live elements count.
    for (int64_t j = lo + threadIdx.x * kChunk; j < hi; j += kSplitThreads * kChunk) {
      float v[kChunk];
      load8(xr + j, v);
#pragma unroll
      for (int k = 0; k < kChunk; ++k)
        if (j + k < hi) add(v[k] * scale);
    }
  } else {
    for (int64_t j = lo + threadIdx.x; j < hi; j += kSplitThreads) add(to_f(xr[j * x.s[3]]) * scale);
  }
  reduce_ms<kSplitThreads>(m, s, sh);
  if (threadIdx.x == 0) partial[row * gridDim.x + blockIdx.x] = make_float2(m, s);
}

template <class T, bool VEC>
__global__ void __launch_bounds__(kSplitThreads)
    softmax_split_write(kt out, kt x, float scale, bool causal, int64_t seg, const float2* partial) {
  pdl_enter();
  __shared__ float sh[32];
  const int64_t row = blockIdx.y;
  // Merge the row's partial pairs (gridDim.x of them).
  float m = -INFINITY, s = 0.f;
  for (unsigned i = threadIdx.x; i < gridDim.x; i += kSplitThreads) {
    const float2 p = partial[row * gridDim.x + i];
    if (p.x == -INFINITY) continue;
    if (p.x > m) {
      s = s * __expf(m - p.x) + p.y;
      m = p.x;
    } else {
      s += p.y * __expf(p.x - m);
    }
  }
  reduce_ms<kSplitThreads>(m, s, sh);
  const float M = m, inv = s > 0.f ? 1.f / s : 0.f;
  int64_t lo, hi;
  segment_bounds<T, VEC>(x, seg, lo, hi);
  const int64_t n = live_count(x, row, causal);
  const T* xr = static_cast<const T*>(x.p) + row_offset(x, row);
  T* yr = static_cast<T*>(out.p) + row_offset(out, row);
  if constexpr (VEC) {
    for (int64_t j = lo + threadIdx.x * kChunk; j < hi; j += kSplitThreads * kChunk) {
      float v[kChunk];
      if (j < n) {
        load8(xr + j, v);
#pragma unroll
        for (int k = 0; k < kChunk; ++k) v[k] = j + k < n ? expf(v[k] * scale - M) * inv : 0.f;
      } else {
#pragma unroll
        for (int k = 0; k < kChunk; ++k) v[k] = 0.f;
      }
      store8(yr + j, v);
    }
  } else {
    for (int64_t j = lo + threadIdx.x; j < hi; j += kSplitThreads) {
      const float v = j < n ? expf(to_f(xr[j * x.s[3]]) * scale - M) * inv : 0.f;
      yr[j * out.s[3]] = from_f<T>(v);
    }
  }
}

template <class T>
error go_split(const launch_ctx& c, const kt& out, const kt& x, float scale, bool causal, bool vec) {
  const int64_t rows = x.numel() / x.d[3];
  const int64_t D = x.d[3];
  // Segments of 8 elements per thread-iteration, at least 4 iterations per
  // thread, and enough blocks for every SM several times over.
  const int64_t min_seg = kSplitThreads * kChunk * 4;
  int64_t splits = (D + min_seg - 1) / min_seg;
  const int64_t want = (static_cast<int64_t>(c.sm_count) * 8 + rows - 1) / rows;
  if (splits > want) splits = want < 1 ? 1 : want;
  if (splits > 65535) splits = 65535;
  int64_t seg = (D + splits - 1) / splits;
  seg = (seg + kChunk - 1) / kChunk * kChunk;
  splits = (D + seg - 1) / seg;
  void* scratch = nullptr;
  AG_CUDA_TRY(cudaMallocAsync(&scratch, static_cast<size_t>(rows * splits) * sizeof(float2), c.stream), c.where);
  const dim3 grid(static_cast<unsigned>(splits), static_cast<unsigned>(rows));
  auto* part = static_cast<float2*>(scratch);
  if (vec) {
    launch_kernel(c, softmax_split_stats<T, true>, grid, kSplitThreads, 0, x, scale, causal, seg, part);
    launch_kernel(c, softmax_split_write<T, true>, grid, kSplitThreads, 0, out, x, scale, causal, seg, part);
  } else {
    launch_kernel(c, softmax_split_stats<T, false>, grid, kSplitThreads, 0, x, scale, causal, seg, part);
    launch_kernel(c, softmax_split_write<T, false>, grid, kSplitThreads, 0, out, x, scale, causal, seg, part);
  }
  const cudaError_t launched = cudaGetLastError();
  AG_CUDA_TRY(cudaFreeAsync(scratch, c.stream), c.where);
  AG_CUDA_TRY(launched, c.where);
  return {};
}

/// Picks the path for same-dtype input and output; false: the general kernel.
template <class T>
bool go_fast(const launch_ctx& c, const kt& out, const kt& x, float scale, bool causal, error& err) {
  if (out.t != x.t) return false;
  const int64_t rows = x.numel() / x.d[3];
  const int64_t D = x.d[3];
  const bool vec = rows_vectorisable(x) && rows_vectorisable(out);
  // Few long rows: one block per row leaves SMs idle; split the rows instead.
  const bool few_rows = rows < static_cast<int64_t>(c.sm_count) * 2 && D >= 16384;
  if (rows <= 65535 && (few_rows || (D > 32768 && (vec || rows < static_cast<int64_t>(c.sm_count) * 8)))) {
    err = go_split<T>(c, out, x, scale, causal, vec);
    return true;
  }
  if (!vec) return false;
  const int64_t C = D / kChunk;
  if (C <= 32) go_vec_cfg<T, 32, 1>(c, out, x, scale, causal, rows);
  else if (C <= 64) go_vec_cfg<T, 32, 2>(c, out, x, scale, causal, rows);
  else if (C <= 128) go_vec_cfg<T, 32, 4>(c, out, x, scale, causal, rows);
  else if (C <= 256) go_vec_cfg<T, 64, 4>(c, out, x, scale, causal, rows);
  else if (C <= 512) go_vec_cfg<T, 128, 4>(c, out, x, scale, causal, rows);
  else if (C <= 1024) go_vec_cfg<T, 256, 4>(c, out, x, scale, causal, rows);
  else if (C <= 2048) go_vec_cfg<T, 512, 4>(c, out, x, scale, causal, rows);
  else if (C <= 4096) go_vec_cfg<T, 512, 8>(c, out, x, scale, causal, rows);
  else return false;
  return true;
}

template <class TI, class TO>
void go(const launch_ctx& c, const kt& out, const kt& x, float scale, bool causal) {
  const int64_t rows = x.numel() / x.d[3];
  const int64_t D = x.d[3];
  const int block = D >= 8192 ? 1024 : D >= 2048 ? 512 : D >= 256 ? 256 : D > 32 ? 128 : 32;
  launch_kernel(c, softmax_kernel<TI, TO>, static_cast<unsigned>(rows), block, 0, out, x, scale, causal);
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
  error err;
  bool done = false;
  switch (static_cast<dtype>(x.t)) {
    case dtype::f32: done = go_fast<float>(c, out, x, scale, causal, err); break;
    case dtype::f16: done = go_fast<__half>(c, out, x, scale, causal, err); break;
    default: done = go_fast<__nv_bfloat16>(c, out, x, scale, causal, err); break;
  }
  if (done) {
    if (err) return err;
    AG_CUDA_TRY_LAUNCH(c.where);
    return {};
  }
  switch (static_cast<dtype>(x.t)) {
    case dtype::f32: go_out<float>(c, out, x, scale, causal); break;
    case dtype::f16: go_out<__half>(c, out, x, scale, causal); break;
    default: go_out<__nv_bfloat16>(c, out, x, scale, causal); break;
  }
  AG_CUDA_TRY_LAUNCH(c.where);
  return {};
}

}  // namespace ag::gpu::cuda
