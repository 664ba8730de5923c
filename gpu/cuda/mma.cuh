#pragma once
// The tensor cores' m16n8k16 product (mma.sync, sm_80 and later), shared by
// the flash attention (flash_attention.cu) and the GEMV kernel's mma form
// (gemv.cu). Device code only; the few-row operand mapping the GEMV uses is
// in gemv_mma_layout.hpp, which host tests check against PTX's layout.

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

namespace ag::gpu::cuda {

// One m16n8k16 product c += a b on the tensor cores, f32 accumulation
// (PTX ISA, "Matrix fragments for mma.m16n8k16"): lane = 4 g + t holds
// a = {(g, 2t..2t+1), (g+8, 2t..), (g, 2t+8..), (g+8, 2t+8..)} of the 16x16
// a, b = {(k 2t..2t+1, n g), (k 2t+8.., n g)} of the 16x8 b, and
// c = {(g, 2t), (g, 2t+1), (g+8, 2t), (g+8, 2t+1)} of the 16x8 result.
template <class T>
__device__ __forceinline__ void mma16816(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1);
template <>
__device__ __forceinline__ void mma16816<__nv_bfloat16>(float (&c)[4], const uint32_t (&a)[4], uint32_t b0,
                                                        uint32_t b1) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#endif
}
template <>
__device__ __forceinline__ void mma16816<__half>(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#endif
}

}  // namespace ag::gpu::cuda
