// Mixture-of-experts configs (Nemotron-H's three layer-list spellings, Granite-4.0-H's num_local_experts, the
// refusals) and MoE models on random weights against themselves: any split of a sequence into calls, token by token
// decode and a batch member alone all equal one pass (the experts are bit-exact per token; what rounds differently is
// the Mamba-2 chunking, as for the dense hybrids), and the canonical config round-trips.
// The transformers references are in moe_fixtures_test.cpp (fixtures/moe, scripts/make_moe_fixtures.py).
#include <gtest/gtest.h>

#include <algorithm>
#include <random>

#include <nlohmann/json.hpp>

#include "mambacpp/config.h"
#include "mambacpp/model.h"
#include "mambacpp/shapes.h"
#include "support/test_support.h"
#include "support/engine_support.h"

namespace mambacpp {
namespace {

constexpr double kSelfTol = 1e-5;

nlohmann::json nemotron_moe_json() {
  return nlohmann::json::parse(R"({
    "model_type": "nemotron_h", "architectures": ["NemotronHForCausalLM"], "vocab_size": 67, "hidden_size": 32,
    "layers_block_type": ["mamba", "moe", "attention", "moe", "mlp", "moe"], "num_attention_heads": 4,
    "num_key_value_heads": 2, "head_dim": 8, "intermediate_size": 24, "mlp_hidden_act": "relu2", "mlp_bias": true,
    "ssm_state_size": 8, "mamba_num_heads": 8, "mamba_head_dim": 8, "n_groups": 2, "conv_kernel": 4,
    "chunk_size": 8, "layer_norm_epsilon": 1e-5, "tie_word_embeddings": false,
    "n_routed_experts": 8, "num_experts_per_tok": 3, "moe_intermediate_size": 12,
    "moe_shared_expert_intermediate_size": 20, "n_shared_experts": 1, "n_group": 2, "topk_group": 1,
    "norm_topk_prob": true, "routed_scaling_factor": 2.5})");
}

nlohmann::json granite_moe_json() {
  return nlohmann::json::parse(R"({
    "model_type": "granitemoehybrid", "architectures": ["GraniteMoeHybridForCausalLM"], "vocab_size": 59,
    "hidden_size": 32, "num_hidden_layers": 3, "layer_types": ["mamba", "attention", "mamba"],
    "num_attention_heads": 4, "num_key_value_heads": 1, "attention_multiplier": 0.3, "embedding_multiplier": 3.0,
    "residual_multiplier": 0.4, "logits_scaling": 2.5, "num_local_experts": 6, "num_experts_per_tok": 2,
    "intermediate_size": 12, "shared_intermediate_size": 24, "position_embedding_type": "nope",
    "mamba_n_heads": 8, "mamba_d_head": 8, "mamba_n_groups": 2, "mamba_d_state": 8, "mamba_chunk_size": 8,
    "rms_norm_eps": 1e-6, "tie_word_embeddings": true})");
}

nlohmann::json jamba_json() {
  return nlohmann::json::parse(R"({
    "model_type": "jamba", "architectures": ["JambaForCausalLM"], "vocab_size": 61, "hidden_size": 32,
    "num_hidden_layers": 6, "attn_layer_period": 3, "attn_layer_offset": 1, "expert_layer_period": 2,
    "expert_layer_offset": 1, "num_experts": 4, "num_experts_per_tok": 2, "intermediate_size": 24,
    "num_attention_heads": 4, "num_key_value_heads": 2, "mamba_d_state": 8, "mamba_d_conv": 4, "mamba_expand": 2,
    "mamba_dt_rank": 5, "rms_norm_eps": 1e-6, "tie_word_embeddings": false})");
}

ModelConfig parse(const nlohmann::json& j) { return parse_model_config(j.dump(), "config.json"); }

void expect_refused(const nlohmann::json& j, std::initializer_list<std::string> parts) {
  const std::string err = test::error_of([&] { parse(j); });
  for (const std::string& p : parts) EXPECT_NE(err.find(p), std::string::npos) << "'" << p << "' not in: " << err;
}

TEST(MoeConfig, NemotronHReadsEveryLayerListSpelling) {
  const ModelConfig c = parse(nemotron_moe_json());
  EXPECT_EQ(c.layers, (std::vector<LayerKind>{LayerKind::Mamba2, LayerKind::MoE, LayerKind::Attention, LayerKind::MoE,
                                              LayerKind::MLP, LayerKind::MoE}));
  EXPECT_EQ(c.moe.n_experts, 8);
  EXPECT_EQ(c.moe.top_k, 3);
  EXPECT_EQ(c.moe.expert_size, 12);
  EXPECT_EQ(c.moe.shared_size, 20);
  EXPECT_EQ(c.moe.routing, MoeRouting::SigmoidGrouped);
  EXPECT_EQ(c.moe.act, MlpAct::Relu2);
  EXPECT_EQ(c.moe.n_group, 2);
  EXPECT_EQ(c.moe.topk_group, 1);
  EXPECT_TRUE(c.moe.norm_topk_prob);
  EXPECT_DOUBLE_EQ(c.moe.routed_scaling, 2.5);
  EXPECT_EQ(c.moe_layer_period, 0);
  // transformers 5's names, and the legacy pattern, mean the same model.
  auto j = nemotron_moe_json();
  j["layers_block_type"] = {"linear_attention", "moe", "full_attention", "moe", "mlp", "moe"};
  EXPECT_EQ(parse(j).to_json(), c.to_json());
  j.erase("layers_block_type");
  j["hybrid_override_pattern"] = "ME*E-E";
  EXPECT_EQ(parse(j).to_json(), c.to_json());
  // num_local_experts is NemotronHConfig's alias of n_routed_experts.
  j = nemotron_moe_json();
  j.erase("n_routed_experts");
  j["num_local_experts"] = 8;
  EXPECT_EQ(parse(j).to_json(), c.to_json());
  // The canonical form round-trips.
  EXPECT_EQ(parse_model_config(c.to_json()).to_json(), c.to_json());
}

TEST(MoeConfig, NemotronHIgnoresMtpLayersAndRefusesWhatItCannotRun) {
  auto j = nemotron_moe_json();
  j["num_nextn_predict_layers"] = 1;
  EXPECT_EQ(parse(j).mtp_layers_ignored, 1);
  j = nemotron_moe_json();
  j["moe_latent_size"] = 64;  // latent MoE is read (moe_latent_test.cpp); wider than hidden_size it is refused
  expect_refused(j, {"moe_latent_size", "64", "hidden_size"});
  j = nemotron_moe_json();
  j["n_group"] = 3;
  expect_refused(j, {"n_group", "3", "does not divide"});
  j = nemotron_moe_json();
  j["num_experts_per_tok"] = 9;
  expect_refused(j, {"num_experts_per_tok", "9"});
  j = nemotron_moe_json();
  j["num_experts_per_tok"] = 5;  // one group of 4 eligible
  expect_refused(j, {"num_experts_per_tok", "5", "topk_group"});
  j = nemotron_moe_json();
  j["topk_group"] = 3;
  expect_refused(j, {"topk_group", "3"});
  j = nemotron_moe_json();
  j["n_group"] = 8;
  j["topk_group"] = 4;
  expect_refused(j, {"n_group", "8", "fewer than 2"});
}

TEST(MoeConfig, Granite) {
  const ModelConfig c = parse(granite_moe_json());
  EXPECT_EQ(c.moe.n_experts, 6);
  EXPECT_EQ(c.moe.top_k, 2);
  EXPECT_EQ(c.moe.expert_size, 12);
  EXPECT_EQ(c.moe.routing, MoeRouting::SoftmaxChosen);
  EXPECT_EQ(c.moe.act, MlpAct::SiluGated);
  EXPECT_EQ(c.moe_layer_period, 1);
  EXPECT_EQ(c.mlp_size, 24);  // the shared_mlp beside the experts
  EXPECT_EQ(parse_model_config(c.to_json()).to_json(), c.to_json());
  auto j = granite_moe_json();
  j["num_experts_per_tok"] = 7;
  expect_refused(j, {"num_experts_per_tok", "7", "6 experts"});
  j["num_local_experts"] = -1;
  expect_refused(j, {"num_local_experts", "-1"});
}

TEST(MoeConfig, Jamba) {
  const ModelConfig c = parse(jamba_json());
  EXPECT_EQ(c.family, Family::Jamba);
  EXPECT_EQ(c.arch, Arch::Mamba1);
  EXPECT_EQ(c.layers, (std::vector<LayerKind>{LayerKind::Mamba1, LayerKind::Attention, LayerKind::Mamba1,
                                              LayerKind::Mamba1, LayerKind::Attention, LayerKind::Mamba1}));
  for (int64_t l = 0; l < 6; ++l) EXPECT_EQ(c.mlp_has_experts(l), l % 2 == 1) << l;
  EXPECT_EQ(c.moe.routing, MoeRouting::SoftmaxAll);
  EXPECT_EQ(c.moe.expert_size, 24);
  EXPECT_EQ(c.dt_rank, 5);
  EXPECT_DOUBLE_EQ(c.mixer_rms_eps, 1e-6);
  EXPECT_EQ(c.rope_theta, 0.0);
  EXPECT_EQ(c.attn_head_dim, 8);
  EXPECT_EQ(parse_model_config(c.to_json()).to_json(), c.to_json());
  auto j = jamba_json();
  j["mamba_dt_rank"] = "auto";
  EXPECT_EQ(parse(j).dt_rank, 2);
  j = jamba_json();
  j["num_experts"] = 1;  // dense everywhere
  EXPECT_EQ(parse(j).moe.n_experts, 0);
  j = jamba_json();
  j["attn_layer_offset"] = 3;
  expect_refused(j, {"attn_layer_offset", "3"});
  j = jamba_json();
  j["num_experts_per_tok"] = 5;
  expect_refused(j, {"num_experts_per_tok", "5"});
}

TEST(MoeConfig, NamedShapesValidate) {
  for (const char* n : {"nemotron-3-nano-30b-a3b", "granite-4.0-h-tiny", "granite-4.0-h-small", "jamba-mini"}) {
    const ModelConfig c = named_shape(n);
    EXPECT_NO_THROW(c.validate()) << n;
    EXPECT_GT(c.moe.n_experts, 0) << n;
  }
  const ModelConfig nano = named_shape("nemotron-3-nano-30b-a3b");
  EXPECT_EQ(nano.n_layer, 52);
  EXPECT_EQ(std::count(nano.layers.begin(), nano.layers.end(), LayerKind::MoE), 23);
  EXPECT_EQ(std::count(nano.layers.begin(), nano.layers.end(), LayerKind::Mamba2), 23);
  EXPECT_EQ(std::count(nano.layers.begin(), nano.layers.end(), LayerKind::Attention), 6);
}

using test::all_logits;

// A checkpoint converted whole to bf16 holds Nemotron's router correction bias (an f32 parameter in transformers)
// narrowed: the routing widens it instead of refusing the model.
TEST(MoeModel, Bf16StoredRouterBiasIsWidened) {
  const ModelConfig c = parse(nemotron_moe_json());
  LoadOptions lo;
  lo.device = DeviceChoice::CPU;
  lo.threads = 2;
  lo.kv_page_tokens = 5;
  auto model = Model::random(c, lo, 5, DType::BF16);
  std::vector<int32_t> ids(23);
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<int32_t>((i * 37 + 11) % c.vocab_size);
  auto st = model->create_state(1);
  const auto one = all_logits(*model, *st, ids);
  for (float v : one) ASSERT_TRUE(std::isfinite(v));
  auto st2 = model->create_state(1);
  std::vector<float> steps;
  for (size_t t = 0; t < ids.size(); ++t) {
    const auto row = all_logits(*model, *st2, std::span<const int32_t>(ids).subspan(t, 1));
    steps.insert(steps.end(), row.begin(), row.end());
  }
  EXPECT_LE(test::max_rel_diff(steps, one), kSelfTol) << "token by token";
}

TEST(MoeModel, RandomWeightsAreSplitAndBatchInvariant) {
  for (const nlohmann::json& j : {nemotron_moe_json(), granite_moe_json(), jamba_json()}) {
    const ModelConfig c = parse(j);
    SCOPED_TRACE(family_name(c.family));
    LoadOptions lo;
    lo.device = DeviceChoice::CPU;
    lo.threads = 2;
    lo.kv_page_tokens = 5;
    lo.max_batch_tokens = 16;  // prefill pieces of 16: sequences cut inside a call too
    auto model = Model::random(c, lo, 5, DType::F32);
    EXPECT_GT(model->weight_bytes(), c.moe.n_experts * c.moe.expert_size * c.d_model * 4 * 2);
    // A decode step of one token reads top_k of the experts; a large batch nearly all of them.
    int64_t moe_layers = 0;
    for (int64_t l = 0; l < c.n_layer; ++l) moe_layers += c.layer_kind(l) == LayerKind::MoE || c.mlp_has_experts(l);
    const int64_t per_expert = (c.moe.act == MlpAct::Relu2 ? 2 : 3) * c.moe.expert_size * c.d_model * 4;
    EXPECT_EQ(model->weight_bytes() - model->decode_weight_bytes(1),
              moe_layers * (c.moe.n_experts - c.moe.top_k) * per_expert);
    EXPECT_GT(model->decode_weight_bytes(64), model->weight_bytes() - moe_layers * per_expert / 100);
    std::vector<int32_t> ids(41);
    for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<int32_t>((i * 37 + 11) % c.vocab_size);
    auto st = model->create_state(1);
    const auto one = all_logits(*model, *st, ids);
    for (float v : one) ASSERT_TRUE(std::isfinite(v));
    // Calls of random lengths.
    std::mt19937 rng(3);
    auto st2 = model->create_state(1);
    std::vector<float> got;
    for (size_t at = 0; at < ids.size();) {
      const size_t n = std::min(ids.size() - at, static_cast<size_t>(std::uniform_int_distribution<int>(1, 9)(rng)));
      const auto part = all_logits(*model, *st2, std::span<const int32_t>(ids).subspan(at, n));
      got.insert(got.end(), part.begin(), part.end());
      at += n;
    }
    EXPECT_LE(test::max_rel_diff(got, one), kSelfTol) << "split into calls";
    // Token by token (decode steps).
    auto st3 = model->create_state(1);
    std::vector<float> steps;
    for (size_t t = 0; t < ids.size(); ++t) {
      const auto row = all_logits(*model, *st3, std::span<const int32_t>(ids).subspan(t, 1));
      steps.insert(steps.end(), row.begin(), row.end());
    }
    EXPECT_LE(test::max_rel_diff(steps, one), kSelfTol) << "token by token";
    // A batch of three sequences against each alone.
    const std::vector<int32_t> a(ids.begin(), ids.begin() + 30), b(ids.begin() + 5, ids.begin() + 17),
        d(ids.rbegin(), ids.rbegin() + 23);
    auto sb = model->create_state(3);
    std::vector<Sequence> seqs = {Sequence::tokens(a, 2), Sequence::tokens(b, 0), Sequence::tokens(d, 1)};
    const ForwardResult r = model->forward(*sb, seqs, Output::AllLogits);
    const int64_t V = c.vocab_size;
    int64_t row = 0;
    for (size_t i = 0; i < seqs.size(); ++i) {
      auto alone = model->create_state(1);
      const auto want = all_logits(*model, *alone, seqs[i].token_ids);
      const std::vector<float> part(r.values.begin() + row * V, r.values.begin() + (row + seqs[i].length()) * V);
      EXPECT_LE(test::max_rel_diff(part, want), kSelfTol) << "sequence " << i;
      row += seqs[i].length();
    }
  }
}

}  // namespace
}  // namespace mambacpp
