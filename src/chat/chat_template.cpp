// The public chat API (mambacpp/chat.h): parse once, render many times; find a model's template and special tokens.
#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "chat/builtins.h"
#include "chat/interpreter.h"
#include "chat/lexer.h"
#include "chat/parser.h"
#include "io/gguf_file.h"
#include "mambacpp/chat.h"
#include "mambacpp/error.h"

namespace mambacpp::chat {

struct Template::Impl {
  std::string source;      // as given
  std::string normalized;  // what offsets in messages refer to
  Body body;
};

Template::Template(const std::string& source) : impl_(std::make_unique<Impl>()) {
  impl_->source = source;
  impl_->normalized = normalize_newlines(source);
  impl_->body = parse_template(impl_->normalized);
}
Template::~Template() = default;
Template::Template(Template&&) noexcept = default;
Template& Template::operator=(Template&&) noexcept = default;

const std::string& Template::source() const { return impl_->source; }

std::string Template::render(const nlohmann::ordered_json& variables, const RenderLimits& limits) const {
  if (!variables.is_object()) fail("chat template variables: expected a JSON object, found ", variables.type_name());
  Value globals = Value::new_dict();
  add_builtin_globals(*globals.dict);
  for (const auto& [k, v] : variables.items()) globals.dict->set(k, Value::from_json(v));
  Interpreter interpreter(impl_->normalized, limits);
  return interpreter.render(impl_->body, globals);
}

namespace {

constexpr uintmax_t kMaxConfigBytes = uintmax_t{64} << 20;

std::string read_bounded(const std::filesystem::path& path) {
  std::error_code ec;
  const uintmax_t size = std::filesystem::file_size(path, ec);
  if (ec) fail(path.string(), ": cannot read its size (", ec.message(), ")");
  if (size > kMaxConfigBytes)
    fail(path.string(), ": ", size, " bytes, more than the limit of 64 MiB for a chat template or tokenizer config");
  std::ifstream in(path, std::ios::binary);
  if (!in) fail(path.string(), ": cannot open");
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// A special token in tokenizer_config.json: a string, null, or an AddedToken object {"content": ...}.
nlohmann::ordered_json token_text(const nlohmann::ordered_json& v) {
  if (v.is_string() || v.is_null()) return v;
  if (v.is_object() && v.contains("content") && v["content"].is_string()) return v["content"];
  return nullptr;
}

bool is_gguf_path(const std::string& path) {
  return path.size() > 5 && path.compare(path.size() - 5, 5, ".gguf") == 0;
}

// A GGUF file's template, as llama.cpp's converter writes tokenizer_config.json's chat_template: the default one
// under tokenizer.chat_template, each other named one under tokenizer.chat_template.<name> (their names listed in
// tokenizer.chat_templates). The special tokens are the texts of the file's special token ids, which is what
// llama.cpp passes to a template too.
std::optional<ChatTemplateFiles> load_gguf_chat_template(const std::string& path, const std::string& name) {
  const GgufFile f(path);
  const std::string key = name == "default" ? "tokenizer.chat_template" : "tokenizer.chat_template." + name;
  const GgufValue* t = f.find(key);
  if (!t) {
    if (name == "default") return std::nullopt;
    std::string names;
    if (const GgufValue* list = f.find("tokenizer.chat_templates"); list && list->type == GgufType::STRING)
      for (const std::string& n : list->strings) names += (names.empty() ? "" : ", ") + n;
    fail(path, ": no chat template named '", name, "' (no key '", key, "'; the file names: ",
         names.empty() ? std::string("none") : names, ")");
  }
  if (t->is_array || t->type != GgufType::STRING)
    fail(path, ": key '", key, "' must be a string (a Jinja template), found ", t->is_array ? "an array of " : "",
         gguf_type_name(t->type));
  ChatTemplateFiles files;
  files.source = t->strings.at(0);
  files.origin = path + " (" + key + ")";
  const GgufValue* tokens = f.find("tokenizer.ggml.tokens");
  if (!tokens || !tokens->is_array || tokens->type != GgufType::STRING || f.get_bool("mambacpp.vocab_placeholder", false))
    return files;  // no real vocabulary: no token texts to give the template
  // llama.cpp's key names (its "seperator" spelling included) and transformers' variable names.
  static const std::pair<const char*, const char*> kSpecial[] = {
      {"tokenizer.ggml.bos_token_id", "bos_token"},       {"tokenizer.ggml.eos_token_id", "eos_token"},
      {"tokenizer.ggml.unknown_token_id", "unk_token"},   {"tokenizer.ggml.padding_token_id", "pad_token"},
      {"tokenizer.ggml.seperator_token_id", "sep_token"}, {"tokenizer.ggml.cls_token_id", "cls_token"},
      {"tokenizer.ggml.mask_token_id", "mask_token"}};
  for (const auto& [id_key, var] : kSpecial) {
    const GgufValue* id = f.find(id_key);
    if (!id) continue;
    if (id->is_array || !id->is_int()) fail(path, ": key '", id_key, "' must be an integer token id");
    const int64_t i = id->ints.at(0);
    if (i < 0 || i >= static_cast<int64_t>(tokens->strings.size()))
      fail(path, ": key '", id_key, "' is ", i, "; expected a token id below ", tokens->strings.size());
    files.special_tokens[var] = tokens->strings[static_cast<size_t>(i)];
  }
  return files;
}

}  // namespace

std::optional<ChatTemplateFiles> load_chat_template(const std::string& model_dir, const std::string& name) {
  std::error_code gguf_ec;
  if (is_gguf_path(model_dir) && std::filesystem::is_regular_file(model_dir, gguf_ec))
    return load_gguf_chat_template(model_dir, name);
  const std::filesystem::path dir(model_dir);
  ChatTemplateFiles files;
  nlohmann::ordered_json config;
  const std::filesystem::path config_path = dir / "tokenizer_config.json";
  std::error_code ec;
  if (std::filesystem::is_regular_file(config_path, ec)) {
    config = nlohmann::ordered_json::parse(read_bounded(config_path), nullptr, /*allow_exceptions=*/false);
    if (config.is_discarded() || !config.is_object())
      fail(config_path.string(), ": expected a JSON object (a tokenizer config)");
    for (const char* key : {"bos_token", "eos_token", "unk_token", "pad_token", "sep_token", "cls_token", "mask_token"})
      if (config.contains(key)) files.special_tokens[key] = token_text(config[key]);
  }
  const std::filesystem::path jinja_path = dir / "chat_template.jinja";
  if (std::filesystem::is_regular_file(jinja_path, ec)) {
    files.source = read_bounded(jinja_path);
    files.origin = jinja_path.string();
    return files;
  }
  if (!config.is_object() || !config.contains("chat_template")) return std::nullopt;
  const nlohmann::ordered_json& t = config["chat_template"];
  if (t.is_string()) {
    files.source = t.get<std::string>();
    files.origin = config_path.string() + " (chat_template)";
    return files;
  }
  if (t.is_array()) {
    // As transformers reads it ({entry["name"]: entry["template"]}): entries without a string name are skipped.
    std::string names;
    for (const auto& entry : t) {
      if (!entry.is_object() || !entry.contains("name") || !entry["name"].is_string()) continue;
      if (entry["name"] == name) {
        if (!entry.contains("template") || !entry["template"].is_string())
          fail(config_path.string(), ": chat_template '", name, "': expected its \"template\" to be a string");
        files.source = entry["template"].get<std::string>();
        files.origin = config_path.string() + " (chat_template '" + name + "')";
        return files;
      }
      names += (names.empty() ? "" : ", ") + entry["name"].get<std::string>();
    }
    fail(config_path.string(), ": chat_template has no template named '", name, "' (it has: ", names, ")");
  }
  if (t.is_null()) return std::nullopt;
  fail(config_path.string(), ": chat_template: expected a string or a list of {name, template}, found ", t.type_name());
}

nlohmann::ordered_json template_variables(const Conversation& c, const nlohmann::ordered_json& special_tokens) {
  nlohmann::ordered_json vars = nlohmann::ordered_json::object();
  if (special_tokens.is_object())
    for (const auto& [k, v] : special_tokens.items()) vars[k] = v;
  vars["messages"] = c.messages;
  vars["tools"] = c.tools;
  vars["documents"] = c.documents;
  vars["add_generation_prompt"] = c.add_generation_prompt;
  if (c.extra.is_object())
    for (const auto& [k, v] : c.extra.items()) vars[k] = v;
  return vars;
}

std::string apply_chat_template(const Template& tmpl, const Conversation& conversation,
                                const nlohmann::ordered_json& special_tokens, const RenderLimits& limits) {
  return tmpl.render(template_variables(conversation, special_tokens), limits);
}

namespace {
// The ends of turn the templates of these families write after an assistant message.
const char* const kTurnEnds[] = {"<|im_end|>", "<|eot_id|>", "<|eom_id|>", "<|end_of_text|>", "<|END_OF_TURN_TOKEN|>",
                                 "<SPECIAL_12>", "<|eom|>", "<|endoftext|>", "</s>"};
}  // namespace

std::vector<std::string> turn_end_strings(const std::string& source, const nlohmann::ordered_json& special_tokens) {
  std::vector<std::string> stops;
  for (const char* end : kTurnEnds)
    if (source.find(end) != std::string::npos) stops.emplace_back(end);
  if (special_tokens.contains("eos_token") && special_tokens["eos_token"].is_string()) {
    const std::string eos = special_tokens["eos_token"].get<std::string>();
    if (!eos.empty() && std::find(stops.begin(), stops.end(), eos) == stops.end()) stops.push_back(eos);
  }
  return stops;
}

}  // namespace mambacpp::chat
