// CUDA backend: mamba2_ssd (chunked SSD for multi-token sequences, the recurrent step for decode batches) against
// the plain sequential recurrence in fp64, which no chunking can influence:
//   H_t = exp(dt_t A) H_{t-1} + dt_t x_t (x) B_t,  y_t = H_t . C_t + D x_t.
// Covers the real Mamba-2 head (head_dim 64, d_state 128, chunk 256) with L = 600 crossing chunk boundaries, odd
// sizes and tile remainders, n_groups in {1, 2, 3, n_heads}, dt clamping, decays from |a| ~ 1e-4 (state carried
// across chunks) to |a| ~ 10 per token (|S| in the thousands inside a chunk), non-identity slots, an unused slot,
// f32 and bf16 state, and chunk sizes 1..1000 on the same inputs, and mamba2-2.7b's shape (80 heads) at 4096 tokens.
// Head_dim and d_state multiples of 16 take the tensor-core chunk kernels (mamba2_ssd_tc.cu), the odd sizes the
// CUDA-core ones. Also compared with the CPU backend.
// Tolerances: the CUDA-core kernels are f32 with f32 accumulation over <= chunk_size terms and f64 cumulative
// decays: ~1e-6 relative in practice; the tensor-core ones split each f32 operand into two bf16 halves and keep
// three of the four partial products, ~3 * 2^-18 relative per product at worst, averaging down in the sums (a few
// 1e-6 expected). 2e-5 is the bound for both. bf16 state: one rounding on write, 4e-3 of max|state| (see conv tests).
// Fast precision (mamba2_ssd_fast.cu, the chunk state's Fast variant): every matrix operand rounded once to bf16
// (relative 2^-9 = 2e-3). A term of y passes through at most three roundings (C, B, x and the scaled score; or C
// and H_in), a term of the state through three (x, x w, B): <= 6e-3 of each term's magnitude. Relative to max|y| the
// error is smaller where the errors of a sum's terms average out and larger where terms cancel; 1e-2 for y and the
// state, with the measured errors printed (expected ~1e-3). A broken tile or mask gives O(1).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "backend/backend.h"
#include "gpu/gpu_test_util.h"

namespace mambacpp {
namespace {

using gputest::DeviceArena;
using gputest::make_batch;
using gputest::Rng;
using gputest::rel_err;
using gputest::rounded;

constexpr double kOutTol = 2e-5;
constexpr double kFastTol = 1e-2;
double state_tol(DType t) { return t == DType::BF16 ? 4e-3 : 2e-5; }
double softplus(double v) { return v > 20.0 ? v : std::log1p(std::exp(v)); }

struct SsdCase {
  int64_t H, P, N, G, chunk;
  std::vector<int64_t> lens, slots;
  int64_t n_slots;
  DType state_dtype = DType::F32;
  float dt_min = 0.0f, dt_max = std::numeric_limits<float>::infinity();
};

// Host inputs of one case. xBC is the conv output [T, H*P + 2*G*N]; zxdt holds dt in its last H columns.
struct SsdInputs {
  int64_t T = 0, W = 0, Wd = 0;
  std::vector<float> xBC, zxdt, A_log, D, dt_bias, state0;
};

SsdInputs make_inputs(const SsdCase& cs, uint64_t seed) {
  Rng rng(seed);
  SsdInputs in;
  for (int64_t l : cs.lens) in.T += l;
  in.W = cs.H * cs.P + 2 * cs.G * cs.N;
  in.Wd = cs.H + 5;
  in.xBC = rng.vec(in.T * in.W, -1.5f, 1.5f);
  in.zxdt = rng.vec(in.T * in.Wd, -2.0f, 2.0f);
  for (int64_t h = 0; h < cs.H; ++h) {
    // Alternate slow heads (A ~ -0.05, dt ~ 0.01: memory spans chunks) and fast ones (A up to -7, dt ~ 1).
    const bool slow = h % 2 == 0;
    in.A_log.push_back(slow ? rng.uniform(-3.5f, -2.5f) : rng.uniform(0.0f, 2.0f));
    in.dt_bias.push_back(slow ? rng.uniform(-5.0f, -4.0f) : rng.uniform(0.0f, 1.0f));
    in.D.push_back(rng.uniform(-1.0f, 1.0f));
  }
  in.state0 = rounded(rng.vec(cs.n_slots * cs.H * cs.P * cs.N, -1, 1), cs.state_dtype);
  return in;
}

struct SsdResult {
  std::vector<double> y, state;
};

SsdResult reference(const SsdCase& cs, const SsdInputs& in, const BatchLayout& batch) {
  const int64_t H = cs.H, P = cs.P, N = cs.N, HP = H * P;
  SsdResult r;
  r.y.assign(static_cast<size_t>(in.T * HP), 0.0);
  r.state = gputest::to_double(in.state0);
  for (const SeqSpan& sp : batch.seqs) {
    for (int64_t h = 0; h < H; ++h) {
      const int64_t g = h / (H / cs.G);
      const double A = -std::exp(double(in.A_log[h]));
      double* S = r.state.data() + (sp.slot * H + h) * P * N;
      for (int64_t t = sp.start; t < sp.start + sp.len; ++t) {
        double dt = softplus(double(in.zxdt[t * in.Wd + 5 + h]) + in.dt_bias[h]);
        dt = std::min(std::max(dt, double(cs.dt_min)), double(cs.dt_max));
        const double dA = std::exp(dt * A);
        const float* row = in.xBC.data() + t * in.W;
        const float* B = row + HP + g * N;
        const float* C = row + HP + cs.G * N + g * N;
        for (int64_t p = 0; p < P; ++p) {
          const double xv = row[h * P + p];
          double acc = 0;
          for (int64_t n = 0; n < N; ++n) {
            double& s = S[p * N + n];
            s = dA * s + dt * xv * B[n];
            acc += s * C[n];
          }
          r.y[t * HP + h * P + p] = acc + double(in.D[h]) * xv;
        }
      }
    }
  }
  return r;
}

// The op's arguments over device copies of `in`: x, B, C are column slices of one xBC buffer, dt of another.
Mamba2ScanArgs device_args(const SsdCase& cs, const SsdInputs& in, DeviceArena& arena) {
  const int64_t HP = cs.H * cs.P, GN = cs.G * cs.N;
  TensorView xBC = arena.upload(in.xBC, DType::F32, {in.T, in.W});
  TensorView zxdt = arena.upload(in.zxdt, DType::F32, {in.T, in.Wd});
  Mamba2ScanArgs a;
  a.x = xBC.cols(0, HP);
  a.B = xBC.cols(HP, GN);
  a.C = xBC.cols(HP + GN, GN);
  a.dt = zxdt.cols(5, cs.H);
  a.A_log = arena.upload(in.A_log, DType::F32, {cs.H});
  a.D = arena.upload(in.D, DType::F32, {cs.H});
  a.dt_bias = arena.upload(in.dt_bias, DType::F32, {cs.H});
  a.dt_min = cs.dt_min;
  a.dt_max = cs.dt_max;
  a.n_heads = cs.H;
  a.head_dim = cs.P;
  a.n_groups = cs.G;
  a.d_state = cs.N;
  a.chunk_size = cs.chunk;
  a.state = arena.upload(in.state0, cs.state_dtype, {cs.n_slots, cs.H, cs.P, cs.N});
  a.y = arena.poisoned({in.T, HP});
  return a;
}

// Runs one case through the backend and checks it against the fp64 recurrence; returns y.
std::vector<float> run_ssd(const SsdCase& cs, uint64_t seed, Precision precision = Precision::Exact) {
  auto be = make_cuda_backend(DType::BF16, precision);
  DeviceArena arena(*be);
  const SsdInputs in = make_inputs(cs, seed);
  BatchLayout batch = make_batch(cs.lens, cs.slots);
  Mamba2ScanArgs a = device_args(cs, in, arena);
  be->prepare_batch(batch);
  be->mamba2_ssd(a, batch);
  const SsdResult ref = reference(cs, in, batch);
  const auto got_y = arena.download(a.y);
  const auto got_state = arena.download(a.state);
  const bool fast = precision == Precision::Fast;
  const double ey = rel_err(got_y, ref.y), es = rel_err(got_state, ref.state);
  if (fast)
    std::printf("[fast ssd] H %lld P %lld N %lld chunk %lld: y %.2e, state %.2e\n", static_cast<long long>(cs.H),
                static_cast<long long>(cs.P), static_cast<long long>(cs.N), static_cast<long long>(cs.chunk), ey, es);
  EXPECT_LT(ey, fast ? kFastTol : kOutTol) << "chunk " << cs.chunk;
  EXPECT_LT(es, fast ? std::max(kFastTol, state_tol(cs.state_dtype)) : state_tol(cs.state_dtype))
      << "chunk " << cs.chunk;
  const int64_t per_slot = cs.H * cs.P * cs.N;
  int64_t touched = 0;  // elements of slots outside the batch that changed
  for (int64_t s = 0; s < cs.n_slots; ++s) {
    if (std::find(cs.slots.begin(), cs.slots.end(), s) != cs.slots.end()) continue;
    for (int64_t i = 0; i < per_slot; ++i) touched += got_state[s * per_slot + i] != in.state0[s * per_slot + i];
  }
  EXPECT_EQ(touched, 0);
  return got_y;
}

TEST(CudaMamba2Ssd, RealHeadLongSequenceCrossesChunks) {
  MAMBACPP_REQUIRE_GPU();
  run_ssd({4, 64, 128, 1, 256, {600, 1, 257, 3}, {1, 3, 0, 2}, 5}, 41);
}

// mamba2-2.7b's SSD shape (80 heads x 64 x 128, one group, chunk 256): the tensor-core chunk kernels at the size
// the prefill benchmark runs (4096 tokens: 16 chunks), and two sequences that end inside a chunk.
TEST(CudaMamba2Ssd, Mamba2_2p7bShapeLongPrompt) {
  MAMBACPP_REQUIRE_GPU();
  run_ssd({80, 64, 128, 1, 256, {4096}, {1}, 2}, 50);
}

TEST(CudaMamba2Ssd, Mamba2_2p7bShapeTwoSequences) {
  MAMBACPP_REQUIRE_GPU();
  run_ssd({80, 64, 128, 1, 256, {300, 300}, {1, 0}, 2}, 51);
}

TEST(CudaMamba2Ssd, BF16StateClampedDtTwoGroups) {
  MAMBACPP_REQUIRE_GPU();
  SsdCase cs{4, 64, 128, 2, 256, {300, 2}, {0, 1}, 2, DType::BF16};
  cs.dt_min = 0.001f;
  cs.dt_max = 0.1f;
  run_ssd(cs, 42);
}

TEST(CudaMamba2Ssd, OddSizesAndGroups) {
  MAMBACPP_REQUIRE_GPU();
  run_ssd({6, 5, 7, 3, 16, {33, 2, 16, 17, 1}, {4, 0, 1, 2, 3}, 6}, 43);
  run_ssd({3, 70, 65, 3, 100, {150, 64}, {1, 0}, 2}, 44);  // tile remainders in head_dim and d_state
}

TEST(CudaMamba2Ssd, ResultDoesNotDependOnChunkSize) {
  MAMBACPP_REQUIRE_GPU();
  for (int64_t chunk : {1, 7, 64, 256, 1000}) run_ssd({2, 64, 128, 1, chunk, {300, 5}, {1, 0}, 2}, 45);
}

TEST(CudaMamba2Ssd, DecodeStepForSingleTokenBatches) {
  MAMBACPP_REQUIRE_GPU();
  run_ssd({8, 64, 128, 2, 256, {1, 1, 1, 1, 1, 1}, {5, 2, 0, 6, 1, 3}, 7}, 46);
  run_ssd({8, 64, 128, 8, 256, {1, 1, 1}, {1, 2, 0}, 3, DType::BF16}, 47);
  run_ssd({3, 5, 33, 1, 256, {1, 1}, {1, 0}, 2}, 48);
}

// The vectorised step (16-byte state accesses, mamba2_ssd.cu): mamba2-2.7b's heads at batch 64 with bf16 and f32
// state (slots in reverse order, one slot unused), and d_state 64 / 32 / 16 (8, 4 and 2 lanes per row of H).
TEST(CudaMamba2Ssd, DecodeStepVectorisedAcrossStateWidths) {
  MAMBACPP_REQUIRE_GPU();
  std::vector<int64_t> ones(64, 1), slots(64);
  for (int64_t i = 0; i < 64; ++i) slots[i] = 64 - i;
  run_ssd({80, 64, 128, 1, 256, ones, slots, 65, DType::BF16}, 52);
  run_ssd({80, 64, 128, 1, 256, ones, slots, 65}, 53);
  run_ssd({4, 64, 64, 2, 256, {1, 1, 1}, {2, 0, 1}, 3, DType::BF16}, 54);
  run_ssd({4, 32, 32, 1, 256, {1, 1}, {1, 0}, 2}, 55);
  run_ssd({6, 24, 16, 3, 256, {1, 1}, {0, 1}, 2, DType::BF16}, 56);
  run_ssd({6, 24, 16, 3, 256, {1, 1}, {0, 1}, 2}, 57);  // f32 at d_state 16: 4 lanes per row
}

// Fast precision: bf16 operands and one product on the tensor-core path (mamba2_ssd_fast.cu), against the same
// fp64 recurrence: the real head across chunk boundaries and sequences, mamba2-2.7b's shape at 4096 tokens, a bf16
// state with two groups, tile remainders (head_dim 80: a 16-column p tile; d_state 48; chunk 100: partial source
// tiles), d_state 256 (the largest covered), and chunk sizes 1..1000.
TEST(CudaMamba2Ssd, FastPrecisionMatchesTheRecurrence) {
  MAMBACPP_REQUIRE_GPU();
  const Precision F = Precision::Fast;
  run_ssd({4, 64, 128, 1, 256, {600, 1, 257, 3}, {1, 3, 0, 2}, 5}, 41, F);
  run_ssd({80, 64, 128, 1, 256, {4096}, {1}, 2}, 50, F);
  run_ssd({80, 64, 128, 1, 256, {300, 300}, {1, 0}, 2}, 51, F);
  SsdCase bf{4, 64, 128, 2, 256, {300, 2}, {0, 1}, 2, DType::BF16};
  bf.dt_min = 0.001f;
  bf.dt_max = 0.1f;
  run_ssd(bf, 42, F);
  run_ssd({6, 80, 48, 3, 100, {150, 64, 1, 37}, {3, 0, 1, 2}, 4}, 58, F);
  run_ssd({2, 32, 256, 2, 128, {200, 9}, {0, 1}, 2}, 59, F);
  for (int64_t chunk : {1, 7, 64, 256, 1000}) run_ssd({2, 64, 128, 1, chunk, {300, 5}, {1, 0}, 2}, 45, F);
}

// Fast precision's chunk output kernels, chosen by the chunk size: a block per (chunk, head) for chunks of up to 4
// output tiles (256 tokens; chunk sizes of 1, 3 and 4 tiles here) and a block per output tile past it (chunk 1000),
// each against the recurrence, y and the state, on the shapes of the test above: many heads, several groups, a bf16
// state, remainders in head_dim and d_state, a one-token sequence in the batch.
TEST(CudaMamba2Ssd, FastChunkOutputKernelsMatchTheRecurrence) {
  MAMBACPP_REQUIRE_GPU();
  const Precision F = Precision::Fast;
  run_ssd({4, 64, 128, 1, 256, {600, 1, 257, 3}, {1, 3, 0, 2}, 5}, 41, F);
  run_ssd({80, 64, 128, 1, 256, {4096}, {1}, 2}, 50, F);
  run_ssd({4, 64, 128, 2, 256, {300, 2, 65, 130}, {0, 1, 3, 2}, 4, DType::BF16}, 42, F);
  run_ssd({6, 80, 48, 3, 100, {150, 64, 1, 37}, {3, 0, 1, 2}, 4}, 58, F);
  run_ssd({2, 32, 256, 2, 128, {200, 9}, {0, 1}, 2}, 59, F);
  for (int64_t chunk : {64, 192, 1000}) run_ssd({2, 64, 128, 1, chunk, {300, 5}, {1, 0}, 2}, 45, F);
}

// Fast precision takes its own path: its y differs from the exact path's by the bf16 roundings (more than f32
// rounding, less than the bound above), so a fast run that silently fell back to the exact kernels fails here.
TEST(CudaMamba2Ssd, FastPrecisionRoundsItsOperands) {
  MAMBACPP_REQUIRE_GPU();
  const SsdCase cs{4, 64, 128, 1, 256, {600, 40}, {1, 0}, 2};
  const auto exact = run_ssd(cs, 60, Precision::Exact), fast = run_ssd(cs, 60, Precision::Fast);
  const double d = rel_err(fast, gputest::to_double(exact));
  std::printf("[fast ssd] fast vs exact: %.2e\n", d);
  EXPECT_GT(d, 1e-4);
  EXPECT_LT(d, kFastTol);
}

// Fast precision stores a prompt's y rounded to bf16 (the error model in mamba2_ssd_fast.cu), in bf16 where the
// caller takes the plan's y dtype (Backend::plan_mamba2) (prompts only) and in f32 otherwise: the same values either way, so the gated
// norm after it gives a prompt the same bits in any batch.
TEST(CudaMamba2Ssd, FastPromptsGiveYInBf16TheValuesOfF32) {
  MAMBACPP_REQUIRE_GPU();
  const SsdCase cs{4, 64, 128, 1, 256, {300, 40}, {1, 0}, 2};
  auto be = make_cuda_backend(DType::BF16, Precision::Fast);
  DeviceArena arena(*be);
  const SsdInputs in = make_inputs(cs, 61);
  BatchLayout prompts = make_batch(cs.lens, cs.slots), with_one = make_batch({300, 1}, {1, 0});
  const Mamba2Shape shape{cs.P, cs.N, cs.chunk, 4, false};
  EXPECT_EQ(be->plan_mamba2(shape, prompts).y_dtype, DType::BF16);
  EXPECT_EQ(be->plan_mamba2(shape, with_one).y_dtype, DType::F32);  // the step kernel's rows are f32
  EXPECT_EQ(make_cuda_backend(DType::BF16, Precision::Exact)->plan_mamba2(shape, prompts).y_dtype, DType::F32);
  std::vector<float> y[2];
  for (int i = 0; i < 2; ++i) {
    Mamba2ScanArgs a = device_args(cs, in, arena);  // the same initial state both times
    if (i == 1) a.y = arena.upload(std::vector<float>(static_cast<size_t>(a.y.numel()), std::nanf("")), DType::BF16,
                                   {a.y.dim(0), a.y.dim(1)});
    be->prepare_batch(prompts);
    be->mamba2_ssd(a, prompts);
    y[i] = arena.download(a.y);
  }
  ASSERT_EQ(y[0].size(), y[1].size());
  int64_t unrounded = 0, differ = 0;
  for (size_t i = 0; i < y[0].size(); ++i) {
    unrounded += !(y[0][i] == gputest::rounded({y[0][i]}, DType::BF16)[0]);  // NaN counts
    differ += !(y[0][i] == y[1][i]);
  }
  EXPECT_EQ(unrounded, 0);
  EXPECT_EQ(differ, 0);
}

// mamba2_conv_ssd's two paths give a prompt the same bits of y, the SSD state and the conv state: the fused one
// (all-prompt batches: conv1d writes the SSD's bf16 x, B, C; its f32 conv output is left unwritten, still NaN, which
// also shows the path ran) and the split one (any batch with a one-token sequence: conv1d's f32 output, then the
// SSD's rounding), reached here by the same batch with a one-token sequence added after it (its own row and slot).
// Both take the fast SSD's silu (conv1d_silu alone takes the exact one, so its bf16 roundings may differ). A bf16
// input (fast prompts' in_proj output, Mamba2Plan::proj_dtype) in the fused run gives the bits of the same values in
// f32 in the split run, with its rows starting at an even column and at an odd one. A batch that already has a
// one-token sequence takes the split path in both runs.
TEST(CudaMamba2Ssd, FastConvFusionGivesTheBitsOfTheSplitPath) {
  MAMBACPP_REQUIRE_GPU();
  struct Case {
    SsdCase cs;
    bool fused;
    int bf16_in_offset = -1;  // >= 0: the fused run's input in bf16, its rows starting this many columns in
    uint64_t seed = 61;
  };
  const SsdCase two_groups{4, 64, 128, 2, 128, {300, 2}, {0, 1}, 2, DType::BF16};
  const SsdCase prompts{4, 64, 128, 1, 256, {600, 257, 3}, {1, 0, 2}, 3};
  const SsdCase with_single{4, 64, 128, 1, 256, {300, 1, 40}, {2, 0, 1}, 3};
  for (const Case& c : {Case{prompts, true}, Case{two_groups, true}, Case{with_single, false}, Case{prompts, true, 0},
                        Case{prompts, true, 1}, Case{two_groups, true, 0}, Case{prompts, true, 0, 63},
                        Case{{4, 64, 128, 1, 64, {4200, 70}, {0, 1}, 2}, true, 1, 64}}) {
    const SsdCase& cs = c.cs;
    // The split run's batch: the case's sequences, then one token in a slot of its own.
    SsdCase ext = cs;
    ext.lens.push_back(1);
    ext.slots.push_back(cs.n_slots);
    ext.n_slots = cs.n_slots + 1;
    const SsdInputs in_ext = make_inputs(ext, c.seed);
    SsdInputs in = in_ext;  // the case's rows and slots: a prefix of the split run's
    in.T = in_ext.T - 1;
    in.xBC.resize(static_cast<size_t>(in.T * in.W));
    in.zxdt.resize(static_cast<size_t>(in.T * in.Wd));
    const int64_t state_per_slot = cs.H * cs.P * cs.N;
    in.state0.resize(static_cast<size_t>(cs.n_slots * state_per_slot));
    Rng rng(c.seed + 1);
    const int64_t W = in.W, K = 4, HP = cs.H * cs.P, GN = cs.G * cs.N;
    const std::vector<float> conv_w = rng.vec(W * K, -0.6f, 0.6f), conv_b = rng.vec(W, -0.3f, 0.3f);
    const std::vector<float> conv_state0 = rng.vec(ext.n_slots * W * (K - 1), -1.5f, 1.5f);
    const bool bf16_in = c.bf16_in_offset >= 0;
    std::vector<float> y[2], state[2], conv_state[2], conv_out[2];
    for (int fused = 0; fused < 2; ++fused) {  // 0: the split run (the case plus a one-token sequence)
      const SsdCase& rc = fused ? cs : ext;
      const SsdInputs& ri = fused ? in : in_ext;
      auto be = make_cuda_backend(DType::BF16, Precision::Fast);
      DeviceArena arena(*be);
      BatchLayout batch = make_batch(rc.lens, rc.slots);
      be->prepare_batch(batch);
      const std::vector<float> xbc = bf16_in ? rounded(ri.xBC, DType::BF16) : ri.xBC;
      TensorView xin = arena.upload(xbc, DType::F32, {ri.T, W});
      if (fused && bf16_in) {
        const int64_t off = c.bf16_in_offset, width = W + 4;
        std::vector<float> wide(static_cast<size_t>(ri.T * width), 0.0f);
        for (int64_t t = 0; t < ri.T; ++t) std::copy_n(xbc.begin() + t * W, W, wide.begin() + t * width + off);
        xin = arena.upload(wide, DType::BF16, {ri.T, width}).cols(off, W);
      }
      TensorView cw = arena.upload(conv_w, DType::F32, {W, 1, K}), cb = arena.upload(conv_b, DType::F32, {W});
      const std::vector<float> cstate0(conv_state0.begin(), conv_state0.begin() + rc.n_slots * W * (K - 1));
      TensorView cstate = arena.upload(cstate0, DType::F32, {rc.n_slots, W, K - 1});
      TensorView out = arena.poisoned({ri.T, W});
      Mamba2ScanArgs a = device_args(rc, ri, arena);
      a.x = out.cols(0, HP);
      a.B = out.cols(HP, GN);
      a.C = out.cols(HP + GN, GN);
      be->mamba2_conv_ssd(xin, cw, cb, cstate, out, a, batch);
      // The case's rows and slots only.
      y[fused] = arena.download(a.y);
      y[fused].resize(static_cast<size_t>(in.T * HP));
      state[fused] = arena.download(a.state);
      state[fused].resize(static_cast<size_t>(cs.n_slots * state_per_slot));
      conv_state[fused] = arena.download(cstate);
      conv_state[fused].resize(static_cast<size_t>(cs.n_slots * W * (K - 1)));
      conv_out[fused] = arena.download(out);
      conv_out[fused].resize(static_cast<size_t>(in.T * W));
    }
    auto same_bits = [](const std::vector<float>& u, const std::vector<float>& v) {
      return u.size() == v.size() && std::memcmp(u.data(), v.data(), u.size() * sizeof(float)) == 0;
    };
    const std::string where = "lens " + std::to_string(cs.lens.size()) + " from " + std::to_string(cs.lens[0]) +
                              ", bf16 input at " + std::to_string(c.bf16_in_offset) + ", seed " +
                              std::to_string(c.seed);
    EXPECT_TRUE(std::none_of(y[0].begin(), y[0].end(), [](float v) { return std::isnan(v); })) << where;
    EXPECT_TRUE(same_bits(y[0], y[1])) << where;
    EXPECT_TRUE(same_bits(state[0], state[1])) << where;
    EXPECT_TRUE(same_bits(conv_state[0], conv_state[1])) << where;
    const bool out_written =
        std::none_of(conv_out[1].begin(), conv_out[1].end(), [](float v) { return std::isnan(v); });
    EXPECT_EQ(out_written, !c.fused) << "the fused path leaves the f32 conv output unwritten; " << where;
    EXPECT_TRUE(std::none_of(conv_out[0].begin(), conv_out[0].end(), [](float v) { return std::isnan(v); }))
        << "the split path writes the f32 conv output; " << where;
  }
}

// The same inputs through the CPU backend: both implement the same contract.
TEST(CudaMamba2Ssd, MatchesCpuBackend) {
  MAMBACPP_REQUIRE_GPU();
  const SsdCase cs{4, 64, 128, 1, 256, {600, 1, 40}, {2, 0, 1}, 3};
  const SsdInputs in = make_inputs(cs, 49);
  BatchLayout batch = make_batch(cs.lens, cs.slots);

  auto gpu = make_cuda_backend();
  DeviceArena arena(*gpu);
  Mamba2ScanArgs a = device_args(cs, in, arena);
  gpu->prepare_batch(batch);
  gpu->mamba2_ssd(a, batch);

  auto cpu = make_cpu_backend(0);
  std::vector<float> xBC = in.xBC, zxdt = in.zxdt, A_log = in.A_log, D = in.D, dt_bias = in.dt_bias;
  std::vector<float> state = in.state0, y(static_cast<size_t>(in.T * cs.H * cs.P));
  const int64_t HP = cs.H * cs.P, GN = cs.G * cs.N;
  TensorView xv(xBC.data(), DType::F32, {in.T, in.W}), dv(zxdt.data(), DType::F32, {in.T, in.Wd});
  Mamba2ScanArgs c = a;
  c.x = xv.cols(0, HP);
  c.B = xv.cols(HP, GN);
  c.C = xv.cols(HP + GN, GN);
  c.dt = dv.cols(5, cs.H);
  c.A_log = TensorView(A_log.data(), DType::F32, {cs.H});
  c.D = TensorView(D.data(), DType::F32, {cs.H});
  c.dt_bias = TensorView(dt_bias.data(), DType::F32, {cs.H});
  c.state = TensorView(state.data(), DType::F32, {cs.n_slots, cs.H, cs.P, cs.N});
  c.y = TensorView(y.data(), DType::F32, {in.T, HP});
  BatchLayout cpu_batch = make_batch(cs.lens, cs.slots);
  cpu->prepare_batch(cpu_batch);
  cpu->mamba2_ssd(c, cpu_batch);

  EXPECT_LT(rel_err(arena.download(a.y), gputest::to_double(y)), kOutTol);
  EXPECT_LT(rel_err(arena.download(a.state), gputest::to_double(state)), kOutTol);
}

}  // namespace
}  // namespace mambacpp
