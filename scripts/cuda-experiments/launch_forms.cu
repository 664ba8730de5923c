// How much host time each way of launching one tiny kernel costs on this
// machine, and its round trip to a host that spins on an event
// (docs/BENCHMARKS.md, session 34). Standalone (README.md here):
//   nvcc -O2 -arch=sm_90 -std=c++17 -o launch_forms launch_forms.cu && ./launch_forms
// Medians of 4000 launches each, two rounds. The kernel adds two 256-float
// vectors of mapped pinned host memory, as a tiny job whose operands stay in
// its arena's host window does. The last two rows launch as a runtime's
// actor does: after other work on its thread, or from a different thread
// each time.
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <thread>
#include <vector>

#define CK(x)                                                                   \
  do {                                                                          \
    cudaError_t e_ = (x);                                                       \
    if (e_ != cudaSuccess) {                                                    \
      std::fprintf(stderr, "%s: %s (line %d)\n", #x, cudaGetErrorString(e_), __LINE__); \
      std::exit(1);                                                             \
    }                                                                           \
  } while (0)

__global__ void add(const float* a, const float* b, float* c, int n) {
  asm volatile("griddepcontrol.wait;" ::: "memory");  // a no-op without a programmatic predecessor
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) c[i] = a[i] + b[i];
}

namespace {
double now_ns() {
  return std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now().time_since_epoch()).count();
}
double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}
cudaError_t launch_ex(cudaStream_t s, bool pdl, const float* a, const float* b, float* c, int n) {
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(1);
  cfg.blockDim = dim3(256);
  cfg.stream = s;
  cudaLaunchAttribute at[1];
  at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  at[0].val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = at;
  cfg.numAttrs = pdl ? 1 : 0;
  return cudaLaunchKernelEx(&cfg, add, a, b, c, n);
}
}  // namespace

int main() {
  constexpr int n = 256, jobs = 4000, windows = 4;
  float* host[windows];
  float* dev[windows];
  for (int k = 0; k < windows; ++k) {
    CK(cudaHostAlloc(&host[k], 3 * n * sizeof(float), cudaHostAllocMapped));
    CK(cudaHostGetDevicePointer(reinterpret_cast<void**>(&dev[k]), host[k], 0));
  }
  cudaStream_t s;
  CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  cudaEvent_t ev, node_ev;
  CK(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming));
  CK(cudaEventCreateWithFlags(&node_ev, cudaEventDisableTiming));
  // One graph per window (as one per arena), plain and with the PDL attribute;
  // and window 0's graph with an event record node after the kernel.
  cudaGraphExec_t plain[windows], pdl[windows], with_event;
  const auto capture = [&](cudaGraphExec_t* x, int w, bool p, bool record) {
    cudaGraph_t g;
    CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
    CK(launch_ex(s, p, dev[w], dev[w] + n, dev[w] + 2 * n, n));
    if (record) CK(cudaEventRecordWithFlags(node_ev, s, cudaEventRecordExternal));
    CK(cudaStreamEndCapture(s, &g));
    CK(cudaGraphInstantiateWithFlags(x, g, 0));
    CK(cudaGraphDestroy(g));
  };
  for (int w = 0; w < windows; ++w) {
    capture(&plain[w], w, false, false);
    capture(&pdl[w], w, true, false);
  }
  capture(&with_event, 0, false, true);
  // One graph whose kernel's pointers are set per window before each launch.
  cudaGraph_t pg;
  CK(cudaGraphCreate(&pg, 0));
  const float *pa = dev[0], *pb = dev[0] + n;
  float* pc = dev[0] + 2 * n;
  int pn = n;
  void* args[4] = {&pa, &pb, &pc, &pn};
  cudaKernelNodeParams kp = {};
  kp.func = reinterpret_cast<void*>(add);
  kp.gridDim = dim3(1);
  kp.blockDim = dim3(256);
  kp.kernelParams = args;
  cudaGraphNode_t node;
  CK(cudaGraphAddKernelNode(&node, pg, nullptr, 0, &kp));
  cudaGraphExec_t params;
  CK(cudaGraphInstantiateWithFlags(&params, pg, 0));
  CK(cudaStreamSynchronize(s));

  // Times `launch(w)` on window w (i % windows, or 0 with `one_window`) and,
  // unless `own_event`, an event record after it, then spins on the event
  // (ev, or node_ev for the graph that records it); checks the kernel's sum
  // was written by the time the event said done.
  // With walk_before, 4 MiB of other memory is walked (untimed) before each launch.
  std::vector<unsigned char> other(std::size_t{4} << 20);
  bool walk_before = false;
  const auto run = [&](const char* name, auto&& launch, bool one_window = false, bool own_event = false) {
    std::vector<double> host_us, record_us, trip_us;
    int early = 0;
    for (int i = 0; i < jobs; ++i) {
      const int w = one_window ? 0 : i % windows;
      float* h = host[w];
      h[0] = static_cast<float>(i), h[n] = 1.f, h[2 * n] = -1.f;
      if (walk_before)
        for (std::size_t k = 0; k < other.size(); k += 64) other[k] = static_cast<unsigned char>(other[k] + 1);
      const double t0 = now_ns();
      CK(launch(w));
      const double t1 = now_ns();
      if (!own_event) CK(cudaEventRecord(ev, s));
      const double t2 = now_ns();
      while (cudaEventQuery(own_event ? node_ev : ev) == cudaErrorNotReady) {
      }
      const double t3 = now_ns();
      if (*static_cast<volatile float*>(&h[2 * n]) != static_cast<float>(i) + 1.f) ++early;
      host_us.push_back((t1 - t0) / 1e3);
      record_us.push_back((t2 - t1) / 1e3);
      trip_us.push_back((t3 - t0) / 1e3);
    }
    std::printf("  %-46s launch %5.2f us, event record %5.2f us, round trip %5.2f us%s\n", name, median(host_us),
                own_event ? 0.0 : median(record_us), median(trip_us),
                early ? " (EVENT SEEN BEFORE THE KERNEL'S WRITE)" : "");
  };
  // As run(), each job's launch and round trip made by the next of 4
  // threads in turn (the others spin, waiting for their turn).
  const auto run_from_threads = [&](const char* name, auto&& launch) {
    constexpr int threads = 4;
    std::vector<double> host_us(jobs), trip_us(jobs);
    std::atomic<int> turn{0};
    std::vector<std::thread> pool;
    for (int t = 0; t < threads; ++t)
      pool.emplace_back([&, t] {
        CK(cudaSetDevice(0));
        for (int i = t; i < jobs; i += threads) {
          while (turn.load(std::memory_order_acquire) != i) {
          }
          const int w = i % windows;
          host[w][0] = static_cast<float>(i), host[w][n] = 1.f, host[w][2 * n] = -1.f;
          const double t0 = now_ns();
          CK(launch(w));
          const double t1 = now_ns();
          CK(cudaEventRecord(ev, s));
          while (cudaEventQuery(ev) == cudaErrorNotReady) {
          }
          const double t2 = now_ns();
          host_us[static_cast<std::size_t>(i)] = (t1 - t0) / 1e3;
          trip_us[static_cast<std::size_t>(i)] = (t2 - t0) / 1e3;
          turn.store(i + 1, std::memory_order_release);
        }
      });
    for (auto& t : pool) t.join();
    std::printf("  %-46s launch %5.2f us, round trip %5.2f us\n", name, median(host_us), median(trip_us));
  };
  for (int round = 1; round <= 2; ++round) {
    std::printf("round %d\n", round);
    run("kernel <<<>>>", [&](int w) {
      add<<<1, 256, 0, s>>>(dev[w], dev[w] + n, dev[w] + 2 * n, n);
      return cudaGetLastError();
    });
    run("kernel, cudaLaunchKernelEx", [&](int w) { return launch_ex(s, false, dev[w], dev[w] + n, dev[w] + 2 * n, n); });
    run("kernel, cudaLaunchKernelEx with PDL", [&](int w) { return launch_ex(s, true, dev[w], dev[w] + n, dev[w] + 2 * n, n); });
    run("graph of the kernel, one per window in turn", [&](int w) { return cudaGraphLaunch(plain[w], s); });
    run("graph of the PDL kernel, one per window", [&](int w) { return cudaGraphLaunch(pdl[w], s); });
    run("one graph, kernel params set per window", [&](int w) {
      pa = dev[w], pb = dev[w] + n, pc = dev[w] + 2 * n;
      const cudaError_t r = cudaGraphExecKernelNodeSetParams(params, node, &kp);
      return r != cudaSuccess ? r : cudaGraphLaunch(params, s);
    });
    run("graph recording its own end event (window 0)", [&](int) { return cudaGraphLaunch(with_event, s); },
        /*one_window=*/true, /*own_event=*/true);
    // The graph launch as a runtime makes it: after other work on the thread
    // (here 4 MiB of memory walked, evicting the core's caches), or from
    // whichever of several threads runs the stream's actor this time.
    walk_before = true;
    run("graph per window, after 4 MiB of other work", [&](int w) { return cudaGraphLaunch(plain[w], s); });
    walk_before = false;
    run_from_threads("graph per window, from 4 threads in turn", [&](int w) { return cudaGraphLaunch(plain[w], s); });
  }
  return 0;
}
