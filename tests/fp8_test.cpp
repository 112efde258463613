// Host FP8 E4M3 (core/fp8.h): every finite code decodes to the value the format defines and encodes back to itself;
// values between two neighbours round to the nearer one, ties to the even code; out-of-range values saturate.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "core/fp8.h"

namespace mambacpp {
namespace {

TEST(Fp8E4m3, DecodesTheDefinedValuesAndRoundTripsEveryCode) {
  EXPECT_EQ(fp8_e4m3_to_float(0x7e), 448.0f);
  EXPECT_EQ(fp8_e4m3_to_float(0x01), 0x1p-9f);
  EXPECT_EQ(fp8_e4m3_to_float(0x08), 0x1p-6f);
  EXPECT_EQ(fp8_e4m3_to_float(0x38), 1.0f);
  EXPECT_EQ(fp8_e4m3_to_float(0xb9), -1.125f);
  EXPECT_TRUE(std::isnan(fp8_e4m3_to_float(0x7f)));
  EXPECT_TRUE(std::isnan(fp8_e4m3_to_float(0xff)));
  for (int c = 0; c < 256; ++c) {
    if ((c & 0x7f) == 0x7f || c == 0x80) continue;  // NaNs; -0 encodes back as 0x80 too but compare bits below
    EXPECT_EQ(fp8_e4m3_from_float(fp8_e4m3_to_float(static_cast<uint8_t>(c))), c) << c;
  }
  EXPECT_EQ(fp8_e4m3_from_float(-0.0f), 0x80);
}

TEST(Fp8E4m3, RoundsToNearestEvenAndSaturates) {
  for (int c = 0; c < 0x7e; ++c) {
    const float lo = fp8_e4m3_to_float(static_cast<uint8_t>(c)), hi = fp8_e4m3_to_float(static_cast<uint8_t>(c + 1));
    const float mid = 0.5f * (lo + hi);  // exact: both have few significant bits
    EXPECT_EQ(fp8_e4m3_from_float(mid), (c & 1) ? c + 1 : c) << "tie between codes " << c << " and " << c + 1;
    EXPECT_EQ(fp8_e4m3_from_float(std::nextafter(mid, lo)), c) << c;
    EXPECT_EQ(fp8_e4m3_from_float(std::nextafter(mid, hi)), c + 1) << c;
  }
  EXPECT_EQ(fp8_e4m3_from_float(1e6f), 0x7e);
  EXPECT_EQ(fp8_e4m3_from_float(-460.0f), 0xfe);
  EXPECT_EQ(fp8_e4m3_from_float(INFINITY), 0x7e);
  EXPECT_EQ(fp8_e4m3_from_float(1e-30f), 0x00);
}

TEST(Fp8E4m3, PerChannelQuantizationUsesEachRowsRange) {
  const std::vector<float> x = {0.5f, -2.0f, 1.0f, 0.0f, 0.0f, 0.0f, 3e-3f, 1e-3f, -7e-4f};
  std::vector<uint8_t> q(9);
  std::vector<float> s(3);
  fp8_quantize_rows(x.data(), 3, 3, q.data(), s.data());
  EXPECT_EQ(s[0], 2.0f / 448.0f);
  EXPECT_EQ(s[1], 1.0f);
  EXPECT_EQ(q[1], 0xfe);  // the row's largest magnitude maps to -448
  EXPECT_EQ(q[6], 0x7e);
  for (int i = 0; i < 9; ++i)
    EXPECT_NEAR(s[i / 3] * fp8_e4m3_to_float(q[i]), x[i], std::fabs(x[i]) * 0.0625 + 1e-30) << i;  // 2^-4 relative
}

}  // namespace
}  // namespace mambacpp
