// Falcon-H1 against transformers: fixtures/falcon_h1/*, made by scripts/make_falcon_h1_fixtures.py (CPU, float64
// from f32-stored weights, full passes). mambacpp computes in f32: the expected error is fp32 rounding through 3-4
// parallel layers, and the tolerance is the other hybrids' (1e-4 of the largest logit), far below what a modelling
// error moves (a multiplier left out or applied to the wrong slice, the gated norm's order or grouping, RoPE's
// pairing: 1e-2 and more; the script records each multiplier's effect in manifest.json).
// Self-consistency as for the other hybrids: any split into calls and a batch member against itself alone within
// 1e-5; the engine's batched, chunked and prefix-cache runs give transformers' greedy tokens.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <random>
#include <set>

#include <nlohmann/json.hpp>

#include "mambacpp/engine.h"
#include "mambacpp/model.h"
#include "mambacpp/npy.h"
#include "support/engine_support.h"
#include "support/test_support.h"

namespace mambacpp {
namespace {

namespace fs = std::filesystem;
constexpr double kFixtureTol = 1e-4;
constexpr double kSelfTol = 1e-5;

std::vector<std::string> falcon_dirs() {
  std::vector<std::string> dirs;
  const fs::path root = fs::path(test::fixture_dir()) / "falcon_h1";
  if (fs::exists(root))
    for (const auto& e : fs::directory_iterator(root))
      if (fs::exists(e.path() / "logits.npy")) dirs.push_back(e.path().string());
  std::sort(dirs.begin(), dirs.end());
  return dirs;
}

std::unique_ptr<Model> load_cpu(const std::string& dir, int64_t max_batch_tokens = 2048, int64_t page_tokens = 8,
                                int threads = 1) {
  LoadOptions lo;
  lo.device = DeviceChoice::CPU;
  lo.threads = threads;
  lo.max_batch_tokens = max_batch_tokens;
  lo.kv_page_tokens = page_tokens;
  return Model::load(dir, lo);
}

using test::all_logits;

// The three variants the script makes: no Mamba norm (untied), the norm before the gate (tied), the norm after it.
TEST(FalconH1Fixtures, AreTheThreeVariants) {
  const auto dirs = falcon_dirs();
  ASSERT_EQ(dirs.size(), 3u) << "expected 3 Falcon-H1 fixtures under " << test::fixture_dir()
                             << "/falcon_h1 (scripts/make_falcon_h1_fixtures.py)";
  std::set<std::tuple<bool, bool, bool>> forms;
  for (const auto& d : dirs) {
    const auto model = load_cpu(d);
    const ModelConfig& c = model->config();
    EXPECT_EQ(c.family, Family::FalconH1);
    EXPECT_NE(c.d_inner, 2 * c.d_model) << d;
    EXPECT_NE(c.ssm_multipliers, std::vector<double>(5, 1.0)) << d;
    forms.insert({c.mamba_rms_norm, c.mamba_rms_norm && c.mamba_norm_before_gate, c.tie_embeddings});
  }
  EXPECT_EQ(forms, (std::set<std::tuple<bool, bool, bool>>{{false, false, false}, {true, true, true}, {true, false, false}}));
}

TEST(FalconH1Fixtures, LogitsMatchTransformers) {
  for (const std::string& dir : falcon_dirs()) {
    SCOPED_TRACE(dir);
    auto model = load_cpu(dir, 2048, 8, /*threads=*/0);
    const auto ids = test::read_token_ids(dir + "/tokens.txt");
    const NpyArray ref = read_npy(dir + "/logits.npy");
    ASSERT_EQ(ref.shape, (std::vector<int64_t>{static_cast<int64_t>(ids.size()), model->config().vocab_size}));
    const std::vector<float> expected(ref.values.begin(), ref.values.end());
    auto st = model->create_state(1);
    const auto got = all_logits(*model, *st, ids);
    const double err = test::max_rel_diff(got, expected);
    std::printf("[falcon_h1] %s: max |logit - fp64 reference| / max |reference| = %.3g\n",
                fs::path(dir).filename().c_str(), err);
    EXPECT_LE(err, kFixtureTol);
    EXPECT_EQ(st->tokens_held(0), static_cast<int64_t>(ids.size()));
  }
}

TEST(FalconH1Fixtures, AnySplitEqualsOnePass) {
  for (const std::string& dir : falcon_dirs()) {
    SCOPED_TRACE(dir);
    for (auto [cap, page] : {std::pair<int64_t, int64_t>{2048, 64}, {7, 8}, {2048, 1}}) {
      auto model = load_cpu(dir, cap, page);
      const auto ids = test::read_token_ids(dir + "/tokens.txt");
      auto st = model->create_state(1);
      const auto one = all_logits(*model, *st, ids);
      std::mt19937_64 rng(5 + static_cast<uint64_t>(cap));
      for (int trial = 0; trial < 3; ++trial) {
        auto st2 = model->create_state(1);
        std::vector<float> got;
        for (size_t at = 0; at < ids.size();) {
          const size_t n = std::min(ids.size() - at, static_cast<size_t>(std::uniform_int_distribution<int>(1, 11)(rng)));
          const auto part = all_logits(*model, *st2, std::span<const int32_t>(ids).subspan(at, n));
          got.insert(got.end(), part.begin(), part.end());
          at += n;
        }
        EXPECT_LE(test::max_rel_diff(got, one), kSelfTol) << "cap " << cap << ", page " << page << ", trial " << trial;
      }
      auto st3 = model->create_state(1);
      std::vector<float> steps;
      for (size_t t = 0; t < ids.size(); ++t) {
        const auto row = all_logits(*model, *st3, std::span<const int32_t>(ids).subspan(t, 1));
        steps.insert(steps.end(), row.begin(), row.end());
      }
      EXPECT_LE(test::max_rel_diff(steps, one), kSelfTol) << "token by token, cap " << cap;
    }
  }
}

TEST(FalconH1Fixtures, BatchMemberEqualsItselfAlone) {
  for (const std::string& dir : falcon_dirs()) {
    SCOPED_TRACE(dir);
    auto model = load_cpu(dir, 16);
    const auto ids = test::read_token_ids(dir + "/tokens.txt");
    const std::vector<int32_t> a(ids.begin(), ids.begin() + 30), b(ids.begin() + 5, ids.begin() + 17),
        c(ids.rbegin(), ids.rbegin() + 23);
    auto st = model->create_state(4);
    all_logits(*model, *st, std::span<const int32_t>(ids).subspan(0, 9), 3);
    std::vector<Sequence> seqs = {Sequence::tokens(a, 2), Sequence::tokens(b, 0), Sequence::tokens(c, 3)};
    const ForwardResult r = model->forward(*st, seqs, Output::AllLogits);
    const int64_t V = model->config().vocab_size;
    int64_t row = 0;
    for (size_t i = 0; i < seqs.size(); ++i) {
      auto alone = model->create_state(1);
      if (i == 2) all_logits(*model, *alone, std::span<const int32_t>(ids).subspan(0, 9));
      const auto want = all_logits(*model, *alone, seqs[i].token_ids);
      const std::vector<float> got(r.values.begin() + row * V, r.values.begin() + (row + seqs[i].length()) * V);
      EXPECT_LE(test::max_rel_diff(got, want), kSelfTol) << "sequence " << i;
      row += seqs[i].length();
    }
  }
}

TEST(FalconH1Fixtures, GreedyMatchesTransformersThroughTheEngine) {
  for (const std::string& dir : falcon_dirs()) {
    SCOPED_TRACE(dir);
    auto model = load_cpu(dir);
    const auto [r, want] = test::greedy_fixture(dir);
    EXPECT_EQ(test::run_alone(*model, r).tokens, want) << "alone";
    std::vector<GenerateRequest> batch(3, r);
    batch[1].prompt.insert(batch[1].prompt.begin(), 7);
    batch[2].max_new_tokens = 5;
    EngineOptions eo;
    eo.max_seqs = 3;
    Engine engine(*model, nullptr, eo);
    EXPECT_EQ(engine.run(batch)[0].tokens, want) << "batched";
    auto again = engine.run({r});
    EXPECT_GT(again[0].cached_prompt_tokens, 0) << "expected a prefix-cache hit";
    EXPECT_EQ(again[0].tokens, want) << "prefix-cache hit";
    EngineOptions chunked;
    chunked.max_seqs = 3;
    chunked.batch_tokens = 3;
    chunked.state_checkpoint_interval = 4;
    Engine small(*model, nullptr, chunked);
    EXPECT_EQ(small.run(batch)[0].tokens, want) << "chunked prefill";
    GenerateRequest longer = r;
    longer.prompt.insert(longer.prompt.end(), want.begin(), want.begin() + 10);
    longer.max_new_tokens = r.max_new_tokens - 10;
    const auto cont = small.run({longer});
    EXPECT_GT(cont[0].cached_prompt_tokens, 0);
    EXPECT_EQ(cont[0].tokens, std::vector<int32_t>(want.begin() + 10, want.end())) << "continued from a checkpoint";
  }
}

TEST(FalconH1Fixtures, PrefixCacheHitEqualsMissInLogprobs) {
  for (const std::string& dir : falcon_dirs()) {
    SCOPED_TRACE(dir);
    auto model = load_cpu(dir);
    const auto ids = test::read_token_ids(dir + "/tokens.txt");
    GenerateRequest r;
    r.prompt.assign(ids.begin(), ids.begin() + 30);
    r.max_new_tokens = 6;
    r.sampling.temperature = 0.0f;
    r.ignore_eos = true;
    r.logprobs = 3;
    const GenerateResult miss = test::run_alone(*model, r);
    EngineOptions eo;
    eo.max_seqs = 1;
    Engine engine(*model, nullptr, eo);
    GenerateRequest shorter = r;
    shorter.prompt.resize(20);
    engine.run({shorter});
    const GenerateResult hit = engine.run({r})[0];
    EXPECT_GT(hit.cached_prompt_tokens, 0);
    ASSERT_EQ(hit.tokens, miss.tokens);
    for (size_t i = 0; i < hit.token_info.size(); ++i)
      EXPECT_NEAR(hit.token_info[i].logprob, miss.token_info[i].logprob, 1e-5) << "token " << i;
  }
}

TEST(FalconH1Fixtures, CliGenerateIsGreedyExact) {
  for (const std::string& dir : falcon_dirs()) {
    SCOPED_TRACE(dir);
    std::ifstream f(dir + "/greedy.json");
    const auto g = nlohmann::json::parse(f);
    test::TempDir tmp;
    std::ofstream(tmp.file("prompt.txt")) << g["prompt_ids"].dump().substr(1, g["prompt_ids"].dump().size() - 2);
    const test::CliResult r = test::run_cli("generate --model " + dir + " --tokens-file " + tmp.file("prompt.txt") +
                                            " -n " + std::to_string(g["max_new_tokens"].get<int>()) +
                                            " --temp 0 --ignore-eos --json --threads 1");
    ASSERT_EQ(r.exit_code, 0) << r.output();
    const auto out = nlohmann::json::parse(r.out);
    EXPECT_EQ(out["tokens"].get<std::vector<int32_t>>(), g["full_pass_ids"].get<std::vector<int32_t>>());
  }
}

}  // namespace
}  // namespace mambacpp
