// The sampling chain of sampler.h: penalties -> (greedy | top-k -> top-p -> min-p -> temperature -> draw).
#include "engine/sampler.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <unordered_set>

#include "mambacpp/error.h"

namespace mambacpp {

void SamplingParams::validate() const {
  if (std::isnan(temperature)) fail("sampling: temperature must be a number, found NaN");
  if (std::isnan(top_p)) fail("sampling: top_p must be a number, found NaN");
  if (std::isnan(min_p)) fail("sampling: min_p must be a number, found NaN");
  if (!(repeat_penalty > 0.0f) || std::isinf(repeat_penalty))
    fail("sampling: repeat_penalty must be a finite number > 0, found ", repeat_penalty);
  if (repeat_last_n < 0) fail("sampling: repeat_last_n must be >= 0, found ", repeat_last_n);
  if (!(presence_penalty >= -2.0f && presence_penalty <= 2.0f))
    fail("sampling: presence_penalty must be in [-2, 2], found ", presence_penalty);
  if (!(frequency_penalty >= -2.0f && frequency_penalty <= 2.0f))
    fail("sampling: frequency_penalty must be in [-2, 2], found ", frequency_penalty);
}

int SamplingParams::candidates_needed() const {
  if (presence_penalty != 0.0f || frequency_penalty != 0.0f) return 0;  // additive penalties: the whole row
  if (greedy()) return 1;
  return top_k >= 1 && top_k <= kMaxTopK ? top_k : 0;
}

void apply_repeat_penalty(std::span<float> logits, std::span<const int32_t> recent, float penalty) {
  if (penalty == 1.0f) return;
  std::unordered_set<int32_t> seen;
  for (int32_t id : recent) {
    if (id < 0 || static_cast<size_t>(id) >= logits.size() || !seen.insert(id).second) continue;
    float& l = logits[static_cast<size_t>(id)];
    l = l > 0.0f ? l / penalty : l * penalty;
  }
}

Sampler::Sampler(const SamplingParams& params, int64_t vocab_size) : params_(params), vocab_size_(vocab_size) {
  params_.validate();
  if (vocab_size < 1) fail("sampler: vocab_size must be >= 1, found ", vocab_size);
  seed_ = params_.seed_given ? params_.seed : (static_cast<uint64_t>(std::random_device{}()) << 32) ^
                                                  static_cast<uint64_t>(std::random_device{}());
  rng_.seed(seed_);
}

void Sampler::accept(int32_t token, bool generated) {
  if (generated && (params_.presence_penalty != 0.0f || params_.frequency_penalty != 0.0f)) ++generated_counts_[token];
  if (params_.repeat_last_n == 0) return;
  recent_.push_back(token);
  while (recent_.size() > static_cast<size_t>(params_.repeat_last_n)) recent_.pop_front();
}

std::vector<float> Sampler::penalized(std::span<const float> logits) const {
  if (static_cast<int64_t>(logits.size()) != vocab_size_)
    fail("sampler: expected ", vocab_size_, " logits, found ", logits.size());
  for (size_t i = 0; i < logits.size(); ++i) {
    // A NaN or +inf logit means the model produced garbage; sampling from it would hide the bug.
    if (std::isnan(logits[i]) || logits[i] == std::numeric_limits<float>::infinity())
      fail("sampler: logit of token ", i, " is ", logits[i], "; expected a finite value or -inf");
  }
  std::vector<float> out(logits.begin(), logits.end());
  const std::vector<int32_t> recent(recent_.begin(), recent_.end());
  apply_repeat_penalty(out, recent, params_.repeat_penalty);
  for (const auto& [id, count] : generated_counts_)
    if (id >= 0 && id < vocab_size_ && out[static_cast<size_t>(id)] != -std::numeric_limits<float>::infinity())
      out[static_cast<size_t>(id)] -= params_.presence_penalty + static_cast<float>(count) * params_.frequency_penalty;
  // A penalty < 1 can push a huge logit to +inf, which no distribution can hold (select_top_k reports it too).
  int32_t overflow = -1;
  for (int32_t id : recent)
    if (id >= 0 && id < vocab_size_ && out[static_cast<size_t>(id)] == std::numeric_limits<float>::infinity() &&
        (overflow < 0 || id < overflow))
      overflow = id;
  if (overflow >= 0)
    fail("sampler: logit of token ", overflow, " is inf after the repetition penalty; expected a finite value or -inf");
  return out;
}

std::vector<int32_t> Sampler::penalized_ids() const {
  std::vector<int32_t> ids;
  if (params_.repeat_penalty == 1.0f) return ids;
  std::unordered_set<int32_t> seen;
  for (int32_t id : recent_)
    if (id >= 0 && id < vocab_size_ && seen.insert(id).second) ids.push_back(id);
  return ids;
}

namespace {

// Softmax over the candidates in double, relative to the first (largest) logit.
std::vector<double> softmax_sorted(const std::vector<std::pair<float, int32_t>>& cand, double inv_temp) {
  std::vector<double> p(cand.size());
  const double top = static_cast<double>(cand.front().first) * inv_temp;
  double sum = 0.0;
  for (size_t i = 0; i < cand.size(); ++i) {
    p[i] = std::exp(static_cast<double>(cand[i].first) * inv_temp - top);
    sum += p[i];
  }
  for (double& x : p) x /= sum;
  return p;
}

}  // namespace

std::vector<TokenProb> Sampler::distribution(std::span<const float> logits) const {
  const std::vector<float> l = penalized(logits);
  const float neg_inf = -std::numeric_limits<float>::infinity();

  if (params_.greedy()) {
    int32_t best = -1;
    for (size_t i = 0; i < l.size(); ++i) {
      if (l[i] == neg_inf) continue;
      // Strictly greater: the lowest id wins ties.
      if (best < 0 || l[i] > l[static_cast<size_t>(best)]) best = static_cast<int32_t>(i);
    }
    if (best < 0) fail("sampler: every logit is -inf; nothing can be sampled");
    return {{best, 1.0}};
  }

  // (logit, id), sorted by logit descending, then id ascending, -inf dropped.
  std::vector<std::pair<float, int32_t>> cand;
  cand.reserve(l.size());
  for (size_t i = 0; i < l.size(); ++i)
    if (l[i] != neg_inf) cand.emplace_back(l[i], static_cast<int32_t>(i));
  if (cand.empty()) fail("sampler: every logit is -inf; nothing can be sampled");
  auto by_logit = [](const auto& a, const auto& b) {
    return a.first > b.first || (a.first == b.first && a.second < b.second);
  };

  if (params_.top_k > 0 && static_cast<size_t>(params_.top_k) < cand.size()) {
    std::partial_sort(cand.begin(), cand.begin() + params_.top_k, cand.end(), by_logit);
    cand.resize(static_cast<size_t>(params_.top_k));
  } else {
    std::sort(cand.begin(), cand.end(), by_logit);
  }
  return finish_distribution(std::move(cand));
}

std::vector<TokenProb> Sampler::finish_distribution(Candidates cand) const {
  if (params_.top_p < 1.0f) {
    const std::vector<double> p = softmax_sorted(cand, 1.0);
    double cum = 0.0;
    size_t keep = cand.size();
    for (size_t i = 0; i < p.size(); ++i) {
      cum += p[i];
      if (cum >= static_cast<double>(params_.top_p)) {
        keep = i + 1;
        break;
      }
    }
    cand.resize(keep);
  }

  if (params_.min_p > 0.0f) {
    // p_i >= min_p * p_max  <=>  logit_i >= logit_max + log(min_p); the max itself always stays.
    const double threshold = static_cast<double>(cand.front().first) + std::log(static_cast<double>(params_.min_p));
    size_t keep = 1;
    while (keep < cand.size() && static_cast<double>(cand[keep].first) >= threshold) ++keep;
    cand.resize(keep);
  }

  const std::vector<double> p = softmax_sorted(cand, 1.0 / static_cast<double>(params_.temperature));
  std::vector<TokenProb> out(cand.size());
  for (size_t i = 0; i < cand.size(); ++i) out[i] = {cand[i].second, p[i]};
  return out;
}

int32_t Sampler::sample(std::span<const float> logits) {
  const std::vector<TokenProb> dist = distribution(logits);
  if (params_.greedy()) return dist.front().id;
  return draw(dist);
}

int32_t Sampler::sample_candidates(const TopKCandidates& top) {
  // The messages of penalized() and distribution(), so that both paths fail alike.
  if (top.bad_id >= 0)
    fail("sampler: logit of token ", top.bad_id, " is ", top.bad_value, "; expected a finite value or -inf");
  if (top.ids.empty()) fail("sampler: every logit is -inf; nothing can be sampled");
  return sample_top(top.logits, top.ids);
}

int32_t Sampler::sample_top(std::span<const float> sorted_logits, std::span<const int32_t> ids) {
  if (sorted_logits.size() != ids.size() || ids.empty())
    fail("sampler: expected as many candidate ids as logits (>= 1), found ", ids.size(), " ids and ",
         sorted_logits.size(), " logits");
  if (params_.greedy()) return ids.front();
  // Step 4 on a longer list than top_k: the first top_k are the ones a full row keeps.
  size_t n = ids.size();
  if (params_.top_k > 0) n = std::min(n, static_cast<size_t>(params_.top_k));
  Candidates cand(n);
  for (size_t i = 0; i < n; ++i) cand[i] = {sorted_logits[i], ids[i]};
  return draw(finish_distribution(std::move(cand)));
}

int32_t Sampler::draw(const std::vector<TokenProb>& dist) {
  // 53 random bits -> u uniform in [0, 1), exactly representable; the same on every platform.
  const double u = static_cast<double>(rng_() >> 11) * 0x1.0p-53;
  double cum = 0.0;
  for (const TokenProb& t : dist) {
    cum += t.p;
    if (u < cum) return t.id;
  }
  return dist.back().id;  // u landed in the rounding gap above the last cumulative sum (< 1e-15)
}

}  // namespace mambacpp
