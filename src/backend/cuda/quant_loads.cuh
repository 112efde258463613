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

// The 64 dequantized elements of unit u of row o, group after group (out[16 g + l]).
template <WeightFormat F>
__device__ __forceinline__ void kq_unit(const QuantMatrix& w, int64_t o, int64_t u, float* out) {
  const int64_t nb = w.cols / 256, b = u >> 2;
  if constexpr (F != WeightFormat::Q6_K) {
    constexpr bool Q5 = F == WeightFormat::Q5_K;
    const uint8_t* blk = w.q + (o * nb + b) * (Q5 ? 176 : 144);
    const uint4 hdr = __ldg(reinterpret_cast<const uint4*>(blk));
    const int j = static_cast<int>(u & 3);
    const uint8_t* qs = blk + (Q5 ? 48 : 16) + 32 * j;
    const uint4 qa = __ldg(reinterpret_cast<const uint4*>(qs));
    const uint4 qb = __ldg(reinterpret_cast<const uint4*>(qs + 16));
    // q5_k's fifth bits: qh[l] bit 2j for element 64j + l, bit 2j + 1 for element 64j + 32 + l (l < 32).
    uint4 ha = make_uint4(0, 0, 0, 0), hb = ha;
    if constexpr (Q5) {
      ha = __ldg(reinterpret_cast<const uint4*>(blk + 16));
      hb = __ldg(reinterpret_cast<const uint4*>(blk + 32));
    }
    const float d = f16_bits_to_f(hdr.x & 0xffffu), dmin = f16_bits_to_f(hdr.x >> 16);
    float sc1, m1, sc2, m2;
    kq_scale_min(2 * j, hdr.y, hdr.z, hdr.w, sc1, m1);
    kq_scale_min(2 * j + 1, hdr.y, hdr.z, hdr.w, sc2, m2);
    const float d1 = __fmul_rn(d, sc1), nm1 = -__fmul_rn(dmin, m1);
    const float d2 = __fmul_rn(d, sc2), nm2 = -__fmul_rn(dmin, m2);
    const uint32_t a[4] = {qa.x, qa.y, qa.z, qa.w}, c[4] = {qb.x, qb.y, qb.z, qb.w};
    const uint32_t h0[4] = {ha.x, ha.y, ha.z, ha.w}, h1[4] = {hb.x, hb.y, hb.z, hb.w};
#pragma unroll
    for (int k = 0; k < 4; ++k)
#pragma unroll
      for (int t = 0; t < 4; ++t) {
        const int l = 4 * k + t;
        uint32_t e0 = byte_of(a[k], t) & 0xfu, e1 = byte_of(c[k], t) & 0xfu;
        uint32_t e2 = byte_of(a[k], t) >> 4, e3 = byte_of(c[k], t) >> 4;
        if constexpr (Q5) {
          e0 += ((byte_of(h0[k], t) >> (2 * j)) & 1u) << 4;
          e1 += ((byte_of(h1[k], t) >> (2 * j)) & 1u) << 4;
          e2 += ((byte_of(h0[k], t) >> (2 * j + 1)) & 1u) << 4;
          e3 += ((byte_of(h1[k], t) >> (2 * j + 1)) & 1u) << 4;
        }
        out[l] = __fmaf_rn(d1, static_cast<float>(e0), nm1);
        out[16 + l] = __fmaf_rn(d1, static_cast<float>(e1), nm1);
        out[32 + l] = __fmaf_rn(d2, static_cast<float>(e2), nm2);
        out[48 + l] = __fmaf_rn(d2, static_cast<float>(e3), nm2);
      }
  } else {
    const int64_t rows = w.rows, cols = w.cols;
    const int h = static_cast<int>((u >> 1) & 1), g2 = static_cast<int>(u & 1);
    const uint8_t* ql = w.q + o * (cols / 2) + b * 128 + 64 * h + 16 * g2;
    const uint8_t* qh = w.q + rows * (cols / 2) + o * (cols / 4) + b * 64 + 32 * h + 16 * g2;
    const int8_t* sc = reinterpret_cast<const int8_t*>(w.q + rows * (cols / 2) + rows * (cols / 4)) + o * (cols / 16) +
                       b * 16 + 8 * h + g2;
    const __half* dd =
        reinterpret_cast<const __half*>(w.q + rows * (cols / 2) + rows * (cols / 4) + rows * (cols / 16));
    const float d = __half2float(dd[o * nb + b]);
    const uint4 va = __ldg(reinterpret_cast<const uint4*>(ql));
    const uint4 vb = __ldg(reinterpret_cast<const uint4*>(ql + 32));
    const uint4 vh = __ldg(reinterpret_cast<const uint4*>(qh));
    float ds[4];
#pragma unroll
    for (int k = 0; k < 4; ++k) ds[k] = __fmul_rn(d, static_cast<float>(__ldg(sc + 2 * k)));
    const uint32_t a[4] = {va.x, va.y, va.z, va.w}, c[4] = {vb.x, vb.y, vb.z, vb.w}, hh[4] = {vh.x, vh.y, vh.z, vh.w};
#pragma unroll
    for (int k = 0; k < 4; ++k)
#pragma unroll
      for (int t = 0; t < 4; ++t) {
        const int l = 4 * k + t;
        const uint32_t A = byte_of(a[k], t), C = byte_of(c[k], t), H = byte_of(hh[k], t);
        const int q0 = static_cast<int>((A & 0xfu) | ((H & 3u) << 4)) - 32;
        const int q1 = static_cast<int>((C & 0xfu) | (((H >> 2) & 3u) << 4)) - 32;
        const int q2 = static_cast<int>((A >> 4) | (((H >> 4) & 3u) << 4)) - 32;
        const int q3 = static_cast<int>((C >> 4) | (((H >> 6) & 3u) << 4)) - 32;
        out[l] = __fmul_rn(ds[0], static_cast<float>(q0));
        out[16 + l] = __fmul_rn(ds[1], static_cast<float>(q1));
        out[32 + l] = __fmul_rn(ds[2], static_cast<float>(q2));
        out[48 + l] = __fmul_rn(ds[3], static_cast<float>(q3));
      }
  }
}

}  // namespace mambacpp::cuda
