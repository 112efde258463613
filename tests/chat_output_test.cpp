// The assistant's text split into content, reasoning_content and tool_calls (app/server/chat_output.h), whole and
// streamed in every split of the text: streaming must give the same message, and no piece of a tag as content.
#include <gtest/gtest.h>

#include <string>

#include "server/chat_output.h"

namespace {

using mambacpp::server::chat_message;
using mambacpp::server::chat_output_format;
using mambacpp::server::ChatOutputFormat;
using mambacpp::server::ChatOutputParser;
using json = nlohmann::json;

const char* const kQwenLike = "{{ '<|im_start|>' }}<think>{% if tools %}<tool_call>{% endif %}";
const char* const kNemotronLike = "<think>{% if tools %}<TOOLCALL>[...]</TOOLCALL>{% endif %}";

TEST(ChatOutput, FormatFollowsTheTemplateAndThePrompt) {
  const ChatOutputFormat f = chat_output_format(kQwenLike, "<|im_start|>assistant\n<think>\n", true);
  EXPECT_TRUE(f.reasoning);
  EXPECT_TRUE(f.starts_in_reasoning);
  EXPECT_EQ(f.call_open, "<tool_call>");
  EXPECT_FALSE(f.call_list);
  const ChatOutputFormat n = chat_output_format(kNemotronLike, "x", true);
  EXPECT_EQ(n.call_open, "<TOOLCALL>");
  EXPECT_TRUE(n.call_list);
  EXPECT_FALSE(n.starts_in_reasoning);
  EXPECT_TRUE(chat_output_format(kQwenLike, "x", /*tools_offered=*/false).call_open.empty());
  EXPECT_FALSE(chat_output_format("{{ messages }}", "x", true).reasoning);
}

TEST(ChatOutput, HermesToolCallsAndReasoning) {
  const ChatOutputFormat f = chat_output_format(kQwenLike, "x", true);
  const std::string text =
      "<think>\nThe user wants weather.\n</think>\n\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": "
      "{\"city\": \"Paris\"}}\n</tool_call>\n<tool_call>\n{\"name\": \"search\", \"arguments\": {\"query\": \"x\"}}\n"
      "</tool_call>";
  const json m = chat_message(f, text, "call_");
  EXPECT_EQ(m["reasoning_content"], "The user wants weather.");
  EXPECT_TRUE(m["content"].is_null()) << m.dump();
  ASSERT_EQ(m["tool_calls"].size(), 2u);
  EXPECT_EQ(m["tool_calls"][0]["function"]["name"], "get_weather");
  EXPECT_EQ(json::parse(m["tool_calls"][0]["function"]["arguments"].get<std::string>()), json({{"city", "Paris"}}));
  EXPECT_EQ(m["tool_calls"][0]["type"], "function");
  EXPECT_NE(m["tool_calls"][0]["id"], m["tool_calls"][1]["id"]);
}

TEST(ChatOutput, NemotronListAndPlainText) {
  const ChatOutputFormat f = chat_output_format(kNemotronLike, "x", true);
  const json m = chat_message(
      f, "Sure.<TOOLCALL>[{\"name\": \"a\", \"arguments\": {\"x\": 1}}, {\"name\": \"b\", \"arguments\": \"{}\"}]</TOOLCALL>",
      "c");
  EXPECT_EQ(m["content"], "Sure.");
  ASSERT_EQ(m["tool_calls"].size(), 2u);
  EXPECT_EQ(m["tool_calls"][1]["function"]["arguments"], "{}");
  EXPECT_EQ(chat_message(f, R"(<TOOLCALL>[{"name": "a", "arguments": {"z": 1, "a": 2}}]</TOOLCALL>)", "c")["tool_calls"][0]
                ["function"]["arguments"],
            R"({"z":1,"a":2})");
  // Text that only looks like a call stays content; without tools nothing is parsed.
  EXPECT_EQ(chat_message(f, "<TOOLCALL>not json</TOOLCALL>", "c")["content"], "<TOOLCALL>not json</TOOLCALL>");
  const ChatOutputFormat plain = chat_output_format("{{ x }}", "x", true);
  EXPECT_EQ(chat_message(plain, " a <tool_call> b", "c")["content"], " a <tool_call> b");
}

TEST(ChatOutput, NemotronThreeXmlCalls) {
  const ChatOutputFormat f = chat_output_format("<think><tool_call><function=", "x", true);
  const json m = chat_message(f,
                              "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n"
                              "<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>",
                              "c");
  ASSERT_EQ(m["tool_calls"].size(), 1u) << m.dump();
  EXPECT_EQ(m["tool_calls"][0]["function"]["name"], "get_weather");
  // The arguments keep the order the model wrote them in.
  EXPECT_EQ(m["tool_calls"][0]["function"]["arguments"], R"({"city":"Paris","days":3})");
}

TEST(ChatOutput, PromptThatOpenedThinkingStartsInReasoning) {
  const ChatOutputFormat f = chat_output_format(kQwenLike, "<|im_start|>assistant\n<think>\n", false);
  const json m = chat_message(f, "let me see</think>\n\nIt is 4.", "c");
  EXPECT_EQ(m["reasoning_content"], "let me see");
  EXPECT_EQ(m["content"], "It is 4.");
}

TEST(ChatOutput, StreamingInAnySplitGivesTheSameAndNoTagAsContent) {
  const ChatOutputFormat f = chat_output_format(kQwenLike, "x", true);
  const std::string text =
      "<think>hmm</think>Hello <tool_call>{\"name\": \"f\", \"arguments\": {\"a\": \"<tool_call>\"}}</tool_call> bye";
  for (size_t a = 0; a <= text.size(); ++a) {
    for (size_t b = a; b <= text.size(); b += 7) {
      ChatOutputParser p(f, "c");
      std::string content, reasoning;
      json calls = json::array();
      for (const std::string& piece : {text.substr(0, a), text.substr(a, b - a), text.substr(b)}) {
        auto d = p.feed(piece);
        content += d.content, reasoning += d.reasoning;
        for (auto& c : d.tool_calls) calls.push_back(c);
        EXPECT_EQ(d.content.find('<'), std::string::npos) << "split " << a << "," << b << ": " << d.content;
      }
      auto d = p.finish();
      content += d.content, reasoning += d.reasoning;
      ASSERT_EQ(content, "Hello  bye") << a << "," << b;
      ASSERT_EQ(reasoning, "hmm");
      ASSERT_EQ(calls.size(), 1u);
      ASSERT_EQ(calls[0]["function"]["name"], "f");
      ASSERT_EQ(calls[0]["index"], 0);
    }
  }
}

TEST(ChatOutput, AnUnfinishedCallIsContent) {
  const ChatOutputFormat f = chat_output_format(kQwenLike, "x", true);
  ChatOutputParser p(f, "c");
  auto d = p.feed("Hi <tool_call>{\"name\": \"f\"");
  EXPECT_EQ(d.content, "Hi ");
  d = p.finish();
  EXPECT_EQ(d.content, "<tool_call>{\"name\": \"f\"");
  EXPECT_TRUE(d.tool_calls.empty());
}

}  // namespace
