// Nemotron-H latent MoE (moe_latent_size) against transformers: fixtures/moe/nemotron_h_moe_latent_f32, made by
// scripts/make_moe_fixtures.py (transformers' own NemotronHMoE with fc1/fc2_latent_proj, float64 logits). The generic
// checks of moe_fixtures_test.cpp (splits, batches, greedy, the other expert layout) run over it as over every MoE
// fixture; this test pins that the latent reference is there, is latent, and matches.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "mambacpp/model.h"
#include "mambacpp/npy.h"
#include "support/engine_support.h"
#include "support/test_support.h"

namespace mambacpp {
namespace {

namespace fs = std::filesystem;

TEST(MoeLatentFixture, MatchesTransformers) {
  const fs::path root = fs::path(test::fixture_dir()) / "moe";
  const std::string dir = (root / "nemotron_h_moe_latent_f32").string();
  ASSERT_TRUE(fs::exists(fs::path(dir) / "logits.npy"))
      << "run: python3 scripts/make_moe_fixtures.py --out fixtures/moe --only nemotron_h_moe_latent_f32";
  std::ifstream mf(root / "manifest.json");
  const nlohmann::json man = nlohmann::json::parse(mf);
  const nlohmann::json& entry = man["models"]["nemotron_h_moe_latent_f32"];
  bool fc1 = false, fc2_bias = false;
  for (const auto& n : entry["saved_tensor_names"]) {
    fc1 |= n.get<std::string>().find("fc1_latent_proj.weight") != std::string::npos;
    fc2_bias |= n.get<std::string>().find("fc2_latent_proj.bias") != std::string::npos;
  }
  EXPECT_TRUE(fc1 && fc2_bias) << "the fixture holds no latent projections";

  LoadOptions lo;
  lo.device = DeviceChoice::CPU;
  lo.threads = 2;
  for (const std::string d : {dir, (root / "nemotron_h_moe_latent_other_layout_f32").string()}) {
    SCOPED_TRACE(d);
    auto model = Model::load(d, lo);
    EXPECT_EQ(model->config().moe.latent_size, 16);
    const auto ids = test::read_token_ids(dir + "/tokens.txt");
    const NpyArray ref = read_npy(dir + "/logits.npy");
    const std::vector<float> want(ref.values.begin(), ref.values.end());
    auto st = model->create_state(1);
    const auto got = test::all_logits(*model, *st, ids);
    ASSERT_EQ(got.size(), want.size());
    const double err = test::max_rel_diff(got, want);
    std::printf("[moe] latent %s: max |logit - fp64 reference| / max |reference| = %.3g\n",
                fs::path(d).filename().c_str(), err);
    EXPECT_LE(err, 1e-4);
  }
}

}  // namespace
}  // namespace mambacpp
