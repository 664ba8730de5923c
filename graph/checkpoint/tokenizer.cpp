#include "graph/checkpoint/tokenizer.hpp"

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

namespace ag::models {

expected<std::u32string> utf8_decode(std::string_view s) {
  std::u32string out;
  out.reserve(s.size());
  std::size_t i = 0;
  while (i < s.size()) {
    const auto b0 = static_cast<unsigned char>(s[i]);
    std::size_t len = 0;
    char32_t c = 0, min = 0;
    if (b0 < 0x80) len = 1, c = b0;
    else if ((b0 & 0xE0) == 0xC0) len = 2, c = b0 & 0x1F, min = 0x80;
    else if ((b0 & 0xF0) == 0xE0) len = 3, c = b0 & 0x0F, min = 0x800;
    else if ((b0 & 0xF8) == 0xF0) len = 4, c = b0 & 0x07, min = 0x10000;
    bool ok = len > 0 && i + len <= s.size();
    for (std::size_t k = 1; ok && k < len; ++k) {
      const auto b = static_cast<unsigned char>(s[i + k]);
      ok = (b & 0xC0) == 0x80;
      c = (c << 6) | (b & 0x3F);
    }
    if (!ok || c < min || c > 0x10FFFF || (c >= 0xD800 && c <= 0xDFFF))
      return error{errc::invalid_argument, "text is not valid UTF-8 at byte " + std::to_string(i)};
    out.push_back(c);
    i += len;
  }
  return out;
}

void utf8_append(std::string& out, char32_t c) {
  if (c < 0x80) {
    out += static_cast<char>(c);
  } else if (c < 0x800) {
    out += static_cast<char>(0xC0 | (c >> 6));
    out += static_cast<char>(0x80 | (c & 0x3F));
  } else if (c < 0x10000) {
    out += static_cast<char>(0xE0 | (c >> 12));
    out += static_cast<char>(0x80 | ((c >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (c & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (c >> 18));
    out += static_cast<char>(0x80 | ((c >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((c >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (c & 0x3F));
  }
}

expected<tokenizer_ptr> load_tokenizer(const std::string& dir) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const fs::path d(dir);
  if (fs::exists(d / "vocab.json", ec) && fs::exists(d / "merges.txt", ec))
    return load_bpe_tokenizer((d / "vocab.json").string(), (d / "merges.txt").string());
  if (fs::exists(d / "tokenizer.model", ec)) {
    bool add_bos = true;
    const fs::path cfg = d / "tokenizer_config.json";
    if (fs::exists(cfg, ec)) {
      std::ifstream in(cfg);
      std::ostringstream s;
      s << in.rdbuf();
      try {
        auto j = nlohmann::json::parse(s.str());
        if (auto it = j.find("add_bos_token"); j.is_object() && it != j.end()) {
          if (!it->is_boolean())
            return error{errc::invalid_argument, cfg.string() + ": 'add_bos_token' is not true or false"};
          add_bos = it->get<bool>();
        }
      } catch (const std::exception& ex) {
        return error{errc::invalid_argument, cfg.string() + ": not valid JSON: " + ex.what()};
      }
    }
    return load_sentencepiece_tokenizer((d / "tokenizer.model").string(), add_bos);
  }
  if (fs::exists(d / "tokenizer.json", ec)) return load_tokenizer_json((d / "tokenizer.json").string());
  return tokenizer_ptr{};
}

}  // namespace ag::models
