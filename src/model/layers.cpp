#include "model/layers.h"

#include <cmath>

#include "model/falcon_h1_layer.h"
#include "model/mixers.h"
#include "model/moe_layer.h"

namespace mambacpp {

// Causal self-attention: q/k/v projections (K times key_multiplier), RoPE where the config has it, attention over the
// slot's KV pages (this call's rows appended), o projection.
void attention_mixer(const Model::Impl& m, const LayerWeights& w, StateCache::Impl& st, size_t li,
                     const BatchLayout& batch, const TensorView& h, TensorView out, bool device_kv) {
  const ModelConfig& c = m.config;
  Backend& be = *m.backend;
  const Device dev = be.device();
  Workspace& ws = m.workspace;
  const int64_t T = batch.total_tokens;
  AttentionArgs a;
  a.q = Workspace::f32(ws.q, dev, T, c.q_dim());
  a.k = Workspace::f32(ws.k, dev, T, c.kv_dim());
  a.v = Workspace::f32(ws.v, dev, T, c.kv_dim());
  a.out = Workspace::f32(ws.attn, dev, T, c.q_dim());
  be.linear(h, w.q_proj, w.q_bias, a.q);
  be.linear(h, w.k_proj, w.k_bias, a.k);
  be.linear(h, w.v_proj, w.v_bias, a.v);
  if (c.key_multiplier != 1.0) be.scale(a.k, static_cast<float>(c.key_multiplier));
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
  be.linear(a.out, w.o_proj, w.o_bias, out);
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

// residual += mixer(rmsnorm(residual)) of a Mamba layer. The fused recipes add the mixer's output unscaled in their
// epilogue, so a family that scales it (Granite) takes the plain ops.
void mamba_sublayer(const Model::Impl& m, const LayerWeights& w, const LayerCache& cache, const PieceContext& ctx,
                    TensorView residual) {
  const ModelConfig& c = m.config;
  Backend& be = *m.backend;
  Workspace& ws = m.workspace;
  const BatchLayout& batch = ctx.batch;
  const bool fuse = m.options.fused_decode && c.residual_multiplier == 1.0;
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
