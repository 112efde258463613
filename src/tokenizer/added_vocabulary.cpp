// Added-token matching (see added_vocabulary.h).
#include "tokenizer/added_vocabulary.h"

#include <algorithm>

#include "tokenizer/utf8.h"

namespace mambacpp::tok {

void TokenMatcher::add(std::string_view pattern, int32_t token_index) {
  if (pattern.empty()) return;
  int32_t node = 0;
  for (char c : pattern) {
    uint64_t key = (static_cast<uint64_t>(node) << 8) | static_cast<unsigned char>(c);
    auto it = edges_.find(key);
    if (it == edges_.end()) {
      it = edges_.emplace(key, nodes_++).first;
      terminal_.push_back(-1);
    }
    node = it->second;
  }
  // The first token with a given form wins (two tokens with one form cannot both be matched).
  if (terminal_[node] < 0) terminal_[node] = token_index;
  first_byte_[static_cast<unsigned char>(pattern[0])] = true;
}

std::pair<size_t, int32_t> TokenMatcher::longest_at(std::string_view text, size_t pos) const {
  if (!first_byte_[static_cast<unsigned char>(text[pos])]) return {0, -1};
  std::pair<size_t, int32_t> best{0, -1};
  int32_t node = 0;
  for (size_t i = pos; i < text.size(); ++i) {
    auto it = edges_.find((static_cast<uint64_t>(node) << 8) | static_cast<unsigned char>(text[i]));
    if (it == edges_.end()) break;
    node = it->second;
    if (terminal_[node] >= 0) best = {i + 1 - pos, terminal_[node]};
  }
  return best;
}

void AddedVocabulary::build(const std::vector<std::string>& match_forms) {
  for (size_t i = 0; i < tokens_.size(); ++i) {
    const AddedToken& t = tokens_[i];
    by_id_.emplace(t.id, i);
    by_content_.emplace(t.content, i);
    (t.normalized ? normalized_matcher_ : raw_matcher_).add(match_forms[i], static_cast<int32_t>(i));
  }
  // Rust's regex \w: Alphabetic, marks, decimal digits, connector punctuation and the two joiners.
  word_char_ = std::make_shared<Regex>("[\\p{Alphabetic}\\p{M}\\p{Nd}\\p{Pc}\\x{200C}\\x{200D}]");
}

const AddedToken* AddedVocabulary::find_id(int32_t id) const {
  auto it = by_id_.find(id);
  return it == by_id_.end() ? nullptr : &tokens_[it->second];
}

std::optional<int32_t> AddedVocabulary::find_content(std::string_view content) const {
  auto it = by_content_.find(std::string(content));
  if (it == by_content_.end()) return std::nullopt;
  return tokens_[it->second].id;
}

void AddedVocabulary::split(std::string_view text, bool raw, std::vector<Split>& out) const {
  const TokenMatcher& matcher = raw ? raw_matcher_ : normalized_matcher_;
  if (text.empty()) return;
  if (matcher.empty()) {
    out.push_back({text, -1});
    return;
  }
  size_t covered = 0;  // text before this offset has been emitted
  size_t pos = 0;      // where the search for the next match resumes
  while (pos < text.size()) {
    auto [len, index] = matcher.longest_at(text, pos);
    if (len == 0) {
      ++pos;
      continue;
    }
    size_t start = pos, stop = pos + len;
    pos = stop;  // a rejected match is skipped as a whole, as the HF matcher's iterator does
    const AddedToken& token = tokens_[static_cast<size_t>(index)];
    if (token.single_word) {
      bool word_before = start > 0 && word_char_->matches_at(text, prev_code_point_start(text, start));
      bool word_after = stop < text.size() && word_char_->matches_at(text, stop);
      if (word_before || word_after) continue;
    }
    if (token.lstrip) {
      size_t s = start;
      while (s > 0) {
        size_t p = prev_code_point_start(text, s);
        size_t q = p;
        if (!is_unicode_whitespace(next_code_point(text, q))) break;
        s = p;
      }
      start = std::max(s, covered);  // whitespace already taken by the previous match stays there
    }
    if (token.rstrip) {
      while (stop < text.size()) {
        size_t q = stop;
        if (!is_unicode_whitespace(next_code_point(text, q))) break;
        stop = q;
      }
      pos = stop;
    }
    if (start > covered) out.push_back({text.substr(covered, start - covered), -1});
    out.push_back({text.substr(start, stop - start), token.id});
    covered = stop;
  }
  if (covered < text.size()) out.push_back({text.substr(covered), -1});
}

}  // namespace mambacpp::tok

