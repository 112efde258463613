// Plain fp64 references for the CPU kernels, written straight from the definitions (MAMBA_NOTES.md, backend.h)
// and independently of src/backend/cpu: dense row-major arrays, one token at a time, no chunking, no blocking.
// Test-only. Sequences are given as SeqSpan (rows [start, start + len), state slot `slot`).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "backend/backend.h"

namespace mambacpp::ref {

using Vec = std::vector<double>;

inline double softplus(double v) { return v > 20.0 ? v : std::log1p(std::exp(v)); }
inline double silu(double v) { return v / (1.0 + std::exp(-v)); }

// Causal depthwise conv1d + SiLU. x, out: [T, C]; w: [C, K]; bias: [C] or empty; state: [n_slots, C, K-1].
// Each channel's input stream is (state ++ sequence); output t is the window ending at input t; the new state is the
// stream's last K-1 values.
inline void conv1d_silu(const Vec& x, int64_t C, int64_t K, const Vec& w, const Vec& bias, Vec& state,
                        const std::vector<SeqSpan>& seqs, Vec& out) {
  const int64_t S = K - 1;
  for (const SeqSpan& s : seqs) {
    for (int64_t c = 0; c < C; ++c) {
      Vec stream;
      for (int64_t j = 0; j < S; ++j) stream.push_back(state[(s.slot * C + c) * S + j]);
      for (int64_t t = 0; t < s.len; ++t) stream.push_back(x[(s.start + t) * C + c]);
      for (int64_t t = 0; t < s.len; ++t) {
        double v = bias.empty() ? 0.0 : bias[c];
        for (int64_t k = 0; k < K; ++k) v += w[c * K + k] * stream[t + k];
        out[(s.start + t) * C + c] = silu(v);
      }
      for (int64_t j = 0; j < S; ++j) state[(s.slot * C + c) * S + j] = stream[stream.size() - S + j];
    }
  }
}

// Mamba-1 selective scan. x, dt, z, y: [T, DI]; B, C: [T, N]; A_log: [DI, N]; D, dt_bias: [DI];
// state: [n_slots, DI, N].
inline void mamba1_scan(const Vec& x, const Vec& dt, const Vec& B, const Vec& C, const Vec& z, const Vec& A_log,
                        const Vec& D, const Vec& dt_bias, Vec& state, int64_t DI, int64_t N,
                        const std::vector<SeqSpan>& seqs, Vec& y) {
  for (const SeqSpan& s : seqs) {
    for (int64_t t = s.start; t < s.start + s.len; ++t) {
      for (int64_t c = 0; c < DI; ++c) {
        const double d = softplus(dt[t * DI + c] + dt_bias[c]);
        double out = 0.0;
        for (int64_t n = 0; n < N; ++n) {
          double& h = state[(s.slot * DI + c) * N + n];
          h = std::exp(d * -std::exp(A_log[c * N + n])) * h + d * B[t * N + n] * x[t * DI + c];
          out += C[t * N + n] * h;
        }
        y[t * DI + c] = (out + D[c] * x[t * DI + c]) * silu(z[t * DI + c]);
      }
    }
  }
}

// Mamba-2 recurrence, one token at a time. x, y: [T, NH * P]; dt: [T, NH]; B, C: [T, G * N]; A_log, D, dt_bias:
// [NH]; state: [n_slots, NH, P, N].
inline void mamba2_scan(const Vec& x, const Vec& dt, const Vec& B, const Vec& C, const Vec& A_log, const Vec& D,
                        const Vec& dt_bias, double dt_min, double dt_max, int64_t NH, int64_t P, int64_t G,
                        int64_t N, Vec& state, const std::vector<SeqSpan>& seqs, Vec& y) {
  const int64_t heads_per_group = NH / G;
  for (const SeqSpan& s : seqs) {
    for (int64_t t = s.start; t < s.start + s.len; ++t) {
      for (int64_t h = 0; h < NH; ++h) {
        const int64_t g = h / heads_per_group;
        double d = softplus(dt[t * NH + h] + dt_bias[h]);
        d = std::min(std::max(d, dt_min), dt_max);
        const double decay = std::exp(d * -std::exp(A_log[h]));
        for (int64_t e = 0; e < P; ++e) {
          const double xv = x[t * NH * P + h * P + e];
          double out = 0.0;
          for (int64_t n = 0; n < N; ++n) {
            double& H = state[((s.slot * NH + h) * P + e) * N + n];
            H = decay * H + d * xv * B[t * G * N + g * N + n];
            out += H * C[t * G * N + g * N + n];
          }
          y[t * NH * P + h * P + e] = out + D[h] * xv;
        }
      }
    }
  }
}

// y = x W^T (+ b). x: [T, in]; w: [out, in]; bias: [out] or empty.
inline Vec linear(const Vec& x, const Vec& w, const Vec& bias, int64_t T, int64_t in, int64_t out) {
  Vec y(static_cast<size_t>(T * out));
  for (int64_t t = 0; t < T; ++t)
    for (int64_t o = 0; o < out; ++o) {
      double v = bias.empty() ? 0.0 : bias[o];
      for (int64_t i = 0; i < in; ++i) v += x[t * in + i] * w[o * in + i];
      y[t * out + o] = v;
    }
  return y;
}

// RMSNorm over groups of `group` channels of g = y * silu(z) (gated) or of y itself (z empty). y: [T, D].
inline Vec rmsnorm(const Vec& y, const Vec& z, const Vec& w, int64_t T, int64_t D, int64_t group, double eps) {
  Vec out(static_cast<size_t>(T * D));
  for (int64_t t = 0; t < T; ++t)
    for (int64_t c0 = 0; c0 < D; c0 += group) {
      double ss = 0.0;
      for (int64_t c = c0; c < c0 + group; ++c) {
        const double g = z.empty() ? y[t * D + c] : y[t * D + c] * silu(z[t * D + c]);
        ss += g * g;
      }
      const double r = 1.0 / std::sqrt(ss / static_cast<double>(group) + eps);
      for (int64_t c = c0; c < c0 + group; ++c) {
        const double g = z.empty() ? y[t * D + c] : y[t * D + c] * silu(z[t * D + c]);
        out[t * D + c] = g * r * w[c];
      }
    }
  return out;
}

}  // namespace mambacpp::ref
