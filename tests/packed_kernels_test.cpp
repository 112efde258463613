// The CPU's kernels for block-format weights (backend/cpu/packed_kernels.h, packed_linear.cpp), on every SIMD target
// this machine runs:
//  - dequantization in registers gives exactly ggml_dequantize_row's floats (special scales included);
//  - f32 activations (Q4_0, Q5_*): a packed row's dot product is bit for bit dot_rows over the dequantized row (the
//    contract the prefill GEMM shares);
//  - the linear against an fp64 dot of the exactly dequantized weights, within an f32 dot product's rounding, on odd
//    shapes and token counts (decode and prefill paths);
//  - a token's outputs do not depend on how many tokens came with it, on how the prompt was split, or on the threads;
//  - a NaN in the inputs or in a block's scale is never lost;
//  - Q8_0 / Q4_K / Q6_K run with int8 activations (packed_kernels.h): the activation rounding within half a block
//    scale per element; the int8 dot product against fp64 over the dequantized operands within its f32 roundings;
//    the linear against fp64 over the f32 activations within the activation rounding's bound.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "backend/cpu/packed_kernels.h"
#include "backend/cpu/simd.h"
#include "core/ggml_blocks.h"
#include "mambacpp/dtype.h"
#include "mambacpp/error.h"
#include "mambacpp/model.h"
#include "mambacpp/shapes.h"
#include "mambacpp/state.h"
#include "model/weights.h"
#include "support/test_support.h"

namespace mambacpp {
namespace {

const WeightFormat kFormats[] = {WeightFormat::Q8_0, WeightFormat::Q4_0, WeightFormat::Q5_0, WeightFormat::Q5_1,
                                 WeightFormat::Q4_K, WeightFormat::Q5_K, WeightFormat::Q6_K};

bool k_quant(WeightFormat f) { return weight_format_info(f).block_elems == 256; }

// Row lengths that leave partial passes and chunks: not multiples of 256 where the format allows.
std::vector<int64_t> row_lengths(WeightFormat f) {
  if (k_quant(f)) return {256, 512, 768, 2304};
  return {32, 96, 288, 800, 2080};
}

// Where a block's f16 scale d lives.
int64_t scale_offset(WeightFormat f) { return f == WeightFormat::Q6_K ? 208 : 0; }

std::vector<float> gaussian(int64_t n, uint64_t seed, double sd = 1.0) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> dist(0.0, sd);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = static_cast<float>(dist(rng));
  return v;
}

struct Packed {
  int64_t rows, in, rb;
  std::vector<uint8_t> bytes;
  std::vector<float> deq;  // the reference dequantization, [rows, in]
};

Packed quantized(WeightFormat f, int64_t rows, int64_t in, uint64_t seed) {
  Packed p{rows, in, weight_row_bytes(f, in), {}, {}};
  const std::vector<float> w = gaussian(rows * in, seed, 0.05);
  p.bytes.resize(static_cast<size_t>(rows * p.rb));
  p.deq.resize(static_cast<size_t>(rows * in));
  for (int64_t r = 0; r < rows; ++r) ggml_quantize_row(f, w.data() + r * in, in, p.bytes.data() + r * p.rb);
  return p;
}
void dequantize_all(WeightFormat f, Packed& p) {
  for (int64_t r = 0; r < p.rows; ++r) ggml_dequantize_row(f, p.bytes.data() + r * p.rb, p.in, p.deq.data() + r * p.in);
}

void set_scale(WeightFormat f, Packed& p, int64_t row, int64_t block, uint16_t half) {
  const WeightFormatInfo& info = weight_format_info(f);
  std::memcpy(p.bytes.data() + row * p.rb + block * info.block_bytes + scale_offset(f), &half, 2);
}

bool same_bits(float a, float b) { return std::memcmp(&a, &b, 4) == 0; }

template <class Fn>
void on_every_target(Fn&& fn) {
  for (const std::string& target : cpu::simd::available_targets()) {
    SCOPED_TRACE("SIMD target " + target);
    cpu::simd::force_target(target);
    fn();
  }
  cpu::simd::force_target("");
}

TEST(PackedKernels, DequantizeInRegistersEqualsReference) {
  on_every_target([] {
    uint64_t seed = 10;
    for (WeightFormat f : kFormats)
      for (int64_t in : row_lengths(f)) {
        Packed p = quantized(f, 6, in, ++seed);
        // Scales the fast f16 conversion does not take: zero, -0, subnormal, largest, inf, NaN.
        set_scale(f, p, 1, 0, 0x0000);
        set_scale(f, p, 2, 0, 0x8000);
        set_scale(f, p, 3, 0, 0x0003);
        set_scale(f, p, 3, in / weight_format_info(f).block_elems - 1, 0x83ff);
        set_scale(f, p, 4, 0, 0x7bff);
        set_scale(f, p, 5, 0, 0xfc00);
        set_scale(f, p, 0, in / weight_format_info(f).block_elems - 1, 0x7e00);
        dequantize_all(f, p);
        std::vector<float> got(static_cast<size_t>(p.rows * (in + 3)), 7.0f);
        cpu::simd::packed_dequantize_rows(p.bytes.data(), f, in, p.rows, got.data(), in + 3);
        for (int64_t r = 0; r < p.rows; ++r) {
          for (int64_t i = 0; i < in; ++i)
            ASSERT_TRUE(same_bits(got[r * (in + 3) + i], p.deq[r * in + i]))
                << weight_format_name(f) << " in=" << in << " row " << r << " element " << i << ": "
                << got[r * (in + 3) + i] << " vs " << p.deq[r * in + i];
          EXPECT_EQ(got[r * (in + 3) + in], 7.0f) << "wrote past the row";
        }
      }
  });
}

TEST(PackedKernels, DotIsDotRowsOverTheDequantizedRowBitForBit) {
  on_every_target([] {
    uint64_t seed = 100;
    for (WeightFormat f : kFormats)
      for (int64_t in : row_lengths(f)) {
        if (cpu::simd::packed_int8(f)) continue;  // int8 activations: Int8DotEqualsFp64OverTheQuantizedOperands
        Packed p = quantized(f, 19, in, ++seed);
        dequantize_all(f, p);
        const std::vector<float> x = gaussian(in, ++seed);
        std::vector<float> got(19), want(19);
        cpu::simd::packed_dot_rows(x.data(), p.bytes.data(), f, in, 19, got.data());
        cpu::simd::dot_rows(x.data(), p.deq.data(), DType::F32, in, 19, want.data());
        for (int r = 0; r < 19; ++r)
          ASSERT_TRUE(same_bits(got[r], want[r]))
              << weight_format_name(f) << " in=" << in << " row " << r << ": " << got[r] << " vs " << want[r];
      }
  });
}

struct Shape {
  int64_t T, in, out;
};

std::vector<float> run_linear(Backend& be, WeightFormat f, const Packed& p, const std::vector<float>& x, int64_t T,
                              const std::vector<float>* bias) {
  std::vector<float> y(static_cast<size_t>(T * p.rows), -1.0f);
  const Weight w = Weight::packed(f, const_cast<uint8_t*>(p.bytes.data()), {p.rows, p.in});
  be.linear(TensorView(const_cast<float*>(x.data()), DType::F32, {T, p.in}), w,
            bias ? TensorView(const_cast<float*>(bias->data()), DType::F32, {p.rows}) : TensorView(),
            TensorView(y.data(), DType::F32, {T, p.rows}));
  return y;
}

// The activation rounding of the int8 path, bounded by the block scales: |x_i - d q_i| <= d / 2 with d = max|x| / 127
// over x_i's block, so |sum_i w_i x_i - sum_i w_i d q_i| <= sum_blocks d / 2 sum_{i in block} |w_i| (computed here
// from x, independently of the kernel's scales; 1% over for the f32 roundings of d and of the quotient).
double activation_rounding_bound(WeightFormat f, const float* x, const float* w, int64_t in) {
  if (!cpu::simd::packed_int8(f)) return 0;
  const int64_t blk = cpu::simd::packed_act_block(f);
  double bound = 0;
  for (int64_t b = 0; b < in; b += blk) {
    double amax = 0, wsum = 0;
    for (int64_t i = b; i < b + blk; ++i) {
      amax = std::max(amax, std::fabs(static_cast<double>(x[i])));
      wsum += std::fabs(static_cast<double>(w[i]));
    }
    bound += amax / 127 / 2 * wsum * 1.01;
  }
  return bound;
}

// Against fp64 over the exactly dequantized weights and the f32 activations. f32 activations: an f32 dot product of
// `in` terms summed in chains of at most in / 4 + 3 additions (four accumulators, then the lanes), so within
// (in / 4 + 8) f32 roundings of sum |x w|. Int8 activations: activation_rounding_bound on top of the int8 dot's own
// f32 roundings (Int8DotEqualsFp64OverTheQuantizedOperands), which (in / 4 + 8) roundings of sum |x w| covers with 2x
// room here (the weights are Gaussian, so |w| bounds a K-quant's scale and min parts within that).
TEST(PackedKernels, LinearEqualsFp64DequantizeThenDot) {
  on_every_target([] {
    auto be = make_cpu_backend(2);
    const Shape shapes[] = {{1, 0, 1}, {2, 0, 37}, {7, 0, 130}, {33, 0, 45}};
    uint64_t seed = 1000;
    for (WeightFormat f : kFormats)
      for (int64_t in : {row_lengths(f)[1], row_lengths(f)[2]})
        for (Shape s : shapes) {
          s.in = in;
          Packed p = quantized(f, s.out, s.in, ++seed);
          dequantize_all(f, p);
          const std::vector<float> x = gaussian(s.T * s.in, ++seed), bias = gaussian(s.out, ++seed);
          const std::vector<float> y = run_linear(*be, f, p, x, s.T, &bias);
          for (int64_t t = 0; t < s.T; ++t)
            for (int64_t o = 0; o < s.out; ++o) {
              double ref = 0, mag = std::fabs(bias[o]);
              for (int64_t i = 0; i < s.in; ++i) {
                const double term = static_cast<double>(x[t * s.in + i]) * p.deq[o * s.in + i];
                ref += term;
                mag += std::fabs(term);
              }
              const double bound = (static_cast<double>(s.in) / 4 + 8) * 0x1p-24 * mag * 2 +
                                   activation_rounding_bound(f, &x[t * s.in], &p.deq[o * s.in], s.in);
              ASSERT_NEAR(y[t * s.out + o], ref + bias[o], bound)
                  << weight_format_name(f) << " T=" << s.T << " in=" << s.in << " out=" << s.out << " at " << t << ","
                  << o;
            }
        }
  });
}

const WeightFormat kInt8Formats[] = {WeightFormat::Q8_0, WeightFormat::Q4_K, WeightFormat::Q6_K};

// One token's quantized activations read back: the values d q and the kernel's scales.
struct QuantizedAct {
  std::vector<uint8_t> bytes;
  std::vector<double> values;
  std::vector<float> scales;
};
QuantizedAct quantize_act(WeightFormat f, const std::vector<float>& x) {
  const int64_t in = static_cast<int64_t>(x.size()), blk = cpu::simd::packed_act_block(f);
  QuantizedAct a;
  a.bytes.assign(static_cast<size_t>(cpu::simd::packed_act_bytes(f, in)), 0xAB);
  cpu::simd::packed_quantize_act(x.data(), f, in, a.bytes.data());
  const int8_t* q = reinterpret_cast<const int8_t*>(a.bytes.data());
  a.scales.resize(static_cast<size_t>(in / blk));
  std::memcpy(a.scales.data(), a.bytes.data() + cpu::simd::packed_act_scales_offset(in), a.scales.size() * 4);
  for (int64_t i = 0; i < in; ++i) a.values.push_back(static_cast<double>(a.scales[i / blk]) * q[i]);
  return a;
}

// d = max|x| / 127 per block, |x - d q| <= d / 2 (and f32's rounding of x * 127 / max), q within [-127, 127], the
// sums the K-quant kernels take; a zero block and a block holding NaN or inf (scale NaN).
TEST(PackedKernels, ActivationRoundingWithinHalfABlockScale) {
  on_every_target([] {
    uint64_t seed = 2000;
    for (WeightFormat f : kInt8Formats)
      for (int64_t in : row_lengths(f)) {
        const int64_t blk = cpu::simd::packed_act_block(f), group = cpu::simd::packed_act_sum_group(f);
        std::vector<float> x = gaussian(in, ++seed, 3.0);
        std::fill(x.begin(), x.begin() + blk, 0.0f);  // block 0: zero
        if (in / blk > 2) x[blk + 5] = std::nanf("");  // block 1: NaN
        if (in / blk > 2) x[2 * blk + 7] = -INFINITY;  // block 2: -inf
        const QuantizedAct a = quantize_act(f, x);
        const int8_t* q = reinterpret_cast<const int8_t*>(a.bytes.data());
        for (int64_t b = 0; b < in / blk; ++b) {
          const bool bad = in / blk > 2 && (b == 1 || b == 2);
          float amax = 0;
          for (int64_t i = b * blk; i < (b + 1) * blk; ++i) amax = std::max(amax, std::fabs(x[i]));
          if (bad) {
            EXPECT_TRUE(std::isnan(a.scales[b])) << weight_format_name(f) << " block " << b;
            continue;
          }
          ASSERT_EQ(a.scales[b], amax / 127.0f) << weight_format_name(f) << " block " << b;
          for (int64_t i = b * blk; i < (b + 1) * blk; ++i) {
            ASSERT_LE(std::abs(q[i]), 127);
            ASSERT_LE(std::fabs(x[i] - a.values[i]), a.scales[b] * (0.5 + 0x1p-20))
                << weight_format_name(f) << " in=" << in << " element " << i;
          }
        }
        if (group == 0) continue;
        const int16_t* sums = reinterpret_cast<const int16_t*>(a.bytes.data() + cpu::simd::packed_act_scales_offset(in) +
                                                               4 * (in / blk));
        for (int64_t g = 0; g < in / group; ++g) {
          int want = 0;
          for (int64_t i = g * group; i < (g + 1) * group; ++i) want += q[i];
          ASSERT_EQ(sums[g], want) << weight_format_name(f) << " sum " << g;
        }
      }
  });
}

// The int8 dot product against fp64 over the dequantized weights and the dequantized activations (d q): the block
// products are exact integers, so the error is the f32 arithmetic's: per block the scale product d_w d_x (1 rounding),
// the chain of block terms into a lane (at most in / 32 roundings), the lanes' sum (3), and ggml's own rounding of a
// dequantized K-quant weight (1 for Q6_K's d sc (q - 32), 1 for Q4_K's subtraction), all relative to the magnitude of
// the terms summed: for Q4_K the scale part |d sc q| and the min part |dmin m| separately (they can cancel), found by
// dequantizing the block with dmin, then d, set to zero.
TEST(PackedKernels, Int8DotEqualsFp64OverTheQuantizedOperands) {
  on_every_target([] {
    uint64_t seed = 3000;
    for (WeightFormat f : kInt8Formats)
      for (int64_t in : row_lengths(f)) {
        Packed p = quantized(f, 21, in, ++seed);
        dequantize_all(f, p);
        std::vector<float> scale_part(p.deq), min_part(static_cast<size_t>(p.rows * in), 0.0f);
        if (f == WeightFormat::Q4_K) {
          Packed a = p, b = p;
          for (int64_t r = 0; r < p.rows; ++r)
            for (int64_t k = 0; k < in / 256; ++k) {
              std::memset(a.bytes.data() + r * p.rb + 144 * k + 2, 0, 2);  // dmin = 0: d sc q
              std::memset(b.bytes.data() + r * p.rb + 144 * k, 0, 2);      // d = 0: -dmin m
            }
          dequantize_all(f, a);
          dequantize_all(f, b);
          scale_part = a.deq;
          min_part = b.deq;
        }
        const std::vector<float> x = gaussian(in, ++seed);
        const QuantizedAct a = quantize_act(f, x);
        std::vector<float> got(static_cast<size_t>(p.rows));
        cpu::simd::packed_dot_rows_int8(a.bytes.data(), 0, 1, p.bytes.data(), f, in, p.rows, got.data(), p.rows);
        for (int64_t r = 0; r < p.rows; ++r) {
          double ref = 0, mag = 0;
          for (int64_t i = 0; i < in; ++i) {
            ref += p.deq[r * in + i] * a.values[i];
            mag += (std::fabs(scale_part[r * in + i]) + std::fabs(min_part[r * in + i])) * std::fabs(a.values[i]);
          }
          const double bound = (static_cast<double>(in) / 32 + 6) * 0x1p-24 * mag;
          ASSERT_NEAR(got[r], ref, bound) << weight_format_name(f) << " in=" << in << " row " << r;
        }
      }
  });
}

// A token's outputs are the same bits whether it is decoded alone, in a decode batch, in a prompt of any length or in
// any piece of one, with one thread or two.
TEST(PackedKernels, BatchSplitAndThreadInvariantBitForBit) {
  on_every_target([] {
    auto be2 = make_cpu_backend(2), be1 = make_cpu_backend(1);
    uint64_t seed = 5000;
    for (WeightFormat f : kFormats) {
      const int64_t in = row_lengths(f)[2], out = 70, T = 33;
      Packed p = quantized(f, out, in, ++seed);
      const std::vector<float> x = gaussian(T * in, ++seed), bias = gaussian(out, ++seed);
      const std::vector<float> all = run_linear(*be2, f, p, x, T, &bias);
      EXPECT_EQ(run_linear(*be1, f, p, x, T, &bias), all) << weight_format_name(f) << ": one thread";
      // Pieces of 1, 2, 3, 5, 7 and 15 tokens: the decode path (<= 4) and the GEMM path (> 4) both.
      int64_t t0 = 0;
      for (int64_t len : {1, 2, 3, 5, 7, 15}) {
        const std::vector<float> piece(x.begin() + t0 * in, x.begin() + (t0 + len) * in);
        const std::vector<float> y = run_linear(*be2, f, p, piece, len, &bias);
        for (int64_t i = 0; i < len * out; ++i)
          ASSERT_TRUE(same_bits(y[i], all[t0 * out + i]))
              << weight_format_name(f) << " piece of " << len << " at token " << t0 << ", element " << i;
        t0 += len;
      }
      ASSERT_EQ(t0, T);
    }
  });
}

TEST(PackedKernels, NaNIsNeverLost) {
  on_every_target([] {
    auto be = make_cpu_backend(2);
    uint64_t seed = 9000;
    for (WeightFormat f : kFormats) {
      const int64_t in = row_lengths(f)[2], out = 40;
      for (int64_t T : {1, 3, 9}) {
        Packed p = quantized(f, out, in, ++seed);
        std::vector<float> x = gaussian(T * in, ++seed);
        x[(T - 1) * in + in / 2] = std::nanf("");  // the last token
        set_scale(f, p, 17, in / weight_format_info(f).block_elems - 1, 0x7e00);  // row 17's last block
        const std::vector<float> y = run_linear(*be, f, p, x, T, nullptr);
        for (int64_t t = 0; t < T; ++t)
          for (int64_t o = 0; o < out; ++o) {
            const bool want_nan = t == T - 1 || o == 17;
            ASSERT_EQ(std::isnan(y[t * out + o]), want_nan) << weight_format_name(f) << " T=" << T << " at " << t
                                                            << "," << o << ": " << y[t * out + o];
          }
      }
    }
  });
}

// bench --weights: a real shape's random weights quantized as llama.cpp types them (two layers of mamba2-130m here),
// run through the model: decode steps (the fused decode linears on packed weights) against the prompt's prefill
// (the packed GEMM), and the same prefill on one thread and on two.
TEST(PackedKernels, RandomQuantizedModelDecodesAsItPrefills) {
  ModelConfig c = named_shape("mamba2-130m");
  c.n_layer = 2;
  c.vocab_size = 1000;
  LoadOptions lo;
  lo.device = DeviceChoice::CPU;
  lo.threads = 2;
  auto m = Model::random_quantized(c, lo, 3, "q4_k");
  EXPECT_EQ(m->weights().layers[0].in_proj.format, WeightFormat::Q4_K);
  EXPECT_EQ(m->weights().layers[1].out_proj.format, WeightFormat::Q4_K);
  EXPECT_EQ(m->weights().embeddings.format, WeightFormat::Q6_K);  // Q4_K_M's output matrix (tied here)
  const std::vector<int32_t> ids = test::random_tokens(7, c.vocab_size, 5);
  auto st = m->create_state(1);
  Sequence all = Sequence::tokens(ids);
  const std::vector<float> prefill = m->forward(*st, {&all, 1}, Output::AllLogits).values;
  ASSERT_EQ(prefill.size(), ids.size() * static_cast<size_t>(c.vocab_size));
  for (float v : prefill) ASSERT_TRUE(std::isfinite(v));
  auto st2 = m->create_state(1);
  for (size_t t = 0; t < ids.size(); ++t) {
    Sequence one = Sequence::tokens(std::span<const int32_t>(ids.data() + t, 1));
    const std::vector<float> step = m->forward(*st2, {&one, 1}, Output::AllLogits).values;
    const std::span<const float> row(prefill.data() + t * c.vocab_size, static_cast<size_t>(c.vocab_size));
    EXPECT_LE(test::max_rel_diff(step, row), 1e-4) << "token " << t;
  }
  lo.threads = 1;
  auto m1 = Model::random_quantized(c, lo, 3, "q4_k");
  auto st1 = m1->create_state(1);
  EXPECT_EQ(m1->forward(*st1, {&all, 1}, Output::AllLogits).values, prefill);
  EXPECT_THROW(Model::random_quantized(c, lo, 3, "q3_k"), Error);
}

}  // namespace
}  // namespace mambacpp
