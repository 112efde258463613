// A decode block in three (Mamba-2) or four (Mamba-1) kernels, for batches of up to kFusedMaxRows sequences of one
// token each (fused_gemv_supported says which shapes and dtypes):
//   Mamba-2: 1. in_proj GEMV with the block's RMSNorm folded in and the conv1d + SiLU on the xBC outputs;
//            2. the SSD state update, D skip and silu(z) gate (launch_mamba2_step with z);
//            3. out_proj GEMV with the group-wise gated norm folded in, added to the residual.
//   Mamba-1: 1. as above (conv on the x half); 2. x_proj GEMV; 3. the scan step with dt_proj folded in;
//            4. out_proj GEMV added to the residual.
// The plain path (src/model/mixers.cpp) computes the same values op by op: the two agree to f32 rounding (the norm
// scale is applied after the dot product here, before it there), which tests/gpu/decode_block_test.cpp checks.
#include "backend/cuda/fused_ops.h"
#include "mambacpp/config.h"
#include "model/weights.h"

namespace mambacpp::cuda {

namespace {

ConstF32Rows crows(const TensorView& v, int64_t col = 0) { return {v.ptr<const float>() + col, v.stride0()}; }
F32Rows rows(const TensorView& v, int64_t col = 0) { return {v.ptr<float>() + col, v.stride0()}; }
DevWeight weight(const TensorView& v) { return v.empty() ? DevWeight{} : DevWeight{v.data, v.dtype}; }
bool is_f32_vector(const TensorView& v) { return v.dtype == DType::F32 && v.contiguous(); }

}  // namespace

bool run_decode_block(const DecodeBlockArgs& a, const SeqSpan* device_seqs, int64_t B, int sm_count,
                      cudaStream_t stream) {
  const ModelConfig& c = *a.config;
  const LayerWeights& w = *a.weights;
  const bool mamba2 = c.arch == Arch::Mamba2;
  if (B < 1 || B > kFusedMaxRows || c.d_model < 1 || c.d_inner < 1) return false;
  if (!is_f32_vector(w.norm) || (mamba2 && !is_f32_vector(w.gated_norm))) return false;
  if (c.d_conv < 1 || c.d_conv > kFusedMaxConvTaps) return false;
  // FalconMamba normalises dt, B and C inside the mixer; these kernels do not, so the plain ops run it.
  if (c.mixer_rms_eps > 0) return false;
  const int64_t di = c.d_inner, conv_ch = c.conv_channels();
  const bool state_bf16 = a.ssm_state.dtype == DType::BF16;

  FusedGemvLaunch in;
  in.x = crows(a.residual);
  in.w = weight(w.in_proj);
  in.bias = weight(w.in_proj_bias);
  in.T = B;
  in.in = c.d_model;
  in.out = c.in_proj_size();
  in.norm_w = weight(w.norm);
  in.norm_group = c.d_model;
  in.eps = static_cast<float>(c.norm_eps);
  in.y = rows(a.proj);
  in.conv_begin = mamba2 ? di : 0;  // Mamba-2: [z | xBC | dt]; Mamba-1: [x | z]
  in.conv_channels = conv_ch;
  in.conv_w = weight(w.conv);
  in.conv_bias = weight(w.conv_bias);
  in.K = c.d_conv;
  in.conv_state = a.conv_state.data;
  in.state_bf16 = a.conv_state.dtype == DType::BF16;
  in.conv_out = rows(a.conv_out);
  in.seqs = device_seqs;

  FusedGemvLaunch out;
  out.x = crows(a.y);
  out.w = weight(w.out_proj);
  out.bias = weight(w.out_proj_bias);
  out.T = B;
  out.in = di;
  out.out = c.d_model;
  if (mamba2) {
    out.norm_w = weight(w.gated_norm);
    out.norm_group = di / c.n_groups;
    out.eps = static_cast<float>(c.norm_eps);
  }
  out.y = rows(a.residual);
  out.accumulate = true;

  FusedGemvLaunch xp;  // Mamba-1's x_proj
  if (!mamba2) {
    xp.x = crows(a.conv_out);
    xp.w = weight(w.x_proj);
    xp.T = B;
    xp.in = di;
    xp.out = c.dt_rank + 2 * c.d_state;
    xp.y = rows(a.xdbc);
  }
  if (!fused_gemv_supported(in) || !fused_gemv_supported(out) || (!mamba2 && !fused_gemv_supported(xp)))
    return false;  // nothing launched yet

  launch_fused_gemv(in, sm_count, stream);
  if (mamba2) {
    const int64_t gn = c.n_groups * c.d_state;
    Mamba2Launch s;
    s.x = crows(a.conv_out);
    s.B = crows(a.conv_out, di);
    s.C = crows(a.conv_out, di + gn);
    s.dt = crows(a.proj, di + conv_ch);
    s.z = crows(a.proj);
    s.A_log = weight(w.A_log);
    s.D = weight(w.D);
    s.dt_bias = weight(w.dt_bias);
    s.dt_min = static_cast<float>(c.dt_min);
    s.dt_max = static_cast<float>(c.dt_max);
    s.n_heads = c.n_heads;
    s.head_dim = c.head_dim;
    s.n_groups = c.n_groups;
    s.d_state = c.d_state;
    s.chunk_size = c.chunk_size;
    s.state = a.ssm_state.data;
    s.state_bf16 = state_bf16;
    s.y = rows(a.y);
    s.T = B;
    s.seqs = device_seqs;
    s.n_seqs = B;
    launch_mamba2_step(s, stream);
  } else {
    const int64_t r = c.dt_rank, n = c.d_state;
    launch_fused_gemv(xp, sm_count, stream);
    Mamba1Launch m;
    m.x = crows(a.conv_out);
    m.dt_low = crows(a.xdbc);
    m.dt_proj = weight(w.dt_proj);
    m.dt_rank = r;
    m.B = crows(a.xdbc, r);
    m.C = crows(a.xdbc, r + n);
    m.z = crows(a.proj, di);
    m.A_log = weight(w.A_log);
    m.D = weight(w.D);
    m.dt_bias = weight(w.dt_bias);
    m.state = a.ssm_state.data;
    m.state_bf16 = state_bf16;
    m.y = rows(a.y);
    m.d_inner = di;
    m.d_state = n;
    m.seqs = device_seqs;
    m.n_seqs = B;
    launch_mamba1_scan(m, stream);
  }

  launch_fused_gemv(out, sm_count, stream);
  return true;
}

bool run_rmsnorm_linear(const TensorView& x, const TensorView& norm_w, float eps, const TensorView& w, TensorView y,
                        int sm_count, cudaStream_t stream) {
  const int64_t T = x.dim(0);
  if (T < 1 || T > kFusedMaxRows || x.dim(1) < 1 || !is_f32_vector(norm_w)) return false;
  FusedGemvLaunch p;
  p.x = crows(x);
  p.w = weight(w);
  p.T = T;
  p.in = x.dim(1);
  p.out = w.dim(0);
  p.norm_w = weight(norm_w);
  p.norm_group = p.in;
  p.eps = eps;
  p.y = rows(y);
  if (!fused_gemv_supported(p)) return false;
  launch_fused_gemv(p, sm_count, stream);
  return true;
}

}  // namespace mambacpp::cuda
