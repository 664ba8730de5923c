// SentencePiece models (tokenizer.model) through libsentencepiece.
#include "graph/checkpoint/tokenizer.hpp"

#ifdef AG_HAVE_SENTENCEPIECE
#include <sentencepiece_processor.h>
#endif

namespace ag::models {

#ifdef AG_HAVE_SENTENCEPIECE

namespace {

class sentencepiece_tokenizer final : public tokenizer {
 public:
  error load(const std::string& path, bool add_bos) {
    add_bos_ = add_bos;
    const auto status = sp_.Load(path);
    if (!status.ok()) return error{errc::invalid_argument, path + ": " + status.ToString()};
    if (add_bos_ && sp_.bos_id() < 0)
      return error{errc::invalid_argument, path + ": add_bos_token is on but the model defines no BOS piece"};
    return {};
  }

  expected<std::vector<int32_t>> encode(std::string_view text) const override {
    if (auto valid = utf8_decode(text); !valid) return valid.err();
    std::vector<int> pieces;
    const auto status = sp_.Encode(text, &pieces);
    if (!status.ok()) return error{errc::invalid_argument, "sentencepiece: " + status.ToString()};
    std::vector<int32_t> ids;
    ids.reserve(pieces.size() + 1);
    if (add_bos_) ids.push_back(sp_.bos_id());
    ids.insert(ids.end(), pieces.begin(), pieces.end());
    return ids;
  }

  expected<std::string> decode(const std::vector<int32_t>& ids) const override {
    std::vector<int> pieces;
    pieces.reserve(ids.size());
    for (int32_t id : ids) {
      if (id < 0 || id >= sp_.GetPieceSize())
        return error{errc::invalid_argument, "token id " + std::to_string(id) + " is not in the vocabulary"};
      pieces.push_back(id);
    }
    std::string text;
    const auto status = sp_.Decode(pieces, &text);
    if (!status.ok()) return error{errc::invalid_argument, "sentencepiece: " + status.ToString()};
    return text;
  }

  int64_t vocab_size() const noexcept override { return sp_.GetPieceSize(); }
  std::string kind() const override { return "sentencepiece"; }

 private:
  sentencepiece::SentencePieceProcessor sp_;
  bool add_bos_ = true;
};

}  // namespace

expected<tokenizer_ptr> load_sentencepiece_tokenizer(const std::string& model_file, bool add_bos) {
  try {
    auto t = std::make_shared<sentencepiece_tokenizer>();
    if (auto e = t->load(model_file, add_bos)) return e;
    return tokenizer_ptr(std::move(t));
  } catch (const std::exception& ex) {
    return error{errc::invalid_argument, model_file + ": " + ex.what()};
  }
}

bool have_sentencepiece() noexcept { return true; }

#else

expected<tokenizer_ptr> load_sentencepiece_tokenizer(const std::string& model_file, bool) {
  return error{errc::invalid_argument, model_file + ": this build has no libsentencepiece (install "
                                                    "libsentencepiece-dev and reconfigure); pass token ids instead"};
}

bool have_sentencepiece() noexcept { return false; }

#endif

}  // namespace ag::models
