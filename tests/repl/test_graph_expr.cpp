// The one-line graph language: parsing, building, and every error with its column.
#include <gtest/gtest.h>

#include "apps/repl/graph_expr.hpp"

using namespace ag;
using namespace ag::repl;

namespace {

std::string err_of(const std::string& text, std::size_t offset = 0) {
  auto g = graph_from_expr(text, 1, offset);
  if (g) return "<no error>";
  return g.err().message;
}

}  // namespace

TEST(ReplGraphExpr, BuildsTheIssueExample) {
  auto g = graph_from_expr("x=input[8,64] w=weight[64,64] y=gelu(matmul(x,w)) out y");
  ASSERT_TRUE(g) << g.err().message;
  ASSERT_EQ(g->inputs().size(), 1u);
  ASSERT_EQ(g->outputs().size(), 1u);
  const node& x = g->at(g->inputs()[0]);
  EXPECT_EQ(x.name, "x");
  EXPECT_EQ(x.dims, (shape{8, 64}));
  const node& y = g->at(g->outputs()[0]);
  EXPECT_EQ(y.name, "y");
  EXPECT_EQ(y.op, op_kind::gelu);
  EXPECT_EQ(y.dims, (shape{8, 64}));
  EXPECT_EQ(g->at(y.inputs[0]).op, op_kind::matmul);
  const node_id w = g->find("w");
  ASSERT_NE(w, no_node);
  EXPECT_EQ(g->at(w).op, op_kind::weight);
  ASSERT_TRUE(g->at(w).data);
  // Random, not zero, weights.
  double sum_sq = 0;
  const ag::host_tensor& wt = *g->at(w).data->in_memory();
  for (int64_t i = 0; i < wt.numel(); ++i) sum_sq += wt.at(i) * wt.at(i);
  EXPECT_GT(sum_sq, 1.0);
}

TEST(ReplGraphExpr, SeveralOutputsTypesKeywordsAndMultiLineText) {
  auto g = graph_from_expr(
      "x = input[4,16]:f16\n"
      "w = weight[32,16]:f16; h = matmul(x, w, tb=1)\n"
      "p = softmax(h, causal=1, scale=0.5) q = layer_norm(h)\n"
      "out p, q");
  ASSERT_TRUE(g) << g.err().message;
  ASSERT_EQ(g->outputs().size(), 2u);
  const node& h = g->at(g->find("h"));
  EXPECT_TRUE(h.attrs.trans_b);
  EXPECT_EQ(h.dims, (shape{4, 32}));
  EXPECT_EQ(h.type, dtype::f16);
  const node& p = g->at(g->find("p"));
  EXPECT_TRUE(p.attrs.causal);
  EXPECT_FLOAT_EQ(p.attrs.scale, 0.5f);
}

TEST(ReplGraphExpr, ViewsAndDataMovementOps) {
  auto g = graph_from_expr(
      "x=input[4,8] r=reshape(x,[2,16]) t=transpose(x,0,1) s=slice(x,1,2,6) "
      "c=concat(x,x,axis=0) k=copy(x,f16) out r t s c k");
  ASSERT_TRUE(g) << g.err().message;
  EXPECT_EQ(g->at(g->find("r")).dims, (shape{2, 16}));
  EXPECT_EQ(g->at(g->find("t")).dims, (shape{8, 4}));
  EXPECT_EQ(g->at(g->find("s")).dims, (shape{4, 4}));
  EXPECT_EQ(g->at(g->find("c")).dims, (shape{8, 8}));
  EXPECT_EQ(g->at(g->find("k")).type, dtype::f16);
  EXPECT_EQ(g->outputs().size(), 5u);
}

TEST(ReplGraphExpr, SyntaxErrorsGiveTheColumn) {
  // After the trailing comma the text ends where an argument should be.
  std::string e = err_of("x=input[8,64] y=gelu(x,");
  EXPECT_NE(e.find("col 24"), std::string::npos) << e;
  e = err_of("x=input[8,64] y=gelu(x");
  EXPECT_NE(e.find("never closed"), std::string::npos) << e;
  EXPECT_NE(e.find("col 21"), std::string::npos) << e;
  e = err_of("x input[8]");
  EXPECT_NE(e.find("col 3"), std::string::npos) << e;
  EXPECT_NE(e.find("expected '=' after 'x'"), std::string::npos) << e;
  e = err_of("x=input[8,a]");
  EXPECT_NE(e.find("col 11"), std::string::npos) << e;
  e = err_of("x=input[8 64]");
  EXPECT_NE(e.find("expected ',' or ']'"), std::string::npos) << e;
  e = err_of("x=");
  EXPECT_NE(e.find("end of text"), std::string::npos) << e;
  e = err_of("out");
  EXPECT_NE(e.find("after 'out'"), std::string::npos) << e;
  e = err_of("  ");
  EXPECT_NE(e.find("empty graph"), std::string::npos) << e;
  e = err_of("x=input[8]:q8 out x");
  EXPECT_NE(e.find("unknown dtype 'q8'"), std::string::npos) << e;
}

TEST(ReplGraphExpr, OffsetShiftsColumnsToTheCommandLine) {
  // As typed after "graph " (6 characters).
  const std::string e = err_of("x=input[8] y=gelu(q) out y", 6);
  EXPECT_NE(e.find("col 25"), std::string::npos) << e;
  EXPECT_NE(e.find("unknown name 'q'"), std::string::npos) << e;
}

TEST(ReplGraphExpr, SemanticErrorsNameWhatIsWrong) {
  std::string e = err_of("x=input[8] y=frobnicate(x) out y");
  EXPECT_NE(e.find("unknown function 'frobnicate'"), std::string::npos) << e;
  EXPECT_NE(e.find("col 14"), std::string::npos) << e;
  e = err_of("x=input[8] y=add(x) out y");
  EXPECT_NE(e.find("'add' takes 2 arguments, got 1"), std::string::npos) << e;
  e = err_of("x=input[8] x=gelu(x) out x");
  EXPECT_NE(e.find("bound twice"), std::string::npos) << e;
  e = err_of("x=input[8] y=gelu(x)");
  EXPECT_NE(e.find("no outputs"), std::string::npos) << e;
  e = err_of("x=input[8] out z");
  EXPECT_NE(e.find("no tensor named 'z'"), std::string::npos) << e;
  e = err_of("x=input[8] y=scale(x, x) out y");
  EXPECT_NE(e.find("must be a number"), std::string::npos) << e;
  e = err_of("x=input[8] y=matmul(x, x, bogus=1) out y");
  EXPECT_NE(e.find("no parameter 'bogus'"), std::string::npos) << e;
  e = err_of("x=input out x");
  EXPECT_NE(e.find("'input' needs its dims in square brackets, e.g. input[8,64]"), std::string::npos) << e;
  e = err_of("x=input(4, 8) out x");
  EXPECT_NE(e.find("col 3: 'input' takes its dims in square brackets: input[4,8], not input(...)"), std::string::npos) << e;
  e = err_of("x=weight(16) out x");
  EXPECT_NE(e.find("weight[16]"), std::string::npos) << e;
  e = err_of("x=input[0,4] out x");
  EXPECT_NE(e.find("positive"), std::string::npos) << e;
  e = err_of("x=input[1,2,3,4,5] out x");
  EXPECT_NE(e.find("1 to 4 dims"), std::string::npos) << e;
}

// Found by fuzz_graph_expr: a bound or axis beyond any integer's range was
// converted from double as it was (undefined behaviour; UBSan stopped the
// fuzzer). Integer arguments are refused with their range before converting.
TEST(ReplGraphExpr, IntegerArgumentsOutOfRangeOrFractionalAreErrorsNotOverflows) {
  std::string e = err_of("a=input[4,6] s=slice(a,1,0,777777777777777777777777777772) out s");
  EXPECT_NE(e.find("'slice': an end must be an integer in ["), std::string::npos) << e;
  EXPECT_NE(e.find("got 7.7777777777777"), std::string::npos) << e;
  e = err_of("a=input[4,6] s=slice(a,1e30,0,2) out s");
  EXPECT_NE(e.find("an axis must be an integer in [-4, 4]"), std::string::npos) << e;
  e = err_of("a=input[4,6] s=slice(a,1,0.5,2) out s");
  EXPECT_NE(e.find("a begin must be an integer"), std::string::npos) << e;
  e = err_of("a=input[4,6] t=transpose(a,0,-9e99) out t");
  EXPECT_NE(e.find("two axes must be an integer in [-4, 4]"), std::string::npos) << e;
  e = err_of("a=input[4,6] b=input[4,2] c=concat(a,b,axis=3e12) out c");
  EXPECT_NE(e.find("'axis' must be an integer in [-4, 4]"), std::string::npos) << e;
  e = err_of("a=input[4,6] p=permute(a,[1,4000000000]) out p");
  EXPECT_NE(e.find("axis 4000000000 is out of range"), std::string::npos) << e;
  // In range, the same calls still build.
  EXPECT_EQ(err_of("a=input[4,6] b=input[4,2] c=concat(a,b,axis=1) s=slice(c,1,2,6) t=transpose(s,0,1) out t"),
            "<no error>");
}

TEST(ReplGraphExpr, ShapeErrorsFromTheBuilderCarryTheColumnAndNode) {
  // Inner dims 64 vs 32: the builder's error, at the matmul's column.
  const std::string e = err_of("x=input[8,64] w=weight[32,16] y=matmul(x,w) out y");
  EXPECT_NE(e.find("col 33"), std::string::npos) << e;
  EXPECT_NE(e.find("y"), std::string::npos) << e;
}

TEST(ReplGraphExpr, ArgmaxGivesI32RowsOfOne) {
  auto g = graph_from_expr("x=input[4,9] y=argmax(softmax(x)) out y");
  ASSERT_TRUE(g) << g.err().message;
  const node& y = g->at(g->outputs()[0]);
  EXPECT_EQ(y.op, op_kind::argmax);
  EXPECT_EQ(y.type, dtype::i32);
  EXPECT_EQ(y.dims, (shape{4, 1}));
}

TEST(ReplGraphExpr, FunctionListCoversTheLanguage) {
  const auto& f = graph_expr_functions();
  for (const char* name : {"input", "weight", "matmul", "gelu", "softmax", "rope", "concat", "argmax"})
    EXPECT_NE(std::find(f.begin(), f.end(), name), f.end()) << name;
}
