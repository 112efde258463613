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
#include <tuple>
#include <vector>

#include "io/checkpoint.h"
#include "io/gguf_export.h"
#include "io/gguf_file.h"
#include "io/gguf_model.h"
#include "mambacpp/model.h"
#include "mambacpp/npy.h"
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

// Falcon-H1 forms llama.cpp's falcon-h1 runs differently, and MoE forms its nemotron_h_moe has no slot for, are
// refused naming the feature, not written without it.
TEST(GgufModel, TheWriterRefusesFormsLlamaCppLacksNamingThem) {
  const fs::path d = scratch("refuse_writer");
  const fs::path fix = test::fixture_dir();
  const std::pair<std::string, std::string> cases[] = {
      // A dense relu2 MLP layer beside expert layers (and shared-expert biases).
      {"moe/nemotron_h_moe_f32", "dense MLP layer"},
      {"falcon_h1/falcon_h1_gate_first_f32", "projectors_bias"}, {"falcon_h1/falcon_h1_norm_tied_f32", "mamba_proj_bias"}};
  for (const auto& [dir, named] : cases) {
    if (!fs::exists(fix / dir / "config.json")) continue;
    SCOPED_TRACE(dir);
    const std::string err = test::error_of([&] { write_gguf((fix / dir).string(), (d / "x.gguf").string(), GgufTarget::F32); });
    EXPECT_NE(err.find(named), std::string::npos) << err;
    EXPECT_FALSE(fs::exists(d / "x.gguf"));
  }
}

// The MoE families as llama.cpp's converter writes them (nemotron_h_moe; granitehybrid with ffn_*_exps and the shared
// MLP as ffn_*_shexp; jamba): written as F32 GGUF and read back, the checkpoint's logits within 1e-5 and its config;
// the experts stacked [E, rows, cols], the router kept f32, the keys llama.cpp reads.
TEST(GgufModel, MoeAndJambaFilesGiveTheCheckpointsLogits) {
  const fs::path fix = fs::path(test::fixture_dir()) / "moe";
  struct Case {
    const char* dir;
    const char* arch;
  };
  const Case cases[] = {{"nemotron_h_moe_all_f32", "nemotron_h_moe"}, {"granite_moe_all_f32", "granitehybrid"},
                        {"granite_moe_f32", "granitehybrid"},         {"jamba_f32", "jamba"},
                        {"jamba_other_layout_f32", "jamba"}};
  for (const Case& k : cases) {
    const std::string dir = (fix / k.dir).string();
    ASSERT_TRUE(fs::exists(fs::path(dir) / "config.json")) << dir;
    SCOPED_TRACE(dir);
    const ModelConfig c = Checkpoint(dir).config();
    ASSERT_GT(c.moe.n_experts, 0);
    const fs::path out = scratch("moe") / "m.gguf";
    write_gguf(dir, out.string(), GgufTarget::F32);
    {
      GgufFile f(out.string());
      const std::string a = k.arch;
      EXPECT_EQ(f.get_string("general.architecture"), a);
      EXPECT_EQ(f.get_int(a + ".expert_count"), c.moe.n_experts);
      EXPECT_EQ(f.get_int(a + ".expert_used_count"), c.moe.top_k);
      int stacked = 0, routers = 0;
      for (const GgufTensor& t : f.tensors()) {
        if (t.name.find("_exps.weight") != std::string::npos) {
          ++stacked;
          ASSERT_EQ(t.n_dims, 3) << t.name;
          EXPECT_EQ(t.shape()[0], c.moe.n_experts) << t.name;
          const bool down = t.name.find("ffn_down_exps") != std::string::npos;
          EXPECT_EQ(t.shape()[1], down ? c.d_model : c.moe.expert_size) << t.name;
          EXPECT_EQ(t.shape()[2], down ? c.moe.expert_size : c.d_model) << t.name;
        }
        if (t.name.find("ffn_gate_inp.weight") != std::string::npos) {
          ++routers;
          EXPECT_EQ(t.shape(), (std::vector<int64_t>{c.moe.n_experts, c.d_model}));
        }
      }
      EXPECT_GT(routers, 0);
      // nemotron_h_moe's experts are relu2 (up, down); the others SwiGLU (gate, up, down).
      EXPECT_EQ(stacked, routers * (a == "nemotron_h_moe" ? 2 : 3));
      if (a == "nemotron_h_moe") {
        EXPECT_EQ(f.get_int(a + ".expert_shared_feed_forward_length"), c.moe.shared_size);
        EXPECT_EQ(f.get_int(a + ".expert_feed_forward_length"), c.moe.expert_size);
        EXPECT_NE(f.tensor("blk.1.exp_probs_b.bias"), nullptr);
        EXPECT_NE(f.tensor("blk.1.ffn_up_shexp.weight"), nullptr);
        EXPECT_EQ(f.tensor("blk.1.ffn_gate_exps.weight"), nullptr);
      }
      if (a == "granitehybrid") {
        EXPECT_EQ(f.get_int(a + ".feed_forward_length"), c.moe.expert_size);
        EXPECT_EQ(f.get_int(a + ".expert_shared_feed_forward_length"), c.mlp_size);
        EXPECT_NE(f.tensor("blk.0.ffn_gate_shexp.weight"), nullptr);
        EXPECT_EQ(f.tensor("blk.0.ffn_gate.weight"), nullptr);
      }
      if (a == "jamba") {
        EXPECT_NE(f.tensor("blk.0.ssm_dt_norm.weight"), nullptr);
        EXPECT_NE(f.tensor("blk.0.ffn_gate.weight"), nullptr);  // layer 0: the dense MLP
        EXPECT_EQ(f.tensor("blk.0.ffn_gate_inp.weight"), nullptr);
      }
    }
    auto ref = load_cpu(dir);
    auto g = load_cpu(out.string());
    const ModelConfig& gc = g->config();
    EXPECT_EQ(gc.family, c.family);
    EXPECT_EQ(gc.layers, c.layers);
    EXPECT_EQ(gc.moe.n_experts, c.moe.n_experts);
    EXPECT_EQ(gc.moe.top_k, c.moe.top_k);
    EXPECT_EQ(gc.moe.expert_size, c.moe.expert_size);
    EXPECT_EQ(gc.moe.routing, c.moe.routing);
    EXPECT_EQ(gc.moe.shared_size, c.moe.shared_size);
    EXPECT_EQ(gc.moe.norm_topk_prob, c.moe.norm_topk_prob);
    EXPECT_EQ(gc.moe.routed_scaling, c.moe.routed_scaling);
    EXPECT_EQ(gc.moe_layer_period > 0, c.moe_layer_period > 0);
    for (int64_t i = 0; i < c.n_layer; ++i) EXPECT_EQ(gc.mlp_has_experts(i), c.mlp_has_experts(i)) << i;
    if (c.family != Family::NemotronH) EXPECT_EQ(gc.mlp_size, c.mlp_size);  // (Nemotron-H MoE: no dense MLP)
    const std::vector<int32_t> ids = test::random_tokens(23, c.vocab_size, 7);
    const std::vector<float> a = logits_of(*ref, ids), b = logits_of(*g, ids);
    ASSERT_EQ(a.size(), b.size());
    EXPECT_LE(test::max_rel_diff(b, a), 1e-5);
    // And transformers' fp64 logits at the fixture's tokens (routing included: a flipped choice is far outside).
    const std::vector<int32_t> fixture_ids = test::read_token_ids(dir + "/tokens.txt");
    const NpyArray fx = read_npy(dir + "/logits.npy");
    const std::vector<float> fp64(fx.values.begin(), fx.values.end()), got = logits_of(*g, fixture_ids);
    ASSERT_EQ(got.size(), fp64.size());
    EXPECT_LE(test::max_rel_diff(got, fp64), 1e-4);
  }
}

// A nemotron_h_moe file with llama.cpp's appended multi-token-prediction block is refused naming the key, and one
// whose groups llama.cpp could not run (expert_group_count > 1 without expert_group_used_count) naming that key.
TEST(GgufModel, NemotronMoeFilesItCannotRunAreRefusedNamingTheKey) {
  const fs::path d = scratch("nemotron_moe_keys");
  const std::string src = (d / "m.gguf").string();
  write_gguf((fs::path(test::fixture_dir()) / "moe" / "nemotron_h_moe_all_f32").string(), src, GgufTarget::F32);
  const GgufFile f(src);
  auto with = [&](const std::string& key, uint32_t value) {
    GgufWriter w;
    for (const std::string& k : f.keys()) w.set(k, *f.find(k));
    w.set_u32(key, value);
    for (const GgufTensor& t : f.tensors())
      w.add_tensor(t.name, t.format, t.shape(), [&t](uint8_t* o) { std::memcpy(o, t.data, t.nbytes); });
    const std::string out = (d / "x.gguf").string();
    w.write(out);
    return test::error_of([&] { GgufModel m(out); });
  };
  EXPECT_EQ(with("nemotron_h_moe.expert_shared_count", 1), "(no error)");  // a key it knows, same value: loads
  EXPECT_NE(with("nemotron_h_moe.nextn_predict_layers", 1).find("nextn_predict_layers"), std::string::npos);
  EXPECT_NE(with("nemotron_h_moe.expert_group_count", 2).find("expert_group_used_count"), std::string::npos);
}

// The released checkpoints' per-expert tensors and transformers 5's fused ones give the same file.
TEST(GgufModel, PerExpertAndFusedCheckpointsGiveTheSameFile) {
  const fs::path fix = fs::path(test::fixture_dir()) / "moe";
  const fs::path d = scratch("layouts");
  write_gguf((fix / "jamba_f32").string(), (d / "a.gguf").string(), GgufTarget::Q8_0);
  write_gguf((fix / "jamba_other_layout_f32").string(), (d / "b.gguf").string(), GgufTarget::Q8_0);
  GgufFile a((d / "a.gguf").string()), b((d / "b.gguf").string());
  ASSERT_EQ(a.tensors().size(), b.tensors().size());
  for (size_t i = 0; i < a.tensors().size(); ++i) {
    const GgufTensor &x = a.tensors()[i], &y = b.tensors()[i];
    EXPECT_EQ(x.name, y.name);
    EXPECT_EQ(x.shape(), y.shape());
    ASSERT_EQ(x.nbytes, y.nbytes) << x.name;
    EXPECT_EQ(std::memcmp(x.data, y.data, x.nbytes), 0) << x.name;
  }
}

// Quantized MoE files run on the packed kernels and equal the F32 file of their dequantized weights; the routers stay
// f32 and the experts take the file's type (or llama.cpp's fallback for their row length).
TEST(GgufModel, QuantizedMoeFilesEqualTheirDequantizedWeights) {
  const fs::path fix = fs::path(test::fixture_dir()) / "moe";
  const fs::path d = scratch("moe_quant");
  for (const char* name : {"nemotron_h_moe_all_f32", "granite_moe_all_f32", "jamba_f32"}) {
    for (GgufTarget t : {GgufTarget::Q8_0, GgufTarget::Q4_K_M}) {
      SCOPED_TRACE(std::string(name) + " " + gguf_target_name(t));
      const std::string dir = (fix / name).string(), q = (d / "q.gguf").string(), deq = (d / "deq.gguf").string();
      write_gguf(dir, q, t);
      GgufModel gm(q);
      for (const GgufTensor& x : gm.file().tensors()) {
        if (x.name.find("ffn_gate_inp") != std::string::npos) EXPECT_EQ(x.format, WeightFormat::F32) << x.name;
        if (x.name.find("_exps.weight") != std::string::npos)
          EXPECT_FALSE(x.format == WeightFormat::F32) << x.name;
      }
      GgufWriter w;
      gguf_add_model(w, gm.config(), [&gm](const std::string& n) { return gm.find(n); }, GgufTarget::F32);
      w.write(deq);
      const int64_t vocab = gm.config().vocab_size;
      const std::vector<int32_t> ids = test::random_tokens(11, vocab, 3);
      const std::vector<float> a = logits_of(*load_cpu(q), ids), b = logits_of(*load_cpu(deq), ids);
      // As QuantizedFilesRunAndEqualTheirDequantizedWeights: the packed kernels' int8 activations.
      EXPECT_LE(test::max_rel_diff(a, b), 3e-2);
    }
  }
}

// Falcon-H1 as llama.cpp's converter writes it: the muP multipliers folded into the weights (one f32 product per
// multiplier), no multiplier keys, no ssm_norm where mamba_rms_norm is false. Read back, every multiplier is 1 and
// the logits are the checkpoint's (and transformers' fp64 ones, the fixture's) to f32 rounding; a multiplier left
// unfolded, folded twice or over the wrong rows of in_proj moves them by 1e-2 or more (the fixture's manifest).
TEST(GgufModel, FalconH1FilesFoldTheMultipliers) {
  const std::string dir = (fs::path(test::fixture_dir()) / "falcon_h1" / "falcon_h1_f32").string();
  const fs::path out = scratch("falcon_h1") / "m.gguf";
  write_gguf(dir, out.string(), GgufTarget::F32);
  const Checkpoint ck(dir);
  const ModelConfig& c = ck.config();
  {
    GgufFile f(out.string());
    EXPECT_EQ(f.get_string("general.architecture"), "falcon-h1");
    EXPECT_EQ(f.get_int("falcon-h1.attention.head_count_kv"), c.n_kv_heads);
    EXPECT_EQ(f.get_int("falcon-h1.ssm.time_step_rank"), c.n_heads);
    EXPECT_EQ(f.find("falcon-h1.embedding_scale"), nullptr);
    EXPECT_EQ(f.tensor("blk.0.ssm_norm.weight"), nullptr);  // mamba_rms_norm false
    auto folded = [&](const std::string& hf, const std::string& gguf, int64_t row, std::vector<double> factors) {
      SCOPED_TRACE(gguf);
      const TensorView* src = ck.find(hf);
      const GgufTensor* t = f.tensor(gguf);
      ASSERT_TRUE(src && t);
      const int64_t cols = src->shape[src->ndim - 1];
      const float* a = src->ptr<const float>() + row * cols;
      const float* b = reinterpret_cast<const float*>(t->data) + row * cols;
      for (int64_t i = 0; i < cols; ++i) {
        float v = a[i];
        for (double m : factors) v *= static_cast<float>(m);
        ASSERT_EQ(b[i], v) << "row " << row << " column " << i;
      }
    };
    const std::vector<double>& mup = c.ssm_multipliers;
    const int64_t di = c.d_inner, gn = c.n_groups * c.d_state;
    folded("model.embed_tokens.weight", "token_embd.weight", 3, {c.embedding_multiplier});
    folded("lm_head.weight", "output.weight", 5, {1.0 / c.logits_scaling});
    const std::string m = "model.layers.1.mamba.", a = "model.layers.1.self_attn.", ff = "model.layers.1.feed_forward.";
    const int64_t first_rows[5] = {0, di, 2 * di, 2 * di + gn, 2 * di + 2 * gn};
    for (int k = 0; k < 5; ++k) {  // the first and last row of each [z | x | B | C | dt] block
      const int64_t last = k < 4 ? first_rows[k + 1] - 1 : c.in_proj_size() - 1;
      for (int64_t r : {first_rows[k], last})
        folded(m + "in_proj.weight", "blk.1.ssm_in.weight", r, {c.ssm_in_multiplier, mup[static_cast<size_t>(k)]});
    }
    folded(m + "out_proj.weight", "blk.1.ssm_out.weight", 2, {c.ssm_out_multiplier});
    folded(a + "q_proj.weight", "blk.1.attn_q.weight", 1, {c.attn_in_multiplier});
    folded(a + "k_proj.weight", "blk.1.attn_k.weight", 1, {c.key_multiplier, c.attn_in_multiplier});
    folded(a + "v_proj.weight", "blk.1.attn_v.weight", 1, {c.attn_in_multiplier});
    folded(a + "o_proj.weight", "blk.1.attn_output.weight", 1, {c.attn_out_multiplier});
    folded(ff + "gate_proj.weight", "blk.1.ffn_gate.weight", 4, {c.mlp_gate_multiplier});
    folded(ff + "up_proj.weight", "blk.1.ffn_up.weight", 4, {});
    folded(ff + "down_proj.weight", "blk.1.ffn_down.weight", 4, {c.mlp_down_multiplier});
  }
  auto g = load_cpu(out.string());
  const ModelConfig& r = g->config();
  EXPECT_EQ(r.family, Family::FalconH1);
  EXPECT_EQ(r.layers, c.layers);
  EXPECT_FALSE(r.mamba_rms_norm);
  EXPECT_EQ(r.n_kv_heads, c.n_kv_heads);
  EXPECT_EQ(r.attn_head_dim, c.attn_head_dim);
  EXPECT_EQ(r.rope_theta, c.rope_theta);
  for (double x : {r.embedding_multiplier, r.logits_scaling, r.key_multiplier, r.attn_in_multiplier,
                   r.attn_out_multiplier, r.ssm_in_multiplier, r.ssm_out_multiplier, r.mlp_gate_multiplier,
                   r.mlp_down_multiplier})
    EXPECT_EQ(x, 1.0);
  for (double x : r.ssm_multipliers) EXPECT_EQ(x, 1.0);
  const std::vector<int32_t> ids = test::read_token_ids(dir + "/tokens.txt");
  const std::vector<float> got = logits_of(*g, ids), direct = logits_of(*load_cpu(dir), ids);
  const NpyArray ref = read_npy(dir + "/logits.npy");
  const std::vector<float> fp64(ref.values.begin(), ref.values.end());
  EXPECT_LE(test::max_rel_diff(got, direct), 1e-5);
  EXPECT_LE(test::max_rel_diff(got, fp64), 1e-4);
}

// The Falcon-H1 forms only the derived checkpoint holds alone (make_falcon_h1_variant.py): the gated RMSNorm after
// the gate (ssm_norm written, read back as mamba_rms_norm) and MLP biases (gate's and down's biases folded).
TEST(GgufModel, FalconH1NormAfterGateAndMlpBiasesReadBack) {
  const std::string dir =
      (fs::path(test::fixture_dir()) / "gguf_llamacpp" / "falcon_h1_norm_after_gate_mlp_bias").string();
  const fs::path out = scratch("falcon_h1_variant") / "m.gguf";
  write_gguf(dir, out.string(), GgufTarget::F32);
  const Checkpoint ck(dir);
  {
    GgufFile f(out.string());
    const ModelConfig& c = ck.config();
    ASSERT_TRUE(c.mamba_rms_norm && !c.mamba_norm_before_gate && c.mlp_bias);
    EXPECT_EQ(f.tensor("blk.2.ssm_norm.weight")->shape(), (std::vector<int64_t>{c.n_groups, c.d_inner / c.n_groups}));
    for (const auto& [hf, gguf, m] : {std::tuple<std::string, std::string, double>{"gate_proj.bias", "ffn_gate.bias",
                                                                                   c.mlp_gate_multiplier},
                                      {"up_proj.bias", "ffn_up.bias", 1.0},
                                      {"down_proj.bias", "ffn_down.bias", c.mlp_down_multiplier}}) {
      const TensorView* src = ck.find("model.layers.2.feed_forward." + hf);
      const float* stored = reinterpret_cast<const float*>(f.tensor("blk.2." + gguf)->data);
      for (int64_t i = 0; i < src->shape[0]; ++i)
        EXPECT_EQ(stored[i], src->ptr<const float>()[i] * static_cast<float>(m)) << gguf << " " << i;
    }
  }
  auto g = load_cpu(out.string());
  EXPECT_TRUE(g->config().mamba_rms_norm);
  EXPECT_FALSE(g->config().mamba_norm_before_gate);
  EXPECT_TRUE(g->config().mlp_bias);
  const std::vector<int32_t> ids = test::read_token_ids(dir + "/tokens.txt");
  EXPECT_LE(test::max_rel_diff(logits_of(*g, ids), logits_of(*load_cpu(dir), ids)), 1e-5);
}

// A tied Falcon-H1 (make_falcon_h1_variant.py tied) is written untied: token_embd times embedding_multiplier and
// output times lm_head_multiplier, both from the one matrix (llama.cpp's converter would leave output out and scale
// the shared matrix by embedding_multiplier alone, 2.5 where the logits need 0.7 here).
TEST(GgufModel, TiedFalconH1IsWrittenWithItsOwnOutput) {
  const std::string dir = (fs::path(test::fixture_dir()) / "gguf_llamacpp" / "falcon_h1_tied").string();
  const fs::path out = scratch("falcon_h1_tied") / "m.gguf";
  write_gguf(dir, out.string(), GgufTarget::F32);
  const Checkpoint ck(dir);
  const ModelConfig& c = ck.config();
  ASSERT_TRUE(c.tie_embeddings);
  ASSERT_NE(c.embedding_multiplier, 1.0 / c.logits_scaling);
  {
    GgufFile f(out.string());
    const TensorView* e = ck.find("model.embed_tokens.weight");
    const float* embd = reinterpret_cast<const float*>(f.tensor("token_embd.weight")->data);
    ASSERT_NE(f.tensor("output.weight"), nullptr);
    const float* output = reinterpret_cast<const float*>(f.tensor("output.weight")->data);
    for (int64_t i = 0; i < c.vocab_size * c.d_model; ++i) {
      ASSERT_EQ(embd[i], e->ptr<const float>()[i] * static_cast<float>(c.embedding_multiplier)) << i;
      ASSERT_EQ(output[i], e->ptr<const float>()[i] * static_cast<float>(1.0 / c.logits_scaling)) << i;
    }
  }
  auto g = load_cpu(out.string());
  EXPECT_FALSE(g->config().tie_embeddings);
  const std::vector<int32_t> ids = test::read_token_ids(dir + "/tokens.txt");
  EXPECT_LE(test::max_rel_diff(logits_of(*g, ids), logits_of(*load_cpu(dir), ids)), 1e-5);
}

// What llama.cpp's falcon-h1 has no slot or no computation for is refused naming the transformers key, not written
// into a file llama.cpp would load and run wrong.
TEST(GgufModel, FalconH1FormsLlamaCppRunsDifferentlyAreRefusedByName) {
  const std::string dir = (fs::path(test::fixture_dir()) / "falcon_h1" / "falcon_h1_f32").string();
  const Checkpoint ck(dir);
  const std::pair<void (*)(ModelConfig&), std::string> cases[] = {
      {[](ModelConfig& c) { c.use_bias = true; }, "mamba_proj_bias"},
      {[](ModelConfig& c) { c.mamba_out_proj_bias = true; }, "projectors_bias"},
      {[](ModelConfig& c) { c.attn_bias = true; }, "attention_bias"},
      {[](ModelConfig& c) { c.mamba_rms_norm = c.mamba_norm_before_gate = true; }, "mamba_norm_before_gate"}};
  for (const auto& [change, named] : cases) {
    ModelConfig c = ck.config();
    change(c);
    GgufWriter w;
    const std::string err = test::error_of([&] { gguf_add_model(w, c, gguf_source_of(ck), GgufTarget::F32); });
    EXPECT_NE(err.find(named), std::string::npos) << err;
    EXPECT_NE(err.find("falcon-h1"), std::string::npos) << err;
  }
  // Norm after the gate (norm(y * silu(z))) is llama.cpp's order: written.
  ModelConfig c = ck.config();
  c.mamba_rms_norm = true;
  c.mamba_norm_before_gate = false;
  EXPECT_EQ(test::error_of([&] { gguf_check_writable(c); }), "(no error)");
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
