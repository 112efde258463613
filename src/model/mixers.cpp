#include "model/mixers.h"

#include <utility>

namespace mambacpp {

// The SSD's arguments over in_proj's output [z | xBC | dt] and the conv output xBC = [x | B | C].
Mamba2ScanArgs mamba2_scan_args(const ModelConfig& c, const LayerWeights& w, const LayerCache& cache,
                                const TensorView& proj, const TensorView& xbc, TensorView y) {
  const int64_t di = c.d_inner, gn = c.n_groups * c.d_state;
  Mamba2ScanArgs a;
  a.x = xbc.cols(0, di);
  a.B = xbc.cols(di, gn);
  a.C = xbc.cols(di + gn, gn);
  a.dt = proj.cols(di + c.conv_channels(), c.n_heads);
  a.A_log = w.A_log;
  a.D = w.D;
  a.dt_bias = w.dt_bias;
  a.dt_min = static_cast<float>(c.dt_min);
  a.dt_max = static_cast<float>(c.dt_max);
  a.n_heads = c.n_heads;
  a.head_dim = c.head_dim;
  a.n_groups = c.n_groups;
  a.d_state = c.d_state;
  a.chunk_size = c.chunk_size;
  a.state = cache.ssm;
  a.y = y;
  return a;
}

namespace {

// Mamba-1 between its projections: in_proj's output xz = [x | z] -> conv, x_proj, dt_proj, the scan gated by silu(z)
// -> y [T, d_inner], out_proj's input.
void mamba1_core(Backend& be, const ModelConfig& c, const LayerWeights& w, const LayerCache& cache,
                 const BatchLayout& batch, Workspace& ws, const TensorView& xz, TensorView y) {
  const int64_t T = batch.total_tokens;
  const Device dev = be.device();
  const int64_t di = c.d_inner, n = c.d_state, r = c.dt_rank;
  TensorView xc = Workspace::f32(ws.conv, dev, T, di);
  be.conv1d_silu(xz.cols(0, di), w.conv, w.conv_bias, cache.conv, batch, xc);
  // x_proj -> [dt_low | B | C].
  TensorView dbc = Workspace::f32(ws.xdbc, dev, T, r + 2 * n);
  be.linear(xc, w.x_proj, {}, dbc);
  if (c.mixer_rms_eps > 0) {
    // FalconMamba: dt, B and C are each RMS-normalised over their own width, with no weight (transformers'
    // rms_forward), before dt_proj and the scan. In place: each row is read in full before it is written.
    const float eps = static_cast<float>(c.mixer_rms_eps);
    // Jamba's norms have weights of their own (dt_norm, b_norm, c_norm).
    const TensorView* own[] = {&w.dt_norm, &w.b_norm, &w.c_norm};
    int i = 0;
    for (const auto& [begin, width] : {std::pair<int64_t, int64_t>{0, r}, {r, n}, {r + n, n}}) {
      TensorView part = dbc.cols(begin, width);
      const TensorView& mine = *own[i++];
      be.rmsnorm(part, mine.empty() ? w.mixer_norm.rows(0, width) : mine, eps, part);
    }
  }
  TensorView dt = Workspace::f32(ws.dt, dev, T, di);
  be.linear(dbc.cols(0, r), w.dt_proj, {}, dt);  // dt_proj's bias is applied inside the scan, before softplus
  Mamba1ScanArgs a;
  a.x = xc;
  a.dt = dt;
  a.A_log = w.A_log;
  a.B = dbc.cols(r, n);
  a.C = dbc.cols(r + n, n);
  a.D = w.D;
  a.dt_bias = w.dt_bias;
  a.z = xz.cols(di, di);
  a.state = cache.ssm;
  a.y = y;
  be.mamba1_scan(a, batch);
}

}  // namespace

void mamba2_core(Backend& be, const ModelConfig& c, const LayerWeights& w, const LayerCache& cache,
                 const BatchLayout& batch, Workspace& ws, const TensorView& zxbcdt, TensorView y) {
  const int64_t T = batch.total_tokens;
  const Device dev = be.device();
  const int64_t di = c.d_inner, conv_ch = c.conv_channels();
  TensorView xbc = Workspace::f32(ws.conv, dev, T, conv_ch);
  be.mamba2_conv_ssd(zxbcdt.cols(di, conv_ch), w.conv, w.conv_bias, cache.conv, xbc,
                     mamba2_scan_args(c, w, cache, zxbcdt, xbc, y), batch);
}

void mamba1_mixer(Backend& be, const ModelConfig& c, const LayerWeights& w, const LayerCache& cache,
                  const BatchLayout& batch, Workspace& ws, const TensorView& h, TensorView out) {
  // in_proj -> [x | z], each [T, d_inner].
  const int64_t T = batch.total_tokens;
  TensorView xz = Workspace::f32(ws.proj, be.device(), T, 2 * c.d_inner);
  be.linear(h, w.in_proj, w.in_proj_bias, xz);
  TensorView y = Workspace::f32(ws.y, be.device(), T, c.d_inner);
  mamba1_core(be, c, w, cache, batch, ws, xz, y);
  be.linear(y, w.out_proj, w.out_proj_bias, out);
}

void mamba2_mixer(Backend& be, const ModelConfig& c, const LayerWeights& w, const LayerCache& cache,
                  const BatchLayout& batch, Workspace& ws, const TensorView& h, TensorView out) {
  const int64_t T = batch.total_tokens, di = c.d_inner;
  const Device dev = be.device();
  // in_proj -> [z (d_inner) | xBC (d_inner + 2 G N) | dt (n_heads)].
  TensorView zxbcdt = Workspace::f32(ws.proj, dev, T, c.in_proj_size());
  be.linear(h, w.in_proj, w.in_proj_bias, zxbcdt);
  TensorView y = Workspace::f32(ws.y, dev, T, di);
  mamba2_core(be, c, w, cache, batch, ws, zxbcdt, y);
  TensorView yn = Workspace::f32(ws.y_normed, dev, T, di);
  be.gated_rmsnorm(y, zxbcdt.cols(0, di), w.gated_norm, di / c.norm_groups(), static_cast<float>(c.norm_eps), yn);
  be.linear(yn, w.out_proj, w.out_proj_bias, out);
}

bool mamba_block_fused_projections(Backend& be, const ModelConfig& c, const LayerWeights& w, const LayerCache& cache,
                                   const BatchLayout& batch, const Mamba2Plan& plan, Workspace& ws,
                                   TensorView residual) {
  const Device dev = be.device();
  const int64_t T = batch.total_tokens, di = c.d_inner;
  const bool mamba2 = c.arch == Arch::Mamba2;
  const float eps = static_cast<float>(c.norm_eps);
  FusedLinearArgs in;  // the block's RMSNorm, then in_proj
  in.x = residual;
  in.w = w.in_proj;
  in.bias = w.in_proj_bias;
  in.norm_w = w.norm;
  in.eps = eps;
  // Mamba-2's [z | xBC | dt] has conv1d, the SSD and the gated norm as its readers here, and y the gated norm alone:
  // the piece's plan says which dtypes they take.
  in.round_prompt_rows = mamba2 && plan.round_proj_prompt_rows;
  in.y = Workspace::of(ws.proj, mamba2 ? plan.proj_dtype : DType::F32, dev, T, mamba2 ? c.in_proj_size() : 2 * di);
  FusedLinearArgs out;  // Mamba-2: the gated norm first; then out_proj, added onto the residual
  out.x = Workspace::of(ws.y, mamba2 ? plan.y_dtype : DType::F32, dev, T, di);
  out.w = w.out_proj;
  out.bias = w.out_proj_bias;
  if (mamba2) {
    out.gate = in.y.cols(0, di);
    out.norm_w = w.gated_norm;
    out.norm_group = di / c.norm_groups();
    out.eps = eps;
  }
  out.y = residual;
  out.accumulate = true;
  if (c.residual_multiplier != 1.0) out.out_scales = {{c.d_model, static_cast<float>(c.residual_multiplier)}};
  if (!be.supports_fused_linear(in, batch) || !be.supports_fused_linear(out, batch)) return false;
  be.fused_linear(in, batch);
  if (mamba2)
    mamba2_core(be, c, w, cache, batch, ws, in.y, out.x);
  else
    mamba1_core(be, c, w, cache, batch, ws, in.y, out.x);
  be.fused_linear(out, batch);
  return true;
}

bool mamba_block_decode_fused(Backend& be, const ModelConfig& c, const LayerWeights& w, const LayerCache& cache,
                              const BatchLayout& batch, Workspace& ws, TensorView residual) {
  // FalconMamba normalises dt, B and C inside the mixer, between pieces these calls fuse: plain ops. The scan folds
  // dt_proj in as a dense matrix.
  if (c.mixer_rms_eps > 0 || (c.arch == Arch::Mamba1 && !w.dt_proj.dense())) return false;
  const Device dev = be.device();
  const int64_t B = batch.total_tokens, di = c.d_inner, conv_ch = c.conv_channels();
  const bool mamba2 = c.arch == Arch::Mamba2;
  const float eps = static_cast<float>(c.norm_eps);
  TensorView proj = Workspace::f32(ws.proj, dev, B, c.in_proj_size());
  TensorView conv_out = Workspace::f32(ws.conv, dev, B, conv_ch);
  TensorView y = Workspace::f32(ws.y, dev, B, di);

  FusedLinearArgs in;  // Mamba-2: [z | xBC | dt], conv on xBC; Mamba-1: [x | z], conv on x
  in.x = residual;
  in.w = w.in_proj;
  in.bias = w.in_proj_bias;
  in.norm_w = w.norm;
  in.eps = eps;
  in.y = proj;
  in.conv_begin = mamba2 ? di : 0;
  in.conv_w = w.conv;
  in.conv_bias = w.conv_bias;
  in.conv_state = cache.conv;
  in.conv_out = conv_out;

  FusedLinearArgs out;
  out.x = y;
  out.w = w.out_proj;
  out.bias = w.out_proj_bias;
  if (mamba2) {  // the gated norm: the step applies silu(z), this prologue the group-wise RMSNorm
    out.norm_w = w.gated_norm;
    out.norm_group = di / c.norm_groups();
    out.eps = eps;
  }
  out.y = residual;
  out.accumulate = true;
  if (c.residual_multiplier != 1.0) out.out_scales = {{c.d_model, static_cast<float>(c.residual_multiplier)}};

  FusedLinearArgs xp;  // Mamba-1's x_proj -> [dt_low | B | C]
  const int64_t r = c.dt_rank, n = c.d_state;
  if (!mamba2) {
    xp.x = conv_out;
    xp.w = w.x_proj;
    xp.y = Workspace::f32(ws.xdbc, dev, B, r + 2 * n);
  }
  if (!be.supports_fused_linear(in, batch) || !be.supports_fused_linear(out, batch) ||
      (!mamba2 && !be.supports_fused_linear(xp, batch)))
    return false;

  be.fused_linear(in, batch);
  if (mamba2) {
    Mamba2ScanArgs s = mamba2_scan_args(c, w, cache, proj, conv_out, y);
    s.z = proj.cols(0, di);
    be.mamba2_ssd(s, batch);
  } else {
    be.fused_linear(xp, batch);
    Mamba1ScanArgs s;
    s.x = conv_out;
    s.dt = xp.y.cols(0, r);
    s.dt_proj = w.dt_proj.data;
    s.A_log = w.A_log;
    s.B = xp.y.cols(r, n);
    s.C = xp.y.cols(r + n, n);
    s.D = w.D;
    s.dt_bias = w.dt_bias;
    s.z = proj.cols(di, di);
    s.state = cache.ssm;
    s.y = y;
    be.mamba1_scan(s, batch);
  }
  be.fused_linear(out, batch);
  return true;
}

}  // namespace mambacpp
