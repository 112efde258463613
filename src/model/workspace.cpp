#include "model/workspace.h"

#include <algorithm>

namespace mambacpp {

void Workspace::reserve(Backend& backend, const ModelConfig& c, int64_t tokens, int64_t rows_of_logits) {
  if (tokens > capacity) {
    auto f32 = [&](int64_t cols) { return DeviceBuffer(backend, static_cast<size_t>(tokens * cols) * 4); };
    ids = DeviceBuffer(backend, static_cast<size_t>(tokens) * 4);
    staging = f32(c.d_model);
    residual = f32(c.d_model);
    normed = f32(c.d_model);
    proj = f32(c.in_proj_size());
    conv = f32(c.conv_channels());
    if (c.arch == Arch::Mamba1) {
      xdbc = f32(c.dt_rank + 2 * c.d_state);
      dt = f32(c.d_inner);
    } else {
      y_normed = f32(c.d_inner);
    }
    y = f32(c.d_inner);
    mixer_out = f32(c.d_model);
    if (c.has_attention()) {
      q = f32(c.q_dim());
      k = f32(c.kv_dim());
      v = f32(c.kv_dim());
      attn = f32(c.q_dim());
    }
    if (c.mlp_size > 0) {
      mlp_h = f32(2 * c.mlp_size);
      mlp_act = f32(c.mlp_size);
    }
    if (c.family == Family::FalconH1) parallel_in = f32(c.d_model);
    if (c.moe.n_experts > 0) {
      moe_logits = f32(c.moe.n_experts);
      moe_ids = f32(c.moe.top_k);
      moe_weights = f32(c.moe.top_k);
      moe_hidden = f32(std::max(c.moe.shared_size, c.mlp_after_mixer ? 2 * c.mlp_size : int64_t{0}));
      moe_shared = f32(c.d_model);
      if (c.moe.latent_size > 0) {
        moe_latent_in = f32(c.moe.latent_size);
        moe_latent_out = f32(c.moe.latent_size);
      }
    }
    capacity = tokens;
    ++generation;
  }
  if (rows_of_logits > logit_rows) {
    logits = DeviceBuffer(backend, static_cast<size_t>(rows_of_logits * c.vocab_size) * 4);
    logit_rows = rows_of_logits;
    ++generation;
  }
}

}  // namespace mambacpp
