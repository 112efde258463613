// The FP8 side of Checkpoint (io/checkpoint.h): the quantization declaration read beside config.json, and every
// F8_E4M3 weight paired with its scales into a typed FP8 weight. Names follow both published layouts:
//   <module>.weight        F8_E4M3 [out, in] (or [E, out, in])
//   <module>.weight_scale  f32/bf16/f16: [] or [1] (per tensor), [out] or [out, 1] (per output channel)
//   <module>.input_scale   f32 scalar (ModelOpt "FP8": the static activation scale; activations stay 16-bit here)
//   *.k_scale, *.v_scale   f32 scalars when the KV cache was calibrated for FP8 (the KV cache stays 16-bit here)
#include <cmath>
#include <filesystem>

#include "io/checkpoint.h"
#include "io/json_relaxed.h"
#include "mambacpp/error.h"

namespace fs = std::filesystem;

namespace mambacpp {

void Checkpoint::read_quant_config(const std::string& config_text, const std::string& config_path) {
  const nlohmann::json config = parse_json_relaxed(config_text, config_path);
  const fs::path hf_path = fs::path(directory_) / "hf_quant_config.json";
  std::error_code ec;
  if (fs::is_regular_file(hf_path, ec)) {
    const nlohmann::json hf = read_json_file_relaxed(hf_path.string());
    quant_ = parse_quant_config(config, config_path, &hf, hf_path.string());
  } else {
    quant_ = parse_quant_config(config, config_path, nullptr, "");
  }
}

float Checkpoint::scalar_scale(const std::string& name, const char* what) const {
  const TensorView* t = find(name);
  MAMBACPP_ASSERT(t != nullptr);
  if (!is_weight_float(t->dtype) || t->numel() != 1)
    fail(directory_, ": ", what, " '", name, "' must be one f32, bf16 or f16 value, found ", dtype_name(t->dtype), " ",
         t->shape_string());
  const float v = load_as_f32(t->data, t->dtype, 0);
  if (!std::isfinite(v) || v <= 0.0f) fail(directory_, ": ", what, " '", name, "' = ", v, "; expected a positive finite scale");
  return v;
}

void Checkpoint::bind_fp8() {
  std::vector<std::string> fp8_names;
  for (const auto& [name, e] : tensors_)
    if (e.fp8) fp8_names.push_back(name);
  const std::string declared = quant_.quantized() ? std::string(quant_.method_name()) + " (" + quant_.source + ")" : "";
  if (!quant_.quantized()) {
    if (!fp8_names.empty())
      fail(directory_, ": tensor '", fp8_names.front(), "' is stored as F8_E4M3 but the checkpoint declares no ",
           "quantization (no quantization_config in config.json and no hf_quant_config.json), so its scales cannot ",
           "be trusted");
    return;
  }
  if (fp8_names.empty())
    fail(directory_, ": ", declared, " declares FP8 weights, but no tensor is stored as F8_E4M3");

  for (const std::string& name : fp8_names) {
    const TensorView& v = tensors_.at(name).view;
    if (!name.ends_with(".weight"))
      fail(directory_, ": tensor '", name, "' is stored as F8_E4M3; only a module's '.weight' is quantized in the ",
           quant_.method_name(), " layout");
    const std::string module = name.substr(0, name.size() - 7);
    const std::string entry = quant_.ignore_entry_for(module);
    if (!entry.empty())
      fail(directory_, ": module '", module, "' is left unquantized by the ignore entry \"", entry, "\" of ",
           quant_.source, ", but '", name, "' is stored as F8_E4M3");
    if (v.ndim < 2 || v.ndim > 3)
      fail(directory_, ": F8_E4M3 tensor '", name, "' has shape ", v.shape_string(), "; expected a 2-D [out, in] ",
           "matrix (or 3-D [experts, out, in])");
    const int64_t cols = v.dim(v.ndim - 1), rows = v.numel() / std::max<int64_t>(cols, 1);

    const std::string scale_name = name + "_scale";
    const TensorView* s = find(scale_name);
    if (!s) fail(directory_, ": F8_E4M3 weight '", name, "' has no '", scale_name, "'");
    if (!is_weight_float(s->dtype))
      fail(directory_, ": '", scale_name, "' has dtype ", dtype_name(s->dtype), "; expected f32, bf16 or f16");
    // Per output channel: [out], [out, 1] (compressed-tensors), [E, out, 1]; per tensor: any shape of one element.
    bool per_channel = s->numel() == rows && s->numel() > 1;
    if (per_channel)
      for (int d = 0; d < s->ndim; ++d)
        per_channel = per_channel && (d < v.ndim - 1 ? s->dim(d) == v.dim(d) : s->dim(d) == 1);
    if (s->numel() != 1 && !per_channel)
      fail(directory_, ": '", scale_name, "' has shape ", s->shape_string(), "; expected [] or [1] (per tensor) or [",
           rows, "] / [", rows, ", 1] (per output channel) for weight ", v.shape_string(),
           " (block-wise scales are not supported)");
    auto scales = std::make_unique<float[]>(static_cast<size_t>(rows));
    for (int64_t r = 0; r < rows; ++r) {
      const float x = load_as_f32(s->data, s->dtype, per_channel ? r : 0);
      if (!std::isfinite(x) || x < 0.0f)
        fail(directory_, ": '", scale_name, "' element ", per_channel ? r : 0, " = ", x,
             "; expected a finite non-negative scale");
      scales[static_cast<size_t>(r)] = x;
    }
    const TensorView sv(scales.get(), DType::F32, {rows});
    fp8_[name] = v.ndim == 2 ? Weight::packed(WeightFormat::FP8_E4M3, v.data, {v.dim(0), v.dim(1)}, Device::CPU, sv)
                             : Weight::packed(WeightFormat::FP8_E4M3, v.data, {v.dim(0), v.dim(1), v.dim(2)},
                                              Device::CPU, sv);
    scales_.push_back(std::move(scales));
    consumed_.insert(scale_name);

    // The static activation scale is checked and not used: weight-only FP8 keeps activations in 16-bit.
    const std::string input_scale = module + ".input_scale";
    if (find(input_scale)) {
      if (quant_.method == QuantMethod::CompressedTensors)
        fail(directory_, ": '", input_scale, "' is a static activation scale, but ", quant_.source,
             " declares dynamic input quantization");
      scalar_scale(input_scale, "input scale");
      consumed_.insert(input_scale);
    }
  }

  for (const auto& [name, e] : tensors_) {
    if (consumed_.count(name)) continue;
    if (name.ends_with(".weight_scale") || name.ends_with(".input_scale"))
      fail(directory_, ": '", name, "' is a quantization scale with no F8_E4M3 weight beside it");
    if (name.ends_with(".k_scale") || name.ends_with(".v_scale")) {
      if (!quant_.kv_cache_fp8)
        fail(directory_, ": '", name, "' is a KV-cache scale, but ", declared, " declares no FP8 KV cache");
      scalar_scale(name, "KV-cache scale");
      consumed_.insert(name);
    }
  }
}

std::optional<Weight> Checkpoint::weight(const std::string& name) const {
  auto q = fp8_.find(name);
  if (q != fp8_.end()) return q->second;
  const TensorView* t = find(name);
  if (!t) return std::nullopt;
  if (!is_weight_float(t->dtype))
    fail(directory_, ": tensor '", name, "' has dtype ", dtype_name(t->dtype), "; expected f32, f16 or bf16");
  return Weight(*t);
}

std::vector<std::string> Checkpoint::weight_names() const {
  std::vector<std::string> out;
  for (const auto& [name, entry] : tensors_)
    if (!consumed_.count(name)) out.push_back(name);
  return out;
}

}  // namespace mambacpp
