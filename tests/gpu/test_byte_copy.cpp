// gpu::copies_independent: two copies may share a kernel (the CUDA
// backend's batched host copies of a replayed segment) only when neither
// touches bytes the other reads or writes. Plain address arithmetic.
#include <gtest/gtest.h>

#include <cstddef>

#include "gpu/byte_copy.hpp"

namespace {

TEST(ByteCopy, CopiesAreIndependentExactlyWhenNoWrittenByteIsTouchedByTheOther) {
  using ag::gpu::byte_copy;
  using ag::gpu::copies_independent;
  alignas(16) static std::byte a[256], b[256];
  const byte_copy first{a, b, 16};
  EXPECT_TRUE(copies_independent(first, byte_copy{a + 16, b, 16})) << "both read b, write disjoint bytes";
  EXPECT_TRUE(copies_independent(first, byte_copy{b + 16, a + 16, 16})) << "disjoint on both sides";
  EXPECT_FALSE(copies_independent(first, byte_copy{a + 15, b + 64, 4})) << "writes the last byte the first writes";
  EXPECT_FALSE(copies_independent(first, byte_copy{b + 64, a + 8, 4})) << "reads bytes the first writes";
  EXPECT_FALSE(copies_independent(first, byte_copy{b + 8, a + 64, 4})) << "writes bytes the first reads";
  EXPECT_FALSE(copies_independent(byte_copy{b + 8, a + 64, 4}, first)) << "the same, in the other order";
  EXPECT_TRUE(copies_independent(first, byte_copy{b, a, 0})) << "an empty copy touches nothing";
  EXPECT_TRUE(copies_independent(first, byte_copy{a + 16, b + 32, 8})) << "adjacent, not overlapping";
}

}  // namespace
