// The CPU kernels against the plain fp64 references of cpu_kernel_reference.h.
// Each mixer kernel runs twice: instantiated with double (the same algorithm, chunking and blocking as in the
// engine) against the reference at 1e-12, which isolates algorithmic errors from rounding; and through the f32
// CpuBackend at 1e-5. Error measure: max|a - b| / max|b| over the whole tensor (NaN or inf fail).
// Why 1e-5 for f32: every output is a sum of at most a few hundred products of O(1) terms (conv: K; scan: d_state per
// step, the state a decayed sum over the sequence; SSD: a chunk of 256 plus the carried state), so the accumulated
// rounding is bounded by ~sqrt(n) * 6e-8 relative to the largest terms, i.e. ~1e-6; 1e-5 leaves a margin while still
// catching an fp32 segment sum formed as a difference of running sums (~eps * |S| = 3e-5 at |S| ~ 500).
// Inputs are drawn in double and rounded to f32 first, so both sides see identical inputs; weights stored as bf16/f16
// are compared against their decoded values.
// Batches mix sequence lengths (1, 2, shorter than the conv window or the chunk, crossing chunk boundaries), use
// non-identity slots (3, 0, 2, ...) with spare slots left untouched, non-zero initial states, and strided views.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "backend/cpu/conv1d.h"
#include "backend/cpu/selective_scan.h"
#include "backend/cpu/simd.h"
#include "backend/cpu/ssd.h"
#include "backend/cpu/weight_arena.h"
#include "cpu_kernel_reference.h"
#include "mambacpp/error.h"
#include "support/test_support.h"

namespace mambacpp {
namespace {

using Vec = std::vector<double>;
constexpr double kTolF64 = 1e-12;
constexpr double kTolF32 = 1e-5;
const double kNaN = std::numeric_limits<double>::quiet_NaN();

// Uniform values in [lo, hi), rounded to f32 so that f32 and f64 paths see the same numbers.
Vec uniform(int64_t n, double lo, double hi, std::mt19937_64& rng) {
  std::uniform_real_distribution<double> d(lo, hi);
  Vec v(static_cast<size_t>(n));
  for (double& x : v) x = static_cast<float>(d(rng));
  return v;
}

// A weight stored in `dtype`; `values` are the stored numbers decoded exactly (what the reference must use).
struct StoredWeight {
  std::vector<uint8_t> bytes;
  DType dtype = DType::F32;
  Vec values;
};
StoredWeight store(const Vec& v, DType dtype) {
  StoredWeight w;
  w.dtype = dtype;
  std::vector<float> f(v.begin(), v.end());
  w.bytes.resize(f.size() * dtype_size(dtype));
  convert_from_f32(f.data(), w.bytes.data(), dtype, static_cast<int64_t>(f.size()));
  std::vector<float> back(f.size());
  convert_to_f32(w.bytes.data(), dtype, back.data(), static_cast<int64_t>(f.size()));
  w.values.assign(back.begin(), back.end());
  return w;
}
TensorView view_of(StoredWeight& w, std::initializer_list<int64_t> shape) {
  return TensorView(w.bytes.data(), w.dtype, shape);
}
cpu::WeightRef f64_ref(const Vec& v) { return {v.data(), DType::F64}; }

// A dense [rows, cols] activation placed at column `off` of a wider buffer (row stride cols + pad), in T.
template <class T>
struct Strided {
  std::vector<T> buf;
  int64_t rows = 0, cols = 0, stride = 0, off = 0;
  Strided(const Vec& dense, int64_t r, int64_t c, int64_t pad = 3, int64_t offset = 2)
      : buf(static_cast<size_t>(r * (c + pad)), static_cast<T>(kNaN)), rows(r), cols(c), stride(c + pad),
        off(offset) {
    for (int64_t i = 0; i < r; ++i)
      for (int64_t j = 0; j < c; ++j) buf[static_cast<size_t>(i * stride + off + j)] = static_cast<T>(dense[i * c + j]);
  }
  cpu::Rows<T> rows_view() { return {buf.data() + off, stride}; }
  cpu::Rows<const T> crows() { return {buf.data() + off, stride}; }
  TensorView view() {
    static_assert(std::is_same_v<T, float>);
    return TensorView(buf.data(), DType::F32, {rows, stride}).cols(off, cols);
  }
  Vec dense() const {
    Vec v(static_cast<size_t>(rows * cols));
    for (int64_t i = 0; i < rows; ++i)
      for (int64_t j = 0; j < cols; ++j) v[i * cols + j] = buf[static_cast<size_t>(i * stride + off + j)];
    return v;
  }
};

template <class T>
std::vector<T> cast(const Vec& v) {
  return std::vector<T>(v.begin(), v.end());
}
template <class T>
Vec widen(const std::vector<T>& v) {
  return Vec(v.begin(), v.end());
}

void expect_close(const Vec& got, const Vec& want, double tol, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (double g : got) ASSERT_TRUE(std::isfinite(g)) << what << ": non-finite output";
  const double d = test::max_rel_diff(std::span<const double>(got), std::span<const double>(want));
  EXPECT_LE(d, tol) << what;
}

struct Batch {
  BatchLayout layout;
  int64_t n_slots = 0;
};
// Sequences of the given lengths packed in order, using the given slots; two spare slots beyond the largest.
Batch make_batch(const std::vector<int64_t>& lens, const std::vector<int64_t>& slots) {
  Batch b;
  int64_t start = 0, max_slot = 0;
  for (size_t i = 0; i < lens.size(); ++i) {
    b.layout.seqs.push_back({start, lens[i], slots[i]});
    start += lens[i];
    max_slot = std::max(max_slot, slots[i]);
  }
  b.layout.total_tokens = start;
  b.n_slots = max_slot + 2;
  return b;
}

// ---- conv1d + SiLU ------------------------------------------------------------------------------------------------

void conv_case(int64_t C, int64_t K, const std::vector<int64_t>& lens, const std::vector<int64_t>& slots, bool bias,
               uint64_t seed) {
  SCOPED_TRACE("conv C=" + std::to_string(C) + " K=" + std::to_string(K) + " seed=" + std::to_string(seed));
  std::mt19937_64 rng(seed);
  Batch b = make_batch(lens, slots);
  const int64_t T = b.layout.total_tokens, S = K - 1;
  const Vec x = uniform(T * C, -2, 2, rng), w = uniform(C * K, -1, 1, rng);
  const Vec bv = bias ? uniform(C, -0.5, 0.5, rng) : Vec{};
  const Vec state0 = uniform(b.n_slots * C * S, -1, 1, rng);

  Vec ref_state = state0, ref_out(static_cast<size_t>(T * C));
  ref::conv1d_silu(x, C, K, w, bv, ref_state, b.layout.seqs, ref_out);

  {  // the kernel in fp64
    Strided<double> xs(x, T, C), out(Vec(static_cast<size_t>(T * C), kNaN), T, C, 5, 1);
    Vec state = state0;
    cpu::Conv1dParams<double> p;
    p.x = xs.crows();
    p.w = f64_ref(w);
    p.bias = bias ? f64_ref(bv) : cpu::WeightRef{};
    p.state = state.data();
    p.out = out.rows_view();
    p.channels = C;
    p.kernel = K;
    p.threads = 2;
    cpu::conv1d_silu(p, std::span<const SeqSpan>(b.layout.seqs));
    expect_close(out.dense(), ref_out, kTolF64, "conv f64 out");
    expect_close(state, ref_state, kTolF64, "conv f64 state");
  }
  {  // the f32 backend op
    auto be = make_cpu_backend(2);
    Strided<float> xs(x, T, C), out(Vec(static_cast<size_t>(T * C), kNaN), T, C, 5, 1);
    std::vector<float> wf = cast<float>(w), bf = cast<float>(bv), state = cast<float>(state0);
    TensorView bias_view = bias ? TensorView(bf.data(), DType::F32, {C}) : TensorView{};
    be->conv1d_silu(xs.view(), TensorView(wf.data(), DType::F32, {C, 1, K}), bias_view,
                    TensorView(state.data(), DType::F32, {b.n_slots, C, S}), b.layout, out.view());
    expect_close(out.dense(), ref_out, kTolF32, "conv f32 out");
    expect_close(widen(state), ref_state, kTolF32, "conv f32 state");
  }
}

TEST(CpuKernels, Conv1dOddShapes) {
  for (int64_t K = 2; K <= 4; ++K) {
    // Lengths 1 and 2 and K-2 (< K-1: the state must shift), plus longer ones; slots out of order.
    conv_case(37, K, {1, 2, std::max<int64_t>(K - 2, 1), 9, 20}, {3, 0, 2, 5, 1}, /*bias=*/true, 10 + K);
    conv_case(37, K, {7, 1}, {1, 0}, /*bias=*/false, 20 + K);
  }
  conv_case(130, 4, {64, 3}, {0, 2}, true, 31);  // more than one channel block
}

// ---- Mamba-1 selective scan ---------------------------------------------------------------------------------------

// dt_rank > 0: the backend call also folds dt_proj in (Mamba1ScanArgs::dt_proj): it gets the low-rank dt and the
// weight, the references the product formed in fp64.
void mamba1_case(int64_t DI, int64_t N, const std::vector<int64_t>& lens, const std::vector<int64_t>& slots,
                 DType wdtype, uint64_t seed, int64_t dt_rank = 0) {
  SCOPED_TRACE("mamba1 d_inner=" + std::to_string(DI) + " d_state=" + std::to_string(N) + " seed=" +
               std::to_string(seed));
  std::mt19937_64 rng(seed);
  Batch b = make_batch(lens, slots);
  const int64_t T = b.layout.total_tokens;
  const Vec x = uniform(T * DI, -2, 2, rng), B = uniform(T * N, -1.5, 1.5, rng), C = uniform(T * N, -1.5, 1.5, rng),
            z = uniform(T * DI, -3, 3, rng);
  Vec dt = uniform(T * DI, -2, 2, rng);
  const Vec dt_low = uniform(T * dt_rank, -1, 1, rng);
  StoredWeight dt_proj_w = store(uniform(DI * dt_rank, -1, 1, rng), wdtype);
  if (dt_rank > 0)
    for (int64_t t = 0; t < T; ++t)
      for (int64_t c = 0; c < DI; ++c) {
        double acc = 0;
        for (int64_t r = 0; r < dt_rank; ++r) acc += dt_low[t * dt_rank + r] * dt_proj_w.values[c * dt_rank + r];
        dt[t * DI + c] = acc;
      }
  Vec A_log = uniform(DI * N, -0.2, 0.2, rng);
  for (int64_t c = 0; c < DI; ++c)
    for (int64_t n = 0; n < N; ++n) A_log[c * N + n] += std::log(static_cast<double>(n + 1));  // A = -(1..N), as S4D
  StoredWeight A_w = store(A_log, wdtype), D_w = store(uniform(DI, 0.5, 1.5, rng), wdtype),
               bias_w = store(uniform(DI, -4, -1, rng), wdtype);
  const Vec state0 = uniform(b.n_slots * DI * N, -1, 1, rng);

  Vec ref_state = state0, ref_y(static_cast<size_t>(T * DI));
  ref::mamba1_scan(x, dt, B, C, z, A_w.values, D_w.values, bias_w.values, ref_state, DI, N, b.layout.seqs, ref_y);

  {
    Strided<double> xs(x, T, DI), dts(dt, T, DI, 1, 0), Bs(B, T, N, 2 * N + 4, 4), Cs(C, T, N, 1, 1), zs(z, T, DI);
    Strided<double> y(Vec(static_cast<size_t>(T * DI), kNaN), T, DI);
    Vec state = state0;
    cpu::Mamba1Params<double> p;
    p.x = xs.crows();
    p.dt = dts.crows();
    p.B = Bs.crows();
    p.C = Cs.crows();
    p.z = zs.crows();
    p.A_log = f64_ref(A_w.values);
    p.D = f64_ref(D_w.values);
    p.dt_bias = f64_ref(bias_w.values);
    p.state = state.data();
    p.y = y.rows_view();
    p.d_inner = DI;
    p.d_state = N;
    p.threads = 2;
    cpu::mamba1_scan(p, std::span<const SeqSpan>(b.layout.seqs));
    expect_close(y.dense(), ref_y, kTolF64, "mamba1 f64 y");
    expect_close(state, ref_state, kTolF64, "mamba1 f64 state");
  }
  {
    auto be = make_cpu_backend(2);
    Strided<float> xs(x, T, DI), dts(dt, T, DI, 1, 0), Bs(B, T, N, 2 * N + 4, 4), Cs(C, T, N, 1, 1), zs(z, T, DI);
    Strided<float> lows(dt_low, T, dt_rank, 2, 1);
    Strided<float> y(Vec(static_cast<size_t>(T * DI), kNaN), T, DI);
    std::vector<float> state = cast<float>(state0);
    Mamba1ScanArgs a;
    a.x = xs.view();
    a.dt = dt_rank > 0 ? lows.view() : dts.view();
    if (dt_rank > 0) a.dt_proj = view_of(dt_proj_w, {DI, dt_rank});
    a.B = Bs.view();
    a.C = Cs.view();
    a.z = zs.view();
    a.A_log = view_of(A_w, {DI, N});
    a.D = view_of(D_w, {DI});
    a.dt_bias = view_of(bias_w, {DI});
    a.state = TensorView(state.data(), DType::F32, {b.n_slots, DI, N});
    a.y = y.view();
    be->mamba1_scan(a, b.layout);
    expect_close(y.dense(), ref_y, kTolF32, "mamba1 f32 y");
    expect_close(widen(state), ref_state, kTolF32, "mamba1 f32 state");
    if (T == static_cast<int64_t>(lens.size())) {
      // A decode batch with the weights adopted by the backend (its huge-page copies, where the kernel has them):
      // the step then takes the backend's -exp(A_log), made once; it must give the same bits as computing it.
      Strided<float> y2(Vec(static_cast<size_t>(T * DI), kNaN), T, DI);
      std::vector<float> state2 = cast<float>(state0);
      Mamba1ScanArgs a2 = a;
      for (TensorView* w : {&a2.A_log, &a2.D, &a2.dt_bias, &a2.dt_proj})
        if (!w->empty()) *w = be->adopt_weight(*w);
      a2.state = TensorView(state2.data(), DType::F32, {b.n_slots, DI, N});
      a2.y = y2.view();
      for (int step = 0; step < 2; ++step) {  // the second step reuses what the first made
        be->mamba1_scan(a2, b.layout);
        if (step == 0) {
          EXPECT_TRUE(y2.dense() == y.dense());
          EXPECT_TRUE(state2 == state);
        }
      }
      be->mamba1_scan(a, b.layout);  // the unadopted weights again: the second step, computed the slow way
      EXPECT_TRUE(state2 == state);
      EXPECT_TRUE(y2.dense() == y.dense());
    }
  }
}

TEST(CpuKernels, Mamba1ScanOddShapes) {
  mamba1_case(37, 5, {1, 2, 11, 3}, {3, 0, 2, 1}, DType::F32, 101);
  mamba1_case(19, 3, {5, 1}, {1, 0}, DType::BF16, 102);
}

TEST(CpuKernels, Mamba1ScanFoldsDtProj) {
  mamba1_case(37, 5, {1, 2, 11, 3}, {3, 0, 2, 1}, DType::F32, 104, /*dt_rank=*/3);
  mamba1_case(24, 16, {1, 1, 1}, {2, 0, 1}, DType::BF16, 105, /*dt_rank=*/7);  // a decode batch
}

// The decode step (a batch of single tokens: dt_proj folded in, the backend's cached -exp(A_log) with adopted
// weights) on every SIMD target, with d_state 19 = 16 + 3 and 37 channels leaving tails on each.
TEST(CpuKernels, Mamba1DecodeStepOnEveryTarget) {
  for (const std::string& target : cpu::simd::available_targets()) {
    SCOPED_TRACE("SIMD target " + target);
    cpu::simd::force_target(target);
    mamba1_case(37, 19, {1, 1, 1}, {2, 0, 1}, DType::F32, 107, /*dt_rank=*/5);
    mamba1_case(70, 16, {1, 1}, {1, 0}, DType::BF16, 108, /*dt_rank=*/3);
    mamba1_case(37, 5, {1}, {0}, DType::F16, 109);
  }
  cpu::simd::force_target("");
}

TEST(CpuKernels, Mamba1ScanRealShapes) {
  // mamba-130m's d_state; a slice of its channels; a prompt of a few hundred tokens next to decode steps.
  mamba1_case(96, 16, {300, 1, 2, 40}, {2, 0, 3, 1}, DType::F32, 103);
}

// ---- Mamba-2 SSD ---------------------------------------------------------------------------------------------------

struct M2Shape {
  int64_t n_heads, head_dim, n_groups, d_state, chunk;
  float dt_min = 0.0f, dt_max = std::numeric_limits<float>::infinity();  // f32, as Mamba2ScanArgs holds them
  double a_lo = 0.02, a_hi = 8.0;        // -A spread geometrically over the heads from a_lo to a_hi
  double bias_lo = -3.0, bias_hi = 0.5;  // dt_bias range (dt_raw is in [-1, 1])
  bool gate = false;  // the backend call also applies Mamba2ScanArgs::z (y *= silu(z)); the reference gates in fp64
};

void mamba2_case(const M2Shape& s, const std::vector<int64_t>& lens, const std::vector<int64_t>& slots, DType wdtype,
                 uint64_t seed, double tol_f32 = kTolF32) {
  SCOPED_TRACE("mamba2 heads=" + std::to_string(s.n_heads) + " head_dim=" + std::to_string(s.head_dim) +
               " groups=" + std::to_string(s.n_groups) + " d_state=" + std::to_string(s.d_state) +
               " chunk=" + std::to_string(s.chunk) + " seed=" + std::to_string(seed));
  std::mt19937_64 rng(seed);
  Batch b = make_batch(lens, slots);
  const int64_t T = b.layout.total_tokens, NH = s.n_heads, P = s.head_dim, G = s.n_groups, N = s.d_state;
  const Vec x = uniform(T * NH * P, -2, 2, rng), dt = uniform(T * NH, -1, 1, rng),
            B = uniform(T * G * N, -1, 1, rng), C = uniform(T * G * N, -1, 1, rng);
  // Decay rates spread geometrically over heads, by default from -0.02 (state carried across many chunks) to -8
  // (|S| in the thousands within a chunk).
  Vec A_log(static_cast<size_t>(NH));
  for (int64_t h = 0; h < NH; ++h)
    A_log[h] = static_cast<float>(std::log(s.a_lo) +
                                  (std::log(s.a_hi) - std::log(s.a_lo)) * h / std::max<int64_t>(NH - 1, 1));
  StoredWeight A_w = store(A_log, wdtype), D_w = store(uniform(NH, 0.5, 1.5, rng), wdtype),
               bias_w = store(uniform(NH, s.bias_lo, s.bias_hi, rng), wdtype);
  const Vec state0 = uniform(b.n_slots * NH * P * N, -1, 1, rng);

  Vec ref_state = state0, ref_y(static_cast<size_t>(T * NH * P));
  ref::mamba2_scan(x, dt, B, C, A_w.values, D_w.values, bias_w.values, s.dt_min,
                   s.dt_max, NH, P, G, N, ref_state, b.layout.seqs, ref_y);
  const Vec z = s.gate ? uniform(T * NH * P, -3, 3, rng) : Vec{};
  Vec ref_gated = ref_y;
  for (size_t i = 0; i < z.size(); ++i) ref_gated[i] *= z[i] / (1 + std::exp(-z[i]));

  {
    Strided<double> xs(x, T, NH * P), dts(dt, T, NH, 5, 1), Bs(B, T, G * N, G * N + 1, 1), Cs(C, T, G * N);
    Strided<double> y(Vec(static_cast<size_t>(T * NH * P), kNaN), T, NH * P);
    Vec state = state0;
    cpu::Mamba2Params<double> p;
    p.x = xs.crows();
    p.dt = dts.crows();
    p.B = Bs.crows();
    p.C = Cs.crows();
    p.A_log = f64_ref(A_w.values);
    p.D = f64_ref(D_w.values);
    p.dt_bias = f64_ref(bias_w.values);
    p.dt_min = s.dt_min;
    p.dt_max = s.dt_max;
    p.n_heads = NH;
    p.head_dim = P;
    p.n_groups = G;
    p.d_state = N;
    p.chunk_size = s.chunk;
    p.state = state.data();
    p.y = y.rows_view();
    p.threads = 2;
    cpu::mamba2_ssd(p, std::span<const SeqSpan>(b.layout.seqs));
    expect_close(y.dense(), ref_y, kTolF64, "mamba2 f64 y");
    expect_close(state, ref_state, kTolF64, "mamba2 f64 state");
  }
  {
    auto be = make_cpu_backend(2);
    Strided<float> xs(x, T, NH * P), dts(dt, T, NH, 5, 1), Bs(B, T, G * N, G * N + 1, 1), Cs(C, T, G * N);
    Strided<float> y(Vec(static_cast<size_t>(T * NH * P), kNaN), T, NH * P);
    std::vector<float> state = cast<float>(state0);
    Mamba2ScanArgs a;
    a.x = xs.view();
    a.dt = dts.view();
    a.B = Bs.view();
    a.C = Cs.view();
    a.A_log = view_of(A_w, {NH});
    a.D = view_of(D_w, {NH});
    a.dt_bias = view_of(bias_w, {NH});
    a.dt_min = s.dt_min;
    a.dt_max = s.dt_max;
    a.n_heads = NH;
    a.head_dim = P;
    a.n_groups = G;
    a.d_state = N;
    a.chunk_size = s.chunk;
    a.state = TensorView(state.data(), DType::F32, {b.n_slots, NH, P, N});
    a.y = y.view();
    Strided<float> zs(z, T, s.gate ? NH * P : 0, 3, 2);
    if (s.gate) a.z = zs.view();
    be->mamba2_ssd(a, b.layout);
    expect_close(y.dense(), ref_gated, tol_f32, "mamba2 f32 y");
    expect_close(widen(state), ref_state, tol_f32, "mamba2 f32 state");
  }
}

TEST(CpuKernels, Mamba2SsdOddShapes) {
  for (int64_t Q : {4, 5, 8}) {
    // Lengths: 1 (recurrent step), 2, < Q, = Q, Q + 1, several chunks with a short tail.
    const std::vector<int64_t> lens = {1, 2, Q - 1, Q, Q + 1, 3 * Q + 2};
    const std::vector<int64_t> slots = {3, 0, 2, 6, 1, 4};
    mamba2_case({6, 3, 2, 5, Q}, lens, slots, DType::F32, 200 + Q);
    mamba2_case({6, 3, 3, 5, Q}, lens, slots, DType::F32, 210 + Q);
    mamba2_case({4, 3, 1, 5, Q, 0.05f, 0.6f}, lens, slots, DType::BF16, 220 + Q);  // dt clamped on both sides
  }
  mamba2_case({2, 4, 2, 7, 3}, {2}, {0}, DType::F16, 230);  // a single two-token sequence, one head per group
}

TEST(CpuKernels, Mamba2SsdGate) {
  M2Shape s{6, 3, 2, 5, 4};
  s.gate = true;
  mamba2_case(s, {1, 2, 3, 4, 5, 14}, {3, 0, 2, 6, 1, 4}, DType::F32, 240);
  mamba2_case(s, {1, 1, 1}, {2, 0, 1}, DType::BF16, 241);  // a decode batch: the recurrent step
}

TEST(CpuKernels, Mamba2SsdRealShapes) {
  // mamba2-130m's d_state, head_dim and chunk; three of its heads. A 600-token prompt crosses two chunk boundaries,
  // 257 crosses one by a single token; decode steps and a 2-token sequence share the batch.
  mamba2_case({3, 64, 1, 128, 256}, {600, 1, 2, 257}, {3, 0, 2, 1}, DType::F32, 301);
}

// The f32 prefill kernels (the SSD's matmuls and decay rows, the Mamba-1 scan's per-token kernel) on every SIMD
// target, on sizes that leave whole vectors and a tail on each (19 = 16 + 3, 20 = 16 + 4, 37 channels).
TEST(CpuKernels, PrefillKernelsOnEveryTarget) {
  for (const std::string& target : cpu::simd::available_targets()) {
    SCOPED_TRACE("SIMD target " + target);
    cpu::simd::force_target(target);
    mamba2_case({3, 20, 1, 19, 7}, {1, 2, 23, 9}, {2, 0, 1, 3}, DType::F32, 250);
    mamba1_case(37, 19, {1, 9, 30}, {2, 0, 1}, DType::F32, 106);
  }
  cpu::simd::force_target("");
}

TEST(CpuKernels, Mamba2SsdStableSegmentSums) {
  // Decays of 0.5 to 5 per step over 256-long chunks: |S| reaches several hundred while the terms that matter are the
  // few nearest the diagonal, so each output is a short sum of O(1) products and f32 rounding bounds its error by
  // ~10 eps ~ 1e-6 (measured: 2e-7). Segment sums formed as differences of f32 running sums are off by ~ulp(|S|)
  // there: measured 3e-6 on these cases, which this tolerance rejects.
  M2Shape s{2, 64, 1, 128, 256};
  s.a_lo = 1.0;
  s.a_hi = 2.0;
  s.bias_lo = 0.5;
  s.bias_hi = 1.5;
  mamba2_case(s, {512, 300}, {1, 0}, DType::F32, 311, /*tol_f32=*/1e-6);
  s.a_lo = 0.1;
  s.a_hi = 0.3;
  s.bias_lo = 2.0;
  s.bias_hi = 3.0;
  mamba2_case(s, {512}, {1}, DType::F32, 314, /*tol_f32=*/1e-6);
}

// ---- linear --------------------------------------------------------------------------------------------------------

void linear_case(int64_t T, int64_t in, int64_t out, DType wdtype, bool bias, uint64_t seed) {
  SCOPED_TRACE("linear T=" + std::to_string(T) + " in=" + std::to_string(in) + " out=" + std::to_string(out) + " " +
               dtype_name(wdtype) + (bias ? " +bias" : ""));
  std::mt19937_64 rng(seed);
  const Vec x = uniform(T * in, -1, 1, rng);
  StoredWeight w = store(uniform(out * in, -1, 1, rng), wdtype), b = store(uniform(out, -1, 1, rng), wdtype);
  const Vec want = ref::linear(x, w.values, bias ? b.values : Vec{}, T, in, out);

  auto be = make_cpu_backend(2);
  Strided<float> xs(x, T, in);
  Strided<float> y(Vec(static_cast<size_t>(T * out), kNaN), T, out, 2, 1);
  const TensorView wv = view_of(w, {out, in}), bv = bias ? view_of(b, {out}) : TensorView{};
  be->linear(xs.view(), wv, bv, y.view());
  // Each output is a dot of `in` products of terms <= 1; f32 summation with lane-wise partial sums errs by << 1e-5
  // of max|y|.
  expect_close(y.dense(), want, kTolF32, "linear");

  // Batch invariance: each row computed alone is bit-identical to the same row inside the batch.
  const Vec batched = y.dense();
  for (int64_t t = 0; t < T; ++t) {
    Strided<float> y1(Vec(static_cast<size_t>(out), kNaN), 1, out);
    be->linear(xs.view().rows(t, 1), wv, bv, y1.view());
    const Vec alone = y1.dense();
    for (int64_t o = 0; o < out; ++o)
      ASSERT_EQ(alone[o], batched[t * out + o]) << "row " << t << " col " << o << " differs when batched";
  }
}

// On every SIMD target (each forced in turn): T <= 4 streams W in its stored dtype (the GEMV), larger T runs the
// packed GEMM (gemm.h); the batch-invariance check below ties the two paths bit for bit.
TEST(CpuKernels, Linear) {
  for (const std::string& target : cpu::simd::available_targets()) {
    SCOPED_TRACE("SIMD target " + target);
    cpu::simd::force_target(target);
    for (DType dt : {DType::F32, DType::F16, DType::BF16}) {
      linear_case(1, 67, 37, dt, true, 401);
      linear_case(3, 13, 5, dt, true, 405);
      linear_case(4, 67, 75, dt, true, 407);  // the GEMV's shares of several 16-row blocks, each read once for 4 tokens
      linear_case(37, 67, 37, dt, true, 402);
      linear_case(37, 300, 50, dt, false, 403);
    }
    linear_case(130, 96, 70, DType::BF16, true, 404);   // one W panel: the tokens split between the threads
    linear_case(45, 1500, 100, DType::F16, true, 406);  // several L2 panels of W rows, split between the threads
  }
  cpu::simd::force_target("");
}

// ---- norms and row ops ---------------------------------------------------------------------------------------------

TEST(CpuKernels, RmsNorm) {
  std::mt19937_64 rng(501);
  const int64_t T = 7, D = 45;
  const Vec x = uniform(T * D, -3, 3, rng);
  StoredWeight w = store(uniform(D, 0.5, 1.5, rng), DType::BF16);
  const Vec want = ref::rmsnorm(x, Vec{}, w.values, T, D, D, 1e-5);
  auto be = make_cpu_backend(2);
  Strided<float> xs(x, T, D), out(Vec(static_cast<size_t>(T * D), kNaN), T, D);
  be->rmsnorm(xs.view(), view_of(w, {D}), 1e-5f, out.view());
  expect_close(out.dense(), want, kTolF32, "rmsnorm");
}

TEST(CpuKernels, GatedRmsNorm) {
  std::mt19937_64 rng(502);
  const int64_t T = 5, D = 24;
  const Vec y = uniform(T * D, -3, 3, rng), z = uniform(T * D, -3, 3, rng);
  StoredWeight w = store(uniform(D, 0.5, 1.5, rng), DType::F32);
  auto be = make_cpu_backend(2);
  for (int64_t group : {int64_t{8}, int64_t{24}}) {
    const Vec want = ref::rmsnorm(y, z, w.values, T, D, group, 1e-5);
    Strided<float> ys(y, T, D), zs(z, T, D, 4, 0), out(Vec(static_cast<size_t>(T * D), kNaN), T, D);
    be->gated_rmsnorm(ys.view(), zs.view(), view_of(w, {D}), group, 1e-5f, out.view());
    expect_close(out.dense(), want, kTolF32, "gated_rmsnorm group " + std::to_string(group));
  }
  // Groups matter: normalising per group differs from normalising the whole row.
  EXPECT_GT(test::max_rel_diff(std::span<const double>(ref::rmsnorm(y, z, w.values, T, D, 8, 1e-5)),
                               std::span<const double>(ref::rmsnorm(y, z, w.values, T, D, 24, 1e-5))),
            1e-3);
}

TEST(CpuKernels, RowOps) {
  auto be = make_cpu_backend(2);
  std::mt19937_64 rng(503);
  const int64_t V = 11, D = 6, T = 4;
  StoredWeight table = store(uniform(V * D, -1, 1, rng), DType::BF16);
  std::vector<int32_t> ids = {3, 0, 10, 3};
  std::vector<float> out(static_cast<size_t>(T * D), NAN);
  be->embed(view_of(table, {V, D}), TensorView(ids.data(), DType::I32, {T}), TensorView(out.data(), DType::F32, {T, D}));
  for (int64_t t = 0; t < T; ++t)
    for (int64_t d = 0; d < D; ++d) ASSERT_EQ(out[t * D + d], table.values[ids[t] * D + d]);
  ids[1] = 11;
  EXPECT_THROW(be->embed(view_of(table, {V, D}), TensorView(ids.data(), DType::I32, {T}),
                         TensorView(out.data(), DType::F32, {T, D})),
               Error);

  StoredWeight half = store(uniform(T * D, -4, 4, rng), DType::F16);
  std::vector<float> f(static_cast<size_t>(T * D), NAN);
  be->to_f32(view_of(half, {T, D}), TensorView(f.data(), DType::F32, {T, D}));
  EXPECT_EQ(widen(f), half.values);

  std::vector<float> acc = cast<float>(uniform(T * D, -1, 1, rng));
  const Vec add = uniform(T * D, -1, 1, rng);
  Strided<float> adds(add, T, D);
  Vec want(acc.begin(), acc.end());
  for (size_t i = 0; i < want.size(); ++i) want[i] = static_cast<float>(want[i] + add[i]);
  be->add_inplace(TensorView(acc.data(), DType::F32, {T, D}), adds.view());
  EXPECT_EQ(widen(acc), want);

  const int64_t rows[] = {2, 2, 0};
  std::vector<float> g(3 * D, NAN);
  be->gather_rows(TensorView(acc.data(), DType::F32, {T, D}), rows, 3, TensorView(g.data(), DType::F32, {3, D}));
  for (int64_t i = 0; i < 3; ++i)
    for (int64_t d = 0; d < D; ++d) ASSERT_EQ(g[i * D + d], acc[rows[i] * D + d]);
}

// ---- errors and memory ---------------------------------------------------------------------------------------------

TEST(CpuKernels, RejectsBadStateAndSlots) {
  auto be = make_cpu_backend(1);
  const int64_t T = 3, C = 4, K = 4;
  std::vector<float> x(T * C, 0.5f), out(T * C), w(C * K, 0.1f), state(2 * C * (K - 1), 0.0f);
  std::vector<uint16_t> state_f16(2 * C * (K - 1), 0);
  Batch b = make_batch({T}, {1});
  const TensorView xv(x.data(), DType::F32, {T, C}), wv(w.data(), DType::F32, {C, 1, K}),
      ov(out.data(), DType::F32, {T, C});
  try {
    be->conv1d_silu(xv, wv, {}, TensorView(state_f16.data(), DType::F16, {2, C, K - 1}), b.layout, ov);
    ADD_FAILURE() << "an f16 state was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("f32 or bf16"), std::string::npos) << e.what();
  }
  const TensorView sv(state.data(), DType::F32, {2, C, K - 1});
  Batch bad_slot = make_batch({T}, {2});
  bad_slot.n_slots = 2;
  EXPECT_THROW(be->conv1d_silu(xv, wv, {}, sv, bad_slot.layout, ov), Error);
  Batch shared = make_batch({1, 2}, {1, 1});
  EXPECT_THROW(be->conv1d_silu(xv, wv, {}, sv, shared.layout, ov), Error);
  Batch too_long = make_batch({T + 1}, {0});
  EXPECT_THROW(be->conv1d_silu(xv, wv, {}, sv, too_long.layout, ov), Error);
  EXPECT_THROW(be->conv1d_silu(xv, wv, {}, sv, b.layout, xv), Error);  // out aliasing x
  be->conv1d_silu(xv, wv, {}, sv, b.layout, ov);  // the valid call goes through
}

// A bf16 state runs the same kernels on an f32 copy of its slots: the outputs equal the f32 state's, and the new
// state is the f32 one rounded to bf16 (the initial values are bf16 numbers, so both start equal).
TEST(CpuKernels, Bf16StateIsTheF32StateRounded) {
  auto be = make_cpu_backend(2);
  const int64_t T = 5, C = 11, K = 4, S = K - 1, n_slots = 3;
  std::vector<float> x(T * C), w(C * K), out32(T * C), out16(T * C), st32(n_slots * C * S);
  std::mt19937 rng(5);
  std::uniform_real_distribution<float> u(-1, 1);
  for (auto* v : {&x, &w, &st32})
    for (float& e : *v) e = bf16_to_f32(f32_to_bf16(u(rng)));
  std::vector<uint16_t> st16(st32.size());
  for (size_t i = 0; i < st32.size(); ++i) st16[i] = f32_to_bf16(st32[i]);
  Batch b = make_batch({2, 3}, {2, 0});
  b.n_slots = n_slots;
  const TensorView xv(x.data(), DType::F32, {T, C}), wv(w.data(), DType::F32, {C, 1, K});
  be->conv1d_silu(xv, wv, {}, TensorView(st32.data(), DType::F32, {n_slots, C, S}), b.layout,
                  TensorView(out32.data(), DType::F32, {T, C}));
  be->conv1d_silu(xv, wv, {}, TensorView(st16.data(), DType::BF16, {n_slots, C, S}), b.layout,
                  TensorView(out16.data(), DType::F32, {T, C}));
  EXPECT_EQ(out16, out32);
  for (size_t i = 0; i < st32.size(); ++i) EXPECT_EQ(st16[i], f32_to_bf16(st32[i])) << "state element " << i;
}

// The CPU backend's weight copies (weight_arena.h): the same bytes, 64-byte aligned, one copy per source (tied
// embeddings), a copy adopted again is itself; a tensor larger than a chunk gets its own.
TEST(CpuKernels, WeightArenaCopiesOncePerSource) {
  cpu::WeightArena arena;
  std::vector<uint8_t> small(1000), big((size_t(65) << 20) + 3);
  for (size_t i = 0; i < small.size(); ++i) small[i] = static_cast<uint8_t>(i * 7 + 1);
  for (size_t i = 0; i < big.size(); i += 4093) big[i] = static_cast<uint8_t>(i);
  const void* s = arena.adopt(small.data(), small.size());
  const void* b = arena.adopt(big.data(), big.size());
  const void* s2 = arena.adopt(small.data() + 1, 10);  // another source in the same chunk as s
  ASSERT_NE(s, small.data());
  EXPECT_EQ(std::memcmp(s, small.data(), small.size()), 0);
  EXPECT_EQ(std::memcmp(b, big.data(), big.size()), 0);
  EXPECT_EQ(std::memcmp(s2, small.data() + 1, 10), 0);
  for (const void* p : {s, b, s2}) EXPECT_EQ(reinterpret_cast<uintptr_t>(p) % 64, 0u);
  EXPECT_EQ(arena.adopt(small.data(), small.size()), s);
  EXPECT_EQ(arena.adopt(s, small.size()), s);
  EXPECT_TRUE(arena.contains(s) && arena.contains(b) && arena.contains(s2));
  EXPECT_FALSE(arena.contains(small.data()) || arena.contains(big.data()));

  auto be = make_cpu_backend(1);
  std::vector<float> w = {1.5f, -2.0f, 3.25f};
  const TensorView v(w.data(), DType::F32, {3});
  const TensorView a = be->adopt_weight(v);
  EXPECT_EQ(a.data != v.data, cpu::WeightArena::huge_pages_available());
  EXPECT_EQ(std::memcmp(a.data, w.data(), sizeof(float) * 3), 0);
  EXPECT_EQ(a.dtype, DType::F32);
  EXPECT_EQ(a.shape_string(), v.shape_string());
  EXPECT_EQ(be->adopt_weight(a).data, a.data);
}

TEST(CpuKernels, DeviceBufferOwnsAlignedMemory) {
  auto be = make_cpu_backend(1);
  DeviceBuffer a(*be, 1000);
  ASSERT_NE(a.data(), nullptr);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(a.data()) % 64, 0u);
  EXPECT_EQ(a.size(), 1000u);
  std::memset(a.data(), 7, 1000);
  void* p = a.data();
  DeviceBuffer b(std::move(a));
  EXPECT_EQ(b.data(), p);
  EXPECT_EQ(a.data(), nullptr);
  DeviceBuffer c(*be, 10);
  c = std::move(b);
  EXPECT_EQ(c.data(), p);
  EXPECT_EQ(static_cast<unsigned char*>(c.data())[999], 7);
  EXPECT_EQ(be->description(), "CPU (1 thread, " + cpu::simd::target_name() + ")");
}

}  // namespace
}  // namespace mambacpp
