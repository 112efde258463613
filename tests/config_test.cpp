// config.json parsing: transformers Mamba-1/Mamba-2, mamba_ssm, and our canonical form; defaults, "auto" dt rank,
// the non-finite float spellings, strings that only look like them, and every rejection with its message.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "support/test_support.h"

#include <cmath>
#include <functional>
#include <limits>
#include <string>

#include "io/json_relaxed.h"
#include "mambacpp/config.h"
#include "mambacpp/error.h"

namespace mambacpp {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

constexpr double kInf = std::numeric_limits<double>::infinity();

using test::error_of;

std::string parse_error(const std::string& text) {
  return error_of([&] { parse_model_config(text, "/models/m/config.json"); });
}

// Every field, so that a round trip or a comparison cannot miss one.
void expect_same(const ModelConfig& a, const ModelConfig& b) {
  EXPECT_EQ(a.arch, b.arch);
  EXPECT_EQ(a.d_model, b.d_model);
  EXPECT_EQ(a.n_layer, b.n_layer);
  EXPECT_EQ(a.vocab_size, b.vocab_size);
  EXPECT_EQ(a.d_state, b.d_state);
  EXPECT_EQ(a.d_conv, b.d_conv);
  EXPECT_EQ(a.d_inner, b.d_inner);
  EXPECT_EQ(a.norm_eps, b.norm_eps);
  EXPECT_EQ(a.use_bias, b.use_bias);
  EXPECT_EQ(a.use_conv_bias, b.use_conv_bias);
  EXPECT_EQ(a.residual_in_fp32, b.residual_in_fp32);
  EXPECT_EQ(a.tie_embeddings, b.tie_embeddings);
  EXPECT_EQ(a.dt_rank, b.dt_rank);
  EXPECT_EQ(a.n_heads, b.n_heads);
  EXPECT_EQ(a.head_dim, b.head_dim);
  EXPECT_EQ(a.n_groups, b.n_groups);
  EXPECT_EQ(a.chunk_size, b.chunk_size);
  EXPECT_EQ(a.dt_min, b.dt_min);
  EXPECT_EQ(a.dt_max, b.dt_max);
  EXPECT_EQ(a.bos_token_id, b.bos_token_id);
  EXPECT_EQ(a.eos_token_id, b.eos_token_id);
  EXPECT_EQ(a.pad_token_id, b.pad_token_id);
}

void expect_round_trip(const ModelConfig& c) {
  const std::string canonical = c.to_json();
  EXPECT_THAT(canonical, HasSubstr("\"mambacpp_config\": 1"));
  expect_same(parse_model_config(canonical, "state.json"), c);
}

// The config.json of state-spaces/mamba-130m-hf (transformers format).
const char* kMamba130mHf = R"json({
  "architectures": ["MambaForCausalLM"], "bos_token_id": 0, "conv_kernel": 4, "eos_token_id": 0, "expand": 2,
  "hidden_act": "silu", "hidden_size": 768, "initializer_range": 0.1, "intermediate_size": 1536,
  "layer_norm_epsilon": 1e-05, "model_type": "mamba", "n_layer": 24, "num_hidden_layers": 24, "pad_token_id": 0,
  "rescale_prenorm_residual": false, "residual_in_fp32": true, "state_size": 16, "time_step_floor": 0.0001,
  "time_step_init_scheme": "random", "time_step_max": 0.1, "time_step_min": 0.001, "time_step_rank": 48,
  "time_step_scale": 1.0, "torch_dtype": "float32", "use_bias": false, "use_cache": true, "use_conv_bias": true,
  "vocab_size": 50280})json";

// A transformers Mamba-2 config in the shape of mistralai/Mamba-Codestral-7B-v0.1; LIMIT is the time_step_limit.
std::string mamba2_hf(const std::string& limit, const std::string& extra = "") {
  return R"json({"architectures": ["Mamba2ForCausalLM"], "bos_token_id": 0, "chunk_size": 256, "conv_kernel": 4,
    "eos_token_id": 0, "expand": 2, "head_dim": 64, "hidden_act": "silu", "hidden_size": 4096,
    "layer_norm_epsilon": 1e-05, "model_type": "mamba2", "n_groups": 8, "num_heads": 128,
    "num_hidden_layers": 64, "pad_token_id": 0, "residual_in_fp32": true, "rms_norm": true, "state_size": 128,
    "tie_word_embeddings": false, "time_step_floor": 0.0001, "time_step_max": 0.1, "time_step_min": 0.001,
    "time_step_rank": 256, "use_bias": false, "use_cache": true, "use_conv_bias": true, "vocab_size": 32768,)json" +
         extra + R"json( "time_step_limit": )json" + limit + "}";
}

TEST(ConfigTransformersMamba1, ReleasedConfig) {
  const ModelConfig c = parse_model_config(kMamba130mHf);
  EXPECT_EQ(c.arch, Arch::Mamba1);
  EXPECT_EQ(c.d_model, 768);
  EXPECT_EQ(c.n_layer, 24);
  EXPECT_EQ(c.vocab_size, 50280);
  EXPECT_EQ(c.d_state, 16);
  EXPECT_EQ(c.d_conv, 4);
  EXPECT_EQ(c.d_inner, 1536);
  EXPECT_EQ(c.dt_rank, 48);
  EXPECT_DOUBLE_EQ(c.norm_eps, 1e-5);
  EXPECT_FALSE(c.use_bias);
  EXPECT_TRUE(c.use_conv_bias);
  EXPECT_TRUE(c.residual_in_fp32);
  EXPECT_TRUE(c.tie_embeddings);  // absent: PretrainedConfig's default
  EXPECT_EQ(c.bos_token_id, 0);
  EXPECT_EQ(c.eos_token_id, 0);
  EXPECT_EQ(c.pad_token_id, 0);
  EXPECT_EQ(c.conv_channels(), 1536);
  EXPECT_EQ(c.in_proj_size(), 3072);
  expect_round_trip(c);
}

TEST(ConfigTransformersMamba1, DefaultsAreMambaConfigs) {
  const ModelConfig c =
      parse_model_config(R"({"model_type": "mamba", "hidden_size": 64, "num_hidden_layers": 2, "vocab_size": 100})");
  EXPECT_EQ(c.d_state, 16);
  EXPECT_EQ(c.d_conv, 4);
  EXPECT_EQ(c.d_inner, 128);  // expand 2
  EXPECT_EQ(c.dt_rank, 4);    // "auto": ceil(64 / 16)
  EXPECT_FALSE(c.use_bias);
  EXPECT_TRUE(c.use_conv_bias);
  EXPECT_TRUE(c.residual_in_fp32);
  EXPECT_TRUE(c.tie_embeddings);
  EXPECT_DOUBLE_EQ(c.norm_eps, 1e-5);
  EXPECT_EQ(c.bos_token_id, -1);
  EXPECT_EQ(c.eos_token_id, -1);
  EXPECT_EQ(c.pad_token_id, -1);
}

TEST(ConfigTransformersMamba1, AutoDtRankRoundsUp) {
  const ModelConfig c = parse_model_config(
      R"({"model_type": "mamba", "hidden_size": 100, "num_hidden_layers": 1, "vocab_size": 10,
          "time_step_rank": "auto"})");
  EXPECT_EQ(c.dt_rank, 7);  // ceil(100 / 16) = ceil(6.25)
  const ModelConfig d = parse_model_config(
      R"({"model_type": "mamba", "hidden_size": 96, "num_hidden_layers": 1, "vocab_size": 10, "expand": 2.0,
          "time_step_rank": 5, "tie_word_embeddings": false, "eos_token_id": [7, 8], "pad_token_id": null})");
  EXPECT_EQ(d.dt_rank, 5);
  EXPECT_EQ(d.d_inner, 192);  // a float expand still gives an exact size
  EXPECT_FALSE(d.tie_embeddings);
  EXPECT_EQ(d.eos_token_id, 7);   // a list: the first entry, the rest stop generation too
  EXPECT_EQ(d.extra_eos_token_ids, std::vector<int64_t>{8});
  EXPECT_EQ(parse_model_config(d.to_json()).extra_eos_token_ids, std::vector<int64_t>{8});  // canonical round trip
  EXPECT_THAT(error_of([] {
                parse_model_config(R"({"model_type": "mamba", "hidden_size": 96, "num_hidden_layers": 1,
                                       "vocab_size": 10, "eos_token_id": [7, -1]})");
              }),
              HasSubstr("expected a list of token ids >= 0"));
  EXPECT_EQ(d.pad_token_id, -1);  // null: none
}

TEST(ConfigTransformersMamba2, BareInfinityLimit) {
  const ModelConfig c = parse_model_config(mamba2_hf("[0.0, Infinity]"));
  EXPECT_EQ(c.arch, Arch::Mamba2);
  EXPECT_EQ(c.d_model, 4096);
  EXPECT_EQ(c.n_layer, 64);
  EXPECT_EQ(c.vocab_size, 32768);
  EXPECT_EQ(c.d_state, 128);
  EXPECT_EQ(c.d_inner, 8192);
  EXPECT_EQ(c.n_heads, 128);
  EXPECT_EQ(c.head_dim, 64);
  EXPECT_EQ(c.n_groups, 8);
  EXPECT_EQ(c.chunk_size, 256);
  EXPECT_FALSE(c.tie_embeddings);
  EXPECT_EQ(c.dt_min, 0.0);
  EXPECT_EQ(c.dt_max, kInf);
  EXPECT_EQ(c.conv_channels(), 8192 + 2 * 8 * 128);
  EXPECT_EQ(c.in_proj_size(), 2 * 8192 + 2 * 8 * 128 + 128);
  expect_round_trip(c);
}

TEST(ConfigTransformersMamba2, FloatObjectLimitAndFiniteLimit) {
  const ModelConfig a = parse_model_config(mamba2_hf(R"([0.0, {"__float__": "Infinity"}])"));
  EXPECT_EQ(a.dt_max, kInf);
  const ModelConfig b = parse_model_config(mamba2_hf("[0.001, 0.1]", R"( "norm_before_gate": false,)"));
  EXPECT_DOUBLE_EQ(b.dt_min, 0.001);
  EXPECT_DOUBLE_EQ(b.dt_max, 0.1);
  expect_round_trip(b);
}

TEST(ConfigTransformersMamba2, DefaultsAreMamba2Configs) {
  const ModelConfig c = parse_model_config(
      R"({"model_type": "mamba2", "hidden_size": 64, "num_hidden_layers": 2, "vocab_size": 100, "num_heads": 2,
          "n_groups": 1})");
  EXPECT_EQ(c.head_dim, 64);
  EXPECT_EQ(c.d_inner, 128);
  EXPECT_EQ(c.d_state, 128);
  EXPECT_EQ(c.d_conv, 4);
  EXPECT_EQ(c.chunk_size, 256);
  EXPECT_FALSE(c.use_bias);
  EXPECT_TRUE(c.use_conv_bias);
  EXPECT_FALSE(c.tie_embeddings);  // Mamba2Config's default, unlike Mamba-1
  EXPECT_EQ(c.dt_min, 0.0);
  EXPECT_EQ(c.dt_max, kInf);
  EXPECT_EQ(c.dt_rank, 0);
  expect_round_trip(c);
}

TEST(ConfigStrings, WordsInsideStringsAreLeftAlone) {
  const std::string text =
      R"({"_name_or_path": "InfinityNet", "note": "NaN handling, -Infinity and \"Infinity\" \\", "Infinity": "NaN",
          "model_type": "mamba", "hidden_size": 32, "num_hidden_layers": 1, "vocab_size": 8, "x": [NaN, -Infinity]})";
  const nlohmann::json j = parse_json_relaxed(text, "config.json");
  EXPECT_EQ(j["_name_or_path"], "InfinityNet");
  EXPECT_EQ(j["note"], "NaN handling, -Infinity and \"Infinity\" \\");
  EXPECT_EQ(j["Infinity"], "NaN");
  ASSERT_TRUE(j["x"][0].is_number_float());
  EXPECT_TRUE(std::isnan(j["x"][0].get<double>()));
  EXPECT_EQ(j["x"][1].get<double>(), -kInf);
  EXPECT_EQ(parse_model_config(text).d_model, 32);
}

TEST(ConfigStrings, FloatObjectsEverywhere) {
  const nlohmann::json j = parse_json_relaxed(
      R"({"a": {"__float__": "-Infinity"}, "b": [{"__float__": "NaN"}], "c": {"__float__": "Infinity", "d": 1}})",
      "x.json");
  EXPECT_EQ(j["a"].get<double>(), -kInf);
  EXPECT_TRUE(std::isnan(j["b"][0].get<double>()));
  EXPECT_TRUE(j["c"].is_object());  // two keys: an ordinary object
  EXPECT_THAT(error_of([] { parse_json_relaxed(R"({"a": {"__float__": "Infinityy"}})", "x.json"); }),
              AllOf(HasSubstr("x.json"), HasSubstr("Infinityy")));
}

TEST(ConfigStrings, MalformedJsonNamesFileAndOriginalByte) {
  const std::string plain = R"({"a": 1,, "b": 2})";
  EXPECT_THAT(error_of([&] { parse_json_relaxed(plain, "/m/config.json"); }),
              AllOf(HasSubstr("/m/config.json"), HasSubstr("byte " + std::to_string(plain.find(",,") + 1))));
  // After a rewritten Infinity the position must still count bytes of the caller's text.
  const std::string after = R"({"x": Infinity, "y": NaN, "z": })";
  EXPECT_THAT(error_of([&] { parse_json_relaxed(after, "/m/config.json"); }),
              HasSubstr("byte " + std::to_string(after.rfind('}'))));
  EXPECT_THAT(parse_error("{\"model_type\": \"mamba\""), AllOf(HasSubstr("/models/m/config.json"), HasSubstr("byte")));
  EXPECT_THAT(parse_error("[1, 2]"), HasSubstr("expected a JSON object"));
}

// mamba_ssm's config.json of state-spaces/mamba-130m.
TEST(ConfigMambaSsm, Mamba1PadsVocab) {
  const ModelConfig c = parse_model_config(
      R"({"d_model": 768, "n_layer": 24, "vocab_size": 50277, "ssm_cfg": {}, "rms_norm": true,
          "residual_in_fp32": true, "fused_add_norm": true, "pad_vocab_size_multiple": 8})");
  EXPECT_EQ(c.arch, Arch::Mamba1);
  EXPECT_EQ(c.vocab_size, 50280);  // rounded up to a multiple of 8
  EXPECT_EQ(c.d_inner, 1536);
  EXPECT_EQ(c.d_state, 16);
  EXPECT_EQ(c.d_conv, 4);
  EXPECT_EQ(c.dt_rank, 48);
  EXPECT_FALSE(c.use_bias);
  EXPECT_TRUE(c.use_conv_bias);
  EXPECT_TRUE(c.tie_embeddings);
  EXPECT_DOUBLE_EQ(c.norm_eps, 1e-5);
  expect_round_trip(c);
}

// mamba_ssm's config.json of state-spaces/mamba2-130m.
TEST(ConfigMambaSsm, Mamba2Defaults) {
  const ModelConfig c = parse_model_config(
      R"({"d_model": 768, "d_intermediate": 0, "n_layer": 24, "vocab_size": 50277, "ssm_cfg": {"layer": "Mamba2"},
          "attn_layer_idx": [], "attn_cfg": {}, "rms_norm": true, "residual_in_fp32": true, "fused_add_norm": true,
          "pad_vocab_size_multiple": 16, "tie_embeddings": true})");
  EXPECT_EQ(c.arch, Arch::Mamba2);
  EXPECT_EQ(c.vocab_size, 50288);
  EXPECT_EQ(c.d_inner, 1536);
  EXPECT_EQ(c.d_state, 128);
  EXPECT_EQ(c.head_dim, 64);
  EXPECT_EQ(c.n_heads, 24);
  EXPECT_EQ(c.n_groups, 1);
  EXPECT_EQ(c.chunk_size, 256);
  EXPECT_EQ(c.dt_min, 0.0);
  EXPECT_EQ(c.dt_max, kInf);
  expect_round_trip(c);
}

TEST(ConfigMambaSsm, Mamba2ExplicitCfg) {
  const ModelConfig c = parse_model_config(
      R"({"d_model": 256, "n_layer": 4, "vocab_size": 1000, "pad_vocab_size_multiple": 1, "tie_embeddings": false,
          "ssm_cfg": {"layer": "Mamba2", "d_state": 64, "d_conv": 3, "expand": 2, "headdim": 32, "ngroups": 4,
                      "chunk_size": 128, "d_ssm": 512, "bias": true, "conv_bias": false, "rmsnorm": true,
                      "norm_before_gate": false, "D_has_hdim": false, "dt_min": 0.001, "dt_max": 0.1,
                      "dt_limit": [0.0001, Infinity]}})");
  EXPECT_EQ(c.vocab_size, 1000);
  EXPECT_EQ(c.n_heads, 16);
  EXPECT_EQ(c.head_dim, 32);
  EXPECT_EQ(c.n_groups, 4);
  EXPECT_EQ(c.d_state, 64);
  EXPECT_EQ(c.d_conv, 3);
  EXPECT_EQ(c.chunk_size, 128);
  EXPECT_TRUE(c.use_bias);
  EXPECT_FALSE(c.use_conv_bias);
  EXPECT_FALSE(c.tie_embeddings);
  EXPECT_DOUBLE_EQ(c.dt_min, 0.0001);  // dt_limit, not the init-only dt_min
  EXPECT_EQ(c.dt_max, kInf);
}

TEST(ConfigRejects, UnknownFormatsAndArchitectures) {
  EXPECT_THAT(parse_error(R"({"model_type": "zamba2", "hidden_size": 8})"),  // (jamba loads since issue 48)
              AllOf(HasSubstr("/models/m/config.json"), HasSubstr("model_type"), HasSubstr("zamba2"),
                    HasSubstr("\"mamba\""), HasSubstr("\"mamba2\""), HasSubstr("\"falcon_mamba\"")));
  EXPECT_THAT(parse_error(R"({"model_type": "mamba", "architectures": ["FalconMambaForCausalLM"],
                              "hidden_size": 8, "num_hidden_layers": 1, "vocab_size": 4})"),
              AllOf(HasSubstr("architectures"), HasSubstr("FalconMambaForCausalLM"), HasSubstr("MambaForCausalLM")));
  EXPECT_THAT(parse_error(R"({"hidden": 8})"), AllOf(HasSubstr("not a recognised Mamba config"),
                                                     HasSubstr("model_type"), HasSubstr("d_model")));
  EXPECT_THAT(parse_error(R"({"model_type": "mamba", "hidden_act": "gelu", "hidden_size": 8,
                              "num_hidden_layers": 1, "vocab_size": 4})"),
              AllOf(HasSubstr("hidden_act"), HasSubstr("gelu"), HasSubstr("silu")));
}

TEST(ConfigRejects, MissingAndNonPositiveSizes) {
  EXPECT_THAT(parse_error(R"({"model_type": "mamba", "num_hidden_layers": 1, "vocab_size": 4})"),
              AllOf(HasSubstr("hidden_size"), HasSubstr("missing")));
  EXPECT_THAT(parse_error(R"({"d_model": 8, "vocab_size": 4})"), AllOf(HasSubstr("n_layer"), HasSubstr("missing")));
  EXPECT_THAT(parse_error(R"({"model_type": "mamba", "hidden_size": 0, "num_hidden_layers": 1, "vocab_size": 4})"),
              AllOf(HasSubstr("hidden_size = 0"), HasSubstr("positive")));
  EXPECT_THAT(parse_error(R"({"model_type": "mamba", "hidden_size": 8, "num_hidden_layers": 1, "vocab_size": 4,
                              "state_size": -4})"),
              AllOf(HasSubstr("state_size = -4"), HasSubstr("positive")));
  // Absurd sizes are refused before any size arithmetic can overflow.
  EXPECT_THAT(parse_error(R"({"model_type": "mamba", "hidden_size": 1000000000000, "num_hidden_layers": 1,
                              "vocab_size": 4})"),
              AllOf(HasSubstr("hidden_size = 1000000000000"), HasSubstr("at most 2^30")));
  EXPECT_THAT(parse_error(R"({"model_type": "mamba", "hidden_size": 1073741824, "num_hidden_layers": 1,
                              "vocab_size": 4})"),
              AllOf(HasSubstr("expand"), HasSubstr("at most 2^30")));
  EXPECT_THAT(parse_error(R"({"model_type": "mamba", "hidden_size": 8, "num_hidden_layers": 1.5, "vocab_size": 4})"),
              AllOf(HasSubstr("num_hidden_layers = 1.5"), HasSubstr("integer")));
  EXPECT_THAT(parse_error(R"({"model_type": "mamba", "hidden_size": 8, "num_hidden_layers": 1, "vocab_size": 4,
                              "expand": 0})"),
              AllOf(HasSubstr("expand"), HasSubstr("positive")));
  EXPECT_THAT(parse_error(R"({"d_model": 8, "n_layer": 1, "vocab_size": 4, "ssm_cfg": {"d_state": 0}})"),
              AllOf(HasSubstr("ssm_cfg.d_state = 0"), HasSubstr("positive")));
  EXPECT_THAT(parse_error(R"({"model_type": "mamba", "hidden_size": 8, "num_hidden_layers": 1, "vocab_size": 4,
                              "use_bias": "yes"})"),
              AllOf(HasSubstr("use_bias"), HasSubstr("true or false")));
}

TEST(ConfigRejects, Mamba1Inconsistencies) {
  EXPECT_THAT(parse_error(R"({"model_type": "mamba", "hidden_size": 8, "num_hidden_layers": 1, "vocab_size": 4,
                              "intermediate_size": 20})"),
              AllOf(HasSubstr("intermediate_size = 20"), HasSubstr("expand * hidden_size = 16")));
  EXPECT_THAT(parse_error(R"({"model_type": "mamba", "hidden_size": 8, "num_hidden_layers": 1, "vocab_size": 4,
                              "time_step_rank": "full"})"),
              AllOf(HasSubstr("time_step_rank"), HasSubstr("full"), HasSubstr("\"auto\"")));
}

TEST(ConfigRejects, Mamba2Variants) {
  EXPECT_THAT(parse_error(mamba2_hf("[0.0, Infinity]", R"( "rms_norm": false,)")),
              AllOf(HasSubstr("rms_norm = false"), HasSubstr("only the gated RMSNorm")));
  EXPECT_THAT(parse_error(mamba2_hf("[0.0, Infinity]", R"( "norm_before_gate": true,)")),
              AllOf(HasSubstr("norm_before_gate = true"), HasSubstr("norm_before_gate = false")));
  EXPECT_THAT(parse_error(mamba2_hf("[0.0, Infinity]", R"( "head_dim": 32,)")),
              AllOf(HasSubstr("num_heads * head_dim = 128 * 32 = 4096"), HasSubstr("expand * hidden_size = 8192")));
  EXPECT_THAT(parse_error(mamba2_hf("[0.0, Infinity]", R"( "n_groups": 3,)")),
              AllOf(HasSubstr("num_heads = 128"), HasSubstr("not a multiple of n_groups = 3")));
  EXPECT_THAT(parse_error(mamba2_hf("[0.1, 0.01]")), AllOf(HasSubstr("time_step_limit"), HasSubstr("lo <= hi")));
  EXPECT_THAT(parse_error(mamba2_hf("[NaN, 1.0]")), HasSubstr("time_step_limit"));
  EXPECT_THAT(parse_error(mamba2_hf("[-Infinity, 1.0]")), HasSubstr("time_step_limit"));
  EXPECT_THAT(parse_error(mamba2_hf("[0.0]")), AllOf(HasSubstr("time_step_limit"), HasSubstr("[lo, hi]")));
}

TEST(ConfigRejects, MambaSsmVariants) {
  const std::string head = R"({"d_model": 768, "n_layer": 2, "vocab_size": 100, )";
  EXPECT_THAT(parse_error(head + R"("ssm_cfg": {"layer": "Mamba2", "D_has_hdim": true}})"),
              AllOf(HasSubstr("ssm_cfg.D_has_hdim = true"), HasSubstr("D_has_hdim = false")));
  EXPECT_THAT(parse_error(head + R"("ssm_cfg": {"layer": "Mamba2", "norm_before_gate": true}})"),
              HasSubstr("ssm_cfg.norm_before_gate = true"));
  EXPECT_THAT(parse_error(head + R"("ssm_cfg": {"layer": "Mamba2", "rmsnorm": false}})"),
              HasSubstr("ssm_cfg.rmsnorm = false"));
  EXPECT_THAT(parse_error(head + R"("ssm_cfg": {"layer": "Mamba2", "d_ssm": 1024}})"),
              AllOf(HasSubstr("ssm_cfg.d_ssm = 1024"), HasSubstr("1536"), HasSubstr("not supported")));
  EXPECT_THAT(parse_error(head + R"("ssm_cfg": {"layer": "Mamba2", "headdim": 100}})"),
              AllOf(HasSubstr("ssm_cfg.headdim = 100"), HasSubstr("d_inner = 1536")));
  EXPECT_THAT(parse_error(head + R"("ssm_cfg": {"layer": "Mamba2", "ngroups": 5}})"),
              AllOf(HasSubstr("nheads = 24"), HasSubstr("not a multiple of ngroups = 5")));
  EXPECT_THAT(parse_error(head + R"("ssm_cfg": {"layer": "Mamba3"}})"),
              AllOf(HasSubstr("ssm_cfg.layer = \"Mamba3\""), HasSubstr("\"Mamba1\" and \"Mamba2\"")));
  EXPECT_THAT(parse_error(head + R"("attn_layer_idx": [1], "attn_cfg": {"num_heads": 12}})"),
              AllOf(HasSubstr("attn_layer_idx = [1]"), HasSubstr("not yet supported")));
  EXPECT_THAT(parse_error(head + R"("d_intermediate": 3072})"),
              AllOf(HasSubstr("d_intermediate = 3072"), HasSubstr("not yet supported")));
  EXPECT_THAT(parse_error(head + R"("rms_norm": false})"), AllOf(HasSubstr("rms_norm = false"), HasSubstr("LayerNorm")));
  EXPECT_THAT(parse_error(head + R"("pad_vocab_size_multiple": 0})"),
              AllOf(HasSubstr("pad_vocab_size_multiple = 0"), HasSubstr("positive")));
}

TEST(ConfigCanonical, RejectsOtherVersionsAndMissingFields) {
  ModelConfig c = parse_model_config(kMamba130mHf);
  nlohmann::json j = nlohmann::json::parse(c.to_json());
  j["mambacpp_config"] = 2;
  EXPECT_THAT(parse_error(j.dump()), AllOf(HasSubstr("mambacpp_config = 2"), HasSubstr("version 1")));
  j["mambacpp_config"] = 1;
  j.erase("d_state");
  EXPECT_THAT(parse_error(j.dump()), AllOf(HasSubstr("d_state"), HasSubstr("missing")));
}

TEST(ConfigValidate, NamesTheInconsistentField) {
  ModelConfig c = parse_model_config(mamba2_hf("[0.0, Infinity]"));
  c.validate();
  ModelConfig bad = c;
  bad.head_dim = 32;
  EXPECT_THAT(error_of([&] { bad.validate(); }), AllOf(HasSubstr("n_heads * head_dim"), HasSubstr("d_inner = 8192")));
  bad = c;
  bad.n_groups = 3;
  EXPECT_THAT(error_of([&] { bad.validate(); }), HasSubstr("n_groups = 3"));
  bad = c;
  bad.dt_max = std::nan("");
  EXPECT_THAT(error_of([&] { bad.validate(); }), HasSubstr("dt limit"));
  bad = c;
  bad.vocab_size = 0;
  EXPECT_THAT(error_of([&] { bad.validate(); }), HasSubstr("vocab_size = 0"));
  ModelConfig m1 = parse_model_config(kMamba130mHf);
  m1.d_state = int64_t{1} << 40;
  EXPECT_THAT(error_of([&] { m1.validate(); }), HasSubstr("d_state = 1099511627776"));
  m1.d_state = 16;
  m1.dt_rank = 0;
  EXPECT_THAT(error_of([&] { m1.validate(); }), HasSubstr("dt_rank = 0"));
  EXPECT_STREQ(arch_name(Arch::Mamba1), "mamba");
  EXPECT_STREQ(arch_name(Arch::Mamba2), "mamba2");
}

}  // namespace
}  // namespace mambacpp
