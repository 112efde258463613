// ModelConfig: detection of the config.json dialect, the canonical JSON form (what state files embed and compare),
// and the consistency checks every parsed config goes through.
#include "mambacpp/config.h"

#include <cmath>

#include <nlohmann/json.hpp>

#include "io/config_formats.h"
#include "io/config_reader.h"
#include "io/json_relaxed.h"
#include "mambacpp/error.h"

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
  return j.dump(2);
}

void ModelConfig::validate() const {
  require_size("d_model", d_model);
  require_size("n_layer", n_layer);
  require_size("vocab_size", vocab_size);
  require_size("d_state", d_state);
  require_size("d_conv", d_conv);
  require_size("d_inner", d_inner);
  if (!(norm_eps > 0) || !std::isfinite(norm_eps)) fail("model config: norm_eps = ", norm_eps, ", expected > 0");
  for (int64_t id : {bos_token_id, eos_token_id, pad_token_id})
    require(id >= -1, "token id", id, ">= 0, or -1 for none");
  if (!(mixer_rms_eps >= 0) || !std::isfinite(mixer_rms_eps) || (mixer_rms_eps > 0 && arch != Arch::Mamba1))
    fail("model config: mixer_rms_eps = ", mixer_rms_eps, ", expected >= 0 (and > 0 only for FalconMamba, a Mamba-1)");
  if (arch == Arch::Mamba1) {
    require_size("dt_rank", dt_rank);
    return;
  }
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
    else
      fail(source, ": model_type = ", t.dump(),
           ": supported model types are \"mamba\" (MambaForCausalLM), \"mamba2\" (Mamba2ForCausalLM) and ",
           "\"falcon_mamba\" (FalconMambaForCausalLM)");
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
