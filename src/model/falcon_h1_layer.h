// Falcon-H1's parallel layer (LayerKind::ParallelHybrid), written against the backend ops:
//   x = rmsnorm(h, input_layernorm)
//   h = h + mamba2(x * ssm_in_multiplier) * ssm_out_multiplier + attention(x * attn_in_multiplier) * attn_out_multiplier
//   h = h + mlp(rmsnorm(h, pre_ff_layernorm))
// with the muP multipliers of ModelConfig (in_proj's output scaled per [z | x | B | C | dt] slice, K scaled before
// RoPE, the MLP's gate before its SiLU and its output). The Mamba output is y * silu(z) (mamba_rms_norm false) or the
// per-group gated RMSNorm before or after the gate.
#pragma once

#include "backend/backend.h"
#include "mambacpp/state.h"
#include "model/layer_stack.h"
#include "model/model_impl.h"

namespace mambacpp {

// residual [T, d_model] += layer `layer` on the piece. The layer's Mamba state is cache entry 2 layer, its KV pages
// entry 2 layer + 1 (ModelConfig::cache_entries); the caller reserves the pages and advances the positions.
void falcon_h1_layer(const Model::Impl& m, int64_t layer, StateCache& state, const PieceContext& ctx,
                     TensorView residual);

}  // namespace mambacpp
