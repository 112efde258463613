// The server's request bodies: /v1/completions (first input byte even) and /v1/chat/completions (odd), with the
// shipped GPT-NeoX tokenizer and the ChatML template. A body is refused with ApiError (a 400 naming the field) or
// mambacpp::Error, or gives prompts of in-range token ids within the limits.
#include <string>

#include "fuzz_files.h"
#include "fuzz_target.h"
#include "mambacpp/tokenizer.h"
#include "server/api_error.h"
#include "server/chat_template.h"
#include "server/completion_request.h"

MAMBACPP_FUZZ_TARGET(completion_request) {
  if (size == 0) return;
  using namespace mambacpp::server;
  static const auto tokenizer = mambacpp::Tokenizer::load(mambacpp::fuzz::source_dir() + "/fixtures/tokenizer/tokenizer.json");
  static const auto chat = select_chat_template("chatml", "");
  RequestLimits limits;
  limits.vocab_size = tokenizer->vocab_size();
  limits.bos_token_id = 0;
  limits.max_prompt = 4096;
  limits.max_new_tokens = 1024;
  limits.max_prompts = 8;
  try {
    const nlohmann::json body = parse_json_body(std::string(reinterpret_cast<const char*>(data) + 1, size - 1));
    const CompletionRequest r = data[0] % 2 == 0 ? parse_completion(body, tokenizer.get(), limits)
                                                 : parse_chat_completion(body, tokenizer.get(), chat.get(), limits);
    MAMBACPP_FUZZ_CHECK(!r.prompts.empty() && static_cast<int64_t>(r.prompts.size()) <= limits.max_prompts);
    for (const auto& p : r.prompts) {
      MAMBACPP_FUZZ_CHECK(!p.empty() && static_cast<int64_t>(p.size()) <= limits.max_prompt);
      for (int32_t id : p) MAMBACPP_FUZZ_CHECK(id >= 0 && id < limits.vocab_size);
    }
    MAMBACPP_FUZZ_CHECK(r.base.max_new_tokens >= 0 && r.base.max_new_tokens <= limits.max_new_tokens);
  } catch (const ApiError& e) {
    MAMBACPP_FUZZ_CHECK(e.status == 400);
  }
}
