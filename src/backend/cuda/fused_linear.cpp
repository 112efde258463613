// Backend::fused_linear's arguments (tensors and plain parameters, backend.h) as the launch parameters of the fused
// GEMV kernels (fused_gemv.cu, fused_gemv_mma.cu). Shapes that disagree are the caller's bug and throw; arguments
// the kernels do not take (dtypes, too many rows or norm groups, a long conv) give nullopt, and the model's layer
// recipe then runs the plain ops.
#include <optional>

#include "backend/cuda/fused_ops.h"
#include "mambacpp/error.h"

namespace mambacpp::cuda {

namespace {

template <class... Parts>
void need(bool ok, const Parts&... parts) {
  if (!ok) fail(parts...);
}
bool is_float_dtype(DType t) { return t == DType::F32 || t == DType::F16 || t == DType::BF16; }
ConstF32Rows crows(const TensorView& v) { return {v.ptr<const float>(), v.stride0()}; }
F32Rows rows(const TensorView& v) { return {v.ptr<float>(), v.stride0()}; }
DevWeight weight(const TensorView& v) { return v.empty() ? DevWeight{} : DevWeight{v.data, v.dtype}; }
bool f32_rows(const TensorView& v, int64_t B) { return v.dtype == DType::F32 && v.ndim == 2 && v.dim(0) >= B; }
bool f32_vector(const TensorView& v) { return v.dtype == DType::F32 && v.contiguous(); }

}  // namespace

namespace {

// FusedLinearArgs::x_scale and out_scales into the launch; false when there are more runs than it holds.
bool set_multipliers(const FusedLinearArgs& a, int64_t out, FusedGemvLaunch& p) {
  const char* op = "fused_linear";
  int64_t prev = 0;
  for (const auto& [end, scale] : a.out_scales) {
    need(end > prev && end <= out, op, ": out_scales run ends must ascend within (0, ", out, "], found ", end,
         " after ", prev);
    prev = end;
  }
  need(a.out_scales.empty() || prev == out, op, ": the last out_scales run ends at ", prev, ", expected ", out);
  if (a.out_scales.size() > static_cast<size_t>(kFusedMaxScaleRuns)) return false;
  p.x_scale = a.x_scale;
  p.n_scale_runs = static_cast<int>(a.out_scales.size());
  for (int r = 0; r < p.n_scale_runs; ++r) {
    p.scale_end[r] = a.out_scales[static_cast<size_t>(r)].first;
    p.scale_of[r] = a.out_scales[static_cast<size_t>(r)].second;
  }
  return true;
}

// The launch parameters for up to max_rows rows; nullopt for what no fused kernel takes.
std::optional<FusedGemvLaunch> build_launch(const FusedLinearArgs& a, int64_t B, int64_t max_rows) {
  const char* op = "fused_linear";
  need(a.x.ndim == 2 && a.w.data.ndim == 2 && a.y.ndim == 2, op, ": x, w and y must be 2-D, found ", a.x.shape_string(),
       ", ", a.w.data.shape_string(), ", ", a.y.shape_string());
  const int64_t in = a.x.dim(1), out = a.w.data.dim(0);
  need(a.w.data.dim(1) == in && a.y.dim(1) == out, op, ": x ", a.x.shape_string(), ", w ", a.w.data.shape_string(), ", y ",
       a.y.shape_string(), " do not chain");
  need(a.bias.empty() || a.bias.numel() == out, op, ": bias has ", a.bias.numel(), " elements, expected ", out);
  need(a.norm_w.empty() || a.norm_w.numel() == in, op, ": norm_w has ", a.norm_w.numel(), " elements, expected ", in);
  if (B < 1 || B > max_rows || !f32_rows(a.x, B) || !f32_rows(a.y, B) || !a.w.data.contiguous()) return std::nullopt;
  if (!a.gate.empty()) return std::nullopt;  // the fused GEMVs have no gated prologue
  if (!is_float_dtype(a.w.data.dtype) || (!a.bias.empty() && !is_float_dtype(a.bias.dtype))) return std::nullopt;
  if (!a.norm_w.empty() && !f32_vector(a.norm_w)) return std::nullopt;

  FusedGemvLaunch p;
  p.x = crows(a.x);
  p.w = weight(a.w.data);
  p.bias = weight(a.bias);
  p.T = B;
  p.in = in;
  p.out = out;
  if (!a.norm_w.empty()) {
    p.norm_w = weight(a.norm_w);
    p.norm_group = a.norm_group > 0 ? a.norm_group : in;
    p.eps = a.eps;
  }
  p.y = rows(a.y);
  p.accumulate = a.accumulate;
  if (!set_multipliers(a, out, p)) return std::nullopt;
  if (!a.conv_w.empty()) {
    need(a.conv_w.ndim == 3 && a.conv_w.dim(1) == 1, op, ": conv_w must be [channels, 1, K], found ",
         a.conv_w.shape_string());
    const int64_t ch = a.conv_w.dim(0), K = a.conv_w.dim(2);
    need(a.conv_begin >= 0 && a.conv_begin + ch <= out, op, ": conv outputs [", a.conv_begin, ", ",
         a.conv_begin + ch, ") outside the ", out, " outputs");
    need(a.conv_bias.empty() || a.conv_bias.numel() == ch, op, ": conv_bias has ", a.conv_bias.numel(),
         " elements, expected ", ch);
    need(a.conv_state.ndim == 3 && a.conv_state.dim(1) == ch && a.conv_state.dim(2) == K - 1 &&
             a.conv_state.contiguous(),
         op, ": conv_state must be a contiguous [n_slots, ", ch, ", ", K - 1, "], found ",
         a.conv_state.shape_string());
    need(a.conv_out.ndim == 2 && a.conv_out.dim(1) == ch, op, ": conv_out must be [B, ", ch, "], found ",
         a.conv_out.shape_string());
    if (K < 1 || K > kFusedMaxConvTaps || !a.conv_w.contiguous() || !is_float_dtype(a.conv_w.dtype) ||
        (!a.conv_bias.empty() && !is_float_dtype(a.conv_bias.dtype)))
      return std::nullopt;
    if ((a.conv_state.dtype != DType::F32 && a.conv_state.dtype != DType::BF16) || !f32_rows(a.conv_out, B))
      return std::nullopt;
    p.conv_begin = a.conv_begin;
    p.conv_channels = ch;
    p.conv_w = weight(a.conv_w);
    p.conv_bias = weight(a.conv_bias);
    p.K = K;
    p.conv_state = a.conv_state.data;
    p.state_bf16 = a.conv_state.dtype == DType::BF16;
    p.conv_out = rows(a.conv_out);
  }
  return p;
}

}  // namespace

std::optional<FusedGemvLaunch> fused_gemv_launch(const FusedLinearArgs& a, int64_t B) {
  std::optional<FusedGemvLaunch> p = build_launch(a, B, kFusedMaxRows);
  if (p && !fused_gemv_supported(*p)) return std::nullopt;
  return p;
}

bool fast_fused_supported(const FusedLinearArgs& a, int64_t B) {
  const char* op = "fused_linear";
  need(a.x.ndim == 2 && a.w.data.ndim == 2 && a.y.ndim == 2, op, ": x, w and y must be 2-D, found ", a.x.shape_string(),
       ", ", a.w.data.shape_string(), ", ", a.y.shape_string());
  const int64_t in = a.x.dim(1), out = a.w.data.dim(0);
  need(a.w.data.dim(1) == in && a.y.dim(1) == out, op, ": x ", a.x.shape_string(), ", w ", a.w.data.shape_string(), ", y ",
       a.y.shape_string(), " do not chain");
  // Rows past a decode batch's kFastMaxRows: prefill pieces, which take no conv epilogue (checked by the caller).
  // x in bf16: Mamba-2's y from the fast SSD (Mamba2Plan::y_dtype), into the gated norm of out_proj.
  const bool x_ok = f32_rows(a.x, B) || (a.x.dtype == DType::BF16 && a.x.ndim == 2 && a.x.dim(0) >= B &&
                                         a.conv_w.empty() && !a.norm_w.empty());
  // y in bf16: Mamba-2's in_proj on prompts (Mamba2Plan::proj_dtype), its gate likewise into out_proj's norm.
  const bool y_ok = f32_rows(a.y, B) || (a.y.dtype == DType::BF16 && a.y.ndim == 2 && a.y.dim(0) >= B &&
                                         a.y.contiguous() && a.bias.empty() && !a.accumulate && a.conv_w.empty());
  const bool gate_ok = f32_rows(a.gate, B) || (a.gate.dtype == DType::BF16 && a.x.dtype == DType::BF16 &&
                                               a.gate.ndim == 2 && a.gate.dim(0) >= B);
  if (B < 1 || in < 1 || out < 1 || !x_ok || !y_ok || !a.w.data.contiguous()) return false;
  // The pinned GEMM has no per-output scales: the plain ops apply the multipliers.
  if (a.x_scale != 1.0f || !a.out_scales.empty()) return false;
  if (!a.gate.empty() && (!gate_ok || a.gate.dim(1) != in)) return false;
  if (a.w.data.dtype != DType::BF16 && a.w.data.dtype != DType::F16) return false;
  if (!a.bias.empty() && (a.accumulate || a.bias.numel() != out || !is_float_dtype(a.bias.dtype))) return false;
  if (!a.norm_w.empty()) {
    const int64_t g = a.norm_group > 0 ? a.norm_group : in;
    if (!f32_vector(a.norm_w) || a.norm_w.numel() != in || in % g != 0) return false;
  }
  if (!a.conv_w.empty()) {
    if (a.accumulate || a.conv_w.ndim != 3 || a.conv_w.dim(1) != 1 || !a.conv_w.contiguous()) return false;
    const int64_t ch = a.conv_w.dim(0), K = a.conv_w.dim(2);
    need(a.conv_begin >= 0 && a.conv_begin + ch <= out, op, ": conv outputs [", a.conv_begin, ", ",
         a.conv_begin + ch, ") outside the ", out, " outputs");
    if (K < 1 || K > kFusedMaxConvTaps || !is_float_dtype(a.conv_w.dtype)) return false;
    if (!a.conv_bias.empty() && (a.conv_bias.numel() != ch || !is_float_dtype(a.conv_bias.dtype))) return false;
    if (a.conv_state.ndim != 3 || a.conv_state.dim(1) != ch || a.conv_state.dim(2) != K - 1 ||
        !a.conv_state.contiguous() || (a.conv_state.dtype != DType::F32 && a.conv_state.dtype != DType::BF16))
      return false;
    if (a.conv_out.ndim != 2 || a.conv_out.dim(1) != ch || !f32_rows(a.conv_out, B)) return false;
  }
  return true;
}

}  // namespace mambacpp::cuda
