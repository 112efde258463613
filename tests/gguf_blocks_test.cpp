// ggml's block formats (core/ggml_blocks.h) and the CPU's kernels for them (backend/cpu/packed_linear.cpp).
// Dequantization is checked on blocks built by hand from the layouts in ggml-common.h (every nibble, fifth bit and
// 6-bit scale/min at a known place, values chosen so a misplaced bit changes the result); quantization by round trips
// with error bounds a wrong scale or rounding would break; the packed linear and embedding against an fp64
// dequantize-then-dot on odd shapes.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "backend/backend.h"
#include "backend/cpu/packed_kernels.h"
#include "core/ggml_blocks.h"
#include "mambacpp/dtype.h"

namespace mambacpp {
namespace {

void put16(uint8_t* p, float v) {
  const uint16_t h = f32_to_f16(v);
  std::memcpy(p, &h, 2);
}

std::vector<float> dequant(WeightFormat f, const std::vector<uint8_t>& b, int64_t n) {
  std::vector<float> y(static_cast<size_t>(n));
  ggml_dequantize_row(f, b.data(), n, y.data());
  return y;
}

TEST(GgmlBlocks, Q8_0ByHand) {
  std::vector<uint8_t> b(34);
  put16(b.data(), 0.25f);
  for (int j = 0; j < 32; ++j) b[2 + j] = static_cast<uint8_t>(static_cast<int8_t>(j - 16));
  const auto y = dequant(WeightFormat::Q8_0, b, 32);
  for (int j = 0; j < 32; ++j) EXPECT_EQ(y[j], (j - 16) * 0.25f) << j;
}

TEST(GgmlBlocks, Q4_0ByHand) {
  std::vector<uint8_t> b(18);
  put16(b.data(), 0.5f);
  for (int j = 0; j < 16; ++j) b[2 + j] = static_cast<uint8_t>(j | ((15 - j) << 4));
  const auto y = dequant(WeightFormat::Q4_0, b, 32);
  for (int j = 0; j < 16; ++j) {
    EXPECT_EQ(y[j], (j - 8) * 0.5f) << j;
    EXPECT_EQ(y[16 + j], (15 - j - 8) * 0.5f) << j;
  }
}

TEST(GgmlBlocks, Q5_0ByHand) {
  std::vector<uint8_t> b(22);
  put16(b.data(), 1.0f);
  const uint32_t qh = 0x0000FFFFu;  // fifth bits of elements 0..15 set, 16..31 clear
  std::memcpy(b.data() + 2, &qh, 4);
  for (int j = 0; j < 16; ++j) b[6 + j] = static_cast<uint8_t>(j | (j << 4));
  const auto y = dequant(WeightFormat::Q5_0, b, 32);
  for (int j = 0; j < 16; ++j) {
    EXPECT_EQ(y[j], static_cast<float>(j)) << j;          // (j + 16) - 16
    EXPECT_EQ(y[16 + j], static_cast<float>(j - 16)) << j;
  }
}

TEST(GgmlBlocks, Q5_1ByHand) {
  std::vector<uint8_t> b(24);
  put16(b.data(), 2.0f);
  put16(b.data() + 2, -1.0f);
  const uint32_t qh = 0x80000001u;  // elements 0 and 31
  std::memcpy(b.data() + 4, &qh, 4);
  for (int j = 0; j < 16; ++j) b[8 + j] = 0x21;
  const auto y = dequant(WeightFormat::Q5_1, b, 32);
  EXPECT_EQ(y[0], 17 * 2.0f - 1.0f);
  for (int j = 1; j < 16; ++j) EXPECT_EQ(y[j], 1.0f) << j;
  for (int j = 16; j < 31; ++j) EXPECT_EQ(y[j], 3.0f) << j;
  EXPECT_EQ(y[31], 18 * 2.0f - 1.0f);
}

// The 12 bytes of eight 6-bit (scale, min) pairs, as ggml-common.h lays them out for q4_k / q5_k.
void pack_scales(const int* sc, const int* m, uint8_t* q) {
  std::memset(q, 0, 12);
  for (int j = 0; j < 8; ++j) {
    if (j < 4) {
      q[j] |= static_cast<uint8_t>(sc[j]);
      q[j + 4] |= static_cast<uint8_t>(m[j]);
    } else {
      q[j + 4] = static_cast<uint8_t>((sc[j] & 0xF) | ((m[j] & 0xF) << 4));
      q[j - 4] |= static_cast<uint8_t>((sc[j] >> 4) << 6);
      q[j] |= static_cast<uint8_t>((m[j] >> 4) << 6);
    }
  }
}

TEST(GgmlBlocks, Q4_KByHand) {
  std::vector<uint8_t> b(144);
  put16(b.data(), 1.0f);
  put16(b.data() + 2, 0.5f);
  int sc[8], m[8];
  for (int j = 0; j < 8; ++j) {
    sc[j] = 10 + 7 * j;  // 10..59: the high bits matter from j = 1
    m[j] = 63 - 5 * j;
  }
  pack_scales(sc, m, b.data() + 4);
  // Sub-blocks 2k and 2k+1 share qs[32k .. 32k+31]: low nibbles for 2k, high for 2k+1.
  for (int l = 0; l < 128; ++l) b[16 + l] = static_cast<uint8_t>((l % 16) | ((15 - (l * 3) % 16) << 4));
  const auto y = dequant(WeightFormat::Q4_K, b, 256);
  for (int e = 0; e < 256; ++e) {
    const int j = e / 32, l = e % 32, k = j / 2;
    const uint8_t byte = b[16 + 32 * k + l];
    const int q = j % 2 == 0 ? byte & 0xF : byte >> 4;
    EXPECT_FLOAT_EQ(y[e], 1.0f * sc[j] * q - 0.5f * m[j]) << e;
  }
}

TEST(GgmlBlocks, Q5_KByHand) {
  std::vector<uint8_t> b(176);
  put16(b.data(), 0.5f);
  put16(b.data() + 2, 0.25f);
  int sc[8], m[8];
  for (int j = 0; j < 8; ++j) {
    sc[j] = 63 - 6 * j;
    m[j] = 3 + 8 * j;
  }
  pack_scales(sc, m, b.data() + 4);
  for (int l = 0; l < 32; ++l) b[16 + l] = static_cast<uint8_t>(l * 37 + 5);             // qh: high bits
  for (int l = 0; l < 128; ++l) b[48 + l] = static_cast<uint8_t>((l * 11 + 3) % 256);  // qs: nibbles
  const auto y = dequant(WeightFormat::Q5_K, b, 256);
  for (int e = 0; e < 256; ++e) {
    const int j = e / 32, l = e % 32, k = j / 2;
    const uint8_t byte = b[48 + 32 * k + l];
    const int low = j % 2 == 0 ? byte & 0xF : byte >> 4;
    const int high = (b[16 + l] >> j) & 1;  // bit j of qh[l] is sub-block j's fifth bit
    EXPECT_FLOAT_EQ(y[e], 0.5f * sc[j] * (low + 16 * high) - 0.25f * m[j]) << e;
  }
}

TEST(GgmlBlocks, Q6_KByHand) {
  std::vector<uint8_t> b(210, 0);
  put16(b.data() + 208, 0.125f);
  auto* sc = reinterpret_cast<int8_t*>(b.data() + 192);
  for (int j = 0; j < 16; ++j) sc[j] = static_cast<int8_t>((j - 8) * 3);
  // Level of element e (0..63), placed as the layout says: in each half of 128, element 32 * g + l (g = 0..3) takes
  // its low nibble from ql[64 * half + l + 32 * (g % 2)] (low for g < 2, high otherwise) and its top two bits from
  // qh[32 * half + l] at bit 2 * g.
  int L[256];
  for (int e = 0; e < 256; ++e) L[e] = (e * 7 + 3) % 64;
  for (int e = 0; e < 256; ++e) {
    const int half = e / 128, g = (e % 128) / 32, l = e % 32;
    uint8_t& ql = b[64 * half + l + 32 * (g % 2)];
    ql |= static_cast<uint8_t>(g < 2 ? (L[e] & 0xF) : (L[e] & 0xF) << 4);
    b[128 + 32 * half + l] |= static_cast<uint8_t>((L[e] >> 4) << (2 * g));
  }
  const auto y = dequant(WeightFormat::Q6_K, b, 256);
  for (int e = 0; e < 256; ++e) EXPECT_FLOAT_EQ(y[e], 0.125f * sc[e / 16] * (L[e] - 32)) << e;
}

std::vector<float> gaussian(int64_t n, uint64_t seed, double sd = 1.0) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> d(0.0, sd);
  std::vector<float> x(static_cast<size_t>(n));
  for (float& v : x) v = static_cast<float>(d(rng));
  return x;
}

// RMS error of a round trip relative to the data's RMS: bounds near what each format's bits allow (a 4-bit format's
// step over a block's range is ~0.3 sigma, so ~0.09 sigma RMS), far below what a wrong scale or shift gives (~0.5+).
TEST(GgmlBlocks, RoundTripsAreAsCloseAsTheirBitsAllow) {
  const struct {
    WeightFormat f;
    double bound;
  } cases[] = {{WeightFormat::Q8_0, 0.006}, {WeightFormat::Q4_0, 0.13}, {WeightFormat::Q5_0, 0.065},
               {WeightFormat::Q5_1, 0.06},  {WeightFormat::Q4_K, 0.11}, {WeightFormat::Q5_K, 0.055},
               {WeightFormat::Q6_K, 0.03}};
  const int64_t n = 4096;
  for (const auto& c : cases) {
    const std::vector<float> x = gaussian(n, 7, 0.03);
    std::vector<uint8_t> q(static_cast<size_t>(weight_row_bytes(c.f, n)));
    ggml_quantize_row(c.f, x.data(), n, q.data());
    const std::vector<float> y = dequant(c.f, q, n);
    double err = 0, ref = 0;
    for (int64_t i = 0; i < n; ++i) {
      err += (x[i] - y[i]) * static_cast<double>(x[i] - y[i]);
      ref += x[i] * static_cast<double>(x[i]);
    }
    EXPECT_LT(std::sqrt(err / ref), c.bound) << weight_format_name(c.f);
    EXPECT_GT(std::sqrt(err / ref), c.bound / 20) << weight_format_name(c.f) << ": suspiciously exact";
    // A block of zeros stays zeros.
    std::vector<float> z(static_cast<size_t>(n), 0.0f);
    ggml_quantize_row(c.f, z.data(), n, q.data());
    for (float v : dequant(c.f, q, n)) ASSERT_EQ(v, 0.0f) << weight_format_name(c.f);
  }
}

TEST(GgmlBlocks, SymmetricFormatsMapTheLargestMagnitudeExactly) {
  // q8_0 scales by amax / 127, q4_0 by max / -8, q5_0 by max / -16: the element of largest magnitude comes back as
  // its f16-rounded scale times the end level.
  std::vector<float> x = gaussian(32, 3);
  x[5] = -4.0f;  // the largest magnitude, negative
  std::vector<uint8_t> q(34);
  ggml_quantize_row(WeightFormat::Q8_0, x.data(), 32, q.data());
  EXPECT_FLOAT_EQ(dequant(WeightFormat::Q8_0, q, 32)[5], -127 * f16_to_f32(f32_to_f16(4.0f / 127)));
  ggml_quantize_row(WeightFormat::Q4_0, x.data(), 32, q.data());
  EXPECT_FLOAT_EQ(dequant(WeightFormat::Q4_0, q, 32)[5], -4.0f);  // d = 0.5, level 0 -> (0 - 8) * 0.5
  ggml_quantize_row(WeightFormat::Q5_0, x.data(), 32, q.data());
  EXPECT_FLOAT_EQ(dequant(WeightFormat::Q5_0, q, 32)[5], -4.0f);  // d = 0.25, level 0 -> -16 * 0.25
  // Re-quantizing q8_0's own output gives the same bytes.
  ggml_quantize_row(WeightFormat::Q8_0, x.data(), 32, q.data());
  const std::vector<float> y = dequant(WeightFormat::Q8_0, q, 32);
  std::vector<uint8_t> q2(34);
  ggml_quantize_row(WeightFormat::Q8_0, y.data(), 32, q2.data());
  EXPECT_EQ(q, q2);
}

TEST(GgmlBlocks, RowsThatAreNotWholeBlocksAreRefused) {
  std::vector<float> x(48);
  std::vector<uint8_t> q(1024);
  EXPECT_THROW(ggml_quantize_row(WeightFormat::Q8_0, x.data(), 48, q.data()), Error);
  EXPECT_THROW(ggml_dequantize_row(WeightFormat::Q4_K, q.data(), 128, x.data()), Error);
  EXPECT_THROW(ggml_quantize_row(WeightFormat::FP8_E4M3, x.data(), 32, q.data()), Error);
}

// The CPU's packed linear and embedding against fp64 over the exactly dequantized weights, on odd shapes.
TEST(PackedLinear, EqualsFp64DequantizeThenDot) {
  auto be = make_cpu_backend(2);
  const WeightFormat formats[] = {WeightFormat::Q8_0, WeightFormat::Q4_0, WeightFormat::Q5_0, WeightFormat::Q5_1,
                                  WeightFormat::Q4_K, WeightFormat::Q5_K, WeightFormat::Q6_K};
  const struct {
    int64_t T, in, out;
  } shapes[] = {{1, 256, 1}, {3, 512, 37}, {17, 768, 5}, {2, 256, 130}};
  uint64_t seed = 1;
  for (WeightFormat f : formats) {
    ASSERT_TRUE(be->supports_weight_format(f)) << weight_format_name(f);
    for (const auto& s : shapes) {
      const int64_t rb = weight_row_bytes(f, s.in);
      const std::vector<float> wf = gaussian(s.out * s.in, ++seed, 0.05);
      std::vector<uint8_t> wq(static_cast<size_t>(s.out * rb));
      std::vector<float> wd(wf.size());
      for (int64_t o = 0; o < s.out; ++o) {
        ggml_quantize_row(f, wf.data() + o * s.in, s.in, wq.data() + o * rb);
        ggml_dequantize_row(f, wq.data() + o * rb, s.in, wd.data() + o * s.in);
      }
      std::vector<float> x = gaussian(s.T * s.in, ++seed), bias = gaussian(s.out, ++seed);
      std::vector<float> y(static_cast<size_t>(s.T * s.out), -1.0f);
      const Weight w = Weight::packed(f, wq.data(), {s.out, s.in});
      be->linear(TensorView(x.data(), DType::F32, {s.T, s.in}), w, TensorView(bias.data(), DType::F32, {s.out}),
                 TensorView(y.data(), DType::F32, {s.T, s.out}));
      for (int64_t t = 0; t < s.T; ++t)
        for (int64_t o = 0; o < s.out; ++o) {
          double ref = bias[o], mag = std::fabs(bias[o]);
          for (int64_t i = 0; i < s.in; ++i) {
            ref += static_cast<double>(x[t * s.in + i]) * wd[o * s.in + i];
            mag += std::fabs(static_cast<double>(x[t * s.in + i]) * wd[o * s.in + i]);
          }
          // An f32 dot product (packed_kernels_test.cpp bounds it per kernel): within in / 4 + 8 roundings of the
          // sum of magnitudes; Q8_0 / Q4_K / Q6_K round the activations to int8 per block first (packed_kernels.h),
          // each within half its block's scale max|x| / 127, so add sum_blocks max|x| / 254 * sum |w| (1% over).
          double act = 0;
          if (cpu::simd::packed_int8(f)) {
            const int64_t blk = cpu::simd::packed_act_block(f);
            for (int64_t b = 0; b < s.in; b += blk) {
              double amax = 0, wsum = 0;
              for (int64_t i = b; i < b + blk; ++i) {
                amax = std::max(amax, std::fabs(static_cast<double>(x[t * s.in + i])));
                wsum += std::fabs(static_cast<double>(wd[o * s.in + i]));
              }
              act += amax / 254 * wsum * 1.01;
            }
          }
          ASSERT_NEAR(y[t * s.out + o], ref, (static_cast<double>(s.in) / 4 + 8) * 0x1p-24 * mag * 2 + act)
              << weight_format_name(f) << " T=" << s.T << " in=" << s.in << " out=" << s.out << " at " << t << "," << o;
        }
      // Embedding rows are the dequantized rows, bit for bit.
      std::vector<int32_t> ids = {static_cast<int32_t>(s.out - 1), 0, static_cast<int32_t>(s.out / 2)};
      std::vector<float> e(ids.size() * static_cast<size_t>(s.in));
      be->embed(w, TensorView(ids.data(), DType::I32, {3}), TensorView(e.data(), DType::F32, {3, s.in}));
      for (size_t r = 0; r < ids.size(); ++r)
        for (int64_t i = 0; i < s.in; ++i) ASSERT_EQ(e[r * s.in + i], wd[ids[r] * s.in + i]);
      ids[1] = static_cast<int32_t>(s.out);
      EXPECT_THROW(be->embed(w, TensorView(ids.data(), DType::I32, {3}), TensorView(e.data(), DType::F32, {3, s.in})),
                   Error);
    }
  }
}

}  // namespace
}  // namespace mambacpp
