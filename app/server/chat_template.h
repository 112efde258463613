// Chat templates: how /v1/chat/completions turns messages into one prompt. Jinja templates are not interpreted;
// the server knows ChatML (<|im_start|>role\ncontent<|im_end|>\n ... <|im_start|>assistant\n) and uses it when
// asked (--chat-template chatml) or when the model's tokenizer_config.json carries a template written in it.
#pragma once

#include <memory>
#include <string>
#include <vector>

namespace mambacpp::server {

struct ChatMessage {
  std::string role;  // system, user or assistant
  std::string content;
};

struct ChatTemplate {
  std::string name;
  std::string message_prefix, role_suffix, message_suffix;  // prefix + role + role_suffix + content + suffix
  std::vector<std::string> stop_strings;                    // end of the assistant's turn

  // The prompt for `messages` followed by the start of the assistant's turn.
  std::string render(const std::vector<ChatMessage>& messages) const;
};

// `choice`: "none" (chat requests are refused), "chatml", or "auto" (chatml when `model_dir`'s
// tokenizer_config.json has a chat_template that uses <|im_start|>, else none). Null for none; throws Error for
// another name.
std::unique_ptr<ChatTemplate> select_chat_template(const std::string& choice, const std::string& model_dir);

}  // namespace mambacpp::server
