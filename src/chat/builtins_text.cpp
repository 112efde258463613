// Python's str semantics on UTF-8 strings for the chat templates: code points, case mapping (utf8proc), strip,
// split, replace, startswith/endswith, HTML escaping, and the str methods templates call (x.strip(), x.split(...)).
#include <utf8proc.h>

#include <algorithm>
#include <string_view>

#include "chat/builtins_internal.h"
#include "chat/interpreter.h"

namespace mambacpp::chat {

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

namespace builtins {

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

static std::string encode(int32_t cp) {
  utf8proc_uint8_t buf[4];
  const auto n = utf8proc_encode_char(cp, buf);
  return std::string(reinterpret_cast<const char*>(buf), static_cast<size_t>(n));
}

enum class Case { Upper, Lower };
static std::string map_case(const std::string& piece, Case c) {
  const int32_t cp = decode(piece);
  if (cp < 0) return piece;
  return encode(c == Case::Upper ? utf8proc_toupper(cp) : utf8proc_tolower(cp));
}

static bool is_cased_letter(const std::string& piece) {
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
static std::string py_title(const std::string& s) {
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

static bool is_py_space(const std::string& piece) {
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

static std::vector<Value> split(Interpreter& in, const std::string& s, const Value* sep_value, const Value* maxsplit_value) {
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

static bool affix_test(const std::string& s, const Value* affix, bool prefix) {
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

}  // namespace builtins

}  // namespace mambacpp::chat
