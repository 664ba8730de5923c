// Drives the checkpoint parsers' fuzz entry point without libFuzzer, so that
// every build runs it (CTest checkpoint.fuzz_smoke; under ASan in CI): seed
// inputs (a valid safetensors file, GPT-2 and LLaMA config.json files, text)
// and a fixed number of deterministic mutations of them (byte flips,
// interesting bytes, truncation, duplication, insertion). It passes when every
// input returns: a crash, hang or sanitizer report fails the test.
//   fuzz_checkpoint_smoke [iterations (default 20000)]
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "graph/checkpoint/tokenizer.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, std::size_t size);

namespace {

uint64_t next(uint64_t& s) {  // splitmix64
  uint64_t z = (s += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

std::vector<uint8_t> with_selector(uint8_t which, const std::string& body) {
  // Sized once and filled (GCC 12 misreads insert() into a 1-byte vector as out of bounds).
  std::vector<uint8_t> v(body.size() + 1);
  v[0] = which;
  std::copy(body.begin(), body.end(), v.begin() + 1);
  return v;
}

std::string safetensors_seed() {
  std::string header =
      R"({"__metadata__":{"format":"pt"},"a":{"dtype":"F32","shape":[2,3],"data_offsets":[0,24]},)"
      R"("b":{"dtype":"BF16","shape":[4],"data_offsets":[24,32]},"c":{"dtype":"I32","shape":[1,2],"data_offsets":[32,40]}})";
  header.append((8 - header.size() % 8) % 8, ' ');
  std::string file(8, '\0');
  uint64_t n = header.size();
  for (int i = 0; i < 8; ++i, n >>= 8) file[static_cast<std::size_t>(i)] = static_cast<char>(n & 0xff);
  file += header;
  for (int i = 0; i < 40; ++i) file += static_cast<char>(i * 37 + 11);
  return file;
}

// A Llama-3-style tokenizer.json: the byte alphabet, a few merges, Llama 3's
// Split regex, added tokens and a template.
std::string tokenizer_json_seed() {
  nlohmann::json vocab = nlohmann::json::object();
  const auto sym = [](uint8_t b) {
    std::string s;
    ag::models::utf8_append(s, ag::models::gpt2_byte_to_unicode(b));
    return s;
  };
  for (int b = 0; b < 256; ++b) vocab[sym(static_cast<uint8_t>(b))] = b;
  const std::string G = sym(' ');
  const std::vector<std::pair<std::string, std::string>> merges = {{G, "t"}, {"h", "e"}, {G + "t", "he"}, {"l", "l"}};
  nlohmann::json m = nlohmann::json::array();
  int id = 256;
  for (const auto& [a, b] : merges) {
    vocab[a + b] = id++;
    m.push_back(a + " " + b);
  }
  const std::string regex =
      R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
  nlohmann::json j = {
      {"added_tokens", {{{"id", 300}, {"content", "<|begin_of_text|>"}}, {{"id", 301}, {"content", "<|eot_id|>"}}}},
      {"normalizer", nullptr},
      {"pre_tokenizer",
       {{"type", "Sequence"},
        {"pretokenizers",
         {{{"type", "Split"}, {"pattern", {{"Regex", regex}}}, {"behavior", "Isolated"}, {"invert", false}},
          {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", false}}}}}},
      {"post_processor",
       {{"type", "TemplateProcessing"},
        {"single", {{{"SpecialToken", {{"id", "<|begin_of_text|>"}}}}, {{"Sequence", {{"id", "A"}}}}}},
        {"special_tokens", {{"<|begin_of_text|>", {{"id", "<|begin_of_text|>"}, {"ids", {300}}}}}}}},
      {"decoder", {{"type", "ByteLevel"}}},
      {"model", {{"type", "BPE"}, {"ignore_merges", true}, {"vocab", vocab}, {"merges", m}}}};
  return j.dump();
}

}  // namespace

int main(int argc, char** argv) {
  const long iterations = argc > 1 ? std::strtol(argv[1], nullptr, 10) : 20000;
  const std::vector<std::vector<uint8_t>> seeds = {
      with_selector(0, safetensors_seed()),
      with_selector(1, R"({"model_type":"gpt2","n_embd":64,"n_head":4,"n_layer":2,"n_positions":32,)"
                       R"("vocab_size":97,"activation_function":"gelu_new","eos_token_id":[1,2]})"),
      with_selector(1, R"({"model_type":"llama","hidden_size":64,"num_attention_heads":4,"num_key_value_heads":2,)"
                       R"("rope_parameters":{"rope_theta":10000.0,"rope_type":"default"},"dtype":"bfloat16"})"),
      with_selector(2, "Hello, world! I'm  here\n\n caf\xc3\xa9 \xf0\x9f\x99\x82 x\xc2\xb2 123"),
      with_selector(3, tokenizer_json_seed()),
  };
  const uint8_t interesting[] = {0, 1, 0x7f, 0x80, 0xff, '0', '9', '-', '"', '{', '}', '[', ']', ',', ':', ' ', '\''};
  uint64_t rng = 12345;
  long runs = 0;
  for (const auto& s : seeds) {
    LLVMFuzzerTestOneInput(s.data(), s.size());
    ++runs;
  }
  for (long it = 0; it < iterations; ++it) {
    std::vector<uint8_t> v = seeds[next(rng) % seeds.size()];
    const int edits = 1 + static_cast<int>(next(rng) % 4);
    for (int e = 0; e < edits && !v.empty(); ++e) {
      const std::size_t at = 1 + next(rng) % v.size();  // keep the selector byte
      switch (next(rng) % 5) {
        case 0:
          if (at < v.size()) v[at] ^= static_cast<uint8_t>(1u << (next(rng) % 8));
          break;
        case 1:
          if (at < v.size()) v[at] = interesting[next(rng) % sizeof interesting];
          break;
        case 2:
          v.resize(at);
          break;
        case 3: {
          const std::size_t len = std::min<std::size_t>(v.size() - at + 1, 1 + next(rng) % 16);
          std::vector<uint8_t> chunk(v.begin() + static_cast<long>(at - 1), v.begin() + static_cast<long>(at - 1 + len));
          v.insert(v.begin() + static_cast<long>(at), chunk.begin(), chunk.end());
          break;
        }
        default:
          v.insert(v.begin() + static_cast<long>(at), static_cast<uint8_t>(next(rng)));
      }
    }
    LLVMFuzzerTestOneInput(v.data(), v.size());
    ++runs;
  }
  std::printf("fuzz_checkpoint_smoke: %ld inputs, every one returned\n", runs);
  return 0;
}
