// Fast-precision chunk output of the Mamba-2 SSD (see mamba2_ssd.cu for the algorithm, mamba2_ssd_tc.cu for the
// exact hi/lo version of the same product structure):
//   y_i = exp(S_i) C_i . H_in^T  +  sum_{j<=i} [exp(S_i - S_j) dt_j (C_i . B_j)] x_j  +  D x_i
// with every matrix operand in bf16 and one tensor-core product (mma.sync m16n8k16, f32 accumulation), as
// mamba_ssm's kernels compute. Operands come from bf16 copies made once per call (by conv1d itself when the backend
// fuses it, Mamba2Launch::inputs_bf16, else ssd_round_inputs_kernel; the state pass writes the entering states'
// copy), so every tile is a plain 16-byte asynchronous copy (cp.async) into shared
// memory, and the next source tile's copy runs while the current one is multiplied (two buffers). The exact kernel
// stages f32 tiles synchronously, splitting each element as it goes: ~23 dependent global round trips per block.
//
// Chunk state likewise, from the same bf16 copies (x times w_j rounded once more in registers).
//
// Error model (fast mode): x, B, C, H_in and the scaled scores are each rounded once to bf16 (relative 2^-9); a
// term of y carries at most three such roundings (C.B^T, the score, x; or C, H_in; D x one) and y is stored rounded
// once more (bf16, as mamba_ssm keeps its activations), a chunk's state three (x, x w, B) -> <= ~4 * 2^-9 = 8e-3 of
// its magnitude, and far less in the max-norm of y, since the rounding errors of
// the 64..256 terms of each dot product are independent (tests/gpu/ssd_test.cpp states the bound it checks). The
// decays are exp2 of f32 sums of the log2-scaled cumulative sums (SsdScratch::cum2, w2; S summed in f64 first): an
// absolute error of ~|S| 2^-23 in the exponent, < 1e-4 relative for |S| < 800, far below one bf16 rounding.
#include <cuda_bf16.h>

#include <algorithm>
#include <mutex>
#include <type_traits>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/cuda_launch.cuh"
#include "backend/cuda/mamba2_ssd_common.cuh"
#include "backend/cuda/mamba2_ssd_tc.h"
#include "backend/cuda/mma_bf16x3.cuh"

namespace mambacpp::cuda {
namespace {

constexpr int kThreads = 128;     // 4 warps x 16 rows = one 64-row tile
constexpr int kT = kSsdFastTile;  // rows i, sources j, columns p per tile
// A score tile: kT x kT floats in the output kernel's accumulator layout (below).
constexpr int kScoreTileFloats = kT * kT;
constexpr int kXPitch = kT + 8;  // bf16 pitch of the X tile: 144 bytes, 8 rows of an ldmatrix hit distinct banks

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// 16 bytes global -> shared, zero-filled when !valid (src then is any mapped address: nothing is read).
__device__ __forceinline__ void cp_async16(void* dst, const void* src, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_addr(dst)), "l"(src),
               "r"(valid ? 16 : 0)
               : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

// Four 8 x 8 bf16 matrices from shared memory (lanes 8 m .. 8 m + 7 give matrix m's row addresses; matrix m lands
// in d[m]), as stored or transposed.
__device__ __forceinline__ void ldmatrix_x4(const __nv_bfloat16* row, uint32_t& d0, uint32_t& d1, uint32_t& d2,
                                            uint32_t& d3) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(d0), "=r"(d1), "=r"(d2), "=r"(d3)
               : "r"(smem_addr(row)));
}
__device__ __forceinline__ void ldmatrix_x4_trans(const __nv_bfloat16* row, uint32_t& d0, uint32_t& d1,
                                                  uint32_t& d2, uint32_t& d3) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(d0), "=r"(d1), "=r"(d2), "=r"(d3)
               : "r"(smem_addr(row)));
}

// B fragments of two neighbouring 8-column tiles from a row-major [k][n] bf16 tile (rows k0..k0+15, columns
// n0..n0+15): the transposing matrix load gives each lane (k 2q, 2q+1; n g) as the "col" operand wants.
__device__ __forceinline__ void ldmatrix_b_trans(const __nv_bfloat16* tile, int pitch, int k0, int n0, int lane,
                                                 uint32_t (&b0)[2], uint32_t (&b1)[2]) {
  const int m = lane >> 3, r = lane & 7;
  ldmatrix_x4_trans(tile + (k0 + r + 8 * (m & 1)) * pitch + n0 + 8 * (m >> 1), b0[0], b0[1], b1[0], b1[1]);
}

// The A fragment of rows [r0, r0 + 16), columns [k0, k0 + 16) of a row-major bf16 tile, and the B fragments of the
// neighbouring 8-column tiles n0.. and n0 + 8.. over k [k0, k0 + 16) of a tile stored [n][k], each by one matrix
// load. Four 4-byte loads per fragment took four times the instructions; the same elements land in the same
// registers (layouts: mma_bf16x3.cuh; pitch N + 8 keeps the eight rows of a matrix on distinct banks).
__device__ __forceinline__ void ldmatrix_a(const __nv_bfloat16* t, int pitch, int r0, int k0, int lane,
                                           uint32_t (&a)[4]) {
  ldmatrix_x4(t + (r0 + (lane & 7) + 8 * ((lane >> 3) & 1)) * pitch + k0 + 8 * (lane >> 4), a[0], a[1], a[2], a[3]);
}
__device__ __forceinline__ void ldmatrix_b_pair(const __nv_bfloat16* t, int pitch, int n0, int k0, int lane,
                                                uint32_t (&b0)[2], uint32_t (&b1)[2]) {
  ldmatrix_x4(t + (n0 + (lane & 7) + 8 * (lane >> 4)) * pitch + k0 + 8 * ((lane >> 3) & 1), b0[0], b0[1], b1[0],
              b1[1]);
}

// kT rows x (width bf16) tile from global rows (stride in elements) into shared (pitch in elements) by a block of
// Threads threads; rows >= valid zero-filled. width a multiple of 8 (16-byte pieces). Where the threads cover whole
// rows (Threads a multiple of width / 8: d_state and head_dim powers of two, as in the models we run), a thread
// copies one piece of every dr-th row through two pointers that step by fixed amounts, ~6 instructions per copy (a
// per-piece row and column with a carry, and the 64-bit product of row and stride, took ~30); else its (row, piece)
// advances by a fixed step with one carry.
template <int Threads = kThreads>
__device__ __forceinline__ void copy_tile(__nv_bfloat16* dst, int pitch, const uint16_t* src, int64_t stride,
                                          int valid_rows, int width, int thread = -1) {
  if (thread < 0) thread = static_cast<int>(threadIdx.x);  // else: the caller's index among Threads copying threads
  const int per_row = width / 8;
  const int dr = Threads / per_row, dc = Threads % per_row;
  int r = thread / per_row, c = thread % per_row;
  if (dc == 0) {
    const uint16_t* s = src + r * stride + 8 * c;
    __nv_bfloat16* d = dst + r * pitch + 8 * c;
    const int64_t s_step = dr * stride;
    const int d_step = dr * pitch;
    if (valid_rows >= kT) {
      for (; r < kT; r += dr, s += s_step, d += d_step) cp_async16(d, s, true);
    } else {
      for (; r < kT; r += dr, s += s_step, d += d_step) cp_async16(d, r < valid_rows ? s : src, r < valid_rows);
    }
    return;
  }
  while (r < kT) {
    const bool ok = r < valid_rows;
    cp_async16(dst + r * pitch + 8 * c, ok ? src + r * stride + 8 * c : src, ok);
    r += dr;
    c += dc;
    if (c >= per_row) {
      c -= per_row;
      ++r;
    }
  }
}

// n elements of 4 or 8 bytes, strided in global memory, into consecutive shared entries; i >= valid zero-filled.
template <class E, int Threads = kThreads>
__device__ __forceinline__ void copy_column(E* dst, const E* src, int64_t stride, int n, int valid) {
  static_assert(sizeof(E) == 4 || sizeof(E) == 8, "cp.async.ca copies 4 or 8 bytes");
  for (int i = threadIdx.x; i < n; i += Threads) {
    const bool ok = i < valid;
    asm volatile("cp.async.ca.shared.global [%0], [%1], %2, %3;\n" ::"r"(smem_addr(dst + i)),
                 "l"(ok ? src + i * stride : src), "n"(sizeof(E)), "r"(ok ? int(sizeof(E)) : 0)
                 : "memory");
  }
}

// s[nt] (nt < NT) = C rows of this warp . B rows 8 nt .. 8 nt + 7 of the source tile, over d_state N. NT is a
// compile-time count so that the loads and products are straight-line code (a run-time bound made every load and
// product its own branch, serialising them).
template <int NT>
__device__ __forceinline__ void scores(float (&s)[8][4], const __nv_bfloat16* cs, const __nv_bfloat16* kt, int pitch,
                                       int N, int warp, int lane) {
  static_assert(NT % 2 == 0, "B fragments load in pairs of column tiles");
#pragma unroll 2
  for (int k0 = 0; k0 < N; k0 += 16) {
    uint32_t a[4], bf[NT][2];
    ldmatrix_a(cs, pitch, 16 * warp, k0, lane, a);
#pragma unroll
    for (int nt = 0; nt < NT; nt += 2) ldmatrix_b_pair(kt, pitch, 8 * nt, k0, lane, bf[nt], bf[nt + 1]);
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) mma_bf16(s[nt], a, bf[nt]);
  }
}

// ---- bf16 copies of x, B and C ----------------------------------------------------------------------------------
// grid (T, 3): y = 0 x, 1 B, 2 C; 8 elements per thread, 16-byte loads where the rows allow (vec).
__global__ void __launch_bounds__(256) ssd_round_inputs_kernel(Mamba2Launch p, SsdScratch sc, bool vec) {
  enter_dependent();
  const int64_t t = blockIdx.x;
  const int which = blockIdx.y;
  const ConstF32Rows& in = which == 0 ? p.x : which == 1 ? p.B : p.C;
  const int64_t width = which == 0 ? p.n_heads * p.head_dim : p.n_groups * p.d_state;
  uint16_t* out = (which == 0 ? sc.x16 : which == 1 ? sc.B16 : sc.C16) + t * width;
  const float* row = in.data + t * in.stride;
  for (int64_t c = 8 * int64_t(threadIdx.x); c < width; c += 8 * 256) {
    float v[8];
    if (vec && c + 8 <= width) {
      const float4 a = *reinterpret_cast<const float4*>(row + c), b = *reinterpret_cast<const float4*>(row + c + 4);
      v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w, v[4] = b.x, v[5] = b.y, v[6] = b.z, v[7] = b.w;
    } else {
#pragma unroll
      for (int k = 0; k < 8; ++k) v[k] = c + k < width ? row[c + k] : 0.0f;
    }
    if (vec && c + 8 <= width) {
      uint4 o;
      o.x = pack2<__nv_bfloat16>(v[0], v[1]);
      o.y = pack2<__nv_bfloat16>(v[2], v[3]);
      o.z = pack2<__nv_bfloat16>(v[4], v[5]);
      o.w = pack2<__nv_bfloat16>(v[6], v[7]);
      *reinterpret_cast<uint4*>(out + c) = o;
    } else {
      for (int k = 0; k < 8 && c + k < width; ++k) out[c + k] = __bfloat16_as_ushort(__float2bfloat16_rn(v[k]));
    }
  }
}

// ---- chunk scores: grid (n_chunks, n_groups, tiles_i * tiles_i) --------------------------------------------------
// s_ij = C_i . B_j over d_state for the tiles jt <= it of each chunk, once per group: every head of the group scales
// the same scores by its own decays (the output kernel), so computing them there redid this product n_heads /
// n_groups times. Same products in the same order as the output kernel's warps would do them (scores<8>), written
// f32 in their accumulator layout: float4 nt of thread tid (rows 16 w + g and + 8, columns 8 nt + 2 q, + 1) at
// float4 index nt * kThreads + tid, so each output-kernel thread loads its own accumulators, coalesced across the
// block.
size_t fast_scores_smem_bytes(int64_t N) {
  return static_cast<size_t>(2 * kT * (N + 8)) * sizeof(__nv_bfloat16);
}

__global__ void __launch_bounds__(kThreads) ssd_chunk_scores_fast_kernel(Mamba2Launch p, const SsdChunk* chunks,
                                                                         SsdScratch sc, int tiles) {
  extern __shared__ __align__(16) unsigned char smem_raw[];
  enter_dependent();
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const SsdChunk ch = chunks[blockIdx.x];
  const int64_t g = blockIdx.y, G = p.n_groups;
  const int it = static_cast<int>(blockIdx.z) / tiles, jt = static_cast<int>(blockIdx.z) % tiles;
  const int i0 = it * kT, j0 = jt * kT;
  if (jt > it || i0 >= ch.len) return;  // block-uniform
  if (ch.single_token) return;  // single-token sequences take the step kernel (no score tiles)
  const int N = static_cast<int>(p.d_state);
  const int64_t GN = G * N;
  const int pitch = N + 8;
  auto* cs = reinterpret_cast<__nv_bfloat16*>(smem_raw);
  __nv_bfloat16* bs = cs + kT * pitch;
  copy_tile(cs, pitch, sc.C16 + (ch.start + i0) * GN + g * N, GN, min(kT, ch.len - i0), N);
  copy_tile(bs, pitch, sc.B16 + (ch.start + j0) * GN + g * N, GN, min(kT, ch.len - j0), N);
  cp_async_commit();
  cp_async_wait<0>();
  __syncthreads();
  float s[8][4] = {};
  scores<8>(s, cs, bs, pitch, N, warp, lane);
  const int64_t tile = int64_t(ch.score_tile) + it * (it + 1) / 2 + jt;
  float4* out = reinterpret_cast<float4*>(sc.scores + (tile * G + g) * kScoreTileFloats);
#pragma unroll
  for (int nt = 0; nt < 8; ++nt) out[nt * kThreads + tid] = make_float4(s[nt][0], s[nt][1], s[nt][2], s[nt][3]);
}

// ---- chunk output, the pieces both kernels below share -----------------------------------------------------------
// A warp owns 16 rows i of a 64-row output tile: rows r0 = 16 warp + g and r1 = r0 + 8 (g = lane / 4), and in acc[nt]
// their columns p 8 nt + 2 q, + 1 (q = lane % 4), mma's accumulator layout. cum0, cum1: cum2 of rows r0, r1.
// Both kernels run the same products in the same order on the same operands: they give the same bits.

// Carried-in term: acc[i][p] = exp(S_i) * sum_n C_i[n] H_in[p, n].
__device__ __forceinline__ void carried_in(float (&acc)[8][4], const __nv_bfloat16* cs, const __nv_bfloat16* hs,
                                           int pitch, int N, int warp, int lane, float cum0, float cum1) {
#pragma unroll
  for (int nt = 0; nt < 8; ++nt) acc[nt][0] = acc[nt][1] = acc[nt][2] = acc[nt][3] = 0.0f;
  scores<8>(acc, cs, hs, pitch, N, warp, lane);
  const float e0 = exp2_approx(cum0), e1 = exp2_approx(cum1);
#pragma unroll
  for (int nt = 0; nt < 8; ++nt) {
    acc[nt][0] *= e0;
    acc[nt][1] *= e0;
    acc[nt][2] *= e1;
    acc[nt][3] *= e1;
  }
}

// The scores s of source tile j0.. for the rows of output tile i0.., masked (j <= i, both inside the chunk: rows_i,
// rows_j) and scaled by exp(S_i - S_j) dt_j = exp2(cum2_i + w2_j), one add and one ex2 per score (the f64
// difference, its conversion and expf were most of the kernel's instructions), packed as the bf16 A fragments of the
// product with X (the scores' accumulator layout is the A fragments' layout). s is free afterwards. Full tiles below
// the diagonal (most of them) need no mask, and the diagonal one of full tiles only c <= r: each its own copy of the
// loop, without the general mask's integer work.
enum class ScoreMask { kNone, kDiagonal, kGeneral };
__device__ __forceinline__ void scale_scores(float (&s)[8][4], uint32_t (&a)[4][4], const float* w2_j, int q, int r0,
                                             int r1, float cum0, float cum1, int i0, int j0, int rows_i, int rows_j) {
  auto scale = [&](auto mask) {
    constexpr ScoreMask kMask = decltype(mask)::value;
#pragma unroll
    for (int nt = 0; nt < 8; ++nt) {
      const float2 w2c = *reinterpret_cast<const float2*>(w2_j + 8 * nt + 2 * q);
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int r = e < 2 ? r0 : r1, c = 8 * nt + 2 * q + (e & 1);
        const float cr = e < 2 ? cum0 : cum1;
        const float v = s[nt][e] * exp2_approx(cr + ((e & 1) ? w2c.y : w2c.x));
        if constexpr (kMask == ScoreMask::kGeneral)
          s[nt][e] = j0 + c <= i0 + r && r < rows_i && c < rows_j ? v : 0.0f;
        else if constexpr (kMask == ScoreMask::kDiagonal)
          s[nt][e] = c <= r ? v : 0.0f;
        else
          s[nt][e] = v;
      }
    }
  };
  if (rows_i < kT || rows_j < kT)
    scale(std::integral_constant<ScoreMask, ScoreMask::kGeneral>{});
  else if (j0 == i0)
    scale(std::integral_constant<ScoreMask, ScoreMask::kDiagonal>{});
  else
    scale(std::integral_constant<ScoreMask, ScoreMask::kNone>{});
#pragma unroll
  for (int kk = 0; kk < 4; ++kk) {
    a[kk][0] = pack2<__nv_bfloat16>(s[2 * kk][0], s[2 * kk][1]);
    a[kk][1] = pack2<__nv_bfloat16>(s[2 * kk][2], s[2 * kk][3]);
    a[kk][2] = pack2<__nv_bfloat16>(s[2 * kk + 1][0], s[2 * kk + 1][1]);
    a[kk][3] = pack2<__nv_bfloat16>(s[2 * kk + 1][2], s[2 * kk + 1][3]);
  }
}

// acc += scores . X (k = source j, n = column p) over the source tile's first 16 kk_end rows (the diagonal tile: rows
// past the warp's own are masked to zero, so their products are skipped).
__device__ __forceinline__ void multiply_x(float (&acc)[8][4], const uint32_t (&a)[4][4], const __nv_bfloat16* xt,
                                           int kk_end, int lane) {
#pragma unroll
  for (int kk = 0; kk < 4; ++kk) {
    if (kk < kk_end) {
#pragma unroll
      for (int np = 0; np < 4; ++np) {
        uint32_t b0[2], b1[2];
        ldmatrix_b_trans(xt, kXPitch, 16 * kk, 16 * np, lane, b0, b1);
        mma_bf16(acc[2 * np], a[kk], b0);
        mma_bf16(acc[2 * np + 1], a[kk], b1);
      }
    }
  }
}

// y = acc + D x, x the tile's bf16 copy (x_rows: its row 0 at column p0, rows x_pitch apart; the copy is all there is
// when conv1d wrote it, Mamba2Launch::inputs_bf16; the same either way, so a prompt's bits do not depend on which path
// its batch took), y at y_off (row 0, column p0) rounded to bf16, as mamba_ssm's activations are: the gated norm reads
// the same values whether y is stored in bf16 (Mamba2Launch::y16, half the bytes) or in f32 (batches with one-token
// rows), so a prompt's bits do not depend on its batch. A thread's accumulators come in pairs of neighbouring columns
// (e, e + 1): one 4-byte load and one 8-byte store each where y's rows allow (head_dim is even here; element
// accesses left half of every 32-byte sector to the next instruction).
__device__ __forceinline__ void store_y(const Mamba2Launch& p, float (&acc)[8][4], const uint16_t* x_rows,
                                        int64_t x_pitch, int64_t y_off, int64_t h, int r0, int r1, int q, int rows_i,
                                        int cols_p) {
  const float Dh = load_f(p.D.data, p.D.dtype, h);
  const bool pairs = (p.y.stride & 1) == 0 && (reinterpret_cast<uintptr_t>(p.y.data) & 7) == 0 &&
                     (reinterpret_cast<uintptr_t>(p.y16) & 3) == 0;
  if (p.y16 && pairs && rows_i == kT && cols_p == kT) {  // a prompt's full tile: no bounds, two row pointers
    const uint16_t* x0 = x_rows + r0 * x_pitch + 2 * q;
    const uint16_t* x1 = x_rows + r1 * x_pitch + 2 * q;
    uint16_t* y0 = p.y16 + y_off + r0 * p.y.stride + 2 * q;
    uint16_t* y1 = p.y16 + y_off + r1 * p.y.stride + 2 * q;
#pragma unroll
    for (int nt = 0; nt < 8; ++nt) {
#pragma unroll
      for (int e = 0; e < 4; e += 2) {
        const uint32_t v = *reinterpret_cast<const uint32_t*>((e < 2 ? x0 : x1) + 8 * nt);
        const float a0 = acc[nt][e] + Dh * __uint_as_float(v << 16);
        const float a1 = acc[nt][e + 1] + Dh * __uint_as_float(v & 0xffff0000u);
        *reinterpret_cast<uint32_t*>((e < 2 ? y0 : y1) + 8 * nt) = pack2<__nv_bfloat16>(a0, a1);
      }
    }
    return;
  }
#pragma unroll
  for (int nt = 0; nt < 8; ++nt) {
#pragma unroll
    for (int e = 0; e < 4; e += 2) {
      const int r = e < 2 ? r0 : r1, c = 8 * nt + 2 * q;
      if (r >= rows_i || c >= cols_p) continue;
      const uint32_t v = *reinterpret_cast<const uint32_t*>(x_rows + r * x_pitch + c);  // pitch and c even
      acc[nt][e] += Dh * __uint_as_float(v << 16);
      acc[nt][e + 1] += Dh * __uint_as_float(v & 0xffff0000u);
    }
  }
#pragma unroll
  for (int nt = 0; nt < 8; ++nt) {
#pragma unroll
    for (int e = 0; e < 4; e += 2) {
      const int r = e < 2 ? r0 : r1, c = 8 * nt + 2 * q;
      if (r >= rows_i || c >= cols_p) continue;
      const uint32_t y2 = pack2<__nv_bfloat16>(acc[nt][e], acc[nt][e + 1]);
      const int64_t at = y_off + r * p.y.stride + c;
      if (p.y16) {
        if (pairs) {
          *reinterpret_cast<uint32_t*>(p.y16 + at) = y2;
        } else {
          p.y16[at] = static_cast<uint16_t>(y2 & 0xffffu);
          p.y16[at + 1] = static_cast<uint16_t>(y2 >> 16);
        }
      } else {
        const float y0 = __uint_as_float(y2 << 16), y1 = __uint_as_float(y2 & 0xffff0000u);
        float* yr = p.y.data + at;
        if (pairs) {
          *reinterpret_cast<float2*>(yr) = make_float2(y0, y1);
        } else {
          yr[0] = y0;
          yr[1] = y1;
        }
      }
    }
  }
}

// This thread's scores of score tile `tile` (ssd_chunk_scores_fast_kernel's layout; tid: the thread's index among the
// 128 of its output tile), as 8 independent loads.
__device__ __forceinline__ void load_scores(const float* scores_g, int64_t tile, int64_t G, int tid, float (&s)[8][4]) {
  const float4* t = reinterpret_cast<const float4*>(scores_g + tile * G * kScoreTileFloats);
#pragma unroll
  for (int nt = 0; nt < 8; ++nt) {
    const float4 v = __ldg(t + nt * kThreads + tid);
    s[nt][0] = v.x, s[nt][1] = v.y, s[nt][2] = v.z, s[nt][3] = v.w;
  }
}

// ---- chunk output, a block per output tile: grid (n_chunks, n_heads, tiles_i * tiles_p) --------------------------
// Dynamic shared memory: the C tile of the i rows and the H_in tile (rows p), each kT x (N + 8) bf16; two X tiles
// [j][p], kT x kXPitch; then the decays w2 of two source tiles (~54 KB at d_state 128: four blocks per SM). The
// score tiles go from global memory straight to the registers that use them (the scores kernel wrote them in this
// kernel's accumulator layout), the next tile's loads in flight during the current tile's products; staged through
// shared memory they took 32 KB more and left three blocks per SM.
__host__ __device__ inline size_t fast_output_region_a_bytes(int64_t N) {
  return static_cast<size_t>(2 * kT * (N + 8)) * sizeof(__nv_bfloat16);
}
size_t fast_output_smem_bytes(int64_t N) {
  return fast_output_region_a_bytes(N) + static_cast<size_t>(2 * kT * kXPitch) * sizeof(__nv_bfloat16) +
         2 * kT * sizeof(float);
}

__global__ void __launch_bounds__(kThreads, 4) ssd_chunk_output_fast_kernel(Mamba2Launch p, const SsdChunk* chunks,
                                                                        SsdScratch sc, int tiles_p) {
  extern __shared__ __align__(16) unsigned char smem_raw[];
  enter_dependent();
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, gr = lane >> 2, q = lane & 3;
  const int64_t chunk = blockIdx.x, h = blockIdx.y;
  const SsdChunk ch = chunks[chunk];
  const int it = static_cast<int>(blockIdx.z / tiles_p);
  const int i0 = it * kT;
  if (i0 >= ch.len) return;  // block-uniform
  if (ch.single_token) return;  // single-token sequences take the step kernel (launch_mamba2_chunked)
  const int64_t P = p.head_dim, H = p.n_heads, HP = H * P;
  const int N = static_cast<int>(p.d_state);
  const int64_t G = p.n_groups, GN = G * N;
  const int64_t g = h / (H / G);
  const int64_t p0 = int64_t(blockIdx.z % tiles_p) * kT;
  const int rows_i = min(kT, ch.len - i0);
  const int cols_p = static_cast<int>(std::min<int64_t>(kT, P - p0));
  const int pitch = N + 8;
  const size_t region_a = fast_output_region_a_bytes(N);
  auto* cs = reinterpret_cast<__nv_bfloat16*>(smem_raw);
  __nv_bfloat16* hs = cs + kT * pitch;  // H_in
  // Buffer b by arithmetic, not a pointer array indexed at run time (that would go to local memory).
  auto* x0 = reinterpret_cast<__nv_bfloat16*>(smem_raw + region_a);
  auto xbuf = [&](int b) { return x0 + b * kT * kXPitch; };
  auto* w2_s = reinterpret_cast<float*>(x0 + 2 * kT * kXPitch);  // [2][kT]
  const float* scores_g = sc.scores + g * kScoreTileFloats;
  const int64_t first_tile = int64_t(ch.score_tile) + it * (it + 1) / 2;  // tile (it, 0); (it, jt) follows

  // Source tile jt into buffer set b, all by cp.async (one group): X rows and their w2.
  auto issue_source = [&](int jt, int b) {
    const int j0 = jt * kT;
    const int rows_j = min(kT, ch.len - j0);
    const int64_t t0 = ch.start + j0;
    copy_tile(xbuf(b), kXPitch, sc.x16 + t0 * HP + h * P + p0, HP, rows_j, cols_p);
    if (cols_p < kT) {  // columns p past the head: zeros (not copied; only when head_dim is not a multiple of 64)
      for (int e = tid; e < kT * (kT - cols_p); e += kThreads) {
        const int r = e / (kT - cols_p), c = cols_p + e % (kT - cols_p);
        xbuf(b)[r * kXPitch + c] = __float2bfloat16_rn(0.0f);
      }
    }
    copy_column(w2_s + b * kT, sc.w2 + h * p.T + t0, int64_t{1}, kT, rows_j);
    cp_async_commit();
  };

  // This thread's two rows (within the tile) and their cumulative decays (cum2 = S log2(e)).
  const int r0 = 16 * warp + gr, r1 = r0 + 8;
  const float* cum2_h = sc.cum2 + h * p.T + ch.start + i0;
  const float cum0 = r0 < rows_i ? cum2_h[r0] : 0.0f;
  const float cum1 = r1 < rows_i ? cum2_h[r1] : 0.0f;

  // Group 0: the C tile and H_in; group 1: source tile 0 (X into xbuf(0)); tile 0's scores into registers.
  copy_tile(cs, pitch, sc.C16 + (ch.start + i0) * GN + g * N, GN, rows_i, N);
  copy_tile(hs, pitch, sc.states16 + ((chunk * H + h) * P + p0) * N, N, cols_p, N);
  cp_async_commit();
  issue_source(0, 0);
  float s[8][4];
  load_scores(scores_g, first_tile, G, tid, s);
  cp_async_wait<1>();
  __syncthreads();

  float acc[8][4];
  carried_in(acc, cs, hs, pitch, N, warp, lane, cum0, cum1);

  // Intra-chunk term, one 64-token source tile at a time up to the diagonal tile. Source tile jt sits in buffer set
  // b = jt % 2: X in xbuf(b), decays in w2_s[b]; its scores in s.
  for (int jt = 0; jt <= it; ++jt) {
    const int b = jt & 1;
    const int j0 = jt * kT;
    const int rows_j = min(kT, ch.len - j0);  // >= 1: j0 <= i0 < len
    cp_async_wait<0>();
    __syncthreads();  // tile jt is in; everyone is done with buffer set b ^ 1 (tile jt - 1)
    if (jt < it) issue_source(jt + 1, b ^ 1);
    uint32_t a[4][4];
    scale_scores(s, a, w2_s + b * kT, q, r0, r1, cum0, cum1, i0, j0, rows_i, rows_j);
    if (jt < it) load_scores(scores_g, first_tile + jt + 1, G, tid, s);
    multiply_x(acc, a, xbuf(b), jt == it ? warp + 1 : 4, lane);
  }

  store_y(p, acc, sc.x16 + (ch.start + i0) * HP + h * P + p0, HP, (ch.start + i0) * p.y.stride + h * P + p0, h, r0,
          r1, q, rows_i, cols_p);
}

// ---- chunk output, a block per (chunk, head): grid (n_chunks, n_heads, tiles_p), 256 threads ---------------------
// Chunks of up to kByChunkTiles tiles take it (docs/benchmarks.md, decisions), longer ones the kernel above.
// The block-per-tile kernel above loads H_in once per output tile (4 times per chunk at chunk 256) and source tile jt
// once per output tile it >= jt (10 tile loads for 4 tiles), and each of its blocks waits for its C, H_in and first
// source tile before its first product, then runs 1..4 tile passes. Here H_in, every X tile and the chunk's decays
// are copied once, and two warpgroups each run two output tiles whose source counts sum to the same (tiles 3 and 0,
// 2 and 1 at chunk 256: 5 tile passes each), the second tile's C copy in flight during the first tile's passes; D x
// reads the output tile's X from shared memory. Same pieces, same order: the same bits as the kernel above.
// Dynamic shared memory: H_in, one C tile per warpgroup (kT x (N + 8) bf16 each), kByChunkTiles X tiles (kT x
// kXPitch), then cum2 and w2 of the chunk's tokens (kByChunkTiles * kT floats each): 89 KB at d_state 128, two blocks
// (16 warps) per SM.
constexpr int kByChunkTiles = 4;
constexpr int kByChunkThreads = 2 * kThreads;
size_t fast_output_by_chunk_smem_bytes(int64_t N) {
  return static_cast<size_t>(3 * kT * (N + 8) + kByChunkTiles * kT * kXPitch) * sizeof(__nv_bfloat16) +
         2 * kByChunkTiles * kT * sizeof(float);
}
bool output_by_chunk_supported(const Mamba2Launch& p) {
  return p.chunk_size <= kByChunkTiles * kT;
}

// Output tiles (first, second; -1: none) of warpgroup wg for a chunk of n output tiles: the longer first, so that the
// second's C copy has the longer time to arrive.
__device__ __forceinline__ int2 warpgroup_tiles(int n, int wg) {
  switch (n) {
    case 4: return wg == 0 ? make_int2(3, 0) : make_int2(2, 1);
    case 3: return wg == 0 ? make_int2(2, -1) : make_int2(1, 0);
    case 2: return wg == 0 ? make_int2(1, -1) : make_int2(0, -1);
    default: return wg == 0 ? make_int2(0, -1) : make_int2(-1, -1);
  }
}

// Named barrier of one warpgroup (ids 1 and 2; 0 is __syncthreads), immediate ids (a register id reserves all 16).
__device__ __forceinline__ void warpgroup_sync(int wg) {
  if (wg == 0)
    asm volatile("bar.sync 1, %0;\n" ::"n"(kThreads) : "memory");
  else
    asm volatile("bar.sync 2, %0;\n" ::"n"(kThreads) : "memory");
}

__global__ void __launch_bounds__(kByChunkThreads, 2)
    ssd_chunk_output_by_chunk_kernel(Mamba2Launch p, const SsdChunk* chunks, SsdScratch sc) {
  extern __shared__ __align__(16) unsigned char smem_raw[];
  enter_dependent();
  const int tid = threadIdx.x, wg = tid / kThreads, wtid = tid % kThreads;  // warpgroup, thread within it
  const int warp = wtid >> 5, lane = tid & 31, gr = lane >> 2, q = lane & 3;  // warp within the warpgroup
  const int64_t chunk = blockIdx.x, h = blockIdx.y;
  const SsdChunk ch = chunks[chunk];
  if (ch.single_token) return;  // single-token sequences take the step kernel (launch_mamba2_chunked)
  const int64_t P = p.head_dim, H = p.n_heads, HP = H * P;
  const int N = static_cast<int>(p.d_state);
  const int64_t G = p.n_groups, GN = G * N;
  const int64_t g = h / (H / G);
  const int64_t p0 = int64_t(blockIdx.z) * kT;
  const int cols_p = static_cast<int>(std::min<int64_t>(kT, P - p0));
  const int n_tiles = (ch.len + kT - 1) / kT;  // 1..kByChunkTiles (output_by_chunk_supported)
  const int pitch = N + 8;
  auto* hs = reinterpret_cast<__nv_bfloat16*>(smem_raw);  // H_in
  __nv_bfloat16* cs = hs + (1 + wg) * kT * pitch;         // this warpgroup's C tile
  __nv_bfloat16* x0 = hs + 3 * kT * pitch;
  auto xbuf = [&](int jt) { return x0 + jt * kT * kXPitch; };
  auto* cum_s = reinterpret_cast<float*>(x0 + kByChunkTiles * kT * kXPitch);  // [kByChunkTiles * kT], 0 past len
  float* w2_s = cum_s + kByChunkTiles * kT;
  const float* scores_g = sc.scores + g * kScoreTileFloats;
  auto first_score_tile = [&](int it) { return int64_t(ch.score_tile) + it * (it + 1) / 2; };  // tile (it, 0)
  const int2 mine = warpgroup_tiles(n_tiles, wg);
  auto copy_c = [&](int it) {  // this warpgroup's threads only
    copy_tile(cs, pitch, sc.C16 + (ch.start + it * kT) * GN + g * N, GN, min(kT, ch.len - it * kT), N, wtid);
    cp_async_commit();
  };

  // Group 0: each warpgroup's first C tile, H_in, the chunk's decays; group 1: every X tile. The first tile's scores
  // into registers meanwhile.
  if (mine.x >= 0) {
    copy_c(mine.x);
  } else {
    cp_async_commit();  // an empty group: the waits below count the same groups in every thread
  }
  copy_tile<kByChunkThreads>(hs, pitch, sc.states16 + ((chunk * H + h) * P + p0) * N, N, cols_p, N);
  copy_column<float, kByChunkThreads>(cum_s, sc.cum2 + h * p.T + ch.start, int64_t{1}, n_tiles * kT, ch.len);
  copy_column<float, kByChunkThreads>(w2_s, sc.w2 + h * p.T + ch.start, int64_t{1}, n_tiles * kT, ch.len);
  cp_async_commit();
  for (int jt = 0; jt < n_tiles; ++jt)
    copy_tile<kByChunkThreads>(xbuf(jt), kXPitch, sc.x16 + (ch.start + jt * kT) * HP + h * P + p0, HP,
                               min(kT, ch.len - jt * kT), cols_p);
  if (cols_p < kT) {  // columns p past the head: zeros (not copied; only when head_dim is not a multiple of 64)
    for (int e = tid; e < n_tiles * kT * (kT - cols_p); e += kByChunkThreads) {
      const int r = e / (kT - cols_p), c = cols_p + e % (kT - cols_p);
      x0[r * kXPitch + c] = __float2bfloat16_rn(0.0f);  // r runs over every tile's rows: the tiles are consecutive
    }
  }
  cp_async_commit();
  float s[8][4];
  if (mine.x >= 0) load_scores(scores_g, first_score_tile(mine.x), G, wtid, s);
  cp_async_wait<1>();
  __syncthreads();

  // The first tile's carried-in term (C and H_in are in), then every X tile.
  const int r0 = 16 * warp + gr, r1 = r0 + 8;
  float acc[8][4];
  if (mine.x >= 0)
    carried_in(acc, cs, hs, pitch, N, warp, lane, cum_s[mine.x * kT + r0], cum_s[mine.x * kT + r1]);
  cp_async_wait<0>();
  __syncthreads();  // the X tiles are in; every warp is done with its C tile
  if (mine.x < 0) return;
  if (mine.y >= 0) copy_c(mine.y);

  for (int pass = 0; pass < 2; ++pass) {
    const int it = pass == 0 ? mine.x : mine.y;
    const int next = pass == 0 ? mine.y : -1;  // the output tile whose first scores follow this tile's last
    const int i0 = it * kT, rows_i = min(kT, ch.len - i0);
    const float cum0 = cum_s[i0 + r0], cum1 = cum_s[i0 + r1];  // 0 past the chunk, as the kernel above has them
    if (pass == 1) {
      cp_async_wait<0>();
      warpgroup_sync(wg);  // this tile's C is in
      carried_in(acc, cs, hs, pitch, N, warp, lane, cum0, cum1);
    }
    for (int jt = 0; jt <= it; ++jt) {
      const int j0 = jt * kT;
      uint32_t a[4][4];
      scale_scores(s, a, w2_s + j0, q, r0, r1, cum0, cum1, i0, j0, rows_i, min(kT, ch.len - j0));
      if (jt < it)
        load_scores(scores_g, first_score_tile(it) + jt + 1, G, wtid, s);
      else if (next >= 0)
        load_scores(scores_g, first_score_tile(next), G, wtid, s);
      multiply_x(acc, a, xbuf(jt), jt == it ? warp + 1 : 4, lane);
    }
    store_y(p, acc, reinterpret_cast<const uint16_t*>(xbuf(it)), kXPitch,
            (ch.start + i0) * p.y.stride + h * P + p0, h, r0, r1, q, rows_i, cols_p);
    if (next < 0) break;
  }
}

// ---- chunk state: grid (n_chunks, n_heads, tiles_p), 128 * NT threads (NT = d_state / 64 rounded up) -------------
// First the chunk's decays (fast precision's cumulative sum, folded in here: as its own launch it is a few blocks
// that leave the GPU idle): dt_t, S_t summed in f64 as the exact path does (128 runs of consecutive tokens, a
// block scan of their totals), kept as f32 cum2 = S log2(e) and w2 = log2(dt) - cum2 (SsdScratch). Every block of a
// (chunk, head) computes them; the first one writes them for the state pass and the output kernel.
// Then out[p, n] = sum_j x_j[p] (w_j B_j[n]), w_j = exp(S_last - S_j) dt_j = exp2(cum2_last + w2_j): warp w owns
// rows p0 + 16 (w % 4) .. + 15 and the 64 columns 64 (w / 4) ..; the chunk's tokens in 64-token steps, each step's x
// and B tiles (bf16 copies, rows j as stored) copied by cp.async two buffers deep. One block covers every column n
// of its rows p, so x and the decays are read and computed once per (chunk, head, p tile): with a block per 64
// columns, mamba2-2.7b read x twice and scanned the decays twice. Both operands are read with transposing matrix
// loads; w_j multiplies the A fragments (x w rounded again to bf16: a second rounding of x, see the error model at
// the top).
constexpr int kDecayThreads = kThreads;  // the decays' scan: 128 threads whatever the block's size
constexpr int kDecayPerThread = kSsdFastMaxChunk / kDecayThreads;

int state_col_tiles(int64_t N) { return static_cast<int>((N + kT - 1) / kT); }
int state_b_pitch(int64_t N) { return state_col_tiles(N) * kT + 8; }  // bf16; + 8 as kXPitch
size_t fast_state_smem_bytes(int64_t N, int64_t chunk_size) {
  const size_t stage = static_cast<size_t>(kT * kXPitch + kT * state_b_pitch(N)) * sizeof(__nv_bfloat16);
  // Two stages of x and B tiles, then w_j of every token, padded to whole 64-token steps.
  return 2 * stage + static_cast<size_t>((chunk_size + kT - 1) / kT * kT) * sizeof(float);
}

// Registers held to 64 per thread (no spills), so that 32 warps fit a multiprocessor at d_state 128 (four blocks of
// 256; they would take ~98), faster than 24 warps at 80 registers. The block is latency-bound by its number of warps:
// four copy stages (two blocks of 107 KB) are slower.
template <int NT>
__global__ void __launch_bounds__(kThreads * NT, 8 / NT)
    ssd_chunk_state_fast_kernel(Mamba2Launch p, const SsdChunk* chunks, SsdScratch sc) {
  constexpr int kBlock = kThreads * NT;
  constexpr int kBPitch = NT * kT + 8;
  constexpr int kStage = kT * kXPitch + kT * kBPitch;  // bf16 elements: the x tile [j][p], then the B tile [j][n]
  extern __shared__ __align__(16) unsigned char smem_raw[];
  __shared__ double run_totals[kDecayThreads / 32];
  __shared__ float cum2_last;
  auto* stages = reinterpret_cast<__nv_bfloat16*>(smem_raw);
  auto xs = [&](int b) { return stages + b * kStage; };
  auto bs = [&](int b) { return stages + b * kStage + kT * kXPitch; };
  float* w_s = reinterpret_cast<float*>(stages + 2 * kStage);  // [steps * kT]: w2_j, then w_j (0 past the chunk)
  enter_dependent();
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, q = lane & 3;
  const int pw = warp & 3, nw = warp >> 2;  // this warp's 16 rows p and 64 columns n of the block's tile
  const int64_t chunk = blockIdx.x, h = blockIdx.y;
  const SsdChunk ch = chunks[chunk];
  if (ch.single_token) return;  // single-token sequences take the step kernel (launch_mamba2_chunked)
  const int64_t P = p.head_dim, N = p.d_state, H = p.n_heads, HP = H * P;
  const int64_t GN = p.n_groups * N, g = h / (H / p.n_groups);
  const int64_t p0 = int64_t(blockIdx.z) * kT;
  const int rows_p = static_cast<int>(std::min<int64_t>(kT, P - p0));
  const int n_steps = (ch.len + kT - 1) / kT;

  auto issue = [&](int js, int b) {
    const int j0 = js * kT;
    const int rows_j = min(kT, ch.len - j0);
    const int64_t t0 = ch.start + j0;
    copy_tile<kBlock>(xs(b), kXPitch, sc.x16 + t0 * HP + h * P + p0, HP, rows_j, rows_p);
    copy_tile<kBlock>(bs(b), kBPitch, sc.B16 + t0 * GN + g * N, GN, rows_j, static_cast<int>(N));
    if (rows_p < kT || N < NT * kT) {  // columns past the head / the state width: zeros (block-uniform)
      for (int e = tid; e < kT * NT * kT; e += kBlock) {
        const int r = e / (NT * kT), c = e % (NT * kT);
        if (c < kT && c >= rows_p) xs(b)[r * kXPitch + c] = __float2bfloat16_rn(0.0f);
        if (c >= N) bs(b)[r * kBPitch + c] = __float2bfloat16_rn(0.0f);
      }
    }
    cp_async_commit();
  };
  issue(0, 0);  // in flight during the decays

  {
    const float A = ssd_head_A(p, h), bias = load_f(p.dt_bias.data, p.dt_bias.dtype, h);
    const bool scans = tid < kDecayThreads;  // warp-uniform
    const int per = (ch.len + kDecayThreads - 1) / kDecayThreads;  // <= kDecayPerThread (kSsdFastMaxChunk)
    const int j_begin = scans ? min(ch.len, tid * per) : ch.len, j_end = min(ch.len, j_begin + per);
    float d[kDecayPerThread];
#pragma unroll
    for (int k = 0; k < kDecayPerThread; ++k)
      d[k] = j_begin + k < j_end ? ssd_dt(p, ch.start + j_begin + k, h, bias) : 0.0f;
    double run = 0.0;
#pragma unroll
    for (int k = 0; k < kDecayPerThread; ++k) run += static_cast<double>(d[k] * A);  // d = 0 past the run
    double incl = run;
#pragma unroll
    for (int off = 1; off < 32; off <<= 1) {
      const double o = __shfl_up_sync(0xffffffffu, incl, off);
      if (lane >= off) incl += o;
    }
    double s = __shfl_up_sync(0xffffffffu, incl, 1);
    if (lane == 0) s = 0.0;
    if (scans && lane == 31) run_totals[warp] = incl;
    __syncthreads();
    if (scans) {
      for (int w = 0; w < warp; ++w) s += run_totals[w];
      const bool writer = blockIdx.z == 0;
#pragma unroll
      for (int k = 0; k < kDecayPerThread; ++k) {
        const int j = j_begin + k;
        if (j < j_end) {
          s += static_cast<double>(d[k] * A);
          const float c2 = static_cast<float>(s * 1.4426950408889634);
          const float w2 = log2f(d[k]) - c2;
          w_s[j] = w2;
          if (writer) {
            sc.cum2[h * p.T + ch.start + j] = c2;
            sc.w2[h * p.T + ch.start + j] = w2;
          }
          if (j == ch.len - 1) cum2_last = c2;
        }
      }
    }
    __syncthreads();
    for (int j = tid; j < n_steps * kT; j += kBlock) w_s[j] = j < ch.len ? exp2_approx(cum2_last + w_s[j]) : 0.0f;
  }

  float acc[8][4] = {};
  for (int js = 0; js < n_steps; ++js) {
    const int b = js & 1;
    cp_async_wait<0>();
    __syncthreads();  // step js is in (and, at js = 0, every w_j); everyone is done with buffer b ^ 1 (step js - 1)
    if (js + 1 < n_steps) issue(js + 1, b ^ 1);
    const float* w_step = w_s + js * kT;
#pragma unroll
    for (int kk = 0; kk < kT / 16; ++kk) {
      // A = (x^T)[p][j] for rows p = 16 pw .., k = j = 16 kk ..: matrix m of the transposing load is stored rows
      // j = 16 kk + 8 (m >> 1) + r, columns p = 16 pw + 8 (m & 1).
      uint32_t a[4];
      {
        const int m = lane >> 3, r = lane & 7;
        ldmatrix_x4_trans(xs(b) + (16 * kk + 8 * (m >> 1) + r) * kXPitch + 16 * pw + 8 * (m & 1), a[0], a[1], a[2],
                          a[3]);
      }
      // a0, a1 hold columns j = 16 kk + 2q, +1; a2, a3 the same + 8.
      const float2 w01 = *reinterpret_cast<const float2*>(w_step + 16 * kk + 2 * q);
      const float2 w23 = *reinterpret_cast<const float2*>(w_step + 16 * kk + 2 * q + 8);
      const float w[4] = {w01.x, w01.y, w23.x, w23.y};
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        const float lo = __uint_as_float(a[k] << 16), hi = __uint_as_float(a[k] & 0xffff0000u);
        const int u = 2 * (k >> 1);
        a[k] = pack2<__nv_bfloat16>(lo * w[u], hi * w[u + 1]);
      }
#pragma unroll
      for (int np = 0; np < 4; ++np) {
        uint32_t b0[2], b1[2];
        ldmatrix_b_trans(bs(b), kBPitch, 16 * kk, kT * nw + 16 * np, lane, b0, b1);
        mma_bf16(acc[2 * np], a, b0);
        mma_bf16(acc[2 * np + 1], a, b1);
      }
    }
  }
  float* out = sc.chunk_states + (chunk * H + h) * P * N;
  const int gr = lane >> 2;
#pragma unroll
  for (int nt = 0; nt < 8; ++nt) {
#pragma unroll
    for (int e = 0; e < 4; e += 2) {  // columns c, c + 1 (d_state is a multiple of 16 here): one 8-byte store
      const int r = 16 * pw + gr + (e >> 1) * 8, c = kT * nw + 8 * nt + 2 * q;
      if (r < rows_p && c < N)
        *reinterpret_cast<float2*>(out + (p0 + r) * N + c) = make_float2(acc[nt][e], acc[nt][e + 1]);
    }
  }
}

unsigned cdiv(int64_t a, int64_t b) { return static_cast<unsigned>((a + b - 1) / b); }

}  // namespace

void launch_ssd_round_inputs(const Mamba2Launch& p, const SsdScratch& scratch, cudaStream_t stream) {
  auto aligned = [](const ConstF32Rows& r) {
    return reinterpret_cast<uintptr_t>(r.data) % 16 == 0 && r.stride % 4 == 0;
  };
  const bool vec = aligned(p.x) && aligned(p.B) && aligned(p.C);  // widths are multiples of 16 (ssd_tc_supported)
  launch_dependent(ssd_round_inputs_kernel, dim3(static_cast<unsigned>(p.T), 3), dim3(256), stream, p, scratch, vec);
}

void launch_ssd_chunk_state_fast(const Mamba2Launch& p, const SsdChunk* chunks, int64_t n_chunks,
                                 const SsdScratch& scratch, cudaStream_t stream) {
  static std::once_flag opt_in[4];
  const int nt = state_col_tiles(p.d_state);  // 1..4: d_state <= kMaxSsdTcState = 256 (ssd_tc_supported)
  const size_t smem = fast_state_smem_bytes(p.d_state, p.chunk_size);
  const dim3 grid(static_cast<unsigned>(n_chunks), static_cast<unsigned>(p.n_heads), cdiv(p.head_dim, kT));
  auto launch = [&](auto kernel, int i) {
    allow_dynamic_smem_once(opt_in[i], kernel, fast_state_smem_bytes((i + 1) * kT, kSsdFastMaxChunk));
    launch_dependent_smem(kernel, grid, dim3(kThreads * (i + 1)), smem, stream, p, chunks, scratch);
  };
  switch (nt) {
    case 1: launch(ssd_chunk_state_fast_kernel<1>, 0); break;
    case 2: launch(ssd_chunk_state_fast_kernel<2>, 1); break;
    case 3: launch(ssd_chunk_state_fast_kernel<3>, 2); break;
    default: launch(ssd_chunk_state_fast_kernel<4>, 3); break;
  }
}

void launch_ssd_chunk_scores_fast(const Mamba2Launch& p, const SsdChunk* chunks, int64_t n_chunks,
                                  const SsdScratch& scratch, cudaStream_t stream) {
  static std::once_flag opt_in;
  allow_dynamic_smem_once(opt_in, ssd_chunk_scores_fast_kernel, fast_scores_smem_bytes(kMaxSsdTcState));
  const unsigned tiles = cdiv(p.chunk_size, kT);
  launch_dependent_smem(ssd_chunk_scores_fast_kernel,
                        dim3(static_cast<unsigned>(n_chunks), static_cast<unsigned>(p.n_groups), tiles * tiles),
                        dim3(kThreads), fast_scores_smem_bytes(p.d_state), stream, p, chunks, scratch,
                        static_cast<int>(tiles));
}

void launch_ssd_chunk_output_fast(const Mamba2Launch& p, const SsdChunk* chunks, int64_t n_chunks,
                                  const SsdScratch& scratch, cudaStream_t stream) {
  const int tiles_p = static_cast<int>(cdiv(p.head_dim, kT));
  if (output_by_chunk_supported(p)) {
    static std::once_flag opt_in_by_chunk;
    allow_dynamic_smem_once(opt_in_by_chunk, ssd_chunk_output_by_chunk_kernel,
                            fast_output_by_chunk_smem_bytes(kMaxSsdTcState));
    launch_dependent_smem(ssd_chunk_output_by_chunk_kernel,
                          dim3(static_cast<unsigned>(n_chunks), static_cast<unsigned>(p.n_heads),
                               static_cast<unsigned>(tiles_p)),
                          dim3(kByChunkThreads), fast_output_by_chunk_smem_bytes(p.d_state), stream, p, chunks,
                          scratch);
    return;
  }
  static std::once_flag opt_in;
  allow_dynamic_smem_once(opt_in, ssd_chunk_output_fast_kernel, fast_output_smem_bytes(kMaxSsdTcState));
  launch_dependent_smem(ssd_chunk_output_fast_kernel,
                        dim3(static_cast<unsigned>(n_chunks), static_cast<unsigned>(p.n_heads),
                             cdiv(p.chunk_size, kT) * tiles_p),
                        dim3(kThreads), fast_output_smem_bytes(p.d_state), stream, p, chunks, scratch, tiles_p);
}

}  // namespace mambacpp::cuda
