// Row log-sum-exp (Backend::row_logsumexp), the normaliser of logprobs: one block per row, a max pass and a sum of
// exp(x - max) in f32, as the CPU backend computes it (both sum in different orders: agreement to a few ulps).
#include <cmath>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/cuda_ops.h"

namespace mambacpp::cuda {
namespace {

constexpr int kThreads = 1024;

__device__ __forceinline__ float nan_max(float a, float b) { return isnan(a) || a > b ? a : b; }

__device__ float block_max(float v, float* scratch) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, n_warps = blockDim.x >> 5;
  for (int o = 16; o > 0; o >>= 1) v = nan_max(v, __shfl_xor_sync(0xffffffffu, v, o));
  __syncthreads();
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  v = lane < n_warps ? scratch[lane] : -INFINITY;
  for (int o = 16; o > 0; o >>= 1) v = nan_max(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

__global__ void __launch_bounds__(kThreads) row_logsumexp_kernel(ConstF32Rows x, const int32_t* limits, float* out) {
  __shared__ float scratch[32];
  const int64_t r = blockIdx.x;
  const float* row = x.data + r * x.stride;
  const int32_t n = limits[r];
  float mx = -INFINITY;
  for (int32_t j = threadIdx.x; j < n; j += blockDim.x) mx = nan_max(row[j], mx);
  mx = block_max(mx, scratch);
  if (isnan(mx) || isinf(mx)) {  // NaN, +inf, or every logit -inf: the value says it
    if (threadIdx.x == 0) out[r] = mx;
    return;
  }
  float sum = 0.0f;
  for (int32_t j = threadIdx.x; j < n; j += blockDim.x) sum += expf(row[j] - mx);
  sum = block_sum(sum, scratch);
  if (threadIdx.x == 0) out[r] = mx + logf(sum);
}

}  // namespace

void launch_row_logsumexp(ConstF32Rows logits, const int32_t* limits, int64_t n_rows, float* out, cudaStream_t stream) {
  if (n_rows <= 0) return;
  row_logsumexp_kernel<<<static_cast<unsigned>(n_rows), kThreads, 0, stream>>>(logits, limits, out);
  MAMBACPP_CUDA_LAUNCHED();
}

}  // namespace mambacpp::cuda
