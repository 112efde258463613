// The quantization a checkpoint declares, read from config.json's "quantization_config" and from ModelOpt's
// hf_quant_config.json beside it. Two published FP8 layouts load (weight-only: activations stay in 16-bit):
//   ModelOpt FP8: quant_algo "FP8" (per-tensor weight_scale, static input_scale) or "FP8_PER_CHANNEL_PER_TOKEN"
//     (per-channel weight_scale, no input_scale); exclusions in "exclude_modules" (hf_quant_config.json) or "ignore"
//     (config.json), as fnmatch wildcards; kv_cache_quant_algo "FP8" (k_scale / v_scale tensors, read and checked).
//   compressed-tensors "float-quantized" (llm-compressor's FP8-dynamic): config_groups whose weights are
//     {num_bits: 8, type: float, strategy: channel|tensor} and input_activations dynamic or absent; "ignore" entries
//     are module names or "re:" regular expressions.
// Anything else (another quant_method, block-wise FP8, integer formats, static input quantization in compressed-tensors,
// output activations) is refused with an error naming the key, the value found and what is supported.
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace mambacpp {

enum class QuantMethod { None, ModelOpt, CompressedTensors };

struct QuantConfig {
  QuantMethod method = QuantMethod::None;
  std::string algo;    // ModelOpt's quant_algo ("FP8", "FP8_PER_CHANNEL_PER_TOKEN"); "float-quantized" for CT
  std::string source;  // the file the declaration came from (for messages)
  // Modules left in 16-bit: ModelOpt wildcards, or compressed-tensors names / "re:" patterns.
  std::vector<std::string> ignore;
  bool kv_cache_fp8 = false;  // k_scale / v_scale tensors are expected (the KV cache still runs in 16-bit)

  bool quantized() const { return method != QuantMethod::None; }
  const char* method_name() const;
  // The ignore entry that names module `module` (a tensor name without ".weight"), or "" when none does.
  std::string ignore_entry_for(const std::string& module) const;
};

// Reads the declaration from config.json (`config`, already parsed; `config_path` for messages) and from
// hf_quant_config.json when `hf_quant` is not null (`hf_quant_path` for messages). No declaration: method None.
// Throws mambacpp::Error naming the file, the key, the value found and what is supported.
QuantConfig parse_quant_config(const nlohmann::json& config, const std::string& config_path,
                               const nlohmann::json* hf_quant, const std::string& hf_quant_path);

// fnmatch-style matching of ModelOpt's wildcards: '*' any run, '?' one character, no character classes.
bool wildcard_match(const std::string& pattern, const std::string& text);

}  // namespace mambacpp
