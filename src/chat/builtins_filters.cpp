// Jinja's filters (x | name(args)) as the chat templates use them: on strings, on numbers, on sequences and
// mappings (sort, unique, map, select...), and tojson.
#include <utf8proc.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <optional>

#include "chat/builtins_internal.h"
#include "chat/interpreter.h"

namespace mambacpp::chat {

using namespace builtins;

namespace {

const char* const kFilters[] = {"abs", "attr", "capitalize", "center", "count", "d", "default", "dictsort", "e",
                                 "escape", "first", "float", "forceescape", "format", "indent", "int", "items", "join",
                                 "last", "length", "list", "lower", "map", "max", "min", "reject", "rejectattr",
                                 "replace", "reverse", "round", "safe", "select", "selectattr", "sort", "string",
                                 "sum", "title", "tojson", "trim", "unique", "upper", "wordcount"};

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

Value map_filter(Interpreter& in, const Value& v, CallArgs& a);
Value select_filter(Interpreter& in, const Value& v, CallArgs& a, bool by_attribute, bool keep_matching);

}  // namespace

bool builtins::is_filter_name(const std::string& name) {
  for (const char* n : kFilters)
    if (name == n) return true;
  return false;
}

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

}  // namespace mambacpp::chat
