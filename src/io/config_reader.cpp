// Typed key access for config objects; every failure names the file, the key, and the value found.
#include "io/config_reader.h"

#include <cmath>

#include "mambacpp/error.h"
#include "core/json_limits.h"

namespace mambacpp {

ConfigReader::ConfigReader(const nlohmann::json& object, std::string source, std::string prefix)
    : object_(object), source_(std::move(source)), prefix_(std::move(prefix)) {
  if (!object_.is_object()) fail(source_, ": ", prefix_.empty() ? "config" : prefix_, " must be a JSON object, found ",
                                 json_excerpt(object_));
}

const nlohmann::json* ConfigReader::get(const std::string& key) const {
  auto it = object_.find(key);
  if (it == object_.end() || it->is_null()) return nullptr;
  return &*it;
}

bool ConfigReader::has(const std::string& key) const { return get(key) != nullptr; }

void ConfigReader::reject(const std::string& key, const std::string& why) const {
  fail(source_, ": ", prefix_, key, ": ", why);
}

void ConfigReader::reject_value(const std::string& key, const nlohmann::json& found, const std::string& why) const {
  fail(source_, ": ", prefix_, key, " = ", json_excerpt(found), ": ", why);
}

int64_t ConfigReader::as_int(const std::string& key, const nlohmann::json& v) const {
  if (v.is_number_integer()) return v.get<int64_t>();
  // Configs written from Python floats (expand=2.0) still count when the value is integral.
  if (v.is_number_float()) {
    const double d = v.get<double>();
    if (std::isfinite(d) && d == std::floor(d) && std::fabs(d) < 9.0e15) return static_cast<int64_t>(d);
  }
  reject_value(key, v, "expected an integer");
}

int64_t ConfigReader::required_int(const std::string& key) const {
  const nlohmann::json* v = get(key);
  if (!v) reject(key, "required key is missing");
  return as_int(key, *v);
}

int64_t ConfigReader::int_or(const std::string& key, int64_t fallback) const {
  const nlohmann::json* v = get(key);
  return v ? as_int(key, *v) : fallback;
}

int64_t ConfigReader::positive_int(const std::string& key) const {
  const int64_t x = required_int(key);
  if (x <= 0 || x > kMaxConfigDim) reject_value(key, *get(key), "expected a positive integer (at most 2^30)");
  return x;
}

int64_t ConfigReader::positive_int_or(const std::string& key, int64_t fallback) const {
  const int64_t x = int_or(key, fallback);
  if (x <= 0 || x > kMaxConfigDim)
    reject_value(key, has(key) ? *get(key) : nlohmann::json(x), "expected a positive integer (at most 2^30)");
  return x;
}

int64_t ConfigReader::layer_count(const std::string& key) const {
  const int64_t x = required_int(key);
  if (x <= 0 || x > kMaxConfigLayers)
    reject_value(key, *get(key), "expected a layer count in [1, " + std::to_string(kMaxConfigLayers) + "]");
  return x;
}

double ConfigReader::number_or(const std::string& key, double fallback) const {
  const nlohmann::json* v = get(key);
  if (!v) return fallback;
  if (!v->is_number()) reject_value(key, *v, "expected a number");
  return v->get<double>();
}

bool ConfigReader::bool_or(const std::string& key, bool fallback) const {
  const nlohmann::json* v = get(key);
  if (!v) return fallback;
  if (!v->is_boolean()) reject_value(key, *v, "expected true or false");
  return v->get<bool>();
}

std::string ConfigReader::string_or(const std::string& key, const std::string& fallback) const {
  const nlohmann::json* v = get(key);
  if (!v) return fallback;
  if (!v->is_string()) reject_value(key, *v, "expected a string");
  return v->get<std::string>();
}

int64_t ConfigReader::token_id(const std::string& key) const {
  const nlohmann::json* v = get(key);
  if (!v) return -1;
  const int64_t id = as_int(key, *v);
  if (id < -1) reject_value(key, *v, "expected a token id >= 0 (or -1 for none)");
  return id;
}

std::vector<int64_t> ConfigReader::token_ids(const std::string& key) const {
  const nlohmann::json* v = get(key);
  if (!v) return {};
  if (!v->is_array()) {
    const int64_t id = token_id(key);
    return id < 0 ? std::vector<int64_t>{} : std::vector<int64_t>{id};
  }
  std::vector<int64_t> ids;
  for (const nlohmann::json& e : *v) {
    const int64_t id = as_int(key, e);
    if (id < 0) reject_value(key, *v, "expected a list of token ids >= 0");
    ids.push_back(id);
  }
  return ids;
}

void read_token_ids(const ConfigReader& r, ModelConfig& c) {
  c.bos_token_id = r.token_id("bos_token_id");
  c.pad_token_id = r.token_id("pad_token_id");
  const std::vector<int64_t> eos = r.token_ids("eos_token_id");
  c.eos_token_id = eos.empty() ? -1 : eos.front();
  c.extra_eos_token_ids.assign(eos.begin() + (eos.empty() ? 0 : 1), eos.end());
}

}  // namespace mambacpp
