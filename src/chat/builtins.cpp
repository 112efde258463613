#include "chat/builtins.h"

#include <utf8proc.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <ctime>

#include "chat/interpreter.h"
#include "mambacpp/error.h"

namespace mambacpp::chat {

namespace {

// ---- Arguments -------------------------------------------------------------------------------------------------

// The argument at `index` or named `name` (nullptr when not given).
const Value* arg(const CallArgs& args, size_t index, const char* name) {
  if (index < args.positional.size()) return &args.positional[index];
  for (const auto& [k, v] : args.keyword)
    if (k == name) return &v;
  return nullptr;
}

void check_arity(const CallArgs& args, size_t max_positional, std::initializer_list<const char*> names,
                 const std::string& what) {
  if (args.positional.size() > max_positional)
    fail(what, " takes at most ", max_positional, " positional arguments, got ", args.positional.size());
  for (const auto& [k, v] : args.keyword) {
    bool known = false;
    for (const char* n : names) known = known || k == n;
    if (!known) fail(what, " got an unexpected keyword argument '", k, "'");
  }
}

const std::string& need_string(const Value* v, const std::string& what) {
  if (!v || !v->is_string()) fail(what, " expects a string", v ? ", found " + v->type_name() : std::string());
  return v->s;
}

int64_t need_int(const Value* v, const std::string& what) {
  if (v && v->kind == Value::Kind::Int) return v->i;
  if (v && v->kind == Value::Kind::Bool) return v->b;
  fail(what, " expects an integer", v ? ", found " + v->type_name() : std::string());
}

bool bool_arg(const Value* v, bool fallback) { return v ? v->truthy() : fallback; }

// ---- Strings ---------------------------------------------------------------------------------------------------

bool is_ascii(const std::string& s) {
  for (unsigned char c : s)
    if (c >= 0x80) return false;
  return true;
}

// Code point of each piece (an invalid byte maps to itself, which never matches a letter).
int32_t decode(const std::string& piece) {
  utf8proc_int32_t cp = -1;
  const auto n = utf8proc_iterate(reinterpret_cast<const utf8proc_uint8_t*>(piece.data()),
                                  static_cast<utf8proc_ssize_t>(piece.size()), &cp);
  return n > 0 ? cp : -1;
}

std::string encode(int32_t cp) {
  utf8proc_uint8_t buf[4];
  const auto n = utf8proc_encode_char(cp, buf);
  return std::string(reinterpret_cast<const char*>(buf), static_cast<size_t>(n));
}

enum class Case { Upper, Lower };
std::string map_case(const std::string& piece, Case c) {
  const int32_t cp = decode(piece);
  if (cp < 0) return piece;
  return encode(c == Case::Upper ? utf8proc_toupper(cp) : utf8proc_tolower(cp));
}

bool is_cased_letter(const std::string& piece) {
  const int32_t cp = decode(piece);
  if (cp < 0) return false;
  const auto cat = utf8proc_category(cp);
  return cat == UTF8PROC_CATEGORY_LU || cat == UTF8PROC_CATEGORY_LL || cat == UTF8PROC_CATEGORY_LT;
}

std::string upper(const std::string& s) {
  std::string out;
  for (const std::string& p : code_points(s)) out += map_case(p, Case::Upper);
  return out;
}
std::string lower(const std::string& s) {
  std::string out;
  for (const std::string& p : code_points(s)) out += map_case(p, Case::Lower);
  return out;
}

// Python's str.title(): a cased letter after an uncased character starts a word.
std::string py_title(const std::string& s) {
  std::string out;
  bool prev_cased = false;
  for (const std::string& p : code_points(s)) {
    const bool cased = is_cased_letter(p);
    out += cased ? map_case(p, prev_cased ? Case::Lower : Case::Upper) : p;
    prev_cased = cased;
  }
  return out;
}

// Jinja's title filter: words start after whitespace, '-', '(', '{', '[' or '<'; the first character of each word
// is upper-cased and the rest lower-cased.
std::string jinja_title(const std::string& s) {
  std::string out;
  bool word_start = true;
  for (const std::string& p : code_points(s)) {
    const bool sep = p.size() == 1 && std::string_view(" \t\n\r\f\v-({[<").find(p[0]) != std::string_view::npos;
    if (sep) {
      out += p;
      word_start = true;
    } else {
      out += map_case(p, word_start ? Case::Upper : Case::Lower);
      word_start = false;
    }
  }
  return out;
}

std::string capitalize(const std::string& s) {
  std::string out;
  bool first = true;
  for (const std::string& p : code_points(s)) {
    out += map_case(p, first ? Case::Upper : Case::Lower);
    first = false;
  }
  return out;
}

bool is_py_space(const std::string& piece) {
  if (piece.size() == 1) {
    const char c = piece[0];
    return c == ' ' || (c >= '\t' && c <= '\r') || (c >= '\x1c' && c <= '\x1f');
  }
  const int32_t cp = decode(piece);
  return cp == 0x85 || cp == 0xA0 || cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 ||
         cp == 0x2029 || cp == 0x202F || cp == 0x205F || cp == 0x3000;
}

// str.strip/lstrip/rstrip: whitespace, or any of the code points in `chars`.
std::string strip(const std::string& s, const Value* chars, bool left, bool right) {
  const std::vector<std::string> cps = code_points(s);
  std::vector<std::string> set;
  const bool use_chars = chars && !chars->is_none();
  if (use_chars) {
    if (!chars->is_string()) fail("strip arg must be None or str, found ", chars->type_name());
    set = code_points(chars->s);
  }
  const auto strippable = [&](const std::string& p) {
    return use_chars ? std::find(set.begin(), set.end(), p) != set.end() : is_py_space(p);
  };
  size_t b = 0, e = cps.size();
  if (left)
    while (b < e && strippable(cps[b])) ++b;
  if (right)
    while (e > b && strippable(cps[e - 1])) --e;
  std::string out;
  for (size_t k = b; k < e; ++k) out += cps[k];
  return out;
}

std::vector<Value> split(Interpreter& in, const std::string& s, const Value* sep_value, const Value* maxsplit_value) {
  int64_t maxsplit = -1;
  if (maxsplit_value) maxsplit = need_int(maxsplit_value, "split's maxsplit");
  std::vector<Value> parts;
  if (!sep_value || sep_value->is_none()) {
    // Runs of whitespace separate; leading and trailing whitespace give no empty pieces.
    const std::vector<std::string> cps = code_points(s);
    size_t k = 0;
    while (k < cps.size()) {
      while (k < cps.size() && is_py_space(cps[k])) ++k;
      if (k >= cps.size()) break;
      std::string piece;
      if (maxsplit >= 0 && static_cast<int64_t>(parts.size()) == maxsplit) {
        for (; k < cps.size(); ++k) piece += cps[k];
        piece = strip(piece, nullptr, false, true);
        parts.push_back(Value::string(std::move(piece)));
        break;
      }
      while (k < cps.size() && !is_py_space(cps[k])) piece += cps[k++];
      in.count_work();
      parts.push_back(Value::string(std::move(piece)));
    }
    return parts;
  }
  const std::string& sep = need_string(sep_value, "split's separator");
  if (sep.empty()) fail("split: empty separator");
  size_t start = 0;
  while (true) {
    const size_t hit = s.find(sep, start);
    if (hit == std::string::npos || (maxsplit >= 0 && static_cast<int64_t>(parts.size()) == maxsplit)) break;
    in.count_work();
    parts.push_back(Value::string(s.substr(start, hit - start)));
    start = hit + sep.size();
  }
  parts.push_back(Value::string(s.substr(start)));
  return parts;
}

std::string replace(Interpreter& in, const std::string& s, const std::string& old, const std::string& repl,
                    int64_t count) {
  std::string out;
  if (old.empty()) {
    // Python inserts the replacement before every code point and at the end.
    int64_t done = 0;
    for (const std::string& p : code_points(s)) {
      if (count < 0 || done < count) {
        out += repl;
        ++done;
      }
      out += p;
      in.check_size(out.size());
    }
    if (count < 0 || done < count) out += repl;
    in.check_size(out.size());
    return out;
  }
  size_t start = 0;
  int64_t done = 0;
  while (count < 0 || done < count) {
    const size_t hit = s.find(old, start);
    if (hit == std::string::npos) break;
    out.append(s, start, hit - start);
    out += repl;
    in.check_size(out.size());
    start = hit + old.size();
    ++done;
  }
  out.append(s, start, std::string::npos);
  in.check_size(out.size());
  return out;
}

bool affix_test(const std::string& s, const Value* affix, bool prefix) {
  if (!affix) fail(prefix ? "startswith" : "endswith", " needs an argument");
  const auto one = [&](const Value& a) {
    const std::string& x = need_string(&a, prefix ? "startswith" : "endswith");
    if (x.size() > s.size()) return false;
    return prefix ? s.compare(0, x.size(), x) == 0 : s.compare(s.size() - x.size(), x.size(), x) == 0;
  };
  if (affix->is_list()) {
    for (const Value& a : affix->list->items)
      if (one(a)) return true;
    return false;
  }
  return one(*affix);
}

std::string html_escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&#34;"; break;
      case '\'': out += "&#39;"; break;
      default: out += c;
    }
  }
  return out;
}

// ---- Ordering for sort/min/max ---------------------------------------------------------------------------------

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

// attribute="a.b.0": each part an item lookup (integers index lists).
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

// Python's int(x) for the int filter: None when it cannot convert.
std::optional<int64_t> to_int(const Value& v, int64_t base) {
  switch (v.kind) {
    case Value::Kind::Int: return v.i;
    case Value::Kind::Bool: return v.b;
    case Value::Kind::Float:
      if (!std::isfinite(v.f) || std::fabs(v.f) >= 9.2e18) return std::nullopt;
      return static_cast<int64_t>(v.f);
    case Value::Kind::String: {
      std::string s;
      for (char c : strip(v.s, nullptr, true, true))
        if (c != '_') s += c;
      if (s.empty()) return std::nullopt;
      errno = 0;
      char* end = nullptr;
      const long long r = std::strtoll(s.c_str(), &end, static_cast<int>(base));
      if (errno == 0 && end && *end == '\0') return r;
      char* fend = nullptr;
      const double d = std::strtod(s.c_str(), &fend);  // Jinja falls back to int(float(value))
      if (fend && *fend == '\0' && base == 10) return to_int(Value::number(d), 10);
      return std::nullopt;
    }
    default: return std::nullopt;
  }
}

std::optional<double> to_float(const Value& v) {
  switch (v.kind) {
    case Value::Kind::Int: return static_cast<double>(v.i);
    case Value::Kind::Bool: return v.b ? 1.0 : 0.0;
    case Value::Kind::Float: return v.f;
    case Value::Kind::String: {
      const std::string s = strip(v.s, nullptr, true, true);
      if (s.empty()) return std::nullopt;
      char* end = nullptr;
      const double d = std::strtod(s.c_str(), &end);
      if (end && *end == '\0') return d;
      return std::nullopt;
    }
    default: return std::nullopt;
  }
}

std::string join(Interpreter& in, const std::vector<Value>& items, const std::string& sep) {
  std::string out;
  for (size_t k = 0; k < items.size(); ++k) {
    in.count_work();
    if (k) out += sep;
    out += to_str(items[k]);
    in.check_size(out.size());
  }
  return out;
}

Value bound(const std::string& name, Value self,
            std::function<Value(Interpreter&, const Value&, CallArgs&)> fn) {
  return Value::function(name, [self = std::move(self), fn = std::move(fn)](Interpreter& in, CallArgs& a) {
    return fn(in, self, a);
  });
}

Value string_method(const Value& self, const std::string& name) {
  using A = CallArgs;
  if (name == "strip" || name == "lstrip" || name == "rstrip") {
    const bool l = name != "rstrip", r = name != "lstrip";
    return bound(name, self, [l, r, name](Interpreter&, const Value& s, A& a) {
      check_arity(a, 1, {"chars"}, name);
      return Value::string(strip(s.s, arg(a, 0, "chars"), l, r));
    });
  }
  if (name == "split")
    return bound(name, self, [](Interpreter& in, const Value& s, A& a) {
      check_arity(a, 2, {"sep", "maxsplit"}, "split");
      return Value::new_list(split(in, s.s, arg(a, 0, "sep"), arg(a, 1, "maxsplit")));
    });
  if (name == "splitlines")
    return bound(name, self, [](Interpreter& in, const Value& s, A& a) {
      check_arity(a, 1, {"keepends"}, "splitlines");
      const bool keep = bool_arg(arg(a, 0, "keepends"), false);
      std::vector<Value> lines;
      size_t start = 0;
      for (size_t k = 0; k < s.s.size(); ++k) {
        if (s.s[k] != '\n' && s.s[k] != '\r') continue;
        size_t end = k + 1;
        if (s.s[k] == '\r' && k + 1 < s.s.size() && s.s[k + 1] == '\n') ++end;
        in.count_work();
        lines.push_back(Value::string(s.s.substr(start, (keep ? end : k) - start)));
        start = end;
        k = end - 1;
      }
      if (start < s.s.size()) lines.push_back(Value::string(s.s.substr(start)));
      return Value::new_list(std::move(lines));
    });
  if (name == "replace")
    return bound(name, self, [](Interpreter& in, const Value& s, A& a) {
      check_arity(a, 3, {"old", "new", "count"}, "replace");
      const Value* count = arg(a, 2, "count");
      return Value::string(replace(in, s.s, need_string(arg(a, 0, "old"), "replace"),
                                   need_string(arg(a, 1, "new"), "replace"), count ? need_int(count, "replace") : -1));
    });
  if (name == "startswith" || name == "endswith") {
    const bool prefix = name == "startswith";
    return bound(name, self, [prefix](Interpreter&, const Value& s, A& a) {
      return Value::boolean(affix_test(s.s, arg(a, 0, "prefix"), prefix));
    });
  }
  if (name == "upper") return bound(name, self, [](Interpreter&, const Value& s, A&) { return Value::string(upper(s.s)); });
  if (name == "lower") return bound(name, self, [](Interpreter&, const Value& s, A&) { return Value::string(lower(s.s)); });
  if (name == "title") return bound(name, self, [](Interpreter&, const Value& s, A&) { return Value::string(py_title(s.s)); });
  if (name == "capitalize")
    return bound(name, self, [](Interpreter&, const Value& s, A&) { return Value::string(capitalize(s.s)); });
  if (name == "find" || name == "rfind" || name == "count")
    return bound(name, self, [name](Interpreter&, const Value& s, A& a) {
      const std::string& sub = need_string(arg(a, 0, "sub"), name);
      if (name == "count") {
        if (sub.empty()) return Value::integer(static_cast<int64_t>(code_points(s.s).size()) + 1);
        int64_t n = 0;
        for (size_t p = s.s.find(sub); p != std::string::npos; p = s.s.find(sub, p + sub.size())) ++n;
        return Value::integer(n);
      }
      const size_t p = name == "find" ? s.s.find(sub) : s.s.rfind(sub);
      // Python counts code points: convert the byte offset.
      return Value::integer(p == std::string::npos ? -1 : static_cast<int64_t>(code_points(s.s.substr(0, p)).size()));
    });
  if (name == "join")
    return bound(name, self, [](Interpreter& in, const Value& s, A& a) {
      const Value* items = arg(a, 0, "iterable");
      if (!items) fail("join needs an iterable");
      std::vector<Value> parts = iterate(in, *items);
      for (const Value& p : parts)
        if (!p.is_string()) fail("join: expected str items, found ", p.type_name());
      return Value::string(join(in, parts, s.s));
    });
  if (name == "isdigit" || name == "isalpha" || name == "isalnum" || name == "isspace" || name == "islower" ||
      name == "isupper")
    return bound(name, self, [name](Interpreter&, const Value& s, A&) {
      const std::vector<std::string> cps = code_points(s.s);
      if (cps.empty()) return Value::boolean(false);
      if (name == "islower" || name == "isupper") {
        bool any = false;
        for (const std::string& p : cps) {
          if (!is_cased_letter(p)) continue;
          any = true;
          if ((name == "islower") != (map_case(p, Case::Lower) == p)) return Value::boolean(false);
        }
        return Value::boolean(any);
      }
      for (const std::string& p : cps) {
        const int32_t cp = decode(p);
        const auto cat = cp < 0 ? UTF8PROC_CATEGORY_CN : utf8proc_category(cp);
        const bool digit = cat == UTF8PROC_CATEGORY_ND;
        const bool alpha = cat >= UTF8PROC_CATEGORY_LU && cat <= UTF8PROC_CATEGORY_LO;
        const bool ok = name == "isdigit" ? digit : name == "isalpha" ? alpha : name == "isalnum" ? digit || alpha
                                                                                                  : is_py_space(p);
        if (!ok) return Value::boolean(false);
      }
      return Value::boolean(true);
    });
  return Value::undefined("'str object' has no attribute '" + name + "'");
}

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

// ---- Filters ---------------------------------------------------------------------------------------------------

Value map_filter(Interpreter& in, const Value& v, CallArgs& a);
Value select_filter(Interpreter& in, const Value& v, CallArgs& a, bool by_attribute, bool keep_matching);

}  // namespace

std::vector<std::string> code_points(const std::string& s) {
  std::vector<std::string> out;
  out.reserve(s.size());
  for (size_t k = 0; k < s.size();) {
    const unsigned char c = static_cast<unsigned char>(s[k]);
    size_t n = c < 0x80 ? 1 : (c >> 5) == 0x6 ? 2 : (c >> 4) == 0xE ? 3 : (c >> 3) == 0x1E ? 4 : 1;
    if (k + n > s.size()) n = 1;
    for (size_t j = 1; j < n; ++j)
      if ((static_cast<unsigned char>(s[k + j]) & 0xC0) != 0x80) n = 1;
    out.push_back(s.substr(k, n));
    k += n;
  }
  return out;
}

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

namespace {

const char* const kFilters[] = {"abs", "attr", "capitalize", "center", "count", "d", "default", "dictsort", "e",
                                 "escape", "first", "float", "forceescape", "format", "indent", "int", "items", "join",
                                 "last", "length", "list", "lower", "map", "max", "min", "reject", "rejectattr",
                                 "replace", "reverse", "round", "safe", "select", "selectattr", "sort", "string",
                                 "sum", "title", "tojson", "trim", "unique", "upper", "wordcount"};
const char* const kTests[] = {"boolean", "callable", "defined", "divisibleby", "eq", "equalto", "escaped", "even",
                              "false", "filter", "float", "ge", "gt", "greaterthan", "in", "integer", "iterable", "le",
                              "lessthan", "lower", "lt", "mapping", "ne", "none", "number", "odd", "sameas",
                              "sequence", "string", "test", "true", "undefined", "upper", "==", "!=", "<", "<=", ">",
                              ">="};

template <size_t N>
bool known(const char* const (&names)[N], const std::string& name) {
  for (const char* n : names)
    if (name == n) return true;
  return false;
}

Value sorted(Interpreter& in, const Value& v, CallArgs& a) {
  check_arity(a, 3, {"reverse", "case_sensitive", "attribute"}, "sort");
  const bool reverse = bool_arg(arg(a, 0, "reverse"), false);
  const bool case_sensitive = bool_arg(arg(a, 1, "case_sensitive"), false);
  const Value* attribute = arg(a, 2, "attribute");
  std::vector<Value> items = iterate(in, v);
  in.count_work(items.size());
  std::vector<Value> keys;
  for (const Value& item : items)
    keys.push_back(attribute && !attribute->is_none() ? resolve_path(in, item, to_str(*attribute)) : item);
  std::vector<size_t> idx(items.size());
  for (size_t k = 0; k < idx.size(); ++k) idx[k] = k;
  std::stable_sort(idx.begin(), idx.end(), [&](size_t x, size_t y) {
    const int c = order(keys[x], keys[y], case_sensitive);
    return reverse ? c > 0 : c < 0;
  });
  std::vector<Value> out;
  for (size_t k : idx) out.push_back(items[k]);
  return Value::new_list(std::move(out));
}

Value min_max(Interpreter& in, const Value& v, CallArgs& a, bool want_max) {
  check_arity(a, 2, {"case_sensitive", "attribute"}, want_max ? "max" : "min");
  const bool case_sensitive = bool_arg(arg(a, 0, "case_sensitive"), false);
  const Value* attribute = arg(a, 1, "attribute");
  std::vector<Value> items = iterate(in, v);
  if (items.empty()) return Value::undefined("no items for min/max");
  in.count_work(items.size());
  const auto key = [&](const Value& x) {
    return attribute && !attribute->is_none() ? resolve_path(in, x, to_str(*attribute)) : x;
  };
  size_t best = 0;
  for (size_t k = 1; k < items.size(); ++k) {
    const int c = order(key(items[k]), key(items[best]), case_sensitive);
    if (want_max ? c > 0 : c < 0) best = k;
  }
  return items[best];
}

std::string indent(const std::string& s, const Value* width_v, bool first, bool blank) {
  std::string pad;
  if (width_v && width_v->is_string())
    pad = width_v->s;
  else
    pad.assign(static_cast<size_t>(std::clamp<int64_t>(width_v ? need_int(width_v, "indent") : 4, 0, 1024)), ' ');
  // Jinja's: the text gets a '\n' appended before splitlines(), so a trailing newline yields no extra line.
  std::vector<std::string> lines;
  const std::string t = s + "\n";
  size_t start = 0;
  for (size_t k = 0; k < t.size(); ++k) {
    if (t[k] != '\n' && t[k] != '\r') continue;
    lines.push_back(t.substr(start, k - start));
    if (t[k] == '\r' && k + 1 < t.size() && t[k + 1] == '\n') ++k;
    start = k + 1;
  }
  std::string out;
  for (size_t k = 0; k < lines.size(); ++k) {
    if (k) out += '\n';
    if (k == 0) {
      out += lines[k];
    } else if (blank || !lines[k].empty()) {
      out += pad + lines[k];
    }
  }
  if (first) out = pad + out;
  return out;
}

}  // namespace

Value apply_filter(Interpreter& in, const std::string& name, const Value& v, CallArgs& a) {
  const auto str_of = [&](const Value& x) { return to_str(x); };
  if (name == "safe") return v;
  if (name == "string") return Value::string(to_str(v));
  if (name == "default" || name == "d") {
    check_arity(a, 2, {"default_value", "boolean"}, name);
    const Value* fallback = arg(a, 0, "default_value");
    const bool boolean = bool_arg(arg(a, 1, "boolean"), false);
    if (v.is_undefined() || (boolean && !v.truthy())) return fallback ? *fallback : Value::string("");
    return v;
  }
  if (name == "tojson") {
    check_arity(a, 1, {"indent", "ensure_ascii", "separators", "sort_keys"}, "tojson");
    const Value* ind = arg(a, 0, "indent");
    int indent_n = -1;
    if (ind && !ind->is_none()) indent_n = static_cast<int>(std::clamp<int64_t>(need_int(ind, "tojson's indent"), 0, 64));
    const std::string out = to_json(v, indent_n);
    in.check_size(out.size());
    return Value::string(out);
  }
  if (name == "length" || name == "count") return Value::integer(length(v));
  if (name == "items") {
    if (v.is_undefined()) return Value::new_list();
    if (!v.is_dict()) fail("items: expected a mapping, found ", v.type_name());
    return in.call(dict_method(v, "items"), a);
  }
  if (name == "list") return Value::new_list(iterate(in, v));
  if (name == "first" || name == "last") {
    if (v.is_string()) {
      const std::vector<std::string> cps = code_points(v.s);
      if (cps.empty()) return Value::undefined("first/last of an empty string");
      return Value::string(name == "first" ? cps.front() : cps.back());
    }
    std::vector<Value> items = iterate(in, v);
    if (items.empty()) return Value::undefined("'" + name + "' of an empty sequence");
    return name == "first" ? items.front() : items.back();
  }
  if (name == "join") {
    check_arity(a, 2, {"d", "attribute"}, "join");
    const Value* sep = arg(a, 0, "d");
    const Value* attribute = arg(a, 1, "attribute");
    std::vector<Value> items = iterate(in, v);
    if (attribute && !attribute->is_none())
      for (Value& item : items) item = resolve_path(in, item, str_of(*attribute));
    return Value::string(join(in, items, sep ? to_str(*sep) : std::string()));
  }
  if (name == "upper") return Value::string(upper(to_str(v)));
  if (name == "lower") return Value::string(lower(to_str(v)));
  if (name == "title") return Value::string(jinja_title(to_str(v)));
  if (name == "capitalize") return Value::string(capitalize(to_str(v)));
  if (name == "trim") {
    check_arity(a, 1, {"chars"}, "trim");
    return Value::string(strip(to_str(v), arg(a, 0, "chars"), true, true));
  }
  if (name == "replace") {
    check_arity(a, 3, {"old", "new", "count"}, "replace");
    const Value* count = arg(a, 2, "count");
    if (!arg(a, 0, "old") || !arg(a, 1, "new")) fail("replace needs the old and the new string");
    return Value::string(replace(in, to_str(v), to_str(*arg(a, 0, "old")), to_str(*arg(a, 1, "new")),
                                 count && !count->is_none() ? need_int(count, "replace's count") : -1));
  }
  if (name == "int") {
    check_arity(a, 2, {"default", "base"}, "int");
    const Value* fallback = arg(a, 0, "default");
    const Value* base = arg(a, 1, "base");
    const int64_t b = base ? need_int(base, "int's base") : 10;
    if (b < 2 || b > 36) fail("int: base must be in 2..36, found ", b);
    if (auto r = to_int(v, b)) return Value::integer(*r);
    return fallback ? *fallback : Value::integer(0);
  }
  if (name == "float") {
    check_arity(a, 1, {"default"}, "float");
    if (auto r = to_float(v)) return Value::number(*r);
    const Value* fallback = arg(a, 0, "default");
    return fallback ? *fallback : Value::number(0.0);
  }
  if (name == "abs") {
    if (v.kind == Value::Kind::Int) {
      if (v.i == INT64_MIN) fail("integer overflow in abs");
      return Value::integer(v.i < 0 ? -v.i : v.i);
    }
    if (v.kind == Value::Kind::Float) return Value::number(std::fabs(v.f));
    if (v.kind == Value::Kind::Bool) return Value::integer(v.b);
    fail("bad operand type for abs(): '", v.type_name(), "'");
  }
  if (name == "round") {
    check_arity(a, 2, {"precision", "method"}, "round");
    const Value* p = arg(a, 0, "precision");
    const int64_t precision = std::clamp<int64_t>(p ? need_int(p, "round's precision") : 0, -30, 30);
    const Value* m = arg(a, 1, "method");
    const std::string method = m ? to_str(*m) : "common";
    if (!v.is_number() && v.kind != Value::Kind::Bool) fail("round: expected a number, found ", v.type_name());
    const double x = v.kind == Value::Kind::Bool ? v.b : v.as_double();
    const double scale = std::pow(10.0, static_cast<double>(precision));
    double r;
    if (method == "common") r = std::nearbyint(x * scale) / scale;  // Python's round(): half to even
    else if (method == "ceil") r = std::ceil(x * scale) / scale;
    else if (method == "floor") r = std::floor(x * scale) / scale;
    else fail("round: method must be common, ceil or floor, found '", method, "'");
    return Value::number(r);
  }
  if (name == "escape" || name == "e" || name == "forceescape") return Value::string(html_escape(to_str(v)));
  if (name == "format") {
    if (!a.positional.empty() && !a.keyword.empty()) fail("format: cannot mix positional and keyword arguments");
    if (!a.keyword.empty()) fail("format: keyword arguments (%(name)s) are not supported");
    const std::string fmt = to_str(v);
    std::string out;
    size_t next = 0;
    for (size_t k = 0; k < fmt.size(); ++k) {
      if (fmt[k] != '%') {
        out += fmt[k];
        continue;
      }
      if (k + 1 < fmt.size() && fmt[k + 1] == '%') {
        out += '%';
        ++k;
        continue;
      }
      if (k + 1 >= fmt.size()) fail("format: incomplete format");
      const char conv = fmt[k + 1];
      if (next >= a.positional.size()) fail("format: not enough arguments for format string");
      const Value& x = a.positional[next++];
      if (conv == 's') out += to_str(x);
      else if (conv == 'r') out += to_repr(x);
      else if (conv == 'd' || conv == 'i') {
        auto r = to_int(x, 10);
        if (!r || x.is_string()) fail("format: %d needs a number, found ", x.type_name());
        out += std::to_string(*r);
      } else fail("format: unsupported format character '", std::string(1, conv), "'");
      ++k;
      in.check_size(out.size());
    }
    return Value::string(out);
  }
  if (name == "indent") {
    check_arity(a, 3, {"width", "first", "blank"}, "indent");
    std::string out = indent(to_str(v), arg(a, 0, "width"), bool_arg(arg(a, 1, "first"), false),
                             bool_arg(arg(a, 2, "blank"), false));
    in.check_size(out.size());
    return Value::string(out);
  }
  if (name == "center") {
    const Value* w = arg(a, 0, "width");
    const int64_t width = std::clamp<int64_t>(w ? need_int(w, "center") : 80, 0, 1 << 20);
    const std::string s = to_str(v);
    const int64_t n = length(Value::string(s));
    if (n >= width) return Value::string(s);
    // Python's str.center: the extra space goes left when the margin is odd and the width is odd.
    const int64_t margin = width - n;
    const int64_t left = margin / 2 + (margin & width & 1);
    return Value::string(std::string(static_cast<size_t>(left), ' ') + s +
                         std::string(static_cast<size_t>(margin - left), ' '));
  }
  if (name == "wordcount") {
    int64_t words = 0;
    bool in_word = false;
    for (const std::string& p : code_points(to_str(v))) {
      const int32_t cp = decode(p);
      const auto cat = cp < 0 ? UTF8PROC_CATEGORY_CN : utf8proc_category(cp);
      const bool w = (cat >= UTF8PROC_CATEGORY_LU && cat <= UTF8PROC_CATEGORY_LO) || cat == UTF8PROC_CATEGORY_ND ||
                     cat == UTF8PROC_CATEGORY_NL || cat == UTF8PROC_CATEGORY_NO || p == "_";
      if (w && !in_word) ++words;
      in_word = w;
    }
    return Value::integer(words);
  }
  if (name == "reverse") {
    if (v.is_string()) {
      std::vector<std::string> cps = code_points(v.s);
      std::string out;
      for (auto it = cps.rbegin(); it != cps.rend(); ++it) out += *it;
      return Value::string(out);
    }
    std::vector<Value> items = iterate(in, v);
    std::reverse(items.begin(), items.end());
    return Value::new_list(std::move(items));
  }
  if (name == "sort") return sorted(in, v, a);
  if (name == "dictsort") {
    if (!v.is_dict()) fail("dictsort: expected a mapping, found ", v.type_name());
    check_arity(a, 3, {"case_sensitive", "by", "reverse"}, "dictsort");
    const bool case_sensitive = bool_arg(arg(a, 0, "case_sensitive"), false);
    const Value* by = arg(a, 1, "by");
    const bool by_value = by && to_str(*by) == "value";
    const bool reverse = bool_arg(arg(a, 2, "reverse"), false);
    std::vector<Value> items;
    for (const auto& [k, x] : v.dict->items) items.push_back(make_tuple(Value::string(k), x));
    in.count_work(items.size());
    std::stable_sort(items.begin(), items.end(), [&](const Value& x, const Value& y) {
      const int c = order(x.list->items[by_value], y.list->items[by_value], case_sensitive);
      return reverse ? c > 0 : c < 0;
    });
    return Value::new_list(std::move(items));
  }
  if (name == "unique") {
    check_arity(a, 2, {"case_sensitive", "attribute"}, "unique");
    const bool case_sensitive = bool_arg(arg(a, 0, "case_sensitive"), false);
    const Value* attribute = arg(a, 1, "attribute");
    std::vector<Value> out, seen;
    for (const Value& item : iterate(in, v)) {
      in.count_work(seen.size() + 1);
      Value key = attribute && !attribute->is_none() ? resolve_path(in, item, to_str(*attribute)) : item;
      if (!case_sensitive && key.is_string()) key = Value::string(lower(key.s));
      bool dup = false;
      for (const Value& s : seen) dup = dup || equal(s, key);
      if (dup) continue;
      seen.push_back(key);
      out.push_back(item);
    }
    return Value::new_list(std::move(out));
  }
  if (name == "min" || name == "max") return min_max(in, v, a, name == "max");
  if (name == "sum") {
    check_arity(a, 2, {"attribute", "start"}, "sum");
    const Value* attribute = arg(a, 0, "attribute");
    const Value* start = arg(a, 1, "start");
    Value total = start ? *start : Value::integer(0);
    for (const Value& item : iterate(in, v)) {
      in.count_work();
      const Value x = attribute && !attribute->is_none() ? resolve_path(in, item, to_str(*attribute)) : item;
      if (total.kind == Value::Kind::Int && x.kind == Value::Kind::Int) {
        int64_t r;
        if (__builtin_add_overflow(total.i, x.i, &r)) fail("integer overflow in sum");
        total = Value::integer(r);
      } else if ((total.is_number() || total.kind == Value::Kind::Bool) && (x.is_number() || x.kind == Value::Kind::Bool)) {
        const double t = total.kind == Value::Kind::Bool ? total.b : total.as_double();
        const double y = x.kind == Value::Kind::Bool ? x.b : x.as_double();
        total = Value::number(t + y);
      } else {
        fail("sum: unsupported operand types '", total.type_name(), "' and '", x.type_name(), "'");
      }
    }
    return total;
  }
  if (name == "attr") {
    const Value* n = arg(a, 0, "name");
    return get_attribute(in, v, need_string(n, "attr"));
  }
  if (name == "map") return map_filter(in, v, a);
  if (name == "select") return select_filter(in, v, a, false, true);
  if (name == "reject") return select_filter(in, v, a, false, false);
  if (name == "selectattr") return select_filter(in, v, a, true, true);
  if (name == "rejectattr") return select_filter(in, v, a, true, false);
  fail("unknown filter '", name, "'");
}

namespace {

Value map_filter(Interpreter& in, const Value& v, CallArgs& a) {
  std::vector<Value> items = iterate(in, v);
  const Value* attribute = nullptr;
  const Value* fallback = nullptr;
  for (const auto& [k, x] : a.keyword) {
    if (k == "attribute") attribute = &x;
    if (k == "default") fallback = &x;
  }
  std::vector<Value> out;
  if (attribute) {
    for (const Value& item : items) {
      in.count_work();
      Value r = resolve_path(in, item, to_str(*attribute));
      out.push_back(r.is_undefined() && fallback ? *fallback : r);
    }
    return Value::new_list(std::move(out));
  }
  if (a.positional.empty() || !a.positional[0].is_string()) fail("map: expected a filter name or attribute=");
  const std::string filter = a.positional[0].s;
  CallArgs rest;
  rest.positional.assign(a.positional.begin() + 1, a.positional.end());
  rest.keyword = a.keyword;
  for (const Value& item : items) {
    in.count_work();
    CallArgs copy = rest;
    out.push_back(apply_filter(in, filter, item, copy));
  }
  return Value::new_list(std::move(out));
}

Value select_filter(Interpreter& in, const Value& v, CallArgs& a, bool by_attribute, bool keep_matching) {
  std::vector<Value> items = iterate(in, v);
  size_t next = 0;
  std::string attribute;
  if (by_attribute) {
    if (a.positional.empty()) fail("selectattr/rejectattr need an attribute name");
    attribute = to_str(a.positional[next++]);
  }
  std::string test;
  if (next < a.positional.size()) test = need_string(&a.positional[next++], "the test name");
  CallArgs test_args;
  test_args.positional.assign(a.positional.begin() + static_cast<std::ptrdiff_t>(next), a.positional.end());
  test_args.keyword = a.keyword;
  std::vector<Value> out;
  for (const Value& item : items) {
    in.count_work();
    const Value x = by_attribute ? resolve_path(in, item, attribute) : item;
    bool match;
    if (test.empty()) {
      match = x.truthy();
    } else {
      CallArgs copy = test_args;
      match = apply_test(in, test, x, copy);
    }
    if (match == keep_matching) out.push_back(item);
  }
  return Value::new_list(std::move(out));
}

}  // namespace

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
  if (name == "filter") return other().is_string() && known(kFilters, other().s);
  if (name == "test") return other().is_string() && known(kTests, other().s);
  fail("unknown test '", name, "'");
}

void add_builtin_globals(DictData& globals) {
  globals.set("range", Value::function("range", [](Interpreter& in, CallArgs& a) {
    if (!a.keyword.empty()) fail("range() takes no keyword arguments");
    if (a.positional.empty() || a.positional.size() > 3) fail("range expected 1 to 3 arguments, got ", a.positional.size());
    int64_t start = 0, stop, step = 1;
    if (a.positional.size() == 1) {
      stop = need_int(&a.positional[0], "range");
    } else {
      start = need_int(&a.positional[0], "range");
      stop = need_int(&a.positional[1], "range");
      if (a.positional.size() == 3) step = need_int(&a.positional[2], "range");
    }
    if (step == 0) fail("range() arg 3 must not be zero");
    const long double count_ld = step > 0 ? (static_cast<long double>(stop) - start) / step
                                          : (static_cast<long double>(start) - stop) / -static_cast<long double>(step);
    const uint64_t count = count_ld <= 0 ? 0 : static_cast<uint64_t>(std::ceil(count_ld));
    if (count > in.limits().max_work) fail("range of ", count, " items is more than the render's limit of work");
    in.count_work(count);
    std::vector<Value> out;
    out.reserve(count);
    for (uint64_t k = 0; k < count; ++k) out.push_back(Value::integer(start + static_cast<int64_t>(k) * step));
    return Value::new_list(std::move(out));
  }));
  globals.set("namespace", Value::function("namespace", [](Interpreter& in, CallArgs& a) {
    Value ns = Value::new_dict();
    ns.dict->namespace_object = true;
    in.track(ns.dict);
    for (const Value& p : a.positional) {
      if (!p.is_dict()) fail("namespace() takes mappings as positional arguments, found ", p.type_name());
      for (const auto& [k, v] : p.dict->items) ns.dict->set(k, v);
    }
    for (const auto& [k, v] : a.keyword) ns.dict->set(k, v);
    return ns;
  }));
  globals.set("dict", Value::function("dict", [](Interpreter&, CallArgs& a) {
    Value d = Value::new_dict();
    for (const Value& p : a.positional) {
      if (!p.is_dict()) fail("dict() takes a mapping, found ", p.type_name());
      for (const auto& [k, v] : p.dict->items) d.dict->set(k, v);
    }
    for (const auto& [k, v] : a.keyword) d.dict->set(k, v);
    return d;
  }));
  // transformers' globals.
  globals.set("raise_exception", Value::function("raise_exception", [](Interpreter&, CallArgs& a) -> Value {
    fail(a.positional.empty() ? std::string("raise_exception() was called") : to_str(a.positional[0]));
  }));
  globals.set("strftime_now", Value::function("strftime_now", [](Interpreter&, CallArgs& a) {
    const std::string& fmt = need_string(arg(a, 0, "format"), "strftime_now");
    if (fmt.size() > 256) fail("strftime_now: format longer than 256 characters");
    const std::time_t now = std::time(nullptr);
    std::tm local{};
    localtime_r(&now, &local);
    std::string buf(1024, '\0');
    const size_t n = std::strftime(buf.data(), buf.size(), fmt.c_str(), &local);
    buf.resize(n);
    return Value::string(buf);
  }));
}

}  // namespace mambacpp::chat
