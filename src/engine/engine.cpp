// The serving engine of mambacpp/engine.h.
//
// A request's life: queued (FIFO) -> admitted to a free state slot, starting from the longest cached prefix of its
// prompt -> prefill of prompt[cached, L-1) in chunks within each step's token budget (chunks end at multiples of
// the checkpoint interval, whose states are cached) -> the state at L-1 is cached and the last prompt token is fed
// as a one-token row, whose logits give the first sampled token -> one row per step, feeding the previous token
// -> finished: the state of every token fed is cached (and written to save_state), the slot is free.
//
// Stopping the prefill one token short is what makes a repeated or extended prompt a cache hit: a state that
// includes the last prompt token could not serve a prompt that ends there, whose logits must be computed.
//
// A step is one forward call over every row, or two when the backend replays decode steps as graphs: the
// prefill chunks first, then the one-token rows as a decode step.
//
// Speculating requests (SpeculativeParams) leave the one-token rows: each drafts k tokens (prompt lookup, or the
// draft model's own slot run k one-token steps from the committed tokens and restored afterwards), then one more
// forward verifies every such row [next, d1..dk] with logits at every position. The target's tokens are chosen row
// by row as decode would choose them; a request keeps the matching prefix plus the target's next token. Its slot was
// snapshotted before the verify: when a draft was refused, the snapshot is restored, so the state, the KV rows and
// everything cached from them stand for committed tokens only, and the kept tokens are fed again at the front of the
// request's next verify row (Run::unfed: no forward of their own; at a finish they run at once). A verify row is
// a split of the sequence like any prefill piece: its logits and states are those of decode steps up to rounding
// (CPU fp32: within 1e-5, tests/model_invariance_test.cpp), so greedy tokens are the plain ones but at near-ties.
//
// A request whose verifies have not been paying (low acceptance) drafts now and then as a probe: its drafts ride its
// one-token row, and the token that step samples checks the first; only when they match does the rest verify, in
// the same step. A refused probe costs its drafts alone. A draft model follows each prompt through its prefill
// chunks.
#include "mambacpp/engine.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <deque>
#include <limits>
#include <map>
#include <mutex>
#include <optional>
#include <random>
#include <set>
#include <unordered_set>

#include "engine/grammar_mask.h"
#include "engine/prefix_cache.h"
#include "engine/request_rules.h"
#include "engine/sampler.h"
#include "engine/speculative.h"
#include "engine/utf8_stream.h"
#include "mambacpp/error.h"
#include "mambacpp/model.h"
#include "mambacpp/state.h"
#include "mambacpp/tokenizer.h"
#include "model/mtp.h"
#include "model/step_pieces.h"

namespace mambacpp {

const char* finish_reason_name(FinishReason r) {
  switch (r) {
    case FinishReason::Eos: return "eos";
    case FinishReason::StopString: return "stop_string";
    case FinishReason::Length: return "length";
    case FinishReason::Cancelled: return "cancelled";
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

// One admitted request.
struct Run {
  RequestId id = 0;
  GenerateRequest req;
  int64_t slot = 0;
  std::optional<Sampler> sampler;
  std::optional<TokenConstraint> grammar;  // the request's grammar, where it has one
  std::set<int32_t> stop_tokens;
  size_t max_stop_len = 0;
  std::vector<int32_t> fed;  // the tokens committed to the slot's state: it holds all but the last `unfed`
  int64_t unfed = 0;         // after a refused draft, the kept tokens wait here to ride with the next verify (the
                             // slot stays at verify_snapshot's state until they are fed)
  bool decoding = false;     // false: prefilling prompt[fed.size(), L-1)
  int32_t next = 0;          // decoding: the token the next row feeds
  size_t emitted = 0;        // bytes of result.text already streamed
  bool done = false;
  GenerateResult result;
  Clock::time_point submitted, admitted, first_token;

  // Speculative decoding.
  DraftLength draft_length;
  std::vector<int32_t> draft;                   // this step's drafted tokens
  std::vector<std::vector<TokenProb>> draft_q;  // draft model, sampling: the distribution each draft was drawn from
  int draft_want = 0;                           // draft model: tokens to draft this step
  bool probe = false;       // this step's drafts ride its decode row: the step's own token checks the first one
  int probe_accepted = 0;   // a probe whose first draft the step's token matched: 1 while the rest verify
  int64_t draft_fed = 0;                        // draft model: the tokens of `fed` its slot stands for
  std::optional<Sampler> draft_sampler;         // draft model, sampling: the request's chain without its penalties
  std::mt19937_64 spec_rng;                     // sampling: the drafts' and the rejection rule's draws
  SlotSnapshot verify_snapshot;                 // the slot before a verify (storage reused from step to step)
  SlotSnapshot draft_snapshot;                  // the draft model's or MTP block's slot after its first draft
  int64_t mtp_fed = 0;            // MTP block: the positions p whose (h_p, token p+1) its slot has run
  std::vector<float> mtp_hidden;  // MTP block: the model's hidden states of positions [mtp_fed, fed.size()), not run
  bool landing = false;                         // verifying: finish() leaves the state's uses to finalize()
  const GeneratedToken* final_token = nullptr;  // the token finish() was given while landing

  int64_t prompt_len() const { return static_cast<int64_t>(req.prompt.size()); }
};

struct Queued {
  RequestId id;
  GenerateRequest req;
  Clock::time_point submitted;
};

// The prefix cache's budget in bytes; checked before the shift so that no value overflows.
int64_t state_cache_bytes(int64_t mb) {
  if (mb < 0 || mb > (int64_t{1} << 32))
    fail("engine: state_cache_mb must be in [0, 2^32], found ", mb);
  return mb << 20;
}

}  // namespace

struct Engine::Impl {
  const Model& model;
  const Tokenizer* tokenizer;
  EngineOptions options;
  int64_t vocab = 0;
  int64_t sample_limit = 0;  // ids at or above (padding rows of the embedding) are never sampled
  std::unique_ptr<StateCache> state;
  std::unique_ptr<StateCache> draft_state;  // the draft model's slots, one per state slot
  std::unique_ptr<MtpHead> mtp;             // the model's MTP block (EngineOptions::draft_mtp)
  double verify_cost = 0.0;                 // speculation: a verify's extra cost in decode steps (the draft gate)
  std::unique_ptr<StateCache> mtp_state;    // its slots, one per state slot
  std::shared_ptr<const TokenTrie> vocab_trie;  // the tokens' bytes, built for the first request with a grammar
  PrefixCache cache;

  // Shared with submit()/cancel() on other threads.
  mutable std::mutex mutex;
  std::condition_variable work;
  std::deque<Queued> queue;
  std::unordered_set<RequestId> unfinished;  // queued or running
  std::unordered_set<RequestId> cancels;     // asked for, applied at the next step
  RequestId next_id = 1;

  // Owned by the stepping thread.
  std::vector<std::unique_ptr<Run>> runs;  // admission order
  std::vector<int64_t> free_slots;
  EngineStats counters;
  EngineStats published;  // under `mutex`: counters as of the last step

  Impl(const Model& m, const Tokenizer* t, const EngineOptions& o)
      : model(m), tokenizer(t), options(o), cache(state_cache_bytes(o.state_cache_mb)) {
    if (options.batch_tokens == 0) options.batch_tokens = m.load_options().max_batch_tokens;
    if (options.max_seqs < 1) fail("engine: max_seqs must be >= 1, found ", options.max_seqs);
    if (options.max_queue < 0) fail("engine: max_queue must be >= 0, found ", options.max_queue);
    if (options.batch_tokens < 1) fail("engine: batch_tokens must be >= 1, found ", options.batch_tokens);
    if (options.max_prompt < 1) fail("engine: max_prompt must be >= 1, found ", options.max_prompt);
    if (options.max_new_tokens < 0) fail("engine: max_new_tokens must be >= 0, found ", options.max_new_tokens);
    if (options.state_checkpoint_interval < 0)
      fail("engine: state_checkpoint_interval must be >= 0, found ", options.state_checkpoint_interval);
    vocab = m.config().vocab_size;
    verify_cost = verify_cost_in_steps(m.decode_graphs());
    sample_limit = t ? std::min<int64_t>(vocab, t->vocab_size()) : vocab;
    state = m.create_state(options.max_seqs, options.state_dtype);
    if (!options.state_cache_dir.empty())
      cache.enable_disk(options.state_cache_dir, state_cache_bytes(options.state_cache_disk_mb), *state);
    for (int64_t s = options.max_seqs - 1; s >= 0; --s) free_slots.push_back(s);
    if (const Model* d = options.draft_model) {
      if (d->config().vocab_size != vocab)
        fail("engine: the draft model '", d->directory(), "' has a vocabulary of ", d->config().vocab_size,
             " ids, the model ", vocab, "; a draft model must share the model's vocabulary");
      draft_state = d->create_state(options.max_seqs, options.state_dtype);
    }
    if (options.draft_mtp) {
      mtp = MtpHead::load(m);
      mtp_state = mtp->create_state(options.max_seqs, options.state_dtype);
    }
  }

  // ---- Validation (before anything changes) -------------------------------------------------------------------
  void validate(const GenerateRequest& r) const {
    validate_request(r, RequestLimits{vocab, model.config().bos_token_id, options.max_prompt, options.max_new_tokens,
                                      tokenizer != nullptr, options.draft_model != nullptr, mtp != nullptr});
  }

  // ---- Admission ----------------------------------------------------------------------------------------------
  void admit(Queued q, Clock::time_point now) {
    auto run = std::make_unique<Run>();
    Run& r = *run;
    r.id = q.id;
    r.req = std::move(q.req);
    r.submitted = q.submitted;
    r.admitted = now;
    r.slot = free_slots.back();
    free_slots.pop_back();
    r.sampler.emplace(r.req.sampling, vocab);
    r.result.id = r.id;
    r.result.seed = r.sampler->seed();
    r.result.prompt_tokens = r.prompt_len();
    r.result.timings.queue_ms = ms_between(r.submitted, now);
    r.stop_tokens.insert(r.req.stop_tokens.begin(), r.req.stop_tokens.end());
    if (!r.req.ignore_eos) {
      const ModelConfig& c = model.config();
      if (c.eos_token_id >= 0) r.stop_tokens.insert(static_cast<int32_t>(c.eos_token_id));
      for (int64_t id : c.extra_eos_token_ids) r.stop_tokens.insert(static_cast<int32_t>(id));
    }
    for (const std::string& s : r.req.stop_strings) r.max_stop_len = std::max(r.max_stop_len, s.size());
    if (!r.req.grammar.empty()) {
      if (!vocab_trie) vocab_trie = TokenTrie::from_tokenizer(*tokenizer, sample_limit);
      r.grammar.emplace(Grammar::parse(r.req.grammar), vocab_trie);
    }
    // The prompt counts for the repetition penalty (as in llama.cpp); only the window's worth matters.
    const size_t window = static_cast<size_t>(r.req.sampling.repeat_last_n), L = r.req.prompt.size();
    for (size_t k = L - std::min(window, L); k < L; ++k) r.sampler->accept(r.req.prompt[k]);

    // Start from the longest cached prefix that leaves the last prompt token to compute.
    const PrefixCache::Hit hit = cache.lookup(r.req.prompt, r.prompt_len() - 1);
    if (hit.snapshot) {
      state->restore(r.slot, *hit.snapshot);
      r.fed.assign(r.req.prompt.begin(), r.req.prompt.begin() + hit.length);
      ++counters.cache_hits;
      counters.cached_tokens += hit.length;
    } else {
      state->reset(r.slot);
      if (cache.budget() > 0) ++counters.cache_misses;
    }
    r.result.cached_prompt_tokens = hit.length;
    const SpeculativeParams& sp = r.req.speculative;
    if (sp.enabled()) {
      r.draft_length = DraftLength(sp.draft_max > 0 ? sp.draft_max : kDefaultDraftMax, sp.adaptive);
      r.spec_rng.seed(r.sampler->seed() ^ 0x9e3779b97f4a7c15ULL);  // apart from the sampler's own stream
      if (sp.draft_mtp) {
        mtp_state->reset(r.slot);
        r.mtp_fed = static_cast<int64_t>(r.fed.size());  // a cached prefix's positions stay unseen by the block
      }
      if (sp.draft_model) draft_state->reset(r.slot);
      if (sp.draft_model || sp.draft_mtp) {
        if (!r.req.sampling.greedy()) {
          SamplingParams q = r.req.sampling;
          q.repeat_penalty = 1.0f, q.presence_penalty = 0.0f, q.frequency_penalty = 0.0f;
          r.draft_sampler.emplace(q, vocab);
        }
      }
    }
    enter_decode_if_ready(r);
    runs.push_back(std::move(run));
  }

  void enter_decode_if_ready(Run& r) {
    if (!r.decoding && static_cast<int64_t>(r.fed.size()) == r.prompt_len() - 1) {
      r.decoding = true;
      r.next = r.req.prompt.back();
    }
  }

  // ---- The prefix cache ---------------------------------------------------------------------------------------
  void remember(const Run& r) {
    if (cache.budget() <= 0 || r.fed.empty() || static_cast<int64_t>(state->slot_bytes()) > cache.budget()) return;
    if (cache.contains(r.fed)) return;
    cache.insert(r.fed, state->snapshot(r.slot));
  }

  // ---- Events -------------------------------------------------------------------------------------------------
  // Sends the text that is safe to show (complete UTF-8 characters that cannot start a stop string) with `token`.
  void emit(Run& r, const GeneratedToken* token, bool final) {
    const std::string& text = r.result.text;
    size_t end = text.size();
    if (!final) {
      end -= stop_prefix_holdback(text, r.req.stop_strings);
      end = utf8_complete_prefix(std::string_view(text).substr(0, end));
    }
    std::string_view piece;
    if (end > r.emitted) piece = std::string_view(text).substr(r.emitted, end - r.emitted), r.emitted = end;
    if (!r.req.on_event || (!token && piece.empty() && !final)) return;
    RequestEvent e;
    e.id = r.id;
    e.token = token;
    e.text = piece;
    e.finished = final;
    e.result = final ? &r.result : nullptr;
    e.prompt_done = static_cast<int64_t>(std::min(r.fed.size(), r.req.prompt.size()));
    r.req.on_event(e);
  }

  void finish(Run& r, FinishReason reason, Clock::time_point now, const GeneratedToken* token = nullptr) {
    r.result.finish_reason = reason;
    if (r.first_token == Clock::time_point{}) {
      r.result.timings.prompt_ms = ms_between(r.admitted, now);
    } else {
      r.result.timings.generate_ms = ms_between(r.first_token, now);
    }
    r.done = true;
    if (r.landing) {  // verify() lands the state on the committed tokens first, then calls finalize()
      r.final_token = token;
      return;
    }
    finalize(r, token);
  }

  // What a finished request does with its state (cache it, save it), then its last event.
  void finalize(Run& r, const GeneratedToken* token) {
    // Verify feeds the tokens of a request it finishes; a cancel may come between two verifies.
    if (const std::string e = feed_unfed({&r}); !e.empty() && r.result.error.empty()) r.result.error = e;
    remember(r);
    if (!r.req.save_state.empty()) {
      try {
        state->save(r.slot, r.req.save_state, r.fed);
      } catch (const Error& e) {
        r.result.error = e.what();
      }
    }
    {
      std::lock_guard<std::mutex> lock(mutex);
      unfinished.erase(r.id);
    }
    emit(r, token, /*final=*/true);
  }

  // A token sampled for `r` (its logprobs filled in by the caller).
  // `sampler_accepted`: the sampler has already recorded the token (verification records as it goes).
  void accept_token(Run& r, GeneratedToken tok, Clock::time_point now, bool sampler_accepted = false) {
    if (r.first_token == Clock::time_point{}) {
      r.first_token = now;
      r.result.timings.prompt_ms = ms_between(r.admitted, now);
    }
    if (r.stop_tokens.count(tok.id)) return finish(r, FinishReason::Eos, now);
    if (r.grammar) r.grammar->accept(tok.id);
    r.result.tokens.push_back(tok.id);
    r.result.token_info.push_back(std::move(tok));
    const GeneratedToken* info = &r.result.token_info.back();
    if (!sampler_accepted) r.sampler->accept(info->id, /*generated=*/true);
    r.next = info->id;
    if (tokenizer) {
      std::string& text = r.result.text;
      const size_t old_size = text.size();
      text += tokenizer->token_bytes(info->id);
      if (r.max_stop_len > 0) {
        // A new occurrence must end in the new bytes, so it starts at most max_stop_len - 1 bytes before them.
        const size_t from = old_size - std::min(old_size, r.max_stop_len - 1);
        const size_t pos = find_stop(text, from, r.req.stop_strings);
        if (pos != std::string::npos) {
          MAMBACPP_ASSERT(pos >= r.emitted);  // the held-back text covered every possible start
          text.resize(pos);
          return finish(r, FinishReason::StopString, now, info);
        }
      }
    }
    if (static_cast<int>(r.result.tokens.size()) >= r.req.max_new_tokens)
      return finish(r, FinishReason::Length, now, info);
    // A model with a context limit: the next step would feed this token at position prompt + generated - 1, past
    // the last one the slot may hold, so the generation ends here as a length stop (as a server's max context does).
    const int64_t limit = model.context_limit();
    if (limit > 0 && r.prompt_len() + static_cast<int64_t>(r.result.tokens.size()) > limit)
      return finish(r, FinishReason::Length, now, info);
    emit(r, info, /*final=*/false);
  }

  void fail_run(Run& r, const std::string& message, Clock::time_point now) {
    r.result.error = message;
    finish(r, FinishReason::Cancelled, now);
  }

  // ---- Sampling -----------------------------------------------------------------------------------------------
  TopKRequest top_k_request(const Run& r) const {
    TopKRequest q;
    const Sampler& s = *r.sampler;
    q.k = std::max(1, s.params().candidates_needed());
    q.limit = sample_limit;
    q.repeat_penalty = s.params().repeat_penalty;
    q.penalized = s.penalized_ids();
    q.logprobs = r.req.logprobs;
    return q;
  }

  // The token of `r` from row i of `out`, with its logprobs when asked for.
  GeneratedToken sample(Run& r, const ForwardResult& out, size_t i) {
    GeneratedToken tok;
    if (!out.candidates.empty()) {
      const TopKCandidates& c = out.candidates[i];
      tok.id = r.sampler->sample_candidates(c);
      if (r.req.logprobs >= 0) {
        const RowLogprobs& lp = out.logprobs[i];
        for (size_t k = 0; k < lp.ids.size(); ++k) tok.top.push_back({lp.ids[k], lp.logprobs[k]});
        // The chosen id's raw logit: from the raw top list, else its candidate logit with the penalty undone.
        const auto in_top = std::find(lp.ids.begin(), lp.ids.end(), tok.id);
        if (in_top != lp.ids.end()) {
          tok.logprob = lp.logprobs[static_cast<size_t>(in_top - lp.ids.begin())];
        } else {
          const size_t k = static_cast<size_t>(std::find(c.ids.begin(), c.ids.end(), tok.id) - c.ids.begin());
          float logit = c.logits.at(k);
          const std::vector<int32_t> pen = r.sampler->penalized_ids();
          const float p = r.sampler->params().repeat_penalty;
          if (std::find(pen.begin(), pen.end(), tok.id) != pen.end()) logit = logit > 0.0f ? logit * p : logit / p;
          tok.logprob = logit - lp.log_normalizer;
        }
      }
      return tok;
    }
    std::span<const float> logits = out.row(static_cast<int64_t>(i));
    std::vector<float> masked;
    if (sample_limit < vocab || r.grammar) {
      masked.assign(logits.begin(), logits.end());
      std::fill(masked.begin() + sample_limit, masked.end(), -std::numeric_limits<float>::infinity());
      if (r.grammar) r.grammar->mask(masked, r.stop_tokens);
      tok.id = r.sampler->sample(masked);
    } else {
      tok.id = r.sampler->sample(logits);
    }
    if (r.req.logprobs >= 0) host_logprobs(logits.first(static_cast<size_t>(sample_limit)), r.req.logprobs, tok);
    return tok;
  }

  // ---- One step -----------------------------------------------------------------------------------------------
  bool step() {
    Clock::time_point now = Clock::now();
    std::vector<Queued> admitted, dropped;
    std::unordered_set<RequestId> cancelled;
    {
      std::lock_guard<std::mutex> lock(mutex);
      cancelled.swap(cancels);
      // Cancelled requests still in the queue leave it now.
      for (auto it = queue.begin(); it != queue.end();) {
        if (cancelled.count(it->id)) {
          unfinished.erase(it->id);
          dropped.push_back(std::move(*it));
          it = queue.erase(it);
        } else {
          ++it;
        }
      }
    }
    for (Queued& q : dropped) {  // their events, outside the lock (a callback may submit or cancel)
      GenerateResult result;
      result.id = q.id;
      result.prompt_tokens = static_cast<int64_t>(q.req.prompt.size());
      result.finish_reason = FinishReason::Cancelled;
      result.timings.queue_ms = ms_between(q.submitted, now);
      if (!q.req.on_event) continue;
      RequestEvent e;
      e.id = q.id;
      e.finished = true;
      e.result = &result;
      q.req.on_event(e);
    }
    for (auto& run : runs)
      if (cancelled.count(run->id) && !run->done) finish(*run, FinishReason::Cancelled, now);
    retire();
    {
      std::lock_guard<std::mutex> lock(mutex);
      while (!free_slots.empty() && !queue.empty() && admitted.size() < free_slots.size()) {
        admitted.push_back(std::move(queue.front()));
        queue.pop_front();
      }
    }
    for (Queued& q : admitted) admit(std::move(q), now);
    if (runs.empty()) {
      publish();
      return false;
    }
    ++counters.steps;
    counters.running_peak = std::max(counters.running_peak, static_cast<int64_t>(runs.size()));

    // The rows: every decoding request one token, then prefill chunks within the rest of the budget.
    std::vector<Run*> decode_rows, prefill_rows;
    std::vector<int64_t> prefill_len;
    for (auto& run : runs)
      if (run->decoding) decode_rows.push_back(run.get());
    // Speculating rows verify in a call of their own; they count one budget token each, as decode rows.
    std::vector<Run*> spec_rows = plan_speculation(decode_rows, now);
    int64_t budget = options.batch_tokens - static_cast<int64_t>(decode_rows.size() + spec_rows.size());
    if (decode_rows.empty() && spec_rows.empty()) budget = std::max<int64_t>(budget, 1);
    const int64_t interval = options.state_checkpoint_interval;
    for (auto& run : runs) {
      if (run->decoding || budget <= 0) continue;
      const int64_t pos = static_cast<int64_t>(run->fed.size());
      int64_t end = std::min(run->prompt_len() - 1, pos + budget);
      if (interval > 0) end = std::min(end, (pos / interval + 1) * interval);  // stop at the next checkpoint
      prefill_rows.push_back(run.get());
      prefill_len.push_back(end - pos);
      budget -= end - pos;
    }

    // Graph-replayed decode steps want their rows alone: prefill first, then the rows of one token (including
    // prompts that reach their last token now). Otherwise one call carries both.
    // Prefill chunks of requests drafting with the MTP block go in a call without one-token rows (it returns their
    // hidden states); those requests' first one-token row waits for the next step, whose verify hands the block the
    // hidden state of the last prompt token.
    const bool mtp_prefill = std::any_of(prefill_rows.begin(), prefill_rows.end(), [&](Run* r) { return uses_mtp(*r); });
    if (model.decode_graphs() || decode_rows.empty() || mtp_prefill) {
      if (!prefill_rows.empty()) {
        forward(prefill_rows, prefill_len, {}, now);
        for (Run* r : prefill_rows)
          if (!r->done && r->decoding && !uses_mtp(*r)) decode_rows.push_back(r);
      }
      if (!decode_rows.empty()) forward({}, {}, decode_rows, now);
    } else {
      forward(prefill_rows, prefill_len, decode_rows, now);
    }
    for (Run* r : decode_rows)
      if (r->probe) check_probe(*r, spec_rows);
    if (!spec_rows.empty()) verify(spec_rows, now);
    retire();
    publish();
    return true;
  }

  // Makes the counters readable from other threads (stats()).
  void publish() {
    EngineStats s = counters;
    s.running = static_cast<int64_t>(runs.size());
    s.cache_entries = cache.entries();
    s.cache_bytes = cache.bytes();
    s.cache_budget_bytes = cache.budget();
    std::lock_guard<std::mutex> lock(mutex);
    published = s;
  }

  // One forward call over prefill chunks (no logits needed) and one-token rows (sampled).
  void forward(const std::vector<Run*>& prefill, const std::vector<int64_t>& lens, const std::vector<Run*>& decode,
               Clock::time_point& now) {
    std::vector<Sequence> seqs;
    for (size_t i = 0; i < prefill.size(); ++i) {
      const Run& r = *prefill[i];
      seqs.push_back(Sequence::tokens(
          std::span<const int32_t>(r.req.prompt.data() + r.fed.size(), static_cast<size_t>(lens[i])), r.slot));
    }
    for (Run* r : decode) seqs.push_back(Sequence::tokens(std::span<const int32_t>(&r->next, 1), r->slot));
    std::vector<Run*> all(prefill);
    all.insert(all.end(), decode.begin(), decode.end());

    ForwardResult out;
    const bool mtp_hidden = std::any_of(prefill.begin(), prefill.end(), [&](Run* r) { return uses_mtp(*r); });
    try {
      if (decode.empty()) {
        out = model.forward(*state, seqs, mtp_hidden ? Output::Hidden : Output::None);
      } else {
        bool candidates = options.device_sampling;
        for (const Run* r : decode)
          if (r->req.max_new_tokens > 0 && (r->sampler->params().candidates_needed() == 0 || r->grammar))
            candidates = false;
        if (candidates) {
          std::vector<TopKRequest> reqs(seqs.size());  // prefill rows: the cheapest request, ignored
          for (size_t i = 0; i < decode.size(); ++i) reqs[prefill.size() + i] = top_k_request(*decode[i]);
          out = model.forward_top_k(*state, seqs, reqs);
        } else {
          out = model.forward(*state, seqs, Output::LastLogits);
        }
      }
    } catch (const std::exception& e) {
      // The call failed as a whole (nothing in it is trustworthy): its requests end with the error.
      now = Clock::now();
      for (Run* r : all) fail_run(*r, e.what(), now);
      return;
    }
    now = Clock::now();
    std::vector<Run*> mtp_runs;
    int64_t hidden_row = 0;
    for (size_t i = 0; i < prefill.size(); ++i) {
      Run& r = *prefill[i];
      if (mtp_hidden && uses_mtp(r)) {
        keep_mtp_hidden(r, out.values, hidden_row, lens[i]);
        mtp_runs.push_back(&r);
      }
      hidden_row += lens[i];
      r.fed.insert(r.fed.end(), r.req.prompt.begin() + static_cast<std::ptrdiff_t>(r.fed.size()),
                   r.req.prompt.begin() + static_cast<std::ptrdiff_t>(r.fed.size() + lens[i]));
      const int64_t pos = static_cast<int64_t>(r.fed.size());
      const int64_t interval = options.state_checkpoint_interval;
      if (pos == r.prompt_len() - 1 || (interval > 0 && pos % interval == 0)) remember(r);
      enter_decode_if_ready(r);
      if (r.req.on_event) {  // progress of the prefill
        RequestEvent e;
        e.id = r.id;
        e.prompt_done = pos;
        r.req.on_event(e);
      }
    }
    for (Run* r : mtp_runs) r->draft_want = 0;  // prefill: the block catches up, nothing is drafted
    if (!mtp_runs.empty()) run_mtp(mtp_runs, now);
    if (options.draft_model) prefill_draft(prefill, now);
    for (size_t i = 0; i < decode.size(); ++i) {
      Run& r = *decode[i];
      r.fed.push_back(r.next);
      if (r.req.max_new_tokens == 0) {
        finish(r, FinishReason::Length, now);
        continue;
      }
      try {
        accept_token(r, sample(r, out, prefill.size() + i), now);
      } catch (const std::exception& e) {  // e.g. a NaN logit in this row: only this request ends
        fail_run(r, e.what(), now);
      }
    }
  }

  // ---- Speculative decoding -----------------------------------------------------------------------------------
  // The row without the ids at or above sample_limit (never sampled): those set to -inf.
  std::span<const float> sampleable(std::span<const float> row, std::vector<float>& buf) const {
    if (sample_limit >= vocab) return row;
    buf.assign(row.begin(), row.end());
    std::fill(buf.begin() + sample_limit, buf.end(), -std::numeric_limits<float>::infinity());
    return buf;
  }

  // The tokens `r` may draft this step: its draft length, bounded so that the verify row's tokens stay within
  // max_new_tokens (the target adds one of its own) and the context limit. The first token is always a decode
  // step's: whether the last prompt token runs in the prefill's step or the next one depends on the batch, and what
  // a request drafts must depend on the request alone (a seed then gives the same tokens in any batch).
  int draft_budget(Run& r) const {
    if (!r.req.speculative.enabled() || r.req.max_new_tokens == 0 || r.first_token == Clock::time_point{} || r.grammar)
      return 0;
    // The request's own schedule (engine/speculative.h DraftLength::next_at): pauses aligned on its generated count,
    // so that paused rows decoding side by side probe in the same steps, and a gate on the verify's cost.
    int64_t k = r.draft_length.next_at(static_cast<int64_t>(r.result.tokens.size()),
                                              uses_mtp(r) ? 0.0 : verify_cost);  // MTP rows verify anyway
    k = std::min<int64_t>(k, r.req.max_new_tokens - static_cast<int64_t>(r.result.tokens.size()) - 1);
    const int64_t limit = model.context_limit();
    if (limit > 0) k = std::min<int64_t>(k, limit - static_cast<int64_t>(r.fed.size()) - 1);
    // The verify row [unfed tokens, next, drafts] stays a short piece, which the model runs with decode steps' bits.
    k = std::min<int64_t>(k, kStepPieceMaxLen - 1 - r.unfed);
    return static_cast<int>(std::max<int64_t>(k, 0));
  }

  // Drafts for the decoding requests that speculate; those with drafts (probes aside: they keep their decode row),
  // or with kept tokens to feed (Run::unfed), leave `decode_rows` and are returned. Requests drafting with the MTP
  // block are returned with or without drafts: their verify hands the block the model's hidden states.
  std::vector<Run*> plan_speculation(std::vector<Run*>& decode_rows, Clock::time_point& now) {
    std::vector<Run*> keep, spec, by_model, by_mtp;
    // Probes (engine/speculative.h DraftLength::pays): a row whose verifies have not been paying drafts as usual,
    // but keeps its decode row; the token the step samples there checks the first draft (check_probe). A refused
    // probe then costs only its drafts: no snapshot, no verify forward, no kept tokens to feed.
    const auto place = [&](Run* r) {
      if (r->draft.empty() && r->unfed == 0) return r->probe = false, keep.push_back(r);
      (r->probe ? keep : spec).push_back(r);
    };
    for (Run* r : decode_rows) {
      r->draft.clear();
      r->draft_q.clear();
      const int k = draft_budget(*r);
      r->probe = k > 0 && r->unfed == 0 && !uses_mtp(*r) && !r->draft_length.pays(verify_cost);
      if (uses_mtp(*r)) {
        r->draft_want = k;
        by_mtp.push_back(r);
        continue;
      }
      if (k > 0 && r->req.speculative.draft_model) {
        r->draft_want = k;
        by_model.push_back(r);
        continue;
      }
      if (k > 0) {
        std::vector<int32_t> context(r->fed);  // prompt and output so far
        context.push_back(r->next);
        r->draft = ngram_draft(context, r->req.speculative.draft_ngram, k);
      }
      place(r);
    }
    if (!by_model.empty()) {
      try {
        draft_with_model(by_model);
      } catch (const std::exception& e) {  // the draft model failed (e.g. NaN): its requests end with the error
        now = Clock::now();
        for (Run* r : by_model) {
          draft_state->reset(r->slot);
          fail_run(*r, std::string("draft model: ") + e.what(), now);
        }
      }
      for (Run* r : by_model)
        if (!r->done) place(r);
    }
    if (!by_mtp.empty()) {
      run_mtp(by_mtp, now);
      for (Run* r : by_mtp)
        if (!r->done) spec.push_back(r);
    }
    decode_rows = std::move(keep);
    return spec;
  }

  // After the decode step of a probe (plan_speculation): the token it sampled there is the target's choice after
  // `next`. When it is the first draft, the rest of the drafts verify in this step (rows: spec_rows), from the state
  // the step left; otherwise the drafts are dropped. Greedy: that token is the argmax, as the verify's would be;
  // sampling: it is drawn from the target's distribution, so the output keeps that distribution, and a deterministic
  // draft is kept with probability p(draft), as the rejection rule keeps it.
  void check_probe(Run& r, std::vector<Run*>& spec_rows) {
    r.probe = false;
    if (r.done) return;  // finished (or failed) in the step: nothing left to verify
    const int drafted = static_cast<int>(r.draft.size());
    if (r.next != r.draft.front()) {
      record_drafts(r, drafted, 0);
      r.draft.clear();
      r.draft_q.clear();
      return;
    }
    r.draft.erase(r.draft.begin());
    if (!r.draft_q.empty()) r.draft_q.erase(r.draft_q.begin());
    if (r.draft.empty()) return record_drafts(r, 1, 1);
    r.probe_accepted = 1;
    spec_rows.push_back(&r);
  }

  void record_drafts(Run& r, int drafted, int accepted) {
    r.result.draft_tokens += drafted;
    r.result.accepted_draft_tokens += accepted;
    counters.draft_tokens += drafted;
    counters.accepted_draft_tokens += accepted;
    r.draft_length.record(drafted, accepted, uses_mtp(r) ? 0.0 : verify_cost);
  }

  // The draft model follows each prefill chunk in the same step (one forward of its own), so that a request's first
  // draft does not run the whole prompt inside a decode step, where every other row would wait for it. A failure
  // ends those requests, as a failed draft does.
  void prefill_draft(const std::vector<Run*>& prefill, Clock::time_point& now) {
    std::vector<Run*> runs;
    std::vector<Sequence> seqs;
    for (Run* r : prefill) {
      const SpeculativeParams& sp = r->req.speculative;
      if (r->done || !sp.enabled() || !sp.draft_model || r->grammar || r->req.max_new_tokens == 0) continue;
      if (r->draft_fed >= static_cast<int64_t>(r->fed.size())) continue;
      runs.push_back(r);
      seqs.push_back(Sequence::tokens({r->fed.data() + r->draft_fed, r->fed.size() - static_cast<size_t>(r->draft_fed)}, r->slot));
    }
    if (seqs.empty()) return;
    try {
      options.draft_model->forward(*draft_state, seqs, Output::None);
    } catch (const std::exception& e) {
      now = Clock::now();
      for (Run* r : runs) {
        draft_state->reset(r->slot);
        fail_run(*r, std::string("draft model: ") + e.what(), now);
      }
      return;
    }
    for (Run* r : runs) r->draft_fed = static_cast<int64_t>(r->fed.size());
  }

  // A draft from a row of the draft model's logits: greedy requests take its argmax (lowest id on ties), sampling
  // ones draw from their chain (penalties aside) and keep the distribution for the rejection rule.
  void propose(Run& r, std::span<const float> row) {
    std::vector<float> buf;
    const std::span<const float> logits = sampleable(row, buf);
    if (!r.draft_sampler) {
      int64_t best = 0;
      for (int64_t i = 1; i < sample_limit; ++i)
        if (logits[static_cast<size_t>(i)] > logits[static_cast<size_t>(best)]) best = i;
      r.draft.push_back(static_cast<int32_t>(best));
      return;
    }
    std::vector<TokenProb> q = r.draft_sampler->distribution(logits);
    r.draft.push_back(draw_from(q, r.spec_rng));
    r.draft_q.push_back(std::move(q));
  }

  // The draft model's slots catch up with the committed tokens and `next` (one forward: its first draft), then run
  // one token at a time for the rest; each slot is restored to the state after `next`, a prefix of whatever the
  // verify commits.
  void draft_with_model(const std::vector<Run*>& runs) {
    const Model& dm = *options.draft_model;
    std::vector<std::vector<int32_t>> inputs(runs.size());
    std::vector<Sequence> seqs;
    for (size_t i = 0; i < runs.size(); ++i) {
      const Run& r = *runs[i];
      inputs[i].assign(r.fed.begin() + r.draft_fed, r.fed.end());
      inputs[i].push_back(r.next);
      seqs.push_back(Sequence::tokens(inputs[i], r.slot));
    }
    ForwardResult out = dm.forward(*draft_state, seqs, Output::LastLogits);
    int longest = 0;
    for (size_t i = 0; i < runs.size(); ++i) {
      Run& r = *runs[i];
      r.draft_fed = static_cast<int64_t>(r.fed.size()) + 1;
      if (r.draft_want > 1) draft_state->snapshot_into(r.slot, r.draft_snapshot);
      propose(r, out.row(static_cast<int64_t>(i)));
      longest = std::max(longest, r.draft_want);
    }
    for (int j = 1; j < longest; ++j) {
      std::vector<Run*> active;
      seqs.clear();
      for (Run* r : runs)
        if (r->draft_want > j) active.push_back(r), seqs.push_back(Sequence::tokens({&r->draft.back(), 1}, r->slot));
      out = dm.forward(*draft_state, seqs, Output::LastLogits);
      for (size_t a = 0; a < active.size(); ++a) propose(*active[a], out.row(static_cast<int64_t>(a)));
    }
    for (Run* r : runs)
      if (r->draft_want > 1) draft_state->restore(r->slot, r->draft_snapshot);
  }

  // ---- The MTP block (model/mtp.h) ----------------------------------------------------------------------------
  // Requests that draft with the block: their decode rows are verifies. (A grammar never drafts; max_new_tokens 0
  // only feeds the last prompt token.)
  bool uses_mtp(const Run& r) const {
    return r.req.speculative.draft_mtp && !r.grammar && r.req.max_new_tokens > 0;
  }

  // The token after position p of `r`'s sequence (the committed tokens, then `next` or the prompt).
  int32_t token_after(const Run& r, int64_t p) const {
    const int64_t n = static_cast<int64_t>(r.fed.size());
    if (p + 1 < n) return r.fed[static_cast<size_t>(p + 1)];
    return r.decoding ? r.next : r.req.prompt[static_cast<size_t>(p + 1)];
  }

  // Keeps the model's hidden states of the `len` positions `r` commits next (rows [row, row + len) of `hidden`, before
  // r.fed grows) for the block. Positions the model ran without handing them over (a prefix-cache hit, a failed
  // call) are a gap: the block then goes on from here without them, which costs acceptance, never exactness.
  void keep_mtp_hidden(Run& r, const std::vector<float>& hidden, int64_t row, int64_t len) {
    const int64_t d = model.config().d_model;
    if (r.mtp_fed + static_cast<int64_t>(r.mtp_hidden.size()) / d != static_cast<int64_t>(r.fed.size())) {
      r.mtp_fed = static_cast<int64_t>(r.fed.size());
      r.mtp_hidden.clear();
    }
    r.mtp_hidden.insert(r.mtp_hidden.end(), hidden.begin() + row * d, hidden.begin() + (row + len) * d);
  }

  // The block runs each request's kept rows (p, token p+1) for p up to the last committed position; its last row
  // gives the first draft when the request wants drafts (draft_want), and the block's own output, paired with each
  // draft, gives the next. Each slot is restored to the state after the committed positions. A failure ends the
  // requests with the error.
  void run_mtp(const std::vector<Run*>& runs, Clock::time_point& now) {
    try {
      draft_with_mtp(runs);
    } catch (const std::exception& e) {
      now = Clock::now();
      for (Run* r : runs) {
        mtp_state->reset(r->slot);
        r->mtp_fed = static_cast<int64_t>(r->fed.size());
        r->mtp_hidden.clear();
        r->draft.clear();
        r->draft_q.clear();
        fail_run(*r, std::string("MTP draft: ") + e.what(), now);
      }
    }
  }

  void draft_with_mtp(const std::vector<Run*>& runs) {
    const int64_t d = model.config().d_model;
    std::vector<Run*> active;
    std::vector<std::vector<int32_t>> tokens;
    std::vector<MtpSequence> seqs;
    for (Run* r : runs) {
      const int64_t n = static_cast<int64_t>(r->fed.size());
      if (r->mtp_fed + static_cast<int64_t>(r->mtp_hidden.size()) / d != n) {  // a gap: see keep_mtp_hidden
        r->mtp_fed = n;
        r->mtp_hidden.clear();
      }
      if (r->mtp_fed == n) continue;  // no hidden state of the last committed position: no draft this step
      std::vector<int32_t> t;
      for (int64_t p = r->mtp_fed; p < n; ++p) t.push_back(token_after(*r, p));
      tokens.push_back(std::move(t));
      active.push_back(r);
    }
    if (active.empty()) return;
    for (size_t i = 0; i < active.size(); ++i) seqs.push_back({active[i]->slot, tokens[i], active[i]->mtp_hidden});
    ForwardResult out = mtp->forward(*mtp_state, seqs, Output::AllLogitsAndHidden);
    std::vector<std::vector<float>> g(active.size());  // each request's latest block output
    int longest = 0;
    int64_t row = 0;
    for (size_t i = 0; i < active.size(); ++i) {
      Run& r = *active[i];
      row += static_cast<int64_t>(tokens[i].size());
      r.mtp_fed = static_cast<int64_t>(r.fed.size());
      r.mtp_hidden.clear();
      if (r.draft_want <= 0) continue;
      if (r.draft_want > 1) mtp_state->snapshot_into(r.slot, r.draft_snapshot);
      propose(r, out.row(row - 1));
      g[i].assign(out.hidden.begin() + (row - 1) * d, out.hidden.begin() + row * d);
      longest = std::max(longest, r.draft_want);
    }
    for (int j = 1; j < longest; ++j) {
      std::vector<size_t> chained;
      seqs.clear();
      for (size_t i = 0; i < active.size(); ++i)
        if (active[i]->draft_want > j) chained.push_back(i), seqs.push_back({active[i]->slot, {&active[i]->draft.back(), 1}, g[i]});
      out = mtp->forward(*mtp_state, seqs, Output::AllLogitsAndHidden);
      for (size_t a = 0; a < chained.size(); ++a) {
        const size_t i = chained[a];
        propose(*active[i], out.row(static_cast<int64_t>(a)));
        g[i].assign(out.hidden.begin() + static_cast<int64_t>(a) * d, out.hidden.begin() + static_cast<int64_t>(a + 1) * d);
      }
    }
    for (Run* r : active)
      if (r->draft_want > 1) mtp_state->restore(r->slot, r->draft_snapshot);
  }

  // One forward over every speculating row [unfed tokens, next, drafts], the target's choice row by row, and each
  // state landed on the tokens it commits.
  void verify(const std::vector<Run*>& rows, Clock::time_point& now) {
    std::vector<std::vector<int32_t>> inputs(rows.size());
    std::vector<Sequence> seqs;
    // Rows with kept tokens are still at the snapshot of the verify that refused their draft (nothing ran on their
    // slot since), and a row without drafts commits all of itself: only a fresh row with drafts takes a snapshot.
    std::vector<char> at_snapshot(rows.size());
    for (size_t i = 0; i < rows.size(); ++i) {
      Run& r = *rows[i];
      inputs[i].assign(r.fed.end() - r.unfed, r.fed.end());
      inputs[i].push_back(r.next);
      inputs[i].insert(inputs[i].end(), r.draft.begin(), r.draft.end());
      seqs.push_back(Sequence::tokens(inputs[i], r.slot));
      if (r.unfed == 0 && !r.draft.empty()) state->snapshot_into(r.slot, r.verify_snapshot);
      at_snapshot[i] = r.unfed > 0 || !r.draft.empty();
    }
    ForwardResult out;
    const bool mtp_hidden = std::any_of(rows.begin(), rows.end(), [&](Run* r) { return uses_mtp(*r); });
    ++counters.verify_steps;
    try {
      out = model.forward(*state, seqs, mtp_hidden ? Output::AllLogitsAndHidden : Output::AllLogits);
    } catch (const std::exception& e) {
      now = Clock::now();
      for (size_t i = 0; i < rows.size(); ++i) {
        if (at_snapshot[i]) state->restore(rows[i]->slot, rows[i]->verify_snapshot);
        fail_run(*rows[i], e.what(), now);
      }
      return;
    }
    now = Clock::now();
    std::vector<Run*> rerun;  // rows whose kept tokens run now, from the snapshot (see below)
    int64_t offset = 0;
    for (size_t i = 0; i < rows.size(); ++i) {
      Run& r = *rows[i];
      const std::vector<int32_t>& row = inputs[i];
      const int64_t first = offset + r.unfed;  // the row of `next`
      offset += static_cast<int64_t>(row.size());
      const std::span<const int32_t> fresh = std::span<const int32_t>(row).subspan(static_cast<size_t>(r.unfed));
      const int drafted = static_cast<int>(fresh.size()) - 1;
      // The target's tokens: row j gives the token after fresh[0..j]; it goes on while it equals the draft fresh[j+1].
      std::vector<GeneratedToken> toks;
      int accepted = 0;
      try {
        std::vector<float> buf;
        for (int j = 0; j <= drafted; ++j) {
          const std::span<const float> logits = out.row(first + j);
          GeneratedToken tok;
          bool kept = false;
          if (r.sampler->params().greedy()) {
            tok.id = r.sampler->sample(sampleable(logits, buf));
            kept = j < drafted && tok.id == fresh[static_cast<size_t>(j) + 1];
          } else {
            const std::vector<TokenProb> p = r.sampler->distribution(sampleable(logits, buf));
            if (j < drafted) {
              const std::span<const TokenProb> q =
                  r.draft_q.empty() ? std::span<const TokenProb>() : std::span<const TokenProb>(r.draft_q[static_cast<size_t>(j)]);
              const SpeculativeChoice c = speculative_choice(p, q, fresh[static_cast<size_t>(j) + 1], r.spec_rng);
              tok.id = c.token, kept = c.accepted;
            } else {
              tok.id = draw_from(p, r.spec_rng);
            }
          }
          if (r.req.logprobs >= 0) host_logprobs(logits.first(static_cast<size_t>(sample_limit)), r.req.logprobs, tok);
          const bool stop = r.stop_tokens.count(tok.id) > 0;
          if (!stop) r.sampler->accept(tok.id, /*generated=*/true);
          toks.push_back(std::move(tok));
          accepted += kept;
          if (stop || !kept) break;
        }
      } catch (const std::exception& e) {  // e.g. a NaN logit in this row: only this request ends
        if (at_snapshot[i]) state->restore(r.slot, r.verify_snapshot);
        fail_run(r, e.what(), now);
        continue;
      }
      // The tokens go out as decode steps would send them; a stop (token, string, length) may come before the last.
      r.landing = true;
      size_t committed = 0;  // tokens of `fresh` the state must stand for: one per token handled
      for (GeneratedToken& tok : toks) {
        ++committed;
        accept_token(r, std::move(tok), now, /*sampler_accepted=*/true);
        if (r.done) break;
      }
      r.landing = false;
      if (uses_mtp(r)) keep_mtp_hidden(r, out.hidden, first, static_cast<int64_t>(committed));
      r.fed.insert(r.fed.end(), fresh.begin(), fresh.begin() + static_cast<std::ptrdiff_t>(committed));
      accepted = std::min(accepted, static_cast<int>(committed));
      if (drafted > 0) record_drafts(r, drafted + r.probe_accepted, accepted + r.probe_accepted);
      r.probe_accepted = 0;
      if (committed == fresh.size()) {  // the state stands for the whole row
        r.unfed = 0;
        if (r.done) finalize(r, r.final_token);
        continue;
      }
      // A draft was refused: back to the snapshot, the kept tokens (with those it had not fed yet) left to feed.
      // They ride with the next verify, unless the request is done (its state is cached or saved now), drafts with
      // the MTP block (which takes the hidden states of each committed position once) or they would crowd the row.
      state->restore(r.slot, r.verify_snapshot);
      r.unfed += static_cast<int64_t>(committed);
      if (r.done || uses_mtp(r) || r.unfed > kStepPieceMaxLen / 2) rerun.push_back(&r);
    }
    if (rerun.empty()) return;
    const std::string error = feed_unfed(rerun);
    now = Clock::now();
    for (Run* r : rerun) {
      if (!error.empty()) {  // back at the snapshot: the kept tokens are not committed
        if (!r->done) {
          fail_run(*r, error, now);
          continue;
        }
        r->result.error = error;
        r->result.finish_reason = FinishReason::Cancelled;
      }
      if (r->done) finalize(*r, r->final_token);
    }
  }

  // Feeds the unfed tokens of `runs` in one forward, so that their states stand for every committed token (before a
  // finish caches or saves them, or where they may not wait for the next verify). Returns the error of a failed
  // forward, whose rows go back to their snapshots with those tokens dropped from `fed`; empty on success.
  std::string feed_unfed(const std::vector<Run*>& runs) {
    std::vector<Run*> feeding;
    std::vector<Sequence> seqs;
    for (Run* r : runs) {
      if (r->unfed == 0) continue;
      feeding.push_back(r);
      const size_t n = static_cast<size_t>(r->unfed);
      seqs.push_back(Sequence::tokens({r->fed.data() + r->fed.size() - n, n}, r->slot));
    }
    if (seqs.empty()) return {};
    std::string error;
    try {
      model.forward(*state, seqs, Output::None);
    } catch (const std::exception& e) {
      error = e.what();
    }
    for (Run* r : feeding) {
      if (!error.empty()) {
        state->restore(r->slot, r->verify_snapshot);
        r->fed.resize(r->fed.size() - static_cast<size_t>(r->unfed));
      }
      r->unfed = 0;
    }
    return error;
  }

  // Frees the slots of finished requests.
  void retire() {
    std::erase_if(runs, [&](const std::unique_ptr<Run>& r) {
      if (!r->done) return false;
      free_slots.push_back(r->slot);
      return true;
    });
  }
};

Engine::Engine(const Model& model, const Tokenizer* tokenizer, const EngineOptions& options)
    : impl_(std::make_unique<Impl>(model, tokenizer, options)) {}
Engine::~Engine() = default;

RequestId Engine::submit(GenerateRequest request) {
  impl_->validate(request);
  RequestId id;
  {
    std::lock_guard<std::mutex> lock(impl_->mutex);
    if (static_cast<int64_t>(impl_->queue.size()) >= impl_->options.max_queue)
      fail("engine: the queue is full (", impl_->options.max_queue, " requests waiting; --max-queue); try again later");
    id = impl_->next_id++;
    impl_->queue.push_back({id, std::move(request), Clock::now()});
    impl_->unfinished.insert(id);
  }
  impl_->work.notify_all();
  return id;
}

bool Engine::cancel(RequestId id) {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  if (id == 0 || id >= impl_->next_id) fail("engine: cancel: no request has id ", id);
  if (!impl_->unfinished.count(id)) return false;
  impl_->cancels.insert(id);
  impl_->work.notify_all();
  return true;
}

bool Engine::step() { return impl_->step(); }

bool Engine::wait_for_work(int64_t timeout_ms) {
  std::unique_lock<std::mutex> lock(impl_->mutex);
  return impl_->work.wait_for(lock, std::chrono::milliseconds(timeout_ms),
                              [&] { return !impl_->unfinished.empty() || !impl_->cancels.empty(); });
}

std::vector<GenerateResult> Engine::run(std::vector<GenerateRequest> requests) {
  for (const GenerateRequest& r : requests) impl_->validate(r);  // all or nothing
  std::vector<GenerateResult> results(requests.size());
  size_t n_finished = 0;
  {
    // The caller's own batch: queued whole, past max_queue (that bound is for other threads' submissions).
    std::lock_guard<std::mutex> lock(impl_->mutex);
    for (size_t i = 0; i < requests.size(); ++i) {
      GenerateRequest& r = requests[i];
      r.on_event = [&results, &n_finished, i, user = std::move(r.on_event)](const RequestEvent& e) {
        if (user) user(e);
        if (e.finished) results[i] = *e.result, ++n_finished;
      };
      const RequestId id = impl_->next_id++;
      impl_->queue.push_back({id, std::move(r), Clock::now()});
      impl_->unfinished.insert(id);
    }
  }
  while (n_finished < requests.size()) MAMBACPP_ASSERT(step());
  return results;
}

std::vector<int32_t> Engine::load_state(const std::string& path) {
  std::vector<int32_t> tokens;
  SlotSnapshot snap = impl_->state->load_snapshot(path, &tokens);
  if (tokens.empty()) fail("state file '", path, "' records no tokens, so no prompt can continue it");
  if (impl_->cache.budget() < static_cast<int64_t>(snap.bytes()))
    fail("state file '", path, "': its state (", snap.bytes(), " bytes) does not fit the prefix cache budget of ",
         impl_->cache.budget(), " bytes (--state-cache-mb)");
  impl_->cache.insert(tokens, std::move(snap));
  impl_->publish();
  return tokens;
}

void Engine::clear_cache() {
  impl_->cache.clear();
  impl_->publish();
}

EngineStats Engine::stats() const {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  EngineStats s = impl_->published;
  s.queued = static_cast<int64_t>(impl_->queue.size());
  return s;
}

const EngineOptions& Engine::options() const { return impl_->options; }
const Model& Engine::model() const { return impl_->model; }

}  // namespace mambacpp
