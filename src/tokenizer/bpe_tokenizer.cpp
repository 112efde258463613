// Encode/decode pipeline of the BPE tokenizer (see bpe_tokenizer.h).
#include "tokenizer/bpe_tokenizer.h"

#include <unordered_set>

#include "mambacpp/error.h"
#include "tokenizer/utf8.h"

namespace mambacpp::tok {

BpeTokenizer::BpeTokenizer(std::unique_ptr<BpeModel> model, Pipeline pipeline, std::vector<AddedToken> added_tokens)
    : model_(std::move(model)),
      pipeline_(std::move(pipeline)),
      added_(std::move(added_tokens), [this](const std::string& s) { return pipeline_.normalizer.apply(s); }) {
  int32_t max_id = -1;
  for (const auto& [token, id] : model_->vocab()) max_id = std::max(max_id, id);
  for (const AddedToken& t : added_.tokens()) max_id = std::max(max_id, t.id);
  const size_t n = static_cast<size_t>(max_id + 1);
  id_token_.assign(n, std::string());
  id_known_.assign(n, 0);
  id_special_.assign(n, 0);
  for (const auto& [token, id] : model_->vocab()) {
    id_token_[static_cast<size_t>(id)] = token;
    id_known_[static_cast<size_t>(id)] = 1;
  }
  // Added tokens take precedence over the model's entry for the same id. A normalized=true token decodes as its
  // normalised content (so that the decoder can undo the normaliser), as HF's decode does. HF decides "special"
  // by that decode string, so every id whose string is some special token's content is dropped by skip_special.
  std::unordered_set<std::string> special_contents;
  for (const AddedToken& t : added_.tokens()) {
    if (t.special) special_contents.insert(t.content);
  }
  for (const AddedToken& t : added_.tokens()) {
    std::string& token = id_token_[static_cast<size_t>(t.id)];
    token = t.normalized ? pipeline_.normalizer.apply(t.content) : t.content;
    id_known_[static_cast<size_t>(t.id)] = 1;
    id_special_[static_cast<size_t>(t.id)] = special_contents.count(token) ? 1 : 0;
  }
  id_piece_.resize(n);
  for (size_t id = 0; id < n; ++id) {
    if (id_known_[id]) id_piece_[id] = pipeline_.decoder.piece(id_token_[id]);
  }
}

void BpeTokenizer::encode_plain(Piece piece, std::vector<int32_t>& out) const {
  thread_local std::vector<Piece> words;
  words.clear();
  pipeline_.pre_tokenizer.split(std::move(piece), words);
  for (const Piece& word : words) model_->tokenize(word.text, out);
}

std::vector<int32_t> BpeTokenizer::encode(std::string_view text) const {
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
    const bool raw_at_start = raw.text.data() == text.data();
    normalized = pipeline_.normalizer.empty() ? std::string(raw.text) : pipeline_.normalizer.apply(raw.text);
    splits.clear();
    added_.split(normalized, /*raw=*/false, splits);
    for (const Split& s : splits) {
      if (s.added_id >= 0) {
        ids.push_back(s.added_id);
      } else {
        encode_plain(Piece{std::string(s.text), raw_at_start && s.text.data() == normalized.data()}, ids);
      }
    }
  }
  return ids;
}

std::string BpeTokenizer::token_bytes(int32_t id) const {
  // Ids that name no token decode to nothing, as in HF (a model's embedding is often padded past the vocab).
  if (id < 0 || static_cast<size_t>(id) >= id_piece_.size()) return {};
  return id_piece_[static_cast<size_t>(id)];
}

std::string BpeTokenizer::decode(std::span<const int32_t> ids, bool skip_special) const {
  std::vector<std::string> tokens;
  tokens.reserve(ids.size());
  for (int32_t id : ids) {
    if (id < 0 || static_cast<size_t>(id) >= id_token_.size() || !id_known_[static_cast<size_t>(id)]) continue;
    if (skip_special && id_special_[static_cast<size_t>(id)]) continue;
    tokens.push_back(id_token_[static_cast<size_t>(id)]);
  }
  return pipeline_.decoder.decode(std::move(tokens));
}

std::optional<int32_t> BpeTokenizer::token_to_id(std::string_view token) const {
  if (auto id = added_.find_content(token)) return id;
  return model_->token_to_id(token);
}

bool BpeTokenizer::is_special(int32_t id) const {
  return id >= 0 && static_cast<size_t>(id) < id_special_.size() && id_special_[static_cast<size_t>(id)];
}

}  // namespace mambacpp::tok
