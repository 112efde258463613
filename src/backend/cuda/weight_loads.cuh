// Weight loads for the GEMV kernels: one 16-byte vector of stored weights (8 bf16, 8 f16 or 4 f32) as floats, and
// a single element as float. bf16 -> f32 is a shift, f16 -> f32 the hardware conversion: both exact.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <cstring>
#include <type_traits>

namespace mambacpp::cuda {

template <class W>
__device__ __forceinline__ float w_to_f(W v) {
  if constexpr (std::is_same_v<W, __nv_bfloat16>) {
    return __bfloat162float(v);
  } else if constexpr (std::is_same_v<W, __half>) {
    return __half2float(v);
  } else {
    return v;
  }
}

// 16 bytes of weights as floats: 8 (bf16/f16) or 4 (f32).
template <class W>
__device__ __forceinline__ void unpack16(const uint4& raw, float* out) {
  const uint32_t u[4] = {raw.x, raw.y, raw.z, raw.w};
  if constexpr (std::is_same_v<W, __nv_bfloat16>) {
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      out[2 * k] = __uint_as_float(u[k] << 16);  // low half = lower address
      out[2 * k + 1] = __uint_as_float(u[k] & 0xffff0000u);
    }
  } else if constexpr (std::is_same_v<W, __half>) {
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      __half2 h;
      memcpy(&h, &u[k], 4);
      const float2 f = __half22float2(h);
      out[2 * k] = f.x;
      out[2 * k + 1] = f.y;
    }
  } else {
#pragma unroll
    for (int k = 0; k < 4; ++k) out[k] = __uint_as_float(u[k]);
  }
}

}  // namespace mambacpp::cuda
