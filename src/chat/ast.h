// The syntax tree of a chat template: expressions and statements as the parser builds them and the interpreter
// walks them. Every node keeps its source offset for "line L, column C" in messages.
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "chat/value.h"

namespace mambacpp::chat {

struct Expr;
using ExprPtr = std::unique_ptr<Expr>;

struct Expr {
  enum class Kind {
    Literal,    // literal
    Name,       // name
    List,       // args: elements
    Tuple,      // args: elements
    Dict,       // kwargs-like pairs in `pairs`
    GetAttr,    // args[0].name
    GetItem,    // args[0][args[1]]
    Slice,      // args[0][args[1]:args[2]:args[3]] (null where omitted)
    Call,       // args[0](args[1..], kwargs, *star, **star_star)
    Filter,     // args[0] | name(args[1..], kwargs)
    Test,       // args[0] is [not] name(args[1..])
    Not,        // not args[0]
    Negate,     // -args[0]
    Plus,       // +args[0]
    Binary,     // args[0] op args[1]: + - * / // % ** ~
    And,        // args[0] and args[1]
    Or,         // args[0] or args[1]
    Compare,    // args[0] ops[0] args[1] ops[1] args[2] ... (Python's chained comparison)
    Conditional // args[1] if args[0] else args[2] (args[2] null: undefined)
  };
  Kind kind;
  size_t offset = 0;
  Value literal;
  std::string name;  // Name, GetAttr attribute, Filter/Test name, Binary operator
  std::vector<ExprPtr> args;
  std::vector<std::pair<std::string, ExprPtr>> kwargs;
  std::vector<std::pair<ExprPtr, ExprPtr>> pairs;  // Dict
  std::vector<std::string> ops;                    // Compare: "==", "!=", "<", "<=", ">", ">=", "in", "not in"
  ExprPtr star;                                     // Call: *args
  ExprPtr star_star;                                // Call: **kwargs
  bool negated = false;                             // Test: `is not`
};

struct Stmt;
using StmtPtr = std::unique_ptr<Stmt>;
using Body = std::vector<StmtPtr>;

struct Stmt {
  enum class Kind {
    Text,      // text
    Print,     // {{ expr }}
    If,        // branches: (condition, body); a null condition is the else branch
    For,       // for targets in expr [if filter] ... [else else_body]
    Set,       // set targets = expr, or set attr_object.attr = expr
    SetBlock,  // {% set target %}body{% endset %}
    Macro,     // {% macro name(params) %}body{% endmacro %}
    CallBlock, // {% call(params) expr %}body{% endcall %}: the body is caller()
    FilterBlock,  // {% filter name(args) %}body{% endfilter %}: expr is a Filter whose args[0] is null
    Break,
    Continue,
    Scope      // a block that renders its body as is ({% generation %}, transformers' assistant-mask marker)
  };
  Kind kind;
  size_t offset = 0;
  std::string text;
  ExprPtr expr;
  std::vector<std::pair<ExprPtr, Body>> branches;
  std::vector<std::string> targets;
  std::string attribute;  // Set to a namespace attribute: targets[0].attribute
  ExprPtr filter;
  Body body, else_body;
  bool recursive = false;
  std::string name;
  std::vector<std::pair<std::string, ExprPtr>> params;  // Macro/CallBlock parameters with optional defaults
};

}  // namespace mambacpp::chat
