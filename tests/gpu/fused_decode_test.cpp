// The fused decode recipe (src/model/mixers.cpp's mamba_block_decode_fused over the CUDA backend's fused_linear,
// fused_gemv.cu) against the plain per-op kernels:
// two models with the same random weights, one with LoadOptions::fused_decode off, prefill the same prompts and
// then decode the same tokens; logits of every step and the final states must agree.
//
// Shapes cover both GEMV load paths (16-byte vectors: widths that are multiples of 8; scalar: d_model 38, 36), the
// one-group norm (scaled after the dot) and the group-wise one (n_groups 2: scales computed first), d_state
// 16 and 128, Mamba-1 with dt_proj folded into the scan, batches of 1 to 8 sequences in permuted slots (CUDA-core
// and tensor-core GEMVs), and a batch of 9 (beyond kFusedMaxRows: the plain path must run and give the same values
// bit for bit).
//
// Tolerance: the two paths differ only in the order of f32 roundings (the norm scale is applied after the dot
// product instead of before it; dt_proj is summed by a lane group instead of a GEMV warp), ~1e-7 relative per
// op, compounded over 6 steps and 2-3 layers; 2e-5 of the largest logit / state value leaves room for that and none
// for a wrong tap, group, slot or scale (those move results by O(1)). With bf16 state the state is rounded at every
// step, and a one-ulp difference in f32 before the rounding can flip a bf16 rounding (2^-9 relative): 2e-2.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <numeric>

#include "gpu/gpu_test_util.h"
#include "mambacpp/model.h"
#include "model/mixers.h"
#include "model/step_pieces.h"
#include "model/weights.h"
#include "model/workspace.h"
#include "support/test_support.h"

namespace mambacpp {
namespace {

using gputest::rel_err;

ModelConfig mamba2_config(int64_t d_model, int64_t head_dim, int64_t n_groups, int64_t d_state, int64_t vocab) {
  ModelConfig c;
  c.arch = Arch::Mamba2;
  c.d_model = d_model;
  c.n_layer = 3;
  c.vocab_size = vocab;
  c.d_state = d_state;
  c.d_inner = 2 * d_model;
  c.head_dim = head_dim;
  c.n_heads = c.d_inner / head_dim;
  c.n_groups = n_groups;
  c.chunk_size = 16;
  return c;
}

ModelConfig mamba1_config(int64_t d_model, int64_t dt_rank, int64_t vocab) {
  ModelConfig c;
  c.arch = Arch::Mamba1;
  c.d_model = d_model;
  c.n_layer = 2;
  c.vocab_size = vocab;
  c.d_state = 16;
  c.d_inner = 2 * d_model;
  c.dt_rank = dt_rank;
  c.use_bias = true;  // covers the in_proj / out_proj bias in the fused GEMV
  return c;
}

std::unique_ptr<Model> gpu_model(const ModelConfig& c, DType weights, bool fused) {
  LoadOptions lo;
  lo.device = DeviceChoice::CUDA;
  lo.weight_dtype = weights;
  lo.fused_decode = fused;
  lo.precision = Precision::Exact;  // the fused GEMVs against the plain ops (fast mode has no fused GEMVs)
  return Model::random(c, lo, /*seed=*/11, DType::F32);
}

std::vector<double> widen(std::span<const float> v) { return {v.begin(), v.end()}; }

// Prefills B prompts of different lengths into slots in reverse order, then decodes `steps` tokens (the plain
// model's greedy choices, fed to both). Returns the largest relative difference of logits and of final states. The
// prompts are longer than the short pieces that run as decode steps (model/step_pieces.h), so both models prefill
// alike and the decode steps are what is compared.
struct Diff {
  double logits = 0.0, state = 0.0;
  bool bitwise_equal = true;
};
Diff compare(const ModelConfig& c, DType weights, DType state_dtype, int64_t B, int steps = 6) {
  auto plain = gpu_model(c, weights, false);
  auto fused = gpu_model(c, weights, true);
  auto sp = plain->create_state(B + 1, state_dtype);
  auto sf = fused->create_state(B + 1, state_dtype);
  std::vector<std::vector<int32_t>> prompts;
  for (int64_t b = 0; b < B; ++b)
    prompts.push_back(
        test::random_tokens(kStepPieceMaxLen + 1 + 5 * b % 23, c.vocab_size, static_cast<uint64_t>(100 + b)));
  std::vector<Sequence> seqs;
  for (int64_t b = 0; b < B; ++b) seqs.push_back(Sequence::tokens(prompts[static_cast<size_t>(b)], B - b));
  ForwardResult rp = plain->forward(*sp, seqs, Output::LastLogits);
  ForwardResult rf = fused->forward(*sf, seqs, Output::LastLogits);

  Diff d;
  std::vector<int32_t> next(static_cast<size_t>(B));
  for (int s = 0; s < steps; ++s) {
    for (int64_t b = 0; b < B; ++b) {
      auto row = rp.row(b);
      next[static_cast<size_t>(b)] = static_cast<int32_t>(std::max_element(row.begin(), row.end()) - row.begin());
      seqs[static_cast<size_t>(b)] = Sequence::tokens(std::span<const int32_t>(&next[static_cast<size_t>(b)], 1), B - b);
    }
    rp = plain->forward(*sp, seqs, Output::LastLogits);
    rf = fused->forward(*sf, seqs, Output::LastLogits);
    d.logits = std::max(d.logits, rel_err(rf.values, widen(rp.values)));
    d.bitwise_equal = d.bitwise_equal && rf.values == rp.values;
  }
  for (int64_t slot = 0; slot <= B; ++slot) {
    const std::vector<float> a = sf->read_slot(slot), b = sp->read_slot(slot);
    d.state = std::max(d.state, slot == 0 ? (a == b ? 0.0 : 1.0) : rel_err(a, widen(b)));  // slot 0 is unused
    d.bitwise_equal = d.bitwise_equal && a == b;
  }
  return d;
}

struct Case {
  const char* name;
  ModelConfig config;
};

std::vector<Case> cases() {
  return {
      {"mamba2 d_state 128, one group", mamba2_config(256, 64, 1, 128, 1000)},
      {"mamba2 two groups, d_state 16", mamba2_config(200, 20, 2, 16, 517)},
      {"mamba2 scalar loads, two groups", mamba2_config(38, 19, 2, 16, 101)},
      {"mamba1", mamba1_config(128, 8, 600)},
      {"mamba1 scalar loads", mamba1_config(36, 3, 97)},
  };
}

// Batches of 1-2 run on CUDA cores (any weight dtype, and 3-8 with f32 weights); 3-8 with 16-bit weights on the
// tensor cores, whose
// hi + lo split of the activations leaves up to 2^-17 of each product (7.6e-6 relative): 5e-5 there.
TEST(FusedDecode, MatchesPlainOpsF32State) {
  MAMBACPP_REQUIRE_GPU();
  for (const Case& k : cases())
    for (DType w : {DType::F32, DType::BF16})
      for (int64_t B : {1, 2, 3, 8}) {
        const Diff d = compare(k.config, w, DType::F32, B);
        const double tol = B > 2 && w != DType::F32 ? 5e-5 : 2e-5;
        std::printf("[fused] %-36s weights %-4s B %2lld: logits %.2e, state %.2e (tolerance %.0e)\n", k.name,
                    dtype_name(w), static_cast<long long>(B), d.logits, d.state, tol);
        EXPECT_LE(d.logits, tol) << k.name << " weights " << dtype_name(w) << " B " << B;
        EXPECT_LE(d.state, tol) << k.name << " weights " << dtype_name(w) << " B " << B;
      }
}

TEST(FusedDecode, MatchesPlainOpsBf16State) {
  MAMBACPP_REQUIRE_GPU();
  for (const Case& k : cases())
    for (int64_t B : {1, 3, 8}) {
      const Diff d = compare(k.config, DType::BF16, DType::BF16, B);
      EXPECT_LE(d.logits, 2e-2) << k.name << " B " << B;
      EXPECT_LE(d.state, 2e-2) << k.name << " B " << B;
    }
}

TEST(FusedDecode, LargerBatchesTakeThePlainPath) {
  MAMBACPP_REQUIRE_GPU();
  for (const Case& k : cases()) {
    const Diff d = compare(k.config, DType::BF16, DType::F32, 9, 3);
    EXPECT_TRUE(d.bitwise_equal) << k.name << ": logits " << d.logits << ", state " << d.state;
  }
}

// The fused path must actually run for the shapes above (else the comparisons would compare the plain path with
// itself): the backend takes every piece of every layer of a one-token batch.
TEST(FusedDecode, BackendAcceptsDecodeBatches) {
  MAMBACPP_REQUIRE_GPU();
  for (const Case& k : cases())
    for (int64_t B : {1, 3}) {  // CUDA cores; tensor cores where the widths allow (3 rows)
      const ModelConfig& c = k.config;
      auto m = gpu_model(c, DType::BF16, true);
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
            << k.name << " B " << B << " layer " << l;
      be.synchronize();
    }
}

}  // namespace
}  // namespace mambacpp
