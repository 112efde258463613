// The mixture-of-experts kernels of the CUDA backend (moe_kernels.cu; the ops in backend_moe.cpp). Plain C++
// declarations, included by the backend's .cpp files.
//
// - Routing: one thread per token runs the rules of moe_routing.h (the host's route_token) step for step: the same
//   first-maximum scans, so ties go to the lower expert index exactly as on the CPU.
// - Sort: the (token, slot) pairs of a block of tokens grouped by expert, ascending pair index within an expert (a
//   stable counting sort by one warp: the order never depends on timing), with the experts that received a pair
//   listed in ascending order.
// - Grouped GEMV (MoeGemvRows::Sorted): one warp per output row of an active expert, over that expert's pairs in
//   runs of 8 (16-byte loads where the widths and addresses allow): each pair's dot product is summed in the same
//   order whatever the other pairs are, so a token's result does not depend on the batch around it. Only the active
//   experts' rows are read.
// - Few tokens (MoeGemvRows::Pairs and DownCombine, 16-bit weights with 16-byte loads): no sort; each warp streams
//   R output rows (a chunk of 16 loads per lane in flight at once); the up GEMV takes one pair per grid row and the
//   down GEMV one token per grid row (its k pairs on different warps, all experts streaming at once), summing the
//   pairs' outputs in slot order (the combine folded in). The same dot products and the same combine as the sorted
//   path, bit for bit (lane l takes features (32 c + l) * 8 .. + 7 in ascending c, then one shuffle tree).
// - Combine: out[t] = sum over j in slot order of weights[t, j] * y[pos(t, j)].
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <map>
#include <vector>

#include "mambacpp/dtype.h"

namespace mambacpp::cuda {

inline constexpr int64_t kMoeMaxExperts = 1024;  // the routing kernel's bit masks and the sort's shared counters
inline constexpr int64_t kMoeMaxGroups = 64;
inline constexpr int64_t kMoeCombineMaxSlots = 64;  // top-k of the down-and-combine kernel (its shared memory)

// MoeScoring's rules (backend.h), as the kernels name them.
enum class MoeRouteRule : int { SigmoidGrouped, SoftmaxChosen, SoftmaxAll };

struct MoeRouteLaunch {
  const float* logits = nullptr;  // [T, E], row stride logits_stride
  int64_t logits_stride = 0;
  const float* bias = nullptr;  // [E] or null
  int64_t T = 0, E = 0, k = 0, n_group = 1, topk_group = 1;
  MoeRouteRule rule = MoeRouteRule::SoftmaxChosen;
  bool renormalize = false;
  float scale = 1.0f;
  int32_t* ids = nullptr;    // [T, k]
  float* weights = nullptr;  // [T, k]
};
void launch_moe_route(const MoeRouteLaunch& p, cudaStream_t stream);

// The pairs p = t * k + j of ids[0 .. P) grouped by expert. offsets: [E + 1] (expert e's pairs are sorted[offsets[e]
// .. offsets[e + 1])); sorted: [P] pair indices; pos: [P], where pair p went (-1 for an id outside [0, E));
// active: [E], the experts with pairs in ascending order, then -1.
void launch_moe_sort(const int32_t* ids, int64_t P, int64_t E, int32_t* offsets, int32_t* sorted, int32_t* pos,
                     int32_t* active, cudaStream_t stream);

// The grouped GEMV's epilogue per output (a = the dot product with the row of table a, b = with the row of table b).
enum class MoeEpilogue : int { Plain, Relu2, SiluMul };

// Which rows a grouped GEMV launch computes: Sorted: the pairs of launch_moe_sort, grouped by active expert (y in
// sorted order); Pairs: pair p = 0 .. n_rows - 1 of ids (y row p); DownCombine: token t = 0 .. n_rows - 1, its pairs
// t * k + j through the down projection (x row t * k + j), combined with combine_weights into y row t (Plain only).
// Pairs and DownCombine need 16-bit weights with 16-byte loads (vec); DownCombine k <= kMoeCombineMaxSlots.
enum class MoeGemvRows : int { Sorted, Pairs, DownCombine };

struct MoeGemvLaunch {
  const void* const* a = nullptr;  // [E] device table: expert e's matrix (row o: a[e] + (a_row0 + o) * in)
  const void* const* b = nullptr;  // [E] second table for SiluMul (row o: b[e] + (b_row0 + o) * in), else null
  int64_t a_row0 = 0, b_row0 = 0;
  DType dtype = DType::BF16;  // the weights' dtype
  bool vec = false;           // 16-byte loads: in % (16 / elem) == 0, every matrix and x row 16-byte aligned
  int64_t in = 0, out = 0;    // the matrices' width and the output rows computed
  // Input rows: by_token: x row of the sorted pair s is x + (sorted[s] / k) * x_stride; else x + s * x_stride.
  const float* x = nullptr;
  int64_t x_stride = 0;
  bool by_token = false;
  int64_t k = 1;
  const int32_t* offsets = nullptr;  // launch_moe_sort's
  const int32_t* sorted = nullptr;
  const int32_t* active = nullptr;
  int64_t max_active = 0;  // grid rows: at most this many experts have pairs (min(E, P))
  MoeEpilogue epilogue = MoeEpilogue::Plain;
  float* y = nullptr;  // row s (sorted order), columns [0, out)
  int64_t y_stride = 0;
  MoeGemvRows rows = MoeGemvRows::Sorted;
  const int32_t* ids = nullptr;  // Pairs, DownCombine: [T, k] expert ids (outside [0, E): NaN for the token)
  int64_t E = 0;
  int64_t n_rows = 0;                      // Pairs: T * k; DownCombine: T
  const float* combine_weights = nullptr;  // DownCombine: [T, k]
};
void launch_moe_gemv(const MoeGemvLaunch& p, cudaStream_t stream);

// xs[s] = x[sorted[s] / k] for s < P (the prefill path's gathered rows, for the per-expert GEMMs).
void launch_moe_gather(const float* x, int64_t x_stride, const int32_t* sorted, int64_t P, int64_t k, int64_t D,
                       float* xs, int64_t xs_stride, cudaStream_t stream);

// out[t, c] = sum over j = 0..k-1, in order, of weights[t, j] * y[pos[t * k + j], c], for t < T (NaN where a pos
// is -1).
void launch_moe_combine(const float* y, int64_t y_stride, const int32_t* pos, const float* weights, int64_t T,
                        int64_t k, int64_t D, float* out, int64_t out_stride, cudaStream_t stream);

// Device tables of expert weight pointers, uploaded once per distinct list and kept as long as the backend (the
// weights outlive every step that uses them; a captured graph holds the table's address).
class MoePointerTables {
 public:
  MoePointerTables() = default;
  ~MoePointerTables();
  MoePointerTables(const MoePointerTables&) = delete;
  MoePointerTables& operator=(const MoePointerTables&) = delete;
  // The device copy of `ptrs` (a synchronous upload the first time: never first seen inside a graph capture, since
  // the model runs every decode step once eagerly before capturing it).
  const void* const* get(const std::vector<const void*>& ptrs);

 private:
  std::map<std::vector<const void*>, void*> tables_;
};

}  // namespace mambacpp::cuda
