// The engine-independent pieces of speculative decoding: drafts by prompt lookup, the rejection rule that keeps the
// target's distribution when sampling, and the controller of the draft length.
//
// Verification (src/engine/engine.cpp) feeds [last token, d1..dk] to the target in one forward with logits at every
// position. Row i holds the target's distribution after d1..di. Greedy: the target's token at row i is computed
// exactly as a plain decode step would (the same sampler on the same logits, which a split sequence reproduces bit for
// bit on the CPU); d(i+1) is accepted when it equals that token, and the first mismatch (or row k, when every draft
// matched) gives the target's own next token. Sampling: speculative_choice() below.
#pragma once

#include <algorithm>
#include <cstdint>
#include <random>
#include <span>
#include <vector>

#include "engine/sampler.h"

namespace mambacpp {

constexpr int kMaxDraftTokens = 32;  // --draft-max limit: a verify row of k+1 tokens stays a small prefill piece
constexpr int kMaxDraftNgram = 16;   // --draft-ngram limit

// Prompt lookup: the tokens that followed the most recent earlier occurrence of the last `n` tokens of `context`
// (prompt and output so far), at most `max_tokens` of them; empty when the suffix occurs nowhere earlier.
std::vector<int32_t> ngram_draft(std::span<const int32_t> context, int n, int max_tokens);

// A uniform double in [0, 1) from 53 random bits (as the sampler draws).
double uniform01(std::mt19937_64& rng);
// A draw from a distribution (probabilities summing to ~1; the last entry takes any rounding remainder).
int32_t draw_from(std::span<const TokenProb> dist, std::mt19937_64& rng);

// The rejection rule of speculative sampling (Leviathan et al. 2023; Chen et al. 2023): a draft `draft` drawn from
// q is kept with probability min(1, p(draft) / q(draft)); otherwise the token is drawn from the residual
// max(0, p - q), normalised. The token that comes out is distributed as p whatever q is. `q` empty stands for a
// deterministic draft (q = 1 at `draft`: prompt lookup, greedy drafting), where the rule keeps the draft with
// probability p(draft) and otherwise draws from p without it.
struct SpeculativeChoice {
  int32_t token = 0;
  bool accepted = false;  // token == draft, kept by the rule
};
SpeculativeChoice speculative_choice(std::span<const TokenProb> p, std::span<const TokenProb> q, int32_t draft,
                                     std::mt19937_64& rng);

// The number of tokens a request drafts next. Adaptive: after every draft was accepted the length grows by one (up
// to the maximum); after fewer than half were, it halves; at one token with nothing accepted, speculation pauses for a
// number of steps that doubles while verifies keep fewer than half their drafts (up to 64), so that low acceptance
// costs a verify now and then rather than every step.
//
// next_at() keeps a batch's verifies few. A step in which any row verifies pays for a whole extra target forward (ungraphed on the
// GPU, plus the state snapshot and, after a refusal, the restore), so what a paused row costs is the number of steps
// in which some row verifies, not its own verifies. next_at() therefore
//  - aligns pauses: a pause of P steps (a power of two) ends at the next multiple of P of the request's generated
//    tokens, so rows that decode in lockstep (admitted together, paused: one token a step) probe in the same steps,
//    and rows paused longer probe on a subset of the shorter pauses' steps;
//  - gates on cost: a request drafts only while its expected accepted tokens, recent acceptance x draft length, reach
//    `min_gain`, the verify's extra cost in decode steps (verify_cost_in_steps()); below it, it pauses as above and
//    probes at the pause's end with its current length, so that a row whose acceptance comes back resumes. The
//    engine checks a probe's first draft against the token of the row's own decode step (pays()), so a refused
//    probe costs no verify.
// Whether a request drafts depends on its own history only, never on the other rows: a seed gives the same tokens
// in any batch (sampling draws from the verify's generator), and a request reports the same draft counts alone and in
// a batch. Reading the other rows (verify only when the batch's summed expected gain pays for the step) would trade
// that away; the alignment gives most of its effect where it matters, rows decoding side by side.
class DraftLength {
 public:
  DraftLength() = default;
  DraftLength(int max_tokens, bool adaptive) : max_(max_tokens), k_(max_tokens), adaptive_(adaptive) {}
  // The draft length for the step that generates the request's token `generated` (0-based count of tokens so far;
  // 0: do not speculate now), with the aligned pauses and the cost gate described above.
  int next_at(int64_t generated, double min_gain);
  // The outcome of a verify of `drafted` tokens; `min_gain` as for next_at().
  void record(int drafted, int accepted, double min_gain = 0.0);
  int current() const { return k_; }
  // Whether a verify at the current length is expected to pay for itself (next_at's gate); a length next_at hands
  // out while it does not is a probe.
  bool pays(double min_gain) const {
    return !adaptive_ || acceptance_ * k_ >= std::min(min_gain, static_cast<double>(max_));
  }
  // Recent acceptance: each verify's accepted / drafted, averaged with weight 1/2 on the newest (1 before any verify,
  // so that a request drafts once; the first verify's rate then replaces it).
  double acceptance() const { return acceptance_; }

 private:
  int max_ = 0, k_ = 0;
  bool adaptive_ = true;
  int pause_ = 0, backoff_ = 1;
  double acceptance_ = 1.0;
  bool measured_ = false;
  int64_t resume_at_ = -1;  // next_at: the paused request probes when its generated count reaches this
};

constexpr int kMaxPauseSteps = 64;

// The extra cost of a verify over a decode step, in decode steps of the target, for a draft length k: the least
// expected number of accepted tokens for which a verify pays. `graphed`: the backend replays decode steps as graphs
// (the GPU), where the verify forward runs ungraphed. Constants from measurements (taken when a refusal still cost a
// rerun of the kept tokens, which now ride with the next verify), see the .cpp.
double verify_cost_in_steps(bool graphed);

}  // namespace mambacpp
