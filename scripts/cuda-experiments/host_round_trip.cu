// Experiment: host cost of CUDA calls with and without a thread spinning on cudaEventQuery.
#include <cuda.h>
#include <cuda_runtime.h>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <thread>
#include <vector>
#include <algorithm>
#define CK(x) do { cudaError_t e_ = (x); if (e_ != cudaSuccess) { std::printf("%s:%d %s\n", __FILE__, __LINE__, cudaGetErrorString(e_)); std::exit(1);} } while (0)
#define CKD(x) do { CUresult e_ = (x); if (e_ != CUDA_SUCCESS) { std::printf("%s:%d CU %d\n", __FILE__, __LINE__, (int)e_); std::exit(1);} } while (0)
static double now_us() { return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now().time_since_epoch()).count(); }
__global__ void add1(float* x, int n) { int i = blockIdx.x * blockDim.x + threadIdx.x; if (i < n) x[i] += 1.f; }
__global__ void spin(long long ns) { long long t0 = clock64(); while (clock64() - t0 < ns) {} }
static double med(std::vector<double> v) { std::sort(v.begin(), v.end()); return v[v.size() / 2]; }

struct ctx_t {
  cudaStream_t s1, s2, s3;
  float *d, *h;
  unsigned int* flag;  // host-mapped
  CUdeviceptr flag_dev;
};

// one round trip: h2d, kernel, d2h, completion detection. mode 0: cudaEventQuery spin; 1: flag spin via cuStreamWriteValue32
double round_trip(ctx_t& c, int mode, cudaEvent_t* evs, bool three_streams, unsigned int gen) {
  double t0 = now_us();
  cudaStream_t a = c.s1, b = three_streams ? c.s2 : c.s1, d = three_streams ? c.s3 : c.s1;
  CK(cudaMemcpyAsync(c.d, c.h, 1024, cudaMemcpyHostToDevice, a));
  if (three_streams) { CK(cudaEventRecord(evs[0], a)); CK(cudaStreamWaitEvent(b, evs[0], 0)); }
  add1<<<1, 256, 0, b>>>(c.d, 256);
  CK(cudaGetLastError());
  if (three_streams) { CK(cudaEventRecord(evs[1], b)); CK(cudaStreamWaitEvent(d, evs[1], 0)); }
  CK(cudaMemcpyAsync(c.h + 512, c.d, 1024, cudaMemcpyDeviceToHost, d));
  if (mode == 0) {
    CK(cudaEventRecord(evs[2], d));
    while (cudaEventQuery(evs[2]) == cudaErrorNotReady) {}
  } else {
    CKD(cuStreamWriteValue32(d, c.flag_dev, gen, CU_STREAM_WRITE_VALUE_DEFAULT));
    while (__atomic_load_n(c.flag, __ATOMIC_ACQUIRE) != gen) {}
  }
  return now_us() - t0;
}

int main() {
  CK(cudaSetDevice(0));
  CK(cudaFree(nullptr));
  ctx_t c;
  CK(cudaStreamCreateWithFlags(&c.s1, cudaStreamNonBlocking));
  CK(cudaStreamCreateWithFlags(&c.s2, cudaStreamNonBlocking));
  CK(cudaStreamCreateWithFlags(&c.s3, cudaStreamNonBlocking));
  cudaStream_t busy; CK(cudaStreamCreateWithFlags(&busy, cudaStreamNonBlocking));
  CK(cudaMalloc(&c.d, 1 << 20));
  CK(cudaHostAlloc(&c.h, 1 << 20, cudaHostAllocDefault));
  for (int i = 0; i < 1024; ++i) c.h[i] = 1.f * i;
  CK(cudaHostAlloc(&c.flag, 64, cudaHostAllocMapped));
  *c.flag = 0;
  void* fd; CK(cudaHostGetDevicePointer(&fd, c.flag, 0)); c.flag_dev = (CUdeviceptr)fd;
  cudaEvent_t evs[3];
  for (auto& e : evs) CK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  unsigned int gen = 0;
  // warm-up
  for (int i = 0; i < 200; ++i) { round_trip(c, 0, evs, true, 0); round_trip(c, 1, evs, true, ++gen); }

  // a poller thread spinning cudaEventQuery on an event that is not done
  std::atomic<bool> poll_on{false}, stop{false};
  cudaEvent_t never; CK(cudaEventCreateWithFlags(&never, cudaEventDisableTiming));
  std::thread poller([&] {
    CK(cudaSetDevice(0));
    while (!stop.load()) {
      if (poll_on.load()) (void)cudaEventQuery(never);
      else std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
  });
  for (int with_poller = 0; with_poller < 2; ++with_poller) {
    if (with_poller) {
      spin<<<1, 1, 0, busy>>>(4000000000LL);  // ~2 s: `never` stays pending
      CK(cudaEventRecord(never, busy));
      poll_on = true;
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    for (int three = 0; three < 2; ++three)
      for (int mode = 0; mode < 2; ++mode) {
        std::vector<double> v;
        for (int i = 0; i < 300; ++i) v.push_back(round_trip(c, mode, evs, three, ++gen));
        std::printf("round_trip poller=%d streams=%d detect=%s: %.1f us (median)\n", with_poller, three ? 3 : 1,
                    mode ? "flag" : "eventquery", med(v));
      }
    // per-call costs
    std::vector<double> rec, cpy, ker, wt;
    for (int i = 0; i < 300; ++i) {
      double t = now_us(); CK(cudaEventRecord(evs[0], c.s1)); rec.push_back(now_us() - t);
      t = now_us(); CK(cudaMemcpyAsync(c.d, c.h, 1024, cudaMemcpyHostToDevice, c.s1)); cpy.push_back(now_us() - t);
      t = now_us(); add1<<<1, 256, 0, c.s2>>>(c.d, 256); ker.push_back(now_us() - t);
      t = now_us(); CK(cudaStreamWaitEvent(c.s2, evs[0], 0)); wt.push_back(now_us() - t);
      CK(cudaStreamSynchronize(c.s2));
    }
    std::printf("calls poller=%d: eventRecord %.2f memcpyAsync %.2f launch %.2f streamWaitEvent %.2f us\n", with_poller,
                med(rec), med(cpy), med(ker), med(wt));
    if (with_poller) poll_on = false;
  }
  stop = true;
  poller.join();
  CK(cudaDeviceSynchronize());
  return 0;
}
