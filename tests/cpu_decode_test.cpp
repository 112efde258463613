// The CPU's fused decode (CpuBackend::decode_block, rmsnorm_linear) against the plain ops it replaces, on every SIMD
// target: the same random model decoded step by step with fused_decode on and off, f32/bf16/f16 weights, for the
// tiny configs (sizes below one vector) and odd medium ones (several vectors plus a tail). The plain ops are tested
// against fp64 references in cpu_kernels_test.cpp; the two paths differ only by f32 rounding (vector exp, the order
// of the dot products' tails, the norm scale), which compounds over a few layers and steps to ~1e-6: 1e-5 as
// max|a - b| / max|b|, the tolerance of the invariance tests. A bf16 state is checked too (its own tolerance below).
#include <gtest/gtest.h>

#include "backend/cpu/simd.h"
#include "mambacpp/model.h"
#include "support/test_support.h"

namespace mambacpp {
namespace {

constexpr double kTol = 1e-5;

ModelConfig odd_mamba2() {
  ModelConfig c = test::tiny_mamba2_config();
  c.d_model = 35;
  c.d_inner = 70;
  c.head_dim = 7;
  c.n_heads = 10;
  c.n_groups = 2;
  c.d_state = 37;
  c.vocab_size = 101;
  return c;
}

ModelConfig odd_mamba1() {
  ModelConfig c = test::tiny_mamba1_config();
  c.d_model = 45;
  c.d_inner = 90;
  c.d_state = 19;
  c.dt_rank = 5;
  c.vocab_size = 67;
  return c;
}

struct Decoded {
  std::vector<float> logits;  // every step's logits
  std::vector<float> state;   // final state of each slot, concatenated
};

// A prompt through prefill, then `steps` single-token steps of `batch` sequences together.
Decoded decode(const ModelConfig& config, DType weights, DType state_dtype, bool fused, int64_t batch, int steps) {
  LoadOptions lo;
  lo.device = DeviceChoice::CPU;
  lo.fused_decode = fused;
  lo.threads = 2;
  auto model = Model::random(config, lo, 99, weights);
  auto state = model->create_state(batch + 1, state_dtype);
  Decoded d;
  std::vector<std::vector<int32_t>> prompts;
  for (int64_t b = 0; b < batch; ++b) prompts.push_back(test::random_tokens(5 + b, config.vocab_size, 10 + b));
  std::vector<Sequence> seqs;
  for (int64_t b = 0; b < batch; ++b) seqs.push_back(Sequence::tokens(prompts[static_cast<size_t>(b)], b + 1));
  model->forward(*state, seqs, Output::LastLogits);
  std::vector<int32_t> next(static_cast<size_t>(batch));
  for (int s = 0; s < steps; ++s) {
    for (int64_t b = 0; b < batch; ++b) {
      next[static_cast<size_t>(b)] = static_cast<int32_t>((7 * s + 3 * b + 1) % config.vocab_size);
      seqs[static_cast<size_t>(b)] = Sequence::tokens(std::span<const int32_t>(&next[static_cast<size_t>(b)], 1), b + 1);
    }
    ForwardResult r = model->forward(*state, seqs, Output::LastLogits);
    d.logits.insert(d.logits.end(), r.values.begin(), r.values.end());
  }
  for (int64_t b = 0; b < batch; ++b) {
    const std::vector<float> s = state->read_slot(b + 1);
    d.state.insert(d.state.end(), s.begin(), s.end());
  }
  return d;
}

TEST(CpuDecode, FusedBlockMatchesPlainOps) {
  for (const std::string& target : cpu::simd::available_targets()) {
    SCOPED_TRACE("SIMD target " + target);
    cpu::simd::force_target(target);
    for (const ModelConfig& c : {test::tiny_mamba1_config(), test::tiny_mamba2_config(), odd_mamba1(), odd_mamba2()}) {
      for (DType w : {DType::F32, DType::BF16, DType::F16}) {
        for (int64_t batch : {1, 3}) {
          SCOPED_TRACE(std::string(c.arch == Arch::Mamba1 ? "mamba1" : "mamba2") + " d_model " +
                       std::to_string(c.d_model) + " weights " + dtype_name(w) + " batch " + std::to_string(batch));
          const Decoded plain = decode(c, w, DType::F32, false, batch, 4);
          const Decoded fused = decode(c, w, DType::F32, true, batch, 4);
          EXPECT_LE(test::max_rel_diff(fused.logits, plain.logits), kTol);
          EXPECT_LE(test::max_rel_diff(fused.state, plain.state), kTol);
        }
        // bf16 state: the fused path rounds in its kernels, the plain ops round an f32 copy after each call — once
        // per token either way, but an f32 difference in the last bit can flip a rounding: one bf16 ulp (2^-8) of
        // an element, 2^-7 with margin for its effect on later steps.
        SCOPED_TRACE(std::string(c.arch == Arch::Mamba1 ? "mamba1" : "mamba2") + " bf16 state, weights " + dtype_name(w));
        const Decoded plain = decode(c, w, DType::BF16, false, 2, 4);
        const Decoded fused = decode(c, w, DType::BF16, true, 2, 4);
        EXPECT_LE(test::max_rel_diff(fused.logits, plain.logits), 0x1p-7);
        EXPECT_LE(test::max_rel_diff(fused.state, plain.state), 0x1p-7);
      }
    }
  }
  cpu::simd::force_target("");
}

}  // namespace
}  // namespace mambacpp
