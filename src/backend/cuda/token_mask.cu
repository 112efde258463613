// launch_token_mask (token_mask.h): one thread per logit, a grid row per masked logits row. A warp's 32 ids share one
// mask word (a broadcast load); only the disallowed entries are written.
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/token_mask.h"

namespace mambacpp::cuda {
namespace {

constexpr int kThreads = 256;

__global__ void __launch_bounds__(kThreads) token_mask_kernel(TokenMaskLaunch p) {
  const int id = static_cast<int>(blockIdx.x) * kThreads + static_cast<int>(threadIdx.x);
  if (id >= p.V) return;
  const uint32_t word = p.words[static_cast<int64_t>(blockIdx.y) * p.words_per_row + (id >> 5)];
  if (!((word >> (id & 31)) & 1u)) p.logits[static_cast<int64_t>(p.rows[blockIdx.y]) * p.stride + id] = -INFINITY;
}

}  // namespace

void launch_token_mask(const TokenMaskLaunch& p, cudaStream_t stream) {
  if (p.n_masked == 0 || p.V == 0) return;
  const dim3 grid(static_cast<unsigned>((p.V + kThreads - 1) / kThreads), static_cast<unsigned>(p.n_masked));
  token_mask_kernel<<<grid, kThreads, 0, stream>>>(p);
  MAMBACPP_CUDA_LAUNCHED();
}

}  // namespace mambacpp::cuda
