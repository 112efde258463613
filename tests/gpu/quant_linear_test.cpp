// Quantized weights on the CUDA backend (backend/cuda/quant_ops.h): q8_0 and fp8 e4m3 (per-channel and per-tensor
// scales) through linear and embed, against fp64 loops over the dequantized weights (ggml_dequantize_row for q8_0,
// fp8_e4m3_to_float times the scale for fp8) -- on odd shapes (widths that are no multiple of 256, and for fp8 of
// 16, which takes the scalar GEMV), row counts 1..17 and prefill sizes, with bias, strided rows and NaN-poisoned
// outputs; the GEMV's batch invariance bit for bit; and a whole q8_0 model against the CPU's q8_0 model.
//
// Tolerances (max|got - ref| / max|ref|):
// - GEMV rows (T <= kQuantGemvMaxRows = 16): exact products of the stored weights, f32 sums: 2e-5, as the dense GEMV.
// - More rows: q8_0 runs on an f16 copy of the dequantized weights (each rounded by up to 2^-12 relative, or 2^-25
//   absolute below f16's normal range), so the dot products move by ~2^-12 / sqrt(terms) of their scale: 2e-3
//   bounds it. fp8 runs on an exact bf16 copy of the bytes with the scale applied after: 2e-5.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "backend/backend.h"
#include "core/fp8.h"
#include "core/ggml_blocks.h"
#include "core/weight.h"
#include "gpu/gpu_test_util.h"
#include "mambacpp/model.h"
#include "support/test_support.h"

namespace mambacpp {
namespace {

using gputest::DeviceArena;
using gputest::Rng;
using gputest::rel_err;

constexpr double kGemvTol = 2e-5;
constexpr double kQ8GemmTol = 2e-3;
constexpr int64_t kGemvRows = 16;

// A host quantized matrix: its bytes, its scales (fp8) and its dequantized values (the reference's weights).
struct HostQuant {
  WeightFormat format;
  int64_t out, in;
  bool per_tensor = false;
  std::vector<uint8_t> bytes;
  std::vector<float> scales;
  std::vector<float> deq;  // [out, in]

  Weight weight() {
    TensorView s = scales.empty() ? TensorView()
                                  : TensorView(scales.data(), DType::F32, {static_cast<int64_t>(scales.size())});
    return Weight::packed(format, bytes.data(), {out, in}, Device::CPU, s);
  }
};

HostQuant make_quant(WeightFormat f, int64_t out, int64_t in, Rng& rng, bool per_tensor = false) {
  HostQuant h{f, out, in, per_tensor};
  // Rows of different magnitudes (one of them tiny, below f16's normal range once scaled) exercise the scales.
  std::vector<float> w(static_cast<size_t>(out * in));
  for (int64_t o = 0; o < out; ++o) {
    const float mag = o % 7 == 3 ? 1e-4f : (o % 5 == 0 ? 2.0f : 0.1f);
    for (int64_t i = 0; i < in; ++i) w[o * in + i] = rng.uniform(-mag, mag);
  }
  h.deq.resize(w.size());
  if (f == WeightFormat::Q8_0) {
    const int64_t rb = weight_row_bytes(f, in);
    h.bytes.resize(static_cast<size_t>(out * rb));
    for (int64_t o = 0; o < out; ++o) {
      ggml_quantize_row(f, &w[o * in], in, &h.bytes[o * rb]);
      ggml_dequantize_row(f, &h.bytes[o * rb], in, &h.deq[o * in]);
    }
    return h;
  }
  h.bytes.resize(w.size());
  h.scales.resize(static_cast<size_t>(out));
  fp8_quantize_rows(w.data(), out, in, h.bytes.data(), h.scales.data());
  if (per_tensor) {
    // One scale for all rows: the largest, so no row saturates.
    float s = 0;
    for (float v : h.scales) s = std::max(s, v);
    for (int64_t o = 0; o < out; ++o)
      for (int64_t i = 0; i < in; ++i) h.bytes[o * in + i] = fp8_e4m3_from_float(w[o * in + i] / s);
    h.scales.assign(1, s);
  }
  for (int64_t o = 0; o < out; ++o)
    for (int64_t i = 0; i < in; ++i)
      h.deq[o * in + i] = static_cast<float>(double(h.scales[per_tensor ? 0 : o]) * fp8_e4m3_to_float(h.bytes[o * in + i]));
  return h;
}

std::vector<double> linear_ref(const std::vector<float>& x, const HostQuant& w, const std::vector<float>* bias,
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
  bool per_tensor;
  int64_t out, in;
};

std::vector<Case> cases() {
  return {{WeightFormat::Q8_0, false, 37, 800},     // 25 blocks: no multiple of 256
          {WeightFormat::Q8_0, false, 5, 32},       // one block
          {WeightFormat::Q8_0, false, 300, 2560},   // a real width
          {WeightFormat::FP8_E4M3, false, 37, 800},
          {WeightFormat::FP8_E4M3, false, 29, 53},  // no multiple of 16: the scalar GEMV and dequantization
          {WeightFormat::FP8_E4M3, true, 300, 2560}};
}

std::string describe(const Case& c) {
  return std::string(weight_format_name(c.format)) + (c.per_tensor ? " per-tensor" : "") + " [" +
         std::to_string(c.out) + ", " + std::to_string(c.in) + "]";
}

TEST(CudaQuant, LinearMatchesFp64OverTheDequantizedWeights) {
  MAMBACPP_REQUIRE_GPU();
  for (Precision precision : {Precision::Exact, Precision::Fast}) {
    auto be = make_cuda_backend(DType::BF16, precision);
    Rng rng(52);
    for (const Case& c : cases()) {
      HostQuant hq = make_quant(c.format, c.out, c.in, rng, c.per_tensor);
      const Weight dw = be->adopt_matrix(hq.weight());
      ASSERT_EQ(dw.format, c.format);
      ASSERT_EQ(dw.device(), Device::CUDA);
      const auto bias = rng.vec(static_cast<size_t>(c.out));
      const TensorView db = be->adopt_weight(TensorView(const_cast<float*>(bias.data()), DType::F32, {c.out}));
      std::vector<int64_t> row_counts;
      for (int64_t T = 1; T <= 17; ++T) row_counts.push_back(T);
      row_counts.push_back(64);
      row_counts.push_back(301);
      for (int64_t T : row_counts) {
        for (bool with_bias : {false, true}) {
          for (bool strided : {false, true}) {
            DeviceArena arena(*be);
            const auto x = rng.vec(static_cast<size_t>(T * c.in));
            const TensorView xv = strided ? arena.upload_strided(x, T, c.in, c.in + 5, 3)
                                          : arena.upload(x, DType::F32, {T, c.in});
            const TensorView yv =
                strided ? arena.upload_strided(std::vector<float>(T * c.out, std::nanf("")), T, c.out, c.out + 3, 2)
                        : arena.poisoned({T, c.out});
            be->linear(xv, dw, with_bias ? db : TensorView(), yv);
            const double err = rel_err(arena.download(yv), linear_ref(x, hq, with_bias ? &bias : nullptr, T));
            // Fast precision rounds x to 16 bits in the GEMM path (2^-9 relative for fp8's bf16, 2^-12 for f16).
            double tol = T <= kGemvRows ? kGemvTol : c.format == WeightFormat::Q8_0 ? kQ8GemmTol : kGemvTol;
            if (precision == Precision::Fast && T > kGemvRows) tol = 1e-2;
            EXPECT_LT(err, tol) << describe(c) << " T=" << T << " bias=" << with_bias << " strided=" << strided
                                << (precision == Precision::Fast ? " fast" : " exact");
          }
        }
      }
    }
  }
}

// Row r of a T-row GEMV is the bits of the 1-row product of that row alone, for every T the GEMV takes.
TEST(CudaQuant, GemvRowsDoNotDependOnTheRowCount) {
  MAMBACPP_REQUIRE_GPU();
  auto be = make_cuda_backend(DType::BF16, Precision::Exact);
  Rng rng(53);
  for (const Case& c : cases()) {
    HostQuant hq = make_quant(c.format, c.out, c.in, rng, c.per_tensor);
    const Weight dw = be->adopt_matrix(hq.weight());
    gputest::expect_rows_independent_of_row_count(*be, dw, c.out, c.in, kGemvRows, rng, describe(c));
  }
}

TEST(CudaQuant, EmbedGathersDequantizedRows) {
  MAMBACPP_REQUIRE_GPU();
  auto be = make_cuda_backend(DType::BF16, Precision::Exact);
  Rng rng(54);
  for (const Case& c : cases()) {
    HostQuant hq = make_quant(c.format, c.out, c.in, rng, c.per_tensor);
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
    // q8_0: d * q is one exact f32 product, as ggml's; fp8: s * e4m3 rounds once in f32 (2^-24).
    EXPECT_LT(rel_err(got, ref), 1e-6) << describe(c);
  }
}

// A random q8_0 Mamba-2 (every matrix q8_0, vectors f32) on the GPU against the same model on the CPU. The GPU
// keeps f32 activations; the CPU's packed kernels round each activation to int8 within half its 32-block's scale
// (max|x| / 254; backend/cpu/packed_kernels.h), which moves these logits by ~1-1.5% (measured on an H100: 1.18e-2
// for 12 tokens, 1.32e-2 for 150), as in gguf_model_test.cpp: 3e-2. The GPU kernels' own exactness is the fp64 test
// above (2e-5 relative).
TEST(CudaQuant, Q8ModelMatchesTheCpusQ8Model) {
  MAMBACPP_REQUIRE_GPU();
  ModelConfig c = test::tiny_mamba2_config();
  c.d_model = 256;
  c.d_inner = 512;
  c.n_heads = 8;
  c.head_dim = 64;
  c.n_groups = 1;
  c.d_state = 64;
  c.chunk_size = 64;
  c.n_layer = 2;
  c.vocab_size = 320;
  LoadOptions cpu_o, gpu_o;
  cpu_o.device = DeviceChoice::CPU;
  gpu_o.device = DeviceChoice::CUDA;
  gpu_o.weight_dtype = DType::F32;  // dense tensors as stored (f32): the only difference is the q8_0 kernels
  gpu_o.precision = Precision::Exact;
  auto cpu = Model::random_quantized(c, cpu_o, 11, "q8_0");
  auto gpu = Model::random_quantized(c, gpu_o, 11, "q8_0");
  for (int64_t prompt : {12, 150}) {
    const auto ids = test::random_tokens(prompt + 6, c.vocab_size, 12);
    std::vector<float> got, ref;
    for (Model* m : {cpu.get(), gpu.get()}) {
      auto st = m->create_state(1);
      std::vector<float>& out = m == cpu.get() ? ref : got;
      const Sequence head = Sequence::tokens(std::span<const int32_t>(ids).first(static_cast<size_t>(prompt)), 0);
      ForwardResult r = m->forward(*st, {&head, 1}, Output::AllLogits);
      out = r.values;
      for (int64_t t = prompt; t < prompt + 6; ++t) {
        const Sequence step = Sequence::tokens(std::span<const int32_t>(ids).subspan(static_cast<size_t>(t), 1), 0);
        r = m->forward(*st, {&step, 1}, Output::LastLogits);
        out.insert(out.end(), r.values.begin(), r.values.end());
      }
    }
    const double err = rel_err(got, gputest::to_double(ref));
    const double tol = 3e-2;
    std::printf("[quant] q8_0 model, %3lld-token prompt + 6 steps: GPU vs CPU max rel err %.2e (tolerance %.0e)\n",
                static_cast<long long>(prompt), err, tol);
    EXPECT_LT(err, tol) << prompt << "-token prompt";
  }
}

}  // namespace
}  // namespace mambacpp
