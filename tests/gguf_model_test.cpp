// Models through GGUF: every checkpoint fixture (transformers-made Mamba, Mamba-2, Nemotron-H, Granite-4.0-H, Bamba)
// written by our writer as F32 GGUF in llama.cpp's names and conventions, then loaded from the file, gives the
// checkpoint's logits within 1e-5 (the conversions -exp(A_log) and back, the [C, K] conv, [H, 1] A and D, the grouped
// ssm_norm, the split ffn_gate / ffn_up and tied embeddings all undone exactly, or the logits move by far more).
// Quantized files run on the CPU's reference kernels and equal, within f32 rounding, the F32 file of the same
// weights dequantized; each tensor's type is the one llama.cpp's quantizer would give it.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <span>
#include <utility>
#include <string>
#include <vector>

#include "io/checkpoint.h"
#include "io/gguf_export.h"
#include "io/gguf_file.h"
#include "io/gguf_model.h"
#include "mambacpp/model.h"
#include "support/test_support.h"

namespace mambacpp {
namespace {

namespace fs = std::filesystem;

std::unique_ptr<Model> load_cpu(const std::string& path) {
  LoadOptions lo;
  lo.device = DeviceChoice::CPU;
  lo.threads = 2;
  return Model::load(path, lo);
}

std::vector<float> logits_of(const Model& model, const std::vector<int32_t>& ids) {
  auto st = model.create_state(1);
  Sequence s = Sequence::tokens(ids);
  return model.forward(*st, {&s, 1}, Output::AllLogits).values;
}

fs::path scratch(const std::string& name) {
  const fs::path d = fs::temp_directory_path() / ("mambacpp_gguf_model_test_" + name);
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

void write_gguf(const std::string& dir, const std::string& out, GgufTarget target) {
  Checkpoint ck(dir);
  GgufWriter w;
  gguf_add_model(w, ck.config(), gguf_source_of(ck), target);
  w.write(out);
}

std::vector<std::string> fixture_dirs() {
  std::vector<std::string> dirs;
  for (const char* sub : {"models", "hybrid"}) {
    const fs::path root = fs::path(test::fixture_dir()) / sub;
    if (!fs::exists(root)) continue;
    for (const auto& e : fs::directory_iterator(root))
      if (fs::exists(e.path() / "config.json")) dirs.push_back(e.path().string());
  }
  std::sort(dirs.begin(), dirs.end());
  return dirs;
}

TEST(GgufModel, F32FilesGiveTheCheckpointsLogits) {
  const std::vector<std::string> dirs = fixture_dirs();
  ASSERT_GE(dirs.size(), 7u);
  int written = 0;
  for (const std::string& dir : dirs) {
    SCOPED_TRACE(dir);
    const ModelConfig c = Checkpoint(dir).config();
    const fs::path out = scratch("f32") / "m.gguf";
    if (c.arch == Arch::Mamba1 && c.use_bias) {
      // llama.cpp's mamba has no slot for in_proj / out_proj biases: refused, naming why.
      EXPECT_NE(test::error_of([&] { write_gguf(dir, out.string(), GgufTarget::F32); }).find("bias"),
                std::string::npos);
      continue;
    }
    write_gguf(dir, out.string(), GgufTarget::F32);
    ++written;
    auto ref = load_cpu(dir);
    auto g = load_cpu(out.string());
    EXPECT_EQ(g->config().n_layer, c.n_layer);
    EXPECT_EQ(g->config().layers, c.layers);
    EXPECT_EQ(g->config().tie_embeddings, c.tie_embeddings);
    const std::vector<int32_t> ids = test::random_tokens(23, c.vocab_size, 5);
    const std::vector<float> a = logits_of(*ref, ids), b = logits_of(*g, ids);
    ASSERT_EQ(a.size(), b.size());
    EXPECT_LE(test::max_rel_diff(b, a), 1e-5);
  }
  EXPECT_GE(written, 6);
}

TEST(GgufModel, TheFileHasLlamaCppsNamesAndConventions) {
  const fs::path d = scratch("names");
  test::write_random_model((d / "m2").string(), test::tiny_mamba2_config(), 3);
  write_gguf((d / "m2").string(), (d / "m2.gguf").string(), GgufTarget::F16);
  GgufFile f((d / "m2.gguf").string());
  const ModelConfig c = test::tiny_mamba2_config();
  EXPECT_EQ(f.get_string("general.architecture"), "mamba2");
  EXPECT_EQ(f.get_int("mamba2.ssm.time_step_rank"), c.n_heads);
  EXPECT_EQ(f.get_int("mamba2.ssm.group_count"), c.n_groups);
  EXPECT_EQ(f.get_int("general.file_type"), 1);
  EXPECT_EQ(f.tensor("output.weight"), nullptr);  // tied
  EXPECT_EQ(f.tensor("blk.1.ssm_conv1d.weight")->shape(), (std::vector<int64_t>{c.conv_channels(), c.d_conv}));
  EXPECT_EQ(f.tensor("blk.1.ssm_a")->shape(), (std::vector<int64_t>{c.n_heads, 1}));
  EXPECT_EQ(f.tensor("blk.1.ssm_d")->shape(), (std::vector<int64_t>{c.n_heads, 1}));
  EXPECT_EQ(f.tensor("blk.1.ssm_norm.weight")->shape(), (std::vector<int64_t>{c.n_groups, c.d_inner / c.n_groups}));
  EXPECT_EQ(f.tensor("blk.0.ssm_in.weight")->format, WeightFormat::F16);
  for (const char* kept : {"blk.0.ssm_conv1d.weight", "blk.0.ssm_a", "blk.0.ssm_d", "blk.0.ssm_dt.bias",
                           "blk.0.ssm_norm.weight", "blk.0.attn_norm.weight", "output_norm.weight"})
    EXPECT_EQ(f.tensor(kept)->format, WeightFormat::F32) << kept;
  // ssm_a holds A = -exp(A_log).
  Checkpoint ck((d / "m2").string());
  const TensorView* alog = ck.find("backbone.layers.1.mixer.A_log");
  const float* a = reinterpret_cast<const float*>(f.tensor("blk.1.ssm_a")->data);
  for (int64_t h = 0; h < c.n_heads; ++h)
    EXPECT_FLOAT_EQ(a[h], -std::exp(alog->ptr<const float>()[h]));
}

// A model whose rows are whole K-quant blocks, so each target's own types are used, not only the fallbacks.
ModelConfig block_config(Arch arch) {
  ModelConfig c = arch == Arch::Mamba1 ? test::tiny_mamba1_config() : test::tiny_mamba2_config();
  c.d_model = 256;
  c.vocab_size = 40;
  c.use_bias = false;
  if (arch == Arch::Mamba1) {
    c.d_inner = 512;
    c.dt_rank = 32;  // ssm_dt rows of 32: Q4_K falls back to Q5_0, as in llama.cpp's Mamba-1 Q4_K_M files
  } else {
    c.d_inner = 512;
    c.head_dim = 64;
    c.n_heads = 8;
    c.n_groups = 2;
  }
  return c;
}

TEST(GgufModel, QuantizedFilesRunAndEqualTheirDequantizedWeights) {
  const fs::path d = scratch("quant");
  for (Arch arch : {Arch::Mamba1, Arch::Mamba2}) {
    const ModelConfig c = block_config(arch);
    const std::string src = (d / "src").string();
    fs::remove_all(src);
    test::write_random_model(src, c, 11);
    for (GgufTarget t : {GgufTarget::Q8_0, GgufTarget::Q4_K_M, GgufTarget::Q6_K}) {
      SCOPED_TRACE(std::string(arch_name(arch)) + " " + gguf_target_name(t));
      const std::string q = (d / "q.gguf").string(), deq = (d / "deq.gguf").string();
      write_gguf(src, q, t);
      GgufModel gm(q);
      // The dequantized weights as an F32 file: the exact values the quantized file's kernels multiply by.
      GgufWriter w;
      gguf_add_model(w, gm.config(), [&gm](const std::string& n) { return gm.find(n); }, GgufTarget::F32);
      w.write(deq);
      const std::vector<int32_t> ids = test::random_tokens(9, c.vocab_size, 2);
      const std::vector<float> a = logits_of(*load_cpu(q), ids), b = logits_of(*load_cpu(deq), ids);
      // Q8_0 / Q4_K / Q6_K matrices run with int8 activations (backend/cpu/packed_kernels.h): each activation within
      // half its block's scale (max|x| / 254) of its f32 value, which moves these logits by up to ~1.5%; the kernels'
      // exact bounds are tested in packed_kernels_test.cpp.
      EXPECT_LE(test::max_rel_diff(a, b), 3e-2);
      {
        // Chunked (the state carried between calls) == one pass, on the packed kernels.
        auto qm = load_cpu(q);
        auto st = qm->create_state(1);
        std::vector<float> chunked;
        for (auto [from, n] : {std::pair<size_t, size_t>{0, 4}, {4, 5}}) {
          Sequence s = Sequence::tokens(std::span<const int32_t>(ids.data() + from, n));
          const std::vector<float> part = qm->forward(*st, {&s, 1}, Output::AllLogits).values;
          chunked.insert(chunked.end(), part.begin(), part.end());
        }
        EXPECT_LE(test::max_rel_diff(chunked, a), 1e-5);
      }
      // And near the unquantized model (the quantization error itself: loose, but a wrong scale is far outside).
      const std::vector<float> orig = logits_of(*load_cpu(src), ids);
      EXPECT_LE(test::max_rel_diff(a, orig), t == GgufTarget::Q4_K_M ? 0.3 : 0.1);
      const GgufFile& f = gm.file();
      const WeightFormat main = t == GgufTarget::Q8_0 ? WeightFormat::Q8_0
                                : t == GgufTarget::Q6_K ? WeightFormat::Q6_K
                                                        : WeightFormat::Q4_K;
      EXPECT_EQ(f.tensor("blk.0.ssm_in.weight")->format, main);
      EXPECT_EQ(f.tensor("blk.1.ssm_out.weight")->format, main);
      // The output matrix (token_embd when tied) gets Q6_K in K files; an untied token_embd the file's type.
      const WeightFormat out = t == GgufTarget::Q8_0 ? WeightFormat::Q8_0 : WeightFormat::Q6_K;
      EXPECT_EQ(f.tensor("token_embd.weight")->format, c.tie_embeddings ? out : main);
      if (!c.tie_embeddings) EXPECT_EQ(f.tensor("output.weight")->format, out);
      EXPECT_EQ(f.tensor("blk.0.ssm_conv1d.weight")->format, WeightFormat::F32);
      if (arch == Arch::Mamba1) {
        EXPECT_EQ(f.tensor("blk.0.ssm_dt.weight")->format,
                  t == GgufTarget::Q8_0 ? WeightFormat::Q8_0 : t == GgufTarget::Q6_K ? WeightFormat::Q8_0 : WeightFormat::Q5_0);
        EXPECT_EQ(f.tensor("blk.0.ssm_a")->format, WeightFormat::F32);
      }
    }
  }
}

TEST(GgufTensorType, FollowsLlamaCppsQuantizer) {
  const std::vector<int64_t> m = {4096, 4096}, odd = {4096, 48}, row32 = {4096, 160};
  EXPECT_EQ(gguf_tensor_type(GgufTarget::Q4_K_M, "blk.0.ssm_in.weight", m, true, 0, 0), WeightFormat::Q4_K);
  EXPECT_EQ(gguf_tensor_type(GgufTarget::Q4_K_M, "token_embd.weight", m, true, 0, 0), WeightFormat::Q6_K);
  EXPECT_EQ(gguf_tensor_type(GgufTarget::Q4_K_M, "token_embd.weight", m, false, 0, 0), WeightFormat::Q4_K);
  EXPECT_EQ(gguf_tensor_type(GgufTarget::Q4_K_M, "output.weight", m, false, 0, 0), WeightFormat::Q6_K);
  EXPECT_EQ(gguf_tensor_type(GgufTarget::Q8_0, "output.weight", m, false, 0, 0), WeightFormat::Q8_0);
  EXPECT_EQ(gguf_tensor_type(GgufTarget::Q4_K_M, "blk.0.ssm_dt.weight", row32, true, 0, 0), WeightFormat::Q5_0);
  EXPECT_EQ(gguf_tensor_type(GgufTarget::Q4_K_M, "blk.0.ssm_dt.weight", odd, true, 0, 0), WeightFormat::F16);
  EXPECT_EQ(gguf_tensor_type(GgufTarget::Q6_K, "blk.0.ssm_dt.weight", row32, true, 0, 0), WeightFormat::Q8_0);
  EXPECT_EQ(gguf_tensor_type(GgufTarget::Q4_K_M, "blk.0.ssm_conv1d.weight", {4096, 4}, true, 0, 0), WeightFormat::F32);
  EXPECT_EQ(gguf_tensor_type(GgufTarget::Q4_K_M, "blk.0.ssm_a", m, true, 0, 0), WeightFormat::F32);
  EXPECT_EQ(gguf_tensor_type(GgufTarget::Q4_K_M, "blk.0.ssm_norm.weight", {8, 512}, true, 0, 0), WeightFormat::F32);
  EXPECT_EQ(gguf_tensor_type(GgufTarget::BF16, "blk.0.ssm_in.weight", m, true, 0, 0), WeightFormat::BF16);
  // Q4_K_M's extra bits: ffn_down / attn_v of the first and last eighth of their layers and every third between.
  std::vector<int> q6;
  for (int i = 0; i < 16; ++i)
    if (gguf_tensor_type(GgufTarget::Q4_K_M, "blk.x.ffn_down.weight", m, true, i, 16) == WeightFormat::Q6_K)
      q6.push_back(i);
  EXPECT_EQ(q6, (std::vector<int>{0, 1, 4, 7, 10, 13, 14, 15}));
}

TEST(GgufModel, RefusesWhatItCannotRunNamingIt) {
  const fs::path d = scratch("refuse");
  test::write_random_model((d / "m").string(), test::tiny_mamba2_config(), 3);
  write_gguf((d / "m").string(), (d / "m.gguf").string(), GgufTarget::F32);
  std::vector<uint8_t> bytes;
  {
    std::ifstream in(d / "m.gguf", std::ios::binary);
    bytes.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  auto with_arch = [&](const std::string& arch) {
    std::vector<uint8_t> b = bytes;
    const std::string from = "mamba2";
    // general.architecture's value is the first "mamba2" preceded by its u64 length 6.
    for (size_t i = 8; i + from.size() <= b.size(); ++i)
      if (std::equal(from.begin(), from.end(), b.begin() + static_cast<long>(i)) && b[i - 8] == 6) {
        const std::string to = arch.substr(0, 6);
        std::copy(to.begin(), to.end(), b.begin() + static_cast<long>(i));
        break;
      }
    const fs::path p = d / "x.gguf";
    std::ofstream(p, std::ios::binary).write(reinterpret_cast<const char*>(b.data()), static_cast<long>(b.size()));
    return test::error_of([&] { load_cpu(p.string()); });
  };
  EXPECT_NE(with_arch("jamba_").find("jamba_"), std::string::npos);
  // A tensor's shape that disagrees with the metadata names the tensor.
  GgufModel ok((d / "m.gguf").string());
  EXPECT_TRUE(ok.find("backbone.layers.0.mixer.A_log").has_value());
  EXPECT_FALSE(ok.find("nope").has_value());
}

}  // namespace
}  // namespace mambacpp
