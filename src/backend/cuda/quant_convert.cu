// Conversions of quantized weights (quant_ops.h): the 16-bit dense copy the prefill GEMMs read, fp8's scales applied
// to a GEMM's output, and the embedding lookup (q4_k / q6_k through the GEMV's unit decoder, quant_loads.cuh).
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

// q4_k / q5_k / q6_k: one thread per 64-element unit (quant_loads.cuh), 16 f16 per group; 16-byte stores where dst
// allows.
template <WeightFormat F>
__global__ void __launch_bounds__(kThreads) kq_dequantize_kernel(QuantMatrix w, uint16_t* dst, bool vec) {
  const int64_t g = blockIdx.x * int64_t(kThreads) + threadIdx.x;
  const int64_t per_row = w.cols / kKqUnitElems;
  if (g >= w.rows * per_row) return;
  const int64_t o = g / per_row, u = g - o * per_row;
  float v[kKqUnitElems];
  kq_unit<F>(w, o, u, v);
  uint16_t* row = dst + o * w.cols + kq_unit_pos<F>(u);
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    uint16_t h[16];
#pragma unroll
    for (int l = 0; l < 16; ++l) h[l] = __half_as_ushort(__float2half_rn(v[16 * k + l]));
    uint16_t* p = row + k * kq_group_stride<F>;
    if (vec) {
      uint4 a, b;
      memcpy(&a, h, 16);
      memcpy(&b, h + 8, 16);
      reinterpret_cast<uint4*>(p)[0] = a;
      reinterpret_cast<uint4*>(p)[1] = b;
    } else {
#pragma unroll
      for (int l = 0; l < 16; ++l) p[l] = h[l];
    }
  }
}

// out[t, unit u of row ids[t]] in f32: grid (units per row / kThreads, T).
template <WeightFormat F>
__global__ void __launch_bounds__(kThreads) kq_embed_kernel(QuantMatrix w, const int32_t* ids, int64_t T, F32Rows out) {
  const int64_t u = blockIdx.x * int64_t(kThreads) + threadIdx.x;
  if (u >= w.cols / kKqUnitElems) return;
  const int64_t p0 = kq_unit_pos<F>(u);
  for (int64_t t = blockIdx.y; t < T; t += gridDim.y) {
    float v[kKqUnitElems];
    kq_unit<F>(w, ids[t], u, v);
    float* row = out.data + t * out.stride + p0;
#pragma unroll
    for (int k = 0; k < 4; ++k)
#pragma unroll
      for (int l = 0; l < 16; ++l) row[k * kq_group_stride<F> + l] = v[16 * k + l];
  }
}

unsigned rows_grid(int64_t rows) { return static_cast<unsigned>(rows < 1 ? 1 : (rows > 65535 ? 65535 : rows)); }

}  // namespace

void launch_quant_dequantize(const QuantMatrix& w, DType to, void* dst, cudaStream_t stream) {
  const int64_t n = w.rows * w.cols;
  if (n <= 0) return;
  const bool fp8 = w.format == WeightFormat::FP8_E4M3;
  MAMBACPP_ASSERT(to == (fp8 ? DType::BF16 : DType::F16));
  uint16_t* out = static_cast<uint16_t*>(dst);
  if (is_kquant(w.format)) {
    const bool vec = reinterpret_cast<uintptr_t>(dst) % 16 == 0;
    const unsigned blocks = blocks_for(n / kKqUnitElems);
    switch (w.format) {
      case WeightFormat::Q6_K:
        kq_dequantize_kernel<WeightFormat::Q6_K><<<blocks, kThreads, 0, stream>>>(w, out, vec);
        break;
      case WeightFormat::Q5_K:
        kq_dequantize_kernel<WeightFormat::Q5_K><<<blocks, kThreads, 0, stream>>>(w, out, vec);
        break;
      default: kq_dequantize_kernel<WeightFormat::Q4_K><<<blocks, kThreads, 0, stream>>>(w, out, vec); break;
    }
    MAMBACPP_CUDA_LAUNCHED();
    return;
  }
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
  if (is_kquant(w.format)) {
    const dim3 grid(blocks_for(w.cols / kKqUnitElems), rows_grid(T));
    switch (w.format) {
      case WeightFormat::Q6_K:
        kq_embed_kernel<WeightFormat::Q6_K><<<grid, kThreads, 0, stream>>>(w, ids, T, out);
        break;
      case WeightFormat::Q5_K:
        kq_embed_kernel<WeightFormat::Q5_K><<<grid, kThreads, 0, stream>>>(w, ids, T, out);
        break;
      default: kq_embed_kernel<WeightFormat::Q4_K><<<grid, kThreads, 0, stream>>>(w, ids, T, out); break;
    }
    MAMBACPP_CUDA_LAUNCHED();
    return;
  }
  embed_kernel<<<dim3(blocks_for(w.cols), rows_grid(T)), kThreads, 0, stream>>>(w, ids, T, out);
  MAMBACPP_CUDA_LAUNCHED();
}

}  // namespace mambacpp::cuda
