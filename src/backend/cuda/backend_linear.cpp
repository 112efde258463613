// Linear ops of the CUDA backend: linear (the GEMV for a few rows, cuBLAS / cuBLASLt above, fast precision's pinned
// GEMM) and fused_linear (exact decode's fused GEMVs, fused_ops.h; fast precision's norm-and-round kernel, pinned
// cuBLASLt GEMM and conv step at every batch size: a row's bits do not depend on the batch around it).
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <climits>
#include <optional>
#include <vector>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/fused_ops.h"

namespace mambacpp {

using namespace cuda;

namespace {

// Consecutive rows of sequences of at least LtMatmul::kPrefillMinRows tokens (prompt = true), or of shorter ones,
// in row order; every row in exactly one run.
struct RowRun {
  int64_t start, len;
  bool prompt;
};
std::vector<RowRun> row_runs(const BatchLayout& b) {
  std::vector<RowRun> runs;
  for (const SeqSpan& s : b.seqs) {
    if (s.len < 1) continue;
    const bool prompt = s.len >= LtMatmul::kPrefillMinRows;
    if (!runs.empty() && runs.back().prompt == prompt && runs.back().start + runs.back().len == s.start)
      runs.back().len += s.len;
    else
      runs.push_back({s.start, s.len, prompt});
  }
  int64_t covered = 0;
  for (const RowRun& r : runs) covered += r.len;
  if (covered != b.total_tokens)
    fail("fused_linear: the batch's sequences cover ", covered, " of its ", b.total_tokens, " rows");
  return runs;
}

// The multipliers (FusedLinearArgs::x_scale, out_scales) on the pinned GEMM. x_scale is the GEMM's alpha: cuBLASLt's
// epilogue forms alpha * acc + beta * y over the f32 accumulator, y holding the broadcast bias (beta = 1), so the
// bias is added after the scale as the fused GEMVs do (x_scale * dot, then + bias). Whether that epilogue rounds the
// product before the add (as the GEMV does) or fuses the two is cuBLASLt's choice, so the bits may differ from the
// GEMV's by an ulp; fast precision's products differ from the GEMV's anyway (x rounded to 16 bits), and what it
// keeps is batch invariance: alpha is a run-time scalar that changes no plan, so every row count scales alike.
// out_scales: stored outputs are scaled in place after the GEMM (before the conv step and a prompt row's rounding),
// one small kernel per run whose scale is not 1. Added onto a residual (accumulate: beta = 1, no bias), one run is
// folded into alpha (x_scale * s, rounded once where the GEMV rounds twice); several runs there are refused (no model
// has them) and the plain ops apply them.
struct FastScales {
  float alpha = 1.0f;
  bool scale_after = false;  // out_scales applied by the scale kernel after the GEMM
};

std::optional<FastScales> fast_scales(const FusedLinearArgs& a) {
  const int64_t out = a.w.data.dim(0);
  int64_t prev = 0;
  for (const auto& [end, scale] : a.out_scales) {
    if (end <= prev || end > out)
      fail("fused_linear: out_scales run ends must ascend within (0, ", out, "], found ", end, " after ", prev);
    prev = end;
  }
  if (!a.out_scales.empty() && prev != out)
    fail("fused_linear: the last out_scales run ends at ", prev, ", expected ", out);
  FastScales f;
  f.alpha = a.x_scale;
  if (a.out_scales.empty()) return f;
  if (a.accumulate) {
    if (a.out_scales.size() > 1) return std::nullopt;
    f.alpha = a.x_scale * a.out_scales[0].second;
    return f;
  }
  f.scale_after = true;
  return f;
}

void scale_runs(const std::vector<std::pair<int64_t, float>>& runs, F32Rows y, int64_t T, cudaStream_t stream) {
  int64_t begin = 0;
  for (const auto& [end, scale] : runs) {
    if (scale != 1.0f) launch_scale(F32Rows{y.data + begin, y.stride}, scale, T, end - begin, stream);
    begin = end;
  }
}

// fast_fused_supported (fused_linear.cpp) refuses multipliers; those fast_scales takes are applied here, so it is
// asked about the rest of the arguments.
bool fast_supported(const FusedLinearArgs& a, int64_t B) {
  if (a.x_scale == 1.0f && a.out_scales.empty()) return fast_fused_supported(a, B);
  FusedLinearArgs rest = a;
  rest.x_scale = 1.0f;
  rest.out_scales.clear();
  return fast_fused_supported(rest, B) && fast_scales(a).has_value();  // the first checks the shapes
}

}  // namespace

// T <= kGemvMaxRows: the GEMV kernel (exact products of the stored weights, f32 sums).
// Larger T, f32 weights: cublasGemmEx in plain f32 (CUBLAS_COMPUTE_32F with the default math mode: no TF32), so
// results match an f32 reference to ~1e-6 relative.
// Larger T, bf16/f16 weights: the tensor cores need both operands in the weight's dtype. Rounding x to bf16 would
// cost 2^-9 relative per activation (~1e-3 on every projection, compounding over layers, and making prefill
// differ from the f32-activation GEMV decode). Instead x = hi + lo (+ r, |r| <= 2^-17 |x| for bf16, 2^-22 for f16)
// with hi = round(x), lo = round(x - hi), and y = W.hi + W.lo: two GEMMs (cuBLASLt, gemm_lt.h; the second
// accumulates with beta = 1) with f32 accumulation whose products are
// exact, so the op is as accurate as an f32 GEMM over the stored weights (~1e-5 relative) at twice the tensor-core
// work, still far cheaper than an f32 GEMM. What remains between bf16-weight logits and the fp32 CPU path is the
// rounding of the weights themselves (2^-9 relative each), which stays within ~1e-2 of the logits' range.
// f16 caveat: |x| > 65504 would overflow hi; projection inputs are normalised or gated activations, far below it.
void CudaBackend::linear(const TensorView& x, const Weight& weight_in, const TensorView& bias, TensorView y) {
  if (!weight_in.dense()) return linear_quant(x, weight_in, bias, y);  // q8_0 / fp8: quant_linear.cpp
  const TensorView& w = weight_in.dense_view("linear");
  check_f32_2d(x, "linear: x");
  check_f32_2d(y, "linear: y");
  need(w.ndim == 2 && is_float_dtype(w.dtype) && w.contiguous(),
       "linear: w must be a contiguous 2-D float "
       "tensor, found ",
       w.shape_string(), " ", dtype_name(w.dtype));
  const int64_t T = x.dim(0), in = x.dim(1), out = w.dim(0);
  need(w.dim(1) == in, "linear: w ", w.shape_string(), " does not take x ", x.shape_string());
  need(y.dim(0) == T && y.dim(1) == out, "linear: y ", y.shape_string(), ", expected [", T, ", ", out, "]");
  need(bias.empty() || bias.numel() == out, "linear: bias has ", bias.numel(), " elements, expected ", out);
  if (T == 0 || out == 0) return;
  const DevWeight b = bias.empty() ? DevWeight{} : weight(bias);
  if (fast_ && w.dtype != DType::F32 && in > 0) {
    linear_fast(x, w, b, y);
    return;
  }
  if (in == 0 || T <= kGemvMaxRows) {
    launch_gemv(crows(x), weight(w), b, rows(y), T, in, out, stream());
    return;
  }
  need(T <= INT_MAX && in <= INT_MAX && out <= INT_MAX && x.stride0() <= INT_MAX && y.stride0() <= INT_MAX,
       "linear: dimensions beyond cuBLAS's 32-bit limits: x ", x.shape_string(), ", w ", w.shape_string());
  const int m = static_cast<int>(out), n = static_cast<int>(T), k = static_cast<int>(in);
  const float one = 1.0f, zero = 0.0f;
  if (b.data) launch_broadcast_bias(b, rows(y), T, out, stream());
  const float* beta0 = b.data ? &one : &zero;
  // Column-major view: y^T [out, T] = w [in, out]^T . x^T [in, T].
  if (w.dtype == DType::F32) {
    MAMBACPP_CUBLAS_CHECK(cublasGemmEx(cublas(), CUBLAS_OP_T, CUBLAS_OP_N, m, n, k, &one, w.data, CUDA_R_32F, k, x.data,
                                       CUDA_R_32F, static_cast<int>(x.stride0()), beta0, y.data, CUDA_R_32F,
                                       static_cast<int>(y.stride0()), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    return;
  }
  const size_t half_bytes = static_cast<size_t>(T * in) * 2;
  char* hi = static_cast<char*>(grow(Slot::kSplit, 2 * half_bytes));
  char* lo = hi + half_bytes;
  launch_split_hi_lo(crows(x), T, in, w.dtype, hi, lo, stream());
  // Two cuBLASLt matmuls (gemm_lt.h), the second accumulating onto the first (dropping it, i.e. rounding the
  // activations to 16 bits, is fast precision's trade: faster prefill, worse logits; linear_fast).
  const cudaDataType_t ab = w.dtype == DType::BF16 ? CUDA_R_16BF : CUDA_R_16F;
  cublas();  // the shared workspace exists
  lt_.run(stream(), cublas_workspace_, kCublasWorkspaceBytes, ab, w.data, hi, y.ptr<float>(), m, n, k, y.stride0(),
          *beta0);
  lt_.run(stream(), cublas_workspace_, kCublasWorkspaceBytes, ab, w.data, lo, y.ptr<float>(), m, n, k, y.stride0(),
          1.0f);
}

// Fast precision, 16-bit weights: x rounded once to the weight dtype (2^-9 relative for bf16, as mamba_ssm and
// vLLM feed their GEMMs), one tensor-core GEMM with f32 accumulation, at every T (decode's single rows too), on the
// pinned cuBLASLt plan (gemm_lt.h): a row's result is the same bits whatever the batch around it.
// x16: where the rounded rows go (null: the linear op's own scratch).
void CudaBackend::linear_fast(const TensorView& x, const TensorView& w, const DevWeight& b, TensorView y, void* x16) {
  const int64_t T = x.dim(0), in = x.dim(1), out = w.dim(0);
  need(T <= INT_MAX && in <= INT_MAX && out <= INT_MAX && y.stride0() <= INT_MAX,
       "linear: dimensions beyond cuBLAS's 32-bit limits: x ", x.shape_string(), ", w ", w.shape_string());
  const size_t half_bytes = static_cast<size_t>(T * in) * 2;
  char* hi = static_cast<char*>(x16 ? x16 : grow(Slot::kSplit, half_bytes));
  launch_split_hi_lo(crows(x), T, in, w.dtype, hi, nullptr, stream());
  if (b.data) launch_broadcast_bias(b, rows(y), T, out, stream());
  cublas();  // the shared workspace exists
  const cudaDataType_t ab = w.dtype == DType::BF16 ? CUDA_R_16BF : CUDA_R_16F;
  lt_.run(stream(), cublas_workspace_, kCublasWorkspaceBytes, ab, w.data, hi, y.ptr<float>(), static_cast<int>(out),
          static_cast<int>(T), static_cast<int>(in), y.stride0(), b.data ? 1.0f : 0.0f, LtMatmul::Pin::Decode);
}

// Fused decode (fused_linear.cpp): batches of up to kFusedMaxRows sequences, sequence i in row i.
// Fast precision with 16-bit weights: every decode batch size on the same kernels (fused_ops.h, kFastMaxRows);
// never the fused GEMVs, whose products differ from the GEMM's.
// Without a conv epilogue the fast path is row by row and takes prefill pieces too (the prefill recipe's norms and
// residual add folded into the GEMMs).
bool CudaBackend::supports_fused_linear(const FusedLinearArgs& a, const BatchLayout& batch) const {
  if (!a.w.dense()) return false;
  if (fast_fused(a, batch)) return fast_rows(a, batch) && fast_supported(a, batch.total_tokens);
  return decode_rows(batch, kFusedMaxRows) && fused_gemv_launch(a, batch.total_tokens).has_value();
}

bool CudaBackend::fast_rows(const FusedLinearArgs& a, const BatchLayout& batch) const {
  return a.conv_w.empty() ? batch.total_tokens >= 1 : step_rows(batch, kFastMaxRows);
}

// Whether fused_linear takes the fast kernels: fast precision, 16-bit weights, and (unless batch invariance is
// required) more rows than the fused GEMVs take.
bool CudaBackend::fast_fused(const FusedLinearArgs& a, const BatchLayout& batch) const {
  if (!fast_ || a.w.data.dtype == DType::F32) return false;
  return batch_invariant_ || !decode_rows(batch, kFusedMaxRows) || !fused_gemv_launch(a, batch.total_tokens);
}

void CudaBackend::fused_linear(const FusedLinearArgs& a, const BatchLayout& batch) {
  const int64_t B = batch.total_tokens;
  if (fast_fused(a, batch)) {
    need(fast_rows(a, batch) && fast_supported(a, B),
         "fused_linear: these arguments have no fast kernels (ask supports_fused_linear first)");
    fused_linear_fast(a, batch);
    return;
  }
  need(decode_rows(batch, kFusedMaxRows), "fused_linear: needs a decode batch of 1..", kFusedMaxRows,
       " one-token sequences in row order");
  std::optional<FusedGemvLaunch> p = fused_gemv_launch(a, B);
  need(p.has_value(), "fused_linear: these arguments have no fused kernel (ask supports_fused_linear first)");
  if (p->conv_channels > 0) p->seqs = device_seqs(batch, a.conv_state.dim(0), B, "fused_linear");
  launch_fused_gemv(*p, sm_count_, stream());
}

// Rows of x normed (norm_w set) and rounded to the weight dtype by one kernel, the pinned GEMM into y (added to it
// when accumulating: beta = 1), then the conv step over the conv columns of y: the same kernels at every batch size
// (docs/benchmarks.md, decisions: one fused kernel for every decode batch size lost from 32 rows on).
void CudaBackend::fused_linear_fast(const FusedLinearArgs& a, const BatchLayout& batch) {
  const int64_t B = batch.total_tokens, in = a.x.dim(1), out = a.w.data.dim(0);
  need(in <= INT_MAX && out <= INT_MAX && a.y.stride0() <= INT_MAX, "fused_linear: dimensions beyond cuBLAS's ",
       "32-bit limits: x ", a.x.shape_string(), ", w ", a.w.data.shape_string());
  // Decode batches round into the scratch graphs hold; prefill pieces into the linear op's own.
  void* x16 = B <= kFastMaxRows ? decode_scratch(Slot::kFastX16, B, in, 2)
                                : grow(Slot::kSplit, static_cast<size_t>(B * in) * 2);
  const ConstF32Rows gate = a.gate.empty() || a.gate.dtype == DType::BF16 ? ConstF32Rows{} : crows(a.gate);
  const DevWeight norm_w = a.norm_w.empty() ? DevWeight{} : weight(a.norm_w);
  const int64_t group = a.norm_group > 0 ? a.norm_group : in;
  if (a.x.dtype == DType::BF16 && a.gate.dtype == DType::BF16 && !a.gate.empty())
    launch_rmsnorm_round_bf16_xz(a.x.ptr<uint16_t>(), a.x.stride0(), a.gate.ptr<uint16_t>(), a.gate.stride0(), norm_w,
                                 group, a.eps, a.w.data.dtype, x16, B, in, stream());
  else if (a.x.dtype == DType::BF16)
    launch_rmsnorm_round_bf16_x(a.x.ptr<uint16_t>(), a.x.stride0(), gate, norm_w, group, a.eps, a.w.data.dtype, x16, B,
                                in, stream());
  else
    launch_rmsnorm_round(crows(a.x), gate, norm_w, group, a.eps, a.w.data.dtype, x16, B, in, stream());
  if (!a.bias.empty()) launch_broadcast_bias(weight(a.bias), rows(a.y), B, out, stream());
  cublas();  // the shared workspace exists
  const cudaDataType_t ab = a.w.data.dtype == DType::BF16 ? CUDA_R_16BF : CUDA_R_16F;
  const float beta = a.accumulate || !a.bias.empty() ? 1.0f : 0.0f;
  // Rows of long prompts on the prefill plan, those of short and one-token sequences on the decode plan (gemm_lt.h):
  // each row gets the bits it gets alone, whatever the forward mixes. Runs of rows of one kind, one GEMM each.
  // A bf16 y (Mamba2Plan::proj_dtype): prompt rows only, the prefill plan with a bf16 output (gemm_lt.h); an f32 y with
  // round_prompt_rows: the prompt rows rounded after it, the same bits.
  const bool y16 = a.y.dtype == DType::BF16;
  const bool round_prompts = a.round_prompt_rows;
  const FastScales sc = *fast_scales(a);  // fast_supported held
  for (const RowRun& r : row_runs(batch)) {
    const void* x_rows = static_cast<const char*>(x16) + static_cast<size_t>(r.start * in) * 2;
    const int rows_n = static_cast<int>(r.len);
    if (y16) {
      need(r.prompt && round_prompts && beta == 0.0f && a.y.stride0() == out,
           "fused_linear: a bf16 y is for Mamba-2's in_proj on prompts of ", LtMatmul::kPrefillMinRows,
           " tokens and more (Mamba2Plan::proj_dtype), found ", a.y.shape_string(), r.prompt ? "" : " with short rows");
      uint16_t* y_rows = a.y.ptr<uint16_t>() + r.start * out;
      // With multipliers, the f32 rows are scaled before they are rounded (the bf16-output plan has alpha = 1).
      const bool plain = sc.alpha == 1.0f && !sc.scale_after;
      if (plain && lt_.run_prefill_bf16(stream(), cublas_workspace_, kCublasWorkspaceBytes, ab, a.w.data.data, x_rows,
                                        y_rows, static_cast<int>(out), rows_n, static_cast<int>(in), out))
        continue;
      float* f = static_cast<float*>(grow(Slot::kProj32, static_cast<size_t>(r.len * out) * 4));
      lt_.run(stream(), cublas_workspace_, kCublasWorkspaceBytes, ab, a.w.data.data, x_rows, f, static_cast<int>(out),
              rows_n, static_cast<int>(in), out, 0.0f, LtMatmul::Pin::Prefill, sc.alpha);
      if (sc.scale_after) scale_runs(a.out_scales, F32Rows{f, out}, r.len, stream());
      launch_convert(f, DType::F32, y_rows, DType::BF16, r.len * out, stream());
      continue;
    }
    float* y_rows = a.y.ptr<float>() + r.start * a.y.stride0();
    lt_.run(stream(), cublas_workspace_, kCublasWorkspaceBytes, ab, a.w.data.data, x_rows, y_rows,
            static_cast<int>(out), rows_n, static_cast<int>(in), a.y.stride0(), beta,
            r.prompt ? LtMatmul::Pin::Prefill : LtMatmul::Pin::Decode, sc.alpha);
    if (sc.scale_after) scale_runs(a.out_scales, F32Rows{y_rows, a.y.stride0()}, r.len, stream());
    if (r.prompt && round_prompts) launch_round_bf16(F32Rows{y_rows, a.y.stride0()}, r.len, out, stream());
  }
  if (a.conv_w.empty()) return;
  // The GEMM wrote the conv columns of y too (y holds all `out` columns); the step reads them from there.
  const int64_t ch = a.conv_w.dim(0);
  Conv1dLaunch p;
  p.x = crows(a.y.cols(a.conv_begin, ch));
  p.w = weight(a.conv_w);
  p.bias = a.conv_bias.empty() ? DevWeight{} : weight(a.conv_bias);
  p.state = a.conv_state.data;
  p.state_bf16 = a.conv_state.dtype == DType::BF16;
  p.out = rows(a.conv_out);
  p.T = B;
  p.C = ch;
  p.K = a.conv_w.dim(2);
  p.seqs = device_seqs(batch, a.conv_state.dim(0), B, "fused_linear");
  p.token_seq = token_seq_;
  p.n_seqs = n_prepared_seqs_;
  p.all_single = true;  // decode rows or step pieces (fast_rows): the conv step kernel
  launch_conv1d_silu(p, stream());
}

}  // namespace mambacpp
