// Jamba's published chat template (fixtures/chat/templates/ai21labs-AI21-Jamba-Mini-1.7.jinja): it renders (macros
// called through a list with *args, namespace flags set inside macros, tojson(indent=2)), and its tool-call syntax
// (<tool_calls>[{"name", "arguments"}, ...]</tool_calls>) is what the server parses back from an answer.
#include <gtest/gtest.h>

#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <string>

#include "mambacpp/chat.h"
#include "server/chat_output.h"
#include "support/test_support.h"

namespace mambacpp {
namespace {

using ojson = nlohmann::ordered_json;

std::string jamba_template() {
  std::ifstream in(test::fixture_dir() + "/chat/templates/ai21labs-AI21-Jamba-Mini-1.7.jinja", std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

TEST(JambaTemplate, RendersTurnsAsTheModelExpects) {
  const chat::Template t(jamba_template());
  chat::Conversation c;
  c.messages = ojson::parse(R"([{"role": "user", "content": "Hello, how are you?"}])");
  // Without a bos_token (the template writes it only when defined): the rendering another Jinja engine gives for
  // this template, minijinja's, recorded beside the template where it was found.
  EXPECT_EQ(chat::apply_chat_template(t, c, ojson::object()),
            "<|bom|><|system|> <|eom|><|bom|><|user|> Hello, how are you?<|eom|><|bom|><|assistant|>");
  c.messages = ojson::parse(R"([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"},
      {"role": "assistant", "content": "Hello."}, {"role": "user", "content": "Bye"}])");
  EXPECT_EQ(chat::apply_chat_template(t, c, {{"bos_token", "<|startoftext|>"}}),
            "<|startoftext|><|bom|><|system|> Be brief.<|eom|><|bom|><|user|> Hi<|eom|><|bom|><|assistant|> Hello."
            "<|eom|><|bom|><|user|> Bye<|eom|><|bom|><|assistant|>");
}

TEST(JambaTemplate, ToolsAreOfferedAndCallsParsedBack) {
  const std::string source = jamba_template();
  const chat::Template t(source);
  chat::Conversation c;
  c.messages = ojson::parse(R"([{"role": "user", "content": "Weather in Paris?"},
      {"role": "assistant", "content": "", "tool_calls": [{"id": "c1", "type": "function",
        "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]},
      {"role": "tool", "content": "{\"temp\": 21}"}])");
  c.tools = ojson::parse(R"([{"type": "function", "function": {"name": "get_weather", "description": "Weather",
      "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}])");
  const std::string prompt = chat::apply_chat_template(t, c, {{"bos_token", "<|startoftext|>"}});
  EXPECT_NE(prompt.find("<tool_definitions>\n# Tools\n\n## Functions\n\n{\n  \"name\": \"get_weather\""), std::string::npos)
      << prompt;
  EXPECT_NE(prompt.find("<tool_calls>[\n"), std::string::npos) << prompt;
  EXPECT_NE(prompt.find("{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}"), std::string::npos) << prompt;
  EXPECT_NE(prompt.find("<|bom|><|tool|> {\"temp\": 21}<|eom|><|bom|><|assistant|>"), std::string::npos) << prompt;

  const server::ChatOutputFormat f = server::chat_output_format(source, prompt, /*tools_offered=*/true);
  EXPECT_EQ(f.call_open, "<tool_calls>");
  EXPECT_EQ(f.call_close, "</tool_calls>");
  EXPECT_TRUE(f.call_list);
  const nlohmann::json m = server::chat_message(
      f, "<tool_calls>[\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Rome\"}}\n]</tool_calls>", "call_");
  ASSERT_EQ(m["tool_calls"].size(), 1u) << m.dump();
  EXPECT_EQ(m["tool_calls"][0]["function"]["name"], "get_weather");
  EXPECT_EQ(nlohmann::json::parse(m["tool_calls"][0]["function"]["arguments"].get<std::string>()),
            nlohmann::json({{"city", "Rome"}}));
  EXPECT_TRUE(m["content"].is_null());
}

}  // namespace
}  // namespace mambacpp
