// A BPE tokenizer as tokenizer.json describes it: added tokens -> normaliser -> pre-tokenizer -> BPE model on
// encode (then the post-processor's special tokens when asked for); ids -> token strings -> decoder on decode.
// Built by tokenizer_json.cpp; agrees with HF tokenizers' encode(text, add_special_tokens) and decode().
#pragma once

#include <memory>

#include "mambacpp/tokenizer.h"
#include "tokenizer/added_vocabulary.h"
#include "tokenizer/bpe_model.h"
#include "tokenizer/decoder.h"
#include "tokenizer/normalizer.h"
#include "tokenizer/pre_tokenizer.h"

namespace mambacpp::tok {

struct Pipeline {
  Normalizer normalizer;
  PreTokenizer pre_tokenizer;
  Decoder decoder;
  PostProcessing post_processing;
};

class BpeTokenizer final : public Tokenizer {
 public:
  BpeTokenizer(std::unique_ptr<BpeModel> model, Pipeline pipeline, std::vector<AddedToken> added_tokens);

  using Tokenizer::encode;
  std::vector<int32_t> encode(std::string_view text) const override;
  PostProcessing post_processing() const override { return pipeline_.post_processing; }
  std::string decode(std::span<const int32_t> ids, bool skip_special = false) const override;
  std::string token_bytes(int32_t id) const override;
  int64_t vocab_size() const override { return static_cast<int64_t>(id_token_.size()); }
  std::optional<int32_t> token_to_id(std::string_view token) const override;
  bool is_special(int32_t id) const override;

 private:
  // Encodes a piece with no added tokens left in it (already normalised).
  void encode_plain(Piece piece, std::vector<int32_t>& out) const;

  std::unique_ptr<BpeModel> model_;
  Pipeline pipeline_;
  AddedVocabulary added_;
  std::vector<std::string> id_token_;  // id -> its token string (added tokens first), "" for ids no token has
  std::vector<char> id_known_;         // id -> whether any token has it (decode skips the others, as HF)
  std::vector<std::string> id_piece_;  // id -> what it adds to streamed text (Decoder::piece)
  std::vector<char> id_special_;       // id -> whether decode(skip_special) drops it
};

}  // namespace mambacpp::tok
