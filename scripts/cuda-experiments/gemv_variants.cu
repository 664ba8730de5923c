// GEMV variants for a decode step's shapes (bf16, one row of x), timed over rotating weight copies.
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <cstdio>
#include <cstdlib>
#include <vector>
#define CK(x) do { cudaError_t e_ = (x); if (e_ != cudaSuccess) { std::printf("%s:%d %s\n", __FILE__, __LINE__, cudaGetErrorString(e_)); std::exit(1);} } while (0)
__device__ __forceinline__ float warp_sum(float v) { for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o); return v; }
__device__ __forceinline__ void unpack(const uint4& u, float (&f)[8]) {
  const unsigned w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
  for (int k = 0; k < 4; ++k) f[2 * k] = __uint_as_float(w[k] << 16), f[2 * k + 1] = __uint_as_float(w[k] & 0xffff0000u);
}
template <int LD> __device__ __forceinline__ uint4 ldw(const uint4* p) {
  if constexpr (LD == 0) return __ldcs(p);
  else if constexpr (LD == 1) { uint4 r; asm volatile("ld.global.nc.L1::no_allocate.L2::256B.v4.u32 {%0,%1,%2,%3}, [%4];" : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w) : "l"(p)); return r; }
  else return __ldg(p);
}
// WPR warps per row (split K inside a block), F loads in flight per lane.
template <int F, int LD, int WPR, int MINB>
__global__ void __launch_bounds__(256, MINB) gemv(const __nv_bfloat16* __restrict__ w, const __nv_bfloat16* __restrict__ x, __nv_bfloat16* y, int N, int K) {
  __shared__ float part[8];
  const int lane = threadIdx.x & 31, wib = threadIdx.x >> 5;
  const int vecs = K / 8;
  const int rows_per_block = 8 / WPR;
  const int sub = wib % WPR;  // which K slice
  const long long nblk_rows = (long long)gridDim.x * rows_per_block;
  for (long long n = (long long)blockIdx.x * rows_per_block + wib / WPR; n < N; n += nblk_rows) {
    const uint4* wr = reinterpret_cast<const uint4*>(w + n * K);
    const uint4* xr = reinterpret_cast<const uint4*>(x);
    float acc = 0.f;
    const int v_begin = sub * (vecs / WPR), v_end = v_begin + vecs / WPR;
    for (int v0 = v_begin + lane; v0 < v_end; v0 += 32 * F) {
      uint4 wv[F];
#pragma unroll
      for (int u = 0; u < F; ++u) { int v = v0 + 32 * u; if (v < v_end) wv[u] = ldw<LD>(wr + v); }
#pragma unroll
      for (int u = 0; u < F; ++u) {
        int v = v0 + 32 * u; if (v >= v_end) break;
        float wf[8], xf[8]; unpack(wv[u], wf); unpack(__ldg(xr + v), xf);
#pragma unroll
        for (int e = 0; e < 8; ++e) acc = fmaf(wf[e], xf[e], acc);
      }
    }
    acc = warp_sum(acc);
    if (WPR == 1) { if (lane == 0) y[n] = __float2bfloat16(acc); }
    else {
      if (lane == 0) part[wib] = acc;
      __syncthreads();
      if (sub == 0 && lane == 0) { float s = 0; for (int k = 0; k < WPR; ++k) s += part[wib + k]; y[n] = __float2bfloat16(s); }
      __syncthreads();
    }
  }
}
__global__ void readsum(const uint4* p, long long n, float* out) {
  float a = 0; for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x) { uint4 v = __ldcs(p + i); a += __uint_as_float(v.x) + __uint_as_float(v.w); }
  if (a == 12345.f) *out = a;
}
int sms;
template <int F, int LD, int WPR, int MINB>
void run(const char* name, std::vector<__nv_bfloat16*>& ws, __nv_bfloat16* x, __nv_bfloat16* y, int N, int K, int grid_cap_mult) {
  int rows_per_block = 8 / WPR;
  long long blocks = (N + rows_per_block - 1) / rows_per_block;
  int occ = 0; CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&occ, gemv<F, LD, WPR, MINB>, 256, 0));
  if (grid_cap_mult > 0 && blocks > (long long)occ * sms * grid_cap_mult) blocks = (long long)occ * sms * grid_cap_mult;
  cudaEvent_t a, b; CK(cudaEventCreate(&a)); CK(cudaEventCreate(&b));
  const int iters = 200;
  for (int i = 0; i < 20; ++i) gemv<F, LD, WPR, MINB><<<blocks, 256>>>(ws[i % ws.size()], x, y, N, K);
  CK(cudaEventRecord(a));
  for (int i = 0; i < iters; ++i) gemv<F, LD, WPR, MINB><<<blocks, 256>>>(ws[i % ws.size()], x, y, N, K);
  CK(cudaEventRecord(b)); CK(cudaEventSynchronize(b)); CK(cudaGetLastError());
  float ms; CK(cudaEventElapsedTime(&ms, a, b));
  double us = ms * 1e3 / iters, gbs = 2.0 * N * K / (us * 1e-6) / 1e9;
  std::printf("  %-34s occ %d grid %6lld: %7.2f us  %6.0f GB/s\n", name, occ, blocks, us, gbs);
}
int main() {
  CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  const size_t big = size_t(1) << 30;  // 1 GiB of weights, rotated
  void* pool; CK(cudaMalloc(&pool, big)); CK(cudaMemset(pool, 0x3c, big));
  __nv_bfloat16 *x, *y; CK(cudaMalloc(&x, 1 << 16)); CK(cudaMalloc(&y, 1 << 20)); CK(cudaMemset(x, 0x3c, 1 << 16));
  float* dummy; CK(cudaMalloc(&dummy, 64));
  { cudaEvent_t a, b; CK(cudaEventCreate(&a)); CK(cudaEventCreate(&b));
    long long n = big / 16; readsum<<<sms * 8, 512>>>((const uint4*)pool, n, dummy);
    CK(cudaEventRecord(a)); for (int i = 0; i < 5; ++i) readsum<<<sms * 8, 512>>>((const uint4*)pool, n, dummy); CK(cudaEventRecord(b)); CK(cudaEventSynchronize(b));
    float ms; CK(cudaEventElapsedTime(&ms, a, b)); std::printf("read bandwidth (1 GiB sum): %.0f GB/s\n", 5.0 * big / (ms * 1e-3) / 1e9); }
  struct shp { const char* n; int N, K; } shapes[] = {{"q/o 2048x2048", 2048, 2048}, {"gate|up 16384x2048", 16384, 2048}, {"down 2048x8192", 2048, 8192}, {"head 32000x2048", 32000, 2048}};
  for (auto& s : shapes) {
    size_t bytes = size_t(2) * s.N * s.K;
    std::vector<__nv_bfloat16*> ws;
    for (size_t off = 0; off + bytes <= big; off += bytes) ws.push_back((__nv_bfloat16*)((char*)pool + off));
    std::printf("%s (%.1f MB, %zu copies)\n", s.n, bytes / 1e6, ws.size());
    run<8, 0, 1, 1>("F8 ldcs (current, no bound)", ws, x, y, s.N, s.K, 0);
    run<8, 0, 1, 4>("F8 ldcs minB4", ws, x, y, s.N, s.K, 0);
    run<8, 1, 1, 4>("F8 nc.L2::256B minB4", ws, x, y, s.N, s.K, 0);
    run<8, 2, 1, 4>("F8 ldg minB4", ws, x, y, s.N, s.K, 0);
    run<16, 0, 1, 2>("F16 ldcs minB2", ws, x, y, s.N, s.K, 0);
    run<4, 0, 1, 4>("F4 ldcs minB4", ws, x, y, s.N, s.K, 0);
    run<8, 0, 1, 4>("F8 ldcs minB4 grid=resident", ws, x, y, s.N, s.K, 1);
    run<8, 0, 2, 4>("F8 ldcs 2 warps/row", ws, x, y, s.N, s.K, 0);
    run<8, 0, 4, 4>("F8 ldcs 4 warps/row", ws, x, y, s.N, s.K, 0);
    run<4, 0, 4, 4>("F4 ldcs 4 warps/row", ws, x, y, s.N, s.K, 0);
    run<8, 1, 4, 4>("F8 nc256 4 warps/row", ws, x, y, s.N, s.K, 0);
  }
  return 0;
}
