// The candidate path end to end on the CPU backend: Model::forward_top_k equals select_top_k's reference applied to
// forward's LastLogits rows (prefill pieces and decode steps), and generate gives the very same tokens with
// EngineOptions::device_sampling on and off, for greedy and every sampling stage, padded vocabularies (a
// tokenizer smaller than the logits), penalties, batches, and a batch where one request needs whole rows.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "support/engine_support.h"
#include "mambacpp/error.h"
#include "mambacpp/model.h"
#include "mambacpp/tokenizer.h"
#include "support/sampling_support.h"
#include "support/test_support.h"
#include "support/top_k_reference.h"

namespace mambacpp {
namespace {

using test::PaddedTokenizer;

// Every chain here penalises over the last 16 tokens.
SamplingParams chain(float temperature, int top_k, float top_p, float min_p, float penalty) {
  return test::sampling_chain(temperature, top_k, top_p, min_p, penalty, 16);
}

class DeviceSampling : public ::testing::Test {
 protected:
  void SetUp() override {
    test::write_random_model(dir.path(), test::tiny_mamba2_config(), 11);
    LoadOptions opt;
    opt.device = DeviceChoice::CPU;
    model = Model::load(dir.path(), opt);
  }
  test::TempDir dir{"mambacpp_devsample"};
  std::unique_ptr<Model> model;
};

TEST_F(DeviceSampling, ForwardTopKEqualsTheReferenceOnLastLogits) {
  const int64_t V = model->config().vocab_size;
  const std::vector<std::vector<int32_t>> prompts = {test::random_tokens(9, V, 1), test::random_tokens(1, V, 2),
                                                     test::random_tokens(30, V, 3)};
  std::vector<TopKRequest> reqs(3);
  reqs[0].k = 1;
  reqs[1].k = 10;
  reqs[1].limit = V - 7;
  reqs[1].repeat_penalty = 1.4f;
  reqs[1].penalized = {0, 5, 9, static_cast<int32_t>(V - 1)};
  reqs[2].k = kMaxTopK;  // above V: every logit, sorted
  reqs[2].repeat_penalty = 0.7f;
  reqs[2].penalized = {3, 4};
  for (bool decode : {false, true}) {
    // Pieces of 8 tokens: the prompts' last rows land in different pieces of the prefill.
    LoadOptions opt;
    opt.device = DeviceChoice::CPU;
    opt.max_batch_tokens = 8;
    auto m = Model::load(dir.path(), opt);
    auto s1 = m->create_state(3), s2 = m->create_state(3);
    std::vector<Sequence> seqs;
    for (size_t i = 0; i < prompts.size(); ++i) seqs.push_back(Sequence::tokens(prompts[i], static_cast<int64_t>(i)));
    std::vector<int32_t> next = {4, 40, 17};
    if (decode) {  // prefill both states alike, then compare one decode step
      m->forward(*s1, seqs, Output::None);
      m->forward(*s2, seqs, Output::None);
      for (size_t i = 0; i < seqs.size(); ++i)
        seqs[i] = Sequence::tokens(std::span<const int32_t>(&next[i], 1), static_cast<int64_t>(i));
    }
    const ForwardResult logits = m->forward(*s1, seqs, Output::LastLogits);
    const ForwardResult top = m->forward_top_k(*s2, seqs, reqs);
    ASSERT_EQ(top.candidates.size(), 3u);
    EXPECT_TRUE(top.values.empty());
    for (size_t i = 0; i < reqs.size(); ++i) {
      const std::span<const float> row = logits.row(static_cast<int64_t>(i));
      const TopKCandidates want = test::reference_top_k(std::vector<float>(row.begin(), row.end()), reqs[i]);
      EXPECT_EQ(top.candidates[i].ids, want.ids) << "sequence " << i << (decode ? " decode" : " prefill");
      EXPECT_EQ(top.candidates[i].logits, want.logits) << "sequence " << i;
      EXPECT_EQ(top.candidates[i].ids.size(), std::min<size_t>(reqs[i].k, reqs[i].limit ? reqs[i].limit : V));
    }
    // The state moved the same way: the next step's logits agree.
    const ForwardResult a = m->forward(*s1, seqs, Output::LastLogits), b = m->forward(*s2, seqs, Output::LastLogits);
    EXPECT_EQ(a.values, b.values);
  }
  // A bad request fails before anything runs.
  auto state = model->create_state(1);
  const std::vector<Sequence> one = {Sequence::tokens(prompts[0])};
  std::vector<TopKRequest> bad(1);
  bad[0].k = 0;
  EXPECT_NE(test::error_of([&] { model->forward_top_k(*state, one, bad); }).find("k must be in [1, 256]"),
            std::string::npos);
  EXPECT_NE(test::error_of([&] {
              model->forward_top_k(*state, one, {});
            }).find("expected one request per sequence (1), found 0"),
            std::string::npos);
}

TEST_F(DeviceSampling, GenerateGivesTheSameTokensOnBothPaths) {
  const int64_t V = model->config().vocab_size;  // 47
  const std::vector<SamplingParams> chains = {
      chain(0.0f, 40, 0.95f, 0.05f, 1.0f),  // greedy
      chain(0.0f, 40, 0.95f, 0.05f, 1.3f),  // greedy with a penalty
      chain(0.8f, 40, 0.95f, 0.05f, 1.0f),  // the defaults
      chain(1.5f, 12, 0.9f, 0.02f, 1.3f),   // every stage, penalised
      chain(2.0f, 256, 1.0f, 0.0f, 0.9f),   // k above the vocabulary; penalty < 1
      chain(1.0f, 3, 1.0f, 0.0f, 1.1f),     // top-k only
  };
  PaddedTokenizer padded(40);  // 7 padding rows that must never be sampled
  int differing_chains = 0;
  for (const SamplingParams& s : chains) {
    for (const Tokenizer* tok : {static_cast<const Tokenizer*>(nullptr), static_cast<const Tokenizer*>(&padded)}) {
      std::vector<GenerateRequest> reqs;
      for (int i = 0; i < 4; ++i) {
        GenerateRequest r;
        r.prompt = test::random_tokens(1 + 5 * i, 40, 70 + i);
        r.max_new_tokens = 24 - 3 * i;
        r.sampling = s;
        r.ignore_eos = true;
        reqs.push_back(r);
      }
      assign_batch_seeds(reqs, 500);
      std::vector<std::vector<int32_t>> got[2];
      for (int device = 0; device < 2; ++device) {
        EngineOptions opt;
        opt.device_sampling = device == 1;
        for (const GenerateResult& r : test::run_batch(*model, reqs, tok, opt)) got[device].push_back(r.tokens);
      }
      for (size_t i = 0; i < reqs.size(); ++i) {
        EXPECT_EQ(got[1][i], got[0][i]) << "request " << i << " T " << s.temperature << " top_k " << s.top_k
                                        << (tok ? " padded" : "");
        EXPECT_EQ(got[1][i].size(), static_cast<size_t>(reqs[i].max_new_tokens));
        if (tok)
          for (int32_t t : got[1][i]) EXPECT_LT(t, 40);
      }
      if (got[1][0] != got[1][1]) ++differing_chains;
    }
  }
  EXPECT_GE(differing_chains, 8) << "the requests' continuations hardly differ; the comparison shows little";
  (void)V;
}

TEST_F(DeviceSampling, OneRequestNeedingWholeRowsTakesTheBatchToWholeRows) {
  // top_k 0 cannot finish on candidates: the whole batch takes whole rows, with the same tokens as before.
  std::vector<GenerateRequest> reqs(2);
  reqs[0].prompt = {1, 2, 3};
  reqs[0].sampling = chain(0.9f, 0, 1.0f, 0.0f, 1.0f);
  reqs[1].prompt = {4};
  reqs[1].sampling = chain(0.0f, 40, 1.0f, 0.0f, 1.0f);
  for (GenerateRequest& r : reqs) r.max_new_tokens = 20, r.ignore_eos = true;
  assign_batch_seeds(reqs, 3);
  std::vector<std::vector<int32_t>> got[2];
  for (int device = 0; device < 2; ++device) {
    EngineOptions opt;
    opt.device_sampling = device == 1;
    for (const GenerateResult& r : test::run_batch(*model, reqs, nullptr, opt)) got[device].push_back(r.tokens);
  }
  EXPECT_EQ(got[1], got[0]);
}

}  // namespace
}  // namespace mambacpp
