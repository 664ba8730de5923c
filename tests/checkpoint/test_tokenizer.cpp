// Tokenizers: GPT-2's byte-level BPE (byte alphabet, pre-tokenizer regex,
// merges by rank, special tokens) from small vocab.json / merges.txt files
// the tests write, and SentencePiece models the tests train with the
// library's own trainer (libsentencepiece_train, in Debian's package).
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <set>

#include "checkpoint_test_util.hpp"
#include "graph/checkpoint/tokenizer.hpp"
#include "graph/checkpoint/unicode_classes.hpp"

#ifdef AG_HAVE_SENTENCEPIECE_TRAINER
#include <sentencepiece_processor.h>
#include <sentencepiece_trainer.h>
#endif

using namespace ag;
using namespace ag::models;
using ag::test::small_bpe;
using ag::test::temp_dir;
using ag::test::u8;

TEST(Gpt2Bpe, ByteAlphabetIsGpt2s) {
  // Printable Latin-1 stands for itself; the others count up from U+0100 in byte order.
  EXPECT_EQ(gpt2_byte_to_unicode('A'), U'A');
  EXPECT_EQ(gpt2_byte_to_unicode('!'), U'!');
  EXPECT_EQ(gpt2_byte_to_unicode(0x00), 0x100u);
  EXPECT_EQ(gpt2_byte_to_unicode('\t'), 0x109u);  // 'ĉ'
  EXPECT_EQ(gpt2_byte_to_unicode('\n'), 0x10Au);  // 'Ċ'
  EXPECT_EQ(gpt2_byte_to_unicode(' '), 0x120u);   // 'Ġ'
  EXPECT_EQ(gpt2_byte_to_unicode(0x7F), 0x121u);
  EXPECT_EQ(gpt2_byte_to_unicode(0xA0), 0x142u);
  EXPECT_EQ(gpt2_byte_to_unicode(0xAD), 0x143u);  // the last of the 68 remapped bytes
  EXPECT_EQ(gpt2_byte_to_unicode(0xAE), 0xAEu);
  std::set<char32_t> all;
  for (int b = 0; b < 256; ++b) all.insert(gpt2_byte_to_unicode(static_cast<uint8_t>(b)));
  EXPECT_EQ(all.size(), 256u);
}

TEST(Gpt2Bpe, PretokenizerMatchesTheRegex) {
  // Expected pieces: GPT-2's pattern run by Python's `regex` module (the one
  // encoder.py and transformers' GPT2Tokenizer use) on the same strings.
  const std::vector<std::pair<std::string, std::vector<std::string>>> cases = {
      {"Hello world", {"Hello", " world"}},
      {"I'm here, they're 'there' and we'll've",
       {"I", "'m", " here", ",", " they", "'re", " '", "there", "'", " and", " we", "'ll", "'ve"}},
      {"  two  spaces   then\n\nnewlines\n",
       {" ", " two", " ", " spaces", "  ", " then", "\n", "\n", "newlines", "\n"}},
      {"trailing   ", {"trailing", "   "}},
      {"tabs\tand \t mixed", {"tabs", "\t", "and", " \t", " mixed"}},
      {"café naïve Ωμέγα 日本語", {"café", " naïve", " Ωμέγα", " 日本語"}},
      {"x² ½ Ⅻ 123abc 4.5", {"x", "²", " ½", " Ⅻ", " 123", "abc", " 4", ".", "5"}},
      {"emoji 🙂🙂 ok!!", {"emoji", " 🙂🙂", " ok", "!!"}},
      {"'S 'd 'x", {"'", "S", " '", "d", " '", "x"}},
      {"a\u3000b \u3000c", {"a", "\u3000", "b", " ", "\u3000", "c"}},
      {"end.", {"end", "."}},
      {"$$$ 100% (yes)", {"$$$", " 100", "%", " (", "yes", ")"}},
      {" leading", {" leading"}},
      {"\n", {"\n"}},
      {"", {}},
  };
  for (const auto& [text, want] : cases) {
    auto got = gpt2_pretokenize(text);
    ASSERT_TRUE(got.has_value()) << got.err().to_string();
    EXPECT_EQ(*got, want) << "text: " << text;
  }
}

TEST(Gpt2Bpe, MergesApplyByRankAndIdsComeFromTheVocabulary) {
  temp_dir dir;
  small_bpe v;
  v.write(dir);
  auto tok = load_tokenizer(dir.str());
  ASSERT_TRUE(tok.has_value()) << tok.err().to_string();
  ASSERT_NE(*tok, nullptr);
  EXPECT_EQ((*tok)->kind(), "gpt2 byte-level BPE");
  EXPECT_EQ((*tok)->vocab_size(), 256 + 7 + 1);
  const std::string G = u8(0x120);
  auto ids = (*tok)->encode("the cat tell");
  ASSERT_TRUE(ids.has_value()) << ids.err().to_string();
  // "the" -> t + he (no "t he" merge); " cat" -> Ġ + ca + t (Ġ t would need a
  // "Ġ c" pair first: no); " tell" -> Ġt + ell (l l before e l, then e ll).
  EXPECT_EQ(*ids, (std::vector<int32_t>{v.id("t"), v.id("he"), v.id(G), v.id("ca"), v.id("t"), v.id(G + "t"),
                                        v.id("ell")}));
  auto the = (*tok)->encode(" the");
  ASSERT_TRUE(the.has_value());
  EXPECT_EQ(*the, std::vector<int32_t>{v.id(G + "the")});
  // Bytes of non-ASCII text are byte tokens: "é" is C3 A9.
  auto e = (*tok)->encode("é");
  ASSERT_TRUE(e.has_value());
  EXPECT_EQ(*e, (std::vector<int32_t>{0xC3, 0xA9}));
}

TEST(Gpt2Bpe, SpecialTokensAndRoundTrips) {
  temp_dir dir;
  small_bpe v;
  v.write(dir);
  auto tok = load_bpe_tokenizer(dir / "vocab.json", dir / "merges.txt");
  ASSERT_TRUE(tok.has_value()) << tok.err().to_string();
  auto ids = (*tok)->encode("he<|endoftext|> the");
  ASSERT_TRUE(ids.has_value());
  EXPECT_EQ(*ids, (std::vector<int32_t>{v.id("he"), v.eot, v.id(u8(0x120) + "the")}));
  const std::vector<std::string> texts = {"Hello, world!\n", "café 日本語 🙂 x² \t\r\n end", "<|endoftext|>", "",
                                         "   ", "we'll've 'S", std::string("nul\0byte", 8)};
  for (const std::string& text : texts) {
    auto enc = (*tok)->encode(text);
    ASSERT_TRUE(enc.has_value()) << enc.err().to_string();
    auto dec = (*tok)->decode(*enc);
    ASSERT_TRUE(dec.has_value()) << dec.err().to_string();
    EXPECT_EQ(*dec, text);
  }
}

namespace {

// The pieces `ids[from..)` stream as after the context ids[0..from), and how
// many pushes held their text back. Where the context ends on a whole
// character every piece is whole UTF-8 (checked); a context that ends inside
// one (ids cut anywhere) has the rest of it come first.
struct streamed {
  std::string text;
  int held = 0;
};
streamed stream_from(const tokenizer_ptr& tok, const std::vector<int32_t>& ids, std::size_t from) {
  const std::vector<int32_t> context(ids.begin(), ids.begin() + static_cast<std::ptrdiff_t>(from));
  const bool whole = utf8_decode(*tok->decode(context)).has_value();
  text_stream ts(tok, context);
  streamed out;
  bool checked = whole;
  for (std::size_t i = from; i < ids.size(); ++i) {
    auto piece = ts.push(ids[i]);
    EXPECT_TRUE(piece.has_value()) << piece.err().to_string();
    if (!piece) return out;
    if (checked) {
      EXPECT_TRUE(utf8_decode(*piece).has_value()) << "token " << i << " streamed a cut character";
    }
    checked = checked || !piece->empty();  // past the rest of a character the context cut
    out.held += piece->empty();
    out.text += *piece;
  }
  auto rest = ts.finish();
  EXPECT_TRUE(rest.has_value());
  if (rest) out.text += *rest;
  return out;
}

}  // namespace

// Byte-level BPE: a multi-byte character whose bytes are separate tokens
// (the small vocabulary has no merges for them) prints once whole, and the
// pieces add up to the whole decode past the context, from every split.
TEST(TextStream, ByteLevelBpeHoldsCutCharactersBackAndAddsUpToTheDecode) {
  temp_dir dir;
  small_bpe v;
  v.write(dir);
  auto tok = load_bpe_tokenizer(dir / "vocab.json", dir / "merges.txt");
  ASSERT_TRUE(tok.has_value()) << tok.err().to_string();
  const std::string text = "he said café 日本語 🙂 x² the end";
  auto ids = (*tok)->encode(text);
  ASSERT_TRUE(ids.has_value());
  int cut_alone = 0;  // tokens that decode alone to a piece of a character
  for (int32_t id : *ids) cut_alone += !utf8_decode(*(*tok)->decode({id})).has_value();
  EXPECT_GE(cut_alone, 10) << "the text's characters are not cut over tokens: the test shows nothing";
  for (std::size_t from : {std::size_t{0}, std::size_t{1}, std::size_t{4}, ids->size() / 2}) {
    SCOPED_TRACE("context of " + std::to_string(from) + " tokens");
    const streamed s = stream_from(*tok, *ids, from);
    const std::string context = *(*tok)->decode(std::vector<int32_t>(ids->begin(), ids->begin() + static_cast<std::ptrdiff_t>(from)));
    EXPECT_EQ(s.text, text.substr(context.size()));
    EXPECT_GT(s.held, 0);
  }
  // A character the sequence leaves cut comes from finish(), as decode gives it.
  const auto jp = *(*tok)->encode("日");
  ASSERT_EQ(jp.size(), 3u);
  text_stream ts(*tok, {});
  EXPECT_EQ(*ts.push(jp[0]), "");
  EXPECT_EQ(*ts.push(jp[1]), "");
  EXPECT_EQ(*ts.finish(), std::string("日").substr(0, 2));
  EXPECT_EQ(*ts.finish(), "");
  // An id outside the vocabulary is an error and leaves the stream as it was.
  text_stream bad(*tok, {v.id("he")});
  auto err = bad.push(static_cast<int32_t>((*tok)->vocab_size()));
  ASSERT_FALSE(err.has_value());
  EXPECT_NE(err.err().message.find("not in the vocabulary"), std::string::npos) << err.err().message;
  EXPECT_EQ(*bad.push(v.id(u8(0x120) + "the")), " the");
  // A context id past the tokenizer's vocabulary (a padded model vocabulary) is left out of the window.
  text_stream padded(*tok, {v.id("he"), static_cast<int32_t>((*tok)->vocab_size()) + 3});
  EXPECT_EQ(*padded.push(v.id(u8(0x120) + "the")), " the");
}

TEST(Gpt2Bpe, BadInputAndBadFilesAreErrors) {
  temp_dir dir;
  small_bpe v;
  v.write(dir);
  auto tok = load_tokenizer(dir.str());
  ASSERT_TRUE(tok.has_value());
  auto bad = (*tok)->encode("ok \xC3(");
  ASSERT_FALSE(bad.has_value());
  EXPECT_NE(bad.err().message.find("not valid UTF-8 at byte 3"), std::string::npos) << bad.err().message;
  EXPECT_FALSE((*tok)->encode("\xED\xA0\x80").has_value()) << "a UTF-8 encoded surrogate";
  EXPECT_FALSE((*tok)->encode("\xC0\x80").has_value()) << "an overlong NUL";
  auto dec = (*tok)->decode({1, 5000});
  ASSERT_FALSE(dec.has_value());
  EXPECT_NE(dec.err().message.find("token id 5000"), std::string::npos) << dec.err().message;

  ag::test::write_text(dir / "merges.txt", "#version: 0.2\nh e\nthree parts here\n");
  auto t = load_tokenizer(dir.str());
  ASSERT_FALSE(t.has_value());
  EXPECT_NE(t.err().message.find("merges.txt: line 3"), std::string::npos) << t.err().message;
  v.write(dir);
  auto missing_byte = v.vocab;
  missing_byte.erase(u8(0x120));
  ag::test::write_text(dir / "vocab.json", missing_byte.dump());
  t = load_tokenizer(dir.str());
  ASSERT_FALSE(t.has_value());
  EXPECT_NE(t.err().message.find("vocab.json: byte 32"), std::string::npos) << t.err().message;
  ag::test::write_text(dir / "vocab.json", R"({"a": "x"})");
  t = load_tokenizer(dir.str());
  ASSERT_FALSE(t.has_value());
  EXPECT_NE(t.err().message.find("token 'a' has id \"x\""), std::string::npos) << t.err().message;
  ag::test::write_text(dir / "vocab.json", "[");
  EXPECT_FALSE(load_tokenizer(dir.str()).has_value());
}

TEST(Llama3Pretokenizer, MatchesTheRegex) {
  // Expected pieces: Llama 3's pattern (its tokenizer.json's Split regex)
  // run by Python's `regex` module, a backtracking engine like the
  // Oniguruma that HF tokenizers uses, on the same strings.
  const std::vector<std::pair<std::string, std::vector<std::string>>> cases = {
      {"Hello world", {"Hello", " world"}},
      {"I'm here, they're 'there' and WE'LL've",
       {"I", "'m", " here", ",", " they", "'re", " '", "there", "'", " and", " WE", "'LL", "'ve"}},
      {"  two  spaces   then\n\nnewlines\n", {" ", " two", " ", " spaces", "  ", " then", "\n\n", "newlines", "\n"}},
      {"trailing   ", {"trailing", "   "}},
      {"tabs\tand \t mixed", {"tabs", "\tand", " \t", " mixed"}},
      {"café naïve Ωμέγα 日本語", {"café", " naïve", " Ωμέγα", " 日本語"}},
      {"x² ½ Ⅻ 1234567abc 4.5", {"x", "²", " ", "½", " ", "Ⅻ", " ", "123", "456", "7", "abc", " ", "4", ".", "5"}},
      {"emoji 🙂🙂 ok!!", {"emoji", " 🙂🙂", " ok", "!!"}},
      {"'S 'd 'x", {"'S", " '", "d", " '", "x"}},
      {"a\u3000b \u3000c", {"a", "\u3000b", " ", "\u3000c"}},
      {"end.", {"end", "."}},
      {"$$$ 100% (yes)", {"$$$", " ", "100", "%", " (", "yes", ")"}},
      {" leading", {" leading"}},
      {"\n", {"\n"}},
      {"", {}},
      {"line one\r\n  \r\n\tindented", {"line", " one", "\r\n  \r\n", "\tindented"}},
      {"...hello!\n\nWorld?\n", {"...", "hello", "!\n\n", "World", "?\n"}},
      {"a  \n b", {"a", "  \n", " b"}},
      {"12345678", {"123", "456", "78"}},
      {"don't DON'T", {"don", "'t", " DON", "'T"}},
      {".net,js", {".net", ",js"}},
      {"x \n\n\n y", {"x", " \n\n\n", " y"}},
  };
  for (const auto& [text, want] : cases) {
    auto got = llama3_pretokenize(text);
    ASSERT_TRUE(got.has_value()) << got.err().to_string();
    EXPECT_EQ(*got, want) << "text: " << text;
  }
  EXPECT_FALSE(llama3_pretokenize("ok \xC3(").has_value()) << "invalid UTF-8";
}

namespace {

// A Llama-3-style tokenizer.json over small_bpe's vocabulary and merges:
// Llama 3's Split regex, ByteLevel, added tokens past the vocabulary, and a
// template that puts <|begin_of_text|> before a text.
nlohmann::json llama3_tokenizer_json(const ag::test::small_bpe& v, bool merges_as_pairs) {
  using nlohmann::json;
  json merges = json::array();
  for (const auto& [a, b] : v.merges) merges.push_back(merges_as_pairs ? json::array({a, b}) : json(a + " " + b));
  json model = {{"type", "BPE"}, {"dropout", nullptr}, {"unk_token", nullptr},
                {"continuing_subword_prefix", nullptr}, {"end_of_word_suffix", nullptr}, {"fuse_unk", false},
                {"byte_fallback", false}, {"ignore_merges", true}, {"vocab", v.vocab}, {"merges", merges}};
  const std::string regex =
      R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
  json pre = {{"type", "Sequence"},
              {"pretokenizers",
               json::array({{{"type", "Split"}, {"pattern", {{"Regex", regex}}}, {"behavior", "Isolated"}, {"invert", false}},
                            {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", true}, {"use_regex", false}}})}};
  json added = json::array({{{"id", 500}, {"content", "<|begin_of_text|>"}, {"single_word", false}, {"lstrip", false},
                             {"rstrip", false}, {"normalized", false}, {"special", true}},
                            {{"id", 501}, {"content", "<|eot_id|>"}, {"special", true}}});
  json post = {{"type", "Sequence"},
               {"processors",
                json::array({{{"type", "ByteLevel"}, {"add_prefix_space", true}, {"trim_offsets", false}, {"use_regex", true}},
                             {{"type", "TemplateProcessing"},
                              {"single", json::array({{{"SpecialToken", {{"id", "<|begin_of_text|>"}, {"type_id", 0}}}},
                                                      {{"Sequence", {{"id", "A"}, {"type_id", 0}}}}})},
                              {"pair", json::array()},
                              {"special_tokens",
                               {{"<|begin_of_text|>", {{"id", "<|begin_of_text|>"}, {"ids", {500}}, {"tokens", {"<|begin_of_text|>"}}}}}}}})}};
  return {{"version", "1.0"}, {"truncation", nullptr}, {"padding", nullptr}, {"added_tokens", added},
          {"normalizer", nullptr}, {"pre_tokenizer", pre}, {"post_processor", post},
          {"decoder", {{"type", "ByteLevel"}, {"add_prefix_space", true}, {"trim_offsets", true}, {"use_regex", true}}},
          {"model", model}};
}

}  // namespace

// A Llama-3-style tokenizer.json, the folder's only tokenizer: the BOS id
// first, Llama 3's pieces merged by rank (or taken whole: ignore_merges),
// the added tokens matched in the text and decoded as themselves; merges as
// "a b" strings or as pairs (newer files).
TEST(TokenizerJson, Llama3StyleEncodesWithBosAndRoundTrips) {
  using ag::test::small_bpe;
  small_bpe v;
  v.vocab[u8(0x120) + "cat"] = 401;  // a whole piece the merges cannot reach: ignore_merges takes it
  for (bool pairs : {false, true}) {
    SCOPED_TRACE(pairs ? "merges as pairs" : "merges as strings");
    temp_dir dir;
    ag::test::write_text(dir / "tokenizer.json", llama3_tokenizer_json(v, pairs).dump());
    auto tok = load_tokenizer(dir.str());
    ASSERT_TRUE(tok.has_value()) << tok.err().to_string();
    ASSERT_NE(*tok, nullptr);
    EXPECT_EQ((*tok)->kind(), "byte-level BPE (tokenizer.json, Llama 3's pre-tokenizer)");
    EXPECT_EQ((*tok)->vocab_size(), 502);
    const std::string G = u8(0x120);
    auto ids = (*tok)->encode("the cat tell<|eot_id|>123");
    ASSERT_TRUE(ids.has_value()) << ids.err().to_string();
    // <|begin_of_text|>; "the" -> t + he; " cat" whole (ignore_merges); " tell"
    // -> Ġt + ell; the added token; "123" one piece of three digit bytes.
    EXPECT_EQ(*ids, (std::vector<int32_t>{500, v.id("t"), v.id("he"), 401, v.id(G + "t"), v.id("ell"), 501, '1', '2', '3'}));
    const std::vector<std::string> texts = {"Hello, world!\n", "café 日本語 🙂 x² \t\r\n end", "<|eot_id|>", "",
                                           "   ", "we'll've 'S", "12345678 ok"};
    for (const std::string& text : texts) {
      auto enc = (*tok)->encode(text);
      ASSERT_TRUE(enc.has_value()) << enc.err().to_string();
      ASSERT_FALSE(enc->empty());
      EXPECT_EQ(enc->front(), 500) << "the template's <|begin_of_text|> first";
      auto dec = (*tok)->decode(std::vector<int32_t>(enc->begin() + 1, enc->end()));
      ASSERT_TRUE(dec.has_value()) << dec.err().to_string();
      EXPECT_EQ(*dec, text);
    }
  }
}

// GPT-2's own tokenizer.json (ByteLevel with its regex, no template) encodes
// as its vocab.json + merges.txt do; vocab.json + merges.txt and
// tokenizer.model come before a tokenizer.json in a folder.
TEST(TokenizerJson, Gpt2StyleEqualsTheVocabFilesAndFolderOrder) {
  using nlohmann::json;
  ag::test::small_bpe v;
  json j = llama3_tokenizer_json(v, false);
  j["pre_tokenizer"] = {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", true}, {"use_regex", true}};
  j["post_processor"] = nullptr;
  j["added_tokens"] = json::array({{{"id", v.eot}, {"content", "<|endoftext|>"}, {"special", true}}});
  j["model"]["ignore_merges"] = false;
  temp_dir dir;
  ag::test::write_text(dir / "tokenizer.json", j.dump());
  auto from_json = load_tokenizer(dir.str());
  ASSERT_TRUE(from_json.has_value()) << from_json.err().to_string();
  EXPECT_EQ((*from_json)->kind(), "byte-level BPE (tokenizer.json, GPT-2's pre-tokenizer)");
  v.write(dir);  // vocab.json + merges.txt now too: they win
  auto from_files = load_tokenizer(dir.str());
  ASSERT_TRUE(from_files.has_value()) << from_files.err().to_string();
  EXPECT_EQ((*from_files)->kind(), "gpt2 byte-level BPE");
  for (const std::string text : {"the cat tell<|endoftext|> he", "I'm  here\n\n 123456 café"}) {
    auto a = (*from_json)->encode(text), b = (*from_files)->encode(text);
    ASSERT_TRUE(a.has_value() && b.has_value());
    EXPECT_EQ(*a, *b) << text;
  }
}

// What the loader does not implement is an error naming the file and the key.
TEST(TokenizerJson, KindsNotImplementedAndBadFilesNameTheKey) {
  using nlohmann::json;
  ag::test::small_bpe v;
  const json good = llama3_tokenizer_json(v, false);
  struct bad_case {
    std::string what;
    std::function<void(json&)> change;
    std::string key;
  };
  const std::vector<bad_case> cases = {
      {"Unigram", [](json& j) { j["model"]["type"] = "Unigram"; }, "'model.type': \"Unigram\" is not implemented"},
      {"byte fallback", [](json& j) { j["model"]["byte_fallback"] = true; }, "'model.byte_fallback'"},
      {"a normalizer", [](json& j) { j["normalizer"] = {{"type", "NFKC"}}; },
       "'normalizer': \"NFKC\" is not implemented (null and NFC are)"},
      {"another regex", [](json& j) { j["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = "\\p{N}"; },
       "'pre_tokenizer': the Split regex"},
      {"Metaspace", [](json& j) { j["pre_tokenizer"] = {{"type", "Metaspace"}}; }, "'pre_tokenizer'"},
      {"a merge of three", [](json& j) { j["model"]["merges"][1] = "a b c"; }, "'model.merges': entry 1"},
      {"no vocab", [](json& j) { j["model"].erase("vocab"); }, "'model.vocab': missing"},
      {"lstrip", [](json& j) { j["added_tokens"][1]["lstrip"] = true; }, "'<|eot_id|>': lstrip true"},
      {"a template naming nothing", [](json& j) { j["post_processor"]["processors"][1]["special_tokens"] = json::object(); },
       "'post_processor'"},
      {"another decoder", [](json& j) { j["decoder"] = {{"type", "WordPiece"}}; }, "'decoder'"},
      {"a missing byte", [](json& j) { j["model"]["vocab"].erase(u8(0x120)); }, "byte 32"},
      {"an id too large", [](json& j) { j["added_tokens"][0]["id"] = 1 << 30; }, "outside [0, 2^24]"},
  };
  for (const bad_case& c : cases) {
    SCOPED_TRACE(c.what);
    json j = good;
    c.change(j);
    temp_dir dir;
    ag::test::write_text(dir / "tokenizer.json", j.dump());
    auto tok = load_tokenizer(dir.str());
    ASSERT_FALSE(tok.has_value());
    EXPECT_EQ(tok.err().code, errc::invalid_argument);
    EXPECT_NE(tok.err().message.find("tokenizer.json: "), std::string::npos) << tok.err().message;
    EXPECT_NE(tok.err().message.find(c.key), std::string::npos) << tok.err().message;
  }
  temp_dir dir;
  ag::test::write_text(dir / "tokenizer.json", "{\"model\": ");
  auto tok = load_tokenizer(dir.str());
  ASSERT_FALSE(tok.has_value());
  EXPECT_NE(tok.err().message.find("not valid JSON"), std::string::npos) << tok.err().message;
}

// NFC (UAX #15), what Qwen2's tokenizer.json normalises to; each case as
// Python's unicodedata.normalize("NFC", ...) gives it.
TEST(UnicodeNfc, ComposesReordersAndKeepsTheExclusions) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"plain ASCII stays", "plain ASCII stays"},
      {"cafe\u0301", "caf\u00e9"},                  // e + combining acute -> é
      {"caf\u00e9", "caf\u00e9"},                    // already composed
      {"\u212b", "\u00c5"},                          // ANGSTROM SIGN, a singleton -> Å
      {"\u2126", "\u03a9"},                          // OHM SIGN -> Ω
      {"a\u0302\u0323", "\u1ead"},                   // marks out of canonical order (230 before 220) -> ậ
      {"a\u0323\u0302", "\u1ead"},
      {"\u1100\u1161\u11a8", "\uac01"},             // Hangul jamo L V T -> 각
      {"\u1100\u1161", "\uac00"},                    // L V -> 가
      {"\uac00\u11a8", "\uac01"},                    // LV + T
      {"\u0958", "\u0915\u093c"},                    // DEVANAGARI QA: a composition exclusion, stays apart
      {"\u0915\u093c", "\u0915\u093c"},
      {"e\u0301\u0301", "\u00e9\u0301"},            // the second acute is blocked by the first (same class)
      {"\u0301a", "\u0301a"},                         // a mark with no starter before it
      {"\u1e9b\u0323", "\u1e9b\u0323"},             // long s with dot above, then dot below (UAX #15's example)
      {"A\u030a\U0001F642", "\u00c5\U0001F642"},
  };
  for (const auto& [in, want] : cases) EXPECT_EQ(ag::models::to_nfc(in), want) << "input: " << in;
}

TEST(Qwen2Pretokenizer, IsLlama3sWithDigitsOneByOne) {
  const std::vector<std::pair<std::string, std::vector<std::string>>> cases = {
      {"12345678 ok", {"1", "2", "3", "4", "5", "6", "7", "8", " ok"}},
      {"x\u00b2 4.5%", {"x", "\u00b2", " ", "4", ".", "5", "%"}},
      {"I'm here, WE'LL", {"I", "'m", " here", ",", " WE", "'LL"}},
      {"  two  spaces\n\nend", {" ", " two", " ", " spaces", "\n\n", "end"}},
  };
  for (const auto& [text, want] : cases) {
    auto got = ag::models::qwen2_pretokenize(text);
    ASSERT_TRUE(got.has_value()) << got.err().to_string();
    EXPECT_EQ(*got, want) << "text: " << text;
  }
}

// A Qwen2-style tokenizer.json (transformers' Qwen2 converter: NFC, Llama
// 3's regex with single digits, ByteLevel, no template): text is normalised
// before it is cut (decomposed and composed spellings give the same ids),
// added tokens are matched first, digits never merge across each other.
TEST(TokenizerJson, Qwen2StyleNormalisesToNfcAndSplitsDigits) {
  using nlohmann::json;
  ag::test::small_bpe v;
  v.merges.push_back({"1", "2"});
  v.vocab["12"] = 402;
  json j = llama3_tokenizer_json(v, false);
  j["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] =
      R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
  j["normalizer"] = {{"type", "NFC"}};
  j["post_processor"] = {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", false}, {"use_regex", false}};
  j["model"]["ignore_merges"] = false;
  temp_dir dir;
  ag::test::write_text(dir / "tokenizer.json", j.dump());
  auto tok = load_tokenizer(dir.str());
  ASSERT_TRUE(tok.has_value()) << tok.err().to_string();
  EXPECT_EQ((*tok)->kind(), "byte-level BPE (tokenizer.json, Qwen2's pre-tokenizer, NFC)");
  auto composed = (*tok)->encode("caf\u00e9 \u00c5"), decomposed = (*tok)->encode("cafe\u0301 \u212b");
  ASSERT_TRUE(composed.has_value() && decomposed.has_value());
  EXPECT_EQ(*composed, *decomposed) << "NFC first";
  auto dec = (*tok)->decode(*decomposed);
  ASSERT_TRUE(dec.has_value());
  EXPECT_EQ(*dec, "caf\u00e9 \u00c5") << "decoding gives the normalised text";
  // "123": the merge "1 2" never applies (each digit is its own piece);
  // Llama 3's regex, over the same vocabulary, keeps the three together.
  auto digits = (*tok)->encode("123<|eot_id|>");
  ASSERT_TRUE(digits.has_value());
  EXPECT_EQ(*digits, (std::vector<int32_t>{'1', '2', '3', 501}));
  json l3 = llama3_tokenizer_json(v, false);
  l3["post_processor"] = nullptr;
  l3["model"]["ignore_merges"] = false;
  temp_dir dir3;
  ag::test::write_text(dir3 / "tokenizer.json", l3.dump());
  auto llama3 = load_tokenizer(dir3.str());
  ASSERT_TRUE(llama3.has_value()) << llama3.err().to_string();
  auto l3_digits = (*llama3)->encode("123");
  ASSERT_TRUE(l3_digits.has_value());
  EXPECT_EQ(*l3_digits, (std::vector<int32_t>{402, '3'}));
}

TEST(Tokenizer, FolderWithoutTokenizerGivesNone) {
  temp_dir dir;
  auto tok = load_tokenizer(dir.str());
  ASSERT_TRUE(tok.has_value()) << tok.err().to_string();
  EXPECT_EQ(*tok, nullptr);
}

#ifdef AG_HAVE_SENTENCEPIECE_TRAINER

using ag::test::train_sentencepiece;

TEST(SentencePiece, TrainedModelEncodesLikeTheLibraryWithBos) {
  temp_dir dir;
  train_sentencepiece(dir);
  auto tok = load_tokenizer(dir.str());
  ASSERT_TRUE(tok.has_value()) << tok.err().to_string();
  ASSERT_NE(*tok, nullptr);
  EXPECT_EQ((*tok)->kind(), "sentencepiece");
  EXPECT_EQ((*tok)->vocab_size(), 80);
  sentencepiece::SentencePieceProcessor sp;
  ASSERT_TRUE(sp.Load(dir / "tokenizer.model").ok());
  for (const std::string text : {"the quick fox", "héllo pipelines", "unseen words zq"}) {
    auto ids = (*tok)->encode(text);
    ASSERT_TRUE(ids.has_value()) << ids.err().to_string();
    std::vector<int> want;
    ASSERT_TRUE(sp.Encode(text, &want).ok());
    ASSERT_FALSE(ids->empty());
    EXPECT_EQ((*ids)[0], sp.bos_id()) << "LlamaTokenizer prepends BOS";
    EXPECT_EQ(std::vector<int32_t>(ids->begin() + 1, ids->end()), std::vector<int32_t>(want.begin(), want.end()));
    EXPECT_GT(ids->size(), 2u);
    auto back = (*tok)->decode(*ids);
    ASSERT_TRUE(back.has_value()) << back.err().to_string();
    EXPECT_EQ(*back, text);
  }
  auto dec = (*tok)->decode({3, 80});
  ASSERT_FALSE(dec.has_value());
  EXPECT_NE(dec.err().message.find("token id 80"), std::string::npos);
  EXPECT_FALSE((*tok)->encode("\xff").has_value());
}

// SentencePiece drops the space a piece starts with when it is the first one
// decoded: decoded token by token, "the quick brown fox" runs together. The
// stream keeps every space, the first generated word's too (the context's
// last tokens are decoded with it).
TEST(SentencePiece, TextStreamKeepsTheSpacesThatDecodingTokensAloneDrops) {
  temp_dir dir;
  train_sentencepiece(dir);
  auto tok = load_tokenizer(dir.str());
  ASSERT_TRUE(tok.has_value()) << tok.err().to_string();
  const std::string text = "the quick brown fox jumps over the lazy dog";
  auto ids = (*tok)->encode(text);
  ASSERT_TRUE(ids.has_value());
  std::string alone;
  for (std::size_t i = 1; i < ids->size(); ++i) alone += *(*tok)->decode({(*ids)[i]});
  EXPECT_EQ(alone.find(' '), std::string::npos) << "decoded alone, the pieces keep their spaces: the test shows nothing";
  const std::size_t from = 4;  // BOS and "the quick"'s pieces, say
  const std::string context = *(*tok)->decode(std::vector<int32_t>(ids->begin(), ids->begin() + from));
  const streamed s = stream_from(*tok, *ids, from);
  EXPECT_EQ(context + s.text, text);
  EXPECT_NE(s.text.find(' '), std::string::npos);
}

TEST(SentencePiece, TokenizerConfigTurnsBosOffAndBadFilesAreErrors) {
  temp_dir dir;
  train_sentencepiece(dir);
  ag::test::write_text(dir / "tokenizer_config.json", R"({"add_bos_token": false})");
  auto tok = load_tokenizer(dir.str());
  ASSERT_TRUE(tok.has_value()) << tok.err().to_string();
  auto ids = (*tok)->encode("the fox");
  ASSERT_TRUE(ids.has_value());
  sentencepiece::SentencePieceProcessor sp;
  ASSERT_TRUE(sp.Load(dir / "tokenizer.model").ok());
  std::vector<int> want;
  ASSERT_TRUE(sp.Encode("the fox", &want).ok());
  EXPECT_EQ(*ids, std::vector<int32_t>(want.begin(), want.end()));
  ag::test::write_text(dir / "tokenizer_config.json", R"({"add_bos_token": "yes"})");
  auto bad_cfg = load_tokenizer(dir.str());
  ASSERT_FALSE(bad_cfg.has_value());
  EXPECT_NE(bad_cfg.err().message.find("'add_bos_token'"), std::string::npos);
  std::filesystem::remove(dir / "tokenizer_config.json");
  ag::test::write_text(dir / "tokenizer.model", "not a protobuf");
  auto bad = load_tokenizer(dir.str());
  ASSERT_FALSE(bad.has_value());
  EXPECT_NE(bad.err().message.find(dir / "tokenizer.model"), std::string::npos) << bad.err().message;
}

#else

TEST(SentencePiece, TrainedModelEncodesLikeTheLibraryWithBos) {
  GTEST_SKIP() << "built without libsentencepiece / libsentencepiece_train (libsentencepiece-dev)";
}

#endif
