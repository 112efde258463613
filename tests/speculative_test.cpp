// Speculative decoding (engine/speculative.h and the engine's verify): greedy output with speculation is token for
// token the output without it, for prompt lookup and for a draft model, alone and beside plain requests, on a pure
// Mamba-2 model and on a hybrid with KV rows; a model drafting for itself has every greedy draft accepted; the state
// a speculating request leaves (state file, prefix cache) is the one of its committed tokens; the rejection rule keeps
// the target's distribution (exact probabilities against counts, chi-square).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <map>
#include <optional>
#include <random>

#include "engine/sampler.h"
#include "engine/speculative.h"
#include "mambacpp/engine.h"
#include "mambacpp/error.h"
#include "mambacpp/model.h"
#include "mambacpp/state.h"
#include "support/engine_support.h"
#include "support/test_support.h"

namespace mambacpp {
namespace {

std::unique_ptr<Model> load_tiny(const test::TempDir& dir, const ModelConfig& cfg, uint64_t seed) {
  test::write_random_model(dir.path(), cfg, seed);
  LoadOptions opt;
  opt.device = DeviceChoice::CPU;
  return Model::load(dir.path(), opt);
}

GenerateRequest request(std::vector<int32_t> prompt, int max_new, float temperature = 0.0f, uint64_t seed = 0) {
  GenerateRequest r;
  r.prompt = std::move(prompt);
  r.max_new_tokens = max_new;
  r.sampling.temperature = temperature;
  r.sampling.top_k = 0;
  r.sampling.top_p = 1.0f;
  r.sampling.min_p = 0.0f;
  r.sampling.seed = seed;
  r.sampling.seed_given = true;
  r.ignore_eos = true;
  return r;
}

GenerateRequest with_ngram(GenerateRequest r, int n, int k = 0) {
  r.speculative.draft_ngram = n;
  r.speculative.draft_max = k;
  return r;
}

GenerateRequest with_draft_model(GenerateRequest r, int k = 0, bool adaptive = true) {
  r.speculative.draft_model = true;
  r.speculative.draft_max = k;
  r.speculative.adaptive = adaptive;
  return r;
}

// A prompt that repeats itself, so that prompt lookup finds continuations.
std::vector<int32_t> repetitive_prompt(int64_t vocab, uint64_t seed) {
  const std::vector<int32_t> phrase = test::random_tokens(7, vocab, seed);
  std::vector<int32_t> p;
  for (int i = 0; i < 4; ++i) p.insert(p.end(), phrase.begin(), phrase.end());
  p.push_back(phrase[0]);
  return p;
}

TEST(SpeculativeParts, NgramDraftContinuesTheLatestOccurrence) {
  const std::vector<int32_t> ctx = {5, 1, 2, 9, 9, 1, 2, 7, 8, 3, 1, 2};
  EXPECT_EQ(ngram_draft(ctx, 2, 3), (std::vector<int32_t>{7, 8, 3}));  // [1 2] last seen before 7 8 3
  EXPECT_EQ(ngram_draft(ctx, 3, 4), (std::vector<int32_t>{}));         // [3 1 2] occurs only at the end
  EXPECT_EQ(ngram_draft(ctx, 1, 10), (std::vector<int32_t>{7, 8, 3, 1, 2}));  // up to the end of the context
  EXPECT_EQ(ngram_draft(std::vector<int32_t>{4, 4}, 1, 3), (std::vector<int32_t>{4}));
  EXPECT_TRUE(ngram_draft(ctx, 0, 3).empty());
  EXPECT_TRUE(ngram_draft(ctx, 2, 0).empty());
}

TEST(SpeculativeParts, DraftLengthAdaptsAndPauses) {
  // min_gain 0: the cost gate never pauses, so this is the adaptation alone (the gate: speculative_schedule_test.cpp).
  DraftLength d(4, true);
  EXPECT_EQ(d.next_at(0, 0.0), 4);
  d.record(4, 0);
  EXPECT_EQ(d.next_at(1, 0.0), 2);
  d.record(2, 0);
  EXPECT_EQ(d.next_at(2, 0.0), 1);
  d.record(1, 0);  // nothing accepted at one token: pause one step (until the next multiple of 1)
  EXPECT_EQ(d.next_at(3, 0.0), 0);
  EXPECT_EQ(d.next_at(4, 0.0), 1);
  d.record(1, 0);  // again: a pause of two steps, ending at the next multiple of 2
  EXPECT_EQ(d.next_at(4, 0.0), 0);
  EXPECT_EQ(d.next_at(5, 0.0), 0);
  EXPECT_EQ(d.next_at(6, 0.0), 1);
  d.record(1, 1);
  EXPECT_EQ(d.next_at(7, 0.0), 2);
  DraftLength partial(8, true);
  partial.record(8, 3);  // fewer than half kept: halve
  EXPECT_EQ(partial.next_at(0, 0.0), 4);
  partial.record(4, 2);  // half: keep
  EXPECT_EQ(partial.next_at(1, 0.0), 4);
  partial.record(4, 1);
  partial.record(2, 0);
  partial.record(1, 0);  // pause 1
  EXPECT_EQ(partial.next_at(2, 0.0), 0);
  EXPECT_EQ(partial.next_at(3, 0.0), 1);
  partial.record(1, 0);  // pause 2: from 4 to 6
  EXPECT_EQ(partial.next_at(4, 0.0), 0);
  EXPECT_EQ(partial.next_at(5, 0.0), 0);
  EXPECT_EQ(partial.next_at(6, 0.0), 1);
  partial.record(1, 1);  // kept: the pauses start at 1 again
  partial.record(2, 0);
  partial.record(1, 0);
  EXPECT_EQ(partial.next_at(7, 0.0), 0);
  EXPECT_EQ(partial.next_at(8, 0.0), 1);
  DraftLength fixed(3, false);
  fixed.record(3, 0);
  EXPECT_EQ(fixed.next_at(0, 0.0), 3);
}

// Pearson's chi-square of `counts` against probabilities `p` (cells with expected count < 5 pooled).
double chi_square(const std::map<int32_t, int>& counts, const std::map<int32_t, double>& p, int n, int* dof) {
  double stat = 0.0, pooled_e = 0.0, pooled_o = 0.0;
  int cells = 0;
  for (const auto& [id, prob] : p) {
    const double e = prob * n;
    const double o = counts.count(id) ? counts.at(id) : 0;
    if (e < 5.0) {
      pooled_e += e, pooled_o += o;
      continue;
    }
    stat += (o - e) * (o - e) / e, ++cells;
  }
  for (const auto& [id, c] : counts)
    if (!p.count(id)) pooled_o += c;  // a token of probability 0 drawn: the pooled cell shows it
  if (pooled_e > 0.0) stat += (pooled_o - pooled_e) * (pooled_o - pooled_e) / pooled_e, ++cells;
  *dof = cells - 1;
  return stat;
}

// The 0.999 quantile of chi-square with `dof` degrees of freedom (Wilson-Hilferty).
double chi_square_999(int dof) {
  const double z = 3.0902, k = dof;
  const double t = 1.0 - 2.0 / (9.0 * k) + z * std::sqrt(2.0 / (9.0 * k));
  return k * t * t * t;
}

TEST(SpeculativeParts, RejectionRuleKeepsTheTargetDistribution) {
  const std::vector<TokenProb> p = {{3, 0.4}, {1, 0.25}, {7, 0.2}, {0, 0.1}, {5, 0.05}};
  const std::vector<TokenProb> q = {{7, 0.5}, {2, 0.3}, {3, 0.1}, {5, 0.1}};  // 2: a token p never gives
  std::map<int32_t, double> want;
  for (const TokenProb& t : p) want[t.id] = t.p;
  std::mt19937_64 rng(7);
  const int n = 200000;
  for (const bool deterministic : {false, true}) {
    std::map<int32_t, int> counts;
    int kept = 0;
    for (int i = 0; i < n; ++i) {
      const int32_t d = deterministic ? 7 : draw_from(q, rng);
      const SpeculativeChoice c =
          speculative_choice(p, deterministic ? std::span<const TokenProb>() : std::span<const TokenProb>(q), d, rng);
      ++counts[c.token];
      kept += c.accepted;
      if (c.accepted) EXPECT_EQ(c.token, d);
    }
    int dof = 0;
    const double stat = chi_square(counts, want, n, &dof);
    EXPECT_LT(stat, chi_square_999(dof)) << (deterministic ? "deterministic draft" : "drafts drawn from q");
    EXPECT_EQ(counts.count(2), 0u);
    // Acceptance: sum min(p, q) for drawn drafts (0.1 + 0.2 + 0.05 = 0.35); p(7) = 0.2 for the fixed draft.
    EXPECT_NEAR(static_cast<double>(kept) / n, deterministic ? 0.2 : 0.35, 0.01);
  }
}

class SpeculativeTest : public ::testing::Test {
 protected:
  void SetUp() override {
    model = load_tiny(dir, test::tiny_mamba2_config(), 11);
    draft = load_tiny(draft_dir, test::tiny_mamba2_config(), 12);  // another model of the same vocabulary
  }
  EngineOptions with_draft(const Model& d) const {
    EngineOptions o;
    o.draft_model = &d;
    return o;
  }
  test::TempDir dir{"mambacpp_spec"}, draft_dir{"mambacpp_spec_draft"};
  std::unique_ptr<Model> model, draft;
};

TEST_F(SpeculativeTest, ModelDraftingForItselfFollowsAChunkedPrefillAndACacheHit) {
  // The draft model follows the prompt chunk by chunk in the prefill steps, from the prompt's start when a cached
  // prefix skips the target's prefill of it: drafting for itself, every draft is still accepted.
  const std::vector<int32_t> prompt = test::random_tokens(100, 47, 77);
  EngineOptions o = with_draft(*model);
  o.batch_tokens = 16;
  o.state_cache_mb = 64;
  Engine engine(*model, nullptr, o);
  for (int pass = 0; pass < 2; ++pass) {
    std::vector<int32_t> p = prompt;
    if (pass == 1) p.insert(p.end(), {5, 9, 13});  // a hit on the first request's cached prompt
    const GenerateRequest plain = request(p, 20);
    std::vector<GenerateRequest> one;
    one.push_back(with_draft_model(plain, 4));
    const GenerateResult got = engine.run(std::move(one)).front();
    ASSERT_EQ(got.tokens, test::run_alone(*model, plain).tokens) << "pass " << pass;
    EXPECT_GT(got.draft_tokens, 0);
    EXPECT_EQ(got.accepted_draft_tokens, got.draft_tokens) << "pass " << pass;
    if (pass == 1) EXPECT_GT(got.cached_prompt_tokens, 0);
  }
}

TEST_F(SpeculativeTest, GreedyPromptLookupGivesThePlainTokens) {
  int64_t drafted = 0, accepted = 0;
  for (uint64_t s = 0; s < 6; ++s) {
    const GenerateRequest plain = request(repetitive_prompt(47, s), 40);
    const GenerateResult want = test::run_alone(*model, plain);
    for (const int n : {1, 2, 3}) {
      for (const int k : {1, 3, 8}) {
        const GenerateResult got = test::run_alone(*model, with_ngram(plain, n, k));
        ASSERT_EQ(got.tokens, want.tokens) << "prompt " << s << ", ngram " << n << ", draft_max " << k;
        EXPECT_EQ(got.finish_reason, want.finish_reason);
        EXPECT_LE(got.accepted_draft_tokens, got.draft_tokens);
        drafted += got.draft_tokens, accepted += got.accepted_draft_tokens;
      }
    }
  }
  EXPECT_GT(drafted, 100);  // speculation ran...
  EXPECT_GT(accepted, 10);  // ...and drafts were both kept
  EXPECT_LT(accepted, drafted);  // and refused (rollbacks happened)
}

TEST_F(SpeculativeTest, GreedyDraftModelGivesThePlainTokens) {
  int64_t drafted = 0, accepted = 0;
  for (uint64_t s = 0; s < 4; ++s) {
    const GenerateRequest plain = request(test::random_tokens(5 + 9 * s, 47, 30 + s), 33);
    const GenerateResult want = test::run_alone(*model, plain);
    for (const int k : {1, 2, 5}) {
      for (const bool adaptive : {true, false}) {
        const GenerateResult got = test::run_alone(*model, with_draft_model(plain, k, adaptive), nullptr, with_draft(*draft));
        ASSERT_EQ(got.tokens, want.tokens) << "prompt " << s << ", draft_max " << k;
        drafted += got.draft_tokens, accepted += got.accepted_draft_tokens;
      }
    }
  }
  EXPECT_GT(drafted, 100);
  EXPECT_LT(accepted, drafted);
}

TEST_F(SpeculativeTest, ModelDraftingForItselfHasEveryGreedyDraftAccepted) {
  for (uint64_t s = 0; s < 3; ++s) {
    const GenerateRequest plain = request(test::random_tokens(4 + 11 * s, 47, 50 + s), 30);
    const GenerateResult want = test::run_alone(*model, plain);
    for (const int k : {1, 4, 7}) {
      const GenerateResult got = test::run_alone(*model, with_draft_model(plain, k), nullptr, with_draft(*model));
      ASSERT_EQ(got.tokens, want.tokens);
      EXPECT_GT(got.draft_tokens, 0);
      EXPECT_EQ(got.accepted_draft_tokens, got.draft_tokens) << "draft_max " << k;
      // The first token is a decode step's; then k drafts and the target's own token per verify (k bounded by
      // the tokens left): 29 tokens in ceil(29 / (k + 1)) verifies, each drafting all but one of its tokens.
      EXPECT_GE(got.draft_tokens, 29 - (29 + k) / (k + 1));
    }
  }
}

TEST_F(SpeculativeTest, MixedBatchGivesEveryRequestItsTokensAlone) {
  EngineOptions opts = with_draft(*draft);
  opts.state_cache_mb = 0;
  std::vector<GenerateRequest> reqs;
  for (int i = 0; i < 12; ++i) {
    const float temp = i % 4 == 3 ? 0.9f : 0.0f;
    GenerateRequest r = request(i % 2 ? repetitive_prompt(47, 70 + i) : test::random_tokens(3 + 5 * i, 47, 70 + i),
                                10 + (i * 7) % 23, temp, 100 + i);
    if (i % 3 == 1) r = with_ngram(std::move(r), 1 + i % 3, i % 5);
    if (i % 3 == 2) r = with_draft_model(std::move(r), i % 4);
    reqs.push_back(std::move(r));
  }
  for (const int64_t slots : {12, 3}) {
    for (const int64_t budget : {0, 5}) {
      EngineOptions o = opts;
      o.batch_tokens = budget;
      const std::vector<GenerateResult> got = test::run_batch(*model, reqs, nullptr, o, slots);
      for (size_t i = 0; i < reqs.size(); ++i) {
        // The request alone, speculating as it does in the batch (sampling: the same draws)...
        const GenerateResult alone = test::run_alone(*model, reqs[i], nullptr, opts);
        EXPECT_EQ(got[i].tokens, alone.tokens) << "request " << i << ", " << slots << " slots, budget " << budget;
        EXPECT_EQ(got[i].draft_tokens, alone.draft_tokens) << "request " << i;
        // ...and greedy ones give the plain tokens.
        if (reqs[i].sampling.greedy()) {
          GenerateRequest plain = reqs[i];
          plain.speculative = {};
          EXPECT_EQ(got[i].tokens, test::run_alone(*model, plain).tokens) << "request " << i;
        }
      }
    }
  }
}

// The state a state file holds, as f32, and the tokens it stands for.
std::vector<float> state_in_file(const Model& model, const std::string& path, std::vector<int32_t>* tokens) {
  auto st = model.create_state(1);
  *tokens = st->load(0, path);
  return st->read_slot(0);
}

// A speculating request leaves the state of its committed tokens: its state file holds the plain run's tokens and
// state (up to the rounding of a different split: 1e-5, as tests/model_invariance_test.cpp allows), and a next turn
// served from the prefix cache continues as a fresh computation does. Returns drafted - accepted (rollbacks).
int64_t expect_state_of_committed_tokens(const Model& model, const Model* draft, std::vector<int32_t> prompt,
                                         uint64_t seed) {
  int64_t refused = 0;
  test::TempDir tmp("mambacpp_spec_state");
  GenerateRequest plain = request(prompt, 25);
  plain.save_state = tmp.file("plain.state");
  const GenerateResult want = test::run_alone(model, plain);
  for (int source = 0; source < 2; ++source) {
    if (source == 1 && !draft) continue;
    GenerateRequest spec = source == 0 ? with_ngram(plain, 2, 4) : with_draft_model(plain, 3);
    spec.save_state = tmp.file("spec.state");
    EngineOptions o;
    o.draft_model = draft;
    Engine engine(model, nullptr, o);
    const GenerateResult got = engine.run({spec}).front();
    EXPECT_EQ(got.tokens, want.tokens) << "source " << source << ", seed " << seed;
    if (got.tokens != want.tokens) return refused;
    refused += got.draft_tokens - got.accepted_draft_tokens;
    std::vector<int32_t> spec_tokens, plain_tokens;
    const std::vector<float> spec_state = state_in_file(model, tmp.file("spec.state"), &spec_tokens);
    const std::vector<float> plain_state = state_in_file(model, tmp.file("plain.state"), &plain_tokens);
    EXPECT_EQ(spec_tokens, plain_tokens) << "source " << source;
    EXPECT_EQ(spec_state.size(), plain_state.size()) << "the KV rows of other tokens";
    EXPECT_LT(test::max_rel_diff(spec_state, plain_state), 1e-5) << "source " << source;
    // The next turn: the prompt, the answer (all but the last token is in the cached state) and more tokens.
    std::vector<int32_t> next = prompt;
    next.insert(next.end(), got.tokens.begin(), got.tokens.end());
    const std::vector<int32_t> more = test::random_tokens(4, model.config().vocab_size, seed + 99);
    next.insert(next.end(), more.begin(), more.end());
    const GenerateResult turn2 = engine.run({request(next, 8)}).front();
    EXPECT_GE(turn2.cached_prompt_tokens, static_cast<int64_t>(prompt.size() + got.tokens.size()) - 1);
    EXPECT_EQ(turn2.tokens, test::run_alone(model, request(next, 8)).tokens);
  }
  return refused;
}

TEST_F(SpeculativeTest, StateAndPrefixCacheSeeOnlyCommittedTokens) {
  int64_t refused = 0;
  for (uint64_t s = 0; s < 4; ++s)
    refused += expect_state_of_committed_tokens(*model, draft.get(), repetitive_prompt(47, 90 + s), s);
  EXPECT_GT(refused, 0) << "no draft was refused: the rollback went untested";
}

// A stop token inside a verify row ends the request there: the state it caches and saves is that of the tokens before
// the stop (the row's rest is rolled back before finalize), and logprobs are those of plain decoding.
TEST_F(SpeculativeTest, StopInsideAVerifyRowLandsTheStateFirst) {
  test::TempDir tmp("mambacpp_spec_stop");
  // A prompt whose greedy run first generates some token at position 2..6: the first token is a decode step's, the
  // next verify row (7 drafts, all kept when the model drafts for itself) carries positions 1..8, so the stop
  // falls inside it.
  std::vector<int32_t> prompt;
  GenerateResult free_run;
  size_t at = 0;
  for (uint64_t seed = 160; seed < 200 && at == 0; ++seed) {
    prompt = test::random_tokens(6, 47, seed);
    free_run = test::run_alone(*model, request(prompt, 30));
    for (size_t i = 2; i <= 6 && i < free_run.tokens.size() && at == 0; ++i)
      if (std::find(free_run.tokens.begin(), free_run.tokens.begin() + static_cast<std::ptrdiff_t>(i),
                    free_run.tokens[i]) == free_run.tokens.begin() + static_cast<std::ptrdiff_t>(i))
        at = i;
  }
  ASSERT_GT(at, 0u) << "no prompt found whose run generates a new token at positions 2..6";
  GenerateRequest plain = request(prompt, 30);
  plain.stop_tokens = {free_run.tokens[at]};
  plain.logprobs = 3;
  plain.save_state = tmp.file("plain.state");
  const GenerateResult want = test::run_alone(*model, plain);
  ASSERT_EQ(want.finish_reason, FinishReason::Eos);
  GenerateRequest spec = with_draft_model(plain, 7, /*adaptive=*/false);
  spec.save_state = tmp.file("spec.state");
  EngineOptions o = with_draft(*model);
  Engine engine(*model, nullptr, o);
  const GenerateResult got = engine.run({spec}).front();
  EXPECT_EQ(got.tokens, want.tokens);
  EXPECT_EQ(got.finish_reason, FinishReason::Eos);
  // One verify row of 7 drafts: those up to the stop token were kept (it counts among them); it ended the request.
  EXPECT_EQ(got.draft_tokens, 7);
  EXPECT_EQ(got.accepted_draft_tokens, static_cast<int64_t>(at));
  ASSERT_EQ(got.token_info.size(), want.token_info.size());
  for (size_t i = 0; i < got.token_info.size(); ++i) {
    EXPECT_NEAR(got.token_info[i].logprob, want.token_info[i].logprob, 1e-4) << "token " << i;
    ASSERT_EQ(got.token_info[i].top.size(), 3u);
    for (size_t j = 0; j < 3; ++j) EXPECT_EQ(got.token_info[i].top[j].id, want.token_info[i].top[j].id);
  }
  std::vector<int32_t> spec_tokens, plain_tokens;
  const std::vector<float> a = state_in_file(*model, tmp.file("spec.state"), &spec_tokens);
  const std::vector<float> b = state_in_file(*model, tmp.file("plain.state"), &plain_tokens);
  EXPECT_EQ(spec_tokens, plain_tokens);
  EXPECT_LT(test::max_rel_diff(a, b), 1e-5);
  // The cached state is that of the committed tokens: a prompt continuing them is a hit that changes nothing.
  std::vector<int32_t> next = prompt;
  next.insert(next.end(), got.tokens.begin(), got.tokens.end());
  next.push_back(free_run.tokens[at]);
  const GenerateResult turn2 = engine.run({request(next, 6)}).front();
  EXPECT_EQ(turn2.cached_prompt_tokens, static_cast<int64_t>(prompt.size() + got.tokens.size()));
  EXPECT_EQ(turn2.tokens, test::run_alone(*model, request(next, 6)).tokens);
}

// After a refused draft the kept tokens wait for the request's next verify row (no forward of their own). A request
// cancelled in between still saves the state of every committed token: cancelled after each step in turn, its state
// file holds the tokens it fed and their state from one plain forward (1e-5: another split, as above).
TEST_F(SpeculativeTest, CancelBetweenVerifiesSavesTheCommittedTokensState) {
  test::TempDir tmp("mambacpp_spec_cancel");
  const std::vector<int32_t> prompt = test::random_tokens(9, 47, 210);
  const std::vector<int32_t> plain_tokens = test::run_alone(*model, request(prompt, 30)).tokens;
  int64_t refused = 0;
  for (int steps = 1; steps <= 12; ++steps) {
    GenerateRequest spec = with_draft_model(request(prompt, 30), 4, /*adaptive=*/false);
    spec.save_state = tmp.file("spec.state");
    std::optional<GenerateResult> result;
    spec.on_event = [&](const RequestEvent& e) {
      if (e.finished) result = *e.result;
    };
    Engine engine(*model, nullptr, with_draft(*draft));
    const RequestId id = engine.submit(std::move(spec));
    for (int i = 0; i < steps && !result; ++i) engine.step();
    if (result) break;  // finished before this many steps: every later count is the same run
    ASSERT_TRUE(engine.cancel(id));
    while (!result) engine.step();
    refused += result->draft_tokens - result->accepted_draft_tokens;
    ASSERT_LE(result->tokens.size(), plain_tokens.size());
    EXPECT_TRUE(std::equal(result->tokens.begin(), result->tokens.end(), plain_tokens.begin())) << steps << " steps";
    std::vector<int32_t> saved;
    const std::vector<float> got = state_in_file(*model, tmp.file("spec.state"), &saved);
    // The prompt and every generated token but the last (the one the next step would feed).
    std::vector<int32_t> fed = prompt;
    fed.insert(fed.end(), result->tokens.begin(), result->tokens.end() - 1);
    EXPECT_EQ(saved, fed) << steps << " steps";
    auto fresh = model->create_state(1);
    const Sequence whole = Sequence::tokens(saved, 0);
    model->forward(*fresh, {&whole, 1}, Output::None);
    EXPECT_LT(test::max_rel_diff(got, fresh->read_slot(0)), 1e-5) << steps << " steps";
  }
  EXPECT_GT(refused, 0) << "no draft was refused: no cancel fell between a refusal and the next verify";
}

TEST(SpeculativeHybrid, KvRowsRollBackToTheCommittedTokens) {
  LoadOptions opt;
  opt.device = DeviceChoice::CPU;
  for (const char* name : {"nemotron_h_f32", "bamba_f32"}) {
    const std::string dir = test::fixture_dir() + "/hybrid/" + name;
    auto model = Model::load(dir, opt);
    const int64_t vocab = model->config().vocab_size;
    int64_t refused = 0;
    for (uint64_t s = 0; s < 3; ++s) {
      SCOPED_TRACE(name);
      refused += expect_state_of_committed_tokens(*model, model.get(), repetitive_prompt(vocab, 120 + s), s);
      // Self-drafting on a hybrid: every draft accepted, the plain tokens.
      const GenerateRequest plain = request(test::random_tokens(9, vocab, 130 + s), 20);
      EngineOptions o;
      o.draft_model = model.get();
      const GenerateResult got = test::run_alone(*model, with_draft_model(plain, 4), nullptr, o);
      EXPECT_EQ(got.tokens, test::run_alone(*model, plain).tokens);
      EXPECT_EQ(got.accepted_draft_tokens, got.draft_tokens);
    }
    EXPECT_GT(refused, 0) << name << ": no draft was refused, the KV rollback went untested";
  }
}

// The second and third sampled tokens' marginals against the exact ones, from the model's logits. The first token is
// a decode step's; the next verify drafts two tokens, by prompt lookup (the prompt repeats) or from a draft model
// (another distribution, q), and the rejection rule picks them.
TEST_F(SpeculativeTest, SamplingKeepsTheModelsDistribution) {
  const std::vector<int32_t> prompt = repetitive_prompt(47, 140);
  SamplingParams sp;
  sp.temperature = 1.0f, sp.top_k = 0, sp.top_p = 1.0f, sp.min_p = 0.0f;
  // p(next | prompt + each continuation), the continuations run side by side in one forward.
  auto next_dists = [&](const std::vector<std::vector<int32_t>>& continuations) {
    auto st = model->create_state(static_cast<int64_t>(continuations.size()));
    std::vector<std::vector<int32_t>> ids(continuations.size(), prompt);
    std::vector<Sequence> seqs;
    for (size_t i = 0; i < ids.size(); ++i) {
      ids[i].insert(ids[i].end(), continuations[i].begin(), continuations[i].end());
      seqs.push_back(Sequence::tokens(ids[i], static_cast<int64_t>(i)));
    }
    const ForwardResult out = model->forward(*st, seqs, Output::LastLogits);
    std::vector<std::vector<double>> d(continuations.size(), std::vector<double>(47, 0.0));
    Sampler s(sp, 47);
    for (size_t i = 0; i < continuations.size(); ++i)
      for (const TokenProb& t : s.distribution(out.row(static_cast<int64_t>(i)))) d[i][static_cast<size_t>(t.id)] += t.p;
    return d;
  };
  const std::vector<double> p1 = next_dists({{}})[0];
  std::map<int32_t, double> p2, p3;
  for (int32_t t1 = 0; t1 < 47; ++t1) {
    const std::vector<double> after1 = next_dists({{t1}})[0];
    std::vector<std::vector<int32_t>> pairs;
    for (int32_t t2 = 0; t2 < 47; ++t2) pairs.push_back({t1, t2});
    const std::vector<std::vector<double>> after2 = next_dists(pairs);
    for (int32_t t2 = 0; t2 < 47; ++t2) {
      const double w = p1[static_cast<size_t>(t1)] * after1[static_cast<size_t>(t2)];
      p2[t2] += w;
      for (int32_t t3 = 0; t3 < 47; ++t3) p3[t3] += w * after2[static_cast<size_t>(t2)][static_cast<size_t>(t3)];
    }
  }
  const int n = 1500;
  for (int source = 0; source < 2; ++source) {
    std::vector<GenerateRequest> reqs;
    for (int i = 0; i < n; ++i) {
      GenerateRequest r = request(prompt, 4, 1.0f, 1000 + static_cast<uint64_t>(i));
      reqs.push_back(source == 0 ? with_ngram(std::move(r), 1, 2) : with_draft_model(std::move(r), 2));
      reqs.back().speculative.adaptive = false;
    }
    EngineOptions o = with_draft(*draft);
    o.state_cache_mb = 0;
    const std::vector<GenerateResult> got = test::run_batch(*model, std::move(reqs), nullptr, o, 64);
    std::map<int32_t, int> c2, c3;
    int64_t drafted = 0, accepted = 0;
    for (const GenerateResult& r : got) {
      ASSERT_EQ(r.tokens.size(), 4u);
      ++c2[r.tokens[1]], ++c3[r.tokens[2]];
      drafted += r.draft_tokens, accepted += r.accepted_draft_tokens;
    }
    // Prompt lookup drafts when the first token occurs in the prompt (7 of 47 ids); a draft model always drafts.
    EXPECT_GE(drafted, source == 0 ? n / 10 : 2 * n) << "source " << source;
    EXPECT_GT(accepted, 0);
    EXPECT_LT(accepted, drafted);
    int dof2 = 0, dof3 = 0;
    const double s2 = chi_square(c2, p2, n, &dof2), s3 = chi_square(c3, p3, n, &dof3);
    EXPECT_LT(s2, chi_square_999(dof2)) << "second token, source " << source << ", " << dof2 << " dof";
    EXPECT_LT(s3, chi_square_999(dof3)) << "third token, source " << source << ", " << dof3 << " dof";
    std::printf("[speculative sampling] source %d: %lld drafted, %lld accepted; chi2 %.1f (%d dof), %.1f (%d dof)\n",
                source, static_cast<long long>(drafted), static_cast<long long>(accepted), s2, dof2, s3, dof3);
  }
}

TEST_F(SpeculativeTest, BadSpeculativeParametersAreClearErrors) {
  Engine plain(*model, nullptr);
  GenerateRequest r = request({1, 2, 3}, 4);
  EXPECT_NE(test::error_of([&] { plain.submit(with_draft_model(r)); }).find("--draft-model"), std::string::npos);
  EXPECT_NE(test::error_of([&] { plain.submit(with_ngram(r, 17)); }).find("draft_ngram must be in [0, 16]"),
            std::string::npos);
  EXPECT_NE(test::error_of([&] { plain.submit(with_ngram(r, 2, 33)); }).find("draft_max must be in [0, 32]"),
            std::string::npos);
  Engine with(*model, nullptr, with_draft(*draft));
  EXPECT_NE(test::error_of([&] { with.submit(with_ngram(with_draft_model(r), 2)); }).find("not both"),
            std::string::npos);
  // A draft model of another vocabulary.
  test::TempDir other("mambacpp_spec_other");
  ModelConfig c = test::tiny_mamba2_config();
  c.vocab_size = 53;
  auto wrong = load_tiny(other, c, 3);
  EXPECT_NE(test::error_of([&] { Engine e(*model, nullptr, with_draft(*wrong)); }).find("vocabulary of 53 ids"),
            std::string::npos);
}

}  // namespace
}  // namespace mambacpp
