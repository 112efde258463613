// Readers of the config.json keys the hybrid families share (config_hybrid.cpp), for the family readers in other
// files (config_falcon_h1.cpp). Each rejects a bad value naming the key, the value found and what was expected.
#pragma once

#include <initializer_list>
#include <string>

#include "io/config_reader.h"
#include "mambacpp/config.h"

namespace mambacpp {

// "architectures", when present, lists `expected` (or its base-model name).
void check_architecture(const ConfigReader& r, const std::string& expected);
double positive_number(const ConfigReader& r, const std::string& key, double fallback);
double nonzero_number(const ConfigReader& r, const std::string& key, double fallback);
// The first key present of `keys` (else the first).
std::string first_key(const ConfigReader& r, std::initializer_list<const char*> keys);
// [lo, hi] into c.dt_min / c.dt_max (absent: [0, inf)).
void read_dt_limit(const ConfigReader& r, const std::string& key, ModelConfig& c);
// `key` (default `fallback`) must name the activation `expected` ("swish" counts as "silu").
void check_activation(const ConfigReader& r, const std::string& key, const std::string& fallback,
                      const std::string& expected);
// num_attention_heads, num_key_value_heads and head_dim (see config_hybrid.cpp); refuses a sliding_window.
void read_attention(const ConfigReader& r, ModelConfig& c, bool head_dim_key, int64_t default_heads,
                    int64_t default_kv, int64_t default_head_dim);
// rope_parameters (or the top-level rope keys): the default rotation only.
void read_rope(const ConfigReader& r, ModelConfig& c, double default_factor);

}  // namespace mambacpp
