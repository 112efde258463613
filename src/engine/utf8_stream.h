// Streaming of token bytes as text: byte-level BPE tokens may end in the middle of a UTF-8 character, so a
// streamed piece must stop before a trailing incomplete character and send it with the next piece. Only a suffix
// that could still become a valid character is held back; anything else (invalid bytes) goes out as-is, so the
// concatenation of all pieces plus flush() is exactly the concatenation of all bytes fed.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace mambacpp {

// Length of the longest prefix of `s` that does not end in an incomplete UTF-8 character: s.size() minus the length
// of a trailing lead byte (C2..F4) followed by fewer continuation bytes than it needs (at most 3 bytes held back).
size_t utf8_complete_prefix(std::string_view s);

class Utf8Stream {
 public:
  // Appends `bytes` and returns the part of the pending bytes that is safe to show now (may be empty).
  std::string push(std::string_view bytes);
  // Returns everything still pending (an incomplete character at the end of the stream goes out as-is).
  std::string flush();
  size_t pending() const { return pending_.size(); }

 private:
  std::string pending_;
};

}  // namespace mambacpp
