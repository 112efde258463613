// The routing of one token (MoeRouteArgs in backend.h) and its combine, on the host, in f32 as transformers computes it (its routers
// run in f32 even in a float64 model): shared by the default moe_route and the CPU backend's, so both give the same
// bits. Every top-k is torch.topk's on the CPU (torch_top_k below), so exact ties go where torch puts them.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <utility>
#include <vector>

#include "backend/backend.h"

namespace mambacpp {
// Argument checks of the MoE ops (moe_ops_default.cpp), shared by every backend's implementation.
void check_moe_route(const MoeRouteArgs& a);
void check_moe_experts(const MoeExpertsArgs& a);
}  // namespace mambacpp

namespace mambacpp::moe {

// One token's combine: out[c] = sum over j = 0..k-1, in that order, of w[j] * y[j][c].
inline void combine_token(const float* const* y, const float* w, int64_t k, int64_t D, float* out) {
  for (int64_t c = 0; c < D; ++c) out[c] = w[0] * y[0][c];
  for (int64_t j = 1; j < k; ++j)
    for (int64_t c = 0; c < D; ++c) out[c] += w[j] * y[j][c];
}

// torch.topk(v, k) on the CPU as ATen's topk_impl_loop computes it: (value, index) pairs compared by value alone (NaN
// above everything), std::partial_sort of the first k when k * 64 <= n, else std::nth_element at k - 1 and std::sort
// of the first k - 1. Which of several equal values are kept is whatever that selection leaves in front, not the
// lowest index: transformers' granite_moe_f32 fixture (router rows that tie exactly) has torch keeping the higher
// index at some ties, and mambacpp mirrors it. torch's CPU wheels are built against libstdc++; the ties equal
// torch's where mambacpp is too (GCC, or clang with libstdc++). out[0..k): best first (ties in the selection's
// order); callers that pass sorted=False in transformers (Nemotron-H) choose the same set.
inline void torch_top_k(const float* v, int64_t n, int64_t k, std::vector<std::pair<float, int64_t>>& q,
                        int64_t* out) {
  q.resize(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) q[static_cast<size_t>(i)] = {v[i], i};
  const auto greater = [](const std::pair<float, int64_t>& x, const std::pair<float, int64_t>& y) {
    return (std::isnan(x.first) && !std::isnan(y.first)) || x.first > y.first;
  };
  if (k * 64 <= n) {
    std::partial_sort(q.begin(), q.begin() + k, q.end(), greater);
  } else {
    std::nth_element(q.begin(), q.begin() + (k - 1), q.end(), greater);
    std::sort(q.begin(), q.begin() + (k - 1), greater);
  }
  for (int64_t j = 0; j < k; ++j) out[j] = q[static_cast<size_t>(j)].second;
}

// Scratch of one routing thread: sized once for E experts and G groups.
struct RouteScratch {
  std::vector<float> s, choice, group;
  std::vector<uint8_t> group_kept;
  std::vector<int64_t> picked;
  std::vector<std::pair<float, int64_t>> pairs;
  void fit(int64_t E, int64_t G) {
    s.resize(static_cast<size_t>(E));
    choice.resize(static_cast<size_t>(E));
    group.resize(static_cast<size_t>(G));
    group_kept.resize(static_cast<size_t>(G));
    picked.resize(static_cast<size_t>(std::max(E, G)));
  }
};

// One token: logits[E] (and bias[E] or null) -> ids[top_k], weights[top_k], best first.
inline void route_token(const MoeRouteArgs& a, int64_t E, const float* logits, const float* bias, int32_t* ids,
                        float* weights, RouteScratch& sc) {
  const int64_t k = a.top_k;
  sc.fit(E, a.n_group);
  int64_t* picked = sc.picked.data();
  if (a.scoring == MoeScoring::SigmoidGrouped) {
    for (int64_t e = 0; e < E; ++e) {
      sc.s[e] = 1.0f / (1.0f + std::exp(-logits[e]));
      sc.choice[e] = bias ? sc.s[e] + bias[e] : sc.s[e];
    }
    const int64_t G = a.n_group, per = E / G;
    if (G > 1) {
      // A group's score: its two best biased scores, summed; the topk_group best groups stay eligible.
      for (int64_t g = 0; g < G; ++g) {
        const float* c = sc.choice.data() + g * per;
        float b1 = -std::numeric_limits<float>::infinity(), b2 = b1;
        for (int64_t i = 0; i < per; ++i) {
          if (c[i] > b1) b2 = b1, b1 = c[i];
          else if (c[i] > b2) b2 = c[i];
        }
        sc.group[g] = b1 + b2;
      }
      torch_top_k(sc.group.data(), G, a.topk_group, sc.pairs, picked);
      std::fill(sc.group_kept.begin(), sc.group_kept.end(), uint8_t{0});
      for (int64_t j = 0; j < a.topk_group; ++j) sc.group_kept[static_cast<size_t>(picked[j])] = 1;
      // The other groups' experts are out of the running (-inf). Some transformers versions mask them with 0.0,
      // which lets one outrank an eligible expert whose biased score is negative; the 5.17 fixture
      // (nemotron_h_moe_f32, a dead expert biased by -10 in an eligible group) matches -inf, not 0.0.
      for (int64_t g = 0; g < G; ++g)
        if (!sc.group_kept[static_cast<size_t>(g)])
          for (int64_t i = 0; i < per; ++i) sc.choice[g * per + i] = -std::numeric_limits<float>::infinity();
    }
    torch_top_k(sc.choice.data(), E, k, sc.pairs, picked);
    float sum = 0.0f;
    for (int64_t j = 0; j < k; ++j) {
      ids[j] = static_cast<int32_t>(picked[j]);
      weights[j] = sc.s[picked[j]];
      sum += weights[j];
    }
    const float denom = sum + 1e-20f;
    for (int64_t j = 0; j < k; ++j) {
      if (a.renormalize) weights[j] /= denom;
      weights[j] *= a.scale;
    }
    return;
  }
  if (a.scoring == MoeScoring::SoftmaxAll) {
    float mx = -std::numeric_limits<float>::infinity();
    for (int64_t e = 0; e < E; ++e) mx = std::max(mx, logits[e]);
    float sum = 0.0f;
    for (int64_t e = 0; e < E; ++e) sum += (sc.s[e] = std::exp(logits[e] - mx));
    for (int64_t e = 0; e < E; ++e) sc.s[e] /= sum;
    torch_top_k(sc.s.data(), E, k, sc.pairs, picked);
    for (int64_t j = 0; j < k; ++j) {
      ids[j] = static_cast<int32_t>(picked[j]);
      weights[j] = sc.s[picked[j]];
    }
    return;
  }
  // SoftmaxChosen: the k best logits, softmax over them.
  torch_top_k(logits, E, k, sc.pairs, picked);
  for (int64_t j = 0; j < k; ++j) {
    ids[j] = static_cast<int32_t>(picked[j]);
    weights[j] = logits[picked[j]];
  }
  const float mx = weights[0];  // the best comes first
  float sum = 0.0f;
  for (int64_t j = 0; j < k; ++j) sum += (weights[j] = std::exp(weights[j] - mx));
  for (int64_t j = 0; j < k; ++j) weights[j] /= sum;
}

}  // namespace mambacpp::moe
