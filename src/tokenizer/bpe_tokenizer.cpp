// Encode/decode pipeline of the byte-level BPE tokenizer (see bpe_tokenizer.h).
#include "tokenizer/bpe_tokenizer.h"

#include <unordered_set>

#include "mambacpp/error.h"
#include "tokenizer/utf8.h"

namespace mambacpp::tok {

ByteLevelBpeTokenizer::ByteLevelBpeTokenizer(std::unique_ptr<BpeModel> model, Normalizer normalizer,
                                             ByteLevelOptions pre_tokenizer, std::vector<AddedToken> added_tokens)
    : model_(std::move(model)),
      normalizer_(std::move(normalizer)),
      splitter_(pre_tokenizer),
      added_(std::move(added_tokens), [this](const std::string& s) { return normalizer_.apply(s); }) {
  int32_t max_id = -1;
  for (const auto& [token, id] : model_->vocab()) max_id = std::max(max_id, id);
  for (const AddedToken& t : added_.tokens()) max_id = std::max(max_id, t.id);
  id_bytes_.assign(static_cast<size_t>(max_id + 1), std::string());
  id_special_.assign(static_cast<size_t>(max_id + 1), 0);
  // The byte-level decoder maps each character of a token back to its byte; a token with any character outside
  // the alphabet (an added token made of real spaces, say) contributes its own UTF-8 bytes instead.
  auto token_to_bytes = [](const std::string& token) {
    std::optional<std::string> bytes = alphabet_to_bytes(token);
    return bytes ? *bytes : token;
  };
  for (const auto& [token, id] : model_->vocab()) id_bytes_[static_cast<size_t>(id)] = token_to_bytes(token);
  // Added tokens take precedence over the model's entry for the same id, as in HF's id_to_token. HF decides
  // "special" by content, so every id whose added token has special content is dropped by skip_special.
  std::unordered_set<std::string> special_contents;
  for (const AddedToken& t : added_.tokens()) {
    if (t.special) special_contents.insert(t.content);
  }
  for (const AddedToken& t : added_.tokens()) {
    id_bytes_[static_cast<size_t>(t.id)] = token_to_bytes(t.content);
    id_special_[static_cast<size_t>(t.id)] = special_contents.count(t.content) ? 1 : 0;
  }
}

void ByteLevelBpeTokenizer::encode_plain(std::string_view piece, std::vector<int32_t>& out) const {
  std::vector<std::string_view> words;
  std::string storage;  // holds the piece when the pre-tokenizer prepends a space
  splitter_.split(piece, words, storage);
  std::string mapped;
  for (std::string_view word : words) {
    mapped = bytes_to_alphabet(word);
    model_->tokenize(mapped, out);
  }
}

std::vector<int32_t> ByteLevelBpeTokenizer::encode(std::string_view text) const {
  size_t bad = first_invalid_utf8(text);
  if (bad != text.size()) fail("tokenizer: encode input is not valid UTF-8 (byte offset ", bad, ")");
  std::vector<int32_t> ids;
  ids.reserve(text.size() / 3 + 1);
  // 1. Tokens matched in the raw text. 2. Normalise each remaining piece on its own and match the normalized
  // tokens in it. 3. Pre-tokenize and BPE what is left.
  std::vector<Split> raw_splits;
  added_.split(text, /*raw=*/true, raw_splits);
  std::vector<Split> splits;
  std::string normalized;
  for (const Split& raw : raw_splits) {
    if (raw.added_id >= 0) {
      ids.push_back(raw.added_id);
      continue;
    }
    normalized = normalizer_.empty() ? std::string(raw.text) : normalizer_.apply(raw.text);
    splits.clear();
    added_.split(normalized, /*raw=*/false, splits);
    for (const Split& s : splits) {
      if (s.added_id >= 0) {
        ids.push_back(s.added_id);
      } else {
        encode_plain(s.text, ids);
      }
    }
  }
  return ids;
}

std::string ByteLevelBpeTokenizer::token_bytes(int32_t id) const {
  // Ids that name no token decode to nothing, as in HF (a model's embedding is often padded past the vocab).
  if (id < 0 || static_cast<size_t>(id) >= id_bytes_.size()) return {};
  return id_bytes_[static_cast<size_t>(id)];
}

std::string ByteLevelBpeTokenizer::decode(std::span<const int32_t> ids, bool skip_special) const {
  std::string bytes;
  for (int32_t id : ids) {
    if (id < 0 || static_cast<size_t>(id) >= id_bytes_.size()) continue;
    if (skip_special && id_special_[static_cast<size_t>(id)]) continue;
    bytes += id_bytes_[static_cast<size_t>(id)];
  }
  return utf8_lossy(bytes);
}

std::optional<int32_t> ByteLevelBpeTokenizer::token_to_id(std::string_view token) const {
  if (auto id = added_.find_content(token)) return id;
  return model_->token_to_id(token);
}

bool ByteLevelBpeTokenizer::is_special(int32_t id) const {
  return id >= 0 && static_cast<size_t>(id) < id_special_.size() && id_special_[static_cast<size_t>(id)];
}

}  // namespace mambacpp::tok
