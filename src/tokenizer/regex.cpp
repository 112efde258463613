// PCRE2 wrapper (see regex.h).
#define PCRE2_CODE_UNIT_WIDTH 8
#include "tokenizer/regex.h"

#include <pcre2.h>

#include "mambacpp/error.h"

namespace mambacpp::tok {

Regex::Regex(const std::string& pattern) {
  int error_code = 0;
  PCRE2_SIZE error_offset = 0;
  pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                                   PCRE2_UTF | PCRE2_UCP, &error_code, &error_offset, nullptr);
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
