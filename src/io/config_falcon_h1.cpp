// config.json of Falcon-H1 as transformers 5.x writes it (FalconH1Config, "falcon_h1"), and the Falcon-H1 part of our
// canonical form. Defaults are FalconH1Config's. Every layer is one parallel layer (a Mamba-2 mixer and attention on
// the same normed input, then a gated SiLU MLP); the muP multipliers are kept as they are and applied by the layer
// recipe (src/model/falcon_h1_layer.cpp). What the forward pass does not implement is refused naming the key: other
// activations, RoPE scaling, sliding windows.
#include <cmath>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/json_limits.h"
#include "io/config_formats.h"
#include "io/config_hybrid_keys.h"
#include "io/config_reader.h"
#include "mambacpp/error.h"

namespace mambacpp {
namespace {

double finite_number(const ConfigReader& r, const std::string& key, double fallback) {
  const double v = r.number_or(key, fallback);
  if (!std::isfinite(v)) r.reject_value(key, nlohmann::json(v), "expected a finite number");
  return v;
}

// A list of exactly n finite numbers (absent or null: n ones, as FalconH1Config fills them in).
std::vector<double> multiplier_list(const ConfigReader& r, const std::string& key, size_t n) {
  const nlohmann::json* v = r.get(key);
  if (!v) return std::vector<double>(n, 1.0);
  if (!v->is_array() || v->size() != n)
    r.reject_value(key, *v, "expected a list of " + std::to_string(n) + " numbers");
  std::vector<double> out;
  for (const auto& x : *v) {
    if (!x.is_number() || !std::isfinite(x.get<double>()))
      r.reject_value(key, *v, "expected a list of " + std::to_string(n) + " finite numbers");
    out.push_back(x.get<double>());
  }
  return out;
}

// The Mamba-2 mixer's keys. d_inner is mamba_d_ssm: FalconH1Config's default 1024 when the key is absent,
// int(mamba_expand * hidden_size) when it is null (the 7B's is 3072 at hidden 3072, not 2 * hidden).
void read_falcon_mamba(const nlohmann::json& j, const ConfigReader& r, ModelConfig& c) {
  c.d_state = r.positive_int_or("mamba_d_state", 256);
  c.d_conv = r.positive_int_or("mamba_d_conv", 4);
  if (!j.contains("mamba_d_ssm")) {
    c.d_inner = 1024;
  } else if (r.has("mamba_d_ssm")) {
    c.d_inner = r.positive_int("mamba_d_ssm");
  } else {
    const double expand = r.number_or("mamba_expand", 2);
    const double inner = std::floor(expand * static_cast<double>(c.d_model));
    if (!(expand > 0) || inner < 1 || inner > static_cast<double>(kMaxConfigDim))
      r.reject_value("mamba_expand", nlohmann::json(expand),
                     "expected a positive expansion factor (mamba_d_ssm is null: d_inner = mamba_expand * hidden_size)");
    c.d_inner = static_cast<int64_t>(inner);
  }
  c.n_heads = r.positive_int_or("mamba_n_heads", 128);
  const nlohmann::json* d_head = r.get("mamba_d_head");
  if (!d_head || (d_head->is_string() && *d_head == "auto")) {
    if (c.d_inner % c.n_heads != 0)
      r.reject_value("mamba_n_heads", nlohmann::json(c.n_heads),
                     "does not divide the Mamba inner size (mamba_d_ssm) " + std::to_string(c.d_inner));
    c.head_dim = c.d_inner / c.n_heads;
  } else {
    c.head_dim = r.positive_int("mamba_d_head");
  }
  if (c.n_heads * c.head_dim != c.d_inner)
    r.reject_value("mamba_d_head", nlohmann::json(c.head_dim),
                   "mamba_n_heads * mamba_d_head must equal the Mamba inner size (mamba_d_ssm) " +
                       std::to_string(c.d_inner));
  c.n_groups = r.positive_int_or("mamba_n_groups", 1);
  if (c.n_heads % c.n_groups != 0)
    r.reject_value("mamba_n_groups", nlohmann::json(c.n_groups),
                   "mamba_n_heads = " + std::to_string(c.n_heads) + " is not a multiple of it");
  c.chunk_size = r.positive_int_or("mamba_chunk_size", 256);
  c.use_conv_bias = r.bool_or("mamba_conv_bias", true);
  c.use_bias = r.bool_or("mamba_proj_bias", false);          // in_proj
  c.mamba_out_proj_bias = r.bool_or("projectors_bias", false);  // out_proj
  read_dt_limit(r, "time_step_limit", c);
  c.mamba_rms_norm = r.bool_or("mamba_rms_norm", false);
  c.mamba_norm_before_gate = r.bool_or("mamba_norm_before_gate", true);
  c.gated_norm_groups = c.n_groups;  // FalconH1RMSNormGated(n_groups=mamba_n_groups): one RMS per group
  // mamba_use_mlp (written by TII's configs) has no effect in transformers: in_proj has no MLP slice there, and the
  // checkpoint's in_proj shape is checked against [z | xBC | dt] when the weights bind.
}

}  // namespace

ModelConfig parse_transformers_falcon_h1(const nlohmann::json& j, const std::string& source) {
  const ConfigReader r(j, source);
  check_architecture(r, "FalconH1ForCausalLM");
  ModelConfig c;
  c.family = Family::FalconH1;
  c.arch = Arch::Mamba2;
  c.d_model = r.positive_int("hidden_size");
  c.vocab_size = r.positive_int_or("vocab_size", 128000);
  c.tie_embeddings = r.bool_or("tie_word_embeddings", false);
  c.residual_in_fp32 = true;
  read_token_ids(r, c);
  c.n_layer = r.layer_count("num_hidden_layers");
  if (const nlohmann::json* list = r.get("layers_block_type")) {  // FalconH1Config: every entry "hybrid"
    if (!list->is_array() || static_cast<int64_t>(list->size()) != c.n_layer)
      r.reject_value("layers_block_type", *list,
                     "expected a list of num_hidden_layers = " + std::to_string(c.n_layer) + " entries \"hybrid\"");
    for (const auto& v : *list)
      if (v != "hybrid") r.reject_value("layers_block_type", *list, "every Falcon-H1 layer is \"hybrid\"");
  }
  c.layers.assign(static_cast<size_t>(c.n_layer), LayerKind::ParallelHybrid);
  c.norm_eps = positive_number(r, "rms_norm_eps", 1e-5);
  check_activation(r, "hidden_act", "silu", "silu");  // the Mamba conv's activation and the MLP's
  read_falcon_mamba(j, r, c);

  // Attention: LlamaAttention (head_dim from the key when given, else hidden_size / heads; scale head_dim^-0.5),
  // RoPE rotate-half over the whole head.
  read_attention(r, c, /*head_dim_key=*/true, 32, 8, 0);
  c.attn_bias = r.bool_or("attention_bias", false);
  read_rope(r, c, 1.0);
  c.max_position = r.positive_int_or("max_position_embeddings", 8192);

  // MLP: LlamaMLP (gate, up, down; biases per mlp_bias).
  c.mlp_size = r.positive_int_or("intermediate_size", 14336);
  c.mlp_act = MlpAct::SiluGated;
  c.mlp_bias = r.bool_or("mlp_bias", false);

  // muP multipliers.
  c.embedding_multiplier = nonzero_number(r, "embedding_multiplier", 1.0);
  c.logits_scaling = 1.0 / nonzero_number(r, "lm_head_multiplier", 1.0);
  c.key_multiplier = finite_number(r, "key_multiplier", 1.0);
  c.attn_in_multiplier = finite_number(r, "attention_in_multiplier", 1.0);
  c.attn_out_multiplier = finite_number(r, "attention_out_multiplier", 1.0);
  c.ssm_in_multiplier = finite_number(r, "ssm_in_multiplier", 1.0);
  c.ssm_out_multiplier = finite_number(r, "ssm_out_multiplier", 1.0);
  c.ssm_multipliers = multiplier_list(r, "ssm_multipliers", 5);
  const std::vector<double> mlp = multiplier_list(r, "mlp_multipliers", 2);
  c.mlp_gate_multiplier = mlp[0];
  c.mlp_down_multiplier = mlp[1];
  return c;
}

std::string falcon_h1_canonical_json(const ModelConfig& c) {
  nlohmann::ordered_json j;
  j["key_multiplier"] = c.key_multiplier;
  j["attn_in_multiplier"] = c.attn_in_multiplier;
  j["attn_out_multiplier"] = c.attn_out_multiplier;
  j["ssm_in_multiplier"] = c.ssm_in_multiplier;
  j["ssm_out_multiplier"] = c.ssm_out_multiplier;
  j["ssm_multipliers"] = c.ssm_multipliers.empty() ? std::vector<double>(5, 1.0) : c.ssm_multipliers;
  j["mlp_gate_multiplier"] = c.mlp_gate_multiplier;
  j["mlp_down_multiplier"] = c.mlp_down_multiplier;
  j["mamba_rms_norm"] = c.mamba_rms_norm;
  j["mamba_norm_before_gate"] = c.mamba_norm_before_gate;
  j["mamba_out_proj_bias"] = c.mamba_out_proj_bias;
  return j.dump();
}

void parse_canonical_falcon_h1(const nlohmann::json& j, const std::string& source, ModelConfig& c) {
  const nlohmann::json* f = j.contains("falcon_h1") ? &j["falcon_h1"] : nullptr;
  if (!f || !f->is_object()) fail(source, ": falcon_h1: expected an object with the Falcon-H1 multipliers");
  const ConfigReader r(*f, source, "falcon_h1.");
  c.key_multiplier = finite_number(r, "key_multiplier", 1.0);
  c.attn_in_multiplier = finite_number(r, "attn_in_multiplier", 1.0);
  c.attn_out_multiplier = finite_number(r, "attn_out_multiplier", 1.0);
  c.ssm_in_multiplier = finite_number(r, "ssm_in_multiplier", 1.0);
  c.ssm_out_multiplier = finite_number(r, "ssm_out_multiplier", 1.0);
  c.ssm_multipliers = multiplier_list(r, "ssm_multipliers", 5);
  c.mlp_gate_multiplier = finite_number(r, "mlp_gate_multiplier", 1.0);
  c.mlp_down_multiplier = finite_number(r, "mlp_down_multiplier", 1.0);
  c.mamba_rms_norm = r.bool_or("mamba_rms_norm", true);
  c.mamba_norm_before_gate = r.bool_or("mamba_norm_before_gate", false);
  c.mamba_out_proj_bias = r.bool_or("mamba_out_proj_bias", false);
}

void validate_falcon_h1(const ModelConfig& c) {
  for (LayerKind k : c.layers)
    if (k != LayerKind::ParallelHybrid)
      fail("model config: falcon_h1 layers are all \"parallel\", found ", layer_kind_name(k));
  if (c.mlp_act != MlpAct::SiluGated) fail("model config: falcon_h1 takes the gated SiLU MLP");
  if (!c.ssm_multipliers.empty() && c.ssm_multipliers.size() != 5)
    fail("model config: ssm_multipliers has ", c.ssm_multipliers.size(), " values, expected 5 ([z | x | B | C | dt])");
  for (double m : c.ssm_multipliers)
    if (!std::isfinite(m)) fail("model config: ssm_multipliers holds ", m, ", expected finite values");
  for (double m : {c.key_multiplier, c.attn_in_multiplier, c.attn_out_multiplier, c.ssm_in_multiplier,
                   c.ssm_out_multiplier, c.mlp_gate_multiplier, c.mlp_down_multiplier})
    if (!std::isfinite(m)) fail("model config: falcon_h1 multiplier ", m, ", expected a finite number");
  if (c.mamba_rms_norm && c.d_inner % c.norm_groups() != 0)
    fail("model config: d_inner = ", c.d_inner, " is not a multiple of the gated norm's ", c.norm_groups(), " groups");
}

}  // namespace mambacpp
