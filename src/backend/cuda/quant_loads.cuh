// Device-side decoding of the quantized layouts of quant_ops.h: 16 stored bytes as 16 floats (int8 quants or e4m3
// values, both exact in f32), single elements, and one dequantized weight element.
#pragma once

#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cstdint>

#include "backend/cuda/quant_ops.h"

namespace mambacpp::cuda {

__device__ __forceinline__ float e4m3_to_f(uint8_t b) {
  const __half_raw h = __nv_cvt_fp8_to_halfraw(static_cast<__nv_fp8_storage_t>(b), __NV_E4M3);
  return __half2float(__half(h));
}

// 16 bytes (lower address first) as 16 floats: int8 quants (Q8) or e4m3 values.
template <bool FP8>
__device__ __forceinline__ void unpack_q16(const uint4& raw, float* out) {
  const uint32_t u[4] = {raw.x, raw.y, raw.z, raw.w};
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    if constexpr (FP8) {
      const __half2_raw lo = __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(u[k] & 0xffffu), __NV_E4M3);
      const __half2_raw hi = __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(u[k] >> 16), __NV_E4M3);
      const float2 a = __half22float2(__half2(lo)), b = __half22float2(__half2(hi));
      out[4 * k] = a.x;
      out[4 * k + 1] = a.y;
      out[4 * k + 2] = b.x;
      out[4 * k + 3] = b.y;
    } else {
#pragma unroll
      for (int j = 0; j < 4; ++j) out[4 * k + j] = static_cast<float>(static_cast<int8_t>(u[k] >> (8 * j)));
    }
  }
}

// The stored value of element (o, i) before any scale: the int8 quant or the e4m3 value.
__device__ __forceinline__ float quant_raw(const QuantMatrix& w, int64_t o, int64_t i) {
  const uint8_t b = w.q[o * w.cols + i];
  return w.format == WeightFormat::FP8_E4M3 ? e4m3_to_f(b) : static_cast<float>(static_cast<int8_t>(b));
}

// The scale of element (o, i): q8_0's block scale, fp8's channel (or tensor) scale.
__device__ __forceinline__ float quant_scale(const QuantMatrix& w, int64_t o, int64_t i) {
  if (w.format == WeightFormat::FP8_E4M3) return static_cast<const float*>(w.scale)[w.per_tensor ? 0 : o];
  return __half2float(static_cast<const __half*>(w.scale)[o * (w.cols / 32) + i / 32]);
}

// Element (o, i) dequantized: scale * raw, one f32 product (exact for q8_0: 11 x 8 significant bits).
__device__ __forceinline__ float quant_element(const QuantMatrix& w, int64_t o, int64_t i) {
  return quant_scale(w, o, i) * quant_raw(w, o, i);
}

}  // namespace mambacpp::cuda
