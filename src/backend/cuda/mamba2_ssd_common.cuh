// Device pieces the Mamba-2 SSD kernels share (mamba2_ssd.cu, mamba2_ssd_fast.cu): a head's A, a token's dt.
#pragma once

#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/cuda_ops.h"

namespace mambacpp::cuda {

__device__ __forceinline__ float ssd_head_A(const Mamba2Launch& p, int64_t h) {
  return -expf(load_f(p.A_log.data, p.A_log.dtype, h));
}
// dt_t = clamp(softplus(dt_raw[t, h] + dt_bias[h]), dt_min, dt_max).
__device__ __forceinline__ float ssd_dt(const Mamba2Launch& p, int64_t t, int64_t h, float bias) {
  const int64_t i = t * p.dt.stride + h;
  const float raw = p.dt16 ? __uint_as_float(uint32_t(p.dt16[i]) << 16) : p.dt.data[i];
  const float d = softplus_f(raw + bias);
  return fminf(fmaxf(d, p.dt_min), p.dt_max);
}

}  // namespace mambacpp::cuda
