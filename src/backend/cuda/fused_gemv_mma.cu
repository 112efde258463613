// The fused decode GEMV on the tensor cores, for 3 <= T <= 8 rows and 16-bit weights (FusedGemvLaunch, fused_ops.h).
#include <cstring>
#include <type_traits>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/cuda_launch.cuh"
#include "backend/cuda/fused_epilogue.cuh"
#include "backend/cuda/fused_ops.h"

namespace mambacpp::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;

// ---- Tensor-core path for 3 <= T <= 8 (16-bit weights) ------------------------------------------------------------
// Each warp computes a 16-output x 8*NTILES-row tile (NTILES = 1 is launched, see kFusedMaxRows) with mma.sync
// m16n8k16 and f32 accumulation. Products must stay exact as in the CUDA-core path, so each activation is split as
// x = hi + lo in the weight's 16-bit type (as for the cuBLAS GEMMs, see CudaBackend::linear) and both halves go
// through the tensor cores: y = W.hi + W.lo.
//
// Fragment layout without shuffles: a dot product may visit the input features in any order, so the 16 k-slots
// of one mma are mapped to features so that every thread's slots are contiguous: lane (g = lane / 4, q = lane % 4)
// holds slots {2q, 2q+1, 2q+8, 2q+9} of rows g and g+8 (PTX's A fragment) and of column g (B fragment); for a
// 32-feature step at kk, mma #0 gives those slots features kk + 8q + 0..3 and mma #1 features kk + 8q + 4..7. So a
// lane loads 16 contiguous bytes of weight rows g and g+8 and 8 contiguous activations of row g of each n-tile.
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
    compute_group_scales(p, n_groups, group_scale);
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
    a = scaled_output(p, o, a);
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

}  // namespace

void launch_fused_gemv_mma(const FusedGemvLaunch& p, int sm_count, cudaStream_t stream) {
  if (p.w.dtype == DType::BF16) {
    launch_mma<__nv_bfloat16, 1>(p, sm_count, stream);
  } else {
    launch_mma<__half, 1>(p, sm_count, stream);
  }
}

}  // namespace mambacpp::cuda
