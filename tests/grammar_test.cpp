// The GBNF grammar engine (src/engine/grammar.h), the vocabulary masks (grammar_mask.h), the JSON-schema compiler
// (mambacpp/grammar.h) and constrained generation on the engine with the shipped model.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <fstream>
#include <random>
#include <string>

#include "engine/grammar.h"
#include "engine/grammar_mask.h"
#include "mambacpp/engine.h"
#include "mambacpp/error.h"
#include "mambacpp/grammar.h"
#include "mambacpp/model.h"
#include "mambacpp/tokenizer.h"
#include "support/engine_support.h"
#include "support/test_support.h"

namespace mambacpp {
namespace {

using nlohmann::json;

bool matches(const std::string& gbnf, const std::string& text) {
  GrammarMatcher m(Grammar::parse(gbnf));
  return m.accept(text) && m.accepting();
}
bool is_prefix(const std::string& gbnf, const std::string& text) {
  GrammarMatcher m(Grammar::parse(gbnf));
  return m.accept(text);
}
std::string parse_error(const std::string& gbnf) {
  try {
    Grammar::parse(gbnf);
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

TEST(Grammar, ParseErrorsNameLineAndColumn) {
  EXPECT_EQ(parse_error("root ::= \"a\"\nitem ::= [a-"), "grammar line 2, column 10: this character class is never closed");
  EXPECT_EQ(parse_error("root ::= \"a\" ( \"b\""), "grammar line 1, column 14: this '(' is never closed");
  EXPECT_EQ(parse_error("root ::= \"a\\q\""), "grammar line 1, column 12: unknown escape '\\q'");
  EXPECT_EQ(parse_error("root ::= x\n"), "grammar line 1, column 10: the rule 'x' is used but never defined");
  EXPECT_EQ(parse_error("root ::= \"a\"\nroot ::= \"b\""), "grammar line 2, column 1: the rule 'root' is defined twice");
  EXPECT_EQ(parse_error("root ::= \"a\"{3,1}"), "grammar line 1, column 10: a repetition {m,n} with n < m");
  EXPECT_EQ(parse_error("root ::= * \"a\""), "grammar line 1, column 10: '*' repeats nothing");
  EXPECT_EQ(parse_error("root \"a\""), "grammar line 1, column 6: expected '::=' after the rule name 'root'");
  EXPECT_EQ(parse_error("item ::= \"a\""), "grammar: no rule named 'root' (where the text starts)");
  EXPECT_EQ(parse_error(""), "grammar line 1, column 1: the grammar is empty; expected rules such as 'root ::= \"yes\" | \"no\"'");
  EXPECT_NE(parse_error("root ::= list\nlist ::= list \",\" \"a\" | \"a\"").find("the rule 'list' is left-recursive"),
            std::string::npos);
  EXPECT_NE(parse_error("root ::= (\"a\"?)*").find("left-recursive"), std::string::npos);
  EXPECT_NE(parse_error("root ::= \"a\"{2000000}").find("repetition count above"), std::string::npos);
}

TEST(Grammar, AcceptsAndRejects) {
  const std::string yesno = "root ::= answer \".\"\nanswer ::= \"yes\" | \"no\"  # a comment\n";
  EXPECT_TRUE(matches(yesno, "yes."));
  EXPECT_TRUE(matches(yesno, "no."));
  EXPECT_FALSE(matches(yesno, "no"));      // a prefix, not complete
  EXPECT_TRUE(is_prefix(yesno, "no"));
  EXPECT_FALSE(is_prefix(yesno, "nope"));
  EXPECT_FALSE(matches(yesno, "yes.."));

  const std::string rep = "root ::= [a-c]{2,3} [0-9]* \"!\"+";
  EXPECT_TRUE(matches(rep, "ab!"));
  EXPECT_TRUE(matches(rep, "abc123!!"));
  EXPECT_FALSE(matches(rep, "a!"));
  EXPECT_FALSE(matches(rep, "abca!"));
  EXPECT_FALSE(matches(rep, "abc"));
  EXPECT_TRUE(matches("root ::= (\"x\" | \"yz\")? \"w\"", "w"));
  EXPECT_TRUE(matches("root ::= (\"x\" | \"yz\")? \"w\"", "yzw"));
  EXPECT_FALSE(matches("root ::= (\"x\" | \"yz\")? \"w\"", "xyzw"));
  EXPECT_TRUE(matches("root ::= \"a\"{3}", "aaa"));
  EXPECT_FALSE(matches("root ::= \"a\"{3}", "aaaa"));
  EXPECT_TRUE(matches("root ::= \"a\"{2,}", "aaaaaaa"));
  EXPECT_FALSE(matches("root ::= \"a\"{2,}", "a"));
  // Multi-line alternatives, escapes.
  EXPECT_TRUE(matches("root ::= \"\\x41\"\n  | \"\\u00e9\"\n", "\xC3\xA9"));
  EXPECT_TRUE(matches("root ::= \"\\x41\"\n  | \"\\u00e9\"\n", "A"));
  // Nested recursion (not left): balanced parentheses.
  const std::string parens = "root ::= p\np ::= \"(\" p* \")\"";
  EXPECT_TRUE(matches(parens, "(()(()))"));
  EXPECT_FALSE(matches(parens, "(()"));
  EXPECT_FALSE(is_prefix(parens, "())"));
}

TEST(Grammar, CharacterClassesAreUtf8) {
  const std::string not_a = "root ::= [^a]";
  EXPECT_TRUE(matches(not_a, "b"));
  EXPECT_FALSE(matches(not_a, "a"));
  EXPECT_TRUE(matches(not_a, "\xC3\xA9"));          // é
  EXPECT_TRUE(matches(not_a, "\xE2\x82\xAC"));      // €
  EXPECT_TRUE(matches(not_a, "\xF0\x9F\x98\x80"));  // 😀
  EXPECT_FALSE(matches(not_a, "\xED\xA0\x80"));     // a surrogate's encoding is not UTF-8
  EXPECT_FALSE(matches(not_a, "\xC3"));              // half a character
  EXPECT_TRUE(is_prefix(not_a, "\xC3"));
  EXPECT_FALSE(is_prefix(not_a, "\xC3\x41"));
  EXPECT_FALSE(is_prefix(not_a, "\xC0\x80"));        // overlong
  const std::string greek = "root ::= [α-ω]+";
  EXPECT_TRUE(matches(greek, "αβω"));
  EXPECT_FALSE(matches(greek, "αA"));
  EXPECT_TRUE(matches("root ::= .", "\xE4\xB8\xAD"));
  // Every code point of a range against a brute-force check of its encodings.
  GrammarMatcher m(Grammar::parse("root ::= [\\u0700-\\u20ff\\U0001F000-\\U0001F0FF]"));
  for (uint32_t cp : {0x6FFu, 0x700u, 0x7FFu, 0x800u, 0xFFFu, 0x1000u, 0x20FFu, 0x2100u, 0x1EFFFu, 0x1F000u, 0x1F0FFu,
                      0x1F100u}) {
    std::string s;
    if (cp < 0x800) s = {char(0xC0 | (cp >> 6)), char(0x80 | (cp & 0x3F))};
    else if (cp < 0x10000) s = {char(0xE0 | (cp >> 12)), char(0x80 | ((cp >> 6) & 0x3F)), char(0x80 | (cp & 0x3F))};
    else s = {char(0xF0 | (cp >> 18)), char(0x80 | ((cp >> 12) & 0x3F)), char(0x80 | ((cp >> 6) & 0x3F)), char(0x80 | (cp & 0x3F))};
    GrammarMatcher c = m;
    const bool in = (cp >= 0x700 && cp <= 0x20FF) || (cp >= 0x1F000 && cp <= 0x1F0FF);
    EXPECT_EQ(c.accept(s) && c.accepting(), in) << std::hex << cp;
  }
}

TEST(Grammar, AmbiguityIsBounded) {
  GrammarLimits lim;
  lim.max_stacks = 64;
  // Each "a" may or may not owe a "b" later: after n of them, n + 1 readings (as many pending "b"s).
  const auto g = Grammar::parse("root ::= x\nx ::= \"a\" x \"b\" | \"a\" x | \"c\"", lim);
  GrammarMatcher ok(g);
  EXPECT_TRUE(ok.accept(std::string(15, 'a') + "c" + std::string(10, 'b')));
  EXPECT_TRUE(ok.accepting());
  GrammarMatcher m(g);
  EXPECT_THROW(m.accept(std::string(200, 'a')), Error);
}

// ---- Token masks against brute force over the shipped vocabulary ----------------------------------------------

LoadOptions cpu_options() {
  LoadOptions o;
  o.device = DeviceChoice::CPU;
  return o;
}

const Tokenizer& shipped_tokenizer() {
  static const std::unique_ptr<Tokenizer> t = Tokenizer::load(test::source_dir() + "/models/default/tokenizer.json");
  return *t;
}

TEST(GrammarMask, EqualsBruteForceOverTheVocabulary) {
  const Tokenizer& tok = shipped_tokenizer();
  const auto trie = TokenTrie::from_tokenizer(tok, tok.vocab_size());
  const std::string schema = R"({"type":"object","properties":{"name":{"type":"string","maxLength":6},
      "n":{"type":"integer"},"tags":{"type":"array","items":{"enum":["a","b c"]},"maxItems":2}},"required":["name"]})";
  for (const std::string& gbnf : {json_object_grammar(), json_schema_to_grammar(schema)}) {
    const auto g = Grammar::parse(gbnf);
    const std::string text = gbnf == json_object_grammar() ? "{\"k\xC3\xA9y\": [1.5e3, true, null], \"x\": {}}"
                                                           : "{\"name\": \"ab\xE2\x82\xAC\", \"n\": -12, \"tags\": [\"b c\"]}";
    GrammarMatcher m(g);
    std::vector<uint8_t> allowed;
    int checked = 0;
    for (size_t cut = 0; cut <= text.size(); cut += 3) {  // several states, some inside a UTF-8 character
      GrammarMatcher at = m;
      ASSERT_TRUE(at.accept(text.substr(0, cut))) << cut;
      allowed_tokens(at, *trie, allowed);
      int n_allowed = 0;
      for (int32_t id = 0; id < tok.vocab_size(); ++id) {
        const std::string& b = trie->bytes(id);
        GrammarMatcher copy = at;
        const bool want = !b.empty() && copy.accept(b);
        ASSERT_EQ(allowed[static_cast<size_t>(id)] != 0, want) << "cut " << cut << " token " << id << " '" << b << "'";
        n_allowed += want;
      }
      EXPECT_GT(n_allowed, 0) << cut;
      ++checked;
    }
    EXPECT_GT(checked, 10);
  }
}

// ---- JSON schemas ---------------------------------------------------------------------------------------------

bool schema_accepts(const std::string& schema, const std::string& text) {
  return matches(json_schema_to_grammar(schema), text);
}
std::string schema_error(const std::string& schema) {
  try {
    json_schema_to_grammar(schema);
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

TEST(JsonSchemaGrammar, AcceptsWhatValidatesAndRejectsTheRest) {
  const std::string person = R"({"type":"object","properties":{"name":{"type":"string"},"age":{"type":"integer"},
      "email":{"type":"string"}},"required":["name","email"],"additionalProperties":false})";
  EXPECT_TRUE(schema_accepts(person, R"({"name": "Ann", "age": 31, "email": "a@b.c"})"));
  EXPECT_TRUE(schema_accepts(person, R"({"name":"Ann","email":"x"})"));
  EXPECT_TRUE(schema_accepts(person, "{\n  \"name\": \"A\\\"n\\u00e9\",\n  \"email\": \"\"\n}"));
  EXPECT_FALSE(schema_accepts(person, R"({"age": 3, "name": "Ann", "email": "x"})"));  // schema order
  EXPECT_FALSE(schema_accepts(person, R"({"name": "Ann"})"));                           // email required
  EXPECT_FALSE(schema_accepts(person, R"({"name": "Ann", "age": 3.5, "email": "x"})"));
  EXPECT_FALSE(schema_accepts(person, R"({"name": "Ann", "email": "x", "extra": 1})"));
  EXPECT_FALSE(schema_accepts(person, R"({"name": "A)" "\n" R"(", "email": "x"})"));  // raw control character

  const std::string optional_first = R"({"properties":{"a":{"type":"boolean"},"b":{"type":"null"}},"required":["b"]})";
  EXPECT_TRUE(schema_accepts(optional_first, R"({"b": null})"));
  EXPECT_TRUE(schema_accepts(optional_first, R"({"a": false, "b": null})"));
  EXPECT_FALSE(schema_accepts(optional_first, R"({, "b": null})"));
  EXPECT_FALSE(schema_accepts(optional_first, R"({})"));

  const std::string arr = R"({"type":"array","items":{"type":"number"},"minItems":1,"maxItems":3})";
  EXPECT_TRUE(schema_accepts(arr, "[1]"));
  EXPECT_TRUE(schema_accepts(arr, "[1, -2.5e-3, 0]"));
  EXPECT_FALSE(schema_accepts(arr, "[]"));
  EXPECT_FALSE(schema_accepts(arr, "[1,2,3,4]"));
  EXPECT_FALSE(schema_accepts(arr, "[01]"));

  EXPECT_TRUE(schema_accepts(R"({"enum":["red",1,null,{"a":[true]}]})", R"({"a":[true]})"));
  EXPECT_FALSE(schema_accepts(R"({"enum":["red",1]})", R"("blue")"));
  EXPECT_TRUE(schema_accepts(R"({"const":"x\"y"})", R"("x\"y")"));
  EXPECT_TRUE(schema_accepts(R"({"type":["string","null"]})", "null"));
  EXPECT_TRUE(schema_accepts(R"({"anyOf":[{"type":"integer"},{"type":"boolean"}]})", "true"));
  EXPECT_FALSE(schema_accepts(R"({"anyOf":[{"type":"integer"},{"type":"boolean"}]})", "\"1\""));
  EXPECT_TRUE(schema_accepts(R"({"type":"string","minLength":2,"maxLength":3})", R"("a\nb")"));
  EXPECT_FALSE(schema_accepts(R"({"type":"string","minLength":2,"maxLength":3})", R"("abcd")"));
  EXPECT_TRUE(schema_accepts(R"({"type":"object","additionalProperties":{"type":"integer"}})", R"({"x": 1, "y": 2})"));
  EXPECT_FALSE(schema_accepts(R"({"type":"object","additionalProperties":{"type":"integer"}})", R"({"x": "1"})"));
  EXPECT_TRUE(schema_accepts("{}", R"([{"any": "thing"}, 1])"));
  // Pydantic's shape: $defs and $ref (recursive here), titles, anyOf with null.
  const std::string tree = R"({"$defs":{"Node":{"title":"Node","type":"object","properties":{
      "v":{"type":"integer"},"kids":{"type":"array","items":{"$ref":"#/$defs/Node"}},
      "note":{"anyOf":[{"type":"string"},{"type":"null"}],"default":null}},"required":["v","kids"]}},
      "$ref":"#/$defs/Node"})";
  EXPECT_TRUE(schema_accepts(tree, R"({"v": 1, "kids": [{"v": 2, "kids": []}], "note": null})"));
  EXPECT_FALSE(schema_accepts(tree, R"({"v": 1, "kids": [{"v": 2}]})"));
}

TEST(JsonSchemaGrammar, UnsupportedFeaturesAreNamed) {
  EXPECT_EQ(schema_error(R"({"type":"string","pattern":"^a+$"})"),
            "json_schema: the keyword 'pattern' (at #) is not supported");
  EXPECT_EQ(schema_error(R"({"properties":{"n":{"type":"integer","minimum":3}}})"),
            "json_schema: the keyword 'minimum' (at #/properties/n) is not supported");
  EXPECT_EQ(schema_error(R"({"allOf":[{"type":"integer"},{"type":"number"}]})"),
            "json_schema: 'allOf' with more than one schema (at #) is not supported");
  EXPECT_EQ(schema_error(R"({"$ref":"https://example.com/s.json"})"),
            "json_schema: the reference 'https://example.com/s.json' (only #/$defs/NAME and #/definitions/NAME) (at "
            "#) is not supported");
  EXPECT_EQ(schema_error(R"({"type":"decimal"})"), "json_schema: unknown type 'decimal' (at #)");
  EXPECT_EQ(schema_error("{"), "json_schema: the schema is not valid JSON");
  EXPECT_EQ(schema_error(R"({"type":"array","minItems":3,"maxItems":2})"),
            "json_schema: maxItems < minItems (at #): nothing validates");
}

// ---- Constrained generation on the engine ----------------------------------------------------------------------

// The subset of JSON-schema validation the schema below uses.
bool validates(const json& v, const json& s) {
  if (s.contains("enum")) return std::find(s["enum"].begin(), s["enum"].end(), v) != s["enum"].end();
  const std::string t = s.value("type", "");
  if (t == "string") {
    if (!v.is_string()) return false;
    size_t cps = 0;
    for (unsigned char c : v.get<std::string>()) cps += (c & 0xC0) != 0x80;
    return cps <= s.value("maxLength", size_t{1} << 30);
  }
  if (t == "integer") return v.is_number_integer();
  if (t == "boolean") return v.is_boolean();
  if (t == "array") {
    if (!v.is_array() || v.size() > s.value("maxItems", size_t{1} << 30)) return false;
    for (const json& x : v)
      if (!validates(x, s["items"])) return false;
    return true;
  }
  if (t == "object") {
    if (!v.is_object()) return false;
    for (const auto& [k, x] : v.items())
      if (!s["properties"].contains(k) || !validates(x, s["properties"][k])) return false;
    for (const json& r : s["required"])
      if (!v.contains(r.get<std::string>())) return false;
    return true;
  }
  return false;
}

TEST(GrammarEngine, HotSamplingFollowsTheSchema) {
  const auto model = Model::load(test::source_dir() + "/models/default", cpu_options());
  const Tokenizer& tok = shipped_tokenizer();
  const json schema = json::parse(R"({"type":"object","properties":{
      "name":{"type":"string","maxLength":8},"ok":{"type":"boolean"},"n":{"type":"integer"},
      "color":{"enum":["red","green","blue"]},"tags":{"type":"array","items":{"type":"string","maxLength":4},"maxItems":3}},
      "required":["name","ok","color"],"additionalProperties":false})");
  std::vector<GenerateRequest> reqs;
  for (int i = 0; i < 60; ++i) {
    GenerateRequest r;
    r.prompt = tok.encode(i % 2 ? "The answer in JSON:" : "def f(x):");
    r.max_new_tokens = 400;
    r.sampling.temperature = 1.5f;
    r.sampling.top_k = 0, r.sampling.top_p = 1.0f, r.sampling.min_p = 0.0f;
    r.sampling.seed = 1000 + static_cast<uint64_t>(i), r.sampling.seed_given = true;
    r.grammar = json_schema_to_grammar(schema.dump());
    reqs.push_back(std::move(r));
  }
  const std::vector<GenerateResult> out = test::run_batch(*model, std::move(reqs), &tok, {}, 16);
  for (const GenerateResult& r : out) {
    ASSERT_TRUE(r.error.empty()) << r.error;
    ASSERT_EQ(r.finish_reason, FinishReason::Eos) << r.text;
    const json v = json::parse(r.text, nullptr, false);
    ASSERT_FALSE(v.is_discarded()) << r.text;
    EXPECT_TRUE(validates(v, schema)) << r.text;
  }
}

TEST(GrammarEngine, JsonObjectAndBadGrammars) {
  const auto model = Model::load(test::source_dir() + "/models/default", cpu_options());
  const Tokenizer& tok = shipped_tokenizer();
  Engine engine(*model, &tok, {.max_seqs = 4});
  GenerateRequest bad;
  bad.prompt = tok.encode("x");
  bad.grammar = "root ::= \"a\" |";
  bad.grammar += " (";
  EXPECT_THROW(engine.submit(bad), Error);
  Engine no_tokenizer(*model, nullptr, {});
  GenerateRequest r;
  r.prompt = {1, 2};
  r.grammar = json_object_grammar();
  EXPECT_THROW(no_tokenizer.submit(r), Error);
  // Greedy and with the speculative options on (constrained requests do not draft).
  r.prompt = tok.encode("Here is some JSON: ");
  r.sampling.temperature = 0.0f;
  r.max_new_tokens = 64;
  r.speculative.draft_ngram = 2;
  r.grammar = "root ::= \"{\\\"a\\\": \" [0-9] \"}\"";
  const GenerateResult g = engine.run({r}).front();
  ASSERT_TRUE(g.error.empty()) << g.error;
  EXPECT_EQ(g.finish_reason, FinishReason::Eos);
  EXPECT_TRUE(matches(r.grammar, g.text)) << g.text;
  EXPECT_EQ(g.draft_tokens, 0);
}

// A constrained row makes its step take whole rows of logits instead of device-selected candidates: the other rows
// of the batch still get the tokens they get alone (the two paths pick the same token).
TEST(GrammarEngine, UnconstrainedRowsBesideAConstrainedOneAreUnchanged) {
  const auto model = Model::load(test::source_dir() + "/models/default", cpu_options());
  const Tokenizer& tok = shipped_tokenizer();
  std::vector<GenerateRequest> reqs(3);
  for (size_t i = 0; i < reqs.size(); ++i) {
    reqs[i].prompt = tok.encode(i == 1 ? "import numpy" : "def main(");
    reqs[i].max_new_tokens = 24;
    reqs[i].ignore_eos = true;
    reqs[i].sampling.seed = 11 + i, reqs[i].sampling.seed_given = true;
  }
  reqs[0].sampling.temperature = 0.0f;
  reqs[2].grammar = "root ::= [a-z ]{30}";
  reqs[2].ignore_eos = false;
  const std::vector<GenerateResult> batch = test::run_batch(*model, reqs, &tok);
  for (size_t i = 0; i < 2; ++i) {
    const GenerateResult alone = test::run_alone(*model, reqs[i], &tok);
    EXPECT_EQ(batch[i].tokens, alone.tokens) << i;
  }
  EXPECT_TRUE(batch[2].error.empty()) << batch[2].error;
  EXPECT_TRUE(matches(reqs[2].grammar, batch[2].text)) << batch[2].text;
}

// `generate --grammar FILE` and `--json-schema` (a file or inline JSON), as llama-cli's --grammar-file/--json-schema.
TEST(GrammarCli, GrammarAndJsonSchemaFlags) {
  test::TempDir dir;
  const std::string model = " --device cpu --model " + test::source_dir() + "/models/default ";
  {
    std::ofstream(dir.file("yn.gbnf")) << "root ::= (\"yes\" | \"no\") \"!\"\n";
    const test::CliResult r = test::run_cli("generate" + model + "-p 'Is it?' -n 8 --temp 1.3 --seed 4 --json --grammar " +
                                            dir.file("yn.gbnf"));
    ASSERT_EQ(r.exit_code, 0) << r.output();
    const json out = json::parse(r.out);
    EXPECT_TRUE(out["text"] == "yes!" || out["text"] == "no!") << r.out;
    EXPECT_EQ(out["stop_reason"], "eos");
  }
  {
    std::ofstream(dir.file("s.json")) << R"({"type":"object","properties":{"ok":{"type":"boolean"}},"required":["ok"]})";
    const test::CliResult r =
        test::run_cli("generate" + model + "-p 'x' -n 200 --temp 1.0 --seed 1 --json --json-schema " + dir.file("s.json"));
    ASSERT_EQ(r.exit_code, 0) << r.output();
    const json v = json::parse(json::parse(r.out)["text"].get<std::string>());
    EXPECT_TRUE(v["ok"].is_boolean());
    const test::CliResult inline_schema =
        test::run_cli("generate" + model + "-p 'x' -n 50 --temp 0 --json --json-schema '{\"enum\": [\"a\", \"b\"]}'");
    ASSERT_EQ(inline_schema.exit_code, 0) << inline_schema.output();
    const std::string text = json::parse(inline_schema.out)["text"];
    EXPECT_TRUE(text == "\"a\"" || text == "\"b\"") << text;
  }
  std::ofstream(dir.file("bad.gbnf")) << "root ::= \"a\"\nb ::= (\n";
  const test::CliResult bad = test::run_cli("generate" + model + "-p x -n 2 --grammar " + dir.file("bad.gbnf"));
  EXPECT_NE(bad.exit_code, 0);
  EXPECT_NE(bad.output().find("grammar line 2, column 7: this '(' is never closed"), std::string::npos) << bad.output();
  const test::CliResult unsupported =
      test::run_cli("generate" + model + "-p x -n 2 --json-schema '{\"type\": \"string\", \"format\": \"date\"}'");
  EXPECT_NE(unsupported.exit_code, 0);
  EXPECT_NE(unsupported.output().find("the keyword 'format' (at #) is not supported"), std::string::npos);
}

}  // namespace
}  // namespace mambacpp
