// Pattern matching and HF's split behaviours (see split_pattern.h).
#include "tokenizer/split_pattern.h"

#include <utf8proc.h>

#include <algorithm>

#include "tokenizer/utf8.h"

namespace mambacpp::tok {

SplitPattern SplitPattern::literal(std::string text) {
  SplitPattern p;
  p.kind_ = Kind::Literal;
  p.literal_ = std::move(text);
  return p;
}

SplitPattern SplitPattern::regex(const std::string& pattern) {
  SplitPattern p;
  p.kind_ = Kind::Regex;
  p.regex_ = std::make_shared<const Regex>(pcre2_from_oniguruma(pattern));
  return p;
}

SplitPattern SplitPattern::char_class(CharClass c) {
  SplitPattern p;
  p.kind_ = Kind::Chars;
  p.chars_ = c;
  return p;
}

bool in_char_class(CharClass c, char32_t cp) {
  switch (c) {
    case CharClass::WhiteSpace:
      return is_unicode_whitespace(cp);
    case CharClass::Punctuation: {
      if (cp < 0x80)
        return (cp >= 0x21 && cp <= 0x2F) || (cp >= 0x3A && cp <= 0x40) || (cp >= 0x5B && cp <= 0x60) ||
               (cp >= 0x7B && cp <= 0x7E);
      auto cat = utf8proc_category(static_cast<utf8proc_int32_t>(cp));
      return cat >= UTF8PROC_CATEGORY_PC && cat <= UTF8PROC_CATEGORY_PO;
    }
    case CharClass::Numeric: {
      auto cat = utf8proc_category(static_cast<utf8proc_int32_t>(cp));
      return cat == UTF8PROC_CATEGORY_ND || cat == UTF8PROC_CATEGORY_NL || cat == UTF8PROC_CATEGORY_NO;
    }
  }
  return false;
}

void SplitPattern::char_matches(std::string_view text, std::vector<std::pair<size_t, size_t>>& out) const {
  size_t i = 0;
  while (i < text.size()) {
    size_t start = i;
    char32_t cp = next_code_point(text, i);
    if (in_char_class(chars_, cp)) out.emplace_back(start, i);
  }
}

void split_by(std::string_view text, const SplitPattern& pattern, SplitBehavior behavior, bool invert,
              std::vector<std::pair<size_t, size_t>>& out) {
  if (text.empty()) return;
  // The whole text as alternating (range, is_match) parts, as HF's find_matches gives them.
  struct Part {
    size_t begin, end;
    bool match;
  };
  std::vector<Part> parts;
  size_t covered = 0;
  pattern.for_each_match(text, [&](size_t begin, size_t end) {
    if (begin > covered) parts.push_back({covered, begin, invert});
    parts.push_back({begin, end, !invert});
    covered = end;
  });
  if (covered < text.size()) parts.push_back({covered, text.size(), invert});

  // Then the behaviour decides which parts join and which go (keep == false).
  struct Cut {
    size_t begin, end;
    bool keep;
  };
  std::vector<Cut> cuts;
  cuts.reserve(parts.size());
  switch (behavior) {
    case SplitBehavior::Removed:
      for (const Part& p : parts) cuts.push_back({p.begin, p.end, !p.match});
      break;
    case SplitBehavior::Isolated:
      for (const Part& p : parts) cuts.push_back({p.begin, p.end, true});
      break;
    case SplitBehavior::Contiguous: {  // runs of matches, and runs of non-matches, become one piece each
      bool previous = false;
      for (const Part& p : parts) {
        if (p.match == previous && !cuts.empty()) {
          cuts.back().end = p.end;
        } else {
          cuts.push_back({p.begin, p.end, true});
        }
        previous = p.match;
      }
      break;
    }
    case SplitBehavior::MergedWithPrevious: {  // a match joins the piece before it, unless that was a match too
      bool previous = false;
      for (const Part& p : parts) {
        if (p.match && !previous && !cuts.empty()) {
          cuts.back().end = p.end;
        } else {
          cuts.push_back({p.begin, p.end, true});
        }
        previous = p.match;
      }
      break;
    }
    case SplitBehavior::MergedWithNext: {  // a match joins the piece after it, unless that is a match too
      bool previous = false;
      for (size_t k = parts.size(); k-- > 0;) {
        const Part& p = parts[k];
        if (p.match && !previous && !cuts.empty()) {
          cuts.back().begin = p.begin;
        } else {
          cuts.push_back({p.begin, p.end, true});
        }
        previous = p.match;
      }
      std::reverse(cuts.begin(), cuts.end());
      break;
    }
  }
  for (const Cut& c : cuts) {
    if (c.keep && c.end > c.begin) out.emplace_back(c.begin, c.end);
  }
}

}  // namespace mambacpp::tok
