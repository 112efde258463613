// Falcon-H1 without its transformers fixtures: the config reader (every key of FalconH1Config, the refusals), the
// parallel layer's cache entries (a Mamba state and KV pages side by side), and the self-consistency of random
// models: any split of a sequence into calls, a batch member against itself alone, a restored or reloaded slot.
// The goldens (tests/falcon_h1_fixture_test.cpp) check the values against transformers.
#include <gtest/gtest.h>

#include <random>

#include <nlohmann/json.hpp>

#include "mambacpp/config.h"
#include "mambacpp/engine.h"
#include "mambacpp/model.h"
#include "mambacpp/shapes.h"
#include "support/engine_support.h"
#include "support/test_support.h"

namespace mambacpp {
namespace {

constexpr double kSelfTol = 1e-5;

// A config.json as FalconH1Config.to_json_string writes one (the keys transformers 5 saves), tiny.
nlohmann::json falcon_config() {
  return nlohmann::json::parse(R"({
    "architectures": ["FalconH1ForCausalLM"], "model_type": "falcon_h1", "vocab_size": 71, "hidden_size": 32,
    "intermediate_size": 40, "num_hidden_layers": 3, "num_attention_heads": 4, "num_key_value_heads": 2,
    "hidden_act": "silu", "rms_norm_eps": 1e-5, "tie_word_embeddings": false, "max_position_embeddings": 4096,
    "attention_dropout": 0.0, "mamba_d_ssm": 48, "mamba_n_heads": 6, "mamba_d_head": 8, "mamba_n_groups": 2,
    "mamba_d_state": 12, "mamba_d_conv": 4, "mamba_expand": 2, "mamba_chunk_size": 8, "mamba_conv_bias": true,
    "mamba_proj_bias": false, "mamba_norm_before_gate": true, "mamba_rms_norm": false, "time_step_min": 0.001,
    "time_step_max": 0.1, "time_step_limit": [0.0, {"__float__": "Infinity"}], "projectors_bias": false,
    "rope_parameters": {"rope_type": "default", "rope_theta": 100000000000.0}, "lm_head_multiplier": 0.7,
    "embedding_multiplier": 2.5, "mlp_multipliers": [0.9, 0.55], "key_multiplier": 0.6,
    "attention_out_multiplier": 0.8, "attention_in_multiplier": 1.3,
    "ssm_multipliers": [0.35, 0.6, 1.4, 0.8, 1.7], "ssm_in_multiplier": 1.25, "ssm_out_multiplier": 0.45,
    "attention_bias": false, "mlp_bias": false, "pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2,
    "num_logits_to_keep": 1, "use_cache": true})");
}

ModelConfig parse(const nlohmann::json& j) { return parse_model_config(j.dump(), "config.json"); }

void expect_refused(const nlohmann::json& j, std::initializer_list<std::string> parts) {
  const std::string err = test::error_of([&] { parse(j); });
  for (const std::string& p : parts) EXPECT_NE(err.find(p), std::string::npos) << "'" << p << "' not in: " << err;
}

TEST(FalconH1Config, EveryKey) {
  const ModelConfig c = parse(falcon_config());
  EXPECT_EQ(c.family, Family::FalconH1);
  EXPECT_EQ(c.arch, Arch::Mamba2);
  EXPECT_EQ(c.layers, std::vector<LayerKind>(3, LayerKind::ParallelHybrid));
  EXPECT_EQ(c.cache_entries(), 6);
  EXPECT_TRUE(c.has_attention());
  EXPECT_EQ(c.d_inner, 48);  // mamba_d_ssm, not 2 * hidden_size
  EXPECT_EQ(c.n_heads, 6);
  EXPECT_EQ(c.head_dim, 8);
  EXPECT_EQ(c.n_groups, 2);
  EXPECT_EQ(c.norm_groups(), 2);
  EXPECT_EQ(c.in_proj_size(), 2 * 48 + 2 * 2 * 12 + 6);
  EXPECT_EQ(c.chunk_size, 8);
  EXPECT_FALSE(c.use_bias);
  EXPECT_FALSE(c.mamba_out_proj_bias);
  EXPECT_FALSE(c.mamba_rms_norm);
  EXPECT_TRUE(c.mamba_norm_before_gate);
  EXPECT_EQ(c.attn_head_dim, 8);  // hidden_size / heads without a head_dim key
  EXPECT_EQ(c.n_kv_heads, 2);
  EXPECT_EQ(c.attn_scale, 0.0);   // 1/sqrt(head_dim)
  EXPECT_EQ(c.rope_theta, 1e11);
  EXPECT_EQ(c.rope_dim, 8);       // the whole head, rotate-half
  EXPECT_EQ(c.max_position, 4096);
  EXPECT_EQ(c.mlp_size, 40);
  EXPECT_EQ(c.mlp_act, MlpAct::SiluGated);
  EXPECT_FALSE(c.mlp_after_mixer);  // the parallel layer runs its own MLP
  EXPECT_EQ(c.embedding_multiplier, 2.5);
  EXPECT_DOUBLE_EQ(1.0 / c.logits_scaling, 0.7);
  EXPECT_EQ(c.key_multiplier, 0.6);
  EXPECT_EQ(c.attn_in_multiplier, 1.3);
  EXPECT_EQ(c.attn_out_multiplier, 0.8);
  EXPECT_EQ(c.ssm_in_multiplier, 1.25);
  EXPECT_EQ(c.ssm_out_multiplier, 0.45);
  EXPECT_EQ(c.ssm_multipliers, (std::vector<double>{0.35, 0.6, 1.4, 0.8, 1.7}));
  EXPECT_EQ(c.mlp_gate_multiplier, 0.9);
  EXPECT_EQ(c.mlp_down_multiplier, 0.55);
  EXPECT_EQ(c.residual_multiplier, 1.0);
  EXPECT_FALSE(c.tie_embeddings);
  EXPECT_EQ(c.eos_token_id, 2);
  EXPECT_EQ(parse_model_config(c.to_json()).to_json(), c.to_json()) << "canonical form round trip";
  EXPECT_NE(c.to_json().find("\"falcon_h1\""), std::string::npos);
  ModelConfig ones = c;  // a config built in code may leave ssm_multipliers empty (all 1)
  ones.ssm_multipliers.clear();
  EXPECT_EQ(parse_model_config(ones.to_json()).ssm_multipliers, std::vector<double>(5, 1.0));
  EXPECT_EQ(parse_model_config(ones.to_json()).to_json(), ones.to_json());
}

TEST(FalconH1Config, DefaultsAndSpellings) {
  auto j = falcon_config();
  // No multipliers: FalconH1Config's ones.
  for (const char* k : {"lm_head_multiplier", "embedding_multiplier", "mlp_multipliers", "key_multiplier",
                        "attention_out_multiplier", "attention_in_multiplier", "ssm_multipliers", "ssm_in_multiplier",
                        "ssm_out_multiplier"})
    j.erase(k);
  ModelConfig c = parse(j);
  EXPECT_EQ(c.ssm_multipliers, std::vector<double>(5, 1.0));
  EXPECT_EQ(c.logits_scaling, 1.0);
  EXPECT_EQ(c.mlp_gate_multiplier, 1.0);
  // mamba_d_ssm null: mamba_expand * hidden_size; absent: FalconH1Config's 1024.
  j = falcon_config();
  j["mamba_d_ssm"] = nullptr;
  j["mamba_d_head"] = "auto";
  j["mamba_n_heads"] = 8;
  c = parse(j);
  EXPECT_EQ(c.d_inner, 64);
  EXPECT_EQ(c.head_dim, 8);
  j.erase("mamba_d_ssm");
  c = parse(j);
  EXPECT_EQ(c.d_inner, 1024);
  EXPECT_EQ(c.head_dim, 128);
  // An explicit head_dim (the released configs write one), the older top-level rope_theta, the Mamba norm on.
  j = falcon_config();
  j["head_dim"] = 12;
  j.erase("rope_parameters");
  j["rope_theta"] = 5000.0;
  j["mamba_rms_norm"] = true;
  j["mamba_norm_before_gate"] = false;
  j["projectors_bias"] = true;
  j["mamba_proj_bias"] = true;
  j["layers_block_type"] = {"hybrid", "hybrid", "hybrid"};
  c = parse(j);
  EXPECT_EQ(c.attn_head_dim, 12);
  EXPECT_EQ(c.q_dim(), 48);
  EXPECT_EQ(c.rope_theta, 5000.0);
  EXPECT_TRUE(c.mamba_rms_norm);
  EXPECT_FALSE(c.mamba_norm_before_gate);
  EXPECT_TRUE(c.use_bias);
  EXPECT_TRUE(c.mamba_out_proj_bias);
  EXPECT_EQ(parse_model_config(c.to_json()).to_json(), c.to_json());
}

TEST(FalconH1Config, RefusesWhatIsNotImplemented) {
  auto j = falcon_config();
  j["hidden_act"] = "gelu";
  expect_refused(j, {"hidden_act", "gelu", "silu"});
  j = falcon_config();
  j["rope_scaling"] = {{"rope_type", "yarn"}, {"factor", 4.0}};
  expect_refused(j, {"rope_scaling", "not supported"});
  j = falcon_config();
  j["rope_parameters"]["rope_type"] = "llama3";
  expect_refused(j, {"rope_type", "llama3"});
  j = falcon_config();
  j["sliding_window"] = 512;
  expect_refused(j, {"sliding_window", "512"});
  j = falcon_config();
  j["ssm_multipliers"] = {1.0, 2.0};
  expect_refused(j, {"ssm_multipliers", "5 numbers"});
  j = falcon_config();
  j["mlp_multipliers"] = {1.0, 2.0, 3.0};
  expect_refused(j, {"mlp_multipliers", "2 numbers"});
  j = falcon_config();
  j["mamba_d_head"] = 7;
  expect_refused(j, {"mamba_d_head", "7", "48"});
  j = falcon_config();
  j["mamba_n_groups"] = 4;
  expect_refused(j, {"mamba_n_groups", "4"});
  j = falcon_config();
  j["num_key_value_heads"] = 3;
  expect_refused(j, {"num_key_value_heads", "3"});
  j = falcon_config();
  j["layers_block_type"] = {"hybrid", "attention", "hybrid"};
  expect_refused(j, {"layers_block_type", "hybrid"});
  j = falcon_config();
  j["architectures"] = {"LlamaForCausalLM"};
  expect_refused(j, {"architectures", "FalconH1ForCausalLM"});
  j = falcon_config();
  j["lm_head_multiplier"] = 0;
  expect_refused(j, {"lm_head_multiplier"});
}

using test::all_logits;

// The three Mamba output forms of the fixtures, on random f32 weights.
std::vector<nlohmann::json> variants() {
  std::vector<nlohmann::json> out(3, falcon_config());
  out[1]["mamba_rms_norm"] = true;
  out[1]["mamba_norm_before_gate"] = true;
  out[1]["tie_word_embeddings"] = true;
  out[2]["mamba_rms_norm"] = true;
  out[2]["mamba_norm_before_gate"] = false;
  out[2]["attention_bias"] = true;
  out[2]["mlp_bias"] = true;
  out[2]["projectors_bias"] = true;
  out[2]["mamba_proj_bias"] = true;
  return out;
}

std::unique_ptr<Model> random_model(const nlohmann::json& j, int64_t max_batch_tokens = 2048, int64_t page = 5) {
  LoadOptions lo;
  lo.device = DeviceChoice::CPU;
  lo.threads = 1;
  lo.max_batch_tokens = max_batch_tokens;
  lo.kv_page_tokens = page;
  return Model::random(parse(j), lo, 7, DType::F32);
}

std::vector<int32_t> token_ids(int64_t n, int64_t vocab) {
  std::vector<int32_t> ids(static_cast<size_t>(n));
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<int32_t>((i * 37 + 11) % static_cast<size_t>(vocab));
  return ids;
}

TEST(FalconH1State, EveryLayerHoldsAMambaStateAndKvPages) {
  auto model = random_model(falcon_config());
  const ModelConfig& c = model->config();
  auto st = model->create_state(2);
  ASSERT_EQ(static_cast<int64_t>(st->layers().size()), 2 * c.n_layer);
  for (int64_t l = 0; l < c.n_layer; ++l) {
    const LayerCache& ssm = st->layers()[static_cast<size_t>(2 * l)];
    const LayerCache& kv = st->layers()[static_cast<size_t>(2 * l + 1)];
    EXPECT_EQ(ssm.kind, LayerCacheKind::Ssm);
    EXPECT_EQ(ssm.conv.dim(1), c.conv_channels());
    EXPECT_EQ(ssm.ssm.dim(1), c.n_heads);
    EXPECT_EQ(kv.kind, LayerCacheKind::Kv);
    EXPECT_EQ(kv.kv_dim, c.kv_dim());
  }
  EXPECT_EQ(st->kv_bytes_per_token(), static_cast<size_t>(c.n_layer * 2 * c.kv_dim()) * 4);
  const auto ids = token_ids(12, c.vocab_size);
  all_logits(*model, *st, ids, 1);
  EXPECT_EQ(st->tokens_held(1), 12);
  EXPECT_EQ(st->tokens_held(0), 0);
  EXPECT_EQ(st->snapshot(1).bytes(), st->slot_bytes() + 12 * st->kv_bytes_per_token());
}

TEST(FalconH1Model, AnySplitEqualsOnePass) {
  for (const auto& j : variants()) {
    SCOPED_TRACE(j.dump());
    for (auto [cap, page] : {std::pair<int64_t, int64_t>{2048, 64}, {7, 5}, {2048, 1}}) {
      auto model = random_model(j, cap, page);
      const auto ids = token_ids(41, model->config().vocab_size);
      auto st = model->create_state(1);
      const auto one = all_logits(*model, *st, ids);
      for (float v : one) ASSERT_TRUE(std::isfinite(v));
      std::mt19937_64 rng(11 + static_cast<uint64_t>(cap));
      auto st2 = model->create_state(1);
      std::vector<float> got;
      for (size_t at = 0; at < ids.size();) {
        const size_t n = std::min(ids.size() - at, static_cast<size_t>(std::uniform_int_distribution<int>(1, 11)(rng)));
        const auto part = all_logits(*model, *st2, std::span<const int32_t>(ids).subspan(at, n));
        got.insert(got.end(), part.begin(), part.end());
        at += n;
      }
      EXPECT_LE(test::max_rel_diff(got, one), kSelfTol) << "cap " << cap << ", page " << page;
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

TEST(FalconH1Model, BatchMemberEqualsItselfAlone) {
  for (const auto& j : variants()) {
    SCOPED_TRACE(j.dump());
    auto model = random_model(j, 16);
    const auto ids = token_ids(45, model->config().vocab_size);
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

TEST(FalconH1State, SnapshotCopySaveLoadReproduceASlot) {
  for (DType sd : {DType::F32, DType::BF16}) {
    SCOPED_TRACE(dtype_name(sd));
    auto model = random_model(variants()[1], 2048, 16);
    const auto ids = token_ids(60, model->config().vocab_size);
    const std::span<const int32_t> head = std::span<const int32_t>(ids).subspan(0, 37), tail = std::span<const int32_t>(ids).subspan(37);
    auto st = model->create_state(3, sd);
    all_logits(*model, *st, head, 0);
    const SlotSnapshot snap = st->snapshot(0);
    test::TempDir tmp;
    st->save(0, tmp.file("s.state"), std::vector<int32_t>(head.begin(), head.end()));
    const auto want = all_logits(*model, *st, tail, 0);
    st->copy(0, 1);
    st->restore(1, snap);
    EXPECT_EQ(st->tokens_held(1), static_cast<int64_t>(head.size()));
    EXPECT_LE(test::max_rel_diff(all_logits(*model, *st, tail, 1), want), 0.0) << "restore";
    auto other = model->create_state(2, sd);
    all_logits(*model, *other, ids, 1);
    EXPECT_EQ(other->load(1, tmp.file("s.state")), std::vector<int32_t>(head.begin(), head.end()));
    EXPECT_LE(test::max_rel_diff(all_logits(*model, *other, tail, 1), want), 0.0) << "state file";
    st->reset(0);
    auto fresh = model->create_state(1, sd);
    EXPECT_LE(test::max_rel_diff(all_logits(*model, *st, tail, 0), all_logits(*model, *fresh, tail)), 0.0) << "reset";
  }
}

// The engine over a parallel-layer model: batched, chunked prefill with state checkpoints, and prefix-cache hits all
// give the tokens of the request run alone.
TEST(FalconH1Model, EngineBatchedChunkedAndCachedEqualAlone) {
  auto model = random_model(variants()[2]);
  GenerateRequest r;
  r.prompt = token_ids(11, model->config().vocab_size);
  r.max_new_tokens = 16;
  r.sampling.temperature = 0.0f;
  r.ignore_eos = true;
  const auto want = test::run_alone(*model, r).tokens;
  ASSERT_EQ(want.size(), 16u);
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
}

// Each multiplier reaches the logits (a random model cannot say it is applied correctly; the fixtures do).
TEST(FalconH1Model, EveryMultiplierChangesTheLogits) {
  const auto base_json = variants()[1];
  auto base = random_model(base_json);
  const auto ids = token_ids(20, base->config().vocab_size);
  auto st = base->create_state(1);
  const auto want = all_logits(*base, *st, ids);
  for (const char* key : {"key_multiplier", "attention_in_multiplier", "attention_out_multiplier",
                          "ssm_in_multiplier", "ssm_out_multiplier", "embedding_multiplier", "lm_head_multiplier"}) {
    auto j = base_json;
    j[key] = j[key].get<double>() * 1.1;
    auto m = random_model(j);
    auto s = m->create_state(1);
    EXPECT_GT(test::max_rel_diff(all_logits(*m, *s, ids), want), 1e-4) << key;
  }
  for (int i = 0; i < 5; ++i) {
    auto j = base_json;
    j["ssm_multipliers"][i] = j["ssm_multipliers"][i].get<double>() * 1.1;
    auto m = random_model(j);
    auto s = m->create_state(1);
    EXPECT_GT(test::max_rel_diff(all_logits(*m, *s, ids), want), 1e-4) << "ssm_multipliers[" << i << "]";
  }
  for (int i = 0; i < 2; ++i) {
    auto j = base_json;
    j["mlp_multipliers"][i] = j["mlp_multipliers"][i].get<double>() * 1.1;
    auto m = random_model(j);
    auto s = m->create_state(1);
    EXPECT_GT(test::max_rel_diff(all_logits(*m, *s, ids), want), 1e-4) << "mlp_multipliers[" << i << "]";
  }
}

TEST(FalconH1Shapes, NamedShapes) {
  for (const char* n : {"falcon-h1-0.5b", "falcon-h1-7b"}) {
    const ModelConfig c = named_shape(n);
    EXPECT_NO_THROW(c.validate()) << n;
    EXPECT_EQ(c.family, Family::FalconH1) << n;
    EXPECT_EQ(c.layers, std::vector<LayerKind>(static_cast<size_t>(c.n_layer), LayerKind::ParallelHybrid)) << n;
    EXPECT_EQ(c.rope_dim, c.attn_head_dim) << n;
    EXPECT_EQ(parse_model_config(c.to_json()).to_json(), c.to_json()) << n;
  }
  const ModelConfig s = named_shape("falcon-h1-0.5b");
  EXPECT_EQ(s.d_inner, 1536);  // mamba_d_ssm != 2 * hidden
  EXPECT_EQ(s.q_dim(), 512);   // head_dim 64 x 8 heads != hidden 1024
  const ModelConfig b = named_shape("falcon-h1-7b");
  EXPECT_EQ(b.d_inner, b.d_model);
  EXPECT_EQ(b.n_layer, 44);
  EXPECT_EQ(b.kv_dim(), 256);
}

}  // namespace
}  // namespace mambacpp
