#include "chat/lexer.h"

#include <cstdint>

#include "mambacpp/error.h"

namespace mambacpp::chat {

namespace {

bool is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'; }
bool is_name_start(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_'; }
bool is_digit(char c) { return c >= '0' && c <= '9'; }

void append_utf8(std::string& out, uint32_t cp) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xE0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

class Lexer {
 public:
  explicit Lexer(std::string_view src) : src_(src) {}

  std::vector<Token> run() {
    size_t pos = 0;
    bool line_starting = true;  // the previous tag's text ended a line (or we are at the start): lstrip applies
    while (pos < src_.size()) {
      const size_t tag = find_tag(pos);
      std::string text(src_.substr(pos, tag - pos));
      if (tag == src_.size()) {
        emit_text(std::move(text), pos);
        break;
      }
      const char kind = src_[tag + 1];  // '{', '%' or '#'
      const char left = tag + 2 < src_.size() ? src_[tag + 2] : '\0';
      if (left == '-') {
        while (!text.empty() && is_space(text.back())) text.pop_back();
      } else if (kind != '{' && left != '+') {
        const size_t line_start = text.rfind('\n') == std::string::npos ? 0 : text.rfind('\n') + 1;
        if (line_start > 0 || line_starting) {
          bool blank = true;
          for (size_t k = line_start; k < text.size(); ++k) blank = blank && (text[k] == ' ' || text[k] == '\t');
          if (blank) text.resize(line_start);
        }
      }
      emit_text(std::move(text), pos);
      size_t p = tag + 2 + ((left == '-' || left == '+') ? 1 : 0);
      if (kind == '#') {
        const size_t close = src_.find("#}", p);
        if (close == std::string_view::npos) fail_at(tag, "a comment opened here is never closed with #}");
        pos = after_tag_end(close, close + 2, true);
      } else if (kind == '%' && is_raw(p)) {
        pos = lex_raw(tag, p);
      } else {
        tokens_.push_back({kind == '{' ? TokenKind::VariableBegin : TokenKind::BlockBegin, {}, tag});
        pos = lex_tag(p, kind == '{' ? '}' : '%', tag);
      }
      line_starting = pos > 0 && src_[pos - 1] == '\n';
    }
    tokens_.push_back({TokenKind::End, {}, src_.size()});
    return std::move(tokens_);
  }

 private:
  [[noreturn]] void fail_at(size_t offset, const std::string& what) {
    fail("chat template ", source_position(src_, offset), ": ", what);
  }

  size_t find_tag(size_t pos) const {
    for (size_t k = pos; k + 1 < src_.size(); ++k)
      if (src_[k] == '{' && (src_[k + 1] == '{' || src_[k + 1] == '%' || src_[k + 1] == '#')) return k;
    return src_.size();
  }

  void emit_text(std::string text, size_t offset) {
    if (!text.empty()) tokens_.push_back({TokenKind::Text, std::move(text), offset});
  }

  // `close` is where the closing delimiter starts, `end` just past it. A '-' before the delimiter strips the
  // whitespace after the tag; otherwise a block or comment tag drops one newline after it unless written with '+'.
  size_t after_tag_end(size_t close, size_t end, bool block_like) {
    const char modifier = close > 0 ? src_[close - 1] : '\0';
    if (modifier == '-') {
      while (end < src_.size() && is_space(src_[end])) ++end;
    } else if (block_like && modifier != '+' && end < src_.size() && src_[end] == '\n') {
      ++end;
    }
    return end;
  }

  bool is_raw(size_t p) const {
    while (p < src_.size() && is_space(src_[p])) ++p;
    if (src_.compare(p, 3, "raw") != 0) return false;
    p += 3;
    while (p < src_.size() && is_space(src_[p])) ++p;
    return src_.compare(p, 2, "%}") == 0 || src_.compare(p, 3, "-%}") == 0 || src_.compare(p, 3, "+%}") == 0;
  }

  size_t lex_raw(size_t tag, size_t p) {
    const size_t open_close = src_.find("%}", p);
    size_t body = after_tag_end(open_close, open_close + 2, true);
    // Find {% endraw %} (with optional whitespace control).
    for (size_t k = body; k + 1 < src_.size(); ++k) {
      if (src_[k] != '{' || src_[k + 1] != '%') continue;
      size_t q = k + 2;
      const char left = q < src_.size() ? src_[q] : '\0';
      if (left == '-' || left == '+') ++q;
      while (q < src_.size() && is_space(src_[q])) ++q;
      if (src_.compare(q, 6, "endraw") != 0) continue;
      q += 6;
      while (q < src_.size() && is_space(src_[q])) ++q;
      if (q < src_.size() && (src_[q] == '-' || src_[q] == '+')) ++q;
      if (src_.compare(q, 2, "%}") != 0) continue;
      std::string text(src_.substr(body, k - body));
      if (left == '-')
        while (!text.empty() && is_space(text.back())) text.pop_back();
      emit_text(std::move(text), body);
      return after_tag_end(q, q + 2, true);
    }
    fail_at(tag, "{% raw %} is never closed with {% endraw %}");
  }

  size_t lex_tag(size_t p, char closer, size_t tag) {
    int depth = 0;  // open brackets: a '}}' inside a dict literal does not end the tag
    while (true) {
      while (p < src_.size() && is_space(src_[p])) ++p;
      if (p >= src_.size())
        fail_at(tag, closer == '}' ? "a {{ opened here is never closed with }}" : "a {% opened here is never closed with %}");
      const char c = src_[p];
      // End of the tag: "}}", "%}", with an optional '-' or '+' before it.
      const size_t mod = (c == '-' || c == '+') ? 1 : 0;
      if (depth == 0 && p + mod + 1 < src_.size() && src_[p + mod] == closer && src_[p + mod + 1] == '}' &&
          (mod == 0 || closer == '%' || c == '-')) {
        tokens_.push_back({closer == '}' ? TokenKind::VariableEnd : TokenKind::BlockEnd, {}, p});
        return after_tag_end(p + mod, p + mod + 2, closer == '%');
      }
      if (is_name_start(c)) {
        size_t e = p;
        while (e < src_.size() && (is_name_start(src_[e]) || is_digit(src_[e]))) ++e;
        tokens_.push_back({TokenKind::Name, std::string(src_.substr(p, e - p)), p});
        p = e;
      } else if (is_digit(c)) {
        p = lex_number(p);
      } else if (c == '\'' || c == '"') {
        p = lex_string(p);
      } else {
        static const char* const kTwo[] = {"//", "**", "==", "!=", "<=", ">="};
        std::string op(1, c);
        for (const char* two : kTwo)
          if (src_.compare(p, 2, two) == 0) op = two;
        if (op.size() == 1 && std::string_view("+-*/%~[](){}<>=.:|,").find(c) == std::string_view::npos)
          fail_at(p, std::string("unexpected character '") + c + "' in a tag");
        if (op == "(" || op == "[" || op == "{") ++depth;
        if (op == ")" || op == "]" || op == "}") {
          if (depth == 0) fail_at(p, "unexpected '" + op + "' (nothing is open to close)");
          --depth;
        }
        tokens_.push_back({TokenKind::Operator, op, p});
        p += op.size();
      }
    }
  }

  size_t lex_number(size_t p) {
    size_t e = p;
    const auto digits = [&] {
      while (e < src_.size() && (is_digit(src_[e]) || (src_[e] == '_' && e + 1 < src_.size() && is_digit(src_[e + 1]))))
        ++e;
    };
    digits();
    bool is_float = false;
    if (e + 1 < src_.size() && src_[e] == '.' && is_digit(src_[e + 1])) {
      is_float = true;
      ++e;
      digits();
    }
    if (e < src_.size() && (src_[e] == 'e' || src_[e] == 'E')) {
      size_t q = e + 1;
      if (q < src_.size() && (src_[q] == '+' || src_[q] == '-')) ++q;
      if (q < src_.size() && is_digit(src_[q])) {
        is_float = true;
        e = q;
        digits();
      }
    }
    std::string text;
    for (size_t k = p; k < e; ++k)
      if (src_[k] != '_') text += src_[k];
    tokens_.push_back({is_float ? TokenKind::Float : TokenKind::Integer, text, p});
    return e;
  }

  size_t lex_string(size_t p) {
    const char quote = src_[p];
    std::string value;
    size_t k = p + 1;
    while (true) {
      if (k >= src_.size()) fail_at(p, "a string opened here is never closed");
      const char c = src_[k];
      if (c == quote) break;
      if (c != '\\') {
        value += c;
        ++k;
        continue;
      }
      if (k + 1 >= src_.size()) fail_at(p, "a string opened here is never closed");
      const char e = src_[k + 1];
      k += 2;
      switch (e) {
        case 'n': value += '\n'; break;
        case 't': value += '\t'; break;
        case 'r': value += '\r'; break;
        case 'a': value += '\a'; break;
        case 'b': value += '\b'; break;
        case 'f': value += '\f'; break;
        case 'v': value += '\v'; break;
        case '\\': value += '\\'; break;
        case '\'': value += '\''; break;
        case '"': value += '"'; break;
        case '\n': break;  // a backslash-newline continues the line
        case 'x':
        case 'u':
        case 'U': {
          const size_t n = e == 'x' ? 2 : e == 'u' ? 4 : 8;
          uint32_t cp = 0;
          for (size_t d = 0; d < n; ++d) {
            const char h = k + d < src_.size() ? src_[k + d] : '\0';
            int digit = (h >= '0' && h <= '9') ? h - '0' : (h >= 'a' && h <= 'f') ? h - 'a' + 10
                      : (h >= 'A' && h <= 'F') ? h - 'A' + 10 : -1;
            if (digit < 0) fail_at(k - 2, std::string("a \\") + e + " escape needs " + std::to_string(n) + " hex digits");
            cp = cp * 16 + static_cast<uint32_t>(digit);
          }
          if (cp > 0x10FFFF) fail_at(k - 2, "a \\U escape beyond U+10FFFF");
          k += n;
          append_utf8(value, cp);
          break;
        }
        default:
          if (e >= '0' && e <= '7') {
            uint32_t cp = static_cast<uint32_t>(e - '0');
            for (int d = 0; d < 2 && k < src_.size() && src_[k] >= '0' && src_[k] <= '7'; ++d, ++k)
              cp = cp * 8 + static_cast<uint32_t>(src_[k] - '0');
            append_utf8(value, cp);
          } else {
            value += '\\';  // Python keeps an unknown escape as written
            value += e;
          }
      }
    }
    tokens_.push_back({TokenKind::String, std::move(value), p});
    return k + 1;
  }

  std::string_view src_;
  std::vector<Token> tokens_;
};

}  // namespace

std::string normalize_newlines(std::string_view source) {
  std::string out;
  out.reserve(source.size());
  for (size_t k = 0; k < source.size(); ++k) {
    if (source[k] == '\r') {
      out += '\n';
      if (k + 1 < source.size() && source[k + 1] == '\n') ++k;
    } else {
      out += source[k];
    }
  }
  if (!out.empty() && out.back() == '\n') out.pop_back();
  return out;
}

std::vector<Token> tokenize(std::string_view source) { return Lexer(source).run(); }

std::string source_position(std::string_view source, size_t offset) {
  size_t line = 1, column = 1;
  for (size_t k = 0; k < offset && k < source.size(); ++k) {
    if (source[k] == '\n') {
      ++line;
      column = 1;
    } else {
      ++column;
    }
  }
  return "line " + std::to_string(line) + ", column " + std::to_string(column);
}

}  // namespace mambacpp::chat
