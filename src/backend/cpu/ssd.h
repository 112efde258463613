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
// blocks of rows), then heads run in parallel. Single-token sequences run in parallel over (sequence, head).
// The chunk products are matrix products (detail::matmul: gemm.h's vector kernels in f32, plain loops otherwise).
// Workspace is O(n_groups * Q^2 + threads * Q^2), independent of L.
#pragma once

#include <algorithm>
#include <span>
#include <vector>

#include "backend/backend.h"
#include "backend/cpu/gemm.h"
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

// The chunk products, as plain loops for any T (the fp64 tests run these) and on the vector kernels of gemm.h for f32.
// C[m, n] (+)= sum_{k < K} A[m, k] * B[k, n]; causal: row m sums k <= m only (A is zero beyond its diagonal).
template <class T>
void matmul(int64_t M, int64_t N, int64_t K, const T* A, int64_t lda, const T* B, int64_t ldb, T* C, int64_t ldc,
            bool accumulate, bool causal) {
  for (int64_t m = 0; m < M; ++m) {
    const int64_t k_end = causal ? std::min(K, m + 1) : K;
    for (int64_t n = 0; n < N; ++n) {
      T acc = accumulate ? C[m * ldc + n] : T(0);
      for (int64_t k = 0; k < k_end; ++k) acc += A[m * lda + k] * B[k * ldb + n];
      C[m * ldc + n] = acc;
    }
  }
}
inline void matmul(int64_t M, int64_t N, int64_t K, const float* A, int64_t lda, const float* B, int64_t ldb,
                   float* C, int64_t ldc, bool accumulate, bool causal) {
  simd::matmul(M, N, K, A, lda, B, ldb, C, ldc, accumulate, causal);
}

// Row i of W (see ssd_chunk_head): seg[j] += a for j < i, W[j] = exp(seg[j]) * CB[j] * dt[j], W[i] = CB[i] * dt[i],
// zeros to n.
template <class T>
void decay_row(int64_t i, int64_t n, T a, T* seg, const T* cb, const T* dt, T* out) {
  for (int64_t j = 0; j < i; ++j) {
    seg[j] += a;
    out[j] = std::exp(seg[j]) * cb[j] * dt[j];
  }
  seg[i] = 0;
  out[i] = cb[i] * dt[i];
  for (int64_t j = i + 1; j < n; ++j) out[j] = 0;
}
inline void decay_row(int64_t i, int64_t n, float a, float* seg, const float* cb, const float* dt, float* out) {
  simd::ssd_decay_row(i, n, a, seg, cb, dt, out);
}

// Per-thread scratch for one (chunk, head): all O(Q^2), O(Q * head_dim) or O(head_dim * d_state).
template <class T>
struct SsdScratch {
  std::vector<T> dt, expS, seg, W, Y1, Y2, HT, XdT;
  void resize(int64_t Q, int64_t P, int64_t N) {
    for (auto* v : {&dt, &expS, &seg}) v->resize(static_cast<size_t>(Q));
    W.resize(static_cast<size_t>(Q * Q));
    Y1.resize(static_cast<size_t>(Q * P));
    Y2.resize(static_cast<size_t>(Q * P));
    HT.resize(static_cast<size_t>(N * P));
    XdT.resize(static_cast<size_t>(P * Q));
  }
};

// One chunk [t0, t0 + q) of one head, given the group's CB[i][j] = C_i . B_j (row stride Q), as three products:
//   Y1 = W X (W lower triangular), Y2 = C H_in^T, y = Y1 + exp(S_i) Y2 + D x;  H_out = exp(S_{q-1}) H_in + Xd^T B
// with W[i][j] = exp(seg[i][j]) CB[i][j] dt_j and Xd[j] = exp(seg[q-1][j]) dt_j x_j.
template <class T>
void ssd_chunk_head(const Mamba2Params<T>& p, int64_t slot, int64_t t0, int64_t q, int64_t h, const T* CB,
                    int64_t Q, SsdScratch<T>& ws) {
  const int64_t P = p.head_dim, N = p.d_state, g = h / (p.n_heads / p.n_groups);
  const T A = -std::exp(weight_at<T>(p.A_log, h)), D = weight_at<T>(p.D, h), bias = weight_at<T>(p.dt_bias, h);
  T* dt = ws.dt.data();
  T* expS = ws.expS.data();
  T* W = ws.W.data();
  T* H = p.state + (slot * p.n_heads + h) * P * N;  // [P, N], H_in on entry, H_out on exit

  T S = 0;
  for (int64_t i = 0; i < q; ++i) {
    dt[i] = ssd_dt(p, t0 + i, h, bias);
    S += dt[i] * A;
    expS[i] = std::exp(S);
  }
  // W row by row: seg[j] = seg[i][j] = a_{j+1} + ... + a_i, one term added per row (term by term: |S| reaches
  // hundreds in a 256-long chunk, where a difference of running sums would lose ~1e-5 relative).
  for (int64_t i = 0; i < q; ++i) decay_row(i, q, i > 0 ? dt[i] * A : T(0), ws.seg.data(), CB + i * Q, dt, W + i * Q);

  const T* X = p.x[t0] + h * P;  // chunk rows of this head, row stride p.x.stride
  matmul(q, P, q, W, Q, X, p.x.stride, ws.Y1.data(), P, false, true);
  for (int64_t e = 0; e < P; ++e)
    for (int64_t n = 0; n < N; ++n) ws.HT[static_cast<size_t>(n * P + e)] = H[e * N + n];
  matmul(q, P, N, p.C[t0] + g * N, p.C.stride, ws.HT.data(), P, ws.Y2.data(), P, false, false);
  for (int64_t i = 0; i < q; ++i) {
    const T* xi = p.x[t0 + i] + h * P;
    T* yi = p.y[t0 + i] + h * P;
    const T* y1 = ws.Y1.data() + i * P;
    const T* y2 = ws.Y2.data() + i * P;
    for (int64_t e = 0; e < P; ++e) yi[e] = y1[e] + expS[i] * y2[e] + D * xi[e];
  }

  // Outgoing state: the decay from position j to the chunk end, exp(seg[q-1][j]), recomputed the same stable way.
  T* XdT = ws.XdT.data();  // [P, Q]
  T seg = 0;
  for (int64_t j = q - 1; j >= 0; --j) {
    if (j < q - 1) seg += dt[j + 1] * A;
    const T decay = (j < q - 1 ? std::exp(seg) : T(1)) * dt[j];
    const T* xj = p.x[t0 + j] + h * P;
    for (int64_t e = 0; e < P; ++e) XdT[e * Q + j] = decay * xj[e];
  }
  const T eS = expS[q - 1];
  for (int64_t i = 0; i < P * N; ++i) H[i] *= eS;
  matmul(P, N, q, XdT, Q, p.B[t0] + g * N, p.B.stride, H, N, true, false);
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

  constexpr int64_t kCbRows = 32;
  std::vector<T> CB(static_cast<size_t>(G * Q * Q));  // [G, Q, Q], lower triangle used
  std::vector<T> BT(static_cast<size_t>(G * N * Q));  // [G, N, Q]: the chunk's B transposed
  for (const SeqSpan& seq : seqs) {
    if (seq.len <= 1) continue;
    for (int64_t t0 = seq.start; t0 < seq.start + seq.len; t0 += Q) {
      const int64_t q = std::min(Q, seq.start + seq.len - t0);
      // CB = C B^T of each group, lower triangle: blocks of rows, each up to its last row's diagonal.
      for (int64_t g = 0; g < G; ++g)
        for (int64_t j = 0; j < q; ++j)
          for (int64_t n = 0; n < N; ++n) BT[static_cast<size_t>((g * N + n) * Q + j)] = p.B[t0 + j][g * N + n];
      const int64_t n_rb = (q + kCbRows - 1) / kCbRows;
      parallel_tasks(p.threads, G * n_rb, [&](int64_t task) {
        const int64_t g = task / n_rb, r0 = (task % n_rb) * kCbRows, r1 = std::min(q, r0 + kCbRows);
        detail::matmul(r1 - r0, r1, N, p.C[t0 + r0] + g * N, p.C.stride, BT.data() + g * N * Q, Q,
                       CB.data() + (g * Q + r0) * Q, Q, false, false);
      });
      // CB is complete; every head has finished with it before the next chunk overwrites it.
      parallel_tasks(p.threads, NH, [&](int64_t h) {
        thread_local detail::SsdScratch<T> ws;
        ws.resize(Q, p.head_dim, N);
        const int64_t g = h / (NH / G);
        detail::ssd_chunk_head(p, seq.slot, t0, q, h, CB.data() + g * Q * Q, Q, ws);
      });
    }
  }
}

}  // namespace mambacpp::cpu
