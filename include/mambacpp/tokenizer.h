// HF tokenizer.json loading and byte-level BPE encode/decode (the GPT-NeoX tokenizer family Mamba models use).
// Encode and decode agree token for token with the HF `tokenizers` library on the tokenizers we support.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace mambacpp {

class Tokenizer {
 public:
  // Loads `path` (a tokenizer.json). Throws Error naming the file and the unsupported part (model type,
  // normalizer, pre-tokenizer, decoder) when it is not a byte-level BPE tokenizer we can reproduce exactly.
  static std::unique_ptr<Tokenizer> load(const std::string& path);
  virtual ~Tokenizer() = default;

  // Text -> ids, as tokenizers' `encode(text, add_special_tokens=False)` gives (added/special tokens in the text
  // are matched as such).
  virtual std::vector<int32_t> encode(std::string_view text) const = 0;
  // Ids -> text through the declared decoder (byte-level: exact bytes). With skip_special, special tokens vanish.
  virtual std::string decode(std::span<const int32_t> ids, bool skip_special = false) const = 0;
  // The raw bytes one token contributes to decoded text (may be an incomplete UTF-8 sequence): for streaming.
  virtual std::string token_bytes(int32_t id) const = 0;

  virtual int64_t vocab_size() const = 0;  // highest id + 1, added tokens included
  virtual std::optional<int32_t> token_to_id(std::string_view token) const = 0;
  virtual bool is_special(int32_t id) const = 0;
};

}  // namespace mambacpp
