// A plain reference for Backend::select_top_k (mambacpp/top_k.h) and random test rows for it: logits drawn from a
// few values (so that ties, -0 and +0 among them, are everywhere), -inf holes, penalties, limits below the row
// length. Shared by the CPU op tests and the GPU tests.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <utility>
#include <vector>

#include "mambacpp/top_k.h"

namespace mambacpp::test {

// The definition, step by step: penalise a copy, look for NaN / +inf below the limit, sort everything considered.
inline TopKCandidates reference_top_k(std::vector<float> row, const TopKRequest& q) {
  const int64_t limit = q.limit == 0 ? static_cast<int64_t>(row.size()) : q.limit;
  if (q.repeat_penalty != 1.0f)
    for (int32_t id : q.penalized)
      if (id < limit) {
        float& l = row[static_cast<size_t>(id)];
        l = l > 0.0f ? l / q.repeat_penalty : l * q.repeat_penalty;
      }
  TopKCandidates out;
  for (int64_t i = 0; i < limit; ++i) {
    const float v = row[static_cast<size_t>(i)];
    if (std::isnan(v) || v == std::numeric_limits<float>::infinity()) {
      out.bad_id = static_cast<int32_t>(i);
      out.bad_value = v;
      return out;
    }
  }
  std::vector<std::pair<float, int32_t>> all;
  for (int64_t i = 0; i < limit; ++i)
    if (row[static_cast<size_t>(i)] != -std::numeric_limits<float>::infinity())
      all.emplace_back(row[static_cast<size_t>(i)], static_cast<int32_t>(i));
  std::sort(all.begin(), all.end(), [](const auto& a, const auto& b) {
    return a.first > b.first || (a.first == b.first && a.second < b.second);
  });
  all.resize(std::min(all.size(), static_cast<size_t>(q.k)));
  for (const auto& [v, id] : all) {
    out.ids.push_back(id);
    out.logits.push_back(v);
  }
  return out;
}

// Logits for one row: `kind` 0 = a few distinct values (heavy ties, both zeros), 1 = normal(0, 3) floats (ties rare),
// 2 = every entry equal, 3 = mostly -inf with a few finite ones.
inline std::vector<float> random_row(int64_t V, int kind, std::mt19937_64& rng) {
  std::vector<float> row(static_cast<size_t>(V));
  std::normal_distribution<float> normal(0.0f, 3.0f);
  std::uniform_int_distribution<int> small(0, 11);
  const float neg_inf = -std::numeric_limits<float>::infinity();
  static const float levels[12] = {-0.0f, 0.0f, 1.5f, -2.25f, 3.0f, 7.0f, 7.0f, -7.0f, 0.5f, 2.0f, -0.0f, 11.0f};
  for (float& x : row) {
    switch (kind) {
      case 0:
        x = levels[small(rng)];
        break;
      case 1:
        x = normal(rng);
        break;
      case 2:
        x = 1.25f;
        break;
      default:
        x = small(rng) == 0 ? normal(rng) : neg_inf;
        break;
    }
    if (kind != 3 && small(rng) == 0 && small(rng) < 3) x = neg_inf;  // ~2% holes
  }
  return row;
}

// `n` distinct ids in [0, V), some of them at or above `limit` when the limit cuts the row.
inline std::vector<int32_t> random_distinct_ids(int64_t V, size_t n, std::mt19937_64& rng) {
  std::vector<int32_t> ids;
  std::uniform_int_distribution<int64_t> pick(0, V - 1);
  for (size_t tries = 0; ids.size() < std::min<size_t>(n, static_cast<size_t>(V)) && tries < 100 * n; ++tries) {
    const auto id = static_cast<int32_t>(pick(rng));
    if (std::find(ids.begin(), ids.end(), id) == ids.end()) ids.push_back(id);
  }
  return ids;
}

}  // namespace mambacpp::test
