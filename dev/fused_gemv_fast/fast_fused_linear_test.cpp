// The fast-precision fused linear of decode (fused_gemv_fast.cu, through Backend::fused_linear; opted in with
// MAMBACPP_DECODE_GEMM=fused, which the backend reads when it is made), one kernel for every batch size 1..256:
// - against an fp64 reference of what it is defined to compute: y_t = s_t * sum_i bf16(x_ti * nw_i) * W_oi with the
//   one-group norm's scale s_t = rsqrt(mean(x_t^2) + eps) applied after the dot product (no norm: s_t = 1), plus
//   bias; the conv epilogue silu(b + sum_k w_k in_k) and the state shift; the residual add. The rounded activations
//   are the host's (round to nearest even, as the kernel rounds), so what is left is f32 accumulation over `in`
//   terms (~sqrt(in) * 2^-24) and rsqrtf's 2 ulps: 2e-5 relative. A group-wise norm rounds bf16(x * nw * s_g)
//   after an rsqrtf the host cannot reproduce bit for bit, so an activation may round the other way (one product
//   off by 2^-8 of itself, ~3e-4 of a typical output): 2e-3 there.
// - batch invariance: row t's outputs (y, conv_out and its slot's conv state) are the same bits in a batch of
//   T rows as in the batch of 256, for T on both sides of the kernel variants (8, 16 and 32 rows per block) and of
//   several 32-row chunks.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "backend/backend.h"
#include "gpu/gpu_test_util.h"

namespace mambacpp {
namespace {

using gputest::DeviceArena;
using gputest::Rng;
using gputest::rounded;
using gputest::ScopedEnv;

struct Shape {
  const char* name;
  int64_t out, in;
  int64_t norm_group;  // 0: no norm; == in: one group
  bool conv, accumulate, bias;
};

constexpr int64_t kRows = 256, kConvK = 4;
int64_t slot_of(int64_t t) { return (t * 37 + 5) % kRows; }  // rows in permuted slots

struct Inputs {
  std::vector<float> x, w, nw, bias, conv_w, conv_b, state0, y0;
  int64_t conv_begin = 0, ch = 0;
};

Inputs make_inputs(const Shape& sh, uint64_t seed) {
  Rng rng(seed);
  Inputs in;
  in.x = rng.vec(kRows * sh.in, -2, 2);
  in.w = rounded(rng.vec(sh.out * sh.in), DType::BF16);
  if (sh.norm_group) in.nw = rng.vec(sh.in, 0.5f, 1.5f);
  if (sh.bias) in.bias = rounded(rng.vec(sh.out), DType::BF16);
  if (sh.conv) {
    in.conv_begin = sh.out / 4;
    in.ch = sh.out / 2;
    in.conv_w = rng.vec(in.ch * kConvK);
    in.conv_b = rng.vec(in.ch);
    in.state0 = rng.vec(kRows * in.ch * (kConvK - 1));
  }
  in.y0 = rng.vec(kRows * sh.out);  // the residual an accumulating call adds to
  return in;
}

struct Outputs {
  std::vector<float> y, conv_out, state;
};

// One fused_linear over rows [0, T) (row t in slot slot_of(t)) on fresh buffers.
Outputs run(Backend& be, const Shape& sh, const Inputs& in, int64_t T) {
  DeviceArena arena(be);
  FusedLinearArgs a;
  a.x = arena.upload(std::vector<float>(in.x.begin(), in.x.begin() + T * sh.in), DType::F32, {T, sh.in});
  a.w = arena.upload(in.w, DType::BF16, {sh.out, sh.in});
  if (sh.bias) a.bias = arena.upload(in.bias, DType::BF16, {sh.out});
  if (sh.norm_group) {
    a.norm_w = arena.upload(in.nw, DType::F32, {sh.in});
    a.norm_group = sh.norm_group;
    a.eps = 1e-5f;
  }
  a.accumulate = sh.accumulate;
  a.y = sh.accumulate ? arena.upload(std::vector<float>(in.y0.begin(), in.y0.begin() + T * sh.out), DType::F32,
                                     {T, sh.out})
                      : arena.poisoned({T, sh.out});
  TensorView state;
  if (sh.conv) {
    a.conv_begin = in.conv_begin;
    a.conv_w = arena.upload(in.conv_w, DType::F32, {in.ch, 1, kConvK});
    a.conv_bias = arena.upload(in.conv_b, DType::F32, {in.ch});
    state = arena.upload(in.state0, DType::F32, {kRows, in.ch, kConvK - 1});
    a.conv_state = state;
    a.conv_out = arena.poisoned({T, in.ch});
  }
  BatchLayout batch;
  for (int64_t t = 0; t < T; ++t) batch.seqs.push_back({t, 1, slot_of(t)});
  batch.total_tokens = T;
  be.prepare_batch(batch);
  EXPECT_TRUE(be.supports_fused_linear(a, batch)) << sh.name << " T " << T;
  be.fused_linear(a, batch);
  Outputs o;
  o.y = arena.download(a.y);
  if (sh.conv) {
    o.conv_out = arena.download(a.conv_out);
    o.state = arena.download(state);
  }
  be.synchronize();
  return o;
}

double bf16r(double v) { return rounded({static_cast<float>(v)}, DType::BF16)[0]; }

TEST(CudaFastFusedLinear, MatchesReferenceAndIsBatchInvariant) {
  MAMBACPP_REQUIRE_GPU();
  const Shape shapes[] = {
      {"in_proj-like: one-group norm, conv epilogue", 648, 128, 128, true, false, false},
      {"out_proj-like: two-group norm, residual add", 128, 256, 128, false, true, false},
      {"lm-head-like: one-group norm, odd out", 333, 256, 256, false, false, false},
      {"x_proj-like: no norm, bias", 40, 264, 0, false, false, true},
      // Up to 8 rows are staged whole while they fit in 24 KB (here T <= 2), in rounds above.
      {"wide in: one-group norm, residual add", 48, 4096, 4096, false, true, false},
  };
  const ScopedEnv fused("MAMBACPP_DECODE_GEMM", "fused");
  auto be = make_cuda_backend(DType::BF16, Precision::Fast);
  for (const Shape& sh : shapes) {
    SCOPED_TRACE(sh.name);
    const Inputs in = make_inputs(sh, 900 + sh.out);
    const Outputs full = run(*be, sh, in, kRows);

    // fp64 reference over all rows.
    const int64_t n_groups = sh.norm_group ? sh.in / sh.norm_group : 1;
    std::vector<double> ref_y(static_cast<size_t>(kRows * sh.out)), ref_conv;
    std::vector<double> ref_state(in.state0.begin(), in.state0.end());
    if (sh.conv) ref_conv.resize(static_cast<size_t>(kRows * in.ch));
    for (int64_t t = 0; t < kRows; ++t) {
      std::vector<double> scale(static_cast<size_t>(n_groups), 1.0);
      if (sh.norm_group)
        for (int64_t g = 0; g < n_groups; ++g) {
          double ss = 0;
          for (int64_t i = g * sh.norm_group; i < (g + 1) * sh.norm_group; ++i)
            ss += double(in.x[t * sh.in + i]) * in.x[t * sh.in + i];
          scale[g] = 1.0 / std::sqrt(ss / double(sh.norm_group) + 1e-5);
        }
      const bool post = n_groups == 1;
      std::vector<double> act(static_cast<size_t>(sh.in));
      for (int64_t i = 0; i < sh.in; ++i) {
        const float u = sh.norm_group ? in.x[t * sh.in + i] * in.nw[i] : in.x[t * sh.in + i];
        act[i] = post ? bf16r(u) : bf16r(double(u) * scale[i / sh.norm_group]);
      }
      for (int64_t o = 0; o < sh.out; ++o) {
        double d = 0;
        for (int64_t i = 0; i < sh.in; ++i) d += act[i] * in.w[o * sh.in + i];
        if (post) d *= scale[0];
        if (sh.bias) d += in.bias[o];
        const int64_t c = o - in.conv_begin;
        if (sh.conv && c >= 0 && c < in.ch) {
          const int64_t base = (slot_of(t) * in.ch + c) * (kConvK - 1);
          double acc = in.conv_b[c];
          for (int64_t k = 0; k < kConvK - 1; ++k) acc += double(in.conv_w[c * kConvK + k]) * in.state0[base + k];
          acc += double(in.conv_w[c * kConvK + kConvK - 1]) * d;
          ref_conv[t * in.ch + c] = acc / (1.0 + std::exp(-acc));
          for (int64_t k = 0; k + 1 < kConvK - 1; ++k) ref_state[base + k] = in.state0[base + k + 1];
          ref_state[base + kConvK - 2] = d;
          continue;
        }
        ref_y[t * sh.out + o] = sh.accumulate ? in.y0[t * sh.out + o] + d : d;
      }
    }
    // The conv columns of y are not written (the poison stays there): compare the others.
    std::vector<float> gy;
    std::vector<double> ry;
    for (int64_t t = 0; t < kRows; ++t)
      for (int64_t o = 0; o < sh.out; ++o) {
        const int64_t c = o - in.conv_begin;
        if (sh.conv && c >= 0 && c < in.ch) continue;
        gy.push_back(full.y[t * sh.out + o]);
        ry.push_back(ref_y[t * sh.out + o]);
      }
    const double tol = n_groups > 1 ? 2e-3 : 2e-5;
    const double ey = gputest::rel_err(gy, ry);
    std::printf("[fast fused] %-44s y vs fp64 %.2e", sh.name, ey);
    EXPECT_LT(ey, tol);
    if (sh.conv) {
      const double ec = gputest::rel_err(full.conv_out, ref_conv), es = gputest::rel_err(full.state, ref_state);
      std::printf(", conv_out %.2e, state %.2e", ec, es);
      EXPECT_LT(ec, tol);
      EXPECT_LT(es, tol);
    }
    std::printf(" (tolerance %.0e)\n", tol);

    for (int64_t T : {1, 2, 3, 7, 8, 9, 16, 17, 31, 32, 33, 63, 64, 65, 100, 255}) {
      SCOPED_TRACE("T = " + std::to_string(T));
      const Outputs part = run(*be, sh, in, T);
      ASSERT_EQ(0, std::memcmp(part.y.data(), full.y.data(), part.y.size() * sizeof(float)));
      if (sh.conv) {
        ASSERT_EQ(0, std::memcmp(part.conv_out.data(), full.conv_out.data(), part.conv_out.size() * sizeof(float)));
        for (int64_t t = 0; t < T; ++t) {  // the slots of rows [0, T)
          const size_t base = static_cast<size_t>(slot_of(t) * in.ch * (kConvK - 1));
          ASSERT_EQ(0, std::memcmp(part.state.data() + base, full.state.data() + base,
                                   static_cast<size_t>(in.ch * (kConvK - 1)) * sizeof(float)));
        }
      }
    }
  }
}

}  // namespace
}  // namespace mambacpp
