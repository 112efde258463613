// Pieces shared by the fused GEMV kernels (fused_gemv.cu, fused_gemv_mma.cu): the group-wise norm scales of the
// prologue, and the epilogue (bias and norm scale are applied by the caller; this stores the output, adds it to the
// residual, or runs the one-token conv1d + SiLU on it).
#pragma once

#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/fused_ops.h"

namespace mambacpp::cuda {

// Group-wise norm with several groups: scale[t * n_groups + g] = rsqrt(mean of x[t]^2 over group g + eps), one warp
// per (row, group). The caller synchronises the block before reading the scales.
__device__ __forceinline__ void compute_group_scales(const FusedGemvLaunch& p, int64_t n_groups, float* scale) {
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, n_warps = blockDim.x >> 5;
  for (int64_t k = warp; k < p.T * n_groups; k += n_warps) {
    const float* xr = p.x.data + (k / n_groups) * p.x.stride + (k % n_groups) * p.norm_group;
    float ss = 0.0f;
    for (int64_t i = lane; i < p.norm_group; i += 32) ss += xr[i] * xr[i];
    ss = warp_sum(ss);
    if (lane == 0) scale[k] = rsqrtf(ss / static_cast<float>(p.norm_group) + p.eps);
  }
}

// Output o of a row from its dot product (the one-group norm's scale already applied): the multipliers and the
// bias (FusedGemvLaunch::x_scale, scale_of). Multiplying by 1 changes no bits, so blocks without them are unchanged.
__device__ __forceinline__ float scaled_output(const FusedGemvLaunch& p, int64_t o, float dot) {
  float v = dot * p.x_scale;
  if (p.bias.data) v += load_f(p.bias.data, p.bias.dtype, o);
  for (int r = 0; r < p.n_scale_runs; ++r)
    if (o < p.scale_end[r]) return v * p.scale_of[r];
  return v;
}

// What the thread finishing output o of row t needs for the conv epilogue, loaded before the wait: the taps are
// weights and the conv state is written by this kernel alone, so neither depends on the previous kernel.
struct ConvTaps {
  float w[kFusedMaxConvTaps];      // w[c, 0 .. K-1]
  float s[kFusedMaxConvTaps - 1];  // the K-1 previous inputs, oldest first
  float bias;
  int64_t base;                    // the slot's state row
  bool active;                     // o is a conv channel (no initialisers: the struct lives in shared memory)
};

__device__ __forceinline__ ConvTaps load_conv_taps(const FusedGemvLaunch& p, int t, int64_t o) {
  ConvTaps ct{};
  const int64_t c = o - p.conv_begin;
  if (c < 0 || c >= p.conv_channels) return ct;
  ct.active = true;
  const int64_t S = p.K - 1;
  ct.base = (p.seqs[t].slot * p.conv_channels + c) * S;
  ct.bias = p.conv_bias.data ? load_f(p.conv_bias.data, p.conv_bias.dtype, c) : 0.0f;
#pragma unroll
  for (int k = 0; k < kFusedMaxConvTaps; ++k) {
    ct.w[k] = k <= S ? load_f(p.conv_w.data, p.conv_w.dtype, c * p.K + k) : 0.0f;
    if (k < kFusedMaxConvTaps - 1) ct.s[k] = k < S ? load_state(p.conv_state, p.state_bf16, ct.base + k) : 0.0f;
  }
  return ct;
}

// The epilogue for output o of row t, done by one thread. Conv channels: out = silu(bias + sum_k w[k] * in[k])
// over the K-1 inputs held in the state and v; the state then drops its oldest input and appends v.
__device__ __forceinline__ void finish_output(const FusedGemvLaunch& p, int t, int64_t o, float v,
                                              const ConvTaps& ct) {
  if (ct.active) {
    const int64_t S = p.K - 1;
    float acc = ct.bias;
#pragma unroll
    for (int k = 0; k < kFusedMaxConvTaps - 1; ++k)
      if (k < S) acc += ct.w[k] * ct.s[k];
#pragma unroll
    for (int k = 0; k < kFusedMaxConvTaps; ++k)
      if (k == S) acc += ct.w[k] * v;
#pragma unroll
    for (int k = 0; k + 1 < kFusedMaxConvTaps - 1; ++k)
      if (k + 1 < S) store_state(p.conv_state, p.state_bf16, ct.base + k, ct.s[k + 1]);
    if (S > 0) store_state(p.conv_state, p.state_bf16, ct.base + S - 1, v);
    p.conv_out.data[t * p.conv_out.stride + (o - p.conv_begin)] = silu_f(acc);
    return;
  }
  float* yp = p.y.data + t * p.y.stride + o;
  *yp = p.accumulate ? *yp + v : v;
}

}  // namespace mambacpp::cuda
