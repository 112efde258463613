// Models through GGUF: every checkpoint fixture (transformers-made Mamba, Mamba-2, Nemotron-H, Granite-4.0-H, Bamba)
// written by our writer as F32 GGUF in llama.cpp's names and conventions, then loaded from the file, gives the
// checkpoint's logits within 1e-5 (the conversions -exp(A_log) and back, the [C, K] conv, [H, 1] A and D, the grouped
// ssm_norm, the split ffn_gate / ffn_up and tied embeddings all undone exactly, or the logits move by far more).
// Quantized files run on the CPU's reference kernels and equal, within f32 rounding, the F32 file of the same
// weights dequantized; each tensor's type is the one llama.cpp's quantizer would give it.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
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

// granitehybrid (Bamba here) as llama.cpp's converter writes it: q and k reordered within each head so that its RoPE
// on adjacent pairs rotates transformers' rotate-half pairs (stored row 2j + s of a head of d rows is row s * d/2 + j),
// and rope.scaling.finetuned set (llama.cpp's granitehybrid switch: false turns RoPE off whatever
// rope.dimension_count says). The file read back gives the checkpoint's rows in their own order; a file with the flag
// false runs without RoPE, as llama.cpp runs it.
TEST(GgufModel, GraniteHybridQueryAndKeyRowsAreInLlamaCppsRopeOrder) {
  const std::string dir = (fs::path(test::fixture_dir()) / "hybrid" / "bamba_f32").string();
  Checkpoint ck(dir);
  const ModelConfig& c = ck.config();
  ASSERT_GT(c.rope_theta, 0.0);
  const fs::path d = scratch("permute");
  const std::string out = (d / "b.gguf").string();
  write_gguf(dir, out, GgufTarget::F32);
  int64_t attn = -1;
  for (int64_t i = 0; i < c.n_layer && attn < 0; ++i)
    if (c.layer_kind(i) == LayerKind::Attention) attn = i;
  ASSERT_GE(attn, 0);
  {
    GgufFile f(out);
    EXPECT_TRUE(f.get_bool("granitehybrid.rope.scaling.finetuned", false));
    EXPECT_EQ(f.get_int("granitehybrid.rope.dimension_count"), c.rope_dim);
    const int64_t hd = c.attn_head_dim;
    for (const auto& [proj, heads] : {std::pair<std::string, int64_t>{"q", c.n_attn_heads}, {"k", c.n_kv_heads}}) {
      const TensorView* hf = ck.find("model.layers." + std::to_string(attn) + ".self_attn." + proj + "_proj.weight");
      const GgufTensor* t = f.tensor("blk." + std::to_string(attn) + ".attn_" + proj + ".weight");
      ASSERT_TRUE(hf && t) << proj;
      const float* stored = reinterpret_cast<const float*>(t->data);
      const float* src = hf->ptr<const float>();
      for (int64_t h = 0; h < heads; ++h)
        for (int64_t j = 0; j < hd / 2; ++j)
          for (int64_t s = 0; s < 2; ++s)
            for (int64_t col = 0; col < c.d_model; ++col)
              ASSERT_EQ(stored[(h * hd + 2 * j + s) * c.d_model + col], src[(h * hd + s * hd / 2 + j) * c.d_model + col])
                  << proj << " head " << h << " pair " << j;
    }
    GgufModel gm(out);
    EXPECT_EQ(gm.config().rope_dim, c.rope_dim);
    const std::string q = "model.layers." + std::to_string(attn) + ".self_attn.q_proj.weight";
    const Weight back = *gm.find(q);
    const TensorView& v = back.dense_view("test");
    ASSERT_EQ(v.dtype, DType::F32);
    ASSERT_EQ(back.numel(), ck.find(q)->numel());
    EXPECT_EQ(std::memcmp(v.ptr<const float>(), ck.find(q)->ptr<const float>(), static_cast<size_t>(back.numel()) * 4), 0);
  }
  // The same file with the flag cleared (a Granite-4.0-H file carries rope.dimension_count without it): no RoPE.
  GgufFile f(out);
  GgufWriter w;
  for (const std::string& k : f.keys()) w.set(k, *f.find(k));
  w.set_bool("granitehybrid.rope.scaling.finetuned", false);
  for (const GgufTensor& t : f.tensors())
    w.add_tensor(t.name, t.format, t.shape(), [&t](uint8_t* o) { std::memcpy(o, t.data, t.nbytes); });
  const std::string nope = (d / "nope.gguf").string();
  w.write(nope);
  EXPECT_EQ(GgufModel(nope).config().rope_dim, 0);
  EXPECT_EQ(GgufModel(nope).config().rope_theta, 0.0);
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

// llama.cpp's quantizer writes shapes without ggml's padding 1s (ssm_norm of one group as [d_inner], A and D as
// [heads]) where its converter and our writer keep them: such a file is the same model.
TEST(GgufModel, ShapesWithoutTheirOnesReadTheSame) {
  const fs::path d = scratch("squeezed");
  ModelConfig c = test::tiny_mamba2_config();
  c.n_groups = 1;
  test::write_random_model((d / "m").string(), c, 5);
  const std::string full = (d / "m.gguf").string(), squeezed = (d / "s.gguf").string();
  write_gguf((d / "m").string(), full, GgufTarget::F32);
  GgufFile f(full);
  GgufWriter w;
  for (const std::string& k : f.keys()) w.set(k, *f.find(k));
  int changed = 0;
  for (const GgufTensor& t : f.tensors()) {
    std::vector<int64_t> shape;
    for (int64_t x : t.shape())
      if (x != 1) shape.push_back(x);
    changed += shape != t.shape();
    w.add_tensor(t.name, t.format, shape, [&t](uint8_t* o) { std::memcpy(o, t.data, t.nbytes); });
  }
  EXPECT_GT(changed, 0);
  w.write(squeezed);
  const std::vector<int32_t> ids = {1, 5, 9, 2, 7};
  EXPECT_EQ(logits_of(*load_cpu(squeezed), ids), logits_of(*load_cpu(full), ids));
}

// Checkpoints whose llama.cpp conventions mambacpp does not write yet are refused naming the model kind, not
// written without their experts (a Granite MoE file of only its shared MLP loaded in llama.cpp and gave wrong logits).
TEST(GgufModel, TheWriterRefusesMoeFalconH1AndJambaNamingThem) {
  const fs::path d = scratch("refuse_writer");
  const fs::path fix = test::fixture_dir();
  const std::pair<std::string, std::string> cases[] = {
      {"moe/granite_moe_f32", "mixture-of-experts"}, {"moe/granite_moe_all_f32", "mixture-of-experts"},
      {"moe/nemotron_h_moe_f32", "nemotron_h_moe"},   {"moe/jamba_f32", "jamba"},
      {"falcon_h1/falcon_h1_f32", "falcon-h1"}};
  for (const auto& [dir, named] : cases) {
    if (!fs::exists(fix / dir / "config.json")) continue;
    SCOPED_TRACE(dir);
    const std::string err = test::error_of([&] { write_gguf((fix / dir).string(), (d / "x.gguf").string(), GgufTarget::F32); });
    EXPECT_NE(err.find(named), std::string::npos) << err;
    EXPECT_FALSE(fs::exists(d / "x.gguf"));
  }
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
