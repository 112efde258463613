// The hybrid families (Nemotron-H, Granite-4.0-H dense, Bamba) against transformers and against themselves.
//
// References: fixtures/hybrid/*, made by scripts/make_hybrid_fixtures.py (transformers 5.17, CPU, float64 from
// f32-stored weights). mambacpp computes in f32, so the expected error is fp32 rounding through 5-6 layers: the
// tolerance 1e-4 of the largest logit (the bound) is ~100x what is measured, while modelling errors (the
// gated norm's grouping, a missing multiplier, RoPE on the wrong channels, a GQA head mapping off by one) move
// logits by 1e-2 or more.
// Self-consistency: any split of a sequence into calls (KV pages and SSM state carried) equals one pass within
// 1e-5, as does a batch member against itself alone; snapshots, copies and state files reproduce a slot exactly.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <set>
#include <sstream>

#include <nlohmann/json.hpp>

#include "backend/backend.h"
#include "mambacpp/block.h"
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

std::vector<std::string> hybrid_dirs() {
  std::vector<std::string> dirs;
  const fs::path root = fs::path(test::fixture_dir()) / "hybrid";
  if (fs::exists(root))
    for (const auto& e : fs::directory_iterator(root))
      if (fs::exists(e.path() / "logits.npy")) dirs.push_back(e.path().string());
  std::sort(dirs.begin(), dirs.end());
  return dirs;
}

// Pages of 8 KV rows by default here, so that the 45-token fixtures cross page boundaries inside calls. One thread:
// these models are tiny, and the machine's cores are shared (LogitsMatchTransformers runs with all of them).
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

TEST(HybridFixtures, AreThreeFamilies) {
  const auto dirs = hybrid_dirs();
  ASSERT_EQ(dirs.size(), 3u) << "expected bamba, granite_h and nemotron_h fixtures under " << test::fixture_dir()
                             << "/hybrid (scripts/make_hybrid_fixtures.py)";
  std::set<Family> families;
  for (const auto& d : dirs) families.insert(load_cpu(d)->config().family);
  EXPECT_EQ(families, (std::set<Family>{Family::NemotronH, Family::GraniteHybrid, Family::Bamba}));
}

TEST(HybridFixtures, LogitsMatchTransformers) {
  for (const std::string& dir : hybrid_dirs()) {
    SCOPED_TRACE(dir);
    auto model = load_cpu(dir, 2048, 8, /*threads=*/0);
    const auto ids = test::read_token_ids(dir + "/tokens.txt");
    const NpyArray ref = read_npy(dir + "/logits.npy");
    ASSERT_EQ(ref.shape, (std::vector<int64_t>{static_cast<int64_t>(ids.size()), model->config().vocab_size}));
    const std::vector<float> expected(ref.values.begin(), ref.values.end());
    auto st = model->create_state(1);
    const auto got = all_logits(*model, *st, ids);
    const double err = test::max_rel_diff(got, expected);
    std::printf("[hybrid] %s: max |logit - fp64 reference| / max |reference| = %.3g\n",
                fs::path(dir).filename().c_str(), err);
    EXPECT_LE(err, kFixtureTol);
    EXPECT_EQ(st->tokens_held(0), model->config().has_attention() ? static_cast<int64_t>(ids.size()) : 0);
  }
}

TEST(HybridFixtures, AnySplitEqualsOnePass) {
  for (const std::string& dir : hybrid_dirs()) {
    SCOPED_TRACE(dir);
    // Pieces of 7 tokens inside one call as well: prefill split by max_batch_tokens must not matter either.
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
      // Token by token (decode steps).
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

TEST(HybridFixtures, BatchMemberEqualsItselfAlone) {
  for (const std::string& dir : hybrid_dirs())
  for (DType sd : {DType::F32, DType::BF16}) {  // a bf16 state (its KV rows too) is as batch-invariant
    SCOPED_TRACE(dir + " state " + dtype_name(sd));
    // f32: several pieces, sequences split across them. A bf16 state is rounded where a piece ends, so a sequence
    // cut elsewhere in the batch than alone differs by that rounding (~1e-3): there, one piece holds the batch.
    auto model = load_cpu(dir, sd == DType::F32 ? 16 : 2048);
    const auto ids = test::read_token_ids(dir + "/tokens.txt");
    const std::vector<int32_t> a(ids.begin(), ids.begin() + 30), b(ids.begin() + 5, ids.begin() + 17),
        c(ids.rbegin(), ids.rbegin() + 23);
    auto st = model->create_state(4, sd);
    // Slot 3 first holds another sequence's tokens (different KV lengths per slot).
    all_logits(*model, *st, std::span<const int32_t>(ids).subspan(0, 9), 3);
    std::vector<Sequence> seqs = {Sequence::tokens(a, 2), Sequence::tokens(b, 0), Sequence::tokens(c, 3)};
    const ForwardResult r = model->forward(*st, seqs, Output::AllLogits);
    const int64_t V = model->config().vocab_size;
    int64_t row = 0;
    for (size_t i = 0; i < seqs.size(); ++i) {
      auto alone = model->create_state(1, sd);
      if (i == 2) all_logits(*model, *alone, std::span<const int32_t>(ids).subspan(0, 9));
      const auto want = all_logits(*model, *alone, seqs[i].token_ids);
      const std::vector<float> got(r.values.begin() + row * V, r.values.begin() + (row + seqs[i].length()) * V);
      EXPECT_LE(test::max_rel_diff(got, want), kSelfTol) << "sequence " << i;
      row += seqs[i].length();
    }
  }
}

TEST(HybridFixtures, GreedyMatchesTransformersThroughTheEngine) {
  for (const std::string& dir : hybrid_dirs()) {
    SCOPED_TRACE(dir);
    auto model = load_cpu(dir);
    const auto [r, want] = test::greedy_fixture(dir);
    EXPECT_EQ(test::run_alone(*model, r).tokens, want) << "alone";
    // Batched with other requests, and again with the prefix cache warm (the same prompt: a hit).
    std::vector<GenerateRequest> batch(3, r);
    batch[1].prompt.insert(batch[1].prompt.begin(), 7);
    batch[2].max_new_tokens = 5;
    EngineOptions eo;
    eo.max_seqs = 3;
    Engine engine(*model, nullptr, eo);
    auto first = engine.run(batch);
    EXPECT_EQ(first[0].tokens, want) << "batched";
    auto again = engine.run({r});
    EXPECT_GT(again[0].cached_prompt_tokens, 0) << "expected a prefix-cache hit";
    EXPECT_EQ(again[0].tokens, want) << "prefix-cache hit";
    // Chunked prefill (steps of 3 tokens shared by the rows) with mid-prompt state checkpoints every 4 positions.
    EngineOptions chunked;
    chunked.max_seqs = 3;
    chunked.batch_tokens = 3;
    chunked.state_checkpoint_interval = 4;
    Engine small(*model, nullptr, chunked);
    EXPECT_EQ(small.run(batch)[0].tokens, want) << "chunked prefill";
    GenerateRequest longer = r;
    longer.prompt.insert(longer.prompt.end(), want.begin(), want.begin() + 10);
    longer.max_new_tokens = r.max_new_tokens - 10;
    const auto cont = small.run({longer});  // starts from a checkpoint inside the first request's history
    EXPECT_GT(cont[0].cached_prompt_tokens, 0);
    EXPECT_EQ(cont[0].tokens, std::vector<int32_t>(want.begin() + 10, want.end())) << "continued from a checkpoint";
  }
}

TEST(HybridModel, CtxSizeLimitsTheTokensHeld) {
  LoadOptions lo;
  lo.device = DeviceChoice::CPU;
  lo.threads = 1;
  lo.ctx_size = 20;
  auto model = Model::load(hybrid_dirs()[0], lo);
  auto st = model->create_state(1);
  const std::vector<int32_t> ids(12, 4);
  all_logits(*model, *st, ids);
  Sequence s = Sequence::tokens(ids);
  const std::string err = test::error_of([&] { model->forward(*st, {&s, 1}, Output::None); });
  EXPECT_NE(err.find("12 tokens held + 12 new exceed the context limit of 20 positions (ctx_size)"), std::string::npos)
      << err;
  EXPECT_EQ(st->tokens_held(0), 12) << "the refused call changed nothing";
  EXPECT_EQ(all_logits(*model, *st, std::span<const int32_t>(ids).subspan(0, 8)).size(),
            8 * static_cast<size_t>(model->config().vocab_size));
}

TEST(HybridModel, RandomWeightsOfEveryFamilyRunAndAreSplitInvariant) {
  for (const std::string& dir : hybrid_dirs()) {
    SCOPED_TRACE(dir);
    std::ifstream f(dir + "/config.json");
    std::stringstream ss;
    ss << f.rdbuf();
    const ModelConfig c = parse_model_config(ss.str());
    LoadOptions lo;
    lo.threads = 1;
    lo.kv_page_tokens = 5;
    auto model = Model::random(c, lo, 3, DType::BF16);
    EXPECT_EQ(model->device(), Device::CPU);
    std::vector<int32_t> ids(40);
    for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<int32_t>((i * 37 + 11) % c.vocab_size);
    auto st = model->create_state(1);
    const auto one = all_logits(*model, *st, ids);
    for (float v : one) ASSERT_TRUE(std::isfinite(v));
    auto st2 = model->create_state(1);
    auto got = all_logits(*model, *st2, std::span<const int32_t>(ids).subspan(0, 13));
    const auto rest = all_logits(*model, *st2, std::span<const int32_t>(ids).subspan(13));
    got.insert(got.end(), rest.begin(), rest.end());
    EXPECT_LE(test::max_rel_diff(got, one), kSelfTol);
    EXPECT_GT(model->weight_bytes(), 0);
    EXPECT_EQ(model->weight_dtype(), DType::BF16);
  }
}

TEST(HybridModel, MambaBlockRefusesHybrids) {
  auto model = load_cpu(hybrid_dirs()[0]);
  EXPECT_NE(test::error_of([&] { MambaBlock b(*model, 0); }).find("hybrid"), std::string::npos);
}

TEST(HybridFixtures, CliGenerateIsGreedyExact) {
  for (const std::string& dir : hybrid_dirs()) {
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

TEST(HybridFixtures, PrefixCacheHitEqualsMissInLogprobs) {
  for (const std::string& dir : hybrid_dirs()) {
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
    engine.run({shorter});  // caches states of a 20-token prefix
    const GenerateResult hit = engine.run({r})[0];
    EXPECT_GT(hit.cached_prompt_tokens, 0);
    ASSERT_EQ(hit.tokens, miss.tokens);
    for (size_t i = 0; i < hit.token_info.size(); ++i)
      EXPECT_NEAR(hit.token_info[i].logprob, miss.token_info[i].logprob, 1e-5) << "token " << i;
  }
}

TEST(HybridState, SnapshotCopySaveLoadReproduceASlot) {
  for (const std::string& dir : hybrid_dirs())
  for (DType sd : {DType::F32, DType::BF16}) {
    SCOPED_TRACE(dir + " state " + dtype_name(sd));
    auto model = load_cpu(dir, 2048, 16);
    const auto fixture_ids = test::read_token_ids(dir + "/tokens.txt");
    std::vector<int32_t> ids;
    while (ids.size() < 100) ids.insert(ids.end(), fixture_ids.begin(), fixture_ids.end());
    ids.resize(100);
    const std::span<const int32_t> head = std::span<const int32_t>(ids).subspan(0, 70);  // 4 pages and a part
    const std::span<const int32_t> tail = std::span<const int32_t>(ids).subspan(head.size());
    auto st = model->create_state(3, sd);
    all_logits(*model, *st, head, 0);
    const SlotSnapshot snap = st->snapshot(0);
    EXPECT_EQ(snap.bytes(), st->slot_bytes() + head.size() * st->kv_bytes_per_token());
    test::TempDir tmp;
    st->save(0, tmp.file("s.state"), std::vector<int32_t>(head.begin(), head.end()));
    const auto want = all_logits(*model, *st, tail, 0);  // slot 0 moves on

    st->copy(0, 1);  // a copy of the advanced slot, then restored back to the prefix
    st->restore(1, snap);
    EXPECT_EQ(st->tokens_held(1), static_cast<int64_t>(head.size()));
    EXPECT_LE(test::max_rel_diff(all_logits(*model, *st, tail, 1), want), 0.0) << "restore";

    auto other = model->create_state(2, sd);
    all_logits(*model, *other, ids, 1);  // a longer history to be replaced
    EXPECT_EQ(other->load(1, tmp.file("s.state")), std::vector<int32_t>(head.begin(), head.end()));
    EXPECT_LE(test::max_rel_diff(all_logits(*model, *other, tail, 1), want), 0.0) << "state file";

    st->restore(2, snap);
    st->copy(2, 0);
    EXPECT_LE(test::max_rel_diff(all_logits(*model, *st, tail, 0), want), 0.0) << "copy";

    st->reset(0);
    EXPECT_EQ(st->tokens_held(0), 0);
    auto fresh = model->create_state(1, sd);
    EXPECT_LE(test::max_rel_diff(all_logits(*model, *st, tail, 0), all_logits(*model, *fresh, tail)), 0.0) << "reset";
  }
}

TEST(HybridState, StateFileOfAnotherShapeIsRefused) {
  const auto dirs = hybrid_dirs();
  ASSERT_FALSE(dirs.empty());
  auto a = load_cpu(dirs[0]);
  auto b = load_cpu(dirs[1]);
  test::TempDir tmp;
  auto st = a->create_state(1);
  const std::vector<int32_t> ids = {1, 2, 3};
  all_logits(*a, *st, ids);
  st->save(0, tmp.file("a.state"));
  auto other = b->create_state(1);
  EXPECT_NE(test::error_of([&] { other->load(0, tmp.file("a.state")); }).find("written by another model"),
            std::string::npos);
  // Truncated KV rows.
  const auto size = fs::file_size(tmp.file("a.state"));
  fs::resize_file(tmp.file("a.state"), size - 8);
  EXPECT_NE(test::error_of([&] { st->load(0, tmp.file("a.state")); }).find("truncated"), std::string::npos);
}

// A bf16 state holds the KV rows in bf16 too: half the bytes per token, every cached value a bf16 one, and logits
// within the bf16 error of the f32 state's. Error model: each cached key, value and SSM state entry is rounded once
// per write (2^-9 relative); through 5-6 layers of these tiny models that moves logits by well under 1e-2 of the
// largest, while a KV row read as the wrong type (f32 bits as bf16 pairs) or a lost rounding moves them by O(1) or
// not at all.
TEST(HybridState, Bf16StateHoldsBf16KvRows) {
  for (const std::string& dir : hybrid_dirs()) {
    SCOPED_TRACE(dir);
    auto model = load_cpu(dir);
    const auto ids = test::read_token_ids(dir + "/tokens.txt");
    auto f32 = model->create_state(1);
    auto bf = model->create_state(1, DType::BF16);
    EXPECT_EQ(2 * bf->kv_bytes_per_token(), f32->kv_bytes_per_token());
    const auto want = all_logits(*model, *f32, ids);
    const auto got = all_logits(*model, *bf, ids);
    const double err = test::max_rel_diff(got, want);
    std::printf("[hybrid] %s: bf16 state vs f32 state, max |logit diff| / max |logit| = %.3g\n",
                fs::path(dir).filename().c_str(), err);
    EXPECT_LE(err, 1e-2);
    EXPECT_GT(err, 0.0);
    const std::vector<float> held = bf->read_slot(0);
    EXPECT_EQ(held.size(), f32->read_slot(0).size());
    for (float v : held) ASSERT_EQ(bf16_to_f32(f32_to_bf16(v)), v);
  }
}

// Version 3 state files held KV rows in f32 whatever the state dtype. A version-3 bf16 file (made here from a
// version-4 one by widening its KV rows) still loads, its rows rounded back to bf16: the same slot exactly.
TEST(HybridState, Version3Bf16FileLoadsWithItsKvRowsRounded) {
  auto model = load_cpu(hybrid_dirs()[0]);
  const auto ids = test::read_token_ids(hybrid_dirs()[0] + "/tokens.txt");
  auto st = model->create_state(1, DType::BF16);
  all_logits(*model, *st, ids);
  test::TempDir tmp;
  st->save(0, tmp.file("v4.state"), ids);
  std::ifstream in(tmp.file("v4.state"), std::ios::binary);
  const std::string v4((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const int64_t n = st->tokens_held(0);
  const size_t data_bytes = st->slot_bytes() + static_cast<size_t>(n) * st->kv_bytes_per_token();
  ASSERT_GT(v4.size(), data_bytes);
  std::string v3 = v4.substr(0, v4.size() - data_bytes);
  const uint32_t three = 3;
  v3.replace(16, 4, reinterpret_cast<const char*>(&three), 4);
  const char* at = v4.data() + (v4.size() - data_bytes);
  int kv_layers = 0;
  for (const LayerCache& l : st->layers()) {
    for (const TensorView* t : {&l.conv, &l.ssm}) {
      if (l.kind != LayerCacheKind::Ssm) continue;
      const size_t nb = t->nbytes() / static_cast<size_t>(t->dim(0));  // one slot
      v3.append(at, nb);
      at += nb;
    }
    if (l.kind != LayerCacheKind::Kv) continue;
    ++kv_layers;
    for (int64_t i = 0; i < 2 * n * l.kv_dim; ++i, at += 2) {
      uint16_t h;
      std::memcpy(&h, at, 2);
      const float f = bf16_to_f32(h);
      v3.append(reinterpret_cast<const char*>(&f), 4);
    }
  }
  ASSERT_GT(kv_layers, 0);
  ASSERT_EQ(at, v4.data() + v4.size());
  std::ofstream(tmp.file("v3.state"), std::ios::binary).write(v3.data(), static_cast<std::streamsize>(v3.size()));
  auto other = model->create_state(1, DType::BF16);
  EXPECT_EQ(other->load(0, tmp.file("v3.state")), ids);
  EXPECT_EQ(other->read_slot(0), st->read_slot(0));
  // A state file of the other dtype is refused, naming both.
  auto f32 = model->create_state(1);
  const std::string err = test::error_of([&] { f32->load(0, tmp.file("v4.state")); });
  EXPECT_NE(err.find("holds bf16 state; this state cache is f32"), std::string::npos) << err;
}

TEST(HybridState, KvMemoryFollowsTheTokensHeld) {
  auto model = load_cpu(hybrid_dirs()[0], 2048, 64);
  auto st = model->create_state(2);
  const size_t fixed = st->snapshot(0).bytes();
  std::vector<int32_t> ids(130, 3);
  all_logits(*model, *st, ids, 1);
  EXPECT_EQ(st->tokens_held(1), 130);
  EXPECT_EQ(st->tokens_held(0), 0);
  EXPECT_EQ(st->snapshot(0).bytes(), fixed);
  EXPECT_EQ(st->snapshot(1).bytes(), fixed + 130 * st->kv_bytes_per_token());
  EXPECT_GT(st->kv_bytes_per_token(), 0u);
  EXPECT_EQ(st->kv_page_tokens(), 64);
}

// Hybrid models run on the GPU too (tests/gpu/hybrid_gpu_test.cpp): auto picks it where one is usable, and an
// explicit --device cuda without one fails naming the missing GPU, never a missing op.
TEST(HybridModel, DeviceChoiceFollowsTheGpu) {
  LoadOptions autod;
  EXPECT_EQ(Model::load(hybrid_dirs()[0], autod)->device(), cuda_available() ? Device::CUDA : Device::CPU);
  if (cuda_available()) return;
  LoadOptions lo;
  lo.device = DeviceChoice::CUDA;
  const std::string err = test::error_of([&] { Model::load(hybrid_dirs()[0], lo); });
  EXPECT_TRUE(err.find("--device cuda: no usable CUDA GPU") != std::string::npos ||
              err.find("--device cuda: this mambacpp was built without CUDA") != std::string::npos)
      << err;
}

TEST(HybridModel, BambaContextLimitIsEnforced) {
  for (const std::string& dir : hybrid_dirs()) {
    auto model = load_cpu(dir);
    if (model->config().family != Family::Bamba) continue;
    ASSERT_GT(model->config().max_position, 0);
    auto st = model->create_state(1);
    std::vector<int32_t> ids(static_cast<size_t>(model->config().max_position) + 1, 1);
    Sequence s = Sequence::tokens(ids);
    const std::string err = test::error_of([&] { model->forward(*st, {&s, 1}, Output::None); });
    EXPECT_NE(err.find("context limit"), std::string::npos) << err;
    EXPECT_EQ(st->tokens_held(0), 0) << "nothing ran";
    return;
  }
  FAIL() << "no Bamba fixture";
}

}  // namespace
}  // namespace mambacpp
