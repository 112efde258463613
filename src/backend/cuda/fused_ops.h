// Launchers of the fused decode kernels (fused_gemv.cu, fused_gemv_mma.cu), callable from plain C++, and the
// translation of Backend::fused_linear's arguments into them (fused_linear.cpp). Decode batches put sequence t in row
// t with exactly one token, so a row's slot is seqs[t].slot.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <optional>

#include "backend/backend.h"
#include "backend/cuda/cuda_ops.h"

namespace mambacpp::cuda {

// Decode batches of up to kFusedMaxRows sequences take the fused kernels (1-2 rows on CUDA cores, 3-8 on the
// tensor cores with 16-bit weights). Larger batches take the plain path: the tensor-core GEMV takes 32 rows
// (NTILES = 4) but each warp re-reads the activations from L2, which made it slower than cuBLASLt at batch 32; it
// needs them staged in shared memory first.
inline constexpr int64_t kFusedMaxRows = 8;
inline constexpr int64_t kFusedMaxNormGroups = 16;  // group-wise norm prologue: scales kept in shared memory
inline constexpr int kFusedMaxConvTaps = 4;          // conv epilogue: d_conv (4 in every released model)
inline constexpr int kFusedMaxScaleRuns = 8;         // runs of FusedLinearArgs::out_scales (Falcon-H1 uses 5)
// Fast precision (mambacpp/precision.h) runs fused_linear for decode batches of every size up to the model's
// largest decode batch as norm-and-round kernel -> one pinned tensor-core GEMM (gemm_lt.h) -> conv step kernel,
// the same kernels at every batch size (batch invariance).
inline constexpr int64_t kFastMaxRows = 256;
// Whether the fast path takes these arguments for B rows (any B: the caller allows a conv epilogue on decode batches
// of up to kFastMaxRows only): 16-bit weights, f32 rows, no bias on an accumulating output, a conv of at most
// kFusedMaxConvTaps taps. Shapes that do not chain throw (as fused_gemv_launch).
bool fast_fused_supported(const FusedLinearArgs& a, int64_t B);

// y = x . w^T (+ bias) for T <= kFusedMaxRows rows (see fused_gemv_supported), with optional pieces folded in:
//   - prologue: an RMSNorm of x (norm_w set): each run of `norm_group` consecutive input features is scaled by
//     rsqrt(mean(x^2 over the run) + eps) and by norm_w. With one group (norm_group == in) the scale is applied
//     after the dot product, from a sum of squares gathered in the same pass over x; with several groups the block
//     computes the scales first.
//   - multipliers: the dot product times x_scale, plus the bias, times the scale of the output's run;
//   - epilogue: outputs [conv_begin, conv_begin + conv_channels) feed a one-token causal conv1d + SiLU (the
//     result goes to conv_out and the slot's conv state shifts by one); other outputs go to y, or are added to it
//     (accumulate: the residual add).
struct FusedGemvLaunch {
  ConstF32Rows x;      // [T, in]
  DevWeight w;         // [out, in] contiguous
  DevWeight bias;      // [out] or absent
  int64_t T = 0, in = 0, out = 0;
  DevWeight norm_w;    // [in] f32, or absent: no norm
  int64_t norm_group = 0;
  float eps = 0.0f;
  F32Rows y;           // [T, out] (columns of the conv range are not written)
  bool accumulate = false;
  int64_t conv_begin = 0, conv_channels = 0;  // conv_channels 0: no conv epilogue
  DevWeight conv_w;    // [conv_channels, K] f32
  DevWeight conv_bias; // [conv_channels] f32 or absent
  int64_t K = 0;
  void* conv_state = nullptr;  // [n_slots, conv_channels, K - 1]
  bool state_bf16 = false;
  F32Rows conv_out;    // [T, conv_channels]
  const SeqSpan* seqs = nullptr;  // device; row t is sequence t
  // Multipliers (FusedLinearArgs::x_scale, out_scales): output o is (x_scale * dot + bias) * scale_of[r] for the
  // first run r with o < scale_end[r]; n_scale_runs 0: times 1.
  float x_scale = 1.0f;
  int n_scale_runs = 0;
  int64_t scale_end[kFusedMaxScaleRuns] = {};
  float scale_of[kFusedMaxScaleRuns] = {};
};
// Whether launch_fused_gemv takes these shapes, dtypes and alignments; and whether it uses the tensor cores.
bool fused_gemv_supported(const FusedGemvLaunch& p);
bool uses_tensor_cores(const FusedGemvLaunch& p);
void launch_fused_gemv(const FusedGemvLaunch& p, int sm_count, cudaStream_t stream);
// The tensor-core kernel behind launch_fused_gemv when uses_tensor_cores(p) (fused_gemv_mma.cu).
void launch_fused_gemv_mma(const FusedGemvLaunch& p, int sm_count, cudaStream_t stream);

// The launch for fused_linear over B rows; nullopt when these kernels do not take the arguments (see
// fused_gemv_supported). Throws Error for shapes that do not chain. `seqs` is left for the caller to fill.
std::optional<FusedGemvLaunch> fused_gemv_launch(const FusedLinearArgs& a, int64_t B);

}  // namespace mambacpp::cuda
