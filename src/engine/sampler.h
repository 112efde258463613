// Next-token sampling from one row of logits: repetition penalty, top-k, top-p, min-p, temperature, then a draw
// from a seeded std::mt19937_64. Deterministic for a given seed and logits (no library distributions, whose output
// differs between standard libraries).
//
// The chain follows llama.cpp's default order (common/sampling: penalties -> dry -> top-k -> typical -> top-p ->
// min-p -> xtc -> temperature -> dist), keeping the stages we implement:
//   1. repetition penalty over the last `repeat_last_n` accepted tokens (each distinct token once):
//      logit > 0 is divided by the penalty, logit <= 0 multiplied by it; then OpenAI's presence and frequency
//      penalties over the generated tokens (logit -= presence + count * frequency, for each generated id);
//   2. temperature <= 0: greedy, the argmax of the penalised logits (ties -> lowest id); nothing below runs;
//   3. candidates sorted by logit, descending (ties -> lowest id first); -inf logits are dropped (probability 0);
//   4. top-k: keep the first k (top_k <= 0: off);
//   5. top-p: softmax of the remaining logits (at temperature 1), keep the shortest prefix whose mass is >= top_p
//      (top_p >= 1: off; always keeps at least one);
//   6. min-p: keep tokens with p >= min_p * p_max, i.e. logit >= max_logit + log(min_p) (min_p <= 0: off);
//   7. temperature: logits / T, softmax in double;
//   8. draw u in [0, 1) from 53 random bits and take the first candidate whose cumulative probability exceeds u.
// As in llama.cpp, the truncations 5 and 6 look at the distribution before temperature.
//
// Steps 5-8 only look at the candidates that top-k kept, so a backend can do 1-4 next to the logits
// (Backend::select_top_k, mambacpp/top_k.h) and hand over just those: sample_candidates() finishes the chain on them
// and picks exactly the token sample() picks from the full row.
#pragma once

#include <cstdint>
#include <deque>
#include <map>
#include <random>
#include <span>
#include <utility>
#include <vector>

#include "mambacpp/sampling.h"
#include "mambacpp/top_k.h"

namespace mambacpp {

// One candidate of the final distribution.
struct TokenProb {
  int32_t id = 0;
  double p = 0.0;
};

// Applies the repetition penalty in place to `logits` [vocab] for each distinct id of `recent`
// (ids outside the vocabulary are ignored).
void apply_repeat_penalty(std::span<float> logits, std::span<const int32_t> recent, float penalty);

class Sampler {
 public:
  // Throws Error when params are invalid or vocab_size < 1.
  Sampler(const SamplingParams& params, int64_t vocab_size);

  // Picks the next token from `logits` [vocab_size]. Does not record it: call accept() with the token that was
  // actually appended (the generator also accepts the prompt tokens, as llama.cpp does, so that they count for the
  // repetition penalty). Consumes exactly one random draw unless greedy. Throws Error on a wrong size, a NaN or
  // +inf logit, or when every logit is -inf.
  int32_t sample(std::span<const float> logits);

  // Picks the next token from the top candidates of the row (as Backend::select_top_k gives them for
  // k = params().candidates_needed(), this sampler's limit and penalized_ids()): exactly the token sample() picks
  // from the row, with the same one draw (none for greedy). Throws the Error sample() throws for a bad row or one
  // without candidates.
  int32_t sample_candidates(const TopKCandidates& top);
  // sample_candidates on candidates already checked: logits descending (ties: lowest id first), none -inf, the
  // first min(top_k, considered) of the penalised row. Throws Error when empty or of different sizes.
  int32_t sample_top(std::span<const float> sorted_logits, std::span<const int32_t> ids);
  // The distinct ids the repetition penalty applies to now (empty when the penalty is off), inside the vocabulary.
  std::vector<int32_t> penalized_ids() const;

  // The distribution sample() draws from, sorted by descending probability (ties: lowest id first); for greedy a
  // single token with p = 1. Does not touch the RNG.
  std::vector<TokenProb> distribution(std::span<const float> logits) const;

  // Appends a token to the repetition-penalty window (keeps the last repeat_last_n); `generated` tokens (not the
  // prompt's) also count for the presence and frequency penalties.
  void accept(int32_t token, bool generated = false);
  void reset_history() { recent_.clear(), generated_counts_.clear(); }

  const SamplingParams& params() const { return params_; }
  uint64_t seed() const { return seed_; }  // the seed in use (the drawn one when none was given)

 private:
  using Candidates = std::vector<std::pair<float, int32_t>>;  // (logit, id), sorted, no -inf
  std::vector<float> penalized(std::span<const float> logits) const;
  // Steps 5-7 on the candidates top-k kept.
  std::vector<TokenProb> finish_distribution(Candidates cand) const;
  // Step 8 (consumes one draw).
  int32_t draw(const std::vector<TokenProb>& dist);

  SamplingParams params_;
  int64_t vocab_size_;
  uint64_t seed_;
  std::mt19937_64 rng_;
  std::deque<int32_t> recent_;
  std::map<int32_t, int> generated_counts_;  // generated id -> times generated (presence/frequency penalties)
};

}  // namespace mambacpp
