// Device pieces the Mamba-1 scan kernels share (mamba1_scan.cu, mamba1_chunked_scan.cu): the state update and the
// order of C . h, written out so that every kernel gives the same bits for the same steps.
#pragma once

#include "backend/cuda/cuda_common.cuh"

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

}  // namespace mambacpp::cuda
