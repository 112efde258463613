// ModelConfig: detection of the config.json dialect, the canonical JSON form (what state files embed and compare),
// and the consistency checks every parsed config goes through.
#include "mambacpp/config.h"

#include <cmath>
#include <cstdint>

#include <nlohmann/json.hpp>

#include "io/config_formats.h"
#include "io/config_reader.h"
#include "io/json_relaxed.h"
#include "mambacpp/error.h"
#include "core/json_limits.h"

namespace mambacpp {
namespace {

// JSON has no inf/nan; write them the way transformers 5 does, which parse_json_relaxed reads back.
nlohmann::ordered_json float_json(double x) {
  if (std::isfinite(x)) return x;
  return {{"__float__", std::isnan(x) ? "NaN" : (x > 0 ? "Infinity" : "-Infinity")}};
}

void require(bool ok, const char* field, int64_t value, const char* expected) {
  if (!ok) fail("model config: ", field, " = ", value, ", expected ", expected);
}

// Positive and small enough that products of two sizes cannot overflow (the derived sizes multiply them).
void require_size(const char* field, int64_t value) {
  require(value > 0 && value <= kMaxConfigDim, field, value, "in [1, 2^30]");
}

}  // namespace

const char* arch_name(Arch a) { return a == Arch::Mamba1 ? "mamba" : "mamba2"; }

const char* family_name(Family f) {
  switch (f) {
    case Family::Mamba: return "mamba";
    case Family::NemotronH: return "nemotron_h";
    case Family::GraniteHybrid: return "granitemoehybrid";
    case Family::Bamba: return "bamba";
    case Family::FalconH1: return "falcon_h1";
    case Family::Jamba: return "jamba";
  }
  return "?";
}

const char* layer_kind_name(LayerKind k) {
  switch (k) {
    case LayerKind::Mamba1: return "mamba1";
    case LayerKind::Mamba2: return "mamba2";
    case LayerKind::Attention: return "attention";
    case LayerKind::MLP: return "mlp";
    case LayerKind::ParallelHybrid: return "parallel";
    case LayerKind::MoE: return "moe";
  }
  return "?";
}

std::string ModelConfig::to_json() const {
  nlohmann::ordered_json j;
  j["mambacpp_config"] = 1;
  j["arch"] = arch_name(arch);
  j["d_model"] = d_model;
  j["n_layer"] = n_layer;
  j["vocab_size"] = vocab_size;
  j["d_state"] = d_state;
  j["d_conv"] = d_conv;
  j["d_inner"] = d_inner;
  j["norm_eps"] = float_json(norm_eps);
  j["use_bias"] = use_bias;
  j["use_conv_bias"] = use_conv_bias;
  j["residual_in_fp32"] = residual_in_fp32;
  j["tie_embeddings"] = tie_embeddings;
  j["dt_rank"] = dt_rank;
  if (mixer_rms_eps != 0.0) j["mixer_rms_eps"] = float_json(mixer_rms_eps);  // FalconMamba only: plain configs unchanged
  j["n_heads"] = n_heads;
  j["head_dim"] = head_dim;
  j["n_groups"] = n_groups;
  j["chunk_size"] = chunk_size;
  j["dt_min"] = float_json(dt_min);
  j["dt_max"] = float_json(dt_max);
  j["bos_token_id"] = bos_token_id;
  j["eos_token_id"] = eos_token_id;
  j["pad_token_id"] = pad_token_id;
  if (!extra_eos_token_ids.empty()) j["extra_eos_token_ids"] = extra_eos_token_ids;  // absent: older forms unchanged
  if (hybrid()) {  // the pure models' canonical form (and so their state files) stays as it was
    j["family"] = family_name(family);
    std::vector<std::string> kinds;
    for (LayerKind k : layers) kinds.emplace_back(layer_kind_name(k));
    j["layers"] = kinds;
    j["mlp_after_mixer"] = mlp_after_mixer;
    j["gated_norm_groups"] = gated_norm_groups;
    j["n_attn_heads"] = n_attn_heads;
    j["n_kv_heads"] = n_kv_heads;
    j["attn_head_dim"] = attn_head_dim;
    j["attn_bias"] = attn_bias;
    j["attn_scale"] = float_json(attn_scale);
    j["rope_theta"] = float_json(rope_theta);
    j["rope_dim"] = rope_dim;
    j["mlp_size"] = mlp_size;
    j["mlp_act"] = mlp_act == MlpAct::Relu2 ? "relu2" : "silu_gated";
    j["mlp_bias"] = mlp_bias;
    j["embedding_multiplier"] = float_json(embedding_multiplier);
    j["residual_multiplier"] = float_json(residual_multiplier);
    j["logits_scaling"] = float_json(logits_scaling);
    j["max_position"] = max_position;
    if (family == Family::FalconH1) j["falcon_h1"] = nlohmann::ordered_json::parse(falcon_h1_canonical_json(*this));
    moe_to_json(*this, j);
  }
  return j.dump(2);
}

void ModelConfig::validate() const {
  require_size("d_model", d_model);
  require(n_layer > 0 && n_layer <= kMaxConfigLayers, "n_layer", n_layer, "in [1, 65536]");
  require_size("vocab_size", vocab_size);
  require_size("d_state", d_state);
  require_size("d_conv", d_conv);
  require_size("d_inner", d_inner);
  if (!(norm_eps > 0) || !std::isfinite(norm_eps)) fail("model config: norm_eps = ", norm_eps, ", expected > 0");
  // An id at or past vocab_size is kept: nothing is indexed by it (the engine compares sampled ids with eos, and a
  // bos used as a prompt goes through the prompt's vocabulary check), and published configs name ids past the
  // embedding rows (a GPT-2 with vocab_size = eos_token_id = 52000). Only what cannot be a token id (int32) is refused.
  for (auto [field, id] : {std::pair{"bos_token_id", bos_token_id}, std::pair{"eos_token_id", eos_token_id},
                            std::pair{"pad_token_id", pad_token_id}})
    if (id < -1 || id > INT32_MAX)
      fail("model config: ", field, " = ", id, ", expected a token id in [0, 2^31), or -1 for none");
  for (int64_t id : extra_eos_token_ids)
    if (id < 0 || id > INT32_MAX) fail("model config: eos_token_id lists ", id, ", expected token ids in [0, 2^31)");
  if (!extra_eos_token_ids.empty() && eos_token_id < 0)
    fail("model config: extra_eos_token_ids given without an eos_token_id");
  if (!(mixer_rms_eps >= 0) || !std::isfinite(mixer_rms_eps) || (mixer_rms_eps > 0 && arch != Arch::Mamba1))
    fail("model config: mixer_rms_eps = ", mixer_rms_eps, ", expected >= 0 (and > 0 only for FalconMamba, a Mamba-1)");
  if (arch == Arch::Mamba1) {
    require_size("dt_rank", dt_rank);
    if (hybrid()) validate_hybrid();  // Jamba
    return;
  }
  if (hybrid()) validate_hybrid();
  require_size("n_heads", n_heads);
  require_size("head_dim", head_dim);
  require_size("n_groups", n_groups);
  require_size("chunk_size", chunk_size);
  if (n_heads * head_dim != d_inner)
    fail("model config: n_heads * head_dim = ", n_heads, " * ", head_dim, " = ", n_heads * head_dim,
         ", expected d_inner = ", d_inner);
  if (n_heads % n_groups != 0)
    fail("model config: n_heads = ", n_heads, " is not a multiple of n_groups = ", n_groups);
  if (!(dt_min >= 0) || !(dt_max >= dt_min) || std::isinf(dt_min))
    fail("model config: dt limit [", dt_min, ", ", dt_max, "], expected 0 <= dt_min <= dt_max");
}

void ModelConfig::validate_hybrid() const {
  // Every Mamba layer of a hybrid is of the model's arch: Mamba-1 for Jamba, Mamba-2 for the others.
  if ((arch == Arch::Mamba1) != (family == Family::Jamba))
    fail("model config: ", family_name(family), " models have ", family == Family::Jamba ? "Mamba-1" : "Mamba-2",
         " layers, found arch ", arch_name(arch));
  if (static_cast<int64_t>(layers.size()) != n_layer)
    fail("model config: ", layers.size(), " layer kinds for n_layer = ", n_layer);
  bool attention = false, mlp = mlp_after_mixer;
  for (LayerKind k : layers) {
    if ((k == LayerKind::Mamba1 && arch != Arch::Mamba1) || (k == LayerKind::Mamba2 && arch != Arch::Mamba2))
      fail("model config: a ", layer_kind_name(k), " layer in a model of arch ", arch_name(arch));
    attention |= k == LayerKind::Attention || k == LayerKind::ParallelHybrid;
    mlp |= k == LayerKind::MLP || k == LayerKind::ParallelHybrid;
  }
  validate_moe(*this);
  if (gated_norm_groups < 0 || (gated_norm_groups > 0 && n_groups % gated_norm_groups != 0))
    fail("model config: gated_norm_groups = ", gated_norm_groups, " does not divide n_groups = ", n_groups);
  if (attention) {
    require_size("n_attn_heads", n_attn_heads);
    require_size("n_kv_heads", n_kv_heads);
    require_size("attn_head_dim", attn_head_dim);
    if (n_attn_heads % n_kv_heads != 0)
      fail("model config: n_attn_heads = ", n_attn_heads, " is not a multiple of n_kv_heads = ", n_kv_heads);
    if (!(attn_scale >= 0) || !std::isfinite(attn_scale)) fail("model config: attn_scale = ", attn_scale, ", expected >= 0");
    if (!(rope_theta >= 0) || !std::isfinite(rope_theta)) fail("model config: rope_theta = ", rope_theta, ", expected >= 0");
    if (rope_theta > 0 && (rope_dim < 2 || rope_dim % 2 != 0 || rope_dim > attn_head_dim))
      fail("model config: rope_dim = ", rope_dim, ", expected an even number in [2, attn_head_dim = ", attn_head_dim, "]");
  }
  if (mlp) require_size("mlp_size", mlp_size);
  if (family == Family::FalconH1) validate_falcon_h1(*this);
  for (double m : {embedding_multiplier, residual_multiplier, logits_scaling})
    if (!std::isfinite(m) || m == 0) fail("model config: multiplier ", m, ", expected finite and non-zero");
  require(max_position >= 0, "max_position", max_position, ">= 0");
}

ModelConfig parse_model_config(const std::string& json_text, const std::string& source) {
  const nlohmann::json j = parse_json_relaxed(json_text, source);
  if (!j.is_object()) fail(source, ": expected a JSON object, found ", j.type_name());
  ModelConfig c;
  if (j.contains("mambacpp_config")) {
    c = parse_canonical(j, source);
  } else if (j.contains("model_type")) {
    const nlohmann::json& t = j["model_type"];
    if (t == "mamba") c = parse_transformers_mamba(j, source);
    else if (t == "mamba2") c = parse_transformers_mamba2(j, source);
    else if (t == "falcon_mamba") c = parse_transformers_falcon_mamba(j, source);
    else if (t == "nemotron_h") c = parse_transformers_nemotron_h(j, source);
    else if (t == "granitemoehybrid") c = parse_transformers_granite_hybrid(j, source);
    else if (t == "bamba") c = parse_transformers_bamba(j, source);
    else if (t == "falcon_h1") c = parse_transformers_falcon_h1(j, source);
    else if (t == "jamba") c = parse_transformers_jamba(j, source);
    else
      fail(source, ": model_type = ", json_excerpt(t),
           ": supported model types are \"mamba\" (MambaForCausalLM), \"mamba2\" (Mamba2ForCausalLM), ",
           "\"falcon_mamba\" (FalconMambaForCausalLM), \"nemotron_h\" (NemotronHForCausalLM), ",
           "\"granitemoehybrid\" (GraniteMoeHybridForCausalLM), \"bamba\" (BambaForCausalLM), ",
           "\"falcon_h1\" (FalconH1ForCausalLM) and \"jamba\" (JambaForCausalLM)");
  } else if (j.contains("d_model")) {
    c = parse_mamba_ssm(j, source);
  } else {
    fail(source, ": not a recognised Mamba config: expected \"model_type\" (transformers), \"d_model\" (mamba_ssm) ",
         "or \"mambacpp_config\" (mamba.cpp)");
  }
  try {
    c.validate();
  } catch (const Error& e) {
    fail(source, ": ", e.what());
  }
  return c;
}

}  // namespace mambacpp
