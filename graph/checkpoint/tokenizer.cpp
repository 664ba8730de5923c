#include "graph/checkpoint/tokenizer.hpp"

#include <algorithm>
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

namespace {

// Whether `s` ends inside a character: a UTF-8 sequence cut off (byte-level
// BPE hands on raw bytes) or U+FFFD (SentencePiece's decoding of a byte
// piece without the rest of its character).
bool ends_cut(const std::string& s) {
  if (s.size() >= 3 && s.compare(s.size() - 3, 3, "\xEF\xBF\xBD") == 0) return true;
  // The last lead byte within 4 of the end, and whether its sequence is whole.
  for (std::size_t back = 1; back <= std::min<std::size_t>(4, s.size()); ++back) {
    const auto b = static_cast<unsigned char>(s[s.size() - back]);
    if ((b & 0xC0) == 0x80) continue;  // a continuation byte
    const std::size_t need = b < 0x80 ? 1 : (b & 0xE0) == 0xC0 ? 2 : (b & 0xF0) == 0xE0 ? 3 : (b & 0xF8) == 0xF0 ? 4 : 1;
    return back < need;
  }
  return false;  // only continuation bytes: invalid, not cut; print it as it is
}

// Tokens of the context decoded with the first pushed ones (transformers'
// streamers and vLLM use 5): enough that a piece's leading space survives.
constexpr std::size_t kContextTokens = 5;

}  // namespace

text_stream::text_stream(tokenizer_ptr tok, const std::vector<int32_t>& context)
    : tok_(std::move(tok)), ids_(context), unprinted_(context.size()) {
  printed_from_ = unprinted_ > kContextTokens ? unprinted_ - kContextTokens : 0;
  // A context id the tokenizer cannot decode (a model's vocabulary may be
  // padded past its tokenizer's) would fail every window: start after it.
  for (std::size_t i = printed_from_; i < unprinted_; ++i)
    if (ids_[i] < 0 || ids_[i] >= tok_->vocab_size()) printed_from_ = i + 1;
}

expected<std::string> text_stream::window(std::size_t end) const {
  return tok_->decode(std::vector<int32_t>(ids_.begin() + static_cast<std::ptrdiff_t>(printed_from_),
                                           ids_.begin() + static_cast<std::ptrdiff_t>(end)));
}

expected<std::string> text_stream::push(int32_t id) {
  ids_.push_back(id);
  auto before = window(unprinted_);
  auto after = before ? window(ids_.size()) : before;
  if (!after) {
    ids_.pop_back();
    return after.err();
  }
  if (after->size() <= before->size() || ends_cut(*after)) return std::string();
  std::string added = after->substr(before->size());
  printed_from_ = unprinted_;
  unprinted_ = ids_.size();
  return added;
}

expected<std::string> text_stream::finish() {
  if (unprinted_ == ids_.size()) return std::string();
  auto before = window(unprinted_);
  auto after = before ? window(ids_.size()) : before;
  if (!after) return after.err();
  printed_from_ = unprinted_ = ids_.size();
  return after->size() > before->size() ? after->substr(before->size()) : std::string();
}

stop_strings::stop_strings(tokenizer_ptr tok, const std::vector<int32_t>& context, std::vector<std::string> stops)
    : stream_(std::move(tok), context), stops_(std::move(stops)) {}

bool stop_strings::push(int32_t id) {
  auto piece = stream_.push(id);
  if (!piece) return false;
  const std::size_t from = text_.size();
  text_ += *piece;
  for (const std::string& s : stops_)
    if (!s.empty() && text_.find(s, from > s.size() ? from - s.size() : 0) != std::string::npos) return true;
  return false;
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
