#include <gtest/gtest.h>

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

}  // namespace
