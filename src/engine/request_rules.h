// The engine's rules for one request: what it may ask for, where its stop strings end the text, and the logprobs
// reported from a row of logits on the host.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "mambacpp/engine.h"

namespace mambacpp {

inline constexpr int kMaxLogprobs = 20;

// What a request is checked against (the model's and the engine's limits).
struct RequestLimits {
  int64_t vocab = 0;
  int64_t bos_token_id = -1;
  int64_t max_prompt = 0;
  int64_t max_new_tokens = 0;
  bool has_tokenizer = false;
  bool has_draft_model = false;
  bool has_draft_mtp = false;
};

// Throws an error naming the field, the allowed values and what was found; changes nothing.
void validate_request(const GenerateRequest& r, const RequestLimits& limits);

// Length of the longest suffix of `text` that is a proper prefix of some stop string: text that must not be
// streamed yet, because the next token may complete the stop string.
size_t stop_prefix_holdback(std::string_view text, const std::vector<std::string>& stops);

// The earliest occurrence of any stop string in `text` at or after `from`, or npos.
size_t find_stop(std::string_view text, size_t from, const std::vector<std::string>& stops);

// Log-softmax over the whole row on the host, as select_outputs computes it on a backend (f32 max and sum): the
// chosen token's logprob and the n best, ties to the lower id.
void host_logprobs(std::span<const float> row, int n, GeneratedToken& tok);

}  // namespace mambacpp
