// `serve`'s chat template detection: tokenizer_config.json (its chat_template, a string or a list of {name,
// template}) read from the model directory. Any file gives no template, ChatML, or a mambacpp::Error.
#include <string>

#include "fuzz_files.h"
#include "fuzz_target.h"
#include "server/chat_template.h"

MAMBACPP_FUZZ_TARGET(chat_template) {
  static const mambacpp::fuzz::ScratchDir dir;
  dir.write("tokenizer_config.json", data, size);
  const auto t = mambacpp::server::select_chat_template("auto", dir.path());
  MAMBACPP_FUZZ_CHECK(t == nullptr || t->name == "chatml");
  if (t) MAMBACPP_FUZZ_CHECK(!t->render({{"user", "hi"}}).empty());
}
