// dtype conversions: f16 / bf16 round trips, round-to-nearest-even, subnormals,
// overflow, inf / nan; host_tensor casts.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>

#include "graph/dtype.hpp"
#include "graph/host_tensor.hpp"
#include "graph/random.hpp"

namespace ag {
namespace {

uint32_t bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

TEST(Dtype, NamesAndSizes) {
  for (dtype t : {dtype::f32, dtype::f16, dtype::bf16, dtype::i32}) {
    dtype back = dtype::i32;
    ASSERT_TRUE(parse_dtype(to_string(t), back));
    EXPECT_EQ(back, t);
  }
  dtype out = dtype::f16;
  EXPECT_FALSE(parse_dtype("f64", out));
  EXPECT_EQ(out, dtype::f16);
  EXPECT_EQ(dtype_size(dtype::f16), 2u);
  EXPECT_EQ(dtype_size(dtype::bf16), 2u);
  EXPECT_EQ(dtype_size(dtype::f32), 4u);
  EXPECT_EQ(dtype_size(dtype::i32), 4u);
  EXPECT_FALSE(is_float(dtype::i32));
  EXPECT_TRUE(is_float(dtype::bf16));
}

TEST(Dtype, HalfRoundTripsEveryBitPattern) {
  for (uint32_t h = 0; h < 0x10000u; ++h) {
    const float f = half_to_float(static_cast<uint16_t>(h));
    const bool is_nan = (h & 0x7c00u) == 0x7c00u && (h & 0x3ffu) != 0;
    if (is_nan) {
      EXPECT_TRUE(std::isnan(f)) << std::hex << h;
      EXPECT_TRUE(std::isnan(half_to_float(float_to_half(f))));
    } else {
      ASSERT_EQ(float_to_half(f), h) << std::hex << h << " -> " << f;
    }
  }
}

TEST(Dtype, Bf16RoundTripsEveryBitPattern) {
  for (uint32_t h = 0; h < 0x10000u; ++h) {
    const float f = bf16_to_float(static_cast<uint16_t>(h));
    if (std::isnan(f)) {
      EXPECT_TRUE(std::isnan(bf16_to_float(float_to_bf16(f))));
    } else {
      ASSERT_EQ(float_to_bf16(f), h) << std::hex << h;
    }
  }
}

TEST(Dtype, HalfKnownValues) {
  EXPECT_EQ(float_to_half(1.0f), 0x3c00);
  EXPECT_EQ(float_to_half(-2.0f), 0xc000);
  EXPECT_EQ(float_to_half(65504.0f), 0x7bff);  // largest finite
  EXPECT_EQ(float_to_half(0.0f), 0x0000);
  EXPECT_EQ(float_to_half(-0.0f), 0x8000);
  EXPECT_EQ(half_to_float(0x3555), 0.333251953125f);
}

TEST(Dtype, HalfRoundsToNearestEven) {
  const float ulp = std::ldexp(1.0f, -10);  // spacing of halves in [1, 2)
  // exactly halfway between 1 and 1 + ulp: ties to the even mantissa (1)
  EXPECT_EQ(float_to_half(1.0f + ulp / 2), 0x3c00);
  // halfway between 1 + ulp (odd) and 1 + 2 ulp (even): rounds up
  EXPECT_EQ(float_to_half(1.0f + 1.5f * ulp), 0x3c02);
  // just above halfway rounds up, just below rounds down
  EXPECT_EQ(float_to_half(std::nextafter(1.0f + ulp / 2, 2.0f)), 0x3c01);
  EXPECT_EQ(float_to_half(std::nextafter(1.0f + ulp / 2, 0.0f)), 0x3c00);
  // mantissa carry into the exponent: 2 - ulp/4 rounds to 2
  EXPECT_EQ(float_to_half(2.0f - ulp / 4), 0x4000);
}

TEST(Dtype, HalfRandomValuesAreWithinHalfAnUlp) {
  rng r(7);
  for (int i = 0; i < 20000; ++i) {
    const float f = static_cast<float>((r.uniform() * 2 - 1) * std::ldexp(1.0, static_cast<int>(r.next() % 30) - 14));
    const float back = half_to_float(float_to_half(f));
    if (std::fabs(f) < std::ldexp(1.0f, -14)) {
      EXPECT_LE(std::fabs(back - f), std::ldexp(1.0f, -25)) << f;  // subnormal spacing 2^-24
    } else if (std::fabs(f) < 65504.0f) {
      EXPECT_LE(std::fabs(back - f), std::fabs(f) * std::ldexp(1.0f, -11)) << f;
    }
  }
}

TEST(Dtype, HalfSubnormals) {
  const float tiny = std::ldexp(1.0f, -24);  // smallest half subnormal
  EXPECT_EQ(float_to_half(tiny), 0x0001);
  EXPECT_EQ(half_to_float(0x0001), tiny);
  EXPECT_EQ(float_to_half(-tiny), 0x8001);
  EXPECT_EQ(float_to_half(tiny / 2), 0x0000);  // tie between 0 and tiny: even (0)
  EXPECT_EQ(float_to_half(std::nextafter(tiny / 2, 1.0f)), 0x0001);
  EXPECT_EQ(float_to_half(tiny * 1.5f), 0x0002);  // tie between 1 and 2 ulps: even (2)
  EXPECT_EQ(float_to_half(tiny * 2.5f), 0x0002);  // tie between 2 and 3: even (2)
  EXPECT_EQ(half_to_float(0x03ff), std::ldexp(1023.0f, -24));  // largest subnormal
  EXPECT_EQ(float_to_half(std::ldexp(1023.0f, -24)), 0x03ff);
  EXPECT_EQ(float_to_half(std::ldexp(1023.5f, -24)), 0x0400);  // rounds up into the smallest normal
  EXPECT_EQ(float_to_half(std::ldexp(1.0f, -14)), 0x0400);
  EXPECT_EQ(float_to_half(1e-10f), 0x0000);
  EXPECT_EQ(float_to_half(std::numeric_limits<float>::denorm_min()), 0x0000);
}

TEST(Dtype, HalfOverflowInfAndNan) {
  const float inf = std::numeric_limits<float>::infinity();
  EXPECT_EQ(float_to_half(65519.0f), 0x7bff);  // below the halfway point to 65536
  EXPECT_EQ(float_to_half(65520.0f), 0x7c00);  // halfway, ties away from odd 0x3ff -> inf
  EXPECT_EQ(float_to_half(1e6f), 0x7c00);
  EXPECT_EQ(float_to_half(-1e6f), 0xfc00);
  EXPECT_EQ(float_to_half(inf), 0x7c00);
  EXPECT_EQ(float_to_half(-inf), 0xfc00);
  EXPECT_EQ(half_to_float(0x7c00), inf);
  EXPECT_EQ(half_to_float(0xfc00), -inf);
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const uint16_t hn = float_to_half(nan);
  EXPECT_EQ(hn & 0x7c00, 0x7c00);
  EXPECT_NE(hn & 0x3ff, 0);
  EXPECT_TRUE(std::isnan(half_to_float(hn)));
  // a nan whose payload lives only in low bits must not collapse to inf
  uint32_t low_payload = 0x7f800001u;
  float lp;
  std::memcpy(&lp, &low_payload, 4);
  EXPECT_TRUE(std::isnan(half_to_float(float_to_half(lp))));
}

TEST(Dtype, Bf16RoundingInfNan) {
  EXPECT_EQ(float_to_bf16(1.0f), 0x3f80);
  const float ulp = std::ldexp(1.0f, -7);
  EXPECT_EQ(float_to_bf16(1.0f + ulp / 2), 0x3f80);           // tie -> even
  EXPECT_EQ(float_to_bf16(1.0f + 1.5f * ulp), 0x3f82);        // tie -> even (up)
  EXPECT_EQ(float_to_bf16(std::nextafter(1.0f + ulp / 2, 2.0f)), 0x3f81);
  const float inf = std::numeric_limits<float>::infinity();
  EXPECT_EQ(float_to_bf16(inf), 0x7f80);
  EXPECT_EQ(float_to_bf16(-inf), 0xff80);
  EXPECT_EQ(float_to_bf16(std::numeric_limits<float>::max()), 0x7f80);  // rounds past the largest bf16
  uint32_t low_payload = 0x7f800001u;
  float lp;
  std::memcpy(&lp, &low_payload, 4);
  EXPECT_TRUE(std::isnan(bf16_to_float(float_to_bf16(lp))));
  // bf16 keeps float's exponent range: float subnormals stay representable-ish
  const float sub = std::ldexp(1.0f, -130);
  EXPECT_EQ(bf16_to_float(float_to_bf16(sub)), sub);
  EXPECT_EQ(bits(bf16_to_float(float_to_bf16(-0.0f))), 0x80000000u);
}

TEST(Dtype, StoreToI32TruncatesAndSaturates) {
  int32_t v[6] = {};
  const float vals[6] = {2.9f, -2.9f, 1e20f, -1e20f, std::numeric_limits<float>::quiet_NaN(), 16777216.0f};
  for (int i = 0; i < 6; ++i) store_from_float(v, dtype::i32, static_cast<std::size_t>(i), vals[i]);
  EXPECT_EQ(v[0], 2);
  EXPECT_EQ(v[1], -2);
  EXPECT_EQ(v[2], std::numeric_limits<int32_t>::max());
  EXPECT_EQ(v[3], std::numeric_limits<int32_t>::min());
  EXPECT_EQ(v[4], 0);
  EXPECT_EQ(v[5], 16777216);
  EXPECT_EQ(load_as_float(v, dtype::i32, 1), -2.0f);
}

TEST(Dtype, HostTensorCastRoundTrips) {
  auto t = host_tensor::random_normal(dtype::f32, {3, 5}, 99, 4.0f);
  auto h = t.cast(dtype::f16);
  auto bf = t.cast(dtype::bf16);
  EXPECT_EQ(h.type(), dtype::f16);
  EXPECT_EQ(h.bytes(), 30u);
  for (int64_t i = 0; i < t.numel(); ++i) {
    EXPECT_EQ(h.at(i), half_to_float(float_to_half(t.at(i))));
    EXPECT_EQ(bf.at(i), bf16_to_float(float_to_bf16(t.at(i))));
  }
  EXPECT_EQ(h.cast(dtype::f32).cast(dtype::f16), h);  // f16 -> f32 -> f16 is exact
  auto ids = host_tensor::random_ints({7}, 5, 1000);
  EXPECT_EQ(ids.cast(dtype::f32).cast(dtype::i32), ids);
  const auto c = compare(h.cast(dtype::f32), t, 0, 1.0 / 2048);
  EXPECT_TRUE(c.ok) << c.message;
}

}  // namespace
}  // namespace ag
