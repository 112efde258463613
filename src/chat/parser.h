// The chat template's parser: tokens into a syntax tree (ast.h), following Jinja's grammar and operator precedence.
// Nesting (of blocks and of expressions) is bounded so that a hostile template cannot exhaust the stack.
#pragma once

#include <string_view>

#include "chat/ast.h"

namespace mambacpp::chat {

inline constexpr int kMaxParseNesting = 200;

// `source` as normalize_newlines() returned it. Throws Error "chat template line L, column C: ...".
Body parse_template(std::string_view source);

}  // namespace mambacpp::chat
