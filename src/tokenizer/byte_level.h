// The byte-level layer of GPT-2 style tokenizers: every byte is shown as one printable Unicode character (the
// bytes_to_unicode alphabet), and text is cut into words by the GPT-2 regex before BPE sees it.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "tokenizer/regex.h"

namespace mambacpp::tok {

// Byte b -> its character: printable bytes ('!'..'~', U+00A1..U+00AC, U+00AE..U+00FF) stand for themselves, the
// other 68 bytes take U+0100, U+0101, ... in increasing byte order (so the space 0x20 becomes U+0120 'Ġ').
const std::array<char32_t, 256>& byte_to_char();
// The inverse map: the byte a character stands for, if it is one of the 256 alphabet characters.
std::optional<uint8_t> char_to_byte(char32_t c);

// Maps raw bytes to the alphabet, as UTF-8 (what vocab keys look like).
std::string bytes_to_alphabet(std::string_view bytes);
// Maps a vocab string back to bytes; std::nullopt when some character is outside the alphabet.
std::optional<std::string> alphabet_to_bytes(std::string_view token);

struct ByteLevelOptions {
  bool add_prefix_space = false;
  bool use_regex = true;
  bool trim_offsets = true;  // only moves offsets, which we do not report
};

// The ByteLevel pre-tokenizer: splits one piece of (normalised) text into words, each a [begin, end) byte range
// of `piece`, with an optional leading space added first when add_prefix_space is set (then ranges refer to the
// returned string).
class ByteLevelSplitter {
 public:
  explicit ByteLevelSplitter(ByteLevelOptions options);
  const ByteLevelOptions& options() const { return options_; }
  // Appends the words of `piece` (valid UTF-8) to `words` as byte strings (not yet mapped to the alphabet).
  void split(std::string_view piece, std::vector<std::string_view>& words, std::string& storage) const;

 private:
  ByteLevelOptions options_;
  Regex regex_;
};

}  // namespace mambacpp::tok
