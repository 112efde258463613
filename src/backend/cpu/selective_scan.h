// Mamba-1 selective scan, sequential in time per channel, fused with the D skip and the silu(z) gate:
//   dt = softplus(dt_raw[t, c] + dt_bias[c]);  A[c, n] = -exp(A_log[c, n])
//   h[c, n] = exp(dt * A[c, n]) * h[c, n] + dt * B[t, n] * x[t, c]
//   y[t, c] = (sum_n C[t, n] * h[c, n] + D[c] * x[t, c]) * silu(z[t, c])
// The state h lives in the slot's state row and is updated in place. Parallel over (sequence, block of channels):
// a block walks time once and reads each row's B and C once; in f32 a token of a block is one vector kernel
// (simd::mamba1_scan_token: exp over d_state, softplus and the gate over vectors of channels).
#pragma once

#include <algorithm>
#include <span>
#include <vector>

#include "backend/backend.h"
#include "backend/cpu/kernel_common.h"
#include "backend/cpu/simd.h"
#include "backend/cpu/thread_pool.h"

namespace mambacpp::cpu {

template <class T>
struct Mamba1Params {
  Rows<const T> x;        // [T, d_inner]
  Rows<const T> dt;       // [T, d_inner] before the bias
  Rows<const T> B;        // [T, d_state]
  Rows<const T> C;        // [T, d_state]
  Rows<const T> z;        // [T, d_inner]
  WeightRef A_log;        // [d_inner, d_state]
  WeightRef D;            // [d_inner]
  WeightRef dt_bias;      // [d_inner]
  T* state = nullptr;     // [n_slots, d_inner, d_state]
  Rows<T> y;              // [T, d_inner]
  int64_t d_inner = 0, d_state = 0;
  int threads = 1;
};

namespace detail {

// One token of channels [0, nc) of a block: h [nc, N] and A [nc, N] (= -exp(A_log)) of the block, the other pointers
// at the block's first channel. Plain loops for any T (the fp64 tests run these); the vector kernel of simd.h in f32.
template <class T>
void mamba1_token(T* h0, const T* x, const T* dt_raw, const T* bias, const T* A, const T* Bt, const T* Ct, const T* D,
                  const T* z, int64_t nc, int64_t N, T* y) {
  for (int64_t c = 0; c < nc; ++c) {
    const T dtv = softplus(dt_raw[c] + bias[c]);
    const T dtx = dtv * x[c];
    const T* Ac = A + c * N;
    T* h = h0 + c * N;
    T acc = 0;
    for (int64_t n = 0; n < N; ++n) {
      h[n] = std::exp(dtv * Ac[n]) * h[n] + dtx * Bt[n];
      acc += Ct[n] * h[n];
    }
    y[c] = (acc + D[c] * x[c]) * silu(z[c]);
  }
}
inline void mamba1_token(float* h0, const float* x, const float* dt_raw, const float* bias, const float* A,
                         const float* Bt, const float* Ct, const float* D, const float* z, int64_t nc, int64_t N,
                         float* y) {
  simd::mamba1_scan_token(h0, x, dt_raw, bias, A, Bt, Ct, D, z, nc, N, y);
}

}  // namespace detail

template <class T>
void mamba1_scan(const Mamba1Params<T>& p, std::span<const SeqSpan> seqs) {
  constexpr int64_t kBlock = 64;  // channels per task: vectors of channels for softplus and the gate
  const int64_t DI = p.d_inner, N = p.d_state;
  const int64_t n_blocks = (DI + kBlock - 1) / kBlock;
  const int64_t n_seqs = static_cast<int64_t>(seqs.size());

  parallel_tasks(p.threads, n_seqs * n_blocks, [&](int64_t task) {
    const SeqSpan seq = seqs[static_cast<size_t>(task / n_blocks)];
    if (seq.len <= 0) return;
    const int64_t c0 = (task % n_blocks) * kBlock, nc = std::min(kBlock, DI - c0);
    std::vector<T> A(static_cast<size_t>(nc * N));  // this task's -exp(A_log) rows
    for (int64_t i = 0; i < nc * N; ++i) A[static_cast<size_t>(i)] = -std::exp(weight_at<T>(p.A_log, c0 * N + i));
    T D[kBlock], bias[kBlock];
    for (int64_t c = 0; c < nc; ++c) {
      D[c] = weight_at<T>(p.D, c0 + c);
      bias[c] = weight_at<T>(p.dt_bias, c0 + c);
    }
    T* h0 = p.state + (seq.slot * DI + c0) * N;  // [nc, N]
    for (int64_t t = seq.start; t < seq.start + seq.len; ++t)
      detail::mamba1_token(h0, p.x[t] + c0, p.dt[t] + c0, bias, A.data(), p.B[t], p.C[t], D, p.z[t] + c0, nc, N,
                           p.y[t] + c0);
  });
}

}  // namespace mambacpp::cpu
