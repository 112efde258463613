// Mamba-2 state-space dual (SSD) over the sequences of a packed batch.
//   dt_t = clamp(softplus(dt_raw[t, h] + dt_bias[h]), dt_min, dt_max);  a_t = dt_t * A[h],  A[h] = -exp(A_log[h])
//   H_t = exp(a_t) * H_{t-1} + dt_t * x_t (x) B_t      (H: [head_dim, d_state] per head)
//   y_t = H_t . C_t + D[h] * x_t
// Head h reads B and C of group h / (n_heads / n_groups).
//
// A sequence of length L > 1 runs in chunks of Q = chunk_size positions (the last one shorter), each starting from
// the running state H_in (kept in the slot's state and updated after each chunk). Within a chunk, with
// seg[i][j] = sum_{k=j+1..i} a_k (j <= i) and S_i = sum_{k=0..i} a_k:
//   y_i   = sum_{j<=i} exp(seg[i][j]) * (C_i . B_j) * dt_j * x_j  +  exp(S_i) * (H_in . C_i)  +  D * x_i
//   H_out = exp(S_{Q-1}) * H_in + sum_j exp(seg[Q-1][j]) * dt_j * x_j (x) B_j
// seg is accumulated term by term from j+1 to i, never as a difference of two running sums: |S| reaches hundreds
// in a 256-long chunk, where an fp32 difference S_i - S_j would lose ~1e-5 relative.
// Single-token sequences (decode) take the recurrent step directly.
//
// Parallelism: multi-token sequences go one at a time; per chunk, C.B^T is formed once per group (parallel over
// rows), then heads run in parallel. Single-token sequences run in parallel over (sequence, head).
// Workspace is O(n_groups * Q^2 + threads * Q^2), independent of L.
#pragma once

#include <algorithm>
#include <span>
#include <vector>

#include "backend/backend.h"
#include "backend/cpu/kernel_common.h"
#include "backend/cpu/thread_pool.h"

namespace mambacpp::cpu {

template <class T>
struct Mamba2Params {
  Rows<const T> x;        // [T, n_heads * head_dim]
  Rows<const T> dt;       // [T, n_heads] raw
  Rows<const T> B;        // [T, n_groups * d_state]
  Rows<const T> C;        // [T, n_groups * d_state]
  WeightRef A_log;        // [n_heads]
  WeightRef D;            // [n_heads]
  WeightRef dt_bias;      // [n_heads]
  T dt_min = 0, dt_max = 0;  // dt_max may be +inf
  int64_t n_heads = 0, head_dim = 0, n_groups = 0, d_state = 0, chunk_size = 256;
  T* state = nullptr;     // [n_slots, n_heads, head_dim, d_state]
  Rows<T> y;              // [T, n_heads * head_dim]
  int threads = 1;
};

namespace detail {

template <class T>
T ssd_dt(const Mamba2Params<T>& p, int64_t t, int64_t h, T bias) {
  return std::clamp(softplus(p.dt[t][h] + bias), p.dt_min, p.dt_max);
}

// One token of one head: the plain recurrence.
template <class T>
void ssd_step(const Mamba2Params<T>& p, const SeqSpan& seq, int64_t h) {
  const int64_t P = p.head_dim, N = p.d_state, g = h / (p.n_heads / p.n_groups), t = seq.start;
  const T A = -std::exp(weight_at<T>(p.A_log, h)), D = weight_at<T>(p.D, h);
  const T dt = ssd_dt(p, t, h, weight_at<T>(p.dt_bias, h));
  const T dA = std::exp(dt * A);
  const T* x = p.x[t] + h * P;
  const T* B = p.B[t] + g * N;
  const T* C = p.C[t] + g * N;
  T* H = p.state + (seq.slot * p.n_heads + h) * P * N;
  T* y = p.y[t] + h * P;
  for (int64_t i = 0; i < P; ++i) {
    const T dtx = dt * x[i];
    T* Hi = H + i * N;
    T acc = 0;
    for (int64_t n = 0; n < N; ++n) {
      Hi[n] = dA * Hi[n] + dtx * B[n];
      acc += Hi[n] * C[n];
    }
    y[i] = acc + D * x[i];
  }
}

// Per-thread scratch for one (chunk, head): all O(Q^2) or O(Q * head_dim).
template <class T>
struct SsdScratch {
  std::vector<T> dt, expS, W, acc;  // [Q], [Q], [Q, Q], [head_dim]
  void resize(int64_t Q, int64_t P) {
    dt.resize(static_cast<size_t>(Q));
    expS.resize(static_cast<size_t>(Q));
    W.resize(static_cast<size_t>(Q * Q));
    acc.resize(static_cast<size_t>(P));
  }
};

// One chunk [t0, t0 + q) of one head, given the group's CB[i][j] = C_i . B_j (row stride Q).
template <class T>
void ssd_chunk_head(const Mamba2Params<T>& p, int64_t slot, int64_t t0, int64_t q, int64_t h, const T* CB,
                    int64_t Q, SsdScratch<T>& ws) {
  const int64_t P = p.head_dim, N = p.d_state, g = h / (p.n_heads / p.n_groups);
  const T A = -std::exp(weight_at<T>(p.A_log, h)), D = weight_at<T>(p.D, h), bias = weight_at<T>(p.dt_bias, h);
  T* dt = ws.dt.data();
  T* expS = ws.expS.data();
  T* W = ws.W.data();
  T* acc = ws.acc.data();
  T* H = p.state + (slot * p.n_heads + h) * P * N;  // [P, N], H_in on entry, H_out on exit

  T S = 0;
  for (int64_t i = 0; i < q; ++i) {
    dt[i] = ssd_dt(p, t0 + i, h, bias);
    S += dt[i] * A;
    expS[i] = std::exp(S);
  }
  // W[i][j] = exp(seg[i][j]) * CB[i][j] * dt_j for j <= i, with seg summed from the diagonal outwards.
  for (int64_t i = 0; i < q; ++i) {
    T* Wi = W + i * Q;
    const T* CBi = CB + i * Q;
    Wi[i] = CBi[i] * dt[i];
    T seg = 0;
    for (int64_t j = i - 1; j >= 0; --j) {
      seg += dt[j + 1] * A;
      Wi[j] = std::exp(seg) * CBi[j] * dt[j];
    }
  }
  // Outputs: intra-chunk part, carried-in state part, D skip. H still holds H_in here.
  for (int64_t i = 0; i < q; ++i) {
    const T* Wi = W + i * Q;
    std::fill(acc, acc + P, T(0));
    for (int64_t j = 0; j <= i; ++j) {
      const T w = Wi[j];
      const T* xj = p.x[t0 + j] + h * P;
#pragma omp simd
      for (int64_t e = 0; e < P; ++e) acc[e] += w * xj[e];
    }
    const T* Ci = p.C[t0 + i] + g * N;
    const T* xi = p.x[t0 + i] + h * P;
    T* yi = p.y[t0 + i] + h * P;
    for (int64_t e = 0; e < P; ++e) {
      const T* He = H + e * N;
      T dot = 0;
#pragma omp simd reduction(+ : dot)
      for (int64_t n = 0; n < N; ++n) dot += He[n] * Ci[n];
      yi[e] = acc[e] + expS[i] * dot + D * xi[e];
    }
  }
  // Outgoing state. The decay from position j to the chunk end is exp(seg[q-1][j]) = W[q-1][j] / (CB * dt): recompute
  // it the same stable way instead of dividing.
  T* decay = W;  // row 0 of W is no longer needed; reuse it for the q decays (scaled by dt_j)
  {
    T seg = 0;
    decay[q - 1] = dt[q - 1];
    for (int64_t j = q - 2; j >= 0; --j) {
      seg += dt[j + 1] * A;
      decay[j] = std::exp(seg) * dt[j];
    }
  }
  const T eS = expS[q - 1];
  for (int64_t e = 0; e < P; ++e) {
    T* He = H + e * N;
#pragma omp simd
    for (int64_t n = 0; n < N; ++n) He[n] *= eS;
    for (int64_t j = 0; j < q; ++j) {
      const T coef = decay[j] * p.x[t0 + j][h * P + e];
      const T* Bj = p.B[t0 + j] + g * N;
#pragma omp simd
      for (int64_t n = 0; n < N; ++n) He[n] += coef * Bj[n];
    }
  }
}

}  // namespace detail

template <class T>
void mamba2_ssd(const Mamba2Params<T>& p, std::span<const SeqSpan> seqs) {
  const int64_t G = p.n_groups, N = p.d_state, NH = p.n_heads;
  int64_t max_len = 1;
  for (const SeqSpan& s : seqs) max_len = std::max(max_len, s.len);
  // Chunks never exceed the longest sequence, so the O(Q^2) workspace stays small for short prompts (same chunking).
  const int64_t Q = std::min(std::max<int64_t>(1, p.chunk_size), max_len);

  // Single-token sequences: one recurrent step each, all in one parallel loop.
  std::vector<SeqSpan> steps;
  for (const SeqSpan& s : seqs)
    if (s.len == 1) steps.push_back(s);
  const int64_t n_steps = static_cast<int64_t>(steps.size());
  if (n_steps > 0) {
    parallel_for(p.threads, n_steps * NH, 1, [&](int64_t i0, int64_t i1) {
      for (int64_t i = i0; i < i1; ++i) detail::ssd_step(p, steps[static_cast<size_t>(i / NH)], i % NH);
    });
  }

  bool any_long = false;
  for (const SeqSpan& s : seqs) any_long = any_long || s.len > 1;
  if (!any_long) return;

  std::vector<T> CB(static_cast<size_t>(G * Q * Q));  // [G, Q, Q], lower triangle used
  for (const SeqSpan& seq : seqs) {
    if (seq.len <= 1) continue;
    for (int64_t t0 = seq.start; t0 < seq.start + seq.len; t0 += Q) {
      const int64_t q = std::min(Q, seq.start + seq.len - t0);
      // Rows of the triangle differ in cost: handed out one at a time.
      parallel_tasks(p.threads, G * q, [&](int64_t task) {
        const int64_t g = task / q, i = task % q;
        const T* Ci = p.C[t0 + i] + g * N;
        T* row = CB.data() + (g * Q + i) * Q;
        for (int64_t j = 0; j <= i; ++j) {
          const T* Bj = p.B[t0 + j] + g * N;
          T dot = 0;
#pragma omp simd reduction(+ : dot)
          for (int64_t n = 0; n < N; ++n) dot += Ci[n] * Bj[n];
          row[j] = dot;
        }
      });
      // CB is complete; every head has finished with it before the next chunk overwrites it.
      parallel_tasks(p.threads, NH, [&](int64_t h) {
        thread_local detail::SsdScratch<T> ws;
        ws.resize(Q, p.head_dim);
        const int64_t g = h / (NH / G);
        detail::ssd_chunk_head(p, seq.slot, t0, q, h, CB.data() + g * Q * Q, Q, ws);
      });
    }
  }
}

}  // namespace mambacpp::cpu
