// Precision modes on the GPU (mambacpp/precision.h) and batch invariance.
// - Fast linear: y = bf16(x) . w^T on the pinned cuBLASLt plan. Against an fp64 reference over the rounded
//   activations: f32 accumulation of exact bf16 x bf16 products over `in` terms, ~sqrt(in) * 2^-24 relative:
//   1e-5 is the bound. Against the unrounded activations the error is the rounding itself, up to 2^-9 relative per
//   activation (printed, not bounded here: it depends on cancellation in the dot products).
// - Batch invariance, fast mode: every kernel of a decode step and of a prefill computes a row's values in an
//   order that does not depend on the other rows, so a sequence's logits are the same bits alone and in a batch
//   of any size 1..256 (asserted with ==), on the decode linears (norm-and-round, pinned cuBLASLt GEMM, conv
//   step). Exact mode keeps the fused GEMVs for up to 8 rows and cuBLASLt's per-shape algorithm above, whose
//   summation orders differ at f32 rounding: 1e-5 and the same greedy tokens (bf16 state: such a difference can flip
//   one rounding of a state entry, 2^-9 of it: 3e-2 as in model_gpu_test.cpp).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "backend/cuda/gemm_lt.h"
#include "gpu/gpu_test_util.h"
#include "mambacpp/model.h"
#include "support/test_support.h"

namespace mambacpp {
namespace {

using gputest::DeviceArena;
using gputest::Rng;
using gputest::rounded;

TEST(CudaFastLinear, RowsAreTheSameBitsAtEveryBatchSizeAndMatchTheRoundedProduct) {
  MAMBACPP_REQUIRE_GPU();
  // in_proj-like (wide out), out_proj-like (wide in) and an odd shape.
  struct Shape { int64_t out, in; };
  for (const Shape sh : {Shape{1320, 256}, Shape{256, 640}, Shape{37, 18}}) {
    SCOPED_TRACE("out " + std::to_string(sh.out) + " in " + std::to_string(sh.in));
    auto be = make_cuda_backend(DType::BF16, Precision::Fast);
    DeviceArena arena(*be);
    Rng rng(61 + sh.out);
    const int64_t Tmax = 256;
    const auto w = rounded(rng.vec(sh.out * sh.in), DType::BF16);
    const auto x = rng.vec(Tmax * sh.in, -2, 2);
    TensorView wv = arena.upload(w, DType::BF16, {sh.out, sh.in});
    TensorView xv = arena.upload(x, DType::F32, {Tmax, sh.in});
    TensorView full = arena.poisoned({Tmax, sh.out});
    be->linear(xv, wv, {}, full);
    const auto ref_bits = arena.download(full);

    // fp64 over the bf16-rounded activations.
    const auto xr = rounded(x, DType::BF16);
    std::vector<double> ref(static_cast<size_t>(Tmax * sh.out)), ref_unrounded(ref.size());
    for (int64_t t = 0; t < Tmax; ++t)
      for (int64_t o = 0; o < sh.out; ++o) {
        double a = 0, b = 0;
        for (int64_t i = 0; i < sh.in; ++i) {
          a += double(xr[t * sh.in + i]) * w[o * sh.in + i];
          b += double(x[t * sh.in + i]) * w[o * sh.in + i];
        }
        ref[t * sh.out + o] = a;
        ref_unrounded[t * sh.out + o] = b;
      }
    EXPECT_LT(gputest::rel_err(ref_bits, ref), 1e-5);
    std::printf("[fast] linear %lld x %lld: vs rounded-x fp64 %.2e, vs f32-x fp64 %.2e\n",
                static_cast<long long>(sh.out), static_cast<long long>(sh.in), gputest::rel_err(ref_bits, ref),
                gputest::rel_err(ref_bits, ref_unrounded));

    for (int64_t T : {1, 2, 3, 8, 9, 31, 32, 33, 64, 100, 129, 255}) {
      TensorView y = arena.poisoned({T, sh.out});
      be->linear(xv.rows(0, T), wv, {}, y);
      const auto got = arena.download(y);
      ASSERT_EQ(0, std::memcmp(got.data(), ref_bits.data(), got.size() * sizeof(float))) << "T = " << T;
    }
  }
}

// Fast fused_linear on prefill pieces (the prefill recipe, mamba_block_fused_projections): the norm, or the gated
// norm of x * silu(gate), rounded to bf16 by one kernel, then the pinned GEMM, added onto y when accumulating.
// - Against the plain ops it replaces (norm / gated norm, fast linear, add): the same f32 values are rounded and
//   the same GEMM plan runs, so without accumulation the bits are equal (asserted ==); with it, the GEMM's epilogue
//   adds onto y instead of a separate add: one f32 rounding either way, asserted to 1e-6 of max|y|.
// - Against fp64 over the host's rounding of the fp64 norm: an activation near a rounding boundary may round the
//   other way (the kernel's rsqrtf is not the host's), 2^-8 of one product, so 2e-3 of max|y|.
// - Row t is the same bits in a prompt of T rows as in a longer one, and as a one-token sequence in a decode batch
//   of any size; in a forward that mixes prompts and one-token sequences each row keeps its kind's bits (prompts of
//   kPrefillMinRows tokens and more run on the prefill plan; shorter ones, one-token rows and the plain linear op on
//   the decode plan: gemm_lt.h).
TEST(CudaFastFusedLinear, PrefillRowsFoldTheNormsAndEqualThePlainOps) {
  MAMBACPP_REQUIRE_GPU();
  struct Shape { int64_t out, in, group; bool gate, accumulate; int64_t x_width; };
  // in_proj-like (one group), out_proj-like (gated, groups, onto the residual), an odd width (the scalar kernel),
  // and rows with a stride that defeats 16-byte accesses (the scalar kernel for aligned widths).
  for (const Shape sh : {Shape{1320, 256, 256, false, false, 256}, Shape{256, 640, 160, true, true, 640},
                         Shape{37, 18, 18, true, true, 18}, Shape{96, 64, 32, true, false, 67}}) {
    SCOPED_TRACE("out " + std::to_string(sh.out) + " in " + std::to_string(sh.in) + " group " +
                 std::to_string(sh.group));
    auto be = make_cuda_backend(DType::BF16, Precision::Fast);
    DeviceArena arena(*be);
    Rng rng(71 + sh.out);
    const int64_t Tmax = 700;
    const float eps = 1e-5f;
    const auto w = rounded(rng.vec(sh.out * sh.in), DType::BF16);
    const auto nw = rng.vec(sh.in, 0.5f, 1.5f);
    const auto x = rng.vec(Tmax * sh.in, -2, 2), z = rng.vec(Tmax * sh.in, -3, 3);
    const auto y0 = rng.vec(Tmax * sh.out, -1, 1);
    TensorView wv = arena.upload(w, DType::BF16, {sh.out, sh.in});
    TensorView nwv = arena.upload(nw, DType::F32, {sh.in});
    TensorView xv = arena.upload_strided(x, Tmax, sh.in, sh.x_width, 0);
    TensorView zv = arena.upload_strided(z, Tmax, sh.in, sh.x_width, 0);
    // The first T rows as a batch of `seqs` (lengths summing to T; empty: one sequence of T rows).
    auto run = [&](int64_t T, std::vector<int64_t> seqs = {}) {
      if (seqs.empty()) seqs = {T};
      FusedLinearArgs a;
      a.x = xv.rows(0, T);
      if (sh.gate) a.gate = zv.rows(0, T);
      a.w = wv;
      a.norm_w = nwv;
      a.norm_group = sh.group;
      a.eps = eps;
      a.y = sh.accumulate ? arena.upload(std::vector<float>(y0.begin(), y0.begin() + T * sh.out), DType::F32,
                                         {T, sh.out})
                          : arena.poisoned({T, sh.out});
      a.accumulate = sh.accumulate;
      BatchLayout batch;
      for (int64_t start = 0; const int64_t len : seqs) {
        batch.seqs.push_back({start, len, static_cast<int64_t>(batch.seqs.size())});
        start += len;
      }
      batch.total_tokens = T;
      EXPECT_TRUE(be->supports_fused_linear(a, batch)) << "T " << T;
      be->fused_linear(a, batch);
      return arena.download(a.y);
    };
    static_assert(Tmax >= cuda::LtMatmul::kPrefillMinRows);
    const auto full = run(Tmax);  // a long prompt's rows: the prefill plan
    // One-token sequences' rows: the decode plan (gemm_lt.h), which the plain linear op runs on too.
    const auto full_decode = run(Tmax, std::vector<int64_t>(Tmax, 1));

    // The plain ops on the same inputs.
    TensorView normed = arena.poisoned({Tmax, sh.in});
    if (sh.gate)
      be->gated_rmsnorm(xv, zv, nwv, sh.group, eps, normed);
    else
      be->rmsnorm(xv, nwv, eps, normed);
    TensorView prod = arena.poisoned({Tmax, sh.out});
    be->linear(normed, wv, {}, prod);
    TensorView plain = arena.upload(y0, DType::F32, {Tmax, sh.out});
    if (sh.accumulate) be->add_inplace(plain, prod);
    const auto want = arena.download(sh.accumulate ? plain : prod);
    if (sh.accumulate) {
      EXPECT_LT(gputest::rel_err(full_decode, gputest::to_double(want)), 1e-6);
    } else {
      ASSERT_EQ(0, std::memcmp(full_decode.data(), want.data(), full.size() * sizeof(float)));
    }

    // fp64 over the host-rounded activations.
    const auto act = gputest::gated_rmsnorm_ref(x, sh.gate ? &z : nullptr, nw, Tmax, sh.in, sh.group, eps);
    std::vector<float> act32(act.begin(), act.end());
    const auto act16 = rounded(act32, DType::BF16);
    std::vector<double> ref(static_cast<size_t>(Tmax * sh.out));
    for (int64_t t = 0; t < Tmax; ++t)
      for (int64_t o = 0; o < sh.out; ++o) {
        double acc = sh.accumulate ? y0[t * sh.out + o] : 0.0;
        for (int64_t i = 0; i < sh.in; ++i) acc += double(act16[t * sh.in + i]) * w[o * sh.in + i];
        ref[t * sh.out + o] = acc;
      }
    EXPECT_LT(gputest::rel_err(full, ref), 2e-3);
    EXPECT_LT(gputest::rel_err(full_decode, ref), 2e-3);

    const size_t row = static_cast<size_t>(sh.out);
    constexpr int64_t kLong = cuda::LtMatmul::kPrefillMinRows;
    for (int64_t T : {kLong, kLong + 1, int64_t{511}}) {
      const auto got = run(T);
      ASSERT_EQ(0, std::memcmp(got.data(), full.data(), got.size() * sizeof(float))) << "prompt of " << T;
    }
    for (int64_t T : {int64_t{2}, int64_t{3}, kLong - 1}) {  // short prompts: the decode plan
      const auto got = run(T);
      ASSERT_EQ(0, std::memcmp(got.data(), full_decode.data(), got.size() * sizeof(float))) << "prompt of " << T;
    }
    for (int64_t T : {1, 3, 257}) {
      const auto got = run(T, std::vector<int64_t>(T, 1));
      ASSERT_EQ(0, std::memcmp(got.data(), full_decode.data(), got.size() * sizeof(float))) << T << " one-token rows";
    }
    // A forward that mixes long and short prompts and one-token sequences: each row the bits of its own kind.
    const std::vector<int64_t> mixed = {kLong + 44, 1, 5, kLong, 1, 2};
    const auto got = run(kLong * 2 + 53, mixed);
    for (int64_t start = 0; const int64_t len : mixed) {
      const auto& want_rows = len >= kLong ? full : full_decode;
      EXPECT_EQ(0, std::memcmp(got.data() + start * row, want_rows.data() + start * row, len * row * sizeof(float)))
          << "rows " << start << " .. " << start + len;
      start += len;
    }
  }
}

// A model large enough for the real kernels (16-byte state vectors, aligned GEMM operands), small enough for CI.
ModelConfig medium_config(Arch arch) {
  ModelConfig c = arch == Arch::Mamba1 ? test::tiny_mamba1_config() : test::tiny_mamba2_config();
  c.d_model = 128;
  c.d_inner = 256;
  c.vocab_size = 320;
  if (arch == Arch::Mamba1) {
    c.d_state = 16;
    c.dt_rank = 8;
  } else {
    c.d_state = 64;
    c.n_heads = 8;
    c.head_dim = 32;
    c.n_groups = 1;
    c.chunk_size = 32;
  }
  return c;
}

std::unique_ptr<Model> load(const std::string& dir, Precision p) {
  LoadOptions lo;
  lo.device = DeviceChoice::CUDA;
  lo.weight_dtype = DType::BF16;
  lo.precision = p;
  return Model::load(dir, lo);
}

// Greedy decode of `n_seqs` sequences together (slot i, prompt i) for `steps` steps; the logits of every step of
// the first `track` sequences, [step][seq][vocab] flattened. scripted: fixed tokens instead of the argmax (so that
// two models see the same inputs).
std::vector<float> decode_logits(const Model& m, int64_t n_seqs, int64_t track, int steps, DType state_dtype,
                                 int64_t vocab, std::vector<int32_t>* tokens, bool scripted = false) {
  auto st = m.create_state(n_seqs, state_dtype);
  std::vector<std::vector<int32_t>> prompts;
  for (int64_t i = 0; i < n_seqs; ++i) prompts.push_back(test::random_tokens(3 + i % 5, vocab, 100 + i));
  std::vector<Sequence> seqs;
  for (int64_t i = 0; i < n_seqs; ++i) seqs.push_back(Sequence::tokens(prompts[i], i));
  ForwardResult r = m.forward(*st, seqs, Output::LastLogits);
  std::vector<float> out;
  std::vector<int32_t> next(static_cast<size_t>(n_seqs));
  for (int step = 0; step < steps; ++step) {
    for (int64_t i = 0; i < n_seqs; ++i) {
      auto row = r.row(i);
      next[i] = scripted ? static_cast<int32_t>((7 * step + 3 * i + 1) % vocab)
                         : static_cast<int32_t>(std::max_element(row.begin(), row.end()) - row.begin());
      if (i < track && tokens) tokens->push_back(next[i]);
      seqs[i] = Sequence::tokens(std::span<const int32_t>(&next[i], 1), i);
    }
    r = m.forward(*st, seqs, Output::LastLogits);
    for (int64_t i = 0; i < track; ++i) out.insert(out.end(), r.row(i).begin(), r.row(i).end());
  }
  return out;
}

// Greedy decode of 3 sequences, each alone and inside batches of 3, 8, 9, 33 and 256: fast precision must give the
// same bits, exact precision the same tokens and logits within f32 rounding.
void check_alone_equals_batched(Arch arch, DType state_dtype, Precision precision) {
  test::TempDir dir;
  const ModelConfig c = medium_config(arch);
  test::write_random_model(dir.path(), c, 71);
  auto model = load(dir.path(), precision);
  const int steps = 6;
  const int64_t track = 3;
  // Each tracked sequence alone (prompt i in slot i of its own state), then inside batches of B.
  std::vector<float> alone;
  std::vector<int32_t> alone_tokens;
  for (int64_t i = 0; i < track; ++i) {
    // decode_logits(n = i + 1, track = i + 1) would decode the others too; run sequence i alone instead.
    auto st = model->create_state(1, state_dtype);
    auto prompt = test::random_tokens(3 + i % 5, c.vocab_size, 100 + i);
    Sequence s = Sequence::tokens(prompt, 0);
    ForwardResult r = model->forward(*st, {&s, 1}, Output::LastLogits);
    std::vector<float> mine;
    std::vector<int32_t> toks;
    int32_t next = 0;
    for (int step = 0; step < steps; ++step) {
      auto row = r.row(0);
      next = static_cast<int32_t>(std::max_element(row.begin(), row.end()) - row.begin());
      toks.push_back(next);
      s = Sequence::tokens(std::span<const int32_t>(&next, 1), 0);
      r = model->forward(*st, {&s, 1}, Output::LastLogits);
      mine.insert(mine.end(), r.row(0).begin(), r.row(0).end());
    }
    alone.insert(alone.end(), mine.begin(), mine.end());
    alone_tokens.insert(alone_tokens.end(), toks.begin(), toks.end());
  }
  for (int64_t B : {3, 8, 9, 33, 256}) {
    SCOPED_TRACE("batch " + std::to_string(B));
    std::vector<int32_t> tokens;
    const auto batched = decode_logits(*model, B, track, steps, state_dtype, c.vocab_size, &tokens);
    // Reorder [step][seq] into [seq][step] as `alone` is laid out.
    std::vector<float> by_seq;
    std::vector<int32_t> tok_by_seq;
    const size_t V = static_cast<size_t>(c.vocab_size);
    for (int64_t i = 0; i < track; ++i)
      for (int step = 0; step < steps; ++step) {
        const float* row = batched.data() + (static_cast<size_t>(step) * track + i) * V;
        by_seq.insert(by_seq.end(), row, row + V);
        tok_by_seq.push_back(tokens[static_cast<size_t>(step * track + i)]);
      }
    EXPECT_EQ(tok_by_seq, alone_tokens);
    const double diff = test::max_rel_diff(by_seq, alone);
    std::printf("[invariance] %s state %s %s B %3lld: max rel diff alone vs batched %.2e\n", arch_name(arch),
                dtype_name(state_dtype), precision_name(precision), static_cast<long long>(B), diff);
    if (precision == Precision::Fast) {
      ASSERT_EQ(by_seq.size(), alone.size());
      EXPECT_EQ(0, std::memcmp(by_seq.data(), alone.data(), alone.size() * sizeof(float)));
    } else {
      EXPECT_LE(diff, state_dtype == DType::F32 ? 1e-5 : 3e-2);  // bf16 state: a rounding flip is 2^-9 of an entry
    }
  }
}

class GpuBatchInvariance : public ::testing::TestWithParam<std::tuple<Arch, DType, Precision>> {};

TEST_P(GpuBatchInvariance, GreedyDecodeAloneEqualsEveryBatchSize) {
  MAMBACPP_REQUIRE_GPU();
  const auto [arch, state_dtype, precision] = GetParam();
  check_alone_equals_batched(arch, state_dtype, precision);
}

INSTANTIATE_TEST_SUITE_P(ArchStatePrecision, GpuBatchInvariance,
                         ::testing::Combine(::testing::Values(Arch::Mamba1, Arch::Mamba2),
                                            ::testing::Values(DType::F32, DType::BF16),
                                            ::testing::Values(Precision::Fast, Precision::Exact)));

// The fast decode path (norm-and-round, pinned GEMMs, dt_proj as a GEMM for Mamba-1) against exact decode of the
// same prompts and tokens: each GEMM input rounded to bf16 (2^-9 relative), as rounding the weights would: 3e-2 of
// the logits' range (model_gpu_test.cpp's bound for bf16 weights), at batch sizes on both sides of 8.
TEST(GpuBatchInvariance, FastDecodeStaysCloseToExact) {
  MAMBACPP_REQUIRE_GPU();
  for (Arch arch : {Arch::Mamba1, Arch::Mamba2}) {
    test::TempDir dir;
    const ModelConfig c = medium_config(arch);
    test::write_random_model(dir.path(), c, 73);
    auto fast = load(dir.path(), Precision::Fast), exact = load(dir.path(), Precision::Exact);
    for (int64_t B : {1, 9}) {
      std::vector<int32_t> tf, te;
      const auto lf = decode_logits(*fast, B, B, 4, DType::F32, c.vocab_size, &tf, /*scripted=*/true);
      const auto le = decode_logits(*exact, B, B, 4, DType::F32, c.vocab_size, &te, /*scripted=*/true);
      const double d = test::max_rel_diff(lf, le);
      std::printf("[fast] %s decode B %lld: max rel logit diff fast vs exact %.2e\n", arch_name(arch),
                  static_cast<long long>(B), d);
      EXPECT_LE(d, 3e-2) << arch_name(arch) << " B " << B;
    }
  }
}

// Packed prefill of sequences of different lengths == each alone, bit for bit in fast mode (every GEMM row on the
// pinned plan of its sequence's length, the SSD chunks cut per sequence).
TEST(GpuBatchInvariance, FastPrefillBatchedEqualsAloneBitForBit) {
  MAMBACPP_REQUIRE_GPU();
  for (Arch arch : {Arch::Mamba1, Arch::Mamba2}) {
    SCOPED_TRACE(arch_name(arch));
    test::TempDir dir;
    const ModelConfig c = medium_config(arch);
    test::write_random_model(dir.path(), c, 72);
    auto model = load(dir.path(), Precision::Fast);
    const std::vector<int64_t> lengths = {1, 9, cuda::LtMatmul::kPrefillMinRows + 44, 33, 2};  // both GEMM plans
    std::vector<std::vector<int32_t>> ids;
    std::vector<Sequence> seqs;
    for (size_t i = 0; i < lengths.size(); ++i) ids.push_back(test::random_tokens(lengths[i], c.vocab_size, 80 + i));
    for (size_t i = 0; i < lengths.size(); ++i) seqs.push_back(Sequence::tokens(ids[i], static_cast<int64_t>(i)));
    auto st = model->create_state(static_cast<int64_t>(lengths.size()));
    ForwardResult batched = model->forward(*st, seqs, Output::AllLogits);
    int64_t row = 0;
    for (size_t i = 0; i < lengths.size(); ++i) {
      auto st1 = model->create_state(1);
      Sequence s = Sequence::tokens(ids[i], 0);
      ForwardResult alone = model->forward(*st1, {&s, 1}, Output::AllLogits);
      ASSERT_EQ(alone.values.size(), static_cast<size_t>(lengths[i] * batched.cols));
      EXPECT_EQ(0, std::memcmp(alone.values.data(), batched.values.data() + row * batched.cols,
                               alone.values.size() * sizeof(float)))
          << "sequence " << i;
      row += lengths[i];
    }
  }
}

// A prompt on the prefill plan (kPrefillMinRows tokens and more) in fast precision, whose in_proj output [z | xBC |
// dt] is bf16 (Mamba2Plan::proj_dtype), against exact precision: z, xBC and dt each rounded to bf16 (2^-9
// relative), as every GEMM input already is in fast precision: the decode test's bound, 3e-2 of the logits' range.
TEST(GpuBatchInvariance, FastLongPromptStaysCloseToExact) {
  MAMBACPP_REQUIRE_GPU();
  test::TempDir dir;
  const ModelConfig c = medium_config(Arch::Mamba2);
  test::write_random_model(dir.path(), c, 74);
  const auto ids = test::random_tokens(cuda::LtMatmul::kPrefillMinRows + 100, c.vocab_size, 90);
  auto logits = [&](Precision precision) {
    auto model = load(dir.path(), precision);
    auto st = model->create_state(1);
    Sequence s = Sequence::tokens(ids, 0);
    return model->forward(*st, {&s, 1}, Output::AllLogits).values;
  };
  const std::vector<float> exact = logits(Precision::Exact), fast = logits(Precision::Fast);
  const double d = test::max_rel_diff(fast, exact);
  std::printf("[fast] mamba2 prompt of %zu: max rel logit diff fast vs exact %.2e\n", ids.size(), d);
  EXPECT_LE(d, 3e-2);
}

}  // namespace
}  // namespace mambacpp
