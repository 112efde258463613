// The activation side of the fp8 prefill GEMM (quant_ops.h, quant_fp8_gemm.cpp): rows of x quantized to e4m3 with
// one dynamic scale per row, and the GEMM's f32 output scaled back by the row's and the weight channel's scales.
#include <cuda_fp8.h>

#include <cstdint>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/quant_ops.h"
#include "mambacpp/error.h"

namespace mambacpp::cuda {
namespace {

constexpr int kThreads = 256;
constexpr float kE4m3Max = 448.0f;

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, off));
  return v;
}

// One block per row: amax over the row, scale = amax / 448 (1 for an all-zero row), q = e4m3(x / scale) rounded to
// nearest even and saturated to +-448 (as fp8_quantize_rows on the host). A row's bytes and scale depend on that row
// alone.
__global__ void __launch_bounds__(kThreads) quantize_rows_kernel(ConstF32Rows x, int64_t in, uint8_t* q,
                                                                 float* row_scale) {
  __shared__ float red[kThreads / 32];
  const int64_t t = blockIdx.x;
  const float* xr = x.data + t * x.stride;
  float m = 0.0f;
  for (int64_t i = threadIdx.x; i < in; i += kThreads) m = fmaxf(m, fabsf(xr[i]));
  m = warp_max(m);
  if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = m;
  __syncthreads();
  float amax = 0.0f;
#pragma unroll
  for (int k = 0; k < kThreads / 32; ++k) amax = fmaxf(amax, red[k]);
  const float scale = amax > 0.0f ? __fdiv_rn(amax, kE4m3Max) : 1.0f;
  uint8_t* qr = q + t * in;
  // x / scale correctly rounded, then one rounding to e4m3: the bytes core/fp8.h's fp8_quantize_rows gives.
  for (int64_t i = threadIdx.x; i < in; i += kThreads)
    qr[i] = static_cast<uint8_t>(__nv_cvt_float_to_fp8(__fdiv_rn(xr[i], scale), __NV_SATFINITE, __NV_E4M3));
  if (threadIdx.x == 0) row_scale[t] = scale;
}

// y[t, o] = y[t, o] * row_scale[t] * s[o] (+ bias[o]).
__global__ void __launch_bounds__(kThreads) scale_rows_columns_kernel(F32Rows y, const float* row_scale,
                                                                      QuantMatrix w, DevWeight bias, int64_t T) {
  const int64_t o = blockIdx.x * int64_t(kThreads) + threadIdx.x;
  if (o >= w.rows) return;
  const float s = static_cast<const float*>(w.scale)[w.per_tensor ? 0 : o];
  const float b = bias.data ? load_f(bias.data, bias.dtype, o) : 0.0f;
  for (int64_t t = blockIdx.y; t < T; t += gridDim.y) {
    float& v = y.data[t * y.stride + o];
    v = __fadd_rn(__fmul_rn(__fmul_rn(v, row_scale[t]), s), b);
  }
}

}  // namespace

void launch_quantize_rows_e4m3(ConstF32Rows x, int64_t T, int64_t in, uint8_t* q, float* row_scale,
                               cudaStream_t stream) {
  if (T <= 0) return;
  MAMBACPP_ASSERT(T <= INT32_MAX);
  quantize_rows_kernel<<<static_cast<unsigned>(T), kThreads, 0, stream>>>(x, in, q, row_scale);
  MAMBACPP_CUDA_LAUNCHED();
}

void launch_scale_rows_columns(F32Rows y, const float* row_scale, const QuantMatrix& w, DevWeight bias, int64_t T,
                               cudaStream_t stream) {
  if (T <= 0 || w.rows <= 0) return;
  const auto blocks = static_cast<unsigned>((w.rows + kThreads - 1) / kThreads);
  const auto rows = static_cast<unsigned>(T < 65535 ? T : 65535);
  scale_rows_columns_kernel<<<dim3(blocks, rows), kThreads, 0, stream>>>(y, row_scale, w, bias, T);
  MAMBACPP_CUDA_LAUNCHED();
}

}  // namespace mambacpp::cuda
