// Near-f32 matrix products on the bf16 tensor cores (mma.sync m16n8k16, f32 accumulation) for kernels whose
// operands are f32: each operand v is split into hi = bf16(v) and lo = bf16(v - hi), and a.b is computed as
// hi_a.hi_b + hi_a.lo_b + lo_a.hi_b. Each split leaves |v - hi - lo| <= 2^-18 |v|, and the dropped lo_a.lo_b is
// below 2^-16 |a b|, so a product carries <= ~3 * 2^-18 relative error (1.1e-5 worst case, ~2e-6 typical, averaging
// down in sums), against ~1e-7 for f32 FMAs and ~4e-3 for a single bf16 product.
//
// Fragment layouts (PTX ISA, mma.m16n8k16 with .bf16; g = lane / 4, q = lane % 4):
//   A (16 x 16, row-major):  reg0 = (row g, cols 2q, 2q+1), reg1 = (row g+8, same cols), reg2 = (row g, cols 2q+8,
//                            2q+9), reg3 = (row g+8, cols 2q+8, 2q+9); the lower column sits in the low 16 bits.
//   B (16 x 8, "col": element (k, n) read from a [n][k] array): reg0 = (k 2q, 2q+1; n g), reg1 = (k 2q+8, 2q+9; n g).
//   C/D (16 x 8, f32): c0, c1 = (row g, cols 2q, 2q+1), c2, c3 = (row g+8, cols 2q, 2q+1).
// The accumulators of two neighbouring 16 x 8 tiles are exactly the A fragment of one 16 x 16 tile, so a product
// computed in registers can feed the next product without going through shared memory.
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

namespace mambacpp::cuda {

// Shared-memory tiles hold hi and lo halves as bf16 with a row pitch of (cols + 8) elements: a multiple of 16 bytes
// whose word count is 4 mod 8, so that the 8 rows x 4 words of one fragment load fall into 32 distinct banks.
struct SplitTile {
  __nv_bfloat16* hi;
  __nv_bfloat16* lo;
  int pitch;  // elements per row
};

__device__ __forceinline__ uint32_t bf16x2_bits(__nv_bfloat16 low_col, __nv_bfloat16 high_col) {
  return static_cast<uint32_t>(__bfloat16_as_ushort(low_col)) |
         (static_cast<uint32_t>(__bfloat16_as_ushort(high_col)) << 16);
}

// (a, b) -> packed hi and lo pairs (a in the low half).
__device__ __forceinline__ void split2(float a, float b, uint32_t& hi, uint32_t& lo) {
  const __nv_bfloat16 ha = __float2bfloat16_rn(a), hb = __float2bfloat16_rn(b);
  const __nv_bfloat16 la = __float2bfloat16_rn(a - __bfloat162float(ha));
  const __nv_bfloat16 lb = __float2bfloat16_rn(b - __bfloat162float(hb));
  hi = bf16x2_bits(ha, hb);
  lo = bf16x2_bits(la, lb);
}

__device__ __forceinline__ void store_split2(const SplitTile& t, int row, int col, float a, float b) {
  uint32_t hi, lo;
  split2(a, b, hi, lo);
  *reinterpret_cast<uint32_t*>(t.hi + row * t.pitch + col) = hi;
  *reinterpret_cast<uint32_t*>(t.lo + row * t.pitch + col) = lo;
}

__device__ __forceinline__ uint32_t ld32(const __nv_bfloat16* p) { return *reinterpret_cast<const uint32_t*>(p); }

// A fragment of rows [r0, r0 + 16), columns [k0, k0 + 16) of a row-major tile.
__device__ __forceinline__ void load_a(const SplitTile& t, int r0, int k0, int lane, uint32_t (&hi)[4],
                                       uint32_t (&lo)[4]) {
  const int g = lane >> 2, q = lane & 3;
  const int o0 = (r0 + g) * t.pitch + k0 + 2 * q, o1 = o0 + 8 * t.pitch;
  hi[0] = ld32(t.hi + o0);
  hi[1] = ld32(t.hi + o1);
  hi[2] = ld32(t.hi + o0 + 8);
  hi[3] = ld32(t.hi + o1 + 8);
  lo[0] = ld32(t.lo + o0);
  lo[1] = ld32(t.lo + o1);
  lo[2] = ld32(t.lo + o0 + 8);
  lo[3] = ld32(t.lo + o1 + 8);
}

// B fragment for columns n [n0, n0 + 8) and k [k0, k0 + 16) of a tile stored [n][k].
__device__ __forceinline__ void load_b(const SplitTile& t, int n0, int k0, int lane, uint32_t (&hi)[2],
                                       uint32_t (&lo)[2]) {
  const int g = lane >> 2, q = lane & 3;
  const int o = (n0 + g) * t.pitch + k0 + 2 * q;
  hi[0] = ld32(t.hi + o);
  hi[1] = ld32(t.hi + o + 8);
  lo[0] = ld32(t.lo + o);
  lo[1] = ld32(t.lo + o + 8);
}

// Not volatile: the compiler may interleave independent products (a volatile asm keeps source order, which made
// every three products into one accumulator a chain of dependent tensor-core latencies).
__device__ __forceinline__ void mma_bf16(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
  asm(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

// d[nt] += a . b[nt] for the 8 column tiles nt < n_end (the rest untouched), three products each, issued as three
// passes over the tiles so that consecutive products go to different accumulators. b: the B fragments of one
// 16-deep k step for 8 tiles, loaded by the caller.
__device__ __forceinline__ void mma3_row(float (&d)[8][4], const uint32_t (&ah)[4], const uint32_t (&al)[4],
                                         const uint32_t (&bh)[8][2], const uint32_t (&bl)[8][2], int n_end) {
#pragma unroll
  for (int nt = 0; nt < 8; ++nt)
    if (nt < n_end) mma_bf16(d[nt], al, bh[nt]);
#pragma unroll
  for (int nt = 0; nt < 8; ++nt)
    if (nt < n_end) mma_bf16(d[nt], ah, bl[nt]);
#pragma unroll
  for (int nt = 0; nt < 8; ++nt)
    if (nt < n_end) mma_bf16(d[nt], ah, bh[nt]);
}

// B fragments of 8 consecutive column tiles (n0 = 0, 8, ..., 56) at k step k0, tiles nt < n_end.
__device__ __forceinline__ void load_b_row(const SplitTile& t, int k0, int lane, int n_end, uint32_t (&hi)[8][2],
                                           uint32_t (&lo)[8][2]) {
#pragma unroll
  for (int nt = 0; nt < 8; ++nt)
    if (nt < n_end) load_b(t, 8 * nt, k0, lane, hi[nt], lo[nt]);
}

// A fragment (hi, lo) of the 16 x 16 tile made of accumulator tiles s0 (columns 0..7) and s1 (columns 8..15).
__device__ __forceinline__ void acc_to_a(const float (&s0)[4], const float (&s1)[4], uint32_t (&hi)[4],
                                         uint32_t (&lo)[4]) {
  split2(s0[0], s0[1], hi[0], lo[0]);
  split2(s0[2], s0[3], hi[1], lo[1]);
  split2(s1[0], s1[1], hi[2], lo[2]);
  split2(s1[2], s1[3], hi[3], lo[3]);
}

}  // namespace mambacpp::cuda
