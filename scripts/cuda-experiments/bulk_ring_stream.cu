// How a ring of bulk copies streams a large read (session 81): every warp of
// a persistent grid (one block an SM) keeps S copies of B bytes in flight into
// its own ring in shared memory, as the runtime's decode step does
// (gpu/cuda/decode_step.cu), and consumes each one (a dot product of its
// bf16 values with x, or one word) before it issues the next copy into the
// freed slot. Prints, for each (warps, slots, bytes) form: the read's
// bandwidth, and the mean cycles a warp spends issuing one copy and waiting
// for one; beside cudaMemcpy's device-to-device bandwidth (read + write).
// The question: is issuing a copy's cost per copy (fewer, larger copies
// would cost less) or per byte in flight (the SM's memory pipeline full)?
// With BRS_PRODUCER=1: the decode step's ring against 15 consumer warps fed
// by a producer warp (stream_producer), with 1-8 passes of arithmetic over
// each chunk, so that the consumers, not the memory, set the pace: what
// taking the issue off a consumer's path saves it. On an H100 (session 82):
// 15 warps fed by a producer stream 3059-3072 GB/s and take 2.64-2.65 us a
// copy, as 15 that issue their own do (3063-3072 GB/s), at every pass count
// from 1 to 8; even 8 passes left the memory setting the pace, so this does
// not answer for a consumer-bound warp (the kernel's producer warp,
// decode_step_producer15.diff, measured 6% slower).
// With BRS_PROBE=1 (session 85): what the stream does to an L2 hit's round
// trip. A probe warp beside each block's streaming warps chases a chain of
// 128-byte lines that sit in L2 (ld.relaxed.gpu, as the step's hand-overs
// read) while the others stream; its mean round trip, for rings of 1-6
// copies in flight a warp and with nothing streaming. The question: the
// step's q/k/v hand-over takes 3.7 us where an idle L2 hit takes well under
// one; does a ring's depth (the bytes queued in the memory system, not the
// bandwidth: 64 KiB an SM already streams at full rate) set that? On an H200
// (session 85): no. Idle 0.161 us; beside 16 x 3 x 4096 (the step's 192 KiB
// an SM) 0.24-0.26 us, beside 16 x 1 x 4096 0.53-0.61 and 16 x 2 x 4096
// 0.51: the round trip follows the traffic, and the shallower rings carry
// more of it, 4357-4431 GB/s at 64 KiB (32 KiB in 2 KiB copies: 4300-4311)
// against 3664-3666 at 192 KiB and 3798-3811 at 128 (no such difference on
// the H100 in session 81).
//   nvcc -O3 -arch=sm_90 -std=c++17 -o bulk_ring_stream bulk_ring_stream.cu
#include <vector>

#include "persistent_common.cuh"

using u64 = unsigned long long;

// A copy of `bytes` into `dst`, complete on `bar`; `hint`: with the decode
// step's L2 evict-first policy (gpu/cuda/decode_step.cu's bulk_load_read_once).
__device__ __forceinline__ void load(void* dst, const void* src, unsigned bytes, u64* bar, bool hint) {
  mbar_expect_tx(bar, bytes);
  if (!hint) return bulk_load(dst, src, bytes, bar);
  u64 policy;
  asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(policy));
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint [%0], [%1], %2, [%3], %4;" ::"r"(
          shared_address(dst)),
      "l"(src), "r"(bytes), "r"(shared_address(bar)), "l"(policy)
      : "memory");
}

// A warp's use of one copy of B bytes at v: `passes` dot products of its
// bf16 values with ones (0: one word read), 4 KiB at a time (the decode
// step's chunk); `freed` runs once all of it is read (a larger copy's slot
// frees only then), after the warp's lanes meet.
template <int B, class Freed>
__device__ __forceinline__ float use_copy(const uint4* v, int lane, int passes, Freed&& freed) {
  if (passes == 0) {
    const float word = __uint_as_float(v[lane].x);
    __syncwarp();
    freed();
    return word;
  }
  constexpr int kPiece = B < 4096 ? B : 4096, kVecs = kPiece / 16 / 32 > 0 ? kPiece / 16 / 32 : 1;
  const uint4 x = make_uint4(0x3f803f80u, 0x3f803f80u, 0x3f803f80u, 0x3f803f80u);  // bf16 ones
  float acc = 0.f;
#pragma unroll 1
  for (int off = 0; off < B; off += kPiece) {
    uint4 w[kVecs];
#pragma unroll
    for (int u = 0; u < kVecs; ++u) w[u] = v[off / 16 + lane + 32 * u];
    if (off + kPiece >= B) {
      __syncwarp();
      freed();
    }
    for (int r = 0; r < passes; ++r) {  // more passes: more arithmetic a byte (a GEMV's whose data waits)
      float lo = 0.f, hi = 0.f;
#pragma unroll
      for (int u = 0; u < kVecs; ++u) fma8_two(w[u], x, lo, hi);
      acc += lo + hi;
    }
  }
  return warp_sum(acc);
}

// Lines a probe warp chases (kProbeLines a block, 128 bytes apart).
constexpr int kProbeLines = 64, kProbeLineWords = 32, kProbeMinLoads = 512;

// A probe warp's lane 0: dependent L2 loads over its block's lines of
// `chase` (each holds the next line's index) until the block's W streaming
// warps are done and kProbeMinLoads were timed; stats [3] cycles, [4] loads.
__device__ void probe_round_trips(const unsigned* chase, const volatile int* streaming_done, int W, u64* stats) {
  const unsigned* mine = chase + static_cast<size_t>(blockIdx.x) * kProbeLines * kProbeLineWords;
  unsigned at = 0;
  for (int i = 0; i < 2 * kProbeLines; ++i)  // into L2 (and warm)
    asm volatile("ld.relaxed.gpu.global.u32 %0, [%1];" : "=r"(at) : "l"(mine + at * kProbeLineWords) : "memory");
  u64 cycles = 0, loads = 0;
  while (*streaming_done < W || loads < kProbeMinLoads) {
    const long long t0 = clock64();
    asm volatile("ld.relaxed.gpu.global.u32 %0, [%1];" : "=r"(at) : "l"(mine + at * kProbeLineWords) : "memory");
    if (at >= kProbeLines) break;  // never: keeps the load's use before the clock
    cycles += clock64() - t0;
    ++loads;
  }
  atomicAdd(&stats[3], cycles);
  atomicAdd(&stats[4], loads);
}

// stats: [0] issue cycles, [1] wait cycles, [2] copies (summed over warps);
// with kProbe, warp W probes (probe_round_trips: [3], [4]).
template <int W, int S, int B, bool kProbe = false>
__global__ void __launch_bounds__((W + kProbe) * 32, 1) stream(const unsigned char* src, long copies_per_warp, int passes,
                                                               int hint, float* out, u64* stats, const unsigned* chase) {
  extern __shared__ __align__(128) unsigned char ring[];
  __shared__ u64 full[W * S];
  __shared__ int streaming_done;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  if (threadIdx.x == 0) {
    for (int i = 0; i < W * S; ++i) mbar_init(&full[i], 1);
    streaming_done = 0;
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  __syncthreads();
  if (kProbe && warp == W) {
    if (lane == 0) probe_round_trips(chase, &streaming_done, W, stats);
    return;
  }
  const long warps = static_cast<long>(gridDim.x) * W, me = static_cast<long>(blockIdx.x) * W + warp;
  unsigned char* mine = ring + static_cast<size_t>(warp) * S * B;
  // Copy k of this warp: piece k * warps + me of the buffer (the grid reads it front to back).
  const auto issue = [&](int slot, long k) {
    if (lane == 0) load(mine + static_cast<size_t>(slot) * B, src + (k * warps + me) * B, B, &full[warp * S + slot], hint);
  };
  for (int s = 0; s < S && s < copies_per_warp; ++s) issue(s, s);
  float acc = 0.f;
  u64 issue_cycles = 0, wait_cycles = 0;
  for (long k = 0; k < copies_per_warp; ++k) {
    const int slot = static_cast<int>(k % S);
    long long t0 = clock64();
    mbar_wait(&full[warp * S + slot], static_cast<unsigned>((k / S) & 1));
    wait_cycles += clock64() - t0;
    acc += use_copy<B>(reinterpret_cast<const uint4*>(mine + static_cast<size_t>(slot) * B), lane, passes, [&] {
      t0 = clock64();
      if (k + S < copies_per_warp) issue(slot, k + S);
      issue_cycles += clock64() - t0;
    });
  }
  if (lane == 0) {
    out[me] = acc;
    atomicAdd(&stats[0], issue_cycles);
    atomicAdd(&stats[1], wait_cycles);
    atomicAdd(&stats[2], static_cast<u64>(copies_per_warp));
    if (kProbe) atomicAdd(&streaming_done, 1);
  }
}

// The same stream with a producer warp: warp W's lane w issues consumer
// warp w's copies, each into a slot once w has read it (an `empty` mbarrier
// a slot), so no consumer issues. stats as stream's ([0]: the producer
// lanes' issue cycles).
template <int W, int S, int B>
__global__ void __launch_bounds__((W + 1) * 32, 1) stream_producer(const unsigned char* src, long copies_per_warp, int passes,
                                                                   int hint, float* out, u64* stats) {
  extern __shared__ __align__(128) unsigned char ring[];
  __shared__ u64 full[W * S], empty[W * S];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  if (threadIdx.x == 0) {
    for (int i = 0; i < W * S; ++i) mbar_init(&full[i], 1), mbar_init(&empty[i], 1);
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  __syncthreads();
  const long warps = static_cast<long>(gridDim.x) * W;
  if (warp == W) {
    const bool serves = lane < W;
    const long me = static_cast<long>(blockIdx.x) * W + (serves ? lane : 0);
    long n = serves ? 0 : copies_per_warp;
    u64 issue_cycles = 0;
    while (__any_sync(0xffffffffu, n < copies_per_warp)) {
      if (n >= copies_per_warp) continue;
      const int slot = static_cast<int>(n % S);
      unsigned ready = 1;
      if (n >= S)
        asm volatile("{ .reg .pred p; mbarrier.test_wait.parity.shared::cta.b64 p, [%1], %2; selp.u32 %0, 1, 0, p; }"
                     : "=r"(ready)
                     : "r"(shared_address(&empty[lane * S + slot])), "r"(static_cast<unsigned>((n / S - 1) & 1))
                     : "memory");
      if (!ready) continue;
      const long long t0 = clock64();
      load(ring + (static_cast<size_t>(lane) * S + slot) * B, src + (n * warps + me) * B, B, &full[lane * S + slot], hint);
      issue_cycles += clock64() - t0;
      ++n;
    }
    if (serves) atomicAdd(&stats[0], issue_cycles);
    return;
  }
  const long me = static_cast<long>(blockIdx.x) * W + warp;
  unsigned char* mine = ring + static_cast<size_t>(warp) * S * B;
  float acc = 0.f;
  u64 wait_cycles = 0;
  for (long k = 0; k < copies_per_warp; ++k) {
    const int slot = static_cast<int>(k % S);
    const long long t0 = clock64();
    mbar_wait(&full[warp * S + slot], static_cast<unsigned>((k / S) & 1));
    wait_cycles += clock64() - t0;
    acc += use_copy<B>(reinterpret_cast<const uint4*>(mine + static_cast<size_t>(slot) * B), lane, passes, [&] {
      if (lane == 0) mbar_arrive(&empty[warp * S + slot]);
    });
  }
  if (lane == 0) {
    out[me] = acc;
    atomicAdd(&stats[1], wait_cycles);
    atomicAdd(&stats[2], static_cast<u64>(copies_per_warp));
  }
}

// kProbe: a probe warp a block (chase: its lines); `bytes` 0 times the
// probe alone, nothing streaming (its round trips include the loop's and
// the clock's own few cycles, the same in every row).
template <int W, int S, int B, bool kProducer = false, bool kProbe = false>
void run(const unsigned char* src, size_t bytes, int sms, float* out, u64* stats, int passes, int hint, double clock_ghz,
         const unsigned* chase = nullptr) {
  const size_t ring = static_cast<size_t>(W) * S * B;
  if (kProducer)
    CK(cudaFuncSetAttribute(stream_producer<W, S, B>, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(ring)));
  else
    CK(cudaFuncSetAttribute(stream<W, S, B, kProbe>, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(ring)));
  const long per_warp = static_cast<long>(bytes / B / (static_cast<size_t>(sms) * W));
  const double read = static_cast<double>(per_warp) * B * sms * W;
  std::vector<u64> h(5);
  const float best = best_of(
      4, [&] { CK(cudaMemset(stats, 0, 5 * sizeof(u64))); },
      [&] {
        if (kProducer)
          stream_producer<W, S, B><<<sms, (W + 1) * 32, ring>>>(src, per_warp, passes, hint, out, stats);
        else
          stream<W, S, B, kProbe><<<sms, (W + kProbe) * 32, ring>>>(src, per_warp, passes, hint, out, stats, chase);
      },
      [&] { CK(cudaMemcpy(h.data(), stats, 5 * sizeof(u64), cudaMemcpyDeviceToHost)); });
  const double copies = static_cast<double>(h[2] > 0 ? h[2] : 1);
  std::printf("%s warps %2d slots %d bytes %5d ring %6zu B/SM passes %d hint %d: %7.1f GB/s  issue %6.0f cycles (%.3f us)  wait %6.0f cycles (%.3f us)  all %.3f us a copy",
              kProducer ? "producer" : "consumers", W, S, B, ring, passes, hint, per_warp > 0 ? read / (best * 1e-3) / 1e9 : 0.0,
              h[0] / copies, h[0] / copies / clock_ghz / 1e3, h[1] / copies, h[1] / copies / clock_ghz / 1e3,
              per_warp > 0 ? best * 1e3 / per_warp : 0.0);
  if (kProbe && h[4] > 0)
    std::printf("  probe L2 round trip %6.0f cycles (%.3f us) over %llu loads", static_cast<double>(h[3]) / h[4],
                static_cast<double>(h[3]) / h[4] / clock_ghz / 1e3, h[4]);
  std::printf("\n");
  std::fflush(stdout);
}

int main() {
  int dev = 0, sms = 0, clock_khz = 0;
  CK(cudaSetDevice(dev));
  CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  CK(cudaDeviceGetAttribute(&clock_khz, cudaDevAttrClockRate, dev));
  const double clock_ghz = clock_khz / 1e6;
  const size_t bytes = size_t(2) << 30;
  unsigned char *src = nullptr, *dst = nullptr;
  CK(cudaMalloc(&src, bytes));
  CK(cudaMalloc(&dst, bytes));
  CK(cudaMemset(src, 0x3f, bytes));
  float* out = nullptr;
  u64* stats = nullptr;
  CK(cudaMalloc(&out, sizeof(float) * sms * 32));
  CK(cudaMalloc(&stats, 5 * sizeof(u64)));
  {
    cudaEvent_t a, b;
    CK(cudaEventCreate(&a));
    CK(cudaEventCreate(&b));
    float best = 1e30f;
    for (int rep = 0; rep < 4; ++rep) {
      CK(cudaEventRecord(a));
      CK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice));
      CK(cudaEventRecord(b));
      CK(cudaEventSynchronize(b));
      float ms = 0;
      CK(cudaEventElapsedTime(&ms, a, b));
      best = ms < best ? ms : best;
    }
    std::printf("SMs %d, clock %.2f GHz; cudaMemcpy D2D (read + write): %.1f GB/s\n", sms, clock_ghz,
                2.0 * bytes / (best * 1e-3) / 1e9);
  }
  if (std::getenv("BRS_PROBE")) {
    // Each block's lines: line i holds i + 1 (the last, 0) in its first word.
    std::vector<unsigned> lines(static_cast<size_t>(sms) * kProbeLines * kProbeLineWords, 0);
    for (int b = 0; b < sms; ++b)
      for (int i = 0; i < kProbeLines; ++i)
        lines[(static_cast<size_t>(b) * kProbeLines + i) * kProbeLineWords] = (i + 1) % kProbeLines;
    unsigned* chase = nullptr;
    CK(cudaMalloc(&chase, lines.size() * sizeof(unsigned)));
    CK(cudaMemcpy(chase, lines.data(), lines.size() * sizeof(unsigned), cudaMemcpyHostToDevice));
    for (int passes = 0; passes < 2; ++passes) {
      run<16, 3, 4096, false, true>(src, 0, sms, out, stats, passes, 1, clock_ghz, chase);  // nothing streaming
      run<16, 1, 4096, false, true>(src, bytes, sms, out, stats, passes, 1, clock_ghz, chase);
      run<16, 2, 4096, false, true>(src, bytes, sms, out, stats, passes, 1, clock_ghz, chase);
      run<16, 3, 4096, false, true>(src, bytes, sms, out, stats, passes, 1, clock_ghz, chase);  // the decode step's
      run<16, 3, 4096, false, true>(src, bytes, sms, out, stats, passes, 0, clock_ghz, chase);
      run<16, 1, 2048, false, true>(src, bytes, sms, out, stats, passes, 1, clock_ghz, chase);
      run<16, 3, 2048, false, true>(src, bytes, sms, out, stats, passes, 1, clock_ghz, chase);  // 96 KiB (after session 85)
      run<16, 6, 2048, false, true>(src, bytes, sms, out, stats, passes, 1, clock_ghz, chase);
    }
    CK(cudaFree(chase));
    return 0;
  }
  if (std::getenv("BRS_PRODUCER")) {  // session 81's second question: a producer warp, with arithmetic enough to wait on
    for (int passes : {1, 2, 4, 8}) {
      run<16, 3, 4096>(src, bytes, sms, out, stats, passes, 1, clock_ghz);
      run<15, 3, 4096>(src, bytes, sms, out, stats, passes, 1, clock_ghz);
      run<15, 3, 4096, true>(src, bytes, sms, out, stats, passes, 1, clock_ghz);
    }
    return 0;
  }
  for (int passes = 0; passes < 2; ++passes) {
    run<16, 3, 4096>(src, bytes, sms, out, stats, passes, 1, clock_ghz);  // the decode step's ring
    run<16, 3, 4096>(src, bytes, sms, out, stats, passes, 0, clock_ghz);
    run<16, 6, 2048>(src, bytes, sms, out, stats, passes, 1, clock_ghz);  // the same bytes in smaller copies
    run<16, 2, 4096>(src, bytes, sms, out, stats, passes, 1, clock_ghz);  // fewer in flight
    run<16, 1, 4096>(src, bytes, sms, out, stats, passes, 1, clock_ghz);
    run<8, 3, 8192>(src, bytes, sms, out, stats, passes, 1, clock_ghz);   // the same bytes in larger copies
    run<4, 3, 16384>(src, bytes, sms, out, stats, passes, 1, clock_ghz);
    run<16, 1, 12288>(src, bytes, sms, out, stats, passes, 1, clock_ghz);
    run<16, 3, 2048>(src, bytes, sms, out, stats, passes, 1, clock_ghz);  // half the bytes in flight
  }
  return 0;
}
