// The schedule of speculation in a batch (engine/speculative.h DraftLength::next_at): requests whose drafts are
// refused stop costing verifies within a bounded number of steps, and paused requests that decode side by side probe
// in the same steps (a step with any verify pays for a whole target forward), at batch 1 and 8; requests whose drafts
// are all accepted keep drafting at full length; the cost gate pauses low acceptance and lets high acceptance draft.
// Through the engine: the steps with a verify (a step whose stats gain draft tokens) of a batch of 8 with a draft
// model of other weights, and of a model drafting for itself.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "engine/speculative.h"
#include "mambacpp/engine.h"
#include "mambacpp/model.h"
#include "support/engine_support.h"
#include "support/test_support.h"

namespace mambacpp {
namespace {

// Rows that decode side by side, each with its own controller; every draft is refused (one target token a verify).
// Returns the steps in which any row verified, over `steps` steps.
std::set<int> verify_steps_refused(const std::vector<int>& draft_max, int steps, double min_gain) {
  std::vector<DraftLength> rows;
  for (int k : draft_max) rows.emplace_back(k, true);
  std::vector<int64_t> generated(rows.size(), 0);
  std::set<int> out;
  for (int s = 0; s < steps; ++s) {
    for (size_t i = 0; i < rows.size(); ++i) {
      const int k = rows[i].next_at(generated[i], min_gain);
      if (k > 0) rows[i].record(k, 0), out.insert(s);
      ++generated[i];
    }
  }
  return out;
}

TEST(SpeculativeSchedule, RefusedDraftsStopCostingVerifiesAtBatch1And8) {
  for (const double gain : {verify_cost_in_steps(false), verify_cost_in_steps(true)}) {
    for (const std::vector<int>& batch : {std::vector<int>{4}, std::vector<int>{4, 4, 4, 4, 4, 4, 4, 4},
                                          std::vector<int>{1, 2, 3, 4, 5, 8, 16, 32}}) {
      const std::set<int> v = verify_steps_refused(batch, 1024, gain);
      // Pauses double up to kMaxPauseSteps: after the first pauses (1 + 2 + ... + 64 steps, 7 probes and the first
      // verifies) at most one step in kMaxPauseSteps verifies, whatever the batch.
      EXPECT_LE(static_cast<int>(v.size()), 12 + 1024 / kMaxPauseSteps) << "batch " << batch.size() << ", gain " << gain;
      std::vector<int> late;
      for (int s : v)
        if (s >= 256) late.push_back(s);
      for (int s : late) EXPECT_EQ(s % kMaxPauseSteps, 0) << "a verify off the shared schedule, step " << s;
      EXPECT_EQ(late.size(), static_cast<size_t>((1024 - 256) / kMaxPauseSteps)) << "the probes went on";
    }
  }
}

TEST(SpeculativeSchedule, PausedRowsProbeInTheSameStepsWhateverTheirHistory) {
  // Two rows with different histories (one had a few good verifies first) pause on the same grid: every probe of
  // a row with a pause of P steps is at a multiple of P of its generated count.
  DraftLength a(4, true), b(4, true);
  int64_t ga = 0, gb = 0;
  for (int i = 0; i < 3; ++i) {
    const int k = b.next_at(gb, 1.0);
    ASSERT_GT(k, 0);
    b.record(k, k), gb += k + 1;  // all kept: the row moves ahead k + 1 tokens
  }
  std::set<int64_t> pa, pb;
  for (int s = 0; s < 600; ++s) {
    if (const int k = a.next_at(ga, 1.0); k > 0) a.record(k, 0), pa.insert(ga);
    if (const int k = b.next_at(gb, 1.0); k > 0) b.record(k, 0), pb.insert(gb);
    ++ga, ++gb;
  }
  for (const std::set<int64_t>* p : {&pa, &pb})
    for (int64_t g : *p)
      if (g >= 300) EXPECT_EQ(g % kMaxPauseSteps, 0) << "probe at generated " << g;
}

TEST(SpeculativeSchedule, FullAcceptanceKeepsDrafting) {
  for (const double gain : {verify_cost_in_steps(false), verify_cost_in_steps(true)}) {
    for (const int max : {1, 2, 4, 8}) {
      DraftLength d(max, true);
      int64_t g = 0;
      for (int s = 0; s < 200; ++s) {
        const int k = d.next_at(g, gain);
        ASSERT_EQ(k, max) << "step " << s << ", gain " << gain;  // every draft kept: the length stays at its maximum
        d.record(k, k), g += k + 1;
      }
    }
  }
}

TEST(SpeculativeSchedule, CostGatePausesLowAcceptanceOnly) {
  // GPU gate (2 expected tokens): a row keeping 1 of 4 drafts pauses; one keeping 3 of 4 drafts every step.
  const double gain = verify_cost_in_steps(true);
  ASSERT_GT(gain, 1.0);
  DraftLength low(4, true), high(4, true);
  int64_t gl = 0, gh = 0;
  int low_verifies = 0;
  for (int s = 0; s < 256; ++s) {
    if (const int k = low.next_at(gl, gain); k > 0) low.record(k, k / 4), ++low_verifies, gl += k / 4;
    ++gl;
    const int k = high.next_at(gh, gain);
    ASSERT_GT(k, 0) << "step " << s;
    high.record(k, (3 * k) / 4);
    gh += (3 * k) / 4 + 1;
  }
  EXPECT_LE(low_verifies, 12 + 256 / kMaxPauseSteps);
}

TEST(SpeculativeSchedule, AnOccasionalKeptDraftDoesNotRestartTheBackOff) {
  // A row whose every fifth verify keeps its draft (at one token: a gain under a verify's cost) pauses as long as
  // one whose drafts are all refused, instead of starting its back-off over at each such verify (~90 verifies).
  const double gain = verify_cost_in_steps(true);
  DraftLength row(4, true);
  int verifies = 0;
  for (int64_t g = 0; g < 512; ++g) {
    if (const int k = row.next_at(g, gain); k > 0) {
      const bool kept = ++verifies % 5 == 0;
      row.record(k, kept ? std::min(k, 1) : 0, gain);
    }
  }
  EXPECT_LE(verifies, 12 + 512 / kMaxPauseSteps);
}

// Through the engine: `requests` greedy requests of equal prompt length stepped one step at a time; the steps in which
// the engine verified (its draft-token count grew) and the results.
struct Stepped {
  std::vector<int64_t> verify_steps;
  int64_t steps = 0;
  int64_t verify_forwards = 0;  // EngineStats::verify_steps
  std::vector<GenerateResult> results;
};
Stepped step_batch(const Model& model, const Model* draft, int requests, int max_new, bool draft_max_of_row) {
  EngineOptions o;
  o.draft_model = draft;
  o.max_seqs = requests;
  o.state_cache_mb = 0;
  Engine engine(model, nullptr, o);
  Stepped out;
  out.results.resize(static_cast<size_t>(requests));
  std::vector<RequestId> ids;
  for (int i = 0; i < requests; ++i) {
    GenerateRequest r;
    r.prompt = test::random_tokens(12, model.config().vocab_size, 300 + static_cast<uint64_t>(i));
    r.max_new_tokens = max_new;
    r.sampling.temperature = 0.0f;
    r.ignore_eos = true;
    r.speculative.draft_model = true;
    r.speculative.draft_max = draft_max_of_row ? 1 + i : 0;  // different lengths: different histories of pauses
    const size_t at = static_cast<size_t>(i);
    r.on_event = [&out, at](const RequestEvent& e) {
      if (e.finished) out.results[at] = *e.result;
    };
    ids.push_back(engine.submit(std::move(r)));
  }
  int64_t drafted = 0;
  while (engine.step()) {
    ++out.steps;
    const int64_t now = engine.stats().draft_tokens;
    if (now > drafted) out.verify_steps.push_back(out.steps);
    drafted = now;
  }
  out.verify_forwards = engine.stats().verify_steps;
  return out;
}

// Zeroes the final norm's weight of an f32 checkpoint in place: every logit is then 0 and a greedy draft is always
// token 0 (the lowest id on ties), which the target refuses wherever its own token is another.
void zero_final_norm(const std::string& dir) {
  const std::string path = dir + "/model.safetensors";
  std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
  uint64_t header_len = 0;
  f.read(reinterpret_cast<char*>(&header_len), 8);
  std::string header(header_len, ' ');
  f.read(header.data(), static_cast<std::streamsize>(header_len));
  const auto info = nlohmann::json::parse(header).at("backbone.norm_f.weight");
  ASSERT_EQ(info.at("dtype").get<std::string>(), "F32");
  const auto begin = info.at("data_offsets")[0].get<int64_t>(), end = info.at("data_offsets")[1].get<int64_t>();
  f.seekp(static_cast<std::streamoff>(8 + header_len + static_cast<uint64_t>(begin)));
  const std::string zeros(static_cast<size_t>(end - begin), '\0');
  f.write(zeros.data(), static_cast<std::streamsize>(zeros.size()));
  ASSERT_TRUE(f.good()) << path;
}

class SpeculativeScheduleEngine : public ::testing::Test {
 protected:
  void SetUp() override {
    test::write_random_model(dir.path(), test::tiny_mamba2_config(), 11);
    test::write_random_model(draft_dir.path(), test::tiny_mamba2_config(), 12);
    zero_final_norm(draft_dir.path());  // drafts token 0 every time: refused but where the target says 0
    LoadOptions opt;
    opt.device = DeviceChoice::CPU;
    model = Model::load(dir.path(), opt);
    draft = Model::load(draft_dir.path(), opt);
  }
  test::TempDir dir{"mambacpp_spec_sched"}, draft_dir{"mambacpp_spec_sched_draft"};
  std::unique_ptr<Model> model, draft;
};

TEST_F(SpeculativeScheduleEngine, RefusedDraftsVerifyInFewStepsAtBatch1And8) {
  const int n = 300;
  for (const int batch : {1, 8}) {
    const Stepped s = step_batch(*model, draft.get(), batch, n, /*draft_max_of_row=*/true);
    int64_t drafted = 0, accepted = 0;
    for (const GenerateResult& r : s.results) {
      ASSERT_EQ(static_cast<int>(r.tokens.size()), n);
      drafted += r.draft_tokens, accepted += r.accepted_draft_tokens;
    }
    ASSERT_GT(drafted, 0);
    ASSERT_LT(10 * accepted, drafted) << "the draft model was meant to be refused";
    // The late steps: rows that keep being refused probe once in kMaxPauseSteps of their tokens, on the shared grid,
    // whatever their draft lengths did before (each row's own schedule would spread them over 8 times as many steps);
    // an accepted probe moves its row off the grid by its kept tokens and resets its pauses, which the slack allows.
    int64_t late = 0;
    for (int64_t v : s.verify_steps) late += v > 100;
    EXPECT_LE(late, (s.steps - 100) / kMaxPauseSteps + 3)
        << "batch " << batch << ": " << late << " of " << s.steps - 100 << " late steps verified";
    // Verify forwards: the rows' first verify (before any, drafts are expected to pay) and the next step's, which
    // feeds the tokens it kept; every later draft is a probe, refused by its decode step's own token.
    EXPECT_LE(s.verify_forwards, 2) << "batch " << batch;
    std::printf("[schedule] batch %d: %lld of %lld drafts accepted, %zu steps drafted (%lld after step 100), %lld "
                "verify forwards, %lld steps\n",
                batch, static_cast<long long>(accepted), static_cast<long long>(drafted), s.verify_steps.size(),
                static_cast<long long>(late), static_cast<long long>(s.verify_forwards), static_cast<long long>(s.steps));
    // Greedy: the plain tokens.
    for (int i = 0; i < batch; ++i) {
      GenerateRequest plain;
      plain.prompt = test::random_tokens(12, model->config().vocab_size, 300 + static_cast<uint64_t>(i));
      plain.max_new_tokens = n;
      plain.sampling.temperature = 0.0f;
      plain.ignore_eos = true;
      EXPECT_EQ(s.results[static_cast<size_t>(i)].tokens, test::run_alone(*model, plain).tokens) << "row " << i;
    }
  }
}

TEST_F(SpeculativeScheduleEngine, AcceptedDraftsKeepSpeculatingAtBatch1And8) {
  for (const int batch : {1, 8}) {
    const Stepped s = step_batch(*model, model.get(), batch, 120, /*draft_max_of_row=*/false);  // the model drafting for itself
    for (const GenerateResult& r : s.results) {
      EXPECT_EQ(r.accepted_draft_tokens, r.draft_tokens);
      EXPECT_GE(r.draft_tokens, 120 * 3 / 4) << "at length 4 every 5 tokens, 4 are drafts but the first";
    }
    EXPECT_GE(static_cast<int64_t>(s.verify_steps.size()), s.steps - 6) << "batch " << batch;
  }
}

}  // namespace
}  // namespace mambacpp
