// How templates reach into values: len(), the iteration of `for`, x.name, x[key], x[a:b:c], and the ordering,
// attribute paths and dict methods the filters share.
#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <optional>

#include "chat/builtins_internal.h"
#include "chat/interpreter.h"

namespace mambacpp::chat {

namespace builtins {

int order(const Value& a, const Value& b, bool case_sensitive) {
  const auto num = [](const Value& v) { return v.is_number() || v.kind == Value::Kind::Bool; };
  if (num(a) && num(b)) {
    const double x = a.kind == Value::Kind::Bool ? a.b : a.as_double();
    const double y = b.kind == Value::Kind::Bool ? b.b : b.as_double();
    return x < y ? -1 : x > y ? 1 : 0;
  }
  if (a.is_string() && b.is_string()) {
    const int c = case_sensitive ? a.s.compare(b.s) : lower(a.s).compare(lower(b.s));
    return c < 0 ? -1 : c > 0 ? 1 : 0;
  }
  if (a.is_list() && b.is_list()) {
    const auto& x = a.list->items;
    const auto& y = b.list->items;
    for (size_t k = 0; k < x.size() && k < y.size(); ++k)
      if (const int c = order(x[k], y[k], case_sensitive)) return c;
    return x.size() < y.size() ? -1 : x.size() > y.size() ? 1 : 0;
  }
  fail("'<' not supported between instances of '", a.type_name(), "' and '", b.type_name(), "'");
}

Value resolve_path(Interpreter& in, const Value& v, const std::string& path) {
  Value cur = v;
  size_t start = 0;
  while (true) {
    const size_t dot = path.find('.', start);
    const std::string part = path.substr(start, dot == std::string::npos ? std::string::npos : dot - start);
    const bool digits = !part.empty() && std::all_of(part.begin(), part.end(), [](char c) { return c >= '0' && c <= '9'; });
    if (digits && part.size() < 18)
      cur = get_item(in, cur, Value::integer(std::strtoll(part.c_str(), nullptr, 10)));
    else
      cur = get_item(in, cur, Value::string(part));
    if (dot == std::string::npos) return cur;
    start = dot + 1;
  }
}

Value make_tuple(Value a, Value b) { return Value::new_list({std::move(a), std::move(b)}, true); }

Value dict_method(const Value& self, const std::string& name) {
  using A = CallArgs;
  if (name == "items")
    return bound(name, self, [](Interpreter& in, const Value& d, A&) {
      std::vector<Value> out;
      in.count_work(d.dict->items.size());
      for (const auto& [k, v] : d.dict->items) out.push_back(make_tuple(Value::string(k), v));
      return Value::new_list(std::move(out));
    });
  if (name == "keys")
    return bound(name, self, [](Interpreter&, const Value& d, A&) {
      std::vector<Value> out;
      for (const auto& kv : d.dict->items) out.push_back(Value::string(kv.first));
      return Value::new_list(std::move(out));
    });
  if (name == "values")
    return bound(name, self, [](Interpreter&, const Value& d, A&) {
      std::vector<Value> out;
      for (const auto& kv : d.dict->items) out.push_back(kv.second);
      return Value::new_list(std::move(out));
    });
  if (name == "get")
    return bound(name, self, [](Interpreter&, const Value& d, A& a) {
      const Value* key = arg(a, 0, "key");
      if (!key) fail("get expected at least 1 argument, got 0");
      const Value* fallback = arg(a, 1, "default");
      if (key->is_string())
        if (const Value* v = d.dict->find(key->s)) return *v;
      return fallback ? *fallback : Value::none();
    });
  return Value::undefined();
}

}  // namespace builtins

using namespace builtins;

int64_t length(const Value& v) {
  switch (v.kind) {
    case Value::Kind::String: return is_ascii(v.s) ? static_cast<int64_t>(v.s.size()) : static_cast<int64_t>(code_points(v.s).size());
    case Value::Kind::List: return static_cast<int64_t>(v.list->items.size());
    case Value::Kind::Dict: return static_cast<int64_t>(v.dict->items.size());
    case Value::Kind::Undefined: return 0;
    default: fail("object of type '", v.type_name(), "' has no len()");
  }
}

std::vector<Value> iterate(Interpreter& in, const Value& v) {
  switch (v.kind) {
    case Value::Kind::List: return v.list->items;
    case Value::Kind::Dict: {
      if (v.dict->namespace_object) break;
      std::vector<Value> keys;
      for (const auto& kv : v.dict->items) keys.push_back(Value::string(kv.first));
      return keys;
    }
    case Value::Kind::String: {
      std::vector<Value> chars;
      for (std::string& p : code_points(v.s)) chars.push_back(Value::string(std::move(p)));
      return chars;
    }
    case Value::Kind::Undefined: return {};
    default: break;
  }
  fail("'", v.type_name(), "' is not iterable");
}

Value get_attribute(Interpreter& in, const Value& object, const std::string& name) {
  switch (object.kind) {
    case Value::Kind::Undefined:
      fail(object.s.empty() ? "an undefined value has no attribute '" + name + "'" : object.s);
    case Value::Kind::String: {
      Value m = string_method(object, name);
      return m;
    }
    case Value::Kind::Dict: {
      if (!object.dict->namespace_object) {
        Value m = dict_method(object, name);
        if (!m.is_undefined()) return m;
      }
      if (const Value* v = object.dict->find(name)) return *v;
      return Value::undefined("'" + object.type_name() + "' has no attribute '" + name + "'");
    }
    default:
      return Value::undefined("'" + object.type_name() + "' has no attribute '" + name + "'");
  }
}

Value get_item(Interpreter& in, const Value& object, const Value& key) {
  if (object.is_undefined())
    fail(object.s.empty() ? std::string("an undefined value has no items") : object.s);
  const bool int_key = key.kind == Value::Kind::Int || key.kind == Value::Kind::Bool;
  if (object.is_list() && int_key) {
    int64_t k = key.kind == Value::Kind::Bool ? key.b : key.i;
    const int64_t n = static_cast<int64_t>(object.list->items.size());
    if (k < 0) k += n;
    if (k < 0 || k >= n) return Value::undefined("'" + object.type_name() + "' has no element " + to_str(key));
    return object.list->items[static_cast<size_t>(k)];
  }
  if (object.is_string() && int_key) {
    const std::vector<std::string> cps = code_points(object.s);
    int64_t k = key.kind == Value::Kind::Bool ? key.b : key.i;
    const int64_t n = static_cast<int64_t>(cps.size());
    if (k < 0) k += n;
    if (k < 0 || k >= n) return Value::undefined("'str object' has no element " + to_str(key));
    return Value::string(cps[static_cast<size_t>(k)]);
  }
  if (object.is_dict() && key.is_string()) {
    if (const Value* v = object.dict->find(key.s)) return *v;
  }
  if (key.is_string()) {  // x['items'] falls back to the attribute
    Value a = get_attribute(in, object, key.s);
    if (!a.is_undefined()) return a;
  }
  return Value::undefined("'" + object.type_name() + "' has no attribute " + to_repr(key));
}

Value get_slice(Interpreter& in, const Value& object, const Value& start_v, const Value& stop_v, const Value& step_v) {
  if (object.is_undefined()) fail(object.s);
  const auto opt = [](const Value& v, const char* what) -> std::optional<int64_t> {
    if (v.is_none()) return std::nullopt;
    if (v.kind == Value::Kind::Int) return v.i;
    if (v.kind == Value::Kind::Bool) return v.b;
    fail("slice ", what, " must be an integer or None, found ", v.type_name());
  };
  const std::optional<int64_t> start = opt(start_v, "start"), stop = opt(stop_v, "stop"), step_o = opt(step_v, "step");
  const int64_t step = step_o.value_or(1);
  if (step == 0) fail("slice step cannot be zero");
  std::vector<std::string> cps;
  int64_t n;
  if (object.is_string()) {
    cps = code_points(object.s);
    n = static_cast<int64_t>(cps.size());
  } else if (object.is_list()) {
    n = static_cast<int64_t>(object.list->items.size());
  } else {
    fail("'", object.type_name(), "' cannot be sliced");
  }
  // Python's slice.indices().
  const auto clamp = [&](std::optional<int64_t> v, int64_t fallback) {
    if (!v) return fallback;
    int64_t x = *v;
    if (x < 0) {
      x += n;
      if (x < 0) x = step < 0 ? -1 : 0;
    } else if (x >= n) {
      x = step < 0 ? n - 1 : n;
    }
    return x;
  };
  const int64_t b = clamp(start, step < 0 ? n - 1 : 0);
  const int64_t e = clamp(stop, step < 0 ? -1 : n);
  std::vector<size_t> picks;
  for (int64_t k = b; step > 0 ? k < e : k > e; k += step) {
    picks.push_back(static_cast<size_t>(k));
    if (step > 0 ? k > INT64_MAX - step : k < INT64_MIN - step) break;
  }
  in.count_work(picks.size());
  if (object.is_string()) {
    std::string out;
    for (size_t k : picks) out += cps[k];
    return Value::string(std::move(out));
  }
  std::vector<Value> out;
  for (size_t k : picks) out.push_back(object.list->items[k]);
  return Value::new_list(std::move(out), object.list->tuple);
}

}  // namespace mambacpp::chat
