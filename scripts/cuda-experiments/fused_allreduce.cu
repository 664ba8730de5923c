// Would a row-parallel GEMV that pushes its own rows to its peer pay? The
// LLaMA-7B decode step at tensor degree 2 (32 layers; per GPU: q/k/v 6144 x
// 4096, o 4096 x 2048, gate|up 11008 x 4096, down 4096 x 5504; bf16, one
// row) on two GPUs, its two all-reduces a layer (4096 bf16, 8 KiB) done
// three ways (docs/BENCHMARKS.md, session 41):
//   A. a kernel of its own after the o and down GEMVs, as the runtime's
//      in-stream push path (gpu/cuda/in_stream.cu): 2 blocks of 512 threads,
//      each pushes its 16-byte words to the peer's inbox as flagged 16-byte
//      lines, then takes the peer's lines, sums them with its own in rank
//      order and writes the sum; PDL: it waits for the GEMV and lets the
//      next GEMV launch at once;
//   F. fused into the o and down GEMVs: each block pushes its four rows (one
//      line) as soon as they are summed, and the grid's last block (a
//      counter) takes the peer's lines and writes the sum: one kernel
//      boundary fewer per all-reduce, the pushes spread over the GEMV;
//   N. no all-reduce (each GPU reads its own partial): the bound.
// Every form is captured as one CUDA graph per GPU (a plain epoch kernel,
// then PDL launches), both GPUs' graphs launched together; a line's flag is
// a hash of (epoch, all-reduce index), so lines of an earlier replay never
// match. A's and F's final activations must agree bit for bit, and so must
// the two GPUs' (the sum is the same on both).
// Standalone (README.md here), two GPUs with peer access:
//   nvcc -O3 -arch=sm_90 -std=c++17 -o fused_allreduce fused_allreduce.cu && ./fused_allreduce
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <vector>

#define CK(x)                                                                              \
  do {                                                                                     \
    cudaError_t e_ = (x);                                                                  \
    if (e_ != cudaSuccess) {                                                               \
      std::fprintf(stderr, "%s: %s (line %d)\n", #x, cudaGetErrorString(e_), __LINE__);   \
      std::exit(1);                                                                        \
    }                                                                                      \
  } while (0)

namespace {

using bf16 = __nv_bfloat16;
constexpr int kThreads = 256, kWarps = kThreads / 32, kLoads = 8, kRowsPerBlock = kWarps / 2;
constexpr int kModel = 4096;               // d: the all-reduced vector
constexpr int kLines = kModel / 4;         // 16-byte lines of 4 bf16 (8 data bytes) each
constexpr int kLayers = 32, kArs = 2 * kLayers;
constexpr long long kSpinLimit = 1ll << 24;  // polls before a wait gives up (error flag)

struct stage {
  const bf16* w;  // [N, K]
  const bf16* x;  // [K]
  bf16* y;        // [N]
  int N, K;
};

// One all-reduce of kModel bf16 between two GPUs.
struct ar_ctx {
  unsigned* peer_inbox = nullptr;            // the peer's inbox, [kArs][kLines] lines of 4 u32
  unsigned* my_inbox = nullptr;              // mine, which the peer pushes into
  const unsigned long long* epoch = nullptr; // mine (the graph's first kernel counts replays)
  unsigned* counter = nullptr;               // mine, [kArs]: blocks done (F), reset by the last
  unsigned* failed = nullptr;                // mine: a wait gave up
  bf16* out = nullptr;                       // the sum, [kModel]
  int index = 0;                             // the all-reduce's index in the step
};

__device__ __forceinline__ void pdl_wait() { asm volatile("griddepcontrol.wait;" ::: "memory"); }
__device__ __forceinline__ void pdl_release() { asm volatile("griddepcontrol.launch_dependents;" ::: "memory"); }
__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ void fma8(const uint4& w, const uint4& x, float& acc) {
  const unsigned a[4] = {w.x, w.y, w.z, w.w}, b[4] = {x.x, x.y, x.z, x.w};
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    acc = fmaf(__uint_as_float(a[k] << 16), __uint_as_float(b[k] << 16), acc);
    acc = fmaf(__uint_as_float(a[k] & 0xffff0000u), __uint_as_float(b[k] & 0xffff0000u), acc);
  }
}
__device__ __forceinline__ unsigned flag_of(unsigned long long tag) {
  const unsigned long long x = (tag ^ (tag >> 31)) * 0x9E3779B97F4A7C15ull;
  return static_cast<unsigned>(x >> 32) | 1u;
}
__device__ __forceinline__ void line_store(unsigned* p, unsigned d0, unsigned f0, unsigned d1, unsigned f1) {
  asm volatile("st.volatile.global.v4.u32 [%0], {%1, %2, %3, %4};" ::"l"(p), "r"(d0), "r"(f0), "r"(d1), "r"(f1)
               : "memory");
}
__device__ __forceinline__ uint4 line_load(const unsigned* p) {
  uint4 v;
  asm volatile("ld.volatile.global.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p)
               : "memory");
  return v;
}
/// Line i of all-reduce `index` in `box` once it carries `flag`: its 8 data bytes.
__device__ __forceinline__ uint2 take_line(const unsigned* box, int index, int i, unsigned flag, unsigned* failed) {
  const unsigned* p = box + 4 * (static_cast<long long>(index) * kLines + i);
  for (long long n = 0; n < kSpinLimit; ++n) {
    const uint4 v = line_load(p);
    if (v.y == flag && v.w == flag) return make_uint2(v.x, v.z);
  }
  atomicExch(failed, 1u);
  return make_uint2(0, 0);
}
/// Two bf16 in a word, summed with two others in f32, rounded back.
__device__ __forceinline__ unsigned add_pair(unsigned a, unsigned b) {
  const float lo = __uint_as_float(a << 16) + __uint_as_float(b << 16);
  const float hi = __uint_as_float(a & 0xffff0000u) + __uint_as_float(b & 0xffff0000u);
  const __nv_bfloat162 r = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const unsigned*>(&r);
}

__global__ void next_epoch(unsigned long long* epoch) { ++*epoch; }

// The runtime's GEMV (gpu/cuda/gemv.cu, one x row): two warps per weight
// row, each over half of K, four rows a block, the first chunk loaded before
// the PDL wait. FUSED 1: the block then pushes its four rows to the peer as
// one line, and the grid's last block sums the peer's lines with this GPU's
// rows into a.out. FUSED 2: each block, after its push, waits for the
// peer's line of the same rows and writes their sum (no counter; a block
// waits for the peer's block of the same index, which this experiment's
// grids, one per GPU, always reach: not safe where GPUs are shared).
template <int FUSED>
__global__ void __launch_bounds__(kThreads, 4) gemv(stage s, ar_ctx a) {
  __shared__ float part[kWarps];
  __shared__ unsigned row_bits[kRowsPerBlock];
  __shared__ int last;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, slice = warp % 2;
  const int vecs = s.K / 8, per = vecs / 2, vb = slice * per, ve = vb + per;
  const long long n = static_cast<long long>(blockIdx.x) * kRowsPerBlock + warp / 2;
  uint4 wv[kLoads];
  const uint4* wr = reinterpret_cast<const uint4*>(s.w + n * s.K);
  if (n < s.N)
#pragma unroll
    for (int u = 0; u < kLoads; ++u)
      if (vb + lane + 32 * u < ve) wv[u] = __ldcs(wr + vb + lane + 32 * u);
  pdl_wait();
  pdl_release();
  float acc = 0.f;
  if (n < s.N) {
    const uint4* xr = reinterpret_cast<const uint4*>(s.x);
    for (int v0 = vb + lane; v0 < ve; v0 += 32 * kLoads) {
      if (v0 != vb + lane)
#pragma unroll
        for (int u = 0; u < kLoads; ++u)
          if (v0 + 32 * u < ve) wv[u] = __ldcs(wr + v0 + 32 * u);
#pragma unroll
      for (int u = 0; u < kLoads; ++u)
        if (v0 + 32 * u < ve) fma8(wv[u], __ldg(xr + v0 + 32 * u), acc);
    }
  }
  acc = warp_sum(acc);
  if (lane == 0) part[warp] = acc;
  __syncthreads();
  if (slice == 0 && lane == 0 && n < s.N) {
    const bf16 r = __float2bfloat16(part[warp] + part[warp + 1]);
    s.y[n] = r;
    if (FUSED != 0) row_bits[warp / 2] = __bfloat16_as_ushort(r);
    if (FUSED == 1) __threadfence();  // the row before the block's count (the last block reads it)
  }
  if constexpr (FUSED != 0) {  // s.N == kModel: every block has 4 rows, one line
    __syncthreads();
    if (threadIdx.x == 0) {
      const unsigned flag = flag_of((*a.epoch << 8) | static_cast<unsigned>(a.index));
      const unsigned d0 = row_bits[0] | (row_bits[1] << 16), d1 = row_bits[2] | (row_bits[3] << 16);
      line_store(a.peer_inbox + 4 * (static_cast<long long>(a.index) * kLines + blockIdx.x), d0, flag, d1, flag);
      if constexpr (FUSED == 2) {
        const uint2 peer = take_line(a.my_inbox, a.index, blockIdx.x, flag, a.failed);
        reinterpret_cast<uint2*>(a.out)[blockIdx.x] = make_uint2(add_pair(d0, peer.x), add_pair(d1, peer.y));
      } else {
        last = atomicAdd(&a.counter[a.index], 1u) == gridDim.x - 1;
      }
    }
    __syncthreads();
    if (FUSED == 2 || !last) return;
    __threadfence();
    const unsigned flag = flag_of((*a.epoch << 8) | static_cast<unsigned>(a.index));
    const uint2* mine = reinterpret_cast<const uint2*>(s.y);
    uint2* out = reinterpret_cast<uint2*>(a.out);
    for (int i = threadIdx.x; i < kLines; i += blockDim.x) {
      const uint2 peer = take_line(a.my_inbox, a.index, i, flag, a.failed);
      const uint2 own = __ldcg(mine + i);  // other blocks' rows: from L2
      out[i] = make_uint2(add_pair(own.x, peer.x), add_pair(own.y, peer.y));  // two members: order-free
    }
    if (threadIdx.x == 0) a.counter[a.index] = 0;
  }
}

// A: the all-reduce as a kernel of its own (the runtime's push path).
__global__ void __launch_bounds__(512) all_reduce_push(const bf16* operand, ar_ctx a) {
  const unsigned long long epoch = *a.epoch;  // set by a plain launch before the graph's first PDL kernel
  pdl_wait();
  pdl_release();
  const unsigned flag = flag_of((epoch << 8) | static_cast<unsigned>(a.index));
  const int w0 = blockIdx.x * 256, w1 = min(w0 + 256, kModel / 8);
  const uint4* mine = reinterpret_cast<const uint4*>(operand);
  unsigned* box = a.peer_inbox + 4ll * a.index * kLines;
  for (int w = w0 + threadIdx.x; w < w1; w += blockDim.x) {
    const uint4 v = mine[w];
    line_store(box + 8 * w, v.x, flag, v.y, flag);
    line_store(box + 8 * w + 4, v.z, flag, v.w, flag);
  }
  uint4* out = reinterpret_cast<uint4*>(a.out);
  for (int w = w0 + threadIdx.x; w < w1; w += blockDim.x) {
    const uint2 lo = take_line(a.my_inbox, a.index, 2 * w, flag, a.failed);
    const uint2 hi = take_line(a.my_inbox, a.index, 2 * w + 1, flag, a.failed);
    const uint4 v = mine[w];
    out[w] = make_uint4(add_pair(v.x, lo.x), add_pair(v.y, lo.y), add_pair(v.z, hi.x), add_pair(v.w, hi.y));
  }
}

__global__ void fill_uniform(bf16* p, long long n, unsigned seed, float scale) {
  for (long long i = blockIdx.x * static_cast<long long>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<long long>(gridDim.x) * blockDim.x) {
    unsigned h = static_cast<unsigned>(i) * 2654435761u ^ (seed * 0x9e3779b9u + static_cast<unsigned>(i >> 32));
    h ^= h >> 16, h *= 0x7feb352du, h ^= h >> 15, h *= 0x846ca68bu, h ^= h >> 16;
    p[i] = __float2bfloat16(scale * (2.0f * (h & 0xffffff) / 16777215.0f - 1.0f));
  }
}

template <class... KA, class... A>
void launch_pdl(cudaStream_t st, void (*k)(KA...), unsigned grid, unsigned block, A... args) {
  cudaLaunchAttribute at[1];
  at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  at[0].val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t c{};
  c.gridDim = grid;
  c.blockDim = block;
  c.stream = st;
  c.attrs = at;
  c.numAttrs = 1;
  CK(cudaLaunchKernelEx(&c, k, args...));
}

struct gpu_side {
  int dev = 0;
  cudaStream_t s{};
  bf16 *w = nullptr, *x = nullptr, *qkv = nullptr, *gu = nullptr, *partial = nullptr;
  unsigned* inbox = nullptr;
  unsigned long long* epoch = nullptr;
  unsigned *counter = nullptr, *failed = nullptr;
  std::vector<stage> st;  // per layer: q/k/v, o, gate|up, down
};

enum form { separate = 0, fused = 1, none = 2, fused_per_block = 3 };

cudaGraphExec_t capture(gpu_side& g, const gpu_side& peer, form f) {
  CK(cudaSetDevice(g.dev));
  cudaGraph_t gr;
  CK(cudaStreamBeginCapture(g.s, cudaStreamCaptureModeThreadLocal));
  next_epoch<<<1, 1, 0, g.s>>>(g.epoch);
  for (int l = 0; l < kLayers; ++l) {
    for (int k = 0; k < 4; ++k) {
      stage s = g.st[4 * l + k];
      const bool row_parallel = k % 2 == 1;  // o, down: partial sums of the vector
      ar_ctx a;
      a.peer_inbox = peer.inbox;
      a.my_inbox = g.inbox;
      a.epoch = g.epoch;
      a.counter = g.counter;
      a.failed = g.failed;
      a.out = g.x;
      a.index = 2 * l + k / 2;
      if (row_parallel) s.y = f == none ? g.x : g.partial;
      const unsigned grid = static_cast<unsigned>((s.N + kRowsPerBlock - 1) / kRowsPerBlock);
      if (row_parallel && f == fused) {
        launch_pdl(g.s, gemv<1>, grid, kThreads, s, a);
      } else if (row_parallel && f == fused_per_block) {
        launch_pdl(g.s, gemv<2>, grid, kThreads, s, a);
      } else {
        launch_pdl(g.s, gemv<0>, grid, kThreads, s, a);
        if (row_parallel && f == separate)
          launch_pdl(g.s, all_reduce_push, 2u, 512u, static_cast<const bf16*>(g.partial), a);
      }
    }
  }
  CK(cudaStreamEndCapture(g.s, &gr));
  cudaGraphExec_t ge;
  CK(cudaGraphInstantiate(&ge, gr, 0));
  CK(cudaGraphDestroy(gr));
  return ge;
}

}  // namespace

int main() {
  int n = 0;
  CK(cudaGetDeviceCount(&n));
  if (n < 2) {
    std::printf("needs two GPUs (found %d)\n", n);
    return 2;
  }
  int can01 = 0, can10 = 0;
  CK(cudaDeviceCanAccessPeer(&can01, 0, 1));
  CK(cudaDeviceCanAccessPeer(&can10, 1, 0));
  if (!can01 || !can10) {
    std::printf("GPUs 0 and 1 have no peer access\n");
    return 2;
  }
  // Per GPU, per layer: q/k/v (column-parallel), o (row), gate|up (column), down (row).
  const int shapes[4][2] = {{6144, kModel}, {kModel, 2048}, {11008, kModel}, {kModel, 5504}};
  gpu_side g[2];
  size_t weight_elems = 0;
  for (const auto& sh : shapes) weight_elems += static_cast<size_t>(sh[0]) * sh[1];
  weight_elems *= kLayers;
  for (int d = 0; d < 2; ++d) {
    gpu_side& s = g[d];
    s.dev = d;
    CK(cudaSetDevice(d));
    CK(cudaDeviceEnablePeerAccess(1 - d, 0));
    CK(cudaStreamCreateWithFlags(&s.s, cudaStreamNonBlocking));
    CK(cudaMalloc(&s.w, weight_elems * 2));
    CK(cudaMalloc(&s.x, kModel * 2));
    CK(cudaMalloc(&s.qkv, 6144 * 2));
    CK(cudaMalloc(&s.gu, 11008 * 2));
    CK(cudaMalloc(&s.partial, kModel * 2));
    const size_t inbox_bytes = static_cast<size_t>(kArs) * kLines * 16;
    CK(cudaMalloc(&s.inbox, inbox_bytes));
    CK(cudaMemset(s.inbox, 0, inbox_bytes));
    CK(cudaMalloc(&s.epoch, 8));
    CK(cudaMemset(s.epoch, 0, 8));
    CK(cudaMalloc(&s.counter, kArs * 4));
    CK(cudaMemset(s.counter, 0, kArs * 4));
    CK(cudaMalloc(&s.failed, 4));
    CK(cudaMemset(s.failed, 0, 4));
    size_t off = 0;
    for (int l = 0; l < kLayers; ++l)
      for (int k = 0; k < 4; ++k) {
        const int N = shapes[k][0], K = shapes[k][1];
        // Uniform(-a, a), a^2 K / 3 = 1 (column-parallel) or 1/2 (row: two partials sum to unit scale).
        const float scale = std::sqrt((k % 2 == 1 ? 1.5f : 3.0f) / K);
        fill_uniform<<<1024, 256>>>(s.w + off, static_cast<long long>(N) * K, 1000 * d + 4 * l + k + 1, scale);
        const bf16* in = k == 0 || k == 2 ? s.x : k == 1 ? s.qkv : s.gu;  // o reads q/k/v's first 2048, down gate|up's first 5504
        bf16* out = k == 0 ? s.qkv : k == 2 ? s.gu : s.partial;
        s.st.push_back(stage{s.w + off, in, out, N, K});
        off += static_cast<size_t>(N) * K;
      }
    CK(cudaGetLastError());
    CK(cudaDeviceSynchronize());
  }
  std::vector<bf16> x0(kModel);
  {
    bf16* d_x0;
    CK(cudaSetDevice(0));
    CK(cudaMalloc(&d_x0, kModel * 2));
    fill_uniform<<<16, 256>>>(d_x0, kModel, 7, 1.7f);
    CK(cudaMemcpy(x0.data(), d_x0, kModel * 2, cudaMemcpyDeviceToHost));
    CK(cudaFree(d_x0));
  }
  const int reps = 50;
  const auto run = [&](form f, std::vector<bf16>& final0, std::vector<bf16>& final1) {
    cudaGraphExec_t ge[2] = {capture(g[0], g[1], f), capture(g[1], g[0], f)};
    const auto launch_both = [&] {
      for (int d = 0; d < 2; ++d) {
        CK(cudaSetDevice(d));
        CK(cudaGraphLaunch(ge[d], g[d].s));
      }
    };
    // One step from x0, for the outputs; then warm-up and timed steps.
    for (int d = 0; d < 2; ++d) {
      CK(cudaSetDevice(d));
      CK(cudaMemcpy(g[d].x, x0.data(), kModel * 2, cudaMemcpyHostToDevice));
    }
    launch_both();
    for (int d = 0; d < 2; ++d) {
      CK(cudaSetDevice(d));
      CK(cudaStreamSynchronize(g[d].s));
    }
    final0.resize(kModel);
    final1.resize(kModel);
    CK(cudaSetDevice(0));
    CK(cudaMemcpy(final0.data(), g[0].x, kModel * 2, cudaMemcpyDeviceToHost));
    CK(cudaSetDevice(1));
    CK(cudaMemcpy(final1.data(), g[1].x, kModel * 2, cudaMemcpyDeviceToHost));
    for (int i = 0; i < 5; ++i) launch_both();
    cudaEvent_t e0[2], e1[2];
    for (int d = 0; d < 2; ++d) {
      CK(cudaSetDevice(d));
      CK(cudaStreamSynchronize(g[d].s));
      CK(cudaEventCreate(&e0[d]));
      CK(cudaEventCreate(&e1[d]));
      CK(cudaEventRecord(e0[d], g[d].s));
    }
    for (int i = 0; i < reps; ++i) launch_both();
    double us = 0;
    for (int d = 0; d < 2; ++d) {
      CK(cudaSetDevice(d));
      CK(cudaEventRecord(e1[d], g[d].s));
      CK(cudaEventSynchronize(e1[d]));
      float ms = 0;
      CK(cudaEventElapsedTime(&ms, e0[d], e1[d]));
      us = std::max(us, ms * 1e3 / reps);
      CK(cudaGraphExecDestroy(ge[d]));
    }
    unsigned failed[2] = {0, 0};
    for (int d = 0; d < 2; ++d) {
      CK(cudaSetDevice(d));
      CK(cudaMemcpy(&failed[d], g[d].failed, 4, cudaMemcpyDeviceToHost));
    }
    if (failed[0] || failed[1]) {
      std::printf("a wait gave up (GPU 0: %u, GPU 1: %u)\n", failed[0], failed[1]);
      std::exit(1);
    }
    return us;
  };
  std::vector<bf16> a0, a1, f0, f1, n0, n1, p0, p1;
  double t_sep[3], t_fused[3], t_none[3], t_per_block[3];
  for (int r = 0; r < 3; ++r) {  // alternated
    t_sep[r] = run(separate, a0, a1);
    t_fused[r] = run(fused, f0, f1);
    t_per_block[r] = run(fused_per_block, p0, p1);
    t_none[r] = run(none, n0, n1);
  }
  const auto same = [](const std::vector<bf16>& p, const std::vector<bf16>& q) {
    return std::memcmp(p.data(), q.data(), p.size() * 2) == 0;
  };
  double rms = 0;
  for (const bf16 v : a0) rms += static_cast<double>(__bfloat162float(v)) * __bfloat162float(v);
  rms = std::sqrt(rms / kModel);
  cudaDeviceProp prop;
  CK(cudaGetDeviceProperties(&prop, 0));
  std::printf("%s x 2; LLaMA-7B decode step at degree 2 (%d layers, 2 all-reduces of %d bf16 a layer), one CUDA graph per GPU\n",
              prop.name, kLayers, kModel);
  std::printf("%-62s %9s %9s %9s %12s\n", "form", "run 1", "run 2", "run 3", "us a layer");
  const auto row = [&](const char* name, const double* t) {
    double v[3] = {t[0], t[1], t[2]};
    std::sort(v, v + 3);
    std::printf("%-62s %9.1f %9.1f %9.1f %12.2f\n", name, t[0], t[1], t[2], v[1] / kLayers);
  };
  row("A: all-reduce kernels of their own (the runtime's push path)", t_sep);
  row("F: fused into the o and down GEMVs (last block sums)", t_fused);
  row("F2: fused, each block sums its own rows (no counter)", t_per_block);
  row("N: no all-reduce (the bound)", t_none);
  const auto med = [](const double* t) {
    double v[3] = {t[0], t[1], t[2]};
    std::sort(v, v + 3);
    return v[1];
  };
  std::printf("all_reduce_cost_us_per_layer_separate: %.2f\n", (med(t_sep) - med(t_none)) / kLayers);
  std::printf("all_reduce_cost_us_per_layer_fused: %.2f\n", (med(t_fused) - med(t_none)) / kLayers);
  std::printf("all_reduce_cost_us_per_layer_fused_per_block: %.2f\n", (med(t_per_block) - med(t_none)) / kLayers);
  std::printf("fused_over_separate: %.3f\n", med(t_fused) / med(t_sep));
  const bool ok = same(a0, a1) && same(f0, f1) && same(a0, f0) && same(a0, p0) && same(p0, p1) && std::isfinite(rms) &&
                  rms > 0.1 && rms < 100;
  std::printf("final activations: A GPU 0 = GPU 1 %s, F GPU 0 = GPU 1 %s, A = F %s, A = F2 %s, F2 GPU 0 = GPU 1 %s (rms %.3f)\n",
              same(a0, a1) ? "yes" : "NO", same(f0, f1) ? "yes" : "NO", same(a0, f0) ? "yes" : "NO",
              same(a0, p0) ? "yes" : "NO", same(p0, p1) ? "yes" : "NO", rms);
  std::printf("%s\n", ok ? "outputs agree" : "OUTPUTS DISAGREE");
  return ok ? 0 : 1;
}
