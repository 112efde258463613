// UTF-8 helpers for the tokenizer: validation, code point decoding, and the lossy bytes -> text conversion that the
// HF byte-level decoder applies (Rust's String::from_utf8_lossy: one U+FFFD per maximal invalid subpart).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace mambacpp::tok {

// Byte offset of the first invalid UTF-8 sequence in `s`, or s.size() when all of it is valid.
size_t first_invalid_utf8(std::string_view s);

// Decodes the code point starting at s[i] (s must be valid UTF-8) and advances i past it.
char32_t next_code_point(std::string_view s, size_t& i);
// Decodes the code point that ends at s[end] (exclusive) and returns its first byte offset.
size_t prev_code_point_start(std::string_view s, size_t end);

void append_utf8(std::string& out, char32_t cp);

// Valid UTF-8 passes through unchanged; every maximal invalid subpart (the longest prefix of a well-formed
// sequence, or else one byte) becomes U+FFFD, exactly as Rust's from_utf8_lossy does.
std::string utf8_lossy(std::string_view bytes);

// The Unicode White_Space property (what Rust's regex and Oniguruma call \s).
bool is_unicode_whitespace(char32_t cp);

}  // namespace mambacpp::tok
