// Does a CUDA graph's launch cost the host more the more kernels it holds,
// and do programmatic (PDL) edges make it so? Session 75's lanes trace
// (docs/BENCHMARKS.md) put the chains of actorgraph-lanes-bench, segments of
// 16 replayed kernels on 8 lanes, starting 27-69 us apart on an H200, where
// session 34 measured 1.2-2.1 us for a graph of one kernel. Standalone
// (README.md here):
//   nvcc -O2 -arch=sm_90 -std=c++17 -o graph_launch_size graph_launch_size.cu && ./graph_launch_size
// Prints, for straight-line graphs of N tiny kernels captured from a stream
// (plain launches, and launches with programmatic stream serialization, as
// the runtime captures its kernels), the median host time of cudaGraphLaunch
// and the graph's device time; then the lanes case: 8 graphs of 16 kernels on
// 8 streams, launched from one thread one after another, or from 8 threads
// released together, with the spread of their first kernels' start times
// (globaltimer) on the GPU.
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <thread>
#include <vector>

#include "persistent_common.cuh"  // CK, the CUDA call check; global_ns

namespace {

// One small step of a chain (a 256-float update, as a [16, 256] op's block
// would be): waits for its programmatic predecessor, releases its successor
// after. The first kernel of a graph stamps its start.
__global__ void step(float* buf, unsigned long long* start) {
  asm volatile("griddepcontrol.wait;" ::: "memory");
  if (start && threadIdx.x == 0) *start = global_ns();
  buf[threadIdx.x] = buf[threadIdx.x] * 0.999f + 0.001f;
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
}

double now_us() {
  return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now().time_since_epoch()).count();
}
double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

void launch_step(cudaStream_t s, bool pdl, float* buf, unsigned long long* start) {
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(1);
  cfg.blockDim = dim3(256);
  cfg.stream = s;
  cudaLaunchAttribute at[1];
  at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  at[0].val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = at;
  cfg.numAttrs = pdl ? 1 : 0;
  CK(cudaLaunchKernelEx(&cfg, step, buf, start));
}

// A straight-line graph of `n` steps captured from `s`, uploaded.
cudaGraphExec_t capture_chain(cudaStream_t s, int n, bool pdl, float* buf, unsigned long long* start) {
  cudaGraph_t g;
  CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
  for (int k = 0; k < n; ++k) launch_step(s, pdl, buf, k == 0 ? start : nullptr);
  CK(cudaStreamEndCapture(s, &g));
  cudaGraphExec_t e;
  CK(cudaGraphInstantiate(&e, g, 0));
  CK(cudaGraphDestroy(g));
  CK(cudaGraphUpload(e, s));
  CK(cudaStreamSynchronize(s));
  return e;
}

constexpr int kLanes = 8, kLaneKernels = 16, kRounds = 2;

// The lanes case: each round launches the 8 graphs (one thread in turn, or
// 8 threads released together), then waits for all; host time of the
// launches and the GPU spread of the chains' starts, medians.
void lanes_case(bool pdl, bool threads, float* buf, unsigned long long* starts, int iterations) {
  std::vector<cudaStream_t> streams(kLanes);
  std::vector<cudaGraphExec_t> graphs(kLanes);
  for (int l = 0; l < kLanes; ++l) {
    CK(cudaStreamCreateWithFlags(&streams[l], cudaStreamNonBlocking));
    graphs[l] = capture_chain(streams[l], kLaneKernels, pdl, buf + 256 * l, starts + l);
  }
  std::vector<double> host, spread;
  std::vector<unsigned long long> at(kLanes);
  std::atomic<int> go{0}, done{0};
  std::atomic<bool> quit{false};
  std::vector<std::thread> pool;
  std::vector<double> thread_end(kLanes);
  if (threads)
    for (int l = 0; l < kLanes; ++l)
      pool.emplace_back([&, l] {
        int seen = 0;
        for (;;) {
          int g;
          while ((g = go.load(std::memory_order_acquire)) == seen && !quit.load(std::memory_order_relaxed)) {
          }
          if (quit.load(std::memory_order_relaxed)) return;
          seen = g;
          CK(cudaGraphLaunch(graphs[l], streams[l]));
          thread_end[l] = now_us();
          done.fetch_add(1, std::memory_order_acq_rel);
        }
      });
  for (int it = 0; it < iterations; ++it) {
    const double t0 = now_us();
    double t1 = t0;
    if (threads) {
      done.store(0);
      go.fetch_add(1, std::memory_order_acq_rel);
      while (done.load(std::memory_order_acquire) < kLanes) {
      }
      t1 = *std::max_element(thread_end.begin(), thread_end.end());
    } else {
      for (int l = 0; l < kLanes; ++l) CK(cudaGraphLaunch(graphs[l], streams[l]));
      t1 = now_us();
    }
    for (int l = 0; l < kLanes; ++l) CK(cudaStreamSynchronize(streams[l]));
    CK(cudaMemcpy(at.data(), starts, sizeof(unsigned long long) * kLanes, cudaMemcpyDeviceToHost));
    if (it >= iterations / 10) {  // the first tenth warms up
      host.push_back(t1 - t0);
      spread.push_back(static_cast<double>(*std::max_element(at.begin(), at.end()) -
                                           *std::min_element(at.begin(), at.end())) / 1e3);
    }
  }
  quit.store(true);
  for (auto& t : pool) t.join();
  std::printf("%-8s %-22s %14.2f %22.2f\n", pdl ? "pdl" : "plain", threads ? "8 threads together" : "one thread in turn",
              median(host), median(spread));
  for (int l = 0; l < kLanes; ++l) {
    CK(cudaGraphExecDestroy(graphs[l]));
    CK(cudaStreamDestroy(streams[l]));
  }
}

}  // namespace

int main() {
  float* buf;
  unsigned long long* starts;
  CK(cudaMalloc(&buf, sizeof(float) * 256 * kLanes));
  CK(cudaMemset(buf, 0, sizeof(float) * 256 * kLanes));
  CK(cudaMalloc(&starts, sizeof(unsigned long long) * kLanes));
  cudaStream_t s;
  CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  for (int round = 1; round <= kRounds; ++round) {
    std::printf("round %d: one straight-line graph of N kernels, medians of 1000 launches\n", round);
    std::printf("%-8s %6s %22s %18s\n", "edges", "N", "cudaGraphLaunch (us)", "device time (us)");
    for (bool pdl : {false, true})
      for (int n : {1, 2, 4, 8, 16, 32, 64, 128}) {
        cudaGraphExec_t g = capture_chain(s, n, pdl, buf, nullptr);
        std::vector<double> host, device;
        for (int it = 0; it < 1100; ++it) {
          CK(cudaEventRecord(e0, s));
          const double t0 = now_us();
          CK(cudaGraphLaunch(g, s));
          const double t1 = now_us();
          CK(cudaEventRecord(e1, s));
          CK(cudaStreamSynchronize(s));
          float ms = 0;
          CK(cudaEventElapsedTime(&ms, e0, e1));
          if (it >= 100) host.push_back(t1 - t0), device.push_back(ms * 1e3);
        }
        std::printf("%-8s %6d %22.2f %18.2f\n", pdl ? "pdl" : "plain", n, median(host), median(device));
        CK(cudaGraphExecDestroy(g));
      }
    std::printf("round %d: %d graphs of %d kernels on %d streams, medians of 450 rounds\n", round, kLanes, kLaneKernels,
                kLanes);
    std::printf("%-8s %-22s %14s %22s\n", "edges", "launched from", "host (us)", "start spread on GPU (us)");
    for (bool pdl : {false, true})
      for (bool threads : {false, true}) lanes_case(pdl, threads, buf, starts, 500);
  }
  CK(cudaEventDestroy(e0));
  CK(cudaEventDestroy(e1));
  CK(cudaStreamDestroy(s));
  CK(cudaFree(starts));
  CK(cudaFree(buf));
  return 0;
}
