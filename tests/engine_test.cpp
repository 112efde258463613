// The serving engine's properties on a tiny random Mamba-2 (and Mamba-1) checkpoint: over random arrival schedules,
// budgets, slot counts and cancellations every request gets the tokens it gets alone; FIFO admission; the prefix
// cache hits where it should, changes nothing and stays in its budget; logprobs are the log-softmax of the model's
// logits; state files continue a sequence; bad input is refused without side effects; submit/cancel from another
// thread.
#include <gtest/gtest.h>
#include <gmock/gmock.h>

#include <atomic>
#include <cmath>
#include <fstream>
#include <random>
#include <thread>

#include "mambacpp/engine.h"
#include "mambacpp/error.h"
#include "mambacpp/model.h"
#include "mambacpp/state.h"
#include "support/engine_support.h"
#include "support/test_support.h"

namespace mambacpp {
namespace {

using ::testing::HasSubstr;

std::unique_ptr<Model> load_tiny(const test::TempDir& dir, const ModelConfig& cfg, uint64_t seed = 11) {
  test::write_random_model(dir.path(), cfg, seed);
  LoadOptions opt;
  opt.device = DeviceChoice::CPU;
  return Model::load(dir.path(), opt);
}

class EngineTest : public ::testing::Test {
 protected:
  void SetUp() override { model = load_tiny(dir, test::tiny_mamba2_config()); }
  test::TempDir dir{"mambacpp_engine"};
  std::unique_ptr<Model> model;
};

GenerateRequest request(std::vector<int32_t> prompt, int max_new, float temperature, uint64_t seed = 0) {
  GenerateRequest r;
  r.prompt = std::move(prompt);
  r.max_new_tokens = max_new;
  r.sampling.temperature = temperature;
  r.sampling.top_k = 0;  // every token possible: a wrong RNG use or state shows
  r.sampling.top_p = 1.0f;
  r.sampling.min_p = 0.0f;
  r.sampling.seed = seed;
  r.sampling.seed_given = true;
  r.ignore_eos = true;
  return r;
}

// Records every event of a request, to check what it emits and when.
struct Recorder {
  std::vector<int32_t> tokens;
  int finished = 0;
  bool after_finish = false;
  GenerateResult result;
  void attach(GenerateRequest& r) {
    r.on_event = [this](const RequestEvent& e) {
      if (finished) after_finish = true;
      if (e.token) tokens.push_back(e.token->id);
      if (e.finished) ++finished, result = *e.result;
    };
  }
};

// ---- scheduling ----------------------------------------------------------------------------------------------

TEST_F(EngineTest, RandomSchedulesGiveEveryRequestItsTokensAlone) {
  std::mt19937 rng(3);
  int schedules = 0;
  for (int64_t batch_tokens : {5, 16, 64}) {
    for (int64_t max_seqs : {1, 3, 8}) {
      for (int64_t interval : {0, 4}) {
        EngineOptions opt;
        opt.max_seqs = max_seqs;
        opt.batch_tokens = batch_tokens;
        opt.state_checkpoint_interval = interval;
        Engine engine(*model, nullptr, opt);
        // Prompts from 1 token to ~3x the budget, greedy and sampled, submitted in waves between steps.
        std::vector<GenerateRequest> reqs;
        for (int i = 0; i < 7; ++i) {
          const int64_t len = 1 + static_cast<int64_t>(rng() % static_cast<uint32_t>(3 * batch_tokens));
          const float temp = i % 2 ? 1.0f : 0.0f;
          reqs.push_back(request(test::random_tokens(len, 47, static_cast<uint64_t>(100 + i)), 1 + (i * 3) % 9,
                                 temp, 40 + static_cast<uint64_t>(i)));
        }
        std::vector<Recorder> rec(reqs.size());
        std::vector<RequestId> ids;
        size_t next = 0;
        int guard = 0;
        while (next < reqs.size() || engine.step()) {
          const size_t wave = std::min(reqs.size() - next, static_cast<size_t>(rng() % 3));
          for (size_t k = 0; k < wave; ++k, ++next) {
            GenerateRequest r = reqs[next];
            rec[next].attach(r);
            ids.push_back(engine.submit(std::move(r)));
          }
          if (next < reqs.size() && wave == 0) engine.step();
          ASSERT_LT(++guard, 10000) << "the engine does not finish";
        }
        for (size_t i = 0; i < reqs.size(); ++i) {
          SCOPED_TRACE(::testing::Message() << "budget " << batch_tokens << " seqs " << max_seqs << " interval "
                                            << interval << " request " << i);
          ASSERT_EQ(rec[i].finished, 1);
          EXPECT_FALSE(rec[i].after_finish);
          EXPECT_EQ(rec[i].tokens, test::run_alone(*model, reqs[i]).tokens);
          EXPECT_EQ(rec[i].result.tokens, rec[i].tokens);
        }
        ++schedules;
      }
    }
  }
  EXPECT_EQ(schedules, 18);
}

TEST_F(EngineTest, OneSlotAdmitsInSubmissionOrder) {
  Engine engine(*model, nullptr, {.max_seqs = 1});
  std::vector<RequestId> finished;
  for (int i = 0; i < 5; ++i) {
    GenerateRequest r = request(test::random_tokens(3 + i, 47, static_cast<uint64_t>(i)), 4 - i % 3, 0.0f);
    r.on_event = [&finished](const RequestEvent& e) {
      if (e.finished) finished.push_back(e.id);
    };
    engine.submit(std::move(r));
  }
  while (engine.step()) {
  }
  EXPECT_EQ(finished, (std::vector<RequestId>{1, 2, 3, 4, 5}));
}

TEST_F(EngineTest, CancelledRequestsStopAndFreeTheirSlot) {
  Engine engine(*model, nullptr, {.max_seqs = 1});
  Recorder running, queued, after;
  GenerateRequest a = request({1, 2, 3}, 50, 1.0f, 5), b = request({4, 5}, 50, 1.0f, 6), c = request({7}, 6, 0.0f);
  running.attach(a);
  queued.attach(b);
  after.attach(c);
  const RequestId ia = engine.submit(a), ib = engine.submit(b);
  engine.submit(c);
  for (int i = 0; i < 4; ++i) engine.step();
  ASSERT_GT(running.tokens.size(), 0u);
  EXPECT_TRUE(engine.cancel(ia));
  EXPECT_TRUE(engine.cancel(ib));  // still queued
  const size_t emitted = running.tokens.size();
  while (engine.step()) {
  }
  EXPECT_EQ(running.tokens.size(), emitted) << "a cancelled request emitted again";
  EXPECT_EQ(running.finished, 1);
  EXPECT_EQ(running.result.finish_reason, FinishReason::Cancelled);
  EXPECT_EQ(queued.finished, 1);
  EXPECT_TRUE(queued.tokens.empty());
  EXPECT_EQ(queued.result.finish_reason, FinishReason::Cancelled);
  // The slot went to the last request, which ran as it runs alone.
  EXPECT_EQ(after.result.tokens, test::run_alone(*model, c).tokens);
  EXPECT_FALSE(engine.cancel(ia)) << "an ended request cannot be cancelled again";
  EXPECT_THAT(test::error_of([&] { engine.cancel(999); }), HasSubstr("no request has id 999"));
}

TEST_F(EngineTest, FullQueueIsAClearError) {
  Engine engine(*model, nullptr, {.max_seqs = 1, .max_queue = 2});
  engine.submit(request({1}, 3, 0.0f));
  engine.submit(request({2}, 3, 0.0f));
  EXPECT_THAT(test::error_of([&] { engine.submit(request({3}, 3, 0.0f)); }), HasSubstr("queue is full"));
  engine.step();  // admits one: room again
  EXPECT_NO_THROW(engine.submit(request({3}, 3, 0.0f)));
  Engine short_prompts(*model, nullptr, {.max_prompt = 4});
  EXPECT_THAT(test::error_of([&] { short_prompts.submit(request({1, 2, 3, 4, 5}, 3, 0.0f)); }),
              HasSubstr("more than the limit of 4"));
}

TEST_F(EngineTest, SubmitAndCancelFromAnotherThread) {
  Engine engine(*model, nullptr, {.max_seqs = 3, .batch_tokens = 8});
  std::vector<GenerateRequest> reqs;
  for (int i = 0; i < 12; ++i) reqs.push_back(request(test::random_tokens(2 + i, 47, static_cast<uint64_t>(i)), 40, 0.0f));
  std::vector<Recorder> rec(reqs.size());
  std::atomic<bool> done{false};
  constexpr size_t kCancelled = 4;
  std::thread producer([&] {
    for (size_t i = 0; i < reqs.size(); ++i) {
      GenerateRequest r = reqs[i];
      rec[i].attach(r);
      const RequestId id = engine.submit(std::move(r));
      if (i == kCancelled) engine.cancel(id);  // while the other thread steps
      std::this_thread::sleep_for(std::chrono::microseconds(300));
    }
    done = true;
  });
  while (!done || engine.step())
    if (!engine.step()) engine.wait_for_work(5);
  producer.join();
  while (engine.step()) {
  }
  for (size_t i = 0; i < reqs.size(); ++i) {
    ASSERT_EQ(rec[i].finished, 1) << "request " << i;
    EXPECT_FALSE(rec[i].after_finish);
    const std::vector<int32_t> alone = test::run_alone(*model, reqs[i]).tokens;
    if (i == kCancelled) {  // cancelled before it could finish its 40 tokens; what it emitted is a prefix
      EXPECT_EQ(rec[i].result.finish_reason, FinishReason::Cancelled);
      EXPECT_EQ(rec[i].tokens, std::vector<int32_t>(alone.begin(), alone.begin() + static_cast<std::ptrdiff_t>(rec[i].tokens.size())));
    } else {
      EXPECT_EQ(rec[i].tokens, alone) << "request " << i;
    }
  }
}

TEST_F(EngineTest, Mamba1SchedulesEqualAlone) {
  test::TempDir d("mambacpp_engine");
  auto m1 = load_tiny(d, test::tiny_mamba1_config());
  std::vector<GenerateRequest> reqs;
  for (int i = 0; i < 6; ++i)
    reqs.push_back(request(test::random_tokens(1 + 9 * i, 47, static_cast<uint64_t>(i)), 7, i % 2 ? 1.0f : 0.0f, 9));
  EngineOptions opt;
  opt.batch_tokens = 12;
  opt.state_checkpoint_interval = 8;
  const std::vector<GenerateResult> got = test::run_batch(*m1, reqs, nullptr, opt, 2);
  for (size_t i = 0; i < reqs.size(); ++i) EXPECT_EQ(got[i].tokens, test::run_alone(*m1, reqs[i]).tokens);
}

// ---- the prefix cache ----------------------------------------------------------------------------------------

// Top-20 logprobs of the first generated token: the logits of the prompt's last position up to a constant.
GenerateRequest with_logprobs(GenerateRequest r) {
  r.logprobs = 20;
  return r;
}

void expect_same_logprobs(const GenerateResult& a, const GenerateResult& b, double tol) {
  ASSERT_EQ(a.token_info.size(), b.token_info.size());
  for (size_t t = 0; t < a.token_info.size(); ++t) {
    ASSERT_EQ(a.token_info[t].top.size(), b.token_info[t].top.size());
    for (size_t k = 0; k < a.token_info[t].top.size(); ++k) {
      EXPECT_NEAR(a.token_info[t].top[k].logprob, b.token_info[t].top[k].logprob, tol) << "token " << t << " rank " << k;
      ASSERT_FALSE(std::isnan(a.token_info[t].top[k].logprob));
    }
  }
}

TEST_F(EngineTest, ChatNextTurnPrefillsOnlyTheNewTokensAndChangesNothing) {
  EngineOptions opt;
  opt.max_seqs = 2;
  opt.state_checkpoint_interval = 0;
  Engine engine(*model, nullptr, opt);
  const GenerateRequest turn1 = with_logprobs(request(test::random_tokens(23, 47, 1), 9, 0.0f));
  const GenerateResult r1 = engine.run({turn1}).front();
  EXPECT_EQ(r1.cached_prompt_tokens, 0);
  // Turn 2: the history (prompt + answer) plus a new message, as a chat client sends it.
  std::vector<int32_t> history = turn1.prompt;
  history.insert(history.end(), r1.tokens.begin(), r1.tokens.end());
  history.insert(history.end(), {5, 6, 7, 8});
  const GenerateRequest turn2 = with_logprobs(request(history, 8, 0.0f));
  const GenerateResult r2 = engine.run({turn2}).front();
  // The end state stands for the prompt and every answer token but the last (sampled, never fed).
  EXPECT_EQ(r2.cached_prompt_tokens, static_cast<int64_t>(turn1.prompt.size() + r1.tokens.size() - 1));
  const GenerateResult fresh = test::run_alone(*model, turn2);
  EXPECT_EQ(fresh.cached_prompt_tokens, 0);
  EXPECT_EQ(r2.tokens, fresh.tokens);
  // fp32 on the CPU: a restored state differs from a recomputed one by the rounding of a different chunking.
  expect_same_logprobs(r2, fresh, 1e-5);

  // The same prompt again: served from its state at L - 1; only the last token is computed.
  const GenerateResult again = engine.run({turn2}).front();
  EXPECT_EQ(again.cached_prompt_tokens, static_cast<int64_t>(history.size()) - 1);
  EXPECT_EQ(again.tokens, fresh.tokens);
  expect_same_logprobs(again, fresh, 1e-5);
  EXPECT_GE(engine.stats().cache_hits, 2);
}

TEST_F(EngineTest, LongPromptCheckpointsServeSharedPrefixes) {
  EngineOptions opt;
  opt.state_checkpoint_interval = 16;
  opt.batch_tokens = 24;
  Engine engine(*model, nullptr, opt);
  const std::vector<int32_t> doc = test::random_tokens(70, 47, 3);
  engine.run({request(doc, 2, 0.0f)});
  // A different question about the same first 50 tokens: the checkpoint at 48 serves it.
  std::vector<int32_t> other(doc.begin(), doc.begin() + 50);
  other.insert(other.end(), {1, 2, 3});
  const GenerateRequest q = with_logprobs(request(other, 6, 0.0f));
  const GenerateResult hit = engine.run({q}).front();
  EXPECT_EQ(hit.cached_prompt_tokens, 48);
  const GenerateResult fresh = test::run_alone(*model, q);
  EXPECT_EQ(hit.tokens, fresh.tokens);
  expect_same_logprobs(hit, fresh, 1e-5);
}

TEST_F(EngineTest, CacheStaysInItsBudget) {
  const int64_t slot = static_cast<int64_t>(model->create_state(1)->slot_bytes());
  // A budget of 1 MiB holds a bounded number of states of this tiny model; run many distinct prompts.
  EngineOptions opt;
  opt.state_cache_mb = 1;
  opt.state_checkpoint_interval = 4;
  opt.max_seqs = 4;
  Engine engine(*model, nullptr, opt);
  ASSERT_LT(slot * 8, int64_t(1) << 20) << "the test needs several states to fit";
  for (int i = 0; i < 40; ++i) engine.submit(request(test::random_tokens(30, 47, 200 + static_cast<uint64_t>(i)), 3, 0.0f));
  int64_t max_bytes = 0;
  while (engine.step()) {
    const EngineStats s = engine.stats();
    EXPECT_LE(s.cache_bytes, s.cache_budget_bytes);
    max_bytes = std::max(max_bytes, s.cache_bytes);
  }
  EXPECT_GT(max_bytes, (int64_t(1) << 20) - slot) << "the cache never filled: eviction was not exercised";
  EXPECT_EQ(engine.stats().running_peak, 4) << "40 requests queued at once fill the 4 slots, and no more";
  // A budget too small for one state: no snapshots, and the results are the same.
  Engine none(*model, nullptr, {.state_cache_mb = 0});
  const GenerateRequest r = request({1, 2, 3, 4}, 5, 0.0f);
  EXPECT_EQ(none.run({r, r}).back().cached_prompt_tokens, 0);
  EXPECT_EQ(none.stats().cache_bytes, 0);
}

// ---- logprobs --------------------------------------------------------------------------------------------------

TEST_F(EngineTest, LogprobsAreTheLogSoftmaxOfTheLogits) {
  for (bool device_sampling : {true, false}) {
    for (float temp : {0.0f, 1.0f}) {
      EngineOptions opt;
      opt.device_sampling = device_sampling;
      GenerateRequest r = request({3, 9, 27, 4}, 6, temp, 17);
      r.logprobs = 5;
      r.sampling.repeat_penalty = 1.3f;  // penalties must not leak into logprobs
      const GenerateResult g = test::run_batch(*model, {r}, nullptr, opt).front();
      ASSERT_EQ(g.token_info.size(), 6u);
      // The reference: AllLogits of the prompt plus the generated tokens, in one pass.
      std::vector<int32_t> seq = r.prompt;
      seq.insert(seq.end(), g.tokens.begin(), g.tokens.end() - 1);
      auto st = model->create_state(1);
      const Sequence s = Sequence::tokens(seq, 0);
      const ForwardResult all = model->forward(*st, std::span(&s, 1), Output::AllLogits);
      for (size_t t = 0; t < g.tokens.size(); ++t) {
        const auto row = all.row(static_cast<int64_t>(r.prompt.size() - 1 + t));
        double mx = -INFINITY, sum = 0.0;
        for (float v : row) mx = std::max(mx, static_cast<double>(v));
        for (float v : row) sum += std::exp(static_cast<double>(v) - mx);
        const double lse = mx + std::log(sum);
        const GeneratedToken& info = g.token_info[t];
        EXPECT_NEAR(info.logprob, row[static_cast<size_t>(info.id)] - lse, 1e-5);
        ASSERT_EQ(info.top.size(), 5u);
        for (size_t k = 0; k < info.top.size(); ++k) {
          EXPECT_NEAR(info.top[k].logprob, row[static_cast<size_t>(info.top[k].id)] - lse, 1e-5);
          if (k > 0) EXPECT_GE(info.top[k - 1].logprob, info.top[k].logprob);
        }
        // Every id outside the top list is no more likely than the last one in it.
        for (size_t v = 0; v < row.size(); ++v)
          if (std::none_of(info.top.begin(), info.top.end(), [&](const TokenLogprob& x) { return x.id == static_cast<int32_t>(v); }))
            EXPECT_LE(row[v] - lse, info.top.back().logprob + 1e-6);
      }
    }
  }
}

TEST_F(EngineTest, PresenceAndFrequencyPenaltiesChangeTheChoiceAlike) {
  GenerateRequest r = request({3, 3, 3}, 30, 0.0f);
  const std::vector<int32_t> plain = test::run_alone(*model, r).tokens;
  r.sampling.presence_penalty = 1.5f;
  r.sampling.frequency_penalty = 0.5f;
  const std::vector<int32_t> penalised = test::run_alone(*model, r).tokens;
  EXPECT_NE(plain, penalised) << "greedy repeats tokens on this model; the penalties must change that";
  // The engine takes whole rows for these penalties, with or without device sampling.
  EngineOptions off;
  off.device_sampling = false;
  EXPECT_EQ(test::run_batch(*model, {r}, nullptr, off).front().tokens, penalised);
  // Generated tokens only: the prompt's repeated 3 is not penalised, so the first token is the plain one.
  EXPECT_EQ(penalised.front(), plain.front());
}

// ---- state files ---------------------------------------------------------------------------------------------

TEST_F(EngineTest, SavedStateContinuesInAnotherEngine) {
  const std::string path = dir.file("turn1.state");
  GenerateRequest turn1 = request(test::random_tokens(17, 47, 8), 5, 0.0f);
  turn1.save_state = path;
  const GenerateResult r1 = test::run_alone(*model, turn1);
  ASSERT_TRUE(r1.error.empty()) << r1.error;

  Engine engine(*model, nullptr, {});
  const std::vector<int32_t> restored = engine.load_state(path);
  std::vector<int32_t> want = turn1.prompt;
  want.insert(want.end(), r1.tokens.begin(), r1.tokens.end() - 1);
  EXPECT_EQ(restored, want);
  std::vector<int32_t> history = turn1.prompt;
  history.insert(history.end(), r1.tokens.begin(), r1.tokens.end());
  history.push_back(9);
  const GenerateRequest turn2 = request(history, 6, 0.0f);
  const GenerateResult r2 = engine.run({turn2}).front();
  EXPECT_EQ(r2.cached_prompt_tokens, static_cast<int64_t>(restored.size()));
  EXPECT_EQ(r2.tokens, test::run_alone(*model, turn2).tokens);

  // Another model's file, a truncated one, and one of the old format are refused, naming why.
  test::TempDir other_dir("mambacpp_engine");
  auto other = load_tiny(other_dir, test::tiny_mamba2_config(), 99);
  Engine other_engine(*other, nullptr, {});
  EXPECT_THAT(test::error_of([&] { other_engine.load_state(path); }), HasSubstr("another model"));
  std::ifstream in(path, std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::ofstream(dir.file("short.state"), std::ios::binary).write(bytes.data(), static_cast<std::streamsize>(bytes.size() - 7));
  EXPECT_THAT(test::error_of([&] { engine.load_state(dir.file("short.state")); }), HasSubstr("truncated"));
  std::string old = bytes;
  old[16] = 2;  // the version field
  std::ofstream(dir.file("old.state"), std::ios::binary).write(old.data(), static_cast<std::streamsize>(old.size()));
  EXPECT_THAT(test::error_of([&] { engine.load_state(dir.file("old.state")); }),
              HasSubstr("records neither the layers' cache-entry kinds nor the tokens"));
  // The engine is unaffected by the failures.
  EXPECT_EQ(engine.run({turn2}).front().tokens, r2.tokens);
}

}  // namespace
}  // namespace mambacpp
