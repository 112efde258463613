// Speculative decoding on the GPU (both precisions, CUDA graphs on): greedy output with prompt lookup or a draft model
// is the plain output, and a model drafting for itself has every draft accepted. A verify row is a short piece, which
// runs as the decode steps plain tokens come from (model/step_pieces.h), so the target's logits for a draft are those
// plain decoding computes, bit for bit.
#include <gtest/gtest.h>

#include "gpu/gpu_test_util.h"
#include "mambacpp/engine.h"
#include "mambacpp/model.h"
#include "mambacpp/precision.h"
#include "mambacpp/shapes.h"
#include "support/engine_support.h"
#include "support/test_support.h"

namespace mambacpp {
namespace {

std::unique_ptr<Model> gpu_model(const char* shape, Precision precision, int64_t n_layer = 0, uint64_t seed = 3) {
  LoadOptions lo;
  lo.device = DeviceChoice::CUDA;
  lo.precision = precision;
  ModelConfig c = named_shape(shape);
  if (n_layer > 0) c.n_layer = n_layer;
  return Model::random(c, lo, seed);
}

GenerateRequest greedy(std::vector<int32_t> prompt, int max_new) {
  GenerateRequest r;
  r.prompt = std::move(prompt);
  r.max_new_tokens = max_new;
  r.sampling.temperature = 0.0f;
  r.ignore_eos = true;
  return r;
}

// A prompt that repeats a phrase, so that prompt lookup finds continuations.
std::vector<int32_t> repetitive(uint64_t seed) {
  const std::vector<int32_t> phrase = test::random_tokens(9, 50000, seed);
  std::vector<int32_t> p;
  for (int i = 0; i < 5; ++i) p.insert(p.end(), phrase.begin(), phrase.end());
  return p;
}

class GpuSpeculative : public ::testing::TestWithParam<Precision> {};

TEST_P(GpuSpeculative, GreedyTokensEqualPlainDecoding) {
  MAMBACPP_REQUIRE_GPU();
  for (const char* shape : {"mamba2-130m", "mamba-130m"}) {
    SCOPED_TRACE(shape);
    auto model = gpu_model(shape, GetParam());
    auto draft = gpu_model(shape, GetParam(), 4, 4);  // a shallower model of the same vocabulary
    EngineOptions opt;
    opt.draft_model = draft.get();
    opt.state_cache_mb = 0;
    int64_t drafted = 0;
    for (uint64_t s = 0; s < 3; ++s) {
      const GenerateRequest plain = greedy(repetitive(s), 48);
      const std::vector<int32_t> want = test::run_alone(*model, plain).tokens;
      GenerateRequest ngram = plain, by_model = plain;
      ngram.speculative.draft_ngram = 2;
      by_model.speculative.draft_model = true;
      // Side by side in one engine, with a plain request beside them.
      const std::vector<GenerateResult> got = test::run_batch(*model, {ngram, by_model, plain}, nullptr, opt, 3);
      for (size_t i = 0; i < got.size(); ++i) EXPECT_EQ(got[i].tokens, want) << "prompt " << s << ", request " << i;
      for (const GenerateResult& r : got) drafted += r.draft_tokens;
    }
    // Random weights rarely continue the prompt's phrase or agree with a shallower copy: on an H100 the three prompts
    // drafted 36-37 tokens and none was accepted, so every verify here rolled back. Acceptance on the GPU is
    // ModelDraftingForItselfAcceptsItsDrafts' part.
    EXPECT_GT(drafted, 20);
  }
}

TEST_P(GpuSpeculative, ModelDraftingForItselfAcceptsItsDrafts) {
  MAMBACPP_REQUIRE_GPU();
  for (const char* shape : {"mamba2-130m", "mamba-130m"}) {
    SCOPED_TRACE(shape);
    auto model = gpu_model(shape, GetParam());
    EngineOptions opt;
    opt.draft_model = model.get();
    // A prompt of 15 tokens: the target takes it as a short piece (decode steps) and the draft's first catch-up
    // (prompt + the target's first token, 16) too, so both states see the same arithmetic at every position. A longer
    // prompt would be one prefill piece for the target and prompt + 1 tokens for the draft: two splits of the same
    // tokens, which fast precision does not yet round alike (issue 54's chunk grid).
    GenerateRequest r = greedy(test::random_tokens(15, 50000, 9), 64);
    const std::vector<int32_t> want = test::run_alone(*model, r).tokens;
    r.speculative.draft_model = true;
    r.speculative.draft_max = 6;
    const GenerateResult got = test::run_alone(*model, r, nullptr, opt);
    EXPECT_EQ(got.tokens, want);
    EXPECT_GT(got.draft_tokens, 40);
    EXPECT_EQ(got.accepted_draft_tokens, got.draft_tokens);  // every one: the verify computes what the draft did
  }
}

INSTANTIATE_TEST_SUITE_P(Precision, GpuSpeculative, ::testing::Values(Precision::Fast, Precision::Exact),
                         [](const ::testing::TestParamInfo<Precision>& i) { return std::string(precision_name(i.param)); });

}  // namespace
}  // namespace mambacpp
