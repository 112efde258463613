// RMSNorm and Mamba-2's gated, group-wise RMSNorm. One block per (row, group): the block sums the squares in f32
// (per-thread partials, then a warp/block tree, which keeps the rounding error at ~log2(D) ulps), then every thread
// scales the elements it read. `out` may alias the input: each thread rereads only its own elements, and all reads
// for the sum finish (block barrier) before any write.
#include <type_traits>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/cuda_ops.h"

namespace mambacpp::cuda {
namespace {

// 1024 threads, loops unrolled by 4: a decode row (T = 1) has a single block, so the loads of a row must be in
// flight together — with 256 threads and rolled loops the gated norm of mamba2-2.7b (5120 channels) took 29 us,
// a chain of dependent memory round trips (docs/benchmarks.md).
constexpr int kThreads = 1024;

// grid.x strides over rows (T may exceed 65535).
__global__ void __launch_bounds__(kThreads) rmsnorm_kernel(ConstF32Rows x, DevWeight w, float eps, F32Rows out, int64_t T, int64_t D) {
  __shared__ float scratch[32];
  for (int64_t t = blockIdx.x; t < T; t += gridDim.x) {
    const float* xr = x.data + t * x.stride;
    float ss = 0.0f;
#pragma unroll 4
    for (int64_t i = threadIdx.x; i < D; i += blockDim.x) ss += xr[i] * xr[i];
    const float scale = rsqrtf(block_sum(ss, scratch) / static_cast<float>(D) + eps);
    float* o = out.data + t * out.stride;
#pragma unroll 4
    for (int64_t i = threadIdx.x; i < D; i += blockDim.x) o[i] = xr[i] * scale * load_f(w.data, w.dtype, i);
  }
}

// grid.x strides over rows * groups.
__global__ void __launch_bounds__(kThreads) gated_rmsnorm_kernel(ConstF32Rows y, ConstF32Rows z, DevWeight w, int64_t group_size, float eps,
                                     F32Rows out, int64_t T, int64_t n_groups) {
  __shared__ float scratch[32];
  for (int64_t r = blockIdx.x; r < T * n_groups; r += gridDim.x) {
    const int64_t t = r / n_groups, c0 = (r % n_groups) * group_size;
    const float* yr = y.data + t * y.stride + c0;
    const float* zr = z.data + t * z.stride + c0;
    float ss = 0.0f;
#pragma unroll 4
    for (int64_t i = threadIdx.x; i < group_size; i += blockDim.x) {
      const float g = yr[i] * silu_f(zr[i]);
      ss += g * g;
    }
    const float scale = rsqrtf(block_sum(ss, scratch) / static_cast<float>(group_size) + eps);
    float* o = out.data + t * out.stride + c0;
#pragma unroll 4
    for (int64_t i = threadIdx.x; i < group_size; i += blockDim.x)
      o[i] = yr[i] * silu_f(zr[i]) * scale * load_f(w.data, w.dtype, c0 + i);
  }
}

// The fast-precision GEMMs' prologue: a group-wise RMSNorm times w (group_size == D: the plain RMSNorm; w absent:
// no norm, the rows only rounded), written once as the weight's 16-bit dtype into a contiguous [T, D] buffer.
// grid.x strides over rows * groups, as above.
template <class H>
__global__ void __launch_bounds__(kThreads) rmsnorm_round_kernel(ConstF32Rows x, DevWeight w, int64_t group_size,
                                                                 float eps, H* out, int64_t T, int64_t D,
                                                                 int64_t n_groups) {
  __shared__ float scratch[32];
  for (int64_t r = blockIdx.x; r < T * n_groups; r += gridDim.x) {
    const int64_t t = r / n_groups, c0 = (r % n_groups) * group_size;
    const float* xr = x.data + t * x.stride + c0;
    float scale = 1.0f;
    if (w.data) {
      float ss = 0.0f;
#pragma unroll 4
      for (int64_t i = threadIdx.x; i < group_size; i += blockDim.x) ss += xr[i] * xr[i];
      scale = rsqrtf(block_sum(ss, scratch) / static_cast<float>(group_size) + eps);
    }
    H* o = out + t * D + c0;
#pragma unroll 4
    for (int64_t i = threadIdx.x; i < group_size; i += blockDim.x) {
      const float v = w.data ? xr[i] * scale * load_f(w.data, w.dtype, c0 + i) : xr[i];
      if constexpr (std::is_same_v<H, __nv_bfloat16>) {
        o[i] = __float2bfloat16_rn(v);
      } else {
        o[i] = __float2half_rn(v);
      }
    }
  }
}

int row_blocks(int64_t rows) { return static_cast<int>(rows > (1 << 20) ? (1 << 20) : rows); }

}  // namespace

void launch_rmsnorm(ConstF32Rows x, DevWeight w, float eps, F32Rows out, int64_t T, int64_t D, cudaStream_t stream) {
  if (T <= 0 || D <= 0) return;
  rmsnorm_kernel<<<row_blocks(T), kThreads, 0, stream>>>(x, w, eps, out, T, D);
  MAMBACPP_CUDA_LAUNCHED();
}

void launch_gated_rmsnorm(ConstF32Rows y, ConstF32Rows z, DevWeight w, int64_t group_size, float eps, F32Rows out,
                          int64_t T, int64_t D, cudaStream_t stream) {
  if (T <= 0 || D <= 0) return;
  const int64_t n_groups = D / group_size;
  gated_rmsnorm_kernel<<<row_blocks(T * n_groups), kThreads, 0, stream>>>(y, z, w, group_size, eps, out, T,
                                                                          n_groups);
  MAMBACPP_CUDA_LAUNCHED();
}

void launch_rmsnorm_round(ConstF32Rows x, DevWeight w, int64_t group_size, float eps, DType to, void* out,
                          int64_t T, int64_t D, cudaStream_t stream) {
  if (T <= 0 || D <= 0) return;
  if (group_size <= 0 || !w.data) group_size = D;
  const int64_t n_groups = D / group_size;
  if (to == DType::BF16) {
    rmsnorm_round_kernel<<<row_blocks(T * n_groups), kThreads, 0, stream>>>(
        x, w, group_size, eps, static_cast<__nv_bfloat16*>(out), T, D, n_groups);
  } else {
    rmsnorm_round_kernel<<<row_blocks(T * n_groups), kThreads, 0, stream>>>(
        x, w, group_size, eps, static_cast<__half*>(out), T, D, n_groups);
  }
  MAMBACPP_CUDA_LAUNCHED();
}

}  // namespace mambacpp::cuda
