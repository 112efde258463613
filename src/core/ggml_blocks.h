// ggml's block formats, row by row: reference quantization (the rounding of ggml's quantize_row_*_ref, the functions
// llama.cpp's quantizer calls when it has no importance matrix, so the same floats give the same bytes) and
// dequantization (exactly ggml's dequantize_row_*: the floats llama.cpp's reference kernels compute with).
//
// Layouts (ggml-common.h), all little-endian, f16 = IEEE half:
//   q8_0  [32]  : d f16, qs i8[32]                              x = d * q
//   q4_0  [32]  : d f16, qs u8[16] (low nibbles: x[0..15], high: x[16..31])       x = d * (q - 8)
//   q5_0  [32]  : d f16, qh u8[4] (fifth bits, bit j of element j), qs u8[16]     x = d * (q - 16)
//   q5_1  [32]  : d f16, m f16, qh u8[4], qs u8[16]              x = d * q + m
//   q4_k  [256] : d f16, dmin f16, scales u8[12] (8 pairs of 6-bit scale/min), qs u8[128]
//                 x = d * sc_j * q - dmin * m_j over 8 sub-blocks of 32
//   q5_k  [256] : d f16, dmin f16, scales u8[12], qh u8[32], qs u8[128]
//   q6_k  [256] : ql u8[128], qh u8[64], scales i8[16], d f16    x = d * sc_j * (q - 32) over 16 sub-blocks of 16
// f32 / f16 / bf16 rows are handled too (plain conversions, RNE), so callers can treat every format alike.
#pragma once

#include <cstdint>

#include "core/weight.h"

namespace mambacpp {

// Quantizes `n` floats (a multiple of the format's block) into weight_row_bytes(f, n) bytes at `out`.
// FP8 is not a ggml format and is refused.
void ggml_quantize_row(WeightFormat f, const float* x, int64_t n, uint8_t* out);
// Dequantizes `n` elements from weight_row_bytes(f, n) bytes at `in` into floats.
void ggml_dequantize_row(WeightFormat f, const uint8_t* in, int64_t n, float* out);

}  // namespace mambacpp
