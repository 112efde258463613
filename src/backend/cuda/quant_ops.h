// Launchers of the quantized-weight kernels (quant_gemv.cu, quant_convert.cu), callable from plain C++.
//
// Device layouts, made once at upload (CudaBackend::adopt_packed, quant_linear.cpp):
//   q8_0     : the int8 quants of every row, row-major [rows, cols] (row stride cols, a multiple of 32, so every row
//              starts 16-byte aligned), then the f16 block scales [rows, cols / 32]. Same byte count as ggml's
//              34-byte blocks; splitting them lets a lane read 16 quants with one 16-byte load.
//   fp8_e4m3 : the e4m3 bytes [rows, cols] as stored, beside f32 scales: [rows] (per output channel) or [1].
// Element (o, i) is  d[o, i / 32] * q[o, i]  (q8_0) or  s[o] * e4m3(b[o, i])  (fp8; s[0] for a per-tensor scale).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <optional>

#include "backend/backend.h"
#include "backend/cuda/cuda_ops.h"
#include "backend/cuda/fused_ops.h"
#include "core/weight.h"

namespace mambacpp::cuda {

struct QuantMatrix {
  WeightFormat format = WeightFormat::Q8_0;  // Q8_0 or FP8_E4M3
  const uint8_t* q = nullptr;                // [rows, cols] bytes (int8 quants or e4m3)
  const void* scale = nullptr;               // q8_0: f16 [rows, cols / 32]; fp8: f32 [rows] or [1]
  bool per_tensor = false;                   // fp8: one scale for the whole matrix
  int64_t rows = 0, cols = 0;
};

// Rows up to this go through the GEMV (dequantizing in registers); more rows: a dequantized 16-bit copy and the
// tensor-core GEMMs. Within the GEMV a row's result does not depend on the row count (chunks of 8 rows, each
// row's sum in the same fixed order).
inline constexpr int64_t kQuantGemvMaxRows = 16;

// y[t, o] = sum_i x[t, i] * W[o, i] (+ bias[o]) for any T (chunks of 8 rows); f32 sums of exact products.
void launch_quant_gemv(ConstF32Rows x, const QuantMatrix& w, DevWeight bias, F32Rows y, int64_t T,
                       cudaStream_t stream);
// dst [rows, cols] contiguous in `to`: q8_0 -> f16 (d * q in f32, then one rounding: 2^-12 relative, or 2^-25
// absolute below f16's normal range); fp8 -> bf16 WITHOUT the scale (e4m3 values are exact in bf16).
void launch_quant_dequantize(const QuantMatrix& w, DType to, void* dst, cudaStream_t stream);
// y[t, o] = y[t, o] * s[o] (+ bias[o]): fp8's scales applied after the GEMM of the unscaled bytes.
void launch_scale_columns(F32Rows y, const QuantMatrix& w, DevWeight bias, int64_t T, cudaStream_t stream);
// out[t, :] = row ids[t] of W dequantized to f32 (exactly the GEMV's weights).
void launch_quant_embed(const QuantMatrix& w, const int32_t* ids, int64_t T, F32Rows out, cudaStream_t stream);

// The device arrays of a q8_0 or fp8 weight that CudaBackend::adopt_packed made; throws Error naming `op` for any
// other weight.
QuantMatrix quant_matrix(const Weight& w, const char* op);

// FP8 prefill (fast precision, fp8 weights; quant_fp8_act.cu, quant_fp8_gemm.cpp): x's rows quantized to e4m3 with
// one dynamic scale per row (amax / 448: a row's bytes depend on that row alone), one FP8 tensor-core GEMM with f32
// accumulation, then y scaled by the row's and the weight channel's scales and the bias added.
void launch_quantize_rows_e4m3(ConstF32Rows x, int64_t T, int64_t in, uint8_t* q, float* row_scale,
                               cudaStream_t stream);
// y[t, o] = y[t, o] * row_scale[t] * s[o] (+ bias[o]).
void launch_scale_rows_columns(F32Rows y, const float* row_scale, const QuantMatrix& w, DevWeight bias, int64_t T,
                               cudaStream_t stream);
// y [T, out] (rows ldy apart, f32) = x_q [T, in] . w_q^T over e4m3 bytes, unscaled. False (nothing enqueued) where
// cuBLASLt has no FP8 algorithm for the shape or alignment (out and in must be multiples of 16).
bool run_fp8_gemm(cudaStream_t stream, void* workspace, size_t ws_bytes, const uint8_t* w, const uint8_t* x, float* y,
                  int64_t out, int64_t T, int64_t in, int64_t ldy);
// Whether linear takes the FP8 GEMM (fast precision, fp8 weights, more than kQuantGemvMaxRows rows): the environment's
// MAMBACPP_FP8_PREFILL_GEMM=1, read at each call (an A/B switch while it is measured).
bool fp8_prefill_gemm();

// Fused decode over quantized weights (quant_fused_gemv.cu): fused_gemv.cu's prologues, multipliers and epilogues
// (FusedGemvLaunch) with q8_0 / fp8 rows dequantized in registers, on CUDA cores, for decode batches of up to
// kQuantFusedMaxRows rows (launches of up to kFusedMaxRows rows; row t of the batch is sequence t). A row's bits do
// not depend on the row count: the split of a row over warps depends on the matrix's shape and the GPU only.
// Each launch reads the matrix: 4 reads at 32 rows, still fewer bytes than the plain path's 16-bit copy and GEMM;
// larger decode batches run the plain ops.
inline constexpr int64_t kQuantFusedMaxRows = 32;
struct QuantFusedLaunch {
  FusedGemvLaunch p;  // p.T is min(B, kFusedMaxRows); p.w is unused (the kernels read `w`); seqs left to the caller
  QuantMatrix w;
};
// The launch for fused_linear over a decode batch of B rows with a q8_0 / fp8 weight; nullopt for what the kernel
// does not take (a gated prologue, other dtypes, widths that are no multiple of 16 (32 for q8_0), x or norm_w not
// 16-byte aligned, norm groups that are not whole 16-element vectors). Throws Error for shapes that do not chain.
std::optional<QuantFusedLaunch> quant_fused_launch(const FusedLinearArgs& a, int64_t B);
// Whether launch_quant_fused_gemv takes a launch of p.T rows (p.T <= kFusedMaxRows).
bool quant_fused_gemv_supported(const FusedGemvLaunch& p, const QuantMatrix& w);
// Warps that share one output row (1, 2, 4 or 8): from the matrix's shape and the multiprocessor count.
int quant_fused_warps_per_row(int64_t out, int64_t in, int sm_count);
// Runs T rows (any T >= 1) in launches of up to kFusedMaxRows rows; p describes the first min(T, 8) rows (x, y,
// conv_out and seqs advance by rows between launches).
void launch_quant_fused_gemv(const FusedGemvLaunch& p, const QuantMatrix& w, int64_t T, int sm_count,
                             cudaStream_t stream);

}  // namespace mambacpp::cuda
