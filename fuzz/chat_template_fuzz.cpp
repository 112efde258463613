// `serve`'s chat template selection: tokenizer_config.json (its chat_template, a string or a list of {name,
// template}, and its special tokens) read from the model directory, then, when a template was found and parses,
// rendered over a short conversation. Any file gives no template, a template, or a mambacpp::Error.
#include <string>

#include "fuzz_files.h"
#include "fuzz_target.h"
#include "server/chat_template.h"

MAMBACPP_FUZZ_TARGET(chat_template) {
  static const mambacpp::fuzz::ScratchDir dir;
  dir.write("tokenizer_config.json", data, size);
  const auto t = mambacpp::server::select_chat_template("auto", dir.path());
  if (!t) return;
  MAMBACPP_FUZZ_CHECK(t->name == "model" && t->tmpl != nullptr);
  mambacpp::chat::Conversation c;
  c.messages = nlohmann::ordered_json::parse(R"([{"role": "system", "content": "s"}, {"role": "user", "content": "hi"}])");
  (void)t->render(c);
}
