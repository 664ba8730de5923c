// A whole decode step as one persistent kernel (decode_step.cuh). Grown
// from scripts/cuda-experiments/decode_step_kernel.cu (session 48: a
// LLaMA-1B step 0.70-0.71 ms on an H200 against 0.78 for the kernel per op),
// made general over the shapes graph/fusion.hpp's decode_step_misfit()
// accepts and reading the runtime's own operands: separate q/k/v and
// gate/up weights, the caches as state tensors, the mask, the positions.

#include "gpu/cuda/decode_step.cuh"

#include <cuda/atomic>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>

#include "gpu/cuda/common.cuh"
#include "gpu/cuda/cuda_check.cuh"
#include "gpu/cuda/in_stream.cuh"
#include "gpu/cuda/in_stream_wait.cuh"
#include "gpu/cuda/rope.cuh"
#include "graph/attention_mask.hpp"
#include "graph/fusion.hpp"

namespace ag::gpu::cuda {

AG_CUDA_MODULE_ANCHOR()

namespace {

using bf16 = __nv_bfloat16;
using u64 = unsigned long long;

constexpr int kWarps = static_cast<int>(decode_step_warps), kThreads = kWarps * 32;
// A warp's ring: chunks in flight. Three, where x fits beside them (a width
// up to kWideFrom: LLaMA-1B's 8192); two for wider shapes (Llama 3.1 8B's
// and Mistral 7B's d_ff 14336), whose x would not fit beside three: 227 KiB
// of shared memory a block. (Two slots made LLaMA-1B 0.5% slower, session 53.)
constexpr int kSlotsNarrow = 3, kSlotsWide = 2;
constexpr int64_t kWideFrom = decode_step_max_narrow_width;  // widths above it take kSlotsWide
constexpr int kChunkMax = 2048;      // elements of a chunk at most (4 KiB)
constexpr int kMaxLayers = decode_step_max_layers;
// The head's rows in up to kMaxHeadParts phases of at most kMaxRows rows a
// block each (a block's shared sums hold kMaxRows): Llama 3's 128,256 logits
// are 972 a block on 132 SMs, more on smaller GPUs.
constexpr int kMaxHeadParts = 4;
constexpr int kMaxPhases = 5 * kMaxLayers + kMaxHeadParts;
constexpr int kMaxRows = 1024;       // a block's rows of one GEMV
constexpr int kMaxResidRows = 128;   // a block's rows of the residual (o's and down's split)
constexpr int kMaxSplits = 16;       // attention blocks a kv head
constexpr int kMaxQueryValues = 512; // query heads a kv head x head dim
constexpr int kMaxGroup = 8;
static_assert(kMaxGroup + 1 <= kWarps, "a warp for each query head of a kv head and one for its key (the q/k norms)");
constexpr int kRoundValues = 4096;   // a round of attention: rows x head dim (16 KiB of k and v)
constexpr int64_t kMaxWidth = decode_step_max_width;
// A tensor-parallel step's ranks are an in-stream group's members (the
// lowering's limit: ag::max_in_stream_members).
constexpr int kMaxRanks = in_stream_members_max;
// Phase codes of the tensor-parallel exchange's tags (tp_tag) beside the
// step's phase numbers (5 a layer and the head's parts, below 254).
constexpr int kPickPhase = 254, kEmbedPhase = 255;
static_assert(5 * kMaxLayers + kMaxHeadParts < kPickPhase, "phase numbers stay below the exchange's own codes");

enum stage : int { kQkv = 0, kAttention = 1, kO = 2, kGateUp = 3, kDown = 4, kHead = 5 };

struct layer_ptrs {
  const bf16 *wq, *wk, *wv, *wo, *wg, *wu, *wd;
  const bf16 *attn_norm, *mlp_norm;  // null: folded into the projections
  const bf16 *bq, *bk, *bv;          // q/k/v biases (Qwen2's); null: none
  const bf16 *q_norm, *k_norm;       // q/k norms' weights [dh] (Qwen3's); null: none
  bf16 *k_cache, *v_cache;           // [Hkv, C, dh]
};

// The workspace (one per compute stream), in this order.
struct workspace_layout {
  static constexpr std::size_t resid = 0;
  static constexpr std::size_t qkv = resid + kMaxWidth * 8;
  static constexpr std::size_t hidden = qkv + 3 * kMaxWidth * 8;
  static constexpr std::size_t attn_out = hidden + kMaxWidth / 2 * 8;
  static constexpr std::size_t partials = attn_out + kMaxWidth * 8;
  static constexpr std::size_t partial_floats = kMaxQueryValues + 2 * kMaxGroup;  // one attending block's
  static constexpr std::size_t best_value = partials + decode_step_max_blocks * partial_floats * 4;
  static constexpr std::size_t best_index = best_value + decode_step_max_blocks * 4;
  static constexpr std::size_t head_count = best_index + decode_step_max_blocks * 4;
  static constexpr std::size_t done = head_count + kMaxLayers * 64 * 4;
  static constexpr std::size_t epoch = done + 4;
  // Tensor-parallel steps: the job word of a launch that gave up waiting
  // for a peer (tp_give_up): every wait of the launch then ends.
  static constexpr std::size_t abort = (epoch + 4 + 7) / 8 * 8;
  static constexpr std::size_t bytes = abort + 8;
};

// A device's tensor-parallel exchange (decode_exchange_bytes, in its
// in_stream_area): what each rank pushes into every rank's memory, in
// three buffers of [kMaxRanks][kMaxWidth] tagged values (o's partial rows,
// down's, the embedding's row), then [kMaxRanks][2] words for each rank's
// best logit and its index. Three buffers, not one, because a value stays
// needed until its readers are done, which a pusher only knows from what
// the readers pushed since: rank A writes o's rows of layer l + 1 only once
// it has every rank's down rows of layer l, which each rank pushes only
// after all its blocks staged layer l's o rows (down reads silu(gate) * up,
// made from them); the same holds for down's rows with o's, and for the
// embedding: a rank's next job pushes its embedding row without waiting for
// anyone, into the buffer no one reads after layer 0.
struct exchange_layout {
  static constexpr std::size_t buffer_words = static_cast<std::size_t>(kMaxRanks) * kMaxWidth;
  static constexpr int o_buffer = 0, down_buffer = 1, embed_buffer = 2;
  static constexpr std::size_t picks = 3 * buffer_words;  // in words
  static constexpr std::size_t bytes = (picks + 2 * kMaxRanks) * 8;
};

struct step_args {
  int layers, d, ff, heads, kv_heads, vocab, cache_rows, splits, qkv_rows, attn_width;
  int head_parts;  // phases the head's rows take (kMaxHeadParts at most)
  int chunk_d, chunk_ff, chunk_attn;  // decode_step_chunk of d, ff and attn_width
  int chunk_qkv;                      // decode_step_qkv_chunk
  float eps, scale;
  const int* token;
  const bf16* embed;
  const int* positions;
  const int* cache_positions;
  const bf16* mask;  // [C]
  const bf16* head;
  const bf16* final_norm;  // null: folded
  float* logits;           // null with argmax
  int* token_out;          // null without
  unsigned* fault_word;
  u64 *resid, *qkv, *hidden, *attn_out;
  float* partials;
  float* best_value;
  int* best_index;
  unsigned *head_count, *done, *epoch;
  // Tensor parallelism (decode_step_params::tp_degree > 1; tp_* below).
  int tp_rank, tp_degree;
  int embed_rows, embed_begin, logit_begin, vocab_total;  // vocab_total: the token's range
  u64* exchange;                 // this rank's (exchange_layout)
  u64* exchange_of[kMaxRanks];   // each rank's, where this one pushes
  const unsigned* dead[kMaxRanks];   // each rank's device's death word (host-mapped)
  int slot[kMaxRanks];               // each rank's device index (a give-up's report)
  const unsigned long long* tag_word;  // the stream's job word (in_stream_job_word)
  const unsigned long long* aborted;   // this device's abort ring (cancelled jobs)
  unsigned long long* faults;          // this device's fault ring, then the give-up's detail
  unsigned long long* abort;           // workspace_layout::abort
  long long timeout_ns;
  double inv[64];  // rope inverse frequencies, dh / 2 of them
  layer_ptrs layer[kMaxLayers];
};

// ---- phases -------------------------------------------------------------

__device__ __forceinline__ int stage_of(const step_args& a, int p) { return p >= 5 * a.layers ? kHead : p % 5; }
__device__ __forceinline__ int phases_of(const step_args& a) { return 5 * a.layers + a.head_parts; }
__device__ __forceinline__ int rows_of(const step_args& a, int st) {
  switch (st) {
    case kQkv: return a.qkv_rows;
    case kO: return a.d;
    case kGateUp: return 2 * a.ff;  // virtual rows: 2i gate row i, 2i + 1 up row i
    case kDown: return a.d;
    case kHead: return a.vocab;
    default: return 0;
  }
}
__device__ __forceinline__ int width_of(const step_args& a, int st) {
  return st == kO ? a.attn_width : st == kDown ? a.ff : a.d;
}
// Elements of the chunks phase stage `st` streams a row in (decode_step_chunk
// of its width, worked out on the host; q/k/v's decode_step_qkv_chunk).
__device__ __forceinline__ int chunk_of(const step_args& a, int st) {
  return st == kO ? a.chunk_attn : st == kDown ? a.chunk_ff : st == kQkv ? a.chunk_qkv : a.chunk_d;
}
// A row's slots in the shared sums: its chunks' products are added there by
// whichever warp reads each chunk, in the order the warps finish. Two
// floats add to the same bits in either order, so a slot that takes at
// most two chunks (one slot for every two) sums the same every run, and so
// does the step, down to its greedy token. One slot a row (float atomics'
// order showing in the last bits) only where a block's rows x slots would
// not fit kMaxRows: on 132 SMs, a vocabulary over about 67,000 with a
// d_model of three or four chunks (6144, 8192), or over about 45,000 with
// five (2560).
__device__ __forceinline__ int sums_per_row(int chunks, int rows) {
  const int pairs = (chunks + 1) / 2;
  return rows * pairs <= kMaxRows ? pairs : 1;
}
// A layer's weights as the loads read them: from shared memory (the
// kernel's parameters, indexed by a layer only known at run time, cost a
// constant-cache miss on the path that issues every chunk's load).
enum weight_slot : int { kWq, kWk, kWv, kWo, kWg, kWu, kWd, kWeightSlots };
// Row r of phase p's matrix (its virtual rows for q/k/v and gate|up);
// `w` the shared table, kWeightSlots a layer.
__device__ __forceinline__ const bf16* row_of(const step_args& a, const bf16* const* w, int p, int r) {
  const int st = stage_of(a, p);
  if (st == kHead) return a.head + static_cast<int64_t>(r) * a.d;
  const bf16* const* L = w + (p / 5) * kWeightSlots;
  switch (st) {
    case kQkv: {
      const int q = a.attn_width, kv = (a.qkv_rows - q) / 2;
      if (r < q) return L[kWq] + static_cast<int64_t>(r) * a.d;
      if (r < q + kv) return L[kWk] + static_cast<int64_t>(r - q) * a.d;
      return L[kWv] + static_cast<int64_t>(r - q - kv) * a.d;
    }
    case kO: return L[kWo] + static_cast<int64_t>(r) * a.attn_width;
    case kGateUp: return L[(r & 1) ? kWu : kWg] + static_cast<int64_t>(r >> 1) * a.d;
    default: return L[kWd] + static_cast<int64_t>(r) * a.ff;
  }
}

// ---- tagged hand-overs ---------------------------------------------------
// A value and the tag of the phase that stored it in one 8-byte access (as
// NCCL's LL protocol does), so a reader that sees the tag sees the value.
// The tag carries the launch's epoch: a value of an earlier launch never
// matches.

__device__ __forceinline__ unsigned tag_of(unsigned epoch, int phase) {
  return (epoch << 8) | static_cast<unsigned>(phase);
}
__device__ __forceinline__ void put(u64* at, float v, unsigned tag) {
  const u64 packed = (static_cast<u64>(tag) << 32) | __float_as_uint(v);
  asm volatile("st.relaxed.gpu.global.b64 [%0], %1;" ::"l"(at), "l"(packed) : "memory");
}
__device__ __forceinline__ u64 peek(const u64* at) {
  u64 v;
  asm volatile("ld.relaxed.gpu.global.b64 %0, [%1];" : "=l"(v) : "l"(at) : "memory");
  return v;
}
__device__ __forceinline__ bool tagged(u64 v, unsigned tag) { return static_cast<unsigned>(v >> 32) == tag; }
// kTp: a tensor-parallel step's waits also end once the launch gave up
// (`abort` holds its job word, tp_give_up), so that no block waits for a
// value its peer will never hand on. Asked every 64 polls: a load of the
// device's own memory.
template <bool kTp>
__device__ __forceinline__ bool stopped(unsigned i, const unsigned long long* abort, unsigned long long job) {
  if constexpr (kTp) return (i & 63u) == 0 && *reinterpret_cast<const volatile unsigned long long*>(abort) == job;
  return false;
}
template <bool kTp = false>
__device__ __forceinline__ unsigned take_bits(const u64* at, unsigned tag, const unsigned long long* abort = nullptr,
                                              unsigned long long job = 0) {
  u64 v = peek(at);
  for (unsigned i = 1; !tagged(v, tag); ++i) {
    if (stopped<kTp>(i, abort, job)) return 0;
    v = peek(at);
  }
  return static_cast<unsigned>(v);
}
template <bool kTp = false>
__device__ __forceinline__ float take(const u64* at, unsigned tag, const unsigned long long* abort = nullptr,
                                      unsigned long long job = 0) {
  return __uint_as_float(take_bits<kTp>(at, tag, abort, job));
}
// f(i, payload) for every i < n of base[i] (this thread's: i = threadIdx.x
// + k * kThreads) once tagged; eight loads a thread in flight before any is
// checked. The values still stale are read again together, a pass at a
// time: a thread that waited on one value (the last producer's) then finds
// the others in one more round trip, not one round trip each.
template <bool kTp = false, class F>
__device__ __forceinline__ void take_each(const u64* base, int n, unsigned tag, F&& f,
                                          const unsigned long long* abort = nullptr, unsigned long long job = 0) {
  constexpr int kBatch = 8;
  for (int i0 = threadIdx.x; i0 < n; i0 += kBatch * kThreads) {
    u64 v[kBatch];
#pragma unroll
    for (int k = 0; k < kBatch; ++k)
      if (i0 + k * kThreads < n) v[k] = peek(base + i0 + k * kThreads);
    for (unsigned polls = 1;; ++polls) {
      if (stopped<kTp>(polls, abort, job)) break;  // the values are what was read: the launch's result is void
      bool stale = false;
#pragma unroll
      for (int k = 0; k < kBatch; ++k)
        if (i0 + k * kThreads < n && !tagged(v[k], tag)) {
          stale = true;
          v[k] = peek(base + i0 + k * kThreads);
        }
      if (!stale) break;
    }
#pragma unroll
    for (int k = 0; k < kBatch; ++k)
      if (i0 + k * kThreads < n) f(i0 + k * kThreads, static_cast<unsigned>(v[k]));
  }
}

__device__ __forceinline__ unsigned bump(unsigned* counter) {
  ::cuda::atomic_ref<unsigned, ::cuda::thread_scope_device> c(*counter);
  return c.fetch_add(1, ::cuda::memory_order_acq_rel);
}
__device__ __forceinline__ float round_bf16(float v) { return __bfloat162float(__float2bfloat16_rn(v)); }

// ---- the tensor-parallel exchange ----------------------------------------
// A tensor-parallel step's ranks (decode_step_params::tp_degree) hand each
// other the rows an all-reduce would sum, as tagged 8-byte values too: rank
// r's value of row i goes into slot [r][i] of a buffer (exchange_layout) in
// every rank's memory, stored at system scope (over NVLink, or into the
// same GPU's memory for logical devices), and each rank sums the slots of a
// row in rank order, as the in-stream all-reduce does, so that all ranks
// hold the same bits. The tags carry the job (the stream's collective tag
// word, set before the launch) and the phase: a value of another job or
// phase never matches. A wait on a peer gives up when the peer's device
// died, the job was cancelled here, or cuda_collective_timeout_s passed
// (tp_give_up); the launch then runs to its end on whatever it reads, and
// the job fails through the device's fault ring (device::collective_fault).

__device__ __forceinline__ unsigned tp_tag(unsigned long long job, int phase) {
  return (static_cast<unsigned>(job & 0xffffffu) << 8) | static_cast<unsigned>(phase);
}
__device__ __forceinline__ u64 peek_sys(const u64* at) {
  u64 v;
  asm volatile("ld.relaxed.sys.global.b64 %0, [%1];" : "=l"(v) : "l"(at) : "memory");
  return v;
}
// Row i's value v of this rank into `buffer` of every rank.
__device__ __forceinline__ void tp_push(const step_args& a, int buffer, int i, float v, unsigned tag) {
  const u64 packed = (static_cast<u64>(tag) << 32) | __float_as_uint(v);
  const std::size_t at = buffer * exchange_layout::buffer_words + static_cast<std::size_t>(a.tp_rank) * kMaxWidth + i;
  for (int r = 0; r < a.tp_degree; ++r)
    asm volatile("st.relaxed.sys.global.b64 [%0], %1;" ::"l"(a.exchange_of[r] + at), "l"(packed) : "memory");
}
__device__ __forceinline__ bool tp_aborted(const step_args& a, unsigned long long job) {
  return *reinterpret_cast<const volatile unsigned long long*>(a.abort) == job;
}
// Whether a wait on rank `from` since t0 ends: the launch gave up already
// (nothing more to note), or it gives up now (a peer's device died, the
// job was cancelled here, the timeout: in_stream_wait.cuh's gave_up, over
// every peer's death word), noted here. Asked every 1024 polls: the host-mapped words cost a PCIe
// read each.
__device__ bool tp_gave_up(const step_args& a, unsigned long long job, long long t0, unsigned tag, u64 seen, int from) {
  if (tp_aborted(a, job)) return true;
  bool over = global_ns() - t0 > a.timeout_ns;
  for (int r = 0; r < a.tp_degree && !over; ++r)
    over = r != a.tp_rank && *reinterpret_cast<const volatile unsigned*>(a.dead[r]) != 0;
  for (int j = 0; j < in_stream_aborts && !over; ++j)
    over = reinterpret_cast<const volatile unsigned long long*>(a.aborted)[j] == job;
  if (!over) return false;
  // The launch's other waits end (abort), the first give-up on this device
  // says what it waited for (as an in-stream part's does; the top bits of
  // the fourth word mark a decode step's, with the rank waited for), and
  // the job is in the fault ring.
  atomicExch(a.abort, job);
  note_give_up(a.faults, tag, seen, a.slot[from], blockIdx.x, (1ull << 62) | static_cast<unsigned>(from));
  note_fault(a.faults, job);
  return true;
}
// Rank `from`'s value at `at` once tagged (its bits; 0 once the launch gave up).
__device__ unsigned tp_take(const step_args& a, unsigned long long job, const u64* at, unsigned tag, int from) {
  u64 v = peek_sys(at);
  long long t0 = 0;
  for (unsigned i = 1; !tagged(v, tag); ++i) {
    if (i == 1) t0 = global_ns();
    if ((i & 1023u) == 0 && tp_gave_up(a, job, t0, tag, v, from)) return 0;
    v = peek_sys(at);
  }
  return static_cast<unsigned>(v);
}
// Row i of a buffer (its slots at `base`): the sum over ranks in rank order,
// rounded to bf16 as the all-reduce's output is.
__device__ float tp_sum(const step_args& a, unsigned long long job, const u64* base, int i, unsigned tag) {
  float acc = 0.f;
  for (int r = 0; r < a.tp_degree; ++r) acc += __uint_as_float(tp_take(a, job, base + r * kMaxWidth + i, tag, r));
  return round_bf16(acc);
}
// take_each over a buffer's summed rows: f(i, bits of tp_sum) for this
// thread's rows i < n, eight of them at a time, rank after rank (each
// rank's eight loads in flight before any is checked; one rank's values
// only, to keep the registers the step's other phases need).
template <class F>
__device__ __forceinline__ void tp_sum_each(const step_args& a, unsigned long long job, const u64* base, int n,
                                            unsigned tag, F&& f) {
  constexpr int kBatch = 8;
  for (int i0 = threadIdx.x; i0 < n; i0 += kBatch * kThreads) {
    float acc[kBatch] = {};
    for (int r = 0; r < a.tp_degree; ++r) {
      const u64* from = base + r * kMaxWidth;
      u64 v[kBatch];
#pragma unroll
      for (int k = 0; k < kBatch; ++k)
        if (i0 + k * kThreads < n) v[k] = peek_sys(from + i0 + k * kThreads);
      long long t0 = 0;
      for (unsigned polls = 1;; ++polls) {
        bool stale = false;
        u64 seen = 0;
#pragma unroll
        for (int k = 0; k < kBatch; ++k)
          if (i0 + k * kThreads < n && !tagged(v[k], tag)) {
            stale = true;
            seen = v[k];
            v[k] = peek_sys(from + i0 + k * kThreads);
          }
        if (!stale) break;
        if (polls == 1) t0 = global_ns();
        if ((polls & 1023u) == 0 && tp_gave_up(a, job, t0, tag, seen, r)) break;
      }
#pragma unroll
      for (int k = 0; k < kBatch; ++k)
        if (i0 + k * kThreads < n) acc[k] += __uint_as_float(static_cast<unsigned>(v[k]));  // rank order
    }
#pragma unroll
    for (int k = 0; k < kBatch; ++k)
      if (i0 + k * kThreads < n) f(i0 + k * kThreads, __float_as_uint(round_bf16(acc[k])));
  }
}

// ---- bulk copies into shared memory --------------------------------------

__device__ __forceinline__ unsigned shared_address(const void* p) {
  return static_cast<unsigned>(__cvta_generic_to_shared(p));
}
__device__ __forceinline__ void mbar_init(u64* b, unsigned count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(shared_address(b)), "r"(count) : "memory");
}
__device__ __forceinline__ void mbar_expect_tx(u64* b, unsigned bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(shared_address(b)), "r"(bytes)
               : "memory");
}
__device__ __forceinline__ void mbar_wait(u64* b, unsigned parity) {
  unsigned done = 0;
  while (!done)
    asm volatile("{ .reg .pred p; mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2; selp.u32 %0, 1, 0, p; }"
                 : "=r"(done)
                 : "r"(shared_address(b)), "r"(parity)
                 : "memory");
}
__device__ __forceinline__ void bulk_load(void* dst, const void* src, unsigned bytes, u64* bar) {
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(
          shared_address(dst)),
      "l"(src), "r"(bytes), "r"(shared_address(bar))
      : "memory");
}

// The same for data read once a step (the weights): its lines are the first
// L2 evicts, so that what is read again stays there (the caches, the
// hand-overs). Measured on an H200: 0.751-0.756 ms a LLaMA-1B step against
// 0.767-0.780 without the hint, alternated in one call (session 50).
__device__ __forceinline__ void bulk_load_read_once(void* dst, const void* src, unsigned bytes, u64* bar) {
  u64 policy;
  asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(policy));
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint [%0], [%1], %2, [%3], %4;" ::"r"(
          shared_address(dst)),
      "l"(src), "r"(bytes), "r"(shared_address(bar)), "l"(policy)
      : "memory");
}

// x . w over 8 bf16 pairs packed in 16 bytes, into two accumulators.
__device__ __forceinline__ void fma8_two(const uint4& w, const uint4& x, float& lo, float& hi) {
  const unsigned a[4] = {w.x, w.y, w.z, w.w}, b[4] = {x.x, x.y, x.z, x.w};
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    lo = fmaf(__uint_as_float(a[k] << 16), __uint_as_float(b[k] << 16), lo);
    hi = fmaf(__uint_as_float(a[k] & 0xffff0000u), __uint_as_float(b[k] & 0xffff0000u), hi);
  }
}

// A warp's next weight load: its item walk.item of phase g, `chunk`
// elements of a row each (decode_step_item_walk), then the items of the
// next phase that has any. Kept in shared memory and walked by the warp's
// lane 0 alone: the other lanes hold no registers for it, and no load's row
// and chunk take a division (LLaMA-1B 0.893-0.894 -> 0.882-0.889 ms a token
// on an H100, alternated, session 81).
struct load_cursor {
  int g, chunk;
  decode_step_item_walk walk;
};
// Settles `lc` on the first item of phase g or of the next phase that has
// one for this warp (g == phases: none left).
__device__ __forceinline__ void settle_loads(const step_args& a, load_cursor& lc, int g, int phases, int warp,
                                             const int* count) {
  while (g < phases && warp >= count[g]) ++g;
  lc.g = g;
  if (g >= phases) return;
  const int st = stage_of(a, g);
  lc.chunk = chunk_of(a, st);
  lc.walk.start(warp, kWarps, width_of(a, st) / lc.chunk);
}
__device__ __forceinline__ void advance_loads(const step_args& a, load_cursor& lc, int phases, int warp, const int* count) {
  lc.walk.next(kWarps);
  if (lc.walk.item >= count[lc.g]) settle_loads(a, lc, lc.g + 1, phases, warp, count);
}

// The cache rows from the first to the last the step's mask leaves visible
// (visible_rows).
struct key_range {
  int lo, hi;
};
// The keys of the cache one attending block covers: [k0, k1), its share of
// the visible rows.
struct key_span {
  int h, s, k0, k1;
};
__device__ __forceinline__ key_span span_of(const step_args& a, key_range live) {
  const int per = (live.hi - live.lo + a.splits - 1) / a.splits, s = blockIdx.x % a.splits;
  const int k0 = min(live.hi, live.lo + s * per);
  return {static_cast<int>(blockIdx.x) / a.splits, s, k0, min(live.hi, k0 + per)};
}

// The mask's visible rows (above attention_hidden_limit, graph/
// attention_mask.hpp), found by every attending block at the kernel's start
// (the first half: each warp's range into `first` / `last`; the second,
// after the block's barrier: the block's; every row when the mask hides
// them all). A generator's mask hides the cache's rows past the sequence,
// so the spans share out only the rows it holds: a sequence of 100 tokens
// in a cache of 2048 reads 100 rows a layer. The loads are in flight beside
// the step's first ones.
__device__ __forceinline__ void scan_visible_rows(const step_args& a, unsigned* first_of_warp, unsigned* last_of_warp) {
  unsigned first = 0xffffffffu, last = 0u;
#pragma unroll 4
  for (int j = threadIdx.x; j < a.cache_rows; j += kThreads)
    if (__bfloat162float(a.mask[j]) > attention_hidden_limit) first = min(first, static_cast<unsigned>(j)), last = j + 1u;
  first = __reduce_min_sync(0xffffffffu, first);
  last = __reduce_max_sync(0xffffffffu, last);
  if ((threadIdx.x & 31) == 0) first_of_warp[threadIdx.x >> 5] = first, last_of_warp[threadIdx.x >> 5] = last;
}
__device__ __forceinline__ key_range visible_rows(const step_args& a, const unsigned* first_of_warp,
                                                 const unsigned* last_of_warp) {
  unsigned first = 0xffffffffu, last = 0u;
#pragma unroll
  for (int w = 0; w < kWarps; ++w) first = min(first, first_of_warp[w]), last = max(last, last_of_warp[w]);
  return last > first ? key_range{static_cast<int>(first), static_cast<int>(last)} : key_range{0, a.cache_rows};
}

template <int DH>
__device__ __forceinline__ bf16* cache_row(bf16* cache, const step_args& a, int h, int key) {
  return cache + (static_cast<int64_t>(h) * a.cache_rows + key) * DH;
}

// Brings rows [r0, r0 + n) of kv head h's k and v caches of `layer` into
// `rows` (k's, then v's at kRoundValues elements on), complete on `bar`.
template <int DH>
__device__ __forceinline__ void fetch_rows(const step_args& a, bf16* const* caches, int layer, int h, int r0, int n,
                                           bf16* rows, u64* bar) {
  const unsigned bytes = static_cast<unsigned>(n) * DH * 2;
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");  // generic stores there before
  mbar_expect_tx(bar, 2 * bytes);
  if (n > 0) {
    bulk_load(rows, cache_row<DH>(caches[2 * layer], a, h, r0), bytes, bar);
    bulk_load(rows + kRoundValues, cache_row<DH>(caches[2 * layer + 1], a, h, r0), bytes, bar);
  }
}

// The mask of keys [r0, r0 + n) into `mask` (the block's last threads,
// which have no q/k/v value to take beside it).
template <int DH>
__device__ __forceinline__ void load_mask(const step_args& a, int r0, int n, float* mask) {
  constexpr int kRows = kRoundValues / DH;
  const int i = static_cast<int>(threadIdx.x) - (kThreads - kRows);
  if (i >= 0 && i < n) mask[i] = __bfloat162float(a.mask[r0 + i]);
}

// One attending block's part of a layer's attention: kv head h, its span of
// keys in rounds of kRoundValues / DH rows, the first round already on its
// way (fetch_rows after q/k/v's products); the last block of the head
// combines the spans into the head's output.
template <int DH, bool kQkNorm, bool kTp>
__device__ void attention_block(const step_args& a, int layer, int phase, bf16* rows, u64* bar, unsigned& bar_uses,
                                unsigned epoch, const float* rope_cs, const float* rope_sn, bf16* const* caches,
                                float* mask, int at, key_range live, unsigned long long job) {
  constexpr int kRows = kRoundValues / DH, kPerLane = DH / 32;
  __shared__ float q[kMaxQueryValues], k_new[DH], v_new[DH];
  __shared__ float scores[kMaxGroup][kRows], run_max[kMaxGroup], run_sum[kMaxGroup], corr[kMaxGroup];
  __shared__ bool last;
  const key_span sp = span_of(a, live);
  const int h = sp.h, t = threadIdx.x, warp = t >> 5, lane = t & 31;
  // `mask` holds the first round's (every layer's: loaded once by the
  // kernel) unless the span has more rounds, whose masks replace it.
  if (sp.k1 - sp.k0 > kRows) load_mask<DH>(a, sp.k0, kRows, mask);
  const int group = a.heads / a.kv_heads, qv = group * DH;
  const unsigned ready = tag_of(epoch, phase - 1);  // q/k/v's
  const int q_rows = a.heads * DH, kv_rows = a.kv_heads * DH;
  for (int i = t; i < qv + 2 * DH; i += kThreads) {
    if (i < qv) q[i] = take<kTp>(a.qkv + h * qv + i, ready, a.abort, job);
    else if (i < qv + DH) k_new[i - qv] = take<kTp>(a.qkv + q_rows + h * DH + i - qv, ready, a.abort, job);
    else v_new[i - qv - DH] = take<kTp>(a.qkv + q_rows + kv_rows + h * DH + i - qv - DH, ready, a.abort, job);
  }
  if (t < kMaxGroup) run_max[t] = -INFINITY, run_sum[t] = 0.f;
  __syncthreads();
  // Qwen3's q/k norms: warp w < group normalises query head w, warp group
  // the new key, over its DH values, rounded as the rms_norm op rounds
  // ((x r) w in f32, then bf16; group + 1 <= kMaxGroup + 1 <= kWarps). A
  // variant of the kernel of its own: the code in LLaMA's kernel, even
  // behind a branch not taken, cost it 0.004 ms a token (LLaMA-1B 0.717-0.719
  // -> 0.721-0.723 on an H200, alternated in one call, session 64).
  if constexpr (kQkNorm) {
    const layer_ptrs& L = a.layer[layer];
    if (warp <= group) {
      float* x = warp < group ? q + warp * DH : k_new;
      const bf16* w = warp < group ? L.q_norm : L.k_norm;
      float s2 = 0.f;
      for (int i = lane; i < DH; i += 32) s2 += x[i] * x[i];
      const float r = rsqrtf(warp_sum(s2) * (1.f / DH) + a.eps);
      for (int i = lane; i < DH; i += 32) x[i] = round_bf16(x[i] * r * __bfloat162float(w[i]));
    }
    __syncthreads();
  }
  // The ropes (neox: pairs i, i + DH / 2), rounded as the rope op rounds.
  for (int i = t; i < (group + 1) * (DH / 2); i += kThreads) {
    float* x = i < group * (DH / 2) ? q + (i / (DH / 2)) * DH : k_new;
    const int k = i % (DH / 2);
    const float sn = rope_sn[k], cs = rope_cs[k];
    const float lo = x[k], hi = x[k + DH / 2];
    x[k] = round_bf16(lo * cs - hi * sn);
    x[k + DH / 2] = round_bf16(hi * cs + lo * sn);
  }
  __syncthreads();
  const bool stores = at >= 0 && at < a.cache_rows;
  if (sp.s == 0 && stores && t < DH) {  // the new rows into the caches
    cache_row<DH>(caches[2 * layer], a, h, at)[t] = __float2bfloat16_rn(k_new[t]);
    cache_row<DH>(caches[2 * layer + 1], a, h, at)[t] = __float2bfloat16_rn(v_new[t]);
  }
  // The weighted values: warp w takes query head w % group and every
  // parts-th key from w / group; a lane kPerLane dims.
  const int parts = kWarps / group, g_mine = warp % group, part = warp / group;
  float acc_part[kPerLane] = {};
  for (int r0 = sp.k0; r0 < sp.k1; r0 += kRows) {
    const int n = min(kRows, sp.k1 - r0);
    if (r0 != sp.k0) {  // later rounds: fetched now (the first came with q/k/v)
      __syncthreads();  // every thread done with the rows and the mask of the round before
      if (t == 0) fetch_rows<DH>(a, caches, layer, h, r0, n, rows, bar);
      load_mask<DH>(a, r0, n, mask);
      __syncthreads();
    }
    mbar_wait(bar, bar_uses & 1u);
    ++bar_uses;
    // Scores: a warp a key, a lane kPerLane dims, every query head at once;
    // the new row where it is stored, as computed (the cache's may be stale).
    for (int i = warp; i < n; i += kWarps) {
      const bool fresh = stores && r0 + i == at;
      float kd[kPerLane];
#pragma unroll
      for (int u = 0; u < kPerLane; ++u)
        kd[u] = fresh ? k_new[lane * kPerLane + u] : __bfloat162float(rows[i * DH + lane * kPerLane + u]);
      const float m = mask[i];
      for (int g = 0; g < group; ++g) {
        float dot = 0.f;
#pragma unroll
        for (int u = 0; u < kPerLane; ++u) dot = fmaf(q[g * DH + lane * kPerLane + u], kd[u], dot);
        dot = warp_sum(dot);
        if (lane == 0) scores[g][i] = (dot + m) * a.scale;
      }
    }
    __syncthreads();
    if (warp < group) {  // the running softmax of head `warp`
      float m = -INFINITY;
      for (int i = lane; i < n; i += 32) m = fmaxf(m, scores[warp][i]);
      m = warp_max(m);
      const float m_new = fmaxf(run_max[warp], m);
      float sum = 0.f;
      for (int i = lane; i < n; i += 32) {
        const float p = __expf(scores[warp][i] - m_new);
        scores[warp][i] = p;
        sum += p;
      }
      sum = warp_sum(sum);
      if (lane == 0) {
        const float c = __expf(run_max[warp] - m_new);  // 0 on the first round
        corr[warp] = c;
        run_sum[warp] = run_sum[warp] * c + sum;
        run_max[warp] = m_new;
      }
    }
    __syncthreads();
    if (part < parts) {
      const float c = corr[g_mine];
#pragma unroll
      for (int u = 0; u < kPerLane; ++u) acc_part[u] *= c;
      for (int i = part; i < n; i += parts) {
        const float p = scores[g_mine][i];
        const bool fresh = stores && r0 + i == at;
#pragma unroll
        for (int u = 0; u < kPerLane; ++u) {
          const int dim = lane * kPerLane + u;
          const float v = fresh ? v_new[dim] : __bfloat162float(rows[kRoundValues + i * DH + dim]);
          acc_part[u] = fmaf(p, v, acc_part[u]);
        }
      }
    }
  }
  if (sp.k0 >= sp.k1) {  // an empty span: its fetch (nothing) still completes the barrier's phase
    mbar_wait(bar, bar_uses & 1u);
    ++bar_uses;
  }
  // The parts summed through the rows' buffer (the last round is done with it).
  __syncthreads();
  float* parts_sum = reinterpret_cast<float*>(rows);
  if (part < parts)
#pragma unroll
    for (int u = 0; u < kPerLane; ++u) parts_sum[warp * DH + lane * kPerLane + u] = acc_part[u];
  __syncthreads();
  float* mine = a.partials + static_cast<int64_t>(blockIdx.x) * workspace_layout::partial_floats;
  if (t < qv) {
    const int g = t / DH, dim = t % DH;
    float acc = 0.f;
    for (int k = 0; k < parts; ++k) acc += parts_sum[(k * group + g) * DH + dim];
    mine[t] = acc;
  }
  if (t < group) mine[qv + 2 * t] = run_max[t], mine[qv + 2 * t + 1] = run_sum[t];
  __syncthreads();
  unsigned* counter = a.head_count + layer * 64 + h;
  if (t == 0) last = bump(counter) == static_cast<unsigned>(a.splits - 1);
  __syncthreads();
  if (!last) return;
  if (t == 0) *counter = 0;  // the last of this launch's bumps: zero for the next launch
  // The head's spans combined. Every load of a pass is in flight at once and
  // lands in shared memory (cp.async, no register held across the wait), so
  // the step's critical path waits one L2 round trip here, not one per few
  // splits. The splits' values go to the rows' buffer (the parts' sum, its
  // last reader, is done), as many splits a pass as fit; their running maxes
  // and sums to the scores' buffer (free too). The 4-byte copies may read
  // through L1, which holds this SM's reads of the same records in earlier
  // layers; the counter's acquire above invalidates it first (CCTL.IVALL
  // after the atomic in the SASS, as the memory model requires).
  const float* first = a.partials + static_cast<int64_t>(h) * a.splits * workspace_layout::partial_floats;
  const auto record = [&](int j) { return first + static_cast<int64_t>(j) * workspace_layout::partial_floats; };
  float* stats = &scores[0][0];  // [split][max, sum of each query head]
  static_assert(kMaxSplits * 2 * kMaxGroup <= kMaxGroup * kRows, "the combine's stats fit the scores' buffer");
  float* values = reinterpret_cast<float*>(rows);
  const int per_pass = kRoundValues / qv, vecs = qv / 4;  // 16-byte pieces of a split's values
  float m = -INFINITY, num = 0.f, den = 0.f;
  for (int j0 = 0; j0 < a.splits; j0 += per_pass) {
    const int n = min(per_pass, a.splits - j0);
    if (j0 > 0) __syncthreads();  // the pass before is read
    for (int i = t; i < n * vecs; i += kThreads) cp_async16(values + 4 * i, record(j0 + i / vecs) + 4 * (i % vecs), true);
    if (j0 == 0 && t < a.splits * 2 * group) cp_async4(stats + t, record(t / (2 * group)) + qv + t % (2 * group));
    cp_async_commit();
    cp_async_wait_all();
    __syncthreads();
    if (t < qv) {
      const int g = t / DH;
      if (j0 == 0)
        for (int j = 0; j < a.splits; ++j) m = fmaxf(m, stats[j * 2 * group + 2 * g]);
      for (int j = 0; j < n; ++j) {
        const float* st = stats + (j0 + j) * 2 * group + 2 * g;
        const float w = __expf(st[0] - m);  // an empty span: max -inf, weight 0
        num = fmaf(w, values[j * qv + t], num), den = fmaf(w, st[1], den);
      }
    }
  }
  if (t < qv) put(a.attn_out + h * qv + t, round_bf16(num / den), tag_of(epoch, phase));
  __syncthreads();  // the rows' buffer is x's next, staged by every thread
}

// `ov` at `oi` into the best so far: the larger value, the lower index
// among equal ones (NaN never wins), so the pick is the same in any order.
__device__ __forceinline__ void better(float& v, int& i, float ov, int oi) {
  if (ov > v || (ov == v && oi < i)) v = ov, i = oi;
}
// The best of every thread's (value, index) of the block, in every thread.
__device__ __forceinline__ void block_best(float& v, int& i, float* reduce, int* reduce_index) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) better(v, i, __shfl_xor_sync(0xffffffffu, v, o), __shfl_xor_sync(0xffffffffu, i, o));
  if ((threadIdx.x & 31) == 0) reduce[threadIdx.x >> 5] = v, reduce_index[threadIdx.x >> 5] = i;
  __syncthreads();
  for (int w = 0; w < kWarps; ++w) better(v, i, reduce[w], reduce_index[w]);
  __syncthreads();  // read by every thread before the arrays are written again
}

// kTp: one rank of a tensor-parallel step (the exchange above): its
// residual rows come from every rank's o and down partials, its embedding
// row from the rank whose slice holds the token, and the token from every
// rank's best logit. A variant of its own, as kQkNorm is.
template <int DH, int kSlots, bool kQkNorm, bool kTp>
__global__ void __launch_bounds__(kThreads, 1) decode_step_kernel(const __grid_constant__ step_args a) {
  extern __shared__ __align__(128) unsigned char dynamic_shared[];
  __shared__ int first_row[kMaxPhases], item_count[kMaxPhases];
  __shared__ u64 full[kWarps * kSlots], span_bar;
  // sums: a GEMV's products, `spr` slots a row (sums_per_row below), zero
  // between phases.
  __shared__ float sums[kMaxRows], reduce[kWarps], inv_rms;
  __shared__ float resid_rows[kMaxResidRows];
  __shared__ int reduce_index[kWarps];
  __shared__ bool last_block;  // this block bumped the step's done counter last
  __shared__ const bf16* weights[kMaxLayers * kWeightSlots];
  __shared__ bf16* caches[kMaxLayers * 2];  // each layer's k and v caches
  __shared__ float mask[kRoundValues / DH];  // the first round's (attending blocks)
  __shared__ int cache_at;
  __shared__ float rope_cs[64], rope_sn[64];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, blocks = gridDim.x;
  const int phases = phases_of(a);
  const unsigned epoch = *a.epoch + 1;
  unsigned char* my_ring = dynamic_shared + static_cast<size_t>(warp) * kSlots * kChunkMax * 2;
  uint4* xs = reinterpret_cast<uint4*>(dynamic_shared + static_cast<size_t>(kWarps) * kSlots * kChunkMax * 2);
  bf16* xs_elems = reinterpret_cast<bf16*>(xs);
  int token = a.token[0];
  if (token < 0 || token >= (kTp ? a.vocab_total : a.vocab)) {
    if (threadIdx.x == 0 && blockIdx.x == 0 && a.fault_word) atomicCAS(a.fault_word, fault_none, fault_get_rows_oob);
    token = -1;  // x0 is zeros, as get_rows leaves a row it cannot read
  }
  // The job's word (the stream's collective tag, set before the launch by a
  // kernel that ended before this one started: no PDL here).
  const unsigned long long job = kTp ? *reinterpret_cast<const volatile unsigned long long*>(a.tag_word) : 0ull;
  const bf16* x0 = nullptr;
  if constexpr (kTp) {
    // This rank's slice of the embedding holds the token's row, or zeros
    // (the vocabulary-parallel get_rows); every rank's row summed is the
    // row. Pushed first: the peers' first phase waits for it. A block its
    // share of the row.
    if (token >= a.embed_begin && token < a.embed_begin + a.embed_rows)
      x0 = a.embed + static_cast<int64_t>(token - a.embed_begin) * a.d;
    const int r1 = static_cast<int>((blockIdx.x + 1LL) * a.d / blocks);
    for (int i = static_cast<int>(static_cast<long long>(blockIdx.x) * a.d / blocks) + threadIdx.x; i < r1; i += kThreads)
      tp_push(a, exchange_layout::embed_buffer, i, x0 ? __bfloat162float(x0[i]) : 0.f, tp_tag(job, kEmbedPhase));
  } else if (token >= 0) {
    x0 = a.embed + static_cast<int64_t>(token) * a.d;
  }
  for (int p = threadIdx.x; p < phases; p += blockDim.x) {
    // A GEMV's rows [first, end) for this block, split evenly and rotated
    // by the phase so that uneven splits' extra rows fall on different
    // blocks; o and down keep one split for the whole step, so that a
    // block's residual rows stay in its shared memory; gate|up's blocks take
    // whole quads of virtual rows (gate i, up i, gate i + 1, up i + 1), so
    // that they hand on silu(gate) * up themselves, as pairs of bf16.
    const int st = stage_of(a, p), n = rows_of(a, st);
    first_row[p] = item_count[p] = 0;
    if (st == kAttention) continue;
    const bool residual = st == kO || st == kDown;
    // The head's parts split one rotation's rows among themselves.
    const int rotation = st == kHead ? 5 * a.layers : p;
    const long long r = (blockIdx.x + (residual ? 0LL : 53LL * rotation)) % blocks;
    const int align = st == kGateUp ? ~3 : ~0;
    int first = static_cast<int>(r * n / blocks) & align;
    int end = r + 1 == blocks ? n : static_cast<int>((r + 1) * n / blocks) & align;
    if (st == kHead) {
      const int part = p - 5 * a.layers, len = end - first;
      end = first + static_cast<int>(static_cast<long long>(len) * (part + 1) / a.head_parts);
      first += static_cast<int>(static_cast<long long>(len) * part / a.head_parts);
    }
    const int k = width_of(a, st);
    first_row[p] = first;
    item_count[p] = (end - first) * (k / chunk_of(a, st));
  }
  for (int i = threadIdx.x; i < kMaxRows; i += blockDim.x) sums[i] = 0.f;
  for (int i = threadIdx.x; i < a.layers * kWeightSlots; i += blockDim.x) {
    const layer_ptrs& L = a.layer[i / kWeightSlots];
    switch (i % kWeightSlots) {
      case kWq: weights[i] = L.wq; break;
      case kWk: weights[i] = L.wk; break;
      case kWv: weights[i] = L.wv; break;
      case kWo: weights[i] = L.wo; break;
      case kWg: weights[i] = L.wg; break;
      case kWu: weights[i] = L.wu; break;
      default: weights[i] = L.wd;
    }
  }
  for (int i = threadIdx.x; i < 2 * a.layers; i += blockDim.x)
    caches[i] = (i & 1) ? a.layer[i / 2].v_cache : a.layer[i / 2].k_cache;
  if (threadIdx.x == 0) cache_at = a.cache_positions[0];
  __shared__ unsigned visible_first[kWarps], visible_last[kWarps];
  if (blockIdx.x < a.kv_heads * a.splits) scan_visible_rows(a, visible_first, visible_last);
  // Every layer rotates by the one position: its sines and cosines once.
  if (threadIdx.x < DH / 2) rope_sincos(static_cast<double>(a.positions[0]), a.inv[threadIdx.x], rope_sn[threadIdx.x], rope_cs[threadIdx.x]);
  if (threadIdx.x == 0) {
    for (int t = 0; t < kWarps * kSlots; ++t) mbar_init(&full[t], 1);
    mbar_init(&span_bar, 1);
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  __syncthreads();
  const bool attends = blockIdx.x < a.kv_heads * a.splits;
  const key_range live = attends ? visible_rows(a, visible_first, visible_last) : key_range{0, 0};
  unsigned span_uses = 0;
  // Each warp's next weight load (load_cursor), walked by its lane 0.
  __shared__ load_cursor loads[kWarps];
  if (lane == 0) settle_loads(a, loads[warp], 0, phases, warp, item_count);
  const auto issue = [&](int slot) {
    if (lane != 0) return;
    load_cursor& lc = loads[warp];
    if (lc.g >= phases) return;
    const bf16* src = row_of(a, weights, lc.g, first_row[lc.g] + lc.walk.row) + static_cast<int64_t>(lc.walk.chunk) * lc.chunk;
    mbar_expect_tx(&full[warp * kSlots + slot], lc.chunk * 2);
    bulk_load_read_once(my_ring + static_cast<size_t>(slot) * kChunkMax * 2, src, lc.chunk * 2, &full[warp * kSlots + slot]);
    advance_loads(a, lc, phases, warp, item_count);
  };
  for (int slot = 0; slot < kSlots; ++slot) issue(slot);
  // The first round's mask, once the warps' weight loads are on their way
  // (barriers come before attention_block reads it).
  if (attends) {
    const key_span sp = span_of(a, live);
    load_mask<DH>(a, sp.k0, min(kRoundValues / DH, sp.k1 - sp.k0), mask);
  }
  int consumed = 0, slot = 0;
  // The head's: the block's best logit over its rows of every head part,
  // and whether x (the final norm's output) is staged already.
  float best = -INFINITY;
  int best_at = 0x7fffffff;
  bool head_staged = false;
  // kTp: this block kept its o and down rows' residual in resid_rows while
  // staging the phase before (q/k/v's for o, gate|up's for down).
  bool residual_kept = false;
  for (int p = 0; p < phases; ++p) {
    const int st = stage_of(a, p), layer = p / 5;
    if (kTp && (st == kQkv || st == kGateUp)) residual_kept = false;
    // What this phase reads carries the previous phase's tag (the head's
    // parts all read the last down's).
    const unsigned ready = tag_of(epoch, (st == kHead ? 5 * a.layers : p) - 1);
    if (st == kAttention) {
      if (attends)
        attention_block<DH, kQkNorm, kTp>(a, layer, p, reinterpret_cast<bf16*>(xs), &span_bar, span_uses, epoch, rope_cs,
                                          rope_sn, caches, mask, cache_at, live, job);
      continue;
    }
    const int k = width_of(a, st), chunk = chunk_of(a, st), cpr = k / chunk, items = item_count[p];
    const int rows = items / cpr, spr = sums_per_row(cpr, rows);
    // A block without rows here reads nothing: every block that reads a
    // phase's input also stores some of its output, which is what lets the
    // next writer of that input know every reader is done.
    if (items > 0) {
      // x for this GEMV, staged as bf16: every value handed on is a bf16
      // value already (the unfused ops round there too), so staging rounds
      // nothing but the norm's output.
      if (st == kHead && head_staged) {
        // a later head part: x is the one an earlier part staged
      } else if (st == kO) {
        take_each<kTp>(a.attn_out, k, ready, [&](int i, unsigned bits) { xs_elems[i] = __float2bfloat16_rn(__uint_as_float(bits)); },
                       a.abort, job);
      } else if (st == kDown) {  // silu(gate) * up, two bf16 a value
        take_each<kTp>(a.hidden, k / 2, ready, [&](int i, unsigned bits) { reinterpret_cast<unsigned*>(xs_elems)[i] = bits; },
                       a.abort, job);
      } else {  // rms_norm of the residual (the token's row before the first layer)
        const bf16* g = st == kHead ? a.final_norm : st == kQkv ? a.layer[layer].attn_norm : a.layer[layer].mlp_norm;
        float ss = 0.f;
        // A tensor-parallel rank 0 keeps the sums of its o and down rows
        // (the residual it adds there, resid_rows) as q/k/v and gate|up
        // stage them: o's and down's split of the rows is the same.
        const int kept_first = st != kHead ? first_row[5 * layer + 2] : 0;
        const int kept_rows = kTp && a.tp_rank == 0 && st != kHead
                                  ? item_count[5 * layer + 2] / (a.attn_width / a.chunk_attn)
                                  : 0;
        const auto stage_residual = [&](int i, unsigned bits) {
          const float f = __uint_as_float(bits);
          xs_elems[i] = __float2bfloat16_rn(f);
          ss = fmaf(f, f, ss);
          if (kTp && static_cast<unsigned>(i - kept_first) < static_cast<unsigned>(kept_rows)) resid_rows[i - kept_first] = f;
        };
        if constexpr (kTp) {
          residual_kept = kept_rows > 0;
          // Every rank's partial rows summed: o's before gate|up, the
          // embedding's before layer 1, down's before later layers and the head.
          const bool embedded = st == kQkv && layer == 0;
          const int buffer = st == kGateUp ? exchange_layout::o_buffer
                             : embedded   ? exchange_layout::embed_buffer
                                          : exchange_layout::down_buffer;
          tp_sum_each(a, job, a.exchange + buffer * exchange_layout::buffer_words, k,
                      tp_tag(job, embedded ? kEmbedPhase : (st == kHead ? 5 * a.layers : p) - 1), stage_residual);
        } else if (st == kQkv && layer == 0) {
          for (int i = threadIdx.x; i < k; i += kThreads) {
            const bf16 x = x0 ? x0[i] : __float2bfloat16_rn(0.f);
            const float f = __bfloat162float(x);
            xs_elems[i] = x;
            ss = fmaf(f, f, ss);
          }
        } else {
          take_each(a.resid, k, ready, stage_residual);
        }
        ss = warp_sum(ss);
        if (lane == 0) reduce[warp] = ss;
        __syncthreads();
        if (threadIdx.x == 0) {
          float t = 0.f;
          for (int w = 0; w < kWarps; ++w) t += reduce[w];
          inv_rms = rsqrtf(t / static_cast<float>(k) + a.eps);
        }
        __syncthreads();
        for (int i = threadIdx.x; i < k; i += kThreads) {
          const float y = __bfloat162float(xs_elems[i]) * inv_rms;
          xs_elems[i] = __float2bfloat16_rn(g ? y * __bfloat162float(g[i]) : y);
        }
        head_staged = st == kHead;
      }
      __syncthreads();  // x staged; and the phase before is done with the sums (zeroed)
      // The products: each warp its items, from its ring.
      // VECS: 16-byte vectors a lane of a chunk, known to the compiler for
      // whole 2048-element chunks (every K of the common shapes) and q/k/v's
      // halves of them, else 0:
      // the chunk's chunk / 8 vectors go round the lanes, vector v to lane
      // v % 32 (a chunk of 1376, LLaMA-2-7B's d_ff in eight: 5 or 6 a lane).
      const auto products = [&](auto vecs_known) {
      constexpr int kVecs = decltype(vecs_known)::value;
      const int nvec = chunk / 8;
      const auto mine = [&](int u) { return kVecs > 0 ? u < kVecs : lane + 32 * u < nvec; };
      int x_chunk = -1;
      uint4 xr[kChunkMax / 256];
      for (int j = warp; j < items; j += kWarps) {
        mbar_wait(&full[warp * kSlots + slot], static_cast<unsigned>((consumed / kSlots) & 1));
        const int row = j / cpr, c = j % cpr;
        const uint4* ring = reinterpret_cast<const uint4*>(my_ring + static_cast<size_t>(slot) * kChunkMax * 2);
        uint4 wv[kChunkMax / 256];
#pragma unroll
        for (int u = 0; u < kChunkMax / 256; ++u)
          if (mine(u)) wv[u] = ring[lane + 32 * u];
        __syncwarp();
        issue(slot);
        if (c != x_chunk) {
#pragma unroll
          for (int u = 0; u < kChunkMax / 256; ++u)
            if (mine(u)) xr[u] = xs[c * nvec + lane + 32 * u];
          x_chunk = c;
        }
        float lo = 0.f, hi = 0.f;
#pragma unroll
        for (int u = 0; u < kChunkMax / 256; ++u)
          if (mine(u)) fma8_two(wv[u], xr[u], lo, hi);
        const float part = warp_sum(lo + hi);
        if (lane == 0) atomicAdd(&sums[row * spr + (spr == 1 ? 0 : c / 2)], part);
        ++consumed;
        if (++slot == kSlots) slot = 0;
      }
      };
      if (chunk == kChunkMax) products(std::integral_constant<int, kChunkMax / 256>{});
      else if (chunk == kChunkMax / 2) products(std::integral_constant<int, kChunkMax / 512>{});  // q/k/v's halves
      else products(std::integral_constant<int, 0>{});
    }
    __syncthreads();
    // The first round of this block's cache rows, while the grid finishes
    // q/k/v (x's buffer is free now).
    if (st == kQkv && attends && threadIdx.x == 0) {
      const key_span sp = span_of(a, live);
      fetch_rows<DH>(a, caches, layer, sp.h, sp.k0, min(kRoundValues / DH, sp.k1 - sp.k0), reinterpret_cast<bf16*>(xs),
                     &span_bar);
    }
    if (items == 0 && st != kHead) continue;
    const int first = first_row[p];
    const auto row_sum = [&](int i) {  // the row's slots in order
      float y = sums[i * spr];
      for (int s = i * spr + 1; s < (i + 1) * spr; ++s) y += sums[s];
      return y;
    };
    // Zero for the next phase, once read and handed on (apart from the
    // reads: those issue back to back, not each behind a store the compiler
    // cannot tell apart from the next read).
    const auto zero_rows = [&](int i, int n) {
      for (int s = i * spr; s < (i + n) * spr; ++s) sums[s] = 0.f;
    };
    for (int i = threadIdx.x; i < (st == kGateUp ? 0 : rows); i += blockDim.x) {  // gate|up's: in quads below
      const int n = first + i;
      const float y = round_bf16(row_sum(i));  // the product as its op stores it
      switch (st) {
        case kQkv: {
          // The biases (Qwen2's) added to the product as the add op adds
          // them: to the rounded product, rounded again.
          const layer_ptrs& L = a.layer[layer];
          float v = y;
          if (L.bq) {
            const int q = a.attn_width, kv = (a.qkv_rows - q) / 2;
            const bf16* b = n < q ? L.bq + n : n < q + kv ? L.bk + (n - q) : L.bv + (n - q - kv);
            v = round_bf16(y + __bfloat162float(*b));
          }
          put(a.qkv + n, v, tag_of(epoch, p));
          break;
        }
        case kGateUp: break;
        case kO:
        case kDown: {
          if constexpr (kTp) {
            // This rank's partial row; rank 0's with the residual added (as
            // the rank's o + residual record adds it): the sum the phase
            // before made, read back from the exchange (o's: the embedding's
            // on layer 1, down's of the layer before; down's: o's).
            float v = y;
            if (a.tp_rank == 0 && residual_kept) {
              v = round_bf16(resid_rows[i] + y);
            } else if (a.tp_rank == 0) {  // a block that staged nothing before
              const bool embedded = st == kO && layer == 0;
              const int buffer = st == kDown ? exchange_layout::o_buffer
                                 : embedded  ? exchange_layout::embed_buffer
                                             : exchange_layout::down_buffer;
              const int from = st == kDown ? p - 2 : embedded ? kEmbedPhase : p - 3;
              v = round_bf16(tp_sum(a, job, a.exchange + buffer * exchange_layout::buffer_words, n, tp_tag(job, from)) + y);
            }
            tp_push(a, st == kO ? exchange_layout::o_buffer : exchange_layout::down_buffer, n, v, tp_tag(job, p));
            break;
          }
          // The residual row as this block left it (the token's row before the first o).
          const float before =
              st == kO && layer == 0 ? (x0 ? __bfloat162float(x0[n]) : 0.f) : resid_rows[i];
          const float r = round_bf16(before + y);
          resid_rows[i] = r;
          put(a.resid + n, r, tag_of(epoch, p));
          break;
        }
        default: {
          if (a.logits) a.logits[n] = y;
          const int at = kTp ? a.logit_begin + n : n;  // the vocabulary's index
          if (y > best || (y == best && at < best_at)) best = y, best_at = at;
        }
      }
      zero_rows(i, 1);
    }
    if (st == kGateUp) {
      for (int i = threadIdx.x; i < rows / 4; i += blockDim.x) {
        const float gate0 = round_bf16(row_sum(4 * i)), up0 = round_bf16(row_sum(4 * i + 1)),
                    gate1 = round_bf16(row_sum(4 * i + 2)), up1 = round_bf16(row_sum(4 * i + 3));
        const bf16 h0 = __float2bfloat16_rn(round_bf16(gate0 / (1.f + __expf(-gate0))) * up0);
        const bf16 h1 = __float2bfloat16_rn(round_bf16(gate1 / (1.f + __expf(-gate1))) * up1);
        const unsigned pair =
            static_cast<unsigned>(__bfloat16_as_ushort(h0)) | (static_cast<unsigned>(__bfloat16_as_ushort(h1)) << 16);
        put(a.hidden + (first / 4 + i), __uint_as_float(pair), tag_of(epoch, p));
        zero_rows(4 * i, 4);
      }
    }
    if (st == kHead && p == phases - 1) {  // the block's best logit, then the last block's pick
      block_best(best, best_at, reduce, reduce_index);
      if (threadIdx.x == 0) {
        a.best_value[blockIdx.x] = best, a.best_index[blockIdx.x] = best_at;
        last_block = bump(a.done) == static_cast<unsigned>(blocks - 1);
      }
      __syncthreads();
      if (last_block) {  // every thread one block's pick or none: one L2 round trip, not one per few blocks
        float v = -INFINITY;
        int at = 0x7fffffff;
        for (int b = threadIdx.x; b < blocks; b += kThreads) better(v, at, __ldcg(a.best_value + b), __ldcg(a.best_index + b));
        block_best(v, at, reduce, reduce_index);
        if constexpr (kTp) {
          // This rank's best into every rank's picks (thread r to rank r);
          // each rank takes every rank's (a thread each) and picks as the
          // argmax op would: all ranks hold the same token.
          const unsigned tag = tp_tag(job, kPickPhase);
          if (threadIdx.x < a.tp_degree) {
            u64* slot = a.exchange_of[threadIdx.x] + exchange_layout::picks + 2 * a.tp_rank;
            const u64 hi = static_cast<u64>(tag) << 32;
            asm volatile("st.relaxed.sys.global.b64 [%0], %1;" ::"l"(slot), "l"(hi | __float_as_uint(v)) : "memory");
            asm volatile("st.relaxed.sys.global.b64 [%0], %1;" ::"l"(slot + 1), "l"(hi | static_cast<unsigned>(at)) : "memory");
          }
          const u64* picks = a.exchange + exchange_layout::picks;
          v = -INFINITY, at = 0x7fffffff;
          if (threadIdx.x < a.tp_degree) {
            const float rv = __uint_as_float(tp_take(a, job, picks + 2 * threadIdx.x, tag, threadIdx.x));
            better(v, at, rv, static_cast<int>(tp_take(a, job, picks + 2 * threadIdx.x + 1, tag, threadIdx.x)));
          }
          block_best(v, at, reduce, reduce_index);
        }
        if (threadIdx.x == 0) {
          if (a.token_out) *a.token_out = at == 0x7fffffff ? 0 : at;
          *a.done = 0;       // every block bumped: zero for the next launch
          *a.epoch = epoch;  // every block read the epoch before it bumped
        }
      }
    }
  }
}

std::size_t dynamic_shared_bytes(int64_t widest, int slots) {
  return static_cast<std::size_t>(kWarps) * slots * kChunkMax * 2 +
         static_cast<std::size_t>(std::max<int64_t>(widest * 2, 2 * kRoundValues * 2));
}

template <int DH, int kSlots, bool kQkNorm, bool kTp>
error launch_for(const launch_ctx& c, step_args& args, std::size_t shared, int blocks) {
  static std::atomic<bool> allowed[kMaxSharedOrdinals];
  const auto kernel = decode_step_kernel<DH, kSlots, kQkNorm, kTp>;
  // The most this variant asks: x of its widest shape beside its rings.
  const std::size_t most = dynamic_shared_bytes(kSlots == kSlotsNarrow ? kWideFrom : kMaxWidth, kSlots);
  AG_CUDA_TRY(allow_shared(kernel, shared, most, allowed), c.where);
  // Whether a block fits an SM, asked once per device (for the most shared
  // memory any launch asks: the attribute above).
  static std::atomic<int> fits[kMaxSharedOrdinals];  // 0 not asked, 1 yes, -1 no
  int dev = 0;
  AG_CUDA_TRY(cudaGetDevice(&dev), c.where);
  int known = dev >= 0 && dev < kMaxSharedOrdinals ? fits[dev].load(std::memory_order_acquire) : 0;
  if (known == 0) {
    int per_sm = 0;
    AG_CUDA_TRY(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, kThreads, most), c.where);
    known = per_sm >= 1 ? 1 : -1;
    if (dev >= 0 && dev < kMaxSharedOrdinals) fits[dev].store(known, std::memory_order_release);
  }
  if (known < 0)
    return error(errc::internal, c.where + ": the decode-step kernel cannot have a block resident on an SM (" +
                                     std::to_string(most) + " bytes of shared memory)");
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeCooperative;
  attr[0].val.cooperative = 1;
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = dim3(static_cast<unsigned>(blocks));
  cfg.blockDim = dim3(kThreads);
  cfg.dynamicSmemBytes = shared;
  cfg.stream = c.stream;
  cfg.attrs = attr;
  cfg.numAttrs = 1;
  AG_CUDA_TRY(cudaLaunchKernelEx(&cfg, kernel, args), c.where);
  return {};
}

// The variant with Qwen3's q/k norms, a tensor-parallel rank's (no q/k
// norms: the lowering's limit), or the plain one.
template <int DH, int kSlots>
error launch_variant(const launch_ctx& c, step_args& args, std::size_t shared, int blocks, bool qk_norm, bool tp) {
  if (tp) return launch_for<DH, kSlots, false, true>(c, args, shared, blocks);
  return qk_norm ? launch_for<DH, kSlots, true, false>(c, args, shared, blocks)
                 : launch_for<DH, kSlots, false, false>(c, args, shared, blocks);
}

}  // namespace

std::size_t decode_step_workspace_bytes() noexcept { return workspace_layout::bytes; }
std::size_t decode_exchange_bytes() noexcept { return exchange_layout::bytes; }

error launch_decode_step(const launch_ctx& c, const op_launch::decode_step_params& p,
                         const std::vector<tensor_arg>& inputs, const tensor_arg& out, void* workspace,
                         std::size_t workspace_bytes, const decode_step_tp* tp) {
  const auto bad = [&](const std::string& what) { return error(errc::internal, c.where + ": " + what); };
  const decode_step_shape shape{p.layers, p.d_model, p.d_ff, p.heads, p.kv_heads, p.head_dim, p.vocab, p.cache_rows,
                                dtype::bf16};
  // Any number of cache rows: their limit is the plan's choice of speed
  // (plan_options::decode_step_max_cache_rows), not one of the kernel's.
  if (std::string why = decode_step_misfit(shape, std::numeric_limits<int64_t>::max()); !why.empty())
    return bad("a decode step the kernel does not take: " + why);
  const std::size_t per_layer = p.layer_operands(), globals = p.global_operands();
  if (inputs.size() != p.operands())
    return bad("a decode step with " + std::to_string(inputs.size()) + " operands");
  if (!workspace || workspace_bytes < workspace_layout::bytes) return bad("the stream has no decode-step workspace");
  const bool parallel = p.tp_degree > 1;
  if (parallel != (tp != nullptr)) return bad("a tensor-parallel step without its peers, or peers for a single device's");
  if (parallel) {
    if (p.tp_degree > kMaxRanks || p.tp_rank < 0 || p.tp_rank >= p.tp_degree)
      return bad("rank " + std::to_string(p.tp_rank) + " of " + std::to_string(p.tp_degree));
    if (!p.argmax || p.qk_norm) return bad("a tensor-parallel step without argmax or with q/k norms");
    if (p.vocab_total < 1 || p.embed_begin < 0 || p.embed_begin + p.embed_rows > p.vocab_total || p.logit_begin < 0 ||
        p.logit_begin + p.vocab > p.vocab_total)
      return bad("vocabulary slices outside the vocabulary");
    if (!tp->tag_word || !tp->aborted || !tp->faults || tp->gpu_share < 1) return bad("no in-stream memory");
    for (int r = 0; r < p.tp_degree; ++r)
      if (!tp->exchange[r] || !tp->dead[r]) return bad("rank " + std::to_string(r) + " has no exchange");
  }
  // Ranks sharing a GPU each take their share of its SMs.
  const int blocks = parallel ? c.sm_count / tp->gpu_share : c.sm_count;
  if (blocks < 1 || blocks > decode_step_max_blocks) return bad(std::to_string(blocks) + " SMs");
  const int splits = static_cast<int>(std::min<int64_t>(kMaxSplits, blocks / p.kv_heads));
  if (splits < 1) return bad("fewer SMs than kv heads");
  // A block's rows of each GEMV must fit its shared sums, and o's and
  // down's its residual rows. The head's rows go in parts: as few as keep
  // two chunks a slot (sums_per_row: the same bits every run), else as few
  // as fit at all.
  const int64_t widest_rows = std::max(2 * p.d_ff, (p.heads + 2 * p.kv_heads) * p.head_dim);
  if (widest_rows / blocks + 4 > kMaxRows || p.d_model / blocks + 1 > kMaxResidRows)
    return bad("too few SMs (" + std::to_string(blocks) + ") for a step this wide");
  const int64_t head_rows = p.vocab / blocks + 2;  // a block's at most (the splits round)
  const int chunk_d = static_cast<int>(decode_step_chunk(p.d_model));
  const int head_chunks = static_cast<int>(p.d_model / chunk_d);
  int head_parts = static_cast<int>((head_rows * ((head_chunks + 1) / 2) + kMaxRows - 1) / kMaxRows);
  if (head_parts > kMaxHeadParts) head_parts = static_cast<int>((head_rows + kMaxRows - 1) / kMaxRows);
  if (head_parts > kMaxHeadParts)
    return bad("too few SMs (" + std::to_string(blocks) + ") for a vocabulary of " + std::to_string(p.vocab));
  const auto ptr = [&](std::size_t i) { return inputs[i].data; };
  // The embedding's rows: the vocabulary, or a rank's slice of it.
  if (inputs[1].dims.rank() != 2 || inputs[1].dims[0] != (parallel ? p.embed_rows : p.vocab))
    return bad("the embedding is not [" + std::to_string(parallel ? p.embed_rows : p.vocab) + ", d]");
  for (std::size_t i = 0; i < inputs.size(); ++i) {
    const tensor_arg& t = inputs[i];
    const bool ints = i == 0 || i == 2 || i == 3;
    if (t.type != (ints ? dtype::i32 : dtype::bf16)) return bad("operand " + std::to_string(i) + " of the wrong dtype");
    if (!t.data) return bad("operand " + std::to_string(i) + " has no buffer");
    if (!ints && (reinterpret_cast<uintptr_t>(t.data) % 16 != 0 || t.stride[static_cast<std::size_t>(t.dims.rank() - 1)] != 1))
      return bad("operand " + std::to_string(i) + " is not 16-byte aligned and contiguous");
  }
  // A tensor-parallel rank past 0 writes its copy of the token or nothing.
  const bool writes = !parallel || p.tp_rank == 0 || p.tp_token_out;
  if (writes && (!out.data || out.type != (p.argmax ? dtype::i32 : dtype::f32)))
    return bad("the output is not " + std::string(p.argmax ? "i32" : "f32"));

  unsigned char* ws = static_cast<unsigned char*>(workspace);
  step_args a{};
  a.layers = p.layers;
  a.d = static_cast<int>(p.d_model);
  a.ff = static_cast<int>(p.d_ff);
  a.heads = static_cast<int>(p.heads);
  a.kv_heads = static_cast<int>(p.kv_heads);
  a.vocab = static_cast<int>(p.vocab);
  a.cache_rows = static_cast<int>(p.cache_rows);
  a.splits = splits;
  a.head_parts = head_parts;
  a.chunk_d = chunk_d;
  a.chunk_ff = static_cast<int>(decode_step_chunk(p.d_ff));
  a.chunk_attn = static_cast<int>(decode_step_chunk(p.heads * p.head_dim));
  a.qkv_rows = static_cast<int>((p.heads + 2 * p.kv_heads) * p.head_dim);
  a.chunk_qkv = static_cast<int>(decode_step_qkv_chunk(p.d_model, a.qkv_rows, blocks));
  a.attn_width = static_cast<int>(p.heads * p.head_dim);
  a.eps = p.eps;
  a.scale = p.scale;
  a.token = static_cast<const int*>(ptr(0));
  a.embed = static_cast<const bf16*>(ptr(1));
  a.positions = static_cast<const int*>(ptr(2));
  a.cache_positions = static_cast<const int*>(ptr(3));
  a.mask = static_cast<const bf16*>(ptr(4));
  a.head = static_cast<const bf16*>(ptr(5));
  a.final_norm = p.final_norm_weighted ? static_cast<const bf16*>(ptr(6)) : nullptr;
  a.logits = p.argmax ? nullptr : static_cast<float*>(out.data);
  a.token_out = p.argmax && writes ? static_cast<int*>(out.data) : nullptr;
  a.fault_word = c.fault_word;
  a.resid = reinterpret_cast<u64*>(ws + workspace_layout::resid);
  a.qkv = reinterpret_cast<u64*>(ws + workspace_layout::qkv);
  a.hidden = reinterpret_cast<u64*>(ws + workspace_layout::hidden);
  a.attn_out = reinterpret_cast<u64*>(ws + workspace_layout::attn_out);
  a.partials = reinterpret_cast<float*>(ws + workspace_layout::partials);
  a.best_value = reinterpret_cast<float*>(ws + workspace_layout::best_value);
  a.best_index = reinterpret_cast<int*>(ws + workspace_layout::best_index);
  a.head_count = reinterpret_cast<unsigned*>(ws + workspace_layout::head_count);
  a.done = reinterpret_cast<unsigned*>(ws + workspace_layout::done);
  a.epoch = reinterpret_cast<unsigned*>(ws + workspace_layout::epoch);
  a.abort = reinterpret_cast<unsigned long long*>(ws + workspace_layout::abort);
  a.tp_degree = 1;
  if (parallel) {
    a.tp_rank = p.tp_rank;
    a.tp_degree = p.tp_degree;
    a.embed_rows = static_cast<int>(p.embed_rows);
    a.embed_begin = static_cast<int>(p.embed_begin);
    a.logit_begin = static_cast<int>(p.logit_begin);
    a.vocab_total = static_cast<int>(p.vocab_total);
    for (int r = 0; r < p.tp_degree; ++r) {
      a.exchange_of[r] = static_cast<u64*>(tp->exchange[r]);
      a.dead[r] = tp->dead[r];
      a.slot[r] = tp->slot[r];
    }
    a.exchange = a.exchange_of[p.tp_rank];
    a.tag_word = tp->tag_word;
    a.aborted = tp->aborted;
    a.faults = tp->faults;
    a.timeout_ns = static_cast<long long>(tp->timeout_s * 1e9);
  }
  rope_inverse_frequencies(p.rope_theta, p.rope_scale, p.head_dim, a.inv);
  for (int l = 0; l < p.layers; ++l) {
    const std::size_t b = globals + per_layer * static_cast<std::size_t>(l);
    layer_ptrs& L = a.layer[l];
    L.wq = static_cast<const bf16*>(ptr(b + 0));
    L.wk = static_cast<const bf16*>(ptr(b + 1));
    L.wv = static_cast<const bf16*>(ptr(b + 2));
    L.k_cache = static_cast<bf16*>(ptr(b + 3));
    L.v_cache = static_cast<bf16*>(ptr(b + 4));
    L.wo = static_cast<const bf16*>(ptr(b + 5));
    L.wg = static_cast<const bf16*>(ptr(b + 6));
    L.wu = static_cast<const bf16*>(ptr(b + 7));
    L.wd = static_cast<const bf16*>(ptr(b + 8));
    L.attn_norm = p.norm_weighted ? static_cast<const bf16*>(ptr(b + 9)) : nullptr;
    L.mlp_norm = p.norm_weighted ? static_cast<const bf16*>(ptr(b + 10)) : nullptr;
    const std::size_t biases = b + op_launch::decode_step_layer_inputs + (p.norm_weighted ? 2 : 0);
    L.bq = p.qkv_bias ? static_cast<const bf16*>(ptr(biases)) : nullptr;
    L.bk = p.qkv_bias ? static_cast<const bf16*>(ptr(biases + 1)) : nullptr;
    L.bv = p.qkv_bias ? static_cast<const bf16*>(ptr(biases + 2)) : nullptr;
    const std::size_t qk_norms = biases + (p.qkv_bias ? 3 : 0);
    L.q_norm = p.qk_norm ? static_cast<const bf16*>(ptr(qk_norms)) : nullptr;
    L.k_norm = p.qk_norm ? static_cast<const bf16*>(ptr(qk_norms + 1)) : nullptr;
  }
  const int64_t widest = std::max({p.d_model, p.d_ff, p.heads * p.head_dim});
  if (widest > kWideFrom) {
    // Heads of 128 only (decode_step_misfit): a second kernel calling
    // attention_block<64> made the compiler keep it a function of its own,
    // and LLaMA-1B's kernel spilled.
    if (p.head_dim != 128) return bad("wider than " + std::to_string(kWideFrom) + " with heads of " + std::to_string(p.head_dim));
    return launch_variant<128, kSlotsWide>(c, a, dynamic_shared_bytes(widest, kSlotsWide), blocks, p.qk_norm, parallel);
  }
  const std::size_t shared = dynamic_shared_bytes(widest, kSlotsNarrow);
  return p.head_dim == 64 ? launch_variant<64, kSlotsNarrow>(c, a, shared, blocks, p.qk_norm, parallel)
                          : launch_variant<128, kSlotsNarrow>(c, a, shared, blocks, p.qk_norm, parallel);
}

}  // namespace ag::gpu::cuda
