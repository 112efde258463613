// Decoder steps (see decoder.h).
#include "tokenizer/decoder.h"

#include <optional>

#include "tokenizer/byte_level.h"
#include "tokenizer/utf8.h"

namespace mambacpp::tok {
namespace {

// Byte-level: each alphabet character back to its byte; a token with any other character gives its own UTF-8.
std::string byte_level_bytes(const std::string& token) {
  std::optional<std::string> bytes = alphabet_to_bytes(token);
  return bytes ? *bytes : token;
}

// "<0xNN>" -> the byte, as HF reads it (Rust's u8::from_str_radix, which also takes "+N").
std::optional<unsigned char> fallback_byte(const std::string& token) {
  if (token.size() != 6 || token.compare(0, 3, "<0x") != 0 || token[5] != '>') return std::nullopt;
  auto hex = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  };
  int hi = hex(token[3]), lo = hex(token[4]);
  if (token[3] == '+' && lo >= 0) return static_cast<unsigned char>(lo);
  if (hi < 0 || lo < 0) return std::nullopt;
  return static_cast<unsigned char>(hi * 16 + lo);
}

std::string replace_all(const std::string& token, const SplitPattern& pattern, const std::string& content) {
  std::string out;
  size_t covered = 0;
  pattern.for_each_match(token, [&](size_t begin, size_t end) {
    out.append(token, covered, begin - covered);
    out += content;
    covered = end;
  });
  out.append(token, covered);
  return out;
}

// Up to `start` copies of `c` off the front and `stop` off the back, counted in characters; never crosses over.
std::string strip(const std::string& token, const std::string& c, size_t start, size_t stop) {
  size_t begin = 0, end = token.size();
  for (size_t k = 0; k < start && token.compare(begin, c.size(), c) == 0 && begin < end; ++k) begin += c.size();
  for (size_t k = 0; k < stop && end >= begin + c.size() && token.compare(end - c.size(), c.size(), c) == 0; ++k) {
    end -= c.size();
  }
  return token.substr(begin, end - begin);
}

// The replacement character back to a space; in the first token of a text (unless the scheme is "never") HF drops
// every replacement character instead, not only a leading one.
std::string metaspace(const std::string& token, const std::string& replacement, bool first) {
  return replace_all(token, SplitPattern::literal(replacement), first ? "" : " ");
}

void byte_fallback(std::vector<std::string>& tokens) {
  std::vector<std::string> out;
  out.reserve(tokens.size());
  std::string run;  // consecutive fallback bytes
  auto flush = [&] {
    if (run.empty()) return;
    if (first_invalid_utf8(run) == run.size()) {
      out.push_back(run);
    } else {
      for (size_t k = 0; k < run.size(); ++k) out.push_back("\uFFFD");  // HF: one U+FFFD per byte of a bad run
    }
    run.clear();
  };
  for (std::string& t : tokens) {
    if (auto b = fallback_byte(t)) {
      run.push_back(static_cast<char>(*b));
      continue;
    }
    flush();
    out.push_back(std::move(t));
  }
  flush();
  tokens = std::move(out);
}

}  // namespace

std::string Decoder::decode(std::vector<std::string> tokens) const {
  if (!present_) {
    std::string out;
    for (size_t k = 0; k < tokens.size(); ++k) out += (k ? " " : "") + tokens[k];
    return out;
  }
  for (const DecoderStep& step : steps_) {
    switch (step.kind) {
      case DecoderStep::ByteLevel: {
        std::string bytes;
        for (const std::string& t : tokens) bytes += byte_level_bytes(t);
        tokens.assign(1, utf8_lossy(bytes));
        break;
      }
      case DecoderStep::Replace:
        for (std::string& t : tokens) t = replace_all(t, *step.pattern, step.content);
        break;
      case DecoderStep::ByteFallback:
        byte_fallback(tokens);
        break;
      case DecoderStep::Fuse: {
        std::string all;
        for (const std::string& t : tokens) all += t;
        tokens.assign(1, std::move(all));
        break;
      }
      case DecoderStep::Strip:
        for (std::string& t : tokens) t = strip(t, step.content, step.start, step.stop);
        break;
      case DecoderStep::Metaspace:
        for (size_t k = 0; k < tokens.size(); ++k) {
          tokens[k] = metaspace(tokens[k], step.content, k == 0 && step.prepend);
        }
        break;
    }
  }
  std::string out;
  for (const std::string& t : tokens) out += t;
  return out;
}

std::string Decoder::piece(const std::string& token) const {
  if (!present_) return " " + token;  // joined by spaces: each token after the first brings one
  std::string t = token;
  bool fused = false;  // after a Fuse, a Strip works on the whole text: in the middle it changes nothing
  for (const DecoderStep& step : steps_) {
    switch (step.kind) {
      case DecoderStep::ByteLevel:
        t = byte_level_bytes(t);
        fused = true;
        break;
      case DecoderStep::Replace:
        t = replace_all(t, *step.pattern, step.content);
        break;
      case DecoderStep::ByteFallback:
        if (auto b = fallback_byte(t)) t = std::string(1, static_cast<char>(*b));
        break;
      case DecoderStep::Fuse:
        fused = true;
        break;
      case DecoderStep::Strip:
        if (!fused) t = strip(t, step.content, step.start, step.stop);
        break;
      case DecoderStep::Metaspace:
        t = metaspace(t, step.content, false);
        break;
    }
  }
  return t;
}

}  // namespace mambacpp::tok
