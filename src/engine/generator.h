// Batched text generation on one Model + StateCache: each request owns one state slot and one Sampler. All prompts
// are prefilled in a single forward call (different lengths, no padding: Mamba sequences are independent), then
// every step runs one forward call with one token for each request still active.
//
// Reproducibility: a request gives the same tokens whether it runs alone or in a batch, as long as the model's
// logits for a sequence do not depend on the other sequences of the call (greedy), and its seed is the same
// (sampling: each request's Sampler is seeded from its own SamplingParams). assign_batch_seeds() gives a batch the
// seeds seed, seed + 1, ... so that request i reruns alone with seed + i.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "engine/sampler.h"

namespace mambacpp {

class Model;
class StateCache;
class Tokenizer;

struct GenerateRequest {
  std::vector<int32_t> prompt;             // >= 1 token (start with BOS when there is no text)
  int max_new_tokens = 128;                // >= 0
  SamplingParams sampling;
  std::vector<int32_t> stop_tokens;        // generation ends before any of these (not part of the result)
  std::vector<std::string> stop_strings;   // generation ends when the text contains one (needs a tokenizer)
  bool ignore_eos = false;                 // false: the model config's eos_token_id (when set) also stops
};

struct GenerateResult {
  enum StopReason { Eos, StopString, Length };

  // Generated tokens, without the prompt and without a stop token. On a stop string: every token up to and
  // including the one that completed the stop string (the text of the last ones may be partly or wholly cut).
  std::vector<int32_t> tokens;
  // The bytes of `tokens` through Tokenizer::token_bytes (special tokens included), cut just before the first
  // occurrence of a stop string. Empty without a tokenizer.
  std::string text;
  StopReason stop_reason = Length;
  double prompt_ms = 0.0;    // the batch's prefill call (shared by every request of the batch)
  double generate_ms = 0.0;  // from the end of the prefill to this request's last token
  uint64_t seed = 0;         // the sampler's seed (the drawn one when none was given): reruns with it reproduce
};

const char* stop_reason_name(GenerateResult::StopReason r);  // "eos" / "stop_string" / "length"

// Streaming: pieces of each request's text, in order, each ending on a complete UTF-8 character (only the last piece
// may end in an incomplete one); text that might be the start of a stop string is held back until it is not. The
// concatenation of a request's pieces equals its GenerateResult::text.
using TextCallback = std::function<void(size_t request_index, std::string_view piece)>;

struct GenerateOptions {
  std::vector<int64_t> slots;  // state slot of request i; empty: slot i
  // true: start from a fresh state. false: the prompt continues what the slot holds (e.g. a chat). Afterwards a
  // slot holds the prompt and every generated token except the last one of `tokens` (sampled, never fed); after a
  // stop token it holds all of `tokens` (the stop token is not fed either).
  bool reset_slots = true;
  TextCallback on_text;        // may be empty
  std::function<void(int64_t done, int64_t total)> on_prefill_progress;  // prompt tokens processed; may be empty
  // true: when every request's sampling chain allows it (greedy, or 1 <= top_k <= kMaxTopK), the backend selects
  // each row's top candidates next to the logits and only those leave the device (Model::forward_top_k); else
  // whole logits rows come back. The tokens are the same either way; false forces whole rows.
  bool device_sampling = true;
};

// Runs `requests` to completion. `tokenizer` may be null for token-ids-only models: then text is empty, stop
// strings are rejected and no text is streamed. When given, token ids at or above tokenizer->vocab_size() (padding
// rows of the embedding) are never sampled. Throws Error on a bad request before touching any state.
std::vector<GenerateResult> generate(const Model& model, StateCache& state, std::span<const GenerateRequest> requests,
                                     const Tokenizer* tokenizer, const GenerateOptions& options = {});

// One request on a fresh one-slot state.
GenerateResult generate(const Model& model, const GenerateRequest& request, const Tokenizer* tokenizer,
                        const TextCallback& on_text = {});

// Sets request i's seed to seed + i (seed_given = true).
void assign_batch_seeds(std::span<GenerateRequest> requests, uint64_t seed);

}  // namespace mambacpp
