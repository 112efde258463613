// Normalisers (see normalizer.h). The Unicode forms go through utf8proc: a small Debian library, where ICU would
// bring 30 MB of data for these few functions. ASCII text is already in every normal form, which makes the common
// case a single scan.
#include "tokenizer/normalizer.h"

#include <utf8proc.h>

#include <cstdlib>

#include "mambacpp/error.h"
#include "tokenizer/utf8.h"

namespace mambacpp::tok {
namespace {

bool is_ascii(std::string_view text) {
  for (char c : text) {
    if (static_cast<unsigned char>(c) >= 0x80) return false;
  }
  return true;
}

std::string unicode_form(std::string_view text, int options) {
  if (is_ascii(text)) return std::string(text);
  utf8proc_uint8_t* mapped = nullptr;
  const utf8proc_ssize_t n =
      utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(text.data()), static_cast<utf8proc_ssize_t>(text.size()),
                   &mapped, static_cast<utf8proc_option_t>(UTF8PROC_STABLE | options));
  if (n < 0) fail("tokenizer: the text is not valid UTF-8 (", utf8proc_errmsg(n), ")");
  std::string out(reinterpret_cast<const char*>(mapped), static_cast<size_t>(n));
  std::free(mapped);
  return out;
}

// Rust's char::to_lowercase, character by character (no context, so a final sigma stays σ). U+0130 is the one
// character whose lowercase is two characters (i + combining dot), which utf8proc's one-to-one map cannot say.
std::string lowercase(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  size_t i = 0;
  while (i < text.size()) {
    unsigned char b = static_cast<unsigned char>(text[i]);
    if (b < 0x80) {
      out.push_back(b >= 'A' && b <= 'Z' ? static_cast<char>(b + 32) : static_cast<char>(b));
      ++i;
      continue;
    }
    char32_t cp = next_code_point(text, i);
    if (cp == 0x130) {
      out += "i\u0307";
      continue;
    }
    append_utf8(out, static_cast<char32_t>(utf8proc_tolower(static_cast<utf8proc_int32_t>(cp))));
  }
  return out;
}

// White_Space on both ends (Rust's str::trim_start / trim_end).
std::string strip(std::string_view text, bool left, bool right) {
  size_t begin = 0, end = text.size();
  if (left) {
    while (begin < end) {
      size_t next = begin;
      if (!is_unicode_whitespace(next_code_point(text, next))) break;
      begin = next;
    }
  }
  if (right) {
    while (end > begin) {
      size_t start = prev_code_point_start(text, end);
      size_t at = start;
      if (!is_unicode_whitespace(next_code_point(text, at))) break;
      end = start;
    }
  }
  return std::string(text.substr(begin, end - begin));
}

std::string replace_all(std::string_view text, const SplitPattern& pattern, const std::string& content) {
  std::string out;
  out.reserve(text.size());
  size_t covered = 0;
  pattern.for_each_match(text, [&](size_t begin, size_t end) {
    out.append(text.substr(covered, begin - covered));
    out += content;
    covered = end;
  });
  out.append(text.substr(covered));
  return out;
}

}  // namespace

std::string nfc(std::string_view text) { return unicode_form(text, UTF8PROC_COMPOSE); }

std::string Normalizer::apply(std::string_view text) const {
  std::string out(text);
  for (const NormalizerStep& step : steps_) {
    switch (step.kind) {
      case NormalizerStep::NFC:
        out = unicode_form(out, UTF8PROC_COMPOSE);
        break;
      case NormalizerStep::NFD:
        out = unicode_form(out, UTF8PROC_DECOMPOSE);
        break;
      case NormalizerStep::NFKC:
        out = unicode_form(out, UTF8PROC_COMPOSE | UTF8PROC_COMPAT);
        break;
      case NormalizerStep::NFKD:
        out = unicode_form(out, UTF8PROC_DECOMPOSE | UTF8PROC_COMPAT);
        break;
      case NormalizerStep::Lowercase:
        out = lowercase(out);
        break;
      case NormalizerStep::Strip:
        out = strip(out, step.strip_left, step.strip_right);
        break;
      case NormalizerStep::Prepend:
        if (!out.empty()) out = step.text + out;  // HF leaves an empty piece empty
        break;
      case NormalizerStep::Replace:
        out = replace_all(out, *step.pattern, step.text);
        break;
    }
  }
  return out;
}

}  // namespace mambacpp::tok
