// Byte-level alphabet and the GPT-2 word-splitting regex (see byte_level.h).
#include "tokenizer/byte_level.h"

#include "tokenizer/utf8.h"

namespace mambacpp::tok {
namespace {

std::array<char32_t, 256> make_byte_to_char() {
  std::array<char32_t, 256> map{};
  char32_t next_free = 256;
  for (int b = 0; b < 256; ++b) {
    bool printable = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
    map[b] = printable ? static_cast<char32_t>(b) : next_free++;
  }
  return map;
}

// All alphabet characters are below U+0144, so the inverse is a small table; -1 marks "not in the alphabet".
std::array<int16_t, 0x144> make_char_to_byte() {
  std::array<int16_t, 0x144> inv;
  inv.fill(-1);
  const auto& fwd = byte_to_char();
  for (int b = 0; b < 256; ++b) inv[fwd[b]] = static_cast<int16_t>(b);
  return inv;
}

// The GPT-2 pattern with \s spelled out as the Unicode White_Space set (see kWhiteSpaceClass).
std::string gpt2_pattern() {
  std::string ws = kWhiteSpaceClass;
  return "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^" + ws + "\\p{L}\\p{N}]+|[" + ws + "]+(?![^" + ws +
         "])|[" + ws + "]+";
}

}  // namespace

const std::array<char32_t, 256>& byte_to_char() {
  static const std::array<char32_t, 256> map = make_byte_to_char();
  return map;
}

std::optional<uint8_t> char_to_byte(char32_t c) {
  static const std::array<int16_t, 0x144> inv = make_char_to_byte();
  if (c >= inv.size() || inv[c] < 0) return std::nullopt;
  return static_cast<uint8_t>(inv[c]);
}

std::string bytes_to_alphabet(std::string_view bytes) {
  const auto& map = byte_to_char();
  std::string out;
  out.reserve(bytes.size() * 2);
  for (char c : bytes) append_utf8(out, map[static_cast<unsigned char>(c)]);
  return out;
}

std::optional<std::string> alphabet_to_bytes(std::string_view token) {
  if (first_invalid_utf8(token) != token.size()) return std::nullopt;
  std::string out;
  out.reserve(token.size());
  size_t i = 0;
  while (i < token.size()) {
    std::optional<uint8_t> b = char_to_byte(next_code_point(token, i));
    if (!b) return std::nullopt;
    out.push_back(static_cast<char>(*b));
  }
  return out;
}

ByteLevelSplitter::ByteLevelSplitter(ByteLevelOptions options) : options_(options), regex_(gpt2_pattern()) {}

void ByteLevelSplitter::split(std::string_view piece, std::vector<std::string_view>& words,
                              std::string& storage) const {
  if (piece.empty()) return;
  if (options_.add_prefix_space && piece.front() != ' ') {
    storage.clear();
    storage.reserve(piece.size() + 1);
    storage.push_back(' ');
    storage.append(piece);
    piece = storage;
  }
  if (!options_.use_regex) {
    words.push_back(piece);
    return;
  }
  // Isolated split: matches become words, and so would any text between matches (the pattern leaves none, since
  // its last alternatives cover whitespace and every other character).
  size_t covered = 0;
  regex_.for_each_match(piece, [&](size_t begin, size_t end) {
    if (begin > covered) words.push_back(piece.substr(covered, begin - covered));
    words.push_back(piece.substr(begin, end - begin));
    covered = end;
  });
  if (covered < piece.size()) words.push_back(piece.substr(covered));
}

}  // namespace mambacpp::tok
