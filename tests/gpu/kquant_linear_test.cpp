// q4_k, q5_k and q6_k weights on the CUDA backend (backend/cuda/quant_ops.h): linear and embed against fp64 loops over the
// weights as ggml_dequantize_row gives them, on odd shapes (output counts no multiple of the GEMV's 8-feature blocks,
// widths of 1 and 3 super-blocks and a real 2560), GEMV row counts 1, 3, 16 and GEMM row counts 17, 64, with bias,
// strided rows and NaN-poisoned outputs; the GEMV's batch invariance bit for bit; and a random Q4_K_M GGUF (the
// writer of `mambacpp quantize`, so Q6_K embeddings beside Q4_K projections) on the GPU against the CPU's run of the
// same file and against the GPU's run of its weights dequantized to an F32 GGUF.
//
// Tolerances (max|got - ref| / max|ref|):
// - GEMV rows (T <= kQuantGemvMaxRows = 16): each weight is ggml's f32 value bit for bit, each product exact in the
//   fmaf, sums in f32 over at most 2560 terms: the f32 summation error is ~ sqrt(n) * 2^-24 of the terms' scale
//   (random signs), far below 2e-5, the bound the q8_0 / dense GEMV tests use.
// - More rows: the weights go through an f16 copy (each value rounded by up to 2^-12 relative, or 2^-25 absolute
//   below f16's normal range), which moves a dot product of random signs by ~2^-12 / sqrt(n) of its scale: 2e-3, as
//   q8_0's. Fast precision also rounds x to f16: 1e-2.
// - Embed: ggml's values bit for bit (the same f32 operations): 0 difference, checked with 1e-7.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <filesystem>
#include <functional>
#include <span>
#include <vector>

#include "backend/backend.h"
#include "core/ggml_blocks.h"
#include "core/weight.h"
#include "gpu/gpu_test_util.h"
#include "io/checkpoint.h"
#include "io/gguf_export.h"
#include "io/gguf_model.h"
#include "mambacpp/model.h"
#include "support/test_support.h"

namespace mambacpp {
namespace {

using gputest::DeviceArena;
using gputest::Rng;
using gputest::rel_err;

constexpr double kGemvTol = 2e-5;
constexpr double kGemmTol = 2e-3;
constexpr double kFastGemmTol = 1e-2;
constexpr int64_t kGemvRows = 16;

// A host k-quant matrix: its GGUF bytes and the values ggml's dequantizer gives (the reference's weights).
struct HostKQuant {
  WeightFormat format;
  int64_t out, in;
  std::vector<uint8_t> bytes;
  std::vector<float> deq;  // [out, in]

  Weight weight() { return Weight::packed(format, bytes.data(), {out, in}, Device::CPU); }
};

HostKQuant make_kquant(WeightFormat f, int64_t out, int64_t in, Rng& rng) {
  HostKQuant h{f, out, in, {}, {}};
  // Rows of different magnitudes (one of them tiny, below f16's normal range once scaled) exercise the scales; a
  // positive offset on some rows makes q4_k's and q5_k's mins matter.
  std::vector<float> w(static_cast<size_t>(out * in));
  for (int64_t o = 0; o < out; ++o) {
    const float mag = o % 7 == 3 ? 1e-4f : (o % 5 == 0 ? 2.0f : 0.1f);
    const float shift = o % 3 == 1 ? 0.5f * mag : 0.0f;
    for (int64_t i = 0; i < in; ++i) w[o * in + i] = rng.uniform(-mag, mag) + shift;
  }
  const int64_t rb = weight_row_bytes(f, in);
  h.bytes.resize(static_cast<size_t>(out * rb));
  h.deq.resize(w.size());
  for (int64_t o = 0; o < out; ++o) {
    ggml_quantize_row(f, &w[o * in], in, &h.bytes[o * rb]);
    ggml_dequantize_row(f, &h.bytes[o * rb], in, &h.deq[o * in]);
  }
  return h;
}

std::vector<double> linear_ref(const std::vector<float>& x, const HostKQuant& w, const std::vector<float>* bias,
                               int64_t T) {
  std::vector<double> ref(static_cast<size_t>(T * w.out));
  for (int64_t t = 0; t < T; ++t)
    for (int64_t o = 0; o < w.out; ++o) {
      double acc = bias ? (*bias)[o] : 0.0;
      for (int64_t i = 0; i < w.in; ++i) acc += double(x[t * w.in + i]) * w.deq[o * w.in + i];
      ref[t * w.out + o] = acc;
    }
  return ref;
}

struct Case {
  WeightFormat format;
  int64_t out, in;
};

std::vector<Case> cases() {
  std::vector<Case> cs;
  for (WeightFormat f : {WeightFormat::Q4_K, WeightFormat::Q5_K, WeightFormat::Q6_K}) {
    cs.push_back({f, 37, 256});   // one super-block: fewer units (4) than lanes
    cs.push_back({f, 13, 768});   // 2 * 256 + 256: 12 units
    cs.push_back({f, 300, 2560}); // a real width (Mamba-2 2.7B's d_model): 40 units, lanes take 1 or 2
  }
  return cs;
}

std::string describe(const Case& c) {
  return std::string(weight_format_name(c.format)) + " [" + std::to_string(c.out) + ", " + std::to_string(c.in) + "]";
}

TEST(CudaKQuant, LinearMatchesFp64OverGgmlsDequantizedWeights) {
  MAMBACPP_REQUIRE_GPU();
  for (Precision precision : {Precision::Exact, Precision::Fast}) {
    auto be = make_cuda_backend(DType::BF16, precision);
    Rng rng(520);
    for (const Case& c : cases()) {
      HostKQuant hq = make_kquant(c.format, c.out, c.in, rng);
      const Weight dw = be->adopt_matrix(hq.weight());
      ASSERT_EQ(dw.format, c.format);
      ASSERT_EQ(dw.device(), Device::CUDA);
      const auto bias = rng.vec(static_cast<size_t>(c.out));
      const TensorView db = be->adopt_weight(TensorView(const_cast<float*>(bias.data()), DType::F32, {c.out}));
      for (int64_t T : {1, 3, 16, 17, 64}) {
        for (bool with_bias : {false, true}) {
          for (bool strided : {false, true}) {
            DeviceArena arena(*be);
            const auto x = rng.vec(static_cast<size_t>(T * c.in));
            // Strided: rows c.in + 5 apart from an offset of 3 floats, so the GEMV takes its scalar x loads.
            const TensorView xv = strided ? arena.upload_strided(x, T, c.in, c.in + 5, 3)
                                          : arena.upload(x, DType::F32, {T, c.in});
            const TensorView yv =
                strided ? arena.upload_strided(std::vector<float>(T * c.out, std::nanf("")), T, c.out, c.out + 3, 2)
                        : arena.poisoned({T, c.out});
            be->linear(xv, dw, with_bias ? db : TensorView(), yv);
            const double err = rel_err(arena.download(yv), linear_ref(x, hq, with_bias ? &bias : nullptr, T));
            const double tol =
                T <= kGemvRows ? kGemvTol : precision == Precision::Fast ? kFastGemmTol : kGemmTol;
            EXPECT_LT(err, tol) << describe(c) << " T=" << T << " bias=" << with_bias << " strided=" << strided
                                << (precision == Precision::Fast ? " fast" : " exact");
          }
        }
      }
    }
  }
}

// Row r of a T-row GEMV is the bits of the 1-row product of that row alone, for T = 1..16.
TEST(CudaKQuant, GemvRowsDoNotDependOnTheRowCount) {
  MAMBACPP_REQUIRE_GPU();
  auto be = make_cuda_backend(DType::BF16, Precision::Exact);
  Rng rng(521);
  for (const Case& c : cases()) {
    HostKQuant hq = make_kquant(c.format, c.out, c.in, rng);
    const Weight dw = be->adopt_matrix(hq.weight());
    gputest::expect_rows_independent_of_row_count(*be, dw, c.out, c.in, kGemvRows, rng, describe(c));
  }
}

TEST(CudaKQuant, EmbedGathersGgmlsDequantizedRows) {
  MAMBACPP_REQUIRE_GPU();
  auto be = make_cuda_backend(DType::BF16, Precision::Exact);
  Rng rng(522);
  for (const Case& c : cases()) {
    HostKQuant hq = make_kquant(c.format, c.out, c.in, rng);
    const Weight dw = be->adopt_matrix(hq.weight());
    DeviceArena arena(*be);
    const std::vector<int32_t> ids = {0, static_cast<int32_t>(c.out - 1), 3 % static_cast<int32_t>(c.out), 0};
    TensorView idv(arena.alloc(ids.size() * 4), DType::I32, {static_cast<int64_t>(ids.size())}, Device::CUDA);
    be->copy_from_host(idv.data, ids.data(), ids.size() * 4);
    const TensorView out = arena.poisoned({static_cast<int64_t>(ids.size()), c.in});
    be->embed(dw, idv, out);
    const auto got = arena.download(out);
    std::vector<double> ref;
    for (int32_t id : ids) ref.insert(ref.end(), hq.deq.begin() + id * c.in, hq.deq.begin() + (id + 1) * c.in);
    EXPECT_LT(rel_err(got, ref), 1e-7) << describe(c);
  }
}

// ---- a Q4_K_M GGUF end to end ------------------------------------------------------------------------------------

namespace fs = std::filesystem;

void write_gguf(const std::string& dir, const std::string& out, GgufTarget target) {
  Checkpoint ck(dir);
  GgufWriter w;
  gguf_add_model(w, ck.config(), gguf_source_of(ck), target);
  w.write(out);
}

int32_t argmax_of(std::span<const float> row) {
  return static_cast<int32_t>(std::max_element(row.begin(), row.end()) - row.begin());
}

// A prompt's logits (all positions), then one step per token of `cont` (each step's logits appended): every model
// sees the same tokens, so their logits compare position by position.
std::vector<float> prompt_then_steps(const Model& m, const std::vector<int32_t>& prompt,
                                     const std::vector<int32_t>& cont) {
  auto st = m.create_state(1);
  const Sequence head = Sequence::tokens(prompt, 0);
  std::vector<float> out = m.forward(*st, {&head, 1}, Output::AllLogits).values;
  for (int32_t t : cont) {
    const std::vector<int32_t> one = {t};
    const Sequence step = Sequence::tokens(one, 0);
    const ForwardResult r = m.forward(*st, {&step, 1}, Output::LastLogits);
    out.insert(out.end(), r.values.begin(), r.values.end());
  }
  return out;
}

// The greedy choice after the prompt and after each step: the argmax of the last prompt row and of each step's row.
std::vector<int32_t> greedy_choices(const std::vector<float>& logits, int64_t prompt, int64_t steps, int64_t vocab) {
  std::vector<int32_t> ch;
  for (int64_t k = 0; k <= steps; ++k) {
    const size_t row = static_cast<size_t>(prompt - 1 + k);
    ch.push_back(argmax_of(std::span<const float>(logits.data() + row * vocab, static_cast<size_t>(vocab))));
  }
  return ch;
}

// A random Mamba-2 written as Q4_K_M GGUF (Q4_K projections, the tied embedding / output in Q6_K; every row whole
// super-blocks, so no fallback type), run on the GPU:
// - against the GPU's run of the F32 GGUF of the same weights dequantized: the only differences are the k-quant
//   kernels' (f32 sums of exact products for the decode steps, the f16 weight copy for the 20-token prompt): 5e-3;
// - against the CPU's run of the Q4_K_M file, whose packed kernels round each activation to int8 (max|x| / 254 per
//   block; backend/cpu/packed_kernels.h), which moves these logits by ~1-1.5% (gguf_model_test.cpp): 3e-2;
// - the greedy choice after the prompt and after every step equals the F32 file's and the CPU's, wherever the
//   reference's top two logits are further apart than its tolerance allows the GPU to move them.
TEST(CudaKQuant, Q4KMGgufMatchesTheCpuAndItsDequantizedWeights) {
  MAMBACPP_REQUIRE_GPU();
  const fs::path d = fs::temp_directory_path() / "mambacpp_kquant_gpu_test";
  fs::remove_all(d);
  fs::create_directories(d);
  ModelConfig c = test::tiny_mamba2_config();
  c.d_model = 256;
  c.d_inner = 512;
  c.head_dim = 64;
  c.n_heads = 8;
  c.n_groups = 2;
  c.vocab_size = 40;
  c.use_bias = false;
  const std::string src = (d / "src").string(), q = (d / "q4_k_m.gguf").string(), deq = (d / "deq.gguf").string();
  test::write_random_model(src, c, 11);
  write_gguf(src, q, GgufTarget::Q4_K_M);
  {
    GgufModel gm(q);
    GgufWriter w;
    gguf_add_model(w, gm.config(), [&gm](const std::string& n) { return gm.find(n); }, GgufTarget::F32);
    w.write(deq);
  }
  LoadOptions cpu_o, gpu_o;
  cpu_o.device = DeviceChoice::CPU;
  cpu_o.threads = 2;
  gpu_o.device = DeviceChoice::CUDA;
  gpu_o.weight_dtype = DType::F32;  // dense tensors as stored (f32): the only difference is the k-quant kernels
  gpu_o.precision = Precision::Exact;
  auto gpu_q = Model::load(q, gpu_o);
  auto gpu_deq = Model::load(deq, gpu_o);
  auto cpu_q = Model::load(q, cpu_o);
  const std::vector<int32_t> prompt = test::random_tokens(20, c.vocab_size, 12);
  constexpr int64_t kSteps = 8;
  // The F32 file's greedy continuation on the GPU, fed to every model.
  std::vector<int32_t> cont;
  {
    auto st = gpu_deq->create_state(1);
    const Sequence head = Sequence::tokens(prompt, 0);
    std::vector<float> last = gpu_deq->forward(*st, {&head, 1}, Output::LastLogits).values;
    for (int64_t s = 0; s < kSteps; ++s) {
      cont.push_back(argmax_of(last));
      const std::vector<int32_t> one = {cont.back()};
      const Sequence step = Sequence::tokens(one, 0);
      last = gpu_deq->forward(*st, {&step, 1}, Output::LastLogits).values;
    }
  }
  const auto gq = prompt_then_steps(*gpu_q, prompt, cont);
  const auto gd = prompt_then_steps(*gpu_deq, prompt, cont);
  const auto cq = prompt_then_steps(*cpu_q, prompt, cont);
  const int64_t P = static_cast<int64_t>(prompt.size()), V = c.vocab_size;
  const auto ch_gq = greedy_choices(gq, P, kSteps, V), ch_gd = greedy_choices(gd, P, kSteps, V),
             ch_cq = greedy_choices(cq, P, kSteps, V);
  const double err_deq = test::max_rel_diff(gq, gd), err_cpu = test::max_rel_diff(gq, cq);
  // Where the reference's top two logits are further apart than twice the tolerance (of the logits' scale), the GPU
  // must choose the reference's token; nearer ties may go either way within the tolerance. Returns {same where
  // clear, clear, same anywhere}.
  auto compare_choices = [&](const std::vector<float>& ref, const std::vector<int32_t>& ref_ch, double tol) {
    float scale = 0;
    for (float v : ref) scale = std::max(scale, std::fabs(v));
    int clear = 0, same_clear = 0, same = 0;
    for (int64_t k = 0; k <= kSteps; ++k) {
      std::vector<float> row(ref.begin() + (P - 1 + k) * V, ref.begin() + (P + k) * V);
      std::partial_sort(row.begin(), row.begin() + 2, row.end(), std::greater<float>());
      const bool is_clear = row[0] - row[1] > 2 * tol * scale;
      clear += is_clear;
      same_clear += is_clear && ch_gq[k] == ref_ch[k];
      same += ch_gq[k] == ref_ch[k];
    }
    return std::array<int, 3>{same_clear, clear, same};
  };
  const auto vs_deq = compare_choices(gd, ch_gd, 5e-3), vs_cpu = compare_choices(cq, ch_cq, 3e-2);
  std::printf("[kquant] Q4_K_M GGUF, 20-token prompt + %lld steps: GPU vs GPU-F32-dequantized %.2e (tol 5e-3), GPU vs "
              "CPU %.2e (tol 3e-2); greedy choices equal to the F32 file's %d/%lld (%d/%d where its margin is clear), "
              "to the CPU's %d/%lld (%d/%d)\n",
              static_cast<long long>(kSteps), err_deq, err_cpu, vs_deq[2], static_cast<long long>(kSteps + 1),
              vs_deq[0], vs_deq[1], vs_cpu[2], static_cast<long long>(kSteps + 1), vs_cpu[0], vs_cpu[1]);
  EXPECT_LT(err_deq, 5e-3);
  EXPECT_LT(err_cpu, 3e-2);
  EXPECT_EQ(vs_deq[0], vs_deq[1]);
  EXPECT_EQ(vs_cpu[0], vs_cpu[1]);
  EXPECT_GE(vs_deq[1], 3) << "too few clear choices to test anything";
  fs::remove_all(d);
}

}  // namespace
}  // namespace mambacpp
