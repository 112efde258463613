// The chat template's lexer: template text into tokens, with Jinja's whitespace control as transformers configures
// it (trim_blocks: the newline after a block or comment tag is dropped; lstrip_blocks: spaces and tabs from the
// start of a line up to a block or comment tag are dropped; `{%-`/`-%}` strip all whitespace on that side, `{%+`
// and `+%}` turn lstrip/trim off for that tag). One trailing newline of the source is dropped, as Jinja does by
// default (keep_trailing_newline=False).
#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

namespace mambacpp::chat {

enum class TokenKind { Text, VariableBegin, VariableEnd, BlockBegin, BlockEnd, Name, String, Integer, Float, Operator, End };

struct Token {
  TokenKind kind;
  std::string text;  // Text: the literal text; String: the unescaped value; Name/Operator/number: as written
  size_t offset;     // where the token starts in the source, for "line L, column C" in messages
};

// Jinja's view of a source: \r\n and \r become \n, and one trailing newline is dropped. Offsets in tokens and
// messages refer to this text.
std::string normalize_newlines(std::string_view source);

// Tokens of a normalized source.
std::vector<Token> tokenize(std::string_view source);

// "line L, column C" of a byte offset (columns count bytes from 1).
std::string source_position(std::string_view source, size_t offset);

}  // namespace mambacpp::chat
