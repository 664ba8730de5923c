// actorgraph-generate on checkpoints the tests write: the greedy token and
// the dumped logits equal the reference evaluator's on one device, 2 stages,
// tensor degree 2 and 2 stages x degree 2 (cpu and sim),
// text prompts go through the folder's tokenizer, and bad input exits with a
// message (1: load or run failure, 2: command line). actorgraph-save-model:
// the folders it writes hold the shape its flags ask for and generate like
// the reference; its seed decides the weights; bad flags exit with a message.
#include <gtest/gtest.h>

#include <sys/wait.h>

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <cstdio>

#include "checkpoint_test_util.hpp"
#include "graph/reference.hpp"
#include "graph/checkpoint/npy.hpp"

using namespace ag;
using namespace ag::models;
using ag::test::temp_dir;

#ifdef AG_GENERATE_BINARY

namespace {

struct run_result {
  int rc = -1;
  std::string out;
};

// Runs `program` with `args`, its stdout and stderr together.
run_result run_program(const std::string& program, const std::string& args) {
  run_result r;
  const std::string cmd = program + " " + args + " 2>&1";
  FILE* p = ::popen(cmd.c_str(), "r");
  if (!p) return r;
  char buf[4096];
  std::size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, p)) > 0) r.out.append(buf, n);
  const int status = ::pclose(p);
  r.rc = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

run_result run(const std::string& args) { return run_program(AG_GENERATE_BINARY, args); }

// The value of a "name: value" line of the output.
std::string field(const std::string& out, const std::string& name) {
  const auto at = out.find("\n" + name + ": ");
  const auto start = at == std::string::npos ? (out.rfind(name + ": ", 0) == 0 ? 0 : std::string::npos)
                                             : at + 1;
  if (start == std::string::npos) return {};
  const auto from = start + name.size() + 2;
  return out.substr(from, out.find('\n', from) - from);
}

// Reference logits [S, V] of the saved graph `g` (batch 1) for these tokens.
host_tensor reference_logits(const transformer_config& cfg, const graph& saved, const std::vector<int32_t>& ids) {
  auto c = cfg;
  c.seq_len = static_cast<int64_t>(ids.size());
  c.batch = 1;
  auto g = build_transformer(c, [&](const std::string& name, dtype, const shape&) -> expected<weight_source_ptr> {
    return saved.at(saved.find(name)).data;
  });
  EXPECT_TRUE(g.has_value());
  std::vector<int32_t> pos(ids.size());
  for (std::size_t i = 0; i < pos.size(); ++i) pos[i] = static_cast<int32_t>(i);
  auto out = evaluate_reference(*g, {host_tensor::from_ints({1, c.seq_len}, ids),
                                     host_tensor::from_ints({c.seq_len}, pos)});
  EXPECT_TRUE(out.has_value());
  host_tensor t;
  t.reset(dtype::f32, {c.seq_len, c.vocab}, (*out)[0].raw());
  return t;
}

// The program printed the layout that its flags (`devices`: "--stages 2",
// "--tp 2" or neither) ask for, as planned.
void expect_layout(const std::string& out, const std::string& devices) {
  const bool tp = devices.find("--tp 2") != std::string::npos;
  const bool staged = devices.find("--stages 2") != std::string::npos;
  EXPECT_NE(out.find(std::string("stages: ") + (staged ? "2" : "1") + ", tp: " + (tp ? "2" : "1")), std::string::npos)
      << out;
}

int32_t argmax_last_row(const host_tensor& l) {
  const int64_t S = l.dims()[0], V = l.dims()[1];
  int32_t best = 0;
  for (int64_t v = 1; v < V; ++v)
    if (l.at((S - 1) * V + v) > l.at((S - 1) * V + best)) best = static_cast<int32_t>(v);
  return best;
}

}  // namespace

TEST(GenerateApp, GreedyTokenAndDumpedLogitsEqualTheReference) {
  for (auto variant : {model_variant::gpt2, model_variant::llama}) {
    const auto cfg = ag::test::tiny_model(variant, variant == model_variant::llama ? 2 : 0);
    temp_dir dir;
    const graph saved = ag::test::save_random_model(dir.str(), cfg);
    const std::vector<int32_t> ids = {3, 14, 15, 9, 26};
    const host_tensor want = reference_logits(cfg, saved, ids);
    for (const std::string devices : {"--devices cpu:1", "--devices sim:2 --stages 2", "--devices cpu:2 --tp 2",
                                      "--devices sim:4 --stages 2 --tp 2"}) {
      SCOPED_TRACE(std::string(to_string(variant)) + " " + devices);
      run_result r = run("--model " + dir.str() + " --prompt-ids 3,14,15,9,26 " + devices + " --dump-logits " +
                         (dir / "logits.npy"));
      ASSERT_EQ(r.rc, 0) << r.out;
      EXPECT_EQ(field(r.out, "generated"), std::to_string(argmax_last_row(want))) << r.out;
      EXPECT_NE(field(r.out, "load_gb_per_s"), "") << r.out;
      EXPECT_NE(field(r.out, "prefill_tokens_per_s"), "") << r.out;
      expect_layout(r.out, devices);
      auto got = load_npy(dir / "logits.npy");
      ASSERT_TRUE(got.has_value()) << got.err().to_string();
      EXPECT_EQ(got->dims(), want.dims());
      auto c = compare(*got, want, 2e-4, 2e-3);
      EXPECT_TRUE(c.ok) << c.message;
    }
  }
}

TEST(GenerateApp, MaxNewTokensGreedyEqualsRecomputingEachToken) {
  for (auto variant : {model_variant::gpt2, model_variant::llama}) {
    const auto cfg = ag::test::tiny_model(variant, variant == model_variant::llama ? 2 : 0);
    temp_dir dir;
    const graph saved = ag::test::save_random_model(dir.str(), cfg);
    std::vector<int32_t> seq = {3, 14, 15, 9, 26};
    std::string want;
    for (int t = 0; t < 5; ++t) {
      const int32_t next = argmax_last_row(reference_logits(cfg, saved, seq));
      want += (t ? "," : "") + std::to_string(next);
      seq.push_back(next);
    }
    for (const std::string devices : {"--devices cpu:1", "--devices sim:2 --stages 2", "--devices sim:2 --tp 2",
                                      "--devices cpu:4 --stages 2 --tp 2"}) {
      SCOPED_TRACE(std::string(to_string(variant)) + " " + devices);
      run_result r = run("--model " + dir.str() + " --prompt-ids 3,14,15,9,26 --max-new-tokens 5 " + devices);
      ASSERT_EQ(r.rc, 0) << r.out;
      EXPECT_EQ(field(r.out, "generated"), want) << r.out;
      EXPECT_EQ(field(r.out, "stop_reason"), "max_tokens") << r.out;
      EXPECT_NE(field(r.out, "decode_ms_per_token"), "") << r.out;
      EXPECT_EQ(field(r.out, "kv_cache").rfind("10 positions, 10 rows a layer, ", 0), 0u) << r.out;
      expect_layout(r.out, devices);
    }
    // Sampling: the same seed gives the same tokens; an eos id stops at once.
    const std::string sample = "--model " + dir.str() + " --prompt-ids 3,14 --max-new-tokens 6 --temperature 3 "
                               "--top-k 20 --top-p 0.95 --seed 9";
    run_result a = run(sample), b = run(sample);
    ASSERT_EQ(a.rc, 0) << a.out;
    EXPECT_EQ(field(a.out, "generated"), field(b.out, "generated"));
    const std::string first = field(a.out, "generated").substr(0, field(a.out, "generated").find(','));
    run_result e = run(sample + " --eos-ids " + first);
    ASSERT_EQ(e.rc, 0) << e.out;
    EXPECT_EQ(field(e.out, "generated"), first) << e.out;
    EXPECT_EQ(field(e.out, "stop_reason"), "eos") << e.out;
  }
}

TEST(GenerateApp, TextPromptGoesThroughTheTokenizer) {
  auto cfg = ag::test::tiny_model(model_variant::gpt2);
  cfg.vocab = 264;  // the small BPE vocabulary's size
  temp_dir dir;
  const graph saved = ag::test::save_random_model(dir.str(), cfg);
  ag::test::small_bpe bpe;
  bpe.write(dir);
  auto tok = load_tokenizer(dir.str());
  ASSERT_TRUE(tok.has_value() && *tok);
  auto ids = (*tok)->encode("the cat tell");
  ASSERT_TRUE(ids.has_value());
  run_result r = run("--model " + dir.str() + " --prompt 'the cat tell'");
  ASSERT_EQ(r.rc, 0) << r.out;
  std::string list;
  for (std::size_t i = 0; i < ids->size(); ++i) list += (i ? "," : "") + std::to_string((*ids)[i]);
  EXPECT_EQ(field(r.out, "prompt_ids"), list) << r.out;
  const int32_t next = argmax_last_row(reference_logits(cfg, saved, *ids));
  EXPECT_EQ(field(r.out, "generated"), std::to_string(next)) << r.out;
  EXPECT_EQ(field(r.out, "generated_text"), *(*tok)->decode({next})) << r.out;
  // Several tokens: their text together.
  r = run("--model " + dir.str() + " --prompt 'the cat tell' --max-new-tokens 3");
  ASSERT_EQ(r.rc, 0) << r.out;
  std::vector<int32_t> gen;
  for (const std::string& item : {field(r.out, "generated")}) {
    std::size_t i = 0;
    while (i < item.size()) {
      const std::size_t c = std::min(item.find(',', i), item.size());
      gen.push_back(std::stoi(item.substr(i, c - i)));
      i = c + 1;
    }
  }
  ASSERT_EQ(gen.size(), 3u) << r.out;
  EXPECT_EQ(gen[0], next);
  EXPECT_EQ(field(r.out, "generated_text"), *(*tok)->decode(gen)) << r.out;
}

// --stop TEXT ends generation at the token whose text completes TEXT (kept,
// stop_reason stop_condition); the text is read through the folder's
// tokenizer as it streams.
TEST(GenerateApp, StopStringEndsGenerationWhereTheTextHoldsIt) {
  auto cfg = ag::test::tiny_model(model_variant::gpt2);
  cfg.vocab = 264;  // the small BPE vocabulary's size
  temp_dir dir;
  ag::test::save_random_model(dir.str(), cfg);
  ag::test::small_bpe bpe;
  bpe.write(dir);
  auto tok = load_tokenizer(dir.str());
  ASSERT_TRUE(tok.has_value() && *tok);
  const auto ids = *(*tok)->encode("the cat");
  const auto tokens_of = [](const std::string& list) {
    std::vector<int32_t> v;
    std::size_t i = 0;
    while (i < list.size()) {
      const std::size_t c = std::min(list.find(',', i), list.size());
      v.push_back(std::stoi(list.substr(i, c - i)));
      i = c + 1;
    }
    return v;
  };
  // Sampled hot (a fixed seed: the same tokens every run), so that the tokens
  // spread over the vocabulary's letters, not the random model's favourites.
  const std::string gen_args = " --prompt 'the cat' --max-new-tokens 12 --eos-ids 100000 --temperature 50 --seed 7";
  run_result r = run("--model " + dir.str() + gen_args);
  ASSERT_EQ(r.rc, 0) << r.out;
  const std::vector<int32_t> all = tokens_of(field(r.out, "generated"));
  ASSERT_EQ(all.size(), 12u) << r.out;
  // The text after each token, as it streams; the stop string is a letter
  // of the 3rd token's text or a later one's that the text before lacks.
  text_stream ts(*tok, ids);
  std::vector<std::string> text_after;
  std::string text;
  for (int32_t t : all) {
    text += *ts.push(t);
    text_after.push_back(text);
  }
  std::string stop;
  std::size_t want_n = 0;
  for (std::size_t k = 2; k + 1 < all.size() && stop.empty(); ++k)
    for (char c : text_after[k].substr(text_after[k - 1].size()))
      if (std::isalnum(static_cast<unsigned char>(c)) && text_after[k - 1].find(c) == std::string::npos) {
        stop = std::string(1, c);
        want_n = k + 1;
        break;
      }
  ASSERT_FALSE(stop.empty()) << "no new letter in tokens 3 to 11: no stop string to test\n" << text;
  r = run("--model " + dir.str() + gen_args + " --stop " + stop);
  ASSERT_EQ(r.rc, 0) << r.out;
  EXPECT_EQ(tokens_of(field(r.out, "generated")), std::vector<int32_t>(all.begin(), all.begin() + static_cast<std::ptrdiff_t>(want_n)))
      << "stop '" << stop << "'\n" << r.out;
  EXPECT_EQ(field(r.out, "stop_reason"), "stop_condition") << r.out;
}

// Several --prompt-ids generate together (a slot each; their decode steps
// share jobs unless --decode-batch 0): each sequence's tokens, printed as
// generated[i], equal recomputing it alone, greedy, on cpu and on two
// pipelined sim devices; the whole run's figures replace the one-sequence
// prefill and decode lines.
TEST(GenerateApp, SeveralPromptsGenerateTogetherAndEachEqualsRecomputing) {
  const auto cfg = ag::test::tiny_model(model_variant::llama, 2);
  temp_dir dir;
  const graph saved = ag::test::save_random_model(dir.str(), cfg);
  const std::vector<std::vector<int32_t>> prompts{{3, 14, 15}, {9, 26}, {5, 3, 5, 8, 9}};
  std::vector<std::string> want;
  std::string args = "--model " + dir.str() + " --max-new-tokens 4";
  for (const auto& prompt : prompts) {
    std::vector<int32_t> seq = prompt;
    std::string w, ids;
    for (std::size_t i = 0; i < prompt.size(); ++i) ids += (i ? "," : "") + std::to_string(prompt[i]);
    for (int t = 0; t < 4; ++t) {
      const int32_t next = argmax_last_row(reference_logits(cfg, saved, seq));
      w += (t ? "," : "") + std::to_string(next);
      seq.push_back(next);
    }
    want.push_back(w);
    args += " --prompt-ids " + ids;
  }
  for (const std::string flags : {" --devices cpu:1 --decode-batch 0", " --devices cpu:1", " --devices cpu:1 --decode-batch 2",
                                  " --devices sim:2 --stages 2"}) {
    SCOPED_TRACE(flags);
    const run_result r = run(args + flags);
    ASSERT_EQ(r.rc, 0) << r.out;
    for (std::size_t i = 0; i < prompts.size(); ++i) {
      EXPECT_EQ(field(r.out, "generated[" + std::to_string(i) + "]"), want[i]) << r.out;
      EXPECT_EQ(field(r.out, "stop_reason[" + std::to_string(i) + "]"), "max_tokens") << r.out;
    }
    EXPECT_EQ(field(r.out, "generated"), "") << "one sequence's line with several: " << r.out;
    EXPECT_EQ(field(r.out, "decode_ms_per_token"), "") << r.out;
    EXPECT_NE(field(r.out, "generated_tokens_per_s"), "") << r.out;
    // With --decode-batch 0 no step is shared. Otherwise how many are
    // depends on how the sequences' prompts and steps interleave in time
    // (under ASan one sequence may finish before the next joins), so only
    // the count's presence is checked.
    const std::string seqs = field(r.out, "sequences");
    EXPECT_EQ(seqs.rfind("3, 12 tokens generated, ", 0), 0u) << r.out;
    if (flags.find("--decode-batch 0") != std::string::npos)
      EXPECT_NE(seqs.find(", 0 of them in steps shared"), std::string::npos) << r.out;
    else
      EXPECT_NE(seqs.find(" of them in steps shared"), std::string::npos) << r.out;
  }
}

TEST(GenerateApp, BadInputExitsWithAMessage) {
  const auto cfg = ag::test::tiny_model(model_variant::gpt2);
  temp_dir dir;
  ag::test::save_random_model(dir.str(), cfg);
  // Runs the program with `args`: it exits with `rc`, its output naming `says`.
  const auto refused = [](const std::string& args, int rc, const std::string& says = "") {
    const run_result r = run(args);
    EXPECT_EQ(r.rc, rc) << args << "\n" << r.out;
    if (!says.empty()) {
      EXPECT_NE(r.out.find(says), std::string::npos) << args << "\n" << r.out;
    }
  };
  refused("--model " + (dir / "missing") + " --prompt-ids 1", 1, "missing: no such folder");
  refused("--model " + dir.str() + " --prompt hello", 1, "has no tokenizer");
  refused("--model " + dir.str() + " --prompt-ids 1,41", 1, "prompt token 41 is outside the vocabulary of 41");
  refused("--model " + dir.str() + " --prompt-ids 1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17", 1,
          "17 tokens exceed n_positions 16");
  refused("--model " + dir.str() + " --prompt-ids 1 --devices bogus:3", 1, "bogus");
  refused("--model " + dir.str() + " --prompt-ids 1,x", 2, "'x' is not a token id");
  refused("--model " + dir.str(), 2);
  refused("--model " + dir.str() + " --prompt-ids 1 --prompt a", 2);
  refused("--model " + dir.str() + " --prompt-ids 1 --frobnicate 3", 2, "--frobnicate");
  refused("--model " + dir.str() + " --prompt-ids 1 --stages x", 2);
  refused("--model " + dir.str() + " --prompt-ids 1 --dtype f64", 2);
  refused("--model " + dir.str() + " --prompt-ids 1 --tp 0", 2, "--tp");
  refused("--model " + dir.str() + " --prompt-ids 1 --stop x", 1, "--stop needs the folder's tokenizer");
  // Several prompts: each checked, named by its index; one prompt's logits only.
  refused("--model " + dir.str() + " --prompt-ids 1,2 --prompt-ids 3,41", 1,
          "prompt 1's token 41 is outside the vocabulary of 41");
  refused("--model " + dir.str() + " --prompt-ids 1,2 --prompt-ids 3,y", 2, "--prompt-ids[1]: 'y' is not a token id");
  refused("--model " + dir.str() + " --prompt-ids 1 --prompt-ids 2 --dump-logits x.npy", 2,
          "--dump-logits writes one prompt's logits, got 2 prompts");
  refused("--model " + dir.str() + " --prompt-ids 1 --decode-batch 300", 2, "--decode-batch");
  // Layouts the planner refuses, naming why (exit 1): more devices per
  // stage than given, more than the model's 4 heads, too few for the stages.
  refused("--model " + dir.str() + " --prompt-ids 1 --devices sim:2 --tp 4", 1,
          "tensor_parallel degree 4 is larger than the 2 device(s) given");
  refused("--model " + dir.str() + " --prompt-ids 1,2 --max-new-tokens 3 --devices sim:5 --tp 5", 1,
          "fewer units than devices");
  refused("--model " + dir.str() + " --prompt-ids 1 --devices sim:4 --tp 2 --stages 3", 1,
          "3 stages x 2 tensor-parallel needs 6 devices, 4 given");
  // A broken tokenizer fails a text prompt; token ids still run, with a warning.
  ag::test::write_text(dir / "vocab.json", "{");
  ag::test::write_text(dir / "merges.txt", "");
  refused("--model " + dir.str() + " --prompt hello", 1, "vocab.json: not valid JSON");
  run_result r = run("--model " + dir.str() + " --prompt-ids 1,2");
  EXPECT_EQ(r.rc, 0) << r.out;
  EXPECT_NE(r.out.find("warning: no generated_text"), std::string::npos) << r.out;
  EXPECT_NE(field(r.out, "generated"), "") << r.out;
}

#ifdef AG_SAVE_MODEL_BINARY

namespace {

run_result save_model(const std::string& args) { return run_program(AG_SAVE_MODEL_BINARY, args); }

// The next `n` greedy tokens after `prompt` by the reference evaluator over
// the folder's model, comma-separated as actorgraph-generate prints them.
std::string reference_greedy(const hf_model& m, std::vector<int32_t> seq, int n) {
  std::string want;
  for (int t = 0; t < n; ++t) {
    const std::vector<float> row = ag::test::recomputed_last_logits(m, seq);
    if (row.empty()) return {};
    const auto next = static_cast<int32_t>(std::max_element(row.begin(), row.end()) - row.begin());
    want += (t ? "," : "") + std::to_string(next);
    seq.push_back(next);
  }
  return want;
}

std::string file_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

}  // namespace

// actorgraph-save-model writes what its flags ask for (the shape, the width
// flags, the dtype, shards), as a folder that hf_model reads back with that
// config and that actorgraph-generate runs as the reference evaluator does.
TEST(SaveModelApp, SavedFoldersHoldTheAskedShapeAndGenerateLikeTheReference) {
  struct want_shape {
    std::string flags;
    model_variant variant;
    int64_t layers, d_model, heads, kv_heads, d_ff, vocab;
    dtype type;
    attention_bias bias;
    bool tied;
    int64_t window;
    bool sharded;
  };
  const std::vector<want_shape> cases = {
      // LLaMA widths of the flags' own, f32, in shards of at most 1 MB (about 1.5 MB in all).
      {"--shape tiny-llama --layers 3 --d-model 96 --heads 6 --kv-heads 2 --d-ff 200 --vocab 500 --dtype f32 "
       "--shard-mb 1",
       model_variant::llama, 3, 96, 6, 2, 200, 500, dtype::f32, attention_bias::none, false, 0, true},
      // Qwen2's biases and tied head, with a sliding window.
      {"--shape tiny-qwen2 --sliding-window 4 --dtype f32", model_variant::llama, 2, 64, 4, 2, 160, 300, dtype::f32,
       attention_bias::qkv, true, 4, false},
      {"--shape tiny-gpt2 --dtype bf16", model_variant::gpt2, 2, 64, 4, 4, 256, 300, dtype::bf16,
       attention_bias::none, true, 0, false},
  };
  for (const want_shape& w : cases) {
    SCOPED_TRACE(w.flags);
    temp_dir dir;
    const run_result saved = save_model("--out " + (dir / "m") + " " + w.flags);
    ASSERT_EQ(saved.rc, 0) << saved.out;
    EXPECT_EQ(saved.out.rfind("saved ", 0), 0u) << saved.out;
    EXPECT_EQ(std::filesystem::exists(dir / "m/model.safetensors.index.json"), w.sharded);
    auto m = hf_model::open(dir / "m");
    ASSERT_TRUE(m.has_value()) << m.err().to_string();
    const transformer_config c = m->model_config(1);
    EXPECT_EQ(c.variant, w.variant);
    EXPECT_EQ(c.n_layers, w.layers);
    EXPECT_EQ(c.d_model, w.d_model);
    EXPECT_EQ(c.n_heads, w.heads);
    EXPECT_EQ(c.kv_heads(), w.kv_heads);
    EXPECT_EQ(c.d_ff, w.d_ff);
    EXPECT_EQ(c.vocab, w.vocab);
    EXPECT_EQ(m->dtype(), w.type);
    EXPECT_EQ(c.attn_bias, w.bias);
    EXPECT_EQ(c.tied_head(), w.tied);
    EXPECT_EQ(c.sliding_window, w.window);
    const std::string want = reference_greedy(*m, {3, 14, 15}, 3);
    const run_result r = run("--model " + (dir / "m") + " --prompt-ids 3,14,15 --max-new-tokens 3 --devices cpu:1");
    ASSERT_EQ(r.rc, 0) << r.out;
    EXPECT_EQ(field(r.out, "generated"), want) << r.out;
  }
}

// --seed decides the weights: the same seed writes the same bytes, another
// seed other ones.
TEST(SaveModelApp, TheSeedDecidesTheWeights) {
  temp_dir dir;
  for (const std::string at : {"a", "b", "c"}) {
    const run_result r =
        save_model("--out " + (dir / at) + " --shape tiny-llama --seed " + (at == "c" ? "8" : "7"));
    ASSERT_EQ(r.rc, 0) << r.out;
  }
  const std::string a = file_bytes(dir / "a/model.safetensors");
  ASSERT_FALSE(a.empty());
  EXPECT_EQ(a, file_bytes(dir / "b/model.safetensors"));
  EXPECT_NE(a, file_bytes(dir / "c/model.safetensors"));
}

// Flags out of range exit 2 naming the flag; a shape the builder cannot
// make, or a folder that cannot be written, exit 1 with the reason.
TEST(SaveModelApp, BadFlagsAndUnbuildableShapesExitWithAMessage) {
  temp_dir dir;
  const auto refused = [](const std::string& args, int rc, const std::string& says) {
    const run_result r = save_model(args);
    EXPECT_EQ(r.rc, rc) << args << "\n" << r.out;
    EXPECT_NE(r.out.find(says), std::string::npos) << args << "\n" << r.out;
  };
  refused("--shape tiny-llama", 2, "--out");
  refused("--out " + (dir / "x") + " --shape tiny-bert", 2, "--shape");
  refused("--out " + (dir / "x") + " --dtype f64", 2, "--dtype");
  refused("--out " + (dir / "x") + " --layers 1001", 2, "--layers");
  refused("--out " + (dir / "x") + " --shape tiny-gpt2 --heads 3", 1, "d_model 64 is not divisible by n_heads 3");
  // A folder under a regular file cannot be made.
  ag::test::write_text(dir / "file", "x");
  refused("--out " + (dir / "file/m") + " --shape tiny-gpt2", 1, "error: cannot make the folder " + (dir / "file/m"));
}

#endif

#else

TEST(GenerateApp, GreedyTokenAndDumpedLogitsEqualTheReference) {
  GTEST_SKIP() << "actorgraph-generate is not part of this build";
}

#endif
