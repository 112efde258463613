// The model hyper-parameters, normalised from transformers' config.json ("mamba", "mamba2", "falcon_mamba", and the
// hybrids "nemotron_h", "granitemoehybrid", "bamba", "falcon_h1") or mamba_ssm's (d_model/n_layer/ssm_cfg). Everything the forward pass needs is resolved here once ("auto" ranks, defaults,
// derived sizes), so the model code never looks at JSON.
#pragma once

#include <cstdint>
#include <limits>
#include <string>
#include <vector>

namespace mambacpp {

enum class Arch : uint8_t { Mamba1, Mamba2 };
const char* arch_name(Arch a);  // "mamba" / "mamba2"

// What a model's layers are made of. The pure models are Family::Mamba: every layer one Mamba block of `arch`.
// The hybrids interleave Mamba-2 layers with attention (and, for Nemotron-H, MLP) layers; they differ in tensor
// names, in whether every layer carries a second (MLP) sublayer, and in the Mamba-2 gated norm's grouping.
// Falcon-H1 runs Mamba-2 and attention side by side in every layer (LayerKind::ParallelHybrid).
enum class Family : uint8_t { Mamba, NemotronH, GraniteHybrid, Bamba, FalconH1, Jamba };
const char* family_name(Family f);  // "mamba" / "nemotron_h" / "granitemoehybrid" / "bamba" / "falcon_h1" / "jamba"

// The mixer of one layer (the first sublayer: norm, mixer, residual add).
// ParallelHybrid (Falcon-H1): a Mamba-2 mixer and attention both read the layer's one normed input and their
// outputs are summed into the residual; its cache holds a Mamba state and KV pages side by side. MoE: a mixture of
// experts (Nemotron-H's E layers).
enum class LayerKind : uint8_t { Mamba1, Mamba2, Attention, MLP, ParallelHybrid, MoE };
const char* layer_kind_name(LayerKind k);  // "mamba1" / "mamba2" / "attention" / "mlp" / "parallel" / "moe"

// MLP activations: relu2 is down(relu(up(x))^2) (Nemotron-H); SiluGated is down(silu(gate(x)) * up(x)) (Granite's
// shared_mlp, Bamba's feed_forward).
enum class MlpAct : uint8_t { Relu2, SiluGated };

// Mixture-of-experts layers (config_moe.cpp). A token's router logits choose top_k of n_experts routed experts;
// their outputs, weighted, are summed beside the shared expert(s):
// - SigmoidGrouped (Nemotron-H): scores sigmoid(logits); the choice ranks scores + e_score_correction_bias, within
//   the topk_group of n_group expert groups whose two best biased scores sum highest; weights are the chosen scores,
//   divided by their sum when norm_topk_prob, times routed_scaling;
// - SoftmaxChosen (Granite-4.0-H): the top_k logits, softmax over those k;
// - SoftmaxAll (Jamba): softmax over all logits, the top_k probabilities as they are (no renormalisation).
// Ties go to the lower expert index (torch.topk on the CPU).
enum class MoeRouting : uint8_t { SigmoidGrouped, SoftmaxChosen, SoftmaxAll };
const char* moe_routing_name(MoeRouting r);  // "sigmoid_grouped" / "softmax_chosen" / "softmax_all"

struct MoeConfig {
  int64_t n_experts = 0;    // routed experts per MoE layer; 0: the model has none
  int64_t top_k = 0;        // experts per token
  int64_t expert_size = 0;  // intermediate width of one routed expert
  MlpAct act = MlpAct::Relu2;  // Relu2: down(relu(up x)^2) (Nemotron-H); SiluGated: down(silu(gate x) * up x)
  MoeRouting routing = MoeRouting::SoftmaxChosen;
  int64_t n_group = 1, topk_group = 1;  // SigmoidGrouped only
  bool norm_topk_prob = false;          // SigmoidGrouped only
  double routed_scaling = 1.0;          // SigmoidGrouped only
  // Nemotron-H's shared expert (a relu2 MLP with mlp_bias beside the routed ones); 0: none. Granite's shared
  // expert is its shared_mlp (mlp_size), Jamba has none.
  int64_t shared_size = 0;
  // Nemotron-H's moe_latent_size (Nemotron 3 Super): the routed experts run in this width, between fc1_latent_proj
  // [latent, d_model] and fc2_latent_proj [d_model, latent]; router and shared expert stay at d_model. 0: none.
  int64_t latent_size = 0;
};

struct ModelConfig {
  Arch arch = Arch::Mamba2;
  int64_t d_model = 0;     // hidden_size
  int64_t n_layer = 0;     // num_hidden_layers
  int64_t vocab_size = 0;  // rows of the embedding matrix (logits have one entry per row)
  int64_t d_state = 0;     // state_size
  int64_t d_conv = 4;      // conv_kernel
  int64_t d_inner = 0;     // expand * d_model (Mamba-2: num_heads * head_dim)
  double norm_eps = 1e-5;  // layer_norm_epsilon (block norms, norm_f, and Mamba-2's gated norm)
  bool use_bias = false;       // in_proj / out_proj bias
  bool use_conv_bias = true;
  bool residual_in_fp32 = true;
  bool tie_embeddings = true;  // lm_head shares the embedding matrix

  // Mamba-1 only.
  int64_t dt_rank = 0;  // time_step_rank ("auto" = ceil(d_model / 16))
  // FalconMamba (Mamba-1 with RMS norms, without weights, on dt, B and C after x_proj): their eps (mixer_rms_eps);
  // 0 for plain Mamba-1.
  double mixer_rms_eps = 0.0;

  // Mamba-2 only.
  int64_t n_heads = 0;
  int64_t head_dim = 0;
  int64_t n_groups = 1;
  int64_t chunk_size = 256;
  double dt_min = 0.0;  // time_step_limit; dt is clamped to [dt_min, dt_max] when finite
  double dt_max = std::numeric_limits<double>::infinity();

  // Hybrid models (Family != Mamba). `layers` names each layer's mixer; empty for the pure models, whose every layer
  // is a block of `arch`. The Mamba-2 fields above describe every Mamba-2 layer of a hybrid.
  Family family = Family::Mamba;
  std::vector<LayerKind> layers;
  bool mlp_after_mixer = false;  // every layer also has an MLP sublayer after its mixer (Granite, Bamba)
  // The Mamba-2 gated norm normalises over groups of d_inner / gated_norm_groups channels: n_groups for Mamba-2 and
  // Nemotron-H (mamba_ssm's per-group form), 1 for Granite-4.0-H and Bamba (their whole-d_inner RMSNorm).
  int64_t gated_norm_groups = 0;  // 0: n_groups
  // Attention layers: causal self-attention with n_kv_heads key/value heads shared by n_attn_heads / n_kv_heads
  // query heads each (GQA; MQA when 1).
  int64_t n_attn_heads = 0;
  int64_t n_kv_heads = 0;
  int64_t attn_head_dim = 0;
  bool attn_bias = false;      // q/k/v/o projection biases
  double attn_scale = 0.0;     // softmax scale of q.k; 0 means 1/sqrt(attn_head_dim)
  double rope_theta = 0.0;     // RoPE base; 0 means no position embedding (NoPE)
  int64_t rope_dim = 0;        // rotated leading channels of each head (partial rotary); rope_theta > 0 only
  // MLPs (MLP layers and the MLP sublayers).
  int64_t mlp_size = 0;        // intermediate size
  MlpAct mlp_act = MlpAct::Relu2;
  bool mlp_bias = false;
  // Granite's multipliers: inputs times embedding_multiplier, every sublayer's output times residual_multiplier
  // before its residual add, logits divided by logits_scaling.
  double embedding_multiplier = 1.0;
  double residual_multiplier = 1.0;
  double logits_scaling = 1.0;
  int64_t max_position = 0;    // max_position_embeddings where the model is bound to it (RoPE); 0: no limit
  // Falcon-H1's muP multipliers (1 elsewhere; embedding_multiplier above scales its inputs, logits_scaling is
  // 1 / lm_head_multiplier). Attention: input = normed * attn_in_multiplier, K = k_proj(.) * key_multiplier before
  // RoPE, output * attn_out_multiplier. Mamba-2: input = normed * ssm_in_multiplier, in_proj's output times
  // ssm_multipliers[i] over its [z | x | B | C | dt] slices, output * ssm_out_multiplier. MLP:
  // down(up(x) * silu(gate(x) * mlp_gate_multiplier)) * mlp_down_multiplier.
  double key_multiplier = 1.0;
  double attn_in_multiplier = 1.0;
  double attn_out_multiplier = 1.0;
  double ssm_in_multiplier = 1.0;
  double ssm_out_multiplier = 1.0;
  std::vector<double> ssm_multipliers;  // 5 values, or empty: all 1
  double mlp_gate_multiplier = 1.0;
  double mlp_down_multiplier = 1.0;
  // Falcon-H1's Mamba-2 output: mamba_rms_norm false is y * silu(z) with no norm (and no norm weight); true is the
  // per-group gated RMSNorm, applied after the gate (norm(y * silu(z)), as every other family) or, with
  // mamba_norm_before_gate, before it (norm(y) * silu(z)).
  bool mamba_rms_norm = true;
  bool mamba_norm_before_gate = false;
  bool mamba_out_proj_bias = false;  // Falcon-H1's projectors_bias: out_proj's bias (in_proj's is use_bias)
  // Mixture of experts: Nemotron-H's MoE layers (LayerKind::MoE), or the MLP sublayer of layers l with
  // l % moe_layer_period == moe_layer_offset (Granite-4.0-H MoE: every layer, period 1; Jamba: expert_layer_period
  // and expert_layer_offset); moe_layer_period 0: no MLP sublayer has experts.
  MoeConfig moe;
  int64_t moe_layer_period = 0;
  int64_t moe_layer_offset = 0;
  bool mlp_has_experts(int64_t l) const { return moe_layer_period > 0 && l % moe_layer_period == moe_layer_offset; }
  // Nemotron-H's multi-token-prediction layers (num_nextn_predict_layers): not part of the model's forward (their
  // tensors, mtp.*, are skipped by the model's loader); they are a draft source for speculative decoding
  // (model/mtp.h, --draft-mtp). mtp_layers: the kinds of the MTP block's layers (mtp_layers_block_type, or the legacy
  // mtp_hybrid_override_pattern; NemotronHConfig's default [attention, moe]); empty when mtp_layers_ignored is 0.
  int64_t mtp_layers_ignored = 0;
  std::vector<LayerKind> mtp_layers;

  bool hybrid() const { return family != Family::Mamba; }
  LayerKind layer_kind(int64_t l) const {
    return layers.empty() ? (arch == Arch::Mamba1 ? LayerKind::Mamba1 : LayerKind::Mamba2)
                          : layers[static_cast<size_t>(l)];
  }
  bool has_attention() const {
    for (LayerKind k : layers)
      if (k == LayerKind::Attention || k == LayerKind::ParallelHybrid) return true;
    return false;
  }
  // Entries of a state cache: one per layer; two per parallel layer (its Mamba state, then its KV pages).
  int64_t cache_entries() const {
    int64_t n = n_layer;
    for (LayerKind k : layers) n += k == LayerKind::ParallelHybrid;
    return n;
  }
  int64_t norm_groups() const { return gated_norm_groups > 0 ? gated_norm_groups : n_groups; }
  int64_t kv_dim() const { return n_kv_heads * attn_head_dim; }   // channels of one token's K (and of its V)
  int64_t q_dim() const { return n_attn_heads * attn_head_dim; }

  // Tokens (-1 when absent), in [0, 2^31). An id may lie past vocab_size (a tokenizer entry without an embedding
  // row): such an eos never stops generation and such a bos is never a prompt.
  int64_t bos_token_id = -1;
  int64_t eos_token_id = -1;
  int64_t pad_token_id = -1;
  // eos_token_id given as a list: its entries after the first, which stop generation too.
  std::vector<int64_t> extra_eos_token_ids;

  // Derived sizes.
  int64_t conv_channels() const {  // channels of conv1d
    return arch == Arch::Mamba1 ? d_inner : d_inner + 2 * n_groups * d_state;
  }
  int64_t in_proj_size() const {  // output features of in_proj
    return arch == Arch::Mamba1 ? 2 * d_inner : 2 * d_inner + 2 * n_groups * d_state + n_heads;
  }
  // Elements of one slot's SSM state for one layer.
  int64_t ssm_state_size() const { return d_inner * d_state; }
  // Elements of one slot's conv state for one layer: the last d_conv - 1 conv inputs per channel.
  int64_t conv_state_size() const { return conv_channels() * (d_conv - 1); }

  // Canonical JSON (our own field names); round-trips through parse_model_config().
  std::string to_json() const;
  // Throws mambacpp::Error naming the inconsistent field.
  void validate() const;

 private:
  void validate_hybrid() const;

 public:
};

// Parses config.json text as transformers or mamba_ssm write it: bare Infinity/-Infinity/NaN and
// {"__float__": "Infinity"} are accepted; strings that merely contain such words are left alone.
// `source` names the file in error messages. Rejects unsupported architectures and variants with a clear error.
ModelConfig parse_model_config(const std::string& json_text, const std::string& source = "config.json");

}  // namespace mambacpp
