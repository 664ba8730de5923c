// `load` and `generate`: a Hugging Face folder saved by the test becomes the
// current model, and generate prints the same tokens as ag::generator run
// directly (greedy), on one device, two pipeline stages, tensor degree 2 and
// 2 stages x degree 2; bad prompts get
// errors naming why.
#include <gtest/gtest.h>

#include <cctype>
#include <filesystem>
#include <unistd.h>

#include "../checkpoint/checkpoint_test_util.hpp"
#include "actors/generator.hpp"
#include "graph/checkpoint/hf_model.hpp"
#include "graph/checkpoint/tokenizer.hpp"
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
  EXPECT_TRUE(f.rejects("generate \"hello\"", "no tokenizer: give ids="));
  EXPECT_TRUE(f.rejects("generate ids=1,41", "ids"));
  // Several prompts (';' between their ids): each prints its solo run's
  // tokens, their decode steps shared (batch=2, the prompts' count) or not
  // (batch=0), on one device and on two stages. (How many steps they shared
  // depends on when the second joined: the generator's tests hold the first
  // to see it.)
  const std::string want45 = direct_tokens(cfg, {4, 5}, 6);
  for (const char* layout : {"set stages=1", "set stages=2"})
    for (const bool shared : {true, false}) {
      SCOPED_TRACE(std::string(layout) + (shared ? "" : ", batch=0"));
      f.ok({"devices sim:2 scale=0.01", layout});
      ASSERT_EQ(f.run(std::string("generate ids=1,2,3;4,5 n=6") + (shared ? "" : " batch=0")), exec_status::ok) << f.text;
      EXPECT_TRUE(has(f.text, "[0] " + want + "(6 tokens, max_tokens)")) << f.text << "\nwant: " << want;
      EXPECT_TRUE(has(f.text, "[1] " + want45 + "(6 tokens, max_tokens)")) << f.text << "\nwant: " << want45;
      EXPECT_TRUE(has(f.text, "2 sequences: 12 tokens")) << f.text;
      EXPECT_TRUE(has(f.text, shared ? " in shared steps (batch=2)" : "; 0 in shared steps (batch=0)")) << f.text;
    }
  f.ok({"devices sim:1 scale=0.01", "set stages=1"});
  EXPECT_EQ(f.run("generate ids=1,2;1,41"), exec_status::failed);
  EXPECT_TRUE(has(f.text, "prompt 1 of ids=")) << f.text;
  EXPECT_TRUE(f.rejects("generate ids=1,2 batch=257", "batch"));
  EXPECT_TRUE(f.rejects("load " + dir + "/missing", "missing"));
  std::filesystem::remove_all(dir);
}

TEST(ReplGenerate, BuiltModelGeneratesAndNeedsAModel) {
  fixture f;
  EXPECT_TRUE(f.rejects("generate ids=1", "no model"));
  f.ok({"model llama layers=2 d=32 heads=4 kv=2 ff=48 seq=8 vocab=41 seed=23"});
  auto cfg = tiny_llama();
  cfg.initializer_range = 0.02f;  // the REPL's model keeps the builder's default
  const std::string want = direct_tokens(cfg, {4, 5}, 4);
  ASSERT_EQ(f.run("generate ids=4,5 n=4"), exec_status::ok) << f.text;
  EXPECT_TRUE(has(f.text, want)) << f.text << "\nwant: " << want;
}

// With a tokenizer, generate prints text as the tokens come: what it prints
// is the decode of the prompt and the tokens, past the prompt's own text
// (models::text_stream), not each token decoded alone.
namespace {

// A random LLaMA over the tokenizer already in `dir` (its vocabulary), then
// `generate "<prompt_text>" n=24` in the REPL against ag::generator's tokens
// decoded whole; then stop= on a letter of it. Returns that text, the tokens'
// decoded one at a time, and whether a stop letter was found to try.
struct repl_text {
  std::string want, alone;
  bool stop_tried = false;
};
repl_text expect_repl_prints_the_decode(const ag::test::temp_dir& dir, const std::string& prompt_text) {
  auto tok = ag::models::load_tokenizer(dir.str());
  EXPECT_TRUE(tok.has_value() && *tok);
  if (!tok || !*tok) return {};
  auto cfg = tiny_llama();
  cfg.vocab = (*tok)->vocab_size();
  auto g = ag::models::build_transformer(cfg);
  EXPECT_TRUE(g.has_value());
  EXPECT_FALSE(ag::models::save_hf_model(dir.str(), cfg, *g));
  auto model = ag::models::hf_model::open(dir.str());
  EXPECT_TRUE(model.has_value()) << model.err().to_string();
  if (!model) return {};
  const std::vector<int32_t> prompt = *(*tok)->encode(prompt_text);
  auto rt = ag::runtime::create("cpu:1");
  EXPECT_TRUE(rt.has_value());
  auto gen = ag::generator::create(**rt, model->model_config(1), model->provider(), {.cache_tokens = 64});
  EXPECT_TRUE(gen.has_value()) << gen.err().to_string();
  ag::generate_options o;
  o.max_new_tokens = 24;
  o.stop_ids = model->config().eos_token_ids;  // as the REPL stops
  const auto r = (*gen)->generate(prompt, o).wait();
  EXPECT_TRUE(r.has_value()) << r.err().to_string();
  if (!r) return {};
  EXPECT_FALSE(r->tokens.empty());
  std::vector<int32_t> all = prompt;
  all.insert(all.end(), r->tokens.begin(), r->tokens.end());
  const std::string before = *(*tok)->decode(prompt), whole = *(*tok)->decode(all);
  EXPECT_EQ(whole.compare(0, before.size(), before), 0) << "the decode of the prompt and the tokens starts with the prompt's";
  const std::string want = whole.substr(before.size());
  fixture f;
  f.ok({"devices sim:1 scale=0.01"});
  EXPECT_EQ(f.run("load " + dir.str()), exec_status::ok) << f.text;
  EXPECT_EQ(f.run("generate \"" + prompt_text + "\" n=24"), exec_status::ok) << f.text;
  EXPECT_TRUE(has(f.text, want + "\n" + std::to_string(r->tokens.size()) + " tokens (")) << f.text << "\nwant: " << want;
  // stop="c": a letter of the text's second half that its first half lacks
  // ends generation at the token that prints it.
  bool stop_tried = false;
  for (std::size_t i = want.size() / 2; i < want.size() && !stop_tried; ++i) {
    const char c = want[i];
    if (!std::isalpha(static_cast<unsigned char>(c)) || want.find(c) < i) continue;
    EXPECT_EQ(f.run("generate \"" + prompt_text + "\" n=24 stop=" + std::string(1, c)), exec_status::ok) << f.text;
    EXPECT_TRUE(has(f.text, want.substr(0, i + 1))) << f.text << "\nwant: " << want.substr(0, i + 1);
    EXPECT_TRUE(has(f.text, " tokens (stop_condition)")) << f.text;
    stop_tried = true;
  }
  // The prompt twice: two sequences decoding in shared steps, each printing
  // the same text when both have ended.
  EXPECT_EQ(f.run("generate \"" + prompt_text + "\" \"" + prompt_text + "\" n=24"), exec_status::ok) << f.text;
  for (const char* tag : {"[0] ", "[1] "})
    EXPECT_TRUE(has(f.text, tag + want + " (" + std::to_string(r->tokens.size()) + " tokens, ")) << f.text;
  EXPECT_TRUE(has(f.text, "2 sequences: " + std::to_string(2 * r->tokens.size()) + " tokens")) << f.text;
  std::string alone;
  for (int32_t t : r->tokens) alone += *(*tok)->decode({t});
  return {want, alone, stop_tried};
}

}  // namespace

// A small byte-level BPE (every byte a token, a few merges): random weights
// generate bytes that cut characters, which print once whole, or at the end
// as the model left them.
TEST(ReplGenerate, TextPrintsAsTheTokensComeAndEqualsTheDecode) {
  ag::test::temp_dir dir;
  ag::test::small_bpe bpe;
  bpe.write(dir);
  expect_repl_prints_the_decode(dir, "he said ");
}

#ifdef AG_HAVE_SENTENCEPIECE_TRAINER
// SentencePiece: each piece decoded alone loses its leading space (words ran
// together on the screen before text_stream); the REPL keeps them.
TEST(ReplGenerate, SentencePieceTextKeepsItsSpaces) {
  ag::test::temp_dir dir;
  ag::test::train_sentencepiece(dir);
  const repl_text t = expect_repl_prints_the_decode(dir, "the quick");
  EXPECT_NE(t.want, t.alone) << "decoded alone the pieces print the same: the test shows nothing";
  EXPECT_TRUE(t.stop_tried) << "no letter to stop at in: " << t.want;
}
#endif
