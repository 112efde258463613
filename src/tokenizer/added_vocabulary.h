// Added tokens of tokenizer.json (special tokens such as <|endoftext|> and extra tokens such as GPT-NeoX's runs of
// spaces). They are found in the text before the BPE model sees it: leftmost match first, longest at that
// position, then the search resumes after the match. Tokens with normalized=false are matched in the raw text,
// those with normalized=true in the normalised text (with their own content normalised too), as HF does.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "tokenizer/regex.h"

namespace mambacpp::tok {

struct AddedToken {
  int32_t id = -1;
  std::string content;
  bool single_word = false;  // only match when not inside a word (no word character right before or after)
  bool lstrip = false;       // swallow the whitespace on its left
  bool rstrip = false;       // swallow the whitespace on its right
  bool normalized = true;
  bool special = false;
};

// A piece of text and, when it was an added token match, that token's id.
struct Split {
  std::string_view text;
  int32_t added_id = -1;
};

// Leftmost-longest matching of a fixed set of byte strings (a trie walked from every start position; added
// tokens are few and short, so this beats building an automaton).
class TokenMatcher {
 public:
  void add(std::string_view pattern, int32_t token_index);
  bool empty() const { return nodes_ == 1; }
  // Longest pattern starting exactly at `pos`: its length and token index, or length 0.
  std::pair<size_t, int32_t> longest_at(std::string_view text, size_t pos) const;

 private:
  std::unordered_map<uint64_t, int32_t> edges_;  // (node << 8 | byte) -> child node
  std::vector<int32_t> terminal_{-1};            // node -> token index ending there, or -1
  bool first_byte_[256] = {};
  int32_t nodes_ = 1;
};

class AddedVocabulary {
 public:
  AddedVocabulary() = default;
  // `normalize` turns a normalized=true token's content into the form it is matched in.
  template <class Normalize>
  AddedVocabulary(std::vector<AddedToken> tokens, Normalize&& normalize);

  // Splits `text` into added-token matches and the text between them (non-empty pieces only), matching the
  // normalized=false tokens (raw == true) or the normalized=true ones (raw == false).
  void split(std::string_view text, bool raw, std::vector<Split>& out) const;

  const std::vector<AddedToken>& tokens() const { return tokens_; }
  const AddedToken* find_id(int32_t id) const;
  std::optional<int32_t> find_content(std::string_view content) const;

 private:
  void build(const std::vector<std::string>& match_forms);

  std::vector<AddedToken> tokens_;
  std::unordered_map<int32_t, size_t> by_id_;
  std::unordered_map<std::string, size_t> by_content_;
  TokenMatcher raw_matcher_, normalized_matcher_;
  std::shared_ptr<Regex> word_char_;  // Rust's \w, for single_word
};

template <class Normalize>
AddedVocabulary::AddedVocabulary(std::vector<AddedToken> tokens, Normalize&& normalize) : tokens_(std::move(tokens)) {
  std::vector<std::string> forms;
  forms.reserve(tokens_.size());
  for (const AddedToken& t : tokens_) forms.push_back(t.normalized ? normalize(t.content) : t.content);
  build(forms);
}

}  // namespace mambacpp::tok
