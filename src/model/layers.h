// The layer recipes of the hybrid models, written once against the backend ops: a layer is a pre-norm sublayer
// (Mamba-2 mixer, attention or MLP) and, where the family has one (mlp_after_mixer), a second pre-norm MLP
// sublayer; each sublayer's output is scaled by residual_multiplier and added to the residual stream.
// The pure Mamba models keep their one-sublayer blocks (run_block in model.cpp).
#pragma once

#include "backend/backend.h"
#include "mambacpp/state.h"
#include "model/model_impl.h"

namespace mambacpp {

// residual [T, d_model] += the layer's sublayers on the packed batch; reads and updates the layer's cache entry
// (Mamba state, or KV rows: the caller has grown the pages and advances positions after the last layer).
// device_kv: attention reads the KV positions and page tables from the state's device mirror
// (StateCache::Impl::sync_device_kv, called by the caller first), so that the work can be captured as a graph.
void run_hybrid_layer(const Model::Impl& m, int64_t layer, StateCache& state, const BatchLayout& batch,
                      TensorView residual, bool device_kv = false);

// The MLP sublayer alone (the second sublayer of a mlp_after_mixer family): residual += mlp(rmsnorm(residual)),
// scaled by residual_multiplier.
void run_mlp_sublayer(const Model::Impl& m, int64_t layer, int64_t T, TensorView residual);

}  // namespace mambacpp
