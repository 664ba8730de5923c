// Checkpoints on real GPUs: tiny GPT-2 and LLaMA (GQA) models saved as
// Hugging Face folders by the test, loaded through memory-mapped safetensors
// (a bf16 file converted to f32 on the way) and run on one GPU and pipelined
// over two, equal the reference evaluator of the loaded graph.
#include <gtest/gtest.h>

#include "actors/actorgraph.hpp"
#include "checkpoint/checkpoint_test_util.hpp"
#include "cuda/cuda_test_util.hpp"
#include "graph/reference.hpp"
#include "graph/checkpoint/hf_model.hpp"

namespace ag {
namespace {

void run_checkpoints(const std::string& spec, int stages) {
  auto rt = runtime::create(spec);
  ASSERT_TRUE(rt) << rt.err().to_string();
  auto bf16_llama = test::tiny_model(models::model_variant::llama, 2);
  bf16_llama.dtype = dtype::bf16;
  for (const auto& cfg : {test::tiny_model(models::model_variant::gpt2), test::tiny_model(models::model_variant::llama, 2),
                          bf16_llama}) {
    SCOPED_TRACE(std::string(models::to_string(cfg.variant)) + " " + to_string(cfg.dtype) + " on " + spec);
    test::temp_dir dir;
    test::save_random_model(dir.str(), cfg);
    auto g = models::load_model(dir.str(), cfg.seq_len, 1, {.dtype = dtype::f32});
    ASSERT_TRUE(g) << g.err().to_string();
    auto p = (*rt)->compile(*g, {.pipeline_stages = stages});
    ASSERT_TRUE(p) << p.err().to_string();
    const auto in = models::transformer_inputs(cfg, 31);
    const auto r = (*rt)->submit(*p, in).wait();
    ASSERT_TRUE(r) << r.err().to_string();
    auto want = evaluate_reference(*g, in);
    ASSERT_TRUE(want) << want.err().to_string();
    auto c = compare((*r)[0], (*want)[0], 2e-4, 2e-3);
    EXPECT_TRUE(c.ok) << c.message;
  }
}

TEST(CudaCheckpoint, LoadedModelsOnOneGpuMatchReference) {
  AG_REQUIRE_GPU(1);
  run_checkpoints("cuda:0", 1);
}

TEST(CudaCheckpoint, LoadedModelsPipelinedOverTwoLogicalDevicesOfOneGpuMatchReference) {
  AG_REQUIRE_GPU(1);
  run_checkpoints("cuda:0,0", 2);
}

TEST(CudaCheckpoint, LoadedModelsPipelinedOverTwoGpusMatchReference) {
  AG_REQUIRE_GPU(2);
  run_checkpoints("cuda:0,1", 2);
}

}  // namespace
}  // namespace ag
