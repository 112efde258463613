// Written from the formats' definitions in ggml (ggml-common.h, ggml-quants.c); the arithmetic keeps ggml's order of
// float operations, which is what makes the bytes identical: this file is built with -ffp-contract=off (no fused
// multiply-adds), as ggml's reference quantizers are (they live in ggml-base, built without -march flags).
#include "core/ggml_blocks.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "mambacpp/dtype.h"
#include "mambacpp/error.h"

namespace mambacpp {

namespace {

constexpr int kQK = 32;    // elements of a q8_0 / q4_0 / q5_0 / q5_1 block
constexpr int kQKK = 256;  // elements of a K-quant super-block
constexpr float kGroupMaxEps = 1e-15f;

void put_f16(uint8_t* p, float v) {
  const uint16_t h = f32_to_f16(v);
  std::memcpy(p, &h, 2);
}
float get_f16(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return f16_to_f32(h);
}

// Round to nearest, ties to even, for |v| < 2^22: ggml's nearest_int (adding 1.5 * 2^23 leaves the integer in the
// mantissa). Out of that range the result is as meaningless as ggml's, and the same bits.
int nearest_int(float v) {
  const float t = v + 12582912.f;
  int32_t i;
  std::memcpy(&i, &t, 4);
  return (i & 0x007fffff) - 0x00400000;
}

// ---- 32-element blocks ---------------------------------------------------------------------------------------------

void quantize_q8_0(const float* x, uint8_t* b) {
  float amax = 0.0f;
  for (int j = 0; j < kQK; ++j) amax = std::max(amax, std::fabs(x[j]));
  const float d = amax / 127;
  const float id = d != 0.0f ? 1.0f / d : 0.0f;
  put_f16(b, d);
  for (int j = 0; j < kQK; ++j) b[2 + j] = static_cast<uint8_t>(static_cast<int8_t>(std::round(x[j] * id)));
}
void dequantize_q8_0(const uint8_t* b, float* y) {
  const float d = get_f16(b);
  for (int j = 0; j < kQK; ++j) y[j] = static_cast<int8_t>(b[2 + j]) * d;
}

// The signed value of largest magnitude (the first one on ties), as q4_0 and q5_0 scale by it.
float signed_absmax(const float* x) {
  float amax = 0.0f, max = 0.0f;
  for (int j = 0; j < kQK; ++j)
    if (amax < std::fabs(x[j])) {
      amax = std::fabs(x[j]);
      max = x[j];
    }
  return max;
}

void quantize_q4_0(const float* x, uint8_t* b) {
  const float d = signed_absmax(x) / -8;
  const float id = d != 0.0f ? 1.0f / d : 0.0f;
  put_f16(b, d);
  for (int j = 0; j < kQK / 2; ++j) {
    const float x0 = x[j] * id, x1 = x[kQK / 2 + j] * id;
    const uint8_t q0 = static_cast<uint8_t>(std::min<int>(15, static_cast<int8_t>(x0 + 8.5f)));
    const uint8_t q1 = static_cast<uint8_t>(std::min<int>(15, static_cast<int8_t>(x1 + 8.5f)));
    b[2 + j] = static_cast<uint8_t>(q0 | (q1 << 4));
  }
}
void dequantize_q4_0(const uint8_t* b, float* y) {
  const float d = get_f16(b);
  for (int j = 0; j < kQK / 2; ++j) {
    y[j] = ((b[2 + j] & 0x0F) - 8) * d;
    y[j + kQK / 2] = ((b[2 + j] >> 4) - 8) * d;
  }
}

// Stores 32 five-bit values: low nibbles in qs (element j and j + 16 share byte j), fifth bits in the u32 qh.
void pack_5bit(const uint8_t* q, uint8_t* qh_bytes, uint8_t* qs) {
  uint32_t qh = 0;
  for (int j = 0; j < kQK / 2; ++j) {
    const uint8_t q0 = q[j], q1 = q[j + kQK / 2];
    qs[j] = static_cast<uint8_t>((q0 & 0x0F) | ((q1 & 0x0F) << 4));
    qh |= ((q0 & 0x10u) >> 4) << j;
    qh |= ((q1 & 0x10u) >> 4) << (j + kQK / 2);
  }
  std::memcpy(qh_bytes, &qh, 4);
}
void unpack_5bit(const uint8_t* qh_bytes, const uint8_t* qs, int* q) {
  uint32_t qh;
  std::memcpy(&qh, qh_bytes, 4);
  for (int j = 0; j < kQK / 2; ++j) {
    q[j] = (qs[j] & 0x0F) | static_cast<int>(((qh >> j) << 4) & 0x10);
    q[j + kQK / 2] = (qs[j] >> 4) | static_cast<int>((qh >> (j + 12)) & 0x10);
  }
}

void quantize_q5_0(const float* x, uint8_t* b) {
  const float d = signed_absmax(x) / -16;
  const float id = d != 0.0f ? 1.0f / d : 0.0f;
  put_f16(b, d);
  uint8_t q[kQK];
  for (int j = 0; j < kQK; ++j)
    q[j] = static_cast<uint8_t>(std::min<int>(31, static_cast<int8_t>(x[j] * id + 16.5f)));
  pack_5bit(q, b + 2, b + 6);
}
void dequantize_q5_0(const uint8_t* b, float* y) {
  const float d = get_f16(b);
  int q[kQK];
  unpack_5bit(b + 2, b + 6, q);
  for (int j = 0; j < kQK; ++j) y[j] = (q[j] - 16) * d;
}

void quantize_q5_1(const float* x, uint8_t* b) {
  float min = x[0], max = x[0];
  for (int j = 1; j < kQK; ++j) {
    min = std::min(min, x[j]);
    max = std::max(max, x[j]);
  }
  const float d = (max - min) / 31;
  const float id = d != 0.0f ? 1.0f / d : 0.0f;
  put_f16(b, d);
  put_f16(b + 2, min);
  uint8_t q[kQK];
  for (int j = 0; j < kQK; ++j) q[j] = static_cast<uint8_t>((x[j] - min) * id + 0.5f);
  pack_5bit(q, b + 4, b + 8);
}
void dequantize_q5_1(const uint8_t* b, float* y) {
  const float d = get_f16(b), m = get_f16(b + 2);
  int q[kQK];
  unpack_5bit(b + 4, b + 8, q);
  for (int j = 0; j < kQK; ++j) y[j] = q[j] * d + m;
}

// ---- K-quants ------------------------------------------------------------------------------------------------------

// ggml's make_qx_quants for rmse_type 1 without importance weights (w = x^2): symmetric levels in [-nmax, nmax - 1],
// the scale refined over 18 trial inverse scales by weighted least squares. L gets level + nmax.
float make_qx_quants(int n, int nmax, const float* x, int8_t* L) {
  float max = 0, amax = 0;
  for (int i = 0; i < n; ++i) {
    const float ax = std::fabs(x[i]);
    if (ax > amax) {
      amax = ax;
      max = x[i];
    }
  }
  if (amax < kGroupMaxEps) {
    for (int i = 0; i < n; ++i) L[i] = 0;
    return 0.f;
  }
  float iscale = -nmax / max;
  float sumlx = 0, suml2 = 0;
  for (int i = 0; i < n; ++i) {
    int l = nearest_int(iscale * x[i]);
    l = std::max(-nmax, std::min(nmax - 1, l));
    L[i] = static_cast<int8_t>(l + nmax);
    const float w = x[i] * x[i];
    sumlx += w * x[i] * l;
    suml2 += w * l * l;
  }
  float scale = suml2 != 0.0f ? sumlx / suml2 : 0.0f;
  float best = scale * sumlx;
  for (int is = -9; is <= 9; ++is) {
    if (is == 0) continue;
    iscale = -(nmax + 0.1f * is) / max;
    sumlx = suml2 = 0;
    for (int i = 0; i < n; ++i) {
      int l = nearest_int(iscale * x[i]);
      l = std::max(-nmax, std::min(nmax - 1, l));
      const float w = x[i] * x[i];
      sumlx += w * x[i] * l;
      suml2 += w * l * l;
    }
    if (suml2 > 0 && sumlx * sumlx > best * suml2) {
      for (int i = 0; i < n; ++i) {
        const int l = nearest_int(iscale * x[i]);
        L[i] = static_cast<int8_t>(nmax + std::max(-nmax, std::min(nmax - 1, l)));
      }
      scale = sumlx / suml2;
      best = scale * sumlx;
    }
  }
  return scale;
}

// ggml's make_qkx2_quants: levels in [0, nmax] of x - min (min <= 0), scale and min fitted by weighted least squares
// over nstep + 1 trial inverse scales; returns the scale, *the_min gets -min.
float make_qkx2_quants(int n, int nmax, const float* x, const float* weights, uint8_t* L, float* the_min,
                       uint8_t* Laux, float rmin, float rdelta, int nstep) {
  float min = x[0], max = x[0];
  float sum_w = weights[0];
  float sum_x = sum_w * x[0];
  for (int i = 1; i < n; ++i) {
    if (x[i] < min) min = x[i];
    if (x[i] > max) max = x[i];
    const float w = weights[i];
    sum_w += w;
    sum_x += w * x[i];
  }
  if (min > 0) min = 0;
  if (max == min) {
    for (int i = 0; i < n; ++i) L[i] = 0;
    *the_min = -min;
    return 0.f;
  }
  float iscale = nmax / (max - min);
  float scale = 1 / iscale;
  float best_error = 0;
  for (int i = 0; i < n; ++i) {
    const int l = nearest_int(iscale * (x[i] - min));
    L[i] = static_cast<uint8_t>(std::max(0, std::min(nmax, l)));
    float diff = scale * L[i] + min - x[i];
    diff = diff * diff;
    best_error += weights[i] * diff;
  }
  for (int is = 0; is <= nstep; ++is) {
    iscale = (rmin + rdelta * is + nmax) / (max - min);
    float sum_l = 0, sum_l2 = 0, sum_xl = 0;
    for (int i = 0; i < n; ++i) {
      int l = nearest_int(iscale * (x[i] - min));
      l = std::max(0, std::min(nmax, l));
      Laux[i] = static_cast<uint8_t>(l);
      const float w = weights[i];
      sum_l += w * l;
      sum_l2 += w * l * l;
      sum_xl += w * l * x[i];
    }
    const float D = sum_w * sum_l2 - sum_l * sum_l;
    if (D > 0) {
      float this_scale = (sum_w * sum_xl - sum_x * sum_l) / D;
      float this_min = (sum_l2 * sum_x - sum_l * sum_xl) / D;
      if (this_min > 0) {
        this_min = 0;
        this_scale = sum_xl / sum_l2;
      }
      float cur_error = 0;
      for (int i = 0; i < n; ++i) {
        float diff = this_scale * Laux[i] + this_min - x[i];
        diff = diff * diff;
        cur_error += weights[i] * diff;
      }
      if (cur_error < best_error) {
        for (int i = 0; i < n; ++i) L[i] = Laux[i];
        best_error = cur_error;
        scale = this_scale;
        min = this_min;
      }
    }
  }
  *the_min = -min;
  return scale;
}

// The 6-bit scale and min of sub-block j (0..7) from the 12 packed bytes of q4_k / q5_k.
void scale_min_k4(int j, const uint8_t* q, uint8_t* d, uint8_t* m) {
  if (j < 4) {
    *d = q[j] & 63;
    *m = q[j + 4] & 63;
  } else {
    *d = static_cast<uint8_t>((q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4));
    *m = static_cast<uint8_t>((q[j + 4] >> 4) | ((q[j - 0] >> 6) << 4));
  }
}

// The shared first half of q4_k and q5_k: per-sub-block scales and mins, packed into d, dmin and scales[12], then the
// levels re-derived from the stored (rounded) scales. `nmax` is 15 or 31.
void quantize_k_scales(const float* x, int nmax, float rmin, int nstep, uint8_t* dd, uint8_t* scales_out,
                       uint8_t* L) {
  uint8_t Laux[32];
  float weights[32], mins[kQKK / 32], scales[kQKK / 32];
  float max_scale = 0, max_min = 0;
  for (int j = 0; j < kQKK / 32; ++j) {
    float sum_x2 = 0;
    for (int l = 0; l < 32; ++l) sum_x2 += x[32 * j + l] * x[32 * j + l];
    const float av_x = std::sqrt(sum_x2 / 32);
    for (int l = 0; l < 32; ++l) weights[l] = av_x + std::fabs(x[32 * j + l]);
    scales[j] = make_qkx2_quants(32, nmax, x + 32 * j, weights, L + 32 * j, &mins[j], Laux, rmin, 0.1f, nstep);
    if (scales[j] > max_scale) max_scale = scales[j];
    if (mins[j] > max_min) max_min = mins[j];
  }
  const float inv_scale = max_scale > 0 ? 63.f / max_scale : 0.f;
  const float inv_min = max_min > 0 ? 63.f / max_min : 0.f;
  std::memset(scales_out, 0, 12);
  for (int j = 0; j < kQKK / 32; ++j) {
    uint8_t ls = static_cast<uint8_t>(nearest_int(inv_scale * scales[j]));
    uint8_t lm = static_cast<uint8_t>(nearest_int(inv_min * mins[j]));
    ls = std::min<uint8_t>(63, ls);
    lm = std::min<uint8_t>(63, lm);
    if (j < 4) {
      scales_out[j] = ls;
      scales_out[j + 4] = lm;
    } else {
      scales_out[j + 4] = static_cast<uint8_t>((ls & 0xF) | ((lm & 0xF) << 4));
      scales_out[j - 4] |= static_cast<uint8_t>((ls >> 4) << 6);
      scales_out[j - 0] |= static_cast<uint8_t>((lm >> 4) << 6);
    }
  }
  put_f16(dd, max_scale / 63.f);
  put_f16(dd + 2, max_min / 63.f);
  const float d_all = get_f16(dd), dmin_all = get_f16(dd + 2);
  for (int j = 0; j < kQKK / 32; ++j) {
    uint8_t sc, m;
    scale_min_k4(j, scales_out, &sc, &m);
    const float d = d_all * sc;
    if (d == 0.0f) continue;
    const float dm = dmin_all * m;
    for (int ii = 0; ii < 32; ++ii) {
      const int l = nearest_int((x[32 * j + ii] + dm) / d);
      L[32 * j + ii] = static_cast<uint8_t>(std::max(0, std::min(nmax, l)));
    }
  }
}

void quantize_q4_k(const float* x, uint8_t* b) {
  uint8_t L[kQKK];
  quantize_k_scales(x, 15, -1.f, 20, b, b + 4, L);
  uint8_t* q = b + 16;
  for (int j = 0; j < kQKK; j += 64) {
    for (int l = 0; l < 32; ++l) q[l] = static_cast<uint8_t>(L[j + l] | (L[j + l + 32] << 4));
    q += 32;
  }
}
void dequantize_q4_k(const uint8_t* b, float* y) {
  const float d = get_f16(b), min = get_f16(b + 2);
  const uint8_t* scales = b + 4;
  const uint8_t* q = b + 16;
  for (int j = 0, is = 0; j < kQKK; j += 64, is += 2, q += 32) {
    uint8_t sc, m;
    scale_min_k4(is, scales, &sc, &m);
    const float d1 = d * sc, m1 = min * m;
    scale_min_k4(is + 1, scales, &sc, &m);
    const float d2 = d * sc, m2 = min * m;
    for (int l = 0; l < 32; ++l) *y++ = d1 * (q[l] & 0xF) - m1;
    for (int l = 0; l < 32; ++l) *y++ = d2 * (q[l] >> 4) - m2;
  }
}

void quantize_q5_k(const float* x, uint8_t* b) {
  uint8_t L[kQKK];
  quantize_k_scales(x, 31, -0.5f, 15, b, b + 4, L);
  uint8_t* qh = b + 16;
  uint8_t* ql = b + 48;
  std::memset(qh, 0, 32);
  uint8_t m1 = 1, m2 = 2;
  for (int n = 0; n < kQKK; n += 64) {
    for (int j = 0; j < 32; ++j) {
      int l1 = L[n + j], l2 = L[n + j + 32];
      if (l1 > 15) {
        l1 -= 16;
        qh[j] |= m1;
      }
      if (l2 > 15) {
        l2 -= 16;
        qh[j] |= m2;
      }
      ql[j] = static_cast<uint8_t>(l1 | (l2 << 4));
    }
    m1 = static_cast<uint8_t>(m1 << 2);
    m2 = static_cast<uint8_t>(m2 << 2);
    ql += 32;
  }
}
void dequantize_q5_k(const uint8_t* b, float* y) {
  const float d = get_f16(b), min = get_f16(b + 2);
  const uint8_t* scales = b + 4;
  const uint8_t* qh = b + 16;
  const uint8_t* ql = b + 48;
  uint8_t u1 = 1, u2 = 2;
  for (int j = 0, is = 0; j < kQKK; j += 64, is += 2, ql += 32) {
    uint8_t sc, m;
    scale_min_k4(is, scales, &sc, &m);
    const float d1 = d * sc, m1 = min * m;
    scale_min_k4(is + 1, scales, &sc, &m);
    const float d2 = d * sc, m2 = min * m;
    for (int l = 0; l < 32; ++l) *y++ = d1 * ((ql[l] & 0xF) + (qh[l] & u1 ? 16 : 0)) - m1;
    for (int l = 0; l < 32; ++l) *y++ = d2 * ((ql[l] >> 4) + (qh[l] & u2 ? 16 : 0)) - m2;
    u1 = static_cast<uint8_t>(u1 << 2);
    u2 = static_cast<uint8_t>(u2 << 2);
  }
}

// q6_k: ql at 0, qh at 128, scales at 192, d at 208.
void quantize_q6_k(const float* x, uint8_t* b) {
  int8_t L[kQKK];
  float scales[kQKK / 16];
  float max_scale = 0, max_abs_scale = 0;
  for (int ib = 0; ib < kQKK / 16; ++ib) {
    const float scale = make_qx_quants(16, 32, x + 16 * ib, L + 16 * ib);
    scales[ib] = scale;
    const float abs_scale = std::fabs(scale);
    if (abs_scale > max_abs_scale) {
      max_abs_scale = abs_scale;
      max_scale = scale;
    }
  }
  std::memset(b, 0, 210);
  if (max_abs_scale < kGroupMaxEps) {
    put_f16(b + 208, 0.f);
    return;
  }
  int8_t* sc = reinterpret_cast<int8_t*>(b + 192);
  const float iscale = -128.f / max_scale;
  put_f16(b + 208, 1 / iscale);
  for (int ib = 0; ib < kQKK / 16; ++ib) sc[ib] = static_cast<int8_t>(std::min(127, nearest_int(iscale * scales[ib])));
  const float d_all = get_f16(b + 208);
  for (int j = 0; j < kQKK / 16; ++j) {
    const float d = d_all * sc[j];
    if (d == 0.0f) continue;
    for (int ii = 0; ii < 16; ++ii) {
      const int l = nearest_int(x[16 * j + ii] / d);
      L[16 * j + ii] = static_cast<int8_t>(std::max(-32, std::min(31, l)) + 32);
    }
  }
  uint8_t* ql = b;
  uint8_t* qh = b + 128;
  for (int j = 0; j < kQKK; j += 128, ql += 64, qh += 32) {
    for (int l = 0; l < 32; ++l) {
      const uint8_t q1 = L[j + l] & 0xF, q2 = L[j + l + 32] & 0xF;
      const uint8_t q3 = L[j + l + 64] & 0xF, q4 = L[j + l + 96] & 0xF;
      ql[l] = static_cast<uint8_t>(q1 | (q3 << 4));
      ql[l + 32] = static_cast<uint8_t>(q2 | (q4 << 4));
      qh[l] = static_cast<uint8_t>((L[j + l] >> 4) | ((L[j + l + 32] >> 4) << 2) | ((L[j + l + 64] >> 4) << 4) |
                                   ((L[j + l + 96] >> 4) << 6));
    }
  }
}
void dequantize_q6_k(const uint8_t* b, float* y) {
  const float d = get_f16(b + 208);
  const uint8_t* ql = b;
  const uint8_t* qh = b + 128;
  const int8_t* sc = reinterpret_cast<const int8_t*>(b + 192);
  for (int n = 0; n < kQKK; n += 128, y += 128, ql += 64, qh += 32, sc += 8) {
    for (int l = 0; l < 32; ++l) {
      const int is = l / 16;
      const int q1 = ((ql[l] & 0xF) | (((qh[l] >> 0) & 3) << 4)) - 32;
      const int q2 = ((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32;
      const int q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
      const int q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
      y[l] = d * sc[is] * q1;
      y[l + 32] = d * sc[is + 2] * q2;
      y[l + 64] = d * sc[is + 4] * q3;
      y[l + 96] = d * sc[is + 6] * q4;
    }
  }
}

using QuantFn = void (*)(const float*, uint8_t*);
using DequantFn = void (*)(const uint8_t*, float*);

struct BlockFns {
  QuantFn quant;
  DequantFn dequant;
};

BlockFns block_fns(WeightFormat f) {
  switch (f) {
    case WeightFormat::Q8_0: return {quantize_q8_0, dequantize_q8_0};
    case WeightFormat::Q4_0: return {quantize_q4_0, dequantize_q4_0};
    case WeightFormat::Q5_0: return {quantize_q5_0, dequantize_q5_0};
    case WeightFormat::Q5_1: return {quantize_q5_1, dequantize_q5_1};
    case WeightFormat::Q4_K: return {quantize_q4_k, dequantize_q4_k};
    case WeightFormat::Q5_K: return {quantize_q5_k, dequantize_q5_k};
    case WeightFormat::Q6_K: return {quantize_q6_k, dequantize_q6_k};
    default: fail("ggml block formats: ", weight_format_name(f), " is not a ggml block format");
  }
}

}  // namespace

void ggml_quantize_row(WeightFormat f, const float* x, int64_t n, uint8_t* out) {
  if (is_dense(f)) {
    convert_from_f32(x, out, dense_dtype(f), n);
    return;
  }
  const BlockFns fns = block_fns(f);
  const WeightFormatInfo& info = weight_format_info(f);
  weight_row_bytes(f, n, "ggml_quantize_row");
  for (int64_t b = 0; b < n / info.block_elems; ++b) fns.quant(x + b * info.block_elems, out + b * info.block_bytes);
}

void ggml_dequantize_row(WeightFormat f, const uint8_t* in, int64_t n, float* out) {
  if (is_dense(f)) {
    convert_to_f32(in, dense_dtype(f), out, n);
    return;
  }
  const BlockFns fns = block_fns(f);
  const WeightFormatInfo& info = weight_format_info(f);
  weight_row_bytes(f, n, "ggml_dequantize_row");
  for (int64_t b = 0; b < n / info.block_elems; ++b) fns.dequant(in + b * info.block_bytes, out + b * info.block_elems);
}

}  // namespace mambacpp
