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
// The hybrids (config_hybrid.cpp): transformers' NemotronHConfig, GraniteMoeHybridConfig (dense only), BambaConfig.
ModelConfig parse_transformers_nemotron_h(const nlohmann::json& j, const std::string& source);
ModelConfig parse_transformers_granite_hybrid(const nlohmann::json& j, const std::string& source);
ModelConfig parse_transformers_bamba(const nlohmann::json& j, const std::string& source);
// Falcon-H1 (config_falcon_h1.cpp): transformers' FalconH1Config; the Falcon-H1 object of our canonical form (its
// multipliers and Mamba norm switches) as written by to_json and read back; its consistency checks.
ModelConfig parse_transformers_falcon_h1(const nlohmann::json& j, const std::string& source);
std::string falcon_h1_canonical_json(const ModelConfig& c);
void parse_canonical_falcon_h1(const nlohmann::json& j, const std::string& source, ModelConfig& c);
void validate_falcon_h1(const ModelConfig& c);
// The hybrid fields of our canonical form (present when "family" is).
void parse_canonical_hybrid(const nlohmann::json& j, const std::string& source, ModelConfig& c);

// Mixture of experts (config_moe.cpp): Nemotron-H's MoE keys, Granite-4.0-H's (num_local_experts > 0), the "moe"
// object of the canonical form, and the checks of ModelConfig::validate.
class ConfigReader;
void read_nemotron_moe(const ConfigReader& r, ModelConfig& c);
void read_granite_moe(const ConfigReader& r, ModelConfig& c, int64_t experts);
void moe_to_json(const ModelConfig& c, nlohmann::ordered_json& j);
void parse_canonical_moe(const nlohmann::json& j, const std::string& source, ModelConfig& c);
void validate_moe(const ModelConfig& c);
// AI21's JambaConfig ("jamba", config_jamba.cpp): Mamba-1, attention and MoE / dense MLP sublayers.
ModelConfig parse_transformers_jamba(const nlohmann::json& j, const std::string& source);

// Our own canonical form, written by ModelConfig::to_json ("mambacpp_config": 1).
ModelConfig parse_canonical(const nlohmann::json& j, const std::string& source);

}  // namespace mambacpp
