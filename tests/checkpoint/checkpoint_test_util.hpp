#pragma once
// Helpers for the checkpoint tests: a temporary folder per test, raw
// safetensors files with any header (for bad-file cases), and tiny GPT-2 /
// LLaMA models saved as Hugging Face folders.
#include <gtest/gtest.h>

#include <atomic>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>
#include <unistd.h>
#include <vector>

#include "graph/models/transformer.hpp"
#include <nlohmann/json.hpp>

#include "graph/checkpoint/hf_model.hpp"
#include "graph/reference.hpp"
#include "graph/checkpoint/tokenizer.hpp"

#ifdef AG_HAVE_SENTENCEPIECE_TRAINER
#include <sentencepiece_trainer.h>
#endif

namespace ag::test {

/// A fresh folder under the system temp dir, removed with everything in it.
class temp_dir {
 public:
  temp_dir() {
    static std::atomic<int> serial{0};
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    std::string name = "ag_ckpt_" + std::to_string(::getpid()) + "_" + std::to_string(serial++);
    if (info) name += std::string("_") + info->name();
    path_ = std::filesystem::temp_directory_path() / name;
    std::filesystem::create_directories(path_);
  }
  ~temp_dir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  temp_dir(const temp_dir&) = delete;
  temp_dir& operator=(const temp_dir&) = delete;
  std::string str() const { return path_.string(); }
  std::string operator/(const std::string& f) const { return (path_ / f).string(); }

 private:
  std::filesystem::path path_;
};

inline void write_text(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << text;
}

/// A safetensors file with this header text and `data_bytes` bytes of data
/// (value i % 251); `declared` overrides the 8-byte header length.
inline void write_raw_safetensors(const std::string& path, const std::string& header, std::size_t data_bytes,
                                  int64_t declared = -1) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  uint64_t n = declared >= 0 ? static_cast<uint64_t>(declared) : header.size();
  for (int i = 0; i < 8; ++i, n >>= 8) out.put(static_cast<char>(n & 0xff));
  out << header;
  for (std::size_t i = 0; i < data_bytes; ++i) out.put(static_cast<char>(i % 251));
}

/// A tiny model of `variant` (2 layers, d 32, 4 heads, kv_heads for llama
/// GQA, vocab 41, seq 7) with weights large enough that every one matters.
inline models::transformer_config tiny_model(models::model_variant variant, int kv_heads = 0) {
  models::transformer_config c;
  c.variant = variant;
  c.n_layers = 2;
  c.d_model = 32;
  c.n_heads = 4;
  c.n_kv_heads = kv_heads;
  c.d_ff = 48;
  c.vocab = 41;
  c.seq_len = 7;
  c.batch = 1;
  c.max_positions = variant == models::model_variant::gpt2 ? 16 : 0;
  c.seed = 23;
  c.initializer_range = 0.2f;
  c.rope_theta = 5000.0f;
  c.eps = 1e-5f;
  return c;
}

/// Builds `cfg` with random weights and saves it into `dir` as a HF folder;
/// returns the in-memory graph (the reference for what is loaded back).
inline graph save_random_model(const std::string& dir, const models::transformer_config& cfg,
                               models::save_options options = {}) {
  auto g = models::build_transformer(cfg);
  EXPECT_TRUE(g.has_value()) << g.err().to_string();
  if (!g) return {};
  auto e = models::save_hf_model(dir, cfg, *g, options);
  EXPECT_FALSE(e) << e.to_string();
  return std::move(*g);
}

/// UTF-8 of one code point.
inline std::string u8(char32_t c) {
  std::string s;
  models::utf8_append(s, c);
  return s;
}

/// A small GPT-2 byte-level BPE vocabulary (264 ids) and its merges: id b is
/// byte b's symbol, then the merged symbols in merge order, then <|endoftext|>.
struct small_bpe {
  std::vector<std::pair<std::string, std::string>> merges = {
      {u8(0x120), "t"},  // "Ġ t"  (Ġ is the space byte)
      {"h", "e"},
      {u8(0x120) + "t", "he"},
      {"l", "l"},
      {"e", "ll"},
      {"e", "l"},  // ranked after "l l": "ell" must merge as e + ll, not el + l
      {"c", "a"},
  };
  nlohmann::json vocab = nlohmann::json::object();
  int32_t eot = 0;

  small_bpe() {
    for (int b = 0; b < 256; ++b) vocab[u8(models::gpt2_byte_to_unicode(static_cast<uint8_t>(b)))] = b;
    int32_t id = 256;
    for (const auto& [a, b] : merges) vocab[a + b] = id++;
    eot = id;
    vocab["<|endoftext|>"] = eot;
  }
  int32_t id(const std::string& s) const { return vocab.at(s).get<int32_t>(); }
  void write(const temp_dir& dir) const { write(dir.str()); }
  void write(const std::string& dir) const {
    write_text(dir + "/vocab.json", vocab.dump());
    std::string m = "#version: 0.2\n";
    for (const auto& [a, b] : merges) m += a + " " + b + "\n";
    write_text(dir + "/merges.txt", m);
  }
};

#ifdef AG_HAVE_SENTENCEPIECE_TRAINER
/// Trains a tiny BPE SentencePiece model (80 pieces) into dir/tokenizer.model
/// with the library's own trainer.
inline void train_sentencepiece(const temp_dir& dir) {
  std::string corpus;
  const char* lines[] = {"the quick brown fox jumps over the lazy dog", "a tokenizer turns text into pieces",
                         "pipelines run stages on devices", "the model reads its weights from a checkpoint",
                         "héllo wörld ünïcode text"};
  for (int k = 0; k < 40; ++k)
    for (const char* l : lines) corpus += std::string(l) + "\n";
  write_text(dir / "corpus.txt", corpus);
  const auto status = sentencepiece::SentencePieceTrainer::Train(
      "--input=" + (dir / "corpus.txt") + " --model_prefix=" + (dir / "tokenizer") +
      " --vocab_size=80 --model_type=bpe --character_coverage=1.0 --minloglevel=2 --num_threads=1");
  ASSERT_TRUE(status.ok()) << status.ToString();
}
#endif

// The last row of the logits of the plain forward pass over `tokens`.
inline std::vector<float> recomputed_last_logits(const models::hf_model& m, const std::vector<int32_t>& tokens) {
  const auto n = static_cast<int64_t>(tokens.size());
  auto g = m.build(n);
  EXPECT_TRUE(g.has_value()) << g.err().to_string();
  if (!g) return {};
  std::vector<int32_t> pos(tokens.size());
  for (std::size_t i = 0; i < pos.size(); ++i) pos[i] = static_cast<int32_t>(i);
  auto r = evaluate_reference(*g, {host_tensor::from_ints({1, n}, tokens), host_tensor::from_ints({n}, pos)});
  EXPECT_TRUE(r.has_value()) << r.err().to_string();
  if (!r) return {};
  const int64_t V = (*r)[0].dims()[2];
  std::vector<float> row(static_cast<std::size_t>(V));
  for (int64_t i = 0; i < V; ++i) row[static_cast<std::size_t>(i)] = (*r)[0].at((n - 1) * V + i);
  return row;
}

}  // namespace ag::test
