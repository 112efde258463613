// The fast-precision fused linear (FusedGemvLaunch, fused_ops.h) for decode batches of 1 to kFastMaxRows rows, one
// kernel for every row count: y = s_t * (bf16(x_t * norm_w) . W^T) (+ bias), the norm scale s_t applied after the
// dot product (one norm group) or before the rounding (several groups), then the conv / residual epilogue.
//
// Batch invariance by construction: the grid's split of the reduction (`wpr` warps per 16-output tile, each taking
// every wpr-th 32-feature step) is chosen from the weight's shape alone; a row's activations enter the tensor
// cores as the same bf16 values whatever the batch; mma.sync computes each output element from its own row and
// column only; the warps' partials are added in warp order. So row t's outputs are the same bits at every batch
// size and in every position of the batch (tests/gpu/fast_fused_linear_test.cpp, precision_test.cpp).
//
// Layout: 256 threads = 8 warps, each warp a 16-output x (8 * NT)-row tile of mma.sync m16n8k16 products (weights
// as A, activations as B, the fragment mapping of fused_gemv_mma.cu: every lane loads 16 contiguous bytes of two
// weight rows and 8 contiguous activations per row). Larger batches run in chunks of 8 * NT rows, the chunks of one
// output tile in neighbouring blocks so that the weights come from L2 after the first.
// Weights stream through a per-warp ring in shared memory filled by cp.async, kDepth - 1 steps ahead (the first
// ones issued before the dependency wait: weights are never written). Activations are staged once per block, a
// chunk of input features at a time: each row times norm_w (and the group scale), rounded to the weight dtype and
// stored in shared memory, where every warp of the block reads its B fragments; the sums of squares of the
// one-group norm are gathered on the way.
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

template <class W>
__device__ __forceinline__ void mma_16816(float (&c)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                          uint32_t b0, uint32_t b1) {
  if constexpr (std::is_same_v<W, __nv_bfloat16>) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
  } else {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
  }
}

// The rows [base, base + NR) of the batch as a launch of their own (the epilogue helpers index rows from 0).
__device__ __forceinline__ FusedGemvLaunch chunk_of(const FusedGemvLaunch& p, int64_t base, int NR) {
  FusedGemvLaunch q = p;
  q.x.data += base * p.x.stride;
  q.y.data += base * p.y.stride;
  if (p.conv_channels > 0) {
    q.conv_out.data += base * p.conv_out.stride;
    q.seqs += base;
  }
  q.T = p.T - base < NR ? p.T - base : NR;
  return q;
}

// Shape of an instantiation (NT n-tiles of 8 rows per block):
// - kChunk: input features staged per block pass. 512 for one n-tile (fewer passes: the next pass's activation
//   loads must land while this pass's weights stream), 256 above (registers for 4 rows per warp). A lane stages
//   features 8l .. 8l + 7 of every 256, in feature order, whatever the chunk: the norm sums are the same bits.
// - kNO: 16-output tiles per warp. Every block re-reads its rows' activations from L2, as many times as there are
//   blocks across the outputs: with 32 rows and more, each warp takes two tiles (the B fragments reused), halving
//   that traffic. A tile's reduction is the same either way (its warps, steps and order depend on wpr alone).
// - kDepth: steps of weights per warp in the cp.async ring (kDepth - 1 in flight).
template <int NT> constexpr int chunk_features() { return NT == 1 ? 512 : 256; }
template <int NT> constexpr int tiles_per_warp() { return NT >= 4 ? 2 : 1; }
template <int NT> constexpr int ring_depth() { return NT >= 4 ? 4 : 6; }
constexpr int kActPad = 8;  // elements of padding per staged row (16 bytes: fewer bank conflicts)

__device__ __forceinline__ void cp_async16(void* dst, const void* src, bool valid) {
  const unsigned d = static_cast<unsigned>(__cvta_generic_to_shared(dst));
  const int n = valid ? 16 : 0;  // 0: writes 16 zero bytes, reads nothing
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(d), "l"(src), "r"(n) : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
}

// Dynamic shared memory: the weight rings, per warp [kDepth][kNO][2 (rows g, g + 8)][32 lanes] x 16 bytes (after
// the loop the warps' partial sums [warp][kNO][16][NR] floats take their place), then the staged activations
// [NR][kChunk + kActPad] in the weight dtype.
template <int NT>
constexpr size_t ring_bytes() {
  const size_t ring = size_t(kWarps) * ring_depth<NT>() * tiles_per_warp<NT>() * 2 * 32 * 16;
  const size_t part = size_t(kWarps) * tiles_per_warp<NT>() * 16 * 8 * NT * 4;
  return ring > part ? ring : part;
}
// Batches of up to 8 rows whose rows fit in kFullRowBytes are staged whole, once (no passes, no barriers in the
// main loop); larger ones in passes of kChunk features. Both compute the same values (see the staging below).
constexpr size_t kFullRowBytes = 24 * 1024;
template <int NT>
constexpr size_t act_bytes() {
  const size_t chunked = size_t(8 * NT) * (chunk_features<NT>() + kActPad) * 2;
  return NT == 1 && kFullRowBytes > chunked ? kFullRowBytes : chunked;
}
template <int NT>
constexpr size_t fast_smem_bytes() {
  return ring_bytes<NT>() + act_bytes<NT>();
}
bool full_rows(int64_t T, int64_t in) { return T <= 8 && size_t(T * (in + kActPad) * 2) <= kFullRowBytes; }

template <class W, int NT>
__global__ void __launch_bounds__(kThreads, NT == 1 ? 3 : 2)
    fast_gemv_kernel(FusedGemvLaunch p, int wpr, int n_chunks, bool whole_rows) {
  constexpr int NR = 8 * NT;  // rows a block covers
  constexpr int kChunk = chunk_features<NT>(), kSub = kChunk / 256, kNO = tiles_per_warp<NT>();
  constexpr int kDepth = ring_depth<NT>(), kSlot = kNO * 2 * 32;  // uint4s per ring slot of a warp
  extern __shared__ uint4 smem[];
  W* act = reinterpret_cast<W*>(smem + ring_bytes<NT>() / 16);  // [NR][kChunk + kActPad] or [T][in + kActPad]
  __shared__ float row_ss[NR];
  __shared__ float group_scale[NR * kFusedMaxNormGroups];
  allow_next_kernel();
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, q = lane & 3;
  const int tiles_per_block = kWarps / wpr * kNO;
  const int64_t tile_block = blockIdx.x / n_chunks, chunk = blockIdx.x % n_chunks;
  const FusedGemvLaunch c = chunk_of(p, chunk * NR, NR);
  // This warp's tiles: kNO consecutive ones from o0; its steps seg, seg + wpr, ... (n_mine of them).
  const int64_t o0 = (tile_block * tiles_per_block + (warp / wpr) * kNO) * 16;
  const int seg = warp % wpr;
  const int64_t n_steps = (p.in + 31) / 32;
  const int n_mine = o0 < p.out && seg < n_steps ? static_cast<int>((n_steps - seg + wpr - 1) / wpr) : 0;
  const W* w0p = static_cast<const W*>(p.w.data);
  const W* w_lane = w0p + (o0 + g) * p.in;  // this lane's first weight row (read only where it exists)
  uint4* my_ring = smem + warp * (kDepth * kSlot) + lane;
  auto issue = [&](int k) {  // step k's weights into ring slot k % kDepth (zeros past the end)
    const int64_t f = (seg + int64_t(k) * wpr) * 32 + 8 * q;
    const bool ok = k < n_mine && f < p.in;
    uint4* slot = my_ring + (k % kDepth) * kSlot;
#pragma unroll
    for (int n = 0; n < kNO; ++n)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const bool v = ok && o0 + 16 * n + 8 * h + g < p.out;
        cp_async16(slot + (2 * n + h) * 32, v ? w_lane + (16 * n + 8 * h) * p.in + f : w0p, v);
      }
    cp_async_commit();
  };
#pragma unroll
  for (int d = 0; d < kDepth - 1; ++d) issue(d);
  wait_for_previous_kernel();

  const bool norm = p.norm_w.data != nullptr;
  const bool per_group = norm && p.norm_group != p.in;
  const bool post_scale = norm && !per_group;
  const int64_t n_groups = per_group ? p.in / p.norm_group : 1;
  if (per_group) {
    compute_group_scales(c, n_groups, group_scale);
    __syncthreads();
  }
  const float* nw = static_cast<const float*>(p.norm_w.data);

  // Staging: warp w stages rows w, w + 8, ...; lane l features 8l .. 8l + 7 of each 256 of the chunk. The next
  // chunk's rows are loaded into registers before this chunk's products, so their latency overlaps the math.
  float xr[NT][kSub][8], ss[NT];
  auto load_chunk = [&](int64_t kc) {
#pragma unroll
    for (int u = 0; u < kSub; ++u) {
      const int64_t f = kc * kChunk + 256 * u + 8 * lane;
#pragma unroll
      for (int rr = 0; rr < NT; ++rr) {
        const int t = warp + 8 * rr;
        if (t < c.T && f < p.in) {
          const float4 x0 = *reinterpret_cast<const float4*>(c.x.data + t * c.x.stride + f);
          const float4 x1 = *reinterpret_cast<const float4*>(c.x.data + t * c.x.stride + f + 4);
          xr[rr][u][0] = x0.x, xr[rr][u][1] = x0.y, xr[rr][u][2] = x0.z, xr[rr][u][3] = x0.w;
          xr[rr][u][4] = x1.x, xr[rr][u][5] = x1.y, xr[rr][u][6] = x1.z, xr[rr][u][7] = x1.w;
        } else {
#pragma unroll
          for (int e = 0; e < 8; ++e) xr[rr][u][e] = 0.0f;
        }
      }
    }
  };
  auto store_chunk = [&](int64_t kc) {
#pragma unroll
    for (int u = 0; u < kSub; ++u) {
      const int64_t f = kc * kChunk + 256 * u + 8 * lane;
      float n8[8];
#pragma unroll
      for (int e = 0; e < 8; ++e) n8[e] = 1.0f;
      if (norm && f < p.in) {
        const float4 n0 = *reinterpret_cast<const float4*>(nw + f), n1 = *reinterpret_cast<const float4*>(nw + f + 4);
        n8[0] = n0.x, n8[1] = n0.y, n8[2] = n0.z, n8[3] = n0.w, n8[4] = n1.x, n8[5] = n1.y, n8[6] = n1.z, n8[7] = n1.w;
      }
#pragma unroll
      for (int rr = 0; rr < NT; ++rr) {
        const int t = warp + 8 * rr;
        const float gs = per_group && t < c.T && f < p.in ? group_scale[t * n_groups + f / p.norm_group] : 1.0f;
        const float* xv = xr[rr][u];
        uint32_t h[4];
#pragma unroll
        for (int e = 0; e < 8; e += 2) {
          // Explicit roundings: the same operations whatever the instantiation (no contraction choices).
          if (post_scale) ss[rr] = __fmaf_rn(xv[e + 1], xv[e + 1], __fmaf_rn(xv[e], xv[e], ss[rr]));
          float a = __fmul_rn(xv[e], n8[e]), b = __fmul_rn(xv[e + 1], n8[e + 1]);
          if (per_group) a = __fmul_rn(a, gs), b = __fmul_rn(b, gs);
          h[e / 2] = pack2<W>(a, b);
        }
        *reinterpret_cast<uint4*>(act + t * (kChunk + kActPad) + 256 * u + 8 * lane) =
            make_uint4(h[0], h[1], h[2], h[3]);
      }
    }
  };

  float acc[kNO][NT][4];
#pragma unroll
  for (int j = 0; j < NT; ++j) {
    ss[j] = 0.0f;
#pragma unroll
    for (int n = 0; n < kNO; ++n) acc[n][j][0] = acc[n][j][1] = acc[n][j][2] = acc[n][j][3] = 0.0f;
  }
  const int64_t n_kchunks = whole_rows ? 0 : (p.in + kChunk - 1) / kChunk;
  const int steps_per_chunk = kChunk / 32 / wpr;  // this warp's steps in each chunk
  int k = 0;  // this warp's next step
  if (whole_rows) {
    // Every row whole: thread i stages 8-feature groups i, i + 256, ... (4 loaded before any is converted), the same
    // values store_chunk computes; row t's sum of squares by warp t, lane l over features 8l .. 8l + 7 of every
    // 256 in feature order, with store_chunk's operations (a skipped group adds what its zeros would: nothing).
    const int64_t n_vec = p.in / 8, lda = p.in + kActPad;
    for (int64_t i0 = threadIdx.x; i0 < c.T * n_vec; i0 += 4 * kThreads) {
      float xv[4][8];
#pragma unroll
      for (int b = 0; b < 4; ++b) {
        const int64_t item = i0 + int64_t(b) * kThreads;
        if (item < c.T * n_vec) {
          const float* src = c.x.data + (item / n_vec) * c.x.stride + (item % n_vec) * 8;
          const float4 x0 = *reinterpret_cast<const float4*>(src), x1 = *reinterpret_cast<const float4*>(src + 4);
          xv[b][0] = x0.x, xv[b][1] = x0.y, xv[b][2] = x0.z, xv[b][3] = x0.w;
          xv[b][4] = x1.x, xv[b][5] = x1.y, xv[b][6] = x1.z, xv[b][7] = x1.w;
        }
      }
#pragma unroll
      for (int b = 0; b < 4; ++b) {
        const int64_t item = i0 + int64_t(b) * kThreads;
        if (item >= c.T * n_vec) continue;
        const int64_t t = item / n_vec, f = (item % n_vec) * 8;
        float n8[8];
#pragma unroll
        for (int e = 0; e < 8; ++e) n8[e] = 1.0f;
        if (norm) {
          const float4 n0 = *reinterpret_cast<const float4*>(nw + f), n1 = *reinterpret_cast<const float4*>(nw + f + 4);
          n8[0] = n0.x, n8[1] = n0.y, n8[2] = n0.z, n8[3] = n0.w, n8[4] = n1.x, n8[5] = n1.y, n8[6] = n1.z, n8[7] = n1.w;
        }
        const float gs = per_group ? group_scale[t * n_groups + f / p.norm_group] : 1.0f;
        uint32_t h[4];
#pragma unroll
        for (int e = 0; e < 8; e += 2) {
          float a = __fmul_rn(xv[b][e], n8[e]), v = __fmul_rn(xv[b][e + 1], n8[e + 1]);
          if (per_group) a = __fmul_rn(a, gs), v = __fmul_rn(v, gs);
          h[e / 2] = pack2<W>(a, v);
        }
        *reinterpret_cast<uint4*>(act + t * lda + f) = make_uint4(h[0], h[1], h[2], h[3]);
      }
    }
    if (post_scale && warp < c.T) {
      const float* xr0 = c.x.data + warp * c.x.stride;
      float s = 0.0f;
      for (int64_t f = 8 * lane; f < p.in; f += 256) {
        const float4 x0 = *reinterpret_cast<const float4*>(xr0 + f), x1 = *reinterpret_cast<const float4*>(xr0 + f + 4);
        const float xv[8] = {x0.x, x0.y, x0.z, x0.w, x1.x, x1.y, x1.z, x1.w};
#pragma unroll
        for (int e = 0; e < 8; e += 2) s = __fmaf_rn(xv[e + 1], xv[e + 1], __fmaf_rn(xv[e], xv[e], s));
      }
#pragma unroll
      for (int off = 16; off > 0; off >>= 1) s = __fadd_rn(s, __shfl_xor_sync(0xffffffffu, s, off));
      if (lane == 0) row_ss[warp] = s;
    }
    __syncthreads();
    for (; k < n_mine; ++k) {
      issue(k + kDepth - 1);
      cp_async_wait<kDepth - 1>();
      const uint4* slot = my_ring + (k % kDepth) * kSlot;
      const uint4 wa = slot[0], wb = slot[32];
      const int64_t f = (seg + int64_t(k) * wpr) * 32 + 8 * q;
      const uint4 xv = g < c.T && f < p.in ? *reinterpret_cast<const uint4*>(act + g * lda + f) : make_uint4(0, 0, 0, 0);
      mma_16816<W>(acc[0][0], wa.x, wb.x, wa.y, wb.y, xv.x, xv.y);
      mma_16816<W>(acc[0][0], wa.z, wb.z, wa.w, wb.w, xv.z, xv.w);
    }
  } else {
    load_chunk(0);
  }
  for (int64_t kc = 0; kc < n_kchunks; ++kc) {
    store_chunk(kc);
    __syncthreads();
    if (kc + 1 < n_kchunks) load_chunk(kc + 1);
    for (int i = 0; i < steps_per_chunk && k < n_mine; ++i, ++k) {
      issue(k + kDepth - 1);
      cp_async_wait<kDepth - 1>();  // step k's weights have landed (this lane's own copies)
      const uint4* slot = my_ring + (k % kDepth) * kSlot;
      uint4 wa[kNO], wb[kNO];
#pragma unroll
      for (int n = 0; n < kNO; ++n) wa[n] = slot[64 * n], wb[n] = slot[64 * n + 32];
      const int col = (seg + i * wpr) * 32 + 8 * q;  // within the chunk
#pragma unroll
      for (int j = 0; j < NT; ++j) {
        const uint4 xv = *reinterpret_cast<const uint4*>(act + (8 * j + g) * (kChunk + kActPad) + col);
#pragma unroll
        for (int n = 0; n < kNO; ++n) {
          mma_16816<W>(acc[n][j], wa[n].x, wb[n].x, wa[n].y, wb[n].y, xv.x, xv.y);
          mma_16816<W>(acc[n][j], wa[n].z, wb[n].z, wa[n].w, wb[n].w, xv.z, xv.w);
        }
      }
    }
    __syncthreads();  // the chunk's activations are read before the next chunk overwrites them
  }
  asm volatile("cp.async.wait_all;" ::: "memory");
  __syncthreads();  // every warp's ring is idle: the partial sums take its place
  float* part = reinterpret_cast<float*>(smem);  // [warp][kNO][16][NR]
  auto part_at = [&](int w, int n, int r, int t) -> float& { return part[((w * kNO + n) * 16 + r) * NR + t]; };
  // acc[n][j]: outputs g, g+8 of tile n for rows 8j + 2q, 8j + 2q + 1. ss[rr]: row warp + 8rr over this lane's
  // features, visited in feature order whatever the batch; the lanes' partials then meet in a fixed tree.
#pragma unroll
  for (int j = 0; j < NT; ++j) {
#pragma unroll
    for (int n = 0; n < kNO; ++n) {
      part_at(warp, n, g, 8 * j + 2 * q) = acc[n][j][0];
      part_at(warp, n, g, 8 * j + 2 * q + 1) = acc[n][j][1];
      part_at(warp, n, g + 8, 8 * j + 2 * q) = acc[n][j][2];
      part_at(warp, n, g + 8, 8 * j + 2 * q + 1) = acc[n][j][3];
    }
    if (!whole_rows) {
      float s = ss[j];
#pragma unroll
      for (int off = 16; off > 0; off >>= 1) s = __fadd_rn(s, __shfl_xor_sync(0xffffffffu, s, off));
      if (lane == 0) row_ss[warp + 8 * j] = s;
    }
  }
  __syncthreads();
  const int T = static_cast<int>(c.T), per_tile = 16 * T;
  for (int idx = threadIdx.x; idx < tiles_per_block * per_tile; idx += kThreads) {
    const int tile = idx / per_tile, r = (idx % per_tile) / T, t = idx % T;
    const int64_t o = (tile_block * tiles_per_block + tile) * 16 + r;
    if (o >= p.out) continue;
    const int w0 = (tile / kNO) * wpr, n = tile % kNO;  // the tile's warps are w0 .. w0 + wpr - 1
    float a = 0.0f;
    for (int kk = 0; kk < wpr; ++kk) a = __fadd_rn(a, part_at(w0 + kk, n, r, t));
    if (post_scale) a = __fmul_rn(a, rsqrtf(__fadd_rn(__fdiv_rn(row_ss[t], static_cast<float>(p.in)), p.eps)));
    if (p.bias.data) a = __fadd_rn(a, load_f(p.bias.data, p.bias.dtype, o));
    finish_output(c, t, o, a, load_conv_taps(c, t, o));
  }
}

// K split: more warps per tile until the grid covers the GPU twice, keeping >= 2 steps of 32 features per warp.
// From the weight's shape only (never the row count): the reduction order of an output must not depend on it.
int fast_wpr(const FusedGemvLaunch& p, int sm_count) {
  const int64_t tiles = (p.out + 15) / 16, steps = (p.in + 31) / 32;
  int wpr = 1;
  while (wpr < kWarps && (tiles * wpr + kWarps - 1) / kWarps < 2 * int64_t(sm_count) && steps >= 2 * wpr) wpr *= 2;
  return wpr;
}

template <class W, int NT>
void launch_nt(const FusedGemvLaunch& p, int wpr, cudaStream_t stream) {
  const int64_t tiles = (p.out + 15) / 16, tiles_per_block = kWarps / wpr * tiles_per_warp<NT>();
  const int64_t n_chunks = (p.T + 8 * NT - 1) / (8 * NT);
  const auto blocks = static_cast<unsigned>((tiles + tiles_per_block - 1) / tiles_per_block * n_chunks);
  constexpr size_t smem = fast_smem_bytes<NT>();  // allowed by init_fast_gemv
  const bool whole = NT == 1 && full_rows(p.T, p.in);
  launch_dependent_smem(fast_gemv_kernel<W, NT>, dim3(blocks), dim3(kThreads), smem, stream, p, wpr,
                        static_cast<int>(n_chunks), whole);
}

// More than the default 48 KB of dynamic shared memory, set once before any launch (never inside a graph capture).
template <class W, int NT>
void allow_smem() {
  MAMBACPP_CUDA_CHECK(cudaFuncSetAttribute(fast_gemv_kernel<W, NT>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                           static_cast<int>(fast_smem_bytes<NT>())));
}

template <class W>
void launch_typed(const FusedGemvLaunch& p, int wpr, cudaStream_t stream) {
  if (p.T <= 8) {
    launch_nt<W, 1>(p, wpr, stream);
  } else if (p.T <= 16) {
    launch_nt<W, 2>(p, wpr, stream);
  } else {
    launch_nt<W, 4>(p, wpr, stream);
  }
}

bool aligned16(const void* ptr) { return reinterpret_cast<uintptr_t>(ptr) % 16 == 0; }

}  // namespace

bool fast_gemv_supported(const FusedGemvLaunch& p) {
  if (p.T < 1 || p.T > kFastMaxRows || p.in < 1) return false;
  if (p.w.dtype != DType::BF16 && p.w.dtype != DType::F16) return false;
  // 8 features per lane and step: 16-byte weight, activation and norm-weight loads.
  if (p.in % 8 != 0 || !aligned16(p.w.data) || !aligned16(p.x.data) || p.x.stride % 4 != 0) return false;
  if (p.norm_w.data) {
    if (!aligned16(p.norm_w.data) || p.norm_group <= 0 || p.norm_group % 8 != 0 || p.in % p.norm_group != 0 ||
        p.in / p.norm_group > kFusedMaxNormGroups)
      return false;
  }
  return true;
}

void init_fast_gemv() {
  allow_smem<__nv_bfloat16, 1>(), allow_smem<__nv_bfloat16, 2>(), allow_smem<__nv_bfloat16, 4>();
  allow_smem<__half, 1>(), allow_smem<__half, 2>(), allow_smem<__half, 4>();
}

void launch_fast_gemv(const FusedGemvLaunch& p, int sm_count, cudaStream_t stream) {
  MAMBACPP_ASSERT(fast_gemv_supported(p));
  if (p.out <= 0) return;
  const int wpr = fast_wpr(p, sm_count);
  if (p.w.dtype == DType::BF16) {
    launch_typed<__nv_bfloat16>(p, wpr, stream);
  } else {
    launch_typed<__half>(p, wpr, stream);
  }
}

}  // namespace mambacpp::cuda
