#include <gtest/gtest.h>

#include "counting_host_memory.hpp"
#include "graph/graph.hpp"

namespace {

TEST(Shape, MoreThanFourDimsIsInvalidAndRejectedByTheBuilder) {
  ag::shape s{1, 2, 3, 4, 5};
  EXPECT_EQ(s.rank(), -1);
  ag::graph_builder b;
  auto x = b.input("too_deep", ag::dtype::f32, {1, 2, 3, 4, 5});
  EXPECT_FALSE(x.valid());
  auto g = std::move(b).build();
  ASSERT_FALSE(g.has_value());
  EXPECT_NE(g.err().message.find("too_deep"), std::string::npos) << g.err().to_string();
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
