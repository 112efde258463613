// The model's weights as views on the backend's device, bound by name from a checkpoint and checked for shape.
// Immutable after load. Shapes follow the stored (PyTorch) layouts.
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "backend/backend.h"
#include "core/weight.h"
#include "mambacpp/config.h"

namespace mambacpp {

struct MoeWeights;  // model/moe_layer.h

struct LayerWeights {
  TensorView norm;          // [d_model] pre-norm of the block
  Weight in_proj;           // [in_proj_size, d_model]
  TensorView in_proj_bias;  // [in_proj_size] or empty
  TensorView conv;          // [conv_channels, 1, d_conv]
  TensorView conv_bias;     // [conv_channels] or empty
  TensorView A_log;         // Mamba-1: [d_inner, d_state]; Mamba-2: [n_heads]
  TensorView D;             // Mamba-1: [d_inner]; Mamba-2: [n_heads]
  TensorView dt_bias;       // Mamba-1: dt_proj.bias [d_inner]; Mamba-2: [n_heads]
  Weight out_proj;          // [d_model, d_inner]
  TensorView out_proj_bias; // [d_model] or empty
  // Mamba-1 only.
  Weight x_proj;            // [dt_rank + 2 * d_state, d_inner]
  Weight dt_proj;           // [d_inner, dt_rank]
  TensorView mixer_norm;    // FalconMamba: ones [max(dt_rank, d_state)], the weight of its weightless dt/B/C norms
  TensorView dt_norm, b_norm, c_norm;  // Jamba: the weights of its dt [dt_rank], B and C [d_state] RMSNorms
  // Mamba-2 only.
  TensorView gated_norm;    // [d_inner]

  // Hybrid models. `norm` above is the pre-norm of the layer's mixer, whatever its kind.
  LayerKind kind = LayerKind::Mamba2;
  // Attention.
  Weight q_proj;            // [n_attn_heads * attn_head_dim, d_model]
  Weight k_proj;            // [n_kv_heads * attn_head_dim, d_model]
  Weight v_proj;            // [n_kv_heads * attn_head_dim, d_model]
  Weight o_proj;            // [d_model, n_attn_heads * attn_head_dim]
  TensorView q_bias, k_bias, v_bias, o_bias;  // [rows of the projection] or empty
  // MLP: the MLP layer's weights (Nemotron-H) or the MLP sublayer's (mlp_after_mixer: Granite, Bamba).
  TensorView mlp_norm;      // [d_model] pre-norm of the MLP sublayer (mlp_after_mixer only)
  Weight mlp_up;            // relu2: [mlp_size, d_model]; gated: [2 mlp_size, d_model] gate rows then up rows
                            // (Granite's input_linear), or [mlp_size, d_model] up rows beside mlp_gate (Bamba)
  Weight mlp_gate;          // gated with separate projections (Bamba's gate_proj): [mlp_size, d_model]; else empty
  Weight mlp_down;          // [d_model, mlp_size]
  TensorView mlp_up_bias;   // [mlp_size] or empty
  TensorView mlp_down_bias; // [d_model] or empty
  TensorView mlp_gate_bias; // [mlp_size] or empty (Falcon-H1's gate_proj with mlp_bias)
  // Mixture of experts: a MoE layer's experts (LayerKind::MoE), or those of the MLP sublayer (mlp_has_experts).
  std::shared_ptr<const MoeWeights> moe;
};

struct ModelWeights {
  Weight embeddings;      // [vocab_size, d_model]
  TensorView norm_f;      // [d_model]
  Weight lm_head;         // [vocab_size, d_model] (the embeddings when tied)
  std::vector<LayerWeights> layers;
  std::shared_ptr<std::vector<float>> mixer_norm_host;  // FalconMamba: the ones behind mixer_norm (CPU uses them in place)
};

// The name and shape of every tensor a hybrid config's checkpoint holds, as bind_weights binds them (transformers 5
// names), for Model::random.
using WeightShapes = std::vector<std::pair<std::string, std::vector<int64_t>>>;
WeightShapes hybrid_weight_shapes(const ModelConfig& config);

// Looks a tensor up by name in the checkpoint, in its stored format (nullopt when absent).
using TensorLookup = std::function<std::optional<Weight>(const std::string&)>;
// A lookup over dense views (safetensors, .bin, random weights): a tensor of another dtype than f32/f16/bf16 is an
// error naming it and `source`.
TensorLookup lookup_views(std::function<const TensorView*(const std::string&)> find, const std::string& source);

// Binds every tensor the config needs (transformers names of the pure models and of the hybrid families; mamba_ssm's `backbone.embedding.weight` too), checks
// shapes and dtypes, reports tensors nobody asked for, and makes each weight usable on `backend`.
// `all_names` is every tensor in the checkpoint; `source` names the checkpoint in errors.
// `on_layer(done, n_layer)` (optional) is called after each layer is bound, for progress reports.
ModelWeights bind_weights(const ModelConfig& config, const TensorLookup& lookup, const std::vector<std::string>& all_names,
                          Backend& backend, const std::string& source,
                          const std::function<void(int64_t, int64_t)>& on_layer = {});

}  // namespace mambacpp
