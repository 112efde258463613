// config.json of the hybrid families as transformers 5.x writes them: NemotronHConfig ("nemotron_h"),
// GraniteMoeHybridConfig ("granitemoehybrid"; its experts in config_moe.cpp) and BambaConfig ("bamba"). Defaults are those of the
// transformers classes. Variants the forward pass does not implement (parallel layers, rope scaling,
// sliding windows, other activations) are rejected here, naming the key and the value found.
#include <algorithm>
#include <cmath>
#include <limits>
#include <string>

#include "io/config_formats.h"
#include "io/config_hybrid_keys.h"
#include "io/config_reader.h"
#include "mambacpp/error.h"
#include "core/json_limits.h"

namespace mambacpp {

void check_architecture(const ConfigReader& r, const std::string& expected) {
  const nlohmann::json* archs = r.get("architectures");
  if (!archs) return;
  if (!archs->is_array()) r.reject_value("architectures", *archs, "expected a list of class names");
  for (const auto& a : *archs)
    if (a.is_string() && (a == expected || a == expected.substr(0, expected.find("ForCausalLM")) + "Model")) return;
  r.reject_value("architectures", *archs, "expected " + expected + "; other architectures are not supported");
}

double positive_number(const ConfigReader& r, const std::string& key, double fallback) {
  const double v = r.number_or(key, fallback);
  if (!(v > 0) || !std::isfinite(v)) r.reject_value(key, nlohmann::json(v), "expected a positive finite number");
  return v;
}

double nonzero_number(const ConfigReader& r, const std::string& key, double fallback) {
  const double v = r.number_or(key, fallback);
  if (v == 0 || !std::isfinite(v)) r.reject_value(key, nlohmann::json(v), "expected a finite non-zero number");
  return v;
}

// The first key present of `keys` (transformers renamed several Mamba keys; configs on the Hub use both spellings).
std::string first_key(const ConfigReader& r, std::initializer_list<const char*> keys) {
  for (const char* k : keys)
    if (r.has(k)) return k;
  return *keys.begin();
}

void read_dt_limit(const ConfigReader& r, const std::string& key, ModelConfig& c) {
  c.dt_min = 0.0;
  c.dt_max = std::numeric_limits<double>::infinity();
  const nlohmann::json* v = r.get(key);
  if (!v) return;
  if (!v->is_array() || v->size() != 2 || !(*v)[0].is_number() || !(*v)[1].is_number())
    r.reject_value(key, *v, "expected [lo, hi] with two numbers");
  const double lo = (*v)[0].get<double>(), hi = (*v)[1].get<double>();
  if (!(lo >= 0) || !(hi >= lo) || std::isinf(lo)) r.reject_value(key, *v, "expected 0 <= lo <= hi (hi may be Infinity)");
  c.dt_min = lo;
  c.dt_max = hi;
}

void check_activation(const ConfigReader& r, const std::string& key, const std::string& fallback,
                      const std::string& expected) {
  const std::string act = r.string_or(key, fallback);
  if (act != expected && !(expected == "silu" && act == "swish"))
    r.reject_value(key, nlohmann::json(act), "only \"" + expected + "\" is supported");
}

// Attention heads: num_attention_heads, num_key_value_heads (null: the same), and a head_dim (null or absent:
// hidden_size / num_attention_heads, which must then divide).
void read_attention(const ConfigReader& r, ModelConfig& c, bool head_dim_key, int64_t default_heads,
                    int64_t default_kv, int64_t default_head_dim) {
  c.n_attn_heads = r.positive_int_or("num_attention_heads", default_heads);
  c.n_kv_heads = r.has("num_key_value_heads") ? r.positive_int("num_key_value_heads")
                                              : (default_kv > 0 ? default_kv : c.n_attn_heads);
  if (c.n_attn_heads % c.n_kv_heads != 0)
    r.reject_value("num_key_value_heads", nlohmann::json(c.n_kv_heads),
                   "num_attention_heads = " + std::to_string(c.n_attn_heads) + " is not a multiple of it");
  if (head_dim_key && (r.has("head_dim") || default_head_dim > 0)) {
    c.attn_head_dim = r.positive_int_or("head_dim", default_head_dim);
  } else {
    if (c.d_model % c.n_attn_heads != 0)
      r.reject_value("num_attention_heads", nlohmann::json(c.n_attn_heads),
                     "hidden_size = " + std::to_string(c.d_model) + " is not a multiple of it (head_dim = hidden_size / heads)");
    c.attn_head_dim = c.d_model / c.n_attn_heads;
  }
  if (r.get("sliding_window")) r.reject_value("sliding_window", *r.get("sliding_window"), "sliding-window attention is not supported");
}

// RoPE parameters: rope_parameters {rope_type, rope_theta, partial_rotary_factor} (transformers 5) or the older
// top-level rope_theta / rope_scaling / partial_rotary_factor. Only the plain ("default") rotation is implemented.
void read_rope(const ConfigReader& r, ModelConfig& c, double default_factor) {
  static const nlohmann::json kEmpty = nlohmann::json::object();
  const nlohmann::json* params = r.get("rope_parameters");
  if (params && !params->is_object()) r.reject_value("rope_parameters", *params, "expected an object");
  const ConfigReader p(params ? *params : kEmpty, r.source(), "rope_parameters.");
  const std::string type = p.string_or("rope_type", p.string_or("type", "default"));
  if (type != "default") p.reject_value("rope_type", nlohmann::json(type), "only the default RoPE (no scaling) is supported");
  if (const nlohmann::json* s = r.get("rope_scaling")) r.reject_value("rope_scaling", *s, "RoPE scaling is not supported");
  c.rope_theta = p.has("rope_theta") ? positive_number(p, "rope_theta", 1e4) : positive_number(r, "rope_theta", 1e4);
  const double factor = p.has("partial_rotary_factor") ? p.number_or("partial_rotary_factor", default_factor)
                                                       : r.number_or("partial_rotary_factor", default_factor);
  if (!(factor > 0 && factor <= 1))
    r.reject_value("partial_rotary_factor", nlohmann::json(factor), "expected a number in (0, 1]");
  c.rope_dim = static_cast<int64_t>(static_cast<double>(c.attn_head_dim) * factor);  // int(head_dim * factor)
  if (c.rope_dim < 2 || c.rope_dim % 2 != 0)
    r.reject_value("partial_rotary_factor", nlohmann::json(factor),
                   "gives " + std::to_string(c.rope_dim) + " rotated channels of head_dim " +
                       std::to_string(c.attn_head_dim) + "; expected an even number >= 2");
}

namespace {

// The mamba_* keys GraniteMoeHybridConfig and BambaConfig share.
void read_mamba_prefixed(const ConfigReader& r, ModelConfig& c) {
  c.d_state = r.positive_int_or("mamba_d_state", 256);
  c.d_conv = r.positive_int_or("mamba_d_conv", 4);
  const double expand = r.number_or("mamba_expand", 2);
  const double inner = std::floor(expand * static_cast<double>(c.d_model));
  if (!(expand > 0) || inner < 1 || inner > static_cast<double>(kMaxConfigDim))
    r.reject_value("mamba_expand", nlohmann::json(expand), "expected a positive expansion factor");
  c.d_inner = static_cast<int64_t>(inner);
  c.n_heads = r.positive_int_or("mamba_n_heads", 128);
  const nlohmann::json* d_head = r.get("mamba_d_head");
  if (!d_head || (d_head->is_string() && *d_head == "auto")) {
    if (c.d_inner % c.n_heads != 0)
      r.reject_value("mamba_n_heads", nlohmann::json(c.n_heads),
                     "does not divide mamba_expand * hidden_size = " + std::to_string(c.d_inner));
    c.head_dim = c.d_inner / c.n_heads;
  } else {
    c.head_dim = r.positive_int("mamba_d_head");
  }
  if (c.n_heads * c.head_dim != c.d_inner)
    r.reject_value("mamba_d_head", nlohmann::json(c.head_dim),
                   "mamba_n_heads * mamba_d_head must equal mamba_expand * hidden_size = " + std::to_string(c.d_inner));
  c.n_groups = r.positive_int_or("mamba_n_groups", 1);
  if (c.n_heads % c.n_groups != 0)
    r.reject_value("mamba_n_groups", nlohmann::json(c.n_groups),
                   "mamba_n_heads = " + std::to_string(c.n_heads) + " is not a multiple of it");
  c.chunk_size = r.positive_int_or("mamba_chunk_size", 256);
  c.use_conv_bias = r.bool_or("mamba_conv_bias", true);
  c.use_bias = r.bool_or("mamba_proj_bias", false);
  read_dt_limit(r, "time_step_limit", c);
}

// A layer-type name as NemotronHConfig and GraniteMoeHybridConfig write them (and their legacy spellings).
LayerKind layer_kind_of(const ConfigReader& r, const std::string& key, const nlohmann::json& v, bool mlp_allowed) {
  if (v.is_string()) {
    const std::string s = v.get<std::string>();
    if (s == "mamba" || s == "linear_attention") return LayerKind::Mamba2;
    if (s == "attention" || s == "full_attention") return LayerKind::Attention;
    if (mlp_allowed && s == "mlp") return LayerKind::MLP;
    if (mlp_allowed && s == "moe") return LayerKind::MoE;
  }
  r.reject_value(key, v, mlp_allowed ? "unknown layer type; expected \"mamba\"/\"linear_attention\", "
                                       "\"attention\"/\"full_attention\" or \"mlp\""
                                     : "unknown layer type; expected \"mamba\"/\"linear_attention\" or "
                                       "\"attention\"/\"full_attention\"");
}

// A Nemotron-H layer pattern string (hybrid_override_pattern, mtp_hybrid_override_pattern): one character a layer.
std::vector<LayerKind> pattern_layers(const ConfigReader& r, const std::string& key, const std::string& pattern) {
  std::vector<LayerKind> layers;
  for (size_t i = 0; i < pattern.size(); ++i) {
    const char ch = pattern[i];
    if (ch == 'M') layers.push_back(LayerKind::Mamba2);
    else if (ch == '*') layers.push_back(LayerKind::Attention);
    else if (ch == '-') layers.push_back(LayerKind::MLP);
    else if (ch == 'E') layers.push_back(LayerKind::MoE);
    else
      r.reject_value(key, nlohmann::json(pattern),
                     "unknown layer character '" + std::string(1, ch) + "' at " + std::to_string(i) +
                         "; expected M (Mamba-2), * (attention), - (MLP), E (MoE)");
  }
  return layers;
}

// The MTP block's layers: mtp_layers_block_type wins over the legacy mtp_hybrid_override_pattern, and neither
// means NemotronHConfig's default [full_attention, moe] (the MTP block of Nemotron 3 Super).
void read_mtp_layers(const ConfigReader& r, ModelConfig& c) {
  const std::string list_key = "mtp_layers_block_type", pattern_key = "mtp_hybrid_override_pattern";
  if (const nlohmann::json* list = r.get(list_key)) {
    if (!list->is_array()) r.reject_value(list_key, *list, "expected a list of layer types");
    if (list->size() > static_cast<size_t>(kMaxConfigLayers))
      r.reject(list_key, "has " + std::to_string(list->size()) + " layers, expected at most " +
                             std::to_string(kMaxConfigLayers));
    for (size_t i = 0; i < list->size(); ++i)
      c.mtp_layers.push_back(layer_kind_of(r, list_key + "[" + std::to_string(i) + "]", (*list)[i], true));
  } else if (r.has(pattern_key)) {
    const std::string pattern = r.string_or(pattern_key, "");
    if (pattern.size() > static_cast<size_t>(kMaxConfigLayers))
      r.reject(pattern_key, "has " + std::to_string(pattern.size()) + " layers, expected at most " +
                                std::to_string(kMaxConfigLayers));
    c.mtp_layers = pattern_layers(r, pattern_key, pattern);
  } else {
    c.mtp_layers = {LayerKind::Attention, LayerKind::MoE};
  }
  if (c.mtp_layers.empty())
    r.reject(r.has(list_key) ? list_key : pattern_key, "expected at least one MTP layer when num_nextn_predict_layers > 0");
}

void check_layer_count(const ConfigReader& r, const ModelConfig& c, const std::string& list_key) {
  if (r.has("num_hidden_layers") && r.required_int("num_hidden_layers") != c.n_layer)
    r.reject_value("num_hidden_layers", *r.get("num_hidden_layers"),
                   "disagrees with the " + std::to_string(c.n_layer) + " layers of " + list_key);
  if (c.n_layer < 1) r.reject(list_key, "expected at least one layer");
}

void read_common(const ConfigReader& r, ModelConfig& c) {
  c.arch = Arch::Mamba2;
  c.d_model = r.positive_int("hidden_size");
  c.vocab_size = r.positive_int("vocab_size");
  c.tie_embeddings = r.bool_or("tie_word_embeddings", false);
  c.residual_in_fp32 = true;
  read_token_ids(r, c);
}

}  // namespace

ModelConfig parse_transformers_nemotron_h(const nlohmann::json& j, const std::string& source) {
  const ConfigReader r(j, source);
  check_architecture(r, "NemotronHForCausalLM");
  ModelConfig c;
  c.family = Family::NemotronH;
  read_common(r, c);
  // transformers' NemotronHForCausalLM declares no tied weights (_tied_weights_keys = {}): its lm_head is always its
  // own lm_head.weight, even under tie_word_embeddings = true (a surprise, mirrored here; a checkpoint without
  // lm_head.weight is refused naming that tensor, where transformers would initialise a random head).
  c.tie_embeddings = false;
  // Layers: layers_block_type (or its alias layer_types) wins over the legacy hybrid_override_pattern, as in
  // NemotronHConfig.
  const std::string list_key = r.has("layers_block_type") ? "layers_block_type" : "layer_types";
  if (const nlohmann::json* list = r.get(list_key)) {
    if (!list->is_array()) r.reject_value(list_key, *list, "expected a list of layer types");
    if (list->size() > static_cast<size_t>(kMaxConfigLayers))
      r.reject(list_key, "has " + std::to_string(list->size()) + " layers, expected at most " +
                             std::to_string(kMaxConfigLayers));
    for (size_t i = 0; i < list->size(); ++i)
      c.layers.push_back(layer_kind_of(r, list_key + "[" + std::to_string(i) + "]", (*list)[i], true));
    c.n_layer = static_cast<int64_t>(c.layers.size());
    check_layer_count(r, c, list_key);
  } else if (r.has("hybrid_override_pattern")) {
    const std::string pattern = r.string_or("hybrid_override_pattern", "");
    if (pattern.size() > static_cast<size_t>(kMaxConfigLayers))
      r.reject("hybrid_override_pattern", "has " + std::to_string(pattern.size()) + " layers, expected at most " +
                                              std::to_string(kMaxConfigLayers));
    c.layers = pattern_layers(r, "hybrid_override_pattern", pattern);
    c.n_layer = static_cast<int64_t>(c.layers.size());
    check_layer_count(r, c, "hybrid_override_pattern");
  } else {
    r.reject("layers_block_type", "required: neither layers_block_type nor hybrid_override_pattern is given");
  }
  // Multi-token-prediction layers serve speculative decoding only: the model's own logits do not use them.
  c.mtp_layers_ignored = r.int_or("num_nextn_predict_layers", 0);
  if (c.mtp_layers_ignored < 0)
    r.reject_value("num_nextn_predict_layers", *r.get("num_nextn_predict_layers"), "expected a count >= 0");
  if (c.mtp_layers_ignored > 0) read_mtp_layers(r, c);
  // The MoE keys are read for the model's own MoE layers only: a dense model that declares an MTP block keeps the
  // config (and the decode path) of a dense model; its block's MoE layers are then refused by --draft-mtp.
  if (std::find(c.layers.begin(), c.layers.end(), LayerKind::MoE) != c.layers.end()) read_nemotron_moe(r, c);
  c.norm_eps = positive_number(r, "layer_norm_epsilon", 1e-5);

  // Mamba-2 layers: d_inner is mamba_num_heads * mamba_head_dim (expand only initialises).
  check_activation(r, "mamba_hidden_act", "silu", "silu");
  c.d_state = r.positive_int_or("ssm_state_size", 128);
  c.n_heads = r.positive_int_or("mamba_num_heads", 128);
  c.head_dim = r.positive_int_or("mamba_head_dim", 64);
  c.d_inner = c.n_heads * c.head_dim;
  const std::string groups_key = first_key(r, {"n_groups", "mamba_n_groups"});
  c.n_groups = r.positive_int_or(groups_key, 8);
  if (c.n_heads % c.n_groups != 0)
    r.reject_value(groups_key, nlohmann::json(c.n_groups),
                   "mamba_num_heads = " + std::to_string(c.n_heads) + " is not a multiple of it");
  c.d_conv = r.positive_int_or(first_key(r, {"conv_kernel", "mamba_d_conv"}), 4);
  c.chunk_size = r.positive_int_or(first_key(r, {"chunk_size", "mamba_chunk_size"}), 128);
  c.use_conv_bias = r.bool_or(first_key(r, {"use_conv_bias", "mamba_conv_bias"}), true);
  c.use_bias = r.bool_or("use_bias", false);  // NemotronHMamba2Mixer's in_proj/out_proj bias
  read_dt_limit(r, first_key(r, {"time_step_limit", "mamba_dt_limit"}), c);
  c.gated_norm_groups = c.n_groups;  // Zamba2RMSNormGated with group_size = d_inner / n_groups

  // Attention layers: NoPE, scaled by 1/sqrt(head_dim); transformers' NemotronHAttention has no biases.
  read_attention(r, c, /*head_dim_key=*/true, 32, 8, 128);
  if (r.bool_or("attention_bias", false))
    r.reject_value("attention_bias", true, "NemotronHAttention has no projection biases; expected false");
  // MLP layers: relu2 up/down.
  check_activation(r, "mlp_hidden_act", "relu2", "relu2");
  c.mlp_size = r.positive_int_or("intermediate_size", 21504);
  c.mlp_act = MlpAct::Relu2;
  c.mlp_bias = r.bool_or("mlp_bias", false);
  return c;
}

ModelConfig parse_transformers_granite_hybrid(const nlohmann::json& j, const std::string& source) {
  const ConfigReader r(j, source);
  check_architecture(r, "GraniteMoeHybridForCausalLM");
  ModelConfig c;
  c.family = Family::GraniteHybrid;
  read_common(r, c);
  const int64_t experts = r.int_or("num_local_experts", 8);  // GraniteMoeHybridConfig's default
  if (experts < 0) r.reject_value("num_local_experts", nlohmann::json(experts), "expected a count >= 0");
  c.n_layer = r.layer_count("num_hidden_layers");
  const std::string list_key = r.has("layer_types") ? "layer_types" : "layers_block_type";
  if (const nlohmann::json* list = r.get(list_key)) {
    if (!list->is_array()) r.reject_value(list_key, *list, "expected a list of layer types");
    if (static_cast<int64_t>(list->size()) != c.n_layer)
      r.reject_value(list_key, *list,
                     "has " + std::to_string(list->size()) + " entries for num_hidden_layers = " + std::to_string(c.n_layer));
    for (size_t i = 0; i < list->size(); ++i)
      c.layers.push_back(layer_kind_of(r, list_key + "[" + std::to_string(i) + "]", (*list)[i], false));
  } else {
    c.layers.assign(static_cast<size_t>(c.n_layer), LayerKind::Mamba2);  // GraniteMoeHybridConfig: all Mamba
  }
  c.norm_eps = positive_number(r, "rms_norm_eps", 1e-6);
  check_activation(r, "hidden_act", "silu", "silu");
  read_mamba_prefixed(r, c);
  c.gated_norm_groups = 1;  // BambaRMSNormGated: one RMS over the whole d_inner

  read_attention(r, c, /*head_dim_key=*/false, 32, 0, 0);
  c.attn_bias = r.bool_or("attention_bias", false);
  c.attn_scale = positive_number(r, "attention_multiplier", 1.0);
  const std::string pos = r.string_or("position_embedding_type", "nope");
  if (pos == "rope") {
    read_rope(r, c, 1.0);
  } else if (pos != "nope") {
    r.reject_value("position_embedding_type", nlohmann::json(pos), "expected \"nope\", null or \"rope\"");
  }
  c.mlp_after_mixer = true;
  c.mlp_size = r.positive_int_or("shared_intermediate_size", 1024);
  c.mlp_act = MlpAct::SiluGated;
  c.embedding_multiplier = nonzero_number(r, "embedding_multiplier", 1.0);
  c.residual_multiplier = nonzero_number(r, "residual_multiplier", 1.0);
  c.logits_scaling = nonzero_number(r, "logits_scaling", 1.0);
  if (experts > 0) read_granite_moe(r, c, experts);  // block_sparse_moe beside the shared_mlp of every layer
  return c;
}

ModelConfig parse_transformers_bamba(const nlohmann::json& j, const std::string& source) {
  const ConfigReader r(j, source);
  check_architecture(r, "BambaForCausalLM");
  ModelConfig c;
  c.family = Family::Bamba;
  read_common(r, c);
  c.n_layer = r.layer_count("num_hidden_layers");
  c.layers.assign(static_cast<size_t>(c.n_layer), LayerKind::Mamba2);
  if (const nlohmann::json* idx = r.get("attn_layer_indices")) {
    if (!idx->is_array()) r.reject_value("attn_layer_indices", *idx, "expected a list of layer indices");
    for (const auto& v : *idx) {
      if (!v.is_number_integer() || v.get<int64_t>() < 0 || v.get<int64_t>() >= c.n_layer)
        r.reject_value("attn_layer_indices", *idx,
                       "expected layer indices in [0, num_hidden_layers = " + std::to_string(c.n_layer) + ")");
      c.layers[static_cast<size_t>(v.get<int64_t>())] = LayerKind::Attention;
    }
  }
  c.norm_eps = positive_number(r, "rms_norm_eps", 1e-5);
  check_activation(r, "hidden_act", "silu", "silu");
  read_mamba_prefixed(r, c);
  c.gated_norm_groups = 1;  // BambaRMSNormGated: one RMS over the whole d_inner

  // BambaConfig forces attention_bias and mlp_bias to false whatever config.json says.
  read_attention(r, c, /*head_dim_key=*/true, 32, 8, 0);
  read_rope(r, c, 0.5);  // BambaConfig hard-codes partial_rotary_factor 0.5: half of each head is rotated
  c.max_position = r.positive_int_or("max_position_embeddings", 262144);
  c.mlp_after_mixer = true;
  c.mlp_size = r.positive_int_or("intermediate_size", 14336);
  c.mlp_act = MlpAct::SiluGated;
  return c;
}

void parse_canonical_hybrid(const nlohmann::json& j, const std::string& source, ModelConfig& c) {
  const ConfigReader r(j, source);
  const std::string fam = r.string_or("family", "");
  if (fam == "nemotron_h") c.family = Family::NemotronH;
  else if (fam == "granitemoehybrid") c.family = Family::GraniteHybrid;
  else if (fam == "bamba") c.family = Family::Bamba;
  else if (fam == "falcon_h1") c.family = Family::FalconH1;
  else if (fam == "jamba") c.family = Family::Jamba;
  else r.reject_value("family", *r.get("family"),
                      "expected \"nemotron_h\", \"granitemoehybrid\", \"bamba\", \"falcon_h1\" or \"jamba\"");
  const nlohmann::json* kinds = r.get("layers");
  if (!kinds || !kinds->is_array()) r.reject("layers", "expected a list of layer kinds");
  for (const auto& k : *kinds) {
    if (k == "mamba2") c.layers.push_back(LayerKind::Mamba2);
    else if (k == "mamba1") c.layers.push_back(LayerKind::Mamba1);
    else if (k == "attention") c.layers.push_back(LayerKind::Attention);
    else if (k == "mlp") c.layers.push_back(LayerKind::MLP);
    else if (k == "parallel") c.layers.push_back(LayerKind::ParallelHybrid);
    else if (k == "moe") c.layers.push_back(LayerKind::MoE);
    else r.reject_value("layers", *kinds, "unknown layer kind " + json_excerpt(k));
  }
  c.mlp_after_mixer = r.bool_or("mlp_after_mixer", false);
  c.gated_norm_groups = r.int_or("gated_norm_groups", 0);
  c.n_attn_heads = r.int_or("n_attn_heads", 0);
  c.n_kv_heads = r.int_or("n_kv_heads", 0);
  c.attn_head_dim = r.int_or("attn_head_dim", 0);
  c.attn_bias = r.bool_or("attn_bias", false);
  c.attn_scale = r.number_or("attn_scale", 0.0);
  c.rope_theta = r.number_or("rope_theta", 0.0);
  c.rope_dim = r.int_or("rope_dim", 0);
  c.mlp_size = r.int_or("mlp_size", 0);
  const std::string act = r.string_or("mlp_act", "relu2");
  if (act == "relu2") c.mlp_act = MlpAct::Relu2;
  else if (act == "silu_gated") c.mlp_act = MlpAct::SiluGated;
  else r.reject_value("mlp_act", nlohmann::json(act), "expected \"relu2\" or \"silu_gated\"");
  c.mlp_bias = r.bool_or("mlp_bias", false);
  c.embedding_multiplier = r.number_or("embedding_multiplier", 1.0);
  c.residual_multiplier = r.number_or("residual_multiplier", 1.0);
  c.logits_scaling = r.number_or("logits_scaling", 1.0);
  c.max_position = r.int_or("max_position", 0);
  if (c.family == Family::FalconH1) parse_canonical_falcon_h1(j, source, c);
  parse_canonical_moe(j, source, c);
}

}  // namespace mambacpp
