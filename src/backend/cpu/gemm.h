// The prefill GEMM's kernels (gemm_kernels.cpp, one build per SIMD target, chosen at run time like simd.h):
// y[t, r] = x[t, :] . w[r, :] over packed rows, each element computed in exactly dot_rows' order (simd.h), so a token's
// result is the same bits whether it is decoded alone (the GEMV) or inside a prompt of any length (this GEMM).
//
// Packed rows: a row of `in` values widened to f32, zero-padded to whole vectors of the target and its vector blocks
// reordered so that each of dot_rows' four accumulator chains (block b feeds chain b % 4) reads contiguous memory.
// A packed row has packed_row_floats(in) floats. The register tile is gemm_tile_tokens() x rows by
// gemm_tile_rows() w rows; packed buffers hold whole tiles (zero rows past the end).
#pragma once

#include <cstdint>

#include "mambacpp/dtype.h"

namespace mambacpp::cpu::simd {

int64_t packed_row_floats(int64_t in);
int64_t gemm_tile_tokens();
int64_t gemm_tile_rows();

// dst[r * packed_row_floats(in) ...] = row r of src (row r at src + r * src_stride elements, dtype f32/bf16/f16),
// packed, for r < rows. dst must hold rows * packed_row_floats(in) floats.
void pack_rows(const void* src, DType dtype, int64_t src_stride, int64_t rows, int64_t in, float* dst);

// y[t * y_stride + r] = x[t] . w[r] for t < T, r < R (in dot_rows' order); xp: packed x rows, T rounded up to whole
// tiles of gemm_tile_tokens(); wp: packed w rows, R rounded up to whole tiles of gemm_tile_rows().
void gemm_packed(const float* xp, int64_t T, const float* wp, int64_t R, int64_t in, float* y, int64_t y_stride);

}  // namespace mambacpp::cpu::simd
