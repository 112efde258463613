// Launchers of the quantized-weight kernels (quant_gemv.cu, quant_convert.cu), callable from plain C++.
//
// Device layouts, made once at upload (CudaBackend::adopt_packed, quant_linear.cpp):
//   q8_0     : the int8 quants of every row, row-major [rows, cols] (row stride cols, a multiple of 32, so every row
//              starts 16-byte aligned), then the f16 block scales [rows, cols / 32]. Same byte count as ggml's
//              34-byte blocks; splitting them lets a lane read 16 quants with one 16-byte load.
//   fp8_e4m3 : the e4m3 bytes [rows, cols] as stored, beside f32 scales: [rows] (per output channel) or [1].
//   q4_k     : ggml's 144-byte blocks as stored, [rows, cols / 256] (a multiple of 16 bytes, so every block and its
//              16-byte header d, dmin, scales[12] are 16-byte aligned).
//   q5_k     : ggml's 176-byte blocks as stored (d, dmin, scales[12], qh[32], qs[128]: 16-byte aligned likewise).
//   q6_k     : ggml's 210-byte blocks split into four arrays (210 is no multiple of 16): ql [rows, cols / 2],
//              qh [rows, cols / 4], scales i8 [rows, cols / 16], d f16 [rows, cols / 256]. Same byte count.
// Element (o, i) is  d[o, i / 32] * q[o, i]  (q8_0) or  s[o] * e4m3(b[o, i])  (fp8; s[0] for a per-tensor scale);
// q4_k, q5_k and q6_k as ggml_dequantize_row computes them (core/ggml_blocks.h), bit for bit.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "backend/cuda/cuda_ops.h"
#include "core/weight.h"

namespace mambacpp::cuda {

struct QuantMatrix {
  WeightFormat format = WeightFormat::Q8_0;  // Q8_0, FP8_E4M3, Q4_K, Q5_K or Q6_K
  const uint8_t* q = nullptr;                // [rows, cols] bytes (int8 quants or e4m3); q4_k / q6_k: the layout above
  const void* scale = nullptr;               // q8_0: f16 [rows, cols / 32]; fp8: f32 [rows] or [1]
  bool per_tensor = false;                   // fp8: one scale for the whole matrix
  int64_t rows = 0, cols = 0;
};

// Rows up to this go through the GEMV (dequantizing in registers); more rows: a dequantized 16-bit copy and the
// tensor-core GEMMs. Within the GEMV a row's result does not depend on the row count (chunks of 8 rows, each
// row's sum in the same fixed order).
inline constexpr int64_t kQuantGemvMaxRows = 16;

inline bool is_kquant(WeightFormat f) {
  return f == WeightFormat::Q4_K || f == WeightFormat::Q5_K || f == WeightFormat::Q6_K;
}

// y[t, o] = sum_i x[t, i] * W[o, i] (+ bias[o]) for any T (chunks of 8 rows); f32 sums of exact products.
void launch_quant_gemv(ConstF32Rows x, const QuantMatrix& w, DevWeight bias, F32Rows y, int64_t T,
                       cudaStream_t stream);
// The same for q4_k / q5_k / q6_k (kquant_gemv.cu): each weight dequantized in f32 exactly as ggml does, times x
// (fmaf).
void launch_kquant_gemv(ConstF32Rows x, const QuantMatrix& w, DevWeight bias, F32Rows y, int64_t T,
                        cudaStream_t stream);
// dst [rows, cols] contiguous in `to`: q4_k / q5_k / q6_k -> f16 (ggml's f32 value, then one rounding, as q8_0);
// q8_0 -> f16 (d * q in f32, then one rounding: 2^-12 relative, or 2^-25
// absolute below f16's normal range); fp8 -> bf16 WITHOUT the scale (e4m3 values are exact in bf16).
void launch_quant_dequantize(const QuantMatrix& w, DType to, void* dst, cudaStream_t stream);
// y[t, o] = y[t, o] * s[o] (+ bias[o]): fp8's scales applied after the GEMM of the unscaled bytes.
void launch_scale_columns(F32Rows y, const QuantMatrix& w, DevWeight bias, int64_t T, cudaStream_t stream);
// out[t, :] = row ids[t] of W dequantized to f32 (exactly the GEMV's weights).
void launch_quant_embed(const QuantMatrix& w, const int32_t* ids, int64_t T, F32Rows out, cudaStream_t stream);

}  // namespace mambacpp::cuda
