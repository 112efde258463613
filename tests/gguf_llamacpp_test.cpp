// What llama.cpp itself does with the files mambacpp writes, recorded by scripts/llamacpp_bench/
// make_llamacpp_fixtures.sh (node-llama-cpp 3.21.1's prebuilt llama.cpp) into fixtures/gguf_llamacpp/, checked here
// without node or network:
// - llama.cpp's log-probabilities on the F32 GGUF our writer makes of a checkpoint fixture equal ours on the same
//   file (llama.cpp with an f32 KV cache and no flash attention; measured differences <= 7e-6), Falcon-H1's folded
//   multipliers included (falcon_h1_norm_after_gate_mlp_bias: make_falcon_h1_variant.py), and the expert families
//   (granitehybrid with experts, jamba, nemotron_h_moe: make_nemotron_h_moe_variant.py);
// - llama.cpp's quantizer (llama_model_quantize, no importance matrix) turns the F32 GGUF of models/default into
//   files whose every tensor has the type and the bytes `mambacpp quantize` gives it.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "io/checkpoint.h"
#include "io/gguf_export.h"
#include "io/gguf_file.h"
#include "mambacpp/gguf.h"
#include "mambacpp/model.h"
#include "support/test_support.h"

namespace mambacpp {
namespace {

namespace fs = std::filesystem;

fs::path fixtures() { return fs::path(test::fixture_dir()) / "gguf_llamacpp"; }

nlohmann::json read_json(const fs::path& p) {
  std::ifstream in(p);
  if (!in) throw std::runtime_error("cannot open " + p.string());
  return nlohmann::json::parse(in);
}

fs::path scratch(const std::string& name) {
  const fs::path d = fs::temp_directory_path() / ("mambacpp_gguf_llamacpp_test_" + name);
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

class GgufLlamaCppLogprobs : public ::testing::TestWithParam<std::string> {};

TEST_P(GgufLlamaCppLogprobs, OursOnTheSameFileEqualLlamaCpps) {
  const nlohmann::json rec = read_json(fixtures() / (GetParam() + ".llamacpp.json"));
  const fs::path src = fs::path(test::source_dir()) / rec.at("fixture").get<std::string>();
  const fs::path file = scratch(GetParam()) / "m.gguf";
  {
    Checkpoint ck(src.string());
    GgufWriter w;
    gguf_add_model(w, ck.config(), gguf_source_of(ck), GgufTarget::F32);
    w.write(file.string());
  }
  LoadOptions lo;
  lo.device = DeviceChoice::CPU;
  lo.threads = 2;
  const auto model = Model::load(file.string(), lo);
  const std::vector<int32_t> ids = rec.at("tokens").get<std::vector<int32_t>>();
  auto st = model->create_state(1);
  Sequence s = Sequence::tokens(ids);
  const std::vector<float> logits = model->forward(*st, {&s, 1}, Output::AllLogits).values;
  const int64_t V = model->config().vocab_size;
  const nlohmann::json& lp = rec.at("logprobs");
  ASSERT_EQ(lp.size(), ids.size());
  double worst = 0;
  int argmax_checked = 0;
  for (size_t t = 0; t < ids.size(); ++t) {
    const float* row = logits.data() + t * static_cast<size_t>(V);
    double m = row[0];
    for (int64_t v = 1; v < V; ++v) m = std::max<double>(m, row[v]);
    double sum = 0;
    for (int64_t v = 0; v < V; ++v) sum += std::exp(row[v] - m);
    const double lse = m + std::log(sum);
    std::string their_top;
    double their_best = -1e30;
    for (const auto& [tok, value] : lp[t].items()) {
      const double ours = row[std::stoll(tok)] - lse, theirs = value.get<double>();
      worst = std::max(worst, std::abs(ours - theirs));
      if (theirs > their_best) their_best = theirs, their_top = tok;
    }
    std::vector<float> sorted(row, row + V);
    std::partial_sort(sorted.begin(), sorted.begin() + 2, sorted.end(), std::greater<>());
    if (sorted[0] - sorted[1] > 1e-3f) {
      ++argmax_checked;
      EXPECT_EQ(std::max_element(row, row + V) - row, std::stoll(their_top)) << "position " << t;
    }
  }
  EXPECT_LE(worst, 5e-5) << "max |log p difference| against llama.cpp";
  EXPECT_GT(argmax_checked, static_cast<int>(ids.size()) / 2);
}

INSTANTIATE_TEST_SUITE_P(Fixtures, GgufLlamaCppLogprobs,
                         ::testing::Values("mamba1_bf16_tied", "mamba2_bf16_sharded", "nemotron_h_f32", "falcon_h1_f32",
                                           "falcon_h1_norm_after_gate_mlp_bias", "falcon_h1_tied",
                                           // The expert families: Granite-4.0-H MoE (ffn_*_exps beside ffn_*_shexp),
                                           // Jamba (experts every other layer), Nemotron-H MoE with grouped sigmoid
                                           // routing, normalised and scaled weights
                                           // (make_nemotron_h_moe_variant.py).
                                           "granite_moe_all_f32", "jamba_f32", "nemotron_h_moe_grouped"));

uint64_t fnv1a64(const uint8_t* p, uint64_t n) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (uint64_t i = 0; i < n; ++i) h = (h ^ p[i]) * 0x100000001b3ull;
  return h;
}

class GgufLlamaCppQuantizer : public ::testing::TestWithParam<std::pair<std::string, std::string>> {};

TEST_P(GgufLlamaCppQuantizer, OurQuantizeGivesItsTypesAndBytes) {
  const auto& [ours_type, theirs] = GetParam();
  const nlohmann::json rec = read_json(fixtures() / ("default_" + theirs + ".tensors.json")).at("tensors");
  const fs::path file = scratch(ours_type) / "q.gguf";
  quantize_to_gguf((fs::path(test::source_dir()) / "models" / "default").string(), ours_type, file.string());
  const GgufFile f(file.string());
  ASSERT_EQ(f.tensors().size(), rec.size());
  int same = 0;
  for (const GgufTensor& t : f.tensors()) {
    ASSERT_TRUE(rec.contains(t.name)) << t.name << " is not in llama.cpp's file";
    const nlohmann::json& r = rec[t.name];
    EXPECT_EQ(gguf_ggml_type_name(ggml_type_of(t.format)), r.at("type").get<std::string>()) << t.name;
    char hex[17];
    std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(fnv1a64(t.data, t.nbytes)));
    EXPECT_EQ(std::string(hex), r.at("fnv1a64").get<std::string>()) << t.name << ": bytes differ from llama.cpp's";
    same += std::string(hex) == r.at("fnv1a64").get<std::string>();
  }
  EXPECT_EQ(same, static_cast<int>(rec.size()));
}

INSTANTIATE_TEST_SUITE_P(Types, GgufLlamaCppQuantizer,
                         ::testing::Values(std::pair<std::string, std::string>{"q8_0", "q8_0"},
                                           std::pair<std::string, std::string>{"q4_k", "q4_k_m"},
                                           std::pair<std::string, std::string>{"q6_k", "q6_k"}),
                         [](const auto& info) { return info.param.first; });

}  // namespace
}  // namespace mambacpp
