// The sampler's candidate path (sample_candidates / sample_top): on the top candidates of a row, as select_top_k
// defines them, it picks exactly the token sample() picks from the whole row, with the same draws, over many steps
// of every chain setting; plus candidates_needed, penalized_ids, and the errors both paths share.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <set>
#include <vector>

#include "engine/sampler.h"
#include "mambacpp/error.h"
#include "support/sampling_support.h"
#include "support/test_support.h"
#include "support/top_k_reference.h"

namespace mambacpp {
namespace {

SamplingParams params(float temperature, int top_k, float top_p, float min_p, float penalty, int last_n) {
  SamplingParams s = test::sampling_chain(temperature, top_k, top_p, min_p, penalty, last_n);
  s.seed = 99;
  s.seed_given = true;
  return s;
}

TEST(SamplerCandidates, CandidatesNeeded) {
  EXPECT_EQ(params(0.0f, 0, 1.0f, 0.0f, 1.0f, 0).candidates_needed(), 1);  // greedy, whatever top_k says
  EXPECT_EQ(params(0.8f, 40, 0.95f, 0.05f, 1.0f, 0).candidates_needed(), 40);
  EXPECT_EQ(params(0.8f, 1, 1.0f, 0.0f, 1.0f, 0).candidates_needed(), 1);
  EXPECT_EQ(params(0.8f, kMaxTopK, 1.0f, 0.0f, 1.0f, 0).candidates_needed(), kMaxTopK);
  EXPECT_EQ(params(0.8f, kMaxTopK + 1, 1.0f, 0.0f, 1.0f, 0).candidates_needed(), 0);
  EXPECT_EQ(params(0.8f, 0, 1.0f, 0.0f, 1.0f, 0).candidates_needed(), 0);
  EXPECT_EQ(params(0.8f, -3, 1.0f, 0.0f, 1.0f, 0).candidates_needed(), 0);
}

TEST(SamplerCandidates, PenalizedIdsAreTheDistinctWindowInsideTheVocabulary) {
  Sampler s(params(0.8f, 40, 1.0f, 0.0f, 1.2f, 4), 10);
  for (int32_t t : {3, 3, 7, 12, 3, 1}) s.accept(t);  // window (last 4): 7, 12 (outside), 3, 1
  std::vector<int32_t> ids = s.penalized_ids();
  EXPECT_EQ(std::set<int32_t>(ids.begin(), ids.end()), (std::set<int32_t>{7, 3, 1}));
  EXPECT_EQ(ids.size(), 3u);
  Sampler off(params(0.8f, 40, 1.0f, 0.0f, 1.0f, 4), 10);
  off.accept(3);
  EXPECT_TRUE(off.penalized_ids().empty());
}

// Two samplers with the same seed: one sees whole rows, the other the candidates of the same rows. Every step
// both pick a token (which must be the same) and accept it, so the penalty window and the RNG move together.
void expect_same_tokens(const SamplingParams& p, int64_t V, int64_t limit, int kind, uint64_t seed) {
  Sampler full(p, V), top(p, V);
  std::mt19937_64 rng(seed);
  const int k = p.candidates_needed();
  ASSERT_GT(k, 0);
  std::set<int32_t> seen;
  for (int step = 0; step < 300; ++step) {
    std::vector<float> row = test::random_row(V, kind, rng);
    std::vector<float> masked = row;
    for (int64_t i = limit; i < V; ++i) masked[static_cast<size_t>(i)] = -std::numeric_limits<float>::infinity();
    TopKRequest q;
    q.k = k;
    q.limit = limit;
    q.repeat_penalty = p.repeat_penalty;
    q.penalized = top.penalized_ids();
    const TopKCandidates cands = test::reference_top_k(row, q);
    if (cands.ids.empty()) continue;  // an all -inf row: both throw (checked elsewhere)
    const int32_t a = full.sample(masked), b = top.sample_candidates(cands);
    ASSERT_EQ(a, b) << "step " << step << " T " << p.temperature << " top_k " << p.top_k;
    full.accept(a);
    top.accept(b);
    seen.insert(a);
  }
  if (!p.greedy() && p.top_k > 1 && V >= 300 && kind <= 1)
    EXPECT_GT(seen.size(), 3u) << "the draws hardly vary; the test shows little";
}

TEST(SamplerCandidates, SameTokensAsTheWholeRow) {
  const std::vector<SamplingParams> chains = {
      params(0.0f, 40, 0.95f, 0.05f, 1.0f, 64),  // greedy
      params(0.0f, 0, 1.0f, 0.0f, 1.5f, 8),      // greedy with a penalty
      params(0.8f, 40, 0.95f, 0.05f, 1.0f, 64),  // the defaults
      params(1.5f, 5, 1.0f, 0.0f, 1.3f, 16),     // top-k only, hot, penalised
      params(0.7f, 256, 0.9f, 0.1f, 0.8f, 32),   // k above many rows' considered count; penalty < 1
      params(1.0f, 1, 1.0f, 0.0f, 1.0f, 0),      // top_k 1 is greedy through the draw path
      params(1.2f, 20, 0.5f, 0.0f, 1.1f, 64),    // top-p cuts hard
      params(1.0f, 60, 1.0f, 0.3f, 1.0f, 0),     // min-p only
  };
  uint64_t seed = 1;
  for (const SamplingParams& p : chains)
    for (int kind : {0, 1, 2, 3})
      for (auto [V, limit] : {std::pair<int64_t, int64_t>{300, 300}, {300, 257}, {7, 7}, {1, 1}})
        expect_same_tokens(p, V, limit, kind, seed++);
}

TEST(SamplerCandidates, ErrorsMatchTheWholeRowPath) {
  Sampler s(params(0.8f, 40, 1.0f, 0.0f, 1.0f, 0), 4);
  const std::vector<float> nan_row = {0.0f, std::nanf(""), 1.0f, 2.0f};
  TopKRequest q;
  q.k = 40;
  const std::string full = test::error_of([&] { s.sample(nan_row); });
  const std::string top = test::error_of([&] { s.sample_candidates(test::reference_top_k(nan_row, q)); });
  EXPECT_FALSE(full.empty());
  EXPECT_EQ(full, top);
  const std::vector<float> none(4, -std::numeric_limits<float>::infinity());
  EXPECT_EQ(test::error_of([&] { s.sample(none); }),
            test::error_of([&] { s.sample_candidates(test::reference_top_k(none, q)); }));
  EXPECT_NE(test::error_of([&] {
              s.sample_top(std::vector<float>{1.0f}, std::vector<int32_t>{});
            }).find("expected as many candidate ids as logits"),
            std::string::npos);
}

TEST(SamplerCandidates, PenaltyOverflowToInfinityIsAnErrorOnBothPaths) {
  // 3e38 / 0.5 overflows: no distribution can hold +inf, so the whole-row path reports it like select_top_k does.
  Sampler s(params(0.8f, 40, 1.0f, 0.0f, 0.5f, 8), 3);
  s.accept(1);
  const std::vector<float> row = {0.0f, 3e38f, 1.0f};
  EXPECT_NE(test::error_of([&] { s.sample(row); }).find("logit of token 1 is inf after the repetition penalty"),
            std::string::npos);
  TopKRequest q;
  q.k = 40;
  q.repeat_penalty = 0.5f;
  q.penalized = s.penalized_ids();
  const TopKCandidates c = test::reference_top_k(row, q);
  EXPECT_EQ(c.bad_id, 1);
  EXPECT_THROW(s.sample_candidates(c), Error);
}

}  // namespace
}  // namespace mambacpp
