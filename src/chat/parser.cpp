#include "chat/parser.h"

#include <charconv>
#include <cstdlib>

#include "chat/lexer.h"
#include "mambacpp/error.h"

namespace mambacpp::chat {

namespace {

class Parser {
 public:
  Parser(std::string_view source, std::vector<Token> tokens) : src_(source), tokens_(std::move(tokens)) {}

  Body parse_all() {
    Body body = parse_body({});
    if (peek().kind != TokenKind::End) error_here("unexpected tag");
    return body;
  }

 private:
  struct DepthGuard {
    explicit DepthGuard(Parser& p) : p(p) {
      if (++p.depth_ > kMaxParseNesting)
        p.error_here("nesting deeper than " + std::to_string(kMaxParseNesting) + " levels");
    }
    ~DepthGuard() { --p.depth_; }
    Parser& p;
  };

  const Token& peek(size_t ahead = 0) const {
    return tokens_[std::min(pos_ + ahead, tokens_.size() - 1)];
  }
  const Token& next() {
    const Token& t = tokens_[pos_];
    if (pos_ + 1 < tokens_.size()) ++pos_;
    return t;
  }
  bool is_op(const char* op, size_t ahead = 0) const {
    return peek(ahead).kind == TokenKind::Operator && peek(ahead).text == op;
  }
  bool is_name(const char* name, size_t ahead = 0) const {
    return peek(ahead).kind == TokenKind::Name && peek(ahead).text == name;
  }
  static std::string describe(const Token& t) {
    switch (t.kind) {
      case TokenKind::Text: return "template text";
      case TokenKind::VariableBegin: return "'{{'";
      case TokenKind::VariableEnd: return "'}}'";
      case TokenKind::BlockBegin: return "'{%'";
      case TokenKind::BlockEnd: return "'%}'";
      case TokenKind::Name: return "'" + t.text + "'";
      case TokenKind::String: return "a string";
      case TokenKind::Integer:
      case TokenKind::Float: return "number " + t.text;
      case TokenKind::Operator: return "'" + t.text + "'";
      case TokenKind::End: return "the end of the template";
    }
    return "?";
  }
  [[noreturn]] void error_at(size_t offset, const std::string& what) const {
    fail("chat template ", source_position(src_, offset), ": ", what);
  }
  [[noreturn]] void error_here(const std::string& what) const {
    error_at(peek().offset, what + " (found " + describe(peek()) + ")");
  }
  void expect_op(const char* op) {
    if (!is_op(op)) error_here(std::string("expected '") + op + "'");
    next();
  }
  void expect_name(const char* name) {
    if (!is_name(name)) error_here(std::string("expected '") + name + "'");
    next();
  }
  std::string expect_identifier(const char* what) {
    if (peek().kind != TokenKind::Name) error_here(std::string("expected ") + what);
    return next().text;
  }
  void expect_block_end() {
    if (peek().kind != TokenKind::BlockEnd) error_here("expected '%}'");
    next();
  }

  ExprPtr node(Expr::Kind kind, size_t offset) {
    auto e = std::make_unique<Expr>();
    e->kind = kind;
    e->offset = offset;
    return e;
  }

  // ---- Statements ------------------------------------------------------------------------------------------------
  // Parses until a block tag whose name is in `ends` (left unconsumed: the BlockBegin and the name stay) or the end.
  Body parse_body(std::initializer_list<const char*> ends) {
    DepthGuard guard(*this);
    Body body;
    while (true) {
      const Token& t = peek();
      if (t.kind == TokenKind::End) {
        if (ends.size() != 0) error_here(std::string("expected {% ") + *(ends.end() - 1) + " %}");
        return body;
      }
      if (t.kind == TokenKind::Text) {
        auto s = std::make_unique<Stmt>();
        s->kind = Stmt::Kind::Text;
        s->offset = t.offset;
        s->text = t.text;
        body.push_back(std::move(s));
        next();
      } else if (t.kind == TokenKind::VariableBegin) {
        next();
        auto s = std::make_unique<Stmt>();
        s->kind = Stmt::Kind::Print;
        s->offset = t.offset;
        s->expr = parse_tuple(true);
        if (peek().kind != TokenKind::VariableEnd) error_here("expected '}}'");
        next();
        body.push_back(std::move(s));
      } else if (t.kind == TokenKind::BlockBegin) {
        for (const char* end : ends)
          if (is_name(end, 1)) return body;
        next();
        body.push_back(parse_statement());
      } else {
        error_here("unexpected token");
      }
    }
  }

  // After a body that stopped at `{% name`: consumes `{% name %}`.
  void end_block(const char* name) {
    next();  // BlockBegin
    expect_name(name);
    expect_block_end();
  }

  StmtPtr parse_statement() {
    const Token& t = peek();
    if (t.kind != TokenKind::Name) error_here("expected a tag name");
    auto s = std::make_unique<Stmt>();
    s->offset = t.offset;
    const std::string tag = next().text;
    if (tag == "if") return parse_if(std::move(s));
    if (tag == "for") return parse_for(std::move(s));
    if (tag == "set") return parse_set(std::move(s));
    if (tag == "macro") return parse_macro(std::move(s));
    if (tag == "call") return parse_call_block(std::move(s));
    if (tag == "filter") return parse_filter_block(std::move(s));
    if (tag == "break" || tag == "continue") {
      if (loop_depth_ == 0) error_at(s->offset, "'" + tag + "' outside of a for loop");
      s->kind = tag == "break" ? Stmt::Kind::Break : Stmt::Kind::Continue;
      expect_block_end();
      return s;
    }
    if (tag == "generation") {
      s->kind = Stmt::Kind::Scope;
      expect_block_end();
      s->body = parse_body({"endgeneration"});
      end_block("endgeneration");
      return s;
    }
    error_at(s->offset, "unsupported tag '" + tag + "' (chat templates may use if, for, set, macro, call, filter, "
                        "break, continue, raw and generation)");
  }

  StmtPtr parse_if(StmtPtr s) {
    s->kind = Stmt::Kind::If;
    ExprPtr cond = parse_tuple(false);
    expect_block_end();
    while (true) {
      Body body = parse_body({"elif", "else", "endif"});
      s->branches.emplace_back(std::move(cond), std::move(body));
      next();  // BlockBegin
      const std::string which = next().text;
      if (which == "elif") {
        cond = parse_tuple(false);
        expect_block_end();
      } else if (which == "else") {
        expect_block_end();
        s->branches.emplace_back(nullptr, parse_body({"endif"}));
        end_block("endif");
        return s;
      } else {
        expect_block_end();
        return s;
      }
    }
  }

  std::vector<std::string> parse_targets() {
    std::vector<std::string> names;
    const bool paren = is_op("(");
    if (paren) next();
    do {
      names.push_back(expect_identifier("a variable name"));
      if (!is_op(",")) break;
      next();
    } while (peek().kind == TokenKind::Name && !is_name("in"));
    if (paren) expect_op(")");
    return names;
  }

  StmtPtr parse_for(StmtPtr s) {
    s->kind = Stmt::Kind::For;
    s->targets = parse_targets();
    expect_name("in");
    s->expr = parse_tuple(false, /*stop_at_recursive=*/true);
    if (is_name("if")) {
      next();
      s->filter = parse_expression(true);
    }
    if (is_name("recursive")) {
      next();
      s->recursive = true;
    }
    expect_block_end();
    ++loop_depth_;
    s->body = parse_body({"else", "endfor"});
    --loop_depth_;
    if (is_name("else", 1)) {
      end_block("else");
      const int saved = loop_depth_;
      loop_depth_ = 0;  // break/continue in a for's else belong to an enclosing loop, which Jinja refuses too
      s->else_body = parse_body({"endfor"});
      loop_depth_ = saved;
    }
    end_block("endfor");
    return s;
  }

  StmtPtr parse_set(StmtPtr s) {
    const std::string first = expect_identifier("a variable name after 'set'");
    if (is_op(".")) {
      next();
      s->kind = Stmt::Kind::Set;
      s->targets = {first};
      s->attribute = expect_identifier("an attribute name");
      expect_op("=");
      s->expr = parse_tuple(true);
      expect_block_end();
      return s;
    }
    s->targets = {first};
    while (is_op(",")) {
      next();
      s->targets.push_back(expect_identifier("a variable name"));
    }
    if (is_op("=")) {
      next();
      s->kind = Stmt::Kind::Set;
      s->expr = parse_tuple(true);
      expect_block_end();
      return s;
    }
    if (s->targets.size() != 1) error_here("expected '=' after the names of a {% set %}");
    s->kind = Stmt::Kind::SetBlock;
    if (is_op("|")) s->filter = parse_filters(nullptr);
    expect_block_end();
    s->body = parse_body({"endset"});
    end_block("endset");
    return s;
  }

  void parse_params(Stmt& s) {
    expect_op("(");
    while (!is_op(")")) {
      std::string name = expect_identifier("a parameter name");
      ExprPtr def;
      if (is_op("=")) {
        next();
        def = parse_expression(true);
      }
      s.params.emplace_back(std::move(name), std::move(def));
      if (!is_op(",")) break;
      next();
    }
    expect_op(")");
  }

  StmtPtr parse_macro(StmtPtr s) {
    s->kind = Stmt::Kind::Macro;
    s->name = expect_identifier("a macro name");
    parse_params(*s);
    expect_block_end();
    const int saved = loop_depth_;
    loop_depth_ = 0;
    s->body = parse_body({"endmacro"});
    loop_depth_ = saved;
    end_block("endmacro");
    return s;
  }

  StmtPtr parse_call_block(StmtPtr s) {
    s->kind = Stmt::Kind::CallBlock;
    if (is_op("(")) parse_params(*s);
    s->expr = parse_expression(true);
    if (s->expr->kind != Expr::Kind::Call) error_at(s->expr->offset, "{% call %} expects a macro call");
    expect_block_end();
    s->body = parse_body({"endcall"});
    end_block("endcall");
    return s;
  }

  StmtPtr parse_filter_block(StmtPtr s) {
    s->kind = Stmt::Kind::FilterBlock;
    s->filter = parse_filter_chain(nullptr, /*first_without_bar=*/true);
    expect_block_end();
    s->body = parse_body({"endfilter"});
    end_block("endfilter");
    return s;
  }

  // ---- Expressions -----------------------------------------------------------------------------------------------
  ExprPtr parse_tuple(bool with_conditional, bool stop_at_recursive = false) {
    const size_t offset = peek().offset;
    ExprPtr first = parse_expression(with_conditional);
    if (!is_op(",")) return first;
    auto t = node(Expr::Kind::Tuple, offset);
    t->args.push_back(std::move(first));
    while (is_op(",")) {
      next();
      const Token& n = peek();
      if (n.kind == TokenKind::VariableEnd || n.kind == TokenKind::BlockEnd || is_op(")") || is_op("=") ||
          (stop_at_recursive && (is_name("recursive") || is_name("if"))))
        break;
      t->args.push_back(parse_expression(with_conditional));
    }
    return t;
  }

  ExprPtr parse_expression(bool with_conditional) {
    DepthGuard guard(*this);
    return with_conditional ? parse_conditional() : parse_or();
  }

  ExprPtr parse_conditional() {
    ExprPtr e = parse_or();
    while (is_name("if")) {
      const size_t offset = next().offset;
      auto c = node(Expr::Kind::Conditional, offset);
      c->args.push_back(parse_or());
      c->args.push_back(std::move(e));
      if (is_name("else")) {
        next();
        c->args.push_back(parse_conditional());
      } else {
        c->args.push_back(nullptr);
      }
      e = std::move(c);
    }
    return e;
  }

  ExprPtr binary(Expr::Kind kind, size_t offset, ExprPtr a, ExprPtr b, std::string op = {}) {
    auto e = node(kind, offset);
    e->name = std::move(op);
    e->args.push_back(std::move(a));
    e->args.push_back(std::move(b));
    return e;
  }

  ExprPtr parse_or() {
    ExprPtr e = parse_and();
    while (is_name("or")) {
      const size_t offset = next().offset;
      e = binary(Expr::Kind::Or, offset, std::move(e), parse_and());
    }
    return e;
  }

  ExprPtr parse_and() {
    ExprPtr e = parse_not();
    while (is_name("and")) {
      const size_t offset = next().offset;
      e = binary(Expr::Kind::And, offset, std::move(e), parse_not());
    }
    return e;
  }

  ExprPtr parse_not() {
    if (is_name("not")) {
      DepthGuard guard(*this);
      const size_t offset = next().offset;
      auto e = node(Expr::Kind::Not, offset);
      e->args.push_back(parse_not());
      return e;
    }
    return parse_compare();
  }

  ExprPtr parse_compare() {
    const size_t offset = peek().offset;
    ExprPtr first = parse_math1();
    ExprPtr cmp;
    while (true) {
      std::string op;
      if (peek().kind == TokenKind::Operator &&
          (peek().text == "==" || peek().text == "!=" || peek().text == "<" || peek().text == "<=" ||
           peek().text == ">" || peek().text == ">=")) {
        op = next().text;
      } else if (is_name("in")) {
        next();
        op = "in";
      } else if (is_name("not") && is_name("in", 1)) {
        next();
        next();
        op = "not in";
      } else {
        break;
      }
      if (!cmp) {
        cmp = node(Expr::Kind::Compare, offset);
        cmp->args.push_back(std::move(first));
      }
      cmp->ops.push_back(op);
      cmp->args.push_back(parse_math1());
    }
    return cmp ? std::move(cmp) : std::move(first);
  }

  ExprPtr parse_math1() {
    ExprPtr e = parse_concat();
    while (is_op("+") || is_op("-")) {
      const Token& t = next();
      e = binary(Expr::Kind::Binary, t.offset, std::move(e), parse_concat(), t.text);
    }
    return e;
  }

  ExprPtr parse_concat() {
    ExprPtr e = parse_math2();
    while (is_op("~")) {
      const Token& t = next();
      e = binary(Expr::Kind::Binary, t.offset, std::move(e), parse_math2(), "~");
    }
    return e;
  }

  ExprPtr parse_math2() {
    ExprPtr e = parse_pow();
    while (is_op("*") || is_op("/") || is_op("//") || is_op("%")) {
      const Token& t = next();
      e = binary(Expr::Kind::Binary, t.offset, std::move(e), parse_pow(), t.text);
    }
    return e;
  }

  ExprPtr parse_pow() {
    ExprPtr e = parse_unary(true);
    while (is_op("**")) {
      const Token& t = next();
      e = binary(Expr::Kind::Binary, t.offset, std::move(e), parse_unary(true), "**");
    }
    return e;
  }

  ExprPtr parse_unary(bool with_filter) {
    DepthGuard guard(*this);
    ExprPtr e;
    if (is_op("-") || is_op("+")) {
      const Token& t = next();
      e = node(t.text == "-" ? Expr::Kind::Negate : Expr::Kind::Plus, t.offset);
      e->args.push_back(parse_unary(false));
    } else {
      e = parse_postfix(parse_primary());
    }
    return with_filter ? parse_filter_expr(std::move(e)) : std::move(e);
  }

  ExprPtr parse_primary() {
    const Token& t = peek();
    switch (t.kind) {
      case TokenKind::Name: {
        next();
        if (t.text == "true" || t.text == "True") return literal(Value::boolean(true), t.offset);
        if (t.text == "false" || t.text == "False") return literal(Value::boolean(false), t.offset);
        if (t.text == "none" || t.text == "None") return literal(Value::none(), t.offset);
        auto e = node(Expr::Kind::Name, t.offset);
        e->name = t.text;
        return e;
      }
      case TokenKind::String: {
        std::string s;
        const size_t offset = t.offset;
        while (peek().kind == TokenKind::String) s += next().text;  // adjacent strings concatenate
        return literal(Value::string(std::move(s)), offset);
      }
      case TokenKind::Integer: {
        next();
        int64_t v = 0;
        auto r = std::from_chars(t.text.data(), t.text.data() + t.text.size(), v);
        if (r.ec != std::errc()) error_at(t.offset, "integer " + t.text + " is out of range");
        return literal(Value::integer(v), t.offset);
      }
      case TokenKind::Float: {
        next();
        return literal(Value::number(std::strtod(t.text.c_str(), nullptr)), t.offset);
      }
      case TokenKind::Operator:
        if (t.text == "(") {
          next();
          if (is_op(")")) {
            next();
            return node(Expr::Kind::Tuple, t.offset);
          }
          ExprPtr first = parse_expression(true);
          if (is_op(")")) {
            next();
            return first;
          }
          auto tuple = node(Expr::Kind::Tuple, t.offset);
          tuple->args.push_back(std::move(first));
          while (is_op(",")) {
            next();
            if (is_op(")")) break;
            tuple->args.push_back(parse_expression(true));
          }
          expect_op(")");
          return tuple;
        }
        if (t.text == "[") {
          next();
          auto list = node(Expr::Kind::List, t.offset);
          while (!is_op("]")) {
            list->args.push_back(parse_expression(true));
            if (!is_op(",")) break;
            next();
          }
          expect_op("]");
          return list;
        }
        if (t.text == "{") {
          next();
          auto dict = node(Expr::Kind::Dict, t.offset);
          while (!is_op("}")) {
            ExprPtr key = parse_expression(true);
            expect_op(":");
            dict->pairs.emplace_back(std::move(key), parse_expression(true));
            if (!is_op(",")) break;
            next();
          }
          expect_op("}");
          return dict;
        }
        break;
      default:
        break;
    }
    error_here("expected an expression");
  }

  ExprPtr literal(Value v, size_t offset) {
    auto e = node(Expr::Kind::Literal, offset);
    e->literal = std::move(v);
    return e;
  }

  ExprPtr parse_postfix(ExprPtr e) {
    while (true) {
      if (is_op(".")) {
        const size_t offset = next().offset;
        auto g = node(Expr::Kind::GetAttr, offset);
        if (peek().kind == TokenKind::Name) {
          g->name = next().text;
        } else if (peek().kind == TokenKind::Integer) {  // x.0 is x[0]
          g->kind = Expr::Kind::GetItem;
          g->args.push_back(std::move(e));
          g->args.push_back(parse_primary());
          e = std::move(g);
          continue;
        } else {
          error_here("expected an attribute name after '.'");
        }
        g->args.push_back(std::move(e));
        e = std::move(g);
      } else if (is_op("[")) {
        const size_t offset = next().offset;
        e = parse_subscript(std::move(e), offset);
      } else if (is_op("(")) {
        e = parse_call(std::move(e));
      } else {
        return e;
      }
    }
  }

  ExprPtr parse_subscript(ExprPtr target, size_t offset) {
    ExprPtr parts[3];
    int part = 0;
    bool slice = false;
    while (!is_op("]")) {
      if (is_op(":")) {
        next();
        slice = true;
        if (++part > 2) error_here("a slice has at most three parts");
        continue;
      }
      if (parts[part]) error_here("expected ':' or ']'");
      parts[part] = parse_expression(true);
    }
    next();
    if (!slice) {
      if (!parts[0]) error_at(offset, "empty subscript");
      auto g = node(Expr::Kind::GetItem, offset);
      g->args.push_back(std::move(target));
      g->args.push_back(std::move(parts[0]));
      return g;
    }
    auto s = node(Expr::Kind::Slice, offset);
    s->args.push_back(std::move(target));
    for (auto& p : parts) s->args.push_back(std::move(p));
    return s;
  }

  // Arguments in parentheses: positional, name=value, *args, **kwargs.
  void parse_args(Expr& call) {
    expect_op("(");
    while (!is_op(")")) {
      if (is_op("*")) {
        next();
        call.star = parse_expression(true);
      } else if (is_op("**")) {
        next();
        call.star_star = parse_expression(true);
      } else if (peek().kind == TokenKind::Name && is_op("=", 1)) {
        std::string name = next().text;
        next();
        call.kwargs.emplace_back(std::move(name), parse_expression(true));
      } else {
        if (!call.kwargs.empty()) error_here("a positional argument after a keyword argument");
        call.args.push_back(parse_expression(true));
      }
      if (!is_op(",")) break;
      next();
    }
    expect_op(")");
  }

  ExprPtr parse_call(ExprPtr callee) {
    auto c = node(Expr::Kind::Call, callee->offset);
    c->args.push_back(std::move(callee));
    parse_args(*c);
    return c;
  }

  ExprPtr parse_filter_expr(ExprPtr e) {
    while (true) {
      if (is_op("|")) {
        e = parse_filters(std::move(e));
      } else if (is_name("is")) {
        e = parse_test(std::move(e));
      } else if (is_op("(")) {
        e = parse_call(std::move(e));
      } else {
        return e;
      }
    }
  }

  // `| name(args)` repeated; `value` may be null (a {% filter %} or {% set x | f %} block's body).
  ExprPtr parse_filters(ExprPtr value) { return parse_filter_chain(std::move(value), false); }

  ExprPtr parse_filter_chain(ExprPtr value, bool first_without_bar) {
    bool first = true;
    while ((first && first_without_bar) || is_op("|")) {
      if (!(first && first_without_bar)) next();
      first = false;
      const Token& t = peek();
      auto f = node(Expr::Kind::Filter, t.offset);
      f->name = expect_identifier("a filter name");
      f->args.push_back(std::move(value));
      if (is_op("(")) parse_args(*f);
      if (f->star || f->star_star) error_at(f->offset, "*args and **kwargs are not supported in filter arguments");
      value = std::move(f);
    }
    return value;
  }

  ExprPtr parse_test(ExprPtr value) {
    const size_t offset = next().offset;  // 'is'
    auto t = node(Expr::Kind::Test, offset);
    if (is_name("not")) {
      next();
      t->negated = true;
    }
    t->name = expect_identifier("a test name after 'is'");
    t->args.push_back(std::move(value));
    if (is_op("(")) {
      parse_args(*t);
      if (t->star || t->star_star) error_at(t->offset, "*args and **kwargs are not supported in test arguments");
    } else {
      const Token& n = peek();
      const bool starts_primary = n.kind == TokenKind::Name || n.kind == TokenKind::String ||
                                  n.kind == TokenKind::Integer || n.kind == TokenKind::Float ||
                                  (n.kind == TokenKind::Operator && (n.text == "[" || n.text == "{"));
      if (starts_primary && !is_name("else") && !is_name("or") && !is_name("and"))
        t->args.push_back(parse_postfix(parse_primary()));
    }
    return t;
  }

  std::string_view src_;
  std::vector<Token> tokens_;
  size_t pos_ = 0;
  int depth_ = 0;
  int loop_depth_ = 0;
};

}  // namespace

Body parse_template(std::string_view source) { return Parser(source, tokenize(source)).parse_all(); }

}  // namespace mambacpp::chat
