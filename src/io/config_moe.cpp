// The mixture-of-experts part of config.json (Nemotron-H's MoE layers, Granite-4.0-H's block_sparse_moe), its
// canonical JSON form, and its consistency checks. Defaults are those of the transformers classes.
#include <cmath>
#include <string>

#include <nlohmann/json.hpp>

#include "io/config_formats.h"
#include "io/config_reader.h"
#include "mambacpp/error.h"

namespace mambacpp {

const char* moe_routing_name(MoeRouting r) {
  switch (r) {
    case MoeRouting::SigmoidGrouped: return "sigmoid_grouped";
    case MoeRouting::SoftmaxChosen: return "softmax_chosen";
    case MoeRouting::SoftmaxAll: return "softmax_all";
  }
  return "?";
}

namespace {

int64_t experts_key(const ConfigReader& r, std::initializer_list<const char*> keys, int64_t fallback) {
  for (const char* k : keys)
    if (r.has(k)) return r.positive_int(k);
  return fallback;
}

void check_top_k(const ConfigReader& r, const MoeConfig& m) {
  if (m.top_k > m.n_experts)
    r.reject_value("num_experts_per_tok", nlohmann::json(m.top_k),
                   "more experts per token than the " + std::to_string(m.n_experts) + " experts");
}

}  // namespace

void read_nemotron_moe(const ConfigReader& r, ModelConfig& c) {
  MoeConfig& m = c.moe;
  m.routing = MoeRouting::SigmoidGrouped;
  m.act = MlpAct::Relu2;  // NemotronHExperts use mlp_hidden_act, which the dense MLP check holds to relu2
  // NemotronHConfig maps num_local_experts to n_routed_experts.
  m.n_experts = experts_key(r, {"n_routed_experts", "num_local_experts"}, 8);
  m.top_k = r.positive_int_or("num_experts_per_tok", 2);
  check_top_k(r, m);
  m.expert_size = r.positive_int_or("moe_intermediate_size", 7688);
  // transformers builds one shared expert of moe_shared_expert_intermediate_size whatever n_shared_experts says.
  m.shared_size = r.positive_int_or("moe_shared_expert_intermediate_size", 7688);
  m.n_group = r.positive_int_or("n_group", 1);
  m.topk_group = r.positive_int_or("topk_group", 1);
  if (m.n_experts % m.n_group != 0)
    r.reject_value("n_group", nlohmann::json(m.n_group),
                   "does not divide n_routed_experts = " + std::to_string(m.n_experts));
  if (m.n_group > 1 && m.n_experts / m.n_group < 2)
    r.reject_value("n_group", nlohmann::json(m.n_group),
                   "leaves fewer than 2 experts per group (a group's score is the sum of its best two)");
  if (m.topk_group > m.n_group)
    r.reject_value("topk_group", nlohmann::json(m.topk_group), "exceeds n_group = " + std::to_string(m.n_group));
  if (m.top_k > m.topk_group * (m.n_experts / m.n_group))
    r.reject_value("num_experts_per_tok", nlohmann::json(m.top_k),
                   "exceeds the experts of the topk_group groups a token may choose from");
  m.norm_topk_prob = r.bool_or("norm_topk_prob", true);
  m.routed_scaling = r.number_or("routed_scaling_factor", 1.0);
  if (!std::isfinite(m.routed_scaling) || m.routed_scaling == 0)
    r.reject_value("routed_scaling_factor", nlohmann::json(m.routed_scaling), "expected a finite non-zero number");
  // Nemotron 3 Super's latent experts; null (what the other configs write) means none.
  if (r.get("moe_latent_size")) {
    m.latent_size = r.positive_int("moe_latent_size");
    if (m.latent_size > c.d_model)
      r.reject_value("moe_latent_size", nlohmann::json(m.latent_size),
                     "exceeds hidden_size = " + std::to_string(c.d_model) + " (the latent is a projection down)");
  }
}

void read_granite_moe(const ConfigReader& r, ModelConfig& c, int64_t experts) {
  MoeConfig& m = c.moe;
  m.routing = MoeRouting::SoftmaxChosen;
  m.act = MlpAct::SiluGated;  // input_linear [E, 2 I, D]: gate rows then up rows
  m.n_experts = experts;
  m.top_k = r.positive_int_or("num_experts_per_tok", 2);
  check_top_k(r, m);
  m.expert_size = r.positive_int_or("intermediate_size", 1024);
  c.moe_layer_period = 1;  // every layer's MLP sublayer
  c.moe_layer_offset = 0;
}

void moe_to_json(const ModelConfig& c, nlohmann::ordered_json& j) {
  if (c.moe.n_experts == 0 && c.mtp_layers_ignored == 0) return;  // configs without experts: unchanged form
  const MoeConfig& m = c.moe;
  nlohmann::ordered_json o;
  o["n_experts"] = m.n_experts;
  o["top_k"] = m.top_k;
  o["expert_size"] = m.expert_size;
  o["act"] = m.act == MlpAct::Relu2 ? "relu2" : "silu_gated";
  o["routing"] = moe_routing_name(m.routing);
  o["n_group"] = m.n_group;
  o["topk_group"] = m.topk_group;
  o["norm_topk_prob"] = m.norm_topk_prob;
  o["routed_scaling"] = m.routed_scaling;
  o["shared_size"] = m.shared_size;
  if (m.latent_size > 0) o["latent_size"] = m.latent_size;  // absent: the form of configs without it is unchanged
  o["layer_period"] = c.moe_layer_period;
  o["layer_offset"] = c.moe_layer_offset;
  o["mtp_layers_ignored"] = c.mtp_layers_ignored;
  if (!c.mtp_layers.empty()) {  // the MTP block's layer kinds, as a Nemotron-H pattern string
    std::string pattern;
    for (LayerKind k : c.mtp_layers)
      pattern += k == LayerKind::Mamba2 ? 'M' : k == LayerKind::Attention ? '*' : k == LayerKind::MLP ? '-' : 'E';
    o["mtp_layers"] = pattern;
  }
  j["moe"] = o;
}

void parse_canonical_moe(const nlohmann::json& j, const std::string& source, ModelConfig& c) {
  const nlohmann::json* o = j.contains("moe") ? &j["moe"] : nullptr;
  if (!o) return;
  if (!o->is_object()) fail(source, ": moe must be an object");
  const ConfigReader r(*o, source, "moe.");
  MoeConfig& m = c.moe;
  m.n_experts = r.int_or("n_experts", 0);
  m.top_k = r.int_or("top_k", 0);
  m.expert_size = r.int_or("expert_size", 0);
  const std::string act = r.string_or("act", "relu2");
  if (act == "relu2") m.act = MlpAct::Relu2;
  else if (act == "silu_gated") m.act = MlpAct::SiluGated;
  else r.reject_value("act", nlohmann::json(act), "expected \"relu2\" or \"silu_gated\"");
  const std::string routing = r.string_or("routing", "softmax_chosen");
  if (routing == "sigmoid_grouped") m.routing = MoeRouting::SigmoidGrouped;
  else if (routing == "softmax_chosen") m.routing = MoeRouting::SoftmaxChosen;
  else if (routing == "softmax_all") m.routing = MoeRouting::SoftmaxAll;
  else r.reject_value("routing", nlohmann::json(routing), "expected sigmoid_grouped, softmax_chosen or softmax_all");
  m.n_group = r.int_or("n_group", 1);
  m.topk_group = r.int_or("topk_group", 1);
  m.norm_topk_prob = r.bool_or("norm_topk_prob", false);
  m.routed_scaling = r.number_or("routed_scaling", 1.0);
  m.shared_size = r.int_or("shared_size", 0);
  m.latent_size = r.int_or("latent_size", 0);
  c.moe_layer_period = r.int_or("layer_period", 0);
  c.moe_layer_offset = r.int_or("layer_offset", 0);
  c.mtp_layers_ignored = r.int_or("mtp_layers_ignored", 0);
  c.mtp_layers.clear();
  for (char ch : r.string_or("mtp_layers", "")) {
    if (ch == 'M') c.mtp_layers.push_back(LayerKind::Mamba2);
    else if (ch == '*') c.mtp_layers.push_back(LayerKind::Attention);
    else if (ch == '-') c.mtp_layers.push_back(LayerKind::MLP);
    else if (ch == 'E') c.mtp_layers.push_back(LayerKind::MoE);
    else r.reject_value("mtp_layers", nlohmann::json(r.string_or("mtp_layers", "")), "expected M, *, - or E a layer");
  }
}

void validate_moe(const ModelConfig& c) {
  if (c.moe_layer_period < 0 || (c.moe_layer_period > 0 && (c.moe_layer_offset < 0 ||
                                                              c.moe_layer_offset >= c.moe_layer_period)))
    fail("model config: moe.layer_offset = ", c.moe_layer_offset, " outside [0, moe.layer_period = ",
         c.moe_layer_period, ")");
  bool moe_layers = false;
  for (int64_t l = 0; l < c.n_layer; ++l) moe_layers |= c.mlp_has_experts(l) || c.layer_kind(l) == LayerKind::MoE;
  const MoeConfig& m = c.moe;
  if (!moe_layers) {
    if (m.n_experts != 0) fail("model config: moe.n_experts = ", m.n_experts, " but no layer has experts");
    return;
  }
  if (c.moe_layer_period > 0 && !c.mlp_after_mixer)
    fail("model config: experts in the MLP sublayer need mlp_after_mixer");
  auto size = [](const char* field, int64_t v) {
    if (v < 1 || v > kMaxConfigDim) fail("model config: moe.", field, " = ", v, ", expected in [1, 2^30]");
  };
  size("n_experts", m.n_experts);
  size("top_k", m.top_k);
  size("expert_size", m.expert_size);
  size("n_group", m.n_group);
  size("topk_group", m.topk_group);
  if (m.n_experts > 65536) fail("model config: moe.n_experts = ", m.n_experts, ", expected at most 65536");
  if (m.top_k > m.n_experts)
    fail("model config: moe.top_k = ", m.top_k, " exceeds moe.n_experts = ", m.n_experts);
  if (m.n_experts % m.n_group != 0 || m.topk_group > m.n_group ||
      (m.n_group > 1 && m.n_experts / m.n_group < 2) || m.top_k > m.topk_group * (m.n_experts / m.n_group))
    fail("model config: moe groups (n_group ", m.n_group, ", topk_group ", m.topk_group, ") do not fit ",
         m.n_experts, " experts with top_k ", m.top_k);
  if (!std::isfinite(m.routed_scaling) || m.routed_scaling == 0)
    fail("model config: moe.routed_scaling = ", m.routed_scaling, ", expected finite and non-zero");
  if (m.shared_size < 0 || m.shared_size > kMaxConfigDim)
    fail("model config: moe.shared_size = ", m.shared_size, ", expected in [0, 2^30]");
  if (m.latent_size < 0 || m.latent_size > c.d_model)
    fail("model config: moe.latent_size = ", m.latent_size, ", expected in [0, d_model = ", c.d_model, "]");
  if (m.latent_size > 0 && c.family != Family::NemotronH)
    fail("model config: moe.latent_size = ", m.latent_size, " but ", family_name(c.family),
         " has no latent expert projections (Nemotron-H's moe_latent_size)");
}

}  // namespace mambacpp
