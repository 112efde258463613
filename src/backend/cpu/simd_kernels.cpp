// The vector kernels of simd.h, written once against Highway and compiled for every x86 target it knows
// (foreach_target re-includes this file per target); HWY_DYNAMIC_DISPATCH picks the target at run time.
// Tails shorter than a vector go through the same vector code on zero-padded copies, so a dot product's order of
// operations depends only on its length.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "backend/cpu/simd_kernels.cpp"
#include "hwy/foreach_target.h"  // IWYU pragma: keep

#include "hwy/highway.h"
#include "hwy/contrib/math/math-inl.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>

#include "backend/cpu/simd.h"
#include "backend/cpu/simd_load-inl.h"
#include "mambacpp/error.h"

HWY_BEFORE_NAMESPACE();
namespace mambacpp::cpu::simd {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

constexpr int64_t kWideRowXBytes = 16 * 1024;  // rows at least this wide (x in f32) prefetch their weights
constexpr int64_t kPrefetchAhead = 6 * 1024;   // how far ahead (4-8 KiB measured alike; 2 KiB too close)

// x . w over one row with four independent accumulators (four FMA chains in flight), the row read front to back:
// a single linear stream per thread is what the hardware prefetcher follows best (4 rows interleaved ran at half the
// bandwidth on Zen 3 without software prefetch). The order is the contract shared with the prefill GEMM
// (gemm_kernels.cpp), which reproduces it bit for bit: vector block b of the row (the last one zero-padded) goes into
// accumulator b % 4, each accumulator a plain chain of MulAdds in block order, then (a0 + a1) + (a2 + a3) and
// SumOfLanes.
//
// kPrefetch: each pass also asks for the weight bytes kPrefetchAhead past it into L2. Rows of 4,096 inputs and more
// (x alone takes half of a 32 KiB L1) streamed at 71-78% of a plain read on Zen 4 with the hardware prefetchers
// alone, at 92-99% with this; shorter rows were at 95-99% already and lose a few percent to it (dot_rows_t picks).
template <class W, bool kPrefetch>
HWY_INLINE float dot_row(const float* HWY_RESTRICT x, const W* HWY_RESTRICT w, int64_t in) {
  const DF df;
  const int64_t L = static_cast<int64_t>(hn::Lanes(df));
  const int64_t pass_bytes = 4 * L * static_cast<int64_t>(sizeof(W));
  VF a0 = hn::Zero(df), a1 = hn::Zero(df), a2 = hn::Zero(df), a3 = hn::Zero(df);
  int64_t i = 0;
  for (; i + 4 * L <= in; i += 4 * L) {
    if constexpr (kPrefetch) {
      const char* ahead = reinterpret_cast<const char*>(w + i) + kPrefetchAhead;
      for (int64_t b = 0; b < pass_bytes; b += 64) __builtin_prefetch(ahead + b, 0, 2);  // 2: into L2 (prefetcht1)
    }
    a0 = hn::MulAdd(hn::LoadU(df, x + i), load_w(df, w + i), a0);
    a1 = hn::MulAdd(hn::LoadU(df, x + i + L), load_w(df, w + i + L), a1);
    a2 = hn::MulAdd(hn::LoadU(df, x + i + 2 * L), load_w(df, w + i + 2 * L), a2);
    a3 = hn::MulAdd(hn::LoadU(df, x + i + 3 * L), load_w(df, w + i + 3 * L), a3);
  }
  // Up to three full vectors and a partial one are left: blocks 4m, 4m+1, 4m+2, 4m+3 in turn.
  const int64_t rest = in - i, full = rest / L;
  if (full > 0) a0 = hn::MulAdd(hn::LoadU(df, x + i), load_w(df, w + i), a0);
  if (full > 1) a1 = hn::MulAdd(hn::LoadU(df, x + i + L), load_w(df, w + i + L), a1);
  if (full > 2) a2 = hn::MulAdd(hn::LoadU(df, x + i + 2 * L), load_w(df, w + i + 2 * L), a2);
  i += full * L;
  if (i < in) {
    HWY_ALIGN float xt[kMaxLanes] = {}, wt[kMaxLanes] = {};
    for (int64_t k = 0; k < in - i; ++k) xt[k] = x[i + k], wt[k] = weight_scalar(w, i + k);
    const VF xv = hn::Load(df, xt), wv = hn::Load(df, wt);
    if (full == 0) a0 = hn::MulAdd(xv, wv, a0);
    else if (full == 1) a1 = hn::MulAdd(xv, wv, a1);
    else if (full == 2) a2 = hn::MulAdd(xv, wv, a2);
    else a3 = hn::MulAdd(xv, wv, a3);
  }
  return hn::GetLane(hn::SumOfLanes(df, hn::Add(hn::Add(a0, a1), hn::Add(a2, a3))));
}

template <class W>
void dot_rows_t(const float* x, const W* w, int64_t in, int64_t rows, float* out) {
  if (in * static_cast<int64_t>(sizeof(float)) >= kWideRowXBytes) {
    for (int64_t r = 0; r < rows; ++r) out[r] = dot_row<W, true>(x, w + r * in, in);
  } else {
    for (int64_t r = 0; r < rows; ++r) out[r] = dot_row<W, false>(x, w + r * in, in);
  }
}

void DotRows(const float* x, const void* w, DType w_dtype, int64_t in, int64_t rows, float* out) {
  switch (w_dtype) {
    case DType::F32: return dot_rows_t(x, static_cast<const float*>(w), in, rows, out);
    case DType::BF16: return dot_rows_t(x, static_cast<const hwy::bfloat16_t*>(w), in, rows, out);
    case DType::F16: return dot_rows_t(x, static_cast<const hwy::float16_t*>(w), in, rows, out);
    default: fail("dot_rows: weights must be f32, bf16 or f16, found ", dtype_name(w_dtype));
  }
}

template <class W>
void to_f32_t(const W* src, float* dst, int64_t n) {
  const DF df;
  const int64_t L = static_cast<int64_t>(hn::Lanes(df));
  int64_t i = 0;
  for (; i + L <= n; i += L) hn::StoreU(load_w(df, src + i), df, dst + i);
  for (; i < n; ++i) dst[i] = weight_scalar(src, i);
}

void ToF32(const void* src, DType from, float* dst, int64_t n) {
  switch (from) {
    case DType::F32: std::memcpy(dst, src, static_cast<size_t>(n) * sizeof(float)); return;
    case DType::BF16: return to_f32_t(static_cast<const hwy::bfloat16_t*>(src), dst, n);
    case DType::F16: return to_f32_t(static_cast<const hwy::float16_t*>(src), dst, n);
    case DType::F64: return convert_to_f32(src, from, dst, n);  // test weights
    default: fail("to_f32: source must be f32, bf16, f16 or f64, found ", dtype_name(from));
  }
}

// silu(v) = v / (1 + exp(-v)); below -88 (Highway's Exp is valid up to +104) it is -0, within 5e-37 of the truth.
HWY_INLINE VF silu_v(DF df, VF v) {
  const VF lo = hn::Set(df, -88.0f);
  const VF e = hn::Exp(df, hn::Neg(hn::Max(v, lo)));
  const VF r = hn::Div(v, hn::Add(hn::Set(df, 1.0f), e));
  return hn::IfThenElse(hn::Lt(v, lo), hn::Mul(v, hn::Zero(df)), r);
}
// softplus(v) = log(1 + exp(v)), v itself above 20 (torch's threshold).
HWY_INLINE VF softplus_v(DF df, VF v) {
  const VF t = hn::Set(df, 20.0f);
  return hn::IfThenElse(hn::Gt(v, t), v, hn::Log1p(df, hn::Exp(df, hn::Min(v, t))));
}

void Silu(const float* in, float* out, int64_t n) {
  const DF df;
  const int64_t L = static_cast<int64_t>(hn::Lanes(df));
  int64_t i = 0;
  for (; i + L <= n; i += L) hn::StoreU(silu_v(df, hn::LoadU(df, in + i)), df, out + i);
  if (i < n) {
    HWY_ALIGN float t[kMaxLanes] = {};
    std::memcpy(t, in + i, static_cast<size_t>(n - i) * sizeof(float));
    hn::Store(silu_v(df, hn::Load(df, t)), df, t);
    std::memcpy(out + i, t, static_cast<size_t>(n - i) * sizeof(float));
  }
}

// H[i, n] = dA * H[i, n] + dtx * B[n] and acc += H[i, n] * C[n] over one state row; returns the dot product.
template <class S>
HWY_INLINE float ssd_row(S* HWY_RESTRICT h, const float* HWY_RESTRICT B, const float* HWY_RESTRICT C, float dA,
                         float dtx, int64_t N) {
  const DF df;
  const int64_t L = static_cast<int64_t>(hn::Lanes(df));
  const VF vdA = hn::Set(df, dA), vdtx = hn::Set(df, dtx);
  VF acc = hn::Zero(df);
  int64_t n = 0;
  for (; n + L <= N; n += L) {
    const VF hv = hn::MulAdd(vdA, load_state(df, h + n), hn::Mul(vdtx, hn::LoadU(df, B + n)));
    store_state(df, hv, h + n);
    acc = hn::MulAdd(hv, hn::LoadU(df, C + n), acc);
  }
  float sum = hn::GetLane(hn::SumOfLanes(df, acc));
  for (; n < N; ++n) {
    const float hv = dA * state_at(h, n) + dtx * B[n];
    if constexpr (std::is_same_v<S, float>) h[n] = hv;
    else reinterpret_cast<uint16_t*>(h)[n] = f32_to_bf16(hv);
    sum += hv * C[n];
  }
  return sum;
}

template <class S>
void ssd_step_head_t(S* H, const float* x, const float* B, const float* C, float dt, float dA, float D, int64_t P,
                     int64_t N, float* y) {
  for (int64_t i = 0; i < P; ++i) y[i] = ssd_row(H + i * N, B, C, dA, dt * x[i], N) + D * x[i];
}

void SsdStepHead(void* H, DType sdt, const float* x, const float* B, const float* C, float dt, float dA, float D,
                 int64_t P, int64_t N, float* y) {
  if (sdt == DType::BF16) return ssd_step_head_t(static_cast<hwy::bfloat16_t*>(H), x, B, C, dt, dA, D, P, N, y);
  ssd_step_head_t(static_cast<float*>(H), x, B, C, dt, dA, D, P, N, y);
}

// kNegA: the caller passes A = -exp(A_log) itself (prefill computes it once per block of channels, not per token).
template <class S, bool kNegA = false>
void mamba1_step_t(S* h, const float* x, const float* dt_raw, const float* dt_bias, const float* A_log,
                   const float* B, const float* C, const float* D, const float* z, int64_t n, int64_t N, float* y) {
  const DF df;
  const int64_t L = static_cast<int64_t>(hn::Lanes(df));
  HWY_ALIGN float dts[kMaxLanes], gates[kMaxLanes];
  for (int64_t c0 = 0; c0 < n; c0 += L) {  // dt and the gate, a vector of channels at a time
    const int64_t m = std::min(L, n - c0);
    HWY_ALIGN float a[kMaxLanes] = {}, zz[kMaxLanes] = {};
    for (int64_t k = 0; k < m; ++k) a[k] = dt_raw[c0 + k] + dt_bias[c0 + k], zz[k] = z[c0 + k];
    hn::Store(softplus_v(df, hn::Load(df, a)), df, dts);
    hn::Store(silu_v(df, hn::Load(df, zz)), df, gates);
    for (int64_t k = 0; k < m; ++k) {
      const int64_t c = c0 + k;
      const float dtv = dts[k], dtx = dtv * x[c];
      S* hc = h + c * N;
      const float* Al = A_log + c * N;
      const VF vdt = hn::Set(df, dtv), vdtx = hn::Set(df, dtx);
      VF acc = hn::Zero(df);
      int64_t j = 0;
      for (; j + L <= N; j += L) {
        const VF A = kNegA ? hn::LoadU(df, Al + j) : hn::Neg(hn::Exp(df, hn::LoadU(df, Al + j)));
        const VF dA = hn::Exp(df, hn::Mul(vdt, A));
        const VF hv = hn::MulAdd(dA, load_state(df, hc + j), hn::Mul(vdtx, hn::LoadU(df, B + j)));
        store_state(df, hv, hc + j);
        acc = hn::MulAdd(hv, hn::LoadU(df, C + j), acc);
      }
      float sum = hn::GetLane(hn::SumOfLanes(df, acc));
      for (; j < N; ++j) {
        const float hv = std::exp(dtv * (kNegA ? Al[j] : -std::exp(Al[j]))) * state_at(hc, j) + dtx * B[j];
        if constexpr (std::is_same_v<S, float>) hc[j] = hv;
        else reinterpret_cast<uint16_t*>(hc)[j] = f32_to_bf16(hv);
        sum += hv * C[j];
      }
      y[c] = (sum + D[c] * x[c]) * gates[k];
    }
  }
}

void Mamba1Step(void* h, DType sdt, const float* x, const float* dt_raw, const float* dt_bias, const float* A_log,
                const float* B, const float* C, const float* D, const float* z, int64_t n, int64_t N, float* y) {
  if (sdt == DType::BF16)
    return mamba1_step_t(static_cast<hwy::bfloat16_t*>(h), x, dt_raw, dt_bias, A_log, B, C, D, z, n, N, y);
  mamba1_step_t(static_cast<float*>(h), x, dt_raw, dt_bias, A_log, B, C, D, z, n, N, y);
}

void Mamba1StepA(void* h, DType sdt, const float* x, const float* dt_raw, const float* dt_bias, const float* A,
                 const float* B, const float* C, const float* D, const float* z, int64_t n, int64_t N, float* y) {
  if (sdt == DType::BF16)
    return mamba1_step_t<hwy::bfloat16_t, true>(static_cast<hwy::bfloat16_t*>(h), x, dt_raw, dt_bias, A, B, C, D, z,
                                                n, N, y);
  mamba1_step_t<float, true>(static_cast<float*>(h), x, dt_raw, dt_bias, A, B, C, D, z, n, N, y);
}

// The A of mamba1_step_t<S, false>, row by row: Neg(Exp) over whole vectors from the row's start, -std::exp on the
// tail (mamba1_step_t<S, true> multiplies the tail's A by dt inside std::exp, as the false variant does).
void NegExpRows(const float* A_log, int64_t rows, int64_t N, float* A) {
  const DF df;
  const int64_t L = static_cast<int64_t>(hn::Lanes(df));
  for (int64_t r = 0; r < rows; ++r) {
    const float* in = A_log + r * N;
    float* out = A + r * N;
    int64_t j = 0;
    for (; j + L <= N; j += L) hn::StoreU(hn::Neg(hn::Exp(df, hn::LoadU(df, in + j))), df, out + j);
    for (; j < N; ++j) out[j] = -std::exp(in[j]);
  }
}

void Mamba1ScanToken(float* h, const float* x, const float* dt_raw, const float* dt_bias, const float* A,
                     const float* B, const float* C, const float* D, const float* z, int64_t n, int64_t N, float* y) {
  mamba1_step_t<float, true>(h, x, dt_raw, dt_bias, A, B, C, D, z, n, N, y);
}

// The greedy pick over a row of logits in one vector pass (the scalar scan, serial on the calling thread, was 0.5% of
// a mamba-130m bf16 decode step in perf on Zen 4): the first NaN or +inf, else the largest value, then its first index.
void ArgmaxFirst(const float* x, int64_t n, int64_t* bad, int64_t* best) {
  const DF df;
  const int64_t L = static_cast<int64_t>(hn::Lanes(df));
  constexpr float kInf = std::numeric_limits<float>::infinity();
  const VF pos_inf = hn::Set(df, kInf);
  *bad = *best = -1;
  VF mx = hn::Set(df, -kInf);
  int64_t i = 0;
  for (; i + L <= n; i += L) {
    const VF v = hn::LoadU(df, x + i);
    if (!hn::AllFalse(df, hn::Or(hn::IsNaN(v), hn::Eq(v, pos_inf)))) break;  // the scalar tail finds which
    mx = hn::Max(mx, v);
  }
  float m = hn::GetLane(hn::MaxOfLanes(df, mx));
  for (int64_t j = i; j < n; ++j) {
    if (std::isnan(x[j]) || x[j] == kInf) {
      *bad = j;
      return;
    }
    m = std::max(m, x[j]);
  }
  if (m == -kInf) return;  // every value -inf (or none)
  const VF vm = hn::Set(df, m);
  for (i = 0; i + L <= n; i += L) {
    const intptr_t k = hn::FindFirstTrue(df, hn::Eq(hn::LoadU(df, x + i), vm));
    if (k >= 0) {
      *best = i + k;
      return;
    }
  }
  for (; x[i] != m; ++i) {}
  *best = i;
}

const char* TargetNameHere() { return hwy::TargetName(HWY_TARGET); }

}  // namespace HWY_NAMESPACE
}  // namespace mambacpp::cpu::simd
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace mambacpp::cpu::simd {

HWY_EXPORT(DotRows);
HWY_EXPORT(ToF32);
HWY_EXPORT(Silu);
HWY_EXPORT(SsdStepHead);
HWY_EXPORT(Mamba1Step);
HWY_EXPORT(Mamba1ScanToken);
HWY_EXPORT(Mamba1StepA);
HWY_EXPORT(NegExpRows);
HWY_EXPORT(TargetNameHere);
HWY_EXPORT(ArgmaxFirst);

namespace {

// Compiled targets supported by this CPU, best (lowest bit) first.
std::vector<int64_t> usable_targets() {
  hwy::SetSupportedTargetsForTest(0);
  std::vector<int64_t> out;
  for (int64_t t = hwy::SupportedTargets() & HWY_TARGETS; t != 0; t &= t - 1) out.push_back(t & ~(t - 1));
  return out;
}

std::string forced_name;

}  // namespace

std::vector<std::string> available_targets() {
  std::vector<std::string> names;
  for (int64_t t : usable_targets()) names.emplace_back(hwy::TargetName(t));
  if (!forced_name.empty()) force_target(forced_name);  // usable_targets() lifted the mock
  return names;
}

void force_target(const std::string& name) {
  if (name.empty()) {
    forced_name.clear();
    hwy::SetSupportedTargetsForTest(0);
    return;
  }
  std::string known;
  for (int64_t t : usable_targets()) {
    if (name == hwy::TargetName(t)) {
      hwy::SetSupportedTargetsForTest(t);
      forced_name = name;
      return;
    }
    known += std::string(known.empty() ? "" : ", ") + hwy::TargetName(t);
  }
  if (!forced_name.empty()) force_target(forced_name);
  fail("SIMD target '", name, "' is not available on this CPU and build; available: ", known);
}

// MAMBACPP_SIMD=<target> at start-up, as force_target; a name this CPU cannot run is reported and the best target
// used instead (a static initializer must not throw).
[[maybe_unused]] const bool env_target_applied = [] {
  if (const char* e = std::getenv("MAMBACPP_SIMD"); e && *e) try {
      force_target(e);
    } catch (const Error& err) {
      std::fprintf(stderr, "mambacpp: ignoring MAMBACPP_SIMD: %s\n", err.what());
    }
  return true;
}();

std::string target_name() {
  return HWY_DYNAMIC_DISPATCH(TargetNameHere)();
}

void dot_rows(const float* x, const void* w, DType w_dtype, int64_t in, int64_t rows, float* out) {
  HWY_DYNAMIC_DISPATCH(DotRows)(x, w, w_dtype, in, rows, out);
}
void to_f32(const void* src, DType from, float* dst, int64_t n) { HWY_DYNAMIC_DISPATCH(ToF32)(src, from, dst, n); }
void silu(const float* in, float* out, int64_t n) { HWY_DYNAMIC_DISPATCH(Silu)(in, out, n); }
void ssd_step_head(void* H, DType state_dtype, const float* x, const float* B, const float* C, float dt, float dA,
                   float D, int64_t P, int64_t N, float* y) {
  HWY_DYNAMIC_DISPATCH(SsdStepHead)(H, state_dtype, x, B, C, dt, dA, D, P, N, y);
}
void mamba1_step(void* h, DType state_dtype, const float* x, const float* dt_raw, const float* dt_bias,
                 const float* A_log, const float* B, const float* C, const float* D, const float* z, int64_t n,
                 int64_t N, float* y) {
  HWY_DYNAMIC_DISPATCH(Mamba1Step)(h, state_dtype, x, dt_raw, dt_bias, A_log, B, C, D, z, n, N, y);
}

void mamba1_step_a(void* h, DType state_dtype, const float* x, const float* dt_raw, const float* dt_bias,
                   const float* A, const float* B, const float* C, const float* D, const float* z, int64_t n,
                   int64_t N, float* y) {
  HWY_DYNAMIC_DISPATCH(Mamba1StepA)(h, state_dtype, x, dt_raw, dt_bias, A, B, C, D, z, n, N, y);
}
void argmax_first(const float* x, int64_t n, int64_t* bad, int64_t* best) {
  HWY_DYNAMIC_DISPATCH(ArgmaxFirst)(x, n, bad, best);
}
void neg_exp_rows(const float* A_log, int64_t rows, int64_t N, float* A) {
  HWY_DYNAMIC_DISPATCH(NegExpRows)(A_log, rows, N, A);
}

void mamba1_scan_token(float* h, const float* x, const float* dt_raw, const float* dt_bias, const float* A,
                       const float* B, const float* C, const float* D, const float* z, int64_t n, int64_t N, float* y) {
  HWY_DYNAMIC_DISPATCH(Mamba1ScanToken)(h, x, dt_raw, dt_bias, A, B, C, D, z, n, N, y);
}

}  // namespace mambacpp::cpu::simd
#endif  // HWY_ONCE
