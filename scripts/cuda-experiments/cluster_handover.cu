// How long the decode step's q/k/v hand-over takes while the weight rings
// stream, through L2 or through a thread block cluster (session 82).
//
// The runtime's decode step (gpu/cuda/decode_step.cu) hands q/k/v to the
// attending blocks through L2: each block stores its rows tagged, and a kv
// head's 16 attending blocks spin on the 384 values their head needs. Session
// 82's diagnostic found that wait 3.7 us after the last store on an H100,
// the round trips queued behind the 192 KiB a SM of weight loads in flight.
// If a kv head's 16 blocks were one cluster that also computed that head's
// q/k/v rows (24 a block, LLaMA-1B's 3072 rows over 128 blocks), the values
// could go straight into each other's shared memory and meet at one cluster
// barrier, a path that never touches L2. Session 47 measured clusters for
// the attention's combine in the kernel-per-op decode, where the cluster
// launch cost 0.4 us a layer; in the persistent kernel the launch is paid once.
//
// Every warp of a persistent grid streams a 2 GiB read through its own ring
// of bulk copies (the decode step's: 16 warps x 3 slots x 4 KiB), in phases
// of ITEMS copies a warp; at each phase's end the block's warps meet and
// the block hands 24 values to each of the other blocks of its group (16
// blocks, or 8), and waits for theirs:
//   none    no hand-over (the stream's own pace with a barrier a phase);
//   l2      tagged 8-byte stores and spinning loads through L2 (the runtime's
//           way; a cooperative launch, groups of consecutive blocks);
//   cluster stores into the group's shared memories (distributed shared
//           memory) and one cluster barrier (the group a cluster).
// Prints, for each, the read's bandwidth, a hand-over's mean time (from the
// block's phase end to holding every value), and how many clusters of 8 and
// 16 the GPU keeps resident with this kernel's shared memory.
//   nvcc -O3 -arch=sm_90 -std=c++17 -o cluster_handover cluster_handover.cu
#include <cooperative_groups.h>

#include <vector>

#include "persistent_common.cuh"

namespace cg = cooperative_groups;
using u64 = unsigned long long;

constexpr int kWarps = 16, kThreads = kWarps * 32, kSlots = 3, kCopy = 4096;
constexpr int kRingBytes = kWarps * kSlots * kCopy;  // a block's rings: its dynamic shared memory
constexpr int kValues = 24;    // a block's q/k/v rows
constexpr int kMaxGroup = 16;  // blocks a group (a kv head's splits)
enum handover_mode : int { kNone = 0, kL2 = 1, kCluster = 2 };

__device__ __forceinline__ void put_tagged(u64* at, float v, unsigned tag) {
  const u64 packed = (static_cast<u64>(tag) << 32) | __float_as_uint(v);
  asm volatile("st.relaxed.gpu.global.b64 [%0], %1;" ::"l"(at), "l"(packed) : "memory");
}
__device__ __forceinline__ float take_tagged(const u64* at, unsigned tag) {
  u64 v;
  do asm volatile("ld.relaxed.gpu.global.b64 %0, [%1];" : "=l"(v) : "l"(at) : "memory");
  while (static_cast<unsigned>(v >> 32) != tag);
  return __uint_as_float(static_cast<unsigned>(v));
}

// board (kL2): [phase parity][group][rank][kValues] tagged values; a writer
// two phases ahead has taken the phase between from every member, so every
// member is done with this parity's values. stats: [0] hand-over ns summed
// over blocks and phases, [1] hand-overs.
template <int M>
__global__ void __launch_bounds__(kThreads, 1) handover(const unsigned char* src, int phases, int items, int group,
                                                       u64* board, unsigned launch, float* out, u64* stats) {
  extern __shared__ __align__(128) unsigned char ring[];
  __shared__ u64 full[kWarps * kSlots];
  __shared__ float exchange[2][kMaxGroup * kValues];  // kCluster: the group's values, by phase parity
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, t = threadIdx.x;
  if (t == 0) {
    for (int i = 0; i < kWarps * kSlots; ++i) mbar_init(&full[i], 1);
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  __syncthreads();
  int rank = 0, members = 1, first = 0;
  if constexpr (M == kCluster) {
    cg::cluster_group cluster = cg::this_cluster();
    rank = static_cast<int>(cluster.block_rank());
    members = static_cast<int>(cluster.num_blocks());
    cluster.sync();  // every block's shared memory is live before a peer stores into it
  } else {
    first = static_cast<int>(blockIdx.x) / group * group;
    rank = static_cast<int>(blockIdx.x) - first;
    members = min(group, static_cast<int>(gridDim.x) - first);
  }
  const long warps = static_cast<long>(gridDim.x) * kWarps, me = static_cast<long>(blockIdx.x) * kWarps + warp;
  const long copies = static_cast<long>(phases) * items;
  unsigned char* mine = ring + static_cast<size_t>(warp) * kSlots * kCopy;
  const auto issue = [&](int slot, long k) {
    if (lane != 0) return;
    mbar_expect_tx(&full[warp * kSlots + slot], kCopy);
    bulk_load(mine + static_cast<size_t>(slot) * kCopy, src + (k * warps + me) * kCopy, kCopy, &full[warp * kSlots + slot]);
  };
  for (int s = 0; s < kSlots && s < copies; ++s) issue(s, s);
  const uint4 ones = make_uint4(0x3f803f80u, 0x3f803f80u, 0x3f803f80u, 0x3f803f80u);
  float acc = 0.f, got = 0.f;
  u64 handover_ns = 0;
  long k = 0;
  for (int p = 0; p < phases; ++p) {
    for (int j = 0; j < items; ++j, ++k) {  // the phase's products: a dot of each copy with ones
      const int slot = static_cast<int>(k % kSlots);
      mbar_wait(&full[warp * kSlots + slot], static_cast<unsigned>((k / kSlots) & 1));
      const uint4* v = reinterpret_cast<const uint4*>(mine + static_cast<size_t>(slot) * kCopy);
      uint4 w[kCopy / 16 / 32];
#pragma unroll
      for (int u = 0; u < kCopy / 16 / 32; ++u) w[u] = v[lane + 32 * u];
      __syncwarp();
      if (k + kSlots < copies) issue(slot, k + kSlots);
      float lo = 0.f, hi = 0.f;
#pragma unroll
      for (int u = 0; u < kCopy / 16 / 32; ++u) fma8_two(w[u], ones, lo, hi);
      acc += lo + hi;
    }
    __syncthreads();  // the phase's products done: its values are ready
    if constexpr (M == kNone) continue;
    const u64 t0 = global_ns();
    if constexpr (M == kL2) {
      const float value = static_cast<float>(rank * kValues + t) + 0.5f;
      const unsigned tag = (launch << 16) | static_cast<unsigned>(p);
      u64* here = board + static_cast<size_t>(p & 1) * gridDim.x * kValues + static_cast<size_t>(first) * kValues;
      if (t < kValues) put_tagged(here + rank * kValues + t, value, tag);
      if (t < members * kValues) got += take_tagged(here + t, tag);
      __syncthreads();
    } else {
      cg::cluster_group cluster = cg::this_cluster();
      if (t < members * kValues) {  // value t % kValues of this block, to member t / kValues
        float* there = cluster.map_shared_rank(&exchange[p & 1][0], t / kValues);
        there[rank * kValues + t % kValues] = static_cast<float>(rank * kValues + t % kValues) + 0.5f;
      }
      cluster.sync();
      if (t < members * kValues) got += exchange[p & 1][t];
    }
    if (t == 0) handover_ns += global_ns() - t0;
  }
  if constexpr (M == kCluster) cg::this_cluster().sync();  // no block leaves while a peer may still store into it
  acc = warp_sum(acc);
  if (lane == 0) out[me] = acc + got;
  if (t == 0 && M != kNone) {
    atomicAdd(&stats[0], handover_ns);
    atomicAdd(&stats[1], static_cast<u64>(phases));
  }
}

// Lets `kernel` take the rings' shared memory, and clusters of `cluster`
// blocks where that is over the portable 8.
template <class Kernel>
cudaError_t allow_rings(Kernel kernel, int cluster) {
  cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kRingBytes);
  if (e == cudaSuccess && cluster > 8) e = cudaFuncSetAttribute(kernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 1);
  return e;
}

// A launch of `grid` blocks in clusters of `size`, with the rings' shared
// memory.
struct cluster_launch {
  cudaLaunchConfig_t config = {};
  cudaLaunchAttribute attribute[1];
  cluster_launch(int grid, int size) {
    config.gridDim = dim3(grid);
    config.blockDim = dim3(kThreads);
    config.dynamicSmemBytes = kRingBytes;
    attribute[0].id = cudaLaunchAttributeClusterDimension;
    attribute[0].val.clusterDim.x = size;
    attribute[0].val.clusterDim.y = 1;
    attribute[0].val.clusterDim.z = 1;
    config.attrs = attribute;
    config.numAttrs = 1;
  }
  cluster_launch(const cluster_launch&) = delete;  // config.attrs points into this object
  cluster_launch& operator=(const cluster_launch&) = delete;
};

struct result {
  double gb_per_s = 0, handover_us = 0;
};

template <int M>
result run(const unsigned char* src, size_t bytes, int grid, int group, int items, u64* board, float* out, u64* stats) {
  auto kernel = handover<M>;
  CK(allow_rings(kernel, M == kCluster ? group : 1));
  const long per_warp = static_cast<long>(bytes / kCopy / (static_cast<size_t>(grid) * kWarps));
  const int phases = static_cast<int>(per_warp / items);
  const double read = static_cast<double>(phases) * items * kCopy * grid * kWarps;
  u64 h[2] = {0, 0};
  static unsigned launch = 0;
  unsigned this_launch = 0;
  int phases_arg = phases;
  void* args[] = {const_cast<unsigned char**>(&src), &phases_arg, &items, &group, &board, &this_launch, &out, &stats};
  const float best = best_of(
      4,
      [&] {
        CK(cudaMemset(stats, 0, 2 * sizeof(u64)));
        this_launch = ++launch;
      },
      [&] {
        if constexpr (M == kCluster) {
          cluster_launch config(grid, group);
          CK(cudaLaunchKernelExC(&config.config, reinterpret_cast<const void*>(kernel), args));
        } else {  // cooperative: the l2 form's groups spin on each other
          CK(cudaLaunchCooperativeKernel(reinterpret_cast<const void*>(kernel), dim3(grid), dim3(kThreads), args, kRingBytes));
        }
      },
      [&] { CK(cudaMemcpy(h, stats, sizeof(h), cudaMemcpyDeviceToHost)); });
  result r;
  r.gb_per_s = read / (best * 1e-3) / 1e9;
  r.handover_us = h[1] ? static_cast<double>(h[0]) / static_cast<double>(h[1]) / 1e3 : 0.0;
  return r;
}

int max_clusters(int size) {
  auto kernel = handover<kCluster>;
  if (allow_rings(kernel, size) != cudaSuccess) {
    std::printf("clusters of %d: non-portable sizes refused\n", size);
    cudaGetLastError();
    return 0;
  }
  cluster_launch config(size * 8, size);
  int clusters = 0;
  const cudaError_t e = cudaOccupancyMaxActiveClusters(&clusters, reinterpret_cast<const void*>(kernel), &config.config);
  if (e != cudaSuccess) {  // a size this GPU does not take: say so, and leave that size out
    std::printf("clusters of %d: %s\n", size, cudaGetErrorString(e));
    cudaGetLastError();
    return 0;
  }
  return clusters;
}

int main() {
  int sms = 0;
  CK(cudaSetDevice(0));
  CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  const size_t bytes = size_t(2) << 30;
  unsigned char* src = nullptr;
  CK(cudaMalloc(&src, bytes));
  CK(cudaMemset(src, 0x3f, bytes));
  float* out = nullptr;
  u64 *stats = nullptr, *board = nullptr;
  CK(cudaMalloc(&out, sizeof(float) * sms * kWarps));
  CK(cudaMalloc(&stats, 2 * sizeof(u64)));
  CK(cudaMalloc(&board, sizeof(u64) * 2 * sms * kValues));
  CK(cudaMemset(board, 0, sizeof(u64) * 2 * sms * kValues));
  const int clusters8 = max_clusters(8), clusters16 = max_clusters(16);
  std::printf("SMs %d; resident clusters with this kernel's %d B of shared memory: %d of 8 blocks (%d blocks), %d of 16 (%d blocks)\n",
              sms, kRingBytes, clusters8, clusters8 * 8, clusters16, clusters16 * 16);
  std::printf("%-8s %5s %5s %5s  %9s  %s\n", "form", "grid", "group", "items", "GB/s", "hand-over us (phase end to every value held)");
  const auto line = [](const char* form, int grid, int group, int items, result r) {
    std::printf("%-8s %5d %5d %5d  %9.1f  %.3f\n", form, grid, group, items, r.gb_per_s, r.handover_us);
    std::fflush(stdout);
  };
  for (int items : {3, 1}) {  // q/k/v's three copies a warp a phase (LLaMA-1B), o's one
    line("none", sms, 16, items, run<kNone>(src, bytes, sms, 16, items, board, out, stats));
    line("l2", sms, 16, items, run<kL2>(src, bytes, sms, 16, items, board, out, stats));
    for (int group : {16, 8}) {
      const int resident = group == 16 ? clusters16 : clusters8, grid = sms / group * group;
      if (resident * group < grid) {
        std::printf("cluster %d: %d of the %d clusters resident at once; left out\n", group, resident, grid / group);
        continue;
      }
      line("none", grid, group, items, run<kNone>(src, bytes, grid, group, items, board, out, stats));
      line("l2", grid, group, items, run<kL2>(src, bytes, grid, group, items, board, out, stats));
      line("cluster", grid, group, items, run<kCluster>(src, bytes, grid, group, items, board, out, stats));
    }
  }
  return 0;
}
