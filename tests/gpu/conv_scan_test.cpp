// CUDA backend: conv1d_silu and mamba1_scan against sequential fp64 references written here, over packed batches of
// sequences with different lengths (1, shorter than K-1, long), non-identity slots, non-zero initial states, a slot
// no sequence uses (must stay untouched), strided inputs, and f32 and bf16 state.
// Tolerances: outputs are f32 arithmetic over short sums (conv) or a contracting recurrence (scan): ~1e-6 relative;
// 2e-5 is the bound. A bf16 state is read exactly (the reference starts from the same rounded values) and written
// once, rounded to nearest: its error is at most 2^-9 relative to each element, so 4e-3 of max|state|.
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <vector>

#include "backend/backend.h"
#include "backend/cuda/cuda_ops.h"  // kMamba1Piece
#include "gpu/gpu_test_util.h"

namespace mambacpp {
namespace {

using gputest::DeviceArena;
using gputest::make_batch;
using gputest::Rng;
using gputest::rel_err;
using gputest::rounded;

constexpr double kOutTol = 2e-5;
double state_tol(DType t) { return t == DType::BF16 ? 4e-3 : 2e-5; }
double silu(double v) { return v / (1.0 + std::exp(-v)); }
double softplus(double v) { return v > 20.0 ? v : std::log1p(std::exp(v)); }

struct ConvCase {
  int64_t C, K;
  std::vector<int64_t> lens, slots;
  int64_t n_slots;
  bool bias;
  DType state_dtype;
};

void run_conv(const ConvCase& cs, uint64_t seed) {
  auto be = make_cuda_backend();
  DeviceArena arena(*be);
  Rng rng(seed);
  const int64_t C = cs.C, K = cs.K, S = K - 1;
  BatchLayout batch = make_batch(cs.lens, cs.slots);
  const int64_t T = batch.total_tokens;
  const auto x = rng.vec(T * C, -2, 2), w = rng.vec(C * K), b = rng.vec(C);
  const auto st0 = rounded(rng.vec(cs.n_slots * C * S, -2, 2), cs.state_dtype);

  TensorView xv = arena.upload_strided(x, T, C, C + 6, 2);
  TensorView hw(const_cast<float*>(w.data()), DType::F32, {C, 1, K});
  TensorView wv = be->adopt_weight(hw);
  TensorView bv = cs.bias ? arena.upload(b, DType::F32, {C}) : TensorView();
  TensorView stv = arena.upload(st0, cs.state_dtype, {cs.n_slots, C, S});
  TensorView out = arena.poisoned({T, C});
  be->prepare_batch(batch);
  be->conv1d_silu(xv, wv, bv, stv, batch, out);

  std::vector<double> ref_out(static_cast<size_t>(T * C));
  auto ref_state = gputest::to_double(st0);
  for (const SeqSpan& sp : batch.seqs) {
    for (int64_t c = 0; c < C; ++c) {
      std::vector<double> win;  // old state (oldest first) ++ this sequence's inputs
      for (int64_t j = 0; j < S; ++j) win.push_back(st0[(sp.slot * C + c) * S + j]);
      for (int64_t t = 0; t < sp.len; ++t) win.push_back(x[(sp.start + t) * C + c]);
      for (int64_t t = 0; t < sp.len; ++t) {
        double acc = cs.bias ? b[c] : 0.0;
        for (int64_t k = 0; k < K; ++k) acc += double(w[c * K + k]) * win[t + k];
        ref_out[(sp.start + t) * C + c] = silu(acc);
      }
      for (int64_t j = 0; j < S; ++j) ref_state[(sp.slot * C + c) * S + j] = win[win.size() - S + j];
    }
  }
  const auto got_state = arena.download(stv);
  EXPECT_LT(rel_err(arena.download(out), ref_out), kOutTol);
  EXPECT_LT(rel_err(got_state, ref_state), state_tol(cs.state_dtype));
  // Slots no sequence names keep their exact old contents.
  for (int64_t s = 0; s < cs.n_slots; ++s) {
    if (std::find(cs.slots.begin(), cs.slots.end(), s) != cs.slots.end()) continue;
    for (int64_t i = 0; i < C * S; ++i) ASSERT_EQ(got_state[s * C * S + i], st0[s * C * S + i]) << "slot " << s;
  }
}

TEST(CudaConv1d, MixedLengthsNonIdentitySlotsF32State) {
  MAMBACPP_REQUIRE_GPU();
  run_conv({37, 4, {5, 1, 2, 17}, {2, 0, 4, 1}, 5, true, DType::F32}, 21);
}

TEST(CudaConv1d, BF16StateAndNoBias) {
  MAMBACPP_REQUIRE_GPU();
  run_conv({64, 4, {3, 40, 1}, {1, 2, 0}, 4, false, DType::BF16}, 22);
}

TEST(CudaConv1d, SequencesShorterThanTheWindowShiftTheState) {
  MAMBACPP_REQUIRE_GPU();
  run_conv({19, 7, {1, 2, 5, 6, 7, 20}, {5, 4, 3, 2, 1, 0}, 6, true, DType::F32}, 23);
  run_conv({8, 2, {1, 1, 3}, {0, 2, 1}, 3, true, DType::F32}, 24);
}

// Decode batches (every sequence one token) take the one-kernel step (conv1d.cu): K = 4, 3, 2 and 1 (no state),
// f32 and bf16 state, slots out of order, an unused slot; K = 7 stays on the general kernels.
TEST(CudaConv1d, SingleTokenBatchesTakeTheStepKernel) {
  MAMBACPP_REQUIRE_GPU();
  run_conv({5376, 4, {1, 1, 1, 1, 1}, {3, 0, 5, 1, 2}, 6, true, DType::BF16}, 26);
  run_conv({300, 4, {1, 1, 1}, {2, 0, 1}, 4, false, DType::F32}, 27);
  run_conv({33, 3, {1, 1}, {1, 0}, 2, true, DType::F32}, 28);
  run_conv({33, 2, {1, 1}, {0, 1}, 2, true, DType::BF16}, 29);
  run_conv({17, 1, {1}, {0}, 1, true, DType::F32}, 30);
  run_conv({17, 7, {1, 1}, {1, 0}, 2, true, DType::F32}, 31);
}

TEST(CudaConv1d, RealMamba2WidthPrefill) {
  MAMBACPP_REQUIRE_GPU();
  run_conv({1536 + 2 * 128, 4, {600, 1, 33}, {1, 0, 2}, 3, true, DType::F32}, 25);
}

// ---- Mamba-1 scan ------------------------------------------------------------------------------------------------

struct ScanCase {
  int64_t d_inner, d_state;
  std::vector<int64_t> lens, slots;
  int64_t n_slots;
  DType state_dtype, weight_dtype;
};

// Runs one case (sequences of kMamba1ChunkedMinLen tokens and more on the chunked scan at d_state
// kMamba1PieceStates, the others on the sequential kernel) and checks it against the fp64 recurrence; returns y.
std::vector<float> run_mamba1(const ScanCase& cs, uint64_t seed, Precision precision = Precision::Exact) {
  auto be = make_cuda_backend(cs.weight_dtype, precision);
  DeviceArena arena(*be);
  Rng rng(seed);
  const int64_t DI = cs.d_inner, N = cs.d_state;
  BatchLayout batch = make_batch(cs.lens, cs.slots);
  const int64_t T = batch.total_tokens;
  const int64_t R = 3 + 2 * N;  // x_proj output width: [dt_rank = 3 | B | C]
  const auto x = rng.vec(T * DI, -2, 2), dt = rng.vec(T * DI, -3, 1), z = rng.vec(T * DI, -3, 3);
  const auto xp = rng.vec(T * R, -1.5f, 1.5f);
  // A_log spread so decays range from slow to fast; dt bias around softplus^-1 of 0.01..0.5.
  const auto A_log = rng.vec(DI * N, -1.0f, 2.5f), D = rng.vec(DI), dt_bias = rng.vec(DI, -4.0f, 0.0f);
  const auto st0 = rounded(rng.vec(cs.n_slots * DI * N, -1, 1), cs.state_dtype);

  TensorView xpv = arena.upload(xp, DType::F32, {T, R});
  TensorView zx = arena.upload_strided(z, T, DI, 2 * DI, DI);  // z is the second half of in_proj's output
  TensorView hA(const_cast<float*>(A_log.data()), DType::F32, {DI, N});
  Mamba1ScanArgs a;
  a.x = arena.upload(x, DType::F32, {T, DI});
  a.dt = arena.upload(dt, DType::F32, {T, DI});
  a.A_log = be->adopt_weight(hA);  // 2-D: stored in the weight dtype
  a.B = xpv.cols(3, N);
  a.C = xpv.cols(3 + N, N);
  a.D = arena.upload(D, DType::F32, {DI});
  a.dt_bias = arena.upload(dt_bias, DType::F32, {DI});
  a.z = zx;
  a.state = arena.upload(st0, cs.state_dtype, {cs.n_slots, DI, N});
  a.y = arena.poisoned({T, DI});
  be->prepare_batch(batch);
  be->mamba1_scan(a, batch);

  const auto Ar = rounded(A_log, a.A_log.dtype);
  std::vector<double> ref_y(static_cast<size_t>(T * DI));
  auto ref_state = gputest::to_double(st0);
  for (const SeqSpan& sp : batch.seqs) {
    for (int64_t c = 0; c < DI; ++c) {
      double* h = ref_state.data() + (sp.slot * DI + c) * N;
      for (int64_t t = sp.start; t < sp.start + sp.len; ++t) {
        const double d = softplus(double(dt[t * DI + c]) + dt_bias[c]);
        double acc = 0;
        for (int64_t n = 0; n < N; ++n) {
          h[n] = std::exp(d * -std::exp(double(Ar[c * N + n]))) * h[n] + d * xp[t * R + 3 + n] * x[t * DI + c];
          acc += xp[t * R + 3 + N + n] * h[n];
        }
        ref_y[t * DI + c] = (acc + double(D[c]) * x[t * DI + c]) * silu(z[t * DI + c]);
      }
    }
  }
  const auto y = arena.download(a.y);
  EXPECT_LT(rel_err(y, ref_y), kOutTol);
  EXPECT_LT(rel_err(arena.download(a.state), ref_state), state_tol(cs.state_dtype));
  return y;
}

TEST(CudaMamba1Scan, RealStateSizeMixedBatch) {
  MAMBACPP_REQUIRE_GPU();
  run_mamba1({64, 16, {1, 40, 3, 130}, {3, 0, 4, 1}, 5, DType::F32, DType::F32}, 31);
}

TEST(CudaMamba1Scan, OddSizesAndBF16StateAndWeights) {
  MAMBACPP_REQUIRE_GPU();
  run_mamba1({37, 5, {7, 1, 2}, {1, 2, 0}, 3, DType::BF16, DType::BF16}, 32);
  run_mamba1({29, 33, {9, 4}, {1, 0}, 2, DType::F32, DType::BF16}, 33);
}

TEST(CudaMamba1Scan, StatesBeyondOnePassAccumulateAcrossPasses) {
  MAMBACPP_REQUIRE_GPU();
  run_mamba1({9, 300, {5, 1, 12}, {2, 1, 0}, 3, DType::F32, DType::F32}, 34);
}

// Decode batches (every sequence one token) of 4 or more sequences at d_state 16 take the one-thread-per-channel step
// kernel (mamba1_scan.cu): f32 and bf16 state and weights, widths that are not a multiple of its block, slots out of
// order, unused slots. (Fewer sequences stay on the lane-per-state kernel: the single-sequence case.)
TEST(CudaMamba1Scan, SingleTokenBatchesTakeTheStepKernel) {
  MAMBACPP_REQUIRE_GPU();
  run_mamba1({100, 16, {1, 1, 1, 1}, {3, 0, 5, 1}, 6, DType::F32, DType::F32}, 36);
  run_mamba1({257, 16, {1, 1, 1, 1, 1}, {2, 0, 1, 5, 4}, 7, DType::BF16, DType::BF16}, 37);
  run_mamba1({33, 16, {1}, {1}, 2, DType::BF16, DType::F32}, 38);
}

// The step kernel gives the lane-per-state kernel's bits: 4 sequences of 3 tokens scanned one step at a time, all 4
// per step (the step kernel), equal the same steps with each sequence alone (fewer than 4 sequences: the
// lane-per-state kernel), y and state, bit for bit, f32 and bf16 state; with an f32 state they also equal the
// whole sequences scanned at once (prefill). This is what keeps decode equal to prefill at every batch size.
TEST(CudaMamba1Scan, StepKernelBitsEqualTheSequenceKernel) {
  MAMBACPP_REQUIRE_GPU();
  for (DType state_dtype : {DType::F32, DType::BF16}) {
    auto be = make_cuda_backend(DType::BF16);
    DeviceArena arena(*be);
    Rng rng(40);
    const int64_t DI = 200, N = 16, L = 3, S = 4, T = L * S, n_slots = 5;
    const std::vector<int64_t> slots = {1, 3, 0, 4};  // slot 2 unused
    const auto x = rng.vec(T * DI, -2, 2), dt = rng.vec(T * DI, -3, 1), z = rng.vec(T * DI, -3, 3);
    const auto bc = rng.vec(T * 2 * N, -1.5f, 1.5f);
    const auto A_log = rng.vec(DI * N, -1.0f, 2.5f), D = rng.vec(DI), dt_bias = rng.vec(DI, -4.0f, 0.0f);
    const auto st0 = rounded(rng.vec(n_slots * DI * N, -1, 1), state_dtype);
    TensorView hA(const_cast<float*>(A_log.data()), DType::F32, {DI, N});
    TensorView bcv = arena.upload(bc, DType::F32, {T, 2 * N});
    Mamba1ScanArgs a;
    a.x = arena.upload(x, DType::F32, {T, DI});
    a.dt = arena.upload(dt, DType::F32, {T, DI});
    a.z = arena.upload(z, DType::F32, {T, DI});
    a.B = bcv.cols(0, N);
    a.C = bcv.cols(N, N);
    a.A_log = be->adopt_weight(hA);
    a.D = arena.upload(D, DType::F32, {DI});
    a.dt_bias = arena.upload(dt_bias, DType::F32, {DI});
    // Token t of sequence i is row i * L + t; each run starts from st0 and writes every row of its y.
    auto run = [&](const std::vector<BatchLayout>& launches) {
      Mamba1ScanArgs r = a;
      r.state = arena.upload(st0, state_dtype, {n_slots, DI, N});
      r.y = arena.poisoned({T, DI});
      for (BatchLayout b : launches) {
        b.total_tokens = T;
        be->prepare_batch(b);
        be->mamba1_scan(r, b);
      }
      return std::make_pair(arena.download(r.y), arena.download(r.state));
    };
    std::vector<BatchLayout> together, alone;
    for (int64_t t = 0; t < L; ++t) {
      BatchLayout step;
      for (int64_t i = 0; i < S; ++i) {
        const SeqSpan span{i * L + t, 1, slots[static_cast<size_t>(i)]};
        step.seqs.push_back(span);
        BatchLayout one;
        one.seqs.push_back(span);
        alone.push_back(one);
      }
      together.push_back(step);
    }
    auto expect_same_bits = [](const std::vector<float>& got, const std::vector<float>& want, const char* what) {
      ASSERT_EQ(got.size(), want.size());
      for (size_t i = 0; i < want.size(); ++i)
        ASSERT_EQ(std::bit_cast<uint32_t>(got[i]), std::bit_cast<uint32_t>(want[i])) << what << "[" << i << "]";
    };
    const auto step_kernel = run(together), lane_kernel = run(alone);
    expect_same_bits(step_kernel.first, lane_kernel.first, "y");
    expect_same_bits(step_kernel.second, lane_kernel.second, "state");
    if (state_dtype == DType::F32) {  // a bf16 state is rounded between decode steps, not inside a prefill
      BatchLayout whole = make_batch({L, L, L, L}, slots);
      const auto prefill = run({whole});
      expect_same_bits(step_kernel.first, prefill.first, "y (prefill)");
      expect_same_bits(step_kernel.second, prefill.second, "state (prefill)");
    }
  }
}

// The chunked scan (the default for prompts; mamba1_chunked_scan.cu) against the same recurrence:
// sequences of 128 tokens and more in pieces of 64 (600: ten, the last partial; 128 and 129: two, the second of
// one token), mixed with shorter ones (1, 3, 127 tokens: the sequential kernel), f32 and bf16 state and weights,
// widths that are not a multiple of its blocks, slots out of order, and fast precision's approximate exp2 (16-bit
// weights; its error, ~1e-7 of each decay's exponent, is far inside the bound). In exact precision a sequence's
// first piece enters with the stored state itself, so its y is the sequential kernel's bit for bit, as is that of the
// short sequences.
TEST(CudaMamba1Scan, ChunkedScanMatchesTheRecurrence) {
  MAMBACPP_REQUIRE_GPU();
  run_mamba1({64, 16, {1, 600, 3, 130, 128}, {3, 0, 4, 1, 2}, 5, DType::F32, DType::F32}, 31);
  run_mamba1({200, 16, {300, 127, 129}, {1, 2, 0}, 3, DType::BF16, DType::BF16}, 39);
  run_mamba1({1536, 16, {600, 1}, {1, 0}, 2, DType::F32, DType::BF16}, 35);
  run_mamba1({200, 16, {300, 127, 129}, {1, 2, 0}, 3, DType::BF16, DType::BF16}, 39, Precision::Fast);
  run_mamba1({1536, 16, {600, 1}, {1, 0}, 2, DType::F32, DType::BF16}, 35, Precision::Fast);
}

// In exact precision the chunked scan's first piece of a sequence enters with the stored state itself, so its y is
// the sequential kernel's bit for bit, as is that of the short sequences beside it: a 700-token sequence and a
// 5-token one scanned at once (the chunked scan) against the same rows scanned in calls of under
// kMamba1ChunkedMinLen tokens each (the sequential kernel), on the same inputs and initial state.
TEST(CudaMamba1Scan, ChunkedScanFirstPieceEqualsTheSequentialKernel) {
  MAMBACPP_REQUIRE_GPU();
  auto be = make_cuda_backend(DType::F32);
  DeviceArena arena(*be);
  Rng rng(44);
  const int64_t DI = 100, N = 16, L = 700, n_slots = 2, T = L + 5;
  const auto x = rng.vec(T * DI, -2, 2), dt = rng.vec(T * DI, -3, 1), z = rng.vec(T * DI, -3, 3);
  const auto bc = rng.vec(T * 2 * N, -1.5f, 1.5f);
  const auto A_log = rng.vec(DI * N, -1.0f, 2.5f), D = rng.vec(DI), dt_bias = rng.vec(DI, -4.0f, 0.0f);
  const auto st0 = rng.vec(n_slots * DI * N, -1, 1);
  TensorView hA(const_cast<float*>(A_log.data()), DType::F32, {DI, N});
  TensorView bcv = arena.upload(bc, DType::F32, {T, 2 * N});
  Mamba1ScanArgs a;
  a.x = arena.upload(x, DType::F32, {T, DI});
  a.dt = arena.upload(dt, DType::F32, {T, DI});
  a.z = arena.upload(z, DType::F32, {T, DI});
  a.B = bcv.cols(0, N);
  a.C = bcv.cols(N, N);
  a.A_log = be->adopt_weight(hA);
  a.D = arena.upload(D, DType::F32, {DI});
  a.dt_bias = arena.upload(dt_bias, DType::F32, {DI});
  auto run = [&](const std::vector<BatchLayout>& launches) {
    Mamba1ScanArgs r = a;
    r.state = arena.upload(st0, DType::F32, {n_slots, DI, N});
    r.y = arena.poisoned({T, DI});
    for (BatchLayout b : launches) {
      b.total_tokens = T;
      be->prepare_batch(b);
      be->mamba1_scan(r, b);
    }
    return arena.download(r.y);
  };
  const std::vector<float> chunked = run({make_batch({L, 5}, {1, 0})});
  std::vector<BatchLayout> pieces;
  const int64_t piece = cuda::kMamba1ChunkedMinLen - 1;
  for (int64_t s = 0; s < L; s += piece) {
    BatchLayout b;
    b.seqs.push_back(SeqSpan{s, std::min(piece, L - s), 1});
    pieces.push_back(b);
  }
  BatchLayout last;
  last.seqs.push_back(SeqSpan{L, 5, 0});
  pieces.push_back(last);
  const std::vector<float> sequential = run(pieces);
  for (int64_t t : {int64_t{0}, cuda::kMamba1Piece - 1, L, L + 4})
    for (int64_t c = 0; c < DI; ++c)
      ASSERT_EQ(std::bit_cast<uint32_t>(chunked[t * DI + c]), std::bit_cast<uint32_t>(sequential[t * DI + c]))
          << "token " << t << ", channel " << c;
}

}  // namespace
}  // namespace mambacpp
