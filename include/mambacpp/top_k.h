// Top-k candidate selection: instead of a whole [vocab] logits row, a forward call (Model::forward_top_k) or a
// backend (Backend::select_top_k) returns the k highest logits of a row, after the repetition penalty, sorted.
// A sampler whose chain only looks at the top k tokens (greedy: k = 1) finishes on those k values and picks exactly
// the token it would have picked from the full row, while only ~2k numbers per row leave the device.
//
// What "the top k" means, precisely (every backend gives bitwise the same answer):
//   1. penalty: for each id of `penalized` (distinct, < limit), logit > 0 is divided by `repeat_penalty`, logit <= 0
//      multiplied by it (as apply_repeat_penalty in engine/sampler.h);
//   2. considered: ids in [0, limit) whose penalised logit is not -inf. If a considered logit is NaN or +inf, the
//      row is bad: `bad_id` is the lowest such id and `bad_value` its penalised logit;
//   3. the candidates are the min(k, considered) largest, ordered by logit descending, equal logits (-0 == +0) by
//      id ascending.
// (C++17: the CUDA sources see this header through backend.h.)
#pragma once

#include <cstdint>
#include <vector>

namespace mambacpp {

// The largest k a selection may ask for. Samplers with a larger (or no) top-k need the full row.
inline constexpr int kMaxTopK = 256;

// What to select from one row.
struct TopKRequest {
  int32_t k = 1;                   // 1..kMaxTopK
  int64_t limit = 0;               // ids >= limit are never candidates (padding rows); 0: the whole row
  float repeat_penalty = 1.0f;     // > 0, finite; 1: off
  std::vector<int32_t> penalized;  // distinct ids in [0, row length) the penalty applies to
  // Model::forward_top_k only (select_top_k ignores it): >= 0 also returns the row's log-softmax normaliser over
  // [0, limit) of the raw logits and its `logprobs` (<= kMaxTopK) most likely ids, before the penalty.
  int32_t logprobs = -1;
};

// Log-probabilities of one row: log-softmax of the raw logits over ids [0, limit).
struct RowLogprobs {
  float log_normalizer = 0.0f;  // log sum exp of the row's logits over [0, limit)
  std::vector<int32_t> ids;     // the most likely ids, best first (ties: lowest id first)
  std::vector<float> logprobs;  // their logit - log_normalizer
};

// The candidates of one row.
struct TopKCandidates {
  std::vector<int32_t> ids;   // min(k, considered) ids, best first
  std::vector<float> logits;  // their penalised logits, descending
  int32_t bad_id = -1;        // the lowest considered id whose logit is NaN or +inf; -1: none
  float bad_value = 0.0f;     // that logit
};

}  // namespace mambacpp
