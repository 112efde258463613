// The fused decode GEMV over quantized weights (backend/cuda/quant_fused_gemv.cu, routed by backend_linear.cpp):
// - every prologue / multiplier / epilogue the fused GEMVs take (one-group norm, group-wise norm, bias, x_scale and
//   out_scales runs, the conv1d + SiLU step with its state shift, the residual add) on q8_0, fp8 per-channel and fp8
//   per-tensor weights against fp64 loops over the dequantized weights, for decode batches of 1..20 rows (more
//   than 8 rows run as several launches) in permuted slots;
// - a row's bits do not depend on the batch: row r of a B-row call equals the 1-row call on that row alone;
// - whole random q8_0 / fp8 Mamba-2 models: the fused recipe runs (the backend takes every piece), its logits match
//   the plain ops' (LoadOptions::fused_decode off), and each sequence's decode logits are the same bits decoded
//   alone or in batches of 3 and 12.
//
// Tolerances: the kernel sums exact products of the stored weights in f32 (a chain of 16 per vector, then the lane,
// warp and block sums), ~1e-7 relative per term, so 2e-5 of the largest reference value, as the dense GEMV tests;
// a wrong block scale, group, tap, slot or run moves results by O(1). The model comparison adds the plain path's
// different order of roundings (norm before the product, the residual add as its own op) compounded over layers and
// steps, and fp8's bf16 lm_head on the tensor-core GEMV (hi + lo split, 7.6e-6 per product): 1e-4.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <vector>

#include "backend/backend.h"
#include "core/fp8.h"
#include "core/ggml_blocks.h"
#include "core/weight.h"
#include "gpu/gpu_test_util.h"
#include "mambacpp/model.h"
#include "model/mixers.h"
#include "model/weights.h"
#include "model/workspace.h"
#include "support/test_support.h"

namespace mambacpp {
namespace {

using gputest::DeviceArena;
using gputest::Rng;
using gputest::rel_err;

constexpr double kTol = 2e-5;

// A host quantized matrix: its bytes, fp8's scales, and the dequantized values the reference uses.
struct HostQuant {
  WeightFormat format;
  int64_t out, in;
  std::vector<uint8_t> bytes;
  std::vector<float> scales;
  std::vector<float> deq;  // [out, in]

  Weight weight() {
    TensorView s = scales.empty() ? TensorView()
                                  : TensorView(scales.data(), DType::F32, {static_cast<int64_t>(scales.size())});
    return Weight::packed(format, bytes.data(), {out, in}, Device::CPU, s);
  }
};

HostQuant make_quant(WeightFormat f, int64_t out, int64_t in, Rng& rng, bool per_tensor) {
  HostQuant h{f, out, in};
  std::vector<float> w(static_cast<size_t>(out * in));
  for (int64_t o = 0; o < out; ++o) {
    const float mag = o % 7 == 3 ? 1e-3f : (o % 5 == 0 ? 2.0f : 0.1f);  // rows of different scales
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
    const float s = *std::max_element(h.scales.begin(), h.scales.end());
    for (int64_t k = 0; k < out * in; ++k) h.bytes[k] = fp8_e4m3_from_float(w[k] / s);
    h.scales.assign(1, s);
  }
  for (int64_t o = 0; o < out; ++o)
    for (int64_t i = 0; i < in; ++i)
      h.deq[o * in + i] =
          static_cast<float>(double(h.scales[per_tensor ? 0 : o]) * fp8_e4m3_to_float(h.bytes[o * in + i]));
  return h;
}

// One fused_linear configuration.
struct Case {
  const char* name;
  int64_t out, in;
  int64_t norm_group;  // 0: no norm; == in: one group
  bool bias, accumulate;
  float x_scale;
  std::vector<std::pair<int64_t, float>> out_scales;
  int64_t conv_begin, conv_channels;  // conv_channels 0: no conv epilogue
};

std::vector<Case> cases() {
  return {
      {"in_proj: one-group norm, bias, conv on [96, 160)", 300, 256, 256, true, false, 1.0f, {}, 96, 64},
      {"out_proj: 4 norm groups, residual add, x_scale, 2 scale runs", 200, 512, 128, false, true, 0.75f,
       {{120, 0.5f}, {200, 2.0f}}, 0, 0},
      {"head: no norm, bias, stored", 37, 2560, 0, true, false, 1.0f, {}, 0, 0},
      {"wide rows split over warps, one-group norm", 2048, 1024, 1024, false, false, 1.0f, {}, 0, 0},
  };
}

constexpr int64_t kSlots = 24;
constexpr int kTaps = 4;

// Inputs of a run: x [B, in], y's starting values [B, out] (the residual), the conv state of every slot.
struct Inputs {
  std::vector<float> x, y0, state;
};

struct Outputs {
  std::vector<float> y, conv_out, state;
};

struct Fixture {
  Backend& be;
  const Case& c;
  Weight w;
  std::vector<float> bias, norm_w, conv_w, conv_b;
  TensorView dbias, dnorm, dconv_w, dconv_b;
};

// Runs fused_linear on rows `rows` of `in` (row k of the call is input row rows[k], in slot rows[k]).
Outputs run(Fixture& f, const Inputs& in, const std::vector<int64_t>& rows) {
  const Case& c = f.c;
  const int64_t B = static_cast<int64_t>(rows.size());
  DeviceArena arena(f.be);
  std::vector<float> x, y0;
  for (int64_t r : rows) {
    x.insert(x.end(), in.x.begin() + r * c.in, in.x.begin() + (r + 1) * c.in);
    y0.insert(y0.end(), in.y0.begin() + r * c.out, in.y0.begin() + (r + 1) * c.out);
  }
  FusedLinearArgs a;
  a.x = arena.upload(x, DType::F32, {B, c.in});
  a.w = f.w;
  a.bias = c.bias ? f.dbias : TensorView();
  if (c.norm_group > 0) {
    a.norm_w = f.dnorm;
    a.norm_group = c.norm_group;
    a.eps = 1e-5f;
  }
  a.y = arena.upload(y0, DType::F32, {B, c.out});
  a.accumulate = c.accumulate;
  a.x_scale = c.x_scale;
  a.out_scales = c.out_scales;
  TensorView state;
  if (c.conv_channels > 0) {
    a.conv_begin = c.conv_begin;
    a.conv_w = f.dconv_w;
    a.conv_bias = f.dconv_b;
    state = arena.upload(in.state, DType::F32, {kSlots, c.conv_channels, kTaps - 1});
    a.conv_state = state;
    a.conv_out = arena.poisoned({B, c.conv_channels});
  }
  BatchLayout batch;
  for (int64_t k = 0; k < B; ++k) batch.seqs.push_back({k, 1, rows[static_cast<size_t>(k)]});
  batch.total_tokens = B;
  f.be.prepare_batch(batch);
  EXPECT_TRUE(f.be.supports_fused_linear(a, batch)) << c.name << " B " << B;
  Outputs o;
  if (!f.be.supports_fused_linear(a, batch)) return o;
  f.be.fused_linear(a, batch);
  f.be.synchronize();
  o.y = arena.download(a.y);
  if (c.conv_channels > 0) {
    o.conv_out = arena.download(a.conv_out);
    o.state = arena.download(state);
  }
  return o;
}

// fp64 reference of run().
Outputs reference(const Fixture& f, const HostQuant& hq, const Inputs& in, const std::vector<int64_t>& rows) {
  const Case& c = f.c;
  Outputs o;
  o.state = in.state;
  for (int64_t r : rows) {
    std::vector<double> xn(static_cast<size_t>(c.in));
    for (int64_t i = 0; i < c.in; ++i) xn[i] = in.x[r * c.in + i];
    if (c.norm_group > 0)
      for (int64_t g0 = 0; g0 < c.in; g0 += c.norm_group) {
        double ss = 0;
        for (int64_t i = g0; i < g0 + c.norm_group; ++i) ss += xn[i] * xn[i];
        const double s = 1.0 / std::sqrt(ss / c.norm_group + 1e-5);
        for (int64_t i = g0; i < g0 + c.norm_group; ++i) xn[i] *= s * f.norm_w[i];
      }
    for (int64_t oo = 0; oo < c.out; ++oo) {
      double dot = 0;
      for (int64_t i = 0; i < c.in; ++i) dot += xn[i] * hq.deq[oo * c.in + i];
      double v = dot * c.x_scale + (c.bias ? f.bias[oo] : 0.0);
      for (const auto& [end, s] : c.out_scales)
        if (oo < end) {
          v *= s;
          break;
        }
      const int64_t ch = oo - c.conv_begin;
      if (c.conv_channels > 0 && ch >= 0 && ch < c.conv_channels) {
        float* st = &o.state[static_cast<size_t>((r * c.conv_channels + ch) * (kTaps - 1))];
        double acc = f.conv_b[ch];
        for (int k = 0; k < kTaps - 1; ++k) acc += double(f.conv_w[ch * kTaps + k]) * st[k];
        acc += double(f.conv_w[ch * kTaps + kTaps - 1]) * v;
        o.conv_out.push_back(static_cast<float>(acc / (1.0 + std::exp(-acc))));
        st[0] = st[1], st[1] = st[2], st[2] = static_cast<float>(v);
        o.y.push_back(in.y0[r * c.out + oo]);  // conv columns of y are not written
        continue;
      }
      o.y.push_back(static_cast<float>(c.accumulate ? in.y0[r * c.out + oo] + v : v));
    }
  }
  return o;
}

struct Format {
  WeightFormat format;
  bool per_tensor;
  const char* name;
};
const Format kFormats[] = {{WeightFormat::Q8_0, false, "q8_0"},
                           {WeightFormat::FP8_E4M3, false, "fp8 per-channel"},
                           {WeightFormat::FP8_E4M3, true, "fp8 per-tensor"}};

// The stored conv-state values the reference reads back: f32 as written (a dropped tap is exact).
std::vector<double> widen(const std::vector<float>& v) { return {v.begin(), v.end()}; }

template <class Body>
void for_each_fixture(Precision precision, uint64_t seed, Body body) {
  auto be = make_cuda_backend(DType::BF16, precision);
  Rng rng(seed);
  for (const Format& fm : kFormats)
    for (const Case& c : cases()) {
      HostQuant hq = make_quant(fm.format, c.out, c.in, rng, fm.per_tensor);
      Fixture f{*be, c, be->adopt_matrix(hq.weight())};
      f.bias = rng.vec(static_cast<size_t>(c.out));
      f.norm_w = rng.vec(static_cast<size_t>(c.in), 0.5f, 1.5f);
      f.conv_w = rng.vec(static_cast<size_t>(std::max<int64_t>(c.conv_channels, 1) * kTaps));
      f.conv_b = rng.vec(static_cast<size_t>(std::max<int64_t>(c.conv_channels, 1)));
      auto up = [&](std::vector<float>& v, std::initializer_list<int64_t> dims) {
        return be->adopt_weight(TensorView(v.data(), DType::F32, dims));
      };
      f.dbias = up(f.bias, {c.out});
      f.dnorm = up(f.norm_w, {c.in});
      if (c.conv_channels > 0) {
        f.dconv_w = up(f.conv_w, {c.conv_channels, 1, kTaps});
        f.dconv_b = up(f.conv_b, {c.conv_channels});
      }
      Inputs in;
      in.x = rng.vec(static_cast<size_t>(kSlots * c.in), -2.0f, 2.0f);
      in.y0 = rng.vec(static_cast<size_t>(kSlots * c.out));
      in.state = rng.vec(static_cast<size_t>(kSlots * std::max<int64_t>(c.conv_channels, 1) * (kTaps - 1)));
      body(fm, f, hq, in);
    }
}

// Rows in permuted slots: row k of the call is input row / slot (7 * k + 3) % kSlots (7 and 24 coprime).
std::vector<int64_t> permuted_rows(int64_t B) {
  std::vector<int64_t> rows;
  for (int64_t k = 0; k < B; ++k) rows.push_back((7 * k + 3) % kSlots);
  return rows;
}

TEST(CudaQuantFused, MatchesFp64OverTheDequantizedWeights) {
  MAMBACPP_REQUIRE_GPU();
  for (Precision precision : {Precision::Exact, Precision::Fast})
    for_each_fixture(precision, 61, [&](const Format& fm, Fixture& f, const HostQuant& hq, const Inputs& in) {
      for (int64_t B : {1, 2, 3, 5, 8, 9, 13, 20}) {
        const std::vector<int64_t> rows = permuted_rows(B);
        const Outputs got = run(f, in, rows);
        const Outputs ref = reference(f, hq, in, rows);
        const double ey = rel_err(got.y, widen(ref.y));
        EXPECT_LT(ey, kTol) << fm.name << " " << f.c.name << " B " << B;
        if (f.c.conv_channels > 0) {
          const double ec = rel_err(got.conv_out, widen(ref.conv_out));
          const double es = rel_err(got.state, widen(ref.state));
          EXPECT_LT(ec, kTol) << fm.name << " " << f.c.name << " B " << B << ": conv_out";
          EXPECT_LT(es, kTol) << fm.name << " " << f.c.name << " B " << B << ": conv state";
        }
        if (B == 13)
          std::printf("[quant-fused] %-15s %-62s B 13: y err %.2e\n", fm.name, f.c.name, ey);
      }
    });
}

// Row k of a B-row call is the bits of the 1-row call on that row alone (same slot, same starting state), for
// batches within one launch (<= 8 rows) and across several (9, 16, 20).
TEST(CudaQuantFused, RowsDoNotDependOnTheBatch) {
  MAMBACPP_REQUIRE_GPU();
  for_each_fixture(Precision::Fast, 62, [&](const Format& fm, Fixture& f, const HostQuant&, const Inputs& in) {
    std::vector<Outputs> alone(static_cast<size_t>(kSlots));
    for (int64_t r = 0; r < kSlots; ++r) alone[static_cast<size_t>(r)] = run(f, in, {r});
    const int64_t out = f.c.out, ch = f.c.conv_channels;
    for (int64_t B : {2, 7, 8, 9, 16, 20}) {
      const std::vector<int64_t> rows = permuted_rows(B);
      const Outputs got = run(f, in, rows);
      if (got.y.empty()) continue;  // run() reported it
      for (int64_t k = 0; k < B; ++k) {
        const Outputs& a = alone[static_cast<size_t>(rows[static_cast<size_t>(k)])];
        EXPECT_EQ(std::memcmp(&got.y[k * out], a.y.data(), static_cast<size_t>(out) * 4), 0)
            << fm.name << " " << f.c.name << ": row " << k << " of " << B << " differs from the row alone";
        if (ch > 0)
          EXPECT_EQ(std::memcmp(&got.conv_out[k * ch], a.conv_out.data(), static_cast<size_t>(ch) * 4), 0)
              << fm.name << " " << f.c.name << ": conv_out row " << k << " of " << B;
      }
    }
  });
}

// ---- whole models -----------------------------------------------------------------------------------------------

ModelConfig model_config(int64_t n_groups) {
  ModelConfig c = test::tiny_mamba2_config();
  c.d_model = 256;
  c.d_inner = 512;
  c.n_heads = 8;
  c.head_dim = 64;
  c.n_groups = n_groups;
  c.d_state = 64;
  c.chunk_size = 64;
  c.n_layer = 2;
  c.vocab_size = 320;
  return c;
}

std::unique_ptr<Model> quant_model(const ModelConfig& c, const char* format, bool fused, Precision precision) {
  LoadOptions o;
  o.device = DeviceChoice::CUDA;
  o.weight_dtype = DType::F32;
  o.fused_decode = fused;
  o.precision = precision;
  return Model::random_quantized(c, o, 11, format);
}

// The fused recipe must actually run (else the comparisons below compare the plain path with itself).
TEST(CudaQuantFused, BackendTakesQuantizedDecodeBlocks) {
  MAMBACPP_REQUIRE_GPU();
  for (const char* format : {"q8_0", "fp8"})
    for (int64_t groups : {1, 2})
      for (int64_t B : {1, 12}) {
        const ModelConfig c = model_config(groups);
        auto m = quant_model(c, format, true, Precision::Fast);
        ASSERT_FALSE(m->weights().layers[0].in_proj.dense()) << format;
        Backend& be = m->backend();
        auto st = m->create_state(B);
        BatchLayout batch;
        for (int64_t i = 0; i < B; ++i) batch.seqs.push_back({i, 1, B - 1 - i});
        batch.total_tokens = B;
        be.prepare_batch(batch);
        Workspace ws;
        ws.reserve(be, c, B, B);
        TensorView residual = Workspace::f32(ws.residual, Device::CUDA, B, c.d_model);
        be.fill_zero(residual.data, static_cast<size_t>(B * c.d_model) * 4);
        for (size_t l = 0; l < m->weights().layers.size(); ++l)
          EXPECT_TRUE(mamba_block_decode_fused(be, c, m->weights().layers[l], st->layers()[l], batch, ws, residual))
              << format << " groups " << groups << " B " << B << " layer " << l;
        be.synchronize();
      }
}

// Prefills each prompt alone into its slot, then decodes `steps` fixed tokens for the sequences `which` together;
// returns the logits of every step, row by row.
std::vector<std::vector<float>> decode(Model& m, const std::vector<std::vector<int32_t>>& prompts,
                                       const std::vector<std::vector<int32_t>>& tokens,
                                       const std::vector<int64_t>& which, int steps) {
  auto st = m.create_state(static_cast<int64_t>(prompts.size()));
  for (int64_t s : which) {
    const Sequence p = Sequence::tokens(prompts[static_cast<size_t>(s)], s);
    m.forward(*st, {&p, 1}, Output::LastLogits);
  }
  std::vector<std::vector<float>> out(which.size());
  for (int step = 0; step < steps; ++step) {
    std::vector<Sequence> seqs;
    for (int64_t s : which)
      seqs.push_back(Sequence::tokens(
          std::span<const int32_t>(&tokens[static_cast<size_t>(s)][static_cast<size_t>(step)], 1), s));
    const ForwardResult r = m.forward(*st, seqs, Output::LastLogits);
    for (size_t k = 0; k < which.size(); ++k) {
      auto row = r.row(static_cast<int64_t>(k));
      out[k].insert(out[k].end(), row.begin(), row.end());
    }
  }
  return out;
}

struct Streams {
  std::vector<std::vector<int32_t>> prompts, tokens;
};
Streams streams(const ModelConfig& c, int64_t n, int steps) {
  Streams s;
  for (int64_t i = 0; i < n; ++i) {
    s.prompts.push_back(test::random_tokens(1 + (5 * i) % 23, c.vocab_size, static_cast<uint64_t>(100 + i)));
    s.tokens.push_back(test::random_tokens(steps, c.vocab_size, static_cast<uint64_t>(200 + i)));
  }
  return s;
}

TEST(CudaQuantFused, ModelDecodeMatchesThePlainOps) {
  MAMBACPP_REQUIRE_GPU();
  constexpr int kSteps = 4;
  for (const char* format : {"q8_0", "fp8"})
    for (int64_t groups : {1, 2})
      for (int64_t B : {1, 3, 12}) {
        const ModelConfig c = model_config(groups);
        const Streams s = streams(c, B, kSteps);
        std::vector<int64_t> all;
        for (int64_t i = 0; i < B; ++i) all.push_back(i);
        auto plain = quant_model(c, format, false, Precision::Exact);
        auto fused = quant_model(c, format, true, Precision::Exact);
        const auto rp = decode(*plain, s.prompts, s.tokens, all, kSteps);
        const auto rf = decode(*fused, s.prompts, s.tokens, all, kSteps);
        double err = 0;
        for (size_t k = 0; k < rp.size(); ++k) err = std::max(err, rel_err(rf[k], widen(rp[k])));
        std::printf("[quant-fused] %-4s model, %lld groups, B %2lld: fused vs plain logits %.2e (tolerance 1e-4)\n",
                    format, static_cast<long long>(groups), static_cast<long long>(B), err);
        EXPECT_LT(err, 1e-4) << format << " groups " << groups << " B " << B;
      }
}

// The bench's defaults (fast precision, batch invariant): a sequence's decode logits are the same bits alone and in
// batches of 3 and 12 (two launches of the quantized GEMVs).
TEST(CudaQuantFused, ModelDecodeRowsDoNotDependOnTheBatch) {
  MAMBACPP_REQUIRE_GPU();
  constexpr int kSteps = 3;
  for (const char* format : {"q8_0", "fp8"}) {
    const ModelConfig c = model_config(2);
    const Streams s = streams(c, 12, kSteps);
    auto m = quant_model(c, format, true, Precision::Fast);
    std::vector<std::vector<float>> alone;
    for (int64_t i = 0; i < 12; ++i) alone.push_back(decode(*m, s.prompts, s.tokens, {i}, kSteps)[0]);
    for (const std::vector<int64_t>& which : {std::vector<int64_t>{4, 0, 9},
                                              std::vector<int64_t>{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11}}) {
      const auto got = decode(*m, s.prompts, s.tokens, which, kSteps);
      for (size_t k = 0; k < which.size(); ++k)
        EXPECT_TRUE(got[k] == alone[static_cast<size_t>(which[k])])
            << format << ": sequence " << which[k] << " in a batch of " << which.size() << " differs from alone";
    }
  }
}

}  // namespace
}  // namespace mambacpp
