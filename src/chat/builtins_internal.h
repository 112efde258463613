// What the builtins_*.cpp files share: reading a call's arguments, Python's str semantics on UTF-8 (case, strip,
// split, replace), the ordering sort/min/max and the comparison tests use, and the str/dict methods bound as
// callables. Private to the chat layer's built-ins; the interpreter sees builtins.h only.
#pragma once

#include <cstdint>
#include <functional>
#include <initializer_list>
#include <string>
#include <vector>

#include "chat/builtins.h"
#include "chat/value.h"
#include "mambacpp/error.h"

namespace mambacpp::chat::builtins {

// ---- Arguments -------------------------------------------------------------------------------------------------

// The argument at `index` or named `name` (nullptr when not given).
inline const Value* arg(const CallArgs& args, size_t index, const char* name) {
  if (index < args.positional.size()) return &args.positional[index];
  for (const auto& [k, v] : args.keyword)
    if (k == name) return &v;
  return nullptr;
}

inline void check_arity(const CallArgs& args, size_t max_positional, std::initializer_list<const char*> names,
                 const std::string& what) {
  if (args.positional.size() > max_positional)
    fail(what, " takes at most ", max_positional, " positional arguments, got ", args.positional.size());
  for (const auto& [k, v] : args.keyword) {
    bool known = false;
    for (const char* n : names) known = known || k == n;
    if (!known) fail(what, " got an unexpected keyword argument '", k, "'");
  }
}

inline const std::string& need_string(const Value* v, const std::string& what) {
  if (!v || !v->is_string()) fail(what, " expects a string", v ? ", found " + v->type_name() : std::string());
  return v->s;
}

inline int64_t need_int(const Value* v, const std::string& what) {
  if (v && v->kind == Value::Kind::Int) return v->i;
  if (v && v->kind == Value::Kind::Bool) return v->b;
  fail(what, " expects an integer", v ? ", found " + v->type_name() : std::string());
}

inline bool bool_arg(const Value* v, bool fallback) { return v ? v->truthy() : fallback; }

// A callable that runs `fn` on `self` (x.method as a value).
inline Value bound(const std::string& name, Value self,
            std::function<Value(Interpreter&, const Value&, CallArgs&)> fn) {
  return Value::function(name, [self = std::move(self), fn = std::move(fn)](Interpreter& in, CallArgs& a) {
    return fn(in, self, a);
  });
}

// ---- Strings (builtins_text.cpp) -------------------------------------------------------------------------------

bool is_ascii(const std::string& s);
// Code point of a piece from code_points() (an invalid byte maps to -1, which never matches a letter).
int32_t decode(const std::string& piece);
std::string upper(const std::string& s);
std::string lower(const std::string& s);
// Jinja's title filter (Python's str.title() differs: it is the str method).
std::string jinja_title(const std::string& s);
std::string capitalize(const std::string& s);
// str.strip/lstrip/rstrip: whitespace, or any of the code points in `chars`.
std::string strip(const std::string& s, const Value* chars, bool left, bool right);
// str.replace; count < 0 replaces all.
std::string replace(Interpreter& in, const std::string& s, const std::string& old, const std::string& repl,
                    int64_t count);
std::string html_escape(const std::string& s);
// The items' str() joined by `sep`.
std::string join(Interpreter& in, const std::vector<Value>& items, const std::string& sep);
// Python's str method `name` bound to `self`; undefined when str has none of that name.
Value string_method(const Value& self, const std::string& name);

// ---- Values (builtins_access.cpp) ------------------------------------------------------------------------------

// Python's ordering of numbers, strings and lists (<0, 0, >0); other pairs are an error.
int order(const Value& a, const Value& b, bool case_sensitive);
// attribute="a.b.0": each part an item lookup (integers index lists).
Value resolve_path(Interpreter& in, const Value& v, const std::string& path);
Value make_tuple(Value a, Value b);
// Python's dict method `name` bound to `self`; undefined when dict has none of that name.
Value dict_method(const Value& self, const std::string& name);

// ---- Names (for the `filter` and `test` tests) -----------------------------------------------------------------

bool is_filter_name(const std::string& name);  // builtins_filters.cpp
bool is_test_name(const std::string& name);    // builtins_tests.cpp

}  // namespace mambacpp::chat::builtins
