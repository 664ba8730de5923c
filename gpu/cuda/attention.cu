#include "gpu/cuda/attention.cuh"

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cuda/atomic>
#include <string>

#include "gpu/cuda/common.cuh"
#include "gpu/cuda/cuda_check.cuh"
#include "gpu/cuda/flash_attention.cuh"
#include "gpu/cuda/mask_visibility.cuh"
#include "gpu/cuda/rope.cuh"
#include "gpu/cuda/vec.cuh"
#include "graph/attention_mask.hpp"

namespace ag::gpu::cuda {

AG_CUDA_MODULE_ANCHOR()
namespace {

constexpr int kThreads = 512;
constexpr int64_t kMaxRows = 16, kMaxKeys = 8192, kMaxHead = 256, kMaxScores = 32768;
// The split kernel's most query rows a block (graph/fusion.hpp's
// fused_attention_split_max_rows): up to kMaxRows softmax rows of several heads.
constexpr int64_t kSplitMaxRows = 64;

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
// into the output and resets the counter.
//
// A decode step's attention is latency bound: a block has a few KiB to read
// and one warp per scheduler, so every instruction of a thread's chain
// waits for the one before. Layout for short chains: a warp per query row,
// a lane per key (rounds of 32 keys, staged with the values in shared
// memory): a lane computes its key's whole score, the row's softmax is two
// warp reductions, and for the weighted sum a lane owns dh / 32 of the
// row's output dims, with no reduction across threads. (The version before,
// eight threads per key and a cross-thread sum of every output, ran about
// 2,000 instructions per warp at 9 cycles each, ncu: 13.8 us a LLaMA-1B
// layer against 9.3 for the four unfused kernels, docs/BENCHMARKS.md.)
// Needs dh = 32, 64, 128 or 256 and 16-byte key and value rows (unit stride
// along dh, aligned), else the kernel above runs.

constexpr int kSplitThreads = 128;
constexpr int kSplitWarps = kSplitThreads / 32;
constexpr int kRoundKeys = 32;  // keys of one round: a lane each
constexpr int kMaxSplits = 32;

struct split_plan {
  int splits = 1;
  int64_t chunk = 0;         // keys per split, a multiple of kRoundKeys
  bool rows_apart = false;   // a group a softmax row (launch_fused_attention's views)
};

// The split kernel looks for the keys its mask hides only over this many
// keys or more: below it the mask's scan would save less than it costs.
constexpr int64_t kTrimKeys = 1024;

// A scan of the mask by a block's threads: the first visible key, one past
// the last, and two sets of mask rows (bit r: row r) that have one.
struct mask_scan {
  unsigned first = 0xffffffffu, last = 0u, rows_a = 0u, rows_b = 0u;
};
// The block's scan in every thread (its threads' scans folded; a barrier).
__device__ __forceinline__ void fold_block(mask_scan& m, mask_scan* per_warp) {
  m.first = __reduce_min_sync(0xffffffffu, m.first);
  m.last = __reduce_max_sync(0xffffffffu, m.last);
  m.rows_a = __reduce_or_sync(0xffffffffu, m.rows_a);
  m.rows_b = __reduce_or_sync(0xffffffffu, m.rows_b);
  if ((threadIdx.x & 31) == 0) per_warp[threadIdx.x >> 5] = m;
  __syncthreads();
#pragma unroll
  for (int w = 0; w < kSplitWarps; ++w) {
    const mask_scan o = per_warp[w];
    m.first = min(m.first, o.first), m.last = max(m.last, o.last), m.rows_a |= o.rows_a, m.rows_b |= o.rows_b;
  }
}

// The keys [lo, hi) from the first to the last that one of the mask rows a
// block's M query rows use (rows (first_row + m) % S) leaves visible (above
// attention_hidden_limit, graph/attention_mask.hpp), in every thread of the
// block; [0, keys) when some row hides all its keys. A generator's mask
// hides its cache's rows past the sequence (or a ring's unfilled ones): the
// splits then share out only the rows it holds, so a sequence of 512 tokens
// in a cache of 16,384 reads 512 rows a layer, not 16,384. The mask has no
// batch index, so every block of the grid finds the same range.
// `seeing`: the rows (bit r: row r) with a visible key; a row of them skips
// the rounds of keys it sees none of (a batched decode step's rows, each a
// sequence whose keys are its own lane of the cache: generator.hpp's
// decode_batch).
//
// First the two ends: a 16-byte vector a thread at each end of every row.
// When every row sees a key in both, they hold the first and the last
// visible keys and the scan is done. Otherwise the whole rows, tested a
// word at a time (a compare per two bf16 values), the place of a visible
// value worked out only for a thread's first and last such vector of a
// row. What it costs (H200, LLaMA-1B, a cache of 16,384 rows, session 66):
// full, 1.228 ms a token against 1.175 without the scan, the same as when
// every block read the whole mask (1.235): the price is the round trip and
// the barrier the first round's loads now wait for, not the reading; with
// 512 tokens in it, 0.83-0.84 against 1.175.
template <class T>
__device__ void visible_keys(const kt& mask, int64_t first_row, int rows, int64_t S, int64_t keys, int64_t& lo,
                             int64_t& hi, unsigned& seeing) {
  constexpr int E = 16 / sizeof(T);
  constexpr int kInFlight = 16;  // vector loads a thread has in flight at once: 16,384 bf16 keys in one go
  __shared__ mask_scan per_warp[kSplitWarps];
  const unsigned every_row = rows >= 32 ? 0xffffffffu : (1u << rows) - 1u;
  const auto row_of = [&](int r) { return static_cast<const T*>(mask.p) + ((first_row + r) % S) * mask.s[2]; };
  const auto lanes_of = [](const uint4& x, uint32_t (&v)[4]) {
    v[0] = visible_lanes<T>(x.x), v[1] = visible_lanes<T>(x.y), v[2] = visible_lanes<T>(x.z), v[3] = visible_lanes<T>(x.w);
    return (v[0] | v[1] | v[2] | v[3]) != 0u;
  };
  const bool vectors = mask.s[3] == 1 && (reinterpret_cast<uintptr_t>(mask.p) & 15) == 0 &&
                       (rows == 1 || (mask.s[2] * static_cast<int64_t>(sizeof(T))) % 16 == 0);
  const int64_t vecs = vectors ? keys / E : 0;
  if (vectors && keys % E == 0 && vecs >= 2 * kSplitThreads) {
    mask_scan ends;  // rows_a: a visible key at the start; rows_b: at the end
    const int64_t head = threadIdx.x, tail = vecs - 1 - threadIdx.x;
    for (int r = 0; r < rows; ++r) {
      const T* row = row_of(r);
      const uint4 hx = *reinterpret_cast<const uint4*>(row + head * E);
      const uint4 tx = *reinterpret_cast<const uint4*>(row + tail * E);
      uint32_t v[4];
      if (lanes_of(hx, v)) ends.first = min(ends.first, static_cast<unsigned>(head * E + first_visible_in<T>(v))), ends.rows_a |= 1u << r;
      if (lanes_of(tx, v)) ends.last = max(ends.last, static_cast<unsigned>(tail * E + visible_end_in<T>(v))), ends.rows_b |= 1u << r;
    }
    fold_block(ends, per_warp);
    if (ends.rows_a == every_row && ends.rows_b == every_row) {
      lo = ends.first, hi = ends.last;
      seeing = every_row;
      return;
    }
    __syncthreads();  // every thread has read per_warp before the whole scan writes it
  }
  mask_scan all;  // rows_a: rows with a visible key
  for (int r = 0; r < rows; ++r) {
    const T* row = row_of(r);
    int64_t last_vec = -1;  // the thread's last vector with a visible value, and its lanes
    uint32_t last_lanes[4] = {0u, 0u, 0u, 0u};
    for (int64_t i0 = threadIdx.x; i0 < vecs; i0 += kInFlight * kSplitThreads) {
      uint4 x[kInFlight];
#pragma unroll
      for (int u = 0; u < kInFlight; ++u) {
        const int64_t i = i0 + u * kSplitThreads;
        if (i < vecs) x[u] = *reinterpret_cast<const uint4*>(row + i * E);
      }
#pragma unroll
      for (int u = 0; u < kInFlight; ++u) {
        const int64_t i = i0 + u * kSplitThreads;
        if (i >= vecs) break;
        uint32_t v[4];
        if (lanes_of(x[u], v)) {
          if (static_cast<unsigned>(i * E) < all.first)
            all.first = min(all.first, static_cast<unsigned>(i * E + first_visible_in<T>(v)));
          last_vec = i;
#pragma unroll
          for (int k = 0; k < 4; ++k) last_lanes[k] = v[k];
        }
      }
    }
    if (last_vec >= 0) {
      all.last = max(all.last, static_cast<unsigned>(last_vec * E + visible_end_in<T>(last_lanes)));
      all.rows_a |= 1u << r;
    }
    for (int64_t j = vecs * E + threadIdx.x; j < keys; j += kSplitThreads)
      if (to_f(row[j * mask.s[3]]) > attention_hidden_limit) {
        all.first = min(all.first, static_cast<unsigned>(j)), all.last = max(all.last, static_cast<unsigned>(j + 1));
        all.rows_a |= 1u << r;
      }
  }
  fold_block(all, per_warp);
  lo = all.rows_a == every_row ? all.first : 0;
  hi = all.rows_a == every_row ? all.last : keys;
  seeing = all.rows_a;
}

// Dynamic shared memory of the split kernel: q rows (f32), one round's key
// rows (padded) and value rows.
template <class T>
constexpr std::size_t split_key_stride(int dh) {
  return static_cast<std::size_t>(dh) + 16 / sizeof(T);  // an odd number of 16-byte units: no bank conflicts
}
template <class T>
std::size_t split_shared_bytes(int64_t M, int dh, int64_t new_rows) {
  return static_cast<std::size_t>(M * dh) * sizeof(float) +
         kRoundKeys * (split_key_stride<T>(dh) + static_cast<std::size_t>(dh)) * sizeof(T) +
         2 * static_cast<std::size_t>(new_rows * dh) * sizeof(float);
}

// A cache prologue (attention.cuh, attention_prologue) as the split kernel
// takes it: rows S = the softmax rows; inv: rope_inverse_frequencies.
constexpr int kMaxRopePairs = 128;
constexpr int kMaxNewRows = 16;  // graph/fusion.hpp's fused_attention_max_new_rows
struct split_prologue {
  bool on = false, rope_q = false, rope_k = false;
  // The kernel before this one does not write k, v or the mask
  // (launch_ctx::settled_inputs): the first round of keys and values is
  // loaded before the PDL wait, beside that kernel's tail. In a decode step
  // they are the KV cache, which only this kernel's prologue writes.
  bool cache_settled = false;
  kt k_new, v_new, cache_positions, rope_positions;
  double inv[kMaxRopePairs];
};

// Rotates the pair (x[k], x[k + half]) by position `pos` (neox), rounded to
// T as the rope op's output is: gpu/cuda/rope.cu's arithmetic.
template <class T>
__device__ __forceinline__ void rotate_rounded(float* x, int k, int half, int32_t pos, double inv) {
  float fs, fc;
  rope_sincos(static_cast<double>(pos), inv, fs, fc);
  const float a = x[k], b = x[k + half];
  x[k] = to_f(from_f<T>(a * fc - b * fs));
  x[k + half] = to_f(from_f<T>(a * fs + b * fc));
}

// DPL: head dims per lane (dh = 32 DPL); RPW: query rows per warp the loops
// are unrolled for (M <= kSplitWarps RPW; warp w takes rows w, w + 4, ...).
template <class T, int DPL, int RPW>
__global__ void __launch_bounds__(kSplitThreads)
    split_attention_kernel(kt out, kt q, kt k, kt v, kt mask, bool masked, float scale, bool causal, int64_t S,
                           int64_t chunk, float* ws, unsigned* counters, bool rows_apart, split_prologue pro) {
  constexpr int dh = 32 * DPL;
  constexpr int E = 16 / sizeof(T);                       // elements per 16-byte vector
  constexpr int kVecs = dh / E;                           // vectors per key row
  constexpr int kStride = static_cast<int>(split_key_stride<T>(dh));
  constexpr int kLoads = kRoundKeys * kVecs / kSplitThreads;  // vectors of K (and of V) per thread per round
  static_assert(kRoundKeys * kVecs % kSplitThreads == 0, "whole vectors per thread");
  if (!pro.cache_settled) pdl_enter();
  extern __shared__ __align__(16) unsigned char split_smem[];
  __shared__ __align__(16) float ps[kSplitWarps][kRoundKeys];
  __shared__ bool last_block;
  const int M = static_cast<int>(q.d[2]);
  const int64_t keys = k.d[2];
  const int splits = static_cast<int>(gridDim.y), split = static_cast<int>(blockIdx.y);
  const int64_t group = blockIdx.x;
  const group_view<T> gv(group, q, k, v, causal, S);
  const T *qb = gv.q, *kb = gv.k, *vb = gv.v;
  // Rows apart (launch_fused_attention): the group is one softmax row's
  // query heads (S = 1 here), row gv.b1 of the mask, of the cache and rope
  // positions.
  const int64_t row0 = rows_apart ? gv.b1 : 0;
  kt mrow = mask;
  if (rows_apart) mrow.p = static_cast<T*>(mask.p) + row0 * mask.s[2];
  const int lane = static_cast<int>(threadIdx.x & 31), warp = static_cast<int>(threadIdx.x >> 5);
  float* qs = reinterpret_cast<float*>(split_smem);  // [M][dh]
  T* ks = reinterpret_cast<T*>(qs + M * dh);         // [kRoundKeys][kStride]
  T* vs = ks + kRoundKeys * kStride;                 // [kRoundKeys][dh]
  // The split's keys [j_begin, j_end): a share of those the mask leaves
  // visible when the cache is long (visible_keys), else the plan's chunk.
  int64_t j_begin = split * chunk, j_end = j_begin + chunk < keys ? j_begin + chunk : keys;
  // Mask rows (bit m % S of query row m, S <= 32) that see some key: such a
  // row skips a round whose keys it sees none of, with exactly what those
  // keys would add (their weights are 0 beside a visible key's in f32).
  unsigned seeing = 0u;
  if (masked && keys >= kTrimKeys) {
    int64_t lo, hi;
    visible_keys<T>(mrow, gv.first_row, M < S ? M : static_cast<int>(S), S, keys, lo, hi, seeing);
    if (S > 32) seeing = 0u;
    const int64_t share = ((hi - lo + splits - 1) / splits + kRoundKeys - 1) / kRoundKeys * kRoundKeys;
    j_begin = min(hi, lo + split * share);
    j_end = min(hi, j_begin + share);
  }
  // The mask row of query row m (rows repeat every S), its first key.
  const auto mask_at = [&](int m, int64_t j) {
    return to_f(static_cast<const T*>(mrow.p)[((gv.first_row + m) % S) * mask.s[2] + j * mask.s[3]]);
  };
  // One round: this thread's vectors of the key and value rows j0.. (zeros
  // past the split's end) and, per row it scores, the mask at its key.
  uint4 kx[kLoads], vx[kLoads];
  float mk[RPW];
  const auto load_round = [&](int64_t j0) {
#pragma unroll
    for (int u = 0; u < kLoads; ++u) {
      const int i = static_cast<int>(threadIdx.x) + u * kSplitThreads;
      const int64_t j = j0 + i / kVecs;
      kx[u] = vx[u] = make_uint4(0, 0, 0, 0);
      if (j < j_end) {
        kx[u] = *reinterpret_cast<const uint4*>(kb + j * k.s[2] + (i % kVecs) * E);
        vx[u] = *reinterpret_cast<const uint4*>(vb + j * v.s[2] + (i % kVecs) * E);
      }
    }
#pragma unroll
    for (int rr = 0; rr < RPW; ++rr) {
      const int m = warp + rr * kSplitWarps;
      mk[rr] = masked && m < M && j0 + lane < j_end ? mask_at(m, j0 + lane) : 0.f;
    }
  };
  const auto store_round = [&] {
#pragma unroll
    for (int u = 0; u < kLoads; ++u) {
      const int i = static_cast<int>(threadIdx.x) + u * kSplitThreads;
      *reinterpret_cast<uint4*>(ks + (i / kVecs) * kStride + (i % kVecs) * E) = kx[u];
      *reinterpret_cast<uint4*>(vs + (i / kVecs) * dh + (i % kVecs) * E) = vx[u];
    }
  };
  // The prologue's new rows [S][dh] (as T; rotated in place), after the round's rows.
  float* knew = reinterpret_cast<float*>(vs + kRoundKeys * dh);
  float* vnew = knew + (pro.on ? S * dh : 0);
  __shared__ int32_t cache_row[kMaxNewRows];
  const int n_new = pro.on ? static_cast<int>(S) : 0;
  // The first round's loads, q's and the prologue's in flight together
  // (the round's before the PDL wait when the cache is settled).
  load_round(j_begin);
  if (pro.cache_settled) pdl_enter();
  for (int i = threadIdx.x; i < M * dh; i += kSplitThreads) qs[i] = to_f(qb[(i / dh) * q.s[2] + (i % dh) * q.s[3]]);
  if (pro.on) {
    const T* kn = static_cast<const T*>(pro.k_new.p) + gv.b0 * pro.k_new.s[0] + gv.b1 * pro.k_new.s[1];
    const T* vn = static_cast<const T*>(pro.v_new.p) + gv.b0 * pro.v_new.s[0] + gv.b1 * pro.v_new.s[1];
    for (int i = threadIdx.x; i < n_new * dh; i += kSplitThreads) {
      knew[i] = to_f(kn[(i / dh) * pro.k_new.s[2] + (i % dh) * pro.k_new.s[3]]);
      vnew[i] = to_f(vn[(i / dh) * pro.v_new.s[2] + (i % dh) * pro.v_new.s[3]]);
    }
    if (threadIdx.x < n_new) {
      // A row stored twice keeps the later (store_rows' order): the earlier is dropped.
      const auto* cache_pos = static_cast<const int32_t*>(pro.cache_positions.p) + row0 * pro.cache_positions.s[3];
      int32_t at = cache_pos[threadIdx.x * pro.cache_positions.s[3]];
      for (int later = threadIdx.x + 1; later < n_new; ++later)
        if (cache_pos[later * pro.cache_positions.s[3]] == at) at = -1;
      cache_row[threadIdx.x] = at < 0 || at >= keys ? -1 : at;
    }
    if (pro.rope_q || pro.rope_k) {
      __syncthreads();
      constexpr int half = dh / 2;
      const auto pos_of = [&](int64_t s) {
        return static_cast<const int32_t*>(pro.rope_positions.p)[(row0 + s) * pro.rope_positions.s[3]];
      };
      if (pro.rope_q)
        for (int i = threadIdx.x; i < M * half; i += kSplitThreads) {
          const int m = i / half, kk = i % half;
          rotate_rounded<T>(qs + m * dh, kk, half, pos_of((gv.first_row + m) % S), pro.inv[kk]);
        }
      if (pro.rope_k)
        for (int i = threadIdx.x; i < n_new * half; i += kSplitThreads) {
          const int r = i / half, kk = i % half;
          rotate_rounded<T>(knew + r * dh, kk, half, pos_of(r), pro.inv[kk]);
        }
    }
    __syncthreads();
    // One block of the group stores the new rows into the caches; every
    // block reads them from shared memory where a round meets them.
    if (split == 0)
      for (int i = threadIdx.x; i < n_new * dh; i += kSplitThreads) {
        const int r = i / dh, d = i % dh;
        if (cache_row[r] < 0) continue;
        T* kc = const_cast<T*>(kb) + cache_row[r] * k.s[2] + d * k.s[3];
        T* vc = const_cast<T*>(vb) + cache_row[r] * v.s[2] + d * v.s[3];
        *kc = from_f<T>(knew[i]);
        *vc = from_f<T>(vnew[i]);
      }
  }
  store_round();
  // The new rows in place of the round's cache rows at their positions.
  const auto substitute = [&](int64_t j0) {
    if (!pro.on) return;
    __syncthreads();
    for (int i = threadIdx.x; i < n_new * dh; i += kSplitThreads) {
      const int r = i / dh, d = i % dh;
      const int64_t j = cache_row[r];
      if (j < j0 || j >= j0 + kRoundKeys || j >= j_end) continue;
      ks[(j - j0) * kStride + d] = from_f<T>(knew[i]);
      vs[(j - j0) * dh + d] = from_f<T>(vnew[i]);
    }
  };
  substitute(j_begin);
  float acc[RPW][DPL], run_max[RPW], run_sum[RPW];
#pragma unroll
  for (int rr = 0; rr < RPW; ++rr) {
    run_max[rr] = -INFINITY, run_sum[rr] = 0.f;
#pragma unroll
    for (int e = 0; e < DPL; ++e) acc[rr][e] = 0.f;
  }
  for (int64_t j0 = j_begin; j0 < j_end; j0 += kRoundKeys) {
    if (j0 != j_begin) {
      load_round(j0);
      __syncthreads();  // every warp is done with the last round's rows
      store_round();
      substitute(j0);
    }
    __syncthreads();
    const int64_t j = j0 + lane;
#pragma unroll
    for (int rr = 0; rr < RPW; ++rr) {
      const int m = warp + rr * kSplitWarps;
      if (m >= M) break;  // the same for the whole warp
      if ((seeing >> (m % S)) & 1u) {
        // A row that sees keys elsewhere skips a round it sees none of (the
        // same for the whole warp).
        if (!__any_sync(0xffffffffu, j < j_end && mk[rr] > attention_hidden_limit)) continue;
      }
      // Lane's key: (q.k + mask) * scale, the unfused chain's order.
      const T* kr = ks + lane * kStride;
      const float* qr = qs + m * dh;
      float d0 = 0.f, d1 = 0.f;
#pragma unroll
      for (int c = 0; c < dh / kChunk; ++c) {
        float kf[kChunk];
        load8(kr + c * kChunk, kf);  // rows of ks start 16-byte aligned (kStride)
#pragma unroll
        for (int e = 0; e < kChunk; e += 2) {
          d0 = fmaf(qr[c * kChunk + e], kf[e], d0);
          d1 = fmaf(qr[c * kChunk + e + 1], kf[e + 1], d1);
        }
      }
      float s = -INFINITY;
      if (j < j_end && j < gv.live(m)) s = (masked ? d0 + d1 + mk[rr] : d0 + d1) * scale;
      // The row's running softmax over the rounds so far.
      const float new_max = fmaxf(run_max[rr], warp_max(s));
      const float p = s == -INFINITY ? 0.f : __expf(s - new_max);
      const float corr = run_max[rr] == -INFINITY ? 0.f : __expf(run_max[rr] - new_max);
      run_sum[rr] = run_sum[rr] * corr + warp_sum(p);
      run_max[rr] = new_max;
      ps[warp][lane] = p;
      __syncwarp();
      // The lane's DPL output dims: sum over the round's keys of p v.
      float a[DPL];
#pragma unroll
      for (int e = 0; e < DPL; ++e) a[e] = acc[rr][e] * corr;
#pragma unroll
      for (int jj = 0; jj < kRoundKeys; jj += 4) {
        const float4 p4 = *reinterpret_cast<const float4*>(&ps[warp][jj]);
        const float pk[4] = {p4.x, p4.y, p4.z, p4.w};
#pragma unroll
        for (int t = 0; t < 4; ++t) {
          const T* vr = vs + (jj + t) * dh + lane * DPL;
#pragma unroll
          for (int e = 0; e < DPL; ++e) a[e] = fmaf(pk[t], to_f(vr[e]), a[e]);
        }
      }
#pragma unroll
      for (int e = 0; e < DPL; ++e) acc[rr][e] = a[e];
      __syncwarp();  // ps is the next row's
    }
  }
  T* ob = gv.out_base(out);
  if (splits == 1) {
#pragma unroll
    for (int rr = 0; rr < RPW; ++rr) {
      const int m = warp + rr * kSplitWarps;
      if (m >= M) break;
      const float inv = run_sum[rr] > 0.f ? 1.f / run_sum[rr] : 0.f;
#pragma unroll
      for (int e = 0; e < DPL; ++e) ob[m * out.s[2] + (lane * DPL + e) * out.s[3]] = from_f<T>(acc[rr][e] * inv);
    }
    return;
  }
  // This split's part to the workspace: per (group, split) M stats (max,
  // sum) then M x dh sums.
  const int64_t per_split = static_cast<int64_t>(M) * (dh + 2);
  float* mine = ws + (group * splits + split) * per_split;
#pragma unroll
  for (int rr = 0; rr < RPW; ++rr) {
    const int m = warp + rr * kSplitWarps;
    if (m >= M) break;
#pragma unroll
    for (int e = 0; e < DPL; ++e) mine[2 * M + m * dh + lane * DPL + e] = acc[rr][e];
    if (lane == 0) mine[2 * m] = run_max[rr], mine[2 * m + 1] = run_sum[rr];
  }
  // Thread 0's increment of the group's counter releases the block's writes
  // (ordered before it by the barrier) and acquires the other blocks', so
  // the last block reads every part; every thread fenced twice before
  // (docs/BENCHMARKS.md, session 47).
  __syncthreads();
  if (threadIdx.x == 0) {
    ::cuda::atomic_ref<unsigned, ::cuda::thread_scope_device> count(counters[group]);
    last_block = count.fetch_add(1u, ::cuda::memory_order_acq_rel) == static_cast<unsigned>(splits - 1);
  }
  __syncthreads();
  if (!last_block) return;
  // The last block combines: out = sum_s w_s acc_s / sum_s w_s sum_s with
  // w_s = e^(max_s - max), in the kernel's layout (a warp per row, lane s
  // reads split s's max and sum, each lane its dims of every split's sums).
  // The stats and the sums are loaded before any of them is used, so the
  // combine waits for one round trip to L2 per batch of splits (the version
  // before staged the stats through shared memory and read the sums after
  // them: two round trips and ~1,000 cycles of dependent loops).
  constexpr int kBatch = 64 / DPL < kMaxSplits ? 64 / DPL : kMaxSplits;  // splits' sums in registers at once
  const float* all = ws + group * splits * per_split;
#pragma unroll
  for (int rr = 0; rr < RPW; ++rr) {
    const int m = warp + rr * kSplitWarps;
    if (m >= M) break;
    const float* stats = all + 2 * m;
    const float* sums = all + 2 * M + m * dh + lane * DPL;
    const float split_max = lane < splits ? __ldcg(stats + lane * per_split) : -INFINITY;
    const float split_sum = lane < splits ? __ldcg(stats + lane * per_split + 1) : 0.f;
    float o[DPL];
#pragma unroll
    for (int e = 0; e < DPL; ++e) o[e] = 0.f;
    float w = 0.f, inv_total = 0.f;
    for (int s0 = 0; s0 < splits; s0 += kBatch) {
      float part[kBatch][DPL];
#pragma unroll
      for (int b = 0; b < kBatch; ++b)
#pragma unroll
        for (int e = 0; e < DPL; ++e) part[b][e] = s0 + b < splits ? __ldcg(sums + (s0 + b) * per_split + e) : 0.f;
      if (s0 == 0) {
        const float mx = warp_max(split_max);
        w = mx == -INFINITY || split_max == -INFINITY ? 0.f : __expf(split_max - mx);
        const float total = warp_sum(w * split_sum);
        inv_total = total > 0.f ? 1.f / total : 0.f;
      }
#pragma unroll
      for (int b = 0; b < kBatch; ++b) {
        const float wb = __shfl_sync(0xffffffffu, w, (s0 + b) & 31);
#pragma unroll
        for (int e = 0; e < DPL; ++e) o[e] = fmaf(wb, part[b][e], o[e]);
      }
    }
#pragma unroll
    for (int e = 0; e < DPL; ++e) ob[m * out.s[2] + (lane * DPL + e) * out.s[3]] = from_f<T>(o[e] * inv_total);
  }
  __syncthreads();  // every warp has read the workspace before the counter is reset
  if (threadIdx.x == 0) counters[group] = 0;  // ready for the next launch on this stream
}

// 16-byte key / value rows: unit stride along dh, aligned rows.
bool split_rows_ok(const kt& x) {
  if (x.s[3] != 1 || !aligned16(x.p)) return false;
  for (int k = 0; k < 3; ++k)
    if (x.d[k] != 1 && x.s[k] % kChunk != 0) return false;
  return true;
}

// Splits for `groups` x `keys`: about `per_sm` blocks per SM, at least one
// round of keys per block, within the workspace; splits = 1 needs none.
split_plan plan_splits(const launch_ctx& c, int64_t groups, int64_t M, int64_t dh, int64_t keys, int64_t per_sm = 2) {
  int64_t splits = (per_sm * c.sm_count + groups - 1) / groups;
  const int64_t most = (keys + kRoundKeys - 1) / kRoundKeys;
  if (splits > most) splits = most;
  if (splits > kMaxSplits) splits = kMaxSplits;
  if (splits < 1) splits = 1;
  const int64_t per_split = M * (dh + 2);
  if (groups > c.attention_counters || groups * splits * per_split > c.attention_workspace_floats)
    splits = c.attention_workspace_floats / (groups * per_split);
  if (groups > c.attention_counters || splits < 1) splits = 1;
  int64_t chunk = (keys + splits - 1) / splits;
  chunk = (chunk + kRoundKeys - 1) / kRoundKeys * kRoundKeys;
  split_plan p;
  p.splits = static_cast<int>((keys + chunk - 1) / chunk);
  p.chunk = chunk;
  return p;
}

template <class T, int DPL, int RPW>
error go_split(const launch_ctx& c, const kt& out, const kt& q, const kt& k, const kt& v, const kt& mask, bool masked,
               float scale, bool causal, int64_t S, int64_t groups, const split_plan& sp,
               const split_prologue& pro) {
  static std::atomic<bool> done[kMaxSharedOrdinals];
  const auto kernel = split_attention_kernel<T, DPL, RPW>;
  const std::size_t shared = split_shared_bytes<T>(q.d[2], 32 * DPL, pro.on ? S : 0);
  AG_CUDA_TRY(allow_shared(kernel, shared, split_shared_bytes<T>(kSplitWarps * RPW, 32 * DPL, kMaxNewRows), done),
              c.where + " (shared memory for fused attention)");
  launch_kernel(c, kernel, dim3(static_cast<unsigned>(groups), static_cast<unsigned>(sp.splits)), kSplitThreads, shared,
                out, q, k, v, mask, masked, scale, causal, S, sp.chunk, c.attention_workspace,
                c.attention_counter_words, sp.rows_apart, pro);
  return {};
}

template <class T, int DPL>
error go_split_rows(const launch_ctx& c, const kt& out, const kt& q, const kt& k, const kt& v, const kt& mask,
                    bool masked, float scale, bool causal, int64_t S, int64_t groups, const split_plan& sp,
                    const split_prologue& pro) {
  // A warp per row up to 4 rows (a LLaMA decode step's query heads per kv
  // head), up to 4 rows per warp beyond, and 8 or 16 for a batched decode
  // step's rows (kSplitMaxRows).
  if (q.d[2] <= kSplitWarps) return go_split<T, DPL, 1>(c, out, q, k, v, mask, masked, scale, causal, S, groups, sp, pro);
  if (q.d[2] <= kMaxRows)
    return go_split<T, DPL, kMaxRows / kSplitWarps>(c, out, q, k, v, mask, masked, scale, causal, S, groups, sp, pro);
  if (q.d[2] <= 2 * kMaxRows)
    return go_split<T, DPL, 2 * kMaxRows / kSplitWarps>(c, out, q, k, v, mask, masked, scale, causal, S, groups, sp, pro);
  return go_split<T, DPL, kSplitMaxRows / kSplitWarps>(c, out, q, k, v, mask, masked, scale, causal, S, groups, sp, pro);
}

template <class T>
error go_split_head(const launch_ctx& c, const kt& out, const kt& q, const kt& k, const kt& v, const kt& mask,
                    bool masked, float scale, bool causal, int64_t S, int64_t groups, const split_plan& sp,
                    const split_prologue& pro) {
  switch (q.d[3]) {
    case 32: return go_split_rows<T, 1>(c, out, q, k, v, mask, masked, scale, causal, S, groups, sp, pro);
    case 64: return go_split_rows<T, 2>(c, out, q, k, v, mask, masked, scale, causal, S, groups, sp, pro);
    case 128: return go_split_rows<T, 4>(c, out, q, k, v, mask, masked, scale, causal, S, groups, sp, pro);
    default: return go_split_rows<T, 8>(c, out, q, k, v, mask, masked, scale, causal, S, groups, sp, pro);
  }
}

std::size_t shared_bytes(int64_t M, int64_t dh, int64_t keys) {
  return static_cast<std::size_t>(M * dh + M * keys + kThreads * M) * sizeof(float);
}

template <class T, int MR>
error go_rows(const launch_ctx& c, const kt& out, const kt& q, const kt& k, const kt& v, const kt& mask, bool masked,
              float scale, bool causal, int64_t S, int64_t groups) {
  static std::atomic<bool> done[kMaxSharedOrdinals];
  const auto kernel = fused_attention_kernel<T, MR>;
  const std::size_t shared = shared_bytes(q.d[2], q.d[3], k.d[2]);
  AG_CUDA_TRY(allow_shared(kernel, shared, shared_bytes(kMaxRows, kMaxHead, kMaxScores / kMaxRows), done),
              c.where + " (shared memory for fused attention)");
  launch_kernel(c, kernel, static_cast<unsigned>(groups), kThreads, shared, out, q, k, v, mask, masked, scale, causal, S);
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
                             const kt* mask, float scale, bool causal, int64_t softmax_rows,
                             const attention_prologue* prologue, bool rows_apart) {
  // The split kernel (below) takes any number of keys, and up to
  // kSplitMaxRows query rows when they are at most kMaxRows softmax rows of
  // several heads (a batched decode step: graph/fusion.hpp,
  // fused_attention_split_rows_fit); the other one holds a row's scores in
  // shared memory.
  const int64_t M = q.d[2], dh = q.d[3], keys = k.d[2];
  const bool split_ok =
      c.attention_workspace && (dh == 32 || dh == 64 || dh == 128 || dh == 256) && split_rows_ok(k) && split_rows_ok(v);
  const bool split_rows = split_ok && M <= kSplitMaxRows && softmax_rows >= 1 && softmax_rows <= kMaxRows &&
                          M % softmax_rows == 0;
  // Longer query runs (a prefill): the flash kernel, which never writes the scores.
  if (M > kMaxRows && !prologue && !split_rows)
    return launch_flash_attention(c, out, q, k, v, mask, scale, causal, softmax_rows);
  const int64_t groups = q.d[0] * q.d[1];
  if (groups * q.d[2] == 0) return {};
  const int t = q.t;
  if (k.t != t || v.t != t || out.t != t || (mask && mask->t != t))
    return error(errc::dtype_mismatch, c.where + ": fused attention needs one dtype for q, k, v, mask and output");
  if (t != static_cast<int>(dtype::f32) && t != static_cast<int>(dtype::f16) && t != static_cast<int>(dtype::bf16))
    return error(errc::dtype_mismatch, c.where + ": fused attention needs f32, f16 or bf16");
  if (M > (split_rows ? kSplitMaxRows : kMaxRows) || keys < 1 || (!split_ok && (keys > kMaxKeys || M * keys > kMaxScores)) || dh > kMaxHead || k.d[3] != dh ||
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
  split_prologue pro{};  // off, nothing read
  // AG_CUDA_ATTENTION_EARLY=0: never load before the PDL wait (a diagnostic switch).
  static const bool early_on = [] {
    const char* e = std::getenv("AG_CUDA_ATTENTION_EARLY");
    return !(e && e[0] == '0');
  }();
  const auto settled = [&](int i) { return ((c.settled_inputs >> i) & 1u) != 0; };
  pro.cache_settled = early_on && c.pdl && settled(1) && settled(2) && (!mask || settled(3));
  if (prologue) {
    const attention_prologue& ap = *prologue;
    if (!split_ok)
      return error(errc::internal, c.where + ": a fused cache prologue needs the split attention kernel (head dim " +
                                       std::to_string(dh) + ", aligned cache rows, the stream's workspace)");
    const int64_t S = softmax_rows;
    const bool rope = ap.rope_q || ap.rope_k;
    if (S > kMaxNewRows || ap.k_new.t != t || ap.v_new.t != t || ap.k_new.d[0] != q.d[0] || ap.k_new.d[1] != q.d[1] ||
        ap.k_new.d[2] != S || ap.k_new.d[3] != dh || ap.v_new.d[0] != q.d[0] || ap.v_new.d[1] != q.d[1] ||
        ap.v_new.d[2] != S || ap.v_new.d[3] != dh || ap.cache_positions.t != static_cast<int>(dtype::i32) ||
        ap.cache_positions.numel() != S ||
        (rope && (ap.rope_positions.t != static_cast<int>(dtype::i32) || ap.rope_positions.numel() != S)))
      return error(errc::invalid_shape, c.where + ": fused cache prologue shapes out of its limits (" +
                                            std::to_string(S) + " new rows of " + std::to_string(dh) + ")");
    pro.on = true;
    pro.rope_q = ap.rope_q;
    pro.rope_k = ap.rope_k;
    pro.k_new = ap.k_new;
    pro.v_new = ap.v_new;
    pro.cache_positions = ap.cache_positions;
    pro.rope_positions = ap.rope_positions;
    rope_inverse_frequencies(ap.theta, ap.scaling, dh, pro.inv);
  }
  if (split_ok) {
    // Rows apart: softmax row s of kv head g is group g S + s, its query
    // heads the group's rows (q and out viewed [kv heads, S, heads a kv
    // head, dh]), the caches shared by the S groups of a kv head (stride 0),
    // its new row row s of k_new / v_new; the kernel offsets the mask, the
    // cache and rope positions by s. Each group trims to its own row's keys
    // (a lane of the cache), so a batched step's blocks sweep one lane each
    // instead of all of them with one warp of four at work.
    const int64_t S = softmax_rows;
    const bool apart = rows_apart && mask && !causal && q.d[0] == 1 && S > 1 && M % S == 0;
    kt qa = q, oa = out, ka = k, va = v;
    int64_t ga = groups, sa = S;
    split_plan sp;
    if (apart) {
      const auto by_row = [S](const kt& x, bool shared) {
        kt y = x;
        y.d[0] = x.d[1], y.s[0] = x.s[1];
        if (shared) {  // [kv heads, S (stride 0), keys, dh]
          y.d[1] = S, y.s[1] = 0;
        } else {  // rows m = h S + s of [.., kv heads, M, dh] as [kv heads, S, M / S, dh]
          y.d[1] = S, y.s[1] = x.s[2];
          y.d[2] = x.d[2] / S, y.s[2] = S * x.s[2];
        }
        return y;
      };
      qa = by_row(q, false), oa = by_row(out, false), ka = by_row(k, true), va = by_row(v, true);
      if (pro.on) pro.k_new = by_row(pro.k_new, false), pro.v_new = by_row(pro.v_new, false);
      ga = q.d[1] * S, sa = 1;
      // Splits for a row's share of the keys (the lanes are alike), about
      // four blocks an SM; the chunk over all keys for blocks that do not
      // trim (fewer than kTrimKeys keys).
      sp = plan_splits(c, ga, M / S, dh, std::max<int64_t>(1, keys / S), 4);
      int64_t chunk = (keys + sp.splits - 1) / sp.splits;
      chunk = (chunk + kRoundKeys - 1) / kRoundKeys * kRoundKeys;
      sp.chunk = chunk;
      sp.splits = static_cast<int>((keys + chunk - 1) / chunk);
      sp.rows_apart = true;
    } else {
      sp = plan_splits(c, groups, M, dh, keys);
    }
    switch (static_cast<dtype>(t)) {
      case dtype::f32: e = go_split_head<float>(c, oa, qa, ka, va, mk, mask != nullptr, scale, causal, sa, ga, sp, pro); break;
      case dtype::f16: e = go_split_head<__half>(c, oa, qa, ka, va, mk, mask != nullptr, scale, causal, sa, ga, sp, pro); break;
      default: e = go_split_head<__nv_bfloat16>(c, oa, qa, ka, va, mk, mask != nullptr, scale, causal, sa, ga, sp, pro); break;
    }
    if (e) return e;
    AG_CUDA_TRY_LAUNCH(c.where);
    return {};
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
