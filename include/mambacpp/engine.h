// The serving engine: continuous batching over one Model, with an exact state prefix cache.
//
//   mambacpp::Engine engine(*model, tokenizer.get(), {.max_seqs = 32});
//   mambacpp::GenerateRequest r;
//   r.prompt = tokenizer->encode("def parse_args(");
//   r.on_event = [](const mambacpp::RequestEvent& e) { std::cout << e.text; };
//   engine.submit(std::move(r));           // from any thread
//   while (engine.step()) {}               // one thread steps: one forward over every active row
//
// A step feeds one token to every decoding request and, within the step's token budget (`batch_tokens`), the next
// chunks of the prompts being prefilled. Requests wait in a FIFO queue until a state slot is free, and free it when
// they finish or are cancelled. Each request's tokens are those it gets alone: the rows of a step are independent
// sequences (greedy: the same tokens; sampling: the same tokens for the same seed).
//
// The prefix cache keeps copies of sequence states at exact token positions (a prompt's last position but one, a
// request's end, and every `state_checkpoint_interval` tokens of a long prompt), keyed by the tokens they stand
// for. A request whose prompt begins with a cached prefix starts from the longest one and prefills the rest; its
// last prompt token is always computed, so its logits exist. A hit changes no result beyond rounding (CPU fp32:
// logits within 1e-5 of recomputation).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "mambacpp/dtype.h"
#include "mambacpp/sampling.h"

namespace mambacpp {

class Model;
class Tokenizer;

using RequestId = uint64_t;

enum class FinishReason : uint8_t {
  Eos,         // the model's end-of-sequence token or one of the request's stop tokens (not part of the result)
  StopString,  // the text reached a stop string (the text is cut before it)
  Length,      // max_new_tokens generated
  Cancelled,   // cancel() was called
};
const char* finish_reason_name(FinishReason r);  // "eos" / "stop_string" / "length" / "cancelled"

struct TokenLogprob {
  int32_t id = 0;
  float logprob = 0.0f;  // log-softmax of the raw logits (before penalties and temperature), over the sampleable ids
};

// One generated token.
struct GeneratedToken {
  int32_t id = 0;
  float logprob = 0.0f;           // set when the request asked for logprobs (>= 0), else 0
  std::vector<TokenLogprob> top;  // the request's `logprobs` most likely ids at this position, best first
};

struct RequestTimings {
  double queue_ms = 0.0;     // submit -> admitted to a state slot
  double prompt_ms = 0.0;    // admitted -> first token sampled (prefill; time to first token = queue + prompt)
  double generate_ms = 0.0;  // first token -> finished
};

struct GenerateResult {
  RequestId id = 0;
  // Generated tokens, without the prompt and without a stop token. On a stop string: every token up to and
  // including the one that completed the stop string.
  std::vector<int32_t> tokens;
  std::vector<GeneratedToken> token_info;  // per token of `tokens`, with logprobs when asked for
  std::string text;                        // the bytes of `tokens`, cut before a stop string; empty without tokenizer
  FinishReason finish_reason = FinishReason::Length;
  int64_t prompt_tokens = 0;
  int64_t cached_prompt_tokens = 0;  // prompt tokens served from the prefix cache (not recomputed)
  uint64_t seed = 0;                 // the sampler's seed (the drawn one when none was given)
  int64_t draft_tokens = 0;           // tokens drafted for verification (speculative decoding)
  int64_t accepted_draft_tokens = 0;  // drafted tokens the target model agreed with (part of `tokens`, or a stop token)
  RequestTimings timings;
  std::string error;  // set when the request failed while running (e.g. the model produced NaN); reason Cancelled
};

// What a request reports as it runs, on the thread that calls step(). A finished request sends one last event
// with `finished` set and `result` pointing at its whole result (valid during the call only).
struct RequestEvent {
  RequestId id = 0;
  const GeneratedToken* token = nullptr;  // the new token, when this event carries one
  std::string_view text;                  // new text: complete UTF-8 characters, never the start of a stop string
  bool finished = false;
  const GenerateResult* result = nullptr;  // when finished
  int64_t prompt_done = 0;  // prompt tokens in the state so far (cached ones included); progress of a long prefill
};

// Speculative decoding of one request: each step drafts up to k tokens cheaply, the model verifies them in one forward
// over [last token, drafts], and the state lands on the accepted prefix (rejected tokens leave no trace in the state,
// the KV rows or the prefix cache). A verify row is a prefill piece, equal to decode steps up to rounding (as a
// prefix-cache hit), so greedy tokens are those of plain decoding but at near-ties. Sampling: the rejection rule
// keeps the model's distribution (the draws differ from plain decoding's for the same seed; a seed still gives the
// same tokens in any batch). The first token is always a plain decode step's.
struct SpeculativeParams {
  int draft_ngram = 0;       // > 0: prompt lookup, continuing the last this many tokens' earlier occurrence
  bool draft_model = false;  // draft with the engine's draft model (EngineOptions::draft_model)
  bool draft_mtp = false;    // draft with the model's own multi-token-prediction block (EngineOptions::draft_mtp)
  int draft_max = 0;         // drafted tokens per step at most, in [0, 32]; 0: kDefaultDraftMax
  bool adaptive = true;      // shorten (and pause) drafting while drafts are rejected
  bool enabled() const { return draft_ngram > 0 || draft_model || draft_mtp; }
};
// The draft length when none is given (docs/benchmarks.md, "Speculative decoding").
constexpr int kDefaultDraftMax = 4;

struct GenerateRequest {
  std::vector<int32_t> prompt;            // >= 1 token (start with BOS when there is no text)
  int max_new_tokens = 128;               // 0 .. EngineOptions::max_new_tokens
  SamplingParams sampling;
  std::vector<int32_t> stop_tokens;       // generation ends before any of these (not part of the result)
  std::vector<std::string> stop_strings;  // generation ends when the text contains one (needs a tokenizer)
  bool ignore_eos = false;                // false: the model config's eos_token_id (when set) also stops
  int logprobs = -1;                      // -1: none; 0..20: each token's logprob and this many top alternatives
  std::string save_state;                 // when set: the state at the request's end is written to this file
  SpeculativeParams speculative;          // off by default; a request with a grammar never drafts
  // A GBNF grammar (mambacpp/grammar.h) the generated text follows; empty: none. Needs a tokenizer. The end-of-
  // sequence and stop tokens are allowed only where the grammar's text is complete; its rows are sampled from whole
  // rows of logits on the host (the device's top-k selection does not see the mask).
  std::string grammar;
  std::function<void(const RequestEvent&)> on_event;  // may be empty; called on the stepping thread
};

struct EngineOptions {
  int64_t max_seqs = 32;       // requests running at once (state slots)
  int64_t max_queue = 1024;    // requests waiting for a slot; submit() beyond that throws
  int64_t batch_tokens = 0;    // tokens per step (decode rows + prefill chunks); 0: the model's max_batch_tokens
  int64_t max_prompt = 65536;  // longer prompts are refused
  int64_t max_new_tokens = 1 << 20;  // larger requests are refused
  int64_t state_cache_mb = 1024;     // prefix cache budget, MiB, in the backend's memory (device memory on a GPU); 0: off
  // The prefix cache's disk tier (src/engine/prefix_cache.h): a directory of state files that outlives the process,
  // and its budget in MiB; empty: none. Needs state_cache_mb > 0 (a snapshot goes to disk as it enters memory).
  std::string state_cache_dir;
  int64_t state_cache_disk_mb = 0;
  // Prompt positions (multiples of this) whose state is cached; 0: none. A multiple of batch_tokens keeps the
  // prefill's chunk boundaries where they are (docs/engine.md).
  int64_t state_checkpoint_interval = 2048;
  DType state_dtype = DType::F32;
  bool device_sampling = true;  // sample from top candidates selected next to the logits when the chain allows
  // A smaller model drafting for requests that ask for it (SpeculativeParams::draft_model): same vocabulary size,
  // any family; it keeps its own state slot per request, in step with the request's. Must outlive the engine.
  const Model* draft_model = nullptr;
  // Load the model's multi-token-prediction block (Nemotron-H checkpoints with num_nextn_predict_layers; model/mtp.h)
  // for requests that ask for it (SpeculativeParams::draft_mtp); the engine refuses a model without one. It keeps its
  // own state slot per request, fed with the model's hidden states of the committed tokens.
  bool draft_mtp = false;
};

struct EngineStats {
  int64_t running = 0, queued = 0;
  int64_t running_peak = 0;  // the most requests that held a state slot in one step, since the engine started
  int64_t cache_entries = 0, cache_bytes = 0, cache_budget_bytes = 0;
  int64_t cache_hits = 0, cache_misses = 0, cached_tokens = 0;  // over every admitted request
  int64_t steps = 0;
  int64_t draft_tokens = 0, accepted_draft_tokens = 0;  // over every verification since the engine started
  int64_t verify_steps = 0;  // steps that ran a verify forward (speculation; a refused probe runs none)
};

class Engine {
 public:
  // `tokenizer` may be null (token-ids-only use: no text, no stop strings). Both must outlive the engine.
  Engine(const Model& model, const Tokenizer* tokenizer, const EngineOptions& options = {});
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  // Queues a request. Throws Error (and changes nothing) on a bad request: empty or too long prompt, token ids out
  // of range, max_new_tokens out of range, bad sampling parameters, stop strings without a tokenizer, logprobs
  // outside [-1, 20], or a full queue. Thread-safe.
  RequestId submit(GenerateRequest request);
  // Cancels a queued or running request: it sends its finished event (reason Cancelled) at the next step and
  // never another. Returns false when it has already finished. Throws Error for an id never submitted.
  // Thread-safe.
  bool cancel(RequestId id);

  // One forward over every active row; returns false when there was nothing to do (no request queued or running).
  // One thread at a time.
  bool step();
  // Blocks until a request is queued or `timeout_ms` passes; true when there is work. Thread-safe.
  bool wait_for_work(int64_t timeout_ms);
  // Runs `requests` to completion (with whatever else is queued) and returns their results in order. They are
  // validated first (one bad request: Error, nothing queued) and queued whole, whatever max_queue says.
  std::vector<GenerateResult> run(std::vector<GenerateRequest> requests);

  // Reads a state file (mambacpp/state.h) into the prefix cache; returns the tokens it stands for. A request whose
  // prompt continues them prefills only its new tokens. Throws Error for a file of another model or a corrupt one.
  // On the stepping thread (or while none steps), as clear_cache().
  std::vector<int32_t> load_state(const std::string& path);
  // Drops every cached state.
  void clear_cache();

  EngineStats stats() const;  // as of the last step; thread-safe
  const EngineOptions& options() const;
  const Model& model() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// Sets request i's seed to seed + i (seed_given = true), so that request i reruns alone with seed + i.
void assign_batch_seeds(std::span<GenerateRequest> requests, uint64_t seed);

}  // namespace mambacpp
