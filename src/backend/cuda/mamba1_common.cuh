// Device pieces the Mamba-1 scan kernels share (mamba1_scan.cu, mamba1_chunked_scan.cu): the state update, the
// order of C . h and a channel's whole step, written out so that every kernel gives the same bits for the same steps.
#pragma once

#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/cuda_ops.h"

namespace mambacpp::cuda {

// h * exp(dt A) + dt x B, each rounding spelled out: the kernels must give the same bits (decode == prefill), and
// the compiler's own choice of which product to fuse differs between them.
__device__ __forceinline__ float state_update(float dtv, float A, float h, float dtx, float B) {
  return __fmaf_rn(B, dtx, __fmul_rn(expf(__fmul_rn(dtv, A)), h));
}

// sum_j part[j] (N a power of two) in the order of the lane-per-state kernel's butterfly over N lanes: lane 0 ends
// with the sum of pairs k, k + off for off = N/2 .. 1.
template <int N>
__device__ __forceinline__ float butterfly_sum(float (&part)[N]) {
#pragma unroll
  for (int off = N / 2; off > 0; off >>= 1)
#pragma unroll
    for (int k = 0; k < off; ++k) part[k] += part[k + off];
  return part[0];
}

// state_update, or with FastExp (A scaled by log2 e) the same with the hardware's approximate exp2.
template <bool FastExp>
__device__ __forceinline__ float scan_update(float dtv, float A, float h, float dtx, float B) {
  if constexpr (FastExp)
    return __fmaf_rn(B, dtx, __fmul_rn(exp2_approx(__fmul_rn(dtv, A)), h));
  else
    return state_update(dtv, A, h, dtx, B);
}

// Token t of channel c, whose N states h are in registers: the states updated and y[t, c] = (C . h + D x) silu(z).
template <bool FastExp, int N>
__device__ __forceinline__ void scan_token(const Mamba1Launch& p, int64_t t, int64_t c, const float (&A)[N],
                                           float bias, float Dc, float (&h)[N]) {
  const float x = p.x.data[t * p.x.stride + c];
  const float dtv = softplus_f(p.dt.data[t * p.dt.stride + c] + bias);
  const float z = p.z.data[t * p.z.stride + c];
  const float dtx = __fmul_rn(dtv, x);
  const float* Bt = p.B.data + t * p.B.stride;
  const float* Ct = p.C.data + t * p.C.stride;
  float part[N];
#pragma unroll
  for (int n = 0; n < N; ++n) {
    h[n] = scan_update<FastExp>(dtv, A[n], h[n], dtx, Bt[n]);
    part[n] = __fmaf_rn(Ct[n], h[n], 0.0f);
  }
  p.y.data[t * p.y.stride + c] = __fmaf_rn(Dc, x, butterfly_sum(part)) * silu_f(z);
}

}  // namespace mambacpp::cuda
