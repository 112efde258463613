// Vector kernels for block-format weights (ggml's Q8_0, Q4_K, Q6_K, ... of core/ggml_blocks.h), compiled per SIMD
// target like simd.h and chosen at run time with it (force_target applies here too).
//
// The contract that makes decode and prefill agree bit for bit: a packed row's dot product is the dot product of the
// row exactly dequantized to f32 (the floats ggml_dequantize_row gives) with x, summed in dot_rows' order (simd.h).
// Q8_0, Q4_K and Q6_K are dequantized in registers and dotted as they are decoded; the other block formats go through
// ggml_dequantize_row into a row buffer and dot_rows. packed_dequantize_rows gives the same floats for the prefill
// GEMM (gemm.h), which reproduces dot_rows' order; so a token's output does not depend on how many tokens came with
// it. The activations stay f32: the error against an fp64 dot of the dequantized row is that of an f32 dot product.
#pragma once

#include <cstdint>

#include "core/weight.h"

namespace mambacpp::cpu::simd {

// Whether `f` has a register-dequantizing kernel (the others run through ggml_dequantize_row).
bool packed_in_registers(WeightFormat f);

// out[r] = x . dequantize(row r) for r < rows, rows of weight_row_bytes(f, in) bytes each from w; in dot_rows' order.
void packed_dot_rows(const float* x, const uint8_t* w, WeightFormat f, int64_t in, int64_t rows, float* out);

// dst[r * dst_stride + i] = element i of row r dequantized, exactly as ggml_dequantize_row.
void packed_dequantize_rows(const uint8_t* w, WeightFormat f, int64_t in, int64_t rows, float* dst,
                            int64_t dst_stride);

}  // namespace mambacpp::cpu::simd
