// Weight sources: slices of in-memory weights along every dimension, and
// shapes-only weights, which plan but cannot be evaluated or loaded.
#include <gtest/gtest.h>

#include "graph/models/transformer.hpp"
#include "graph/plan.hpp"
#include "graph/reference.hpp"
#include "graph/weight_source.hpp"

using namespace ag;

namespace {

// Element (i0, i1, i2) of a contiguous [d0, d1, d2] tensor.
float at3(const host_tensor& t, int64_t i0, int64_t i1, int64_t i2) {
  return t.at((i0 * t.dims()[1] + i1) * t.dims()[2] + i2);
}

}  // namespace

TEST(WeightSource, SliceAlongEachDimHoldsExactlyThoseElements) {
  const host_tensor t = host_tensor::random_normal(dtype::f32, {3, 5, 4}, 11);
  auto w = make_host_weight(t);
  ASSERT_EQ(w->bytes(), 3 * 5 * 4 * 4);
  for (int dim = 0; dim < 3; ++dim) {
    const int64_t n = t.dims()[dim];
    const int64_t begin = 1, end = n - 1;
    ASSERT_EQ(w->slice_bytes(dim, end - begin), t.numel() / n * (end - begin) * 4);
    std::vector<float> got(static_cast<std::size_t>(t.numel() / n * (end - begin)), -1e30f);
    ASSERT_FALSE(w->read_slice(dim, begin, end, got.data()));
    shape sd = t.dims();
    sd[dim] = end - begin;
    std::size_t k = 0;
    for (int64_t a = 0; a < sd[0]; ++a)
      for (int64_t b = 0; b < sd[1]; ++b)
        for (int64_t c = 0; c < sd[2]; ++c, ++k) {
          const int64_t i0 = a + (dim == 0 ? begin : 0), i1 = b + (dim == 1 ? begin : 0),
                        i2 = c + (dim == 2 ? begin : 0);
          ASSERT_EQ(got[k], at3(t, i0, i1, i2)) << "dim " << dim << " at " << a << "," << b << "," << c;
        }
  }
}

TEST(WeightSource, SliceOutsideTheShapeIsAnErrorNamingTheRange) {
  auto w = make_host_weight(host_tensor::random_normal(dtype::bf16, {4, 6}, 3));
  std::vector<std::byte> buf(1024);
  error e = w->read_slice(1, 2, 7, buf.data());
  EXPECT_EQ(e.code, errc::invalid_argument);
  EXPECT_NE(e.message.find("[2, 7) along dim 1 of [4, 6]"), std::string::npos) << e.message;
  EXPECT_EQ(w->read_slice(2, 0, 1, buf.data()).code, errc::invalid_argument);
  EXPECT_EQ(w->read_slice(0, 3, 2, buf.data()).code, errc::invalid_argument);
}

TEST(WeightSource, ReadAllOfAnInMemoryWeightIsItsTensor) {
  const host_tensor t = host_tensor::random_normal(dtype::f16, {7, 3}, 5);
  auto w = make_host_weight(t);
  auto all = read_all(*w);
  ASSERT_TRUE(all);
  EXPECT_TRUE(*all == t);
}

TEST(WeightSource, ShapesOnlyTransformerPlansButDoesNotEvaluate) {
  models::transformer_config cfg;
  cfg.variant = models::model_variant::llama;
  cfg.n_kv_heads = 2;
  cfg.weight_values = false;
  auto g = models::build_transformer(cfg);
  ASSERT_TRUE(g) << g.err().to_string();
  int64_t weights = 0;
  for (const node& n : g->nodes())
    if (n.op == op_kind::weight) {
      ++weights;
      EXPECT_FALSE(n.data->has_values()) << n.name;
      EXPECT_EQ(n.data->in_memory(), nullptr) << n.name;
    }
  EXPECT_GT(weights, 0);
  // Same weight bytes as the graph with values: planning sees the same model.
  cfg.weight_values = true;
  auto with_values = models::build_transformer(cfg);
  ASSERT_TRUE(with_values);
  EXPECT_EQ(g->weight_bytes(), with_values->weight_bytes());

  auto gp = std::make_shared<const graph>(std::move(*g));
  std::vector<device_spec> devs(2);
  devs[1].name = "sim1";
  auto p = compile(gp, devs);
  ASSERT_TRUE(p) << p.err().to_string();
  EXPECT_FALSE((*p)->describe().empty());

  auto r = evaluate_reference(*gp, models::transformer_inputs(cfg, 1));
  ASSERT_FALSE(r);
  EXPECT_EQ(r.err().code, errc::invalid_argument);
  EXPECT_NE(r.err().message.find("shapes only"), std::string::npos) << r.err().message;
}
