// The layer recipes, written once against the backend ops: a layer is a pre-norm sublayer of its kind (Mamba-1 or
// Mamba-2 mixer, attention, MLP) and, where the family has one (mlp_after_mixer: Granite, Bamba), a second pre-norm
// MLP sublayer; each sublayer's output is scaled by residual_multiplier (1 outside Granite) and added to the residual
// stream.
#pragma once

#include "backend/backend.h"
#include "mambacpp/state.h"
#include "model/layer_stack.h"
#include "model/model_impl.h"

namespace mambacpp {

// residual [T, d_model] += layer `layer`'s sublayers on the piece; reads and updates the layer's cache entry (Mamba
// state, or KV rows: the caller has reserved the pages and advances the positions after the last layer).
void run_layer(const Model::Impl& m, int64_t layer, StateCache& state, const PieceContext& ctx, TensorView residual);

// The attention mixer, out [T, d_model] = attention(h [T, d_model]) over the KV pages of cache entry `li` (for
// recipes in other files). device_kv: positions and pages from the state's device mirror (decode steps).
void attention_mixer(const Model::Impl& m, const LayerWeights& w, StateCache::Impl& st, size_t li,
                     const BatchLayout& batch, const TensorView& h, TensorView out, bool device_kv);

}  // namespace mambacpp
