// The decode GEMV with its neighbours folded in (see FusedGemvLaunch in fused_ops.h): an RMSNorm prologue, and a
// one-token conv1d or a residual-add epilogue. A decode block is then three kernels (Mamba-2) instead of eight:
// the norm, the conv and the add no longer cost a launch and a round trip each.
//
// Layout: 256 threads = 8 warps; `wpr` warps (1, 2, 4 or 8) share one output feature, each taking every wpr-th
// 16-byte vector of its weight row, so that narrow outputs (out_proj) still put enough loads in flight. Partial
// sums meet in shared memory and are added in warp order: the result does not depend on timing (graph replays
// are bit-identical to eager runs). Every kernel here is launched as a programmatic dependent of the previous one
// (cuda_launch.cuh), so a launch and the first weight loads overlap the previous kernel's tail.
#include <algorithm>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/cuda_launch.cuh"
#include "backend/cuda/fused_ops.h"
#include "backend/cuda/weight_loads.cuh"
#include "mambacpp/error.h"

namespace mambacpp::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;

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
  if (per_group) {  // one warp per (row, group)
    for (int64_t k = warp; k < NT * n_groups; k += kWarps) {
      const float* xr = p.x.data + (k / n_groups) * p.x.stride + (k % n_groups) * p.norm_group;
      float ss = 0.0f;
      for (int64_t i = lane; i < p.norm_group; i += 32) ss += xr[i] * xr[i];
      ss = warp_sum(ss);
      if (lane == 0) group_scale[k] = rsqrtf(ss / static_cast<float>(p.norm_group) + p.eps);
    }
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
    if (p.bias.data) a += load_f(p.bias.data, p.bias.dtype, o);
    finish_output(p, t, o, a, taps[warp][t]);
  }
}

// ---- Tensor-core path for 3 <= T <= 8 (16-bit weights) ------------------------------------------------------------
// Each warp computes a 16-output x 8*NTILES-row tile (NTILES = 1 is launched, see kFusedMaxRows) with mma.sync m16n8k16 (f32 accumulation). Products must stay
// exact as in the CUDA-core path, so each activation is split as x = hi + lo in the weight's 16-bit type (as for
// the cuBLAS GEMMs, see CudaBackend::linear) and both halves go through the tensor cores: y = W.hi + W.lo.
//
// Fragment layout without shuffles: a dot product may visit the input features in any order, so the 16 k-slots
// of one mma are mapped to features so that every thread's slots are contiguous: lane (g = lane / 4, q = lane % 4)
// holds slots {2q, 2q+1, 2q+8, 2q+9} of rows g and g+8 (PTX's A fragment) and of column g (B fragment); for a
// 32-feature step at kk, mma #0 gives those slots features kk + 8q + 0..3 and mma #1 features kk + 8q + 4..7. So a
// lane loads 16 contiguous bytes of weight rows g and g+8 and 8 contiguous activations of row g of each n-tile.
template <class W>
__device__ __forceinline__ uint32_t pack2(float a, float b) {
  uint32_t u;
  if constexpr (std::is_same_v<W, __nv_bfloat16>) {
    const __nv_bfloat162 h = __floats2bfloat162_rn(a, b);
    memcpy(&u, &h, 4);
  } else {
    const __half2 h = __floats2half2_rn(a, b);
    memcpy(&u, &h, 4);
  }
  return u;
}

template <class W>
__device__ __forceinline__ float round16(float a) {
  if constexpr (std::is_same_v<W, __nv_bfloat16>) {
    return __bfloat162float(__float2bfloat16_rn(a));
  } else {
    return __half2float(__float2half_rn(a));
  }
}

template <class W>
__device__ __forceinline__ void mma16816(float (&c)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                         uint32_t b0, uint32_t b1) {
  if constexpr (std::is_same_v<W, __nv_bfloat16>) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%0,%1,%2,%3};"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
  } else {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%0,%1,%2,%3};"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
  }
}

template <class W, int NTILES>
__global__ void __launch_bounds__(kThreads, 2) fused_gemv_mma_kernel(FusedGemvLaunch p, int wpr) {
  constexpr int NR = 8 * NTILES;  // rows of x a tile covers
  __shared__ float part[kWarps][16][NR];
  __shared__ float part_ss[kWarps][NR];
  __shared__ float group_scale[NR * kFusedMaxNormGroups];
  allow_next_kernel();
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, q = lane & 3;
  const int64_t o0 = (blockIdx.x * int64_t(kWarps / wpr) + warp / wpr) * 16;  // first output of the tile
  const int seg = warp % wpr;
  const int64_t n_steps = (p.in + 31) / 32;
  const W* w_lo = static_cast<const W*>(p.w.data) + (o0 + g < p.out ? o0 + g : 0) * p.in;
  const W* w_hi = static_cast<const W*>(p.w.data) + (o0 + g + 8 < p.out ? o0 + g + 8 : 0) * p.in;
  const bool row_lo = o0 + g < p.out, row_hi = o0 + g + 8 < p.out;
  auto load_w = [&](const W* row, bool ok, int64_t f) {  // 8 weights at feature f (zeros beyond the matrix)
    return ok && f < p.in ? __ldg(reinterpret_cast<const uint4*>(row + f)) : make_uint4(0, 0, 0, 0);
  };
  // The first step's weights are loaded before the wait (weights are never written).
  int64_t step = seg;
  uint4 wa = load_w(w_lo, row_lo, step * 32 + 8 * q), wb = load_w(w_hi, row_hi, step * 32 + 8 * q);
  wait_for_previous_kernel();

  const bool norm = p.norm_w.data != nullptr;
  const bool per_group = norm && p.norm_group != p.in;
  const bool post_scale = norm && !per_group;
  const int64_t n_groups = per_group ? p.in / p.norm_group : 1;
  if (per_group) {
    for (int64_t k = warp; k < p.T * n_groups; k += kWarps) {
      const float* xr = p.x.data + (k / n_groups) * p.x.stride + (k % n_groups) * p.norm_group;
      float ss = 0.0f;
      for (int64_t i = lane; i < p.norm_group; i += 32) ss += xr[i] * xr[i];
      ss = warp_sum(ss);
      if (lane == 0) group_scale[k] = rsqrtf(ss / static_cast<float>(p.norm_group) + p.eps);
    }
    __syncthreads();
  }
  const float* nw = static_cast<const float*>(p.norm_w.data);

  float c[NTILES][4];
  float sq[NTILES];
#pragma unroll
  for (int j = 0; j < NTILES; ++j) c[j][0] = c[j][1] = c[j][2] = c[j][3] = sq[j] = 0.0f;
  const bool tile_live = o0 < p.out;
  for (; tile_live && step < n_steps; step += wpr) {
    const int64_t f = step * 32 + 8 * q;  // this lane's 8 features
    const uint4 a = wa, b = wb;
    if (step + wpr < n_steps) {  // next step's weights in flight during this step's math
      wa = load_w(w_lo, row_lo, f + 32 * wpr);
      wb = load_w(w_hi, row_hi, f + 32 * wpr);
    }
    float scale8[8];
#pragma unroll
    for (int e = 0; e < 8; ++e) scale8[e] = 1.0f;
    if (norm && f < p.in) {
      const float4 n0 = *reinterpret_cast<const float4*>(nw + f), n1 = *reinterpret_cast<const float4*>(nw + f + 4);
      scale8[0] = n0.x, scale8[1] = n0.y, scale8[2] = n0.z, scale8[3] = n0.w;
      scale8[4] = n1.x, scale8[5] = n1.y, scale8[6] = n1.z, scale8[7] = n1.w;
    }
#pragma unroll
    for (int j = 0; j < NTILES; ++j) {
      const int64_t t = 8 * j + g;
      float xv[8];
      if (t < p.T && f < p.in) {
        const float4 x0 = *reinterpret_cast<const float4*>(p.x.data + t * p.x.stride + f);
        const float4 x1 = *reinterpret_cast<const float4*>(p.x.data + t * p.x.stride + f + 4);
        xv[0] = x0.x, xv[1] = x0.y, xv[2] = x0.z, xv[3] = x0.w, xv[4] = x1.x, xv[5] = x1.y, xv[6] = x1.z, xv[7] = x1.w;
      } else {
#pragma unroll
        for (int e = 0; e < 8; ++e) xv[e] = 0.0f;
      }
      const float gs = per_group && t < p.T && f < p.in ? group_scale[t * n_groups + f / p.norm_group] : 1.0f;
      uint32_t hi[4], lo[4];
#pragma unroll
      for (int e = 0; e < 8; e += 2) {
        if (post_scale) sq[j] += xv[e] * xv[e] + xv[e + 1] * xv[e + 1];
        const float u = xv[e] * scale8[e] * gs, v = xv[e + 1] * scale8[e + 1] * gs;
        const float uh = round16<W>(u), vh = round16<W>(v);
        hi[e / 2] = pack2<W>(uh, vh);
        lo[e / 2] = pack2<W>(u - uh, v - vh);
      }
      mma16816<W>(c[j], a.x, b.x, a.y, b.y, hi[0], hi[1]);
      mma16816<W>(c[j], a.x, b.x, a.y, b.y, lo[0], lo[1]);
      mma16816<W>(c[j], a.z, b.z, a.w, b.w, hi[2], hi[3]);
      mma16816<W>(c[j], a.z, b.z, a.w, b.w, lo[2], lo[3]);
    }
  }
  // c[j]: rows g, g+8 of the tile for x rows 8j + 2q, 8j + 2q + 1. Sums of squares: x row 8j + g, over this lane's
  // features; the 4 lanes of a group together cover the warp's features.
#pragma unroll
  for (int j = 0; j < NTILES; ++j) {
    part[warp][g][8 * j + 2 * q] = c[j][0];
    part[warp][g][8 * j + 2 * q + 1] = c[j][1];
    part[warp][g + 8][8 * j + 2 * q] = c[j][2];
    part[warp][g + 8][8 * j + 2 * q + 1] = c[j][3];
    float s = sq[j];
    s += __shfl_xor_sync(0xffffffffu, s, 1);
    s += __shfl_xor_sync(0xffffffffu, s, 2);
    if (q == 0) part_ss[warp][8 * j + g] = s;
  }
  __syncthreads();
  // Every thread of the block finishes some of the block's outputs (the conv epilogue has dependent loads: spread
  // over 256 threads they overlap).
  const int per_tile = 16 * static_cast<int>(p.T), tiles_per_block = kWarps / wpr;
  for (int idx = threadIdx.x; idx < tiles_per_block * per_tile; idx += kThreads) {
    const int tile = idx / per_tile, r = (idx % per_tile) / static_cast<int>(p.T), t = idx % static_cast<int>(p.T);
    const int64_t o = (blockIdx.x * int64_t(tiles_per_block) + tile) * 16 + r;
    if (o >= p.out) continue;
    float a = 0.0f, s = 0.0f;
    for (int k = 0; k < wpr; ++k) a += part[tile * wpr + k][r][t], s += part_ss[tile * wpr + k][t];
    if (post_scale) a *= rsqrtf(s / static_cast<float>(p.in) + p.eps);
    if (p.bias.data) a += load_f(p.bias.data, p.bias.dtype, o);
    finish_output(p, t, o, a, load_conv_taps(p, t, o));
  }
}

template <class W, int NTILES>
void launch_mma(const FusedGemvLaunch& p, int sm_count, cudaStream_t stream) {
  // Split K over more warps until the grid covers the GPU twice, keeping >= 4 steps of 32 features per warp.
  const int64_t tiles = (p.out + 15) / 16, steps = (p.in + 31) / 32;
  int wpr = 1;
  while (wpr < kWarps && (tiles * wpr + kWarps - 1) / kWarps < 2 * int64_t(sm_count) && steps >= 8 * wpr) wpr *= 2;
  const int64_t tiles_per_block = kWarps / wpr;
  const auto blocks = static_cast<unsigned>((tiles + tiles_per_block - 1) / tiles_per_block);
  launch_dependent(fused_gemv_mma_kernel<W, NTILES>, dim3(blocks), dim3(kThreads), stream, p, wpr);
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
    if (p.w.dtype == DType::BF16) {
      launch_mma<__nv_bfloat16, 1>(p, sm_count, stream);
    } else {
      launch_mma<__half, 1>(p, sm_count, stream);
    }
    return;
  }
  switch (p.w.dtype) {
    case DType::BF16: launch_typed<__nv_bfloat16>(p, sm_count, stream); break;
    case DType::F16: launch_typed<__half>(p, sm_count, stream); break;
    default: launch_typed<float>(p, sm_count, stream); break;
  }
}

}  // namespace mambacpp::cuda
