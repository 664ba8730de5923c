#pragma once
/// \file dtype.hpp
/// Element types. f16 / bf16 are storage formats: arithmetic is f32 (or f64
/// in the reference evaluator). i32 holds token ids and positions.

#include <cstdint>
#include <cstring>
#include <cstddef>

namespace ag {

enum class dtype : uint8_t { f32 = 0, f16 = 1, bf16 = 2, i32 = 3 };

/// Bytes per element.
constexpr std::size_t dtype_size(dtype t) noexcept {
  return t == dtype::f16 || t == dtype::bf16 ? 2 : 4;
}
/// "f32", "f16", "bf16", "i32".
const char* to_string(dtype t) noexcept;
/// Parses the names above; false if unknown.
bool parse_dtype(const char* s, dtype& out) noexcept;
constexpr bool is_float(dtype t) noexcept { return t != dtype::i32; }

/// IEEE binary16 <-> float, round to nearest even; inf/nan preserved.
uint16_t float_to_half(float f) noexcept;
float half_to_float(uint16_t h) noexcept;

/// bfloat16 <-> float, round to nearest even; nan preserved.
inline uint16_t float_to_bf16(float f) noexcept {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40u);  // quiet nan
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}
inline float bf16_to_float(uint16_t h) noexcept {
  uint32_t u = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

/// Reads element i of a buffer of type t as float (i32 converts exactly up to 2^24).
float load_as_float(const void* data, dtype t, std::size_t i) noexcept;
/// Writes v (rounded to t) as element i.
void store_from_float(void* data, dtype t, std::size_t i, float v) noexcept;

}  // namespace ag
