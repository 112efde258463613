// Per-target helpers shared by the Highway kernel files (simd_kernels.cpp, gemm_kernels.cpp): the f32 vector type,
// loads that widen bf16/f16 weights to f32 exactly, and the f32/bf16 state loads and stores. Included once per target
// by each file's foreach_target pass (the usual Highway "-inl.h" guard below).
#if defined(MAMBACPP_BACKEND_CPU_SIMD_LOAD_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef MAMBACPP_BACKEND_CPU_SIMD_LOAD_INL_H_
#undef MAMBACPP_BACKEND_CPU_SIMD_LOAD_INL_H_
#else
#define MAMBACPP_BACKEND_CPU_SIMD_LOAD_INL_H_
#endif

#include <cstdint>
#include <type_traits>

#include "hwy/highway.h"
#include "mambacpp/dtype.h"

HWY_BEFORE_NAMESPACE();
namespace mambacpp::cpu::simd {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

using DF = hn::ScalableTag<float>;
using DU = hn::RebindToUnsigned<DF>;
using DI = hn::RebindToSigned<DF>;
using DBF = hn::Rebind<hwy::bfloat16_t, DF>;
using DH = hn::Rebind<hwy::float16_t, DF>;
using DU16 = hn::Rebind<uint16_t, DF>;
using VF = hn::Vec<DF>;
constexpr size_t kMaxLanes = HWY_MAX_BYTES / sizeof(float);

// Loads Lanes(df) weights at p as f32.
HWY_INLINE VF load_w(DF df, const float* p) { return hn::LoadU(df, p); }
HWY_INLINE VF load_w(DF df, const hwy::bfloat16_t* p) { return hn::PromoteTo(df, hn::LoadU(DBF(), p)); }
#if HWY_TARGET == HWY_AVX2 || HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL
HWY_INLINE VF load_w(DF df, const hwy::float16_t* p) { return hn::PromoteTo(df, hn::LoadU(DH(), p)); }  // vcvtph2ps
#else
// Without F16C (Highway's emulation there maps inf/NaN halves to finite numbers): the exponent and mantissa
// shifted into place and scaled by 2^112 (exact for normal and subnormal halves), inf/NaN given the f32 exponent.
HWY_INLINE VF load_w(DF df, const hwy::float16_t* p) {
  const DU du;
  const auto h = hn::PromoteTo(du, hn::LoadU(DU16(), reinterpret_cast<const uint16_t*>(p)));
  const auto em = hn::And(h, hn::Set(du, 0x7fffu));
  const VF finite = hn::Mul(hn::BitCast(df, hn::ShiftLeft<13>(em)), hn::Set(df, 0x1p112f));
  const VF special = hn::BitCast(df, hn::Or(hn::ShiftLeft<13>(em), hn::Set(du, 0x7f800000u)));
  const auto is_special = hn::Gt(hn::BitCast(DI(), em), hn::Set(DI(), 0x7bff));  // signed: em < 2^15
  const VF mag = hn::IfThenElse(hn::RebindMask(df, is_special), special, finite);
  return hn::Or(mag, hn::BitCast(df, hn::ShiftLeft<16>(hn::And(h, hn::Set(du, 0x8000u)))));
}
#endif

// f32 <-> bf16 state, rounding to nearest even (NaN stays a quiet NaN), as mambacpp::f32_to_bf16.
HWY_INLINE VF load_state(DF df, const float* p) { return hn::LoadU(df, p); }
HWY_INLINE VF load_state(DF df, const hwy::bfloat16_t* p) { return load_w(df, p); }
HWY_INLINE void store_state(DF df, VF v, float* p) { hn::StoreU(v, df, p); }
HWY_INLINE void store_state(DF df, VF v, hwy::bfloat16_t* p) {
  const DU du;
  const auto bits = hn::BitCast(du, v);
  const auto lsb = hn::And(hn::ShiftRight<16>(bits), hn::Set(du, 1u));
  auto r = hn::ShiftRight<16>(hn::Add(bits, hn::Add(hn::Set(du, 0x7fffu), lsb)));
  const auto nan = hn::Or(hn::ShiftRight<16>(bits), hn::Set(du, 0x40u));
  r = hn::IfThenElse(hn::RebindMask(du, hn::IsNaN(v)), nan, r);
  hn::StoreU(hn::DemoteTo(DU16(), hn::BitCast(DI(), r)), DU16(), reinterpret_cast<uint16_t*>(p));
}
HWY_INLINE float state_at(const float* p, int64_t i) { return p[i]; }
HWY_INLINE float state_at(const hwy::bfloat16_t* p, int64_t i) { return bf16_to_f32(reinterpret_cast<const uint16_t*>(p)[i]); }

template <class W>
HWY_INLINE float weight_scalar(const W* p, int64_t i) {
  if constexpr (std::is_same_v<W, float>) return p[i];
  else if constexpr (std::is_same_v<W, hwy::bfloat16_t>) return bf16_to_f32(reinterpret_cast<const uint16_t*>(p)[i]);
  else return f16_to_f32(reinterpret_cast<const uint16_t*>(p)[i]);
}

}  // namespace HWY_NAMESPACE
}  // namespace mambacpp::cpu::simd
HWY_AFTER_NAMESPACE();

#endif  // MAMBACPP_BACKEND_CPU_SIMD_LOAD_INL_H_
