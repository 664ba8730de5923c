#include "gpu/cuda/attention.cuh"

#include <atomic>

#include "gpu/cuda/common.cuh"
#include "gpu/cuda/cuda_check.cuh"

namespace ag::gpu::cuda {
namespace {

constexpr int kThreads = 512;
constexpr int64_t kMaxRows = 16, kMaxKeys = 8192, kMaxHead = 256, kMaxScores = 32768;
constexpr int kMaxOrdinals = 64;

// One block per batch entry (b0, b1) with all its M query rows, so each key
// and value row is read once for all of them (grouped-query attention puts
// a kv head's query heads in M). Phases, each spread over the whole block:
//  1. scores: a thread per key, the M dot products of its key row;
//  2. softmax: a warp per query row (max, exp, sum);
//  3. weighted sum: threads split (output element d, a share of the keys),
//     M accumulators each, then summed over the shares in shared memory.
// Shared memory: q [M][dh], scores [M][keys], the shares' sums [kThreads / dh][M][dh] (f32).
template <class T, int MR>  // MR: rows the loops are unrolled for (M <= MR, the next power of two)
__global__ void __launch_bounds__(kThreads)
    fused_attention_kernel(kt out, kt q, kt k, kt v, kt mask, bool masked, float scale, bool causal, int64_t S) {
  extern __shared__ float smem[];
  __shared__ float inv_sum[MR];
  const int M = static_cast<int>(q.d[2]);
  const int64_t dh = q.d[3], keys = k.d[2];
  float* qs = smem;
  float* sc = qs + M * dh;
  float* part = sc + M * keys;
  const int64_t b1 = blockIdx.x % q.d[1], b0 = blockIdx.x / q.d[1];
  const int64_t first_row = static_cast<int64_t>(blockIdx.x) * M;  // flat query row of m = 0
  const T* qb = static_cast<const T*>(q.p) + b0 * q.s[0] + b1 * q.s[1];
  const T* kb = static_cast<const T*>(k.p) + b0 * k.s[0] + b1 * k.s[1];
  const T* vb = static_cast<const T*>(v.p) + b0 * v.s[0] + b1 * v.s[1];
  // Keys row m sees: j < live(m) (softmax row (first_row + m) % S).
  auto live = [&](int m) -> int64_t {
    if (!causal) return keys;
    const int64_t n = (first_row + m) % S + (keys - S) + 1;
    return n < 0 ? 0 : (n > keys ? keys : n);
  };
  for (int64_t i = threadIdx.x; i < M * dh; i += blockDim.x)
    qs[i] = to_f(qb[(i / dh) * q.s[2] + (i % dh) * q.s[3]]);
  __syncthreads();
  // 1. scores, (q.k + mask) * scale: the unfused chain's order. A thread per
  // key; its row is read kChunk elements at a time, all loads of a chunk in
  // flight before the arithmetic (a decode step is latency bound).
  constexpr int kChunk = 16;
  for (int64_t j = threadIdx.x; j < keys; j += blockDim.x) {
    const T* kr = kb + j * k.s[2];
    float dot[MR];
#pragma unroll
    for (int m = 0; m < MR; ++m) dot[m] = 0.f;
    for (int64_t d0 = 0; d0 < dh; d0 += kChunk) {
      float kv[kChunk];
#pragma unroll
      for (int u = 0; u < kChunk; ++u) kv[u] = d0 + u < dh ? to_f(kr[(d0 + u) * k.s[3]]) : 0.f;
#pragma unroll
      for (int u = 0; u < kChunk; ++u)
        if (d0 + u < dh)
#pragma unroll
          for (int m = 0; m < MR; ++m)
            if (m < M) dot[m] += qs[m * dh + d0 + u] * kv[u];
    }
    // Loops over m unrolled to MR (a template argument: exact for M a power
    // of two) with a guard: they stay in registers, and a decode step's 4
    // rows run 4 multiply-adds, not 16 mostly predicated off (measured: a
    // 16-row unroll made the kernel 99 us on an H100, instruction bound).
#pragma unroll
    for (int m = 0; m < MR; ++m) {
      if (m >= M) continue;
      float s = -INFINITY;
      if (j < live(m)) {
        s = dot[m];
        if (masked) s += to_f(static_cast<const T*>(mask.p)[((first_row + m) % S) * mask.s[2] + j * mask.s[3]]);
        s *= scale;
      }
      sc[m * keys + j] = s;
    }
  }
  __syncthreads();
  // 2. softmax of each row: probabilities unnormalised, 1 / sum kept.
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  for (int m = warp; m < M; m += warps) {
    float* row = sc + m * keys;
    float mx = -INFINITY;
    for (int64_t j = lane; j < keys; j += 32) mx = fmaxf(mx, row[j]);
    mx = warp_max(mx);
    float sum = 0.f;
    for (int64_t j = lane; j < keys; j += 32) {
      const float e = (mx == -INFINITY || row[j] == -INFINITY) ? 0.f : __expf(row[j] - mx);
      row[j] = e;
      sum += e;
    }
    sum = warp_sum(sum);
    if (lane == 0) inv_sum[m] = sum > 0.f ? 1.f / sum : 0.f;
  }
  __syncthreads();
  // 3. out[m][d] = sum_j p[m][j] v[j][d] / sum[m] (dh <= kThreads: checked).
  const int shares = static_cast<int>(kThreads / dh);
  const int share = static_cast<int>(threadIdx.x / dh);
  const int64_t d = threadIdx.x % dh;
  if (share < shares) {
    float acc[MR];
#pragma unroll
    for (int m = 0; m < MR; ++m) acc[m] = 0.f;
    // kUnroll keys' loads in flight at a time.
    constexpr int kUnroll = 8;
    for (int64_t j0 = share; j0 < keys; j0 += static_cast<int64_t>(shares) * kUnroll) {
      float vv[kUnroll];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const int64_t j = j0 + static_cast<int64_t>(u) * shares;
        vv[u] = j < keys ? to_f(vb[j * v.s[2] + d * v.s[3]]) : 0.f;
      }
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const int64_t j = j0 + static_cast<int64_t>(u) * shares;
        if (j < keys)
#pragma unroll
          for (int m = 0; m < MR; ++m)
            if (m < M) acc[m] += sc[m * keys + j] * vv[u];
      }
    }
#pragma unroll
    for (int m = 0; m < MR; ++m)
      if (m < M) part[(share * M + m) * dh + d] = acc[m];
  }
  __syncthreads();
  T* ob = static_cast<T*>(out.p) + b0 * out.s[0] + b1 * out.s[1];
  for (int64_t i = threadIdx.x; i < M * dh; i += blockDim.x) {
    const int m = static_cast<int>(i / dh);
    const int64_t e = i % dh;
    float sum = 0.f;
    for (int sh = 0; sh < shares; ++sh) sum += part[(sh * M + m) * dh + e];
    ob[m * out.s[2] + e * out.s[3]] = from_f<T>(sum * inv_sum[m]);
  }
}

std::size_t shared_bytes(int64_t M, int64_t dh, int64_t keys) {
  return static_cast<std::size_t>(M * dh + M * keys + kThreads * M) * sizeof(float);
}

// Lets the kernel use more than 48 KiB of shared memory, once per device.
template <class T, int MR>
cudaError_t allow_shared(std::size_t bytes) {
  static std::atomic<bool> done[kMaxOrdinals];
  if (bytes <= 48 * 1024) return cudaSuccess;
  int dev = 0;
  if (cudaError_t r = cudaGetDevice(&dev); r != cudaSuccess) return r;
  if (dev >= 0 && dev < kMaxOrdinals && done[dev].load(std::memory_order_acquire)) return cudaSuccess;
  const cudaError_t r = cudaFuncSetAttribute(fused_attention_kernel<T, MR>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                             static_cast<int>(shared_bytes(kMaxRows, kMaxHead, kMaxScores / kMaxRows)));
  if (r == cudaSuccess && dev >= 0 && dev < kMaxOrdinals) done[dev].store(true, std::memory_order_release);
  return r;
}

template <class T, int MR>
error go_rows(const launch_ctx& c, const kt& out, const kt& q, const kt& k, const kt& v, const kt& mask, bool masked,
              float scale, bool causal, int64_t S, int64_t groups) {
  const std::size_t shared = shared_bytes(q.d[2], q.d[3], k.d[2]);
  AG_CUDA_TRY((allow_shared<T, MR>(shared)), c.where + " (shared memory for fused attention)");
  fused_attention_kernel<T, MR><<<static_cast<unsigned>(groups), kThreads, shared, c.stream>>>(out, q, k, v, mask, masked,
                                                                                              scale, causal, S);
  return {};
}

template <class T>
error go(const launch_ctx& c, const kt& out, const kt& q, const kt& k, const kt& v, const kt& mask, bool masked,
         float scale, bool causal, int64_t S, int64_t groups) {
  const int64_t M = q.d[2];
  if (M <= 1) return go_rows<T, 1>(c, out, q, k, v, mask, masked, scale, causal, S, groups);
  if (M <= 2) return go_rows<T, 2>(c, out, q, k, v, mask, masked, scale, causal, S, groups);
  if (M <= 4) return go_rows<T, 4>(c, out, q, k, v, mask, masked, scale, causal, S, groups);
  if (M <= 8) return go_rows<T, 8>(c, out, q, k, v, mask, masked, scale, causal, S, groups);
  return go_rows<T, kMaxRows>(c, out, q, k, v, mask, masked, scale, causal, S, groups);
}

}  // namespace

error launch_fused_attention(const launch_ctx& c, const kt& out, const kt& q, const kt& k, const kt& v,
                             const kt* mask, float scale, bool causal, int64_t softmax_rows) {
  const int64_t groups = q.d[0] * q.d[1];
  if (groups * q.d[2] == 0) return {};
  const int t = q.t;
  if (k.t != t || v.t != t || out.t != t || (mask && mask->t != t))
    return error(errc::dtype_mismatch, c.where + ": fused attention needs one dtype for q, k, v, mask and output");
  if (t != static_cast<int>(dtype::f32) && t != static_cast<int>(dtype::f16) && t != static_cast<int>(dtype::bf16))
    return error(errc::dtype_mismatch, c.where + ": fused attention needs f32, f16 or bf16");
  const int64_t M = q.d[2], dh = q.d[3], keys = k.d[2];
  if (M > kMaxRows || keys < 1 || keys > kMaxKeys || M * keys > kMaxScores || dh > kMaxHead || k.d[3] != dh ||
      v.d[3] != dh || v.d[2] != keys || out.d[2] != M || out.d[3] != dh || softmax_rows < 1 || M % softmax_rows != 0 ||
      (mask && (mask->d[2] != softmax_rows || mask->d[3] != keys)))
    return error(errc::invalid_shape, c.where + ": fused attention shapes out of its limits (rows " +
                                          std::to_string(M) + ", keys " + std::to_string(keys) + ", head " +
                                          std::to_string(dh) + ")");
  for (int i = 0; i < 2; ++i)
    if (k.d[i] != q.d[i] || v.d[i] != q.d[i] || out.d[i] != q.d[i])
      return error(errc::invalid_shape, c.where + ": fused attention needs equal batch dims");
  if (groups > 0x7fffffffLL) return error(errc::invalid_shape, c.where + ": too many batch entries");
  const kt none{};
  const kt& mk = mask ? *mask : none;
  error e;
  switch (static_cast<dtype>(t)) {
    case dtype::f32: e = go<float>(c, out, q, k, v, mk, mask != nullptr, scale, causal, softmax_rows, groups); break;
    case dtype::f16: e = go<__half>(c, out, q, k, v, mk, mask != nullptr, scale, causal, softmax_rows, groups); break;
    default: e = go<__nv_bfloat16>(c, out, q, k, v, mk, mask != nullptr, scale, causal, softmax_rows, groups); break;
  }
  if (e) return e;
  AG_CUDA_TRY_LAUNCH(c.where);
  return {};
}

}  // namespace ag::gpu::cuda
