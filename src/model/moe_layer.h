// Mixture-of-experts sublayers: Nemotron-H's MoE layers (LayerKind::MoE: routed relu2 experts beside a shared relu2
// expert; with moe_latent_size the routed experts run in a narrower latent width between two linears) and
// Granite-4.0-H's MLP sublayer with experts (routed SwiGLU experts beside the shared_mlp). The router runs in f32 (the
// backend's linear widens its weight exactly, as transformers' .float() does), then Backend::moe_route and
// Backend::moe_experts; the shared expert's output is added to the routed ones, and the sum, scaled by
// residual_multiplier, to the residual stream.
#pragma once

#include <functional>
#include <initializer_list>
#include <memory>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "core/weight.h"
#include "mambacpp/config.h"
#include "model/layer_stack.h"
#include "model/model_impl.h"

namespace mambacpp {

struct MoeWeights {
  Weight router;             // [E, d_model] (Nemotron-H's gate.weight, Granite's router.layer.weight)
  TensorView score_bias;     // [E] Nemotron-H's e_score_correction_bias (f32), or empty
  // One 2-D weight per routed expert: from per-expert checkpoint tensors, or the rows(e, 1) of a fused [E, out, in].
  std::vector<Weight> up;    // relu2: [I, d_model]; SwiGLU: [2 I, d_model] gate rows then up rows, or [I, d_model]
  std::vector<Weight> gate;  // SwiGLU with separate gate_proj tensors: [I, d_model]; else empty
  std::vector<Weight> down;  // [d_model, I]
  // Nemotron-H's shared expert (relu2, biases per mlp_bias); Granite's is the layer's shared_mlp (LayerWeights).
  Weight shared_up;          // [shared_size, d_model] or empty
  Weight shared_down;        // [d_model, shared_size]
  TensorView shared_up_bias, shared_down_bias;
  // Nemotron-H's latent MoE (moe_latent_size L): the routed experts' input fc1_latent_proj(x) and their weighted sum
  // through fc2_latent_proj (both with biases per mlp_bias); up is then [I, L] and down [L, I]. Empty: none.
  Weight latent_in;          // fc1_latent_proj [L, d_model]
  Weight latent_out;         // fc2_latent_proj [d_model, L]
  TensorView latent_in_bias, latent_out_bias;  // [L], [d_model] or empty
};

// How bind_moe reaches the checkpoint (weights.cpp's binder): a matrix or dense tensor of exactly that shape (a
// missing one is an error naming it), and whether a tensor of that name exists (false while recording shapes).
struct MoeBinder {
  std::function<Weight(const std::string&, std::initializer_list<int64_t>)> matrix;
  std::function<TensorView(const std::string&, std::initializer_list<int64_t>)> tensor;
  std::function<bool(const std::string&)> has;
};

// The MoE weights under `prefix` (Nemotron-H: "<layer>.mixer.", Granite: "<layer>.block_sparse_moe."). Experts are
// read per expert when the checkpoint holds "<prefix>experts.0.up_proj.weight", else as fused 3-D tensors.
std::shared_ptr<const MoeWeights> bind_moe(const MoeBinder& b, const ModelConfig& c, const std::string& prefix);

// Bytes of every weight of the MoE (all experts, router, shared expert and latent projections), and of the routed
// experts alone.
int64_t moe_weight_bytes(const MoeWeights& w);
int64_t moe_expert_bytes(const MoeWeights& w);

// residual += residual_multiplier * (routed experts + shared expert)(rmsnorm(residual) * norm).
void moe_sublayer(const Model::Impl& m, const LayerWeights& w, const TensorView& norm, const PieceContext& ctx,
                  TensorView residual);

}  // namespace mambacpp
