// A compiled PCRE2 pattern in UTF + Unicode-property mode (JIT when available), used for the byte-level split
// regex and the word-character test of single_word added tokens. Matching is thread-safe: each call brings its own
// match data.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace mambacpp::tok {

// The Unicode White_Space set as the inside of a character class. HF's regexes run on Oniguruma, whose \s is
// White_Space; PCRE2's UCP \s differs at the edges (U+180E), so patterns spell the set out.
extern const char* const kWhiteSpaceClass;

// Rewrites an Oniguruma pattern (the dialect of tokenizer.json) into PCRE2 with the same meaning for what HF's
// patterns use: \s \w \d \h (and their negations) become explicit Unicode sets; everything else is shared syntax.
std::string pcre2_from_oniguruma(std::string_view pattern);

class Regex {
 public:
  explicit Regex(const std::string& pattern);
  ~Regex();
  Regex(const Regex&) = delete;
  Regex& operator=(const Regex&) = delete;

  // Calls on_match(begin, end) for every non-overlapping match in `text`, left to right. `text` must already be
  // valid UTF-8 (it is not re-checked: a per-call check would make scanning a long text quadratic).
  template <class F>
  void for_each_match(std::string_view text, F&& on_match) const;

  // Whether the pattern matches at exactly offset `at` of valid UTF-8 `text`.
  bool matches_at(std::string_view text, size_t at) const;

 private:
  // Next match at or after `start`: true and [begin, end) set, or false.
  bool find(std::string_view text, size_t start, void* match_data, size_t& begin, size_t& end) const;
  void* new_match_data() const;
  static void free_match_data(void* match_data);

  void* code_ = nullptr;  // pcre2_code_8*, kept opaque so that users of this header need no PCRE2 headers
};

template <class F>
void Regex::for_each_match(std::string_view text, F&& on_match) const {
  void* md = new_match_data();
  struct Guard {
    void* md;
    ~Guard() { free_match_data(md); }
  } guard{md};
  size_t pos = 0, begin = 0, end = 0;
  while (pos <= text.size() && find(text, pos, md, begin, end)) {
    if (end == begin) {  // an empty match (our patterns have none): step one code point to make progress
      if (begin >= text.size()) break;
      pos = begin + 1;
      while (pos < text.size() && (static_cast<unsigned char>(text[pos]) & 0xC0) == 0x80) ++pos;
      continue;
    }
    on_match(begin, end);
    pos = end;
  }
}

}  // namespace mambacpp::tok
