// The model's weights as views on the backend's device, bound by name from a checkpoint and checked for shape.
// Immutable after load. Shapes follow the stored (PyTorch) layouts.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "mambacpp/config.h"

namespace mambacpp {

struct LayerWeights {
  TensorView norm;          // [d_model] pre-norm of the block
  TensorView in_proj;       // [in_proj_size, d_model]
  TensorView in_proj_bias;  // [in_proj_size] or empty
  TensorView conv;          // [conv_channels, 1, d_conv]
  TensorView conv_bias;     // [conv_channels] or empty
  TensorView A_log;         // Mamba-1: [d_inner, d_state]; Mamba-2: [n_heads]
  TensorView D;             // Mamba-1: [d_inner]; Mamba-2: [n_heads]
  TensorView dt_bias;       // Mamba-1: dt_proj.bias [d_inner]; Mamba-2: [n_heads]
  TensorView out_proj;      // [d_model, d_inner]
  TensorView out_proj_bias; // [d_model] or empty
  // Mamba-1 only.
  TensorView x_proj;        // [dt_rank + 2 * d_state, d_inner]
  TensorView dt_proj;       // [d_inner, dt_rank]
  TensorView mixer_norm;    // FalconMamba: ones [max(dt_rank, d_state)], the weight of its weightless dt/B/C norms
  // Mamba-2 only.
  TensorView gated_norm;    // [d_inner]
};

struct ModelWeights {
  TensorView embeddings;  // [vocab_size, d_model]
  TensorView norm_f;      // [d_model]
  TensorView lm_head;     // [vocab_size, d_model] (the embeddings when tied)
  std::vector<LayerWeights> layers;
  std::shared_ptr<std::vector<float>> mixer_norm_host;  // FalconMamba: the ones behind mixer_norm (CPU uses them in place)
};

// Looks a tensor up by name in the checkpoint (nullptr when absent).
using TensorLookup = std::function<const TensorView*(const std::string&)>;

// Binds every tensor the config needs (transformers names; mamba_ssm's `backbone.embedding.weight` too), checks
// shapes and dtypes, reports tensors nobody asked for, and makes each weight usable on `backend`.
// `all_names` is every tensor in the checkpoint; `source` names the checkpoint in errors.
// `on_layer(done, n_layer)` (optional) is called after each layer is bound, for progress reports.
ModelWeights bind_weights(const ModelConfig& config, const TensorLookup& lookup, const std::vector<std::string>& all_names,
                          Backend& backend, const std::string& source,
                          const std::function<void(int64_t, int64_t)>& on_layer = {});

}  // namespace mambacpp
