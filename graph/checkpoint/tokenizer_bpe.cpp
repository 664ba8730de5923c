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

bool is_cr_lf(char32_t c) { return c == U'\r' || c == U'\n'; }
char32_t ascii_lower(char32_t c) { return c >= U'A' && c <= U'Z' ? c + 32 : c; }

// Length (in code points) of Llama 3's pre-tokenizer regex match at
// position i of cp, the alternatives tried in order as the regex engine does:
//   (?i:'s|'t|'re|'ve|'m|'ll|'d) | [^\r\n\p{L}\p{N}]?\p{L}+ | \p{N}{1,3} |
//    ?[^\s\p{L}\p{N}]+[\r\n]* | \s*[\r\n]+ | \s+(?!\S) | \s+
// Qwen2's regex is the same with \p{N} (digits one at a time): max_digits 1.
std::size_t llama3_like_match_at(const std::u32string& cp, std::size_t i, std::size_t max_digits) {
  const std::size_t n = cp.size();
  if (cp[i] == U'\'' && i + 1 < n) {  // contractions, any case
    const char32_t a = ascii_lower(cp[i + 1]);
    if (a == U's' || a == U't' || a == U'm' || a == U'd') return 2;
    if (i + 2 < n) {
      const char32_t b = ascii_lower(cp[i + 2]);
      if ((a == U'r' && b == U'e') || (a == U'v' && b == U'e') || (a == U'l' && b == U'l')) return 3;
    }
  }
  const auto letters_from = [&](std::size_t k) {
    while (k < n && is_unicode_letter(cp[k])) ++k;
    return k;
  };
  // One char that is no CR, LF, letter or number (a space, punctuation),
  // then letters; or the letters alone.
  if (!is_cr_lf(cp[i]) && !is_unicode_letter(cp[i]) && !is_unicode_number(cp[i]) && i + 1 < n &&
      is_unicode_letter(cp[i + 1]))
    return letters_from(i + 1) - i;
  if (is_unicode_letter(cp[i])) return letters_from(i) - i;
  if (is_unicode_number(cp[i])) {  // digits by threes (Qwen2: one by one)
    std::size_t k = i;
    while (k < n && k - i < max_digits && is_unicode_number(cp[k])) ++k;
    return k - i;
  }
  // An optional space, symbols, then any CRs and LFs.
  const std::size_t j = cp[i] == U' ' && i + 1 < n && is_other(cp[i + 1]) ? i + 1 : i;
  if (is_other(cp[j])) {
    std::size_t k = j;
    while (k < n && is_other(cp[k])) ++k;
    while (k < n && is_cr_lf(cp[k])) ++k;
    return k - i;
  }
  // Whitespace from here on: up to its last CR or LF if it has one
  // (\s*[\r\n]+, the greedy \s* giving back to the last of them), else all of
  // it at the end of the text or before a single space (\s+(?!\S)), else it.
  std::size_t k = i;
  while (k < n && is_unicode_space(cp[k])) ++k;
  for (std::size_t m = k; m > i; --m)
    if (is_cr_lf(cp[m - 1])) return m - i;
  if (k == n || k - i == 1) return k - i;
  return k - i - 1;
}

std::size_t llama3_match_at(const std::u32string& cp, std::size_t i) { return llama3_like_match_at(cp, i, 3); }
std::size_t qwen2_match_at(const std::u32string& cp, std::size_t i) { return llama3_like_match_at(cp, i, 1); }

// Cuts UTF-8 `text` into the pieces `match` finds, one after the other.
expected<std::vector<std::string>> pretokenize(std::string_view text,
                                               std::size_t (*match)(const std::u32string&, std::size_t)) {
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
    const std::size_t len = match(*cps, i);
    pieces.emplace_back(text.substr(offset[i], offset[i + len] - offset[i]));
    i += len;
  }
  return pieces;
}

// The pre-tokenizer regexes tokenizer.json files carry, as transformers
// writes them (the Split pattern's "Regex", after JSON unescaping).
constexpr std::string_view gpt2_regex = R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";
constexpr std::string_view llama3_regex =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
constexpr std::string_view llama3_regex_cased =  // the same, contractions spelled without (?i:)
    R"((?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

// Qwen2's (Qwen2.5's too): Llama 3's with single digits.
constexpr std::string_view qwen2_regex =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

enum class pre_tokenizer { gpt2, llama3, qwen2 };

using json = nlohmann::json;

class bpe_tokenizer final : public tokenizer {
 public:
  error load(const std::string& vocab_path, const std::string& merges_path) {
    std::ifstream vin(vocab_path, std::ios::binary);
    if (!vin) return error{errc::invalid_argument, vocab_path + ": cannot open: " + std::strerror(errno)};
    std::ostringstream vs;
    vs << vin.rdbuf();
    try {
      auto j = json::parse(vs.str());
      if (!j.is_object()) return error{errc::invalid_argument, vocab_path + ": not a JSON object of token -> id"};
      if (auto e = add_vocab(j, vocab_path)) return e;
    } catch (const std::exception& ex) {
      return error{errc::invalid_argument, vocab_path + ": not valid JSON: " + ex.what()};
    }
    // Entries of the form <|...|> are GPT-2's special tokens.
    for (const auto& [token, id] : vocab_)
      if (token.size() > 4 && token.rfind("<|", 0) == 0 && token.compare(token.size() - 2, 2, "|>") == 0) {
        specials_.push_back(token);
        special_ids_[token] = id;
      }
    // Longest first, so that at one position the longest special token wins.
    std::sort(specials_.begin(), specials_.end(), [](const auto& a, const auto& b) { return a.size() > b.size(); });
    if (auto e = check_byte_alphabet(vocab_path)) return e;
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

  // Every token -> id of object `j` (ids in [0, 2^31), at most 2^24).
  error add_vocab(const json& j, const std::string& origin) {
    for (auto it = j.begin(); it != j.end(); ++it) {
      if (!it->is_number_integer() || it->get<int64_t>() < 0 || it->get<int64_t>() > INT32_MAX)
        return error{errc::invalid_argument, origin + ": token '" + it.key() + "' has id " + it->dump() +
                                                 ", not an integer in [0, 2^31)"};
      if (auto e = add_token(it.key(), it->get<int64_t>(), origin)) return e;
    }
    return {};
  }
  error add_token(const std::string& token, int64_t id64, const std::string& origin) {
    if (id64 < 0 || id64 > (1 << 24))
      return error{errc::invalid_argument, origin + ": token '" + token + "' has id " + std::to_string(id64) +
                                               ", outside [0, 2^24]"};
    const auto id = static_cast<int32_t>(id64);
    vocab_[token] = id;
    if (static_cast<std::size_t>(id) >= tokens_.size()) {
      tokens_.resize(static_cast<std::size_t>(id) + 1);
      present_.resize(static_cast<std::size_t>(id) + 1, false);
    }
    tokens_[static_cast<std::size_t>(id)] = token;
    present_[static_cast<std::size_t>(id)] = true;
    return {};
  }
  // A byte-level vocabulary has a token for each of the 256 bytes.
  error check_byte_alphabet(const std::string& origin) {
    for (int b = 0; b < 256; ++b) {
      std::string s;
      utf8_append(s, byte_map[static_cast<std::size_t>(b)]);
      if (!vocab_.count(s))
        return error{errc::invalid_argument, origin + ": byte " + std::to_string(b) + " ('" + s +
                                                 "') is not in the vocabulary: not a byte-level BPE vocabulary"};
    }
    for (int b = 0; b < 256; ++b) unbyte_[byte_map[static_cast<std::size_t>(b)]] = static_cast<uint8_t>(b);
    return {};
  }

  expected<std::vector<int32_t>> encode(std::string_view text) const override {
    if (auto valid = utf8_decode(text); !valid) return valid.err();  // names the byte offset
    std::vector<int32_t> ids = prefix_;
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
        ids.push_back(special_ids_.at(*special));
        next += special->size();
      }
      at = next;
    }
    ids.insert(ids.end(), suffix_.begin(), suffix_.end());
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
  std::string kind() const override { return kind_; }

  /// HF tokenizers' tokenizer.json of a byte-level BPE: the model (BPE:
  /// vocab, merges, ignore_merges), the pre-tokenizer (GPT-2's ByteLevel
  /// regex, or a Split by Llama 3's regex then ByteLevel without one), the
  /// added tokens (matched in the text first), a ByteLevel decoder, and the
  /// post-processor's template (the ids it puts around a single text:
  /// Llama 3's <|begin_of_text|>). Anything else is an error naming the key.
  error load_json(std::string_view text, const std::string& path) {
    json j;
    try {
      j = json::parse(text.begin(), text.end());
    } catch (const std::exception& ex) {
      return error{errc::invalid_argument, path + ": not valid JSON: " + ex.what()};
    }
    const auto bad = [&](const std::string& key, const std::string& what) {
      return error{errc::invalid_argument, path + ": '" + key + "': " + what};
    };
    const auto type_of = [](const json& o) {
      return o.is_object() && o.contains("type") && o["type"].is_string() ? o["type"].get<std::string>() : std::string("?");
    };
    if (!j.is_object()) return error{errc::invalid_argument, path + ": not a JSON object"};
    // The model: a byte-level BPE.
    if (!j.contains("model") || !j["model"].is_object()) return bad("model", "missing or not an object");
    const json& m = j["model"];
    if (m.contains("type") && type_of(m) != "BPE")
      return bad("model.type", "\"" + type_of(m) + "\" is not implemented (byte-level BPE is)");
    if (m.value("byte_fallback", false))
      return bad("model.byte_fallback", "true is not implemented (a SentencePiece-style BPE: use its tokenizer.model)");
    for (const char* k : {"continuing_subword_prefix", "end_of_word_suffix"})
      if (m.contains(k) && !m[k].is_null() && !(m[k].is_string() && m[k].get<std::string>().empty()))
        return bad(std::string("model.") + k, m[k].dump() + " is not implemented (null only)");
    if (m.contains("ignore_merges") && !m["ignore_merges"].is_boolean())
      return bad("model.ignore_merges", "not true or false");
    ignore_merges_ = m.value("ignore_merges", false);
    if (!m.contains("vocab") || !m["vocab"].is_object()) return bad("model.vocab", "missing or not an object of token -> id");
    if (auto e = add_vocab(m["vocab"], path + ": 'model.vocab'")) return e;
    if (!m.contains("merges") || !m["merges"].is_array()) return bad("model.merges", "missing or not an array");
    int rank = 0;
    for (const json& mg : m["merges"]) {
      std::string pair;
      if (mg.is_string()) pair = mg.get<std::string>();  // "a b" (older files)
      else if (mg.is_array() && mg.size() == 2 && mg[0].is_string() && mg[1].is_string())
        pair = mg[0].get<std::string>() + " " + mg[1].get<std::string>();  // ["a", "b"]
      const auto sp = pair.find(' ');
      if (sp == std::string::npos || sp == 0 || sp + 1 == pair.size() || pair.find(' ', sp + 1) != std::string::npos)
        return bad("model.merges", "entry " + std::to_string(rank) + " (" + mg.dump() + ") is not two symbols");
      ranks_.emplace(std::move(pair), rank++);
    }
    // The added tokens: matched in the text before anything else.
    if (j.contains("added_tokens") && !j["added_tokens"].is_null()) {
      if (!j["added_tokens"].is_array()) return bad("added_tokens", "not an array");
      for (const json& t : j["added_tokens"]) {
        if (!t.is_object() || !t.contains("id") || !t["id"].is_number_integer() || !t.contains("content") ||
            !t["content"].is_string() || t["content"].get<std::string>().empty())
          return bad("added_tokens", "entry " + t.dump() + " has no integer 'id' and text 'content'");
        const std::string content = t["content"].get<std::string>();
        for (const char* k : {"single_word", "lstrip", "rstrip"})
          if (t.value(k, false)) return bad("added_tokens", "'" + content + "': " + k + " true is not implemented");
        if (auto e = add_token(content, t["id"].get<int64_t>(), path + ": 'added_tokens'")) return e;
        special_ids_[content] = static_cast<int32_t>(t["id"].get<int64_t>());
        specials_.push_back(content);
      }
    }
    // The normalizer: none, or NFC (Qwen2's), applied to the text between added tokens.
    if (j.contains("normalizer") && !j["normalizer"].is_null()) {
      if (type_of(j["normalizer"]) != "NFC")
        return bad("normalizer", "\"" + type_of(j["normalizer"]) + "\" is not implemented (null and NFC are)");
      nfc_ = true;
    }
    // The pre-tokenizer: ByteLevel with GPT-2's regex, or a Split by GPT-2's
    // or Llama 3's regex followed by a ByteLevel without one.
    const json pre = j.value("pre_tokenizer", json());
    const auto byte_level = [&](const json& b, bool with_regex) {
      return type_of(b) == "ByteLevel" && !b.value("add_prefix_space", false) && b.value("use_regex", true) == with_regex;
    };
    if (byte_level(pre, true)) {
      pre_ = pre_tokenizer::gpt2;
    } else if (type_of(pre) == "Sequence" && pre.contains("pretokenizers") && pre["pretokenizers"].is_array() &&
               pre["pretokenizers"].size() == 2 && byte_level(pre["pretokenizers"][1], false)) {
      const json& split = pre["pretokenizers"][0];
      const json pattern = split.value("pattern", json());
      const std::string regex =
          pattern.is_object() && pattern.contains("Regex") && pattern["Regex"].is_string() ? pattern["Regex"].get<std::string>() : "";
      if (type_of(split) != "Split" || split.value("behavior", std::string()) != "Isolated" || split.value("invert", false))
        return bad("pre_tokenizer", "a Sequence whose first part is not an isolating Split: " + split.dump());
      if (regex == llama3_regex || regex == llama3_regex_cased) pre_ = pre_tokenizer::llama3;
      else if (regex == qwen2_regex) pre_ = pre_tokenizer::qwen2;
      else if (regex == gpt2_regex) pre_ = pre_tokenizer::gpt2;
      else return bad("pre_tokenizer", "the Split regex " + pattern.dump() + " is not implemented (GPT-2's, Llama 3's and Qwen2's are)");
    } else {
      return bad("pre_tokenizer", pre.dump() + " is not implemented (ByteLevel with GPT-2's regex, or Split by "
                                               "Llama 3's regex then ByteLevel)");
    }
    if (j.contains("decoder") && !j["decoder"].is_null() && type_of(j["decoder"]) != "ByteLevel")
      return bad("decoder", "\"" + type_of(j["decoder"]) + "\" is not implemented (ByteLevel is)");
    if (auto e = read_template(j.value("post_processor", json()), bad)) return e;
    if (auto e = check_byte_alphabet(path)) return e;
    std::sort(specials_.begin(), specials_.end(), [](const auto& a, const auto& b) { return a.size() > b.size(); });
    kind_ = std::string("byte-level BPE (tokenizer.json, ") +
            (pre_ == pre_tokenizer::llama3 ? "Llama 3's" : pre_ == pre_tokenizer::qwen2 ? "Qwen2's" : "GPT-2's") +
            " pre-tokenizer" + (nfc_ ? ", NFC" : "") + ")";
    return {};
  }

 private:
  // The ids a TemplateProcessing post-processor puts before and after a
  // single text (its "single" template's SpecialTokens around Sequence A),
  // inside a Sequence of processors or alone; ByteLevel ones change no ids.
  template <class Bad>
  error read_template(const json& pp, const Bad& bad) {
    const std::string type = pp.is_object() && pp.contains("type") ? pp["type"].get<std::string>() : "";
    if (pp.is_null() || type == "ByteLevel") return {};
    if (type == "Sequence") {
      for (const json& p : pp.value("processors", json::array()))
        if (auto e = read_template(p, bad)) return e;
      return {};
    }
    if (type != "TemplateProcessing") return bad("post_processor", "\"" + type + "\" is not implemented (TemplateProcessing and ByteLevel are)");
    bool after = false;
    for (const json& item : pp.value("single", json::array())) {
      if (item.contains("Sequence")) {
        after = true;
        continue;
      }
      const std::string name = item.contains("SpecialToken") ? item["SpecialToken"].value("id", std::string()) : "";
      const json& specials = pp.value("special_tokens", json::object());
      if (name.empty() || !specials.contains(name) || !specials[name].contains("ids") || !specials[name]["ids"].is_array())
        return bad("post_processor", "a template item " + item.dump() + " that names no special token with ids");
      for (const json& id : specials[name]["ids"]) {
        if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() >= static_cast<int64_t>(tokens_.size()) ||
            !present_[static_cast<std::size_t>(id.get<int64_t>())])
          return bad("post_processor", "special token '" + name + "' has id " + id.dump() + ", not in the vocabulary");
        (after ? suffix_ : prefix_).push_back(static_cast<int32_t>(id.get<int64_t>()));
      }
    }
    return {};
  }

  // `text` is valid UTF-8 (checked whole by encode; special tokens are matched whole).
  error encode_plain(std::string_view text, std::vector<int32_t>& ids) const {
    const std::string normalized = nfc_ ? to_nfc(text) : std::string();
    if (nfc_) text = normalized;
    auto pieces = pre_ == pre_tokenizer::llama3  ? pretokenize(text, llama3_match_at)
                  : pre_ == pre_tokenizer::qwen2 ? pretokenize(text, qwen2_match_at)
                                                 : gpt2_pretokenize(text);
    if (!pieces) return pieces.err();
    for (const std::string& piece : *pieces) {
      std::vector<std::string> sym;
      std::string word;
      for (unsigned char b : piece) {
        std::string s;
        utf8_append(s, byte_map[b]);
        word += s;
        sym.push_back(std::move(s));
      }
      if (ignore_merges_) {  // a piece the vocabulary has whole is that token
        if (auto it = vocab_.find(word); it != vocab_.end()) {
          ids.push_back(it->second);
          continue;
        }
      }
      merge(sym);
      for (const auto& s : sym) {
        auto it = vocab_.find(s);
        if (it == vocab_.end()) return error{errc::invalid_argument, "BPE piece '" + s + "' is not in the vocabulary"};
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
  std::unordered_map<std::string, int32_t> special_ids_;
  std::unordered_map<std::string, int> ranks_;  // "a b" -> merge rank
  std::unordered_map<char32_t, uint8_t> unbyte_;
  pre_tokenizer pre_ = pre_tokenizer::gpt2;
  bool nfc_ = false;  ///< normalizer NFC: text in NFC before the pre-tokenizer
  bool ignore_merges_ = false;
  std::vector<int32_t> prefix_, suffix_;  // the post-processor's ids around a text
  std::string kind_ = "gpt2 byte-level BPE";
};

}  // namespace

char32_t gpt2_byte_to_unicode(uint8_t b) noexcept { return byte_map[b]; }

expected<std::vector<std::string>> gpt2_pretokenize(std::string_view text) { return pretokenize(text, match_at); }

expected<std::vector<std::string>> llama3_pretokenize(std::string_view text) {
  return pretokenize(text, llama3_match_at);
}

expected<std::vector<std::string>> qwen2_pretokenize(std::string_view text) { return pretokenize(text, qwen2_match_at); }

expected<tokenizer_ptr> load_bpe_tokenizer(const std::string& vocab_json, const std::string& merges_txt) {
  try {
    auto t = std::make_shared<bpe_tokenizer>();
    if (auto e = t->load(vocab_json, merges_txt)) return e;
    return tokenizer_ptr(std::move(t));
  } catch (const std::exception& ex) {  // allocation failure
    return error{errc::invalid_argument, vocab_json + ": " + ex.what()};
  }
}

expected<tokenizer_ptr> parse_tokenizer_json(std::string_view text, const std::string& origin) {
  try {
    auto t = std::make_shared<bpe_tokenizer>();
    if (auto e = t->load_json(text, origin)) return e;
    return tokenizer_ptr(std::move(t));
  } catch (const std::exception& ex) {  // allocation failure, or a JSON value of a type the reads above did not check
    return error{errc::invalid_argument, origin + ": " + ex.what()};
  }
}

expected<tokenizer_ptr> load_tokenizer_json(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return error{errc::invalid_argument, path + ": cannot open: " + std::strerror(errno)};
  std::ostringstream text;
  text << in.rdbuf();
  return parse_tokenizer_json(text.str(), path);
}

}  // namespace ag::models
