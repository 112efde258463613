// The multipliers of Backend::fused_linear (FusedLinearArgs::x_scale, out_scales) on the fused GEMVs against fp64:
// y = (x_scale * (norm(x) . w) + bias) * s(o) over three runs of outputs, stored and added onto a residual, for 1, 2
// (CUDA cores), 3 and 8 rows (tensor cores with bf16 weights), 16-byte and scalar loads (in 256 and 36). The products
// are exact and the sums f32: 2e-5 of max|y|; the tensor cores' hi + lo split of the activations leaves up to 2^-17
// of each product: 5e-5 there (as fused_decode_test.cpp). Fast precision's pinned GEMM (bf16 weights) takes them
// too: x_scale as the GEMM's alpha, the runs scaled after it, one run added onto a residual folded into alpha; its
// activations are rounded to bf16 (2^-9 relative each), so 1e-2 of max|y|, far below what a missed multiplier moves
// (0.35 to 1.7 per run). Several runs added onto a residual, or a bias with the add, stay with the plain ops.
//
// The hybrids' fused decode (Falcon-H1's parallel layer with its muP multipliers in the fused GEMVs' epilogue,
// Granite's residual multiplier, the attention and MLP sublayers on fused linears) against the plain per-op kernels
// (LoadOptions::fused_decode = false) and the CPU engine. Decode batches of 1 and 3 rows: with bf16 weights 1-2 rows
// run the CUDA-core GEMV, 3-8 the tensor-core one. Exact precision: the fused and plain paths then differ by f32
// summation order only, so 1e-5 of the largest logit / state value (as the GPU-vs-CPU tests), 5e-5 on the tensor
// cores (the hi + lo split's residue, as fused_decode_test.cpp); and the states must differ at all where the fused
// path applies (else the test would pass on a silent fallback).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>

#include "gpu/gpu_test_util.h"
#include "mambacpp/model.h"
#include "support/test_support.h"

using mambacpp::gputest::DeviceArena;
using mambacpp::gputest::Rng;

namespace mambacpp {
namespace {

namespace fs = std::filesystem;

struct Case {
  std::string dir;
  bool fused;  // whether the fused decode applies (Falcon-H1's norm(y) * silu(z) order keeps the plain ops)
};

std::vector<Case> cases() {
  const fs::path root = test::fixture_dir();
  return {{(root / "falcon_h1" / "falcon_h1_f32").string(), true},
          {(root / "falcon_h1" / "falcon_h1_gate_first_f32").string(), true},
          {(root / "falcon_h1" / "falcon_h1_norm_tied_f32").string(), false},
          {(root / "hybrid" / "granite_h_f32").string(), true},
          {(root / "hybrid" / "nemotron_h_f32").string(), true}};
}

std::unique_ptr<Model> load(const std::string& dir, DeviceChoice dev, DType weights, bool fused) {
  LoadOptions lo;
  lo.device = dev;
  lo.threads = 1;
  lo.weight_dtype = weights;
  lo.precision = Precision::Exact;
  lo.kv_page_tokens = 8;
  lo.fused_decode = fused;
  return Model::load(dir, lo);
}

// Prompts in slots {3, 0, 2} (the first n_rows of them), then 24 decode steps of all of them together (the tokens
// fixed in advance, so that no difference feeds back). Every step's last logits in order, and the slots' states
// (Mamba state and KV rows) left behind: the LM head is fused on both sides of the comparison's difference, the
// states only by the layers, so they tell whether a layer took the fused path.
struct Decoded {
  std::vector<float> logits, states;
};
Decoded decode(const Model& m, const std::vector<int32_t>& ids, size_t n_rows) {
  auto st = m.create_state(4);
  const size_t L = ids.size();
  const std::vector<std::vector<int32_t>> prompts = {{ids.begin(), ids.begin() + 5},
                                                     {ids.begin() + 3, ids.begin() + 12},
                                                     {ids.begin(), ids.begin() + 1}};
  const int64_t slots[] = {3, 0, 2};
  std::vector<Sequence> seqs;
  for (size_t i = 0; i < n_rows; ++i) seqs.push_back(Sequence::tokens(prompts[i], slots[i]));
  Decoded d;
  d.logits = m.forward(*st, seqs, Output::LastLogits).values;
  std::vector<int32_t> next(n_rows);
  for (size_t step = 0; step < 24; ++step) {
    for (size_t i = 0; i < n_rows; ++i) {
      next[i] = ids[(7 * i + step) % L];
      seqs[i] = Sequence::tokens(std::span<const int32_t>(&next[i], 1), slots[i]);
    }
    const ForwardResult r = m.forward(*st, seqs, Output::LastLogits);
    d.logits.insert(d.logits.end(), r.values.begin(), r.values.end());
  }
  for (size_t i = 0; i < n_rows; ++i) {
    const std::vector<float> s = st->read_slot(slots[i]);
    d.states.insert(d.states.end(), s.begin(), s.end());
  }
  return d;
}

TEST(GpuFusedHybridDecode, FusedEqualsPlainAndCpu) {
  MAMBACPP_REQUIRE_GPU();
  for (const Case& c : cases()) {
    ASSERT_TRUE(fs::exists(fs::path(c.dir) / "config.json")) << c.dir;
    const auto ids = test::read_token_ids(c.dir + "/tokens.txt");
    for (size_t rows : {size_t{1}, size_t{3}}) {
      const Decoded cpu = decode(*load(c.dir, DeviceChoice::CPU, DType::F32, true), ids, rows);
      for (DType wd : {DType::F32, DType::BF16}) {
        SCOPED_TRACE(c.dir + " rows " + std::to_string(rows) + " weights " + dtype_name(wd));
        const Decoded fused = decode(*load(c.dir, DeviceChoice::CUDA, wd, true), ids, rows);
        const Decoded plain = decode(*load(c.dir, DeviceChoice::CUDA, wd, false), ids, rows);
        const double err = test::max_rel_diff(fused.logits, plain.logits);
        const double state_err = test::max_rel_diff(fused.states, plain.states);
        std::printf("[gpu fused hybrid] %s rows %zu %s: fused vs plain logits %.3g, states %.3g\n",
                    fs::path(c.dir).filename().c_str(), rows, dtype_name(wd), err, state_err);
        const double tol = wd == DType::BF16 && rows >= 3 ? 5e-5 : 1e-5;  // tensor cores: the hi + lo split's residue
        EXPECT_LE(err, tol) << "fused vs plain logits";
        EXPECT_LE(state_err, tol) << "fused vs plain states";
        if (c.fused)
          EXPECT_NE(fused.states, plain.states) << "bit-identical states: the layers did not take the fused path";
        else
          EXPECT_EQ(fused.states, plain.states) << "this layer keeps the plain ops";
        if (wd == DType::F32) {
          EXPECT_LE(test::max_rel_diff(fused.logits, cpu.logits), 1e-5) << "fused vs CPU logits";
          EXPECT_LE(test::max_rel_diff(fused.states, cpu.states), 1e-5) << "fused vs CPU states";
        }
      }
    }
  }
}

TEST(GpuFusedLinearMultipliers, MatchFp64Reference) {
  MAMBACPP_REQUIRE_GPU();
  for (DType wd : {DType::F32, DType::BF16}) {
    auto be = make_cuda_backend(wd, Precision::Exact);
    auto fast = make_cuda_backend(wd, Precision::Fast);
    for (int64_t in : {int64_t{256}, int64_t{36}})
      for (int64_t T : {1, 2, 3, 8})
        for (bool accumulate : {false, true}) {
          SCOPED_TRACE(std::string(dtype_name(wd)) + " in " + std::to_string(in) + " T " + std::to_string(T) +
                       (accumulate ? " accumulate" : ""));
          const int64_t out = 72;
          DeviceArena arena(*be);
          Rng rng(static_cast<uint64_t>(5 + in + T));
          const float eps = 1e-5f, x_scale = 1.25f;
          const std::vector<std::pair<int64_t, float>> runs = {{24, 0.35f}, {60, 1.7f}, {out, 0.6f}};
          const auto w = gputest::rounded(rng.vec(static_cast<size_t>(out * in)), wd);
          const auto nw = rng.vec(static_cast<size_t>(in), 0.5f, 1.5f), bias = rng.vec(static_cast<size_t>(out));
          const auto x = rng.vec(static_cast<size_t>(T * in), -2, 2), y0 = rng.vec(static_cast<size_t>(T * out));
          FusedLinearArgs a;
          a.x = arena.upload(x, DType::F32, {T, in});
          a.w = arena.upload(w, wd, {out, in});
          a.bias = arena.upload(bias, DType::F32, {out});
          a.norm_w = arena.upload(nw, DType::F32, {in});
          a.eps = eps;
          a.x_scale = x_scale;
          a.out_scales = runs;
          a.y = accumulate ? arena.upload(y0, DType::F32, {T, out}) : arena.poisoned({T, out});
          a.accumulate = accumulate;
          const BatchLayout batch = gputest::make_batch(std::vector<int64_t>(static_cast<size_t>(T), 1), [&] {
            std::vector<int64_t> slots;
            for (int64_t t = 0; t < T; ++t) slots.push_back(t);
            return slots;
          }());
          ASSERT_TRUE(be->supports_fused_linear(a, batch));
          be->fused_linear(a, batch);
          const auto got = arena.download(a.y);
          std::vector<double> ref(static_cast<size_t>(T * out)), dots(ref.size());
          for (int64_t t = 0; t < T; ++t) {
            double ss = 0;
            for (int64_t i = 0; i < in; ++i) ss += double(x[t * in + i]) * x[t * in + i];
            const double r = 1.0 / std::sqrt(ss / static_cast<double>(in) + eps);
            for (int64_t o = 0; o < out; ++o) {
              double dot = 0;
              for (int64_t i = 0; i < in; ++i) dot += double(x[t * in + i]) * r * nw[i] * w[o * in + i];
              dots[static_cast<size_t>(t * out + o)] = dot;
              const double s = o < 24 ? 0.35 : o < 60 ? 1.7 : 0.6;
              const double v = (double(x_scale) * dot + bias[o]) * double(static_cast<float>(s));
              ref[static_cast<size_t>(t * out + o)] = accumulate ? y0[t * out + o] + v : v;
            }
          }
          const bool tensor_cores = wd == DType::BF16 && T >= 3 && in % 8 == 0;
          EXPECT_LE(gputest::rel_err(got, ref), tensor_cores ? 5e-5 : 2e-5);
          if (wd != DType::BF16) continue;
          // Fast precision: its own arena (its stream orders its uploads, kernels and downloads).
          DeviceArena fa(*fast);
          FusedLinearArgs f = a;
          f.x = fa.upload(x, DType::F32, {T, in});
          f.w = fa.upload(w, wd, {out, in});
          f.bias = fa.upload(bias, DType::F32, {out});
          f.norm_w = fa.upload(nw, DType::F32, {in});
          if (!accumulate) {
            f.y = fa.poisoned({T, out});
            ASSERT_TRUE(fast->supports_fused_linear(f, batch)) << "fast precision with multipliers";
            fast->fused_linear(f, batch);
            const double err = gputest::rel_err(fa.download(f.y), ref);
            std::printf("[gpu fused multipliers] fast in %lld T %lld: %.3g\n", static_cast<long long>(in),
                        static_cast<long long>(T), err);
            EXPECT_LE(err, 1e-2) << "fast precision, stored";
            continue;
          }
          f.y = fa.upload(y0, DType::F32, {T, out});
          EXPECT_FALSE(fast->supports_fused_linear(f, batch)) << "a bias with the residual add";
          f.bias = TensorView{};
          EXPECT_FALSE(fast->supports_fused_linear(f, batch)) << "several runs with the residual add";
          f.out_scales = {{out, 0.6f}};
          ASSERT_TRUE(fast->supports_fused_linear(f, batch)) << "one run with the residual add";
          fast->fused_linear(f, batch);
          std::vector<double> ref1(ref.size());
          for (size_t k = 0; k < ref1.size(); ++k)
            ref1[k] = y0[k] + double(x_scale) * dots[k] * double(0.6f);
          EXPECT_LE(gputest::rel_err(fa.download(f.y), ref1), 1e-2) << "fast precision, added onto the residual";
        }
  }
}

// Fast precision with multipliers keeps batch invariance: alpha changes no plan and the run scales are elementwise,
// so each row of an 8-row batch is the bits that row gets alone, stored (x_scale, bias, three runs) and added onto a
// residual (one run folded into alpha).
TEST(GpuFusedLinearMultipliers, FastRowsEqualAlone) {
  MAMBACPP_REQUIRE_GPU();
  auto fast = make_cuda_backend(DType::BF16, Precision::Fast);
  const int64_t in = 256, out = 72, T = 8;
  Rng rng(91);
  const auto w = gputest::rounded(rng.vec(static_cast<size_t>(out * in)), DType::BF16);
  const auto nw = rng.vec(static_cast<size_t>(in), 0.5f, 1.5f), bias = rng.vec(static_cast<size_t>(out));
  const auto x = rng.vec(static_cast<size_t>(T * in), -2, 2), y0 = rng.vec(static_cast<size_t>(T * out));
  for (bool accumulate : {false, true}) {
    SCOPED_TRACE(accumulate ? "accumulate" : "stored");
    auto run = [&](int64_t first, int64_t rows) {
      DeviceArena fa(*fast);
      FusedLinearArgs f;
      f.x = fa.upload(std::vector<float>(x.begin() + first * in, x.begin() + (first + rows) * in), DType::F32,
                      {rows, in});
      f.w = fa.upload(w, DType::BF16, {out, in});
      f.norm_w = fa.upload(nw, DType::F32, {in});
      f.eps = 1e-5f;
      f.x_scale = 1.25f;
      if (accumulate) {
        f.y = fa.upload(std::vector<float>(y0.begin() + first * out, y0.begin() + (first + rows) * out), DType::F32,
                        {rows, out});
        f.accumulate = true;
        f.out_scales = {{out, 0.6f}};
      } else {
        f.bias = fa.upload(bias, DType::F32, {out});
        f.y = fa.poisoned({rows, out});
        f.out_scales = {{24, 0.35f}, {60, 1.7f}, {out, 0.6f}};
      }
      std::vector<int64_t> slots;
      for (int64_t t = 0; t < rows; ++t) slots.push_back(t);
      const BatchLayout batch = gputest::make_batch(std::vector<int64_t>(static_cast<size_t>(rows), 1), slots);
      EXPECT_TRUE(fast->supports_fused_linear(f, batch));
      fast->fused_linear(f, batch);
      return fa.download(f.y);
    };
    const std::vector<float> all = run(0, T);
    for (int64_t t = 0; t < T; ++t)
      EXPECT_EQ(run(t, 1), std::vector<float>(all.begin() + t * out, all.begin() + (t + 1) * out)) << "row " << t;
  }
}

}  // namespace
}  // namespace mambacpp
