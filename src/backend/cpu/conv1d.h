// Causal depthwise conv1d + SiLU over the sequences of a packed batch, continuing from each sequence's conv state.
//   out[t, c] = silu(bias[c] + sum_k w[c, k] * in[t - (K-1) + k, c])
// where in[p, c] for p < 0 comes from the slot's state (the last K-1 inputs before the sequence). Afterwards the
// state holds the last K-1 inputs of (old state ++ sequence): a sequence shorter than K-1 shifts the old state.
// Parallel over (sequence, block of channels); each task owns its channels' state, so tasks never share memory.
#pragma once

#include <algorithm>
#include <span>

#include "backend/backend.h"
#include "backend/cpu/kernel_common.h"
#include "backend/cpu/simd.h"
#include "backend/cpu/thread_pool.h"

namespace mambacpp::cpu {

inline constexpr int64_t kConvMaxKernel = 16;

template <class T>
struct Conv1dParams {
  Rows<const T> x;        // [T, C]
  WeightRef w;            // [C, 1, K] stored layout
  WeightRef bias;         // [C], or absent
  T* state = nullptr;     // [n_slots, C, K-1]
  Rows<T> out;            // [T, C]; must not overlap x
  int64_t channels = 0;   // C
  int64_t kernel = 0;     // K in [1, kConvMaxKernel]
  int threads = 1;
};

namespace detail {

// out[c] = silu(in[c]) for c < n: plain for any T (the fp64 tests), the vector kernel in f32.
template <class T>
void silu_row(const T* in, T* out, int64_t n) {
  for (int64_t c = 0; c < n; ++c) out[c] = silu(in[c]);
}
inline void silu_row(const float* in, float* out, int64_t n) { simd::silu(in, out, n); }

}  // namespace detail

template <class T>
void conv1d_silu(const Conv1dParams<T>& p, std::span<const SeqSpan> seqs) {
  constexpr int64_t kBlock = 64;  // channels per task: one pass over time touches a few cache lines per row
  const int64_t C = p.channels, K = p.kernel, S = K - 1;
  const int64_t n_blocks = (C + kBlock - 1) / kBlock;
  const int64_t n_seqs = static_cast<int64_t>(seqs.size());

  parallel_tasks(p.threads, n_seqs * n_blocks, [&](int64_t task) {
    const SeqSpan seq = seqs[static_cast<size_t>(task / n_blocks)];
    if (seq.len <= 0) return;
    const int64_t c0 = (task % n_blocks) * kBlock, nc = std::min(kBlock, C - c0);
    T w[kBlock * kConvMaxKernel];
    T wt[kConvMaxKernel * kBlock];  // tap-major: the loop over channels reads it contiguously
    T b[kBlock], acc[kBlock];
    weight_load(p.w, c0 * K, nc * K, w);
    for (int64_t c = 0; c < nc; ++c)
      for (int64_t k = 0; k < K; ++k) wt[k * kBlock + c] = w[c * K + k];
    for (int64_t c = 0; c < nc; ++c) b[c] = p.bias.present() ? weight_at<T>(p.bias, c0 + c) : T(0);
    T* st = p.state + seq.slot * C * S + c0 * S;  // [nc, S] of this slot

    for (int64_t t = 0; t < seq.len; ++t) {
      for (int64_t c = 0; c < nc; ++c) acc[c] = b[c];
      for (int64_t k = 0; k < K; ++k) {  // taps in order: each channel sums bias + w0 v0 + w1 v1 + ...
        const int64_t pos = t - S + k;     // input position relative to the sequence start
        const T* wk = wt + k * kBlock;
        if (pos >= 0) {
          const T* xr = p.x[seq.start + pos] + c0;
          for (int64_t c = 0; c < nc; ++c) acc[c] += wk[c] * xr[c];
        } else {
          for (int64_t c = 0; c < nc; ++c) acc[c] += wk[c] * st[c * S + S + pos];
        }
      }
      detail::silu_row(acc, p.out[seq.start + t] + c0, nc);
    }
    // New state: the last S inputs. Ascending j reads old entries (j + len > j) before they are overwritten.
    for (int64_t c = 0; c < nc; ++c) {
      for (int64_t j = 0; j < S; ++j) {
        const int64_t pos = seq.len - S + j;
        st[c * S + j] = pos >= 0 ? p.x[seq.start + pos][c0 + c] : st[c * S + j + seq.len];
      }
    }
  });
}

}  // namespace mambacpp::cpu
