#include "chat/interpreter.h"

#include <cmath>

#include "chat/builtins.h"
#include "chat/lexer.h"
#include "mambacpp/error.h"

namespace mambacpp::chat {

const Value* Interpreter::Scope::find(const std::string& name) const {
  for (const Scope* s = this; s; s = s->parent.get())
    for (const auto& [k, v] : s->vars)
      if (k == name) return &v;
  return nullptr;
}

void Interpreter::Scope::set(const std::string& name, Value v) {
  for (auto& [k, old] : vars)
    if (k == name) {
      old = std::move(v);
      return;
    }
  vars.emplace_back(name, std::move(v));
}

Interpreter::~Interpreter() {
  // Values may be released in any order: move them out first so that no destructor runs on a half-cleared vector.
  for (auto& scope : closures_) {
    auto vars = std::move(scope->vars);
    scope->vars.clear();
  }
  for (auto& ns : namespaces_) {
    auto items = std::move(ns->items);
    ns->items.clear();
  }
}

void Interpreter::error_at(size_t offset, const std::string& what) const {
  throw TemplateError("chat template " + source_position(source_, offset) + ": " + what);
}

void Interpreter::count_work(uint64_t units) {
  work_ += units;
  if (work_ > limits_.max_work)
    fail("the template did more than ", limits_.max_work, " loop iterations and filter steps (the render's limit)");
}

void Interpreter::check_size(size_t size) const {
  if (size > limits_.max_output_bytes)
    fail("the template built a value of ", size, " bytes or items, more than the limit of ", limits_.max_output_bytes);
}

void Interpreter::append(std::string& out, const std::string& text) const {
  check_size(out.size() + text.size());
  out += text;
}

Value Interpreter::lookup(const std::string& name) const {
  if (const Value* v = scope_->find(name)) return *v;
  return Value::undefined("'" + name + "' is undefined");
}

std::string Interpreter::render(const Body& body, const Value& globals) {
  scope_ = std::make_shared<Scope>();
  scope_->vars = globals.dict->items;  // the caller's variables are the outermost scope
  auto top = std::make_shared<Scope>();
  top->parent = scope_;
  scope_ = top;
  std::string out;
  exec_body(body, out);
  return out;
}

Interpreter::Flow Interpreter::exec_body(const Body& body, std::string& out) {
  for (const StmtPtr& s : body) {
    const Flow f = exec(*s, out);
    if (f != Flow::Normal) return f;
  }
  return Flow::Normal;
}

Interpreter::Flow Interpreter::exec(const Stmt& s, std::string& out) {
  switch (s.kind) {
    case Stmt::Kind::Text:
      append(out, s.text);
      return Flow::Normal;
    case Stmt::Kind::Print: {
      const Value v = eval(*s.expr);
      try {
        append(out, to_str(v));
      } catch (const TemplateError&) {
        throw;
      } catch (const Error& e) {
        error_at(s.offset, e.what());
      }
      return Flow::Normal;
    }
    case Stmt::Kind::If:
      for (const auto& [cond, body] : s.branches)
        if (!cond || eval(*cond).truthy()) return exec_body(body, out);
      return Flow::Normal;
    case Stmt::Kind::For:
      exec_for(s, out);
      return Flow::Normal;
    case Stmt::Kind::Set:
      exec_set(s);
      return Flow::Normal;
    case Stmt::Kind::SetBlock: {
      std::string captured;
      exec_body(s.body, captured);
      Value v = Value::string(std::move(captured));
      if (s.filter) {
        // The filter chain was parsed over a null value: apply it from the innermost filter out.
        std::vector<const Expr*> chain;
        for (const Expr* f = s.filter.get(); f; f = f->args[0].get()) chain.push_back(f);
        for (auto it = chain.rbegin(); it != chain.rend(); ++it) {
          CallArgs args = eval_args(**it, 1);
          try {
            v = apply_filter(*this, (*it)->name, v, args);
          } catch (const TemplateError&) {
            throw;
          } catch (const Error& e) {
            error_at((*it)->offset, e.what());
          }
        }
      }
      scope_->set(s.targets[0], std::move(v));
      return Flow::Normal;
    }
    case Stmt::Kind::FilterBlock: {
      std::string captured;
      exec_body(s.body, captured);
      Value v = Value::string(std::move(captured));
      std::vector<const Expr*> chain;
      for (const Expr* f = s.filter.get(); f; f = f->args[0].get()) chain.push_back(f);
      for (auto it = chain.rbegin(); it != chain.rend(); ++it) {
        CallArgs args = eval_args(**it, 1);
        try {
          v = apply_filter(*this, (*it)->name, v, args);
        } catch (const TemplateError&) {
          throw;
        } catch (const Error& e) {
          error_at((*it)->offset, e.what());
        }
      }
      append(out, to_str(v));
      return Flow::Normal;
    }
    case Stmt::Kind::Macro:
      scope_->set(s.name, make_macro(s, scope_, Value::undefined("'caller' is undefined")));
      return Flow::Normal;
    case Stmt::Kind::CallBlock: {
      // caller() renders the block's body; the call itself is the expression with `caller` passed along.
      Value caller = make_macro(s, scope_, Value::undefined("'caller' is undefined"));
      const Expr& call = *s.expr;
      Value callee = eval(*call.args[0]);
      CallArgs args = eval_args(call, 1);
      args.keyword.emplace_back("caller", caller);
      try {
        append(out, to_str(this->call(callee, args)));
      } catch (const TemplateError&) {
        throw;
      } catch (const Error& e) {
        error_at(s.offset, e.what());
      }
      return Flow::Normal;
    }
    case Stmt::Kind::Break:
      return Flow::Break;
    case Stmt::Kind::Continue:
      return Flow::Continue;
    case Stmt::Kind::Scope:
      return exec_body(s.body, out);
  }
  return Flow::Normal;
}

void Interpreter::exec_set(const Stmt& s) {
  Value v = eval(*s.expr);
  if (!s.attribute.empty()) {
    const Value target = lookup(s.targets[0]);
    if (!target.is_dict() || !target.dict->namespace_object)
      error_at(s.offset, "cannot assign attribute '" + s.attribute + "' on '" + s.targets[0] +
                             "', which is not a namespace() object");
    target.dict->set(s.attribute, std::move(v));
    return;
  }
  bind_targets(s, *scope_, v, "names");
}

void Interpreter::bind_targets(const Stmt& s, Scope& scope, const Value& v, const char* what) {
  if (s.targets.size() == 1) {
    scope.set(s.targets[0], v);
    return;
  }
  std::vector<Value> items;
  try {
    items = iterate(*this, v);
  } catch (const Error& e) {
    error_at(s.offset, e.what());
  }
  if (items.size() != s.targets.size())
    error_at(s.offset, "cannot unpack " + std::to_string(items.size()) + " values into " +
                           std::to_string(s.targets.size()) + " " + what);
  for (size_t k = 0; k < items.size(); ++k) scope.set(s.targets[k], std::move(items[k]));
}

void Interpreter::exec_for(const Stmt& s, std::string& out) {
  const Value iterable = eval(*s.expr);
  std::vector<Value> items;
  try {
    items = iterate(*this, iterable);
  } catch (const TemplateError&) {
    throw;
  } catch (const Error& e) {
    error_at(s.expr->offset, e.what());
  }
  const auto bind = [&](Scope& scope, const Value& item) { bind_targets(s, scope, item, "loop variables"); };
  const std::shared_ptr<Scope> outer = scope_;
  // The loop filter (`for x in xs if cond`) runs first: loop.index, length and last count the kept items only.
  if (s.filter) {
    std::vector<Value> kept;
    for (const Value& item : items) {
      try {
        count_work();
      } catch (const Error& e) {
        error_at(s.offset, e.what());
      }
      auto probe = std::make_shared<Scope>();
      probe->parent = outer;
      bind(*probe, item);
      scope_ = probe;
      const bool keep = eval(*s.filter).truthy();
      scope_ = outer;
      if (keep) kept.push_back(item);
    }
    items = std::move(kept);
  }
  const int64_t n = static_cast<int64_t>(items.size());
  for (int64_t k = 0; k < n; ++k) {
    try {
      count_work();
    } catch (const Error& e) {
      scope_ = outer;
      error_at(s.offset, e.what());
    }
    auto iteration = std::make_shared<Scope>();
    iteration->parent = outer;
    Value loop = Value::new_dict();
    DictData& d = *loop.dict;
    d.items.reserve(12);
    d.items.emplace_back("index", Value::integer(k + 1));
    d.items.emplace_back("index0", Value::integer(k));
    d.items.emplace_back("revindex", Value::integer(n - k));
    d.items.emplace_back("revindex0", Value::integer(n - k - 1));
    d.items.emplace_back("first", Value::boolean(k == 0));
    d.items.emplace_back("last", Value::boolean(k == n - 1));
    d.items.emplace_back("length", Value::integer(n));
    d.items.emplace_back("depth", Value::integer(1));
    d.items.emplace_back("depth0", Value::integer(0));
    d.items.emplace_back("previtem", k > 0 ? items[static_cast<size_t>(k - 1)]
                                           : Value::undefined("there is no previous item"));
    d.items.emplace_back("nextitem", k + 1 < n ? items[static_cast<size_t>(k + 1)]
                                               : Value::undefined("there is no next item"));
    d.items.emplace_back("cycle", Value::function("loop.cycle", [k](Interpreter&, CallArgs& a) -> Value {
                           if (a.positional.empty()) fail("loop.cycle() needs at least one value");
                           return a.positional[static_cast<size_t>(k) % a.positional.size()];
                         }));
    iteration->set("loop", std::move(loop));
    bind(*iteration, items[static_cast<size_t>(k)]);
    scope_ = iteration;
    Flow f;
    try {
      f = exec_body(s.body, out);
    } catch (...) {
      scope_ = outer;
      throw;
    }
    scope_ = outer;
    if (f == Flow::Break) break;
  }
  if (n == 0 && !s.else_body.empty()) exec_body(s.else_body, out);
}

Value Interpreter::make_macro(const Stmt& s, std::shared_ptr<Scope> closure, Value caller) {
  const Stmt* def = &s;
  closures_.push_back(closure);
  return Value::function(s.kind == Stmt::Kind::Macro ? s.name : "caller",
                         [this, def, closure, caller](Interpreter&, CallArgs& args) -> Value {
    if (depth_ >= limits_.max_call_depth)
      fail("macro calls nested deeper than ", limits_.max_call_depth, " (the render's limit)");
    count_work();
    auto scope = std::make_shared<Scope>();
    scope->parent = closure;
    const std::shared_ptr<Scope> saved = scope_;
    scope_ = scope;
    struct Restore {
      Interpreter* in;
      std::shared_ptr<Scope> saved;
      ~Restore() {
        in->scope_ = saved;
        --in->depth_;
      }
    } restore{this, saved};
    ++depth_;
    std::vector<Value> extra;
    for (size_t k = 0; k < args.positional.size(); ++k) {
      if (k < def->params.size())
        scope->set(def->params[k].first, args.positional[k]);
      else
        extra.push_back(args.positional[k]);
    }
    Value kwargs = Value::new_dict();
    Value call_caller = caller;
    for (auto& [name, v] : args.keyword) {
      bool is_param = false;
      for (size_t k = 0; k < def->params.size(); ++k)
        if (def->params[k].first == name) {
          if (k < args.positional.size())
            fail("macro '", def->name, "' got multiple values for argument '", name, "'");
          is_param = true;
        }
      if (is_param)
        scope->set(name, v);
      else if (name == "caller")
        call_caller = v;
      else
        kwargs.dict->set(name, v);
    }
    for (size_t k = args.positional.size(); k < def->params.size(); ++k) {
      const auto& [name, def_expr] = def->params[k];
      bool given = false;
      for (const auto& kw : args.keyword) given = given || kw.first == name;
      if (given) continue;
      scope->set(name, def_expr ? eval(*def_expr) : Value::undefined("parameter '" + name + "' was not given"));
    }
    scope->set("varargs", Value::new_list(std::move(extra), /*tuple=*/true));
    scope->set("kwargs", std::move(kwargs));
    scope->set("caller", call_caller);
    std::string out;
    exec_body(def->body, out);
    return Value::string(std::move(out));
  });
}

CallArgs Interpreter::eval_args(const Expr& e, size_t first) {
  CallArgs args;
  for (size_t k = first; k < e.args.size(); ++k) args.positional.push_back(eval(*e.args[k]));
  for (const auto& [name, v] : e.kwargs) args.keyword.emplace_back(name, eval(*v));
  if (e.star) {
    const Value star = eval(*e.star);
    try {
      for (Value& v : iterate(*this, star)) args.positional.push_back(std::move(v));
    } catch (const TemplateError&) {
      throw;
    } catch (const Error& err) {
      error_at(e.star->offset, err.what());
    }
  }
  if (e.star_star) {
    const Value kw = eval(*e.star_star);
    if (!kw.is_dict()) error_at(e.star_star->offset, "** needs a mapping, found " + kw.type_name());
    for (const auto& [k, v] : kw.dict->items) args.keyword.emplace_back(k, v);
  }
  return args;
}

Value Interpreter::call(const Value& f, CallArgs& args) {
  if (f.is_undefined()) fail(f.s.empty() ? std::string("an undefined value is not callable") : f.s);
  if (!f.is_callable()) fail("'", f.type_name(), "' is not callable");
  return f.callable->fn(*this, args);
}

Value Interpreter::eval(const Expr& e) {
  try {
    return eval_inner(e);
  } catch (const TemplateError&) {
    throw;
  } catch (const Error& err) {
    error_at(e.offset, err.what());
  }
}

Value Interpreter::eval_inner(const Expr& e) {
  using K = Expr::Kind;
  switch (e.kind) {
    case K::Literal:
      return e.literal;
    case K::Name:
      return lookup(e.name);
    case K::List:
    case K::Tuple: {
      std::vector<Value> items;
      items.reserve(e.args.size());
      for (const ExprPtr& a : e.args) items.push_back(eval(*a));
      return Value::new_list(std::move(items), e.kind == K::Tuple);
    }
    case K::Dict: {
      Value d = Value::new_dict();
      for (const auto& [k, v] : e.pairs) {
        const Value key = eval(*k);
        if (!key.is_string()) error_at(k->offset, "dict keys must be strings here, found " + key.type_name());
        d.dict->set(key.s, eval(*v));
      }
      return d;
    }
    case K::GetAttr:
      return get_attribute(*this, eval(*e.args[0]), e.name);
    case K::GetItem: {
      const Value obj = eval(*e.args[0]);
      return get_item(*this, obj, eval(*e.args[1]));
    }
    case K::Slice: {
      const Value obj = eval(*e.args[0]);
      const auto part = [&](size_t k) { return e.args[k] ? eval(*e.args[k]) : Value::none(); };
      const Value start = part(1), stop = part(2), step = part(3);
      return get_slice(*this, obj, start, stop, step);
    }
    case K::Call: {
      const Value f = eval(*e.args[0]);
      CallArgs args = eval_args(e, 1);
      return call(f, args);
    }
    case K::Filter: {
      const Value v = eval(*e.args[0]);
      CallArgs args = eval_args(e, 1);
      return apply_filter(*this, e.name, v, args);
    }
    case K::Test: {
      const Value v = eval(*e.args[0]);
      CallArgs args = eval_args(e, 1);
      return Value::boolean(apply_test(*this, e.name, v, args) != e.negated);
    }
    case K::Not:
      return Value::boolean(!eval(*e.args[0]).truthy());
    case K::Negate:
    case K::Plus: {
      const Value v = eval(*e.args[0]);
      if (v.kind == Value::Kind::Bool) return Value::integer(e.kind == K::Negate ? -int64_t{v.b} : v.b);
      if (v.kind == Value::Kind::Int) {
        if (e.kind == K::Plus) return v;
        if (v.i == INT64_MIN) fail("integer overflow");
        return Value::integer(-v.i);
      }
      if (v.kind == Value::Kind::Float) return Value::number(e.kind == K::Negate ? -v.f : v.f);
      if (v.is_undefined()) fail(v.s);
      fail("bad operand type for unary ", e.kind == K::Negate ? "-" : "+", ": '", v.type_name(), "'");
    }
    case K::Binary: {
      const Value a = eval(*e.args[0]);
      const Value b = eval(*e.args[1]);
      return eval_binary(e, a, b);
    }
    case K::And: {
      Value a = eval(*e.args[0]);
      return a.truthy() ? eval(*e.args[1]) : a;
    }
    case K::Or: {
      Value a = eval(*e.args[0]);
      return a.truthy() ? a : eval(*e.args[1]);
    }
    case K::Compare: {
      Value left = eval(*e.args[0]);
      for (size_t k = 0; k < e.ops.size(); ++k) {
        Value right = eval(*e.args[k + 1]);
        if (!compare(e.ops[k], left, right)) return Value::boolean(false);
        left = std::move(right);
      }
      return Value::boolean(true);
    }
    case K::Conditional:
      if (eval(*e.args[0]).truthy()) return eval(*e.args[1]);
      return e.args[2] ? eval(*e.args[2]) : Value::undefined("the conditional expression had no else branch");
  }
  return Value::undefined();
}

namespace {

[[noreturn]] void unsupported(const std::string& op, const Value& a, const Value& b) {
  if (a.is_undefined()) fail(a.s);
  if (b.is_undefined()) fail(b.s);
  fail("unsupported operand type(s) for ", op, ": '", a.type_name(), "' and '", b.type_name(), "'");
}

bool is_int_like(const Value& v) { return v.kind == Value::Kind::Int || v.kind == Value::Kind::Bool; }
int64_t int_of(const Value& v) { return v.kind == Value::Kind::Bool ? v.b : v.i; }
bool is_numeric(const Value& v) { return v.is_number() || v.kind == Value::Kind::Bool; }
double double_of(const Value& v) { return v.kind == Value::Kind::Float ? v.f : static_cast<double>(int_of(v)); }

// Python's printf-style `format % args` for the conversions templates use (%s %r %d %i %f %%, with width and
// precision).
std::string percent_format(const std::string& fmt, const Value& args_value) {
  std::vector<Value> args;
  if (args_value.is_list() && args_value.list->tuple)
    args = args_value.list->items;
  else
    args.push_back(args_value);
  size_t next = 0;
  std::string out;
  for (size_t k = 0; k < fmt.size(); ++k) {
    if (fmt[k] != '%') {
      out += fmt[k];
      continue;
    }
    if (++k >= fmt.size()) fail("incomplete format");
    if (fmt[k] == '%') {
      out += '%';
      continue;
    }
    std::string spec = "%";
    while (k < fmt.size() && std::string_view("-+ #0123456789.").find(fmt[k]) != std::string_view::npos)
      spec += fmt[k++];
    if (k >= fmt.size()) fail("incomplete format");
    const char conv = fmt[k];
    if (next >= args.size()) fail("not enough arguments for format string");
    const Value& a = args[next++];
    std::string piece;
    if (conv == 's' || conv == 'r') {
      piece = conv == 's' ? to_str(a) : to_repr(a);
      if (spec.size() > 1) {
        char buf[64];
        const std::string f = spec + "s";
        if (piece.size() < 32 && spec.size() < 8) {
          std::snprintf(buf, sizeof buf, f.c_str(), piece.c_str());
          piece = buf;
        }
      }
    } else if (conv == 'd' || conv == 'i' || conv == 'f' || conv == 'F' || conv == 'e' || conv == 'g') {
      if (!is_numeric(a)) fail("%", conv, " format: a real number is required, not ", a.type_name());
      if (spec.size() > 12) fail("format specification too long");
      char buf[400];
      if (conv == 'd' || conv == 'i') {
        const int64_t v = a.kind == Value::Kind::Float ? static_cast<int64_t>(a.f) : int_of(a);
        std::snprintf(buf, sizeof buf, (spec + "lld").c_str(), static_cast<long long>(v));
      } else {
        std::snprintf(buf, sizeof buf, (spec + conv).c_str(), double_of(a));
      }
      piece = buf;
    } else {
      fail("unsupported format character '", std::string(1, conv), "'");
    }
    out += piece;
  }
  if (next < args.size()) fail("not all arguments converted during string formatting");
  return out;
}

}  // namespace

Value Interpreter::eval_binary(const Expr& e, const Value& a, const Value& b) {
  const std::string& op = e.name;
  if (op == "~") {
    std::string s = to_str(a);
    std::string t = to_str(b);
    check_size(s.size() + t.size());
    return Value::string(s + t);
  }
  if (op == "+") {
    if (is_int_like(a) && is_int_like(b)) {
      int64_t r;
      if (__builtin_add_overflow(int_of(a), int_of(b), &r)) fail("integer overflow in +");
      return Value::integer(r);
    }
    if (is_numeric(a) && is_numeric(b)) return Value::number(double_of(a) + double_of(b));
    if (a.is_string() && b.is_string()) {
      check_size(a.s.size() + b.s.size());
      return Value::string(a.s + b.s);
    }
    if (a.is_list() && b.is_list()) {
      check_size(a.list->items.size() + b.list->items.size());
      std::vector<Value> items = a.list->items;
      items.insert(items.end(), b.list->items.begin(), b.list->items.end());
      return Value::new_list(std::move(items), a.list->tuple && b.list->tuple);
    }
    unsupported(op, a, b);
  }
  if (op == "-") {
    if (is_int_like(a) && is_int_like(b)) {
      int64_t r;
      if (__builtin_sub_overflow(int_of(a), int_of(b), &r)) fail("integer overflow in -");
      return Value::integer(r);
    }
    if (is_numeric(a) && is_numeric(b)) return Value::number(double_of(a) - double_of(b));
    unsupported(op, a, b);
  }
  if (op == "*") {
    if (is_int_like(a) && is_int_like(b)) {
      int64_t r;
      if (__builtin_mul_overflow(int_of(a), int_of(b), &r)) fail("integer overflow in *");
      return Value::integer(r);
    }
    if (is_numeric(a) && is_numeric(b)) return Value::number(double_of(a) * double_of(b));
    const Value* seq = a.is_string() || a.is_list() ? &a : b.is_string() || b.is_list() ? &b : nullptr;
    const Value* count = seq == &a ? &b : &a;
    if (seq && is_int_like(*count)) {
      const int64_t n = std::max<int64_t>(0, int_of(*count));
      const size_t unit = seq->is_string() ? seq->s.size() : seq->list->items.size();
      if (unit != 0 && static_cast<uint64_t>(n) > limits_.max_output_bytes / unit) check_size(SIZE_MAX);
      if (seq->is_string()) {
        std::string s;
        s.reserve(unit * static_cast<size_t>(n));
        for (int64_t k = 0; k < n; ++k) s += seq->s;
        return Value::string(std::move(s));
      }
      std::vector<Value> items;
      for (int64_t k = 0; k < n; ++k) items.insert(items.end(), seq->list->items.begin(), seq->list->items.end());
      return Value::new_list(std::move(items), seq->list->tuple);
    }
    unsupported(op, a, b);
  }
  if (op == "/") {
    if (!is_numeric(a) || !is_numeric(b)) unsupported(op, a, b);
    if (double_of(b) == 0) fail("division by zero");
    return Value::number(double_of(a) / double_of(b));
  }
  if (op == "//" || op == "%") {
    if (op == "%" && a.is_string()) {
      const std::string s = percent_format(a.s, b);
      check_size(s.size());
      return Value::string(s);
    }
    if (!is_numeric(a) || !is_numeric(b)) unsupported(op, a, b);
    if (is_int_like(a) && is_int_like(b)) {
      const int64_t x = int_of(a), y = int_of(b);
      if (y == 0) fail("integer division or modulo by zero");
      if (x == INT64_MIN && y == -1) fail("integer overflow in ", op);
      int64_t q = x / y, r = x % y;
      if (r != 0 && ((r < 0) != (y < 0))) {  // Python floors toward negative infinity
        --q;
        r += y;
      }
      return Value::integer(op == "//" ? q : r);
    }
    const double x = double_of(a), y = double_of(b);
    if (y == 0) fail("float division by zero");
    if (op == "//") return Value::number(std::floor(x / y));
    double r = std::fmod(x, y);
    if (r != 0 && ((r < 0) != (y < 0))) r += y;
    return Value::number(r);
  }
  if (op == "**") {
    if (!is_numeric(a) || !is_numeric(b)) unsupported(op, a, b);
    if (is_int_like(a) && is_int_like(b) && int_of(b) >= 0) {
      int64_t base = int_of(a), exp = int_of(b), r = 1;
      while (exp > 0) {
        if ((exp & 1) && __builtin_mul_overflow(r, base, &r)) fail("integer overflow in **");
        exp >>= 1;
        if (exp > 0 && __builtin_mul_overflow(base, base, &base)) fail("integer overflow in **");
      }
      return Value::integer(r);
    }
    return Value::number(std::pow(double_of(a), double_of(b)));
  }
  fail("unknown operator ", op);
}

bool Interpreter::compare(const std::string& op, const Value& a, const Value& b) {
  if (op == "==") return equal(a, b);
  if (op == "!=") return !equal(a, b);
  if (op == "in" || op == "not in") {
    bool found = false;
    if (b.is_string()) {
      if (!a.is_string()) fail("'in <string>' requires string as left operand, not ", a.type_name());
      found = b.s.find(a.s) != std::string::npos;
    } else if (b.is_list()) {
      for (const Value& v : b.list->items) found = found || equal(a, v);
    } else if (b.is_dict()) {
      found = a.is_string() && b.dict->find(a.s) != nullptr;
    } else if (b.is_undefined()) {
      found = false;
    } else {
      fail("argument of type '", b.type_name(), "' is not iterable");
    }
    return op == "in" ? found : !found;
  }
  // Ordering: numbers, strings (UTF-8 byte order is code point order), lists lexicographically.
  int c;
  if (is_numeric(a) && is_numeric(b)) {
    if (is_int_like(a) && is_int_like(b))
      c = int_of(a) < int_of(b) ? -1 : int_of(a) > int_of(b) ? 1 : 0;
    else
      c = double_of(a) < double_of(b) ? -1 : double_of(a) > double_of(b) ? 1 : 0;
  } else if (a.is_string() && b.is_string()) {
    c = a.s.compare(b.s);
    c = c < 0 ? -1 : c > 0 ? 1 : 0;
  } else if (a.is_list() && b.is_list()) {
    const auto& x = a.list->items;
    const auto& y = b.list->items;
    size_t k = 0;
    while (k < x.size() && k < y.size() && equal(x[k], y[k])) ++k;
    if (k < x.size() && k < y.size()) return compare(op, x[k], y[k]);
    c = x.size() < y.size() ? -1 : x.size() > y.size() ? 1 : 0;
  } else {
    if (a.is_undefined()) fail(a.s);
    if (b.is_undefined()) fail(b.s);
    fail("'", op, "' not supported between instances of '", a.type_name(), "' and '", b.type_name(), "'");
  }
  if (op == "<") return c < 0;
  if (op == "<=") return c <= 0;
  if (op == ">") return c > 0;
  return c >= 0;
}

}  // namespace mambacpp::chat
