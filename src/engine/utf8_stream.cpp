// Finding where a byte string stops being complete UTF-8, and a stream that holds back the incomplete tail.
#include "engine/utf8_stream.h"

namespace mambacpp {

namespace {

bool is_continuation(unsigned char c) { return (c & 0xC0) == 0x80; }

// Bytes a character starting with `c` has in total; 0 when `c` cannot start a multi-byte character
// (ASCII, a continuation byte, or a byte never valid in UTF-8: C0, C1, F5..FF).
size_t sequence_length(unsigned char c) {
  if (c >= 0xC2 && c <= 0xDF) return 2;
  if (c >= 0xE0 && c <= 0xEF) return 3;
  if (c >= 0xF0 && c <= 0xF4) return 4;
  return 0;
}

}  // namespace

size_t utf8_complete_prefix(std::string_view s) {
  // Walk back over at most 3 continuation bytes to the byte that would start the last character.
  size_t i = s.size();
  size_t trailing = 0;
  while (i > 0 && trailing < 3 && is_continuation(static_cast<unsigned char>(s[i - 1]))) {
    --i;
    ++trailing;
  }
  if (i == 0) return s.size();  // only continuation bytes: nothing could complete them
  const size_t lead = i - 1;
  const size_t need = sequence_length(static_cast<unsigned char>(s[lead]));
  // Incomplete when the lead wants more bytes than are there; a complete or over-long run goes out as-is.
  if (need > 0 && trailing + 1 < need) return lead;
  return s.size();
}

std::string Utf8Stream::push(std::string_view bytes) {
  pending_.append(bytes);
  const size_t n = utf8_complete_prefix(pending_);
  std::string out = pending_.substr(0, n);
  pending_.erase(0, n);
  return out;
}

std::string Utf8Stream::flush() {
  std::string out;
  out.swap(pending_);
  return out;
}

}  // namespace mambacpp
