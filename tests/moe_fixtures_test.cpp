// The mixture-of-experts hybrids (Nemotron-H MoE, Granite-4.0-H MoE, Jamba) against transformers and against
// themselves.
//
// References: fixtures/moe/*, made by scripts/make_moe_fixtures.py (transformers on the CPU, float64 from f32-stored
// weights; routers in f32 as transformers casts them). Tolerance as for the dense hybrids (1e-4 of the largest logit;
// a wrong routing rule, a missing scale or a swapped gate/up half moves logits by 1e-2 or more). The cases hold
// group-limited routing, an expert that no token may choose, top-k = number of experts and exact router ties; the
// `*_other_layout_f32` copies store the experts the other way (per-expert <-> fused 3-D tensors) and must give the
// same logits bit for bit.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iterator>
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

fs::path moe_root() { return fs::path(test::fixture_dir()) / "moe"; }

// Directories with their own reference (logits.npy), sorted.
std::vector<std::string> moe_dirs() {
  std::vector<std::string> dirs;
  if (fs::exists(moe_root()))
    for (const auto& e : fs::directory_iterator(moe_root()))
      if (fs::exists(e.path() / "logits.npy")) dirs.push_back(e.path().string());
  std::sort(dirs.begin(), dirs.end());
  return dirs;
}

nlohmann::json manifest() {
  std::ifstream f(moe_root() / "manifest.json");
  return nlohmann::json::parse(f);
}

std::unique_ptr<Model> load_cpu(const std::string& dir, int64_t max_batch_tokens = 2048, int threads = 1) {
  LoadOptions lo;
  lo.device = DeviceChoice::CPU;
  lo.threads = threads;
  lo.max_batch_tokens = max_batch_tokens;
  lo.kv_page_tokens = 8;
  return Model::load(dir, lo);
}

using test::all_logits;

std::string file_bytes(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) ADD_FAILURE() << "cannot read " << path;
  return {std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
}

std::vector<float> reference(const std::string& dir) {
  const NpyArray ref = read_npy(dir + "/logits.npy");
  return std::vector<float>(ref.values.begin(), ref.values.end());
}

TEST(MoeFixtures, CoverTheThreeFamiliesAndTheRoutingCases) {
  const auto dirs = moe_dirs();
  ASSERT_GE(dirs.size(), 3u) << "expected the fixtures of scripts/make_moe_fixtures.py under " << moe_root();
  std::set<Family> families;
  for (const auto& d : dirs) families.insert(load_cpu(d)->config().family);
  EXPECT_EQ(families, (std::set<Family>{Family::NemotronH, Family::GraniteHybrid, Family::Jamba}));
  // What the references exercise, from the routing the script recorded: an expert no token chose, top-k = the number
  // of experts (every expert gets every token), and exact router ties at the top-k boundary. At those ties torch.topk
  // (CPU) does not always keep the lower index (the manifest's torch_equals_lowest_index_rule is false there); the
  // routing mirrors torch's selection (moe_routing.h, torch_top_k), and LogitsMatchTransformers tells the two apart.
  bool idle_expert = false, every_expert = false;
  int64_t tie_layers = 0, ties_off_lowest_index = 0;
  const nlohmann::json man = manifest();  // a named object: the range-for must not iterate a destroyed temporary
  for (const auto& [name, m] : man["models"].items()) {
    if (!m.contains("routing")) continue;
    for (const auto& [layer, st] : m["routing"].items()) {
      ASSERT_TRUE(st.contains("tokens_per_expert")) << name << " " << layer << ": " << st.dump();
      bool all_tokens = true;
      for (const auto& n : st["tokens_per_expert"]) {
        idle_expert |= n.get<int64_t>() == 0;
        all_tokens &= n.get<int64_t>() == st["tokens"].get<int64_t>();
      }
      every_expert |= all_tokens;
      if (st["ties_at_boundary"].get<int64_t>() > 0) {
        ++tie_layers;
        ties_off_lowest_index += st.value("torch_equals_lowest_index_rule", true) ? 0 : 1;
      }
    }
  }
  EXPECT_TRUE(idle_expert) << "no fixture has an expert that received no token";
  EXPECT_TRUE(every_expert) << "no fixture routes every token to every expert (top-k = number of experts)";
  EXPECT_GT(tie_layers, 0) << "no fixture has router ties at the top-k boundary";
  std::printf("[moe] %lld layers with ties at the top-k boundary, %lld where torch kept a higher index\n",
              static_cast<long long>(tie_layers), static_cast<long long>(ties_off_lowest_index));
}

TEST(MoeFixtures, LogitsMatchTransformers) {
  for (const std::string& dir : moe_dirs()) {
    SCOPED_TRACE(dir);
    auto model = load_cpu(dir, 2048, /*threads=*/2);
    const auto ids = test::read_token_ids(dir + "/tokens.txt");
    const std::vector<float> expected = reference(dir);
    ASSERT_EQ(expected.size(), ids.size() * static_cast<size_t>(model->config().vocab_size));
    auto st = model->create_state(1);
    const auto got = all_logits(*model, *st, ids);
    const double err = test::max_rel_diff(got, expected);
    std::printf("[moe] %s: max |logit - fp64 reference| / max |reference| = %.3g\n", fs::path(dir).filename().c_str(),
                err);
    EXPECT_LE(err, kFixtureTol);
  }
}

TEST(MoeFixtures, TheOtherExpertLayoutGivesTheSameLogits) {
  int copies = 0;
  const nlohmann::json man = manifest();  // a named object: the range-for must not iterate a destroyed temporary
  for (const auto& [name, m] : man["models"].items()) {
    if (!m.contains("same_reference_as")) continue;
    SCOPED_TRACE(name);
    ++copies;
    const std::string base_name = m["same_reference_as"].get<std::string>();
    const std::string dir = (moe_root() / name).string(), base = (moe_root() / base_name).string();
    // The copy carries the base's reference files (the same model), with its experts' tensors stored the other way.
    for (const char* f : {"logits.npy", "tokens.txt", "greedy.json"})
      EXPECT_EQ(file_bytes(dir + "/" + f), file_bytes(base + "/" + f)) << f;
    ASSERT_TRUE(man["models"].contains(base_name));
    EXPECT_NE(m["saved_tensor_names"], man["models"][base_name]["saved_tensor_names"])
        << "the copy stores its experts as the base does (" << m["expert_layout"] << ")";
    const auto ids = test::read_token_ids(base + "/tokens.txt");
    auto a = load_cpu(dir);
    auto b = load_cpu(base);
    auto sa = a->create_state(1);
    auto sb = b->create_state(1);
    const auto got = all_logits(*a, *sa, ids);
    EXPECT_EQ(got, all_logits(*b, *sb, ids)) << m["expert_layout"];
    EXPECT_LE(test::max_rel_diff(got, reference(base)), kFixtureTol);
  }
  EXPECT_GE(copies, 1);
}

TEST(MoeFixtures, AnySplitEqualsOnePass) {
  for (const std::string& dir : moe_dirs()) {
    SCOPED_TRACE(dir);
    for (int64_t cap : {int64_t{2048}, int64_t{7}}) {
      auto model = load_cpu(dir, cap);
      const auto ids = test::read_token_ids(dir + "/tokens.txt");
      auto st = model->create_state(1);
      const auto one = all_logits(*model, *st, ids);
      std::mt19937_64 rng(9 + static_cast<uint64_t>(cap));
      auto st2 = model->create_state(1);
      std::vector<float> got;
      for (size_t at = 0; at < ids.size();) {
        const size_t n = std::min(ids.size() - at, static_cast<size_t>(std::uniform_int_distribution<int>(1, 11)(rng)));
        const auto part = all_logits(*model, *st2, std::span<const int32_t>(ids).subspan(at, n));
        got.insert(got.end(), part.begin(), part.end());
        at += n;
      }
      EXPECT_LE(test::max_rel_diff(got, one), kSelfTol) << "cap " << cap;
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

TEST(MoeFixtures, BatchMemberEqualsItselfAlone) {
  for (const std::string& dir : moe_dirs()) {
    SCOPED_TRACE(dir);
    auto model = load_cpu(dir, 16);
    const auto ids = test::read_token_ids(dir + "/tokens.txt");
    const std::vector<int32_t> a(ids.begin(), ids.begin() + 30), b(ids.begin() + 5, ids.begin() + 17),
        c(ids.rbegin(), ids.rbegin() + 23);
    auto st = model->create_state(3);
    std::vector<Sequence> seqs = {Sequence::tokens(a, 2), Sequence::tokens(b, 0), Sequence::tokens(c, 1)};
    const ForwardResult r = model->forward(*st, seqs, Output::AllLogits);
    const int64_t V = model->config().vocab_size;
    int64_t row = 0;
    for (size_t i = 0; i < seqs.size(); ++i) {
      auto alone = model->create_state(1);
      const auto want = all_logits(*model, *alone, seqs[i].token_ids);
      const std::vector<float> got(r.values.begin() + row * V, r.values.begin() + (row + seqs[i].length()) * V);
      EXPECT_LE(test::max_rel_diff(got, want), kSelfTol) << "sequence " << i;
      row += seqs[i].length();
    }
  }
}

TEST(MoeFixtures, GreedyMatchesTransformersThroughTheEngine) {
  for (const std::string& dir : moe_dirs()) {
    SCOPED_TRACE(dir);
    auto model = load_cpu(dir);
    const auto [r, want] = test::greedy_fixture(dir);
    EXPECT_EQ(test::run_alone(*model, r).tokens, want) << "alone";
    std::vector<GenerateRequest> batch(3, r);
    batch[1].prompt.insert(batch[1].prompt.begin(), 7);
    batch[2].max_new_tokens = 5;
    EngineOptions eo;
    eo.max_seqs = 3;
    eo.batch_tokens = 3;  // chunked prefill shared by the rows
    Engine engine(*model, nullptr, eo);
    EXPECT_EQ(engine.run(batch)[0].tokens, want) << "batched, chunked prefill";
    auto again = engine.run({r});
    EXPECT_GT(again[0].cached_prompt_tokens, 0) << "expected a prefix-cache hit";
    EXPECT_EQ(again[0].tokens, want) << "prefix-cache hit";
  }
}

}  // namespace
}  // namespace mambacpp
