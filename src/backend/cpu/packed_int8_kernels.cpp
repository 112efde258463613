// The int8-activation kernels of packed_kernels.h (Q8_0, Q4_K, Q6_K weights), compiled for every x86 target Highway
// knows (foreach_target re-includes this file per target) and dispatched with the other CPU kernels.
//
// The integer products are exact whatever the instructions, so every target computes the same block sums. The 32-byte
// operations below are written once over a small vector type: AVX2 registers on the AVX2 and AVX-512 targets (the
// 256-bit forms run there too), a pair of SSE registers on SSSE3/SSE4, plain arrays elsewhere (EMU128, SCALAR), all
// with the lane layout of AVX2's maddubs/madd: i32 lane k of a 32-element group holds elements 4k..4k+3. The float
// part (block scale times block sum) then runs in a fixed order per row, the same for any number of rows or tokens.
//
// No product saturates: the unsigned operand of maddubs is at most 128 (|w| of Q8_0) or 63 (Q6_K) or 15 (Q4_K) and the
// activations lie in [-127, 127], so a pair sums to at most 2 * 128 * 127 < 2^15.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "backend/cpu/packed_int8_kernels.cpp"
#include "hwy/foreach_target.h"  // IWYU pragma: keep

#include "hwy/highway.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "backend/cpu/packed_kernels.h"
#include "core/ggml_blocks.h"
#include "mambacpp/dtype.h"
#include "mambacpp/error.h"

#if HWY_ARCH_X86
#include <immintrin.h>
#endif

HWY_BEFORE_NAMESPACE();
namespace mambacpp::cpu::simd {
namespace HWY_NAMESPACE {

// An f16 scale as f32 (normal halves by moving the bits, the rest through the library conversion: NaN/inf stay).
HWY_INLINE float half_f32(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  const uint32_t e = h & 0x7c00u;
  if (e == 0 || e == 0x7c00u) return f16_to_f32(h);
  const uint32_t bits =
      (static_cast<uint32_t>(h & 0x8000u) << 16) | ((static_cast<uint32_t>(h & 0x7fffu) << 13) + 0x38000000u);
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX2
// 32 bytes / 16 i16 / 8 i32 in one AVX2 register.
struct VI {
  __m256i v;
};
struct VF8 {
  __m256 v;
};
HWY_INLINE VI load32(const void* p) { return {_mm256_loadu_si256(static_cast<const __m256i*>(p))}; }
HWY_INLINE VI zero_i() { return {_mm256_setzero_si256()}; }
HWY_INLINE VI set1_8(uint8_t c) { return {_mm256_set1_epi8(static_cast<char>(c))}; }
HWY_INLINE VI set1_16(int16_t c) { return {_mm256_set1_epi16(c)}; }
// i16 lanes 0..7 = lo, 8..15 = hi.
HWY_INLINE VI set_halves16(int16_t lo, int16_t hi) {
  return {_mm256_set_m128i(_mm_set1_epi16(hi), _mm_set1_epi16(lo))};
}
HWY_INLINE VI and_(VI a, VI b) { return {_mm256_and_si256(a.v, b.v)}; }
HWY_INLINE VI or_(VI a, VI b) { return {_mm256_or_si256(a.v, b.v)}; }
template <int n>
HWY_INLINE VI srli16(VI a) {
  return {_mm256_srli_epi16(a.v, n)};
}
template <int n>
HWY_INLINE VI slli16(VI a) {
  return {_mm256_slli_epi16(a.v, n)};
}
HWY_INLINE VI add32(VI a, VI b) { return {_mm256_add_epi32(a.v, b.v)}; }
// b negated where a < 0, zeroed where a == 0 (psignb).
HWY_INLINE VI sign8(VI b, VI a) { return {_mm256_sign_epi8(b.v, a.v)}; }
// i16 lane j = a[2j] * b[2j] + a[2j+1] * b[2j+1], a unsigned, b signed.
HWY_INLINE VI maddubs(VI a, VI b) { return {_mm256_maddubs_epi16(a.v, b.v)}; }
// i32 lane k = a[2k] * b[2k] + a[2k+1] * b[2k+1] over i16 lanes.
HWY_INLINE VI madd16(VI a, VI b) { return {_mm256_madd_epi16(a.v, b.v)}; }
HWY_INLINE VI lane0_i(int32_t v) { return {_mm256_zextsi128_si256(_mm_cvtsi32_si128(v))}; }
HWY_INLINE int32_t hsum_i(VI a) {
  __m128i s = _mm_add_epi32(_mm256_castsi256_si128(a.v), _mm256_extracti128_si256(a.v, 1));
  s = _mm_add_epi32(s, _mm_unpackhi_epi64(s, s));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 1));
  return _mm_cvtsi128_si32(s);
}
// Eight u8 sub-block scales, each to be spread over a whole vector of i16 (K4Scales::get(j)).
struct K4Scales {
  __m256i v;
  explicit K4Scales(const uint8_t* sc) : v(_mm256_broadcastsi128_si256(_mm_cvtepu8_epi16(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(sc))))) {}
  HWY_INLINE VI get(int j) const { return {_mm256_shuffle_epi8(v, _mm256_set1_epi16(static_cast<int16_t>(0x0100 * (2 * j + 1) + 2 * j)))}; }
};
// Sixteen i8 scales: get(j) = i16 lanes 0..7 scale j, 8..15 scale j + 1.
struct K6Scales {
  __m128i v;
  explicit K6Scales(const int8_t* sc) : v(_mm_loadu_si128(reinterpret_cast<const __m128i*>(sc))) {}
  HWY_INLINE VI get(int j) const {
    const __m128i idx = _mm_set_epi64x(0x0101010101010101LL * (j + 1), 0x0101010101010101LL * j);
    return {_mm256_cvtepi8_epi16(_mm_shuffle_epi8(v, idx))};
  }
};
// sum_j a[j] * b[j] over 8 u8 a and 8 i16 b.
HWY_INLINE int32_t dot8_u8_i16(const uint8_t* a, const int16_t* b) {
  __m128i s = _mm_madd_epi16(_mm_cvtepu8_epi16(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(a))),
                             _mm_loadu_si128(reinterpret_cast<const __m128i*>(b)));
  s = _mm_add_epi32(s, _mm_unpackhi_epi64(s, s));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 1));
  return _mm_cvtsi128_si32(s);
}
// sum_j a[j] * b[j] over 16 i8 a and 16 i16 b.
HWY_INLINE int32_t dot16_i8_i16(const int8_t* a, const int16_t* b) {
  const __m256i p = _mm256_madd_epi16(_mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(a))),
                                      _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b)));
  return hsum_i({p});
}
// The f16 pair at p (d, dmin) as f32, by F16C's exact conversion.
HWY_INLINE void half2_f32(const uint8_t* p, float& a, float& b) {
  int32_t bits;
  std::memcpy(&bits, p, 4);
  const __m128 v = _mm_cvtph_ps(_mm_cvtsi32_si128(bits));
  a = _mm_cvtss_f32(v);
  b = _mm_cvtss_f32(_mm_movehdup_ps(v));
}
HWY_INLINE float half1_f32(const uint8_t* p) {
  uint16_t bits;
  std::memcpy(&bits, p, 2);
  return _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(bits)));
}
HWY_INLINE VF8 zero_f() { return {_mm256_setzero_ps()}; }
// c + float(a) * s, lane by lane.
HWY_INLINE VF8 fma_i(VI a, float s, VF8 c) { return {_mm256_fmadd_ps(_mm256_cvtepi32_ps(a.v), _mm256_set1_ps(s), c.v)}; }
HWY_INLINE VF8 add_f(VF8 a, VF8 b) { return {_mm256_add_ps(a.v, b.v)}; }
// ((l0 + l4) + (l2 + l6)) + ((l1 + l5) + (l3 + l7)).
HWY_INLINE float hsum_f(VF8 a) {
  const __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(a.v), _mm256_extractf128_ps(a.v, 1));
  const __m128 s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
  return _mm_cvtss_f32(_mm_add_ss(s2, _mm_movehdup_ps(s2)));
}
#elif HWY_ARCH_X86 && HWY_TARGET <= HWY_SSSE3
// The same 32 bytes as two SSE registers (lo: bytes 0..15).
struct VI {
  __m128i lo, hi;
};
struct VF8 {
  __m128 lo, hi;
};
HWY_INLINE VI load32(const void* p) {
  const __m128i* q = static_cast<const __m128i*>(p);
  return {_mm_loadu_si128(q), _mm_loadu_si128(q + 1)};
}
HWY_INLINE VI zero_i() { return {_mm_setzero_si128(), _mm_setzero_si128()}; }
HWY_INLINE VI set1_8(uint8_t c) { return {_mm_set1_epi8(static_cast<char>(c)), _mm_set1_epi8(static_cast<char>(c))}; }
HWY_INLINE VI set1_16(int16_t c) { return {_mm_set1_epi16(c), _mm_set1_epi16(c)}; }
HWY_INLINE VI set_halves16(int16_t lo, int16_t hi) { return {_mm_set1_epi16(lo), _mm_set1_epi16(hi)}; }
HWY_INLINE VI and_(VI a, VI b) { return {_mm_and_si128(a.lo, b.lo), _mm_and_si128(a.hi, b.hi)}; }
HWY_INLINE VI or_(VI a, VI b) { return {_mm_or_si128(a.lo, b.lo), _mm_or_si128(a.hi, b.hi)}; }
template <int n>
HWY_INLINE VI srli16(VI a) {
  return {_mm_srli_epi16(a.lo, n), _mm_srli_epi16(a.hi, n)};
}
template <int n>
HWY_INLINE VI slli16(VI a) {
  return {_mm_slli_epi16(a.lo, n), _mm_slli_epi16(a.hi, n)};
}
HWY_INLINE VI add32(VI a, VI b) { return {_mm_add_epi32(a.lo, b.lo), _mm_add_epi32(a.hi, b.hi)}; }
HWY_INLINE VI sign8(VI b, VI a) { return {_mm_sign_epi8(b.lo, a.lo), _mm_sign_epi8(b.hi, a.hi)}; }
HWY_INLINE VI maddubs(VI a, VI b) { return {_mm_maddubs_epi16(a.lo, b.lo), _mm_maddubs_epi16(a.hi, b.hi)}; }
HWY_INLINE VI madd16(VI a, VI b) { return {_mm_madd_epi16(a.lo, b.lo), _mm_madd_epi16(a.hi, b.hi)}; }
HWY_INLINE VI lane0_i(int32_t v) { return {_mm_cvtsi32_si128(v), _mm_setzero_si128()}; }
HWY_INLINE int32_t hsum_i(VI a) {
  __m128i s = _mm_add_epi32(a.lo, a.hi);
  s = _mm_add_epi32(s, _mm_unpackhi_epi64(s, s));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 1));
  return _mm_cvtsi128_si32(s);
}
struct K4Scales {
  __m128i v;
  explicit K4Scales(const uint8_t* sc)
      : v(_mm_unpacklo_epi8(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(sc)), _mm_setzero_si128())) {}
  HWY_INLINE VI get(int j) const {
    const __m128i r = _mm_shuffle_epi8(v, _mm_set1_epi16(static_cast<int16_t>(0x0100 * (2 * j + 1) + 2 * j)));
    return {r, r};
  }
};
struct K6Scales {
  __m128i v;
  explicit K6Scales(const int8_t* sc) : v(_mm_loadu_si128(reinterpret_cast<const __m128i*>(sc))) {}
  // Byte j into the high byte of every i16, then an arithmetic shift: sign-extended.
  HWY_INLINE VI get(int j) const {
    return {_mm_srai_epi16(_mm_shuffle_epi8(v, _mm_set1_epi16(static_cast<int16_t>(0x0100 * j + 0x80))), 8),
            _mm_srai_epi16(_mm_shuffle_epi8(v, _mm_set1_epi16(static_cast<int16_t>(0x0100 * (j + 1) + 0x80))), 8)};
  }
};
HWY_INLINE int32_t dot8_u8_i16(const uint8_t* a, const int16_t* b) {
  __m128i s = _mm_madd_epi16(_mm_unpacklo_epi8(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(a)), _mm_setzero_si128()),
                             _mm_loadu_si128(reinterpret_cast<const __m128i*>(b)));
  s = _mm_add_epi32(s, _mm_unpackhi_epi64(s, s));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 1));
  return _mm_cvtsi128_si32(s);
}
HWY_INLINE int32_t dot16_i8_i16(const int8_t* a, const int16_t* b) {
  const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(a));
  const __m128i* pb = reinterpret_cast<const __m128i*>(b);
  return hsum_i({_mm_madd_epi16(_mm_srai_epi16(_mm_unpacklo_epi8(v, v), 8), _mm_loadu_si128(pb)),
                 _mm_madd_epi16(_mm_srai_epi16(_mm_unpackhi_epi8(v, v), 8), _mm_loadu_si128(pb + 1))});
}
HWY_INLINE void half2_f32(const uint8_t* p, float& a, float& b) {
  a = half_f32(p);
  b = half_f32(p + 2);
}
HWY_INLINE float half1_f32(const uint8_t* p) { return half_f32(p); }
HWY_INLINE VF8 zero_f() { return {_mm_setzero_ps(), _mm_setzero_ps()}; }
HWY_INLINE VF8 fma_i(VI a, float s, VF8 c) {
  const __m128 sv = _mm_set1_ps(s);
  return {_mm_add_ps(_mm_mul_ps(_mm_cvtepi32_ps(a.lo), sv), c.lo), _mm_add_ps(_mm_mul_ps(_mm_cvtepi32_ps(a.hi), sv), c.hi)};
}
HWY_INLINE VF8 add_f(VF8 a, VF8 b) { return {_mm_add_ps(a.lo, b.lo), _mm_add_ps(a.hi, b.hi)}; }
HWY_INLINE float hsum_f(VF8 a) {
  const __m128 s4 = _mm_add_ps(a.lo, a.hi);
  const __m128 s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
  return _mm_cvtss_f32(_mm_add_ss(s2, _mm_movehdup_ps(s2)));
}
#else
// Plain arrays with the same lane meaning (any other target: EMU128, SCALAR, non-x86).
struct VI {
  uint8_t b[32];
  int16_t h(int j) const {
    int16_t v;
    std::memcpy(&v, b + 2 * j, 2);
    return v;
  }
  int32_t w(int k) const {
    int32_t v;
    std::memcpy(&v, b + 4 * k, 4);
    return v;
  }
  void set_h(int j, int32_t v) {
    const int16_t t = static_cast<int16_t>(v);
    std::memcpy(b + 2 * j, &t, 2);
  }
  void set_w(int k, int32_t v) { std::memcpy(b + 4 * k, &v, 4); }
};
struct VF8 {
  float f[8];
};
HWY_INLINE VI load32(const void* p) {
  VI r;
  std::memcpy(r.b, p, 32);
  return r;
}
HWY_INLINE VI zero_i() { return VI{}; }
HWY_INLINE VI set1_8(uint8_t c) {
  VI r;
  std::memset(r.b, c, 32);
  return r;
}
HWY_INLINE VI set_halves16(int16_t lo, int16_t hi) {
  VI r;
  for (int j = 0; j < 16; ++j) r.set_h(j, j < 8 ? lo : hi);
  return r;
}
HWY_INLINE VI set1_16(int16_t c) { return set_halves16(c, c); }
HWY_INLINE VI and_(VI a, VI b) {
  for (int i = 0; i < 32; ++i) a.b[i] &= b.b[i];
  return a;
}
HWY_INLINE VI or_(VI a, VI b) {
  for (int i = 0; i < 32; ++i) a.b[i] |= b.b[i];
  return a;
}
template <int n>
HWY_INLINE VI srli16(VI a) {
  for (int j = 0; j < 16; ++j) a.set_h(j, static_cast<uint16_t>(a.h(j)) >> n);
  return a;
}
template <int n>
HWY_INLINE VI slli16(VI a) {
  for (int j = 0; j < 16; ++j) a.set_h(j, static_cast<uint16_t>(static_cast<uint16_t>(a.h(j)) << n));
  return a;
}
HWY_INLINE VI add32(VI a, VI b) {
  for (int k = 0; k < 8; ++k)
    a.set_w(k, static_cast<int32_t>(static_cast<uint32_t>(a.w(k)) + static_cast<uint32_t>(b.w(k))));
  return a;
}
HWY_INLINE VI sign8(VI b, VI a) {
  for (int i = 0; i < 32; ++i) {
    const int8_t s = static_cast<int8_t>(a.b[i]);
    const int8_t v = static_cast<int8_t>(b.b[i]);
    b.b[i] = static_cast<uint8_t>(s < 0 ? static_cast<int8_t>(-v) : s == 0 ? 0 : v);
  }
  return b;
}
HWY_INLINE VI maddubs(VI a, VI b) {
  VI r;
  for (int j = 0; j < 16; ++j) {
    int32_t s = a.b[2 * j] * static_cast<int8_t>(b.b[2 * j]) + a.b[2 * j + 1] * static_cast<int8_t>(b.b[2 * j + 1]);
    r.set_h(j, s > 32767 ? 32767 : s < -32768 ? -32768 : s);
  }
  return r;
}
HWY_INLINE VI madd16(VI a, VI b) {
  VI r;
  for (int k = 0; k < 8; ++k) r.set_w(k, a.h(2 * k) * b.h(2 * k) + a.h(2 * k + 1) * b.h(2 * k + 1));
  return r;
}
HWY_INLINE VI lane0_i(int32_t v) {
  VI r{};
  r.set_w(0, v);
  return r;
}
HWY_INLINE int32_t hsum_i(VI a) {
  int32_t s = 0;
  for (int k = 0; k < 8; ++k) s += a.w(k);
  return s;
}
struct K4Scales {
  const uint8_t* sc;
  explicit K4Scales(const uint8_t* s) : sc(s) {}
  HWY_INLINE VI get(int j) const { return set1_16(sc[j]); }
};
struct K6Scales {
  const int8_t* sc;
  explicit K6Scales(const int8_t* s) : sc(s) {}
  HWY_INLINE VI get(int j) const { return set_halves16(sc[j], sc[j + 1]); }
};
HWY_INLINE int32_t dot8_u8_i16(const uint8_t* a, const int16_t* b) {
  int32_t s = 0;
  for (int j = 0; j < 8; ++j) s += a[j] * b[j];
  return s;
}
HWY_INLINE int32_t dot16_i8_i16(const int8_t* a, const int16_t* b) {
  int32_t s = 0;
  for (int j = 0; j < 16; ++j) s += a[j] * b[j];
  return s;
}
HWY_INLINE void half2_f32(const uint8_t* p, float& a, float& b) {
  a = half_f32(p);
  b = half_f32(p + 2);
}
HWY_INLINE float half1_f32(const uint8_t* p) { return half_f32(p); }
HWY_INLINE VF8 zero_f() { return VF8{}; }
HWY_INLINE VF8 fma_i(VI a, float s, VF8 c) {
  for (int k = 0; k < 8; ++k) c.f[k] = static_cast<float>(a.w(k)) * s + c.f[k];
  return c;
}
HWY_INLINE VF8 add_f(VF8 a, VF8 b) {
  for (int k = 0; k < 8; ++k) a.f[k] += b.f[k];
  return a;
}
HWY_INLINE float hsum_f(VF8 a) {
  return ((a.f[0] + a.f[4]) + (a.f[2] + a.f[6])) + ((a.f[1] + a.f[5]) + (a.f[3] + a.f[7]));
}
#endif

// The quantized activations of one token (layout in packed_kernels.h).
struct Act {
  const int8_t* q;
  const float* d;
  const int16_t* bsums;
  Act(const uint8_t* xq, WeightFormat f, int64_t in) {
    q = reinterpret_cast<const int8_t*>(xq);
    d = reinterpret_cast<const float*>(xq + packed_act_scales_offset(in));
    bsums = reinterpret_cast<const int16_t*>(reinterpret_cast<const uint8_t*>(d) + 4 * (in / packed_act_block(f)));
  }
};

// Each kernel dots one row with NT tokens' activations (NT <= 4), the row's weights decoded once for all of them.
// A token's operations are the same whatever NT (its integer block sums are exact, its f32 operations run in the
// same order), so a token's result does not depend on the tokens beside it.

// q8_0 blocks {d f16, q i8[32]} against per-32 activations: per block, the exact integer dot (|w| through maddubs,
// x given w's sign) scaled by d_w * d_x into eight f32 lanes; even and odd blocks into two accumulators (two
// independent chains), added, then the lanes in hsum_f's order.
template <int NT>
HWY_INLINE void dot_q8_0(const Act* a, const uint8_t* HWY_RESTRICT w, int64_t in, float* out) {
  const VI ones = set1_16(1);
  VF8 acc0[NT], acc1[NT];
  for (int t = 0; t < NT; ++t) acc0[t] = acc1[t] = zero_f();
  const int64_t nb = in / 32;
  int64_t b = 0;
  for (; b + 2 <= nb; b += 2) {
    const uint8_t* w0 = w + 34 * b;
    const VI q0 = load32(w0 + 2), q1 = load32(w0 + 36);
    const VI u0 = sign8(q0, q0), u1 = sign8(q1, q1);
    const float d0 = half1_f32(w0), d1 = half1_f32(w0 + 34);
    for (int t = 0; t < NT; ++t) {
      const VI p0 = madd16(maddubs(u0, sign8(load32(a[t].q + 32 * b), q0)), ones);
      const VI p1 = madd16(maddubs(u1, sign8(load32(a[t].q + 32 * b + 32), q1)), ones);
      acc0[t] = fma_i(p0, d0 * a[t].d[b], acc0[t]);
      acc1[t] = fma_i(p1, d1 * a[t].d[b + 1], acc1[t]);
    }
  }
  if (b < nb) {
    const uint8_t* w0 = w + 34 * b;
    const VI q0 = load32(w0 + 2);
    const VI u0 = sign8(q0, q0);
    const float d0 = half1_f32(w0);
    for (int t = 0; t < NT; ++t) {
      const VI p0 = madd16(maddubs(u0, sign8(load32(a[t].q + 32 * b), q0)), ones);
      acc0[t] = fma_i(p0, d0 * a[t].d[b], acc0[t]);
    }
  }
  for (int t = 0; t < NT; ++t) out[t] = hsum_f(add_f(acc0[t], acc1[t]));
}

// q4_k super-blocks {d f16, dmin f16, scales u8[12], qs u8[128]} against per-256 activations with the sums of each
// 32 (Act::bsums): x = (d sc_j) q - dmin m_j, so the dot is d d_x sum_j sc_j (q . x_q)_j - dmin d_x sum_j m_j
// (sum x_q)_j, both sums exact integers. The first, as eight i32 lanes, is scaled by d d_x into eight f32 lanes per
// super-block; the second into a scalar, subtracted at the end.
template <int NT>
HWY_INLINE void dot_q4_k(const Act* a, const uint8_t* HWY_RESTRICT w, int64_t in, float* out) {
  const VI m4 = set1_8(0xF);
  VF8 acc[NT];
  float mins[NT];
  for (int t = 0; t < NT; ++t) {
    acc[t] = zero_f();
    mins[t] = 0.0f;
  }
  for (int64_t i = 0; i < in / 256; ++i) {
    const uint8_t* blk = w + 144 * i;
    // The 6-bit scales and mins of ggml's 12-byte packing, as whole words: bytes 0..7 scales, 8..15 mins.
    uint32_t u[4];
    std::memcpy(u, blk + 4, 12);
    u[3] = ((u[2] >> 4) & 0x0f0f0f0fu) | (((u[1] >> 6) & 0x03030303u) << 4);
    const uint32_t m_lo = u[1] & 0x3f3f3f3fu;
    u[1] = (u[2] & 0x0f0f0f0fu) | (((u[0] >> 6) & 0x03030303u) << 4);
    u[2] = m_lo;
    u[0] &= 0x3f3f3f3fu;
    uint8_t sm[16];
    std::memcpy(sm, u, 16);
    const K4Scales sc(sm);
    const uint8_t* qs = blk + 16;
    VI sumi[NT];
    for (int t = 0; t < NT; ++t) sumi[t] = zero_i();
#pragma GCC unroll 4
    for (int g = 0; g < 4; ++g) {
      const VI q = load32(qs + 32 * g);
      const VI lo = and_(q, m4), hi = and_(srli16<4>(q), m4);
      const VI s_lo = sc.get(2 * g), s_hi = sc.get(2 * g + 1);
      for (int t = 0; t < NT; ++t) {
        const int8_t* xq = a[t].q + 256 * i + 64 * g;
        sumi[t] = add32(sumi[t], madd16(s_lo, maddubs(lo, load32(xq))));
        sumi[t] = add32(sumi[t], madd16(s_hi, maddubs(hi, load32(xq + 32))));
      }
    }
    float d, dmin;
    half2_f32(blk, d, dmin);
    for (int t = 0; t < NT; ++t) {
      const float dx = a[t].d[i];
      acc[t] = fma_i(sumi[t], d * dx, acc[t]);
      mins[t] += (dmin * dx) * static_cast<float>(dot8_u8_i16(sm + 8, a[t].bsums + 8 * i));
    }
  }
  for (int t = 0; t < NT; ++t) out[t] = hsum_f(acc[t]) - mins[t];
}

// q6_k super-blocks {ql u8[128], qh u8[64], scales i8[16], d f16} against per-256 activations with the sums of each
// 16: x = (d sc_j) (q - 32) with q in [0, 63], so the dot is d d_x (sum_j sc_j (q . x_q)_j - 32 sum_j sc_j
// (sum x_q)_j): eight i32 lanes less the offset (in lane 0), scaled by d d_x into eight f32 lanes per super-block.
template <int NT>
HWY_INLINE void dot_q6_k(const Act* a, const uint8_t* HWY_RESTRICT w, int64_t in, float* out) {
  const VI m4 = set1_8(0xF), m2 = set1_8(3);
  VF8 acc[NT];
  for (int t = 0; t < NT; ++t) acc[t] = zero_f();
  for (int64_t i = 0; i < in / 256; ++i) {
    const uint8_t* blk = w + 210 * i;
    const int8_t* sc = reinterpret_cast<const int8_t*>(blk + 192);
    const K6Scales scales(sc);
    VI sumi[NT];
    for (int t = 0; t < NT; ++t) sumi[t] = lane0_i(-32 * dot16_i8_i16(sc, a[t].bsums + 16 * i));
#pragma GCC unroll 2
    for (int h = 0; h < 2; ++h) {
      const VI ql0 = load32(blk + 64 * h), ql1 = load32(blk + 64 * h + 32), qh = load32(blk + 128 + 32 * h);
      const VI q[4] = {or_(and_(ql0, m4), slli16<4>(and_(qh, m2))),
                       or_(and_(ql1, m4), slli16<4>(and_(srli16<2>(qh), m2))),
                       or_(and_(srli16<4>(ql0), m4), slli16<4>(and_(srli16<4>(qh), m2))),
                       or_(and_(srli16<4>(ql1), m4), slli16<4>(and_(srli16<6>(qh), m2)))};
#pragma GCC unroll 4
      for (int k = 0; k < 4; ++k) {
        const VI s = scales.get(8 * h + 2 * k);  // sub-blocks of 16: two per 32-element group
        for (int t = 0; t < NT; ++t)
          sumi[t] = add32(sumi[t], madd16(s, maddubs(q[k], load32(a[t].q + 256 * i + 128 * h + 32 * k))));
      }
    }
    const float d = half1_f32(blk + 208);
    for (int t = 0; t < NT; ++t) acc[t] = fma_i(sumi[t], d * a[t].d[i], acc[t]);
  }
  for (int t = 0; t < NT; ++t) out[t] = hsum_f(acc[t]);
}

// Tokens in groups of four (then the rest), each group against every row: a group's activations stay in L1 while
// the rows stream past.
template <template <int> class K>
void dot_tokens(const uint8_t* xq, int64_t xq_stride, int64_t T, const uint8_t* w, WeightFormat f, int64_t rb,
                int64_t in, int64_t rows, float* out, int64_t out_stride) {
  for (int64_t t0 = 0; t0 < T; t0 += 4) {
    const int nt = static_cast<int>(std::min<int64_t>(4, T - t0));
    const Act a[4] = {Act(xq + t0 * xq_stride, f, in), Act(xq + std::min(t0 + 1, T - 1) * xq_stride, f, in),
                      Act(xq + std::min(t0 + 2, T - 1) * xq_stride, f, in),
                      Act(xq + std::min(t0 + 3, T - 1) * xq_stride, f, in)};
    float r4[4];
    for (int64_t r = 0; r < rows; ++r) {
      const uint8_t* row = w + r * rb;
      switch (nt) {
        case 4: K<4>::run(a, row, in, r4); break;
        case 3: K<3>::run(a, row, in, r4); break;
        case 2: K<2>::run(a, row, in, r4); break;
        default: K<1>::run(a, row, in, r4); break;
      }
      for (int t = 0; t < nt; ++t) out[(t0 + t) * out_stride + r] = r4[t];
    }
  }
}
template <int NT>
struct Q8_0K {
  static void run(const Act* a, const uint8_t* w, int64_t in, float* out) { dot_q8_0<NT>(a, w, in, out); }
};
template <int NT>
struct Q4_KK {
  static void run(const Act* a, const uint8_t* w, int64_t in, float* out) { dot_q4_k<NT>(a, w, in, out); }
};
template <int NT>
struct Q6_KK {
  static void run(const Act* a, const uint8_t* w, int64_t in, float* out) { dot_q6_k<NT>(a, w, in, out); }
};

// Per block of `blk` elements: d = max |x| / 127, q = x * (127 / max |x|) rounded to nearest even, so
// |x - d q| <= d / 2 (plus f32 rounding); an all-zero block gets d = 0 and q = 0, a block holding NaN or inf d = NaN
// (its dot products are NaN). Element by element, so every target gives the same bytes. Then the sums of each `group`
// quantized values (none for group 0).
void QuantizeAct(const float* HWY_RESTRICT x, int64_t in, int64_t blk, int64_t group, uint8_t* HWY_RESTRICT xq) {
  namespace hn = hwy::HWY_NAMESPACE;
  const hn::ScalableTag<float> df;
  const hn::RebindToSigned<decltype(df)> di;
  const hn::Rebind<int8_t, decltype(df)> d8;
  const int64_t L = static_cast<int64_t>(hn::Lanes(df));
  int8_t* q = reinterpret_cast<int8_t*>(xq);
  float* d = reinterpret_cast<float*>(xq + packed_act_scales_offset(in));
  int16_t* sums = reinterpret_cast<int16_t*>(d + in / blk);
  for (int64_t b = 0; b < in / blk; ++b) {
    const float* xb = x + b * blk;
    int8_t* qb = q + b * blk;
    auto amax = hn::Zero(df);
    auto finite = hn::FirstN(df, 0);
    finite = hn::Not(finite);
    for (int64_t i = 0; i < blk; i += L) {
      const auto v = hn::LoadU(df, xb + i);
      amax = hn::Max(amax, hn::Abs(v));
      finite = hn::And(finite, hn::IsFinite(v));
    }
    const float m = hn::GetLane(hn::MaxOfLanes(df, amax));
    const bool all_finite = hn::AllTrue(df, finite);
    if (!all_finite || m == 0.0f) {
      d[b] = all_finite ? 0.0f : std::nanf("");
      for (int64_t i = 0; i < blk; ++i) qb[i] = 0;
    } else {
      d[b] = m / 127.0f;
      const auto id = hn::Set(df, 127.0f / m);
      for (int64_t i = 0; i < blk; i += L)
        hn::StoreU(hn::DemoteTo(d8, hn::NearestInt(hn::Mul(hn::LoadU(df, xb + i), id))), d8, qb + i);
    }
  }
  if (group == 0) return;
  for (int64_t gi = 0; gi < in / group; ++gi) {
    auto acc = hn::Zero(di);
    for (int64_t i = 0; i < group; i += L) acc = hn::Add(acc, hn::PromoteTo(di, hn::LoadU(d8, q + gi * group + i)));
    sums[gi] = static_cast<int16_t>(hn::GetLane(hn::SumOfLanes(di, acc)));
  }
}

void PackedDotRowsInt8(const uint8_t* xq, int64_t xq_stride, int64_t T, const uint8_t* w, WeightFormat f, int64_t in,
                       int64_t rows, float* out, int64_t out_stride) {
  const int64_t rb = weight_row_bytes(f, in, "packed_dot_rows_int8");
  switch (f) {
    case WeightFormat::Q8_0: return dot_tokens<Q8_0K>(xq, xq_stride, T, w, f, rb, in, rows, out, out_stride);
    case WeightFormat::Q4_K: return dot_tokens<Q4_KK>(xq, xq_stride, T, w, f, rb, in, rows, out, out_stride);
    case WeightFormat::Q6_K: return dot_tokens<Q6_KK>(xq, xq_stride, T, w, f, rb, in, rows, out, out_stride);
    default: fail("packed_dot_rows_int8: ", weight_format_name(f), " has no int8-activation kernel");
  }
}

}  // namespace HWY_NAMESPACE
}  // namespace mambacpp::cpu::simd
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace mambacpp::cpu::simd {

HWY_EXPORT(PackedDotRowsInt8);
HWY_EXPORT(QuantizeAct);

bool packed_int8(WeightFormat f) {
  return f == WeightFormat::Q8_0 || f == WeightFormat::Q4_K || f == WeightFormat::Q6_K;
}

int64_t packed_act_block(WeightFormat f) { return weight_format_info(f).block_elems == 256 ? 256 : 32; }

int64_t packed_act_sum_group(WeightFormat f) {
  return f == WeightFormat::Q4_K ? 32 : f == WeightFormat::Q6_K ? 16 : 0;
}

int64_t packed_act_scales_offset(int64_t in) { return (in + 63) / 64 * 64; }

int64_t packed_act_bytes(WeightFormat f, int64_t in) {
  const int64_t g = packed_act_sum_group(f);
  return packed_act_scales_offset(in) + 4 * (in / packed_act_block(f)) + (g > 0 ? 2 * (in / g) : 0);
}

void packed_quantize_act(const float* x, WeightFormat f, int64_t in, uint8_t* xq) {
  const int64_t blk = packed_act_block(f);
  if (!packed_int8(f)) fail("packed_quantize_act: ", weight_format_name(f), " has no int8-activation kernel");
  if (in % blk != 0) fail("packed_quantize_act: ", in, " elements are not whole blocks of ", blk);
  HWY_DYNAMIC_DISPATCH(QuantizeAct)(x, in, blk, packed_act_sum_group(f), xq);
}

void packed_dot_rows_int8(const uint8_t* xq, int64_t xq_stride, int64_t T, const uint8_t* w, WeightFormat f,
                          int64_t in, int64_t rows, float* out, int64_t out_stride) {
  HWY_DYNAMIC_DISPATCH(PackedDotRowsInt8)(xq, xq_stride, T, w, f, in, rows, out, out_stride);
}

}  // namespace mambacpp::cpu::simd
#endif  // HWY_ONCE
