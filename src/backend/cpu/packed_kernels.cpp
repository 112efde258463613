// The kernels of packed_kernels.h, compiled for every x86 target Highway knows (foreach_target re-includes this file
// per target) and dispatched like simd_kernels.cpp.
//
// A row is walked in chunks of 256 elements (one K-quant super-block, or eight 32-element blocks; the last chunk of a
// 32-block format may be shorter). Dequantization (Q8_0, Q4_K, Q6_K: the embeddings' rows): a chunk's per-block
// scales are decoded once into small arrays (scalar, in ggml's float order), then each vector of L weights is decoded
// in registers from its quant bits and scaled, with the same float operations ggml_dequantize_row performs, so it
// holds exactly the floats the reference kernel would. The f32-activation dot (the formats without an int8 kernel)
// runs dot_rows' accumulation over each chunk dequantized by ggml_dequantize_row: vector block b of the row into
// accumulator b % 4, the last partial pass into a0, a1, a2, then (a0 + a1) + (a2 + a3) and SumOfLanes. 256 is a whole
// number of passes (4 L floats) on every x86 target, so only the row's end has a partial pass, as in dot_rows.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "backend/cpu/packed_kernels.cpp"
#include "hwy/foreach_target.h"  // IWYU pragma: keep

#include "hwy/highway.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include "backend/cpu/packed_kernels.h"
#include "backend/cpu/simd_load-inl.h"
#include "core/ggml_blocks.h"
#include "mambacpp/dtype.h"
#include "mambacpp/error.h"

HWY_BEFORE_NAMESPACE();
namespace mambacpp::cpu::simd {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

constexpr int64_t kChunk = 256;
static_assert(kChunk % HWY_MAX_BYTES == 0, "a chunk must hold whole passes of four vectors");

using DI8 = hn::Rebind<int8_t, DF>;
using DU8 = hn::Rebind<uint8_t, DF>;

// An f16 scale as f32: normal halves by moving the bits into place (exact), the rest (zero, subnormal, inf, NaN)
// through the library conversion, so a NaN or infinite scale reaches the dot product as it is.
HWY_INLINE float half_at(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  const uint32_t e = h & 0x7c00u;
  if (e == 0 || e == 0x7c00u) return f16_to_f32(h);
  const uint32_t bits = (static_cast<uint32_t>(h & 0x8000u) << 16) | ((static_cast<uint32_t>(h & 0x7fffu) << 13) + 0x38000000u);
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

// out[j] = d * q[j] for j < n (one f32 multiply each, as the scalar d * q), in vectors where n is a multiple of L.
template <class Q>
HWY_INLINE void scale_bytes(float d, const Q* q, int64_t n, float* out) {
  const DF df;
  const int64_t L = static_cast<int64_t>(hn::Lanes(df));
  if (n % L != 0) {
    for (int64_t j = 0; j < n; ++j) out[j] = d * q[j];
    return;
  }
  using D8 = hn::Rebind<Q, DF>;
  using D32 = hn::Rebind<hwy::MakeSigned<int32_t>, DF>;
  const VF dv = hn::Set(df, d);
  for (int64_t j = 0; j < n; j += L) {
    const auto v = hn::PromoteTo(hn::Rebind<hwy::MakeWide<hwy::MakeWide<Q>>, DF>(), hn::LoadU(D8(), q + j));
    hn::StoreU(hn::Mul(dv, hn::ConvertTo(df, hn::BitCast(D32(), v))), df, out + j);
  }
}

// L unsigned bytes at p as u32 lanes.
HWY_INLINE hn::Vec<DU> load_u8(const uint8_t* p) { return hn::PromoteTo(DU(), hn::LoadU(DU8(), p)); }

// q8_0: 8 blocks of {d f16, qs i8[32]}; x = q * d.
struct Q8_0 {
  float ds[8];
  const uint8_t* b;
  static int64_t chunk_bytes() { return 8 * 34; }
  HWY_INLINE void prepare(const uint8_t* chunk, int64_t n) {
    b = chunk;
    for (int64_t k = 0; k < n / 32; ++k) ds[k] = half_at(chunk + 34 * k);
  }
  HWY_INLINE VF vec(DF df, int64_t e) const {
    const uint8_t* p = b + 34 * (e >> 5) + 2 + (e & 31);
    const VF q = hn::ConvertTo(df, hn::PromoteTo(DI(), hn::LoadU(DI8(), reinterpret_cast<const int8_t*>(p))));
    return hn::Mul(q, hn::Set(df, ds[e >> 5]));
  }
};

// q4_k: {d f16, dmin f16, scales u8[12], qs u8[128]}; element 64 g + 32 h + l is nibble h of qs[32 g + l], in
// sub-block 2 g + h: x = (d * sc) * q - dmin * m.
struct Q4_K {
  float ds[8], dm[8];
  const uint8_t* qs;
  static int64_t chunk_bytes() { return 144; }
  HWY_INLINE void prepare(const uint8_t* chunk, int64_t) {
    const float d = half_at(chunk), dmin = half_at(chunk + 2);
    const uint8_t* s = chunk + 4;
    HWY_ALIGN uint8_t sc[8], m[8];
    for (int j = 0; j < 4; ++j) {
      sc[j] = s[j] & 63;
      m[j] = s[j + 4] & 63;
      sc[j + 4] = static_cast<uint8_t>((s[j + 8] & 0xF) | ((s[j] >> 6) << 4));
      m[j + 4] = static_cast<uint8_t>((s[j + 8] >> 4) | ((s[j + 4] >> 6) << 4));
    }
    scale_bytes(d, sc, 8, ds);
    scale_bytes(dmin, m, 8, dm);
    qs = chunk + 16;
  }
  HWY_INLINE VF vec(DF df, int64_t e) const {
    const int64_t sb = e >> 5;
    const auto u = load_u8(qs + 32 * (e >> 6) + (e & 31));
    const auto q = hn::And(hn::ShiftRightSame(u, static_cast<int>((sb & 1) * 4)), hn::Set(DU(), 0xFu));
    return hn::Sub(hn::Mul(hn::Set(df, ds[sb]), hn::ConvertTo(df, hn::BitCast(DI(), q))), hn::Set(df, dm[sb]));
  }
};

// q6_k: {ql u8[128], qh u8[64], scales i8[16], d f16}; element 128 h + 32 k + l (k < 4, l < 32) has its low four bits
// in nibble k / 2 of ql[64 h + 32 (k % 2) + l] and its top two in bits 2 k of qh[32 h + l]; it lies in sub-block
// (element / 16): x = (d * sc) * (q - 32).
struct Q6_K {
  float ds[16];
  const uint8_t* b;
  static int64_t chunk_bytes() { return 210; }
  HWY_INLINE void prepare(const uint8_t* chunk, int64_t) {
    b = chunk;
    const float d = half_at(chunk + 208);
    const int8_t* sc = reinterpret_cast<const int8_t*>(chunk + 192);
    scale_bytes(d, sc, 16, ds);
  }
  HWY_INLINE VF vec(DF df, int64_t e) const {
    const int64_t h = e >> 7, k = (e >> 5) & 3, l = e & 31;
    const auto lo = hn::And(hn::ShiftRightSame(load_u8(b + 64 * h + 32 * (k & 1) + l), static_cast<int>(4 * (k >> 1))),
                            hn::Set(DU(), 0xFu));
    const auto hi = hn::And(hn::ShiftRightSame(load_u8(b + 128 + 32 * h + l), static_cast<int>(2 * k)),
                            hn::Set(DU(), 3u));
    const auto q = hn::Sub(hn::BitCast(DI(), hn::Or(lo, hn::ShiftLeft<4>(hi))), hn::Set(DI(), 32));
    return hn::Mul(hn::ConvertTo(df, q), hn::Set(df, ds[e >> 4]));
  }
};

// Any other block format: the chunk dequantized by ggml_dequantize_row into a buffer, read back as vectors.
struct ViaReference {
  WeightFormat f;
  int64_t bytes;
  HWY_ALIGN float buf[kChunk];
  explicit ViaReference(WeightFormat fmt) : f(fmt) {
    const WeightFormatInfo& info = weight_format_info(fmt);
    bytes = kChunk / info.block_elems * info.block_bytes;
  }
  int64_t chunk_bytes() const { return bytes; }
  void prepare(const uint8_t* chunk, int64_t n) { ggml_dequantize_row(f, chunk, n, buf); }
  HWY_INLINE VF vec(DF df, int64_t e) const { return hn::Load(df, buf + e); }
  HWY_INLINE void dot_chunk(DF df, const float* HWY_RESTRICT x, VF& a0, VF& a1, VF& a2, VF& a3) const {
    const int64_t L = static_cast<int64_t>(hn::Lanes(df));
    for (int64_t e = 0; e < kChunk; e += 4 * L)
    {
      a0 = hn::MulAdd(hn::LoadU(df, x + e), vec(df, e), a0);
      a1 = hn::MulAdd(hn::LoadU(df, x + e + L), vec(df, e + L), a1);
      a2 = hn::MulAdd(hn::LoadU(df, x + e + 2 * L), vec(df, e + 2 * L), a2);
      a3 = hn::MulAdd(hn::LoadU(df, x + e + 3 * L), vec(df, e + 3 * L), a3);
    }
  }
};

template <class F>
HWY_INLINE float dot_row_q(F& fmt, const float* HWY_RESTRICT x, const uint8_t* HWY_RESTRICT row, int64_t in) {
  const DF df;
  const int64_t L = static_cast<int64_t>(hn::Lanes(df));
  VF a0 = hn::Zero(df), a1 = hn::Zero(df), a2 = hn::Zero(df), a3 = hn::Zero(df);
  const int64_t cb = fmt.chunk_bytes();
  for (int64_t c0 = 0; c0 < in; c0 += kChunk) {
    const int64_t n = std::min(kChunk, in - c0);
    fmt.prepare(row + (c0 / kChunk) * cb, n);
    const float* xc = x + c0;
    if (n == kChunk) {  // whole chunks: the unrolled kernel, the same vectors into the same accumulators
      fmt.dot_chunk(df, xc, a0, a1, a2, a3);
      continue;
    }
    int64_t e = 0;
    for (; e + 4 * L <= n; e += 4 * L) {
      a0 = hn::MulAdd(hn::LoadU(df, xc + e), fmt.vec(df, e), a0);
      a1 = hn::MulAdd(hn::LoadU(df, xc + e + L), fmt.vec(df, e + L), a1);
      a2 = hn::MulAdd(hn::LoadU(df, xc + e + 2 * L), fmt.vec(df, e + 2 * L), a2);
      a3 = hn::MulAdd(hn::LoadU(df, xc + e + 3 * L), fmt.vec(df, e + 3 * L), a3);
    }
    // Only the row's last chunk can end inside a pass; the rows are whole blocks of 32, so whole vectors.
    const int64_t full = (n - e) / L;
    if (full > 0) a0 = hn::MulAdd(hn::LoadU(df, xc + e), fmt.vec(df, e), a0);
    if (full > 1) a1 = hn::MulAdd(hn::LoadU(df, xc + e + L), fmt.vec(df, e + L), a1);
    if (full > 2) a2 = hn::MulAdd(hn::LoadU(df, xc + e + 2 * L), fmt.vec(df, e + 2 * L), a2);
  }
  return hn::GetLane(hn::SumOfLanes(df, hn::Add(hn::Add(a0, a1), hn::Add(a2, a3))));
}

template <class F>
void dot_rows_q(F& fmt, const float* x, const uint8_t* w, int64_t row_bytes, int64_t in, int64_t rows, float* out) {
  for (int64_t r = 0; r < rows; ++r) out[r] = dot_row_q(fmt, x, w + r * row_bytes, in);
}

template <class F>
void dequantize_rows_q(F& fmt, const uint8_t* w, int64_t row_bytes, int64_t in, int64_t rows, float* dst,
                       int64_t dst_stride) {
  const DF df;
  const int64_t L = static_cast<int64_t>(hn::Lanes(df));
  const int64_t cb = fmt.chunk_bytes();
  for (int64_t r = 0; r < rows; ++r) {
    const uint8_t* row = w + r * row_bytes;
    float* d = dst + r * dst_stride;
    for (int64_t c0 = 0; c0 < in; c0 += kChunk) {
      const int64_t n = std::min(kChunk, in - c0);
      fmt.prepare(row + (c0 / kChunk) * cb, n);
      for (int64_t e = 0; e < n; e += L) hn::StoreU(fmt.vec(df, e), df, d + c0 + e);
    }
  }
}

void PackedDotRows(const float* x, const uint8_t* w, WeightFormat f, int64_t in, int64_t rows, float* out) {
  const int64_t rb = weight_row_bytes(f, in, "packed_dot_rows");
  switch (f) {
    case WeightFormat::Q4_0:
    case WeightFormat::Q5_0:
    case WeightFormat::Q5_1:
    case WeightFormat::Q5_K: {
      ViaReference q(f);
      return dot_rows_q(q, x, w, rb, in, rows, out);
    }
    default: fail("packed_dot_rows: ", weight_format_name(f), " is not a block format with f32 activations");
  }
}

void PackedDequantizeRows(const uint8_t* w, WeightFormat f, int64_t in, int64_t rows, float* dst, int64_t dst_stride) {
  const int64_t rb = weight_row_bytes(f, in, "packed_dequantize_rows");
  switch (f) {
    case WeightFormat::Q8_0: {
      Q8_0 q;
      return dequantize_rows_q(q, w, rb, in, rows, dst, dst_stride);
    }
    case WeightFormat::Q4_K: {
      Q4_K q;
      return dequantize_rows_q(q, w, rb, in, rows, dst, dst_stride);
    }
    case WeightFormat::Q6_K: {
      Q6_K q;
      return dequantize_rows_q(q, w, rb, in, rows, dst, dst_stride);
    }
    case WeightFormat::Q4_0:
    case WeightFormat::Q5_0:
    case WeightFormat::Q5_1:
    case WeightFormat::Q5_K:
      for (int64_t r = 0; r < rows; ++r) ggml_dequantize_row(f, w + r * rb, in, dst + r * dst_stride);
      return;
    default: fail("packed_dequantize_rows: ", weight_format_name(f), " is not a block format");
  }
}

}  // namespace HWY_NAMESPACE
}  // namespace mambacpp::cpu::simd
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace mambacpp::cpu::simd {

HWY_EXPORT(PackedDotRows);
HWY_EXPORT(PackedDequantizeRows);

bool packed_in_registers(WeightFormat f) {
  return f == WeightFormat::Q8_0 || f == WeightFormat::Q4_K || f == WeightFormat::Q6_K;
}

void packed_dot_rows(const float* x, const uint8_t* w, WeightFormat f, int64_t in, int64_t rows, float* out) {
  HWY_DYNAMIC_DISPATCH(PackedDotRows)(x, w, f, in, rows, out);
}

void packed_dequantize_rows(const uint8_t* w, WeightFormat f, int64_t in, int64_t rows, float* dst,
                            int64_t dst_stride) {
  HWY_DYNAMIC_DISPATCH(PackedDequantizeRows)(w, f, in, rows, dst, dst_stride);
}

}  // namespace mambacpp::cpu::simd
#endif  // HWY_ONCE
