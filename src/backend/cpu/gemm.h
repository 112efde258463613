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
// tiles of gemm_tile_tokens(); wp: packed w rows, R rounded up to whole tiles of gemm_tile_rows(). Any alignment
// works; 64-byte aligned buffers (linear.cpp) keep every vector load within one cache line.
void gemm_packed(const float* xp, int64_t T, const float* wp, int64_t R, int64_t in, float* y, int64_t y_stride);

// The SSD's chunk products (ssd.h), vectors along C's rows: C[m, n] (+)= sum_{k < K} A[m, k] * B[k, n] for m < M,
// n < N (row strides lda, ldb, ldc). causal: row m sums only k < m rounded up to its tile of 4 rows (A must be zero
// beyond the diagonal there), for lower-triangular A.
void matmul(int64_t M, int64_t N, int64_t K, const float* A, int64_t lda, const float* B, int64_t ldb, float* C,
            int64_t ldc, bool accumulate, bool causal);

// One row i of the SSD's decay-weighted chunk matrix: for j < i, seg[j] += a and out[j] = exp(seg[j]) * cb[j] * dt[j];
// then seg[i] = 0, out[i] = cb[i] * dt[i] and out[i + 1 .. n) = 0. Called for i = 0, 1, ... it keeps
// seg[j] = a_{j+1} + ... + a_i, summed term by term (never a difference of running sums).
void ssd_decay_row(int64_t i, int64_t n, float a, float* seg, const float* cb, const float* dt, float* out);

}  // namespace mambacpp::cpu::simd
