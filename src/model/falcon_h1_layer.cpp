#include "model/falcon_h1_layer.h"

#include "model/layers.h"
#include "model/mixers.h"

namespace mambacpp {
namespace {

void scale_unless_one(Backend& be, TensorView x, double alpha) {
  if (alpha != 1.0) be.scale(x, static_cast<float>(alpha));
}

// out [T, d_model] = out_proj(gated(y)) of the Mamba-2 mixer on its input x (already times ssm_in_multiplier).
void mamba_branch(const Model::Impl& m, const LayerWeights& w, const LayerCache& cache, const BatchLayout& batch,
                  const TensorView& x, TensorView out) {
  const ModelConfig& c = m.config;
  Backend& be = *m.backend;
  Workspace& ws = m.workspace;
  const Device dev = be.device();
  const int64_t T = batch.total_tokens, di = c.d_inner, gn = c.n_groups * c.d_state;
  TensorView zxbcdt = Workspace::f32(ws.proj, dev, T, c.in_proj_size());
  be.linear(x, w.in_proj, w.in_proj_bias, zxbcdt);
  if (!c.ssm_multipliers.empty()) {  // the muP vector, one value per slice (in_proj's bias included, as in transformers)
    const int64_t widths[5] = {di, di, gn, gn, c.n_heads};
    int64_t begin = 0;
    for (int i = 0; i < 5; ++i) {
      scale_unless_one(be, zxbcdt.cols(begin, widths[i]), c.ssm_multipliers[static_cast<size_t>(i)]);
      begin += widths[i];
    }
  }
  TensorView y = Workspace::f32(ws.y, dev, T, di);
  mamba2_core(be, c, w, cache, batch, ws, zxbcdt, y);
  const TensorView z = zxbcdt.cols(0, di);
  TensorView gated = Workspace::f32(ws.y_normed, dev, T, di);
  const float eps = static_cast<float>(c.norm_eps);
  const int64_t group = di / c.norm_groups();
  if (!c.mamba_rms_norm) {
    be.silu_mul(z, y, gated);
  } else if (!c.mamba_norm_before_gate) {
    be.gated_rmsnorm(y, z, w.gated_norm, group, eps, gated);
  } else {  // rmsnorm of each group of y with its slice of the weight, then the gate
    for (int64_t g = 0; g < c.norm_groups(); ++g)
      be.rmsnorm(y.cols(g * group, group), w.gated_norm.rows(g * group, group), eps, gated.cols(g * group, group));
    be.silu_mul(z, gated, gated);
  }
  be.linear(gated, w.out_proj, w.out_proj_bias, out);
}

// out = down(up(x) * silu(gate(x) * mlp_gate_multiplier)) * mlp_down_multiplier.
void mlp_branch(const Model::Impl& m, const LayerWeights& w, int64_t T, const TensorView& x, TensorView out) {
  const ModelConfig& c = m.config;
  Backend& be = *m.backend;
  Workspace& ws = m.workspace;
  const Device dev = be.device();
  const int64_t n = c.mlp_size;
  TensorView hid = Workspace::f32(ws.mlp_h, dev, T, 2 * n);
  TensorView gate = hid.cols(0, n), up = hid.cols(n, n);
  be.linear(x, w.mlp_gate, w.mlp_gate_bias, gate);
  scale_unless_one(be, gate, c.mlp_gate_multiplier);
  be.linear(x, w.mlp_up, w.mlp_up_bias, up);
  TensorView act = Workspace::f32(ws.mlp_act, dev, T, n);
  be.silu_mul(gate, up, act);
  be.linear(act, w.mlp_down, w.mlp_down_bias, out);
  scale_unless_one(be, out, c.mlp_down_multiplier);
}

// The layer of a decode step on fused linears (sequence i in row i, one token each), 16 kernels instead of ~35:
//   in_proj with input_layernorm before it, its inputs times ssm_in_multiplier and its outputs times their slice's
//     ssm_multipliers value, the conv1d + SiLU of xBC after it; q, k, v with the same norm (times attn_in_multiplier,
//     K times key_multiplier) -- all of them read the residual before either branch adds to it;
//   the SSD step with the silu(z) gate; out_proj (with the gated norm's group-wise RMSNorm where mamba_rms_norm) added
//     onto the residual times ssm_out_multiplier;
//   RoPE, attention, o_proj added onto the residual times attn_out_multiplier;
//   the MLP: gate and up with pre_ff_layernorm folded in (gate times its multiplier), silu_mul, down added onto the
//     residual times its multiplier.
// The branches add in the plain order (Mamba, then attention). Returns false, having run nothing, where the backend
// lacks a piece, and for norm(y) * silu(z) (mamba_norm_before_gate), which the SSD step's gate cannot express.
bool falcon_h1_decode_fused(const Model::Impl& m, const LayerWeights& w, StateCache& state, size_t ssm_entry,
                            const BatchLayout& batch, TensorView residual) {
  const ModelConfig& c = m.config;
  Backend& be = *m.backend;
  Workspace& ws = m.workspace;
  const Device dev = be.device();
  if (c.mamba_rms_norm && c.mamba_norm_before_gate) return false;
  const int64_t B = batch.total_tokens, di = c.d_inner, gn = c.n_groups * c.d_state;
  const float eps = static_cast<float>(c.norm_eps);
  const LayerCache& cache = state.layers()[ssm_entry];
  TensorView proj = Workspace::f32(ws.proj, dev, B, c.in_proj_size());
  TensorView conv_out = Workspace::f32(ws.conv, dev, B, c.conv_channels());
  TensorView y = Workspace::f32(ws.y, dev, B, di);

  FusedLinearArgs in;  // [z | xBC | dt], conv on xBC
  in.x = residual;
  in.w = w.in_proj;
  in.bias = w.in_proj_bias;
  in.norm_w = w.norm;
  in.eps = eps;
  in.x_scale = static_cast<float>(c.ssm_in_multiplier);
  if (!c.ssm_multipliers.empty()) {
    const int64_t widths[5] = {di, di, gn, gn, c.n_heads};
    int64_t end = 0;
    for (int i = 0; i < 5; ++i) {
      end += widths[i];
      in.out_scales.push_back({end, static_cast<float>(c.ssm_multipliers[static_cast<size_t>(i)])});
    }
  }
  in.y = proj;
  in.conv_begin = di;
  in.conv_w = w.conv;
  in.conv_bias = w.conv_bias;
  in.conv_state = cache.conv;
  in.conv_out = conv_out;

  FusedLinearArgs out;
  out.x = y;
  out.w = w.out_proj;
  out.bias = w.out_proj_bias;
  if (c.mamba_rms_norm) {  // rmsnorm(y * silu(z)): the step applies the gate, this prologue the group-wise norm
    out.norm_w = w.gated_norm;
    out.norm_group = di / c.norm_groups();
    out.eps = eps;
  }
  out.y = residual;
  out.accumulate = true;
  if (c.ssm_out_multiplier != 1.0) out.out_scales = {{c.d_model, static_cast<float>(c.ssm_out_multiplier)}};

  const FusedAttentionDecode attn =
      fused_attention_decode_args(m, w, w.norm, c.attn_in_multiplier, c.attn_out_multiplier, B, residual);
  const FusedMlpDecode mlp =
      fused_mlp_decode_args(m, w, w.mlp_norm, c.mlp_gate_multiplier, c.mlp_down_multiplier, B, residual);
  if (!fused_supported(be, batch, {&in, &out, &attn.q, &attn.k, &attn.v, &attn.o, &mlp.gate, &mlp.up, &mlp.down}))
    return false;

  be.fused_linear(in, batch);
  run_fused_qkv(be, attn, batch);
  Mamba2ScanArgs s = mamba2_scan_args(c, w, cache, proj, conv_out, y);
  s.z = proj.cols(0, di);
  be.mamba2_ssd(s, batch);
  be.fused_linear(out, batch);
  run_fused_attend(m, state_impl(state), ssm_entry + 1, batch, attn);
  run_fused_mlp(m, mlp, batch);
  return true;
}

}  // namespace

void falcon_h1_layer(const Model::Impl& m, int64_t layer, StateCache& state, const PieceContext& ctx,
                     TensorView residual) {
  const ModelConfig& c = m.config;
  Backend& be = *m.backend;
  Workspace& ws = m.workspace;
  const Device dev = be.device();
  const int64_t T = ctx.batch.total_tokens;
  const float eps = static_cast<float>(c.norm_eps);
  const LayerWeights& w = m.weights.layers[static_cast<size_t>(layer)];
  const size_t ssm_entry = 2 * static_cast<size_t>(layer), kv_entry = ssm_entry + 1;  // every layer is parallel
  if (m.options.fused_decode && ctx.pass == Pass::Decode && be.supports_device_kv() &&
      falcon_h1_decode_fused(m, w, state, ssm_entry, ctx.batch, residual))
    return;
  TensorView out = Workspace::f32(ws.mixer_out, dev, T, c.d_model);

  // Both branches read the same normed input, each times its own multiplier: two copies of the norm, so that
  // neither scaling is undone by the other (and the residual is updated only once both have read it).
  TensorView ssm_in = Workspace::f32(ws.normed, dev, T, c.d_model);
  TensorView attn_in = Workspace::f32(ws.parallel_in, dev, T, c.d_model);
  be.rmsnorm(residual, w.norm, eps, ssm_in);
  be.rmsnorm(residual, w.norm, eps, attn_in);
  scale_unless_one(be, ssm_in, c.ssm_in_multiplier);
  scale_unless_one(be, attn_in, c.attn_in_multiplier);

  mamba_branch(m, w, state.layers()[ssm_entry], ctx.batch, ssm_in, out);
  scale_unless_one(be, out, c.ssm_out_multiplier);
  be.add_inplace(residual, out);

  attention_mixer(m, w, state_impl(state), kv_entry, ctx.batch, attn_in, out, /*device_kv=*/ctx.pass == Pass::Decode);
  scale_unless_one(be, out, c.attn_out_multiplier);
  be.add_inplace(residual, out);

  TensorView normed = Workspace::f32(ws.normed, dev, T, c.d_model);
  be.rmsnorm(residual, w.mlp_norm, eps, normed);
  mlp_branch(m, w, T, normed, out);
  be.add_inplace(residual, out);
}

}  // namespace mambacpp
