// The values a chat template computes with: Python's (None, bool, int, float, str, list, tuple, dict) plus Jinja's
// undefined and callables (macros, bound methods, globals). Lists and dicts are shared by reference, as in Python,
// so a namespace() changed inside a macro is changed for its caller. Dicts keep insertion order (tojson keeps it).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

namespace mambacpp::chat {

struct Value;
class Interpreter;

struct ListData {
  std::vector<Value> items;
  bool tuple = false;  // printed as (a, b) by str(); otherwise the same
};

struct DictData {
  std::vector<std::pair<std::string, Value>> items;
  bool namespace_object = false;  // namespace(): attributes may be assigned with {% set ns.x = ... %}

  const Value* find(const std::string& key) const;
  void set(const std::string& key, Value value);
};

// Positional and keyword arguments of one call.
struct CallArgs {
  std::vector<Value> positional;
  std::vector<std::pair<std::string, Value>> keyword;
};

struct CallableData {
  std::string name;
  std::function<Value(Interpreter&, CallArgs&)> fn;
};

struct Value {
  enum class Kind { Undefined, None, Bool, Int, Float, String, List, Dict, Callable };
  Kind kind = Kind::Undefined;
  bool b = false;
  int64_t i = 0;
  double f = 0;
  std::string s;  // String; for Undefined, the name that was looked up (for messages)
  std::shared_ptr<ListData> list;
  std::shared_ptr<DictData> dict;
  std::shared_ptr<CallableData> callable;

  static Value undefined(std::string what = {});
  static Value none();
  static Value boolean(bool v);
  static Value integer(int64_t v);
  static Value number(double v);
  static Value string(std::string v);
  static Value new_list(std::vector<Value> items = {}, bool tuple = false);
  static Value new_dict();
  static Value function(std::string name, std::function<Value(Interpreter&, CallArgs&)> fn);
  static Value from_json(const nlohmann::ordered_json& j);

  bool is_undefined() const { return kind == Kind::Undefined; }
  bool is_none() const { return kind == Kind::None; }
  bool is_string() const { return kind == Kind::String; }
  bool is_number() const { return kind == Kind::Int || kind == Kind::Float; }
  bool is_list() const { return kind == Kind::List; }
  bool is_dict() const { return kind == Kind::Dict; }
  bool is_callable() const { return kind == Kind::Callable; }
  double as_double() const { return kind == Kind::Int ? static_cast<double>(i) : f; }

  // Python's bool(x) (undefined is false).
  bool truthy() const;
  // The name of the type as Jinja's messages say it ("dict object", "str object"...).
  std::string type_name() const;
};

// Python's == (1 == 1.0, deep on lists and dicts; undefined equals only undefined).
bool equal(const Value& a, const Value& b);
// Python's str(x) (what {{ x }} prints; undefined prints nothing); repr(x) quotes strings.
std::string to_str(const Value& v);
std::string to_repr(const Value& v);
// Python's repr of a float ("1.0", "0.1", "1e-05", "1e+20", "inf", "nan").
std::string float_repr(double v);
// json.dumps(x, ensure_ascii=False, indent=indent, sort_keys=False), transformers' tojson filter. `indent` < 0 is
// None (", " and ": " separators on one line). Throws Error for a value json cannot encode (undefined, callables).
std::string to_json(const Value& v, int indent);

}  // namespace mambacpp::chat
