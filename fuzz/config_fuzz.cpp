// config.json parsing (relaxed JSON, every dialect: mamba_ssm, transformers Mamba/Mamba2/FalconMamba, the hybrid
// families, mamba.cpp's canonical form): any input must parse into a config that passes validate() or be rejected
// with mambacpp::Error. What parses must survive its own canonical round trip.
#include <string>

#include "fuzz_target.h"
#include "mambacpp/config.h"

MAMBACPP_FUZZ_TARGET(config) {
  const mambacpp::ModelConfig c = mambacpp::parse_model_config(std::string(reinterpret_cast<const char*>(data), size), "fuzz");
  const mambacpp::ModelConfig again = mambacpp::parse_model_config(c.to_json(), "fuzz-canonical");
  MAMBACPP_FUZZ_CHECK(again.to_json() == c.to_json());
}
