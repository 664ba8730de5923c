#include "gpu/cuda/attention.cuh"

#include <atomic>

#include "gpu/cuda/common.cuh"
#include "gpu/cuda/cuda_check.cuh"
#include "gpu/cuda/vec.cuh"

namespace ag::gpu::cuda {

AG_CUDA_MODULE_ANCHOR()
namespace {

constexpr int kThreads = 512;
constexpr int64_t kMaxRows = 16, kMaxKeys = 8192, kMaxHead = 256, kMaxScores = 32768;
constexpr int kMaxOrdinals = 64;

// One batch entry (b0, b1) of both attention kernels: its q, k, v and
// output, the flat query row of its m = 0, and the keys its row m sees:
// j < live(m) (softmax row (first_row + m) % S; all keys unless causal).
template <class T>
struct group_view {
  int64_t b0, b1, first_row, keys, S;
  bool causal;
  const T *q, *k, *v;
  __device__ group_view(int64_t group, const kt& qx, const kt& kx, const kt& vx, bool causal_, int64_t S_)
      : b0(group / qx.d[1]), b1(group % qx.d[1]), first_row(group * qx.d[2]), keys(kx.d[2]), S(S_), causal(causal_),
        q(base(qx)), k(base(kx)), v(base(vx)) {}
  __device__ const T* base(const kt& x) const { return static_cast<const T*>(x.p) + b0 * x.s[0] + b1 * x.s[1]; }
  __device__ T* out_base(const kt& o) const { return static_cast<T*>(o.p) + b0 * o.s[0] + b1 * o.s[1]; }
  __device__ int64_t live(int m) const {
    if (!causal) return keys;
    const int64_t n = (first_row + m) % S + (keys - S) + 1;
    return n < 0 ? 0 : (n > keys ? keys : n);
  }
};

// Rows m < M of `sc` (row m at sc + m * stride, n entries) replaced by
// e^(s - max) (0 where s or the max is -inf), a warp per row; row_max[m] and
// row_sum[m] get the row's max and sum (lane 0). The caller syncs after.
__device__ __forceinline__ void softmax_rows_unnormalised(float* sc, int M, int64_t n, int64_t stride,
                                                          float* row_max, float* row_sum) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  for (int m = warp; m < M; m += warps) {
    float* row = sc + m * stride;
    float mx = -INFINITY;
    for (int64_t j = lane; j < n; j += 32) mx = fmaxf(mx, row[j]);
    mx = warp_max(mx);
    float sum = 0.f;
    for (int64_t j = lane; j < n; j += 32) {
      const float e = (mx == -INFINITY || row[j] == -INFINITY) ? 0.f : __expf(row[j] - mx);
      row[j] = e;
      sum += e;
    }
    sum = warp_sum(sum);
    if (lane == 0) row_max[m] = mx, row_sum[m] = sum;
  }
}

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
  pdl_enter();
  extern __shared__ float smem[];
  __shared__ float inv_sum[MR];
  const int M = static_cast<int>(q.d[2]);
  const int64_t dh = q.d[3], keys = k.d[2];
  float* qs = smem;
  float* sc = qs + M * dh;
  float* part = sc + M * keys;
  const group_view<T> gv(blockIdx.x, q, k, v, causal, S);
  const T *qb = gv.q, *kb = gv.k, *vb = gv.v;
  const int64_t first_row = gv.first_row;
  auto live = [&](int m) { return gv.live(m); };
  for (int64_t i = threadIdx.x; i < M * dh; i += blockDim.x)
    qs[i] = to_f(qb[(i / dh) * q.s[2] + (i % dh) * q.s[3]]);
  __syncthreads();
  // 1. scores, (q.k + mask) * scale: the unfused chain's order. A thread per
  // key; its row is read kKeyChunk elements at a time, all loads of a chunk in
  // flight before the arithmetic (a decode step is latency bound).
  constexpr int kKeyChunk = 16;
  for (int64_t j = threadIdx.x; j < keys; j += blockDim.x) {
    const T* kr = kb + j * k.s[2];
    float dot[MR];
#pragma unroll
    for (int m = 0; m < MR; ++m) dot[m] = 0.f;
    for (int64_t d0 = 0; d0 < dh; d0 += kKeyChunk) {
      float kv[kKeyChunk];
#pragma unroll
      for (int u = 0; u < kKeyChunk; ++u) kv[u] = d0 + u < dh ? to_f(kr[(d0 + u) * k.s[3]]) : 0.f;
#pragma unroll
      for (int u = 0; u < kKeyChunk; ++u)
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
  __shared__ float row_max[MR];
  softmax_rows_unnormalised(sc, M, keys, keys, row_max, inv_sum);
  __syncthreads();
  if (threadIdx.x < M) inv_sum[threadIdx.x] = inv_sum[threadIdx.x] > 0.f ? 1.f / inv_sum[threadIdx.x] : 0.f;
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
  T* ob = gv.out_base(out);
  for (int64_t i = threadIdx.x; i < M * dh; i += blockDim.x) {
    const int m = static_cast<int>(i / dh);
    const int64_t e = i % dh;
    float sum = 0.f;
    for (int sh = 0; sh < shares; ++sh) sum += part[(sh * M + m) * dh + e];
    ob[m * out.s[2] + e * out.s[3]] = from_f<T>(sum * inv_sum[m]);
  }
}

// ---- keys split over blocks (flash-decoding) ----------------------------
//
// The kernel above gives a kv head one block: 8 blocks for a LLaMA-1B decode
// step, on 8 of 132 SMs, slower than the four unfused kernels. This one gives
// each (batch entry, share of the keys) a block: grid (groups, splits). A
// block computes its keys' scores for all M query rows, their softmax
// relative to its own maximum, and the weighted sum of its values, writes
// (max, sum, unnormalised sum of values) to the stream's workspace, and the
// last block of a group to finish (a counter per group) combines the splits
// into the output and resets the counter. Needs 16-byte rows (dh a multiple
// of 8 with dh / 8 a power of two up to 32, unit stride along dh, aligned),
// else the kernel above runs.

constexpr int kSplitThreads = 128;
constexpr int kMaxSplits = 32;

struct split_plan {
  int splits = 1;
  int64_t chunk = 0;  // keys per split, a multiple of the keys one pass covers
};

template <class T, int MR>
__global__ void __launch_bounds__(kSplitThreads)
    split_attention_kernel(kt out, kt q, kt k, kt v, kt mask, bool masked, float scale, bool causal, int64_t S,
                           int64_t chunk, float* ws, unsigned* counters) {
  pdl_enter();
  extern __shared__ float smem[];
  __shared__ float row_max[MR], row_sum[MR];
  __shared__ float weight[MR * kMaxSplits], weighted_sum[MR * kMaxSplits];  // the combine's, per (row, split)
  __shared__ bool last_block;
  const int M = static_cast<int>(q.d[2]);
  const int dh = static_cast<int>(q.d[3]);
  const int64_t keys = k.d[2];
  const int splits = static_cast<int>(gridDim.y), split = static_cast<int>(blockIdx.y);
  const int64_t group = blockIdx.x;
  const group_view<T> gv(group, q, k, v, causal, S);
  const T *qb = gv.q, *kb = gv.k, *vb = gv.v;
  const int64_t first_row = gv.first_row;
  auto live = [&](int m) { return gv.live(m); };
  const int64_t j_begin = split * chunk, j_end = j_begin + chunk < keys ? j_begin + chunk : keys;
  const int G = dh / kChunk;                // threads per key row: one 8-element chunk each
  const int per_pass = kSplitThreads / G;   // keys one pass covers
  float* qs = smem;                         // [M][dh]
  float* sc = qs + M * dh;                  // [M][chunk]
  float* acc = sc + M * chunk;              // [M][dh]
  const int part = static_cast<int>(threadIdx.x) % G, slot = static_cast<int>(threadIdx.x) / G;
  for (int i = threadIdx.x; i < M * dh; i += kSplitThreads) {
    qs[i] = to_f(qb[(i / dh) * q.s[2] + (i % dh) * q.s[3]]);
    acc[i] = 0.f;
  }
  __syncthreads();
  // 1. scores: G neighbouring threads read one key row (16 bytes each) and
  // sum their partial dot products with shuffles.
  for (int64_t j0 = j_begin; j0 < j_end; j0 += per_pass) {
    const int64_t j = j0 + slot;
    float kv[kChunk];
    if (j < j_end) load8(kb + j * k.s[2] + part * kChunk, kv);
    else
#pragma unroll
      for (int e = 0; e < kChunk; ++e) kv[e] = 0.f;
#pragma unroll
    for (int m = 0; m < MR; ++m) {
      if (m >= M) break;
      float d = 0.f;
#pragma unroll
      for (int e = 0; e < kChunk; ++e) d = fmaf(qs[m * dh + part * kChunk + e], kv[e], d);
      for (int o = G / 2; o > 0; o >>= 1) d += __shfl_xor_sync(0xffffffffu, d, o);
      if (part == 0 && j < j_end) {
        float s = -INFINITY;
        if (j < live(m)) {
          s = d;
          if (masked) s += to_f(static_cast<const T*>(mask.p)[((first_row + m) % S) * mask.s[2] + j * mask.s[3]]);
          s *= scale;
        }
        sc[m * chunk + (j - j_begin)] = s;
      }
    }
  }
  __syncthreads();
  // 2. each row's maximum over this block's keys, exponentials, their sum.
  const int n_here = static_cast<int>(j_end - j_begin);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  softmax_rows_unnormalised(sc, M, n_here, chunk, row_max, row_sum);
  __syncthreads();
  // 3. sum of p v over this block's keys: thread (slot, part) takes keys
  // slot, slot + per_pass, ... and the 8 dims of its part, for every row.
  {
    float a[MR][kChunk];
#pragma unroll
    for (int m = 0; m < MR; ++m)
#pragma unroll
      for (int e = 0; e < kChunk; ++e) a[m][e] = 0.f;
    for (int j = slot; j < n_here; j += per_pass) {
      float vv[kChunk];
      load8(vb + (j_begin + j) * v.s[2] + part * kChunk, vv);
#pragma unroll
      for (int m = 0; m < MR; ++m) {
        if (m >= M) break;
        const float p = sc[m * chunk + j];
#pragma unroll
        for (int e = 0; e < kChunk; ++e) a[m][e] = fmaf(p, vv[e], a[m][e]);
      }
    }
    // Sum over the slots: first inside each warp (its 32 / G slots, with
    // shuffles), then the warps one after the other. (Shared-memory float
    // atomics from every slot were a compare-and-swap loop under 16-way
    // contention: 43 us a launch, ncu.)
#pragma unroll
    for (int m = 0; m < MR; ++m) {
      if (m >= M) break;
#pragma unroll
      for (int e = 0; e < kChunk; ++e)
        for (int o = G; o < 32; o <<= 1) a[m][e] += __shfl_xor_sync(0xffffffffu, a[m][e], o);
    }
    for (int w = 0; w < kSplitThreads / 32; ++w) {
      if (warp == w && lane < G) {
#pragma unroll
        for (int m = 0; m < MR; ++m) {
          if (m >= M) break;
#pragma unroll
          for (int e = 0; e < kChunk; ++e) acc[m * dh + part * kChunk + e] += a[m][e];
        }
      }
      __syncthreads();
    }
  }
  T* ob = gv.out_base(out);
  if (splits == 1) {
    for (int i = threadIdx.x; i < M * dh; i += kSplitThreads) {
      const int m = i / dh;
      const float inv = row_sum[m] > 0.f ? 1.f / row_sum[m] : 0.f;
      ob[m * out.s[2] + (i % dh) * out.s[3]] = from_f<T>(acc[i] * inv);
    }
    return;
  }
  // 4. this split's part to the workspace: per (group, split) M stats
  // (max, sum) then M x dh sums.
  const int64_t per_split = static_cast<int64_t>(M) * (dh + 2);
  float* mine = ws + (group * splits + split) * per_split;
  for (int i = threadIdx.x; i < M * dh; i += kSplitThreads) mine[2 * M + i] = acc[i];
  if (threadIdx.x < M) mine[2 * threadIdx.x] = row_max[threadIdx.x], mine[2 * threadIdx.x + 1] = row_sum[threadIdx.x];
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0) last_block = atomicAdd(&counters[group], 1u) == static_cast<unsigned>(splits - 1);
  __syncthreads();
  if (!last_block) return;
  __threadfence();
  // 5. the last block combines: out = sum_s w_s acc_s / sum_s w_s sum_s with
  // w_s = e^(max_s - max). The splits' figures are read in parallel into
  // shared memory first, so that the last loop's loads are independent of
  // each other (read one by one, behind a branch each, they made this block
  // a chain of L2 round trips: 50 us a launch).
  const float* all = ws + group * splits * per_split;
  const int ms_count = M * splits;
  for (int i = threadIdx.x; i < ms_count; i += kSplitThreads) {
    const int m = i / splits, s = i % splits;
    weight[i] = __ldcg(all + s * per_split + 2 * m);
    weighted_sum[i] = __ldcg(all + s * per_split + 2 * m + 1);
  }
  __syncthreads();
  if (threadIdx.x < M) {
    float mx = -INFINITY;
    for (int s = 0; s < splits; ++s) mx = fmaxf(mx, weight[threadIdx.x * splits + s]);
    row_max[threadIdx.x] = mx;
  }
  __syncthreads();
  for (int i = threadIdx.x; i < ms_count; i += kSplitThreads) {
    const float mx = row_max[i / splits], ms = weight[i];
    const float w = (mx == -INFINITY || ms == -INFINITY) ? 0.f : __expf(ms - mx);
    weight[i] = w;
    weighted_sum[i] *= w;
  }
  __syncthreads();
  if (threadIdx.x < M) {
    float total = 0.f;
    for (int s = 0; s < splits; ++s) total += weighted_sum[threadIdx.x * splits + s];
    row_sum[threadIdx.x] = total > 0.f ? 1.f / total : 0.f;
  }
  __syncthreads();
  for (int i = threadIdx.x; i < M * dh; i += kSplitThreads) {
    const int m = i / dh;
    const float* w = weight + m * splits;
    const float* src = all + 2 * M + i;
    float sum = 0.f;
#pragma unroll 8
    for (int s = 0; s < splits; ++s) sum = fmaf(__ldcg(src + s * per_split), w[s], sum);
    ob[m * out.s[2] + (i % dh) * out.s[3]] = from_f<T>(sum * row_sum[m]);
  }
  if (threadIdx.x == 0) counters[group] = 0;  // ready for the next launch on this stream
}

// 16-byte key / value / query-free rows: dh / 8 a power of two <= 32, unit
// stride along dh, aligned rows.
bool split_rows_ok(const kt& x) {
  const int64_t dh = x.d[3];
  if (dh % kChunk != 0 || x.s[3] != 1 || !aligned16(x.p)) return false;
  for (int k = 0; k < 3; ++k)
    if (x.d[k] != 1 && x.s[k] % kChunk != 0) return false;
  return true;
}

// Splits for `groups` x `keys`: about two blocks per SM, at least one pass of
// keys per block, within the workspace; splits = 1 needs none.
split_plan plan_splits(const launch_ctx& c, int64_t groups, int64_t M, int64_t dh, int64_t keys) {
  const int64_t per_pass = kSplitThreads / (dh / kChunk);
  // Shared memory (q, sums, scores: f32) within the default 48 KiB with
  // the combine's 4 KiB of static arrays.
  const int64_t max_chunk = (10752 - 2 * M * dh) / M;
  if (max_chunk < per_pass) return {0, 0};
  int64_t splits = (2 * c.sm_count + groups - 1) / groups;
  const int64_t most = (keys + per_pass - 1) / per_pass;
  if (splits > most) splits = most;
  if (splits > kMaxSplits) splits = kMaxSplits;
  if (splits < 1) splits = 1;
  const int64_t per_split = M * (dh + 2);
  if (groups > c.attention_counters || groups * splits * per_split > c.attention_workspace_floats)
    splits = c.attention_workspace_floats / (groups * per_split);
  if (groups > c.attention_counters || splits < 1) splits = 1;
  int64_t chunk = (keys + splits - 1) / splits;
  chunk = (chunk + per_pass - 1) / per_pass * per_pass;
  if (chunk > max_chunk) return {0, 0};  // too many keys for one block's scores
  split_plan p;
  p.splits = static_cast<int>((keys + chunk - 1) / chunk);
  p.chunk = chunk;
  return p;
}

template <class T, int MR>
error go_split(const launch_ctx& c, const kt& out, const kt& q, const kt& k, const kt& v, const kt& mask, bool masked,
               float scale, bool causal, int64_t S, int64_t groups, const split_plan& sp) {
  const int64_t M = q.d[2], dh = q.d[3];
  const std::size_t shared = static_cast<std::size_t>(2 * M * dh + M * sp.chunk) * sizeof(float);
  launch_kernel(c, split_attention_kernel<T, MR>, dim3(static_cast<unsigned>(groups), static_cast<unsigned>(sp.splits)),
                kSplitThreads, shared, out, q, k, v, mask, masked, scale, causal, S, sp.chunk, c.attention_workspace,
                c.attention_counter_words);
  return {};
}

template <class T>
error go_split_rows(const launch_ctx& c, const kt& out, const kt& q, const kt& k, const kt& v, const kt& mask,
                    bool masked, float scale, bool causal, int64_t S, int64_t groups, const split_plan& sp) {
  const int64_t M = q.d[2];
  if (M <= 1) return go_split<T, 1>(c, out, q, k, v, mask, masked, scale, causal, S, groups, sp);
  if (M <= 2) return go_split<T, 2>(c, out, q, k, v, mask, masked, scale, causal, S, groups, sp);
  if (M <= 4) return go_split<T, 4>(c, out, q, k, v, mask, masked, scale, causal, S, groups, sp);
  if (M <= 8) return go_split<T, 8>(c, out, q, k, v, mask, masked, scale, causal, S, groups, sp);
  return go_split<T, kMaxRows>(c, out, q, k, v, mask, masked, scale, causal, S, groups, sp);
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
  launch_kernel(c, fused_attention_kernel<T, MR>, static_cast<unsigned>(groups), kThreads, shared, out, q, k, v, mask,
                masked, scale, causal, S);
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
  const int64_t G = dh / kChunk;
  if (c.attention_workspace && dh % kChunk == 0 && G <= 32 && (G & (G - 1)) == 0 && split_rows_ok(k) &&
      split_rows_ok(v)) {
    const split_plan sp = plan_splits(c, groups, M, dh, keys);
    if (sp.splits > 0) {
      switch (static_cast<dtype>(t)) {
        case dtype::f32: e = go_split_rows<float>(c, out, q, k, v, mk, mask != nullptr, scale, causal, softmax_rows, groups, sp); break;
        case dtype::f16: e = go_split_rows<__half>(c, out, q, k, v, mk, mask != nullptr, scale, causal, softmax_rows, groups, sp); break;
        default: e = go_split_rows<__nv_bfloat16>(c, out, q, k, v, mk, mask != nullptr, scale, causal, softmax_rows, groups, sp); break;
      }
      if (e) return e;
      AG_CUDA_TRY_LAUNCH(c.where);
      return {};
    }
  }
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
