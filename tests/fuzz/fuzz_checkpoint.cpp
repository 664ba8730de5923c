// libFuzzer entry point for the checkpoint parsers (owner: ckpt): the
// safetensors header and index parser, config.json, the tokenizer's UTF-8 /
// GPT-2, Llama 3 and Qwen2 pre-tokenizers, NFC, and tokenizer.json (then encoding,
// decoding and streaming the text token by token with what it loads). The first input byte picks the parser, the
// rest is its input. Nothing may crash, hang or leak; errors are values.
//
// Every build runs it twice: its seed corpus (tests/fuzz/corpus/checkpoint/)
// replayed as CTest fuzz.checkpoint, and a deterministic mutation loop
// (checkpoint_smoke_main.cpp, CTest checkpoint.fuzz_smoke). scripts/fuzz.sh
// runs it under libFuzzer with the other targets.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>
#include <vector>

#include "graph/checkpoint/hf_config.hpp"
#include "graph/checkpoint/safetensors.hpp"
#include "graph/checkpoint/tokenizer.hpp"
#include "graph/checkpoint/unicode_classes.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, std::size_t size) {
  if (size == 0) return 0;
  const uint8_t which = data[0] % 4;
  ++data;
  --size;
  switch (which) {
    case 0: {  // a whole safetensors file
      std::vector<std::byte> bytes(size);
      if (size) std::memcpy(bytes.data(), data, size);
      auto f = ag::models::safetensors_file::parse(ag::models::mapped_file::from_bytes(std::move(bytes), "fuzz"));
      if (f) {
        // Every tensor a graph can hold reads back without touching bytes
        // outside the file (ASan checks the copies).
        for (const auto& e : (*f)->tensors()) {
          for (ag::dtype as : {ag::dtype::f32, ag::dtype::bf16, ag::dtype::i32}) {
            auto w = (*f)->weight(e.name, as);
            if (!w || (*w)->bytes() > (int64_t{1} << 24)) continue;
            std::vector<std::byte> out(static_cast<std::size_t>((*w)->bytes()));
            if ((*w)->dims()[0] > 0) (void)(*w)->read_slice(0, 0, (*w)->dims()[0], out.data());
          }
        }
      }
      break;
    }
    case 1: {  // config.json
      auto c = ag::models::parse_hf_config(std::string_view(reinterpret_cast<const char*>(data), size), "fuzz");
      if (c) (void)ag::models::parameter_count(c->model);
      break;
    }
    case 2: {  // text through UTF-8 decoding, the pre-tokenizers and NFC
      std::string_view text(reinterpret_cast<const char*>(data), size);
      for (auto pieces : {ag::models::gpt2_pretokenize(text), ag::models::llama3_pretokenize(text),
                          ag::models::qwen2_pretokenize(text)})
        if (pieces) {
          std::size_t total = 0;
          for (const auto& p : *pieces) total += p.size();
          if (total != size) __builtin_trap();  // pieces must concatenate to the text
        }
      if (ag::models::utf8_decode(text)) {
        // NFC is idempotent and its output is valid UTF-8.
        const std::string once = ag::models::to_nfc(text);
        if (!ag::models::utf8_decode(once) || ag::models::to_nfc(once) != once) __builtin_trap();
      }
      break;
    }
    case 3: {  // a tokenizer.json, then text through what it loaded
      std::string_view text(reinterpret_cast<const char*>(data), size);
      auto tok = ag::models::parse_tokenizer_json(text, "fuzz");
      if (tok && *tok) {
        auto ids = (*tok)->encode(text.substr(0, 256));
        if (ids) {
          auto whole = (*tok)->decode(*ids);
          // Streamed token by token after a context (text_stream), the text
          // adds up to the whole decode past the context's (byte-level BPE
          // decodes a run as its tokens' bytes, so a run's decode extends its
          // prefix's).
          const std::size_t from = ids->empty() ? 0 : data[size / 2] % (ids->size() + 1);
          const std::vector<int32_t> context(ids->begin(), ids->begin() + static_cast<std::ptrdiff_t>(from));
          auto head = (*tok)->decode(context);
          ag::models::text_stream stream(*tok, context);
          std::string streamed;
          for (std::size_t i = from; i < ids->size(); ++i)
            if (auto piece = stream.push((*ids)[i])) streamed += *piece;
          if (auto rest = stream.finish()) streamed += *rest;
          if (whole && head && whole->compare(0, head->size(), *head) == 0 && streamed != whole->substr(head->size()))
            __builtin_trap();
        }
      }
      break;
    }
  }
  return 0;
}
