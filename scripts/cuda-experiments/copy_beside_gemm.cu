// How fast do copies run beside a GEMM that fills the GPU? The copy-engine
// collectives (collective_algo::copy_engine) move a reduce-scatter's and an
// all-gather's pieces with cudaMemcpy(2D)Async while the chunks' GEMMs run;
// in the d-8192 layer's trace such a part took 3-5x its time alone. This
// measures each kind of copy alone and beside a stream of bf16 GEMMs of the
// layer's MLP shape (4096 x 8192 x 7168, cuBLAS), on the copying GPU or on
// the GPU it reads from:
//   - peer pull (the copy enqueued on the reading GPU), 1D and 2D (2 rows);
//   - peer push (enqueued on the GPU that owns the data);
//   - a local device-to-device copy, 1D and 2D (2 rows);
//   - with the copy stream at the highest priority, and a plain kernel copy;
//   - a local copy through cudaMemcpyBatchAsync / cudaMemcpy3DBatchAsync
//     with cudaMemcpyFlagPreferOverlapWithCompute (CUDA 12.8+: the driver
//     is asked to keep it off the SMs), and one enqueued on the other GPU.
// Build: nvcc -O3 -arch=sm_90 -std=c++17 -o copy_beside_gemm copy_beside_gemm.cu -lcublas
// Run on a machine with 2 GPUs with peer access (1 GPU: the local rows only).
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>

#define CK(x)                                                                              \
  do {                                                                                     \
    cudaError_t e_ = (x);                                                                  \
    if (e_ != cudaSuccess) {                                                               \
      std::fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
      std::exit(1);                                                                        \
    }                                                                                      \
  } while (0)

namespace {

__global__ void copy_kernel(uint4* dst, const uint4* src, size_t n) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
    dst[i] = src[i];
}

struct gemm_load {
  int dev;
  cublasHandle_t h;
  cudaStream_t s;
  __nv_bfloat16 *a, *b, *c;
  int m = 4096, k = 8192, n = 7168;
  void init(int d) {
    dev = d;
    CK(cudaSetDevice(d));
    CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    CK(cudaMalloc(&a, sizeof(__nv_bfloat16) * m * k));
    CK(cudaMalloc(&b, sizeof(__nv_bfloat16) * k * n));
    CK(cudaMalloc(&c, sizeof(__nv_bfloat16) * m * n));
    CK(cudaMemset(a, 0, sizeof(__nv_bfloat16) * m * k));
    CK(cudaMemset(b, 0, sizeof(__nv_bfloat16) * k * n));
    if (cublasCreate(&h) != CUBLAS_STATUS_SUCCESS) std::exit(2);
    cublasSetStream(h, s);
  }
  void enqueue(int count) {
    CK(cudaSetDevice(dev));
    const float one = 1, zero = 0;
    for (int i = 0; i < count; ++i)
      if (cublasGemmEx(h, CUBLAS_OP_N, CUBLAS_OP_N, n, m, k, &one, b, CUDA_R_16BF, n, a, CUDA_R_16BF, k, &zero, c,
                       CUDA_R_16BF, n, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT) != CUBLAS_STATUS_SUCCESS)
        std::exit(3);
  }
};

/// Microseconds `copy` takes on `s` (device `dev`), median of 5, with the
/// GEMM loads in `loads` running (6 GEMMs enqueued just before it: they last
/// longer than any copy).
double time_copy(int dev, cudaStream_t s, const std::function<void()>& copy, gemm_load* loads[], int nloads) {
  double best[5];
  for (int r = 0; r < 5; ++r) {
    for (int i = 0; i < nloads; ++i) loads[i]->enqueue(6);
    CK(cudaSetDevice(dev));
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    CK(cudaEventRecord(e0, s));
    copy();
    CK(cudaEventRecord(e1, s));
    CK(cudaEventSynchronize(e1));
    float ms = 0;
    CK(cudaEventElapsedTime(&ms, e0, e1));
    best[r] = 1000.0 * ms;
    for (int i = 0; i < nloads; ++i) {
      CK(cudaSetDevice(loads[i]->dev));
      CK(cudaStreamSynchronize(loads[i]->s));
    }
    CK(cudaEventDestroy(e0));
    CK(cudaEventDestroy(e1));
  }
  std::sort(best, best + 5);
  return best[2];
}

}  // namespace

int main() {
  int gpus = 0;
  CK(cudaGetDeviceCount(&gpus));
  const size_t bytes = size_t{16} << 20, half = bytes / 2;
  gemm_load g0, g1;
  g0.init(0);
  if (gpus > 1) g1.init(1);
  void *src0, *dst0, *src1 = nullptr;
  CK(cudaSetDevice(0));
  CK(cudaMalloc(&src0, bytes));
  CK(cudaMalloc(&dst0, bytes));
  cudaStream_t s0, s0hi, s1 = nullptr;
  int lo = 0, hi = 0;
  CK(cudaDeviceGetStreamPriorityRange(&lo, &hi));
  CK(cudaStreamCreateWithFlags(&s0, cudaStreamNonBlocking));
  CK(cudaStreamCreateWithPriority(&s0hi, cudaStreamNonBlocking, hi));
  if (gpus > 1) {
    CK(cudaDeviceEnablePeerAccess(1, 0));
    CK(cudaSetDevice(1));
    CK(cudaDeviceEnablePeerAccess(0, 0));
    CK(cudaMalloc(&src1, bytes));
    CK(cudaStreamCreateWithFlags(&s1, cudaStreamNonBlocking));
  }
  std::printf("%-44s %10s %14s %14s\n", "copy of 16 MiB", "alone us", "gemm@dst us", "gemm@src us");
  gemm_load* on0[] = {&g0};
  gemm_load* on1[] = {&g1};
  auto row = [&](const char* name, int dev, cudaStream_t s, const std::function<void()>& f, bool peer) {
    const double alone = time_copy(dev, s, f, nullptr, 0);
    const double at0 = time_copy(dev, s, f, on0, 1);
    const double at1 = peer ? time_copy(dev, s, f, on1, 1) : 0.0;
    std::printf("%-44s %10.1f %14.1f %14.1f\n", name, alone, at0, at1);
  };
  // Local copies on GPU 0 (the GEMM runs on GPU 0 too: "gemm@dst").
  row("local 1D (cudaMemcpyAsync D2D)", 0, s0,
      [&] { CK(cudaMemcpyAsync(dst0, src0, bytes, cudaMemcpyDeviceToDevice, s0)); }, false);
  row("local 2D, 2 rows (cudaMemcpy2DAsync)", 0, s0,
      [&] { CK(cudaMemcpy2DAsync(dst0, bytes / 2, src0, bytes / 2, half, 2, cudaMemcpyDeviceToDevice, s0)); }, false);
  row("local 1D, high-priority stream", 0, s0hi,
      [&] { CK(cudaMemcpyAsync(dst0, src0, bytes, cudaMemcpyDeviceToDevice, s0hi)); }, false);
  row("local 1D, batch API, prefer overlap", 0, s0,
      [&] {
        cudaMemcpyAttributes a{};
        a.srcAccessOrder = cudaMemcpySrcAccessOrderStream;
        a.flags = cudaMemcpyFlagPreferOverlapWithCompute;
        void* dsts[] = {dst0};
        const void* srcs[] = {src0};
        size_t sizes[] = {bytes}, idx[] = {0};
        CK(cudaMemcpyBatchAsync(dsts, srcs, sizes, 1, &a, idx, 1, s0));
      },
      false);
  row("local 2D, 2 rows, 3D batch API, prefer overlap", 0, s0,
      [&] {
        cudaMemcpy3DBatchOp op{};
        op.src.type = op.dst.type = cudaMemcpyOperandTypePointer;
        op.src.op.ptr.ptr = src0;
        op.dst.op.ptr.ptr = dst0;
        op.src.op.ptr.rowLength = op.dst.op.ptr.rowLength = bytes / 2;
        op.extent = make_cudaExtent(half, 2, 1);
        op.srcAccessOrder = cudaMemcpySrcAccessOrderStream;
        op.flags = cudaMemcpyFlagPreferOverlapWithCompute;
        CK(cudaMemcpy3DBatchAsync(1, &op, 0, s0));
      },
      false);
  row("local kernel copy (132 blocks)", 0, s0,
      [&] { copy_kernel<<<132, 512, 0, s0>>>((uint4*)dst0, (const uint4*)src0, bytes / 16); }, false);
  if (gpus > 1) {
    // GPU 0 pulls from GPU 1 (gemm@dst: GEMMs on GPU 0; gemm@src: on GPU 1).
    row("peer pull 1D (enqueued on the reader)", 0, s0,
        [&] { CK(cudaMemcpyAsync(dst0, src1, bytes, cudaMemcpyDefault, s0)); }, true);
    row("peer pull 2D, 2 rows", 0, s0,
        [&] { CK(cudaMemcpy2DAsync(dst0, bytes / 2, src1, bytes / 2, half, 2, cudaMemcpyDefault, s0)); }, true);
    row("peer pull 1D, high-priority stream", 0, s0hi,
        [&] { CK(cudaMemcpyAsync(dst0, src1, bytes, cudaMemcpyDefault, s0hi)); }, true);
    row("peer pull by kernel (132 blocks)", 0, s0,
        [&] { copy_kernel<<<132, 512, 0, s0>>>((uint4*)dst0, (const uint4*)src1, bytes / 16); }, true);
    // GPU 0's own data copied within GPU 0, enqueued on GPU 1's stream.
    row("local 1D on GPU 0, enqueued on GPU 1", 1, s1,
        [&] { CK(cudaMemcpyAsync(dst0, src0, bytes, cudaMemcpyDefault, s1)); }, true);
    // GPU 1 pushes into GPU 0 (gemm@dst: GEMMs on GPU 0 = the destination).
    row("peer push 1D (enqueued on the owner)", 1, s1,
        [&] { CK(cudaMemcpyAsync(dst0, src1, bytes, cudaMemcpyDefault, s1)); }, true);
  }
  // The GEMM's own time, for scale.
  {
    cudaEvent_t e0, e1;
    CK(cudaSetDevice(0));
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    g0.enqueue(2);
    CK(cudaEventRecord(e0, g0.s));
    g0.enqueue(6);
    CK(cudaEventRecord(e1, g0.s));
    CK(cudaEventSynchronize(e1));
    float ms = 0;
    CK(cudaEventElapsedTime(&ms, e0, e1));
    std::printf("gemm 4096 x 8192 x 7168 bf16: %.1f us each\n", 1000.0 * ms / 6);
  }
  return 0;
}
