// Element types and the scalar conversions the kernels use to read weights in their stored dtype.
#pragma once

#include <cstdint>
#include <cstring>
#include <string>

namespace mambacpp {

// U8: raw bytes (a block-format weight's storage, core/weight.h).
enum class DType : uint8_t { F32, F16, BF16, F64, I32, I64, U8 };

size_t dtype_size(DType t);
const char* dtype_name(DType t);   // "f32", "f16", "bf16", ...
DType parse_dtype(const std::string& name);  // accepts f32/fp32/float32, f16/fp16/float16, bf16/bfloat16; throws

// The dtypes weights are stored in as plain floats (what checkpoints hold besides quantized blocks).
constexpr bool is_weight_float(DType t) { return t == DType::F32 || t == DType::F16 || t == DType::BF16; }

inline float bf16_to_f32(uint16_t h) {
  uint32_t bits = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

// Round to nearest even; NaN stays NaN.
inline uint16_t f32_to_bf16(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, 4);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((bits >> 16) | 0x40u);
  bits += 0x7fffu + ((bits >> 16) & 1u);
  return static_cast<uint16_t>(bits >> 16);
}

float f16_to_f32(uint16_t h);
uint16_t f32_to_f16(float f);

// Reads element i of a buffer of type t as a float (f32/f16/bf16/f64).
inline float load_as_f32(const void* data, DType t, int64_t i) {
  switch (t) {
    case DType::F32: return static_cast<const float*>(data)[i];
    case DType::BF16: return bf16_to_f32(static_cast<const uint16_t*>(data)[i]);
    case DType::F16: return f16_to_f32(static_cast<const uint16_t*>(data)[i]);
    case DType::F64: return static_cast<float>(static_cast<const double*>(data)[i]);
    default: return 0.0f;
  }
}

// Converts n elements of type `from` into floats.
void convert_to_f32(const void* src, DType from, float* dst, int64_t n);
// Converts n floats into type `to` (f32/f16/bf16).
void convert_from_f32(const float* src, void* dst, DType to, int64_t n);

}  // namespace mambacpp
