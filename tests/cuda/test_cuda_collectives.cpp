// Tensor parallelism on CUDA with two logical devices of one GPU ("cuda:0,0",
// where NCCL cannot run): the backend's one-shot collectives (every dtype)
// and tensor-parallel transformers at degree 2 equal the CPU reference.
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "actors/actorgraph.hpp"
#include "cuda/cuda_test_util.hpp"
#include "../graph/tp_random_graph.hpp"
#include "graph/models/transformer.hpp"
#include "graph/reference.hpp"

namespace ag {
namespace {

TEST(CudaCollectives, OneShotOnTwoLogicalDevicesOfOneGpuEqualsTheReferenceForEveryDtype) {
  AG_REQUIRE_GPU(1);
  auto rt = runtime::create("cuda:0,0");
  ASSERT_TRUE(rt.has_value()) << rt.err().to_string();
  for (dtype t : {dtype::f32, dtype::f16, dtype::bf16, dtype::i32}) {
    SCOPED_TRACE(to_string(t));
    auto g = test::user_collectives(t, 2, 5, 64);
    ASSERT_TRUE(g);
    auto p = (*rt)->compile(g);
    ASSERT_TRUE(p.has_value()) << p.err().to_string();
    std::vector<host_tensor> in;
    for (int k = 0; k < 2; ++k)
      in.push_back(t == dtype::i32 ? host_tensor::random_ints({5, 64}, 30 + k, 1000)
                                   : host_tensor::random_normal(t, {5, 64}, 30 + k));
    auto want = evaluate_reference(*g, in).value();
    const auto& got = (*rt)->submit(*p, in).wait();
    ASSERT_TRUE(got.has_value()) << got.err().to_string();
    ASSERT_EQ(got->size(), want.size());
    // Sums of two values in f32 then rounded once: exact for i32, within
    // one rounding of the storage dtype otherwise.
    const double tol = t == dtype::f32 ? 1e-6 : t == dtype::i32 ? 0 : 1e-2;
    for (std::size_t i = 0; i < want.size(); ++i) {
      auto c = compare((*got)[i], want[i], tol, tol);
      EXPECT_TRUE(c.ok) << "output " << i << ": " << c.message;
    }
  }
}

TEST(CudaCollectives, TensorParallelTransformersOnTwoLogicalDevicesEqualTheReference) {
  AG_REQUIRE_GPU(1);
  auto rt = runtime::create("cuda:0,0");
  ASSERT_TRUE(rt.has_value()) << rt.err().to_string();
  for (auto variant : {models::model_variant::gpt2, models::model_variant::llama}) {
    models::transformer_config cfg;
    cfg.variant = variant;
    cfg.n_layers = 2;
    cfg.d_model = 64;
    cfg.n_heads = 8;
    cfg.n_kv_heads = variant == models::model_variant::llama ? 2 : 0;
    cfg.vocab = 101;
    cfg.seq_len = 16;
    cfg.batch = 2;
    SCOPED_TRACE(models::to_string(variant));
    auto g = std::make_shared<const graph>(models::build_transformer(cfg).value());
    plan_options o;
    o.tensor_parallel = 2;
    auto p = (*rt)->compile(g, o);
    ASSERT_TRUE(p.has_value()) << p.err().to_string();
    int parts = 0;
    for (const auto& s : (*p)->steps()) parts += s.kind == step_kind::collective;
    EXPECT_GT(parts, 0);
    std::vector<job> jobs;
    std::vector<std::vector<host_tensor>> ins;
    for (int k = 0; k < 4; ++k) {
      ins.push_back(models::transformer_inputs(cfg, 70 + static_cast<uint64_t>(k)));
      jobs.push_back((*rt)->submit(*p, ins.back()));
    }
    for (int k = 0; k < 4; ++k) {
      const auto& r = jobs[static_cast<std::size_t>(k)].wait();
      ASSERT_TRUE(r.has_value()) << r.err().to_string();
      auto want = evaluate_reference(*g, ins[static_cast<std::size_t>(k)]).value();
      auto c = compare(r->front(), want.front(), 2e-4, 2e-3);
      EXPECT_TRUE(c.ok) << "job " << k << ": " << c.message;
    }
  }
}

}  // namespace
}  // namespace ag
