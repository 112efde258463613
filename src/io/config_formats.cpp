// Reads transformers' and mamba_ssm's config.json into ModelConfig. Defaults are the ones of the reference classes
// (transformers MambaConfig / Mamba2Config, mamba_ssm MambaConfig + Mamba / Mamba2 module arguments), so a config
// that omits a key means what it means to the code that wrote it. Variants the forward pass does not implement are
// rejected here, naming the key, the value found and what is supported.
#include "io/config_formats.h"

#include <cmath>
#include <limits>

#include "io/config_reader.h"
#include "mambacpp/error.h"

namespace mambacpp {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

// d_inner = expand * d_model, as Python's int(expand * hidden_size); expand may be written as a float.
int64_t expanded_size(const ConfigReader& r, const std::string& expand_key, double fallback, int64_t d_model) {
  const double expand = r.number_or(expand_key, fallback);
  const double d_inner = std::floor(expand * static_cast<double>(d_model));
  if (!(expand > 0) || !std::isfinite(expand) || d_inner < 1 || d_inner > static_cast<double>(kMaxConfigDim))
    r.reject_value(expand_key, nlohmann::json(expand),
                   "expected a positive expansion factor giving at most 2^30 inner channels");
  return static_cast<int64_t>(d_inner);
}

void check_silu(const ConfigReader& r) {
  const std::string act = r.string_or("hidden_act", "silu");
  if (act != "silu" && act != "swish")
    r.reject_value("hidden_act", nlohmann::json(act), "only \"silu\" is supported");
}

void check_architectures(const ConfigReader& r, const std::string& model_type, const std::string& expected) {
  const nlohmann::json* archs = r.get("architectures");
  if (!archs) return;
  if (!archs->is_array()) r.reject_value("architectures", *archs, "expected a list of class names");
  for (const auto& a : *archs)
    if (a.is_string() && (a == expected || a == expected.substr(0, expected.find("ForCausalLM")) + "Model")) return;
  r.reject_value("architectures", *archs,
                 "model_type \"" + model_type + "\" expects " + expected + "; other architectures are not supported");
}

double positive_eps(const ConfigReader& r, const std::string& key, double fallback) {
  const double eps = r.number_or(key, fallback);
  if (!(eps > 0) || !std::isfinite(eps)) r.reject_value(key, nlohmann::json(eps), "expected a positive finite number");
  return eps;
}

// Reads a [lo, hi] clamp for dt; hi may be infinite.
void read_dt_limit(const ConfigReader& r, const std::string& key, ModelConfig& c) {
  const nlohmann::json* v = r.get(key);
  if (!v) return;
  if (!v->is_array() || v->size() != 2 || !(*v)[0].is_number() || !(*v)[1].is_number())
    r.reject_value(key, *v, "expected [lo, hi] with two numbers");
  const double lo = (*v)[0].get<double>(), hi = (*v)[1].get<double>();
  if (!(lo >= 0) || !(hi >= lo) || std::isinf(lo))
    r.reject_value(key, *v, "expected 0 <= lo <= hi (hi may be Infinity)");
  c.dt_min = lo;
  c.dt_max = hi;
}

int64_t resolve_dt_rank(const ConfigReader& r, const std::string& key, int64_t d_model) {
  const nlohmann::json* v = r.get(key);
  if (!v || (v->is_string() && *v == "auto")) return (d_model + 15) / 16;  // ceil(d_model / 16)
  if (v->is_string()) r.reject_value(key, *v, "expected \"auto\" or a positive integer");
  return r.positive_int(key);
}

void check_heads(const ConfigReader& r, const ModelConfig& c, const std::string& heads_key, const std::string& dim_key,
                 const std::string& groups_key, const std::string& inner_desc) {
  if (c.n_heads * c.head_dim != c.d_inner)
    r.reject(heads_key, heads_key + " * " + dim_key + " = " + std::to_string(c.n_heads) + " * " +
                            std::to_string(c.head_dim) + " = " + std::to_string(c.n_heads * c.head_dim) +
                            ", expected " + inner_desc + " = " + std::to_string(c.d_inner));
  if (c.n_heads % c.n_groups != 0)
    r.reject(groups_key, heads_key + " = " + std::to_string(c.n_heads) + " is not a multiple of " + groups_key +
                             " = " + std::to_string(c.n_groups));
}

}  // namespace

namespace {

// MambaConfig and FalconMambaConfig share their keys; FalconMamba adds mixer_rms_eps, and its intermediate_size, when
// given, wins over expand (tiiuae/falcon-mamba-7b's config.json has expand 16 beside intermediate_size 8192).
ModelConfig parse_transformers_mamba1(const nlohmann::json& j, const std::string& source, bool falcon) {
  const ConfigReader r(j, source);
  check_architectures(r, falcon ? "falcon_mamba" : "mamba", falcon ? "FalconMambaForCausalLM" : "MambaForCausalLM");
  check_silu(r);
  ModelConfig c;
  c.arch = Arch::Mamba1;
  c.d_model = r.positive_int("hidden_size");
  c.n_layer = r.layer_count("num_hidden_layers");
  c.vocab_size = r.positive_int("vocab_size");
  c.d_state = r.positive_int_or("state_size", 16);
  c.d_conv = r.positive_int_or("conv_kernel", 4);
  if (falcon && r.has("intermediate_size")) {
    c.d_inner = r.positive_int("intermediate_size");
  } else {
    c.d_inner = expanded_size(r, "expand", 2, c.d_model);
    if (r.has("intermediate_size") && r.required_int("intermediate_size") != c.d_inner)
      r.reject_value("intermediate_size", *r.get("intermediate_size"),
                     "expected expand * hidden_size = " + std::to_string(c.d_inner));
  }
  c.dt_rank = resolve_dt_rank(r, "time_step_rank", c.d_model);
  c.norm_eps = positive_eps(r, "layer_norm_epsilon", 1e-5);
  if (falcon) c.mixer_rms_eps = positive_eps(r, "mixer_rms_eps", 1e-6);  // FalconMambaConfig's default
  c.use_bias = r.bool_or("use_bias", false);
  c.use_conv_bias = r.bool_or("use_conv_bias", true);
  c.residual_in_fp32 = r.bool_or("residual_in_fp32", true);
  c.tie_embeddings = r.bool_or("tie_word_embeddings", true);  // PretrainedConfig's default
  read_token_ids(r, c);
  return c;
}

}  // namespace

ModelConfig parse_transformers_mamba(const nlohmann::json& j, const std::string& source) {
  return parse_transformers_mamba1(j, source, false);
}

ModelConfig parse_transformers_falcon_mamba(const nlohmann::json& j, const std::string& source) {
  return parse_transformers_mamba1(j, source, true);
}

ModelConfig parse_transformers_mamba2(const nlohmann::json& j, const std::string& source) {
  const ConfigReader r(j, source);
  check_architectures(r, "mamba2", "Mamba2ForCausalLM");
  check_silu(r);
  if (!r.bool_or("rms_norm", true))
    r.reject_value("rms_norm", false, "only the gated RMSNorm variant (rms_norm = true) is supported");
  if (r.bool_or("norm_before_gate", false))
    r.reject_value("norm_before_gate", true, "only norm_before_gate = false (gate, then norm) is supported");
  ModelConfig c;
  c.arch = Arch::Mamba2;
  c.d_model = r.positive_int("hidden_size");
  c.n_layer = r.layer_count("num_hidden_layers");
  c.vocab_size = r.positive_int("vocab_size");
  c.d_state = r.positive_int_or("state_size", 128);
  c.d_conv = r.positive_int_or("conv_kernel", 4);
  c.d_inner = expanded_size(r, "expand", 2, c.d_model);
  if (r.has("intermediate_size") && r.required_int("intermediate_size") != c.d_inner)
    r.reject_value("intermediate_size", *r.get("intermediate_size"),
                   "expected expand * hidden_size = " + std::to_string(c.d_inner));
  c.n_heads = r.positive_int_or("num_heads", 128);
  c.head_dim = r.positive_int_or("head_dim", 64);
  c.n_groups = r.positive_int_or("n_groups", 8);
  check_heads(r, c, "num_heads", "head_dim", "n_groups", "expand * hidden_size");
  c.chunk_size = r.positive_int_or("chunk_size", 256);
  c.norm_eps = positive_eps(r, "layer_norm_epsilon", 1e-5);
  c.use_bias = r.bool_or("use_bias", false);
  c.use_conv_bias = r.bool_or("use_conv_bias", true);
  c.residual_in_fp32 = r.bool_or("residual_in_fp32", true);
  c.dt_min = 0.0;
  c.dt_max = kInf;
  read_dt_limit(r, "time_step_limit", c);
  c.tie_embeddings = r.bool_or("tie_word_embeddings", false);  // Mamba2Config's default
  read_token_ids(r, c);
  return c;
}

ModelConfig parse_mamba_ssm(const nlohmann::json& j, const std::string& source) {
  const ConfigReader r(j, source);
  if (const nlohmann::json* attn = r.get("attn_layer_idx"); attn && !(attn->is_array() && attn->empty()))
    r.reject_value("attn_layer_idx", *attn, "hybrid models with attention layers are not yet supported");
  if (r.int_or("d_intermediate", 0) != 0)
    r.reject_value("d_intermediate", *r.get("d_intermediate"), "blocks with an MLP are not yet supported (expected 0)");
  if (!r.bool_or("rms_norm", true))
    r.reject_value("rms_norm", false, "LayerNorm blocks are not supported; only rms_norm = true");

  ModelConfig c;
  c.d_model = r.positive_int("d_model");
  c.n_layer = r.layer_count("n_layer");
  // The embedding has vocab_size rounded up to a multiple of pad_vocab_size_multiple rows.
  const int64_t vocab = r.positive_int("vocab_size");
  const int64_t multiple = r.positive_int_or("pad_vocab_size_multiple", 8);
  c.vocab_size = (vocab + multiple - 1) / multiple * multiple;
  c.residual_in_fp32 = r.bool_or("residual_in_fp32", true);
  c.tie_embeddings = r.bool_or("tie_embeddings", true);
  c.norm_eps = 1e-5;  // mamba_ssm's norm_epsilon default; its config.json does not carry the value

  static const nlohmann::json kEmpty = nlohmann::json::object();
  const nlohmann::json* ssm = r.get("ssm_cfg");
  const ConfigReader s(ssm ? *ssm : kEmpty, source, "ssm_cfg.");
  const std::string layer = s.string_or("layer", "Mamba1");
  if (layer == "Mamba1") {
    c.arch = Arch::Mamba1;
    c.d_state = s.positive_int_or("d_state", 16);
    c.d_conv = s.positive_int_or("d_conv", 4);
    c.d_inner = expanded_size(s, "expand", 2, c.d_model);
    c.dt_rank = resolve_dt_rank(s, "dt_rank", c.d_model);
    c.use_bias = s.bool_or("bias", false);
    c.use_conv_bias = s.bool_or("conv_bias", true);
  } else if (layer == "Mamba2") {
    c.arch = Arch::Mamba2;
    if (!s.bool_or("rmsnorm", true))
      s.reject_value("rmsnorm", false, "only the gated RMSNorm variant (rmsnorm = true) is supported");
    if (s.bool_or("norm_before_gate", false))
      s.reject_value("norm_before_gate", true, "only norm_before_gate = false (gate, then norm) is supported");
    if (s.bool_or("D_has_hdim", false))
      s.reject_value("D_has_hdim", true, "only D_has_hdim = false (one D per head) is supported");
    c.d_state = s.positive_int_or("d_state", 128);
    c.d_conv = s.positive_int_or("d_conv", 4);
    c.d_inner = expanded_size(s, "expand", 2, c.d_model);
    // d_ssm < d_inner routes part of in_proj through a gated MLP beside the SSM; not implemented.
    const int64_t d_ssm = s.positive_int_or("d_ssm", c.d_inner);
    if (d_ssm != c.d_inner)
      s.reject_value("d_ssm", *s.get("d_ssm"),
                     "expected d_ssm = expand * d_model = " + std::to_string(c.d_inner) +
                         " (a partial SSM with a parallel MLP is not supported)");
    c.head_dim = s.positive_int_or("headdim", 64);
    if (c.d_inner % c.head_dim != 0)
      s.reject_value("headdim", nlohmann::json(c.head_dim),
                     "d_inner = " + std::to_string(c.d_inner) + " is not a multiple of headdim");
    c.n_heads = c.d_inner / c.head_dim;
    c.n_groups = s.positive_int_or("ngroups", 1);
    check_heads(s, c, "nheads", "headdim", "ngroups", "d_inner");
    c.chunk_size = s.positive_int_or("chunk_size", 256);
    c.use_bias = s.bool_or("bias", false);
    c.use_conv_bias = s.bool_or("conv_bias", true);
    // dt_min/dt_max in ssm_cfg only initialise the dt bias; the forward clamp is dt_limit.
    c.dt_min = 0.0;
    c.dt_max = kInf;
    read_dt_limit(s, "dt_limit", c);
  } else {
    s.reject_value("layer", nlohmann::json(layer), "supported layers are \"Mamba1\" and \"Mamba2\"");
  }
  return c;
}

ModelConfig parse_canonical(const nlohmann::json& j, const std::string& source) {
  const ConfigReader r(j, source);
  if (r.required_int("mambacpp_config") != 1)
    r.reject_value("mambacpp_config", *r.get("mambacpp_config"), "this build reads version 1");
  ModelConfig c;
  const std::string arch = r.string_or("arch", "");
  if (arch == "mamba") c.arch = Arch::Mamba1;
  else if (arch == "mamba2") c.arch = Arch::Mamba2;
  else r.reject_value("arch", r.has("arch") ? *r.get("arch") : nlohmann::json(), "expected \"mamba\" or \"mamba2\"");
  auto need_bool = [&](const char* key) {
    if (!r.has(key)) r.reject(key, "required key is missing");
    return r.bool_or(key, false);
  };
  auto need_number = [&](const char* key) {
    if (!r.has(key)) r.reject(key, "required key is missing");
    return r.number_or(key, 0.0);
  };
  c.d_model = r.required_int("d_model");
  c.n_layer = r.required_int("n_layer");
  c.vocab_size = r.required_int("vocab_size");
  c.d_state = r.required_int("d_state");
  c.d_conv = r.required_int("d_conv");
  c.d_inner = r.required_int("d_inner");
  c.norm_eps = need_number("norm_eps");
  c.use_bias = need_bool("use_bias");
  c.use_conv_bias = need_bool("use_conv_bias");
  c.residual_in_fp32 = need_bool("residual_in_fp32");
  c.tie_embeddings = need_bool("tie_embeddings");
  c.dt_rank = r.required_int("dt_rank");
  c.mixer_rms_eps = r.number_or("mixer_rms_eps", 0.0);  // written only for FalconMamba
  c.n_heads = r.required_int("n_heads");
  c.head_dim = r.required_int("head_dim");
  c.n_groups = r.required_int("n_groups");
  c.chunk_size = r.required_int("chunk_size");
  c.dt_min = need_number("dt_min");
  c.dt_max = need_number("dt_max");
  c.bos_token_id = r.required_int("bos_token_id");
  c.eos_token_id = r.required_int("eos_token_id");
  c.pad_token_id = r.required_int("pad_token_id");
  if (r.has("extra_eos_token_ids")) c.extra_eos_token_ids = r.token_ids("extra_eos_token_ids");
  if (r.has("family")) parse_canonical_hybrid(j, source, c);
  return c;
}

}  // namespace mambacpp
