// FP8 E4M3 (the OCP / NVIDIA "e4m3fn" encoding: 1 sign, 4 exponent bits with bias 7, 3 mantissa bits, no infinities,
// 0x7f / 0xff NaN, largest finite 448) on the host: exact decoding, round-to-nearest-even encoding that saturates to
// +-448 (as torch's float8_e4m3fn casts after ModelOpt's scaling, and cuda_fp8.h's __NV_SATFINITE), and the
// per-output-channel quantization of a matrix (scale = max|row| / 448, so every row uses the whole range).
#pragma once

#include <cstdint>

namespace mambacpp {

float fp8_e4m3_to_float(uint8_t b);
uint8_t fp8_e4m3_from_float(float x);  // NaN -> 0x7f; |x| > 448 -> +-448
// rows x cols floats -> e4m3 bytes [rows, cols] and f32 scales [rows]: out[r, i] = e4m3(x[r, i] / scale[r]);
// an all-zero row gets scale 1.
void fp8_quantize_rows(const float* x, int64_t rows, int64_t cols, uint8_t* out, float* scales);
// The inverse: out[r, i] = e4m3(in[r, i]) * scales[per_tensor ? 0 : r], one f32 multiply (the value a kernel that
// scales each product gets to within one rounding; exact whenever the product fits f32's 24 bits).
void fp8_dequantize_rows(const uint8_t* in, int64_t rows, int64_t cols, const float* scales, bool per_tensor,
                         float* out);

}  // namespace mambacpp
