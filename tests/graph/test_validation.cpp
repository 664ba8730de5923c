// Validation: each kind of bad graph is rejected with a fitting errc and a
// message that names the node; graph::from_nodes on raw node lists.
#include <gtest/gtest.h>

#include <algorithm>

#include "graph/graph.hpp"
#include "graph/host_tensor.hpp"

namespace ag {
namespace {

// The message holds every one of `parts`.
void expect_message(const error& e, std::initializer_list<const char*> parts) {
  for (const char* p : parts) EXPECT_NE(e.message.find(p), std::string::npos) << "'" << p << "' not in: " << e.message;
}

TEST(Validation, MatmulInnerDimMismatchNamesNodeAndShapes) {
  graph_builder b;
  auto a = b.input("a", dtype::f32, {2, 8, 64});
  auto w = b.input("w", dtype::f32, {32, 16});
  b.matmul(a, w, false, false, "attn.qk");
  EXPECT_EQ(b.status().code, errc::invalid_shape);
  expect_message(b.status(), {"matmul 'attn.qk'", "[2, 8, 64]", "K=64", "[32, 16]", "K=32"});
}

TEST(Validation, MatmulRankBatchAndDtypeRules) {
  {
    graph_builder b;
    auto a = b.input("a", dtype::f32, {8});
    auto w = b.input("w", dtype::f32, {8, 4});
    b.matmul(a, w, false, false, "mm");
    EXPECT_EQ(b.status().code, errc::invalid_shape);
    expect_message(b.status(), {"'mm'", "rank >= 2"});
  }
  {
    graph_builder b;
    auto a = b.input("a", dtype::f32, {2, 3, 4});
    auto w = b.input("w", dtype::f32, {3, 4, 5});
    b.matmul(a, w, false, false, "mm");
    EXPECT_EQ(b.status().code, errc::invalid_shape);
    expect_message(b.status(), {"'mm'", "broadcast"});
  }
  {
    graph_builder b;
    auto a = b.input("a", dtype::f32, {3, 4});
    auto w = b.input("w", dtype::f16, {4, 5});
    b.matmul(a, w, false, false, "mm");
    EXPECT_EQ(b.status().code, errc::dtype_mismatch);
    expect_message(b.status(), {"'mm'", "f16", "f32"});
  }
  {
    graph_builder b;
    auto a = b.input("a", dtype::i32, {3, 4});
    auto w = b.input("w", dtype::i32, {4, 5});
    b.matmul(a, w, false, false, "mm");
    EXPECT_EQ(b.status().code, errc::dtype_mismatch);
  }
  {  // transposes change which dims must agree
    graph_builder b;
    auto a = b.input("a", dtype::f32, {4, 3});
    auto w = b.input("w", dtype::f32, {5, 4});
    auto y = b.matmul(a, w, true, true, "mm");
    ASSERT_TRUE(y.valid()) << b.status().to_string();
    EXPECT_EQ(b.info(y).dims, (shape{3, 5}));
  }
}

TEST(Validation, ElementwiseBroadcastAndDtype) {
  {
    graph_builder b;
    auto a = b.input("a", dtype::f32, {2, 3});
    auto c = b.input("c", dtype::f32, {2});
    b.add(a, c, "bias_add");
    EXPECT_EQ(b.status().code, errc::invalid_shape);
    expect_message(b.status(), {"add 'bias_add'", "[2]", "[2, 3]"});
  }
  {  // b may not have higher rank than a (output dims are a's)
    graph_builder b;
    auto a = b.input("a", dtype::f32, {3});
    auto c = b.input("c", dtype::f32, {2, 3});
    b.mul(a, c, "m");
    EXPECT_EQ(b.status().code, errc::invalid_shape);
  }
  {
    graph_builder b;
    auto a = b.input("a", dtype::f32, {2, 3});
    auto c = b.input("c", dtype::bf16, {3});
    b.add(a, c, "mix");
    EXPECT_EQ(b.status().code, errc::dtype_mismatch);
    expect_message(b.status(), {"add 'mix'", "bf16"});
  }
  {
    graph_builder b;
    auto ids = b.input("ids", dtype::i32, {3});
    b.gelu(ids, gelu_mode::erf, "g");
    EXPECT_EQ(b.status().code, errc::dtype_mismatch);
  }
}

TEST(Validation, NormWeightShapeAndDtype) {
  {
    graph_builder b;
    auto x = b.input("x", dtype::f32, {2, 8});
    auto w = b.weight("w", host_tensor::random_normal(dtype::f32, {4}, 1));
    b.rms_norm(x, w, 1e-6f, "norm");
    EXPECT_EQ(b.status().code, errc::invalid_shape);
    expect_message(b.status(), {"rms_norm 'norm'", "[4]", "[8]"});
  }
  {
    graph_builder b;
    auto x = b.input("x", dtype::f32, {2, 8});
    auto w = b.weight("w", host_tensor::random_normal(dtype::f16, {8}, 1));
    b.layer_norm(x, w, tensor(), 1e-5f, "ln");
    EXPECT_EQ(b.status().code, errc::dtype_mismatch);
  }
}

TEST(Validation, SoftmaxCausalNeedsKeysAtLeastQueries) {
  graph_builder b;
  auto x = b.input("x", dtype::f32, {4, 2});
  b.softmax(x, true, 1.0f, "attn");
  EXPECT_EQ(b.status().code, errc::invalid_shape);
  expect_message(b.status(), {"softmax 'attn'", "Sk >= Sq"});
}

TEST(Validation, ArgmaxTakesFloatsAndGivesI32RowsOfOne) {
  {
    graph_builder b;
    auto x = b.input("ids", dtype::i32, {4, 7});
    b.argmax(x, "pick");
    EXPECT_EQ(b.status().code, errc::dtype_mismatch);
    expect_message(b.status(), {"argmax 'pick'", "x"});
  }
  {
    graph_builder b;
    b.argmax(b.input("huge", dtype::f32, {1, int64_t{1} << 31}), "pick");
    EXPECT_EQ(b.status().code, errc::invalid_shape);
    expect_message(b.status(), {"argmax 'pick'", "i32 index"});
  }
  graph_builder b;
  auto y = b.argmax(b.input("logits", dtype::bf16, {2, 3, 50}), "pick");
  ASSERT_TRUE(y.valid()) << b.status().to_string();
  b.output(y);
  auto g = std::move(b).build();
  ASSERT_TRUE(g) << g.err().to_string();
  const node& n = g->at(g->outputs()[0]);
  EXPECT_EQ(n.type, dtype::i32);
  EXPECT_EQ(n.dims, (shape{2, 3, 1}));
}

TEST(Validation, RopeShapeAndPositions) {
  {
    graph_builder b;
    auto x = b.input("x", dtype::f32, {4, 2, 5});
    auto p = b.input("p", dtype::i32, {4});
    b.rope(x, p, 10000.0f, rope_mode::neox, "q_rot");
    EXPECT_EQ(b.status().code, errc::invalid_shape);
    expect_message(b.status(), {"rope 'q_rot'", "even"});
  }
  {
    graph_builder b;
    auto x = b.input("x", dtype::f32, {4, 8});
    auto p = b.input("p", dtype::i32, {4});
    b.rope(x, p, 10000.0f, rope_mode::neox, "r");
    EXPECT_EQ(b.status().code, errc::invalid_shape);
  }
  {
    graph_builder b;
    auto x = b.input("x", dtype::f32, {4, 2, 8});
    auto p = b.input("p", dtype::f32, {4});
    b.rope(x, p, 10000.0f, rope_mode::neox, "r");
    EXPECT_EQ(b.status().code, errc::dtype_mismatch);
  }
  {
    graph_builder b;
    auto x = b.input("x", dtype::f32, {4, 2, 8});
    auto p = b.input("p", dtype::i32, {3});
    b.rope(x, p, 10000.0f, rope_mode::neox, "r");
    EXPECT_EQ(b.status().code, errc::invalid_shape);
    expect_message(b.status(), {"[3]", "[4]"});
  }
}

TEST(Validation, GetRowsTableAndIds) {
  {
    graph_builder b;
    auto t = b.weight("emb", host_tensor::random_normal(dtype::f32, {10, 4}, 1));
    auto ids = b.input("ids", dtype::f32, {3});
    b.get_rows(t, ids, "embed");
    EXPECT_EQ(b.status().code, errc::dtype_mismatch);
    expect_message(b.status(), {"get_rows 'embed'", "i32"});
  }
  {
    graph_builder b;
    auto t = b.weight("emb", host_tensor::random_normal(dtype::f32, {10, 4, 2}, 1));
    auto ids = b.input("ids", dtype::i32, {3});
    b.get_rows(t, ids, "embed");
    EXPECT_EQ(b.status().code, errc::invalid_shape);
  }
  {
    graph_builder b;
    auto t = b.weight("emb", host_tensor::random_normal(dtype::f32, {10, 4}, 1));
    auto ids = b.input("ids", dtype::i32, {1, 2, 3, 4});
    b.get_rows(t, ids, "embed");
    EXPECT_EQ(b.status().code, errc::invalid_shape);
  }
}

TEST(Validation, BadAxesAndPermutations) {
  auto check = [](auto make, errc want, const char* name) {
    graph_builder b;
    auto x = b.input("x", dtype::f32, {2, 3, 4});
    make(b, x);
    EXPECT_EQ(b.status().code, want) << name << ": " << b.status().to_string();
    EXPECT_NE(b.status().message.find(std::string("'") + name + "'"), std::string::npos) << b.status().message;
  };
  check([](graph_builder& b, tensor x) { b.transpose(x, 0, 3, "t"); }, errc::invalid_argument, "t");
  check([](graph_builder& b, tensor x) { b.transpose(x, -4, 1, "t"); }, errc::invalid_argument, "t");
  check([](graph_builder& b, tensor x) { b.permute(x, {0, 0, 1, 3}, "p"); }, errc::invalid_argument, "p");
  check([](graph_builder& b, tensor x) { b.permute(x, {0, 1, 3, 2}, "p"); }, errc::invalid_argument, "p");
  check([](graph_builder& b, tensor x) { b.slice(x, 3, 0, 1, "s"); }, errc::invalid_argument, "s");
  check([](graph_builder& b, tensor x) { b.slice(x, 1, 2, 2, "s"); }, errc::invalid_argument, "s");
  check([](graph_builder& b, tensor x) { b.slice(x, 1, 0, 4, "s"); }, errc::invalid_argument, "s");
  check([](graph_builder& b, tensor x) { b.concat({x, x}, 3, "c"); }, errc::invalid_argument, "c");
  check([](graph_builder& b, tensor x) { b.concat({x, b.slice(x, 1, 0, 2)}, 2, "c"); }, errc::invalid_shape, "c");
  check([](graph_builder& b, tensor x) { b.concat({x, b.copy(x, dtype::f16)}, 0, "c"); }, errc::dtype_mismatch,
        "c");
}

TEST(Validation, ReshapeNeedsContiguousSourceAndSameCount) {
  {
    graph_builder b;
    auto x = b.input("x", dtype::f32, {2, 3});
    auto t = b.transpose(x, 0, 1, "xt");
    b.reshape(t, {6}, "flat");
    EXPECT_EQ(b.status().code, errc::invalid_shape);
    expect_message(b.status(), {"reshape 'flat'", "'xt'", "not contiguous"});
  }
  {
    graph_builder b;
    auto x = b.input("x", dtype::f32, {2, 3});
    b.reshape(x, {7}, "flat");
    EXPECT_EQ(b.status().code, errc::invalid_shape);
    expect_message(b.status(), {"[2, 3]", "[7]"});
  }
  {  // a slice along the outermost axis stays contiguous: reshape is fine
    graph_builder b;
    auto x = b.input("x", dtype::f32, {4, 3});
    auto s = b.slice(x, 0, 1, 3);
    auto r = b.reshape(s, {6});
    ASSERT_TRUE(r.valid()) << b.status().to_string();
    EXPECT_EQ(b.info(r).offset, 3);
  }
}

TEST(Validation, ViewMustStayInsideStorage) {
  graph_builder b;
  auto x = b.input("x", dtype::f32, {3, 4});
  auto ok = b.view(x, {2, 2}, {4, 1, 0, 0}, 6, "ok");  // last element 6 + 4 + 1 = 11
  ASSERT_TRUE(ok.valid()) << b.status().to_string();
  b.view(x, {2, 2}, {4, 1, 0, 0}, 7, "too_far");  // reaches 12
  EXPECT_EQ(b.status().code, errc::invalid_shape);
  expect_message(b.status(), {"view 'too_far'", "12"});
}

TEST(Validation, InputShapesMustHaveRankOneToFourAndPositiveDims) {
  {
    graph_builder b;
    b.input("scalar", dtype::f32, shape{});
    EXPECT_EQ(b.status().code, errc::invalid_shape);
    expect_message(b.status(), {"input 'scalar'", "rank 0"});
  }
  {
    graph_builder b;
    b.input("empty", dtype::f32, {3, 0});
    EXPECT_EQ(b.status().code, errc::invalid_shape);
  }
}

// ---- graph::from_nodes on raw node lists ----

node raw(node_id id, op_kind op, std::string name, std::vector<node_id> inputs = {}) {
  node n;
  n.id = id;
  n.op = op;
  n.name = std::move(name);
  n.inputs = std::move(inputs);
  return n;
}

node raw_input(node_id id, std::string name, shape dims) {
  node n = raw(id, op_kind::input, std::move(name));
  n.dims = dims;
  return n;
}

TEST(FromNodes, RenumbersTopologicallyKeepingNames) {
  // consumers listed before their inputs, with sparse ids
  std::vector<node> nodes;
  nodes.push_back(raw(50, op_kind::silu, "out", {40}));
  nodes.push_back(raw(40, op_kind::add, "sum", {10, 30}));
  nodes.push_back(raw_input(30, "b", {4}));
  nodes.push_back(raw_input(10, "a", {2, 4}));
  auto g = graph::from_nodes(nodes, {10, 30}, {50});
  ASSERT_TRUE(g) << g.err().to_string();
  ASSERT_EQ(g->size(), 4u);
  // stable: among ready nodes, the earliest listed first ("b" before "a")
  EXPECT_EQ(g->at(0).name, "b");
  EXPECT_EQ(g->at(1).name, "a");
  EXPECT_EQ(g->at(2).name, "sum");
  EXPECT_EQ(g->at(3).name, "out");
  for (const node& n : g->nodes()) {
    EXPECT_EQ(n.id, &n - g->nodes().data());
    for (node_id in : n.inputs) EXPECT_LT(in, n.id);
  }
  EXPECT_EQ(g->at(2).inputs, (std::vector<node_id>{1, 0}));
  EXPECT_EQ(g->at(2).dims, (shape{2, 4}));
  EXPECT_EQ(g->inputs(), (std::vector<node_id>{1, 0}));
  EXPECT_EQ(g->outputs(), std::vector<node_id>{3});
  EXPECT_EQ(g->consumers(0), std::vector<node_id>{2});
}

TEST(FromNodes, RoundTripsABuiltGraph) {
  graph_builder b;
  auto x = b.input("x", dtype::f32, {2, 3, 4});
  auto p = b.permute(x, {1, 2, 0, 3});
  auto s = b.slice(p, 1, 1, 4);
  auto c = b.contiguous(s);
  b.output(b.softmax(c, false, 0.5f));
  auto g = std::move(b).build();
  ASSERT_TRUE(g);
  std::vector<node> nodes = g->nodes();
  std::reverse(nodes.begin(), nodes.end());
  auto g2 = graph::from_nodes(nodes, g->inputs(), g->outputs());
  ASSERT_TRUE(g2) << g2.err().to_string();
  ASSERT_EQ(g2->size(), g->size());
  for (std::size_t i = 0; i < g->size(); ++i) {
    const node& a = g->nodes()[i];
    const node& c2 = g2->nodes()[i];
    EXPECT_EQ(a.name, c2.name);
    EXPECT_EQ(a.dims, c2.dims);
    EXPECT_EQ(a.stride, c2.stride);
    EXPECT_EQ(a.offset, c2.offset);
    EXPECT_EQ(a.storage, c2.storage);
    EXPECT_EQ(a.attrs, c2.attrs);
  }
}

TEST(FromNodes, UnknownInputId) {
  std::vector<node> nodes{raw_input(0, "x", {4}), raw(1, op_kind::add, "sum", {0, 7})};
  auto g = graph::from_nodes(nodes, {0}, {1});
  ASSERT_FALSE(g);
  EXPECT_EQ(g.err().code, errc::unknown_input);
  expect_message(g.err(), {"add 'sum'", "7"});
}

TEST(FromNodes, MissingInputArity) {
  std::vector<node> nodes{raw_input(0, "x", {4}), raw(1, op_kind::matmul, "proj", {0})};
  auto g = graph::from_nodes(nodes, {0}, {1});
  ASSERT_FALSE(g);
  EXPECT_EQ(g.err().code, errc::missing_input);
  expect_message(g.err(), {"matmul 'proj'", "1 inputs", "2"});

  std::vector<node> too_many{raw_input(0, "x", {4}), raw(1, op_kind::silu, "act", {0, 0})};
  auto g2 = graph::from_nodes(too_many, {0}, {1});
  ASSERT_FALSE(g2);
  EXPECT_EQ(g2.err().code, errc::invalid_argument);
}

TEST(FromNodes, CycleNamesANodeOnIt) {
  // x -> a -> b -> c -> a, and d hangs off the cycle
  std::vector<node> nodes{raw_input(0, "x", {4}), raw(1, op_kind::add, "a", {0, 3}), raw(2, op_kind::silu, "b", {1}),
                          raw(3, op_kind::silu, "c", {2}), raw(4, op_kind::silu, "d", {3})};
  auto g = graph::from_nodes(nodes, {0}, {4});
  ASSERT_FALSE(g);
  EXPECT_EQ(g.err().code, errc::cycle);
  const std::string& m = g.err().message;
  EXPECT_NE(m.find("cycle"), std::string::npos) << m;
  const bool names_member = m.find("'a'") != std::string::npos && m.find("'b'") != std::string::npos &&
                            m.find("'c'") != std::string::npos;
  EXPECT_TRUE(names_member) << m;
  EXPECT_EQ(m.find("'d'"), std::string::npos) << m;  // d is downstream, not on the cycle
  EXPECT_EQ(m.find("'x'"), std::string::npos) << m;

  std::vector<node> self{raw_input(0, "x", {4}), raw(1, op_kind::add, "loop", {0, 1})};
  auto g2 = graph::from_nodes(self, {0}, {1});
  ASSERT_FALSE(g2);
  EXPECT_EQ(g2.err().code, errc::cycle);
  expect_message(g2.err(), {"'loop'"});
}

TEST(FromNodes, DuplicateIdsAndNames) {
  std::vector<node> ids{raw_input(0, "x", {4}), raw_input(0, "y", {4})};
  auto g = graph::from_nodes(ids, {0}, {0});
  ASSERT_FALSE(g);
  EXPECT_EQ(g.err().code, errc::invalid_argument);
  expect_message(g.err(), {"duplicate id"});

  std::vector<node> names{raw_input(0, "x", {4}), raw(1, op_kind::silu, "x", {0})};
  auto g2 = graph::from_nodes(names, {0}, {1});
  ASSERT_FALSE(g2);
  EXPECT_EQ(g2.err().code, errc::invalid_argument);
  expect_message(g2.err(), {"'x'", "duplicate name"});
}

TEST(FromNodes, InputAndOutputLists) {
  std::vector<node> nodes{raw_input(0, "x", {4}), raw_input(1, "y", {4}), raw(2, op_kind::add, "s", {0, 1})};
  auto unknown_out = graph::from_nodes(nodes, {0, 1}, {9});
  ASSERT_FALSE(unknown_out);
  EXPECT_EQ(unknown_out.err().code, errc::unknown_input);
  expect_message(unknown_out.err(), {"output", "9"});

  auto unlisted = graph::from_nodes(nodes, {0}, {2});
  ASSERT_FALSE(unlisted);
  EXPECT_EQ(unlisted.err().code, errc::missing_input);
  expect_message(unlisted.err(), {"input 'y'"});

  auto not_input = graph::from_nodes(nodes, {0, 1, 2}, {2});
  ASSERT_FALSE(not_input);
  EXPECT_EQ(not_input.err().code, errc::invalid_argument);
  expect_message(not_input.err(), {"add 's'"});

  auto twice = graph::from_nodes(nodes, {0, 1, 0}, {2});
  ASSERT_FALSE(twice);
  EXPECT_EQ(twice.err().code, errc::invalid_argument);

  auto no_out = graph::from_nodes(nodes, {0, 1}, {});
  ASSERT_FALSE(no_out);
  EXPECT_EQ(no_out.err().code, errc::invalid_argument);
}

TEST(FromNodes, ShapeErrorsAreFoundAfterRenumbering) {
  node w = raw(5, op_kind::weight, "w");
  w.data = make_host_weight(host_tensor::random_normal(dtype::f32, {3, 2}, 1));
  std::vector<node> nodes{raw(9, op_kind::matmul, "mm", {1, 5}), w, raw_input(1, "x", {2, 4})};
  auto g = graph::from_nodes(nodes, {1}, {9});
  ASSERT_FALSE(g);
  EXPECT_EQ(g.err().code, errc::invalid_shape);
  expect_message(g.err(), {"matmul 'mm'", "K=4", "K=3"});

  node nodata = raw(0, op_kind::weight, "empty_w");
  auto g2 = graph::from_nodes({nodata}, {}, {0});
  ASSERT_FALSE(g2);
  expect_message(g2.err(), {"weight 'empty_w'", "no data"});
}

TEST(FromNodes, RawViewUsesGivenLayoutAndBadEnumsAreRejected) {
  node v = raw(1, op_kind::view, "diag");
  v.dims = {3};
  v.stride = {4, 0, 0, 0};  // the diagonal of a 3x3 storage
  v.offset = 0;
  v.inputs = {0};
  auto g = graph::from_nodes({raw_input(0, "x", {3, 3}), v}, {0}, {1});
  ASSERT_TRUE(g) << g.err().to_string();
  EXPECT_EQ(g->at(1).storage, 0);
  EXPECT_EQ(g->at(1).stride[0], 4);

  v.offset = 1;  // 1 + 2 * 4 = 9 is past the 9 elements
  auto g2 = graph::from_nodes({raw_input(0, "x", {3, 3}), v}, {0}, {1});
  ASSERT_FALSE(g2);
  EXPECT_EQ(g2.err().code, errc::invalid_shape);
  expect_message(g2.err(), {"view 'diag'"});

  node bad = raw_input(0, "x", {3});
  bad.type = static_cast<dtype>(9);
  auto g3 = graph::from_nodes({bad}, {0}, {0});
  ASSERT_FALSE(g3);
  EXPECT_EQ(g3.err().code, errc::invalid_argument);

  node op = raw(5, static_cast<op_kind>(200), "weird");
  auto g4 = graph::from_nodes({op}, {}, {5});
  ASSERT_FALSE(g4);
  EXPECT_EQ(g4.err().code, errc::invalid_argument);
  expect_message(g4.err(), {"'weird'"});
}

// ---- sizes (issue 13): overflow is an error naming the node and its shape ----

constexpr int64_t two31 = int64_t{1} << 31;

TEST(Sizes, InputWhoseBytesOverflow64BitsIsRefusedNamingNodeAndShape) {
  graph_builder b;
  auto x = b.input("x", dtype::f32, {two31, two31});  // 2^62 elements, 2^64 bytes
  EXPECT_FALSE(x.valid());
  EXPECT_EQ(b.status().code, errc::invalid_shape);
  expect_message(b.status(), {"input 'x'", "[2147483648, 2147483648]", "18446744073709551616 bytes"});
  // one element count past int64 too
  graph_builder c;
  c.input("y", dtype::f16, {two31 * 2, two31 * 2});
  EXPECT_EQ(c.status().code, errc::invalid_shape);
  expect_message(c.status(), {"input 'y'", "18446744073709551616 elements"});
  // the largest tensor a graph may hold is accepted
  graph_builder d;
  auto z = d.input("z", dtype::f32, {two31, two31 / 4});
  EXPECT_TRUE(z.valid()) << d.status().to_string();
}

TEST(Sizes, ComputedShapesThatOverflowAreRefusedAtTheOp) {
  {  // a matmul outer product of 2^32 x 2^32
    graph_builder b;
    auto a = b.input("a", dtype::f32, {two31 * 2, 1});
    auto w = b.input("w", dtype::f32, {1, two31 * 2});
    b.matmul(a, w, false, false, "outer");
    EXPECT_EQ(b.status().code, errc::invalid_shape);
    expect_message(b.status(), {"matmul 'outer'", "[4294967296, 4294967296]"});
  }
  {  // concat whose axis length passes int64
    graph_builder b;
    auto a = b.input("a", dtype::f16, {int64_t{1} << 61});  // 2^62 bytes: the largest tensor
    ASSERT_TRUE(a.valid()) << b.status().to_string();
    b.concat({a, a, a, a}, 0, "cat");  // 2^63 elements
    EXPECT_EQ(b.status().code, errc::invalid_shape);
    expect_message(b.status(), {"concat 'cat'", "overflow 64 bits"});
  }
  {  // get_rows output [ids..., D]
    graph_builder b;
    auto t = b.input("table", dtype::f32, {4, two31});
    auto ids = b.input("ids", dtype::i32, {two31});
    b.get_rows(t, ids, "rows");
    EXPECT_EQ(b.status().code, errc::invalid_shape);
    expect_message(b.status(), {"get_rows 'rows'"});
  }
  {  // a reshape target whose element count wraps around to the source's
    graph_builder b;
    auto x = b.input("x", dtype::f32, {4});
    b.reshape(x, {4, (int64_t{1} << 62) + 1}, "r");  // 2^64 + 4 elements = 4 mod 2^64
    EXPECT_EQ(b.status().code, errc::invalid_shape);
    expect_message(b.status(), {"reshape 'r'", "elements"});
  }
}

TEST(Sizes, ViewsWithStridesOrOffsetsPast64BitsAreRefused) {
  node v = raw(1, op_kind::view, "v", {0});
  v.dims = {3, 2};
  v.stride = {int64_t{1} << 62, 1, 0, 0};  // reaches 2^63
  auto g = graph::from_nodes({raw_input(0, "x", {8}), v}, {0}, {1});
  ASSERT_FALSE(g);
  EXPECT_EQ(g.err().code, errc::invalid_shape);
  expect_message(g.err(), {"view 'v'", "past 64 bits"});
  v.stride = {1, 1, 0, 0};
  v.offset = INT64_MAX;
  auto g2 = graph::from_nodes({raw_input(0, "x", {8}), v}, {0}, {1});
  ASSERT_FALSE(g2);
  expect_message(g2.err(), {"view 'v'"});
  // A broadcast view (stride 0) of 2^64 bytes over one element is refused
  // too: its readers and a host copy of it would need all of them.
  node b = raw(1, op_kind::view, "bcast", {0});
  b.dims = {two31, two31};
  b.stride = {0, 0, 0, 0};
  auto g3 = graph::from_nodes({raw_input(0, "x", {1}), b}, {0}, {1});
  ASSERT_FALSE(g3);
  EXPECT_EQ(g3.err().code, errc::invalid_shape);
  expect_message(g3.err(), {"view 'bcast'", "18446744073709551616 bytes"});
}

TEST(Sizes, WeightDataMustMatchItsShapeWithoutOverflow) {
  // dims of 2^64 bytes and no bytes at all: an unchecked product is 0 == 0
  host_tensor odd;
  odd.reset(dtype::f32, {two31, two31}, {});
  graph_builder b;
  b.weight("w", std::move(odd));
  EXPECT_EQ(b.status().code, errc::invalid_shape);
  expect_message(b.status(), {"weight 'w'", "18446744073709551616"});
  host_tensor unknown;
  unknown.reset(static_cast<dtype>(7), {2}, byte_buffer(8));
  graph_builder c;
  c.weight("w", std::move(unknown));
  EXPECT_EQ(c.status().code, errc::invalid_argument);
  expect_message(c.status(), {"weight 'w'", "unknown dtype 7"});
}

}  // namespace
}  // namespace ag
