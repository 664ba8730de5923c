// What the persistent-kernel experiments (persistent_chain.cu,
// decode_step_kernel.cu, bulk_ring_stream.cu, cluster_handover.cu) share,
// and graph_launch_size.cu's CUDA call check and clock: the CUDA call check, the
// random fills and the streaming read that sets the floor, the bf16
// products' warp sums, mbarriers and bulk copies from global into shared
// memory, the global nanosecond clock, the fastest of a few timed runs,
// and a warp's walk over its chunks of a chain of GEMVs.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>

#define CK(x)                                                                              \
  do {                                                                                     \
    cudaError_t e_ = (x);                                                                  \
    if (e_ != cudaSuccess) {                                                               \
      std::fprintf(stderr, "%s: %s (line %d)\n", #x, cudaGetErrorString(e_), __LINE__);   \
      std::exit(1);                                                                        \
    }                                                                                      \
  } while (0)

// offset + uniform(-scale, scale), a hash of the index and the seed.
__global__ void fill_uniform(__nv_bfloat16* p, long long n, unsigned seed, float scale, float offset) {
  for (long long i = blockIdx.x * static_cast<long long>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<long long>(gridDim.x) * blockDim.x) {
    unsigned h = static_cast<unsigned>(i) * 2654435761u ^ (seed * 0x9e3779b9u + static_cast<unsigned>(i >> 32));
    h ^= h >> 16, h *= 0x7feb352du, h ^= h >> 15, h *= 0x846ca68bu, h ^= h >> 16;
    p[i] = __float2bfloat16(offset + scale * (2.0f * (h & 0xffffff) / 16777215.0f - 1.0f));
  }
}

// A streaming read of n 16-byte words: the floor the chains are held to.
__global__ void read_all(const uint4* p, long long n, unsigned* sink) {
  unsigned acc = 0;
  for (long long i = blockIdx.x * static_cast<long long>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<long long>(gridDim.x) * blockDim.x) {
    const uint4 v = __ldcs(p + i);
    acc ^= v.x ^ v.y ^ v.z ^ v.w;
  }
  if (acc == 0x12345678u) *sink = acc;
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// x . w over 8 bf16 pairs packed in 16 bytes, into two accumulators (the
// low and the high halves: half as long a dependent chain).
__device__ __forceinline__ void fma8_two(const uint4& w, const uint4& x, float& lo, float& hi) {
  const unsigned a[4] = {w.x, w.y, w.z, w.w}, b[4] = {x.x, x.y, x.z, x.w};
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    lo = fmaf(__uint_as_float(a[k] << 16), __uint_as_float(b[k] << 16), lo);
    hi = fmaf(__uint_as_float(a[k] & 0xffff0000u), __uint_as_float(b[k] & 0xffff0000u), hi);
  }
}

// The GPU's global nanosecond clock (comparable across SMs).
__device__ __forceinline__ unsigned long long global_ns() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}
__device__ __forceinline__ unsigned shared_address(const void* p) {
  return static_cast<unsigned>(__cvta_generic_to_shared(p));
}
__device__ __forceinline__ void mbar_init(unsigned long long* b, unsigned count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(shared_address(b)), "r"(count) : "memory");
}
__device__ __forceinline__ void mbar_arrive(unsigned long long* b) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(shared_address(b)) : "memory");
}
__device__ __forceinline__ void mbar_expect_tx(unsigned long long* b, unsigned bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(shared_address(b)), "r"(bytes) : "memory");
}
// PC_SUSPEND_NS (a build flag): the most a waiting thread sleeps in one try
// before it tries again (mbarrier.try_wait's suspend-time hint); 0 leaves
// the limit to the hardware.
#ifndef PC_SUSPEND_NS
#define PC_SUSPEND_NS 0
#endif
__device__ __forceinline__ void mbar_wait(unsigned long long* b, unsigned parity) {
  unsigned done = 0;
  while (!done) {
    if (PC_SUSPEND_NS == 0)
      asm volatile("{ .reg .pred p; mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2; selp.u32 %0, 1, 0, p; }"
                   : "=r"(done)
                   : "r"(shared_address(b)), "r"(parity)
                   : "memory");
    else
      asm volatile("{ .reg .pred p; mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2, %3; selp.u32 %0, 1, 0, p; }"
                   : "=r"(done)
                   : "r"(shared_address(b)), "r"(parity), "r"(static_cast<unsigned>(PC_SUSPEND_NS))
                   : "memory");
  }
}
__device__ __forceinline__ void bulk_load(void* dst, const void* src, unsigned bytes, unsigned long long* bar) {
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(
                   shared_address(dst)),
               "l"(src), "r"(bytes), "r"(shared_address(bar))
               : "memory");
}

// The fastest of `reps` timed runs of launch() on the default stream, in
// ms; before each run, prepare(); after a run faster than every one before
// it, best() (to read that run's counters).
template <class Prepare, class Launch, class Best>
float best_of(int reps, Prepare&& prepare, Launch&& launch, Best&& best) {
  cudaEvent_t a, b;
  CK(cudaEventCreate(&a));
  CK(cudaEventCreate(&b));
  float fastest = 1e30f;
  for (int rep = 0; rep < reps; ++rep) {
    prepare();
    CK(cudaEventRecord(a));
    launch();
    CK(cudaGetLastError());
    CK(cudaEventRecord(b));
    CK(cudaEventSynchronize(b));
    float ms = 0;
    CK(cudaEventElapsedTime(&ms, a, b));
    if (ms < fastest) {
      fastest = ms;
      best();
    }
  }
  CK(cudaEventDestroy(a));
  CK(cudaEventDestroy(b));
  return fastest;
}

// A warp's walk over its items of a chain of GEMVs: items warp, warp + warps,
// ... of GEMV g (item_count[g] of them), then of the next GEMV that has any.
struct chunk_cursor {
  int g, j;
  int count, warp, warps;
  const int* item_count;
  __device__ chunk_cursor(int count_, int warp_, int warps_, const int* item_count_)
      : g(0), j(warp_), count(count_), warp(warp_), warps(warps_), item_count(item_count_) {
    settle();
  }
  __device__ bool done() const { return g >= count; }
  __device__ void advance() {
    j += warps;
    settle();
  }

 private:
  __device__ void settle() {
    while (g < count && j >= item_count[g]) {
      if (++g < count) j = warp;
    }
  }
};
