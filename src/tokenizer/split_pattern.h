// What the Split pre-tokenizer, the Replace normaliser and decoder, and the other splitting pre-tokenizers look
// for in text, and how HF cuts text around the matches (its SplitDelimiterBehavior, with `invert`).
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "tokenizer/regex.h"

namespace mambacpp::tok {

// Character classes HF tests with Rust's char methods: each matching character is a match of its own.
enum class CharClass {
  WhiteSpace,   // char::is_whitespace (the White_Space property)
  Punctuation,  // ASCII punctuation or a Unicode P* category
  Numeric,      // char::is_numeric (Nd, Nl, No)
};

class SplitPattern {
 public:
  static SplitPattern literal(std::string text);
  // An Oniguruma pattern, as tokenizer.json holds it (translated to PCRE2, see regex.h).
  static SplitPattern regex(const std::string& pattern);
  static SplitPattern char_class(CharClass c);

  // Calls on_match(begin, end) for each non-empty match in valid UTF-8 `text`, left to right, non-overlapping.
  template <class F>
  void for_each_match(std::string_view text, F&& on_match) const;

 private:
  enum class Kind { Literal, Regex, Chars } kind_ = Kind::Literal;
  std::string literal_;
  std::shared_ptr<const Regex> regex_;
  CharClass chars_ = CharClass::WhiteSpace;
  void char_matches(std::string_view text, std::vector<std::pair<size_t, size_t>>& out) const;
};

bool in_char_class(CharClass c, char32_t cp);

enum class SplitBehavior { Removed, Isolated, MergedWithPrevious, MergedWithNext, Contiguous };

// Cuts `text` at the matches of `pattern` (or, with invert, at the text between them) and appends the resulting
// non-empty [begin, end) ranges, as HF's NormalizedString::split does.
void split_by(std::string_view text, const SplitPattern& pattern, SplitBehavior behavior, bool invert,
              std::vector<std::pair<size_t, size_t>>& out);

template <class F>
void SplitPattern::for_each_match(std::string_view text, F&& on_match) const {
  switch (kind_) {
    case Kind::Literal: {
      if (literal_.empty()) return;
      size_t pos = 0;
      while ((pos = text.find(literal_, pos)) != std::string_view::npos) {
        on_match(pos, pos + literal_.size());
        pos += literal_.size();
      }
      return;
    }
    case Kind::Regex:
      regex_->for_each_match(text, on_match);
      return;
    case Kind::Chars: {
      std::vector<std::pair<size_t, size_t>> matches;
      char_matches(text, matches);
      for (auto [b, e] : matches) on_match(b, e);
      return;
    }
  }
}

}  // namespace mambacpp::tok
