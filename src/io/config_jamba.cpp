// config.json of AI21's Jamba (transformers' JambaConfig, "jamba"): Mamba-1 mixers whose dt, B and C are
// RMS-normalised with weights (dt_layernorm, b_layernorm, c_layernorm), causal NoPE attention every
// attn_layer_period layers from attn_layer_offset, and after every mixer an MLP sublayer: mixture of experts every
// expert_layer_period layers from expert_layer_offset (softmax over all experts, top-k, no renormalisation), a dense
// SwiGLU MLP elsewhere. Defaults are JambaConfig's.
#include <string>

#include <nlohmann/json.hpp>

#include "io/config_formats.h"
#include "io/config_reader.h"
#include "mambacpp/error.h"

namespace mambacpp {

ModelConfig parse_transformers_jamba(const nlohmann::json& j, const std::string& source) {
  const ConfigReader r(j, source);
  if (const nlohmann::json* archs = r.get("architectures")) {
    bool ok = archs->is_array();
    if (ok) {
      ok = false;
      for (const auto& a : *archs) ok |= a == "JambaForCausalLM" || a == "JambaModel";
    }
    if (!ok) r.reject_value("architectures", *archs, "expected JambaForCausalLM; other architectures are not supported");
  }
  ModelConfig c;
  c.family = Family::Jamba;
  c.arch = Arch::Mamba1;
  c.d_model = r.positive_int_or("hidden_size", 4096);
  c.vocab_size = r.positive_int_or("vocab_size", 65536);
  c.tie_embeddings = r.bool_or("tie_word_embeddings", false);
  c.residual_in_fp32 = true;
  read_token_ids(r, c);
  c.n_layer = r.layer_count("num_hidden_layers");
  c.norm_eps = r.number_or("rms_norm_eps", 1e-6);
  if (!(c.norm_eps > 0)) r.reject_value("rms_norm_eps", nlohmann::json(c.norm_eps), "expected a positive number");
  const std::string act = r.string_or("hidden_act", "silu");
  if (act != "silu" && act != "swish") r.reject_value("hidden_act", nlohmann::json(act), "only \"silu\" is supported");

  // Mamba-1 mixers; dt, B and C normalised with weights, eps rms_norm_eps.
  c.d_state = r.positive_int_or("mamba_d_state", 16);
  c.d_conv = r.positive_int_or("mamba_d_conv", 4);
  c.d_inner = r.positive_int_or("mamba_expand", 2) * c.d_model;
  const nlohmann::json* rank = r.get("mamba_dt_rank");
  c.dt_rank = !rank || (rank->is_string() && *rank == "auto") ? (c.d_model + 15) / 16 : r.positive_int("mamba_dt_rank");
  c.use_conv_bias = r.bool_or("mamba_conv_bias", true);
  c.use_bias = r.bool_or("mamba_proj_bias", false);
  c.mixer_rms_eps = c.norm_eps;

  // Attention: head_dim = hidden_size / heads, no biases, no position embedding, scale 1/sqrt(head_dim).
  c.n_attn_heads = r.positive_int_or("num_attention_heads", 32);
  c.n_kv_heads = r.positive_int_or("num_key_value_heads", 8);
  if (c.n_attn_heads % c.n_kv_heads != 0)
    r.reject_value("num_key_value_heads", nlohmann::json(c.n_kv_heads),
                   "num_attention_heads = " + std::to_string(c.n_attn_heads) + " is not a multiple of it");
  if (c.d_model % c.n_attn_heads != 0)
    r.reject_value("num_attention_heads", nlohmann::json(c.n_attn_heads),
                   "hidden_size = " + std::to_string(c.d_model) + " is not a multiple of it");
  c.attn_head_dim = c.d_model / c.n_attn_heads;
  if (const nlohmann::json* w = r.get("sliding_window"))
    r.reject_value("sliding_window", *w, "sliding-window attention is not supported");
  const int64_t attn_period = r.positive_int_or("attn_layer_period", 8);
  const int64_t attn_offset = r.int_or("attn_layer_offset", 4);
  if (attn_offset < 0 || attn_offset >= attn_period)
    r.reject_value("attn_layer_offset", nlohmann::json(attn_offset),
                   "expected in [0, attn_layer_period = " + std::to_string(attn_period) + ")");
  for (int64_t l = 0; l < c.n_layer; ++l)
    c.layers.push_back(l % attn_period == attn_offset ? LayerKind::Attention : LayerKind::Mamba1);

  // The MLP sublayer: SwiGLU (gate_proj, up_proj, down_proj) of intermediate_size, dense or as experts.
  c.mlp_after_mixer = true;
  c.mlp_size = r.positive_int_or("intermediate_size", 14336);
  c.mlp_act = MlpAct::SiluGated;
  const int64_t experts = r.positive_int_or("num_experts", 16);
  const int64_t expert_period = r.positive_int_or("expert_layer_period", 2);
  const int64_t expert_offset = r.int_or("expert_layer_offset", 1);
  if (expert_offset < 0 || expert_offset >= expert_period)
    r.reject_value("expert_layer_offset", nlohmann::json(expert_offset),
                   "expected in [0, expert_layer_period = " + std::to_string(expert_period) + ")");
  if (experts > 1) {  // JambaConfig.layers_num_experts: experts where l % period == offset, one (dense) elsewhere
    MoeConfig& m = c.moe;
    m.n_experts = experts;
    m.top_k = r.positive_int_or("num_experts_per_tok", 2);
    if (m.top_k > experts)
      r.reject_value("num_experts_per_tok", nlohmann::json(m.top_k),
                     "more experts per token than the " + std::to_string(experts) + " experts");
    m.expert_size = c.mlp_size;
    m.routing = MoeRouting::SoftmaxAll;
    m.act = MlpAct::SiluGated;
    c.moe_layer_period = expert_period;
    c.moe_layer_offset = expert_offset;
  }
  return c;
}

}  // namespace mambacpp
