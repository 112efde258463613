// FP8 checkpoints as published (io/quant_config.h, io/checkpoint.h) and `quantize --type fp8`
// (mambacpp/fp8_checkpoint.h). The FP8 directories are built here from the transformers fixtures of every family and
// from tiny random models of awkward widths, in each layout: ModelOpt per channel (config.json) and per tensor with
// static input scales (hf_quant_config.json), compressed-tensors per channel (bf16 [out, 1] scales, "re:" ignore
// entries) and per tensor.
//
// What is compared, and the tolerance:
// - the loaded weights against the bytes and scales written: exact (they are the file's bytes; a per-tensor scale is
//   the same f32 on every row);
// - logits of the FP8 directory against those of a plain f32 checkpoint holding the dequantized weights
//   (e4m3(b) * scale, one f32 multiply): exact on the CPU. The CPU has no FP8 kernels and dequantizes each FP8 weight
//   at load with that same multiply, so both models run the same f32 kernels on the same f32 weights; any difference
//   is a loading error (a scale on the wrong row, a module quantized that should not be, a dropped tensor).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>

#include "core/fp8.h"
#include "io/checkpoint.h"
#include "io/json_relaxed.h"
#include "io/safetensors.h"
#include "mambacpp/fp8_checkpoint.h"
#include "mambacpp/gguf.h"
#include "mambacpp/model.h"
#include "support/test_support.h"

namespace mambacpp {
namespace {

namespace fs = std::filesystem;
using ::testing::AllOf;
using ::testing::HasSubstr;

enum class Layout { ModelOptChannel, ModelOptTensorHf, CtChannel, CtTensor };

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// The projection matrices the published tools quantize (nn.Linear weights), without the tables and routers.
bool is_projection(const std::string& name, const TensorView& v) {
  if (v.ndim != 2 || !ends_with(name, ".weight")) return false;
  for (const char* t : {"embeddings.weight", "embed_tokens.weight", "embedding.weight", "lm_head.weight"})
    if (ends_with(name, t)) return false;
  return name.find("router") == std::string::npos && !ends_with(name, ".gate.weight") &&
         name.find("norm") == std::string::npos && name.find("conv1d") == std::string::npos;
}

std::vector<float> values_of(const TensorView& v) {
  std::vector<float> x(static_cast<size_t>(v.numel()));
  convert_to_f32(v.data, v.dtype, x.data(), v.numel());
  return x;
}

// A config.json as our reader takes it (bare Infinity as Python writes it, or transformers 5's {"__float__": ...}),
// with non-finite floats spelled back in transformers 5's way so that it can be written again.
nlohmann::json read_json(const std::string& path) {
  nlohmann::json config = read_json_file_relaxed(path);
  std::function<void(nlohmann::json&)> spell = [&](nlohmann::json& j) {
    if (j.is_number_float() && !std::isfinite(j.get<double>()))
      j = {{"__float__", std::isnan(j.get<double>()) ? "NaN" : j.get<double>() > 0 ? "Infinity" : "-Infinity"}};
    else if (j.is_structured())
      for (auto& e : j) spell(e);
  };
  spell(config);
  return config;
}
void write_json(const std::string& path, const nlohmann::json& j) { std::ofstream(path) << j.dump(2); }

// Everything a test needs to write one directory: tensors with their bytes kept alive.
struct DirWriter {
  std::vector<SafetensorsOut> tensors;
  std::vector<std::vector<uint8_t>> owned;
  void add(const std::string& name, const std::string& dtype, std::vector<int64_t> shape, std::vector<uint8_t> bytes) {
    owned.push_back(std::move(bytes));
    tensors.push_back({name, dtype, std::move(shape), owned.back().data(), owned.back().size()});
  }
  void add_view(const std::string& name, const TensorView& v) {
    const auto* p = static_cast<const uint8_t*>(v.data);
    add(name, safetensors_dtype_name(v.dtype), std::vector<int64_t>(v.shape.begin(), v.shape.begin() + v.ndim),
        std::vector<uint8_t>(p, p + v.nbytes()));
  }
  template <class T>
  void add_values(const std::string& name, const std::string& dtype, std::vector<int64_t> shape, const std::vector<T>& x) {
    std::vector<uint8_t> b(x.size() * sizeof(T));
    std::memcpy(b.data(), x.data(), b.size());
    add(name, dtype, std::move(shape), std::move(b));
  }
  // (Moving a std::vector keeps its buffer, so the pointers taken in add() stay valid as `owned` grows.)
  void write(const std::string& dir) {
    write_safetensors_file(dir + "/model.safetensors", tensors);
  }
};

// A matrix quantized as the layout stores it: bytes, the scale as stored (bf16 for compressed-tensors), and the
// per-row f32 scales the loader must produce.
struct Quantized {
  std::vector<uint8_t> bytes;
  std::vector<float> row_scales;
};
Quantized quantize(const std::vector<float>& x, int64_t rows, int64_t cols, bool per_tensor, bool bf16_scales) {
  Quantized q;
  q.bytes.resize(x.size());
  q.row_scales.resize(static_cast<size_t>(rows));
  float amax = 0;
  for (float v : x) amax = std::max(amax, std::fabs(v));
  for (int64_t r = 0; r < rows; ++r) {
    float s;
    if (per_tensor) {
      s = amax > 0 ? amax / 448.0f : 1.0f;
    } else {
      float m = 0;
      for (int64_t i = 0; i < cols; ++i) m = std::max(m, std::fabs(x[r * cols + i]));
      s = m > 0 ? m / 448.0f : 1.0f;
    }
    if (bf16_scales) s = bf16_to_f32(f32_to_bf16(s));  // the scale the file holds; x / s may then saturate at 448
    q.row_scales[static_cast<size_t>(r)] = s;
    for (int64_t i = 0; i < cols; ++i) q.bytes[r * cols + i] = fp8_e4m3_from_float(x[r * cols + i] / s);
  }
  return q;
}

// Writes `src` (any checkpoint the project reads) in `layout` to `fp8_dir`, and the same model with the FP8 weights
// dequantized to f32 to `plain_dir`. Returns the FP8 weights written, by tensor name.
std::map<std::string, Quantized> write_fp8_checkpoint(const std::string& src, const std::string& fp8_dir,
                                                      const std::string& plain_dir, Layout layout) {
  fs::create_directories(fp8_dir);
  fs::create_directories(plain_dir);
  const Checkpoint ck(src);
  const bool per_tensor = layout == Layout::ModelOptTensorHf || layout == Layout::CtTensor;
  const bool ct = layout == Layout::CtChannel || layout == Layout::CtTensor;
  DirWriter fp8, plain;
  std::map<std::string, Quantized> written;
  std::vector<std::string> ignore;
  for (const std::string& name : ck.names()) {
    const TensorView& v = *ck.find(name);
    if (!is_projection(name, v)) {
      fp8.add_view(name, v);
      plain.add_view(name, v);
      if (v.ndim == 2 && ends_with(name, ".weight")) ignore.push_back(name.substr(0, name.size() - 7));
      continue;
    }
    const int64_t rows = v.dim(0), cols = v.dim(1);
    Quantized q = quantize(values_of(v), rows, cols, per_tensor, ct);
    std::vector<float> deq(static_cast<size_t>(rows * cols));
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t i = 0; i < cols; ++i)
        deq[r * cols + i] = fp8_e4m3_to_float(q.bytes[r * cols + i]) * q.row_scales[static_cast<size_t>(r)];
    plain.add_values(name, "F32", {rows, cols}, deq);
    fp8.add(name, "F8_E4M3", {rows, cols}, q.bytes);
    if (layout == Layout::ModelOptChannel) fp8.add_values(name + "_scale", "F32", {rows}, q.row_scales);
    if (layout == Layout::ModelOptTensorHf) {
      fp8.add_values(name + "_scale", "F32", {}, std::vector<float>{q.row_scales[0]});
      const std::string module = name.substr(0, name.size() - 7);
      fp8.add_values(module + ".input_scale", "F32", {}, std::vector<float>{0.0123f});
    }
    if (ct) {
      std::vector<uint16_t> s;
      for (int64_t r = 0; r < (per_tensor ? 1 : rows); ++r) s.push_back(f32_to_bf16(q.row_scales[static_cast<size_t>(r)]));
      fp8.add_values(name + "_scale", "BF16", per_tensor ? std::vector<int64_t>{1} : std::vector<int64_t>{rows, 1}, s);
    }
    written[name] = std::move(q);
  }
  fp8.write(fp8_dir);
  plain.write(plain_dir);

  nlohmann::json config = read_json(src + "/config.json");
  write_json(plain_dir + "/config.json", config);
  switch (layout) {
    case Layout::ModelOptChannel:
      config["quantization_config"] = {{"quant_method", "modelopt"}, {"quant_algo", "FP8_PER_CHANNEL_PER_TOKEN"},
                                       {"ignore", ignore}};
      break;
    case Layout::ModelOptTensorHf:
      write_json(fp8_dir + "/hf_quant_config.json",
                 {{"producer", {{"name", "modelopt"}, {"version", "0.33.0"}}},
                  {"quantization", {{"quant_algo", "FP8"}, {"kv_cache_quant_algo", nullptr},
                                    {"exclude_modules", ignore.empty() ? std::vector<std::string>{"lm_head"} : ignore}}}});
      break;
    case Layout::CtChannel:
    case Layout::CtTensor: {
      // The ignore entries as llm-compressor writes them: a regular expression for the output table, names else.
      std::vector<std::string> ct_ignore = {"re:.*lm_head"};
      for (const std::string& m : ignore) ct_ignore.push_back(m);
      config["quantization_config"] = {
          {"quant_method", "compressed-tensors"},
          {"format", "float-quantized"},
          {"quantization_status", "compressed"},
          {"config_groups",
           {{"group_0",
             {{"targets", {"Linear"}},
              {"weights", {{"num_bits", 8}, {"type", "float"}, {"strategy", per_tensor ? "tensor" : "channel"},
                           {"symmetric", true}, {"dynamic", false}, {"group_size", nullptr}}},
              {"input_activations", {{"num_bits", 8}, {"type", "float"}, {"strategy", "token"}, {"dynamic", true},
                                     {"symmetric", true}}},
              {"output_activations", nullptr}}}}},
          {"ignore", ct_ignore},
          {"kv_cache_scheme", nullptr}};
      break;
    }
  }
  write_json(fp8_dir + "/config.json", config);
  return written;
}

// The FP8 checkpoint `fp8_dir` (any layout) with every FP8 weight dequantized to f32, as a plain checkpoint.
void write_dequantized(const std::string& fp8_dir, const std::string& plain_dir) {
  fs::create_directories(plain_dir);
  const Checkpoint ck(fp8_dir);
  DirWriter plain;
  for (const std::string& n : ck.weight_names()) {
    const Weight w = *ck.weight(n);
    if (w.dense()) {
      plain.add_view(n, w.data);
      continue;
    }
    std::vector<float> deq(static_cast<size_t>(w.numel()));
    const int64_t cols = w.dim(w.ndim - 1);
    for (size_t i = 0; i < deq.size(); ++i)
      deq[i] = fp8_e4m3_to_float(w.data.ptr<const uint8_t>()[i]) * w.scale.ptr<const float>()[i / static_cast<size_t>(cols)];
    plain.add_values(n, "F32", std::vector<int64_t>(w.shape.begin(), w.shape.begin() + w.ndim), deq);
  }
  plain.write(plain_dir);
  nlohmann::json config = read_json(fp8_dir + "/config.json");
  config.erase("quantization_config");
  write_json(plain_dir + "/config.json", config);
}

std::unique_ptr<Model> load_cpu(const std::string& dir) {
  LoadOptions lo;
  lo.device = DeviceChoice::CPU;
  lo.threads = 2;
  return Model::load(dir, lo);
}

std::vector<float> logits_of(const std::string& dir, int64_t n_tokens = 13) {
  auto model = load_cpu(dir);
  auto st = model->create_state(1);
  const auto ids = test::random_tokens(n_tokens, model->config().vocab_size, 7);
  Sequence s = Sequence::tokens(ids);
  return model->forward(*st, {&s, 1}, Output::AllLogits).values;
}

// Every transformers fixture model (all families: Mamba-1/2, FalconMamba, mamba_ssm .bin layouts, Bamba, Granite-4.0-H,
// Nemotron-H, Falcon-H1, Jamba, the MoE variants).
std::vector<std::string> every_fixture_model() {
  std::vector<std::string> dirs;
  for (const char* group : {"models", "checkpoints", "hybrid", "falcon_h1", "moe"})
    for (const auto& e : fs::directory_iterator(test::fixture_dir() + "/" + group))
      if (fs::exists(e.path() / "config.json") && fs::exists(e.path() / "logits.npy")) dirs.push_back(e.path().string());
  std::sort(dirs.begin(), dirs.end());
  return dirs;
}

void expect_loaded_weights(const std::string& fp8_dir, const std::map<std::string, Quantized>& written) {
  const Checkpoint ck(fp8_dir);
  ASSERT_TRUE(ck.quant().quantized());
  for (const auto& [name, q] : written) {
    SCOPED_TRACE(name);
    const std::optional<Weight> w = ck.weight(name);
    ASSERT_TRUE(w.has_value());
    ASSERT_EQ(w->format, WeightFormat::FP8_E4M3);
    ASSERT_EQ(w->numel(), static_cast<int64_t>(q.bytes.size()));
    ASSERT_EQ(w->scale.dtype, DType::F32);
    ASSERT_EQ(w->scale.numel(), w->dim(0)) << "a per-tensor scale is broadcast to every row";
    EXPECT_EQ(0, std::memcmp(w->data.data, q.bytes.data(), q.bytes.size()));
    const float* s = w->scale.ptr<const float>();
    for (int64_t r = 0; r < w->dim(0); ++r) ASSERT_EQ(s[r], q.row_scales[static_cast<size_t>(r)]) << "row " << r;
    // The dequantized values, as a kernel sees them.
    std::vector<float> deq(q.bytes.size());
    fp8_dequantize_rows(w->data.ptr<const uint8_t>(), w->dim(0), w->dim(1), s, false, deq.data());
    for (size_t i = 0; i < deq.size(); ++i)
      ASSERT_EQ(deq[i], fp8_e4m3_to_float(q.bytes[i]) * q.row_scales[i / static_cast<size_t>(w->dim(1))]);
  }
  for (const std::string& n : ck.weight_names())
    EXPECT_FALSE(ends_with(n, "_scale")) << n << " should have been folded into its weight";
}

TEST(Fp8Checkpoint, EveryLayoutLoadsTheWrittenWeightsAndRunsAsTheDequantizedModel) {
  // Awkward widths (18, 20, 36, 40, 102 and 14-row matrices) from tiny random models, plus a hybrid with attention,
  // MLP and MoE layers from the fixtures.
  test::TempDir tmp("fp8_layouts");
  test::write_random_model(tmp.file("m1"), test::tiny_mamba1_config(), 3, DType::BF16);
  test::write_random_model(tmp.file("m2"), test::tiny_mamba2_config(), 4, DType::F32);
  const std::vector<std::string> sources = {tmp.file("m1"), tmp.file("m2"),
                                            test::fixture_dir() + "/hybrid/nemotron_h_f32",
                                            test::fixture_dir() + "/moe/granite_moe_f32"};
  const std::pair<Layout, const char*> layouts[] = {{Layout::ModelOptChannel, "modelopt_channel"},
                                                    {Layout::ModelOptTensorHf, "modelopt_tensor_hf"},
                                                    {Layout::CtChannel, "ct_channel"},
                                                    {Layout::CtTensor, "ct_tensor"}};
  for (const std::string& src : sources) {
    for (const auto& [layout, tag] : layouts) {
      SCOPED_TRACE(src + " as " + tag);
      const std::string base = tmp.file(fs::path(src).filename().string() + "_" + tag);
      const auto written = write_fp8_checkpoint(src, base + "_fp8", base + "_plain", layout);
      ASSERT_FALSE(written.empty());
      expect_loaded_weights(base + "_fp8", written);
      const auto fp8 = logits_of(base + "_fp8"), plain = logits_of(base + "_plain");
      ASSERT_EQ(fp8.size(), plain.size());
      EXPECT_EQ(test::max_rel_diff(fp8, plain), 0.0);
    }
  }
}

TEST(Fp8Checkpoint, QuantizeWritesModelOptThatLoadsBackBitForBitInEveryFamily) {
  test::TempDir tmp("fp8_quantize");
  for (const std::string& src : every_fixture_model()) {
    SCOPED_TRACE(src);
    const std::string name = fs::path(src).filename().string();
    const std::string out = tmp.file(name + "_fp8");
    int64_t last_done = 0, calls = 0;
    const Fp8QuantizeReport r = quantize_to_fp8_checkpoint(src, out, [&](int64_t done, int64_t total) {
      EXPECT_EQ(done, last_done + 1);
      last_done = done, ++calls;
      EXPECT_LE(done, total);
    });
    EXPECT_GT(r.quantized, 0);
    EXPECT_EQ(calls, r.quantized + r.kept);

    // The weights: each projection exactly fp8_quantize_rows of the source values, everything else the source bytes.
    const Checkpoint source(src), back(out);
    ASSERT_EQ(back.quant().method, QuantMethod::ModelOpt);
    EXPECT_EQ(back.quant().algo, "FP8_PER_CHANNEL_PER_TOKEN");
    EXPECT_EQ(back.weight_names(), source.weight_names());
    std::map<std::string, Quantized> expected;
    for (const std::string& n : source.weight_names()) {
      SCOPED_TRACE(n);
      const TensorView& v = *source.find(n);
      const std::optional<Weight> w = back.weight(n);
      ASSERT_TRUE(w.has_value());
      if (!is_projection(n, v)) {
        ASSERT_TRUE(w->dense());
        ASSERT_EQ(w->data.dtype, v.dtype);
        ASSERT_EQ(w->data.nbytes(), v.nbytes());
        EXPECT_EQ(0, std::memcmp(w->data.data, v.data, v.nbytes()));
        continue;
      }
      Quantized q;
      q.bytes.resize(static_cast<size_t>(v.numel()));
      q.row_scales.resize(static_cast<size_t>(v.dim(0)));
      fp8_quantize_rows(values_of(v).data(), v.dim(0), v.dim(1), q.bytes.data(), q.row_scales.data());
      expected[n] = std::move(q);
    }
    expect_loaded_weights(out, expected);
    // The other files come along; the config declares ModelOpt in both of its spellings.
    EXPECT_TRUE(fs::exists(out + "/hf_quant_config.json"));
    if (fs::exists(src + "/tokens.txt")) EXPECT_TRUE(fs::exists(out + "/tokens.txt"));
    EXPECT_FALSE(fs::exists(out + "/pytorch_model.bin"));

    // Quantizing the FP8 directory again passes its FP8 weights through unchanged.
    const std::string again = tmp.file(name + "_fp8_again");
    quantize_to_fp8_checkpoint(out, again);
    expect_loaded_weights(again, expected);

    // The model runs: its logits are those of the dequantized weights (exact, see the top), and near the 16-bit
    // model's (e4m3 keeps 3 mantissa bits: a few percent of the largest logit through these tiny models).
    const std::string plain = tmp.file(name + "_plain");
    write_dequantized(out, plain);
    const auto fp8 = logits_of(out), deq = logits_of(plain), full = logits_of(src);
    EXPECT_EQ(test::max_rel_diff(fp8, deq), 0.0);
    const double vs_full = test::max_rel_diff(fp8, full);
    std::printf("[fp8 quantize] %-34s max |fp8 - 16-bit| / max |16-bit| = %.3f\n", name.c_str(), vs_full);
    EXPECT_LT(vs_full, 0.25);
  }
}

TEST(Fp8Checkpoint, QuantizeReadsGgufFiles) {
  // An f32 GGUF holds the source's projection values exactly, so its FP8 weights are those of the source checkpoint.
  test::TempDir tmp("fp8_gguf");
  test::write_random_model(tmp.file("src"), test::tiny_mamba2_config(), 9);
  quantize_to_gguf(tmp.file("src"), "f32", tmp.file("m.gguf"));
  quantize_to_fp8_checkpoint(tmp.file("m.gguf"), tmp.file("out"));
  const Checkpoint source(tmp.file("src")), back(tmp.file("out"));
  int64_t compared = 0;
  for (const std::string& n : source.weight_names()) {
    const TensorView& v = *source.find(n);
    if (!is_projection(n, v)) continue;
    SCOPED_TRACE(n);
    const std::optional<Weight> w = back.weight(n);
    ASSERT_TRUE(w.has_value());
    ASSERT_EQ(w->format, WeightFormat::FP8_E4M3);
    std::vector<uint8_t> bytes(static_cast<size_t>(v.numel()));
    std::vector<float> scales(static_cast<size_t>(v.dim(0)));
    fp8_quantize_rows(values_of(v).data(), v.dim(0), v.dim(1), bytes.data(), scales.data());
    EXPECT_EQ(0, std::memcmp(w->data.data, bytes.data(), bytes.size()));
    EXPECT_EQ(0, std::memcmp(w->scale.data, scales.data(), scales.size() * sizeof(float)));
    ++compared;
  }
  EXPECT_EQ(compared, 2 * test::tiny_mamba2_config().n_layer);
  EXPECT_EQ(logits_of(tmp.file("out")).size(), 13u * static_cast<size_t>(test::tiny_mamba2_config().vocab_size));
}

TEST(Fp8Checkpoint, GgufExportDequantizesTheFp8Weights) {
  // llama.cpp has no FP8 type: an FP8 checkpoint goes to GGUF as its e4m3 bytes times their scales, the values the
  // CPU runs the checkpoint with. So the f32 file's logits are the checkpoint's within the f32 GGUF round trip's
  // 1e-5 (gguf_model_test: A_log goes through -exp and log); reading the bytes without their scales, or as integers,
  // moves them by far more.
  test::TempDir tmp("fp8_to_gguf");
  test::write_random_model(tmp.file("src"), test::tiny_mamba2_config(), 9);
  quantize_to_fp8_checkpoint(tmp.file("src"), tmp.file("fp8"));
  quantize_to_gguf(tmp.file("fp8"), "f32", tmp.file("m.gguf"));
  const std::vector<float> fp8 = logits_of(tmp.file("fp8")), gguf = logits_of(tmp.file("m.gguf"));
  ASSERT_EQ(fp8.size(), gguf.size());
  float peak = 0.0f, diff = 0.0f;
  for (size_t i = 0; i < fp8.size(); ++i) {
    ASSERT_TRUE(std::isfinite(gguf[i])) << i;
    peak = std::max(peak, std::fabs(fp8[i]));
    diff = std::max(diff, std::fabs(fp8[i] - gguf[i]));
  }
  EXPECT_LE(diff, 1e-5f * peak);
  // A block format from FP8 (requantized, as llama.cpp's --allow-requantize) loads and runs.
  quantize_to_gguf(tmp.file("fp8"), "q8_0", tmp.file("q.gguf"));
  EXPECT_EQ(logits_of(tmp.file("q.gguf")).size(), fp8.size());
}

TEST(Fp8Checkpoint, QuantizeCliPrintsProgressAndRefusesANonEmptyOut) {
  test::TempDir tmp("fp8_cli");
  test::write_random_model(tmp.file("src"), test::tiny_mamba2_config(), 5);
  std::ofstream(tmp.file("src") + "/tokenizer_config.json") << "{}";
  const test::CliResult ok = test::run_cli("quantize --model " + tmp.file("src") + " --type fp8 --out " + tmp.file("out"));
  ASSERT_EQ(ok.exit_code, 0) << ok.output();
  EXPECT_THAT(ok.err, AllOf(HasSubstr("quantizing: tensor"), HasSubstr("wrote " + tmp.file("out"))));
  EXPECT_TRUE(fs::exists(tmp.file("out") + "/tokenizer_config.json"));
  const test::CliResult again =
      test::run_cli("quantize --model " + tmp.file("src") + " --type fp8 --out " + tmp.file("out"));
  EXPECT_NE(again.exit_code, 0);
  EXPECT_THAT(again.output(), HasSubstr("is not an empty directory"));
}

// ---- Refusals ---------------------------------------------------------------------------------------------------

class Fp8Refusals : public ::testing::Test {
 protected:
  void SetUp() override {
    test::write_random_model(tmp_.file("src"), test::tiny_mamba2_config(), 6);
    write_fp8_checkpoint(tmp_.file("src"), dir(), tmp_.file("plain"), Layout::CtChannel);
    ASSERT_NO_THROW(Checkpoint{dir()});
    config_ = read_json(dir() + "/config.json");
  }
  std::string dir() const { return tmp_.file("fp8"); }
  nlohmann::json config() const { return config_; }  // as written, before any case changed it
  std::string error_with_config(const nlohmann::json& c) {
    write_json(dir() + "/config.json", c);
    return test::error_of([&] { Checkpoint{dir()}; });
  }
  nlohmann::json& group(nlohmann::json& c) { return c["quantization_config"]["config_groups"]["group_0"]; }
  test::TempDir tmp_{"fp8_refusals"};
  nlohmann::json config_;
};

TEST_F(Fp8Refusals, OtherQuantMethodsNameTheirKey) {
  for (const char* method : {"awq", "gptq", "bitsandbytes", "fp8"}) {
    nlohmann::json c = config();
    c["quantization_config"] = {{"quant_method", method}, {"weight_block_size", {128, 128}}};
    EXPECT_THAT(error_with_config(c), AllOf(HasSubstr("quantization_config.quant_method"),
                                            HasSubstr(std::string("\"") + method + "\""), HasSubstr("supported")));
  }
}

TEST_F(Fp8Refusals, ModelOptBlockWiseAndUnknownAlgorithms) {
  nlohmann::json c = config();
  c["quantization_config"] = {{"quant_method", "modelopt"}, {"quant_algo", "FP8_PB_WO"}};
  EXPECT_THAT(error_with_config(c), AllOf(HasSubstr("quant_algo"), HasSubstr("FP8_PB_WO"), HasSubstr("block-wise"),
                                          HasSubstr("FP8, FP8_PER_CHANNEL_PER_TOKEN")));
  c["quantization_config"] = {{"quant_method", "modelopt"}, {"quant_algo", "NVFP4"}};
  EXPECT_THAT(error_with_config(c), AllOf(HasSubstr("quant_algo"), HasSubstr("NVFP4")));
  c["quantization_config"] = {{"quant_method", "modelopt"}, {"quant_algo", "FP8"}, {"kv_cache_quant_algo", "NVFP4"}};
  EXPECT_THAT(error_with_config(c), AllOf(HasSubstr("kv_cache_quant_algo"), HasSubstr("NVFP4")));
}

TEST_F(Fp8Refusals, CompressedTensorsVariantsNameTheirKey) {
  struct Case {
    const char* key;
    nlohmann::json value;
    const char* in;  // "weights" or "input_activations"
  };
  const Case cases[] = {{"strategy", "block", "weights"},          {"strategy", "group", "weights"},
                        {"type", "int", "weights"},                {"num_bits", 4, "weights"},
                        {"group_size", 128, "weights"},            {"block_structure", {128, 128}, "weights"},
                        {"dynamic", false, "input_activations"}};
  for (const Case& k : cases) {
    nlohmann::json c = config();
    group(c)[k.in][k.key] = k.value;
    EXPECT_THAT(error_with_config(c), AllOf(HasSubstr(std::string(k.in) + "." + k.key), HasSubstr(k.value.dump()),
                                            HasSubstr("not supported")))
        << k.key;
  }
  nlohmann::json c = config();
  c["quantization_config"]["format"] = "pack-quantized";
  EXPECT_THAT(error_with_config(c), AllOf(HasSubstr("format"), HasSubstr("pack-quantized")));
  c = config();
  group(c)["output_activations"] = {{"num_bits", 8}};
  EXPECT_THAT(error_with_config(c), HasSubstr("output_activations"));
}

TEST_F(Fp8Refusals, TensorsThatContradictTheDeclaration) {
  // An ignored module stored in FP8.
  nlohmann::json c = config();
  c["quantization_config"]["ignore"].push_back("re:.*layers\\.0\\.mixer\\.in_proj");
  EXPECT_THAT(error_with_config(c), AllOf(HasSubstr("backbone.layers.0.mixer.in_proj"), HasSubstr("ignore entry"),
                                          HasSubstr("F8_E4M3")));
  // F8_E4M3 bytes without any declaration.
  c = config();
  c.erase("quantization_config");
  EXPECT_THAT(error_with_config(c), AllOf(HasSubstr("stored as F8_E4M3"), HasSubstr("declares no quantization")));
}

TEST(Fp8CheckpointScales, CheckedConsumedOrRefused) {
  test::TempDir tmp("fp8_scales");
  test::write_random_model(tmp.file("src"), test::tiny_mamba2_config(), 8);
  const std::string w = "backbone.layers.1.mixer.out_proj.weight";  // [18, 36]
  nlohmann::json decl = {{"quant_method", "modelopt"}, {"quant_algo", "FP8"}};
  auto write = [&](const std::string& scale_dtype, std::vector<int64_t> shape, std::vector<float> scale,
                   bool with_scale, const std::string& extra = "") {
    const std::string dir = tmp.file("case");
    fs::remove_all(dir);
    fs::create_directories(dir);
    const Checkpoint src(tmp.file("src"));
    DirWriter out;
    for (const std::string& n : src.names()) {
      if (n != w) {
        out.add_view(n, *src.find(n));
        continue;
      }
      out.add(n, "F8_E4M3", {18, 36}, std::vector<uint8_t>(18 * 36, 0x38));  // 1.0
      if (with_scale) out.add_values(n + "_scale", scale_dtype, shape, scale);
    }
    if (!extra.empty()) out.add_values(extra, "F32", {}, std::vector<float>{1.0f});
    out.write(dir);
    nlohmann::json c = read_json(tmp.file("src") + "/config.json");
    c["quantization_config"] = decl;
    write_json(dir + "/config.json", c);
    return test::error_of([&] { Checkpoint{dir}; });
  };
  EXPECT_EQ(write("F32", {}, {0.5f}, true), "(no error)");
  EXPECT_THAT(write("F32", {}, {}, false), AllOf(HasSubstr(w), HasSubstr("has no '" + w + "_scale'")));
  EXPECT_THAT(write("F32", {1, 1}, std::vector<float>(1, 1.0f), true), HasSubstr("(no error)"));
  EXPECT_THAT(write("F32", {18, 2}, std::vector<float>(36, 1.0f), true),
              AllOf(HasSubstr(w + "_scale"), HasSubstr("[18, 2]"), HasSubstr("block-wise")));
  EXPECT_THAT(write("F32", {18}, std::vector<float>(18, -1.0f), true),
              AllOf(HasSubstr(w + "_scale"), HasSubstr("non-negative")));
  EXPECT_THAT(write("F32", {}, {0.5f}, true, "backbone.layers.0.mixer.in_proj.weight_scale"),
              AllOf(HasSubstr("backbone.layers.0.mixer.in_proj.weight_scale"), HasSubstr("no F8_E4M3 weight")));
  EXPECT_THAT(write("F32", {}, {0.5f}, true, "backbone.layers.0.mixer.k_scale"),
              AllOf(HasSubstr("k_scale"), HasSubstr("no FP8 KV cache")));
  // Declared, the KV-cache scale is checked and consumed (the KV cache stays 16-bit), and so is a static input scale.
  decl["kv_cache_quant_algo"] = "FP8";
  EXPECT_EQ(write("F32", {}, {0.5f}, true, "backbone.layers.0.mixer.k_scale"), "(no error)");
  EXPECT_EQ(write("F32", {}, {0.5f}, true, "backbone.layers.1.mixer.out_proj.input_scale"), "(no error)");
  EXPECT_EQ(Checkpoint(tmp.file("case")).weight_names(), Checkpoint(tmp.file("src")).weight_names());
  // A dynamic compressed-tensors declaration with a static input scale beside the weight contradicts itself.
  decl = nlohmann::json::parse(R"({"quant_method": "compressed-tensors", "config_groups": {"group_0": {
      "weights": {"num_bits": 8, "type": "float", "strategy": "tensor"},
      "input_activations": {"num_bits": 8, "type": "float", "dynamic": true}}}})");
  EXPECT_EQ(write("F32", {1}, {0.5f}, true), "(no error)");
  EXPECT_THAT(write("F32", {1}, {0.5f}, true, "backbone.layers.1.mixer.out_proj.input_scale"),
              AllOf(HasSubstr("out_proj.input_scale"), HasSubstr("dynamic input quantization")));
  // hf_quant_config.json and config.json must agree.
  decl = {{"quant_method", "modelopt"}, {"quant_algo", "FP8"}};
  write("F32", {}, {0.5f}, true);
  write_json(tmp.file("case") + "/hf_quant_config.json",
             {{"quantization", {{"quant_algo", "FP8_PER_CHANNEL_PER_TOKEN"}, {"exclude_modules", {"lm_head"}}}}});
  EXPECT_THAT(test::error_of([&] { Checkpoint{tmp.file("case")}; }),
              AllOf(HasSubstr("quant_algo"), HasSubstr("contradicts"), HasSubstr("hf_quant_config.json")));
}

TEST(Fp8CheckpointWildcards, ModelOptPatterns) {
  EXPECT_TRUE(wildcard_match("lm_head", "lm_head"));
  EXPECT_TRUE(wildcard_match("*router*", "model.layers.3.mlp.router.layer"));
  EXPECT_TRUE(wildcard_match("model.layers.0.mlp*", "model.layers.0.mlp.down_proj"));
  EXPECT_FALSE(wildcard_match("model.layers.0.mlp*", "model.layers.10.mlp.down_proj"));
  EXPECT_TRUE(wildcard_match("*.mixer.?n_proj", "backbone.layers.2.mixer.in_proj"));
  EXPECT_FALSE(wildcard_match("*.mixer.in_proj", "backbone.layers.2.mixer.in_proj_x"));
}

}  // namespace
}  // namespace mambacpp
