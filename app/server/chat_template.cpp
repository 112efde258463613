#include "server/chat_template.h"

#include <filesystem>
#include <fstream>
#include <sstream>

#include "mambacpp/error.h"
#include "server/api_error.h"

namespace mambacpp::server {

namespace {

using ojson = nlohmann::ordered_json;

// ChatML as the Qwen2.5-style templates write it, without a default system prompt.
constexpr const char* kChatml =
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}";

std::string read_file(const std::string& path) {
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path, ec))
    fail("--chat-template: expected auto, none, chatml or the path of a Jinja template file, found '", path,
         "' (no such file)");
  if (std::filesystem::file_size(path, ec) > (uintmax_t{16} << 20))
    fail("--chat-template ", path, ": more than 16 MiB; expected a Jinja chat template");
  std::ifstream in(path, std::ios::binary);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::string type_of(const ojson& v) {
  if (v.is_string()) return "a string";
  if (v.is_array()) return "an array";
  if (v.is_object()) return "an object";
  if (v.is_boolean()) return "a boolean";
  if (v.is_number()) return "a number";
  return "null";
}

}  // namespace

std::string ChatTemplate::render(const chat::Conversation& conversation) const {
  return chat::apply_chat_template(*tmpl, conversation, special_tokens);
}

std::unique_ptr<ChatTemplate> select_chat_template(const std::string& choice, const std::string& model_dir) {
  if (choice == "none") return nullptr;
  auto t = std::make_unique<ChatTemplate>();
  std::optional<chat::ChatTemplateFiles> files;
  if (!model_dir.empty()) files = chat::load_chat_template(model_dir);
  if (files) t->special_tokens = files->special_tokens;
  std::string source;
  if (choice == "chatml") {
    t->name = "chatml";
    source = kChatml;
  } else if (choice == "auto") {
    if (!files) return nullptr;
    t->name = "model";
    source = files->source;
  } else {
    t->name = choice;
    source = read_file(choice);
  }
  try {
    t->tmpl = std::make_shared<const chat::Template>(source);
  } catch (const Error& e) {
    fail(t->name == "model" ? files->origin : t->name, ": ", e.what());
  }
  t->stop_strings = chat::turn_end_strings(source, t->special_tokens);
  return t;
}

chat::Conversation conversation_from_request(const ojson& body) {
  chat::Conversation c;
  if (!body.contains("messages") || body["messages"].is_null())
    throw bad_request("messages", "missing; expected an array of {role, content} objects");
  const ojson& m = body["messages"];
  if (!m.is_array() || m.empty())
    throw bad_request("messages", "expected a non-empty array of {role, content} objects, found " +
                                      (m.is_array() ? std::string("an empty array") : type_of(m)));
  for (size_t i = 0; i < m.size(); ++i) {
    const std::string param = "messages[" + std::to_string(i) + "]";
    if (!m[i].is_object()) throw bad_request(param, "expected an object with role and content, found " + type_of(m[i]));
    ojson msg = m[i];
    if (!msg.contains("role") || !msg["role"].is_string())
      throw bad_request(param + ".role", "expected a string (system, user, assistant, tool, ...)");
    if (msg["role"] == "developer") msg["role"] = "system";
    const std::string role = msg["role"].get<std::string>();
    if (role != "system" && role != "user" && role != "assistant" && role != "tool" && role != "function")
      throw bad_request(param + ".role", "expected system, developer, user, assistant or tool (OpenAI's roles), found \"" +
                                             role.substr(0, 64) + "\"");
    if (msg.contains("content")) {
      ojson& content = msg["content"];
      if (content.is_array()) {
        std::string text;
        for (size_t k = 0; k < content.size(); ++k) {
          const ojson& part = content[k];
          if (!part.is_object() || !part.contains("type") || part["type"] != "text" || !part.contains("text") ||
              !part["text"].is_string())
            throw bad_request(param + ".content[" + std::to_string(k) + "]",
                              "only text parts ({\"type\": \"text\", \"text\": ...}) are supported");
          if (k) text += "\n";
          text += part["text"].get<std::string>();
        }
        content = text;
      } else if (!content.is_string() && !content.is_null()) {
        throw bad_request(param + ".content", "expected a string, an array of text parts or null, found " +
                                                  type_of(content));
      }
    }
    if (msg.contains("tool_calls") && !msg["tool_calls"].is_null()) {
      ojson& calls = msg["tool_calls"];
      if (!calls.is_array()) throw bad_request(param + ".tool_calls", "expected an array, found " + type_of(calls));
      for (size_t k = 0; k < calls.size(); ++k) {
        ojson& call = calls[k];
        const std::string cp = param + ".tool_calls[" + std::to_string(k) + "]";
        if (!call.is_object() || !call.contains("function") || !call["function"].is_object() ||
            !call["function"].contains("name") || !call["function"]["name"].is_string())
          throw bad_request(cp, "expected {\"type\": \"function\", \"function\": {\"name\": ..., \"arguments\": ...}}");
        ojson& args = call["function"]["arguments"];
        if (args.is_string()) {
          ojson parsed = ojson::parse(args.get<std::string>(), nullptr, /*allow_exceptions=*/false);
          if (parsed.is_object()) args = std::move(parsed);
        }
      }
    }
    c.messages.push_back(std::move(msg));
  }
  if (body.contains("tools") && !body["tools"].is_null()) {
    if (!body["tools"].is_array()) throw bad_request("tools", "expected an array of tools, found " + type_of(body["tools"]));
    for (size_t k = 0; k < body["tools"].size(); ++k) {
      const ojson& t = body["tools"][k];
      if (!t.is_object() || !t.contains("function") || !t["function"].is_object() || !t["function"].contains("name") ||
          !t["function"]["name"].is_string())
        throw bad_request("tools[" + std::to_string(k) + "]",
                          "expected {\"type\": \"function\", \"function\": {\"name\": ..., \"parameters\": ...}}");
    }
    if (!body["tools"].empty()) c.tools = body["tools"];
  }
  if (body.contains("tool_choice") && !body["tool_choice"].is_null()) {
    const ojson& choice = body["tool_choice"];
    if (choice == "none") {
      c.tools = nullptr;  // the model is not offered the tools
    } else if (choice != "auto") {
      throw bad_request("tool_choice", "only \"auto\" and \"none\" are supported (a required or named tool call would "
                                       "need constrained decoding)");
    }
  }
  if (body.contains("chat_template_kwargs") && !body["chat_template_kwargs"].is_null()) {
    if (!body["chat_template_kwargs"].is_object())
      throw bad_request("chat_template_kwargs", "expected an object of template variables, found " +
                                                    type_of(body["chat_template_kwargs"]));
    c.extra = body["chat_template_kwargs"];
  }
  if (body.contains("add_generation_prompt") && !body["add_generation_prompt"].is_null()) {
    if (!body["add_generation_prompt"].is_boolean())
      throw bad_request("add_generation_prompt", "expected a boolean, found " + type_of(body["add_generation_prompt"]));
    c.add_generation_prompt = body["add_generation_prompt"].get<bool>();
  }
  return c;
}

}  // namespace mambacpp::server
