#include "server/chat_template.h"

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "mambacpp/error.h"

namespace mambacpp::server {

namespace {

std::unique_ptr<ChatTemplate> chatml() {
  auto t = std::make_unique<ChatTemplate>();
  t->name = "chatml";
  t->message_prefix = "<|im_start|>";
  t->role_suffix = "\n";
  t->message_suffix = "<|im_end|>\n";
  t->stop_strings = {"<|im_end|>"};
  return t;
}

// The chat_template string of tokenizer_config.json (a string, or a list of {name, template}); empty when none.
std::string config_template(const std::string& model_dir) {
  const std::filesystem::path path = std::filesystem::path(model_dir) / "tokenizer_config.json";
  // Read whole into a DOM of many times its size: bounded (real ones hold at most a few MB).
  constexpr uintmax_t kMaxBytes = uintmax_t{64} << 20;
  std::error_code ec;
  if (std::filesystem::is_regular_file(path, ec) && std::filesystem::file_size(path, ec) > kMaxBytes && !ec)
    fail(path.string(), ": ", std::filesystem::file_size(path, ec), " bytes, more than the limit of 64 MiB for a ",
         "tokenizer_config.json (read for its chat_template); expected a tokenizer config of at most that size");
  std::ifstream in(path);
  if (!in) return {};
  const nlohmann::json config = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  if (!config.is_object() || !config.contains("chat_template")) return {};
  const nlohmann::json& t = config["chat_template"];
  if (t.is_string()) return t.get<std::string>();
  if (t.is_array())
    for (const nlohmann::json& entry : t)
      if (entry.is_object() && entry.contains("name") && entry["name"] == "default" && entry.contains("template") &&
          entry["template"].is_string())
        return entry["template"].get<std::string>();
  return {};
}

}  // namespace

std::string ChatTemplate::render(const std::vector<ChatMessage>& messages) const {
  std::string out;
  for (const ChatMessage& m : messages) out += message_prefix + m.role + role_suffix + m.content + message_suffix;
  return out + message_prefix + "assistant" + role_suffix;
}

std::unique_ptr<ChatTemplate> select_chat_template(const std::string& choice, const std::string& model_dir) {
  if (choice == "none") return nullptr;
  if (choice == "chatml") return chatml();
  if (choice == "auto") {
    if (config_template(model_dir).find("<|im_start|>") != std::string::npos) return chatml();
    return nullptr;
  }
  fail("--chat-template: expected auto, none or chatml, found '", choice, "'");
}

}  // namespace mambacpp::server
