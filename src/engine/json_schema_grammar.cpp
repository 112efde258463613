// JSON schemas compiled to GBNF (mambacpp/grammar.h): one rule per schema node, written as text so that the result
// is a grammar a user could have written (and that the server's logs can show).
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "engine/grammar.h"
#include "mambacpp/error.h"
#include "mambacpp/grammar.h"

namespace mambacpp {

namespace {

using json = nlohmann::ordered_json;

// The JSON value grammar the schema rules build on. Whitespace between tokens is bounded (so is the length of a
// number's digits), so that a model cannot pad forever inside an otherwise finished value.
constexpr const char* kJsonBase = R"(ws ::= [ \t\n]{0,20}
value ::= object | array | string | number | boolean | null
object ::= "{" ws ( string ws ":" ws value ws ( "," ws string ws ":" ws value ws )* )? "}"
array ::= "[" ws ( value ws ( "," ws value ws )* )? "]"
string ::= "\"" char* "\""
char ::= [^"\\\x00-\x1F] | "\\" ( ["\\/bfnrt] | "u" [0-9a-fA-F]{4} )
integer ::= "-"? ( "0" | [1-9] [0-9]{0,15} )
number ::= integer ( "." [0-9]{1,16} )? ( [eE] [-+]? [0-9]{1,3} )?
boolean ::= "true" | "false"
null ::= "null"
)";

// A GBNF string literal for `bytes`.
std::string literal(const std::string& bytes) {
  std::string out = "\"";
  for (unsigned char c : bytes) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c < 0x20 || c == 0x7F) {
      static const char* hex = "0123456789ABCDEF";
      out += "\\x";
      out += hex[c >> 4];
      out += hex[c & 15];
    } else {
      out += static_cast<char>(c);
    }
  }
  return out + "\"";
}

// The JSON text of a value as it is generated (compact).
std::string json_literal(const json& v) { return literal(v.dump(-1, ' ', false, json::error_handler_t::strict)); }

const std::set<std::string> kAnnotations = {"title", "description", "examples", "default",    "$schema",
                                            "$id",   "$comment",    "$defs",    "definitions"};
const std::set<std::string> kSupported = {"type",      "properties", "required", "additionalProperties",
                                          "items",     "minItems",   "maxItems", "minLength",
                                          "maxLength", "enum",       "const",    "anyOf",
                                          "oneOf",     "allOf",      "$ref"};

class SchemaCompiler {
 public:
  explicit SchemaCompiler(const json& root) : root_(root) {}

  std::string run() {
    const std::string top = compile(root_, "#", 0);
    std::ostringstream out;
    out << "root ::= " << top << "\n";
    for (const std::string& r : rules_) out << r << "\n";
    out << kJsonBase;
    return out.str();
  }

 private:
  [[noreturn]] static void unsupported(const std::string& what, const std::string& where) {
    fail("json_schema: ", what, " (at ", where, ") is not supported");
  }

  std::string add_rule(const std::string& body) {
    const std::string name = reserve();
    define(name, body);
    return name;
  }
  std::string reserve() { return "s" + std::to_string(next_rule_++); }
  void define(const std::string& name, const std::string& body) { rules_.push_back(name + " ::= " + body); }

  static int64_t count(const json& s, const char* key, const std::string& where) {
    const json& v = s[key];
    if (!v.is_number_integer() || v.get<int64_t>() < 0 || v.get<int64_t>() > 100000)
      fail("json_schema: '", key, "' (at ", where, ") must be an integer in [0, 100000], found ", v.dump());
    return v.get<int64_t>();
  }

  // A GBNF expression for `s`.
  std::string compile(const json& s, const std::string& where, int depth) {
    if (depth > 64) fail("json_schema: the schema nests deeper than 64 levels (at ", where, ")");
    if (s.is_boolean()) {
      if (!s.get<bool>()) unsupported("the schema false (nothing validates)", where);
      return "value";
    }
    if (!s.is_object()) fail("json_schema: a schema must be an object or a boolean (at ", where, "), found ", s.dump());
    for (const auto& [key, unused] : s.items())
      if (!kAnnotations.count(key) && !kSupported.count(key)) unsupported("the keyword '" + key + "'", where);
    if (s.contains("$ref")) {
      for (const auto& [key, unused] : s.items())
        if (key != "$ref" && !kAnnotations.count(key)) unsupported("'" + key + "' beside '$ref'", where);
      return ref(s["$ref"], where, depth);
    }
    if (s.contains("const")) return json_literal(s["const"]);
    if (s.contains("enum")) {
      const json& e = s["enum"];
      if (!e.is_array() || e.empty()) fail("json_schema: 'enum' (at ", where, ") must be a non-empty array");
      std::string alts;
      for (const json& v : e) alts += (alts.empty() ? "" : " | ") + json_literal(v);
      return add_rule(alts);
    }
    for (const char* key : {"anyOf", "oneOf", "allOf"}) {
      if (!s.contains(key)) continue;
      const json& list = s[key];
      if (!list.is_array() || list.empty()) fail("json_schema: '", key, "' (at ", where, ") must be a non-empty array");
      for (const auto& [k, unused] : s.items())
        if (k != key && !kAnnotations.count(k)) unsupported(std::string("'") + k + "' beside '" + key + "'", where);
      if (std::string(key) == "allOf") {
        if (list.size() != 1) unsupported("'allOf' with more than one schema", where);
        return compile(list[0], where + "/allOf/0", depth + 1);
      }
      std::string alts;
      for (size_t i = 0; i < list.size(); ++i)
        alts += (i ? " | " : "") + compile(list[i], where + "/" + key + "/" + std::to_string(i), depth + 1);
      return add_rule(alts);
    }
    if (s.contains("type")) {
      const json& t = s["type"];
      if (t.is_string()) return typed(s, t.get<std::string>(), where, depth);
      if (!t.is_array() || t.empty())
        fail("json_schema: 'type' (at ", where, ") must be a string or a non-empty array");
      std::string alts;
      for (const json& one : t) {
        if (!one.is_string()) fail("json_schema: 'type' (at ", where, ") lists a non-string: ", one.dump());
        alts += (alts.empty() ? "" : " | ") + typed(s, one.get<std::string>(), where, depth);
      }
      return add_rule(alts);
    }
    if (s.contains("properties") || s.contains("additionalProperties") || s.contains("required"))
      return typed(s, "object", where, depth);
    if (s.contains("items") || s.contains("minItems") || s.contains("maxItems")) return typed(s, "array", where, depth);
    if (s.contains("minLength") || s.contains("maxLength")) return typed(s, "string", where, depth);
    return "value";
  }

  std::string ref(const json& r, const std::string& where, int depth) {
    if (!r.is_string()) fail("json_schema: '$ref' (at ", where, ") must be a string");
    const std::string path = r.get<std::string>();
    const auto known = refs_.find(path);
    if (known != refs_.end()) return known->second;
    std::string key;
    for (const char* prefix : {"#/$defs/", "#/definitions/"})
      if (path.rfind(prefix, 0) == 0) key = std::string(prefix).substr(2, std::string(prefix).size() - 3);
    if (key.empty() || !root_.is_object() || !root_.contains(key))
      unsupported("the reference '" + path + "' (only #/$defs/NAME and #/definitions/NAME)", where);
    const std::string name = path.substr(key.size() + 3);
    const json& defs = root_[key];
    if (!defs.is_object() || !defs.contains(name))
      fail("json_schema: '$ref' (at ", where, ") names '", path, "', which is not defined");
    const std::string rule = reserve();
    refs_[path] = rule;  // before compiling: a recursive schema refers to the rule by name
    define(rule, compile(defs[name], path, depth + 1));
    return rule;
  }

  std::string typed(const json& s, const std::string& type, const std::string& where, int depth) {
    if (type == "string") {
      if (!s.contains("minLength") && !s.contains("maxLength")) return "string";
      const int64_t lo = s.contains("minLength") ? count(s, "minLength", where) : 0;
      std::string rep = "{" + std::to_string(lo) + ",";
      if (s.contains("maxLength")) {
        const int64_t hi = count(s, "maxLength", where);
        if (hi < lo) fail("json_schema: maxLength < minLength (at ", where, "): nothing validates");
        rep += std::to_string(hi);
      }
      return add_rule("\"\\\"\" char" + rep + "} \"\\\"\"");
    }
    if (type == "integer") return "integer";
    if (type == "number") return "number";
    if (type == "boolean") return "boolean";
    if (type == "null") return "null";
    if (type == "array") return array(s, where, depth);
    if (type == "object") return object(s, where, depth);
    fail("json_schema: unknown type '", type, "' (at ", where, ")");
  }

  std::string array(const json& s, const std::string& where, int depth) {
    const std::string item = s.contains("items") ? compile(s["items"], where + "/items", depth + 1) : "value";
    const int64_t lo = s.contains("minItems") ? count(s, "minItems", where) : 0;
    const bool bounded = s.contains("maxItems");
    const int64_t hi = bounded ? count(s, "maxItems", where) : 0;
    if (bounded && hi < lo) fail("json_schema: maxItems < minItems (at ", where, "): nothing validates");
    if (bounded && hi == 0) return add_rule("\"[\" ws \"]\"");
    const std::string rest = "( \",\" ws " + item + " ws ){" + std::to_string(std::max<int64_t>(lo - 1, 0)) + "," +
                             (bounded ? std::to_string(hi - 1) : "") + "}";
    const std::string body = item + " ws " + rest;
    return add_rule("\"[\" ws " + (lo == 0 ? "( " + body + " )?" : body) + " \"]\"");
  }

  std::string object(const json& s, const std::string& where, int depth) {
    const json props = s.contains("properties") ? s["properties"] : json::object();
    if (!props.is_object()) fail("json_schema: 'properties' (at ", where, ") must be an object");
    std::set<std::string> required;
    if (s.contains("required")) {
      if (!s["required"].is_array()) fail("json_schema: 'required' (at ", where, ") must be an array of names");
      for (const json& n : s["required"]) {
        if (!n.is_string()) fail("json_schema: 'required' (at ", where, ") lists a non-string: ", n.dump());
        if (!props.contains(n.get<std::string>()))
          unsupported("the required property '" + n.get<std::string>() + "', absent from 'properties',", where);
        required.insert(n.get<std::string>());
      }
    }
    const json extra = s.contains("additionalProperties") ? s["additionalProperties"] : json(true);
    if (props.empty()) {
      if (extra.is_boolean() && !extra.get<bool>()) return add_rule("\"{\" ws \"}\"");
      if (extra.is_boolean()) return "object";
      const std::string v = compile(extra, where + "/additionalProperties", depth + 1);
      const std::string kv = "string ws \":\" ws " + v + " ws";
      return add_rule("\"{\" ws ( " + kv + " ( \",\" ws " + kv + " )* )? \"}\"");
    }
    if (!extra.is_boolean()) compile(extra, where + "/additionalProperties", depth + 1);  // checked, never generated
    // rest(k, first): the properties from k on; `first`: none written yet, so no comma before the next one.
    std::vector<std::string> kv;
    std::vector<bool> req;
    for (const auto& [name, sub] : props.items()) {
      kv.push_back(literal(json(name).dump()) + " ws \":\" ws " +
                   compile(sub, where + "/properties/" + name, depth + 1) + " ws");
      req.push_back(required.count(name) > 0);
    }
    const size_t n = kv.size();
    std::vector<std::string> rest_first(n + 1), rest_later(n + 1);
    rest_first[n] = rest_later[n] = "\"\"";
    for (size_t k = n; k-- > 0;) {
      for (bool first : {true, false}) {
        const std::string take = (first ? "" : "\",\" ws ") + kv[k] + " " + rest_later[k + 1];
        const std::string skip = first ? rest_first[k + 1] : rest_later[k + 1];
        (first ? rest_first : rest_later)[k] = add_rule(req[k] ? take : "( " + take + " ) | " + skip);
      }
    }
    return add_rule("\"{\" ws " + rest_first[0] + " \"}\"");
  }

  const json& root_;
  std::vector<std::string> rules_;
  size_t next_rule_ = 0;
  std::map<std::string, std::string> refs_;
};

}  // namespace

void check_grammar(std::string_view gbnf) { Grammar::parse(gbnf); }

std::string json_object_grammar() { return std::string("root ::= object\n") + kJsonBase; }

std::string json_schema_to_grammar(std::string_view schema_json) {
  const json schema = json::parse(schema_json, nullptr, /*allow_exceptions=*/false);
  if (schema.is_discarded()) fail("json_schema: the schema is not valid JSON");
  std::string g = SchemaCompiler(schema).run();
  Grammar::parse(g);  // a compiler bug shows here, not in the middle of a generation
  return g;
}

}  // namespace mambacpp
