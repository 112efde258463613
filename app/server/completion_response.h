// Builds the answers of /v1/completions and /v1/chat/completions in OpenAI's shapes: one JSON object when not
// streamed, else SSE events ("data: {chunk}\n\n", then "data: [DONE]\n\n"). Fed with one request's ChoiceEvents.
#pragma once

#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "mambacpp/tokenizer.h"
#include "server/completion_request.h"
#include "server/request_channel.h"

namespace mambacpp::server {

class CompletionResponse {
 public:
  CompletionResponse(std::shared_ptr<const CompletionRequest> request, const Tokenizer* tokenizer, std::string id,
                     std::string model, int64_t created);

  // Streaming: the SSE events `e` gives (possibly none: a token whose text is held back waits for the next).
  std::string stream_event(const ChoiceEvent& e);
  // Streaming: after every choice's last event: the usage chunk (when asked for) and [DONE].
  std::string stream_end() const;

  // Not streaming: records `e`; full() is the answer once every choice has finished.
  void add(const ChoiceEvent& e);
  nlohmann::json full() const;

  // The first choice that failed in the engine (error set) or was cancelled: its message, else empty.
  std::string failure() const;
  bool cancelled() const;
  const std::vector<GenerateResult>& results() const { return results_; }

 private:
  struct Pending {
    std::vector<GeneratedToken> tokens;  // streamed tokens whose text has not been sent yet
    int64_t text_offset = 0;             // bytes of the choice's text sent so far (legacy text_offset)
    bool role_sent = false;              // chat: the first delta carries the role
    std::shared_ptr<ChatOutputParser> parser;  // chat: splits the text into content, reasoning, tool calls
    bool tool_calls = false;                   // chat: a tool call was streamed (finish_reason "tool_calls")
  };

  nlohmann::json usage() const;
  nlohmann::json logprobs_json(const std::vector<GeneratedToken>& tokens, int64_t text_offset) const;
  std::string token_text(int32_t id) const;
  std::string sse(const nlohmann::json& chunk) const;
  nlohmann::json chunk(nlohmann::json choices) const;

  std::shared_ptr<const CompletionRequest> request_;  // kept alive: streams outlive the handler
  const Tokenizer* tokenizer_;
  std::string id_, model_;
  int64_t created_;
  std::vector<GenerateResult> results_;  // per choice, once finished
  std::vector<bool> done_;
  std::vector<Pending> pending_;
};

const char* openai_finish_reason(FinishReason r);  // "stop" (EOS or a stop string) or "length"

}  // namespace mambacpp::server
