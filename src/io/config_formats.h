// The config.json dialects parse_model_config understands, each turned into a ModelConfig with every default and
// derived size resolved. Internal to src/io; the public entry point is parse_model_config (mambacpp/config.h).
#pragma once

#include <string>

#include <nlohmann/json.hpp>

#include "mambacpp/config.h"

namespace mambacpp {

// transformers' MambaConfig ("model_type": "mamba").
ModelConfig parse_transformers_mamba(const nlohmann::json& j, const std::string& source);
// transformers' FalconMambaConfig ("model_type": "falcon_mamba"): Mamba-1 plus mixer_rms_eps.
ModelConfig parse_transformers_falcon_mamba(const nlohmann::json& j, const std::string& source);
// transformers' Mamba2Config ("model_type": "mamba2").
ModelConfig parse_transformers_mamba2(const nlohmann::json& j, const std::string& source);
// mamba_ssm's MambaConfig (d_model, n_layer, ssm_cfg {"layer": "Mamba1" | "Mamba2", ...}).
ModelConfig parse_mamba_ssm(const nlohmann::json& j, const std::string& source);
// Our own canonical form, written by ModelConfig::to_json ("mambacpp_config": 1).
ModelConfig parse_canonical(const nlohmann::json& j, const std::string& source);

}  // namespace mambacpp
