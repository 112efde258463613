// Causal self-attention over a paged KV cache and rotary position embedding, generic over the compute type T so the
// tests run the same code in fp64, and over the pages' element type P (T, or Bf16: rows rounded to bf16 as they are
// appended and widened as they are read). Shapes and semantics: AttentionArgs and Backend::rope in backend/backend.h.
//
// Every output row is computed on its own, its keys visited in position order, so a row's result does not depend
// on how its sequence was split into calls or on the other sequences of the batch (bit for bit).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <span>
#include <type_traits>
#include <vector>

#include "backend/backend.h"
#include "backend/cpu/kernel_common.h"
#include "backend/cpu/thread_pool.h"

namespace mambacpp::cpu {

template <class T>
struct AttentionParams {
  Rows<const T> q, k, v;  // [T, n_heads * hd], [T, n_kv * hd], [T, n_kv * hd]
  Rows<T> out;            // [T, n_heads * hd]
  int64_t n_heads = 0, n_kv_heads = 0, head_dim = 0, page_tokens = 0;
  T scale = T(0);
  int threads = 1;
};

// A bf16 page element (the bits of the f32 rounded to nearest even).
struct Bf16 {
  uint16_t bits;
};

// A page element from a T and back.
template <class P, class T>
inline P kv_put(T v) {
  if constexpr (std::is_same_v<P, Bf16>) return Bf16{f32_to_bf16(static_cast<float>(v))};
  else return static_cast<P>(v);
}
template <class T, class P>
inline T kv_get(P v) {
  if constexpr (std::is_same_v<P, Bf16>) return static_cast<T>(bf16_to_f32(v.bits));
  else return static_cast<T>(v);
}

// One sequence's pages: K rows then V rows per page, `kv_dim` wide.
template <class P>
struct KvPages {
  std::vector<P*> pages;
  int64_t past = 0;
};

template <class P>
inline P* kv_row(const KvPages<P>& c, int64_t pos, int64_t page_tokens, int64_t kv_dim, bool value) {
  P* page = c.pages[static_cast<size_t>(pos / page_tokens)];
  return page + ((value ? page_tokens : 0) + pos % page_tokens) * kv_dim;
}

template <class T, class P = T>
void attention(const AttentionParams<T>& p, std::span<const SeqSpan> seqs, std::span<const KvPages<P>> cache) {
  const int64_t hd = p.head_dim, kv_dim = p.n_kv_heads * hd, rep = p.n_heads / p.n_kv_heads;
  // Append this call's keys and values first: row i then sees positions [0, past + i].
  for (size_t s = 0; s < seqs.size(); ++s)
    for (int64_t i = 0; i < seqs[s].len; ++i) {
      const int64_t pos = cache[s].past + i, t = seqs[s].start + i;
      P* kr = kv_row(cache[s], pos, p.page_tokens, kv_dim, false);
      P* vr = kv_row(cache[s], pos, p.page_tokens, kv_dim, true);
      for (int64_t c = 0; c < kv_dim; ++c) {
        kr[c] = kv_put<P>(p.k[t][c]);
        vr[c] = kv_put<P>(p.v[t][c]);
      }
    }
  for (size_t s = 0; s < seqs.size(); ++s) {
    const KvPages<P>& c = cache[s];
    const int64_t len = seqs[s].len;
    parallel_tasks(p.threads, len * p.n_heads, [&](int64_t task) {
      const int64_t i = task / p.n_heads, h = task % p.n_heads;
      {
        const int64_t t = seqs[s].start + i, n_keys = c.past + i + 1, g = h / rep;
        const T* q = p.q[t] + h * hd;
        std::vector<T> w(static_cast<size_t>(n_keys));
        T mx = -std::numeric_limits<T>::infinity();
        for (int64_t j = 0; j < n_keys; ++j) {
          const P* key = kv_row(c, j, p.page_tokens, kv_dim, false) + g * hd;
          T dot = T(0);
          for (int64_t d = 0; d < hd; ++d) dot += q[d] * kv_get<T>(key[d]);
          w[static_cast<size_t>(j)] = dot * p.scale;
          mx = std::max(mx, w[static_cast<size_t>(j)]);
        }
        T sum = T(0);
        for (int64_t j = 0; j < n_keys; ++j) sum += (w[static_cast<size_t>(j)] = std::exp(w[static_cast<size_t>(j)] - mx));
        T* o = p.out[t] + h * hd;
        std::fill(o, o + hd, T(0));
        for (int64_t j = 0; j < n_keys; ++j) {
          const P* val = kv_row(c, j, p.page_tokens, kv_dim, true) + g * hd;
          const T a = w[static_cast<size_t>(j)] / sum;
          for (int64_t d = 0; d < hd; ++d) o[d] += a * kv_get<T>(val[d]);
        }
      }
    });
  }
}

// RoPE in place on rows of x [T, n_heads * head_dim]. Angles are formed in double (pos * theta^(-2i/rope_dim)),
// so long positions do not lose the phase to float rounding.
template <class T>
void rope(Rows<T> x, int64_t n_heads, int64_t head_dim, int64_t rope_dim, double theta, std::span<const SeqSpan> seqs,
          std::span<const int64_t> start_positions, int threads) {
  const int64_t half = rope_dim / 2;
  std::vector<double> inv_freq(static_cast<size_t>(half));
  for (int64_t i = 0; i < half; ++i)
    inv_freq[static_cast<size_t>(i)] = std::pow(theta, -static_cast<double>(2 * i) / static_cast<double>(rope_dim));
  for (size_t s = 0; s < seqs.size(); ++s) {
    parallel_for(threads, seqs[s].len, 17, [&](int64_t i0, int64_t i1) {
      for (int64_t i = i0; i < i1; ++i) {
        const double pos = static_cast<double>(start_positions[s] + i);
        T* row = x[seqs[s].start + i];
        for (int64_t f = 0; f < half; ++f) {
          const double a = pos * inv_freq[static_cast<size_t>(f)];
          const T cs = static_cast<T>(std::cos(a)), sn = static_cast<T>(std::sin(a));
          for (int64_t h = 0; h < n_heads; ++h) {
            T* e = row + h * head_dim;
            const T x1 = e[f], x2 = e[f + half];
            e[f] = x1 * cs - x2 * sn;
            e[f + half] = x2 * cs + x1 * sn;
          }
        }
      }
    });
  }
}

}  // namespace mambacpp::cpu
