// The decode GEMV with its neighbours folded in (see FusedGemvLaunch in fused_ops.h): an RMSNorm prologue, and a
// one-token conv1d or a residual-add epilogue. A decode block is then three kernels (Mamba-2) instead of eight:
// the norm, the conv and the add no longer cost a launch and a round trip each.
//
// CUDA-core layout (1-2 rows, or f32 weights): 256 threads = 8 warps; `wpr` warps (1, 2, 4 or 8) share one output feature, each taking every wpr-th
// 16-byte vector of its weight row, so that narrow outputs (out_proj) still put enough loads in flight. Partial
// sums meet in shared memory and are added in warp order: the result does not depend on timing (graph replays
// are bit-identical to eager runs). Every kernel here is launched as a programmatic dependent of the previous one
// (cuda_launch.cuh), so a launch and the first weight loads overlap the previous kernel's tail.
#include <algorithm>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/cuda_launch.cuh"
#include "backend/cuda/fused_epilogue.cuh"
#include "backend/cuda/fused_ops.h"
#include "backend/cuda/weight_loads.cuh"
#include "mambacpp/error.h"

namespace mambacpp::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;

// One 16-byte weight vector (input features v*V .. v*V+V-1 of the row) against every row of x: acc += w . x
// (times the group's scale), ss += x . x (only for the one-group norm).
template <class W, int NT>
__device__ __forceinline__ void consume_vector(const FusedGemvLaunch& p, const uint4& raw, int64_t v,
                                               const float* nw, bool per_group, bool post_scale,
                                               const float* group_scale, int64_t n_groups, float (&acc)[NT],
                                               float (&ss)[NT]) {
  constexpr int V = 16 / sizeof(W);
  float wf[V];
  unpack16<W>(raw, wf);
  if (nw) {
#pragma unroll
    for (int q = 0; q < V / 4; ++q) {
      const float4 g = *reinterpret_cast<const float4*>(nw + v * V + 4 * q);
      wf[4 * q] *= g.x, wf[4 * q + 1] *= g.y, wf[4 * q + 2] *= g.z, wf[4 * q + 3] *= g.w;
    }
  }
#pragma unroll
  for (int r = 0; r < NT; ++r) {
    const float4* xp = reinterpret_cast<const float4*>(p.x.data + r * p.x.stride + v * V);
    float dot = 0.0f, sq = 0.0f;
#pragma unroll
    for (int q = 0; q < V / 4; ++q) {
      const float4 xv = xp[q];
      dot += wf[4 * q] * xv.x + wf[4 * q + 1] * xv.y + wf[4 * q + 2] * xv.z + wf[4 * q + 3] * xv.w;
      if (post_scale) sq += xv.x * xv.x + xv.y * xv.y + xv.z * xv.z + xv.w * xv.w;
    }
    if (per_group) dot *= group_scale[r * n_groups + (v * V) / p.norm_group];
    acc[r] += dot;
    ss[r] += sq;
  }
}

constexpr int kPrefetch = 4;  // weight vectors per lane loaded before waiting for the previous kernel

// VEC: 16-byte loads (in % V == 0, aligned rows, and norm groups made of whole vectors; checked by the launcher).
// Launched as a dependent kernel: the first kPrefetch weight vectors of each lane (and the conv epilogue's taps
// and state) are loaded while the previous kernel finishes, everything else after the wait.
// Occupancy: a memory-bound GEMV needs many loads in flight, so registers are capped at 64 for one or two rows
// (4 blocks = 32 warps per SM); more rows keep more accumulators.
template <class W, int NT, bool VEC>
__global__ void __launch_bounds__(kThreads, NT <= 2 ? 4 : 2) fused_gemv_kernel(FusedGemvLaunch p, int wpr) {
  __shared__ float part[kWarps][NT];
  __shared__ float part_ss[kWarps][NT];
  __shared__ float group_scale[NT * kFusedMaxNormGroups];
  allow_next_kernel();
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int64_t o = blockIdx.x * int64_t(kWarps / wpr) + warp / wpr;
  const int seg = warp % wpr;
  const W* wr = static_cast<const W*>(p.w.data) + (o < p.out ? o : 0) * p.in;
  constexpr int V = VEC ? 16 / sizeof(W) : 1;
  const int64_t n_vec = p.in / V;
  const int64_t v0 = seg * 32 + lane, dv = 32 * int64_t(wpr);
  const uint4* wv = reinterpret_cast<const uint4*>(wr);
  // Lane t of a row's first warp finishes row t of output o; its conv taps wait in shared memory (registers
  // are the scarce resource here).
  __shared__ ConvTaps taps[kWarps][NT];
  const bool finisher = o < p.out && seg == 0 && lane < NT;
  if (finisher) taps[warp][lane] = load_conv_taps(p, lane, o);
  uint4 pre[VEC ? kPrefetch : 1];
  if constexpr (VEC) {
#pragma unroll
    for (int k = 0; k < kPrefetch; ++k)
      if (o < p.out && v0 + k * dv < n_vec) pre[k] = __ldg(wv + v0 + k * dv);
  }
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
  if (o < p.out) {
    if constexpr (VEC) {
#pragma unroll
      for (int k = 0; k < kPrefetch; ++k)
        if (v0 + k * dv < n_vec)
          consume_vector<W, NT>(p, pre[k], v0 + k * dv, nw, per_group, post_scale, group_scale, n_groups, acc, ss);
#pragma unroll 4
      for (int64_t v = v0 + kPrefetch * dv; v < n_vec; v += dv)
        consume_vector<W, NT>(p, __ldg(wv + v), v, nw, per_group, post_scale, group_scale, n_groups, acc, ss);
    } else {
      for (int64_t i = v0; i < p.in; i += dv) {
        float wf = w_to_f(wr[i]);
        if (norm) wf *= nw[i];
#pragma unroll
        for (int r = 0; r < NT; ++r) {
          const float xv = p.x.data[r * p.x.stride + i];
          acc[r] += per_group ? wf * xv * group_scale[r * n_groups + i / p.norm_group] : wf * xv;
          if (post_scale) ss[r] += xv * xv;
        }
      }
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
    for (int k = 0; k < wpr; ++k) a += part[warp + k][t], s += part_ss[warp + k][t];
    if (post_scale) a *= rsqrtf(s / static_cast<float>(p.in) + p.eps);
    a = scaled_output(p, o, a);
    finish_output(p, t, o, a, taps[warp][t]);
  }
}

template <class W, int NT>
void launch_rows(const FusedGemvLaunch& p, bool vec, int wpr, cudaStream_t stream) {
  const int64_t rows_per_block = kWarps / wpr;
  const auto blocks = static_cast<unsigned>((p.out + rows_per_block - 1) / rows_per_block);
  if (vec) {
    launch_dependent(fused_gemv_kernel<W, NT, true>, dim3(blocks), dim3(kThreads), stream, p, wpr);
  } else {
    launch_dependent(fused_gemv_kernel<W, NT, false>, dim3(blocks), dim3(kThreads), stream, p, wpr);
  }
}

template <class W>
void launch_typed(const FusedGemvLaunch& p, int sm_count, cudaStream_t stream) {
  constexpr int64_t V = 16 / sizeof(W);
  const bool norm = p.norm_w.data != nullptr;
  const bool vec = p.in % V == 0 && reinterpret_cast<uintptr_t>(p.w.data) % 16 == 0 &&
                   reinterpret_cast<uintptr_t>(p.x.data) % 16 == 0 && (p.T == 1 || p.x.stride % 4 == 0) &&
                   (!norm || (reinterpret_cast<uintptr_t>(p.norm_w.data) % 16 == 0 && p.norm_group % V == 0));
  // Split rows over more warps until the grid covers the GPU twice, keeping >= 2 vectors per lane.
  int wpr = 1;
  const int64_t n_vec = p.in / V;
  while (wpr < kWarps && (p.out * wpr + kWarps - 1) / kWarps < 2 * int64_t(sm_count) && n_vec >= 64 * wpr) wpr *= 2;
  switch (p.T) {
    case 1: launch_rows<W, 1>(p, vec, wpr, stream); break;
    case 2: launch_rows<W, 2>(p, vec, wpr, stream); break;
    case 3: launch_rows<W, 3>(p, vec, wpr, stream); break;
    case 4: launch_rows<W, 4>(p, vec, wpr, stream); break;
    case 5: launch_rows<W, 5>(p, vec, wpr, stream); break;
    case 6: launch_rows<W, 6>(p, vec, wpr, stream); break;
    case 7: launch_rows<W, 7>(p, vec, wpr, stream); break;
    default: launch_rows<W, 8>(p, vec, wpr, stream); break;
  }
}

}  // namespace

bool fused_gemv_supported(const FusedGemvLaunch& p) {
  if (p.T < 1 || p.in < 1 || p.T > kFusedMaxRows) return false;
  if (p.norm_w.data && (p.norm_group <= 0 || p.in % p.norm_group != 0 || p.in / p.norm_group > kFusedMaxNormGroups))
    return false;
  return true;
}

bool uses_tensor_cores(const FusedGemvLaunch& p) {
  const bool sixteen_bit = p.w.dtype == DType::BF16 || p.w.dtype == DType::F16;
  const bool aligned = reinterpret_cast<uintptr_t>(p.w.data) % 16 == 0 && reinterpret_cast<uintptr_t>(p.x.data) % 16 == 0 &&
                       (p.T == 1 || p.x.stride % 4 == 0) &&
                       (!p.norm_w.data || (reinterpret_cast<uintptr_t>(p.norm_w.data) % 16 == 0 && p.norm_group % 8 == 0));
  return p.T >= 3 && sixteen_bit && p.in % 8 == 0 && aligned;
}

void launch_fused_gemv(const FusedGemvLaunch& p, int sm_count, cudaStream_t stream) {
  MAMBACPP_ASSERT(fused_gemv_supported(p));
  if (p.out <= 0) return;
  if (uses_tensor_cores(p)) {
    launch_fused_gemv_mma(p, sm_count, stream);
    return;
  }
  switch (p.w.dtype) {
    case DType::BF16: launch_typed<__nv_bfloat16>(p, sm_count, stream); break;
    case DType::F16: launch_typed<__half>(p, sm_count, stream); break;
    default: launch_typed<float>(p, sm_count, stream); break;
  }
}

}  // namespace mambacpp::cuda
