// `load` and `generate`: a Hugging Face folder saved by the test becomes the
// current model, and generate prints the same tokens as ag::generator run
// directly (greedy), on one device, two pipeline stages, tensor degree 2 and
// 2 stages x degree 2; bad prompts get
// errors naming why.
#include <gtest/gtest.h>

#include <filesystem>
#include <unistd.h>

#include "actors/generator.hpp"
#include "graph/checkpoint/hf_model.hpp"
#include "session_fixture.hpp"

using namespace ag::repl;
using namespace ag::repl::test_support;

namespace {

ag::models::transformer_config tiny_llama() {
  ag::models::transformer_config c;
  c.variant = ag::models::model_variant::llama;
  c.n_layers = 2;
  c.d_model = 32;
  c.n_heads = 4;
  c.n_kv_heads = 2;
  c.d_ff = 48;
  c.vocab = 41;
  c.seq_len = 8;
  c.batch = 1;
  c.seed = 23;
  c.initializer_range = 0.2f;
  return c;
}

// Greedy tokens of `prompt` through ag::generator directly.
std::string direct_tokens(const ag::models::transformer_config& cfg, const std::vector<int32_t>& prompt, int n) {
  auto rt = ag::runtime::create("cpu:1");
  EXPECT_TRUE(rt.has_value());
  auto gen = ag::generator::create(**rt, cfg, {}, {.cache_tokens = 32});
  EXPECT_TRUE(gen.has_value()) << gen.err().to_string();
  ag::generate_options o;
  o.max_new_tokens = n;
  const ag::generation h = (*gen)->generate(prompt, o);
  const auto& r = h.wait();
  EXPECT_TRUE(r.has_value()) << r.err().to_string();
  std::string s;
  for (int32_t t : r->tokens) s += std::to_string(t) + " ";
  return s;
}

}  // namespace

TEST(ReplGenerate, LoadedFolderGeneratesWhatTheGeneratorDoesOnEveryLayout) {
  const auto cfg = tiny_llama();
  const std::string dir =
      (std::filesystem::temp_directory_path() / ("ag_repl_gen_" + std::to_string(::getpid()))).string();
  std::filesystem::create_directories(dir);
  auto g = ag::models::build_transformer(cfg);
  ASSERT_TRUE(g.has_value());
  const ag::error saved = ag::models::save_hf_model(dir, cfg, *g);
  ASSERT_FALSE(saved) << saved.to_string();
  const std::string want = direct_tokens(cfg, {1, 2, 3}, 6);
  fixture f;
  f.ok({"devices sim:2 scale=0.01"});
  ASSERT_EQ(f.run("load " + dir), exec_status::ok) << f.text;
  EXPECT_TRUE(has(f.text, "llama, 2 layers, d 32, 4 heads of 8 (2 kv), vocab 41")) << f.text;
  EXPECT_TRUE(has(f.text, "no tokenizer")) << f.text;
  ASSERT_EQ(f.run("generate ids=1,2,3 n=6"), exec_status::ok) << f.text;
  EXPECT_TRUE(has(f.text, want)) << f.text << "\nwant: " << want;
  EXPECT_TRUE(has(f.text, "6 tokens (max_tokens)")) << f.text;
  f.ok({"set stages=2"});
  ASSERT_EQ(f.run("generate ids=1,2,3 n=6"), exec_status::ok) << f.text;
  EXPECT_TRUE(has(f.text, want)) << f.text;
  // The first token comes from the prompt's chunk (host), the rest from the
  // device; two stages: one step at a time.
  EXPECT_TRUE(has(f.text, "5 picked on the device, 0 of them pipelined")) << f.text;
  f.ok({"devices sim:1 scale=0.01"});
  ASSERT_EQ(f.run("generate ids=1,2,3 n=6"), exec_status::ok) << f.text;
  EXPECT_TRUE(has(f.text, want)) << f.text;
  // One device: the steps after the first read their token on the device.
  EXPECT_TRUE(has(f.text, "5 picked on the device, 4 of them pipelined")) << f.text;
  f.ok({"set stages=1"});
  // Tensor parallel, and 2 stages x 2: the layout 'set' chose, the same tokens.
  f.ok({"devices sim:2 scale=0.01", "set tp=2"});
  ASSERT_EQ(f.run("generate ids=1,2,3 n=6"), exec_status::ok) << f.text;
  EXPECT_TRUE(has(f.text, want)) << f.text;
  EXPECT_TRUE(has(f.text, "stages=1 tp=2")) << f.text;
  EXPECT_TRUE(has(f.text, "5 picked on the device, 4 of them pipelined")) << f.text;
  f.ok({"devices sim:4 scale=0.01", "set stages=2"});
  ASSERT_EQ(f.run("generate ids=1,2,3 n=6"), exec_status::ok) << f.text;
  EXPECT_TRUE(has(f.text, want)) << f.text;
  EXPECT_TRUE(has(f.text, "stages=2 tp=2")) << f.text;
  // Pipeline x tensor: one step at a time, as over stages.
  EXPECT_TRUE(has(f.text, "5 picked on the device, 0 of them pipelined")) << f.text;
  f.ok({"devices sim:1 scale=0.01", "set stages=1 tp=1"});
  // A prompt it cannot take.
  EXPECT_EQ(f.run("generate \"hello\""), exec_status::failed);
  EXPECT_TRUE(has(f.text, "no tokenizer: give ids=")) << f.text;
  EXPECT_EQ(f.run("generate ids=1,41"), exec_status::failed);
  EXPECT_TRUE(has(f.text, "ids")) << f.text;
  EXPECT_EQ(f.run("load " + dir + "/missing"), exec_status::failed);
  EXPECT_TRUE(has(f.text, "missing")) << f.text;
  std::filesystem::remove_all(dir);
}

TEST(ReplGenerate, BuiltModelGeneratesAndNeedsAModel) {
  fixture f;
  EXPECT_EQ(f.run("generate ids=1"), exec_status::failed);
  EXPECT_TRUE(has(f.text, "no model")) << f.text;
  f.ok({"model llama layers=2 d=32 heads=4 kv=2 ff=48 seq=8 vocab=41 seed=23"});
  auto cfg = tiny_llama();
  cfg.initializer_range = 0.02f;  // the REPL's model keeps the builder's default
  const std::string want = direct_tokens(cfg, {4, 5}, 4);
  ASSERT_EQ(f.run("generate ids=4,5 n=4"), exec_status::ok) << f.text;
  EXPECT_TRUE(has(f.text, want)) << f.text << "\nwant: " << want;
}
