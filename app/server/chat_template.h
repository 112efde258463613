// Chat templates for /v1/chat/completions, /apply-template and `mambacpp generate --chat`: the model's own Jinja
// template (tokenizer_config.json's chat_template or chat_template.jinja) rendered by src/chat exactly as
// transformers' apply_chat_template renders it, or a built-in ChatML, or a template file named on the command line.
#pragma once

#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "mambacpp/chat.h"

namespace mambacpp::server {

struct ChatTemplate {
  std::string name;  // "chatml", "model" (the model directory's template) or the file it was read from
  std::shared_ptr<const chat::Template> tmpl;
  nlohmann::ordered_json special_tokens = nlohmann::ordered_json::object();  // bos_token, eos_token, ...
  std::vector<std::string> stop_strings;  // ends of a turn the template writes (generation stops there)

  // The prompt for `conversation`. Throws Error with the template's own message when it raises.
  std::string render(const chat::Conversation& conversation) const;
};

// `choice`: "none" (chat requests are refused), "chatml" (built in), "auto" (the model directory's template, else
// none), or the path of a Jinja file (special tokens still from `model_dir`). Null for none; throws Error for a
// file that cannot be read or a template that does not parse.
std::unique_ptr<ChatTemplate> select_chat_template(const std::string& choice, const std::string& model_dir);

// The OpenAI chat body's conversation (messages, tools, tool_choice, chat_template_kwargs, add_generation_prompt)
// as the template sees it. Content given as text parts becomes one string (the parts joined with "\n", as vLLM
// does); an assistant tool call's `arguments` given as a JSON string becomes the object it encodes (templates
// apply tojson to it). Throws ApiError 400 naming the field for anything malformed.
chat::Conversation conversation_from_request(const nlohmann::ordered_json& body);

}  // namespace mambacpp::server
