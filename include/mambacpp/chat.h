// Chat templates: the Jinja text every instruct model ships (tokenizer_config.json's chat_template, or a
// chat_template.jinja file) rendered as transformers' apply_chat_template renders it (Jinja with trim_blocks and
// lstrip_blocks, the loopcontrols extension, transformers' tojson, raise_exception and strftime_now). The
// interpreter reads untrusted text: it is bounded in nesting, work and output, and every failure is an Error naming
// the template's line and column.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

namespace mambacpp::chat {

struct RenderLimits {
  int max_call_depth = 64;                 // nested macro calls (a recursive macro stops here)
  uint64_t max_work = uint64_t{1} << 24;   // loop iterations and elements visited by filters, for the whole render
  size_t max_output_bytes = size_t{64} << 20;  // the output, and any string or list built on the way
};


// A parsed template; render() may be called from many threads at once.
class Template {
 public:
  // Parses `source`; throws Error "chat template line L, column C: ..." for a syntax error.
  explicit Template(const std::string& source);
  ~Template();
  Template(Template&&) noexcept;
  Template& operator=(Template&&) noexcept;

  // Renders with `variables` (a JSON object) over the built-in globals. Throws Error for a template that fails,
  // with the template's own message for raise_exception().
  std::string render(const nlohmann::ordered_json& variables, const RenderLimits& limits = {}) const;
  const std::string& source() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// What a model directory says about its chat: the template text and the special tokens the template may use.
struct ChatTemplateFiles {
  std::string source;                   // the Jinja text
  std::string origin;                   // where it came from, for messages ("tokenizer_config.json", ...)
  nlohmann::ordered_json special_tokens = nlohmann::ordered_json::object();  // bos_token, eos_token, ... (may be null)
};

// Reads `model_dir`: chat_template.jinja if present, else tokenizer_config.json's chat_template (a string, or a
// list of {name, template} from which `name` is taken, "default" unless told). Special tokens come from
// tokenizer_config.json (a string, or an AddedToken object's "content"). A path ending in .gguf is a GGUF file:
// tokenizer.chat_template (tokenizer.chat_template.<name> for another name), the special tokens being the texts of
// its tokenizer.ggml.*_token_id tokens. nullopt when the model has no template; Error for a file that cannot be
// read or a named template that is not there.
std::optional<ChatTemplateFiles> load_chat_template(const std::string& model_dir, const std::string& name = "default");

// One conversation to render, as transformers' apply_chat_template takes it.
struct Conversation {
  nlohmann::ordered_json messages = nlohmann::ordered_json::array();
  nlohmann::ordered_json tools;          // null (the template sees `tools` as none) or a list of tool schemas
  nlohmann::ordered_json documents;      // null or a list
  bool add_generation_prompt = true;
  nlohmann::ordered_json extra = nlohmann::ordered_json::object();  // chat_template_kwargs: more variables
};

// The variables transformers passes: the special tokens, then messages, tools, documents, add_generation_prompt and
// the extra kwargs (which override everything before them).
nlohmann::ordered_json template_variables(const Conversation& conversation,
                                          const nlohmann::ordered_json& special_tokens);

// Renders a conversation with a model's template.
std::string apply_chat_template(const Template& tmpl, const Conversation& conversation,
                                const nlohmann::ordered_json& special_tokens, const RenderLimits& limits = {});

// Where an assistant's turn ends in the text of a template: the ends of turn of the families mambacpp runs that the
// template writes (<|im_end|>, <|eot_id|>, <|END_OF_TURN_TOKEN|>, ...), then special_tokens' eos_token. Generation
// stops at any of them (the server, `generate --chat` and Python's Model.chat): a model stops on its eos token id
// already; these catch a turn end that is not the tokenizer's eos, or that the tokenizer splits into pieces.
std::vector<std::string> turn_end_strings(const std::string& source, const nlohmann::ordered_json& special_tokens);

}  // namespace mambacpp::chat
