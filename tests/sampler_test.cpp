// Sampler tests against hand-computed distributions: each stage of the chain (penalty, top-k, top-p, min-p,
// temperature), their order, -inf handling, seeding, and the empirical frequencies of many draws.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <map>
#include <vector>

#include "engine/sampler.h"
#include "mambacpp/error.h"

namespace mambacpp {
namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// Logits whose softmax is exactly `p` up to rounding log(p) to float.
std::vector<float> logits_of(const std::vector<double>& p) {
  std::vector<float> l;
  for (double x : p) l.push_back(x > 0 ? static_cast<float>(std::log(x)) : kNegInf);
  return l;
}

// All filters off, temperature 1: the sampler draws from softmax(logits) as given.
SamplingParams plain() {
  SamplingParams s;
  s.temperature = 1.0f;
  s.top_k = 0;
  s.top_p = 1.0f;
  s.min_p = 0.0f;
  s.seed = 1234;
  s.seed_given = true;
  return s;
}

// The distribution as id -> p, for comparisons that do not depend on order.
std::map<int32_t, double> as_map(const std::vector<TokenProb>& d) {
  std::map<int32_t, double> m;
  for (const TokenProb& t : d) m[t.id] = t.p;
  return m;
}

// Rounding log(p) to float moves a logit by <= 2^-24 * |log p| (<= 2.3 here), so a probability moves by
// <= ~3e-7 relative; 1e-6 absolute leaves room and is far below any difference the tests look for (>= 0.01).
constexpr double kProbTol = 1e-6;

void expect_distribution(const std::vector<TokenProb>& got, const std::map<int32_t, double>& want) {
  const std::map<int32_t, double> g = as_map(got);
  ASSERT_EQ(g.size(), want.size());
  for (const auto& [id, p] : want) {
    ASSERT_TRUE(g.count(id)) << "token " << id << " missing";
    EXPECT_NEAR(g.at(id), p, kProbTol) << "token " << id;
  }
}

const std::vector<double> kP = {0.1, 0.4, 0.2, 0.3};  // sorted: 1 (0.4), 3 (0.3), 2 (0.2), 0 (0.1)

TEST(Sampler, GreedyTakesArgmaxLowestIdOnTies) {
  SamplingParams s = plain();
  s.temperature = 0.0f;
  Sampler sampler(s, 5);
  const std::vector<float> l = {1.0f, 3.0f, 2.0f, 3.0f, kNegInf};
  for (int i = 0; i < 3; ++i) EXPECT_EQ(sampler.sample(l), 1);
  const std::vector<TokenProb> d = sampler.distribution(l);
  ASSERT_EQ(d.size(), 1u);
  EXPECT_EQ(d[0].id, 1);
  EXPECT_EQ(d[0].p, 1.0);
  s.temperature = -1.0f;  // negative also means greedy
  EXPECT_EQ(Sampler(s, 5).sample(std::vector<float>{kNegInf, kNegInf, -5.0f, -7.0f, -5.0f}), 2);
}

TEST(Sampler, GreedyAppliesRepetitionPenalty) {
  SamplingParams s = plain();
  s.temperature = 0.0f;
  s.repeat_penalty = 2.0f;
  Sampler sampler(s, 4);
  const std::vector<float> l = {0.0f, 3.0f, 2.0f, -1.0f};
  EXPECT_EQ(sampler.sample(l), 1);
  sampler.accept(1);  // 3 / 2 = 1.5 < 2
  EXPECT_EQ(sampler.sample(l), 2);
}

TEST(Sampler, TopKKeepsExactlyK) {
  SamplingParams s = plain();
  s.top_k = 2;
  expect_distribution(Sampler(s, 4).distribution(logits_of(kP)), {{1, 0.4 / 0.7}, {3, 0.3 / 0.7}});
  s.top_k = 3;
  expect_distribution(Sampler(s, 4).distribution(logits_of(kP)), {{1, 0.4 / 0.9}, {3, 0.3 / 0.9}, {2, 0.2 / 0.9}});
  // Ties at the cut: exactly k survive, lowest ids first.
  s.top_k = 2;
  expect_distribution(Sampler(s, 4).distribution(std::vector<float>{1.0f, 1.0f, 1.0f, 0.0f}), {{0, 0.5}, {1, 0.5}});
  // Off: top_k <= 0, or k >= the vocabulary.
  for (int k : {0, -3, 4, 100}) {
    s.top_k = k;
    expect_distribution(Sampler(s, 4).distribution(logits_of(kP)), {{0, 0.1}, {1, 0.4}, {2, 0.2}, {3, 0.3}});
  }
}

TEST(Sampler, TopPKeepsShortestPrefixWithEnoughMass) {
  SamplingParams s = plain();
  // Sorted masses: 0.4, 0.7, 0.9, 1.0 (boundaries avoided: float rounding would make equality a coin toss).
  s.top_p = 0.35f;
  expect_distribution(Sampler(s, 4).distribution(logits_of(kP)), {{1, 1.0}});
  s.top_p = 0.65f;
  expect_distribution(Sampler(s, 4).distribution(logits_of(kP)), {{1, 0.4 / 0.7}, {3, 0.3 / 0.7}});
  s.top_p = 0.75f;
  expect_distribution(Sampler(s, 4).distribution(logits_of(kP)), {{1, 0.4 / 0.9}, {3, 0.3 / 0.9}, {2, 0.2 / 0.9}});
  s.top_p = 0.95f;
  expect_distribution(Sampler(s, 4).distribution(logits_of(kP)), {{0, 0.1}, {1, 0.4}, {2, 0.2}, {3, 0.3}});
  s.top_p = 0.0f;  // keeps at least one token
  expect_distribution(Sampler(s, 4).distribution(logits_of(kP)), {{1, 1.0}});
}

TEST(Sampler, MinPKeepsTokensAboveFractionOfMax) {
  SamplingParams s = plain();
  s.min_p = 0.3f;  // threshold 0.12: drops 0.1
  expect_distribution(Sampler(s, 4).distribution(logits_of(kP)), {{1, 0.4 / 0.9}, {3, 0.3 / 0.9}, {2, 0.2 / 0.9}});
  s.min_p = 0.6f;  // threshold 0.24: drops 0.2 too
  expect_distribution(Sampler(s, 4).distribution(logits_of(kP)), {{1, 0.4 / 0.7}, {3, 0.3 / 0.7}});
  s.min_p = 1.0f;  // only the max
  expect_distribution(Sampler(s, 4).distribution(logits_of(kP)), {{1, 1.0}});
}

TEST(Sampler, TemperatureSharpensAndFlattens) {
  SamplingParams s = plain();
  s.temperature = 0.5f;  // p^2 normalised: 0.01, 0.16, 0.04, 0.09 over 0.30
  expect_distribution(Sampler(s, 4).distribution(logits_of(kP)),
                      {{0, 0.01 / 0.30}, {1, 0.16 / 0.30}, {2, 0.04 / 0.30}, {3, 0.09 / 0.30}});
  s.temperature = 2.0f;  // sqrt(p) normalised
  const double z = std::sqrt(0.1) + std::sqrt(0.4) + std::sqrt(0.2) + std::sqrt(0.3);
  expect_distribution(Sampler(s, 4).distribution(logits_of(kP)), {{0, std::sqrt(0.1) / z}, {1, std::sqrt(0.4) / z},
                                                                   {2, std::sqrt(0.2) / z}, {3, std::sqrt(0.3) / z}});
}

TEST(Sampler, ChainOrderTopKThenTopPThenMinPThenTemperature) {
  SamplingParams s = plain();
  // Top-p sees the distribution renormalised after top-k: {0.444, 0.333, 0.222} reaches 0.75 after two tokens,
  // where the full distribution (0.4, 0.7, 0.9) would need three.
  s.top_k = 3;
  s.top_p = 0.75f;
  expect_distribution(Sampler(s, 4).distribution(logits_of(kP)), {{1, 0.4 / 0.7}, {3, 0.3 / 0.7}});
  // Min-p looks at the distribution before temperature: at T = 1 the threshold 0.6 * 0.4 = 0.24 keeps {0.4, 0.3};
  // applied after T = 0.5 it would keep only the top token (p^2: 0.09 < 0.6 * 0.16 = 0.096).
  s = plain();
  s.min_p = 0.6f;
  s.temperature = 0.5f;
  expect_distribution(Sampler(s, 4).distribution(logits_of(kP)), {{1, 0.16 / 0.25}, {3, 0.09 / 0.25}});
}

TEST(Sampler, NegativeInfinityLogitsHaveZeroProbability) {
  SamplingParams s = plain();
  const std::vector<float> l = {kNegInf, 0.5f, kNegInf, 0.5f};
  expect_distribution(Sampler(s, 4).distribution(l), {{1, 0.5}, {3, 0.5}});
  s.top_k = 3;  // k larger than the finite candidates
  expect_distribution(Sampler(s, 4).distribution(l), {{1, 0.5}, {3, 0.5}});
  Sampler sampler(s, 4);
  for (int i = 0; i < 200; ++i) {
    const int32_t t = sampler.sample(l);
    EXPECT_TRUE(t == 1 || t == 3) << t;
  }
}

TEST(Sampler, RejectsBadLogitsAndParams) {
  Sampler sampler(plain(), 3);
  EXPECT_THROW(sampler.sample(std::vector<float>{kNegInf, kNegInf, kNegInf}), Error);
  EXPECT_THROW(sampler.sample(std::vector<float>{0.0f, std::nanf(""), 1.0f}), Error);
  EXPECT_THROW(sampler.sample(std::vector<float>{0.0f, std::numeric_limits<float>::infinity(), 1.0f}), Error);
  EXPECT_THROW(sampler.sample(std::vector<float>{0.0f, 1.0f}), Error);  // wrong vocabulary size
  SamplingParams s = plain();
  s.temperature = 0.0f;
  EXPECT_THROW(Sampler(s, 3).sample(std::vector<float>{kNegInf, kNegInf, kNegInf}), Error);
  s = plain();
  s.temperature = std::nanf("");
  EXPECT_THROW(Sampler(s, 3), Error);
  s = plain();
  s.repeat_penalty = 0.0f;
  EXPECT_THROW(Sampler(s, 3), Error);
  s = plain();
  s.repeat_last_n = -1;
  EXPECT_THROW(Sampler(s, 3), Error);
  EXPECT_THROW(Sampler(plain(), 0), Error);
}

TEST(Sampler, RepeatPenaltyMath) {
  // Positive logits are divided, negative multiplied, zero stays; each distinct token once; unknown ids ignored.
  std::vector<float> l = {2.0f, -2.0f, 0.0f, 1.0f, 3.0f};
  apply_repeat_penalty(l, std::vector<int32_t>{0, 1, 2, 0, 0, -1, 99}, 2.0f);
  EXPECT_EQ(l, (std::vector<float>{1.0f, -4.0f, 0.0f, 1.0f, 3.0f}));
  // A penalty below 1 rewards repetition the same way round.
  l = {2.0f, -2.0f};
  apply_repeat_penalty(l, std::vector<int32_t>{0, 1}, 0.5f);
  EXPECT_EQ(l, (std::vector<float>{4.0f, -1.0f}));
}

TEST(Sampler, RepeatPenaltyWindowKeepsLastN) {
  SamplingParams s = plain();
  s.repeat_penalty = 2.0f;
  s.repeat_last_n = 2;
  Sampler sampler(s, 4);
  for (int32_t t : {0, 1, 2}) sampler.accept(t);  // window {1, 2}: 0 has left it
  const std::vector<float> l = {1.0f, 1.0f, 1.0f, 1.0f};
  const double a = std::exp(1.0), b = std::exp(0.5), z = 2 * a + 2 * b;
  expect_distribution(sampler.distribution(l), {{0, a / z}, {1, b / z}, {2, b / z}, {3, a / z}});
  sampler.reset_history();
  expect_distribution(sampler.distribution(l), {{0, 0.25}, {1, 0.25}, {2, 0.25}, {3, 0.25}});
  s.repeat_last_n = 0;  // off
  Sampler off(s, 4);
  off.accept(0);
  expect_distribution(off.distribution(l), {{0, 0.25}, {1, 0.25}, {2, 0.25}, {3, 0.25}});
}

std::vector<int32_t> draws(Sampler& sampler, const std::vector<float>& logits, int n) {
  std::vector<int32_t> out;
  for (int i = 0; i < n; ++i) out.push_back(sampler.sample(logits));
  return out;
}

TEST(Sampler, SameSeedSameSequence) {
  SamplingParams s = plain();
  s.seed = 42;
  Sampler a(s, 4), b(s, 4);
  EXPECT_EQ(a.seed(), 42u);
  const std::vector<int32_t> da = draws(a, logits_of(kP), 1000);
  EXPECT_EQ(da, draws(b, logits_of(kP), 1000));
  s.seed = 43;
  Sampler c(s, 4);
  EXPECT_NE(da, draws(c, logits_of(kP), 1000));
  // Without a seed, each sampler draws its own, and reports it so that a run can be repeated.
  s.seed_given = false;
  Sampler r1(s, 4), r2(s, 4);
  EXPECT_NE(r1.seed(), r2.seed());  // equal with probability 2^-64
  SamplingParams again = s;
  again.seed = r1.seed();
  again.seed_given = true;
  Sampler r1_again(again, 4);
  EXPECT_EQ(draws(r1, logits_of(kP), 200), draws(r1_again, logits_of(kP), 200));
}

// Draws n tokens and checks each frequency against its probability within 4.5 binomial standard deviations
// sqrt(p (1 - p) / n): a correct sampler fails that for a given token with probability < 7e-6. Tokens of
// probability 0 must never be drawn.
void expect_frequencies(Sampler& sampler, const std::vector<float>& logits, const std::map<int32_t, double>& want) {
  const int n = 20000;
  std::map<int32_t, int> count;
  for (int i = 0; i < n; ++i) ++count[sampler.sample(logits)];
  for (const auto& [id, c] : count) EXPECT_TRUE(want.count(id)) << "drew token " << id << " of probability 0";
  for (const auto& [id, p] : want) {
    const double f = static_cast<double>(count[id]) / n;
    const double sigma = std::sqrt(p * (1 - p) / n);
    EXPECT_NEAR(f, p, 4.5 * sigma) << "token " << id;
  }
}

TEST(Sampler, EmpiricalFrequenciesMatchDistribution) {
  SamplingParams s = plain();
  Sampler all(s, 4);
  expect_frequencies(all, logits_of(kP), {{0, 0.1}, {1, 0.4}, {2, 0.2}, {3, 0.3}});

  // Through the chain: top-k 3 drops token 0, then T = 0.5 squares the rest: 0.16, 0.09, 0.04 over 0.29.
  s.top_k = 3;
  s.temperature = 0.5f;
  s.seed = 99;
  Sampler chain(s, 4);
  expect_frequencies(chain, logits_of(kP), {{1, 0.16 / 0.29}, {3, 0.09 / 0.29}, {2, 0.04 / 0.29}});

  // A wider vocabulary with the defaults (top-k 40, top-p 0.95, min-p 0.05, T 0.8), the expected distribution
  // computed here by hand from the definitions: 50 tokens with logits 0, -0.1, ..., -4.9.
  SamplingParams d;
  d.seed = 7;
  d.seed_given = true;
  std::vector<float> l(50);
  for (int i = 0; i < 50; ++i) l[static_cast<size_t>(i)] = -0.1f * static_cast<float>(i);
  std::vector<double> p;
  double z = 0;
  for (int i = 0; i < 40; ++i) z += std::exp(static_cast<double>(l[static_cast<size_t>(i)]));  // top-k 40
  size_t keep = 0;
  for (double cum = 0; keep < 40 && cum < 0.95; ++keep) cum += std::exp(static_cast<double>(l[keep])) / z;  // top-p
  size_t keep_min_p = 0;  // min-p: logit >= log(0.05) (the max logit is 0)
  while (keep_min_p < keep && static_cast<double>(l[keep_min_p]) >= std::log(0.05)) ++keep_min_p;
  std::map<int32_t, double> want;
  double zt = 0;
  for (size_t i = 0; i < keep_min_p; ++i) zt += std::exp(static_cast<double>(l[i]) / 0.8);
  for (size_t i = 0; i < keep_min_p; ++i)
    want[static_cast<int32_t>(i)] = std::exp(static_cast<double>(l[i]) / 0.8) / zt;
  // Top-p binds: with r = e^-0.1 the first 27 of the 40 hold 1 - r^27 = 0.93279 of 1 - r^40 = 0.98168, i.e.
  // 0.9502 >= 0.95 (26 hold 0.9446). Min-p alone would keep 30 (logits down to -2.9 >= log 0.05 = -2.996).
  ASSERT_EQ(keep, 27u);
  ASSERT_EQ(keep_min_p, 27u);
  Sampler defaults(d, 50);
  expect_distribution(defaults.distribution(l), want);
  expect_frequencies(defaults, l, want);
}

}  // namespace
}  // namespace mambacpp
