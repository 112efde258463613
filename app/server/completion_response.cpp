#include "server/completion_response.h"

namespace mambacpp::server {

using nlohmann::json;

const char* openai_finish_reason(FinishReason r) { return r == FinishReason::Length ? "length" : "stop"; }

CompletionResponse::CompletionResponse(std::shared_ptr<const CompletionRequest> request, const Tokenizer* tokenizer,
                                       std::string id, std::string model, int64_t created)
    : request_(std::move(request)),
      tokenizer_(tokenizer),
      id_(std::move(id)),
      model_(std::move(model)),
      created_(created),
      results_(request_->prompts.size()),
      done_(request_->prompts.size(), false),
      pending_(request_->prompts.size()) {}

std::string CompletionResponse::token_text(int32_t id) const {
  return tokenizer_ ? tokenizer_->token_bytes(id) : std::to_string(id);
}

// Completions: OpenAI's legacy shape (parallel arrays). Chat: {"content": [{token, logprob, bytes, top_logprobs}]}.
// text_offset counts bytes of the completion text (the prompt is not echoed).
json CompletionResponse::logprobs_json(const std::vector<GeneratedToken>& tokens, int64_t text_offset) const {
  if (request_->base.logprobs < 0) return nullptr;
  auto bytes_of = [](const std::string& s) {
    json b = json::array();
    for (unsigned char c : s) b.push_back(c);
    return b;
  };
  if (request_->chat) {
    json content = json::array();
    for (const GeneratedToken& t : tokens) {
      const std::string s = token_text(t.id);
      json top = json::array();
      for (const TokenLogprob& alt : t.top) {
        const std::string a = token_text(alt.id);
        top.push_back({{"token", a}, {"logprob", alt.logprob}, {"bytes", bytes_of(a)}});
      }
      content.push_back({{"token", s}, {"logprob", t.logprob}, {"bytes", bytes_of(s)}, {"top_logprobs", top}});
    }
    return {{"content", content}};
  }
  json toks = json::array(), lps = json::array(), tops = json::array(), offsets = json::array();
  for (const GeneratedToken& t : tokens) {
    const std::string s = token_text(t.id);
    toks.push_back(s);
    lps.push_back(t.logprob);
    json top = json::object();
    for (const TokenLogprob& alt : t.top) {
      const std::string a = token_text(alt.id);
      if (!top.contains(a)) top[a] = alt.logprob;  // two ids of one text: the likelier (listed first) stands
    }
    tops.push_back(top);
    offsets.push_back(text_offset);
    text_offset += static_cast<int64_t>(s.size());
  }
  return {{"tokens", toks}, {"token_logprobs", lps}, {"top_logprobs", tops}, {"text_offset", offsets}};
}

json CompletionResponse::usage() const {
  int64_t prompt = 0, completion = 0, cached = 0, drafted = 0, accepted = 0;
  for (size_t i = 0; i < results_.size(); ++i) {
    prompt += static_cast<int64_t>(request_->prompts[i].size());
    completion += static_cast<int64_t>(results_[i].tokens.size());
    cached += results_[i].cached_prompt_tokens;
    drafted += results_[i].draft_tokens;
    accepted += results_[i].accepted_draft_tokens;
  }
  // draft_tokens / accepted_draft_tokens: speculative decoding's drafts and those the model agreed with (0 without).
  return {{"prompt_tokens", prompt},
          {"completion_tokens", completion},
          {"total_tokens", prompt + completion},
          {"prompt_tokens_details", {{"cached_tokens", cached}}},
          {"draft_tokens", drafted},
          {"accepted_draft_tokens", accepted}};
}

json CompletionResponse::chunk(json choices) const {
  return {{"id", id_},
          {"object", request_->chat ? "chat.completion.chunk" : "text_completion"},
          {"created", created_},
          {"model", model_},
          {"choices", std::move(choices)}};
}

std::string CompletionResponse::sse(const json& chunk) const {
  // Token texts may be cut inside a UTF-8 character (logprobs): those bytes become U+FFFD instead of an exception.
  return "data: " + chunk.dump(-1, ' ', false, json::error_handler_t::replace) + "\n\n";
}

std::string CompletionResponse::stream_event(const ChoiceEvent& e) {
  Pending& p = pending_[e.choice];
  if (e.token) p.tokens.push_back(*e.token);
  if (e.result) {
    results_[e.choice] = *e.result;
    done_[e.choice] = true;
  }
  const bool failed = e.result && e.result->finish_reason == FinishReason::Cancelled;
  if (e.text.empty() && !e.result) return {};  // the token's text is held back: it goes with the next piece

  std::string out;
  json choice = {{"index", e.choice}};
  if (request_->chat) {
    if (!p.parser)
      p.parser = std::make_shared<ChatOutputParser>(request_->output, "call_" + id_ + "_" + std::to_string(e.choice) + "_");
    ChatDelta d = p.parser->feed(e.text);
    if (e.result) {
      ChatDelta rest = p.parser->finish();
      d.content += rest.content;
      d.reasoning += rest.reasoning;
      for (auto& c : rest.tool_calls) d.tool_calls.push_back(c);
    }
    // Text held back as a possible tag start waits for the next piece (with its logprobs).
    if (d.content.empty() && d.reasoning.empty() && d.tool_calls.empty() && !e.result && p.role_sent) return {};
    json delta = json::object();
    if (!p.role_sent) delta["role"] = "assistant", p.role_sent = true;
    if (!d.content.empty() || (d.reasoning.empty() && d.tool_calls.empty())) delta["content"] = d.content;
    if (!d.reasoning.empty()) delta["reasoning_content"] = d.reasoning;
    if (!d.tool_calls.empty()) delta["tool_calls"] = d.tool_calls, p.tool_calls = true;
    choice["delta"] = delta;
  } else {
    choice["text"] = e.text;
  }
  choice["logprobs"] = logprobs_json(p.tokens, p.text_offset);
  choice["finish_reason"] = e.result && !failed ? json(p.tool_calls && e.result->finish_reason != FinishReason::Length
                                                           ? "tool_calls"
                                                           : openai_finish_reason(e.result->finish_reason))
                                               : json(nullptr);
  for (const GeneratedToken& t : p.tokens) p.text_offset += static_cast<int64_t>(token_text(t.id).size());
  p.tokens.clear();
  if (!(failed && e.text.empty())) out += sse(chunk(json::array({choice})));
  if (failed) {  // the stream ends with an error event: the server stopped, or the engine failed this choice
    const std::string message =
        e.result->error.empty() ? "the request was cancelled: the server is shutting down" : e.result->error;
    out += sse({{"error", {{"message", message}, {"type", "server_error"}, {"param", nullptr}, {"code", nullptr}}}});
  }
  return out;
}

std::string CompletionResponse::stream_end() const {
  std::string out;
  if (request_->include_usage) {
    json last = chunk(json::array());
    last["usage"] = usage();
    out += sse(last);
  }
  return out + "data: [DONE]\n\n";
}

void CompletionResponse::add(const ChoiceEvent& e) {
  if (!e.result) return;  // the result holds every token and the whole text
  results_[e.choice] = *e.result;
  done_[e.choice] = true;
}

json CompletionResponse::full() const {
  json choices = json::array();
  for (size_t i = 0; i < results_.size(); ++i) {
    const GenerateResult& r = results_[i];
    json choice = {{"index", i}};
    bool tool_calls = false;
    if (request_->chat) {
      choice["message"] = chat_message(request_->output, r.text, "call_" + id_ + "_" + std::to_string(i) + "_");
      tool_calls = choice["message"].contains("tool_calls");
    } else {
      choice["text"] = r.text;
    }
    choice["logprobs"] = logprobs_json(r.token_info, 0);
    choice["finish_reason"] =
        tool_calls && r.finish_reason != FinishReason::Length ? "tool_calls" : openai_finish_reason(r.finish_reason);
    choices.push_back(std::move(choice));
  }
  json out = {{"id", id_},           {"object", request_->chat ? "chat.completion" : "text_completion"},
              {"created", created_}, {"model", model_},
              {"choices", choices},  {"usage", usage()}};
  return out;
}

std::string CompletionResponse::failure() const {
  for (size_t i = 0; i < results_.size(); ++i)
    if (done_[i] && results_[i].finish_reason == FinishReason::Cancelled)
      return results_[i].error.empty() ? "the request was cancelled: the server is shutting down" : results_[i].error;
  return {};
}

bool CompletionResponse::cancelled() const {
  for (size_t i = 0; i < results_.size(); ++i)
    if (done_[i] && results_[i].finish_reason == FinishReason::Cancelled) return true;
  return false;
}

}  // namespace mambacpp::server
