// Prompt lookup, the speculative rejection rule and the draft-length controller of engine/speculative.h.
#include "engine/speculative.h"

#include <algorithm>
#include <map>

#include "mambacpp/error.h"

namespace mambacpp {

std::vector<int32_t> ngram_draft(std::span<const int32_t> context, int n, int max_tokens) {
  const int64_t len = static_cast<int64_t>(context.size());
  if (n < 1 || max_tokens < 1 || len <= n) return {};
  const std::span<const int32_t> suffix = context.subspan(static_cast<size_t>(len - n));
  // Most recent first: the nearest repetition is the likeliest to continue the same way.
  for (int64_t start = len - n - 1; start >= 0; --start) {
    if (!std::equal(suffix.begin(), suffix.end(), context.begin() + start)) continue;
    const int64_t from = start + n;
    const int64_t count = std::min<int64_t>(max_tokens, len - from);
    return {context.begin() + from, context.begin() + from + count};
  }
  return {};
}

double uniform01(std::mt19937_64& rng) { return static_cast<double>(rng() >> 11) * 0x1.0p-53; }

int32_t draw_from(std::span<const TokenProb> dist, std::mt19937_64& rng) {
  MAMBACPP_ASSERT(!dist.empty());
  const double u = uniform01(rng);
  double cum = 0.0;
  for (const TokenProb& t : dist) {
    cum += t.p;
    if (u < cum) return t.id;
  }
  // Rounding left the sum just under u: the last token with any mass.
  for (size_t i = dist.size(); i-- > 0;)
    if (dist[i].p > 0.0) return dist[i].id;
  return dist.back().id;
}

SpeculativeChoice speculative_choice(std::span<const TokenProb> p, std::span<const TokenProb> q, int32_t draft,
                                     std::mt19937_64& rng) {
  std::map<int32_t, double> q_of;
  if (q.empty()) {
    q_of[draft] = 1.0;
  } else {
    for (const TokenProb& t : q) q_of[t.id] += t.p;
  }
  double p_draft = 0.0;
  for (const TokenProb& t : p)
    if (t.id == draft) p_draft += t.p;
  const double q_draft = q_of.count(draft) ? q_of[draft] : 0.0;
  // q_draft > 0 whenever the draft was drawn from q; a draft q gives no mass is never kept.
  if (q_draft > 0.0 && uniform01(rng) * q_draft < p_draft) return {draft, true};

  // The residual max(0, p - q) over p's support (where p is 0 the residual is 0).
  std::vector<TokenProb> residual;
  residual.reserve(p.size());
  double mass = 0.0;
  for (const TokenProb& t : p) {
    const auto it = q_of.find(t.id);
    const double r = std::max(0.0, t.p - (it == q_of.end() ? 0.0 : it->second));
    if (r > 0.0) residual.push_back({t.id, r}), mass += r;
  }
  if (residual.empty()) {
    // p == q up to rounding, yet the draft was refused: only possible through rounding of p_draft / q_draft near 1;
    // p itself is then the right distribution.
    return {draw_from(p, rng), false};
  }
  for (TokenProb& t : residual) t.p /= mass;
  const int32_t token = draw_from(residual, rng);
  return {token, false};
}

int DraftLength::next_at(int64_t generated, double min_gain) {
  if (!adaptive_) return k_;
  if (resume_at_ >= 0) {
    if (generated < resume_at_) return 0;
    resume_at_ = -1;  // the probe: the current length, whatever the gate says
    return k_;
  }
  int steps = pause_;
  // A request that keeps every draft at the length it asked for drafts, whatever the cost model says of that length.
  if (steps == 0 && !pays(min_gain)) {
    // The gate: a verify would not pay. Pause as a refused one-token verify does, with the same back-off.
    steps = backoff_;
    backoff_ = std::min(kMaxPauseSteps, backoff_ * 2);
  }
  if (steps == 0) return k_;
  pause_ = 0;
  int aligned = 1;  // a power of two, so that longer pauses end on a subset of the shorter ones' ends
  while (aligned < steps) aligned *= 2;
  resume_at_ = (generated / aligned + 1) * aligned;
  return 0;
}

double verify_cost_in_steps(bool graphed) {
  // GPU (H200, random-weight mamba2-2.7b, batch 1, fast precision; docs/benchmarks.md "Speculative decoding"): a
  // refused verify (draft steps, the ungraphed verify forward of k+1 tokens, the rerun of the kept tokens) cost ~16 ms
  // beside a 2.7 ms graphed decode step, ~6 steps; an accepted one skips the rerun, ~3. 2 tokens at the default
  // length 4 is acceptance 50%: the rows issue 53 wants sped up (>= 60%) keep drafting, low ones pause.
  if (graphed) return 2.0;
  // CPU (mamba2-130m shape, 2 threads; docs/perf-log/speculative-cpu-2026-12-07.md): decode is weight-bound; a verify
  // of 5 tokens cost ~1.3 decode steps (the model drafting for itself: 5 tokens a cycle at 6.6 tokens/s against 13.9
  // plain, less its 4 draft steps) and the rerun after a refusal about one more: ~2 steps, as on the GPU's accepted
  // verifies, so the same 2 tokens.
  return 2.0;
}

void DraftLength::record(int drafted, int accepted, double min_gain) {
  if (!adaptive_ || drafted <= 0) return;
  const double rate = static_cast<double>(accepted) / drafted;
  acceptance_ = measured_ ? 0.5 * acceptance_ + 0.5 * rate : rate;  // the first verify replaces the optimistic prior
  measured_ = true;
  // A verify that kept half its drafts, and at least the tokens a verify costs, paid for itself. (Kept tokens below
  // the cost do not: at one draft accepted now and then, the back-off would start over at every such verify and a
  // batch of such rows would verify in most steps.)
  if (2 * accepted >= drafted && accepted >= min_gain) backoff_ = 1;
  if (accepted >= drafted) {
    k_ = std::min(max_, k_ + 1);
  } else if (2 * accepted < drafted) {
    if (k_ == 1) {
      pause_ = backoff_;
      backoff_ = std::min(kMaxPauseSteps, backoff_ * 2);
    }
    k_ = std::max(1, k_ / 2);
  }
}

}  // namespace mambacpp
