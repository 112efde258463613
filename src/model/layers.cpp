#include "model/layers.h"

#include <cmath>

#include "model/falcon_h1_layer.h"
#include "model/mixers.h"
#include "model/moe_layer.h"

namespace mambacpp {

namespace {

// RoPE on this call's q and k (in place), then attention over the slot's KV pages (the rows appended) into out.
void attend(const Model::Impl& m, StateCache::Impl& st, size_t li, const BatchLayout& batch, const TensorView& q,
            const TensorView& k, const TensorView& v, TensorView out, bool device_kv) {
  const ModelConfig& c = m.config;
  Backend& be = *m.backend;
  AttentionArgs a;
  a.q = q;
  a.k = k;
  a.v = v;
  a.out = out;
  const auto* lengths = device_kv ? static_cast<const int64_t*>(st.kv_lengths.data()) : nullptr;
  std::vector<int64_t> start;
  for (const SeqSpan& s : batch.seqs) start.push_back(st.positions[static_cast<size_t>(s.slot)]);
  if (c.rope_theta > 0 && device_kv) {
    be.rope_at_lengths(a.q, c.n_attn_heads, c.attn_head_dim, c.rope_dim, c.rope_theta, lengths, batch);
    be.rope_at_lengths(a.k, c.n_kv_heads, c.attn_head_dim, c.rope_dim, c.rope_theta, lengths, batch);
  } else if (c.rope_theta > 0) {
    be.rope(a.q, c.n_attn_heads, c.attn_head_dim, c.rope_dim, c.rope_theta, start, batch);
    be.rope(a.k, c.n_kv_heads, c.attn_head_dim, c.rope_dim, c.rope_theta, start, batch);
  }
  a.n_heads = c.n_attn_heads;
  a.n_kv_heads = c.n_kv_heads;
  a.head_dim = c.attn_head_dim;
  a.page_tokens = st.page_tokens;
  a.kv_dtype = st.dtype;
  a.scale = static_cast<float>(c.attn_scale > 0 ? c.attn_scale : 1.0 / std::sqrt(static_cast<double>(c.attn_head_dim)));
  if (device_kv) {
    a.device_lengths = lengths;
    a.device_pages = st.device_pages(li);
    a.max_pages = st.table_pages;
  } else {
    for (const SeqSpan& s : batch.seqs) a.cache.push_back(st.kv_sequence(li, s.slot));
  }
  be.attention(a, batch);
}

std::vector<std::pair<int64_t, float>> scale_all(int64_t n, double alpha) {
  if (alpha == 1.0) return {};
  return {{n, static_cast<float>(alpha)}};
}

}  // namespace

// Causal self-attention: q/k/v projections (K times key_multiplier), RoPE where the config has it, attention over the
// slot's KV pages (this call's rows appended), o projection.
void attention_mixer(const Model::Impl& m, const LayerWeights& w, StateCache::Impl& st, size_t li,
                     const BatchLayout& batch, const TensorView& h, TensorView out, bool device_kv) {
  const ModelConfig& c = m.config;
  Backend& be = *m.backend;
  const Device dev = be.device();
  Workspace& ws = m.workspace;
  const int64_t T = batch.total_tokens;
  TensorView q = Workspace::f32(ws.q, dev, T, c.q_dim());
  TensorView k = Workspace::f32(ws.k, dev, T, c.kv_dim());
  TensorView v = Workspace::f32(ws.v, dev, T, c.kv_dim());
  TensorView attn = Workspace::f32(ws.attn, dev, T, c.q_dim());
  be.linear(h, w.q_proj, w.q_bias, q);
  be.linear(h, w.k_proj, w.k_bias, k);
  be.linear(h, w.v_proj, w.v_bias, v);
  if (c.key_multiplier != 1.0) be.scale(k, static_cast<float>(c.key_multiplier));
  attend(m, st, li, batch, q, k, v, attn, device_kv);
  be.linear(attn, w.o_proj, w.o_bias, out);
}

bool fused_supported(const Backend& be, const BatchLayout& batch, std::initializer_list<const FusedLinearArgs*> args) {
  for (const FusedLinearArgs* a : args)
    if (!a->w.data.empty() && !be.supports_fused_linear(*a, batch)) return false;
  return true;
}

FusedAttentionDecode fused_attention_decode_args(const Model::Impl& m, const LayerWeights& w, const TensorView& norm,
                                                 double x_scale, double out_scale, int64_t T, TensorView residual) {
  const ModelConfig& c = m.config;
  const Device dev = m.backend->device();
  Workspace& ws = m.workspace;
  FusedAttentionDecode a;
  const Weight* proj[3] = {&w.q_proj, &w.k_proj, &w.v_proj};
  const TensorView* bias[3] = {&w.q_bias, &w.k_bias, &w.v_bias};
  FusedLinearArgs* args[3] = {&a.q, &a.k, &a.v};
  DeviceBuffer* buf[3] = {&ws.q, &ws.k, &ws.v};
  for (int i = 0; i < 3; ++i) {
    FusedLinearArgs& f = *args[i];
    f.x = residual;
    f.w = *proj[i];
    f.bias = *bias[i];
    f.norm_w = norm;
    f.eps = static_cast<float>(c.norm_eps);
    f.x_scale = static_cast<float>(x_scale);
    f.y = Workspace::f32(*buf[i], dev, T, i == 0 ? c.q_dim() : c.kv_dim());
  }
  a.k.out_scales = scale_all(c.kv_dim(), c.key_multiplier);
  a.o.x = Workspace::f32(ws.attn, dev, T, c.q_dim());
  a.o.w = w.o_proj;
  a.o.bias = w.o_bias;
  a.o.y = residual;
  a.o.accumulate = true;
  a.o.out_scales = scale_all(c.d_model, out_scale);
  return a;
}

void run_fused_qkv(Backend& be, const FusedAttentionDecode& a, const BatchLayout& batch) {
  be.fused_linear(a.q, batch);
  be.fused_linear(a.k, batch);
  be.fused_linear(a.v, batch);
}

void run_fused_attend(const Model::Impl& m, StateCache::Impl& st, size_t li, const BatchLayout& batch,
                      const FusedAttentionDecode& a) {
  attend(m, st, li, batch, a.q.y, a.k.y, a.v.y, a.o.x, /*device_kv=*/true);
  m.backend->fused_linear(a.o, batch);
}

FusedMlpDecode fused_mlp_decode_args(const Model::Impl& m, const LayerWeights& w, const TensorView& norm,
                                     double gate_scale, double down_scale, int64_t T, TensorView residual) {
  const ModelConfig& c = m.config;
  const Device dev = m.backend->device();
  Workspace& ws = m.workspace;
  const int64_t n = c.mlp_size;
  TensorView hid = Workspace::f32(ws.mlp_h, dev, T, 2 * n);
  FusedMlpDecode a;
  auto normed_input = [&](FusedLinearArgs& f) {
    f.x = residual;
    f.norm_w = norm;
    f.eps = static_cast<float>(c.norm_eps);
  };
  if (c.mlp_act == MlpAct::Relu2) {  // down(relu(up(h))^2)
    normed_input(a.up);
    a.up.w = w.mlp_up;
    a.up.bias = w.mlp_up_bias;
    a.up.y = hid.cols(0, n);
    a.hid_up = a.up.y;
  } else if (w.mlp_gate.empty()) {  // Granite's input_linear: [gate | up] in one matrix
    normed_input(a.up);
    a.up.w = w.mlp_up;
    a.up.y = hid;
    a.up.out_scales = gate_scale == 1.0 ? std::vector<std::pair<int64_t, float>>{}
                                        : std::vector<std::pair<int64_t, float>>{{n, static_cast<float>(gate_scale)},
                                                                                 {2 * n, 1.0f}};
    a.hid_gate = hid.cols(0, n);
    a.hid_up = hid.cols(n, n);
  } else {
    normed_input(a.gate);
    a.gate.w = w.mlp_gate;
    a.gate.bias = w.mlp_gate_bias;
    a.gate.y = hid.cols(0, n);
    a.gate.out_scales = scale_all(n, gate_scale);
    normed_input(a.up);
    a.up.w = w.mlp_up;
    a.up.bias = w.mlp_up_bias;
    a.up.y = hid.cols(n, n);
    a.hid_gate = a.gate.y;
    a.hid_up = a.up.y;
  }
  a.down.x = c.mlp_act == MlpAct::Relu2 ? a.hid_up : Workspace::f32(ws.mlp_act, dev, T, n);
  a.down.w = w.mlp_down;
  a.down.bias = w.mlp_down_bias;
  a.down.y = residual;
  a.down.accumulate = true;
  a.down.out_scales = scale_all(c.d_model, down_scale);
  return a;
}

void run_fused_mlp(const Model::Impl& m, const FusedMlpDecode& a, const BatchLayout& batch) {
  Backend& be = *m.backend;
  if (!a.gate.w.data.empty()) be.fused_linear(a.gate, batch);
  be.fused_linear(a.up, batch);
  if (m.config.mlp_act == MlpAct::Relu2)
    be.relu2(a.hid_up);
  else
    be.silu_mul(a.hid_gate, a.hid_up, a.down.x);
  be.fused_linear(a.down, batch);
}

namespace {

// relu2: down(relu(up(h))^2); gated SiLU: down(silu(gate(h)) * up(h)).
void mlp(const Model::Impl& m, const LayerWeights& w, int64_t T, const TensorView& h, TensorView out) {
  const ModelConfig& c = m.config;
  Backend& be = *m.backend;
  const Device dev = be.device();
  Workspace& ws = m.workspace;
  const int64_t n = c.mlp_size;
  TensorView hid = Workspace::f32(ws.mlp_h, dev, T, 2 * n);
  if (c.mlp_act == MlpAct::Relu2) {
    TensorView up = hid.cols(0, n);
    be.linear(h, w.mlp_up, w.mlp_up_bias, up);
    be.relu2(up);
    be.linear(up, w.mlp_down, w.mlp_down_bias, out);
    return;
  }
  if (w.mlp_gate.empty()) {
    be.linear(h, w.mlp_up, {}, hid);  // Granite's input_linear: [gate | up]
  } else {
    be.linear(h, w.mlp_gate, {}, hid.cols(0, n));
    be.linear(h, w.mlp_up, {}, hid.cols(n, n));
  }
  TensorView act = Workspace::f32(ws.mlp_act, dev, T, n);
  be.silu_mul(hid.cols(0, n), hid.cols(n, n), act);
  be.linear(act, w.mlp_down, w.mlp_down_bias, out);
}

void add_scaled(Backend& be, const ModelConfig& c, TensorView residual, TensorView out) {
  if (c.residual_multiplier != 1.0) be.scale(out, static_cast<float>(c.residual_multiplier));
  be.add_inplace(residual, out);
}

// residual += mixer(rmsnorm(residual)) of a Mamba layer (the fused recipes scale the output by residual_multiplier in
// their epilogue).
void mamba_sublayer(const Model::Impl& m, const LayerWeights& w, const LayerCache& cache, const PieceContext& ctx,
                    TensorView residual) {
  const ModelConfig& c = m.config;
  Backend& be = *m.backend;
  Workspace& ws = m.workspace;
  const BatchLayout& batch = ctx.batch;
  const bool fuse = m.options.fused_decode;
  if (fuse && ctx.pass == Pass::Decode && mamba_block_decode_fused(be, c, w, cache, batch, ws, residual)) return;
  if (fuse && mamba_block_fused_projections(be, c, w, cache, batch, ctx.mamba2, ws, residual)) return;
  const int64_t T = batch.total_tokens;
  TensorView normed = Workspace::f32(ws.normed, be.device(), T, c.d_model);
  TensorView out = Workspace::f32(ws.mixer_out, be.device(), T, c.d_model);
  be.rmsnorm(residual, w.norm, static_cast<float>(c.norm_eps), normed);
  if (w.kind == LayerKind::Mamba1)
    mamba1_mixer(be, c, w, cache, batch, ws, normed, out);
  else
    mamba2_mixer(be, c, w, cache, batch, ws, normed, out);
  add_scaled(be, c, residual, out);
}

// residual += f(norm(residual)) for an attention or MLP sublayer with pre-norm weight `norm`.
void plain_sublayer(const Model::Impl& m, int64_t layer, StateCache& state, const PieceContext& ctx,
                    const TensorView& norm, LayerKind kind, TensorView residual) {
  const ModelConfig& c = m.config;
  Backend& be = *m.backend;
  Workspace& ws = m.workspace;
  const int64_t T = ctx.batch.total_tokens;
  const LayerWeights& w = m.weights.layers[static_cast<size_t>(layer)];
  if (m.options.fused_decode && ctx.pass == Pass::Decode && be.supports_device_kv()) {
    if (kind == LayerKind::Attention) {
      const FusedAttentionDecode a = fused_attention_decode_args(m, w, norm, 1.0, c.residual_multiplier, T, residual);
      if (fused_supported(be, ctx.batch, {&a.q, &a.k, &a.v, &a.o})) {
        run_fused_qkv(be, a, ctx.batch);
        run_fused_attend(m, state_impl(state), static_cast<size_t>(layer), ctx.batch, a);
        return;
      }
    } else {
      const FusedMlpDecode a = fused_mlp_decode_args(m, w, norm, 1.0, c.residual_multiplier, T, residual);
      if (fused_supported(be, ctx.batch, {&a.gate, &a.up, &a.down})) {
        run_fused_mlp(m, a, ctx.batch);
        return;
      }
    }
  }
  TensorView normed = Workspace::f32(ws.normed, be.device(), T, c.d_model);
  TensorView out = Workspace::f32(ws.mixer_out, be.device(), T, c.d_model);
  be.rmsnorm(residual, norm, static_cast<float>(c.norm_eps), normed);
  if (kind == LayerKind::Attention)
    attention_mixer(m, w, state_impl(state), static_cast<size_t>(layer), ctx.batch, normed, out,
                    /*device_kv=*/ctx.pass == Pass::Decode);
  else
    mlp(m, w, T, normed, out);
  add_scaled(be, c, residual, out);
}

}  // namespace

void run_layer(const Model::Impl& m, int64_t layer, StateCache& state, const PieceContext& ctx, TensorView residual) {
  const ModelConfig& c = m.config;
  const LayerWeights& w = m.weights.layers[static_cast<size_t>(layer)];
  switch (w.kind) {
    case LayerKind::Mamba1:
    case LayerKind::Mamba2:
      mamba_sublayer(m, w, state.layers()[static_cast<size_t>(layer)], ctx, residual);
      break;
    case LayerKind::Attention:
    case LayerKind::MLP:
      plain_sublayer(m, layer, state, ctx, w.norm, w.kind, residual);
      break;
    case LayerKind::ParallelHybrid:
      falcon_h1_layer(m, layer, state, ctx, residual);
      break;
    case LayerKind::MoE:
      moe_sublayer(m, w, w.norm, ctx, residual);
      break;
  }
  if (c.mlp_after_mixer && w.moe)  // the MLP sublayer with experts (Granite-4.0-H MoE)
    moe_sublayer(m, w, w.mlp_norm, ctx, residual);
  else if (c.mlp_after_mixer)
    plain_sublayer(m, layer, state, ctx, w.mlp_norm, LayerKind::MLP, residual);
}

}  // namespace mambacpp
