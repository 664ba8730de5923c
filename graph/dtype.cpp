#include "graph/dtype.hpp"

#include <cstdint>
#include <cstring>

namespace ag {

const char* to_string(dtype t) noexcept {
  switch (t) {
    case dtype::f32: return "f32";
    case dtype::f16: return "f16";
    case dtype::bf16: return "bf16";
    case dtype::i32: return "i32";
  }
  return "?";
}

bool parse_dtype(const char* s, dtype& out) noexcept {
  static constexpr dtype all[] = {dtype::f32, dtype::f16, dtype::bf16, dtype::i32};
  for (dtype t : all) {
    if (std::strcmp(s, to_string(t)) == 0) {
      out = t;
      return true;
    }
  }
  return false;
}

uint16_t float_to_half(float f) noexcept {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  const uint32_t sign = (x >> 16) & 0x8000u;
  const uint32_t abs = x & 0x7fffffffu;
  if (abs > 0x7f800000u) return static_cast<uint16_t>(sign | 0x7e00u);  // nan
  if (abs >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u); // overflow -> inf (rounds past 65504)
  if (abs < 0x38800000u) {
    // subnormal half (or zero): value = abs_float * 2^24 rounded to nearest even
    if (abs < 0x33000000u) return static_cast<uint16_t>(sign);  // < 2^-25 rounds to 0
    const uint32_t mant = (abs & 0x7fffffu) | 0x800000u;
    const int exp = static_cast<int>(abs >> 23);   // 102..112
    const int shift = 126 - exp;                    // 14..24
    uint32_t h = mant >> shift;
    const uint32_t rem = mant & ((1u << shift) - 1u);
    const uint32_t halfway = 1u << (shift - 1);
    if (rem > halfway || (rem == halfway && (h & 1u))) ++h;
    return static_cast<uint16_t>(sign | h);
  }
  // normal: rebias exponent (127 -> 15), round mantissa 23 -> 10 bits to nearest even
  uint32_t h = ((abs >> 13) - (112u << 10));
  const uint32_t rem = abs & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) ++h;
  return static_cast<uint16_t>(sign | h);
}

float half_to_float(uint16_t h) noexcept {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t mant = h & 0x3ffu;
  uint32_t x;
  if (exp == 0) {
    if (mant == 0) {
      x = sign;
    } else {  // subnormal: normalise
      int e = -1;
      do {
        ++e;
        mant <<= 1;
      } while ((mant & 0x400u) == 0);
      x = sign | ((112u - static_cast<uint32_t>(e)) << 23) | ((mant & 0x3ffu) << 13);
    }
  } else if (exp == 31) {
    x = sign | 0x7f800000u | (mant << 13);
  } else {
    x = sign | ((exp + 112u) << 23) | (mant << 13);
  }
  float f;
  std::memcpy(&f, &x, 4);
  return f;
}

float load_as_float(const void* data, dtype t, std::size_t i) noexcept {
  switch (t) {
    case dtype::f32: return static_cast<const float*>(data)[i];
    case dtype::f16: return half_to_float(static_cast<const uint16_t*>(data)[i]);
    case dtype::bf16: return bf16_to_float(static_cast<const uint16_t*>(data)[i]);
    case dtype::i32: return static_cast<float>(static_cast<const int32_t*>(data)[i]);
  }
  return 0.0f;
}

void store_from_float(void* data, dtype t, std::size_t i, float v) noexcept {
  switch (t) {
    case dtype::f32: static_cast<float*>(data)[i] = v; break;
    case dtype::f16: static_cast<uint16_t*>(data)[i] = float_to_half(v); break;
    case dtype::bf16: static_cast<uint16_t*>(data)[i] = float_to_bf16(v); break;
    case dtype::i32: {
      // truncate toward zero like a C cast, but defined for nan (0) and out-of-range values (saturate)
      int32_t r = 0;
      if (v >= 2147483648.0f) r = INT32_MAX;
      else if (v <= -2147483648.0f) r = INT32_MIN;
      else if (v == v) r = static_cast<int32_t>(v);
      static_cast<int32_t*>(data)[i] = r;
      break;
    }
  }
}

}  // namespace ag
