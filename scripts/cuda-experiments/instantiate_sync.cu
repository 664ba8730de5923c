// Does cudaGraphInstantiate (or cudaGraphExecDestroy) wait for the GPU?
// A one-block kernel spins on stream `spin` until the host releases it 2 s
// later; meanwhile another stream's captured graph is instantiated, with and
// without a graph memory node (captured cudaMallocAsync) and a programmatic
// (PDL) edge. A call that takes ~2 s waited for the spinning kernel: with an
// in-stream all-reduce part spinning there, that is a deadlock
// (docs/BENCHMARKS.md, session 14). Build: nvcc -arch=sm_90 -O2 -o instantiate_sync instantiate_sync.cu
#include <cuda_runtime.h>

#include <chrono>
#include <cstdio>
#include <thread>

#define CK(x)                                                                      \
  do {                                                                             \
    cudaError_t e_ = (x);                                                          \
    if (e_ != cudaSuccess) {                                                       \
      std::printf("%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
      return 1;                                                                    \
    }                                                                              \
  } while (0)

__global__ void spin(volatile unsigned* flag) {
  while (*flag == 0) {
  }
}
__global__ void work(float* p) {
  asm volatile("griddepcontrol.wait;" ::: "memory");
  p[threadIdx.x] += 1.0f;
}

double ms_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

int main() {
  unsigned* flag = nullptr;
  CK(cudaHostAlloc(&flag, sizeof(unsigned), cudaHostAllocMapped));
  float* buf = nullptr;
  CK(cudaMalloc(&buf, 1024 * sizeof(float)));
  cudaStream_t s_spin, s_cap;
  CK(cudaStreamCreateWithFlags(&s_spin, cudaStreamNonBlocking));
  CK(cudaStreamCreateWithFlags(&s_cap, cudaStreamNonBlocking));
  work<<<1, 32, 0, s_cap>>>(buf);  // loaded before anything spins
  spin<<<1, 1, 0, s_spin>>>(flag);
  *flag = 1;
  CK(cudaDeviceSynchronize());
  for (int variant = 0; variant < 4; ++variant) {
    const char* name[] = {"plain kernels", "with a memory node", "with a PDL edge", "exec destroy (plain)"};
    // Capture first (capture enqueues nothing).
    cudaGraph_t g = nullptr;
    CK(cudaStreamBeginCapture(s_cap, cudaStreamCaptureModeThreadLocal));
    void* scratch = nullptr;
    if (variant == 1) CK(cudaMallocAsync(&scratch, 4096, s_cap));
    for (int k = 0; k < 8; ++k) {
      cudaLaunchAttribute a[1];
      a[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
      a[0].val.programmaticStreamSerializationAllowed = 1;
      cudaLaunchConfig_t c{};
      c.gridDim = 1;
      c.blockDim = 32;
      c.stream = s_cap;
      c.attrs = a;
      c.numAttrs = variant == 2 ? 1 : 0;
      CK(cudaLaunchKernelEx(&c, work, scratch ? static_cast<float*>(scratch) : buf));
    }
    if (variant == 1) CK(cudaFreeAsync(scratch, s_cap));
    CK(cudaStreamEndCapture(s_cap, &g));
    cudaGraphExec_t x = nullptr;
    if (variant == 3) CK(cudaGraphInstantiateWithFlags(&x, g, 0));
    *flag = 0;
    spin<<<1, 1, 0, s_spin>>>(flag);
    std::thread release([&] {
      std::this_thread::sleep_for(std::chrono::seconds(2));
      *reinterpret_cast<volatile unsigned*>(flag) = 1;
    });
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    const auto t0 = std::chrono::steady_clock::now();
    if (variant == 3)
      CK(cudaGraphExecDestroy(x));
    else
      CK(cudaGraphInstantiateWithFlags(&x, g, 0));
    const double ms = ms_since(t0);
    const auto t1 = std::chrono::steady_clock::now();
    work<<<1, 32, 0, s_cap>>>(buf);
    const double launch_ms = ms_since(t1);
    release.join();
    CK(cudaDeviceSynchronize());
    std::printf("%-22s: %s took %8.2f ms while a kernel spun (a launch after it: %.3f ms)\n", name[variant],
                variant == 3 ? "cudaGraphExecDestroy" : "cudaGraphInstantiate", ms, launch_ms);
    if (variant != 3) CK(cudaGraphExecDestroy(x));
    CK(cudaGraphDestroy(g));
  }
  return 0;
}
