#include "gpu/cuda/common.cuh"
#include "gpu/cuda/cuda_check.cuh"
#include "gpu/cuda/in_stream.cuh"
#include "gpu/cuda/in_stream_wait.cuh"

#include <algorithm>
#include <cstdlib>

namespace ag::gpu::cuda {

AG_CUDA_MODULE_ANCHOR()
namespace {

struct in_stream_args {
  const void* in[in_stream_members_max];
  unsigned long long* arrive_at[in_stream_members_max];  // member k's arrive array
  unsigned long long* ack_at[in_stream_members_max];     // member k's ack array
  unsigned long long* arrive = nullptr;  // this member's: [block][sender slot]
  unsigned long long* ack = nullptr;     // this member's: what each sender saw of mine
  unsigned long long* last = nullptr;    // this member's: the tag it last announced to each
  const unsigned int* dead[in_stream_members_max];    // member k's death word
  int slot[in_stream_members_max];                    // member k's slot in the arrays
  int n = 0;
  int rank = 0;
  unsigned int key = 0;
  int type = 0;
  const unsigned long long* tag = nullptr;
  const unsigned long long* aborted = nullptr;
  unsigned long long* faults = nullptr;
  unsigned long long* progress = nullptr;  // device: last part started / finished here (block 0)
  long long timeout_ns = 0;
  long long n_out = 0;
  long long per_block = 0;  // elements per block (a multiple of 8 when `words`)
  int words = 0;            // f32/f16/bf16 read and written as 16-byte words
  int push = 0;             // the push path (in_stream.cuh): aligned operands, at most in_stream_push_max_bytes
  int release_early = 0;    // every member a GPU of its own: the next kernel may launch now (in_stream.cuh)
  unsigned int* inbox_at[in_stream_members_max];  // member k's inboxes
  unsigned long long* push_parity = nullptr;      // this member's: [block][receiver slot]
};

__device__ __forceinline__ unsigned long long load_acquire(const unsigned long long* p) {
  unsigned long long v;
  asm volatile("ld.acquire.sys.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ void store_release(unsigned long long* p, unsigned long long v) {
  asm volatile("st.release.sys.global.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}
/// Waits until *flag == want; false when it gave_up.
__device__ bool wait_for(const unsigned long long* flag, unsigned long long want, const unsigned int* dead,
                         const unsigned long long* aborted, unsigned long long job, long long t0, long long timeout) {
  for (unsigned i = 1;; ++i) {
    if (load_acquire(flag) == want) return true;
    if ((i & 1023u) == 0 && gave_up(dead, aborted, job, t0, timeout)) return false;
  }
}

// ---- the push path (in_stream.cuh) ----

/// The flag of a tag's lines: a nonzero 32-bit hash of all 64 bits.
__device__ __forceinline__ unsigned push_flag(unsigned long long tag) {
  const unsigned long long x = (tag ^ (tag >> 31)) * 0x9E3779B97F4A7C15ull;
  return static_cast<unsigned>(x >> 32) | 1u;
}
/// One 16-byte line, in one store whose 8-byte halves each land whole.
__device__ __forceinline__ void line_store(unsigned int* p, unsigned d0, unsigned f0, unsigned d1, unsigned f1) {
  asm volatile("st.volatile.global.v4.u32 [%0], {%1, %2, %3, %4};" ::"l"(p), "r"(d0), "r"(f0), "r"(d1), "r"(f1)
               : "memory");
}
__device__ __forceinline__ uint4 line_load(const unsigned int* p) {
  uint4 v;
  asm volatile("ld.volatile.global.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p)
               : "memory");
  return v;
}
/// Takes the two lines of 16-byte word `w` (lines 2w and 2w + 1) pushed
/// with `flag` from either parity of one sender's inboxes (`box`: parity 0,
/// then `in_stream_inbox_lines` further parity 1), clearing them; false when
/// it gave_up. `seen`: a flag last read, for a give-up's message. A poll
/// loads the four places the two lines may be in together, so it waits for
/// one memory latency: taking line 2w and then 2w + 1, each from parity 0
/// and then parity 1, waited for two to four in a row (the part's read
/// phase; docs/BENCHMARKS.md, session 41).
__device__ bool take_word(unsigned int* box, long long w, unsigned flag, uint4& data, unsigned& seen,
                          const unsigned int* dead, const unsigned long long* aborted, unsigned long long job,
                          long long t0, long long timeout) {
  unsigned int* lo0 = box + 8 * w;  // line 2w, parity 0
  unsigned int* lo1 = lo0 + 4 * in_stream_inbox_lines;
  unsigned int* hi0 = lo0 + 4;      // line 2w + 1
  unsigned int* hi1 = lo1 + 4;
  bool have_lo = false, have_hi = false;
  // Takes a line from whichever parity (v0 at p0, v1 at p1) carries the flag.
  const auto take = [&](const uint4& v0, unsigned int* p0, const uint4& v1, unsigned int* p1, unsigned& d0,
                        unsigned& d1) {
    const bool in0 = v0.y == flag && v0.w == flag, in1 = v1.y == flag && v1.w == flag;
    if (!in0 && !in1) {
      seen = v0.y;
      return false;
    }
    const uint4& v = in0 ? v0 : v1;
    d0 = v.x, d1 = v.z;
    line_store(in0 ? p0 : p1, 0, 0, 0, 0);
    return true;
  };
  for (unsigned n = 1;; ++n) {
    const uint4 a0 = line_load(lo0), a1 = line_load(lo1), b0 = line_load(hi0), b1 = line_load(hi1);
    if (!have_lo) have_lo = take(a0, lo0, a1, lo1, data.x, data.y);
    if (!have_hi) have_hi = take(b0, hi0, b1, hi1, data.z, data.w);
    if (have_lo && have_hi) return true;
    if ((n & 1023u) == 0 && gave_up(dead, aborted, job, t0, timeout)) return false;
  }
}

/// Adds the 16 bytes `w` (8 x f16/bf16 or 4 x f32, type t) into acc.
__device__ __forceinline__ void add_words(float* acc, const uint4& w, int t) {
  const auto* h = reinterpret_cast<const unsigned short*>(&w);
  if (t == 0) {
    const auto* f = reinterpret_cast<const float*>(&w);
    for (int e = 0; e < 4; ++e) acc[e] += f[e];
  } else if (t == 1) {
    for (int e = 0; e < 8; ++e) acc[e] += __half2float(__ushort_as_half(h[e]));
  } else {
    for (int e = 0; e < 8; ++e) acc[e] += __bfloat162float(__ushort_as_bfloat16(h[e]));
  }
}
__device__ __forceinline__ uint4 pack_words(const float* acc, int t) {
  uint4 w;
  auto* h = reinterpret_cast<unsigned short*>(&w);
  if (t == 0) {
    auto* f = reinterpret_cast<float*>(&w);
    for (int e = 0; e < 4; ++e) f[e] = acc[e];
  } else if (t == 1) {
    for (int e = 0; e < 8; ++e) h[e] = __half_as_ushort(__float2half_rn(acc[e]));
  } else {
    for (int e = 0; e < 8; ++e) h[e] = __bfloat16_as_ushort(__float2bfloat16_rn(acc[e]));
  }
  return w;
}

// One barrier, at arrival: a member's part reads the others' operands only
// once each announced the job's tag (its operand is written: stream order).
// No barrier at the end: the memory plan lets a stream overwrite its operand
// only after a step that the plan orders after every member's part (through
// a later collective's deps on the other members' steps, which that
// collective's arrival barrier meets, or through the job's end), so the
// readers are done by then (graph/memory_plan.cpp, happens-before).
// Without it a member may reach its next collective while a peer has not
// yet seen its previous announcement in the same flag: each member
// acknowledges what it saw (ack), and a member overwrites its announcement
// to a peer only once the peer acknowledged the previous one; in steady
// state that acknowledgement came long before, so it costs no wait.
__global__ void __launch_bounds__(512) in_stream_all_reduce_kernel(void* out, in_stream_args a) {
  pdl_wait();  // the operand is the previous kernel's output
  if (a.release_early) pdl_release();  // only where no member shares this GPU (in_stream.cuh)
  // The job's tag, after the PDL wait: the kernel that set it
  // (set_tag_kernel) is often the one right before this part, and a plain
  // launch ends its blocks before its store is sure to be seen, so a part
  // launched with PDL that read the tag before its wait could take the
  // stream's previous tag and push its lines under the wrong flag (a peer
  // then waits for them until the timeout). Read before the wait until
  // 2026-12-01, to overlap the load with it (0.05-0.2 us of a part, 2 H200s).
  const unsigned long long job = *reinterpret_cast<const volatile unsigned long long*>(a.tag);
  __shared__ int failed;
  const int b = blockIdx.x;
  const unsigned long long tag = (job << in_stream_key_bits) | a.key;
  const int me = a.slot[a.rank];
  const int k = threadIdx.x;  // thread k < n talks to member k
  if (threadIdx.x == 0) failed = 0;
  // What the GPU did last, for a give-up's report: device words, which the
  // host copies out when it reports (cuda_device::collective_progress).
  // Host-mapped words cost every part about 0.85 us (2 H200s, 8 and 64 KiB:
  // 5.1 -> 4.3 and 5.4 -> 4.6 us): the grid's end waits for its writes
  // over PCIe.
  if (b == 0 && threadIdx.x == 0) reinterpret_cast<volatile unsigned long long*>(a.progress)[0] = tag;
  __syncthreads();
  const auto finished = [&] {
    if (b == 0 && threadIdx.x == 0) reinterpret_cast<volatile unsigned long long*>(a.progress)[1] = tag;
  };
  if (a.push) {
    // Block b's words of every member's slice: push mine to each peer, then
    // take each peer's from my inboxes, summing in rank order as below.
    const int per = a.type == 0 ? 4 : 8;
    const long long w0 = b * a.per_block / per;
    const long long w1 = (b * a.per_block + a.per_block < a.n_out ? b * a.per_block + a.per_block : a.n_out) / per;
    const unsigned flag = push_flag(tag);
    const uint4* mine = static_cast<const uint4*>(a.in[a.rank]);
    for (int m = 0; m < a.n; ++m) {
      if (m == a.rank) continue;
      const unsigned long long parity = a.push_parity[b * in_stream_slots + a.slot[m]] & 1u;
      unsigned int* box = a.inbox_at[m] + 4 * (static_cast<long long>(me) * 2 + static_cast<long long>(parity)) *
                                              in_stream_inbox_lines;
      for (long long w = w0 + threadIdx.x; w < w1; w += blockDim.x) {
        const uint4 v = mine[w];
        line_store(box + 8 * w, v.x, flag, v.y, flag);
        line_store(box + 8 * w + 4, v.z, flag, v.w, flag);
      }
    }
    const long long t0 = global_ns();
    for (long long w = w0 + threadIdx.x; w < w1 && !*reinterpret_cast<volatile int*>(&failed); w += blockDim.x) {
      float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
      const uint4 own = mine[w];  // loaded before the peers' lines are waited for
      for (int m = 0; m < a.n; ++m) {
        if (m == a.rank) {
          add_words(acc, own, a.type);
          continue;
        }
        unsigned int* box = a.inbox_at[a.rank] + 4 * (static_cast<long long>(a.slot[m]) * 2) * in_stream_inbox_lines;
        uint4 word;
        unsigned seen = 0;
        if (!take_word(box, w, flag, word, seen, a.dead[m], a.aborted, job, t0, a.timeout_ns)) {
          failed = 1;
          note_give_up(a.faults, tag, seen, a.slot[m], b, (1ull << 63) | flag);
          break;
        }
        add_words(acc, word, a.type);
      }
      if (failed) break;
      if (a.words)  // this member's output is aligned
        static_cast<uint4*>(out)[w] = pack_words(acc, a.type);
      else  // a constant bound, so that acc stays in registers
#pragma unroll
        for (int e = 0; e < 8; ++e)
          if (e < per) st(out, a.type, w * per + e, acc[e]);
    }
    __syncthreads();
    // The next push to each peer goes to the other parity (pushes were made
    // whatever happened after them).
    if (threadIdx.x < a.n && threadIdx.x != a.rank) a.push_parity[b * in_stream_slots + a.slot[threadIdx.x]] ^= 1u;
    if (failed && threadIdx.x == 0) note_fault(a.faults, job);
    finished();
    return;
  }
  if (k < a.n && k != a.rank) {
    const int from_k = b * in_stream_slots + a.slot[k];
    // The peer saw my last announcement before I overwrite it (or its job
    // ended: cancelled here, the peer dead, the timeout).
    // Not for an announcement of a job this device gave up on (the peer may
    // never look for it).
    // Both words are loaded before either is compared, so the two loads
    // are in flight together (one memory latency before the announcement,
    // not two in a row).
    const unsigned long long prev = a.last[from_k], prev_job = prev >> in_stream_key_bits;
    const unsigned long long seen = *reinterpret_cast<const volatile unsigned long long*>(&a.ack[from_k]);
    if (prev != 0 && seen != prev &&
        reinterpret_cast<const volatile unsigned long long*>(a.faults)[prev_job % in_stream_faults] != prev_job)
      (void)wait_for(&a.ack[from_k], prev, a.dead[k], a.aborted, prev_job, global_ns(), a.timeout_ns);
    // The operand was written by earlier kernels, complete and in this GPU's
    // memory: the release store alone publishes the announcement.
    store_release(&a.arrive_at[k][b * in_stream_slots + me], tag);
    a.last[from_k] = tag;
    if (wait_for(&a.arrive[from_k], tag, a.dead[k], a.aborted, job, global_ns(), a.timeout_ns)) {
      // Orders nothing but the load just done (a relaxed store is enough).
      *reinterpret_cast<volatile unsigned long long*>(&a.ack_at[k][b * in_stream_slots + me]) = tag;
    } else {
      failed = 1;
      note_give_up(a.faults, tag, load_acquire(&a.arrive[from_k]), a.slot[k], b, prev);
    }
  }
  __syncthreads();
  if (failed) {
    if (threadIdx.x == 0) note_fault(a.faults, job);
    finished();
    return;
  }
  const long long begin = b * a.per_block;
  const long long end = begin + a.per_block < a.n_out ? begin + a.per_block : a.n_out;
  if (a.words) {
    // 16-byte loads: one NVLink transaction serves 8 bf16 elements.
    const int per = a.type == 0 ? 4 : 8;
    for (long long w = begin / per + threadIdx.x; w < end / per; w += blockDim.x) {
      float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
      for (int m = 0; m < a.n; ++m) add_words(acc, static_cast<const uint4*>(a.in[m])[w], a.type);
      static_cast<uint4*>(out)[w] = pack_words(acc, a.type);
    }
    finished();
    return;
  }
  for (long long i = begin + threadIdx.x; i < end; i += blockDim.x) store_member_sum(out, a.type, a.in, a.n, i, i);
  finished();
}

__global__ void set_tag_kernel(unsigned long long* slot, unsigned long long job) { *slot = job; }

/// Whether the environment sets the diagnostic switch `name` to 0 (off).
bool switched_off(const char* name) {
  const char* v = std::getenv(name);
  return v && v[0] == '0';
}

// A stream without a tag word (launch_set_in_stream_tag, launch_in_stream_all_reduce).
error no_tag_word(const launch_ctx& c) {
  return error(errc::out_of_memory, c.where +
                                        ": the stream has no in-stream tag word (only compute streams have one, "
                                        "and its allocation may have failed)");
}

}  // namespace

in_stream_split_t in_stream_split(int64_t n_out, int64_t elem_bytes, bool words, bool push_allowed) {
  in_stream_split_t s;
  if (n_out <= 0) return s;
  if (words && push_allowed && n_out * elem_bytes <= in_stream_push_max_bytes) {
    s.push = true;
    s.per_block = in_stream_push_block_words * (16 / elem_bytes);
    s.grid = (n_out + s.per_block - 1) / s.per_block;
    return s;
  }
  constexpr int64_t per_block_min = 512 * 4;  // elements: 4 per thread before another block pays
  s.grid = std::min<int64_t>((n_out + per_block_min - 1) / per_block_min, in_stream_blocks);
  s.per_block = (n_out + s.grid - 1) / s.grid;
  if (words) s.per_block = (s.per_block + 7) / 8 * 8;
  return s;
}

error launch_in_stream_all_reduce(const launch_ctx& c, const tensor_arg& out, const in_stream_member* members, int n,
                                  int rank, const in_stream_area& mine, const unsigned long long* tag_word,
                                  uint32_t key, double timeout_s, bool release_early) {
  if (n < 2 || n > in_stream_members_max || rank < 0 || rank >= n)
    return error(errc::invalid_argument, c.where + ": in-stream all_reduce of " + std::to_string(n) +
                                             " members, rank " + std::to_string(rank));
  if (key >= (1u << in_stream_key_bits))
    return error(errc::invalid_argument, c.where + ": collective key " + std::to_string(key) + " too large");
  const int64_t n_out = out.dims.numel();
  if (n_out == 0) return {};
  in_stream_args a{};
  a.n = n;
  a.rank = rank;
  a.key = key;
  a.type = static_cast<int>(out.type);
  if (!tag_word) return no_tag_word(c);
  a.tag = tag_word;
  a.aborted = mine.aborted_dev;
  a.faults = mine.faults_dev;
  a.progress = mine.progress_dev;
  a.timeout_ns = static_cast<long long>(timeout_s * 1e9);
  // AG_CUDA_IN_STREAM_RELEASE=0: never release early (a diagnostic switch).
  static const bool release_on = !switched_off("AG_CUDA_IN_STREAM_RELEASE");
  a.release_early = release_early && release_on;
  a.arrive = mine.arrive;
  a.ack = mine.ack;
  a.last = mine.last;
  for (int m = 0; m < n; ++m) {
    const in_stream_area& ar = *members[m].area;
    a.in[m] = members[m].operand;
    a.arrive_at[m] = ar.arrive;
    a.ack_at[m] = ar.ack;
    a.dead[m] = ar.dead_dev;
    a.slot[m] = ar.slot;
  }
  constexpr int block = 512;
  a.n_out = n_out;
  // Blocks split at 16-byte words, and small parts push, where every
  // member's operand is aligned: decided from what all members see alike
  // (the operands, the size, the dtype), since pushing parts and reading
  // parts do not meet and the members' blocks must cover the same slices.
  // This member's output only decides how it is written.
  bool operands_aligned = true;
  for (int m = 0; m < n; ++m) operands_aligned = operands_aligned && reinterpret_cast<uintptr_t>(members[m].operand) % 16 == 0;
  const bool out_aligned = reinterpret_cast<uintptr_t>(out.data) % 16 == 0;
  const int per = a.type == 0 ? 4 : 8;
  const bool words = a.type != 3 && operands_aligned && n_out % per == 0;
  // AG_CUDA_IN_STREAM_PUSH=0: every part reads in place (a diagnostic switch).
  static const bool push_on = !switched_off("AG_CUDA_IN_STREAM_PUSH");
  const in_stream_split_t split = in_stream_split(n_out, static_cast<int64_t>(dtype_size(out.type)), words, push_on);
  const int64_t grid = split.grid;
  a.per_block = split.per_block;
  a.push = split.push;
  a.words = words && out_aligned;
  a.push_parity = mine.push_parity;
  for (int m = 0; m < n; ++m) a.inbox_at[m] = members[m].area->inbox;
  launch_kernel(c, in_stream_all_reduce_kernel, dim3(static_cast<unsigned>(grid)), dim3(block), 0, out.data, a);
  AG_CUDA_TRY_LAUNCH(c.where);
  return {};
}

error launch_set_in_stream_tag(const launch_ctx& c, unsigned long long* tag_word, uint64_t job) {
  if (!tag_word) return no_tag_word(c);
  // Stored as job + 1: zero is what the flags and rings hold before any part.
  set_tag_kernel<<<1, 1, 0, c.stream>>>(tag_word, in_stream_job_word(job));
  AG_CUDA_TRY_LAUNCH(c.where);
  return {};
}

}  // namespace ag::gpu::cuda
