// The generation loop of generator.h: validate every request, prefill all prompts in one forward call, then decode
// one token per active request per call, sampling, stopping and streaming text for each request on its own.
#include "engine/generator.h"

#include <algorithm>
#include <chrono>
#include <limits>
#include <optional>
#include <set>

#include "engine/utf8_stream.h"
#include "mambacpp/error.h"
#include "mambacpp/model.h"
#include "mambacpp/state.h"
#include "mambacpp/tokenizer.h"

namespace mambacpp {

const char* stop_reason_name(GenerateResult::StopReason r) {
  switch (r) {
    case GenerateResult::Eos: return "eos";
    case GenerateResult::StopString: return "stop_string";
    case GenerateResult::Length: return "length";
  }
  return "?";
}

void assign_batch_seeds(std::span<GenerateRequest> requests, uint64_t seed) {
  for (size_t i = 0; i < requests.size(); ++i) {
    requests[i].sampling.seed = seed + i;
    requests[i].sampling.seed_given = true;
  }
}

namespace {

using Clock = std::chrono::steady_clock;

double ms_between(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double, std::milli>(b - a).count();
}

// Length of the longest suffix of `text` that is a proper prefix of some stop string: text that must not be
// streamed yet, because the next token may complete the stop string.
size_t stop_prefix_holdback(std::string_view text, const std::vector<std::string>& stops) {
  size_t best = 0;
  for (const std::string& s : stops) {
    for (size_t len = std::min(s.size() - 1, text.size()); len > best; --len) {
      if (text.substr(text.size() - len) == std::string_view(s).substr(0, len)) {
        best = len;
        break;
      }
    }
  }
  return best;
}

// The earliest occurrence of any stop string in `text` at or after `from`, or npos.
size_t find_stop(std::string_view text, size_t from, const std::vector<std::string>& stops) {
  size_t best = std::string_view::npos;
  for (const std::string& s : stops) best = std::min(best, text.find(s, from));
  return best;
}

// One request in flight.
struct Run {
  const GenerateRequest* request = nullptr;
  size_t index = 0;
  int64_t slot = 0;
  std::optional<Sampler> sampler;
  std::set<int32_t> stop_tokens;
  size_t max_stop_len = 0;
  size_t emitted = 0;     // bytes of result.text already streamed
  int32_t next = 0;       // the token to feed in the next decode call
  bool active = true;
  GenerateResult result;
};

class BatchGenerator {
 public:
  BatchGenerator(const Model& model, StateCache& state, std::span<const GenerateRequest> requests,
                 const Tokenizer* tokenizer, const GenerateOptions& options)
      : model_(model), state_(state), tokenizer_(tokenizer), options_(options) {
    const ModelConfig& cfg = model.config();
    vocab_ = cfg.vocab_size;
    // Padding rows of the embedding (ids the tokenizer does not know) must never be sampled.
    sample_limit_ = tokenizer ? std::min<int64_t>(vocab_, tokenizer->vocab_size()) : vocab_;
    if (!options.slots.empty() && options.slots.size() != requests.size())
      fail("generate: expected one slot per request (", requests.size(), "), found ", options.slots.size());
    std::set<int64_t> used_slots;
    runs_.resize(requests.size());
    for (size_t i = 0; i < requests.size(); ++i) {
      const GenerateRequest& r = requests[i];
      Run& run = runs_[i];
      run.request = &r;
      run.index = i;
      run.slot = options.slots.empty() ? static_cast<int64_t>(i) : options.slots[i];
      state.check_slot(run.slot, "generate: request slot");
      if (!used_slots.insert(run.slot).second)
        fail("generate: request ", i, " uses slot ", run.slot, ", which an earlier request already uses");
      if (r.prompt.empty()) {
        if (cfg.bos_token_id >= 0)
          fail("generate: request ", i, " has an empty prompt; Mamba needs at least one token to start from "
               "(use the BOS token ", cfg.bos_token_id, " as the prompt)");
        fail("generate: request ", i, " has an empty prompt; Mamba needs at least one token to start from "
             "(use a BOS token as the prompt)");
      }
      for (int32_t t : r.prompt)
        if (t < 0 || t >= vocab_) fail("generate: request ", i, ": prompt token ", t, " outside [0, ", vocab_, ")");
      if (r.max_new_tokens < 0)
        fail("generate: request ", i, ": max_new_tokens must be >= 0, found ", r.max_new_tokens);
      if (!r.stop_strings.empty() && !tokenizer)
        fail("generate: request ", i, " has stop strings, but there is no tokenizer to turn tokens into text "
             "(token-ids-only model); use stop tokens instead");
      for (const std::string& s : r.stop_strings) {
        if (s.empty()) fail("generate: request ", i, ": a stop string is empty");
        run.max_stop_len = std::max(run.max_stop_len, s.size());
      }
      run.sampler.emplace(r.sampling, vocab_);  // validates the sampling parameters
      run.result.seed = run.sampler->seed();
      run.stop_tokens.insert(r.stop_tokens.begin(), r.stop_tokens.end());
      if (!r.ignore_eos && cfg.eos_token_id >= 0) run.stop_tokens.insert(static_cast<int32_t>(cfg.eos_token_id));
      // The prompt counts for the repetition penalty (as in llama.cpp); only the window's worth matters.
      const size_t window = static_cast<size_t>(r.sampling.repeat_last_n);
      for (size_t k = r.prompt.size() - std::min(window, r.prompt.size()); k < r.prompt.size(); ++k)
        run.sampler->accept(r.prompt[k]);
    }
  }

  std::vector<GenerateResult> run() {
    if (runs_.empty()) return {};
    if (options_.reset_slots)
      for (const Run& r : runs_) state_.reset(r.slot);

    const Clock::time_point t0 = Clock::now();
    std::vector<Sequence> seqs;
    std::vector<Run*> active;
    for (Run& r : runs_) {
      seqs.push_back(Sequence::tokens(r.request->prompt, r.slot));
      active.push_back(&r);
    }
    ForwardResult out = forward(seqs, active, options_.on_prefill_progress);
    const Clock::time_point t_prefill = Clock::now();
    prefill_end_ = t_prefill;
    for (Run& r : runs_) r.result.prompt_ms = ms_between(t0, t_prefill);
    for (size_t i = 0; i < runs_.size(); ++i) {
      if (runs_[i].request->max_new_tokens == 0) {
        finish(runs_[i], GenerateResult::Length, t_prefill);
      } else {
        step(runs_[i], sample(runs_[i], out, i), t_prefill);
      }
    }

    // Decode: one forward call per step, one token for each request still running.
    for (;;) {
      active.clear();
      seqs.clear();
      for (Run& r : runs_) {
        if (!r.active) continue;
        active.push_back(&r);
        seqs.push_back(Sequence::tokens(std::span<const int32_t>(&r.next, 1), r.slot));
      }
      if (active.empty()) break;
      out = forward(seqs, active, {});
      const Clock::time_point now = Clock::now();
      for (size_t k = 0; k < active.size(); ++k) step(*active[k], sample(*active[k], out, k), now);
    }

    std::vector<GenerateResult> results;
    for (Run& r : runs_) results.push_back(std::move(r.result));
    return results;
  }

 private:
  // One forward call for `runs` (sequence i is runs[i]'s). With device sampling, and when every run that will
  // sample from it can finish on top candidates (runs that sample nothing ask for one), only those come back.
  ForwardResult forward(const std::vector<Sequence>& seqs, const std::vector<Run*>& runs,
                        const std::function<void(int64_t, int64_t)>& on_progress) {
    bool candidates = options_.device_sampling;
    for (const Run* r : runs)
      if (r->request->max_new_tokens > 0 && r->sampler->params().candidates_needed() == 0) candidates = false;
    ForwardResult out;
    if (!candidates) {
      out = model_.forward(state_, seqs, Output::LastLogits, on_progress);
      MAMBACPP_ASSERT(out.rows == static_cast<int64_t>(runs.size()) && out.cols == vocab_);
      return out;
    }
    std::vector<TopKRequest> requests(runs.size());
    for (size_t i = 0; i < runs.size(); ++i) {
      const Sampler& s = *runs[i]->sampler;
      requests[i].k = std::max(1, s.params().candidates_needed());
      requests[i].limit = sample_limit_;
      requests[i].repeat_penalty = s.params().repeat_penalty;
      requests[i].penalized = s.penalized_ids();
    }
    out = model_.forward_top_k(state_, seqs, requests, on_progress);
    MAMBACPP_ASSERT(out.candidates.size() == runs.size());
    return out;
  }

  // The next token of `r` from row i of `out` (candidates or logits, whichever forward() returned).
  int32_t sample(Run& r, const ForwardResult& out, size_t i) {
    if (!out.candidates.empty()) return r.sampler->sample_candidates(out.candidates[i]);
    const std::span<const float> logits = out.row(static_cast<int64_t>(i));
    if (sample_limit_ < vocab_) {
      std::vector<float> masked(logits.begin(), logits.end());
      std::fill(masked.begin() + sample_limit_, masked.end(), -std::numeric_limits<float>::infinity());
      return r.sampler->sample(masked);
    }
    return r.sampler->sample(logits);
  }

  void step(Run& r, int32_t token, Clock::time_point now) {
    if (r.stop_tokens.count(token)) return finish(r, GenerateResult::Eos, now);

    r.result.tokens.push_back(token);
    r.sampler->accept(token);
    r.next = token;
    if (tokenizer_) {
      std::string& text = r.result.text;
      const size_t old_size = text.size();
      text += tokenizer_->token_bytes(token);
      if (r.max_stop_len > 0) {
        // A new occurrence must end in the new bytes, so it starts at most max_stop_len - 1 bytes before them.
        const size_t from = old_size - std::min(old_size, r.max_stop_len - 1);
        const size_t pos = find_stop(text, from, r.request->stop_strings);
        if (pos != std::string::npos) {
          MAMBACPP_ASSERT(pos >= r.emitted);  // the held-back text covered every possible start
          text.resize(pos);
          return finish(r, GenerateResult::StopString, now);
        }
      }
    }
    if (static_cast<int>(r.result.tokens.size()) >= r.request->max_new_tokens)
      return finish(r, GenerateResult::Length, now);
    stream(r, /*final=*/false);
  }

  // Sends the text that is safe to show: complete UTF-8 characters that cannot be the start of a stop string.
  void stream(Run& r, bool final) {
    if (!options_.on_text || !tokenizer_) return;
    const std::string& text = r.result.text;
    size_t end = text.size();
    if (!final) {
      end -= stop_prefix_holdback(text, r.request->stop_strings);
      end = utf8_complete_prefix(std::string_view(text).substr(0, end));
    }
    if (end <= r.emitted) return;
    options_.on_text(r.index, std::string_view(text).substr(r.emitted, end - r.emitted));
    r.emitted = end;
  }

  void finish(Run& r, GenerateResult::StopReason reason, Clock::time_point now) {
    r.result.stop_reason = reason;
    r.result.generate_ms = ms_between(prefill_end_, now);
    r.active = false;
    stream(r, /*final=*/true);
  }

  const Model& model_;
  StateCache& state_;
  const Tokenizer* tokenizer_;
  const GenerateOptions& options_;
  int64_t vocab_ = 0;
  int64_t sample_limit_ = 0;
  std::vector<Run> runs_;
  Clock::time_point prefill_end_;
};

}  // namespace

std::vector<GenerateResult> generate(const Model& model, StateCache& state, std::span<const GenerateRequest> requests,
                                     const Tokenizer* tokenizer, const GenerateOptions& options) {
  return BatchGenerator(model, state, requests, tokenizer, options).run();
}

GenerateResult generate(const Model& model, const GenerateRequest& request, const Tokenizer* tokenizer,
                        const TextCallback& on_text) {
  std::unique_ptr<StateCache> state = model.create_state(1);
  GenerateOptions options;
  options.on_text = on_text;
  return std::move(generate(model, *state, std::span<const GenerateRequest>(&request, 1), tokenizer, options).front());
}

}  // namespace mambacpp
