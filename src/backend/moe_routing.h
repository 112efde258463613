// The routing of one token (MoeRouteArgs in backend.h) and its combine, on the host, in f32 as transformers computes it (its routers
// run in f32 even in a float64 model): shared by the default moe_route and the CPU backend's, so both give the same
// bits. Top-k picks are made one at a time by a first-maximum scan, so ties go to the lower expert index.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
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

// Index of the largest of v[0..n) not yet taken (NaN never wins; all NaN or taken: the first free index).
inline int64_t first_max(const float* v, int64_t n, const std::vector<uint8_t>& taken) {
  int64_t best = -1;
  for (int64_t i = 0; i < n; ++i) {
    if (taken[static_cast<size_t>(i)]) continue;
    if (best < 0 || v[i] > v[best] || (std::isnan(v[best]) && !std::isnan(v[i]))) best = i;
  }
  return best;
}

// Scratch of one routing thread: sized once for E experts and G groups.
struct RouteScratch {
  std::vector<float> s, choice, group;
  std::vector<uint8_t> taken, group_taken;
  void fit(int64_t E, int64_t G) {
    s.resize(static_cast<size_t>(E));
    choice.resize(static_cast<size_t>(E));
    group.resize(static_cast<size_t>(G));
    taken.resize(static_cast<size_t>(E));
    group_taken.resize(static_cast<size_t>(G));
  }
};

// One token: logits[E] (and bias[E] or null) -> ids[top_k], weights[top_k], best first.
inline void route_token(const MoeRouteArgs& a, int64_t E, const float* logits, const float* bias, int32_t* ids,
                        float* weights, RouteScratch& sc) {
  const int64_t k = a.top_k;
  sc.fit(E, a.n_group);
  std::fill(sc.taken.begin(), sc.taken.end(), uint8_t{0});
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
      std::fill(sc.group_taken.begin(), sc.group_taken.end(), uint8_t{0});
      for (int64_t j = 0; j < a.topk_group; ++j) sc.group_taken[first_max(sc.group.data(), G, sc.group_taken)] = 1;
      for (int64_t g = 0; g < G; ++g)
        if (!sc.group_taken[g])
          for (int64_t i = 0; i < per; ++i) sc.taken[g * per + i] = 1;  // not eligible
    }
    float sum = 0.0f;
    for (int64_t j = 0; j < k; ++j) {
      const int64_t e = first_max(sc.choice.data(), E, sc.taken);
      sc.taken[e] = 1;
      ids[j] = static_cast<int32_t>(e);
      weights[j] = sc.s[e];
      sum += sc.s[e];
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
    for (int64_t j = 0; j < k; ++j) {
      const int64_t e = first_max(sc.s.data(), E, sc.taken);
      sc.taken[e] = 1;
      ids[j] = static_cast<int32_t>(e);
      weights[j] = sc.s[e];
    }
    return;
  }
  // SoftmaxChosen: the k best logits, softmax over them.
  for (int64_t j = 0; j < k; ++j) {
    const int64_t e = first_max(logits, E, sc.taken);
    sc.taken[e] = 1;
    ids[j] = static_cast<int32_t>(e);
    weights[j] = logits[e];
  }
  const float mx = weights[0];  // the best comes first
  float sum = 0.0f;
  for (int64_t j = 0; j < k; ++j) sum += (weights[j] = std::exp(weights[j] - mx));
  for (int64_t j = 0; j < k; ++j) weights[j] /= sum;
}

}  // namespace mambacpp::moe
