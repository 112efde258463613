// The assistant's text split into what OpenAI's chat API returns separately: reasoning (`<think>...</think>`) as
// reasoning_content, tool calls in the model's own syntax as tool_calls, and the rest as content. The syntax is
// chosen from the chat template: Nemotron's `<TOOLCALL>[{"name", "arguments"}, ...]</TOOLCALL>`, Jamba's
// `<tool_calls>[...]</tool_calls>` (the same list), or the Hermes /
// Qwen / Granite 4.0 `<tool_call>{"name", "arguments"}</tool_call>` blocks. Streaming holds back text that may be
// the start of a tag, so that no piece of a tag reaches the client as content.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace mambacpp::server {

struct ChatOutputFormat {
  bool reasoning = false;         // the template writes <think> blocks
  bool starts_in_reasoning = false;  // the prompt ends inside an open <think> (the model writes only </think>)
  std::string call_open, call_close;  // empty: tool calls are not parsed
  bool call_list = false;         // the block holds a JSON list of calls (Nemotron), else one call per block
};

// The format for a template's source and the prompt it rendered (a prompt ending in "<think>\n" has opened it).
ChatOutputFormat chat_output_format(const std::string& template_source, const std::string& prompt, bool tools_offered);

// One piece of a streamed or whole answer.
struct ChatDelta {
  std::string content, reasoning;
  nlohmann::json tool_calls = nlohmann::json::array();  // OpenAI's [{index, id, type, function: {name, arguments}}]
};

class ChatOutputParser {
 public:
  explicit ChatOutputParser(ChatOutputFormat format, std::string id_prefix = "call_");
  // Feeds generated text; returns what can be sent now.
  ChatDelta feed(const std::string& text);
  // End of the answer: everything still held back (an unfinished tag is content).
  ChatDelta finish();
  int tool_call_count() const { return calls_; }

 private:
  enum class Mode { Content, Reasoning, ToolCall };
  void emit(ChatDelta& d, const std::string& text) const;
  void parse_calls(ChatDelta& d, const std::string& block);

  ChatOutputFormat format_;
  std::string id_prefix_;
  Mode mode_ = Mode::Content;
  std::string held_;   // text not yet classified (a possible tag start, or a tool call block being read)
  int calls_ = 0;
};

// Whole-answer helper: content (null when empty and there are calls), reasoning_content, tool_calls.
nlohmann::json chat_message(const ChatOutputFormat& format, const std::string& text, const std::string& id_prefix);

}  // namespace mambacpp::server
