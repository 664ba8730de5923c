// GPT-2's byte-level BPE (encoder.py / transformers' GPT2Tokenizer).
#include <algorithm>
#include <array>
#include <cerrno>
#include <climits>
#include <cstring>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <sstream>
#include <unordered_map>

#include "graph/checkpoint/tokenizer.hpp"
#include "graph/checkpoint/unicode_classes.hpp"

namespace ag::models {

namespace {

// bytes_to_unicode(): printable bytes ('!'..'~', '¡'..'¬', '®'..'ÿ') stand for
// themselves, the others take U+0100 + n in byte order.
std::array<char32_t, 256> make_byte_map() {
  std::array<char32_t, 256> m{};
  char32_t next = 256;
  for (int b = 0; b < 256; ++b) {
    const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
    m[static_cast<std::size_t>(b)] = printable ? static_cast<char32_t>(b) : next++;
  }
  return m;
}
const std::array<char32_t, 256> byte_map = make_byte_map();

bool is_other(char32_t c) { return !is_unicode_space(c) && !is_unicode_letter(c) && !is_unicode_number(c); }

// Length (in code points) of the regex match at position i of cp.
std::size_t match_at(const std::u32string& cp, std::size_t i) {
  const std::size_t n = cp.size();
  // 's|'t|'re|'ve|'m|'ll|'d
  if (cp[i] == U'\'' && i + 1 < n) {
    const char32_t a = cp[i + 1];
    if (a == U's' || a == U't' || a == U'm' || a == U'd') return 2;
    if (i + 2 < n) {
      const char32_t b = cp[i + 2];
      if ((a == U'r' && b == U'e') || (a == U'v' && b == U'e') || (a == U'l' && b == U'l')) return 3;
    }
  }
  //  ?\p{L}+ |  ?\p{N}+ |  ?[^\s\p{L}\p{N}]+
  const std::size_t j = cp[i] == U' ' ? i + 1 : i;
  for (bool (*cls)(char32_t) : {+[](char32_t c) { return is_unicode_letter(c); },
                                +[](char32_t c) { return is_unicode_number(c); }, +[](char32_t c) { return is_other(c); }}) {
    // With the optional space taken; the match without it starts at a space
    // (cp[i] == ' '), which no class here contains, so it cannot succeed.
    if (j < n && cls(cp[j])) {
      std::size_t k = j;
      while (k < n && cls(cp[k])) ++k;
      return k - i;
    }
  }
  // \s+(?!\S) | \s+
  std::size_t k = i;
  while (k < n && is_unicode_space(cp[k])) ++k;
  if (k == n || k - i == 1) return k - i;
  return k - i - 1;  // leave the last space to start the next piece (" word")
}

class bpe_tokenizer final : public tokenizer {
 public:
  error load(const std::string& vocab_path, const std::string& merges_path) {
    std::ifstream vin(vocab_path, std::ios::binary);
    if (!vin) return error{errc::invalid_argument, vocab_path + ": cannot open: " + std::strerror(errno)};
    std::ostringstream vs;
    vs << vin.rdbuf();
    try {
      auto j = nlohmann::json::parse(vs.str());
      if (!j.is_object()) return error{errc::invalid_argument, vocab_path + ": not a JSON object of token -> id"};
      for (auto it = j.begin(); it != j.end(); ++it) {
        if (!it->is_number_integer() || it->get<int64_t>() < 0 || it->get<int64_t>() > INT32_MAX)
          return error{errc::invalid_argument, vocab_path + ": token '" + it.key() + "' has id " + it->dump() +
                                                   ", not an integer in [0, 2^31)"};
        const auto id = static_cast<int32_t>(it->get<int64_t>());
        vocab_[it.key()] = id;
        if (static_cast<std::size_t>(id) >= tokens_.size()) {
          if (id > (1 << 24)) return error{errc::invalid_argument, vocab_path + ": id " + it->dump() + " is implausibly large"};
          tokens_.resize(static_cast<std::size_t>(id) + 1);
          present_.resize(static_cast<std::size_t>(id) + 1, false);
        }
        tokens_[static_cast<std::size_t>(id)] = it.key();
        present_[static_cast<std::size_t>(id)] = true;
        if (it.key().size() > 4 && it.key().rfind("<|", 0) == 0 && it.key().compare(it.key().size() - 2, 2, "|>") == 0)
          specials_.push_back(it.key());
      }
    } catch (const std::exception& ex) {
      return error{errc::invalid_argument, vocab_path + ": not valid JSON: " + ex.what()};
    }
    // Longest first, so that at one position the longest special token wins.
    std::sort(specials_.begin(), specials_.end(), [](const auto& a, const auto& b) { return a.size() > b.size(); });
    for (int b = 0; b < 256; ++b) {
      std::string s;
      utf8_append(s, byte_map[static_cast<std::size_t>(b)]);
      if (!vocab_.count(s))
        return error{errc::invalid_argument, vocab_path + ": byte " + std::to_string(b) + " ('" + s +
                                                 "') is not in the vocabulary: not a byte-level BPE vocabulary"};
    }
    for (int b = 0; b < 256; ++b) unbyte_[byte_map[static_cast<std::size_t>(b)]] = static_cast<uint8_t>(b);

    std::ifstream min(merges_path, std::ios::binary);
    if (!min) return error{errc::invalid_argument, merges_path + ": cannot open: " + std::strerror(errno)};
    std::string line;
    int line_no = 0, rank = 0;
    while (std::getline(min, line)) {
      ++line_no;
      if (!line.empty() && line.back() == '\r') line.pop_back();
      if (line.empty() || (line_no == 1 && line.rfind("#version", 0) == 0)) continue;
      const auto sp = line.find(' ');
      if (sp == std::string::npos || sp == 0 || sp + 1 == line.size() || line.find(' ', sp + 1) != std::string::npos)
        return error{errc::invalid_argument, merges_path + ": line " + std::to_string(line_no) +
                                                 " is not two symbols separated by one space"};
      ranks_.emplace(line, rank++);  // first occurrence keeps its rank
    }
    return {};
  }

  expected<std::vector<int32_t>> encode(std::string_view text) const override {
    if (auto valid = utf8_decode(text); !valid) return valid.err();  // names the byte offset
    std::vector<int32_t> ids;
    std::size_t at = 0;
    while (at < text.size()) {
      // The next special token, if any, ends this plain-text segment.
      std::size_t next = text.size();
      const std::string* special = nullptr;
      for (const auto& s : specials_) {
        const std::size_t p = text.find(s, at);
        if (p < next) next = p, special = &s;
      }
      if (auto e = encode_plain(text.substr(at, next - at), ids)) return e;
      if (special) {
        ids.push_back(vocab_.at(*special));
        next += special->size();
      }
      at = next;
    }
    return ids;
  }

  expected<std::string> decode(const std::vector<int32_t>& ids) const override {
    std::string joined;
    for (int32_t id : ids) {
      if (id < 0 || static_cast<std::size_t>(id) >= tokens_.size() || !present_[static_cast<std::size_t>(id)])
        return error{errc::invalid_argument, "token id " + std::to_string(id) + " is not in the vocabulary"};
      joined += tokens_[static_cast<std::size_t>(id)];
    }
    auto cps = utf8_decode(joined);
    if (!cps) return cps.err();  // vocab.json was valid JSON, hence valid UTF-8: not reached
    std::string out;
    for (char32_t c : *cps) {
      auto it = unbyte_.find(c);
      if (it != unbyte_.end()) out += static_cast<char>(it->second);
      else utf8_append(out, c);  // a vocabulary entry outside the byte alphabet: keep it as text
    }
    return out;
  }

  int64_t vocab_size() const noexcept override { return static_cast<int64_t>(tokens_.size()); }
  std::string kind() const override { return "gpt2 byte-level BPE"; }

 private:
  // `text` is valid UTF-8 (checked whole by encode; special tokens are ASCII).
  error encode_plain(std::string_view text, std::vector<int32_t>& ids) const {
    auto pieces = gpt2_pretokenize(text);
    if (!pieces) return pieces.err();
    for (const std::string& piece : *pieces) {
      std::vector<std::string> sym;
      for (unsigned char b : piece) {
        std::string s;
        utf8_append(s, byte_map[b]);
        sym.push_back(std::move(s));
      }
      merge(sym);
      for (const auto& s : sym) {
        auto it = vocab_.find(s);
        if (it == vocab_.end()) return error{errc::invalid_argument, "BPE piece '" + s + "' is not in vocab.json"};
        ids.push_back(it->second);
      }
    }
    return {};
  }

  // Merges the adjacent pair of lowest rank everywhere, until none is left.
  void merge(std::vector<std::string>& sym) const {
    std::string key;
    while (sym.size() > 1) {
      int best = std::numeric_limits<int>::max();
      std::size_t best_at = 0;
      for (std::size_t i = 0; i + 1 < sym.size(); ++i) {
        key.assign(sym[i]).append(" ").append(sym[i + 1]);
        auto it = ranks_.find(key);
        if (it != ranks_.end() && it->second < best) best = it->second, best_at = i;
      }
      if (best == std::numeric_limits<int>::max()) return;
      const std::string a = sym[best_at], b = sym[best_at + 1];
      std::vector<std::string> out;
      out.reserve(sym.size());
      for (std::size_t i = 0; i < sym.size();) {
        if (i + 1 < sym.size() && sym[i] == a && sym[i + 1] == b) {
          out.push_back(a + b);
          i += 2;
        } else {
          out.push_back(std::move(sym[i]));
          ++i;
        }
      }
      sym = std::move(out);
    }
  }

  std::unordered_map<std::string, int32_t> vocab_;
  std::vector<std::string> tokens_;  // id -> token
  std::vector<bool> present_;
  std::vector<std::string> specials_;
  std::unordered_map<std::string, int> ranks_;  // "a b" -> merge rank
  std::unordered_map<char32_t, uint8_t> unbyte_;
};

}  // namespace

char32_t gpt2_byte_to_unicode(uint8_t b) noexcept { return byte_map[b]; }

expected<std::vector<std::string>> gpt2_pretokenize(std::string_view text) {
  auto cps = utf8_decode(text);
  if (!cps) return cps.err();
  // Byte offset of each code point, to cut pieces out of the original text.
  std::vector<std::size_t> offset;
  offset.reserve(cps->size() + 1);
  for (std::size_t i = 0; i < text.size(); ++i)
    if ((static_cast<unsigned char>(text[i]) & 0xC0) != 0x80) offset.push_back(i);
  offset.push_back(text.size());
  std::vector<std::string> pieces;
  for (std::size_t i = 0; i < cps->size();) {
    const std::size_t len = match_at(*cps, i);
    pieces.emplace_back(text.substr(offset[i], offset[i + len] - offset[i]));
    i += len;
  }
  return pieces;
}

expected<tokenizer_ptr> load_bpe_tokenizer(const std::string& vocab_json, const std::string& merges_txt) {
  try {
    auto t = std::make_shared<bpe_tokenizer>();
    if (auto e = t->load(vocab_json, merges_txt)) return e;
    return tokenizer_ptr(std::move(t));
  } catch (const std::exception& ex) {  // allocation failure
    return error{errc::invalid_argument, vocab_json + ": " + ex.what()};
  }
}

}  // namespace ag::models
