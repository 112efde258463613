// _ChatTemplate: a model's own chat template (src/chat, the renderer behind the server's /v1/chat/completions and
// `generate --chat`), found in a model directory or a .gguf file. Conversations cross as JSON text: the Python side
// builds them with json.dumps, and the renderer sees exactly what the server would.
#include <pybind11/stl.h>

#include <memory>
#include <nlohmann/json.hpp>
#include <optional>

#include "errors.h"
#include "handles.h"
#include "mambacpp/chat.h"

namespace py = pybind11;

namespace mambacpp::python {

namespace {

struct ChatTemplate {
  chat::ChatTemplateFiles files;
  chat::Template tmpl;
};

nlohmann::ordered_json parse_json(const std::string& text, const char* what) {
  auto j = nlohmann::ordered_json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) throw InvalidArgument(std::string(what) + ": not valid JSON");
  return j;
}

}  // namespace

void bind_chat(py::module_& m) {
  py::class_<ChatTemplate, std::shared_ptr<ChatTemplate>>(m, "_ChatTemplate")
      .def_property_readonly("source", [](const ChatTemplate& t) { return t.files.source; })
      .def_property_readonly("origin", [](const ChatTemplate& t) { return t.files.origin; })
      .def_property_readonly("special_tokens_json", [](const ChatTemplate& t) { return t.files.special_tokens.dump(); })
      // Where the assistant's turn ends (chat.h: turn_end_strings): Model.chat stops there, as the server does.
      .def_property_readonly("stop_strings",
                             [](const ChatTemplate& t) { return chat::turn_end_strings(t.files.source, t.files.special_tokens); })
      // messages, tools, documents: JSON arrays (tools/documents may be null); extra: a JSON object of more
      // variables. A template that raises (raise_exception, a bad conversation) is bad input.
      .def("render",
           [](const ChatTemplate& t, const std::string& messages, const std::string& tools,
              const std::string& documents, bool add_generation_prompt, const std::string& extra) {
             chat::Conversation c;
             c.messages = parse_json(messages, "messages");
             c.tools = parse_json(tools, "tools");
             c.documents = parse_json(documents, "documents");
             c.add_generation_prompt = add_generation_prompt;
             c.extra = parse_json(extra, "template_kwargs");
             if (!c.messages.is_array()) throw InvalidArgument("messages: expected a list of {role, content} dicts");
             if (!c.extra.is_object()) throw InvalidArgument("template_kwargs: expected a JSON object");
             return input_errors([&] { return chat::apply_chat_template(t.tmpl, c, t.files.special_tokens); });
           },
           py::arg("messages"), py::arg("tools"), py::arg("documents"), py::arg("add_generation_prompt"),
           py::arg("extra"));
  // The template of a model directory or .gguf file (chat.h: load_chat_template), or None when it has none. A file
  // that cannot be read or a template that does not parse is a FileError.
  m.def(
      "_load_chat_template",
      [](const std::string& path) -> std::shared_ptr<ChatTemplate> {
        return file_errors([&]() -> std::shared_ptr<ChatTemplate> {
          std::optional<chat::ChatTemplateFiles> files = chat::load_chat_template(path);
          if (!files) return nullptr;
          try {
            chat::Template tmpl(files->source);
            return std::make_shared<ChatTemplate>(ChatTemplate{std::move(*files), std::move(tmpl)});
          } catch (const Error& e) {
            fail(path, ": ", files->origin, ": ", e.what());
          }
        });
      },
      py::arg("path"));
}

}  // namespace mambacpp::python
