// Device-side decoding of the quantized layouts of quant_ops.h: 16 stored bytes as 16 floats (int8 quants or e4m3
// values, both exact in f32), single elements, one dequantized weight element, and the k-quants' 64-element units.
#pragma once

#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cstdint>

#include "backend/cuda/quant_ops.h"

namespace mambacpp::cuda {

__device__ __forceinline__ float e4m3_to_f(uint8_t b) {
  const __half_raw h = __nv_cvt_fp8_to_halfraw(static_cast<__nv_fp8_storage_t>(b), __NV_E4M3);
  return __half2float(__half(h));
}

// 16 bytes (lower address first) as 16 floats: int8 quants (Q8) or e4m3 values.
template <bool FP8>
__device__ __forceinline__ void unpack_q16(const uint4& raw, float* out) {
  const uint32_t u[4] = {raw.x, raw.y, raw.z, raw.w};
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    if constexpr (FP8) {
      const __half2_raw lo = __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(u[k] & 0xffffu), __NV_E4M3);
      const __half2_raw hi = __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(u[k] >> 16), __NV_E4M3);
      const float2 a = __half22float2(__half2(lo)), b = __half22float2(__half2(hi));
      out[4 * k] = a.x;
      out[4 * k + 1] = a.y;
      out[4 * k + 2] = b.x;
      out[4 * k + 3] = b.y;
    } else {
#pragma unroll
      for (int j = 0; j < 4; ++j) out[4 * k + j] = static_cast<float>(static_cast<int8_t>(u[k] >> (8 * j)));
    }
  }
}

// The stored value of element (o, i) before any scale: the int8 quant or the e4m3 value.
__device__ __forceinline__ float quant_raw(const QuantMatrix& w, int64_t o, int64_t i) {
  const uint8_t b = w.q[o * w.cols + i];
  return w.format == WeightFormat::FP8_E4M3 ? e4m3_to_f(b) : static_cast<float>(static_cast<int8_t>(b));
}

// The scale of element (o, i): q8_0's block scale, fp8's channel (or tensor) scale.
__device__ __forceinline__ float quant_scale(const QuantMatrix& w, int64_t o, int64_t i) {
  if (w.format == WeightFormat::FP8_E4M3) return static_cast<const float*>(w.scale)[w.per_tensor ? 0 : o];
  return __half2float(static_cast<const __half*>(w.scale)[o * (w.cols / 32) + i / 32]);
}

// Element (o, i) dequantized: scale * raw, one f32 product (exact for q8_0: 11 x 8 significant bits).
__device__ __forceinline__ float quant_element(const QuantMatrix& w, int64_t o, int64_t i) {
  return quant_scale(w, o, i) * quant_raw(w, o, i);
}

// ---- q4_k / q5_k / q6_k: units of 64 elements --------------------------------------------------------------------------
// A super-block of 256 elements is 4 units; a unit is 4 groups of 16 elements that share their scales' bytes and
// whose quants come from 16-byte loads. Group g of unit u starts at row position kq_unit_pos(u) + g * kq_group_stride:
//   q4_k: unit j of a block is quant bytes qs[32j, 32j + 32): low nibbles are elements 64j + [0, 32) (sub-block 2j),
//         high nibbles 64j + 32 + [0, 32) (sub-block 2j + 1). Groups: 64j + 16g, stride 16.
//   q6_k: unit (half h, g2) of a block is ql[64h + 16 g2 ...], ql[64h + 32 + 16 g2 ...] and qh[32h + 16 g2 ...]: the
//         elements 128h + 16 g2 + 32 k + [0, 16), k = 0..3, each a 16-element sub-block with its own scale. Stride 32.
//   q5_k: as q4_k, the quants' fifth bits from qh[32] (bit 2j / 2j + 1 of qh[l] for unit j's low / high nibbles).
// The values are ggml's (dequantize_row_q4_K / q5_K / q6_K) bit for bit: q4_k / q5_k  d*sc (exact) times q (exact, at
// most 22 bits) minus dmin*m (exact), one rounding (fmaf gives the same); q6_k  (d*sc)*(q - 32), every product exact
// in f32 (at most 23 bits).
inline constexpr int kKqUnitElems = 64;

template <WeightFormat F>
__device__ __forceinline__ int64_t kq_unit_pos(int64_t u) {
  if constexpr (F == WeightFormat::Q6_K) return (u >> 2) * 256 + ((u >> 1) & 1) * 128 + (u & 1) * 16;
  return (u >> 2) * 256 + (u & 3) * 64;
}
template <WeightFormat F>
inline constexpr int kq_group_stride = F == WeightFormat::Q6_K ? 32 : 16;

__device__ __forceinline__ uint32_t byte_of(uint32_t v, int k) { return (v >> (8 * k)) & 0xffu; }

__device__ __forceinline__ float f16_bits_to_f(uint32_t bits) {
  return __half2float(__ushort_as_half(static_cast<unsigned short>(bits)));
}

// The 6-bit scale and min of q4_k sub-block `is` (0..7) from the 12 scale bytes s0 = bytes 0..3, s1 = 4..7, s2 = 8..11
// (ggml's get_scale_min_k4).
__device__ __forceinline__ void kq_scale_min(int is, uint32_t s0, uint32_t s1, uint32_t s2, float& sc, float& m) {
  if (is < 4) {
    sc = static_cast<float>(byte_of(s0, is) & 63u);
    m = static_cast<float>(byte_of(s1, is) & 63u);
  } else {
    const int k = is - 4;
    sc = static_cast<float>((byte_of(s2, k) & 0xfu) | ((byte_of(s0, k) >> 6) << 4));
    m = static_cast<float>((byte_of(s2, k) >> 4) | ((byte_of(s1, k) >> 6) << 4));
  }
}

// A unit's stored bytes, loaded once (every load issued before any decoding), and its sub-blocks' float scales.
//   q4_k / q5_k: q = quant bytes 32j .. 32j + 31 of the block (q[0..3] the first 16, q[4..7] the next 16), h = q5_k's
//                qh bytes (h[0..3] bytes 0..15, h[4..7] 16..31), s[0], s[1] = d*sc and -dmin*m of sub-block 2j,
//                s[2], s[3] of sub-block 2j + 1, j = the unit's index in its block.
//   q6_k:        q[0..3] = ql at the unit, q[4..7] = ql 32 bytes on, h[0..3] = qh at the unit, s[k] = d*sc of group k.
template <WeightFormat F>
struct KqUnitRaw {
  static constexpr bool kQ5 = F == WeightFormat::Q5_K;
  uint32_t q[8];
  uint32_t h[kQ5 ? 8 : (F == WeightFormat::Q6_K ? 4 : 1)];
  float s[4];
  int j;
};

template <WeightFormat F>
__device__ __forceinline__ void kq_unit_load(const QuantMatrix& w, int64_t o, int64_t u, KqUnitRaw<F>& r) {
  const int64_t nb = w.cols / 256, b = u >> 2;
  if constexpr (F != WeightFormat::Q6_K) {
    constexpr bool Q5 = F == WeightFormat::Q5_K;
    const uint8_t* blk = w.q + (o * nb + b) * (Q5 ? 176 : 144);
    const int j = static_cast<int>(u & 3);
    const uint8_t* qs = blk + (Q5 ? 48 : 16) + 32 * j;
    const uint4 hdr = __ldg(reinterpret_cast<const uint4*>(blk));
    const uint4 qa = __ldg(reinterpret_cast<const uint4*>(qs));
    const uint4 qb = __ldg(reinterpret_cast<const uint4*>(qs + 16));
    r.q[0] = qa.x, r.q[1] = qa.y, r.q[2] = qa.z, r.q[3] = qa.w;
    r.q[4] = qb.x, r.q[5] = qb.y, r.q[6] = qb.z, r.q[7] = qb.w;
    if constexpr (Q5) {
      const uint4 ha = __ldg(reinterpret_cast<const uint4*>(blk + 16));
      const uint4 hb = __ldg(reinterpret_cast<const uint4*>(blk + 32));
      r.h[0] = ha.x, r.h[1] = ha.y, r.h[2] = ha.z, r.h[3] = ha.w;
      r.h[4] = hb.x, r.h[5] = hb.y, r.h[6] = hb.z, r.h[7] = hb.w;
    }
    const float d = f16_bits_to_f(hdr.x & 0xffffu), dmin = f16_bits_to_f(hdr.x >> 16);
    float sc1, m1, sc2, m2;
    kq_scale_min(2 * j, hdr.y, hdr.z, hdr.w, sc1, m1);
    kq_scale_min(2 * j + 1, hdr.y, hdr.z, hdr.w, sc2, m2);
    r.s[0] = __fmul_rn(d, sc1), r.s[1] = -__fmul_rn(dmin, m1);
    r.s[2] = __fmul_rn(d, sc2), r.s[3] = -__fmul_rn(dmin, m2);
    r.j = j;
  } else {
    const int64_t rows = w.rows, cols = w.cols;
    const int h = static_cast<int>((u >> 1) & 1), g2 = static_cast<int>(u & 1);
    const uint8_t* ql = w.q + o * (cols / 2) + b * 128 + 64 * h + 16 * g2;
    const uint8_t* qh = w.q + rows * (cols / 2) + o * (cols / 4) + b * 64 + 32 * h + 16 * g2;
    const int8_t* sc = reinterpret_cast<const int8_t*>(w.q + rows * (cols / 2) + rows * (cols / 4)) + o * (cols / 16) +
                       b * 16 + 8 * h + g2;
    const __half* dd =
        reinterpret_cast<const __half*>(w.q + rows * (cols / 2) + rows * (cols / 4) + rows * (cols / 16));
    const uint4 va = __ldg(reinterpret_cast<const uint4*>(ql));
    const uint4 vb = __ldg(reinterpret_cast<const uint4*>(ql + 32));
    const uint4 vh = __ldg(reinterpret_cast<const uint4*>(qh));
    const float d = __half2float(__ldg(dd + o * nb + b));
    r.q[0] = va.x, r.q[1] = va.y, r.q[2] = va.z, r.q[3] = va.w;
    r.q[4] = vb.x, r.q[5] = vb.y, r.q[6] = vb.z, r.q[7] = vb.w;
    r.h[0] = vh.x, r.h[1] = vh.y, r.h[2] = vh.z, r.h[3] = vh.w;
#pragma unroll
    for (int k = 0; k < 4; ++k) r.s[k] = __fmul_rn(d, static_cast<float>(__ldg(sc + 2 * k)));
    r.j = 0;
  }
}

// Group G (0..3) of a loaded unit: its 16 dequantized elements (out[l] = element 16 G + l of the unit), ggml's values.
//   q4_k / q5_k: G 0 = low nibbles of q[0..3] (sub-block 2j), 1 = low nibbles of q[4..7] (2j), 2 = high nibbles of
//                q[0..3] (2j + 1), 3 = high nibbles of q[4..7] (2j + 1); q5_k's fifth bit from h (bit 2j or 2j + 1).
//   q6_k:        G 0 = low nibbles of ql | qh bits 0-1, 1 = low nibbles 32 bytes on | bits 2-3, 2 = high nibbles |
//                bits 4-5, 3 = high nibbles 32 bytes on | bits 6-7; minus 32.
// The quant e (0..63) becomes a float without the int-to-float conversion: the float whose mantissa holds e above 2^23,
// minus 2^23 (or 2^23 + 32 for q6_k's e - 32), every step exact (Sterbenz), so the values are those of float(e).
template <WeightFormat F, int G>
__device__ __forceinline__ void kq_group(const KqUnitRaw<F>& r, float* out) {
  constexpr int kw = (G & 1) ? 4 : 0;  // which 16 quant bytes
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    // The 4 quants of bytes 4k .. 4k + 3, one per byte (each < 64), decoded a word at a time.
    const uint32_t v = r.q[kw + k];
    uint32_t e = G < 2 ? (v & 0x0f0f0f0fu) : ((v >> 4) & 0x0f0f0f0fu);
    if constexpr (F == WeightFormat::Q5_K) e |= ((r.h[kw + k] >> (2 * r.j + (G >> 1))) & 0x01010101u) << 4;
    if constexpr (F == WeightFormat::Q6_K) e |= ((r.h[k] >> (2 * G)) & 0x03030303u) << 4;
#pragma unroll
    for (int t = 0; t < 4; ++t) {
      // Byte t of e as the low byte of the float 2^23 + e_t (byte_perm: e's byte t, then two zero bytes, then 0x4B).
      const float f = __uint_as_float(__byte_perm(e, 0x4B000000u, 0x7540u | t));
      if constexpr (F != WeightFormat::Q6_K)
        out[4 * k + t] = __fmaf_rn(r.s[G < 2 ? 0 : 2], __fsub_rn(f, 8388608.0f), r.s[G < 2 ? 1 : 3]);
      else
        out[4 * k + t] = __fmul_rn(r.s[G], __fsub_rn(f, 8388608.0f + 32.0f));
    }
  }
}

// The 64 dequantized elements of unit u of row o, group after group (out[16 g + l]).
template <WeightFormat F>
__device__ __forceinline__ void kq_unit(const QuantMatrix& w, int64_t o, int64_t u, float* out) {
  KqUnitRaw<F> r;
  kq_unit_load<F>(w, o, u, r);
  kq_group<F, 0>(r, out);
  kq_group<F, 1>(r, out + 16);
  kq_group<F, 2>(r, out + 32);
  kq_group<F, 3>(r, out + 48);
}

}  // namespace mambacpp::cuda
