// A SentencePiece-style tokenizer as llama.cpp runs a GGUF "llama" vocabulary (tokens, scores, token types): the
// vocabulary Llama-2, Mistral, Codestral Mamba and Jamba files hold. Encoding, exactly as llama.cpp's SPM tokenizer:
//   1. special tokens (control, user-defined and unknown types) are cut out of the text, longest first;
//   2. each remaining fragment gets a leading space when it starts the text or follows a special token (with
//      add_space_prefix), its spaces become U+2581;
//   3. its characters are merged pairwise, always the adjacent pair whose concatenation is the vocabulary token of
//      highest score (the leftmost among equals), until no adjacent pair forms a token;
//   4. a character that is no token becomes the <0xNN> tokens of its UTF-8 bytes (byte fallback).
// Decoding: U+2581 back to spaces, byte tokens to their bytes, control tokens dropped when asked, and the first
// token's leading space removed (the one step 2 added).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "mambacpp/tokenizer.h"

namespace mambacpp::tok {

struct SpmVocab {
  std::vector<std::string> tokens;
  std::vector<float> scores;         // empty: all 0
  std::vector<int64_t> token_types;  // llama.cpp's: 1 normal, 2 unknown, 3 control, 4 user-defined, 5 unused, 6 byte
  bool add_space_prefix = true;
  bool add_bos = true, add_eos = false;
  int64_t bos_id = -1, eos_id = -1, unk_id = -1;
};

class SpmTokenizer final : public Tokenizer {
 public:
  // Throws naming `source` for inconsistent arrays or a repeated token.
  SpmTokenizer(SpmVocab vocab, const std::string& source);

  using Tokenizer::encode;
  std::vector<int32_t> encode(std::string_view text) const override;
  PostProcessing post_processing() const override;
  std::string decode(std::span<const int32_t> ids, bool skip_special = false) const override;
  std::string token_bytes(int32_t id) const override;
  int64_t vocab_size() const override { return static_cast<int64_t>(v_.tokens.size()); }
  std::optional<int32_t> token_to_id(std::string_view token) const override;
  bool is_special(int32_t id) const override;

 private:
  // Steps 3 and 4 on one fragment (spaces already escaped).
  void encode_fragment(const std::string& text, std::vector<int32_t>& out) const;
  int32_t find(std::string_view text) const;  // -1 when no token has this text
  // What token `id` adds to decoded text; control and unknown tokens give their text unless `skip_special`.
  std::string piece(int32_t id, bool skip_special) const;

  SpmVocab v_;
  std::string source_;
  std::unordered_map<std::string, int32_t> ids_;
  std::vector<int32_t> specials_;  // matched in text, longest text first
  int32_t byte_ids_[256];          // <0xNN> (else the one-byte token), or -1
};

}  // namespace mambacpp::tok
