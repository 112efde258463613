// Falcon-H1's published chat template (fixtures/chat/templates/tiiuae-Falcon-H1-1.5B-Deep-Instruct.jinja): ChatML
// turns after the bos token, the system turn first, tools offered in a system turn of their own (the template leaves
// that turn open and writes no assistant tool calls back), and its <tool_call> JSON blocks parsed back as tool_calls.
// Expected texts: Jinja2 with transformers' environment (trim_blocks, lstrip_blocks, transformers' tojson) on the
// same template and conversations.
#include <gtest/gtest.h>

#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <string>

#include "mambacpp/chat.h"
#include "mambacpp/error.h"
#include "server/chat_output.h"
#include "support/test_support.h"

namespace mambacpp {
namespace {

using ojson = nlohmann::ordered_json;

std::string falcon_h1_template() {
  std::ifstream in(test::fixture_dir() + "/chat/templates/tiiuae-Falcon-H1-1.5B-Deep-Instruct.jinja", std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

TEST(FalconH1Template, RendersChatMlTurnsAfterTheBosToken) {
  const chat::Template t(falcon_h1_template());
  chat::Conversation c;
  c.messages = ojson::parse(R"([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"},
      {"role": "assistant", "content": "Hello."}, {"role": "user", "content": "Bye"}])");
  EXPECT_EQ(chat::apply_chat_template(t, c, {{"bos_token", "<|begin_of_text|>"}}),
            "<|begin_of_text|><|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
            "<|im_start|>assistant\nHello.<|im_end|>\n<|im_start|>user\nBye<|im_end|>\n<|im_start|>assistant\n");
  // Where Jinja2 raises, so must we: messages[0] of an empty list, a string plus a list of content parts.
  c.messages = ojson::array();
  EXPECT_THROW(chat::apply_chat_template(t, c, {{"bos_token", "<|begin_of_text|>"}}), Error);
  c.messages = ojson::parse(R"([{"role": "user", "content": [{"type": "text", "text": "Hi"}]}])");
  EXPECT_THROW(chat::apply_chat_template(t, c, {{"bos_token", "<|begin_of_text|>"}}), Error);
}

TEST(FalconH1Template, ToolsAreOfferedAndCallsParsedBack) {
  const std::string source = falcon_h1_template();
  const chat::Template t(source);
  chat::Conversation c;
  c.messages = ojson::parse(R"([{"role": "user", "content": "Weather in Paris?"},
      {"role": "assistant", "content": "", "tool_calls": [{"id": "c1", "type": "function",
        "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]},
      {"role": "tool", "content": "{\"temp\": 21}"}])");
  c.tools = ojson::parse(R"([{"type": "function", "function": {"name": "get_weather", "description": "Weather",
      "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}])");
  const std::string prompt = chat::apply_chat_template(t, c, {{"bos_token", "<|begin_of_text|>"}});
  EXPECT_EQ(prompt,
            "<|begin_of_text|><|im_start|>system\nYou are a function calling AI model. You are provided with function "
            "signature within <tools> </tools> XML tags. You may call one or more functions to assist with the user "
            "query. Don't make assumptions about what values to plug into functions.\n<tools>\n[{\"type\": "
            "\"function\", \"function\": {\"name\": \"get_weather\", \"description\": \"Weather\", \"parameters\": "
            "{\"type\": \"object\", \"properties\": {\"city\": {\"type\": \"string\"}}}}}]\n</tools>\nFor each "
            "function call, return a json object with function name and arguments within <tool_call> </tool_call> "
            "tags with the following schema:\n<tool_call>\n{'arguments': <args-dict>, 'name': <function-name>}\n"
            "</tool_call>\n<|im_start|>user\nWeather in Paris?<|im_end|>\n<|im_start|>assistant\n<|im_end|>\n"
            "<|im_start|>tool\n{\"temp\": 21}<|im_end|>\n<|im_start|>assistant\n");

  const server::ChatOutputFormat f = server::chat_output_format(source, prompt, /*tools_offered=*/true);
  EXPECT_EQ(f.call_open, "<tool_call>");
  EXPECT_EQ(f.call_close, "</tool_call>");
  EXPECT_FALSE(f.reasoning);
  const nlohmann::json m = server::chat_message(
      f, "<tool_call>\n{\"arguments\": {\"city\": \"Rome\"}, \"name\": \"get_weather\"}\n</tool_call>", "call_");
  ASSERT_EQ(m["tool_calls"].size(), 1u) << m.dump();
  EXPECT_EQ(m["tool_calls"][0]["function"]["name"], "get_weather");
  EXPECT_EQ(nlohmann::json::parse(m["tool_calls"][0]["function"]["arguments"].get<std::string>()),
            nlohmann::json({{"city", "Rome"}}));
  EXPECT_TRUE(m["content"].is_null());
}

}  // namespace
}  // namespace mambacpp
