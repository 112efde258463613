// HF tokenizer.json loading and BPE encode/decode: the GPT-NeoX byte-level family Mamba models use, Llama-3-style
// byte-level tokenizers with a Split regex, SentencePiece-style ones with byte fallback (Llama-2, Mistral) and the
// other pipelines docs/tokenizers.md lists. Encode and decode agree token for token with the HF `tokenizers`
// library on the tokenizers we support.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace mambacpp {

// The special tokens a tokenizer.json's post-processor puts around one encoded text (e.g. Llama's BOS before it,
// BERT's [CLS] before and [SEP] after).
struct PostProcessing {
  std::vector<int32_t> before, after;
};

class Tokenizer {
 public:
  // Loads `path` (a tokenizer.json). Throws Error naming the file, the JSON path of the unsupported part and the
  // type found there when it is not a BPE pipeline we can reproduce exactly.
  static std::unique_ptr<Tokenizer> load(const std::string& path);
  virtual ~Tokenizer() = default;

  // Text -> ids, as tokenizers' `encode(text, add_special_tokens=False)` gives (added/special tokens in the text
  // are matched as such).
  virtual std::vector<int32_t> encode(std::string_view text) const = 0;
  // Text -> ids as tokenizers' `encode(text, add_special_tokens)` gives them: with add_special_tokens, the
  // post-processor's special tokens around encode(text), which is what `tokenizer(text)` returns.
  std::vector<int32_t> encode(std::string_view text, bool add_special_tokens) const {
    std::vector<int32_t> ids = encode(text);
    if (!add_special_tokens) return ids;
    PostProcessing p = post_processing();
    ids.insert(ids.begin(), p.before.begin(), p.before.end());
    ids.insert(ids.end(), p.after.begin(), p.after.end());
    return ids;
  }
  // Empty unless the tokenizer.json has a post-processor that adds tokens.
  virtual PostProcessing post_processing() const { return {}; }
  // Ids -> text through the declared decoder, as tokenizers' decode(). With skip_special, special tokens vanish.
  virtual std::string decode(std::span<const int32_t> ids, bool skip_special = false) const = 0;
  // The raw bytes one token contributes to decoded text after other tokens (may be an incomplete UTF-8 sequence):
  // for streaming a continuation. What a decoder does only at the very start of a text (dropping the first
  // token's leading space) is not applied.
  virtual std::string token_bytes(int32_t id) const = 0;

  virtual int64_t vocab_size() const = 0;  // highest id + 1, added tokens included
  virtual std::optional<int32_t> token_to_id(std::string_view token) const = 0;
  virtual bool is_special(int32_t id) const = 0;
};

}  // namespace mambacpp
