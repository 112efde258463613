// The Mamba-1 and Mamba-2 mixers (one block's token mixing), written once against the backend ops.
// Input `h` is the normed hidden state [T, d_model]; output `out` is [T, d_model]; the layer's conv and SSM state
// (all slots) is read and updated per the sequences of `batch`.
#pragma once

#include "backend/backend.h"
#include "mambacpp/config.h"
#include "mambacpp/state.h"
#include "model/weights.h"
#include "model/workspace.h"

namespace mambacpp {

void mamba1_mixer(Backend& be, const ModelConfig& c, const LayerWeights& w, const LayerCache& cache,
                  const BatchLayout& batch, Workspace& ws, const TensorView& h, TensorView out);

void mamba2_mixer(Backend& be, const ModelConfig& c, const LayerWeights& w, const LayerCache& cache,
                  const BatchLayout& batch, Workspace& ws, const TensorView& h, TensorView out);

}  // namespace mambacpp
