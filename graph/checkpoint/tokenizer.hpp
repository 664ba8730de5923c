#pragma once
/// \file tokenizer.hpp
/// Text <-> token ids for a model folder. Token ids always work without a
/// tokenizer; when the folder has one, text works too:
/// - GPT-2's byte-level BPE (`vocab.json` + `merges.txt`): the exact
///   byte-to-unicode mapping of GPT-2's encoder.py, its pre-tokenizer regex
///   `'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+`
///   (implemented by hand over Unicode tables, see unicode_classes.hpp), then
///   merges by rank. Vocabulary entries of the form `<|...|>` (GPT-2's
///   `<|endoftext|>`) are special tokens: matched in the text before
///   pre-tokenizing, as transformers' added tokens are.
/// - HF tokenizers' `tokenizer.json` of a byte-level BPE (Llama 3.x's; GPT-2's
///   too): its vocab and merges (with ignore_merges), its pre-tokenizer
///   (GPT-2's regex, or Llama 3's
///   `(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`,
///   by hand too; or Qwen2's, the same with `\p{N}` for `\p{N}{1,3}`), its
///   normalizer (none, or NFC as Qwen2's: to_nfc, unicode_classes.hpp), its
///   added tokens (matched in the text first, not normalised) and its
///   post-processor's template (the ids around a text: Llama 3's
///   <|begin_of_text|>). Other normalizers, pre-tokenizers, models or
///   decoders are errors naming the key.
/// - SentencePiece (`tokenizer.model`, LLaMA-1/2 and Mistral) through
///   Debian's libsentencepiece; encode() prepends the BOS id as transformers'
///   LlamaTokenizer does (add_bos_token, default true; a tokenizer_config.json
///   with "add_bos_token": false turns it off).
///
/// Thread-safety: a tokenizer is immutable once loaded; encode() and decode()
/// may run on several threads at once.

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "graph/error.hpp"

namespace ag::models {

class tokenizer {
 public:
  virtual ~tokenizer() = default;
  /// Token ids of UTF-8 `text`. Errors (invalid_argument): invalid UTF-8
  /// (naming the byte offset), a piece the vocabulary lacks (naming it).
  virtual expected<std::vector<int32_t>> encode(std::string_view text) const = 0;
  /// The text of `ids` (bytes as the model produced them: a cut-off
  /// multi-byte character stays cut off). Errors: an id outside the vocabulary.
  virtual expected<std::string> decode(const std::vector<int32_t>& ids) const = 0;
  virtual int64_t vocab_size() const noexcept = 0;
  /// "gpt2 byte-level BPE" / "sentencepiece".
  virtual std::string kind() const = 0;
};
using tokenizer_ptr = std::shared_ptr<const tokenizer>;

/// The text of a sequence's tokens as they come, for printing while it
/// generates (the REPL's `generate`). Decoding each token alone is wrong
/// twice over: SentencePiece drops the space a piece starts with when it is
/// the first one decoded ("▁world" alone is "world"), and a character cut
/// over several tokens (byte-level BPE's multi-byte characters,
/// SentencePiece's byte pieces) comes out as broken bytes or U+FFFD. push()
/// decodes a short window that starts at the last token it printed (at
/// first, a few tokens back into the context) and returns what the new token
/// adds, once that ends on a whole character; a cut-off character waits for
/// the token that completes it, or for finish(). The pieces concatenated
/// equal decode(context + pushed) less decode(context), for tokenizers whose
/// decode of a longer run extends that of a shorter one (both here).
/// Not thread-safe: one per sequence, fed from one thread at a time.
class text_stream {
 public:
  /// `context`: the ids before the first pushed one (the prompt).
  text_stream(tokenizer_ptr tok, const std::vector<int32_t>& context);
  /// The text `id` completes: empty while a character is cut off. Errors:
  /// an id outside the vocabulary (nothing is kept of it).
  expected<std::string> push(int32_t id);
  /// What is still held back (a character the sequence left cut off, as
  /// decode() gives it), once; then empty.
  expected<std::string> finish();

 private:
  expected<std::string> window(std::size_t end) const;
  tokenizer_ptr tok_;
  std::vector<int32_t> ids_;
  std::size_t printed_from_ = 0;  // the window's first token (already printed)
  std::size_t unprinted_ = 0;     // ids_[unprinted_..) not printed yet
};

/// Stop strings (transformers' stop_strings): push() each generated token;
/// true once the sequence's text (a text_stream from `context`) holds one of
/// `stops` (empty ones never match), looked for only where the new text could
/// complete it. An id the tokenizer lacks adds no text. For
/// generate_options::stop_when. Not thread-safe: one per sequence.
class stop_strings {
 public:
  stop_strings(tokenizer_ptr tok, const std::vector<int32_t>& context, std::vector<std::string> stops);
  bool push(int32_t id);

 private:
  text_stream stream_;
  std::vector<std::string> stops_;
  std::string text_;
};

/// The tokenizer of model folder `dir`: vocab.json + merges.txt, else
/// tokenizer.model, else tokenizer.json, else null (no error: the folder has
/// no tokenizer, ids still work). Errors name the file and what is wrong in
/// it (a tokenizer.json of a kind not implemented: the key that says so).
expected<tokenizer_ptr> load_tokenizer(const std::string& dir);

/// GPT-2 byte-level BPE from its two files. Errors: a file that cannot be
/// read, vocab.json not an object of string -> id (ids in [0, 2^31)), a
/// merges.txt line that is not two symbols, a byte of the 256-entry byte
/// alphabet missing from the vocabulary.
expected<tokenizer_ptr> load_bpe_tokenizer(const std::string& vocab_json, const std::string& merges_txt);

/// A byte-level BPE from HF tokenizers' tokenizer.json (above). Errors name
/// the file and the key.
expected<tokenizer_ptr> load_tokenizer_json(const std::string& path);
/// The same from the file's text; errors name `origin`.
expected<tokenizer_ptr> parse_tokenizer_json(std::string_view text, const std::string& origin);

/// SentencePiece from a tokenizer.model file; `add_bos` prepends the model's
/// BOS id in encode(). Errors: the library's, naming the file; a build
/// without libsentencepiece says so.
expected<tokenizer_ptr> load_sentencepiece_tokenizer(const std::string& model_file, bool add_bos = true);

/// GPT-2's bytes_to_unicode(): the code point that stands for byte b in
/// vocab.json and merges.txt (printable Latin-1 maps to itself, the other 68
/// bytes to U+0100 upwards in byte order).
char32_t gpt2_byte_to_unicode(uint8_t b) noexcept;

/// GPT-2's pre-tokenizer: splits UTF-8 `text` into the pieces the regex
/// above matches (concatenated, they give `text` back). Errors: invalid UTF-8.
expected<std::vector<std::string>> gpt2_pretokenize(std::string_view text);
/// Llama 3's pre-tokenizer (its regex above), the same way.
expected<std::vector<std::string>> llama3_pretokenize(std::string_view text);
/// Qwen2's pre-tokenizer (Llama 3's regex with single digits), the same way.
expected<std::vector<std::string>> qwen2_pretokenize(std::string_view text);

/// Whether the build has libsentencepiece.
bool have_sentencepiece() noexcept;

/// Decodes UTF-8 strictly (no overlongs, surrogates or code points past
/// U+10FFFF). Errors name the byte offset of the first bad sequence.
expected<std::u32string> utf8_decode(std::string_view s);
/// Appends the UTF-8 encoding of `c`.
void utf8_append(std::string& out, char32_t c);

}  // namespace ag::models
