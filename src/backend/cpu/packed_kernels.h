// Vector kernels for block-format weights (ggml's Q8_0, Q4_K, Q6_K, ... of core/ggml_blocks.h), compiled per SIMD
// target like simd.h and chosen at run time with it (force_target applies here too).
//
// Q8_0, Q4_K and Q6_K run with int8 activations (below; faster than f32 activations in decode and prefill alike:
// docs/perf-log/cpu-block-kernels-2026-12-07.md). The other block formats keep f32 activations, with the contract
// that makes decode and prefill agree bit for bit: a packed row's dot product is the dot product of the row exactly
// dequantized to f32 (the floats ggml_dequantize_row gives) with x, summed in dot_rows' order (simd.h);
// packed_dequantize_rows gives the same floats for the prefill GEMM (gemm.h), which reproduces that order. Their error
// against an fp64 dot of the dequantized row is that of an f32 dot product.
#pragma once

#include <cstdint>

#include "core/weight.h"

namespace mambacpp::cpu::simd {

// Whether `f` is dequantized in registers (the others run through ggml_dequantize_row).
bool packed_in_registers(WeightFormat f);

// out[r] = x . dequantize(row r) for r < rows, rows of weight_row_bytes(f, in) bytes each from w; in dot_rows' order.
// For the formats without an int8 kernel (Q4_0, Q5_0, Q5_1, Q5_K).
void packed_dot_rows(const float* x, const uint8_t* w, WeightFormat f, int64_t in, int64_t rows, float* out);

// dst[r * dst_stride + i] = element i of row r dequantized, exactly as ggml_dequantize_row.
void packed_dequantize_rows(const uint8_t* w, WeightFormat f, int64_t in, int64_t rows, float* dst,
                            int64_t dst_stride);

// Int8 activations (packed_int8_kernels.cpp), as llama.cpp's Q8_0 / Q8_K: Q8_0, Q4_K and Q6_K weights are dotted with
// a token's activations rounded to int8 per block (32 elements for Q8_0, a 256-element super-block for the K-quants),
// one f32 scale d = max|x| / 127 per block (|x - d q| <= d / 2), and for the K-quants the sums of each 16 quantized
// values (of each 32 for Q4_K, 16 for Q6_K, whose sub-blocks they are). The block dot products are exact integers; each row then sums (d_w d_x) * S in a fixed order, so a row's
// result depends only on its bytes and the token's quantized activations, whatever the rows or tokens beside it.
bool packed_int8(WeightFormat f);
// Elements per activation scale for weights of format f (32 or 256).
int64_t packed_act_block(WeightFormat f);
// Elements per activation sum (32 for Q4_K, 16 for Q6_K; 0: none).
int64_t packed_act_sum_group(WeightFormat f);
// One token's quantized activations: q i8[in], at packed_act_scales_offset(in) the scales f32[in / block], then (K-quants)
// the sums i16[in / group].
int64_t packed_act_bytes(WeightFormat f, int64_t in);
int64_t packed_act_scales_offset(int64_t in);
// xq (packed_act_bytes(f, in) bytes) = x quantized for weights of format f. A block holding NaN or inf gets a NaN scale.
void packed_quantize_act(const float* x, WeightFormat f, int64_t in, uint8_t* xq);
// out[t * out_stride + r] = dot of row r (weight_row_bytes(f, in) bytes each from w) with token t's quantized
// activations (at xq + t * xq_stride) for t < T, r < rows; a token's result is the same bits whatever T.
void packed_dot_rows_int8(const uint8_t* xq, int64_t xq_stride, int64_t T, const uint8_t* w, WeightFormat f,
                          int64_t in, int64_t rows, float* out, int64_t out_stride);

}  // namespace mambacpp::cpu::simd
