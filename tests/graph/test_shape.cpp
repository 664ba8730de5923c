#include <gtest/gtest.h>

#include "counting_host_memory.hpp"
#include "graph/graph.hpp"
#include "graph/host_tensor.hpp"

#include <stdexcept>
#include <vector>

namespace {

TEST(Shape, MoreThanFourDimsIsInvalidAndRejectedByTheBuilder) {
  ag::shape s{1, 2, 3, 4, 5};
  EXPECT_EQ(s.rank(), -5);
  EXPECT_FALSE(s.valid_rank());
  EXPECT_EQ(s.to_string(), "[1, 2, 3, 4, ... (5 dims)]");
  std::vector<int64_t> six{1, 2, 3, 4, 5, 6};
  EXPECT_EQ(ag::shape::from_range(six.begin(), six.end()).rank(), -6);  // not silently cut to 4
  ag::graph_builder b;
  auto x = b.input("too_deep", ag::dtype::f32, {1, 2, 3, 4, 5});
  EXPECT_FALSE(x.valid());
  auto g = std::move(b).build();
  ASSERT_FALSE(g.has_value());
  EXPECT_EQ(g.err().code, ag::errc::invalid_shape);
  EXPECT_NE(g.err().message.find("too_deep"), std::string::npos) << g.err().to_string();
  // The rank as given, not "rank -1" (issue 13)
  EXPECT_NE(g.err().message.find("5 dimensions, at most 4"), std::string::npos) << g.err().to_string();
  EXPECT_EQ(g.err().message.find("-1"), std::string::npos) << g.err().to_string();
}

TEST(Shape, CheckedArithmeticRefusesWhatDoesNotFitInt64) {
  int64_t n = 0;
  EXPECT_TRUE(ag::checked_numel(ag::shape{3, 4, 5}, n));
  EXPECT_EQ(n, 60);
  EXPECT_TRUE(ag::checked_numel(ag::shape{int64_t{1} << 31, int64_t{1} << 31}, n));
  EXPECT_EQ(n, int64_t{1} << 62);
  EXPECT_FALSE(ag::checked_bytes(ag::shape{int64_t{1} << 31, int64_t{1} << 31}, 4, n));  // 2^64 bytes
  EXPECT_FALSE(ag::checked_numel(ag::shape{int64_t{1} << 32, int64_t{1} << 32}, n));    // 2^64 elements
  EXPECT_FALSE(ag::checked_numel(ag::shape{2, -3}, n));
  EXPECT_FALSE(ag::checked_numel(ag::shape{1, 2, 3, 4, 5}, n));
  EXPECT_TRUE(ag::checked_max_index(ag::shape{4, 8}, {8, 1}, 3, n));
  EXPECT_EQ(n, 3 + 3 * 8 + 7);
  EXPECT_FALSE(ag::checked_max_index(ag::shape{3, 2}, {int64_t{1} << 62, 1}, 0, n));
  EXPECT_FALSE(ag::checked_max_index(ag::shape{2}, {1}, INT64_MAX, n));
  // exact counts past 64 bits, for error messages
  EXPECT_EQ(ag::numel_string(ag::shape{int64_t{1} << 31, int64_t{1} << 31}, 4), "18446744073709551616");
  EXPECT_EQ(ag::numel_string(ag::shape{INT64_MAX, INT64_MAX}), "85070591730234615847396907784232501249");
  EXPECT_EQ(ag::numel_string(ag::shape{2, -3}), "-6");
  EXPECT_EQ(ag::numel_string(ag::shape{7, 0}), "0");
}

TEST(HostTensor, CheckedFactoriesReturnErrorsInsteadOfThrowing) {
  auto ok = ag::host_tensor::create(ag::dtype::f16, {3, 5});
  ASSERT_TRUE(ok.has_value()) << ok.err().to_string();
  EXPECT_EQ(ok->bytes(), 30u);
  for (int64_t i = 0; i < ok->numel(); ++i) EXPECT_EQ(ok->at(i), 0.0f);
  auto empty = ag::host_tensor::create_uninitialized(ag::dtype::f32, {0, 4});
  ASSERT_TRUE(empty.has_value());
  EXPECT_EQ(empty->bytes(), 0u);
  // 2^64 bytes: the constructor would throw std::length_error
  auto overflow = ag::host_tensor::create(ag::dtype::f32, {int64_t{1} << 31, int64_t{1} << 31});
  ASSERT_FALSE(overflow.has_value());
  EXPECT_EQ(overflow.err().code, ag::errc::invalid_shape);
  EXPECT_NE(overflow.err().message.find("18446744073709551616"), std::string::npos) << overflow.err().message;
  // More than this host has: refused with the size, before trying
  const int64_t elems = ag::host_memory_bytes() / 4 + 1;
  auto huge = ag::host_tensor::create_uninitialized(ag::dtype::f32, {elems});
  ASSERT_FALSE(huge.has_value());
  EXPECT_EQ(huge.err().code, ag::errc::out_of_memory);
  EXPECT_NE(huge.err().message.find(std::to_string(elems * 4)), std::string::npos) << huge.err().message;
  EXPECT_EQ(ag::host_tensor::create(ag::dtype::f32, {2, -1}).err().code, ag::errc::invalid_shape);
  EXPECT_EQ(ag::host_tensor::create(ag::dtype::f32, {1, 2, 3, 4, 5}).err().code, ag::errc::invalid_shape);
  EXPECT_EQ(ag::host_tensor::create(static_cast<ag::dtype>(9), {2}).err().code, ag::errc::invalid_argument);
}

TEST(HostTensor, ImpossibleSizesNeverWrap) {
  const ag::shape huge{int64_t{1} << 31, int64_t{1} << 31};  // 2^64 bytes of f32: wrapped to 0 before
  EXPECT_THROW(ag::host_tensor(ag::dtype::f32, huge), std::length_error);
  EXPECT_THROW(ag::host_tensor::uninitialized(ag::dtype::f32, huge), std::length_error);
  // value factories: dims kept, no bytes, nothing written past the end (this
  // was a segfault in the REPL: "graph w=weight[2147483648,2147483648] ...")
  auto w = ag::host_tensor::random_normal(ag::dtype::f32, huge, 1);
  EXPECT_EQ(w.dims(), huge);
  EXPECT_EQ(w.bytes(), 0u);
  EXPECT_EQ(w.stored_elements(), 0);
  EXPECT_TRUE(w.to_floats().empty());
  ag::graph_builder b;
  b.weight("w", std::move(w));
  EXPECT_EQ(b.status().code, ag::errc::invalid_shape);
  EXPECT_NE(b.status().message.find("weight 'w'"), std::string::npos) << b.status().message;
  // possible in principle, but more than this host has: refused by name too
  const int64_t elems = ag::host_memory_bytes() / 4 + 1;
  auto big = ag::host_tensor::random_uniform(ag::dtype::f32, {elems}, 2);
  EXPECT_EQ(big.bytes(), 0u);
  ag::graph_builder c;
  c.weight("big", std::move(big));
  EXPECT_EQ(c.status().code, ag::errc::invalid_argument);
  EXPECT_NE(c.status().message.find("more than this host's"), std::string::npos) << c.status().message;
  // comparing a tensor whose bytes do not match its dims says so
  auto good = ag::host_tensor::from_floats(ag::dtype::f32, {2}, {1, 2});
  ag::host_tensor odd;
  odd.reset(ag::dtype::f32, {2}, ag::byte_buffer(4));
  auto r = ag::compare(odd, good, 0, 0);
  EXPECT_FALSE(r.ok);
  EXPECT_NE(r.message.find("holds 4 bytes"), std::string::npos) << r.message;
}

TEST(HostTensor, HostMemoryIsKnown) {
  // at least 64 MiB and at most 2^62: a real figure, not a placeholder
  EXPECT_GE(ag::host_memory_bytes(), int64_t{64} << 20);
  EXPECT_LE(ag::host_memory_bytes(), ag::max_tensor_bytes);
}

TEST(Shape, ContiguityIgnoresSizeOneDims) {
  ag::shape s{4, 1, 8};
  ag::strides st = ag::contiguous_strides(s);
  EXPECT_EQ(st[0], 8);
  EXPECT_EQ(st[2], 1);
  st[1] = 12345;  // stride of a size-1 dim never matters
  EXPECT_TRUE(ag::is_contiguous(s, st));
  st[0] = 9;
  EXPECT_FALSE(ag::is_contiguous(s, st));
}

}  // namespace

namespace {

TEST(HostTensor, ZeroFilledByDefaultAndUninitializedHasTheRightSize) {
  ag::host_tensor z(ag::dtype::bf16, {3, 5});
  ASSERT_EQ(z.bytes(), 30u);
  for (int64_t i = 0; i < z.numel(); ++i) EXPECT_EQ(z.at(i), 0.0f);
  auto u = ag::host_tensor::uninitialized(ag::dtype::f32, {7, 9});
  EXPECT_EQ(u.bytes(), 7u * 9u * 4u);
  EXPECT_EQ(u.dims(), (ag::shape{7, 9}));
  u.set(62, 1.5f);
  EXPECT_EQ(u.at(62), 1.5f);
}

// Storage from a host_memory_resource: the bytes come from it, a move keeps
// them there, a copy is heap memory with equal contents, and every buffer goes
// back to the resource exactly once, with the size it was allocated with.
TEST(HostTensor, ResourceStorageFollowsMovesAndCopiesAreHeap) {
  ag::test::counting_host_memory mem;
  {
    auto t = ag::host_tensor::uninitialized(ag::dtype::f32, {64, 33}, &mem);
    EXPECT_EQ(t.memory(), &mem);
    EXPECT_TRUE(mem.owns(t.data()));
    EXPECT_EQ(t.bytes(), 64u * 33u * 4u);
    for (int64_t i = 0; i < t.numel(); ++i) t.set(i, static_cast<float>(i % 17) - 8.0f);

    ag::host_tensor copy = t;
    EXPECT_EQ(copy.memory(), nullptr);
    EXPECT_FALSE(mem.owns(copy.data()));
    EXPECT_TRUE(copy == t);

    const std::byte* bytes = t.data();
    ag::host_tensor moved = std::move(t);
    EXPECT_EQ(moved.data(), bytes);
    EXPECT_EQ(moved.memory(), &mem);

    // Move-assigning over a heap tensor frees the heap bytes and adopts the
    // resource's buffer; copy-assigning into it keeps its own storage.
    ag::host_tensor heap(ag::dtype::f32, {2, 2});
    heap = std::move(moved);
    EXPECT_EQ(heap.data(), bytes);
    EXPECT_EQ(heap.memory(), &mem);
    ag::host_tensor other = ag::host_tensor::uninitialized(ag::dtype::f32, {64, 33}, &mem);
    const std::byte* other_bytes = other.data();
    other = copy;
    EXPECT_EQ(other.data(), other_bytes);
    EXPECT_TRUE(other == copy);
    EXPECT_EQ(mem.live(), 2u);
  }
  EXPECT_EQ(mem.live(), 0u);
  EXPECT_EQ(mem.allocations(), 2);
  EXPECT_EQ(mem.bad_deallocations(), 0);
}

}  // namespace
