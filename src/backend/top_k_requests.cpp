// check_top_k_requests (backend.h): the argument checks every backend's select_top_k shares, so that the kernels
// can trust k, the limit, the penalty and the penalised ids.
#include <algorithm>
#include <climits>
#include <cmath>
#include <vector>

#include "backend/backend.h"
#include "mambacpp/error.h"

namespace mambacpp {

void check_row_logsumexp(const TensorView& logits, const std::vector<int64_t>& limits) {
  if (logits.ndim != 2 || logits.dtype != DType::F32)
    fail("row_logsumexp: logits must be a 2-D f32 tensor, found ", logits.shape_string(), " ", dtype_name(logits.dtype));
  if (static_cast<int64_t>(limits.size()) != logits.dim(0))
    fail("row_logsumexp: expected one limit per logits row (", logits.dim(0), "), found ", limits.size());
  for (size_t r = 0; r < limits.size(); ++r)
    if (limits[r] < 1 || limits[r] > logits.dim(1) || limits[r] > (int64_t(1) << 30))
      fail("row_logsumexp: row ", r, ": limit must be in [1, ", logits.dim(1), "], found ", limits[r]);
}

std::vector<int64_t> check_top_k_requests(const TensorView& logits, const std::vector<TopKRequest>& requests) {
  if (logits.ndim != 2 || logits.dtype != DType::F32)
    fail("select_top_k: logits must be a 2-D f32 tensor, found ", logits.shape_string(), " ", dtype_name(logits.dtype));
  const int64_t n = logits.dim(0), V = logits.dim(1);
  if (static_cast<int64_t>(requests.size()) != n)
    fail("select_top_k: expected one request per logits row (", n, "), found ", requests.size());
  // 2^30: the kernels index a row with 32-bit ints, with room for a block of threads past the end.
  if (V < 1 || V > (int64_t(1) << 30)) fail("select_top_k: rows must have 1 to 2^30 entries, found ", V);
  std::vector<int64_t> limits(requests.size());
  std::vector<int32_t> sorted;
  for (size_t r = 0; r < requests.size(); ++r) {
    const TopKRequest& q = requests[r];
    if (q.k < 1 || q.k > kMaxTopK) fail("select_top_k: row ", r, ": k must be in [1, ", kMaxTopK, "], found ", q.k);
    if (q.limit < 0 || q.limit > V) fail("select_top_k: row ", r, ": limit must be in [0, ", V, "], found ", q.limit);
    if (!(q.repeat_penalty > 0.0f) || std::isinf(q.repeat_penalty))
      fail("select_top_k: row ", r, ": repeat_penalty must be a finite number > 0, found ", q.repeat_penalty);
    sorted.assign(q.penalized.begin(), q.penalized.end());
    std::sort(sorted.begin(), sorted.end());
    for (size_t i = 0; i < sorted.size(); ++i) {
      if (sorted[i] < 0 || sorted[i] >= V)
        fail("select_top_k: row ", r, ": penalized id ", sorted[i], " outside [0, ", V, ")");
      if (i > 0 && sorted[i] == sorted[i - 1])
        fail("select_top_k: row ", r, ": penalized id ", sorted[i], " appears twice; expected distinct ids");
    }
    limits[r] = q.limit == 0 ? V : q.limit;
  }
  return limits;
}

}  // namespace mambacpp
