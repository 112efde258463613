// Jinja's tests (x is name(args)): types, comparisons, membership, divisibility, case.
#include "chat/builtins_internal.h"
#include "chat/interpreter.h"

namespace mambacpp::chat {

using namespace builtins;

namespace {

const char* const kTests[] = {"boolean", "callable", "defined", "divisibleby", "eq", "equalto", "escaped", "even",
                              "false", "filter", "float", "ge", "gt", "greaterthan", "in", "integer", "iterable", "le",
                              "lessthan", "lower", "lt", "mapping", "ne", "none", "number", "odd", "sameas",
                              "sequence", "string", "test", "true", "undefined", "upper", "==", "!=", "<", "<=", ">",
                              ">="};

}  // namespace

bool builtins::is_test_name(const std::string& name) {
  for (const char* n : kTests)
    if (name == n) return true;
  return false;
}

bool apply_test(Interpreter& in, const std::string& name, const Value& v, CallArgs& a) {
  using K = Value::Kind;
  const auto other = [&]() -> const Value& {
    if (a.positional.empty()) fail("test '", name, "' needs an argument");
    return a.positional[0];
  };
  if (name == "defined") return !v.is_undefined();
  if (name == "undefined") return v.is_undefined();
  if (name == "none") return v.is_none();
  if (name == "string") return v.is_string();
  if (name == "mapping") return v.is_dict() && !v.dict->namespace_object;
  if (name == "iterable") return v.is_string() || v.is_list() || (v.is_dict() && !v.dict->namespace_object) || v.is_undefined();
  if (name == "sequence") return v.is_string() || v.is_list() || (v.is_dict() && !v.dict->namespace_object);
  if (name == "number") return v.is_number() || v.kind == K::Bool;
  if (name == "integer") return v.kind == K::Int;
  if (name == "float") return v.kind == K::Float;
  if (name == "boolean") return v.kind == K::Bool;
  if (name == "true") return v.kind == K::Bool && v.b;
  if (name == "false") return v.kind == K::Bool && !v.b;
  if (name == "callable") return v.is_callable();
  if (name == "escaped") return false;
  if (name == "eq" || name == "equalto" || name == "==") return equal(v, other());
  if (name == "ne" || name == "!=") return !equal(v, other());
  if (name == "sameas") {
    const Value& o = other();
    if (v.kind != o.kind) return false;
    if (v.is_list()) return v.list == o.list;
    if (v.is_dict()) return v.dict == o.dict;
    if (v.is_callable()) return v.callable == o.callable;
    return equal(v, o);
  }
  if (name == "lt" || name == "lessthan" || name == "<") return order(v, other(), true) < 0;
  if (name == "le" || name == "<=") return order(v, other(), true) <= 0;
  if (name == "gt" || name == "greaterthan" || name == ">") return order(v, other(), true) > 0;
  if (name == "ge" || name == ">=") return order(v, other(), true) >= 0;
  if (name == "in") {
    const Value& c = other();
    if (c.is_string()) return v.is_string() && c.s.find(v.s) != std::string::npos;
    if (c.is_dict()) return v.is_string() && c.dict->find(v.s) != nullptr;
    for (const Value& x : iterate(in, c))
      if (equal(v, x)) return true;
    return false;
  }
  if (name == "odd" || name == "even" || name == "divisibleby") {
    if (v.kind != K::Int && v.kind != K::Bool) fail("test '", name, "' expects an integer, found ", v.type_name());
    const int64_t x = v.kind == K::Bool ? v.b : v.i;
    if (name == "odd") return x % 2 != 0;
    if (name == "even") return x % 2 == 0;
    const int64_t d = need_int(&other(), "divisibleby");
    if (d == 0) fail("divisibleby: division by zero");
    if (d == -1) return true;
    return x % d == 0;
  }
  if (name == "lower" || name == "upper") {
    if (!v.is_string()) return false;
    CallArgs none;
    return in.call(string_method(v, name == "lower" ? "islower" : "isupper"), none).truthy();
  }
  if (name == "filter") return other().is_string() && is_filter_name(other().s);
  if (name == "test") return other().is_string() && is_test_name(other().s);
  fail("unknown test '", name, "'");
}

}  // namespace mambacpp::chat
