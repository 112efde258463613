// Conversions of quantized weights (quant_ops.h): the 16-bit dense copy the prefill GEMMs read, fp8's scales applied
// to a GEMM's output, and the embedding lookup.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/quant_loads.cuh"
#include "backend/cuda/quant_ops.h"
#include "mambacpp/error.h"

namespace mambacpp::cuda {
namespace {

constexpr int kThreads = 256;

unsigned blocks_for(int64_t n) { return static_cast<unsigned>((n + kThreads - 1) / kThreads); }

// One thread per 8 consecutive elements of a row (cols % 8 == 0): an 8-byte load, a 16-byte store.
template <bool FP8>
__global__ void __launch_bounds__(kThreads) dequantize8_kernel(QuantMatrix w, uint16_t* dst) {
  const int64_t g = blockIdx.x * int64_t(kThreads) + threadIdx.x;  // group of 8
  const int64_t per_row = w.cols / 8;
  if (g >= w.rows * per_row) return;
  const int64_t o = g / per_row, i = (g - o * per_row) * 8;
  const uint2 raw = *reinterpret_cast<const uint2*>(w.q + o * w.cols + i);
  const uint8_t* b = reinterpret_cast<const uint8_t*>(&raw);
  uint16_t h[8];
  if constexpr (FP8) {
#pragma unroll
    for (int k = 0; k < 8; ++k) h[k] = __bfloat16_as_ushort(__float2bfloat16_rn(e4m3_to_f(b[k])));
  } else {
    const float d = __half2float(static_cast<const __half*>(w.scale)[o * (w.cols / 32) + i / 32]);
#pragma unroll
    for (int k = 0; k < 8; ++k) h[k] = __half_as_ushort(__float2half_rn(d * static_cast<float>(static_cast<int8_t>(b[k]))));
  }
  uint4 out;
  memcpy(&out, h, 16);
  *reinterpret_cast<uint4*>(dst + o * w.cols + i) = out;
}

// Any cols (fp8 rows of odd width): one element per thread.
__global__ void __launch_bounds__(kThreads) dequantize1_kernel(QuantMatrix w, uint16_t* dst) {
  const int64_t e = blockIdx.x * int64_t(kThreads) + threadIdx.x;
  if (e >= w.rows * w.cols) return;
  const int64_t o = e / w.cols, i = e - o * w.cols;
  const float v = quant_raw(w, o, i);
  dst[e] = w.format == WeightFormat::FP8_E4M3 ? __bfloat16_as_ushort(__float2bfloat16_rn(v))
                                              : __half_as_ushort(__float2half_rn(quant_scale(w, o, i) * v));
}

__global__ void __launch_bounds__(kThreads) scale_columns_kernel(F32Rows y, QuantMatrix w, DevWeight bias, int64_t T) {
  const int64_t o = blockIdx.x * int64_t(kThreads) + threadIdx.x;
  if (o >= w.rows) return;
  const float s = static_cast<const float*>(w.scale)[w.per_tensor ? 0 : o];
  const float b = bias.data ? load_f(bias.data, bias.dtype, o) : 0.0f;
  for (int64_t t = blockIdx.y; t < T; t += gridDim.y) {
    float& v = y.data[t * y.stride + o];
    v = __fadd_rn(__fmul_rn(s, v), b);
  }
}

__global__ void __launch_bounds__(kThreads) embed_kernel(QuantMatrix w, const int32_t* ids, int64_t T, F32Rows out) {
  const int64_t i = blockIdx.x * int64_t(kThreads) + threadIdx.x;
  if (i >= w.cols) return;
  for (int64_t t = blockIdx.y; t < T; t += gridDim.y) out.data[t * out.stride + i] = quant_element(w, ids[t], i);
}

unsigned rows_grid(int64_t rows) { return static_cast<unsigned>(rows < 1 ? 1 : (rows > 65535 ? 65535 : rows)); }

}  // namespace

void launch_quant_dequantize(const QuantMatrix& w, DType to, void* dst, cudaStream_t stream) {
  const int64_t n = w.rows * w.cols;
  if (n <= 0) return;
  const bool fp8 = w.format == WeightFormat::FP8_E4M3;
  MAMBACPP_ASSERT(to == (fp8 ? DType::BF16 : DType::F16));
  uint16_t* out = static_cast<uint16_t*>(dst);
  if (w.cols % 8 == 0 && reinterpret_cast<uintptr_t>(dst) % 16 == 0) {
    if (fp8)
      dequantize8_kernel<true><<<blocks_for(n / 8), kThreads, 0, stream>>>(w, out);
    else
      dequantize8_kernel<false><<<blocks_for(n / 8), kThreads, 0, stream>>>(w, out);
  } else {
    dequantize1_kernel<<<blocks_for(n), kThreads, 0, stream>>>(w, out);
  }
  MAMBACPP_CUDA_LAUNCHED();
}

void launch_scale_columns(F32Rows y, const QuantMatrix& w, DevWeight bias, int64_t T, cudaStream_t stream) {
  if (T <= 0 || w.rows <= 0) return;
  scale_columns_kernel<<<dim3(blocks_for(w.rows), rows_grid(T)), kThreads, 0, stream>>>(y, w, bias, T);
  MAMBACPP_CUDA_LAUNCHED();
}

void launch_quant_embed(const QuantMatrix& w, const int32_t* ids, int64_t T, F32Rows out, cudaStream_t stream) {
  if (T <= 0 || w.cols <= 0) return;
  embed_kernel<<<dim3(blocks_for(w.cols), rows_grid(T)), kThreads, 0, stream>>>(w, ids, T, out);
  MAMBACPP_CUDA_LAUNCHED();
}

}  // namespace mambacpp::cuda
