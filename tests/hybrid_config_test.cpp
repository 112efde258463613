// Hybrid configs as transformers 5.17 writes them (the fixtures' config.json), the legacy spellings, and the
// variants mambacpp refuses, each with an error that names the key and the value.
#include <gtest/gtest.h>

#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "mambacpp/config.h"
#include "support/test_support.h"

namespace mambacpp {
namespace {

nlohmann::json fixture_config(const std::string& name) {
  std::ifstream f(test::fixture_dir() + "/hybrid/" + name + "/config.json");
  return nlohmann::json::parse(f);
}

ModelConfig parse(const nlohmann::json& j) { return parse_model_config(j.dump(), "config.json"); }

// The error of parsing `j`, which must mention every one of `parts`.
void expect_refused(const nlohmann::json& j, std::initializer_list<std::string> parts) {
  const std::string err = test::error_of([&] { parse(j); });
  for (const std::string& p : parts) EXPECT_NE(err.find(p), std::string::npos) << "'" << p << "' not in: " << err;
}

TEST(HybridConfig, NemotronH) {
  const ModelConfig c = parse(fixture_config("nemotron_h_f32"));
  EXPECT_EQ(c.family, Family::NemotronH);
  EXPECT_EQ(c.layers, (std::vector<LayerKind>{LayerKind::Mamba2, LayerKind::Attention, LayerKind::Mamba2, LayerKind::MLP,
                                              LayerKind::Mamba2, LayerKind::Attention}));
  EXPECT_EQ(c.n_layer, 6);
  EXPECT_EQ(c.d_inner, 96);
  EXPECT_EQ(c.norm_groups(), 2);  // per-group gated norm
  EXPECT_EQ(c.attn_head_dim, 20);
  EXPECT_EQ(c.n_kv_heads, 2);
  EXPECT_EQ(c.rope_theta, 0.0);  // NoPE
  EXPECT_EQ(c.mlp_act, MlpAct::Relu2);
  EXPECT_TRUE(c.mlp_bias);
  EXPECT_FALSE(c.mlp_after_mixer);

  // The legacy pattern means the same layers.
  auto j = fixture_config("nemotron_h_f32");
  j.erase("layers_block_type");
  j["hybrid_override_pattern"] = "M*M-M*";
  EXPECT_EQ(parse(j).to_json(), c.to_json());
  j["hybrid_override_pattern"] = "M*E-M*";  // an MoE layer (tests/moe_config_test.cpp)
  EXPECT_EQ(parse(j).layers[2], LayerKind::MoE);
  j["hybrid_override_pattern"] = "M*X";
  expect_refused(j, {"hybrid_override_pattern", "'X'"});
  j["hybrid_override_pattern"] = "M*M-M*";
  j["num_hidden_layers"] = 5;
  expect_refused(j, {"num_hidden_layers", "5", "6 layers"});

  j = fixture_config("nemotron_h_f32");
  j["layers_block_type"][3] = "moe";
  EXPECT_EQ(parse(j).layers[3], LayerKind::MoE);
  j["layers_block_type"][3] = "conv";
  expect_refused(j, {"layers_block_type[3]", "\"conv\"", "unknown layer type"});
  j = fixture_config("nemotron_h_f32");
  j["num_key_value_heads"] = 3;
  expect_refused(j, {"num_key_value_heads", "3", "not a multiple"});
  j = fixture_config("nemotron_h_f32");
  j["mlp_hidden_act"] = "gelu";
  expect_refused(j, {"mlp_hidden_act", "gelu", "relu2"});
  j = fixture_config("nemotron_h_f32");
  j["sliding_window"] = 128;
  expect_refused(j, {"sliding_window", "128"});
  j = fixture_config("nemotron_h_f32");
  j["mamba_num_heads"] = 7;
  expect_refused(j, {"n_groups", "not a multiple"});
}

TEST(HybridConfig, GraniteDense) {
  const ModelConfig c = parse(fixture_config("granite_h_f32"));
  EXPECT_EQ(c.family, Family::GraniteHybrid);
  EXPECT_EQ(c.layers, (std::vector<LayerKind>{LayerKind::Mamba2, LayerKind::Attention, LayerKind::Mamba2,
                                              LayerKind::Mamba2, LayerKind::Attention}));
  EXPECT_EQ(c.norm_groups(), 1);  // whole-d_inner gated norm although n_groups = 2
  EXPECT_EQ(c.n_groups, 2);
  EXPECT_EQ(c.n_kv_heads, 1);
  EXPECT_EQ(c.attn_head_dim, 10);
  EXPECT_DOUBLE_EQ(c.attn_scale, 0.3);
  EXPECT_DOUBLE_EQ(c.embedding_multiplier, 3.0);
  EXPECT_DOUBLE_EQ(c.residual_multiplier, 0.4);
  EXPECT_DOUBLE_EQ(c.logits_scaling, 2.5);
  EXPECT_TRUE(c.attn_bias);
  EXPECT_TRUE(c.use_bias);
  EXPECT_TRUE(c.mlp_after_mixer);
  EXPECT_EQ(c.mlp_size, 56);
  EXPECT_EQ(c.rope_theta, 0.0);

  auto j = fixture_config("granite_h_f32");
  j["num_local_experts"] = 8;  // the MoE models (tests/moe_config_test.cpp)
  EXPECT_EQ(parse(j).moe.n_experts, 8);
  j.erase("num_local_experts");  // GraniteMoeHybridConfig's default is 8 experts
  EXPECT_EQ(parse(j).moe.n_experts, 8);
  j = fixture_config("granite_h_f32");
  j["layer_types"][0] = "mlp";
  expect_refused(j, {"layer_types[0]", "\"mlp\"", "unknown layer type"});
  j = fixture_config("granite_h_f32");
  j["layer_types"].erase(0);
  expect_refused(j, {"layer_types", "4 entries", "num_hidden_layers = 5"});
  j = fixture_config("granite_h_f32");
  j["position_embedding_type"] = "rope";
  const ModelConfig rope = parse(j);
  EXPECT_DOUBLE_EQ(rope.rope_theta, 10000.0);
  EXPECT_EQ(rope.rope_dim, 10);
  j["rope_parameters"]["rope_type"] = "yarn";
  expect_refused(j, {"rope_parameters.rope_type", "yarn"});
  j = fixture_config("granite_h_f32");
  j["position_embedding_type"] = "alibi";
  expect_refused(j, {"position_embedding_type", "alibi"});
  j = fixture_config("granite_h_f32");
  j["num_attention_heads"] = 3;
  j["num_key_value_heads"] = 1;
  expect_refused(j, {"num_attention_heads", "3", "hidden_size = 40"});
}

TEST(HybridConfig, Bamba) {
  const ModelConfig c = parse(fixture_config("bamba_f32"));
  EXPECT_EQ(c.family, Family::Bamba);
  EXPECT_EQ(c.layers, (std::vector<LayerKind>{LayerKind::Mamba2, LayerKind::Attention, LayerKind::Mamba2,
                                              LayerKind::Mamba2, LayerKind::Attention}));
  EXPECT_DOUBLE_EQ(c.rope_theta, 500.0);
  EXPECT_EQ(c.attn_head_dim, 8);
  EXPECT_EQ(c.rope_dim, 4);  // half of each head
  EXPECT_EQ(c.norm_groups(), 1);
  EXPECT_EQ(c.mlp_act, MlpAct::SiluGated);
  EXPECT_EQ(c.max_position, 4096);

  auto j = fixture_config("bamba_f32");
  j["attn_layer_indices"] = {1, 5};
  expect_refused(j, {"attn_layer_indices", "[1,5]", "num_hidden_layers = 5"});
  j = fixture_config("bamba_f32");
  j["rope_parameters"]["rope_type"] = "linear";
  expect_refused(j, {"rope_parameters.rope_type", "linear"});
  j = fixture_config("bamba_f32");
  j["rope_scaling"] = {{"type", "dynamic"}, {"factor", 2.0}};
  expect_refused(j, {"rope_scaling", "dynamic"});
  j = fixture_config("bamba_f32");
  j["mamba_d_head"] = 7;
  expect_refused(j, {"mamba_d_head", "7"});
  j = fixture_config("bamba_f32");
  j["architectures"] = {"FalconH1ForCausalLM"};
  expect_refused(j, {"architectures", "FalconH1ForCausalLM"});
}

TEST(HybridConfig, CanonicalFormRoundTripsAndPureModelsAreUnchanged) {
  for (const char* name : {"nemotron_h_f32", "granite_h_f32", "bamba_f32"}) {
    const ModelConfig c = parse(fixture_config(name));
    EXPECT_EQ(parse_model_config(c.to_json()).to_json(), c.to_json()) << name;
  }
  const std::string pure = test::tiny_mamba2_config().to_json();
  EXPECT_EQ(pure.find("family"), std::string::npos) << "pure models' canonical config (state files) must not change";
}

TEST(HybridConfig, UnknownModelTypeNamesTheSupportedOnes) {
  nlohmann::json j = fixture_config("bamba_f32");
  j["model_type"] = "zamba2";
  expect_refused(j, {"zamba2", "nemotron_h", "granitemoehybrid", "bamba", "falcon_h1", "jamba"});
}

}  // namespace
}  // namespace mambacpp
