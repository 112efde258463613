// The byte-level BPE tokenizer (GPT-2 / GPT-NeoX family): added tokens -> normaliser -> ByteLevel pre-tokenizer ->
// BPE model on encode; ids -> token bytes -> lossy UTF-8 on decode. Built by tokenizer_json.cpp from a
// tokenizer.json; agrees with HF tokenizers' encode(text, add_special_tokens=False) and decode().
#pragma once

#include <memory>

#include "mambacpp/tokenizer.h"
#include "tokenizer/added_vocabulary.h"
#include "tokenizer/bpe_model.h"
#include "tokenizer/byte_level.h"
#include "tokenizer/normalizer.h"

namespace mambacpp::tok {

class ByteLevelBpeTokenizer final : public Tokenizer {
 public:
  ByteLevelBpeTokenizer(std::unique_ptr<BpeModel> model, Normalizer normalizer, ByteLevelOptions pre_tokenizer,
                        std::vector<AddedToken> added_tokens);

  std::vector<int32_t> encode(std::string_view text) const override;
  std::string decode(std::span<const int32_t> ids, bool skip_special = false) const override;
  std::string token_bytes(int32_t id) const override;
  int64_t vocab_size() const override { return static_cast<int64_t>(id_bytes_.size()); }
  std::optional<int32_t> token_to_id(std::string_view token) const override;
  bool is_special(int32_t id) const override;

 private:
  // Encodes a piece with no added tokens left in it (already normalised).
  void encode_plain(std::string_view piece, std::vector<int32_t>& out) const;

  std::unique_ptr<BpeModel> model_;
  Normalizer normalizer_;
  ByteLevelSplitter splitter_;
  AddedVocabulary added_;
  std::vector<std::string> id_bytes_;  // id -> the bytes it decodes to ("" for ids no token has)
  std::vector<char> id_special_;       // id -> whether decode(skip_special) drops it
};

}  // namespace mambacpp::tok
