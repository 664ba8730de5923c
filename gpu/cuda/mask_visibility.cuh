#pragma once
// Which keys an attention mask hides, tested on its raw bits (device code
// shared by the split kernel, attention.cu, and the flash kernel's row
// bounds, flash_attention.cu). A value at or below attention_hidden_limit
// (graph/attention_mask.hpp) hides its key.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

namespace ag::gpu::cuda {

// The bits of attention_hidden_limit in T, twice for 2-byte types: a mask
// value is hidden when its bits, read as an unsigned number, are at least
// these (a negative number at least the limit's magnitude, -inf too).
template <class T>
struct hidden_bits;
template <>
struct hidden_bits<float> {
  static constexpr uint32_t word = 0xC6800000u;  // -16384.f
};
template <>
struct hidden_bits<__half> {
  static constexpr uint32_t word = 0xF400F400u;
};
template <>
struct hidden_bits<__nv_bfloat16> {
  static constexpr uint32_t word = 0xC680C680u;
};
// Per element of the word: all ones where the mask value is visible.
template <class T>
__device__ __forceinline__ uint32_t visible_lanes(uint32_t w) {
  if constexpr (sizeof(T) == 2) return __vcmpltu2(w, hidden_bits<T>::word);
  else return w < hidden_bits<T>::word ? 0xffffffffu : 0u;
}
// The first visible element of a 16-byte vector whose words' lanes are v
// (one of them non-zero), and one past its last.
template <class T>
__device__ __forceinline__ int first_visible_in(const uint32_t (&v)[4]) {
  constexpr int W = 4 / sizeof(T);  // elements per word
#pragma unroll
  for (int k = 0; k < 4; ++k)
    if (v[k]) return k * W + (W == 2 && !(v[k] & 0xffffu) ? 1 : 0);
  return 0;
}
template <class T>
__device__ __forceinline__ int visible_end_in(const uint32_t (&v)[4]) {
  constexpr int W = 4 / sizeof(T);
#pragma unroll
  for (int k = 3; k >= 0; --k)
    if (v[k]) return k * W + (W == 2 && (v[k] >> 16) ? 2 : 1);
  return 0;
}

}  // namespace ag::gpu::cuda
