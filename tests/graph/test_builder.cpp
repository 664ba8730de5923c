// graph_builder: node records, default names, layouts of views, first-error
// semantics, outputs / pins / layers, DOT output.
#include <gtest/gtest.h>

#include "graph/graph.hpp"

namespace ag {
namespace {

TEST(Builder, BuildsNodesInOrderWithDefaultNamesAndConsumers) {
  graph_builder b;
  auto x = b.input("x", dtype::f32, {8, 16});
  auto w = b.weight("w", host_tensor::random_normal(dtype::f32, {16, 4}, 1));
  auto y = b.matmul(x, w);
  auto z = b.gelu(y, gelu_mode::tanh, "act");
  b.output(z);
  EXPECT_EQ(b.info(y).name, "matmul_2");
  EXPECT_EQ(b.info(y).dims, (shape{8, 4}));
  EXPECT_TRUE(b.status().ok());
  auto g = std::move(b).build();
  ASSERT_TRUE(g) << g.err().to_string();
  ASSERT_EQ(g->size(), 4u);
  EXPECT_EQ(g->inputs(), std::vector<node_id>{0});
  EXPECT_EQ(g->outputs(), std::vector<node_id>{3});
  EXPECT_EQ(g->find("act"), 3);
  EXPECT_EQ(g->find("matmul_2"), 2);
  EXPECT_EQ(g->find("nope"), no_node);
  EXPECT_EQ(g->consumers(0), std::vector<node_id>{2});
  EXPECT_EQ(g->consumers(1), std::vector<node_id>{2});
  EXPECT_EQ(g->consumers(2), std::vector<node_id>{3});
  EXPECT_TRUE(g->consumers(3).empty());
  for (const node& n : g->nodes()) {
    EXPECT_EQ(n.storage, n.id);
    EXPECT_TRUE(n.contiguous());
  }
  EXPECT_EQ(g->weight_bytes(), 16 * 4 * 4);
  EXPECT_EQ(g->at(1).type, dtype::f32);
  EXPECT_EQ(g->at(1).dims, (shape{16, 4}));
}

TEST(Builder, DefaultNameAvoidsAnExplicitNameTakenEarlier) {
  graph_builder b;
  auto x = b.input("scale_1", dtype::f32, {2});
  auto y = b.scale(x, 2.0f);
  b.output(y);
  EXPECT_NE(b.info(y).name, "scale_1");
  EXPECT_TRUE(b.status().ok()) << b.status().to_string();
}

TEST(Builder, ViewsAliasStorageWithComposedLayout) {
  graph_builder b;
  auto x = b.input("x", dtype::f16, {2, 3, 4});
  auto t = b.transpose(x, 0, -1, "t");            // [4, 3, 2], strides [1, 4, 12]
  auto s = b.slice(t, 1, 1, 3, "s");              // [4, 2, 2], offset 4
  auto p = b.permute(s, {2, 0, 1, 0}, "p");       // [2, 4, 2], strides [12, 1, 4]
  auto r = b.reshape(x, {6, 4}, "r");
  auto c = b.contiguous(p, "c");
  b.output(c);
  b.output(r);
  const node& tn = b.info(t);
  EXPECT_EQ(tn.dims, (shape{4, 3, 2}));
  EXPECT_EQ(tn.stride, (strides{1, 4, 12, 0}));
  EXPECT_EQ(tn.storage, x.id());
  EXPECT_EQ(tn.type, dtype::f16);
  EXPECT_EQ(tn.own_bytes(), 0);
  const node& sn = b.info(s);
  EXPECT_EQ(sn.dims, (shape{4, 2, 2}));
  EXPECT_EQ(sn.offset, 4);
  EXPECT_EQ(sn.storage, x.id());
  const node& pn = b.info(p);
  EXPECT_EQ(pn.dims, (shape{2, 4, 2}));
  EXPECT_EQ(pn.stride[0], 12);
  EXPECT_EQ(pn.stride[1], 1);
  EXPECT_EQ(pn.stride[2], 4);
  EXPECT_EQ(pn.offset, 4);
  EXPECT_TRUE(pn.is_view());
  EXPECT_FALSE(pn.contiguous());
  const node& rn = b.info(r);
  EXPECT_TRUE(rn.contiguous());
  EXPECT_EQ(rn.storage, x.id());
  const node& cn = b.info(c);
  EXPECT_EQ(cn.op, op_kind::copy);
  EXPECT_EQ(cn.type, dtype::f16);
  EXPECT_EQ(cn.storage, c.id());
  EXPECT_TRUE(cn.contiguous());
  EXPECT_EQ(cn.own_bytes(), 2 * 4 * 2 * 2);
  EXPECT_TRUE(std::move(b).build());
}

TEST(Builder, FirstErrorIsKeptAndLaterCallsReturnInvalidTensors) {
  graph_builder b;
  auto x = b.input("x", dtype::f32, {4, 8});
  auto w = b.input("w", dtype::f32, {7, 2});
  auto bad = b.matmul(x, w, false, false, "proj");
  EXPECT_FALSE(bad.valid());
  EXPECT_EQ(b.status().code, errc::invalid_shape);
  auto later = b.scale(x, 2.0f);  // fine by itself, but the builder has failed
  EXPECT_FALSE(later.valid());
  auto y = b.add(x, w, "another_bad_one");
  EXPECT_FALSE(y.valid());
  b.output(x);
  auto g = std::move(b).build();
  ASSERT_FALSE(g);
  EXPECT_EQ(g.err().code, errc::invalid_shape);
  EXPECT_NE(g.err().message.find("proj"), std::string::npos) << g.err().message;
}

TEST(Builder, InvalidTensorArgumentIsMissingInput) {
  graph_builder b;
  auto x = b.input("x", dtype::f32, {4});
  auto y = b.add(x, tensor(), "sum");
  EXPECT_FALSE(y.valid());
  EXPECT_EQ(b.status().code, errc::missing_input);
  EXPECT_NE(b.status().message.find("sum"), std::string::npos) << b.status().message;
}

TEST(Builder, TensorFromAnotherBuilderIsRejected) {
  graph_builder b1, b2;
  auto x1 = b1.input("x", dtype::f32, {4});
  auto x2 = b2.input("x", dtype::f32, {4});
  ASSERT_TRUE(x1.valid());
  ASSERT_TRUE(x2.valid());
  EXPECT_EQ(x1.id(), x2.id());  // same id: only the owner tag tells them apart
  auto y = b2.add(x2, x1, "mix");
  EXPECT_FALSE(y.valid());
  EXPECT_EQ(b2.status().code, errc::unknown_input);
  EXPECT_NE(b2.status().message.find("another graph_builder"), std::string::npos) << b2.status().message;
  EXPECT_EQ(b1.info(x2).name, "");  // info of a foreign tensor: the default node
}

TEST(Builder, DuplicateExplicitNameIsAnError) {
  graph_builder b;
  auto x = b.input("x", dtype::f32, {4});
  b.scale(x, 2.0f, "h");
  auto y = b.scale(x, 3.0f, "h");
  EXPECT_FALSE(y.valid());
  EXPECT_EQ(b.status().code, errc::invalid_argument);
  EXPECT_NE(b.status().message.find("'h'"), std::string::npos) << b.status().message;
  EXPECT_NE(b.status().message.find("duplicate"), std::string::npos) << b.status().message;
}

TEST(Builder, OutputTwiceAndNoOutputAreErrors) {
  {
    graph_builder b;
    auto x = b.scale(b.input("x", dtype::f32, {4}), 2.0f);
    b.output(x);
    b.output(x);
    EXPECT_EQ(b.status().code, errc::invalid_argument);
  }
  {
    graph_builder b;
    b.scale(b.input("x", dtype::f32, {4}), 2.0f);
    auto g = std::move(b).build();
    ASSERT_FALSE(g);
    EXPECT_EQ(g.err().code, errc::invalid_argument);
  }
}

TEST(Builder, LayersAndPinsAreRecorded) {
  graph_builder b;
  auto x = b.input("x", dtype::f32, {4});
  b.set_layer(0);
  auto y = b.scale(x, 2.0f, "l0");
  b.set_layer(1);
  auto z = b.scale(y, 2.0f, "l1");
  b.set_layer(-1);
  auto o = b.silu(z, "head");
  b.pin(z, 1);
  b.output(o);
  auto g = std::move(b).build();
  ASSERT_TRUE(g) << g.err().to_string();
  EXPECT_EQ(g->at(g->find("x")).layer, -1);
  EXPECT_EQ(g->at(g->find("l0")).layer, 0);
  EXPECT_EQ(g->at(g->find("l1")).layer, 1);
  EXPECT_EQ(g->at(g->find("head")).layer, -1);
  EXPECT_EQ(g->at(g->find("l1")).pinned_device, 1);
  EXPECT_EQ(g->at(g->find("l0")).pinned_device, -1);

  graph_builder b2;
  auto x2 = b2.input("x", dtype::f32, {4});
  b2.pin(x2, -3);
  EXPECT_EQ(b2.status().code, errc::invalid_argument);
}

TEST(Builder, LayerNormWithBiasOnlyGetsAOnesWeight) {
  graph_builder b;
  auto x = b.input("x", dtype::bf16, {2, 6});
  auto bias = b.weight("bias", host_tensor::random_normal(dtype::bf16, {6}, 3));
  auto y = b.layer_norm(x, tensor(), bias, 1e-5f, "ln");
  b.output(y);
  ASSERT_TRUE(y.valid()) << b.status().to_string();
  const node& n = b.info(y);
  ASSERT_EQ(n.inputs.size(), 3u);
  auto g = std::move(b).build();
  ASSERT_TRUE(g) << g.err().to_string();
  const node& w = g->at(g->at(g->find("ln")).inputs[1]);
  EXPECT_EQ(w.op, op_kind::weight);
  EXPECT_EQ(w.name, "ln.ones");
  ASSERT_TRUE(w.data);
  EXPECT_EQ(w.type, dtype::bf16);
  for (int64_t i = 0; i < 6; ++i) EXPECT_EQ(w.data->in_memory()->at(i), 1.0f);
}

TEST(Builder, NegativeAxesAreNormalised) {
  graph_builder b;
  auto x = b.input("x", dtype::f32, {2, 3, 4});
  auto s = b.slice(x, -1, -3, -1, "s");  // last axis, [1, 3)
  auto t = b.transpose(x, -1, -3, "t");
  auto c = b.concat({x, x}, -2, "c");
  auto p = b.permute(x, {-1, 0, 1, 3}, "p");
  b.output(c);
  ASSERT_TRUE(b.status().ok()) << b.status().to_string();
  EXPECT_EQ(b.info(s).attrs.axis, 2);
  EXPECT_EQ(b.info(s).attrs.begin, 1);
  EXPECT_EQ(b.info(s).attrs.end, 3);
  EXPECT_EQ(b.info(s).dims, (shape{2, 3, 2}));
  EXPECT_EQ(b.info(t).dims, (shape{4, 3, 2}));
  EXPECT_EQ(b.info(c).attrs.axis, 1);
  EXPECT_EQ(b.info(c).dims, (shape{2, 6, 4}));
  EXPECT_EQ(b.info(p).attrs.perm[0], 2);
  EXPECT_EQ(b.info(p).dims, (shape{4, 2, 3}));
  // re-validation of the normalised attrs keeps them (from_nodes re-infers every node)
  EXPECT_TRUE(std::move(b).build());
}

TEST(Builder, OpNamesRoundTrip) {
  for (int i = 0; i < op_kind_count; ++i) {
    const auto k = static_cast<op_kind>(i);
    op_kind back = op_kind::input;
    ASSERT_TRUE(parse_op_kind(to_string(k), back)) << to_string(k);
    EXPECT_EQ(back, k);
  }
  op_kind out = op_kind::add;
  EXPECT_FALSE(parse_op_kind("matmull", out));
  EXPECT_EQ(out, op_kind::add);
  EXPECT_STREQ(to_string(op_kind::rms_norm), "rms_norm");
  EXPECT_STREQ(to_string(op_kind::get_rows), "get_rows");
}

TEST(Builder, DotHasEveryNodeEdgeAndHighlightsOutputs) {
  graph_builder b;
  auto x = b.input("x\"quoted", dtype::f32, {2, 3});
  auto w = b.weight("w", host_tensor::random_normal(dtype::f32, {3, 5}, 7));
  auto y = b.matmul(x, w, false, false, "y");
  auto t = b.transpose(y, 0, 1, "yt");
  b.output(b.contiguous(t, "out"));
  auto g = std::move(b).build();
  ASSERT_TRUE(g);
  const std::string dot = g->to_dot();
  EXPECT_EQ(dot.rfind("digraph", 0), 0u);
  for (const char* want : {"n0 [", "n1 [", "n2 [", "n3 [", "n4 [", "n0 -> n2;", "n1 -> n2;", "n2 -> n3;",
                           "n3 -> n4;", "x\\\"quoted", "matmul f32 [2, 5]", "transpose f32 [5, 2]",
                           "view of y"})
    EXPECT_NE(dot.find(want), std::string::npos) << want << "\n" << dot;
  // only the output node is highlighted
  const auto out_line = dot.substr(dot.find("n4 ["), dot.find('\n', dot.find("n4 [")) - dot.find("n4 ["));
  EXPECT_NE(out_line.find("penwidth=2"), std::string::npos) << out_line;
  EXPECT_EQ(dot.find("penwidth=2"), dot.rfind("penwidth=2"));
  EXPECT_EQ(dot.find("n0 -> n1"), std::string::npos);
}

}  // namespace
}  // namespace ag
