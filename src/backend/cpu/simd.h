// The CPU backend's vector kernels, compiled once per instruction set by Google Highway (simd_kernels.cpp) and
// chosen at run time: the best target the CPU supports (AVX-512 "AVX3", AVX2+FMA+F16C, SSE4, SSSE3, or the
// portable "EMU128"), or the one named by MAMBACPP_SIMD / force_target (tests run every target the machine has).
// Results are deterministic for a given target; they differ between targets in the last bits (lane counts change
// the order of additions), which every tolerance in the tests allows.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "mambacpp/dtype.h"

namespace mambacpp::cpu::simd {

// The target in use, e.g. "AVX2".
std::string target_name();
// Targets compiled in and supported by this CPU, best first.
std::vector<std::string> available_targets();
// Uses the named target from now on (one of available_targets()); "" returns to the best. Throws on an unknown or
// unsupported name. Not thread-safe: call it between kernels.
void force_target(const std::string& name);

// out[r] = sum_i x[i] * w[r * in + i] for r in [0, rows); w in f32, bf16 or f16. Each row is summed in a fixed
// order (lane-wise partial sums, then a fixed reduction), the same whatever `rows` and whatever the row's place.
void dot_rows(const float* x, const void* w, DType w_dtype, int64_t in, int64_t rows, float* out);

// dst[i] = src[i] as f32, src in f32, bf16 or f16 (exact), or f64 (rounded; scalar).
void to_f32(const void* src, DType from, float* dst, int64_t n);

// out[i] = silu(in[i]) = in[i] / (1 + exp(-in[i])); in and out may be the same.
void silu(const float* in, float* out, int64_t n);

// One decode token of one Mamba-2 head: for i < P, with H the head's [P, N] state (f32 or bf16, updated in place),
//   H[i, :] = dA * H[i, :] + (dt * x[i]) * B;  y[i] = H[i, :] . C + D * x[i]
void ssd_step_head(void* H, DType state_dtype, const float* x, const float* B, const float* C, float dt, float dA,
                   float D, int64_t P, int64_t N, float* y);

// One decode token of Mamba-1 channels [0, n): with dt_c = softplus(dt_raw[c] + dt_bias[c]), A = -exp(A_log),
//   h[c, :] = exp(dt_c * A[c, :]) * h[c, :] + dt_c * x[c] * B;  y[c] = (h[c, :] . C + D[c] * x[c]) * silu(z[c])
// h: [n, N] state rows (f32 or bf16, in place); A_log: [n, N] f32; dt_bias, D: [n] f32.
void mamba1_step(void* h, DType state_dtype, const float* x, const float* dt_raw, const float* dt_bias,
                 const float* A_log, const float* B, const float* C, const float* D, const float* z, int64_t n,
                 int64_t N, float* y);

// mamba1_step with A = -exp(A_log) given ([n, N] f32, as neg_exp_rows makes it: the same bits as mamba1_step's own).
void mamba1_step_a(void* h, DType state_dtype, const float* x, const float* dt_raw, const float* dt_bias,
                   const float* A, const float* B, const float* C, const float* D, const float* z, int64_t n,
                   int64_t N, float* y);

// A[r, :] = -exp(A_log[r, :]) for `rows` rows of N, each row computed as mamba1_step computes it (vectors from the
// row's start, the tail in scalar), so that mamba1_step_a(A) = mamba1_step(A_log) bit for bit on this target.
void neg_exp_rows(const float* A_log, int64_t rows, int64_t N, float* A);

// mamba1_step on an f32 state with A = -exp(A_log) given ([n, N] f32): one token of a prefill scan's block of channels.
void mamba1_scan_token(float* h, const float* x, const float* dt_raw, const float* dt_bias, const float* A,
                       const float* B, const float* C, const float* D, const float* z, int64_t n, int64_t N, float* y);

// Over x[0, n): *bad = the first index holding NaN or +inf (then *best = -1), else -1 and *best = the lowest index of
// the largest value, -0 and +0 equal, or -1 when every value is -inf (or n == 0).
void argmax_first(const float* x, int64_t n, int64_t* bad, int64_t* best);

}  // namespace mambacpp::cpu::simd
