#include "model/layer_stack.h"

#include "model/layers.h"

namespace mambacpp {

void run_layers(const Model::Impl& m, StateCache& state, const BatchLayout& batch, Pass pass, TensorView residual) {
  const ModelConfig& c = m.config;
  Backend& be = *m.backend;
  if (c.embedding_multiplier != 1.0) be.scale(residual, static_cast<float>(c.embedding_multiplier));
  PieceContext ctx{batch, pass, {}};
  if (c.arch == Arch::Mamba2)  // pure Mamba-2 and the Mamba-2 hybrids: one block shape for every Mamba layer
    ctx.mamba2 = be.plan_mamba2({c.head_dim, c.d_state, c.chunk_size, c.d_conv, c.use_bias}, batch);
  for (int64_t l = 0; l < c.n_layer; ++l) run_layer(m, l, state, ctx, residual);
}

void reserve_kv(StateCache& state, const BatchLayout& batch, Pass pass) {
  StateCache::Impl& st = state_impl(state);
  if (!st.has_kv()) return;
  for (const SeqSpan& s : batch.seqs) st.fit_kv(s.slot, st.positions[static_cast<size_t>(s.slot)] + s.len);
  if (pass == Pass::Decode) st.sync_device_kv(batch.seqs);
}

void advance_kv(StateCache& state, const BatchLayout& batch) {
  StateCache::Impl& st = state_impl(state);
  if (!st.has_kv()) return;
  for (const SeqSpan& s : batch.seqs) st.positions[static_cast<size_t>(s.slot)] += s.len;
}

void lm_head(const Model::Impl& m, const TensorView& normed, TensorView logits) {
  Backend& be = *m.backend;
  be.linear(normed, m.weights.lm_head, {}, logits);
  if (m.config.logits_scaling != 1.0) be.scale(logits, static_cast<float>(1.0 / m.config.logits_scaling));
}

void lm_head_decode(const Model::Impl& m, const TensorView& residual, const BatchLayout& batch, TensorView logits) {
  const ModelConfig& c = m.config;
  Backend& be = *m.backend;
  FusedLinearArgs head;
  head.x = residual;
  head.w = m.weights.lm_head;
  head.norm_w = m.weights.norm_f;
  head.eps = static_cast<float>(c.norm_eps);
  head.y = logits;
  if (m.options.fused_decode && be.supports_fused_linear(head, batch)) {
    be.fused_linear(head, batch);
    if (c.logits_scaling != 1.0) be.scale(logits, static_cast<float>(1.0 / c.logits_scaling));
    return;
  }
  TensorView normed = Workspace::f32(m.workspace.normed, be.device(), batch.total_tokens, c.d_model);
  be.rmsnorm(residual, m.weights.norm_f, head.eps, normed);
  lm_head(m, normed, logits);
}

}  // namespace mambacpp
