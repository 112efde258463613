// Typed access to the keys of one JSON object of a config file, with errors that name the file, the key, what was
// expected and what was found. A key holding null counts as absent (transformers writes null for unset ids).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "mambacpp/config.h"

namespace mambacpp {

// Sizes above this are rejected as corrupt: every product of two sizes (and 2 * n_groups * d_state) then fits in
// int64 without overflow.
constexpr int64_t kMaxConfigDim = int64_t{1} << 30;

// Layers of a model: real ones have at most a few hundred; a count near kMaxConfigDim would size per-layer tables
// of gigabytes (a 1 KB config.json took 2 GB) before the weights are looked at.
constexpr int64_t kMaxConfigLayers = 65536;

class ConfigReader {
 public:
  // `prefix` is prepended to key names in messages, e.g. "ssm_cfg." for a nested object.
  ConfigReader(const nlohmann::json& object, std::string source, std::string prefix = "");

  bool has(const std::string& key) const;
  const nlohmann::json* get(const std::string& key) const;  // nullptr when absent or null

  int64_t required_int(const std::string& key) const;
  int64_t int_or(const std::string& key, int64_t fallback) const;
  // Like int_or/required_int, but the value must be in (0, kMaxConfigDim].
  int64_t positive_int(const std::string& key) const;
  int64_t positive_int_or(const std::string& key, int64_t fallback) const;
  // A layer count: in [1, kMaxConfigLayers] (the readers size per-layer tables by it before any weight is seen).
  int64_t layer_count(const std::string& key) const;
  double number_or(const std::string& key, double fallback) const;  // any JSON number, including inf/nan
  bool bool_or(const std::string& key, bool fallback) const;
  std::string string_or(const std::string& key, const std::string& fallback) const;
  // A token id: an integer >= -1; -1 when absent.
  int64_t token_id(const std::string& key) const;
  // Token ids given as one integer or a list of them (eos_token_id may be a list); empty when absent or -1.
  std::vector<int64_t> token_ids(const std::string& key) const;

  // Throws: "<source>: <prefix><key> = <found>: <why>".
  [[noreturn]] void reject(const std::string& key, const std::string& why) const;
  [[noreturn]] void reject_value(const std::string& key, const nlohmann::json& found, const std::string& why) const;
  const std::string& source() const { return source_; }

 private:
  int64_t as_int(const std::string& key, const nlohmann::json& v) const;

  const nlohmann::json& object_;
  std::string source_;
  std::string prefix_;
};

// bos/eos/pad ids of a published config (eos_token_id may be a list: the rest go to extra_eos_token_ids).
void read_token_ids(const ConfigReader& r, ModelConfig& c);

}  // namespace mambacpp
