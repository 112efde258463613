#include "core/fp8.h"

#include <algorithm>
#include <cmath>

namespace mambacpp {

float fp8_e4m3_to_float(uint8_t b) {
  const int e = (b >> 3) & 15, m = b & 7;
  if (e == 15 && m == 7) return std::nanf("");
  const float mag = e == 0 ? std::ldexp(static_cast<float>(m), -9) : std::ldexp(static_cast<float>(8 + m), e - 10);
  return b & 0x80 ? -mag : mag;
}

uint8_t fp8_e4m3_from_float(float x) {
  if (std::isnan(x)) return 0x7f;
  const uint8_t sign = std::signbit(x) ? 0x80 : 0;
  const float a = std::fabs(x);
  if (a >= 448.0f) return sign | 0x7e;
  int code;
  if (a < 0x1p-6f) {
    // Subnormals (and zero): steps of 2^-9; a result of 8 steps is the smallest normal, code 0x08, as it should be.
    code = static_cast<int>(std::nearbyint(a * 0x1p9f));
  } else {
    int k;
    std::frexp(a, &k);  // a = f 2^k, f in [0.5, 1): the exponent is k - 1
    const int e = k - 1;
    int m = static_cast<int>(std::nearbyint(std::ldexp(a, 3 - e)));  // in [8, 16]; scaling by 2^n is exact
    int biased = e + 7;
    if (m == 16) m = 8, ++biased;
    code = (biased << 3) | (m - 8);
    code = std::min(code, 0x7e);  // rounding up past 448 (a in (448, 464) is caught above; this is belt and braces)
  }
  return static_cast<uint8_t>(sign | code);
}

void fp8_quantize_rows(const float* x, int64_t rows, int64_t cols, uint8_t* out, float* scales) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * cols;
    float amax = 0.0f;
    for (int64_t i = 0; i < cols; ++i) amax = std::max(amax, std::fabs(xr[i]));
    const float s = amax > 0.0f ? amax / 448.0f : 1.0f;
    scales[r] = s;
    for (int64_t i = 0; i < cols; ++i) out[r * cols + i] = fp8_e4m3_from_float(xr[i] / s);
  }
}

void fp8_dequantize_rows(const uint8_t* in, int64_t rows, int64_t cols, const float* scales, bool per_tensor,
                         float* out) {
  float table[256];
  for (int b = 0; b < 256; ++b) table[b] = fp8_e4m3_to_float(static_cast<uint8_t>(b));
  for (int64_t r = 0; r < rows; ++r) {
    const float s = scales[per_tensor ? 0 : r];
    for (int64_t i = 0; i < cols; ++i) out[r * cols + i] = table[in[r * cols + i]] * s;
  }
}

}  // namespace mambacpp
