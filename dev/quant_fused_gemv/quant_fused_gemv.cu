// The fused decode GEMV of fused_gemv.cu over quantized weights (quant_ops.h): the same prologues (one-group or
// group-wise RMSNorm), multipliers (x_scale, out_scales, bias) and epilogues (conv1d + SiLU step, store, residual
// add; fused_epilogue.cuh), with the weights read as q8_0 or fp8 e4m3 bytes, 16 per lane per 16-byte load, and
// converted to f32 in registers (exact: int8 quants and e4m3 values are f32 numbers).
//
// Layout: 256 threads = 8 warps; `wpr` warps share one output feature, each taking every wpr-th 16-byte vector of
// its row. wpr depends on the matrix's shape and the GPU's multiprocessor count only, never on the row count, and
// every row's sum has one fixed order of f32 operations (below), so a row's bits are the same in a batch of any
// size; batches of more than 8 rows run as launches of up to 8 rows each (an output's weights are read once per
// launch, the x rows stay in L1/L2).
//
// Order of a row's sum: per 16-byte vector a chain of fmaf over its 16 elements from zero (times the norm weight
// first when there is a norm), times the group's norm scale (group-wise norm), then into the lane's sum: q8_0 as
// fmaf(block scale, vector sum, lane sum), fp8 as an add. Lane sums meet by warp_sum's shuffle tree, warps in warp
// order; then fp8's channel (or tensor) scale, the one-group norm's scale, and scaled_output's multipliers and bias.
// Explicit _rn intrinsics keep the compiler from contracting the chain differently in the instantiations for
// different row counts.
#include <cuda_fp16.h>

#include <algorithm>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/cuda_launch.cuh"
#include "backend/cuda/fused_epilogue.cuh"
#include "backend/cuda/fused_ops.h"
#include "backend/cuda/quant_loads.cuh"
#include "backend/cuda/quant_ops.h"
#include "mambacpp/error.h"

namespace mambacpp::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int kVec = 16;      // stored bytes (= elements) per 16-byte load
constexpr int kPrefetch = 4;  // weight vectors per lane loaded before waiting for the previous kernel

// Four stored bytes (lower address first) as four floats: int8 quants or e4m3 values.
template <bool FP8>
__device__ __forceinline__ void unpack4(uint32_t u, float (&f)[4]) {
  if constexpr (FP8) {
    const __half2_raw lo = __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(u & 0xffffu), __NV_E4M3);
    const __half2_raw hi = __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(u >> 16), __NV_E4M3);
    const float2 a = __half22float2(__half2(lo)), b = __half22float2(__half2(hi));
    f[0] = a.x, f[1] = a.y, f[2] = b.x, f[3] = b.y;
  } else {
#pragma unroll
    for (int j = 0; j < 4; ++j) f[j] = static_cast<float>(static_cast<int8_t>(u >> (8 * j)));
  }
}

// One 16-byte weight vector (input features v*16 .. v*16+15 of the row) against every row of x. d: the q8_0 block
// scale of the vector (unused for fp8).
template <bool FP8, int NT>
__device__ __forceinline__ void consume_vector(const FusedGemvLaunch& p, const uint4& raw, float d, int64_t v,
                                               const float* nw, bool per_group, bool post_scale,
                                               const float* group_scale, int64_t n_groups, float (&acc)[NT],
                                               float (&ss)[NT]) {
  const uint32_t u[4] = {raw.x, raw.y, raw.z, raw.w};
  float part[NT];
#pragma unroll
  for (int r = 0; r < NT; ++r) part[r] = 0.0f;
#pragma unroll
  for (int q = 0; q < 4; ++q) {
    float wf[4];
    unpack4<FP8>(u[q], wf);
    if (nw) {
      const float4 g = *reinterpret_cast<const float4*>(nw + v * kVec + 4 * q);
      wf[0] = __fmul_rn(wf[0], g.x), wf[1] = __fmul_rn(wf[1], g.y);
      wf[2] = __fmul_rn(wf[2], g.z), wf[3] = __fmul_rn(wf[3], g.w);
    }
#pragma unroll
    for (int r = 0; r < NT; ++r) {
      const float4 xv = reinterpret_cast<const float4*>(p.x.data + r * p.x.stride + v * kVec)[q];
      part[r] = __fmaf_rn(wf[0], xv.x, part[r]);
      part[r] = __fmaf_rn(wf[1], xv.y, part[r]);
      part[r] = __fmaf_rn(wf[2], xv.z, part[r]);
      part[r] = __fmaf_rn(wf[3], xv.w, part[r]);
      if (post_scale) {
        ss[r] = __fmaf_rn(xv.x, xv.x, ss[r]);
        ss[r] = __fmaf_rn(xv.y, xv.y, ss[r]);
        ss[r] = __fmaf_rn(xv.z, xv.z, ss[r]);
        ss[r] = __fmaf_rn(xv.w, xv.w, ss[r]);
      }
    }
  }
#pragma unroll
  for (int r = 0; r < NT; ++r) {
    float s = part[r];
    if (per_group) s = __fmul_rn(s, group_scale[r * n_groups + (v * kVec) / p.norm_group]);
    acc[r] = FP8 ? __fadd_rn(acc[r], s) : __fmaf_rn(d, s, acc[r]);
  }
}

__device__ __forceinline__ float q8_block_scale(const QuantMatrix& w, int64_t o, int64_t v) {
  const auto* d = reinterpret_cast<const unsigned short*>(w.scale) + o * (w.cols / 32) + (v >> 1);
  return __half2float(__ushort_as_half(__ldg(d)));
}

// Launched as a dependent kernel: the first kPrefetch weight vectors of each lane (and their block scales, and the
// conv epilogue's taps and state) are loaded while the previous kernel finishes, everything else after the wait.
template <bool FP8, int NT>
__global__ void __launch_bounds__(kThreads, NT <= 2 ? 4 : 2)
    quant_fused_gemv_kernel(FusedGemvLaunch p, QuantMatrix w, int wpr) {
  __shared__ float part[kWarps][NT];
  __shared__ float part_ss[kWarps][NT];
  __shared__ float group_scale[NT * kFusedMaxNormGroups];
  __shared__ ConvTaps taps[kWarps][NT];
  allow_next_kernel();
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int64_t o = blockIdx.x * int64_t(kWarps / wpr) + warp / wpr;
  const bool live = o < p.out;
  const int64_t orow = live ? o : 0;
  const int seg = warp % wpr;
  const uint4* wv = reinterpret_cast<const uint4*>(w.q + orow * p.in);
  const int64_t n_vec = p.in / kVec;
  const int64_t v0 = seg * 32 + lane, dv = 32 * int64_t(wpr);
  // Lane t of a row's first warp finishes row t of output o.
  const bool finisher = live && seg == 0 && lane < NT;
  if (finisher) taps[warp][lane] = load_conv_taps(p, lane, o);
  uint4 pre[kPrefetch];
  float pre_d[kPrefetch];
#pragma unroll
  for (int k = 0; k < kPrefetch; ++k) {
    pre_d[k] = 1.0f;
    if (live && v0 + k * dv < n_vec) {
      pre[k] = __ldg(wv + v0 + k * dv);
      if constexpr (!FP8) pre_d[k] = q8_block_scale(w, orow, v0 + k * dv);
    }
  }
  float channel_scale = 1.0f;
  if constexpr (FP8)
    if (finisher) channel_scale = static_cast<const float*>(w.scale)[w.per_tensor ? 0 : o];
  wait_for_previous_kernel();

  const bool norm = p.norm_w.data != nullptr;
  const bool per_group = norm && p.norm_group != p.in;
  const bool post_scale = norm && !per_group;  // one group: scale after the dot, from sums of squares
  const int64_t n_groups = per_group ? p.in / p.norm_group : 1;
  if (per_group) {
    compute_group_scales(p, n_groups, group_scale);
    __syncthreads();
  }

  const float* nw = static_cast<const float*>(p.norm_w.data);
  float acc[NT], ss[NT];
#pragma unroll
  for (int r = 0; r < NT; ++r) acc[r] = ss[r] = 0.0f;
  if (live) {
#pragma unroll
    for (int k = 0; k < kPrefetch; ++k)
      if (v0 + k * dv < n_vec)
        consume_vector<FP8, NT>(p, pre[k], pre_d[k], v0 + k * dv, nw, per_group, post_scale, group_scale, n_groups,
                                acc, ss);
#pragma unroll 2
    for (int64_t v = v0 + kPrefetch * dv; v < n_vec; v += dv) {
      const float d = FP8 ? 1.0f : q8_block_scale(w, o, v);
      consume_vector<FP8, NT>(p, __ldg(wv + v), d, v, nw, per_group, post_scale, group_scale, n_groups, acc, ss);
    }
  }
#pragma unroll
  for (int r = 0; r < NT; ++r) {
    acc[r] = warp_sum(acc[r]);
    if (post_scale) ss[r] = warp_sum(ss[r]);
  }
  if (lane == 0) {
#pragma unroll
    for (int r = 0; r < NT; ++r) part[warp][r] = acc[r], part_ss[warp][r] = ss[r];
  }
  __syncthreads();
  if (finisher) {
    const int t = lane;
    float a = 0.0f, s = 0.0f;
    for (int k = 0; k < wpr; ++k) a = __fadd_rn(a, part[warp + k][t]), s = __fadd_rn(s, part_ss[warp + k][t]);
    if (FP8) a = __fmul_rn(a, channel_scale);
    if (post_scale) a = __fmul_rn(a, rsqrtf(s / static_cast<float>(p.in) + p.eps));
    a = scaled_output(p, o, a);
    finish_output(p, t, o, a, taps[warp][t]);
  }
}

template <bool FP8, int NT>
void launch_rows(const FusedGemvLaunch& p, const QuantMatrix& w, int wpr, cudaStream_t stream) {
  const int64_t rows_per_block = kWarps / wpr;
  const auto blocks = static_cast<unsigned>((p.out + rows_per_block - 1) / rows_per_block);
  launch_dependent(quant_fused_gemv_kernel<FP8, NT>, dim3(blocks), dim3(kThreads), stream, p, w, wpr);
}

template <bool FP8>
void launch_chunk(const FusedGemvLaunch& p, const QuantMatrix& w, int wpr, cudaStream_t stream) {
  switch (p.T) {
    case 1: launch_rows<FP8, 1>(p, w, wpr, stream); break;
    case 2: launch_rows<FP8, 2>(p, w, wpr, stream); break;
    case 3: launch_rows<FP8, 3>(p, w, wpr, stream); break;
    case 4: launch_rows<FP8, 4>(p, w, wpr, stream); break;
    case 5: launch_rows<FP8, 5>(p, w, wpr, stream); break;
    case 6: launch_rows<FP8, 6>(p, w, wpr, stream); break;
    case 7: launch_rows<FP8, 7>(p, w, wpr, stream); break;
    default: launch_rows<FP8, 8>(p, w, wpr, stream); break;
  }
}

bool aligned16(const void* ptr) { return reinterpret_cast<uintptr_t>(ptr) % 16 == 0; }

}  // namespace

bool quant_fused_gemv_supported(const FusedGemvLaunch& p, const QuantMatrix& w) {
  if (w.format != WeightFormat::Q8_0 && w.format != WeightFormat::FP8_E4M3) return false;
  if (w.rows != p.out || w.cols != p.in || !w.q || !w.scale) return false;
  if (!fused_gemv_supported(p)) return false;
  if (p.in % (w.format == WeightFormat::Q8_0 ? 32 : kVec) != 0) return false;
  if (!aligned16(w.q) || !aligned16(p.x.data) || p.x.stride % 4 != 0) return false;
  const bool norm = p.norm_w.data != nullptr;
  return !norm || (aligned16(p.norm_w.data) && p.norm_group % kVec == 0);
}

int quant_fused_warps_per_row(int64_t out, int64_t in, int sm_count) {
  // Split rows over more warps until the grid fills every multiprocessor's four resident blocks, keeping >= 2
  // vectors per lane. Only the shape and the GPU decide: the row count never does.
  int wpr = 1;
  const int64_t n_vec = in / kVec;
  while (wpr < kWarps && (out * wpr + kWarps - 1) / kWarps < 4 * int64_t(sm_count) && n_vec >= 64 * wpr) wpr *= 2;
  return wpr;
}

void launch_quant_fused_gemv(const FusedGemvLaunch& p, const QuantMatrix& w, int64_t T, int sm_count,
                             cudaStream_t stream) {
  FusedGemvLaunch chunk = p;
  chunk.T = std::min<int64_t>(T, kFusedMaxRows);
  MAMBACPP_ASSERT(quant_fused_gemv_supported(chunk, w));
  if (T <= 0 || p.out <= 0) return;
  const int wpr = quant_fused_warps_per_row(p.out, p.in, sm_count);
  const bool fp8 = w.format == WeightFormat::FP8_E4M3;
  for (int64_t t0 = 0; t0 < T; t0 += kFusedMaxRows) {
    chunk = p;
    chunk.T = std::min<int64_t>(T - t0, kFusedMaxRows);
    chunk.x.data += t0 * p.x.stride;
    if (chunk.y.data) chunk.y.data += t0 * p.y.stride;
    if (chunk.conv_channels > 0) {
      chunk.conv_out.data += t0 * p.conv_out.stride;
      chunk.seqs += t0;
    }
    if (fp8)
      launch_chunk<true>(chunk, w, wpr, stream);
    else
      launch_chunk<false>(chunk, w, wpr, stream);
  }
}

}  // namespace mambacpp::cuda
