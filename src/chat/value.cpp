#include "chat/value.h"

#include <charconv>
#include <cmath>
#include <cstdio>

#include "mambacpp/error.h"

namespace mambacpp::chat {

const Value* DictData::find(const std::string& key) const {
  for (const auto& [k, v] : items)
    if (k == key) return &v;
  return nullptr;
}

void DictData::set(const std::string& key, Value value) {
  for (auto& [k, v] : items)
    if (k == key) {
      v = std::move(value);
      return;
    }
  items.emplace_back(key, std::move(value));
}

Value Value::undefined(std::string what) {
  Value v;
  v.s = std::move(what);
  return v;
}
Value Value::none() {
  Value v;
  v.kind = Kind::None;
  return v;
}
Value Value::boolean(bool b) {
  Value v;
  v.kind = Kind::Bool;
  v.b = b;
  return v;
}
Value Value::integer(int64_t i) {
  Value v;
  v.kind = Kind::Int;
  v.i = i;
  return v;
}
Value Value::number(double f) {
  Value v;
  v.kind = Kind::Float;
  v.f = f;
  return v;
}
Value Value::string(std::string s) {
  Value v;
  v.kind = Kind::String;
  v.s = std::move(s);
  return v;
}
Value Value::new_list(std::vector<Value> items, bool tuple) {
  Value v;
  v.kind = Kind::List;
  v.list = std::make_shared<ListData>();
  v.list->items = std::move(items);
  v.list->tuple = tuple;
  return v;
}
Value Value::new_dict() {
  Value v;
  v.kind = Kind::Dict;
  v.dict = std::make_shared<DictData>();
  return v;
}
Value Value::function(std::string name, std::function<Value(Interpreter&, CallArgs&)> fn) {
  Value v;
  v.kind = Kind::Callable;
  v.callable = std::make_shared<CallableData>();
  v.callable->name = std::move(name);
  v.callable->fn = std::move(fn);
  return v;
}

Value Value::from_json(const nlohmann::ordered_json& j) {
  switch (j.type()) {
    case nlohmann::ordered_json::value_t::null:
    case nlohmann::ordered_json::value_t::discarded:
      return none();
    case nlohmann::ordered_json::value_t::boolean:
      return boolean(j.get<bool>());
    case nlohmann::ordered_json::value_t::number_integer:
      return integer(j.get<int64_t>());
    case nlohmann::ordered_json::value_t::number_unsigned: {
      const uint64_t u = j.get<uint64_t>();
      if (u > static_cast<uint64_t>(INT64_MAX)) return number(static_cast<double>(u));
      return integer(static_cast<int64_t>(u));
    }
    case nlohmann::ordered_json::value_t::number_float:
      return number(j.get<double>());
    case nlohmann::ordered_json::value_t::string:
      return string(j.get<std::string>());
    case nlohmann::ordered_json::value_t::array: {
      Value v = new_list();
      v.list->items.reserve(j.size());
      for (const auto& e : j) v.list->items.push_back(from_json(e));
      return v;
    }
    case nlohmann::ordered_json::value_t::object: {
      Value v = new_dict();
      v.dict->items.reserve(j.size());
      // JSON objects parsed by nlohmann have unique keys: append without a search.
      for (const auto& [k, e] : j.items()) v.dict->items.emplace_back(k, from_json(e));
      return v;
    }
    case nlohmann::ordered_json::value_t::binary:
      break;
  }
  fail("chat template variables: a binary JSON value cannot be passed to a template");
}

bool Value::truthy() const {
  switch (kind) {
    case Kind::Undefined:
    case Kind::None:
      return false;
    case Kind::Bool:
      return b;
    case Kind::Int:
      return i != 0;
    case Kind::Float:
      return f != 0;
    case Kind::String:
      return !s.empty();
    case Kind::List:
      return !list->items.empty();
    case Kind::Dict:
      return dict->namespace_object || !dict->items.empty();
    case Kind::Callable:
      return true;
  }
  return false;
}

std::string Value::type_name() const {
  switch (kind) {
    case Kind::Undefined: return "undefined";
    case Kind::None: return "NoneType object";
    case Kind::Bool: return "bool object";
    case Kind::Int: return "int object";
    case Kind::Float: return "float object";
    case Kind::String: return "str object";
    case Kind::List: return list->tuple ? "tuple object" : "list object";
    case Kind::Dict: return dict->namespace_object ? "Namespace object" : "dict object";
    case Kind::Callable: return "function";
  }
  return "object";
}

bool equal(const Value& a, const Value& b) {
  using K = Value::Kind;
  if (a.is_number() && b.is_number()) {
    if (a.kind == K::Int && b.kind == K::Int) return a.i == b.i;
    return a.as_double() == b.as_double();
  }
  // Python: True == 1 and False == 0.
  if (a.kind == K::Bool && b.is_number()) return equal(Value::integer(a.b), b);
  if (b.kind == K::Bool && a.is_number()) return equal(a, Value::integer(b.b));
  if (a.kind != b.kind) return false;
  switch (a.kind) {
    case K::Undefined:
    case K::None:
      return true;
    case K::Bool:
      return a.b == b.b;
    case K::String:
      return a.s == b.s;
    case K::List: {
      if (a.list == b.list) return true;
      if (a.list->items.size() != b.list->items.size() || a.list->tuple != b.list->tuple) return false;
      for (size_t k = 0; k < a.list->items.size(); ++k)
        if (!equal(a.list->items[k], b.list->items[k])) return false;
      return true;
    }
    case K::Dict: {
      if (a.dict == b.dict) return true;
      if (a.dict->namespace_object || b.dict->namespace_object) return false;
      if (a.dict->items.size() != b.dict->items.size()) return false;
      for (const auto& [k, v] : a.dict->items) {
        const Value* other = b.dict->find(k);
        if (!other || !equal(v, *other)) return false;
      }
      return true;
    }
    case K::Callable:
      return a.callable == b.callable;
    default:
      return false;
  }
}

std::string float_repr(double v) {
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  if (v == 0) return std::signbit(v) ? "-0.0" : "0.0";
  // Shortest round-trip digits, then Python's layout: positional for exponents in [-4, 16), else d.ddde+XX.
  char buf[64];
  auto r = std::to_chars(buf, buf + sizeof buf, v, std::chars_format::scientific);
  std::string sci(buf, r.ptr);
  const bool negative = sci[0] == '-';
  if (negative) sci.erase(0, 1);
  const size_t e_pos = sci.find('e');
  std::string digits = sci.substr(0, e_pos);
  const int exponent = std::stoi(sci.substr(e_pos + 1));
  digits.erase(std::remove(digits.begin(), digits.end(), '.'), digits.end());
  std::string out;
  if (exponent >= -4 && exponent < 16) {
    if (exponent < 0) {
      out = "0." + std::string(static_cast<size_t>(-exponent - 1), '0') + digits;
    } else if (static_cast<size_t>(exponent) + 1 >= digits.size()) {
      out = digits + std::string(static_cast<size_t>(exponent) + 1 - digits.size(), '0') + ".0";
    } else {
      out = digits.substr(0, static_cast<size_t>(exponent) + 1) + "." + digits.substr(static_cast<size_t>(exponent) + 1);
    }
  } else {
    out = digits.substr(0, 1);
    if (digits.size() > 1) out += "." + digits.substr(1);
    char exp[16];
    std::snprintf(exp, sizeof exp, "e%c%02d", exponent < 0 ? '-' : '+', exponent < 0 ? -exponent : exponent);
    out += exp;
  }
  return negative ? "-" + out : out;
}

namespace {

void repr_string(const std::string& s, std::string& out) {
  const bool has_single = s.find('\'') != std::string::npos;
  const bool has_double = s.find('"') != std::string::npos;
  const char quote = has_single && !has_double ? '"' : '\'';
  out += quote;
  for (unsigned char c : s) {
    if (c == quote || c == '\\') {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\r') {
      out += "\\r";
    } else if (c == '\t') {
      out += "\\t";
    } else if (c < 0x20 || c == 0x7f) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02x", c);
      out += buf;
    } else {
      out += static_cast<char>(c);
    }
  }
  out += quote;
}

void append_str(const Value& v, std::string& out, bool repr) {
  using K = Value::Kind;
  switch (v.kind) {
    case K::Undefined:
      return;
    case K::None:
      out += "None";
      return;
    case K::Bool:
      out += v.b ? "True" : "False";
      return;
    case K::Int:
      out += std::to_string(v.i);
      return;
    case K::Float:
      out += float_repr(v.f);
      return;
    case K::String:
      if (repr)
        repr_string(v.s, out);
      else
        out += v.s;
      return;
    case K::List: {
      out += v.list->tuple ? '(' : '[';
      for (size_t k = 0; k < v.list->items.size(); ++k) {
        if (k) out += ", ";
        append_str(v.list->items[k], out, true);
      }
      if (v.list->tuple && v.list->items.size() == 1) out += ',';
      out += v.list->tuple ? ')' : ']';
      return;
    }
    case K::Dict: {
      if (v.dict->namespace_object) out += "<Namespace ";
      out += '{';
      bool first = true;
      for (const auto& [k, e] : v.dict->items) {
        if (!first) out += ", ";
        first = false;
        repr_string(k, out);
        out += ": ";
        append_str(e, out, true);
      }
      out += '}';
      if (v.dict->namespace_object) out += '>';
      return;
    }
    case K::Callable:
      out += "<function " + v.callable->name + ">";
      return;
  }
}

void json_string(const std::string& s, std::string& out) {
  out += '"';
  for (unsigned char c : s) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      case '\b': out += "\\b"; break;
      case '\f': out += "\\f"; break;
      default:
        if (c < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof buf, "\\u%04x", c);
          out += buf;
        } else {
          out += static_cast<char>(c);
        }
    }
  }
  out += '"';
}

void append_json(const Value& v, int indent, int level, std::string& out) {
  using K = Value::Kind;
  const auto newline = [&](int lvl) {
    out += '\n';
    out.append(static_cast<size_t>(indent) * static_cast<size_t>(lvl), ' ');
  };
  switch (v.kind) {
    case K::None:
      out += "null";
      return;
    case K::Bool:
      out += v.b ? "true" : "false";
      return;
    case K::Int:
      out += std::to_string(v.i);
      return;
    case K::Float:
      if (std::isnan(v.f))
        out += "NaN";
      else if (std::isinf(v.f))
        out += v.f > 0 ? "Infinity" : "-Infinity";
      else
        out += float_repr(v.f);
      return;
    case K::String:
      json_string(v.s, out);
      return;
    case K::List: {
      if (v.list->items.empty()) {
        out += "[]";
        return;
      }
      out += '[';
      for (size_t k = 0; k < v.list->items.size(); ++k) {
        if (k) out += indent >= 0 ? "," : ", ";
        if (indent >= 0) newline(level + 1);
        append_json(v.list->items[k], indent, level + 1, out);
      }
      if (indent >= 0) newline(level);
      out += ']';
      return;
    }
    case K::Dict: {
      if (v.dict->namespace_object) fail("tojson: Object of type Namespace is not JSON serializable");
      if (v.dict->items.empty()) {
        out += "{}";
        return;
      }
      out += '{';
      bool first = true;
      for (const auto& [k, e] : v.dict->items) {
        if (!first) out += indent >= 0 ? "," : ", ";
        first = false;
        if (indent >= 0) newline(level + 1);
        json_string(k, out);
        out += ": ";
        append_json(e, indent, level + 1, out);
      }
      if (indent >= 0) newline(level);
      out += '}';
      return;
    }
    case K::Undefined:
      fail("tojson: Object of type Undefined is not JSON serializable");
    case K::Callable:
      fail("tojson: Object of type function is not JSON serializable");
  }
}

}  // namespace

std::string to_str(const Value& v) {
  std::string out;
  append_str(v, out, false);
  return out;
}

std::string to_repr(const Value& v) {
  std::string out;
  append_str(v, out, true);
  return out;
}

std::string to_json(const Value& v, int indent) {
  std::string out;
  append_json(v, indent, 0, out);
  return out;
}

}  // namespace mambacpp::chat
