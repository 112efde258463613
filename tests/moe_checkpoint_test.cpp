// MoE checkpoints through the real loader: the experts stored as fused 3-D tensors (transformers 5) and as per-expert
// 2-D tensors (the released checkpoints) load to the same model (logits bit for bit), Nemotron-H's multi-token-
// prediction tensors are skipped only when the config declares MTP layers, and a missing expert names itself.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <map>
#include <random>
#include <regex>

#include <nlohmann/json.hpp>

#include "mambacpp/config.h"
#include "mambacpp/model.h"
#include "model/weights.h"
#include "support/test_support.h"

namespace mambacpp {
namespace {

const char* kNemotron = R"({
  "model_type": "nemotron_h", "architectures": ["NemotronHForCausalLM"], "vocab_size": 53, "hidden_size": 32,
  "hybrid_override_pattern": "ME*E", "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 8,
  "intermediate_size": 24, "mlp_hidden_act": "relu2", "mlp_bias": true, "ssm_state_size": 8, "mamba_num_heads": 8,
  "mamba_head_dim": 8, "n_groups": 2, "conv_kernel": 4, "chunk_size": 8, "layer_norm_epsilon": 1e-5,
  "tie_word_embeddings": false, "n_routed_experts": 6, "num_experts_per_tok": 2, "moe_intermediate_size": 12,
  "moe_shared_expert_intermediate_size": 20, "n_group": 2, "topk_group": 1, "norm_topk_prob": true,
  "routed_scaling_factor": 2.5})";

const char* kJamba = R"({
  "model_type": "jamba", "architectures": ["JambaForCausalLM"], "vocab_size": 61, "hidden_size": 32,
  "num_hidden_layers": 4, "attn_layer_period": 4, "attn_layer_offset": 2, "expert_layer_period": 2,
  "expert_layer_offset": 1, "num_experts": 4, "num_experts_per_tok": 2, "intermediate_size": 24,
  "num_attention_heads": 4, "num_key_value_heads": 2, "mamba_d_state": 8, "mamba_d_conv": 4, "mamba_expand": 2,
  "mamba_dt_rank": 5, "rms_norm_eps": 1e-6, "tie_word_embeddings": false})";

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// Every tensor the config needs, in the fused layout, with values that make each matter.
std::map<std::string, test::HostTensor> random_tensors(const ModelConfig& c, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::uniform_real_distribution<float> ud(0.0f, 1.0f);
  std::map<std::string, test::HostTensor> out;
  for (const auto& [name, shape] : hybrid_weight_shapes(c)) {
    test::HostTensor t;
    t.shape = shape;
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    const float fan_in = shape.size() >= 2 ? static_cast<float>(shape.back()) : 1.0f;
    for (int64_t i = 0; i < n; ++i) {
      float v;
      if (ends_with(name, "norm.weight") || ends_with(name, "norm_f.weight")) v = 1.0f + 0.2f * nd(rng);
      else if (ends_with(name, "A_log")) v = std::log(1.0f + 15.0f * ud(rng));
      else if (ends_with(name, ".D")) v = 0.5f + ud(rng);
      else if (ends_with(name, "dt_bias") || ends_with(name, "dt_proj.bias")) v = -1.5f + 0.5f * nd(rng);
      else if (ends_with(name, "e_score_correction_bias")) v = 0.1f * nd(rng);
      else v = nd(rng) / std::sqrt(fan_in);
      t.values.push_back(v);
    }
    out[name] = std::move(t);
  }
  return out;
}

// The same tensors with every fused expert tensor split into per-expert ones (gate_up_proj into gate and up).
std::map<std::string, test::HostTensor> per_expert(const std::map<std::string, test::HostTensor>& fused) {
  std::map<std::string, test::HostTensor> out;
  const std::regex re(R"((.*\.experts)\.(up_proj|down_proj|gate_up_proj)$)");
  std::smatch m;
  for (const auto& [name, t] : fused) {
    if (!std::regex_match(name, m, re)) {
      out[name] = t;
      continue;
    }
    const int64_t E = t.shape[0], rows = t.shape[1], cols = t.shape[2];
    for (int64_t e = 0; e < E; ++e) {
      auto slice = [&](int64_t r0, int64_t nr) {
        test::HostTensor s;
        s.shape = {nr, cols};
        s.values.assign(t.values.begin() + (e * rows + r0) * cols, t.values.begin() + (e * rows + r0 + nr) * cols);
        return s;
      };
      const std::string p = m[1].str() + "." + std::to_string(e) + ".";
      if (m[2] == "gate_up_proj") {
        out[p + "gate_proj.weight"] = slice(0, rows / 2);
        out[p + "up_proj.weight"] = slice(rows / 2, rows / 2);
      } else {
        out[p + m[2].str() + ".weight"] = slice(0, rows);
      }
    }
  }
  return out;
}

void write_model(const std::string& dir, const nlohmann::json& config,
                 const std::map<std::string, test::HostTensor>& tensors) {
  std::filesystem::create_directories(dir);
  std::ofstream(dir + "/config.json") << config.dump(1);
  test::write_safetensors(dir + "/model.safetensors", tensors);
}

std::vector<float> logits_of(const std::string& dir) {
  LoadOptions lo;
  lo.device = DeviceChoice::CPU;
  lo.threads = 1;
  auto model = Model::load(dir, lo);
  std::vector<int32_t> ids(19);
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<int32_t>((i * 29 + 3) % model->config().vocab_size);
  auto st = model->create_state(1);
  Sequence s = Sequence::tokens(ids, 0);
  return model->forward(*st, {&s, 1}, Output::AllLogits).values;
}

TEST(MoeCheckpoint, FusedAndPerExpertExpertsLoadToTheSameModel) {
  for (const char* text : {kNemotron, kJamba}) {
    const nlohmann::json j = nlohmann::json::parse(text);
    SCOPED_TRACE(j["model_type"].get<std::string>());
    const ModelConfig c = parse_model_config(text);
    test::TempDir tmp;
    const auto fused = random_tensors(c, 17);
    const auto split = per_expert(fused);
    ASSERT_GT(split.size(), fused.size());
    write_model(tmp.file("fused"), j, fused);
    write_model(tmp.file("split"), j, split);
    const auto a = logits_of(tmp.file("fused"));
    for (float v : a) ASSERT_TRUE(std::isfinite(v));
    EXPECT_EQ(a, logits_of(tmp.file("split")));
    // One expert missing: the error names it.
    auto broken = split;
    const std::string gone = j["model_type"] == "jamba" ? "model.layers.1.feed_forward.experts.3.down_proj.weight"
                                                        : "model.layers.3.mixer.experts.5.down_proj.weight";
    ASSERT_EQ(broken.erase(gone), 1u);
    write_model(tmp.file("broken"), j, broken);
    EXPECT_NE(test::error_of([&] { logits_of(tmp.file("broken")); }).find(gone), std::string::npos);
  }
}

TEST(MoeCheckpoint, GraniteLoadsTheReleasedAndTheTransformers5Names) {
  const nlohmann::json j = nlohmann::json::parse(R"({
    "model_type": "granitemoehybrid", "architectures": ["GraniteMoeHybridForCausalLM"], "vocab_size": 59,
    "hidden_size": 32, "num_hidden_layers": 2, "layer_types": ["mamba", "attention"], "num_attention_heads": 4,
    "num_key_value_heads": 1, "attention_multiplier": 0.3, "embedding_multiplier": 3.0, "residual_multiplier": 0.4,
    "logits_scaling": 2.5, "num_local_experts": 5, "num_experts_per_tok": 2, "intermediate_size": 12,
    "shared_intermediate_size": 24, "mamba_n_heads": 8, "mamba_d_head": 8, "mamba_n_groups": 2, "mamba_d_state": 8,
    "mamba_chunk_size": 8, "rms_norm_eps": 1e-6, "tie_word_embeddings": true})");
  const ModelConfig c = parse_model_config(j.dump());
  const auto released = random_tensors(c, 23);
  ASSERT_TRUE(released.count("model.layers.1.block_sparse_moe.input_linear.weight"));
  std::map<std::string, test::HostTensor> v5;
  for (const auto& [name, t] : released) {
    std::string n = std::regex_replace(name, std::regex(R"(router\.layer\.weight$)"), "router.weight");
    n = std::regex_replace(n, std::regex(R"(block_sparse_moe\.input_linear\.weight$)"), "block_sparse_moe.experts.gate_up_proj");
    n = std::regex_replace(n, std::regex(R"(block_sparse_moe\.output_linear\.weight$)"), "block_sparse_moe.experts.down_proj");
    v5[n] = t;
  }
  ASSERT_TRUE(v5.count("model.layers.1.block_sparse_moe.experts.down_proj"));
  test::TempDir tmp;
  write_model(tmp.file("released"), j, released);
  write_model(tmp.file("v5"), j, v5);
  const auto a = logits_of(tmp.file("released"));
  for (float v : a) ASSERT_TRUE(std::isfinite(v));
  EXPECT_EQ(a, logits_of(tmp.file("v5")));
}

TEST(MoeCheckpoint, MtpTensorsAreSkippedOnlyForDeclaredMtpLayers) {
  nlohmann::json j = nlohmann::json::parse(kNemotron);
  const ModelConfig c = parse_model_config(kNemotron);
  auto tensors = random_tensors(c, 5);
  tensors["mtp.layers.0.mixer.gate.weight"] = test::HostTensor{{6, 32}, std::vector<float>(6 * 32, 0.5f)};
  test::TempDir tmp;
  write_model(tmp.file("plain"), j, tensors);
  EXPECT_NE(test::error_of([&] { logits_of(tmp.file("plain")); }).find("mtp.layers.0.mixer.gate.weight"),
            std::string::npos);
  j["num_nextn_predict_layers"] = 1;
  write_model(tmp.file("mtp"), j, tensors);
  tensors.erase("mtp.layers.0.mixer.gate.weight");
  j.erase("num_nextn_predict_layers");
  write_model(tmp.file("none"), j, tensors);
  EXPECT_EQ(logits_of(tmp.file("mtp")), logits_of(tmp.file("none")));
}

}  // namespace
}  // namespace mambacpp
