// The chat template interpreter (src/chat) feature by feature. Each case's expected output is what Jinja2 3.1.6
// renders with the environment transformers' apply_chat_template builds (ImmutableSandboxedEnvironment,
// trim_blocks + lstrip_blocks, loopcontrols, transformers' tojson, raise_exception, {% generation %}): the
// expectations were produced by that renderer and are kept here as literals so that each can be read.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "mambacpp/chat.h"
#include "mambacpp/error.h"

namespace {

using mambacpp::chat::Template;
using json = nlohmann::ordered_json;

struct Case {
  const char* name;
  const char* source;
  const char* variables;
  const char* expected;
};

const Case kCases[] = {
    {"trim_lstrip_blocks",
     R"j(  {% if true %}
  a
  {% endif %}
b
)j",
     R"j({})j",
     R"j(  a
b)j"},
    {"minus_strips",
     R"j(a  {%- if true -%}  
 b {{- ' c ' -}} 
 d{% endif %})j",
     R"j({})j",
     R"j(ab c d)j"},
    {"plus_disables_lstrip",
     R"j(x
  {%+ if true %}y{% endif %})j",
     R"j({})j",
     R"j(x
  y)j"},
    {"comment_trim",
     R"j(a
  {# note #}
b)j",
     R"j({})j",
     R"j(a
b)j"},
    {"trailing_newline_dropped",
     R"j(a
)j",
     R"j({})j",
     R"j(a)j"},
    {"only_one_trailing_newline",
     R"j(a

)j",
     R"j({})j",
     R"j(a
)j"},
    {"variable_tags_do_not_trim",
     R"j({{ 'a' }}
  {{ 'b' }}
)j",
     R"j({})j",
     R"j(a
  b)j"},
    {"raw",
     R"j({% raw %}{{ x }}{% endraw %})j",
     R"j({})j",
     R"j({{ x }})j"},
    {"for_scoping",
     R"j({% set x = 1 %}{% for i in [1,2,3] %}{% set x = x + i %}{{ x }},{% endfor %}{{ x }})j",
     R"j({})j",
     R"j(2,3,4,1)j"},
    {"namespace_in_loop",
     R"j({% set ns = namespace(n=0) %}{% for i in range(4) %}{% set ns.n = ns.n + i %}{% endfor %}{{ ns.n }})j",
     R"j({})j",
     R"j(6)j"},
    {"namespace_in_macro",
     R"j({% set ns = namespace(seen=false) %}{% macro mark() %}{% set ns.seen = true %}{% endmacro %}{{ mark() }}{{ ns.seen }})j",
     R"j({})j",
     R"j(True)j"},
    {"break_continue",
     R"j({% for i in range(10) %}{% if i == 2 %}{% continue %}{% endif %}{% if i == 5 %}{% break %}{% endif %}{{ i }}{% endfor %})j",
     R"j({})j",
     R"j(0134)j"},
    {"loop_filter",
     R"j({% for m in messages if m.role != 'system' %}{{ loop.index }}{{ m.role }}{{ loop.last }};{% endfor %})j",
     R"j({"messages": [{"role": "system"}, {"role": "user"}, {"role": "assistant"}]})j",
     R"j(1userFalse;2assistantTrue;)j"},
    {"loop_vars",
     R"j({% for x in 'abc' %}{{ loop.index0 }}{{ loop.revindex }}{{ loop.first }}{{ loop.previtem }}{{ loop.nextitem }}{{ loop.length }}|{% endfor %})j",
     R"j({})j",
     R"j(03Trueb3|12Falseac3|21Falseb3|)j"},
    {"loop_else",
     R"j({% for x in [] %}{{ x }}{% else %}empty{% endfor %})j",
     R"j({})j",
     R"j(empty)j"},
    {"loop_cycle",
     R"j({% for x in range(3) %}{{ loop.cycle('a','b') }}{% endfor %})j",
     R"j({})j",
     R"j(aba)j"},
    {"macro_defaults_kwargs",
     R"j({% macro m(a, b=2, c='x') %}{{ a }}-{{ b }}-{{ c }}{% endmacro %}{{ m(1) }} {{ m(1, c=3) }} {{ m(b=5, a=4) }})j",
     R"j({})j",
     R"j(1-2-x 1-2-3 4-5-x)j"},
    {"macro_varargs_kwargs",
     R"j({% macro m(a) %}{{ a }}{{ varargs }}{{ kwargs }}{% endmacro %}{{ m(1, 3, 4, z=5) }})j",
     R"j({})j",
     R"j(1(3, 4){'z': 5})j"},
    {"macro_through_variable",
     R"j({% macro m(x) %}<{{ x }}>{% endmacro %}{% set f = m %}{{ f('y') }})j",
     R"j({})j",
     R"j(<y>)j"},
    {"macro_star_args",
     R"j({% macro m(a, b) %}{{ a }}{{ b }}{% endmacro %}{% set xs = [1, 2] %}{{ m(*xs) }})j",
     R"j({})j",
     R"j(12)j"},
    {"macro_recursive",
     R"j({% macro r(n) %}{{ n }}{% if n > 0 %}{{ r(n - 1) }}{% endif %}{% endmacro %}{{ r(3) }})j",
     R"j({})j",
     R"j(3210)j"},
    {"slices",
     R"j({{ [1,2,3,4][::-1] }} {{ 'hello'[1:3] }} {{ [1,2,3][-2:] }} {{ 'abc'[::-1] }} {{ [1,2,3,4,5][::2] }} {{ 'héllo'[::-1] }})j",
     R"j({})j",
     R"j([4, 3, 2, 1] el [2, 3] cba [1, 3, 5] olléh)j"},
    {"tests",
     R"j({{ x is defined }}{{ y is defined }}{{ none is none }}{{ 's' is string }}{{ {} is mapping }}{{ [] is iterable }}{{ 's' is sequence }}{{ false is false }}{{ 3 is equalto 3 }}{{ 1 is string }}{{ x is not none }})j",
     R"j({"x": 1})j",
     R"j(TrueFalseTrueTrueTrueTrueTrueTrueTrueFalseTrue)j"},
    {"tests_more",
     R"j({{ 4 is divisibleby 2 }}{{ 3 is odd }}{{ 2 is even }}{{ 1.5 is number }}{{ 1 is integer }}{{ true is boolean }}{{ 'a' is in 'abc' }}{{ 'ab' is lower }})j",
     R"j({})j",
     R"j(TrueTrueTrueTrueTrueTrueTrueTrue)j"},
    {"tojson",
     R"j({{ x | tojson }}|{{ x | tojson(indent=2) }}|{{ 'é"<>&' | tojson }}|{{ [1.5, none, true] | tojson }}|{{ {} | tojson }}{{ [] | tojson(indent=4) }})j",
     R"j({"x": {"b": 1, "a": [1, {"c": "ü"}], "e": {}}})j",
     R"j({"b": 1, "a": [1, {"c": "ü"}], "e": {}}|{
  "b": 1,
  "a": [
    1,
    {
      "c": "ü"
    }
  ],
  "e": {}
}|"é\"<>&"|[1.5, null, true]|{}[])j"},
    {"string_filter",
     R"j({{ true | string }} {{ none | string }} {{ {'a': 1} | string }} {{ [1, 'x'] | string }} {{ 1.0 | string }} {{ "it's" | string }} {{ ["it's"] }})j",
     R"j({})j",
     R"j(True None {'a': 1} [1, 'x'] 1.0 it's ["it's"])j"},
    {"items_filter",
     R"j({% for k, v in d | items %}{{ k }}={{ v }};{% endfor %}{% for k, v in d.items() %}{{ k }}:{{ v }};{% endfor %})j",
     R"j({"d": {"z": 1, "a": 2}})j",
     R"j(z=1;a=2;z:1;a:2;)j"},
    {"selectattr_map",
     R"j({{ xs | selectattr('role', 'equalto', 'user') | map(attribute='content') | join(', ') }}|{{ xs | map(attribute='role') | list }}|{{ xs | rejectattr('role', 'eq', 'user') | list | length }})j",
     R"j({"xs": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}, {"role": "user", "content": "c"}]})j",
     R"j(a, c|['user', 'assistant', 'user']|1)j"},
    {"default_filter",
     R"j({{ x | default('d') }} {{ '' | default('d') }} {{ '' | default('d', true) }} {{ none | default('d', true) }} {{ 0 | d('z', true) }})j",
     R"j({})j",
     R"j(d  d d z)j"},
    {"text_filters",
     R"j({{ '  a b  ' | trim }}|{{ 'hello world-x' | title }}|{{ 'AbC' | lower }}|{{ 'abc' | upper }}|{{ 'xxaxx' | trim('x') }}|{{ 'abc' | capitalize }})j",
     R"j({})j",
     R"j(a b|Hello World-X|abc|ABC|a|Abc)j"},
    {"seq_filters",
     R"j({{ [3,1,2] | length }} {{ 'héllo' | length }} {{ [1,2,3] | first }} {{ [1,2,3] | last }} {{ 'abc' | list }} {{ '42' | int + 1 }} {{ 'x' | int }} {{ 3.9 | int }} {{ [1,2] | join }} {{ [3,1,2] | sort }} {{ [1,2] | reverse | list }} {{ [1,2,2,1] | unique | list }})j",
     R"j({})j",
     R"j(3 5 1 3 ['a', 'b', 'c'] 43 0 3 12 [1, 2, 3] [2, 1] [1, 2])j"},
    {"string_methods",
     R"j({{ '  x  '.strip() }}|{{ 'xxhixx'.strip('x') }}|{{ '  x'.lstrip() }}|{{ 'x  '.rstrip() }}|{{ 'a,b,,c'.split(',') }}|{{ ' a  b '.split() }}|{{ 'a b c'.split(' ', 1) }}|{{ 'aXbX'.replace('X', '-') }}|{{ 'abc'.startswith('ab') }}{{ 'abc'.endswith('bc') }}{{ 'abc'.startswith(('x', 'a')) }}|{{ 'Hello World'.lower() }}{{ 'hello'.upper() }}{{ 'hello wORLD'.title() }})j",
     R"j({})j",
     R"j(x|hi|x|x|['a', 'b', '', 'c']|['a', 'b']|['a', 'b c']|a-b-|TrueTrueTrue|hello worldHELLOHello World)j"},
    {"dict_methods",
     R"j({{ d.get('a') }} {{ d.get('z') }} {{ d.get('z', 7) }} {{ d.keys() | list }} {{ d.values() | list }} {{ d['a'] }} {{ d.a }})j",
     R"j({"d": {"a": 1, "b": 2}})j",
     R"j(1 None 7 ['a', 'b'] [1, 2] 1 1)j"},
    {"globals",
     R"j({{ range(3) | list }} {{ range(1, 7, 2) | list }} {{ range(5, 0, -2) | list }})j",
     R"j({})j",
     R"j([0, 1, 2] [1, 3, 5] [5, 3, 1])j"},
    {"undefined_print",
     R"j([{{ nothing }}][{{ d.missing }}][{{ d.missing is defined }}])j",
     R"j({"d": {}})j",
     R"j([][][False])j"},
    {"operators",
     R"j({{ 7 // 2 }} {{ -7 // 2 }} {{ 7 % 3 }} {{ -7 % 3 }} {{ 7 / 2 }} {{ 2 ** 10 }} {{ 'a' ~ 1 ~ none }} {{ 'ab' * 3 }} {{ [1] + [2] }} {{ 1 + 2 * 3 }} {{ (1 + 2) * 3 }} {{ 1 < 2 < 3 }} {{ 1 < 3 < 2 }} {{ 'b' in ['a','b'] }} {{ 'x' not in 'abc' }} {{ 'k' in {'k': 1} }} {{ not true or true }} {{ 0.1 + 0.2 }})j",
     R"j({})j",
     R"j(3 -4 1 2 3.5 1024 a1None ababab [1, 2] 7 9 True False True True True True 0.30000000000000004)j"},
    {"conditional_expr",
     R"j({{ 'a' if x else 'b' }}{{ 'c' if not x else 'd' }}[{{ 'e' if false }}])j",
     R"j({"x": true})j",
     R"j(ad[])j"},
    {"literals",
     R"j({{ [1, 'two', 3.0, none, true, {'k': [1]}] }} {{ {'a': 1}.a }} {{ 'a' 'b' }} {{ "q\n\t" | tojson }} {{ (1,) }} {{ () }})j",
     R"j({})j",
     R"j([1, 'two', 3.0, None, True, {'k': [1]}] 1 ab "q\n\t" (1,) ())j"},
    {"set_multiple",
     R"j({% set a, b = 1, 2 %}{{ a }}{{ b }}{% set c = [3, 4] %}{% set d, e = c %}{{ d }}{{ e }})j",
     R"j({})j",
     R"j(1234)j"},
    {"set_block",
     R"j({% set x %}hello {{ 'world' }}{% endset %}[{{ x }}])j",
     R"j({})j",
     R"j([hello world])j"},
    {"filter_block",
     R"j({% filter upper %}abc {{ 'd' }}{% endfilter %})j",
     R"j({})j",
     R"j(ABC D)j"},
    {"call_block",
     R"j({% macro wrap(tag) %}<{{ tag }}>{{ caller() }}</{{ tag }}>{% endmacro %}{% call wrap('b') %}bold{% endcall %})j",
     R"j({})j",
     R"j(<b>bold</b>)j"},
    {"generation_block",
     R"j({% for m in messages %}{% generation %}{{ m.content }}{% endgeneration %}{% endfor %})j",
     R"j({"messages": [{"content": "x"}, {"content": "y"}]})j",
     R"j(xy)j"},
    {"whitespace_mixed",
     R"j({%- for m in messages -%}
    {{- m.role }}
    {%- if m.content %}: {{ m.content | trim }}{% endif %}

{% endfor -%}
end)j",
     R"j({"messages": [{"role": "user", "content": " hi "}, {"role": "assistant", "content": ""}]})j",
     R"j(user: hi
assistant
end)j"},
    {"nested_loops_loop_var",
     R"j({% for a in [1,2] %}{% for b in [3,4] %}{{ loop.index }}{% endfor %}{{ loop.index }}{% endfor %})j",
     R"j({})j",
     R"j(121122)j"},
    {"content_parts",
     R"j({% for m in messages %}{% if m.content is string %}{{ m.content }}{% else %}{% for p in m.content if p.type == 'text' %}{{ p.text }}{% endfor %}{% endif %}{% endfor %})j",
     R"j({"messages": [{"content": "a"}, {"content": [{"type": "text", "text": "b"}, {"type": "image"}, {"type": "text", "text": "c"}]}]})j",
     R"j(abc)j"},
    {"float_repr",
     R"j({{ 1e-5 }} {{ 123456789012345678.0 }} {{ 1.5e16 }} {{ 0.0001 }} {{ 2.5 }} {{ 100.0 }} {{ 1/3 }})j",
     R"j({})j",
     R"j(1e-05 1.2345678901234568e+17 1.5e+16 0.0001 2.5 100.0 0.3333333333333333)j"},
    {"indent_filter",
     R"j({{ 'a
b

c' | indent(2) }}|{{ 'a
b' | indent(2, true) }})j",
     R"j({})j",
     R"j(a
  b

  c|  a
  b)j"},
    {"format",
     R"j({{ '%s-%d' | format('a', 3) }} {{ '%s and %s' % ('x', 'y') }} {{ '%05.1f' % 3.14159 }})j",
     R"j({})j",
     R"j(a-3 x and y 003.1)j"},
    {"json_unicode",
     R"j({{ s | tojson }})j",
     R"j({"s": "日本 \u0001"})j",
     R"j("日本 \u0001")j"},
    {"dictsort_min_max_sum",
     R"j({{ d | dictsort }} {{ [3,1,2] | min }} {{ [3,1,2] | max }} {{ [1,2,3] | sum }} {{ xs | sum(attribute='n') }})j",
     R"j({"d": {"b": 1, "A": 2}, "xs": [{"n": 1}, {"n": 5}]})j",
     R"j([('A', 2), ('b', 1)] 1 3 6 6)j"},
    {"test_none_chain",
     R"j({% if tools is not none and tools | length > 0 %}T{% else %}N{% endif %})j",
     R"j({"tools": null})j",
     R"j(N)j"},
    {"is_test_with_and",
     R"j({{ x is defined and x }})j",
     R"j({"x": 0})j",
     R"j(0)j"},
    {"string_concat_plus",
     R"j({{ 'a' + 'b' }}{{ messages[0]['content'] + '!' }})j",
     R"j({"messages": [{"content": "hi"}]})j",
     R"j(abhi!)j"},
    {"index_out_of_range",
     R"j([{{ xs[5] }}][{{ xs[-1] }}])j",
     R"j({"xs": [1, 2]})j",
     R"j([][2])j"},
    {"attr_on_none",
     R"j([{{ x.y }}])j",
     R"j({"x": null})j",
     R"j([])j"},
};

std::string render(const std::string& source, const json& vars = json::object(),
                   const mambacpp::chat::RenderLimits& limits = {}) {
  return Template(source).render(vars, limits);
}

std::string error_of(const std::string& source, const json& vars = json::object(),
                     const mambacpp::chat::RenderLimits& limits = {}) {
  try {
    render(source, vars, limits);
  } catch (const mambacpp::Error& e) {
    return e.what();
  }
  return "(no error)";
}

TEST(ChatTemplate, RendersAsJinjaWithTransformersSettings) {
  for (const Case& c : kCases) {
    SCOPED_TRACE(c.name);
    EXPECT_EQ(render(c.source, json::parse(c.variables)), c.expected);
  }
}

TEST(ChatTemplate, RaiseExceptionCarriesTheTemplatesMessageAndPosition) {
  const std::string e = error_of("line one\n{{ raise_exception('roles must alternate') }}");
  EXPECT_NE(e.find("roles must alternate"), std::string::npos) << e;
  EXPECT_NE(e.find("line 2, column 4"), std::string::npos) << e;
}

TEST(ChatTemplate, SyntaxErrorsNameLineAndColumn) {
  EXPECT_NE(error_of("a\n{% if x %}b").find("line 2"), std::string::npos);
  EXPECT_NE(error_of("a\n{% if x %}b").find("endif"), std::string::npos);
  EXPECT_NE(error_of("{{ 1 + }}").find("line 1, column 8: expected an expression"), std::string::npos)
      << error_of("{{ 1 + }}");
  EXPECT_NE(error_of("ab\n{{ 1 +").find("line 2, column 1: a {{ opened here is never closed"), std::string::npos);
  EXPECT_NE(error_of("x\n  {% foo %}").find("line 2, column 6: unsupported tag 'foo'"), std::string::npos)
      << error_of("x\n  {% foo %}");
  EXPECT_NE(error_of("{{ 'abc }}").find("never closed"), std::string::npos);
  EXPECT_NE(error_of("{% break %}").find("outside of a for loop"), std::string::npos);
  EXPECT_NE(error_of("{# open").find("comment"), std::string::npos);
}

TEST(ChatTemplate, RuntimeErrorsNameLineAndColumn) {
  EXPECT_NE(error_of("\n\n  {{ x.y }}").find("line 3, column 7: 'x' is undefined"), std::string::npos)
      << error_of("\n\n  {{ x.y }}");
  EXPECT_NE(error_of("{{ 1 + 'a' }}").find("unsupported operand"), std::string::npos);
  EXPECT_NE(error_of("{{ x | nosuchfilter }}").find("unknown filter 'nosuchfilter'"), std::string::npos);
  EXPECT_NE(error_of("{{ 1 // 0 }}").find("by zero"), std::string::npos);
  EXPECT_NE(error_of("{% set x = 1 %}{% set x.a = 2 %}").find("not a namespace"), std::string::npos);
  EXPECT_NE(error_of("{{ 9223372036854775807 + 1 }}").find("overflow"), std::string::npos);
}

TEST(ChatTemplate, LimitsBoundWorkOutputAndDepth) {
  mambacpp::chat::RenderLimits small;
  small.max_work = 1000;
  small.max_output_bytes = 1 << 16;
  small.max_call_depth = 16;
  EXPECT_NE(error_of("{% for i in range(100) %}{% for j in range(100) %}{% endfor %}{% endfor %}", json::object(), small)
                .find("limit"),
            std::string::npos);
  EXPECT_NE(error_of("{{ range(100000000000) | length }}", json::object(), small).find("limit"), std::string::npos);
  EXPECT_NE(error_of("{{ 'x' * 1000000 }}", json::object(), small).find("limit"), std::string::npos);
  EXPECT_NE(error_of("{% for i in range(500) %}{{ 'abcdefghijklmnopqrstuvwxyz' * 10 }}{% endfor %}", json::object(), small)
                .find("limit"),
            std::string::npos);
  EXPECT_NE(error_of("{% macro r() %}{{ r() }}{% endmacro %}{{ r() }}", json::object(), small).find("deeper than 16"),
            std::string::npos);
  // Nesting in the source is bounded by the parser, before anything runs.
  EXPECT_NE(error_of("{{ " + std::string(5000, '(') + "1" + std::string(5000, ')') + " }}").find("nesting deeper"), std::string::npos);
  std::string ifs;
  for (int k = 0; k < 1000; ++k) ifs += "{% if true %}";
  EXPECT_NE(error_of(ifs).find("nesting deeper"), std::string::npos);
}

TEST(ChatTemplate, NamespaceCyclesAndMacrosInNamespacesAreReleased) {
  // Under ASan/LSan a leak here is a failure; the rendering itself must work.
  EXPECT_EQ(render("{% macro m() %}m{% endmacro %}{% set ns = namespace(f=m) %}{% set ns.self = ns %}{{ ns.f() }}"),
            "m");
}

TEST(ChatTemplate, TemplateVariablesFollowTransformers) {
  mambacpp::chat::Conversation c;
  c.messages = json::array({{{"role", "user"}, {"content", "hi"}}});
  c.extra = {{"enable_thinking", false}};
  const json specials = {{"bos_token", nullptr}, {"eos_token", "</s>"}};
  const std::string t =
      "{{ bos_token is none }}|{{ eos_token }}|{{ tools is none }}|{{ add_generation_prompt }}|{{ enable_thinking }}|"
      "{{ messages[0].content }}";
  EXPECT_EQ(mambacpp::chat::apply_chat_template(Template(t), c, specials), "True|</s>|True|True|False|hi");
}

class ChatTemplateFilesTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           ("mambacpp_chat_files_" + std::to_string(::testing::UnitTest::GetInstance()->random_seed()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  void write(const std::string& name, const std::string& text) { std::ofstream(dir_ / name) << text; }
  std::filesystem::path dir_;
};

TEST_F(ChatTemplateFilesTest, StringTemplateAndSpecialTokens) {
  write("tokenizer_config.json",
        R"({"bos_token": {"content": "<s>", "lstrip": false}, "eos_token": "</s>", "pad_token": null,
            "chat_template": "{{ bos_token }}{{ messages[0].content }}"})");
  const auto files = mambacpp::chat::load_chat_template(dir_.string());
  ASSERT_TRUE(files.has_value());
  EXPECT_EQ(files->source, "{{ bos_token }}{{ messages[0].content }}");
  EXPECT_EQ(files->special_tokens["bos_token"], "<s>");
  EXPECT_EQ(files->special_tokens["eos_token"], "</s>");
  EXPECT_TRUE(files->special_tokens["pad_token"].is_null());
}

TEST_F(ChatTemplateFilesTest, NamedTemplatesPickDefaultOrTheNamedOne) {
  write("tokenizer_config.json",
        R"({"chat_template": [{"name": "tool_use", "template": "T"}, {"name": "default", "template": "D"}]})");
  EXPECT_EQ(mambacpp::chat::load_chat_template(dir_.string())->source, "D");
  EXPECT_EQ(mambacpp::chat::load_chat_template(dir_.string(), "tool_use")->source, "T");
  try {
    mambacpp::chat::load_chat_template(dir_.string(), "rag");
    FAIL() << "expected an error";
  } catch (const mambacpp::Error& e) {
    EXPECT_NE(std::string(e.what()).find("no template named 'rag' (it has: tool_use, default)"), std::string::npos)
        << e.what();
  }
}

TEST_F(ChatTemplateFilesTest, JinjaFileWinsAndNoTemplateIsNullopt) {
  EXPECT_FALSE(mambacpp::chat::load_chat_template(dir_.string()).has_value());
  write("tokenizer_config.json", R"({"eos_token": "<|end|>", "chat_template": "old"})");
  write("chat_template.jinja", "new {{ eos_token }}\n");
  const auto files = mambacpp::chat::load_chat_template(dir_.string());
  ASSERT_TRUE(files.has_value());
  EXPECT_EQ(files->source, "new {{ eos_token }}\n");
  EXPECT_EQ(Template(files->source).render(files->special_tokens), "new <|end|>");
}

TEST_F(ChatTemplateFilesTest, MalformedConfigIsAnError) {
  write("tokenizer_config.json", R"({"chat_template": 5})");
  EXPECT_THROW(mambacpp::chat::load_chat_template(dir_.string()), mambacpp::Error);
  write("tokenizer_config.json", "not json");
  EXPECT_THROW(mambacpp::chat::load_chat_template(dir_.string()), mambacpp::Error);
}

}  // namespace
