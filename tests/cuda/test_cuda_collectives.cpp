// Tensor parallelism on CUDA with two logical devices of one GPU ("cuda:0,0",
// where NCCL cannot run): the backend's one-shot collectives (every dtype)
// and tensor-parallel transformers at degree 2 equal the CPU reference.
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "actors/actorgraph.hpp"
#include "cuda/cuda_test_util.hpp"
#include "graph/models/transformer.hpp"
#include "graph/reference.hpp"

namespace ag {
namespace {

/// Member k computes copy(x_k) on device k; then all_reduce, reduce_scatter
/// (dim 1) and all_gather (dim 1) parts on both members.
std::shared_ptr<const graph> two_member_collectives(dtype t) {
  const int n = 2;
  std::vector<node> nodes;
  auto add = [&](node nd) {
    nd.id = static_cast<node_id>(nodes.size());
    nodes.push_back(std::move(nd));
    return nodes.back().id;
  };
  std::vector<node_id> ins, own, outs;
  for (int k = 0; k < n; ++k) {
    node x;
    x.op = op_kind::input;
    x.name = "x" + std::to_string(k);
    x.type = t;
    x.dims = shape{5, 64};
    ins.push_back(add(x));
  }
  for (int k = 0; k < n; ++k) {
    node c;
    c.op = op_kind::copy;
    c.name = "own" + std::to_string(k);
    c.type = t;
    c.dims = shape{5, 64};
    c.inputs = {ins[static_cast<std::size_t>(k)]};
    c.pinned_device = k;
    own.push_back(add(c));
  }
  for (int k = 0; k < n; ++k) {
    node ar;
    ar.op = op_kind::all_reduce;
    ar.name = "sum" + std::to_string(k);
    ar.inputs = own;
    ar.attrs.group = 0;
    ar.attrs.rank = k;
    ar.pinned_device = k;
    outs.push_back(add(ar));
    node rs;
    rs.op = op_kind::reduce_scatter;
    rs.name = "scatter" + std::to_string(k);
    rs.inputs = own;
    rs.attrs.group = 1;
    rs.attrs.rank = k;
    rs.attrs.axis = 1;
    rs.attrs.begin = 32 * k;
    rs.attrs.end = 32 * k + 32;
    rs.pinned_device = k;
    outs.push_back(add(rs));
    node gth;
    gth.op = op_kind::all_gather;
    gth.name = "gather" + std::to_string(k);
    gth.inputs = own;
    gth.dims = shape{5, 128};
    gth.attrs.group = 2;
    gth.attrs.rank = k;
    gth.attrs.axis = 1;
    gth.attrs.axis2 = 1;
    gth.pinned_device = k;
    outs.push_back(add(gth));
  }
  auto g = graph::from_nodes(nodes, ins, outs);
  EXPECT_TRUE(g.has_value()) << (g ? "" : g.err().to_string());
  return g ? std::make_shared<const graph>(std::move(*g)) : nullptr;
}

TEST(CudaCollectives, OneShotOnTwoLogicalDevicesOfOneGpuEqualsTheReferenceForEveryDtype) {
  AG_REQUIRE_GPU(1);
  auto rt = runtime::create("cuda:0,0");
  ASSERT_TRUE(rt.has_value()) << rt.err().to_string();
  for (dtype t : {dtype::f32, dtype::f16, dtype::bf16, dtype::i32}) {
    SCOPED_TRACE(to_string(t));
    auto g = two_member_collectives(t);
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
