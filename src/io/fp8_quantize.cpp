// mambacpp/fp8_checkpoint.h: any model mambacpp reads, written as a ModelOpt FP8 (per-channel) checkpoint.
#include <cmath>
#include <cstring>
#include <filesystem>
#include <limits>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/atomic_file.h"
#include "core/file_bytes.h"
#include "core/fp8.h"
#include "core/ggml_blocks.h"
#include "io/checkpoint.h"
#include "io/gguf_model.h"
#include "io/json_relaxed.h"
#include "io/safetensors.h"
#include "mambacpp/error.h"
#include "mambacpp/fp8_checkpoint.h"

namespace fs = std::filesystem;

namespace mambacpp {

namespace {

constexpr const char* kAlgo = "FP8_PER_CHANNEL_PER_TOKEN";

// The matrices a linear layer multiplies by: 2-D `.weight` tensors other than the embedding and output tables (kept
// as ModelOpt keeps lm_head, and read by row rather than multiplied on the GPU) and the MoE routers (their logits
// pick the experts, so small errors change which weights run at all).
bool quantizable(const std::string& name, int ndim) {
  if (ndim != 2 || !name.ends_with(".weight")) return false;
  for (const char* table : {"embeddings.weight", "embed_tokens.weight", "embedding.weight", "lm_head.weight"})
    if (name.ends_with(table)) return false;
  return name.find("router") == std::string::npos && !name.ends_with(".gate.weight") &&
         name.find("norm") == std::string::npos && name.find("conv1d") == std::string::npos;
}

// Python's json writes non-finite floats as bare Infinity / NaN (transformers' configs hold some, e.g.
// time_step_limit); nlohmann would write null. Marked as strings here and unquoted after dumping.
constexpr const char* kMark = "\x01mambacpp-float:";
void mark_non_finite(nlohmann::json& j) {
  if (j.is_number_float() && !std::isfinite(j.get<double>())) {
    const double x = j.get<double>();
    j = std::string(kMark) + (std::isnan(x) ? "NaN" : x > 0 ? "Infinity" : "-Infinity");
  } else if (j.is_structured()) {
    for (auto& e : j) mark_non_finite(e);
  }
}
std::string dump_python_style(nlohmann::json j) {
  mark_non_finite(j);
  std::string s = j.dump(2, ' ', false, nlohmann::json::error_handler_t::strict);
  // The marker's \x01 is written as the escape \u0001.
  const std::string quoted = "\"\\u0001mambacpp-float:";
  for (size_t at; (at = s.find(quoted)) != std::string::npos;) {
    const size_t end = s.find('"', at + quoted.size());
    s = s.substr(0, at) + s.substr(at + quoted.size(), end - at - quoted.size()) + s.substr(end + 1);
  }
  return s;
}

// One output tensor and the memory behind its bytes.
struct OutTensor {
  SafetensorsOut out;
  std::vector<uint8_t> owned;  // when the bytes are made here
};

void add_fp8(std::vector<std::unique_ptr<OutTensor>>& outs, const std::string& name, int64_t rows, int64_t cols,
             const void* bytes, std::vector<uint8_t> owned_bytes, const float* scales, bool per_tensor) {
  auto w = std::make_unique<OutTensor>();
  w->owned = std::move(owned_bytes);
  w->out = {name, "F8_E4M3", {rows, cols}, w->owned.empty() ? bytes : w->owned.data(), static_cast<uint64_t>(rows * cols)};
  auto s = std::make_unique<OutTensor>();
  s->owned.resize(static_cast<size_t>(rows) * sizeof(float));
  auto* sf = reinterpret_cast<float*>(s->owned.data());
  for (int64_t r = 0; r < rows; ++r) sf[r] = scales[per_tensor ? 0 : r];
  s->out = {name + "_scale", "F32", {rows}, s->owned.data(), s->owned.size()};
  outs.push_back(std::move(w));
  outs.push_back(std::move(s));
}

// Rows of f32 values -> F8_E4M3 bytes and per-row scales.
void quantize_into(std::vector<std::unique_ptr<OutTensor>>& outs, const std::string& name, int64_t rows, int64_t cols,
                   const float* values) {
  std::vector<uint8_t> bytes(static_cast<size_t>(rows * cols));
  std::vector<float> scales(static_cast<size_t>(rows));
  fp8_quantize_rows(values, rows, cols, bytes.data(), scales.data());
  add_fp8(outs, name, rows, cols, nullptr, std::move(bytes), scales.data(), false);
}

void keep(std::vector<std::unique_ptr<OutTensor>>& outs, const std::string& name, const TensorView& v,
          std::vector<uint8_t> owned = {}) {
  auto t = std::make_unique<OutTensor>();
  t->owned = std::move(owned);
  t->out = {name, safetensors_dtype_name(v.dtype), std::vector<int64_t>(v.shape.begin(), v.shape.begin() + v.ndim),
            t->owned.empty() ? v.data : t->owned.data(), static_cast<uint64_t>(v.nbytes())};
  outs.push_back(std::move(t));
}

std::vector<float> to_f32(const TensorView& v) {
  std::vector<float> x(static_cast<size_t>(v.numel()));
  convert_to_f32(v.data, v.dtype, x.data(), v.numel());
  return x;
}

}  // namespace

Fp8QuantizeReport quantize_to_fp8_checkpoint(const std::string& model_path, const std::string& out_dir,
                                             const std::function<void(int64_t, int64_t)>& progress) {
  std::error_code ec;
  if (fs::exists(out_dir, ec)) {
    if (fs::equivalent(model_path, out_dir, ec))
      fail("quantize: --out '", out_dir, "' is the input model itself; write to another directory");
    if (!fs::is_directory(out_dir, ec) || !fs::is_empty(out_dir, ec))
      fail("quantize: --out '", out_dir, "' exists and is not an empty directory");
  }
  const bool from_gguf = fs::is_regular_file(model_path, ec);
  std::unique_ptr<Checkpoint> ck;
  std::unique_ptr<GgufModel> gm;
  nlohmann::json config;
  std::vector<std::string> names;
  if (from_gguf) {
    gm = std::make_unique<GgufModel>(model_path);
    config = nlohmann::json::parse(gm->config().to_json());
    names = gm->names();
  } else {
    ck = std::make_unique<Checkpoint>(model_path);
    const std::string config_path = (fs::path(model_path) / "config.json").string();
    config = parse_json_relaxed(read_file_bytes(config_path, "config"), config_path);
    names = ck->weight_names();
  }

  std::vector<std::unique_ptr<OutTensor>> outs;
  std::vector<std::string> excluded;  // 2-D `.weight` modules left unquantized, for the ignore lists
  Fp8QuantizeReport report;
  const int64_t total = static_cast<int64_t>(names.size());
  for (int64_t i = 0; i < total; ++i) {
    const std::string& name = names[static_cast<size_t>(i)];
    if (ck) {
      const TensorView* raw = ck->find(name);
      MAMBACPP_ASSERT(raw != nullptr);
      const std::optional<Weight> w = raw->dtype == DType::U8 ? ck->weight(name) : std::nullopt;
      if (w && w->format == WeightFormat::FP8_E4M3) {
        // Already FP8: the same bytes, the scales as loaded (a per-tensor scale written per channel).
        if (w->ndim != 2) fail("quantize: FP8 tensor '", name, "' is ", w->shape_string(), "; only 2-D matrices are written");
        add_fp8(outs, name, w->dim(0), w->dim(1), w->data.data, {}, w->scale.ptr<const float>(), w->scale.numel() == 1);
        ++report.quantized;
      } else if (quantizable(name, raw->ndim) && is_weight_float(raw->dtype)) {
        quantize_into(outs, name, raw->dim(0), raw->dim(1), to_f32(*raw).data());
        ++report.quantized;
      } else {
        if (raw->ndim == 2 && name.ends_with(".weight")) excluded.push_back(name.substr(0, name.size() - 7));
        keep(outs, name, *raw);
        ++report.kept;
      }
    } else {
      const std::optional<Weight> w = gm->find(name);
      MAMBACPP_ASSERT(w.has_value());
      std::vector<float> values;
      if (w->dense()) {
        values = to_f32(w->data);
      } else {
        const int64_t cols = w->dim(w->ndim - 1), rows = w->numel() / std::max<int64_t>(cols, 1);
        values.resize(static_cast<size_t>(w->numel()));
        const int64_t rb = weight_row_bytes(w->format, cols, name);
        for (int64_t r = 0; r < rows; ++r)
          ggml_dequantize_row(w->format, w->data.ptr<const uint8_t>() + r * rb, cols, values.data() + r * cols);
      }
      if (quantizable(name, w->ndim)) {
        quantize_into(outs, name, w->dim(0), w->dim(1), values.data());
        ++report.quantized;
      } else {
        if (w->ndim == 2 && name.ends_with(".weight")) excluded.push_back(name.substr(0, name.size() - 7));
        if (w->dense()) {
          keep(outs, name, w->data);
        } else {
          // A block-format table (embeddings, output) becomes f32: its exact dequantized values.
          std::vector<uint8_t> bytes(values.size() * sizeof(float));
          std::memcpy(bytes.data(), values.data(), bytes.size());
          TensorView v = w->data;
          v.dtype = DType::F32;
          v.ndim = w->ndim;
          for (int d = 0; d < w->ndim; ++d) v.shape[static_cast<size_t>(d)] = w->dim(d);
          keep(outs, name, v, std::move(bytes));
        }
        ++report.kept;
      }
    }
    if (progress) progress(i + 1, total);
  }
  if (report.quantized == 0) fail("quantize: ", model_path, " has no projection matrix to quantize");

  fs::create_directories(out_dir, ec);
  if (ec) fail("quantize: cannot create '", out_dir, "': ", ec.message());
  std::vector<SafetensorsOut> list;
  for (const auto& t : outs) list.push_back(t->out);
  const std::string st_path = (fs::path(out_dir) / "model.safetensors").string();
  write_safetensors_file(st_path, std::move(list), {{"format", "pt"}});
  report.bytes = static_cast<uint64_t>(fs::file_size(st_path));

  // ModelOpt's two spellings of the same declaration: config.json's (transformers, vLLM) and hf_quant_config.json
  // (TensorRT-LLM, older vLLM). Exclusions are exact module names.
  const nlohmann::json producer = {{"name", "mambacpp"}, {"version", "1"}};
  config["quantization_config"] = {{"quant_method", "modelopt"}, {"quant_algo", kAlgo}, {"ignore", excluded},
                                   {"kv_cache_scheme", nullptr}, {"producer", producer}};
  const nlohmann::json hf_quant = {
      {"producer", producer},
      {"quantization", {{"quant_algo", kAlgo}, {"kv_cache_quant_algo", nullptr}, {"exclude_modules", excluded}}}};
  write_file_atomically((fs::path(out_dir) / "config.json").string(), dump_python_style(config) + "\n", "config");
  write_file_atomically((fs::path(out_dir) / "hf_quant_config.json").string(), hf_quant.dump(2) + "\n",
                        "hf_quant_config.json");

  if (!from_gguf) {
    // The source's other files (tokenizer, generation config, chat template, README), not its weights.
    const std::set<std::string> replaced = {"config.json", "hf_quant_config.json", "model.safetensors.index.json",
                                            "pytorch_model.bin.index.json"};
    for (const auto& e : fs::directory_iterator(model_path)) {
      if (!e.is_regular_file()) continue;
      const std::string file = e.path().filename().string(), ext = e.path().extension().string();
      if (replaced.count(file) || ext == ".safetensors" || ext == ".bin" || ext == ".pt" || ext == ".pth" ||
          ext == ".ckpt")
        continue;
      write_file_atomically((fs::path(out_dir) / file).string(),
                            read_file_bytes(e.path().string(), "quantize", std::numeric_limits<uint64_t>::max()), file);
    }
  }
  return report;
}

}  // namespace mambacpp
