// The CPU backend's select_top_k: per row, the repetition penalty in place, the bad-logit check, then the k best
// (logit descending, id ascending) by a partial sort, or a vector argmax for k = 1. Rows run in parallel.
#include <algorithm>
#include <cmath>
#include <limits>
#include <utility>
#include <vector>

#include "backend/cpu/cpu_ops.h"
#include "backend/cpu/simd.h"
#include "backend/cpu/thread_pool.h"

namespace mambacpp::cpu {

namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

void select_row(float* row, int64_t limit, const TopKRequest& q, TopKCandidates& out) {
  out = TopKCandidates{};
  if (q.repeat_penalty != 1.0f)
    for (int32_t id : q.penalized)
      if (id < limit) row[id] = row[id] > 0.0f ? row[id] / q.repeat_penalty : row[id] * q.repeat_penalty;
  int64_t bad, best;
  simd::argmax_first(row, limit, &bad, &best);
  if (bad >= 0) {
    out.bad_id = static_cast<int32_t>(bad);
    out.bad_value = row[bad];
    return;
  }
  if (q.k == 1) {  // the lowest id wins ties (and -0 == +0 is a tie)
    if (best >= 0) {
      out.ids.push_back(static_cast<int32_t>(best));
      out.logits.push_back(row[best]);
    }
    return;
  }
  std::vector<std::pair<float, int32_t>> cand;
  for (int64_t i = 0; i < limit; ++i)
    if (row[i] != kNegInf) cand.emplace_back(row[i], static_cast<int32_t>(i));
  const size_t k = std::min(cand.size(), static_cast<size_t>(q.k));
  std::partial_sort(
      cand.begin(), cand.begin() + static_cast<std::ptrdiff_t>(k), cand.end(),
      [](const auto& a, const auto& b) { return a.first > b.first || (a.first == b.first && a.second < b.second); });
  for (size_t i = 0; i < k; ++i) {
    out.ids.push_back(cand[i].second);
    out.logits.push_back(cand[i].first);
  }
}

}  // namespace

void select_top_k_f32(Rows<float> logits, std::span<const TopKRequest> requests, std::span<const int64_t> limits,
                      std::vector<TopKCandidates>& out, int threads) {
  const int64_t n = static_cast<int64_t>(requests.size());
  out.resize(requests.size());
  parallel_tasks(threads, n, [&](int64_t r) {
    select_row(logits[r], limits[static_cast<size_t>(r)], requests[static_cast<size_t>(r)],
               out[static_cast<size_t>(r)]);
  });
}

}  // namespace mambacpp::cpu
