// Would one persistent kernel for a whole decode step reach the bandwidth
// floor (issue 12's decode_vs_bandwidth_floor <= 1.15)? A LLaMA-1B-shaped
// step (16 layers, d 2048, 32 heads over 8 kv heads of 64, ff 8192, vocab
// 32000, bf16 weights, an f32 residual stream, batch 1) as one cooperative
// kernel of one block an SM (session 48):
//   - every GEMV (q/k/v, o, gate|up, down, the head) is persistent_chain.cu's
//     form F: each warp streams its 4 KiB chunks of the block's rows into
//     its own ring of shared memory with bulk copies, as far ahead as the
//     ring reaches and across every phase (weights do not depend on x);
//   - the rms_norms are folded into the staging of x (each block sums the
//     squares of the 2048-wide residual itself), silu(gate) * up into the
//     gate|up GEMV's stores (its rows alternate gate and up, a block takes
//     whole quads and hands on pairs of bf16), the residual adds into the o
//     and down GEMVs' stores;
//   - attention: 16 blocks a kv head each take a span of the cache, rope
//     their 4 query heads and the new key, score, softmax and sum their
//     span; the last of a head's 16 (a counter) combines them; the first
//     stores the new key and value in the cache;
//   - the head GEMV's blocks keep their best logit; the last block picks the
//     token.
// Phases meet through their data: every value a phase hands on (q/k/v,
// silu(gate) * up, the residual, attention's output) is stored with the tag
// of the phase that wrote it in one 8-byte store (a 32-bit payload and a
// 32-bit tag, as NCCL's LL protocol does), and its readers spin on the tag:
// no fence, no counter (ef368a0 has the counter form: 7% slower). Every
// reader reads the whole of what it needs, so no buffer is rewritten before
// all readers of its last contents are done. The result is checked against
// a kernel-per-op reference of the same step (logits, the token, the cache
// rows written) and timed against a streaming read of the weights and the
// cache; one launch is traced phase by phase.
// Standalone (README.md here):
//   nvcc -O3 -arch=sm_90 -std=c++17 -o decode_step_kernel decode_step_kernel.cu && ./decode_step_kernel [POS]
#include <cuda/atomic>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "persistent_common.cuh"


namespace {

using bf16 = __nv_bfloat16;
constexpr int kLayers = 16, kD = 2048, kHeads = 32, kKvHeads = 8, kHeadDim = 64, kFf = 8192, kVocab = 32000;
constexpr int kQkv = (kHeads + 2 * kKvHeads) * kHeadDim, kGroup = kHeads / kKvHeads;
constexpr float kEps = 1e-5f;
constexpr int kWarps = 16, kThreads = kWarps * 32, kSlots = 3, kChunk = 2048;  // a chunk: elements
constexpr int kSplits = 16, kMaxSpan = 64;  // attention blocks a kv head, keys a block at most
constexpr int kMaxPhases = kLayers * 5 + 1, kMaxRows = 256, kPartial = kHeadDim + 2;

enum phase_kind : int { kQkvGemv, kAttention, kOGemv, kGateUpGemv, kDownGemv, kHeadGemv };
struct phase {
  int kind, layer;
  const bf16* w;  // [N, K]
  int N, K;
};

struct step_args {
  const phase* phases;
  int count;
  const float* x0;       // the token's embedding row [kD]
  unsigned long long* resid;  // [kD] tagged
  const bf16* norm_w;    // [2 kLayers + 1][kD]: attention's and the MLP's per layer, then the final one
  unsigned long long* qkv;       // [kQkv] tagged
  unsigned long long* hidden;    // [kFf / 2] tagged: silu(gate) * up as bf16 pairs
  unsigned long long* attn_out;  // [kD] tagged
  float* partials;       // [kKvHeads][kSplits][kGroup][kPartial]: acc, max, sum
  bf16* cache;           // [kLayers][2][kKvHeads][max_len][kHeadDim]
  int max_len, pos;      // the step's token is at pos: it sees pos + 1 keys
  const float* rope_cos;  // [kHeadDim / 2] at pos
  const float* rope_sin;
  float* logits;         // [kVocab]
  float* best_value;     // [gridDim]
  int* best_index;
  int* token;
  unsigned* done;        // [count]: the head phase's counter (the last block picks the token)
  unsigned* head_count;  // [kLayers][kKvHeads]: a head's splits finished
  unsigned epoch;        // launches so far, this one included
  unsigned long long* trace;  // null, or [count][gridDim][kMarks] globaltimer stamps (thread 0's)
  int l2_ahead;               // each warp prefetches into L2 the chunk this many items past its ring's (0: none)
};

// Trace marks of a phase: entered, its input ready, x staged, products done, stored and counted.
constexpr int kMarks = 5;
__device__ __forceinline__ void mark(const step_args& a, int p, int k) {
  if (a.trace && threadIdx.x == 0) a.trace[(static_cast<size_t>(p) * gridDim.x + blockIdx.x) * kMarks + k] = global_ns();
}

__device__ __forceinline__ bf16* cache_row(const step_args& a, int layer, int kv, int head, int key) {
  return a.cache + (((static_cast<size_t>(layer) * 2 + kv) * kKvHeads + head) * a.max_len + key) * kHeadDim;
}

// Tagged values: a float and the tag of the phase that stored it, in one
// 8-byte access, so that a reader that sees the tag sees the value.
__device__ __forceinline__ unsigned tag_of(unsigned epoch, int phase_index) {
  return (epoch << 8) | static_cast<unsigned>(phase_index);
}
__device__ __forceinline__ void put(unsigned long long* at, float v, unsigned tag) {
  const unsigned long long packed = (static_cast<unsigned long long>(tag) << 32) | __float_as_uint(v);
  asm volatile("st.relaxed.gpu.global.b64 [%0], %1;" ::"l"(at), "l"(packed) : "memory");
}
__device__ __forceinline__ unsigned long long peek(const unsigned long long* at) {
  unsigned long long v;
  asm volatile("ld.relaxed.gpu.global.b64 %0, [%1];" : "=l"(v) : "l"(at) : "memory");
  return v;
}
__device__ __forceinline__ float value_of(unsigned long long v) { return __uint_as_float(static_cast<unsigned>(v)); }
__device__ __forceinline__ bool tagged(unsigned long long v, unsigned tag) { return static_cast<unsigned>(v >> 32) == tag; }
// The value at `at` once it carries `tag`.
__device__ __forceinline__ float take(const unsigned long long* at, unsigned tag) {
  unsigned long long v = peek(at);
  while (!tagged(v, tag)) v = peek(at);
  return value_of(v);
}
// The 32-bit payloads at base[i0 + k * stride] once tagged: every load
// issued before any is checked.
template <int N>
__device__ __forceinline__ void take_n(const unsigned long long* base, int i0, int stride, unsigned tag, unsigned (&out)[N]) {
  unsigned long long v[N];
#pragma unroll
  for (int k = 0; k < N; ++k) v[k] = peek(base + i0 + k * stride);
#pragma unroll
  for (int k = 0; k < N; ++k) {
    while (!tagged(v[k], tag)) v[k] = peek(base + i0 + k * stride);
    out[k] = static_cast<unsigned>(v[k]);
  }
}


__device__ __forceinline__ unsigned bump(unsigned* counter) {
  cuda::atomic_ref<unsigned, cuda::thread_scope_device> c(*counter);
  return c.fetch_add(1, cuda::memory_order_acq_rel);
}

// A head vector's rope (rotate-half pairs i, i + 32), in shared memory.
__device__ __forceinline__ void rope(float* x, const float* c, const float* s, int i) {
  const float lo = x[i], hi = x[i + kHeadDim / 2];
  x[i] = lo * c[i] - hi * s[i];
  x[i + kHeadDim / 2] = hi * c[i] + lo * s[i];
}

// The keys a block's span of attention covers: [k0, k1) of pos + 1.
struct key_span {
  int h, s, k0, k1;
};
__device__ __forceinline__ key_span span_of(int pos) {
  const int keys = pos + 1, span = (keys + kSplits - 1) / kSplits;
  const int s = blockIdx.x % kSplits, k0 = min(keys, s * span);
  return {static_cast<int>(blockIdx.x) / kSplits, s, k0, min(keys, k0 + span)};
}

// The cache rows of this block's span before pos (k, then v, each up to
// kMaxSpan rows of 128 bytes), brought into `rows` by bulk copies that
// complete on `bar`; issued as soon as the q/k/v GEMV's products are done
// with the x buffer they land in, so that they arrive while the grid
// finishes that GEMV.
__device__ __forceinline__ void fetch_span(const step_args& a, int layer, unsigned char* rows, unsigned long long* bar) {
  const key_span k = span_of(a.pos);
  const int n = max(0, min(k.k1, a.pos) - k.k0);
  const unsigned bytes = static_cast<unsigned>(n) * kHeadDim * 2;
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");  // the x staged there by generic stores
  mbar_expect_tx(bar, 2 * bytes);
  if (n > 0) {
    bulk_load(rows, cache_row(a, layer, 0, k.h, k.k0), bytes, bar);
    bulk_load(rows + kMaxSpan * kHeadDim * 2, cache_row(a, layer, 1, k.h, k.k0), bytes, bar);
  }
}

// One block's part of a layer's attention: kv head h, the s-th span of keys
// (its cache rows already fetched into `rows` by fetch_span, complete on
// `bar` in phase `parity`).
__device__ void attention_block(const step_args& a, int layer, int phase_index, const unsigned char* rows,
                                unsigned long long* bar, unsigned parity) {
  __shared__ float q[kGroup][kHeadDim], k_new[kHeadDim], v_new[kHeadDim], cs[kHeadDim];
  __shared__ float scores[kGroup][kMaxSpan], acc[kGroup][4][kHeadDim], mx[kGroup], total[kGroup];
  __shared__ bool last;
  const key_span sp = span_of(a.pos);
  const int h = sp.h, s = sp.s, k0 = sp.k0, n = sp.k1 - sp.k0, t = threadIdx.x;
  const int warp = t >> 5, lane = t & 31;
  const __nv_bfloat162* k_rows = reinterpret_cast<const __nv_bfloat162*>(rows);
  const __nv_bfloat162* v_rows = reinterpret_cast<const __nv_bfloat162*>(rows + kMaxSpan * kHeadDim * 2);
  const unsigned ready = tag_of(a.epoch, phase_index - 1);  // q/k/v's
  if (t < kGroup * kHeadDim) q[t / kHeadDim][t % kHeadDim] = take(a.qkv + (h * kGroup) * kHeadDim + t, ready);
  else if (t < kGroup * kHeadDim + kHeadDim) k_new[t - kGroup * kHeadDim] = take(a.qkv + (kHeads + h) * kHeadDim + t - kGroup * kHeadDim, ready);
  else if (t < kGroup * kHeadDim + 2 * kHeadDim) v_new[t - kGroup * kHeadDim - kHeadDim] = take(a.qkv + (kHeads + kKvHeads + h) * kHeadDim + t - kGroup * kHeadDim - kHeadDim, ready);
  if (t < kHeadDim / 2) cs[t] = a.rope_cos[t], cs[t + kHeadDim / 2] = a.rope_sin[t];
  __syncthreads();
  const float scale = rsqrtf(static_cast<float>(kHeadDim));
  if (t < kGroup * kHeadDim / 2) {
    rope(q[t / (kHeadDim / 2)], cs, cs + kHeadDim / 2, t % (kHeadDim / 2));
  } else if (t < kGroup * kHeadDim / 2 + kHeadDim / 2) {
    rope(k_new, cs, cs + kHeadDim / 2, t - kGroup * kHeadDim / 2);
  }
  __syncthreads();
  if (t < kGroup * kHeadDim) q[t / kHeadDim][t % kHeadDim] *= scale;
  if (t < kHeadDim) {  // the new row as the cache holds it
    const bf16 kb = __float2bfloat16(k_new[t]), vb = __float2bfloat16(v_new[t]);
    k_new[t] = __bfloat162float(kb), v_new[t] = __bfloat162float(vb);
    if (s == 0) cache_row(a, layer, 0, h, a.pos)[t] = kb, cache_row(a, layer, 1, h, a.pos)[t] = vb;
  }
  mbar_wait(bar, parity);
  __syncthreads();
  // This lane's two dims of the span's i-th key or value row: the new row
  // (at pos) from shared memory as computed, the others as fetched.
  const auto dims_of = [&](const __nv_bfloat162* rows_fetched, const float* row_new, int i) {
    if (k0 + i == a.pos) return make_float2(row_new[2 * lane], row_new[2 * lane + 1]);
    const __nv_bfloat162 pair = rows_fetched[i * (kHeadDim / 2) + lane];
    return make_float2(__low2float(pair), __high2float(pair));
  };
  // Scores: a warp a key, a lane two dims, the four query heads at once.
  for (int i = warp; i < n; i += kWarps) {
    const float2 k = dims_of(k_rows, k_new, i);
#pragma unroll
    for (int g = 0; g < kGroup; ++g) {
      const float d = warp_sum(q[g][2 * lane] * k.x + q[g][2 * lane + 1] * k.y);
      if (lane == 0) scores[g][i] = d;
    }
  }
  __syncthreads();
  if (warp < kGroup) {  // softmax over the span: warp g, head g
    float m = -INFINITY;
    for (int i = lane; i < n; i += 32) m = fmaxf(m, scores[warp][i]);
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
    float sum = 0.f;
    for (int i = lane; i < n; i += 32) {
      const float p = __expf(scores[warp][i] - m);
      scores[warp][i] = p;
      sum += p;
    }
    sum = warp_sum(sum);
    if (lane == 0) mx[warp] = m, total[warp] = sum;
  }
  __syncthreads();
  {  // weighted values: warp w takes head w % 4 and every fourth key from w / 4; a lane two dims
    const int g = warp % kGroup, part = warp / kGroup;
    float lo = 0.f, hi = 0.f;
    for (int i = part; i < n; i += 4) {
      const float2 v = dims_of(v_rows, v_new, i);
      lo = fmaf(scores[g][i], v.x, lo), hi = fmaf(scores[g][i], v.y, hi);
    }
    acc[g][part][2 * lane] = lo, acc[g][part][2 * lane + 1] = hi;
  }
  __syncthreads();
  float* mine = a.partials + (static_cast<size_t>(h) * kSplits + s) * kGroup * kPartial;
  if (t < kGroup * kHeadDim) {
    const int g = t / kHeadDim, d = t % kHeadDim;
    mine[g * kPartial + d] = acc[g][0][d] + acc[g][1][d] + acc[g][2][d] + acc[g][3][d];
    if (d == 0) mine[g * kPartial + kHeadDim] = mx[g], mine[g * kPartial + kHeadDim + 1] = total[g];
  }
  __syncthreads();
  if (t == 0) last = bump(a.head_count + layer * kKvHeads + h) == kSplits * a.epoch - 1;
  __syncthreads();
  if (!last) return;
  if (t < kGroup * kHeadDim) {  // the head's 16 spans combined, by its last block
    const int g = t / kHeadDim, d = t % kHeadDim;
    const float* head = a.partials + static_cast<size_t>(h) * kSplits * kGroup * kPartial + g * kPartial;
    float m = -INFINITY;
    for (int j = 0; j < kSplits; ++j) m = fmaxf(m, __ldcg(head + j * kGroup * kPartial + kHeadDim));
    float num = 0.f, den = 0.f;
    for (int j = 0; j < kSplits; ++j) {
      const float* p = head + j * kGroup * kPartial;
      const float w = __expf(__ldcg(p + kHeadDim) - m);  // an empty span: max -inf, weight 0
      num = fmaf(w, __ldcg(p + d), num), den = fmaf(w, __ldcg(p + kHeadDim + 1), den);
    }
    put(a.attn_out + (h * kGroup + g) * kHeadDim + d, num / den, tag_of(a.epoch, phase_index));
  }
}


__global__ void __launch_bounds__(kThreads, 1) decode_step(step_args a) {
  extern __shared__ __align__(128) unsigned char dynamic_shared[];
  __shared__ phase ph[kMaxPhases];
  __shared__ int first_row[kMaxPhases], item_count[kMaxPhases];
  __shared__ unsigned long long full[kWarps * kSlots], span_bar;
  __shared__ float sums[kMaxRows], reduce[kWarps], inv_rms;
  __shared__ float resid_rows[kD / 128];  // this block's rows of the residual (o's and down's split: at most 16)
  __shared__ int reduce_index[kWarps];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, blocks = gridDim.x;
  unsigned char* my_ring = dynamic_shared + static_cast<size_t>(warp) * kSlots * kChunk * 2;
  uint4* xs = reinterpret_cast<uint4*>(dynamic_shared + static_cast<size_t>(kWarps) * kSlots * kChunk * 2);
  bf16* xs_elems = reinterpret_cast<bf16*>(xs);
  for (int p = threadIdx.x; p < a.count; p += blockDim.x) {
    // A GEMV's rows [first, end) for this block (the split rotated by the
    // phase, so that uneven splits' extra rows fall on different blocks),
    // in chunks of kChunk.
    ph[p] = a.phases[p];
    first_row[p] = item_count[p] = 0;
    if (ph[p].kind == kAttention) continue;
    // gate|up's rows alternate gate and up (row 2i gate i, 2i + 1 up i), and a
    // block takes whole quads, so that it can hand on silu(gate) * up itself
    // as pairs of bf16.
    // The o and down GEMVs keep one split for the whole step (no rotation), so
    // that a block's residual rows stay in its shared memory from phase to phase.
    const bool residual = ph[p].kind == kOGemv || ph[p].kind == kDownGemv;
    const long long r = (blockIdx.x + (residual ? 0LL : 53LL * p)) % blocks;
    const int align = ph[p].kind == kGateUpGemv ? ~3 : ~0;
    const int first = static_cast<int>(r * ph[p].N / blocks) & align;
    const int end = r + 1 == blocks ? ph[p].N : static_cast<int>((r + 1) * ph[p].N / blocks) & align;
    first_row[p] = first;
    item_count[p] = (end - first) * (ph[p].K / kChunk);
  }
  for (int i = threadIdx.x; i < kMaxRows; i += blockDim.x) sums[i] = 0.f;
  if (threadIdx.x == 0) {
    for (int t = 0; t < kWarps * kSlots; ++t) mbar_init(&full[t], 1);
    mbar_init(&span_bar, 1);
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  __syncthreads();
  const bool attends = blockIdx.x < kKvHeads * kSplits;
  // Item j of GEMV phase p: chunk j % (K / kChunk) of the block's row first_row + j / (K / kChunk).
  const auto chunk_source = [&](int p, int j) {
    const phase& f = ph[p];
    const int cpr = f.K / kChunk, row = first_row[p] + j / cpr, c = j % cpr;
    return f.w + static_cast<long long>(row) * f.K + static_cast<long long>(c) * kChunk;
  };
  chunk_cursor to_load(a.count, warp, kWarps, item_count);  // kSlots items ahead of the consuming one
  // An L2 prefetch cursor, a.l2_ahead items past the loading one: DRAM keeps
  // working through the phases where the rings are full and nothing is
  // consumed (attention, the stagings, the counters' round trips).
  chunk_cursor to_prefetch(a.count, warp, kWarps, item_count);
  const auto prefetch_next = [&] {
    if (to_prefetch.done()) return;
    if (lane == 0)
      asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(chunk_source(to_prefetch.g, to_prefetch.j)),
                   "r"(kChunk * 2)
                   : "memory");
    to_prefetch.advance();
  };
  if (a.l2_ahead > 0)
    for (int i = 0; i < kSlots + a.l2_ahead; ++i) {  // the cursor's start: past the ring's first loads
      if (i >= kSlots) prefetch_next();
      else to_prefetch.advance();
    }
  const auto issue = [&](int slot) {
    if (to_load.done()) return;
    if (a.l2_ahead > 0) prefetch_next();
    if (lane == 0) {
      mbar_expect_tx(&full[warp * kSlots + slot], kChunk * 2);
      bulk_load(my_ring + static_cast<size_t>(slot) * kChunk * 2, chunk_source(to_load.g, to_load.j), kChunk * 2,
                &full[warp * kSlots + slot]);
    }
    to_load.advance();
  };
  for (int slot = 0; slot < kSlots; ++slot) issue(slot);
  int q = 0, slot = 0;
  for (int p = 0; p < a.count; ++p) {
    const phase& f = ph[p];
    mark(a, p, 0);
    const unsigned ready = tag_of(a.epoch, p - 1);  // what this phase reads carries the previous phase's tag
    mark(a, p, 1);
    if (f.kind == kAttention) {
      if (attends) attention_block(a, f.layer, p, reinterpret_cast<unsigned char*>(xs), &span_bar, f.layer & 1);
      mark(a, p, 2), mark(a, p, 3), mark(a, p, 4);
      continue;
    }
    // x for this GEMV, staged as bf16.
    if (f.kind == kOGemv) {
      unsigned o[kD / kThreads];
      take_n(a.attn_out, threadIdx.x, kThreads, ready, o);
#pragma unroll
      for (int u = 0; u < kD / kThreads; ++u) xs_elems[threadIdx.x + u * kThreads] = __float2bfloat16(__uint_as_float(o[u]));
    } else if (f.kind == kDownGemv) {
      // silu(gate) * up, computed by gate|up's blocks, two bf16 a value.
      unsigned h[kFf / 2 / kThreads];
      take_n(a.hidden, threadIdx.x, kThreads, ready, h);
#pragma unroll
      for (int u = 0; u < kFf / 2 / kThreads; ++u) reinterpret_cast<unsigned*>(xs_elems)[threadIdx.x + u * kThreads] = h[u];
    } else {  // rms_norm of the residual (the token's row before the first layer's o)
      const bool from_token = f.kind == kQkvGemv && f.layer == 0;
      const bf16* g = a.norm_w + static_cast<size_t>(f.kind == kQkvGemv ? 2 * f.layer : f.kind == kGateUpGemv ? 2 * f.layer + 1 : 2 * kLayers) * kD;
      float ss = 0.f;
      float v[kD / kThreads];
      if (from_token) {
#pragma unroll
        for (int u = 0; u < kD / kThreads; ++u) v[u] = a.x0[threadIdx.x + u * kThreads];
      } else {
        unsigned bits[kD / kThreads];
        take_n(a.resid, threadIdx.x, kThreads, ready, bits);
#pragma unroll
        for (int u = 0; u < kD / kThreads; ++u) v[u] = __uint_as_float(bits[u]);
      }
#pragma unroll
      for (int u = 0; u < kD / kThreads; ++u) ss = fmaf(v[u], v[u], ss);
      ss = warp_sum(ss);
      if (lane == 0) reduce[warp] = ss;
      __syncthreads();
      if (threadIdx.x == 0) {
        float t = 0.f;
        for (int w = 0; w < kWarps; ++w) t += reduce[w];
        inv_rms = rsqrtf(t / kD + kEps);
      }
      __syncthreads();
#pragma unroll
      for (int u = 0; u < kD / kThreads; ++u) {
        const int i = threadIdx.x + u * kThreads;
        xs_elems[i] = __float2bfloat16(v[u] * inv_rms * __bfloat162float(g[i]));
      }
    }
    __syncthreads();
    mark(a, p, 2);
    const int cpr = f.K / kChunk, items = item_count[p];
    int x_chunk = -1;
    uint4 xr[kChunk / 8 / 32];
    for (int j = warp; j < items; j += kWarps) {
      mbar_wait(&full[warp * kSlots + slot], static_cast<unsigned>((q / kSlots) & 1));
      const int row = j / cpr, c = j % cpr;
      const uint4* chunk = reinterpret_cast<const uint4*>(my_ring + static_cast<size_t>(slot) * kChunk * 2);
      uint4 wv[kChunk / 8 / 32];
#pragma unroll
      for (int u = 0; u < kChunk / 8 / 32; ++u) wv[u] = chunk[lane + 32 * u];
      __syncwarp();
      issue(slot);
      if (c != x_chunk) {
#pragma unroll
        for (int u = 0; u < kChunk / 8 / 32; ++u) xr[u] = xs[c * (kChunk / 8) + lane + 32 * u];
        x_chunk = c;
      }
      float lo = 0.f, hi = 0.f;
#pragma unroll
      for (int u = 0; u < kChunk / 8 / 32; ++u) fma8_two(wv[u], xr[u], lo, hi);
      const float part = warp_sum(lo + hi);
      if (lane == 0) atomicAdd(&sums[row], part);
      ++q;
      if (++slot == kSlots) slot = 0;
    }
    __syncthreads();
    mark(a, p, 3);
    if (f.kind == kQkvGemv && attends && threadIdx.x == 0) fetch_span(a, f.layer, reinterpret_cast<unsigned char*>(xs), &span_bar);
    const int rows = items / cpr, first = first_row[p];
    float best = -INFINITY;
    int best_at = 0x7fffffff;
    for (int i = threadIdx.x; i < rows; i += blockDim.x) {
      const int n = first + i;
      const float y = sums[i];
      if (f.kind != kGateUpGemv) sums[i] = 0.f;  // gate|up's are read in quads below
      switch (f.kind) {
        case kQkvGemv: put(a.qkv + n, y, tag_of(a.epoch, p)); break;
        case kGateUpGemv: break;  // below, a quad of rows at a time
        case kOGemv:
        case kDownGemv: {  // the residual row as this block left it (the token's row before the first o)
          const float r = (f.kind == kOGemv && f.layer == 0 ? a.x0[n] : resid_rows[i]) + y;
          resid_rows[i] = r;
          put(a.resid + n, r, tag_of(a.epoch, p));
          break;
        }
        default:
          a.logits[n] = y;
          if (y > best || (y == best && n < best_at)) best = y, best_at = n;
      }
    }
    if (f.kind == kGateUpGemv) {
      for (int i = threadIdx.x; i < rows / 4; i += blockDim.x) {
        const float* y = sums + 4 * i;
        const bf16 h0 = __float2bfloat16(y[0] / (1.f + __expf(-y[0])) * y[1]);
        const bf16 h1 = __float2bfloat16(y[2] / (1.f + __expf(-y[2])) * y[3]);
        const unsigned pair = static_cast<unsigned>(__bfloat16_as_ushort(h0)) | (static_cast<unsigned>(__bfloat16_as_ushort(h1)) << 16);
        put(a.hidden + (first / 4 + i), __uint_as_float(pair), tag_of(a.epoch, p));
      }
      __syncthreads();
      for (int i = threadIdx.x; i < rows; i += blockDim.x) sums[i] = 0.f;
    }
    if (f.kind == kHeadGemv) {  // the block's best logit, then the last block's pick
#pragma unroll
      for (int o = 16; o > 0; o >>= 1) {
        const float ov = __shfl_xor_sync(0xffffffffu, best, o);
        const int oi = __shfl_xor_sync(0xffffffffu, best_at, o);
        if (ov > best || (ov == best && oi < best_at)) best = ov, best_at = oi;
      }
      if (lane == 0) reduce[warp] = best, reduce_index[warp] = best_at;
      __syncthreads();
      if (threadIdx.x == 0) {
        for (int w = 1; w < kWarps; ++w)
          if (reduce[w] > best || (reduce[w] == best && reduce_index[w] < best_at)) best = reduce[w], best_at = reduce_index[w];
        a.best_value[blockIdx.x] = best, a.best_index[blockIdx.x] = best_at;
      }
    }
    __syncthreads();
    if (threadIdx.x == 0 && f.kind == kHeadGemv && bump(a.done + p) == blocks * a.epoch - 1) {
      float v = -INFINITY;
      int at = 0x7fffffff;
      for (int b = 0; b < blocks; ++b) {
        const float bv = __ldcg(a.best_value + b);
        const int bi = __ldcg(a.best_index + b);
        if (bv > v || (bv == v && bi < at)) v = bv, at = bi;
      }
      *a.token = at;
    }
    mark(a, p, 4);
  }
}

// ---- the reference: a kernel per op, plain ----------------------------------

__global__ void ref_norm(const float* x, const bf16* g, bf16* out) {
  __shared__ float part[32], inv;
  float ss = 0.f;
  for (int i = threadIdx.x; i < kD; i += blockDim.x) ss = fmaf(x[i], x[i], ss);
  ss = warp_sum(ss);
  if ((threadIdx.x & 31) == 0) part[threadIdx.x >> 5] = ss;
  __syncthreads();
  if (threadIdx.x == 0) {
    float t = 0.f;
    for (int w = 0; w < static_cast<int>(blockDim.x) / 32; ++w) t += part[w];
    inv = rsqrtf(t / kD + kEps);
  }
  __syncthreads();
  for (int i = threadIdx.x; i < kD; i += blockDim.x) out[i] = __float2bfloat16(x[i] * inv * __bfloat162float(g[i]));
}

// y[n] (+)= w[n, :] . x, a warp a row.
__global__ void ref_gemv(const bf16* w, const bf16* x, float* y, int N, int K, bool add) {
  const int n = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32, lane = threadIdx.x & 31;
  if (n >= N) return;
  float acc = 0.f;
  for (int k = lane; k < K; k += 32) acc = fmaf(__bfloat162float(w[static_cast<size_t>(n) * K + k]), __bfloat162float(x[k]), acc);
  acc = warp_sum(acc);
  if (lane == 0) y[n] = add ? y[n] + acc : acc;
}

__global__ void ref_rope_store(float* qkv, const float* c, const float* s, bf16* cache, int layer, int pos, int max_len) {
  const int head = blockIdx.x, i = threadIdx.x;  // heads: the 32 query heads, then the 8 key heads
  float* x = qkv + head * kHeadDim;
  const float lo = x[i], hi = x[i + kHeadDim / 2];
  __syncthreads();
  x[i] = lo * c[i] - hi * s[i];
  x[i + kHeadDim / 2] = hi * c[i] + lo * s[i];
  if (head >= kHeads) {
    const int kv = head - kHeads;
    bf16* k_row = cache + (((static_cast<size_t>(layer) * 2 + 0) * kKvHeads + kv) * max_len + pos) * kHeadDim;
    bf16* v_row = cache + (((static_cast<size_t>(layer) * 2 + 1) * kKvHeads + kv) * max_len + pos) * kHeadDim;
    const float* v = qkv + (kHeads + kKvHeads + kv) * kHeadDim;
    k_row[i] = __float2bfloat16(x[i]), k_row[i + kHeadDim / 2] = __float2bfloat16(x[i + kHeadDim / 2]);
    v_row[i] = __float2bfloat16(v[i]), v_row[i + kHeadDim / 2] = __float2bfloat16(v[i + kHeadDim / 2]);
  }
}

// A block a query head over all its keys (at most 1024).
__global__ void ref_attention(const float* qkv, const bf16* cache, bf16* out, int layer, int keys, int max_len) {
  __shared__ float p[1024], q[kHeadDim], stat[2];
  const int head = blockIdx.x, kv = head / kGroup;
  if (threadIdx.x < kHeadDim) q[threadIdx.x] = qkv[head * kHeadDim + threadIdx.x] * rsqrtf(static_cast<float>(kHeadDim));
  __syncthreads();
  const bf16* k_base = cache + ((static_cast<size_t>(layer) * 2 + 0) * kKvHeads + kv) * max_len * kHeadDim;
  const bf16* v_base = cache + ((static_cast<size_t>(layer) * 2 + 1) * kKvHeads + kv) * max_len * kHeadDim;
  for (int j = threadIdx.x; j < keys; j += blockDim.x) {
    float d = 0.f;
    for (int i = 0; i < kHeadDim; ++i) d = fmaf(q[i], __bfloat162float(k_base[static_cast<size_t>(j) * kHeadDim + i]), d);
    p[j] = d;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    float m = -INFINITY, sum = 0.f;
    for (int j = 0; j < keys; ++j) m = fmaxf(m, p[j]);
    for (int j = 0; j < keys; ++j) sum += expf(p[j] - m);
    stat[0] = m, stat[1] = sum;
  }
  __syncthreads();
  if (threadIdx.x < kHeadDim) {
    float acc = 0.f;
    for (int j = 0; j < keys; ++j) acc = fmaf(expf(p[j] - stat[0]), __bfloat162float(v_base[static_cast<size_t>(j) * kHeadDim + threadIdx.x]), acc);
    out[head * kHeadDim + threadIdx.x] = __float2bfloat16(acc / stat[1]);
  }
}

// gate|up's rows alternate: row 2i is gate i, 2i + 1 up i.
__global__ void ref_silu_mul(const float* gate_up, bf16* out) {
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < kFf; i += gridDim.x * blockDim.x) {
    const float g = gate_up[2 * i];
    out[i] = __float2bfloat16(g / (1.f + expf(-g)) * gate_up[2 * i + 1]);
  }
}



}  // namespace

int main(int argc, char** argv) {
  const int pos = argc > 1 ? std::atoi(argv[1]) : 575;  // the runtime's bench: 512 + 128 tokens, 576 on average
  if (pos < 1 || (pos + 1 + kSplits - 1) / kSplits > kMaxSpan || pos + 1 > 1024) {
    std::fprintf(stderr, "POS must be 1..1023\n");
    return 2;
  }
  const int max_len = pos + 1;
  cudaDeviceProp prop;
  CK(cudaGetDeviceProperties(&prop, 0));
  // Weights: per layer q/k/v, o, gate|up, down; then the head.
  const size_t per_layer = static_cast<size_t>(kQkv) * kD + static_cast<size_t>(kD) * kD + 2ull * kFf * kD + static_cast<size_t>(kD) * kFf;
  const size_t weight_elems = per_layer * kLayers + static_cast<size_t>(kVocab) * kD;
  bf16* w;
  CK(cudaMalloc(&w, weight_elems * 2));
  std::vector<phase> phases;
  {
    size_t off = 0;
    const auto take = [&](int kind, int layer, int N, int K) {
      fill_uniform<<<1024, 256>>>(w + off, static_cast<long long>(N) * K, 100 + static_cast<unsigned>(phases.size()), std::sqrt(3.0f / K), 0.f);
      phases.push_back({kind, layer, w + off, N, K});
      off += static_cast<size_t>(N) * K;
    };
    for (int l = 0; l < kLayers; ++l) {
      take(kQkvGemv, l, kQkv, kD);
      phases.push_back({kAttention, l, nullptr, 0, 0});
      take(kOGemv, l, kD, kD);
      take(kGateUpGemv, l, 2 * kFf, kD);
      take(kDownGemv, l, kD, kFf);
    }
    take(kHeadGemv, kLayers, kVocab, kD);
  }
  const int count = static_cast<int>(phases.size());
  phase* d_phases;
  CK(cudaMalloc(&d_phases, sizeof(phase) * count));
  CK(cudaMemcpy(d_phases, phases.data(), sizeof(phase) * count, cudaMemcpyHostToDevice));
  const size_t cache_elems = static_cast<size_t>(kLayers) * 2 * kKvHeads * max_len * kHeadDim;
  bf16 *norm_w, *cache, *cache_ref, *x0_bf16, *attn_out, *xb;
  CK(cudaMalloc(&norm_w, (2 * kLayers + 1) * kD * 2));
  CK(cudaMalloc(&cache, cache_elems * 2));
  CK(cudaMalloc(&cache_ref, cache_elems * 2));
  CK(cudaMalloc(&x0_bf16, kD * 2));
  CK(cudaMalloc(&attn_out, kD * 2));
  CK(cudaMalloc(&xb, kFf * 2));
  fill_uniform<<<64, 256>>>(norm_w, (2 * kLayers + 1) * kD, 9, 0.5f, 1.0f);
  fill_uniform<<<1024, 256>>>(cache, static_cast<long long>(cache_elems), 11, 1.0f, 0.f);
  fill_uniform<<<8, 256>>>(x0_bf16, kD, 13, 1.0f, 0.f);
  CK(cudaGetLastError());
  CK(cudaMemcpy(cache_ref, cache, cache_elems * 2, cudaMemcpyDeviceToDevice));
  std::vector<bf16> x0_host(kD);
  CK(cudaMemcpy(x0_host.data(), x0_bf16, kD * 2, cudaMemcpyDeviceToHost));
  std::vector<float> x0f(kD), cs(kHeadDim / 2), sn(kHeadDim / 2);
  for (int i = 0; i < kD; ++i) x0f[i] = __bfloat162float(x0_host[i]);
  for (int i = 0; i < kHeadDim / 2; ++i) {
    const double freq = std::pow(500000.0, -2.0 * i / kHeadDim);
    cs[i] = static_cast<float>(std::cos(pos * freq)), sn[i] = static_cast<float>(std::sin(pos * freq));
  }
  float *x0, *resid_ref, *qkv, *gate_up, *partials, *logits, *logits_ref, *rope_c, *rope_s, *best_value;
  int *best_index, *token;
  unsigned *done, *head_count, *sink;
  CK(cudaMalloc(&x0, kD * 4));
  CK(cudaMalloc(&resid_ref, kD * 4));
  CK(cudaMalloc(&qkv, kQkv * 4));
  CK(cudaMalloc(&gate_up, 2 * kFf * 4));
  CK(cudaMalloc(&partials, kKvHeads * kSplits * kGroup * kPartial * 4));
  CK(cudaMalloc(&logits, kVocab * 4));
  CK(cudaMalloc(&logits_ref, kVocab * 4));
  CK(cudaMalloc(&rope_c, kHeadDim / 2 * 4));
  CK(cudaMalloc(&rope_s, kHeadDim / 2 * 4));
  CK(cudaMalloc(&best_value, prop.multiProcessorCount * 4));
  CK(cudaMalloc(&best_index, prop.multiProcessorCount * 4));
  CK(cudaMalloc(&token, 4));
  CK(cudaMalloc(&done, count * 4));
  CK(cudaMalloc(&head_count, kLayers * kKvHeads * 4));
  CK(cudaMalloc(&sink, 4));
  CK(cudaMemset(done, 0, count * 4));
  CK(cudaMemset(head_count, 0, kLayers * kKvHeads * 4));
  CK(cudaMemcpy(x0, x0f.data(), kD * 4, cudaMemcpyHostToDevice));
  CK(cudaMemcpy(rope_c, cs.data(), cs.size() * 4, cudaMemcpyHostToDevice));
  CK(cudaMemcpy(rope_s, sn.data(), sn.size() * 4, cudaMemcpyHostToDevice));
  cudaStream_t s;
  CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));

  // The reference step.
  CK(cudaMemcpy(resid_ref, x0, kD * 4, cudaMemcpyDeviceToDevice));
  const auto gemv = [&](const phase& f, const bf16* x, float* y, bool add) {
    ref_gemv<<<(f.N + 7) / 8, 256, 0, s>>>(f.w, x, y, f.N, f.K, add);
  };
  for (int l = 0; l < kLayers; ++l) {
    const phase* f = &phases[l * 5];
    ref_norm<<<1, 1024, 0, s>>>(resid_ref, norm_w + 2 * l * kD, xb);
    gemv(f[0], xb, qkv, false);
    ref_rope_store<<<kHeads + kKvHeads, kHeadDim / 2, 0, s>>>(qkv, rope_c, rope_s, cache_ref, l, pos, max_len);
    ref_attention<<<kHeads, 256, 0, s>>>(qkv, cache_ref, attn_out, l, pos + 1, max_len);
    gemv(f[2], attn_out, resid_ref, true);
    ref_norm<<<1, 1024, 0, s>>>(resid_ref, norm_w + (2 * l + 1) * kD, xb);
    gemv(f[3], xb, gate_up, false);
    ref_silu_mul<<<32, 256, 0, s>>>(gate_up, xb);
    gemv(f[4], xb, resid_ref, true);
  }
  ref_norm<<<1, 1024, 0, s>>>(resid_ref, norm_w + 2 * kLayers * kD, xb);
  gemv(phases.back(), xb, logits_ref, false);
  CK(cudaGetLastError());
  CK(cudaStreamSynchronize(s));

  // The persistent step.
  const int grid = prop.multiProcessorCount;
  const size_t shared = static_cast<size_t>(kWarps) * kSlots * kChunk * 2 + kFf * 2;
  CK(cudaFuncSetAttribute(decode_step, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(shared)));
  // The megakernel's hand-overs, tagged (8 bytes a value; tag 0 is no launch's).
  unsigned long long *mk_resid, *mk_qkv, *mk_hidden, *mk_attn_out;
  CK(cudaMalloc(&mk_resid, kD * 8));
  CK(cudaMalloc(&mk_qkv, kQkv * 8));
  CK(cudaMalloc(&mk_hidden, kFf / 2 * 8));
  CK(cudaMalloc(&mk_attn_out, kD * 8));
  CK(cudaMemset(mk_resid, 0, kD * 8));
  CK(cudaMemset(mk_qkv, 0, kQkv * 8));
  CK(cudaMemset(mk_hidden, 0, kFf / 2 * 8));
  CK(cudaMemset(mk_attn_out, 0, kD * 8));
  step_args args{d_phases, count, x0, mk_resid, norm_w, mk_qkv, mk_hidden, mk_attn_out, partials, cache, max_len, pos,
                 rope_c, rope_s, logits, best_value, best_index, token, done, head_count, 0, nullptr, 0};
  const auto launch = [&] {
    ++args.epoch;
    void* params[] = {&args};
    CK(cudaLaunchCooperativeKernel(reinterpret_cast<void*>(decode_step), grid, kThreads, params, shared, s));
  };
  launch();
  CK(cudaStreamSynchronize(s));
  CK(cudaGetLastError());
  std::vector<float> lg(kVocab), lr(kVocab);
  int tok = -1;
  CK(cudaMemcpy(lg.data(), logits, kVocab * 4, cudaMemcpyDeviceToHost));
  CK(cudaMemcpy(lr.data(), logits_ref, kVocab * 4, cudaMemcpyDeviceToHost));
  CK(cudaMemcpy(&tok, token, 4, cudaMemcpyDeviceToHost));
  double num = 0, den = 0;
  int ref_tok = 0;
  for (int i = 0; i < kVocab; ++i) {
    num += (lg[i] - lr[i]) * double(lg[i] - lr[i]), den += double(lr[i]) * lr[i];
    if (lr[i] > lr[ref_tok]) ref_tok = i;
  }
  int own_best = 0;
  for (int i = 0; i < kVocab; ++i)
    if (lg[i] > lg[own_best]) own_best = i;
  // The cache rows this step wrote, every layer and kv head.
  std::vector<bf16> c1(cache_elems), c2(cache_elems);
  CK(cudaMemcpy(c1.data(), cache, cache_elems * 2, cudaMemcpyDeviceToHost));
  CK(cudaMemcpy(c2.data(), cache_ref, cache_elems * 2, cudaMemcpyDeviceToHost));
  double cnum = 0, cden = 0, untouched = 0;
  for (size_t r = 0; r < cache_elems / kHeadDim; ++r) {
    const bool written = static_cast<int>(r % max_len) == pos;
    for (int i = 0; i < kHeadDim; ++i) {
      const double a = __bfloat162float(c1[r * kHeadDim + i]), b = __bfloat162float(c2[r * kHeadDim + i]);
      if (written) cnum += (a - b) * (a - b), cden += b * b;
      else untouched = std::max(untouched, std::fabs(a - b));
    }
  }
  const double logit_gap = std::sqrt(num / den), cache_gap = std::sqrt(cnum / std::max(cden, 1e-30));
  std::printf("%s, %d SMs; LLaMA-1B shape, one token at position %d: %zu MB of weights, %zu MB of cache read\n", prop.name,
              prop.multiProcessorCount, pos, weight_elems * 2 / 1000000, cache_elems * 2 / 1000000);
  std::printf("logits against the kernel-per-op reference: relative L2 %.2e; token %d (its own logits' argmax %d, the reference's %d)\n",
              logit_gap, tok, own_best, ref_tok);
  std::printf("cache rows written: relative L2 %.2e; rows not written: max difference %.1e\n", cache_gap, untouched);

  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  const auto time_it = [&](auto&& run, int reps) {
    for (int i = 0; i < 3; ++i) run();
    CK(cudaEventRecord(e0, s));
    for (int i = 0; i < reps; ++i) run();
    CK(cudaEventRecord(e1, s));
    CK(cudaEventSynchronize(e1));
    float ms;
    CK(cudaEventElapsedTime(&ms, e0, e1));
    return ms * 1e3 / reps;
  };
  const double read_us = time_it([&] {
    read_all<<<prop.multiProcessorCount * 8, 512, 0, s>>>(reinterpret_cast<const uint4*>(w), static_cast<long long>(weight_elems / 8), sink);
  }, 20);
  const double gbs = weight_elems * 2 / (read_us * 1e-6) / 1e9;
  // The floor: the weights and the cache's rows read once (pos + 1 keys, k and v) at that rate.
  const double floor_us = (weight_elems * 2 + static_cast<double>(kLayers) * 2 * kKvHeads * (pos + 1) * kHeadDim * 2) / (gbs * 1e9) * 1e6;
  // L2 prefetch distances (items a warp), alternated; 0 is the plain step.
  const std::vector<int> aheads = {0, 2};
  std::vector<double> by_ahead(aheads.size(), 1e30);
  for (int round = 0; round < 3; ++round)
    for (size_t i = 0; i < aheads.size(); ++i) {
      args.l2_ahead = aheads[i];
      by_ahead[i] = std::min(by_ahead[i], time_it(launch, 20));
      CK(cudaMemcpy(&tok, token, 4, cudaMemcpyDeviceToHost));
      if (tok != own_best) std::printf("token %d after the L2-prefetch step %d\n", tok, aheads[i]);
    }
  args.l2_ahead = 0;
  for (size_t i = 0; i < aheads.size(); ++i)
    std::printf("step with L2 prefetch %d chunks ahead a warp: %.1f us\n", aheads[i], by_ahead[i]);
  const double best = by_ahead[0];
  const double best_prefetch = *std::min_element(by_ahead.begin() + 1, by_ahead.end());
  const int tok_after = tok;
  CK(cudaMemcpy(&tok, token, 4, cudaMemcpyDeviceToHost));
  {  // One traced launch: where a layer's time goes, phase by phase (us, averaged over the layers).
    unsigned long long* trace;
    const size_t marks = static_cast<size_t>(count) * grid * kMarks;
    CK(cudaMalloc(&trace, marks * 8));
    args.trace = trace;
    launch();
    CK(cudaStreamSynchronize(s));
    args.trace = nullptr;
    std::vector<unsigned long long> tr(marks);
    CK(cudaMemcpy(tr.data(), trace, marks * 8, cudaMemcpyDeviceToHost));
    const auto at = [&](int p, int b, int k) { return static_cast<double>(tr[(static_cast<size_t>(p) * grid + b) * kMarks + k]); };
    const char* names[] = {"q/k/v", "attention", "o", "gate|up", "down", "head"};
    double span[6] = {}, wait[6] = {}, stage[6] = {}, items[6] = {}, store[6] = {};
    int n[6] = {};
    for (int p = 1; p < count; ++p) {
      double end_prev = 0, end = 0;
      for (int b = 0; b < grid; ++b) end_prev = std::max(end_prev, at(p - 1, b, 4)), end = std::max(end, at(p, b, 4));
      const int k = phases[p].kind;
      span[k] += end - end_prev, ++n[k];
      for (int b = 0; b < grid; ++b) {
        wait[k] += (at(p, b, 1) - at(p, b, 0)) / grid, stage[k] += (at(p, b, 2) - at(p, b, 1)) / grid;
        items[k] += (at(p, b, 3) - at(p, b, 2)) / grid, store[k] += (at(p, b, 4) - at(p, b, 3)) / grid;
      }
    }
    std::printf("%-10s %12s %10s %10s %10s %10s\n", "phase", "last done to", "wait", "stage x", "products", "store");
    std::printf("%-10s %12s %10s %10s %10s %10s\n", "", "last done", "(mean over blocks, us)", "", "", "");
    for (int k = 0; k < 6; ++k)
      if (n[k])
        std::printf("%-10s %12.2f %10.2f %10.2f %10.2f %10.2f\n", names[k], span[k] / n[k] / 1e3, wait[k] / n[k] / 1e3,
                    stage[k] / n[k] / 1e3, items[k] / n[k] / 1e3, store[k] / n[k] / 1e3);
    CK(cudaFree(trace));
  }
  std::printf("streaming read of the weights: %.1f us (%.0f GB/s); the step's floor (weights and cache): %.1f us\n", read_us, gbs, floor_us);
  std::printf("megakernel_step_us: %.1f\nmegakernel_vs_floor: %.3f\n", best, best / floor_us);
  std::printf("megakernel_l2_prefetch_step_us: %.1f\nmegakernel_l2_prefetch_vs_floor: %.3f\n", best_prefetch, best_prefetch / floor_us);
  const bool ok = logit_gap < 2e-2 && cache_gap < 1e-2 && untouched == 0 && tok == own_best && tok_after == tok;
  std::printf("%s\n", ok ? "step agrees with the reference" : "STEP DISAGREES");
  return ok ? 0 : 1;
}
