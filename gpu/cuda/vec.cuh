#pragma once
// 16-byte vectorised loads / stores of 8-element chunks for the memory-bound
// kernels, and the host-side checks that decide when a tensor may take them.
// A chunk is always 8 elements: one uint4 of f16 / bf16 (read as 4 packed
// pairs), two float4 of f32. Only gpu/cuda/*.cu include this.

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "gpu/cuda/kernel_args.hpp"

namespace ag::gpu::cuda {

inline constexpr int kChunk = 8;

__device__ __forceinline__ void load8(const float* p, float (&v)[8]) {
  const float4 a = reinterpret_cast<const float4*>(p)[0];
  const float4 b = reinterpret_cast<const float4*>(p)[1];
  v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w, v[4] = b.x, v[5] = b.y, v[6] = b.z, v[7] = b.w;
}
__device__ __forceinline__ void load8(const __nv_bfloat16* p, float (&v)[8]) {
  const uint4 u = *reinterpret_cast<const uint4*>(p);
  const __nv_bfloat162* h = reinterpret_cast<const __nv_bfloat162*>(&u);
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    const float2 f = __bfloat1622float2(h[k]);
    v[2 * k] = f.x, v[2 * k + 1] = f.y;
  }
}
__device__ __forceinline__ void load8(const __half* p, float (&v)[8]) {
  const uint4 u = *reinterpret_cast<const uint4*>(p);
  const __half2* h = reinterpret_cast<const __half2*>(&u);
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    const float2 f = __half22float2(h[k]);
    v[2 * k] = f.x, v[2 * k + 1] = f.y;
  }
}

__device__ __forceinline__ void store8(float* p, const float (&v)[8]) {
  reinterpret_cast<float4*>(p)[0] = make_float4(v[0], v[1], v[2], v[3]);
  reinterpret_cast<float4*>(p)[1] = make_float4(v[4], v[5], v[6], v[7]);
}
__device__ __forceinline__ void store8(__nv_bfloat16* p, const float (&v)[8]) {
  uint4 u;
  __nv_bfloat162* h = reinterpret_cast<__nv_bfloat162*>(&u);
#pragma unroll
  for (int k = 0; k < 4; ++k) h[k] = __floats2bfloat162_rn(v[2 * k], v[2 * k + 1]);
  *reinterpret_cast<uint4*>(p) = u;
}
__device__ __forceinline__ void store8(__half* p, const float (&v)[8]) {
  uint4 u;
  __half2* h = reinterpret_cast<__half2*>(&u);
#pragma unroll
  for (int k = 0; k < 4; ++k) h[k] = __floats2half2_rn(v[2 * k], v[2 * k + 1]);
  *reinterpret_cast<uint4*>(p) = u;
}

/// True when p is 16-byte aligned.
inline bool aligned16(const void* p) { return (reinterpret_cast<std::uintptr_t>(p) & 15u) == 0; }

/// True when every row (last dim) of x starts 16-byte aligned, is contiguous
/// and holds a whole number of 8-element chunks: the rows may be read and
/// written with load8 / store8 at row_offset(x, r) + 8 * k.
inline bool rows_vectorisable(const kt& x) {
  if (!aligned16(x.p)) return false;
  if (x.d[3] % kChunk != 0) return false;
  if (x.d[3] != 1 && x.s[3] != 1) return false;
  for (int k = 0; k < 3; ++k)
    if (x.d[k] != 1 && x.s[k] % kChunk != 0) return false;
  return true;
}

/// 1 << ceil(log2(v)) for v >= 1.
inline int64_t pow2_ceil(int64_t v) {
  int64_t p = 1;
  while (p < v) p <<= 1;
  return p;
}

}  // namespace ag::gpu::cuda
