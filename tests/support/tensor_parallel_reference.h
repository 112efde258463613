// Tensor parallelism simulated in one process: the N ranks' shards of a model (tensor_parallel.h) run one after
// another on the model's CPU backend, each rank computing its partial output of every sublayer, and the all-reduce
// done by summing the partials on the host (the vocab-parallel embedding by summing the ranks' rows, the
// vocab-parallel lm_head by concatenating their columns). It is the reference the multi-GPU (NCCL) runtime is checked
// against: the same shards and the same reductions, without a second device.
//
// One sequence from a fresh state, prefilled in one piece. Mamba-1 and Mamba-2 models, the hybrids of their layers
// with attention, MLP and mixture-of-experts layers (Nemotron-H and Granite-4.0-H, dense and MoE; Bamba; Jamba), and
// Falcon-H1 where its gated norm groups lie within the ranks. sublayer_partials does not take Falcon-H1's layers.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "mambacpp/model.h"
#include "model/tensor_parallel.h"

namespace mambacpp {

class SimulatedTensorParallel {
 public:
  // `model` on the CPU; it must outlive this object. Throws what plan_tensor_parallel throws.
  SimulatedTensorParallel(const Model& model, int64_t n_ranks);

  const TpPlan& plan() const { return plan_; }

  // Logits [ids.size(), vocab_size] of every position.
  std::vector<float> logits(std::span<const int32_t> ids) const;

  // One sublayer of `layer` on its normed input rows [T, d_model] as each rank computes it: rank r's partial output
  // [T, d_model] (before residual_multiplier). `mlp_sublayer`: the MLP after the mixer (mlp_after_mixer families).
  // Attention reads and appends to a fresh KV cache of its own, so rows are positions 0..T-1 of one sequence.
  std::vector<std::vector<float>> sublayer_partials(int64_t layer, bool mlp_sublayer,
                                                    const std::vector<float>& normed) const;

 private:
  std::vector<float> rank_sublayer(int64_t rank, int64_t layer, LayerKind kind, const std::vector<float>& normed) const;
  // A Mamba-2 layer whose gated norm spans the ranks (TpPlan::norm_all_reduce).
  std::vector<std::vector<float>> mamba2_whole_norm_partials(int64_t layer, const std::vector<float>& normed) const;
  // Falcon-H1's parallel layer, residual [T, d_model] updated: its Mamba, attention and MLP branches, each reduced.
  void falcon_h1_layer(int64_t layer, std::vector<float>& residual) const;
  // A Mamba-1 layer: x_proj's partial sums all-reduced before dt_proj and the scan.
  std::vector<std::vector<float>> mamba1_partials(int64_t layer, const std::vector<float>& normed) const;

  const Model& model_;
  TpPlan plan_;
  ModelConfig rank_config_;
  std::vector<std::vector<LayerShard>> shards_;    // [rank][layer]
  std::vector<VocabShard> embeddings_, lm_heads_;  // [rank]
};

}  // namespace mambacpp
