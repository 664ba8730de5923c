#pragma once
// Shared by the kernels: a by-value tensor descriptor, dtype loads/stores with
// f32 arithmetic, warp/block reductions, and the launch context every host
// launcher takes. Included only by gpu/cuda/*.cu and gpu/cuda/*.cpp.

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>

#include "gpu/cuda/kernel_args.hpp"
#include "gpu/cuda/kernel_preload.hpp"

namespace ag::gpu::cuda {

/// Registers the module of the .cu file it is in, so that preload_kernels()
/// (kernel_preload.hpp) loads all its kernels when the devices are made.
/// Every .cu file with kernels has one, inside namespace ag::gpu::cuda.
#define AG_CUDA_MODULE_ANCHOR()                                                                  \
  namespace {                                                                                    \
  __global__ void module_anchor_kernel() {}                                                      \
  [[maybe_unused]] const bool module_anchor_registered =                                         \
      register_module_anchor(reinterpret_cast<const void*>(&module_anchor_kernel));             \
  }

// Programmatic dependent launch (PDL, sm_90+; launch_ctx::pdl). A kernel
// launched by launch_kernel() with PDL on may start while the kernel before
// it on the stream still runs, so every such kernel calls pdl_wait() before
// it reads or writes anything but weights: griddepcontrol.wait returns once
// the previous grid has completed and its writes are visible (and at once
// when there is no programmatic predecessor). pdl_release() lets the next
// kernel launch early; our kernels call it right after their wait, so at
// most one kernel's blocks wait behind a running one. Without PDL both are
// no-ops.
__device__ __forceinline__ void pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}
__device__ __forceinline__ void pdl_release() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}
/// The usual kernel entry: wait for the kernel before, then let the next one launch.
__device__ __forceinline__ void pdl_enter() {
  pdl_wait();
  pdl_release();
}

// 16 bytes global -> shared without the registers (zeros when !valid:
// nothing is read then), completed by cp_async_commit() then
// cp_async_wait_all() (sm_80+).
__device__ __forceinline__ void cp_async16(void* dst, const void* src, bool valid) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  const auto d = static_cast<uint32_t>(__cvta_generic_to_shared(dst));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(d), "l"(src), "r"(valid ? 16 : 0) : "memory");
#endif
}
// 4 bytes global -> shared the same way (may read through L1: the caller
// orders it after the writes it must see, as for any weak load).
__device__ __forceinline__ void cp_async4(void* dst, const void* src) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  const auto d = static_cast<uint32_t>(__cvta_generic_to_shared(dst));
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4;" ::"r"(d), "l"(src) : "memory");
#endif
}
__device__ __forceinline__ void cp_async_commit() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.commit_group;" ::: "memory");
#endif
}
__device__ __forceinline__ void cp_async_wait_all() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.wait_group 0;" ::: "memory");
#endif
}

/// Devices a kernel's allow_shared() flags track (ordinals at or past it ask every time).
inline constexpr int kMaxSharedOrdinals = 64;

/// Lets `kernel` take `bytes` of dynamic shared memory when that is more
/// than the 48 KiB a launch gets without asking: once per device (`done`, a
/// static array of the launcher), for the most any of its launches asks
/// (`most`).
template <class Kernel>
cudaError_t allow_shared(Kernel kernel, std::size_t bytes, std::size_t most,
                         std::atomic<bool> (&done)[kMaxSharedOrdinals]) {
  if (bytes <= 48 * 1024) return cudaSuccess;
  int dev = 0;
  if (cudaError_t r = cudaGetDevice(&dev); r != cudaSuccess) return r;
  if (dev >= 0 && dev < kMaxSharedOrdinals && done[dev].load(std::memory_order_acquire)) return cudaSuccess;
  const cudaError_t r = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(most));
  if (r == cudaSuccess && dev >= 0 && dev < kMaxSharedOrdinals) done[dev].store(true, std::memory_order_release);
  return r;
}

/// Launches `kernel` on c.stream, as a programmatic dependent of the
/// previous kernel when c.pdl (the kernel must call pdl_wait() first: see
/// above). Errors are left for cudaGetLastError(), as with <<<>>>.
template <class... KernelArgs, class... Args>
void launch_kernel(const launch_ctx& c, void (*kernel)(KernelArgs...), dim3 grid, dim3 block, std::size_t shared,
                   Args&&... args) {
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = shared;
  cfg.stream = c.stream;
  cfg.attrs = attr;
  cfg.numAttrs = c.pdl ? 1 : 0;
  (void)cudaLaunchKernelEx(&cfg, kernel, std::forward<Args>(args)...);
}

__device__ __forceinline__ float ld(const void* p, int t, int64_t i) {
  switch (t) {
    case 0: return static_cast<const float*>(p)[i];
    case 1: return __half2float(static_cast<const __half*>(p)[i]);
    case 2: return __bfloat162float(static_cast<const __nv_bfloat16*>(p)[i]);
    default: return static_cast<float>(static_cast<const int32_t*>(p)[i]);
  }
}
__device__ __forceinline__ void st(void* p, int t, int64_t i, float v) {
  switch (t) {
    case 0: static_cast<float*>(p)[i] = v; break;
    case 1: static_cast<__half*>(p)[i] = __float2half_rn(v); break;
    case 2: static_cast<__nv_bfloat16*>(p)[i] = __float2bfloat16_rn(v); break;
    default: static_cast<int32_t*>(p)[i] = static_cast<int32_t>(v); break;
  }
}

/// out[i] = the sum of in[k][src] over the n members, in f32 rounded once to
/// type t; i32 (t == 3) exactly in 64 bits, saturated as the reference does.
/// The collectives' reduction (collective.cu, in_stream.cu).
__device__ __forceinline__ void store_member_sum(void* out, int t, const void* const* in, int n, int64_t src,
                                                 int64_t i) {
  if (t == 3) {
    long long s = 0;
    for (int k = 0; k < n; ++k) s += static_cast<const int32_t*>(in[k])[src];
    if (s > 2147483647LL) s = 2147483647LL;
    if (s < -2147483648LL) s = -2147483648LL;
    static_cast<int32_t*>(out)[i] = static_cast<int32_t>(s);
  } else {
    float s = 0.f;
    for (int k = 0; k < n; ++k) s += ld(in[k], t, src);
    st(out, t, i, s);
  }
}

// Typed versions for the templated (fast) kernels.
template <class T> __device__ __forceinline__ float to_f(T v);
template <> __device__ __forceinline__ float to_f<float>(float v) { return v; }
template <> __device__ __forceinline__ float to_f<__half>(__half v) { return __half2float(v); }
template <> __device__ __forceinline__ float to_f<__nv_bfloat16>(__nv_bfloat16 v) { return __bfloat162float(v); }
template <class T> __device__ __forceinline__ T from_f(float v);
template <> __device__ __forceinline__ float from_f<float>(float v) { return v; }
template <> __device__ __forceinline__ __half from_f<__half>(float v) { return __float2half_rn(v); }
template <> __device__ __forceinline__ __nv_bfloat16 from_f<__nv_bfloat16>(float v) { return __float2bfloat16_rn(v); }

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}
/// sin and cos of a rope angle, pos * inv (inv = theta^(-2k/D),
/// rope_inverse_frequencies): the angle in f64, reduced to [-pi, pi] in f64
/// (exact to about 1e-12 for any int32 position), then sin / cos in f32:
/// cheaper than an f64 sincos of up to 2^31 radians, as accurate for f32 /
/// 16-bit data. The rope kernel and the fused attention's rope both use it,
/// so that they round alike.
__device__ __forceinline__ float rope_reduced_angle(double position, double inv) {
  const double angle = position * inv;
  const double two_pi = 6.283185307179586476925286766559;
  return static_cast<float>(angle - rint(angle * (1.0 / two_pi)) * two_pi);
}
__device__ __forceinline__ void rope_sincos(double position, double inv, float& fs, float& fc) {
  sincosf(rope_reduced_angle(position, inv), &fs, &fc);
}
/// Sum over the block; every thread gets the result. `sh` holds 32 floats.
__device__ __forceinline__ float block_sum(float v, float* sh) {
  v = warp_sum(v);
  const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
  __syncthreads();  // sh may still be read from a previous reduction
  if (lane == 0) sh[w] = v;
  __syncthreads();
  const int nw = (blockDim.x + 31) >> 5;
  v = lane < nw ? sh[lane] : 0.f;
  return warp_sum(v);
}
__device__ __forceinline__ float block_max(float v, float* sh) {
  v = warp_max(v);
  const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
  __syncthreads();
  if (lane == 0) sh[w] = v;
  __syncthreads();
  const int nw = (blockDim.x + 31) >> 5;
  v = lane < nw ? sh[lane] : -INFINITY;
  return warp_max(v);
}

/// Offset of the row `row` (flat index over d[0..2]) of a kt.
__device__ __forceinline__ int64_t row_offset(const kt& x, int64_t row) {
  const int64_t i2 = row % x.d[2];
  const int64_t r = row / x.d[2];
  const int64_t i1 = r % x.d[1];
  const int64_t i0 = r / x.d[1];
  return i0 * x.s[0] + i1 * x.s[1] + i2 * x.s[2];
}

/// Offset of flat (row-major over d) index i in a kt.
__device__ __forceinline__ int64_t flat_offset(const kt& x, int64_t i) {
  const int64_t i3 = i % x.d[3];
  return row_offset(x, i / x.d[3]) + i3 * x.s[3];
}

}  // namespace ag::gpu::cuda
