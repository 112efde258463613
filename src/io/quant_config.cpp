// Parsing of the quantization declarations (quant_config.h). Every key that would change what the numbers mean is
// checked; a key we do not act on is refused rather than ignored.
#include "io/quant_config.h"

#include <algorithm>
#include <cctype>
#include <regex>

#include "core/json_limits.h"
#include "mambacpp/error.h"

namespace mambacpp {

namespace {

constexpr const char* kSupported =
    "supported: quant_method \"modelopt\" with quant_algo FP8 or FP8_PER_CHANNEL_PER_TOKEN, or \"compressed-tensors\" "
    "with 8-bit float weights (strategy channel or tensor) and dynamic or no input quantization";

std::string upper(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return static_cast<char>(std::toupper(c)); });
  return s;
}

bool is_null_or_absent(const nlohmann::json& obj, const char* key) {
  return !obj.contains(key) || obj[key].is_null();
}

// A list of strings at `key` (absent or null: empty).
std::vector<std::string> string_list(const nlohmann::json& obj, const char* key, const std::string& where) {
  std::vector<std::string> out;
  if (is_null_or_absent(obj, key)) return out;
  const nlohmann::json& v = obj[key];
  if (!v.is_array()) fail(where, ".", key, " must be a list of module names, found ", json_excerpt(v));
  for (const auto& e : v) {
    if (!e.is_string()) fail(where, ".", key, " must be a list of module names, found the entry ", json_excerpt(e));
    out.push_back(e.get<std::string>());
  }
  return out;
}

// The string at `key`, or fail naming it.
std::string string_at(const nlohmann::json& obj, const char* key, const std::string& where) {
  if (!obj.contains(key)) fail(where, ": missing \"", key, "\" (", kSupported, ")");
  if (!obj[key].is_string()) fail(where, ".", key, " must be a string, found ", json_excerpt(obj[key]));
  return obj[key].get<std::string>();
}

[[noreturn]] void refuse(const std::string& where, const char* key, const nlohmann::json& found, const char* expected) {
  fail(where, ".", key, " = ", json_excerpt(found), " is not supported (", expected, ")");
}

// ModelOpt's FP8 algorithms we run. The per-block variant (FP8_PB_WO) needs block scales, which the typed FP8
// weight (one scale per output channel) cannot hold.
void check_modelopt_algo(const std::string& algo, const std::string& where) {
  if (algo == "FP8" || algo == "FP8_PER_CHANNEL_PER_TOKEN") return;
  fail(where, ".quant_algo = \"", algo, "\" is not supported",
       algo == "FP8_PB_WO" ? " (block-wise FP8: weight scales per 128x128 block)" : "",
       " (supported ModelOpt quant_algo: FP8, FP8_PER_CHANNEL_PER_TOKEN)");
}

bool modelopt_kv_algo(const nlohmann::json& q, const std::string& where) {
  if (is_null_or_absent(q, "kv_cache_quant_algo")) return false;
  const nlohmann::json& kv = q["kv_cache_quant_algo"];
  if (kv.is_string() && upper(kv.get<std::string>()) == "FP8") return true;
  refuse(where, "kv_cache_quant_algo", kv, "null or \"FP8\"");
}

bool kv_cache_scheme(const nlohmann::json& q, const std::string& where) {
  if (is_null_or_absent(q, "kv_cache_scheme")) return false;
  const nlohmann::json& kv = q["kv_cache_scheme"];
  if (kv.is_object() && kv.value("num_bits", nlohmann::json()) == 8 && kv.value("type", nlohmann::json()) == "float") return true;
  refuse(where, "kv_cache_scheme", kv, "null or {num_bits: 8, type: \"float\"}");
}

// Keys of a ModelOpt declaration that would change the numbers and that the FP8 algorithms do not use.
void check_modelopt_extras(const nlohmann::json& q, const std::string& where) {
  for (const char* key : {"group_size", "weight_block_size", "block_size"})
    if (!is_null_or_absent(q, key)) refuse(where, key, q[key], "per-channel or per-tensor FP8 has no block or group size");
}

// hf_quant_config.json: {"producer": {...}, "quantization": {"quant_algo", "kv_cache_quant_algo", "exclude_modules"}}.
QuantConfig parse_hf_quant(const nlohmann::json& j, const std::string& path) {
  if (!j.is_object() || !j.contains("quantization") || !j["quantization"].is_object())
    fail(path, ": expected an object with a \"quantization\" object (ModelOpt's hf_quant_config.json)");
  const nlohmann::json& q = j["quantization"];
  const std::string where = path + ": quantization";
  QuantConfig c;
  c.method = QuantMethod::ModelOpt;
  c.source = path;
  c.algo = upper(string_at(q, "quant_algo", where));
  check_modelopt_algo(c.algo, where);
  check_modelopt_extras(q, where);
  c.kv_cache_fp8 = modelopt_kv_algo(q, where);
  c.ignore = string_list(q, "exclude_modules", where);
  return c;
}

// config.json's quantization_config with quant_method "modelopt": the flat form (quant_algo, ignore, kv_cache_scheme
// or kv_cache_quant_algo) or the hf_quant_config form nested under "quantization".
QuantConfig parse_modelopt(const nlohmann::json& qc, const std::string& path) {
  if (qc.contains("quantization") && qc["quantization"].is_object()) {
    QuantConfig c = parse_hf_quant(qc, path + ": quantization_config");
    c.source = path;
    return c;
  }
  const std::string where = path + ": quantization_config";
  QuantConfig c;
  c.method = QuantMethod::ModelOpt;
  c.source = path;
  c.algo = upper(string_at(qc, "quant_algo", where));
  check_modelopt_algo(c.algo, where);
  check_modelopt_extras(qc, where);
  c.kv_cache_fp8 = modelopt_kv_algo(qc, where) || kv_cache_scheme(qc, where);
  c.ignore = string_list(qc, "ignore", where);
  for (const std::string& e : string_list(qc, "exclude_modules", where)) c.ignore.push_back(e);
  return c;
}

void check_ct_weights(const nlohmann::json& w, const std::string& where) {
  if (!w.is_object()) fail(where, " must be an object, found ", json_excerpt(w));
  if (w.value("num_bits", nlohmann::json()) != 8) refuse(where, "num_bits", w.value("num_bits", nlohmann::json()), "num_bits: 8");
  if (!w.contains("type") || w["type"] != "float")
    refuse(where, "type", w.value("type", nlohmann::json()), "type: \"float\" (e4m3); integer weights (int4/int8, "
                                                              "GPTQ/AWQ packings) are not");
  const nlohmann::json strategy = w.value("strategy", nlohmann::json());
  if (strategy != "channel" && strategy != "tensor")
    refuse(where, "strategy", strategy, "strategy \"channel\" or \"tensor\"; block and group scales are not");
  for (const char* key : {"group_size", "block_structure", "actorder"})
    if (!is_null_or_absent(w, key)) refuse(where, key, w[key], "null for per-channel or per-tensor FP8");
  if (w.contains("symmetric") && w["symmetric"] != true)
    refuse(where, "symmetric", w["symmetric"], "symmetric: true (FP8 has no zero point)");
  if (w.contains("dynamic") && w["dynamic"] != false)
    refuse(where, "dynamic", w["dynamic"], "dynamic: false (weights are stored quantized)");
}

void check_ct_inputs(const nlohmann::json& a, const std::string& where) {
  if (a.is_null()) return;
  if (!a.is_object()) fail(where, " must be an object or null, found ", json_excerpt(a));
  if (a.value("dynamic", nlohmann::json()) != true)
    refuse(where, "dynamic", a.value("dynamic", nlohmann::json()),
           "dynamic: true; static input scales would quantize activations to fixed ranges, which weight-only FP8 "
           "does not reproduce");
  if (a.value("num_bits", nlohmann::json()) != 8 || a.value("type", nlohmann::json()) != "float")
    fail(where, " = ", json_excerpt(a), " is not supported (8-bit float dynamic activations, run in 16-bit here)");
}

QuantConfig parse_compressed_tensors(const nlohmann::json& qc, const std::string& path) {
  const std::string where = path + ": quantization_config";
  QuantConfig c;
  c.method = QuantMethod::CompressedTensors;
  c.source = path;
  c.algo = "float-quantized";
  if (qc.contains("format") && qc["format"] != "float-quantized")
    refuse(where, "format", qc["format"], "format \"float-quantized\": FP8 weights stored as F8_E4M3");
  if (qc.contains("quantization_status") && qc["quantization_status"] != "compressed")
    refuse(where, "quantization_status", qc["quantization_status"], "\"compressed\": the weights stored quantized");
  for (const char* key : {"sparsity_config", "transform_config"})
    if (!is_null_or_absent(qc, key) && !(qc[key].is_object() && qc[key].empty()))
      refuse(where, key, qc[key], "null; sparse or transformed weights are not");
  if (!qc.contains("config_groups") || !qc["config_groups"].is_object() || qc["config_groups"].empty())
    fail(where, ": missing \"config_groups\" (", kSupported, ")");
  for (const auto& [name, g] : qc["config_groups"].items()) {
    const std::string gw = where + ".config_groups." + name;
    if (!g.is_object()) fail(gw, " must be an object, found ", json_excerpt(g));
    if (is_null_or_absent(g, "weights")) fail(gw, ": missing \"weights\" (", kSupported, ")");
    if (g.contains("format") && !g["format"].is_null() && g["format"] != "float-quantized")
      refuse(gw, "format", g["format"], "format \"float-quantized\"");
    check_ct_weights(g["weights"], gw + ".weights");
    check_ct_inputs(g.value("input_activations", nlohmann::json()), gw + ".input_activations");
    if (!is_null_or_absent(g, "output_activations"))
      refuse(gw, "output_activations", g["output_activations"], "null; quantized outputs are not");
  }
  c.kv_cache_fp8 = kv_cache_scheme(qc, where);
  c.ignore = string_list(qc, "ignore", where);
  return c;
}

}  // namespace

const char* QuantConfig::method_name() const {
  switch (method) {
    case QuantMethod::None: return "none";
    case QuantMethod::ModelOpt: return "modelopt";
    case QuantMethod::CompressedTensors: return "compressed-tensors";
  }
  return "?";
}

bool wildcard_match(const std::string& pattern, const std::string& text) {
  // Iterative glob with backtracking to the last '*'.
  size_t p = 0, t = 0, star = std::string::npos, mark = 0;
  while (t < text.size()) {
    if (p < pattern.size() && (pattern[p] == '?' || pattern[p] == text[t])) {
      ++p, ++t;
    } else if (p < pattern.size() && pattern[p] == '*') {
      star = p++, mark = t;
    } else if (star != std::string::npos) {
      p = star + 1, t = ++mark;
    } else {
      return false;
    }
  }
  while (p < pattern.size() && pattern[p] == '*') ++p;
  return p == pattern.size();
}

std::string QuantConfig::ignore_entry_for(const std::string& module) const {
  for (const std::string& e : ignore) {
    if (method == QuantMethod::CompressedTensors && e.rfind("re:", 0) == 0) {
      try {
        // Python's re.match: anchored at the start only.
        const std::regex re(e.substr(3));
        if (std::regex_search(module, re, std::regex_constants::match_continuous)) return e;
      } catch (const std::regex_error&) {
        fail(source, ": quantization_config.ignore entry \"", e, "\" is not a regular expression this reader parses");
      }
      continue;
    }
    // ModelOpt writes exact names and wildcards ("lm_head", "*router*", "model.layers.0.mlp*").
    if (e == module || wildcard_match(e, module)) return e;
  }
  return "";
}

QuantConfig parse_quant_config(const nlohmann::json& config, const std::string& config_path,
                               const nlohmann::json* hf_quant, const std::string& hf_quant_path) {
  QuantConfig from_config;
  if (config.is_object() && config.contains("quantization_config") && !config["quantization_config"].is_null()) {
    const nlohmann::json& qc = config["quantization_config"];
    const std::string where = config_path + ": quantization_config";
    if (!qc.is_object()) fail(where, " must be an object, found ", json_excerpt(qc));
    const std::string method = string_at(qc, "quant_method", where);
    if (method == "modelopt") from_config = parse_modelopt(qc, config_path);
    else if (method == "compressed-tensors") from_config = parse_compressed_tensors(qc, config_path);
    else
      fail(where, ".quant_method = \"", method, "\" is not supported (", kSupported,
           method == "fp8" ? "; transformers' \"fp8\" method stores block-wise scales (weight_block_size)" : "", ")");
  }
  if (!hf_quant) return from_config;
  QuantConfig c = parse_hf_quant(*hf_quant, hf_quant_path);
  if (from_config.method == QuantMethod::CompressedTensors)
    fail(config_path, ": quantization_config.quant_method = \"compressed-tensors\" contradicts ", hf_quant_path,
         " (ModelOpt); remove one of them");
  if (from_config.method == QuantMethod::ModelOpt) {
    if (from_config.algo != c.algo)
      fail(config_path, ": quantization_config.quant_algo = \"", from_config.algo, "\" contradicts ", hf_quant_path,
           " (quant_algo \"", c.algo, "\")");
    for (const std::string& e : from_config.ignore) c.ignore.push_back(e);
    c.kv_cache_fp8 = c.kv_cache_fp8 || from_config.kv_cache_fp8;
  }
  return c;
}

}  // namespace mambacpp
