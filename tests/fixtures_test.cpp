// Whole-model logits against golden fixtures made by HF transformers (scripts/make_fixtures.py; docs/fixtures.md
// says how to regenerate them). The references were computed in float64 from the stored weights; mambacpp computes
// in float32, so the expected difference is fp32 rounding accumulated through a few layers (measured 1.2e-7 to
// 5.1e-7 of the largest logit). The tolerance, 1e-5, leaves a 20x margin for that while any modelling error (a missing bias, the
// wrong norm grouping, a shifted conv state) moves logits by 1e-2 or more.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <random>

#include "mambacpp/model.h"
#include "support/test_support.h"
#include "mambacpp/npy.h"

namespace mambacpp {
namespace {

namespace fs = std::filesystem;
constexpr double kTol = 1e-5;

using test::fixture_model_dirs;
using test::read_token_ids;

std::vector<float> to_float(const NpyArray& a) { return {a.values.begin(), a.values.end()}; }

TEST(Fixtures, ArePresent) {
  // The fixture tests must not pass by finding nothing.
  EXPECT_GE(fixture_model_dirs().size(), 5u) << "expected the transformers fixtures under " << test::fixture_dir()
                                         << "/models (scripts/make_fixtures.py)";
}

TEST(Fixtures, LogitsMatchTransformers) {
  for (const std::string& dir : fixture_model_dirs()) {
    SCOPED_TRACE(dir);
    LoadOptions lo;
    lo.device = DeviceChoice::CPU;
    auto model = Model::load(dir, lo);
    auto ids = read_token_ids(dir + "/tokens.txt");
    NpyArray ref = read_npy(dir + "/logits.npy");
    ASSERT_EQ(ref.shape.size(), 2u);
    ASSERT_EQ(ref.shape[0], static_cast<int64_t>(ids.size()));
    ASSERT_EQ(ref.shape[1], model->config().vocab_size);
    auto expected = to_float(ref);

    auto st = model->create_state(1);
    Sequence s = Sequence::tokens(ids);
    ForwardResult r = model->forward(*st, {&s, 1}, Output::AllLogits);
    EXPECT_LE(test::max_rel_diff(r.values, expected), kTol) << "one pass";

    // The same through random chunks carrying the state.
    std::mt19937_64 rng(11);
    for (int trial = 0; trial < 3; ++trial) {
      auto st2 = model->create_state(1);
      std::vector<float> got;
      for (size_t at = 0; at < ids.size();) {
        size_t n = std::min(ids.size() - at, static_cast<size_t>(std::uniform_int_distribution<int>(1, 12)(rng)));
        Sequence c = Sequence::tokens(std::span<const int32_t>(ids).subspan(at, n));
        ForwardResult part = model->forward(*st2, {&c, 1}, Output::AllLogits);
        got.insert(got.end(), part.values.begin(), part.values.end());
        at += n;
      }
      EXPECT_LE(test::max_rel_diff(got, expected), kTol) << "chunked, trial " << trial;
    }
  }
}

TEST(Fixtures, EmbeddingsInputMatchesTransformers) {
  int checked = 0;
  for (const std::string& dir : fixture_model_dirs()) {
    if (!fs::exists(dir + "/inputs_embeds.npy")) continue;
    SCOPED_TRACE(dir);
    LoadOptions lo;
    lo.device = DeviceChoice::CPU;
    auto model = Model::load(dir, lo);
    NpyArray emb = read_npy(dir + "/inputs_embeds.npy");
    auto e = to_float(emb);
    auto expected = to_float(read_npy(dir + "/logits_embeds.npy"));
    auto st = model->create_state(1);
    ForwardResult r = model->forward(*st, TensorView(e.data(), DType::F32, {1, emb.shape[0], emb.shape[1]}), Output::AllLogits);
    EXPECT_LE(test::max_rel_diff(r.values, expected), kTol);
    ++checked;
  }
  EXPECT_GE(checked, 2) << "expected inputs_embeds fixtures for a Mamba-1 and a Mamba-2 model";
}

}  // namespace
}  // namespace mambacpp
