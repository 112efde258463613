// Turns the JSON body of /v1/completions or /v1/chat/completions into engine requests, checking every field the
// server reads (type and range) so that a bad request gets a 400 naming the field instead of reaching the engine.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "mambacpp/engine.h"
#include "mambacpp/tokenizer.h"
#include "server/chat_output.h"
#include "server/chat_template.h"

namespace mambacpp::server {

// What the model and the server allow; the parser checks requests against it.
struct RequestLimits {
  int64_t vocab_size = 0;
  int64_t bos_token_id = -1;         // the prompt of an empty string; -1: an empty prompt is refused
  int64_t max_prompt = 65536;        // tokens per prompt (--max-prompt)
  int64_t max_new_tokens = 1 << 20;  // largest max_tokens
  int64_t max_prompts = 64;          // prompts (choices) in one request
  SpeculativeParams speculative;     // the server's defaults (serve --draft-*); a request's draft_* fields override
  bool draft_model_loaded = false;   // whether requests may ask for "draft_model": true
  bool draft_mtp_loaded = false;     // whether requests may ask for "draft_mtp": true (serve --draft-mtp)
};

struct CompletionRequest {
  std::vector<std::vector<int32_t>> prompts;  // one choice each, in order
  GenerateRequest base;                       // everything but the prompt and the callback
  bool stream = false;
  bool include_usage = false;  // stream_options.include_usage: a last chunk with the usage
  bool chat = false;           // the response is a chat completion
  ChatOutputFormat output;     // chat: how the answer splits into content, reasoning_content and tool_calls
};

// Parses a request body; throws ApiError 400 for malformed JSON or a body that is not an object.
nlohmann::json parse_json_body(const std::string& body);
// The same, keeping the client's key order (chat bodies: the template's tojson writes tools in that order).
nlohmann::ordered_json parse_ordered_json_body(const std::string& body);

// Throws ApiError (400, naming the field) for anything missing, of the wrong type or out of range.
// Structured output (response_format json_object / json_schema, grammar, json_schema) becomes base.grammar; a schema
// feature not supported is a 400 naming it. The ordered body keeps a schema's property order for generation.
CompletionRequest parse_completion(const nlohmann::json& body, const Tokenizer* tokenizer, const RequestLimits& limits);
CompletionRequest parse_completion(const nlohmann::ordered_json& body, const Tokenizer* tokenizer,
                                   const RequestLimits& limits);
// The prompt of a chat body (messages, tools, tool_choice, chat_template_kwargs, add_generation_prompt) rendered
// with the model's template: /apply-template's answer and the prompt of /v1/chat/completions. `body` keeps the
// client's key order (tojson in templates keeps it, as transformers does). `chat_template` null: the model has no
// chat template, a 400 saying so; a template that raises: a 400 carrying its message.
std::string render_chat_prompt(const nlohmann::ordered_json& body, const ChatTemplate* chat_template);
CompletionRequest parse_chat_completion(const nlohmann::ordered_json& body, const Tokenizer* tokenizer,
                                        const ChatTemplate* chat_template, const RequestLimits& limits);

// Field readers shared with the other endpoints: the value of body[name] checked for type (and range), or
// `fallback` when absent or null. Throw ApiError naming the field.
bool read_bool(const nlohmann::json& body, const char* name, bool fallback);
int64_t read_int(const nlohmann::json& body, const char* name, int64_t fallback, int64_t lo, int64_t hi);
std::vector<int32_t> read_token_ids(const nlohmann::json& value, const std::string& param, int64_t vocab_size);

}  // namespace mambacpp::server
