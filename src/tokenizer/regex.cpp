// PCRE2 wrapper (see regex.h).
#define PCRE2_CODE_UNIT_WIDTH 8
#include "tokenizer/regex.h"

#include <pcre2.h>

#include "mambacpp/error.h"

namespace mambacpp::tok {

const char* const kWhiteSpaceClass =
    "\\t\\n\\x{0B}\\f\\r \\x{85}\\x{A0}\\x{1680}\\x{2000}-\\x{200A}\\x{2028}\\x{2029}\\x{202F}\\x{205F}\\x{3000}";

namespace {
// Oniguruma's Unicode \w (UTS #18's): Alphabetic, marks, decimal digits, connector punctuation, the two joiners.
constexpr const char* kWordClass = "\\p{Alphabetic}\\p{M}\\p{Nd}\\p{Pc}\\x{200C}\\x{200D}";
}  // namespace

std::string pcre2_from_oniguruma(std::string_view pattern) {
  std::string out;
  out.reserve(pattern.size() + 32);
  const std::string ws = kWhiteSpaceClass, word = kWordClass;
  bool in_class = false;
  for (size_t i = 0; i < pattern.size(); ++i) {
    char c = pattern[i];
    if (c == '\\' && i + 1 < pattern.size()) {
      char e = pattern[++i];
      if (in_class) {
        // Inside a class only the positive sets can be spelled out; \S \W \D keep PCRE2's own (near) meaning.
        if (e == 's') {
          out += ws;
        } else if (e == 'w') {
          out += word;
        } else if (e == 'd') {
          out += "\\p{Nd}";
        } else if (e == 'h') {
          out += "0-9a-fA-F";
        } else {
          out += c;
          out += e;
        }
        continue;
      }
      switch (e) {
        case 's':
          out += "[" + ws + "]";
          break;
        case 'S':
          out += "[^" + ws + "]";
          break;
        case 'w':
          out += "[" + word + "]";
          break;
        case 'W':
          out += "[^" + word + "]";
          break;
        case 'd':
          out += "\\p{Nd}";
          break;
        case 'D':
          out += "\\P{Nd}";
          break;
        case 'h':  // Oniguruma's \h is a hex digit (PCRE2's is horizontal space)
          out += "[0-9a-fA-F]";
          break;
        case 'H':
          out += "[^0-9a-fA-F]";
          break;
        default:
          out += c;
          out += e;
      }
      continue;
    }
    if (!in_class && c == '[') {
      in_class = true;
      out += c;
      // A ']' first in the class (after an optional '^') is a literal.
      if (i + 1 < pattern.size() && pattern[i + 1] == '^') out += pattern[++i];
      if (i + 1 < pattern.size() && pattern[i + 1] == ']') out += pattern[++i];
      continue;
    }
    if (in_class && c == ']') in_class = false;
    out += c;
  }
  return out;
}

Regex::Regex(const std::string& pattern) {
  int error_code = 0;
  PCRE2_SIZE error_offset = 0;
  pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(), PCRE2_UTF | PCRE2_UCP,
                                   &error_code, &error_offset, nullptr);
  if (!code) {
    PCRE2_UCHAR message[256];
    pcre2_get_error_message(error_code, message, sizeof(message));
    fail("tokenizer regex '", pattern, "': ", reinterpret_cast<const char*>(message), " at offset ", error_offset);
  }
  // JIT is an optimisation only: when it is unavailable pcre2_match falls back to the interpreter.
  pcre2_jit_compile(code, PCRE2_JIT_COMPLETE);
  code_ = code;
}

Regex::~Regex() { pcre2_code_free(static_cast<pcre2_code*>(code_)); }

void* Regex::new_match_data() const {
  pcre2_match_data* md = pcre2_match_data_create_from_pattern(static_cast<pcre2_code*>(code_), nullptr);
  if (!md) fail("tokenizer regex: out of memory for match data");
  return md;
}

void Regex::free_match_data(void* match_data) { pcre2_match_data_free(static_cast<pcre2_match_data*>(match_data)); }

bool Regex::find(std::string_view text, size_t start, void* match_data, size_t& begin, size_t& end) const {
  auto* md = static_cast<pcre2_match_data*>(match_data);
  int rc = pcre2_match(static_cast<pcre2_code*>(code_), reinterpret_cast<PCRE2_SPTR>(text.data()), text.size(), start,
                       PCRE2_NO_UTF_CHECK, md, nullptr);
  if (rc == PCRE2_ERROR_NOMATCH) return false;
  if (rc < 0) {
    PCRE2_UCHAR message[256];
    pcre2_get_error_message(rc, message, sizeof(message));
    fail("tokenizer regex match failed: ", reinterpret_cast<const char*>(message));
  }
  PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md);
  begin = ov[0];
  end = ov[1];
  return true;
}

bool Regex::matches_at(std::string_view text, size_t at) const {
  void* md = new_match_data();
  auto* code = static_cast<pcre2_code*>(code_);
  int rc = pcre2_match(code, reinterpret_cast<PCRE2_SPTR>(text.data()), text.size(), at,
                       PCRE2_NO_UTF_CHECK | PCRE2_ANCHORED, static_cast<pcre2_match_data*>(md), nullptr);
  free_match_data(md);
  if (rc < 0 && rc != PCRE2_ERROR_NOMATCH) fail("tokenizer regex match failed (code ", rc, ")");
  return rc >= 0;
}

}  // namespace mambacpp::tok
