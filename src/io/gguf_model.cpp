#include "io/gguf_model.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <cstring>
#include <map>
#include <set>

#include "core/ggml_blocks.h"
#include "io/gguf_writer.h"
#include "mambacpp/dtype.h"
#include "mambacpp/error.h"

namespace mambacpp {

namespace {

using Shape = std::vector<int64_t>;

int64_t numel(const Shape& s) {
  int64_t n = 1;
  for (int64_t d : s) n *= d;
  return n;
}

std::string shape_str(const Shape& s) {
  std::string r = "[";
  for (size_t i = 0; i < s.size(); ++i) r += (i ? ", " : "") + std::to_string(s[i]);
  return r + "]";
}

TensorView view_of(void* p, DType t, const Shape& s) {
  TensorView v(p, t, {1});
  v.ndim = static_cast<int>(s.size());
  for (size_t i = 0; i < s.size(); ++i) v.shape[i] = s[i];
  return v;
}

struct Names {
  std::vector<GgufTensorName> list;
  GgufTensorName& add(const std::string& hf, const std::string& gguf, Shape hf_shape, Shape gguf_shape = {},
                      GgufConversion conv = GgufConversion::Plain, int64_t heads = 0) {
    if (gguf_shape.empty()) gguf_shape = hf_shape;
    GgufTensorName t;
    t.hf = hf;
    t.gguf = gguf;
    t.hf_shape = std::move(hf_shape);
    t.gguf_shape = std::move(gguf_shape);
    t.conversion = conv;
    t.heads = heads;
    list.push_back(std::move(t));
    return list.back();
  }
  // A stacked-experts tensor `gguf` [E, rows, cols] from the fused transformers tensor `hf` ([E, rows, cols], or
  // [E, 2 rows, cols] halved by `conv`), or from per-expert tensors `per_expert` with "{e}" for the expert's index.
  GgufTensorName& experts(const std::string& hf, const std::string& gguf, int64_t E, int64_t rows, int64_t cols,
                          GgufConversion conv, const std::string& per_expert, std::vector<std::string> alt = {}) {
    const bool half = conv == GgufConversion::GateHalf || conv == GgufConversion::UpHalf;
    GgufTensorName& t = add(hf, gguf, {E, half ? 2 * rows : rows, cols}, {E, rows, cols}, conv);
    t.experts = E;
    t.alt = std::move(alt);
    if (!per_expert.empty()) {
      const size_t at = per_expert.find("{e}");
      for (int64_t e = 0; e < E; ++e)
        t.expert_names.push_back(per_expert.substr(0, at) + std::to_string(e) + per_expert.substr(at + 3));
    }
    return t;
  }
};

// The Mamba-2 mixer of layer `b` ("blk.N.") whose transformers tensors lie under `m`.
void mamba2_names(Names& n, const ModelConfig& c, const std::string& m, const std::string& b) {
  // llama.cpp stores ssm_norm as [n_groups, d_inner / n_groups] for every family (the grouping of the norm itself is
  // the family's: gated_norm_groups).
  const int64_t C = c.conv_channels(), H = c.n_heads, G = c.n_groups;
  n.add(m + "in_proj.weight", b + "ssm_in.weight", {c.in_proj_size(), c.d_model});
  if (c.use_bias) n.add(m + "in_proj.bias", b + "ssm_in.bias", {c.in_proj_size()});
  n.add(m + "conv1d.weight", b + "ssm_conv1d.weight", {C, 1, c.d_conv}, {C, c.d_conv});
  if (c.use_conv_bias) n.add(m + "conv1d.bias", b + "ssm_conv1d.bias", {C});
  n.add(m + "dt_bias", b + "ssm_dt.bias", {H});
  n.add(m + "A_log", b + "ssm_a", {H}, {H, 1}, GgufConversion::NegExp);
  n.add(m + "D", b + "ssm_d", {H}, {H, 1});
  // Falcon-H1 with mamba_rms_norm false has no norm (llama.cpp's ssm_norm is optional: y * silu(z) alone).
  if (c.family != Family::FalconH1 || c.mamba_rms_norm)
    n.add(m + "norm.weight", b + "ssm_norm.weight", {c.d_inner}, {G, c.d_inner / G});
  n.add(m + "out_proj.weight", b + "ssm_out.weight", {c.d_model, c.d_inner});
  if (c.use_bias) n.add(m + "out_proj.bias", b + "ssm_out.bias", {c.d_model});
}

// granitehybrid and nemotron_h both come from llama.cpp's GraniteHybridModel converter, which permutes q and k
// (HeadPermute); its other architectures store them as transformers does.
void attention_names(Names& n, const ModelConfig& c, const std::string& a, const std::string& b) {
  const int64_t q = c.q_dim(), kv = c.kv_dim();
  // (falcon-h1's RoPE is NeoX-style, rotate-half as in transformers: stored as is.)
  const bool permuted = c.family == Family::GraniteHybrid || c.family == Family::Bamba || c.family == Family::NemotronH;
  const GgufConversion qk = permuted ? GgufConversion::HeadPermute : GgufConversion::Plain;
  n.add(a + "q_proj.weight", b + "attn_q.weight", {q, c.d_model}, {}, qk, c.n_attn_heads);
  n.add(a + "k_proj.weight", b + "attn_k.weight", {kv, c.d_model}, {}, qk, c.n_kv_heads);
  n.add(a + "v_proj.weight", b + "attn_v.weight", {kv, c.d_model});
  n.add(a + "o_proj.weight", b + "attn_output.weight", {c.d_model, q});
  if (c.attn_bias) {
    n.add(a + "q_proj.bias", b + "attn_q.bias", {q}, {}, qk, c.n_attn_heads);
    n.add(a + "k_proj.bias", b + "attn_k.bias", {kv}, {}, qk, c.n_kv_heads);
    n.add(a + "v_proj.bias", b + "attn_v.bias", {kv});
    n.add(a + "o_proj.bias", b + "attn_output.bias", {c.d_model});
  }
}

// A Nemotron-H MoE layer's mixer under `m`: the router (gate, with its e_score_correction_bias as llama.cpp's
// exp_probs_b), the routed experts' up / down (relu2: no gate), and the shared expert.
void nemotron_moe_names(Names& n, const ModelConfig& c, const std::string& m, const std::string& b) {
  const int64_t E = c.moe.n_experts, I = c.moe.expert_size, D = c.d_model, S = c.moe.shared_size;
  n.add(m + "gate.weight", b + "ffn_gate_inp.weight", {E, D});
  n.add(m + "gate.e_score_correction_bias", b + "exp_probs_b.bias", {E});
  n.experts(m + "experts.up_proj", b + "ffn_up_exps.weight", E, I, D, GgufConversion::Plain,
            m + "experts.{e}.up_proj.weight");
  n.experts(m + "experts.down_proj", b + "ffn_down_exps.weight", E, D, I, GgufConversion::Plain,
            m + "experts.{e}.down_proj.weight");
  n.add(m + "shared_experts.up_proj.weight", b + "ffn_up_shexp.weight", {S, D});
  n.add(m + "shared_experts.down_proj.weight", b + "ffn_down_shexp.weight", {D, S});
}

// Jamba (llama.cpp's jamba, conversion/jamba.py): Mamba-1 mixers with dt / B / C norms (ssm_dt_norm, ssm_b_norm,
// ssm_c_norm), NoPE attention stored as transformers stores it, and after every mixer pre_ff_layernorm (ffn_norm)
// then a SwiGLU MLP or, on expert layers, the router (ffn_gate_inp) and stacked experts.
void jamba_names(Names& n, const ModelConfig& c) {
  const int64_t d = c.d_model, di = c.d_inner, m = c.mlp_size;
  n.add("model.embed_tokens.weight", "token_embd.weight", {c.vocab_size, d});
  n.add("model.final_layernorm.weight", "output_norm.weight", {d});
  if (!c.tie_embeddings) n.add("lm_head.weight", "output.weight", {c.vocab_size, d});
  for (int64_t i = 0; i < c.n_layer; ++i) {
    const std::string b = "blk." + std::to_string(i) + ".", p = "model.layers." + std::to_string(i) + ".";
    n.add(p + "input_layernorm.weight", b + "attn_norm.weight", {d});
    if (c.layer_kind(i) == LayerKind::Attention) {
      attention_names(n, c, p + "self_attn.", b);
    } else {
      const std::string x = p + "mamba.";
      n.add(x + "in_proj.weight", b + "ssm_in.weight", {2 * di, d});
      n.add(x + "conv1d.weight", b + "ssm_conv1d.weight", {di, 1, c.d_conv}, {di, c.d_conv});
      if (c.use_conv_bias) n.add(x + "conv1d.bias", b + "ssm_conv1d.bias", {di});
      n.add(x + "x_proj.weight", b + "ssm_x.weight", {c.dt_rank + 2 * c.d_state, di});
      n.add(x + "dt_layernorm.weight", b + "ssm_dt_norm.weight", {c.dt_rank});
      n.add(x + "dt_proj.weight", b + "ssm_dt.weight", {di, c.dt_rank});
      n.add(x + "dt_proj.bias", b + "ssm_dt.bias", {di});
      n.add(x + "b_layernorm.weight", b + "ssm_b_norm.weight", {c.d_state});
      n.add(x + "c_layernorm.weight", b + "ssm_c_norm.weight", {c.d_state});
      n.add(x + "A_log", b + "ssm_a", {di, c.d_state}, {}, GgufConversion::NegExp);
      n.add(x + "D", b + "ssm_d", {di});
      n.add(x + "out_proj.weight", b + "ssm_out.weight", {d, di});
    }
    n.add(p + "pre_ff_layernorm.weight", b + "ffn_norm.weight", {d});
    const std::string f = p + "feed_forward.";
    if (c.mlp_has_experts(i)) {
      // transformers 5 fuses the experts (experts.gate_up_proj [E, 2I, D]: gate rows then up rows; down_proj);
      // the released checkpoints hold experts.N.{gate,up,down}_proj.weight.
      const int64_t E = c.moe.n_experts, I = c.moe.expert_size;
      n.add(f + "router.weight", b + "ffn_gate_inp.weight", {E, d});
      n.experts(f + "experts.gate_up_proj", b + "ffn_gate_exps.weight", E, I, d, GgufConversion::GateHalf,
                f + "experts.{e}.gate_proj.weight");
      n.experts(f + "experts.gate_up_proj", b + "ffn_up_exps.weight", E, I, d, GgufConversion::UpHalf,
                f + "experts.{e}.up_proj.weight");
      n.experts(f + "experts.down_proj", b + "ffn_down_exps.weight", E, d, I, GgufConversion::Plain,
                f + "experts.{e}.down_proj.weight");
    } else {
      n.add(f + "gate_proj.weight", b + "ffn_gate.weight", {m, d});
      n.add(f + "up_proj.weight", b + "ffn_up.weight", {m, d});
      n.add(f + "down_proj.weight", b + "ffn_down.weight", {d, m});
    }
  }
}

// Falcon-H1's layers: the Mamba-2 mixer and attention both after input_layernorm (attn_norm), the gated SiLU MLP after
// pre_ff_layernorm (ffn_norm).
void falcon_h1_names(Names& n, const ModelConfig& c) {
  const int64_t d = c.d_model, m = c.mlp_size;
  n.add("model.embed_tokens.weight", "token_embd.weight", {c.vocab_size, d});
  n.add("model.final_layernorm.weight", "output_norm.weight", {d});
  // Tied embeddings are written untied: llama.cpp's converter folds embedding_multiplier into the one shared matrix
  // and loses lm_head_multiplier, so `output` is written explicitly as the embedding times lm_head_multiplier. (A
  // tied file, llama.cpp's or another writer's, has no `output` and is read tied, as llama.cpp reads it.)
  n.add(c.tie_embeddings ? "model.embed_tokens.weight" : "lm_head.weight", "output.weight", {c.vocab_size, d});
  for (int64_t i = 0; i < c.n_layer; ++i) {
    const std::string b = "blk." + std::to_string(i) + ".", p = "model.layers." + std::to_string(i) + ".";
    n.add(p + "input_layernorm.weight", b + "attn_norm.weight", {d});
    mamba2_names(n, c, p + "mamba.", b);
    attention_names(n, c, p + "self_attn.", b);
    // No ".weight": llama.cpp maps the whole name model.layers.N.pre_ff_layernorm.weight to FFN_PRE_NORM
    // ("blk.N.ffn_norm") for falcon-h1, and its loader asks for exactly that.
    n.add(p + "pre_ff_layernorm.weight", b + "ffn_norm", {d});
    const std::string f = p + "feed_forward.";
    n.add(f + "gate_proj.weight", b + "ffn_gate.weight", {m, d});
    n.add(f + "up_proj.weight", b + "ffn_up.weight", {m, d});
    n.add(f + "down_proj.weight", b + "ffn_down.weight", {d, m});
    if (c.mlp_bias) {
      n.add(f + "gate_proj.bias", b + "ffn_gate.bias", {m});
      n.add(f + "up_proj.bias", b + "ffn_up.bias", {m});
      n.add(f + "down_proj.bias", b + "ffn_down.bias", {d});
    }
  }
  // The multipliers folded as llama.cpp's converter (conversion/falcon_h1.py) folds them: the embedding and lm_head;
  // q, k, v times attention_in_multiplier (k also key_multiplier, first), o times attention_out_multiplier; in_proj
  // times ssm_in_multiplier, then its [z | x | B | C | dt] row blocks times ssm_multipliers; out_proj times
  // ssm_out_multiplier; the MLP's gate (weight and bias: transformers scales gate(x)) and down (likewise).
  // Exact for these transformers computations because each multiplier scales a projection's input or its whole
  // output; biases of projections whose input is scaled have no such fold and are refused (gguf_check_writable).
  const int64_t big = std::numeric_limits<int64_t>::max();
  auto all = [big](std::vector<double> f) { return std::vector<GgufTensorName::Scale>{{big, std::move(f)}}; };
  auto ends_with = [](const std::string& s, const char* t) {
    const size_t k = std::strlen(t);
    return s.size() >= k && s.compare(s.size() - k, k, t) == 0;
  };
  const std::vector<double> mup = c.ssm_multipliers.empty() ? std::vector<double>(5, 1.0) : c.ssm_multipliers;
  const int64_t gn = c.n_groups * c.d_state;
  for (GgufTensorName& t : n.list) {
    const std::string& g = t.gguf;
    std::vector<GgufTensorName::Scale> s;
    if (g == "token_embd.weight") s = all({c.embedding_multiplier});
    else if (g == "output.weight") s = all({1.0 / c.logits_scaling});
    else if (ends_with(g, ".attn_q.weight") || ends_with(g, ".attn_v.weight")) s = all({c.attn_in_multiplier});
    else if (ends_with(g, ".attn_k.weight")) s = all({c.key_multiplier, c.attn_in_multiplier});
    else if (ends_with(g, ".attn_output.weight")) s = all({c.attn_out_multiplier});
    else if (ends_with(g, ".ssm_out.weight")) s = all({c.ssm_out_multiplier});
    else if (ends_with(g, ".ffn_gate.weight") || ends_with(g, ".ffn_gate.bias")) s = all({c.mlp_gate_multiplier});
    else if (ends_with(g, ".ffn_down.weight") || ends_with(g, ".ffn_down.bias")) s = all({c.mlp_down_multiplier});
    else if (ends_with(g, ".ssm_in.weight")) {
      const int64_t di = c.d_inner;
      const int64_t ends[5] = {di, 2 * di, 2 * di + gn, 2 * di + 2 * gn, big};
      for (int k = 0; k < 5; ++k) s.push_back({ends[k], {c.ssm_in_multiplier, mup[static_cast<size_t>(k)]}});
    }
    bool identity = true;
    for (const auto& seg : s)
      for (double f : seg.factors) identity = identity && f == 1.0;
    if (!identity) t.scale = std::move(s);
  }
}

int64_t positive(const GgufFile& f, const std::string& key) {
  const int64_t v = f.get_int(key);
  if (v < 1 || v > (int64_t(1) << 32)) fail(f.path(), ": key '", key, "' is ", v, "; expected a positive size");
  return v;
}

// A per-layer integer array (or a scalar meaning every layer), as llama.cpp writes head_count_kv and
// feed_forward_length for hybrids.
std::vector<int64_t> per_layer(const GgufFile& f, const std::string& key, int64_t n_layer) {
  const GgufValue* v = f.find(key);
  if (!v) return std::vector<int64_t>(static_cast<size_t>(n_layer), 0);
  if (!v->is_int() || v->type == GgufType::BOOL) fail(f.path(), ": key '", key, "' must hold integers");
  if (!v->is_array) return std::vector<int64_t>(static_cast<size_t>(n_layer), v->ints[0]);
  if (static_cast<int64_t>(v->ints.size()) != n_layer)
    fail(f.path(), ": key '", key, "' has ", v->ints.size(), " entries; expected one per layer (", n_layer, ")");
  for (int64_t x : v->ints)
    if (x < 0 || x > (int64_t(1) << 32)) fail(f.path(), ": key '", key, "' holds ", x, "; expected a size");
  return v->ints;
}

// expert_count / expert_used_count, checked as llama.cpp checks them (0 < used <= count).
void expert_counts(const GgufFile& f, const std::string& a, MoeConfig& m) {
  m.n_experts = positive(f, a + ".expert_count");
  m.top_k = positive(f, a + ".expert_used_count");
  if (m.n_experts > 65536 || m.top_k > m.n_experts)
    fail(f.path(), ": key '", a, ".expert_used_count' is ", m.top_k, " of ", m.n_experts,
         " experts (expert_count); expected 1 to expert_count, at most 65536");
}

// nemotron_h_moe: sigmoid routing over expert_count experts, with exp_probs_b (e_score_correction_bias) in the choice,
// grouped where expert_group_count > 1, the chosen weights normalised where expert_weights_norm and scaled by
// expert_weights_scale (0 or absent: 1, as llama.cpp reads it); relu2 experts of expert_feed_forward_length (else
// the layers' feed_forward_length) beside one shared expert of expert_shared_feed_forward_length.
void nemotron_moe_config(const GgufFile& f, const std::string& a, ModelConfig& c) {
  MoeConfig& m = c.moe;
  expert_counts(f, a, m);
  m.routing = MoeRouting::SigmoidGrouped;
  m.act = MlpAct::Relu2;
  const std::vector<int64_t> ff = per_layer(f, a + ".feed_forward_length", c.n_layer);
  int64_t width = 0;
  for (int64_t x : ff)
    if (x > 0) {
      if (width && width != x) fail(f.path(), ": expert layers with different feed_forward_length (", width, ", ", x, ")");
      width = x;
    }
  m.expert_size = f.find(a + ".expert_feed_forward_length") ? positive(f, a + ".expert_feed_forward_length") : width;
  if (m.expert_size < 1) fail(f.path(), ": no expert width (expert_feed_forward_length, feed_forward_length)");
  m.shared_size = positive(f, a + ".expert_shared_feed_forward_length");
  m.norm_topk_prob = f.get_bool(a + ".expert_weights_norm", false);
  const double scale = f.get_float(a + ".expert_weights_scale", 0.0);
  m.routed_scaling = scale == 0.0 ? 1.0 : scale;
  m.n_group = std::max<int64_t>(1, f.get_int(a + ".expert_group_count", 1));
  m.topk_group = m.n_group > 1 ? positive(f, a + ".expert_group_used_count") : 1;
  c.mlp_size = 0;
  c.mlp_bias = false;
}

// granitehybrid with experts: softmax over the chosen experts' logits (llama.cpp: softmax over all, the chosen
// renormalised: the same), SwiGLU experts of feed_forward_length, the shared MLP (ffn_*_shexp) of
// expert_shared_feed_forward_length, in every layer.
void granite_moe_config(const GgufFile& f, const std::string& a, ModelConfig& c) {
  MoeConfig& m = c.moe;
  expert_counts(f, a, m);
  m.routing = MoeRouting::SoftmaxChosen;
  m.act = MlpAct::SiluGated;
  m.expert_size = c.mlp_size;
  if (!f.find(a + ".expert_shared_feed_forward_length"))
    fail(f.path(), ": a granitehybrid file with experts but no shared expert (",  a,
         ".expert_shared_feed_forward_length): mambacpp runs Granite-4.0-H's MoE with its shared MLP only");
  c.mlp_size = positive(f, a + ".expert_shared_feed_forward_length");
  c.moe_layer_period = 1;
  c.moe_layer_offset = 0;
}

// jamba: Mamba-1 layers (dt / B / C normalised with weights) where head_count_kv is 0, NoPE attention elsewhere, a
// SwiGLU MLP after every mixer; expert layers are those holding an ffn_gate_inp (the file has no period key), which
// must fall every p layers from an offset o, as transformers' Jamba places them.
void jamba_config(const GgufFile& f, const std::string& a, ModelConfig& c) {
  c.mixer_rms_eps = c.norm_eps;
  c.residual_in_fp32 = true;
  c.n_attn_heads = positive(f, a + ".attention.head_count");
  if (c.d_model % c.n_attn_heads != 0)
    fail(f.path(), ": embedding_length ", c.d_model, " is not a multiple of attention.head_count ", c.n_attn_heads);
  c.attn_head_dim = c.d_model / c.n_attn_heads;
  const std::vector<int64_t> kv = per_layer(f, a + ".attention.head_count_kv", c.n_layer);
  for (int64_t i = 0; i < c.n_layer; ++i) {
    const int64_t h = kv[static_cast<size_t>(i)];
    if (h > 0 && c.n_kv_heads && h != c.n_kv_heads)
      fail(f.path(), ": attention layers with different head_count_kv (", c.n_kv_heads, ", ", h, ")");
    if (h > 0) c.n_kv_heads = h;
    c.layers.push_back(h > 0 ? LayerKind::Attention : LayerKind::Mamba1);
  }
  c.mlp_after_mixer = true;
  c.mlp_act = MlpAct::SiluGated;
  c.mlp_size = positive(f, a + ".feed_forward_length");
  std::vector<int64_t> expert_layers;
  for (int64_t i = 0; i < c.n_layer; ++i)
    if (f.tensor("blk." + std::to_string(i) + ".ffn_gate_inp.weight")) expert_layers.push_back(i);
  if (expert_layers.empty()) return;
  MoeConfig& m = c.moe;
  expert_counts(f, a, m);
  m.routing = MoeRouting::SoftmaxAll;
  m.act = MlpAct::SiluGated;
  m.expert_size = c.mlp_size;
  const int64_t o = expert_layers[0];
  const int64_t p = expert_layers.size() > 1 ? expert_layers[1] - expert_layers[0] : c.n_layer;
  for (int64_t i = 0; i < c.n_layer; ++i) {
    const bool has = std::find(expert_layers.begin(), expert_layers.end(), i) != expert_layers.end();
    if (has != (i >= o && (i - o) % p == 0) || o >= p)
      fail(f.path(), ": the layers holding ffn_gate_inp (expert layers) do not fall every p layers from an offset "
           "below p, as Jamba places them (layer ", i, ")");
  }
  c.moe_layer_period = p;
  c.moe_layer_offset = o;
}

const GgufTensor& need_tensor(const GgufFile& f, const std::string& name) {
  const GgufTensor* t = f.tensor(name);
  if (!t) fail(f.path(), ": missing tensor '", name, "'");
  return *t;
}

}  // namespace

int64_t gguf_head_permuted_source(int64_t i, int64_t n, int64_t heads) {
  const int64_t d = n / heads, h = i / d, k = i % d;
  return h * d + (k % 2) * (d / 2) + k / 2;
}

std::string gguf_arch_name(const ModelConfig& c) {
  switch (c.family) {
    case Family::Mamba: return c.arch == Arch::Mamba1 ? "mamba" : "mamba2";
    // llama.cpp's converter names a Nemotron-H with experts nemotron_h_moe (its MoE tensors and keys).
    case Family::NemotronH: return c.moe.n_experts > 0 ? "nemotron_h_moe" : "nemotron_h";
    case Family::GraniteHybrid:
    case Family::Bamba: return "granitehybrid";
    case Family::FalconH1: return "falcon-h1";
    case Family::Jamba: return "jamba";
  }
  fail("GGUF: no llama.cpp architecture for ", family_name(c.family), " models");
}

std::vector<GgufTensorName> gguf_tensor_names(const ModelConfig& c) {
  Names n;
  if (c.family == Family::FalconH1) {
    falcon_h1_names(n, c);
    return n.list;
  }
  if (c.family == Family::Jamba) {
    jamba_names(n, c);
    return n.list;
  }
  const bool pure = !c.hybrid();
  const std::string root = pure ? "backbone." : "model.";
  if (pure) {
    n.add("backbone.embeddings.weight", "token_embd.weight", {c.vocab_size, c.d_model});
    n.add("backbone.norm_f.weight", "output_norm.weight", {c.d_model});
  } else if (c.family == Family::NemotronH) {
    n.add("model.embeddings.weight", "token_embd.weight", {c.vocab_size, c.d_model});
    n.add("model.norm_f.weight", "output_norm.weight", {c.d_model});
  } else {
    n.add("model.embed_tokens.weight", "token_embd.weight", {c.vocab_size, c.d_model});
    n.add(c.family == Family::Bamba ? "model.final_layernorm.weight" : "model.norm.weight", "output_norm.weight",
          {c.d_model});
  }
  if (!c.tie_embeddings) n.add("lm_head.weight", "output.weight", {c.vocab_size, c.d_model});
  for (int64_t i = 0; i < c.n_layer; ++i) {
    const std::string b = "blk." + std::to_string(i) + ".";
    const std::string p = root + "layers." + std::to_string(i) + ".";
    const LayerKind kind = c.layer_kind(i);
    if (pure) {
      const std::string m = p + "mixer.";
      n.add(p + "norm.weight", b + "attn_norm.weight", {c.d_model});
      if (kind == LayerKind::Mamba2) {
        mamba2_names(n, c, m, b);
        continue;
      }
      n.add(m + "in_proj.weight", b + "ssm_in.weight", {c.in_proj_size(), c.d_model});
      if (c.use_bias) n.add(m + "in_proj.bias", b + "ssm_in.bias", {c.in_proj_size()});
      n.add(m + "conv1d.weight", b + "ssm_conv1d.weight", {c.d_inner, 1, c.d_conv}, {c.d_inner, c.d_conv});
      if (c.use_conv_bias) n.add(m + "conv1d.bias", b + "ssm_conv1d.bias", {c.d_inner});
      n.add(m + "x_proj.weight", b + "ssm_x.weight", {c.dt_rank + 2 * c.d_state, c.d_inner});
      n.add(m + "dt_proj.weight", b + "ssm_dt.weight", {c.d_inner, c.dt_rank});
      n.add(m + "dt_proj.bias", b + "ssm_dt.bias", {c.d_inner});
      n.add(m + "A_log", b + "ssm_a", {c.d_inner, c.d_state}, {}, GgufConversion::NegExp);
      n.add(m + "D", b + "ssm_d", {c.d_inner});
      n.add(m + "out_proj.weight", b + "ssm_out.weight", {c.d_model, c.d_inner});
      if (c.use_bias) n.add(m + "out_proj.bias", b + "ssm_out.bias", {c.d_model});
      continue;
    }
    const int64_t mlp = c.mlp_size;
    if (c.family == Family::NemotronH) {
      const std::string mx = p + "mixer.";
      n.add(p + "norm.weight", b + "attn_norm.weight", {c.d_model});
      if (kind == LayerKind::Mamba2) mamba2_names(n, c, mx, b);
      else if (kind == LayerKind::Attention) attention_names(n, c, mx, b);
      else if (kind == LayerKind::MoE) nemotron_moe_names(n, c, mx, b);
      else {
        n.add(mx + "up_proj.weight", b + "ffn_up.weight", {mlp, c.d_model});
        n.add(mx + "down_proj.weight", b + "ffn_down.weight", {c.d_model, mlp});
        if (c.mlp_bias) {
          n.add(mx + "up_proj.bias", b + "ffn_up.bias", {mlp});
          n.add(mx + "down_proj.bias", b + "ffn_down.bias", {c.d_model});
        }
      }
      continue;
    }
    // Granite-4.0-H, and Bamba (which llama.cpp converts to the same architecture).
    n.add(p + "input_layernorm.weight", b + "attn_norm.weight", {c.d_model});
    if (kind == LayerKind::Mamba2) mamba2_names(n, c, p + "mamba.", b);
    else attention_names(n, c, p + "self_attn.", b);
    if (c.family == Family::Bamba) {
      n.add(p + "pre_ff_layernorm.weight", b + "ffn_norm.weight", {c.d_model});
      n.add(p + "feed_forward.gate_proj.weight", b + "ffn_gate.weight", {mlp, c.d_model});
      n.add(p + "feed_forward.up_proj.weight", b + "ffn_up.weight", {mlp, c.d_model});
      n.add(p + "feed_forward.down_proj.weight", b + "ffn_down.weight", {c.d_model, mlp});
      continue;
    }
    n.add(p + "post_attention_layernorm.weight", b + "ffn_norm.weight", {c.d_model});
    // With experts, llama.cpp's converter names the shared MLP the shared expert (ffn_*_shexp).
    const std::string sh = c.mlp_has_experts(i) ? "_shexp" : "";
    n.add(p + "shared_mlp.input_linear.weight", b + "ffn_gate" + sh + ".weight", {2 * mlp, c.d_model},
          {mlp, c.d_model}, GgufConversion::GateHalf);
    n.add(p + "shared_mlp.input_linear.weight", b + "ffn_up" + sh + ".weight", {2 * mlp, c.d_model}, {mlp, c.d_model},
          GgufConversion::UpHalf);
    n.add(p + "shared_mlp.output_linear.weight", b + "ffn_down" + sh + ".weight", {c.d_model, mlp});
    if (c.mlp_has_experts(i)) {
      // block_sparse_moe: input_linear [E, 2I, D] (gate rows, then up rows, per expert), output_linear [E, D, I],
      // router.layer (transformers 5: experts.gate_up_proj / experts.down_proj, router.weight).
      const std::string e = p + "block_sparse_moe.";
      const int64_t E = c.moe.n_experts, I = c.moe.expert_size, D = c.d_model;
      n.add(e + "router.layer.weight", b + "ffn_gate_inp.weight", {E, D}).alt = {e + "router.weight"};
      n.experts(e + "input_linear.weight", b + "ffn_gate_exps.weight", E, I, D, GgufConversion::GateHalf, "",
                {e + "experts.gate_up_proj"});
      n.experts(e + "input_linear.weight", b + "ffn_up_exps.weight", E, I, D, GgufConversion::UpHalf, "",
                {e + "experts.gate_up_proj"});
      n.experts(e + "output_linear.weight", b + "ffn_down_exps.weight", E, D, I, GgufConversion::Plain, "",
                {e + "experts.down_proj"});
    }
  }
  return n.list;
}

void gguf_check_writable(const ModelConfig& c) {
  if (c.arch == Arch::Mamba1 && c.use_bias)
    fail("GGUF: llama.cpp's mamba architecture has no slot for in_proj / out_proj biases (use_bias); this model "
         "cannot be written for it");
  if (c.family == Family::Jamba) {
    const char* why = c.use_bias ? "in_proj / out_proj biases (mamba_proj_bias): llama.cpp's jamba has no slot for them"
                      : !c.use_conv_bias ? "no conv1d bias (mamba_conv_bias false): llama.cpp's jamba requires one"
                      : c.d_inner != 2 * c.d_model ? "mamba_expand other than 2: llama.cpp's jamba supports only 2"
                                                   : nullptr;
    if (why) fail("GGUF: this jamba model cannot be written for llama.cpp's jamba (", why, ")");
    return;
  }
  if (c.family == Family::NemotronH && c.moe.n_experts > 0) {
    const char* why = nullptr;
    for (int64_t i = 0; i < c.n_layer; ++i)
      if (c.layer_kind(i) == LayerKind::MLP)
        why = "a dense MLP layer beside the expert layers: llama.cpp's nemotron_h_moe runs every feed-forward layer as "
              "experts (its feed_forward_length array gives their width)";
    if (!why && c.moe.shared_size == 0) why = "no shared expert: llama.cpp's nemotron_h_moe requires ffn_*_shexp";
    if (!why && c.mlp_bias) why = "shared-expert biases (mlp_bias): llama.cpp's nemotron_h_moe has no slot for them";
    if (why) fail("GGUF: this nemotron_h model cannot be written for llama.cpp's nemotron_h_moe (", why, ")");
    return;
  }
  if (c.family != Family::FalconH1) return;
  const char* why = nullptr;
  if (c.use_bias) why = "mamba_proj_bias: llama.cpp's falcon-h1 has no ssm_in bias";
  else if (c.mamba_out_proj_bias) why = "projectors_bias: llama.cpp's falcon-h1 has no ssm_out bias";
  else if (c.attn_bias)
    why = "attention_bias: llama.cpp's falcon-h1 never adds attn_output.bias, and its converter scales the q / k "
          "biases by attention_in_multiplier, which transformers applies to the input only";
  else if (c.mamba_rms_norm && c.mamba_norm_before_gate)
    why = "mamba_norm_before_gate with mamba_rms_norm: llama.cpp's falcon-h1 normalises after the gate, "
          "norm(y * silu(z)), not norm(y) * silu(z)";
  if (why)
    fail("GGUF: this falcon_h1 model cannot be written for llama.cpp's falcon-h1 (", why, "); it would load there "
         "and give wrong logits");
}

void gguf_write_config(const ModelConfig& c, GgufWriter& w) {
  gguf_check_writable(c);
  const std::string a = gguf_arch_name(c);
  w.set_string("general.architecture", a);
  w.set_u32(a + ".context_length", static_cast<uint32_t>(c.max_position > 0 ? c.max_position : 1048576));
  w.set_u32(a + ".embedding_length", static_cast<uint32_t>(c.d_model));
  w.set_u32(a + ".block_count", static_cast<uint32_t>(c.n_layer));
  w.set_u32(a + ".ssm.conv_kernel", static_cast<uint32_t>(c.d_conv));
  w.set_u32(a + ".ssm.inner_size", static_cast<uint32_t>(c.d_inner));
  w.set_u32(a + ".ssm.state_size", static_cast<uint32_t>(c.d_state));
  w.set_f32(a + ".attention.layer_norm_rms_epsilon", static_cast<float>(c.norm_eps));
  // llama.cpp's nemotron_h reads its (RMS) norms' eps from the LayerNorm key.
  if (c.family == Family::NemotronH) w.set_f32(a + ".attention.layer_norm_epsilon", static_cast<float>(c.norm_eps));
  w.set_u32(a + ".vocab_size", static_cast<uint32_t>(c.vocab_size));
  // transformers' time_step_limit (dt clamped to [min, max]): llama.cpp has no such key and ignores these.
  if (c.dt_min > 0) w.set_f32(a + ".ssm.time_step_min", static_cast<float>(c.dt_min));
  if (std::isfinite(c.dt_max)) w.set_f32(a + ".ssm.time_step_max", static_cast<float>(c.dt_max));
  if (c.arch == Arch::Mamba1) {
    w.set_u32(a + ".ssm.time_step_rank", static_cast<uint32_t>(c.dt_rank));
    w.set_bool(a + ".ssm.dt_b_c_rms", c.mixer_rms_eps > 0);
  } else {
    w.set_u32(a + ".ssm.time_step_rank", static_cast<uint32_t>(c.n_heads));
    w.set_u32(a + ".ssm.group_count", static_cast<uint32_t>(c.n_groups));
  }
  if (!c.hybrid()) {
    w.set_u32(a + ".feed_forward_length", 0);
    w.set_u32(a + ".attention.head_count", 0);
    return;
  }
  if (c.family == Family::FalconH1) {
    // As llama.cpp's converter writes them: scalars (every layer has attention, Mamba-2 and the MLP), RoPE over the
    // whole head (its default n_rot is key_length; written anyway), no multiplier keys (folded into the weights).
    w.set_u32(a + ".attention.head_count", static_cast<uint32_t>(c.n_attn_heads));
    w.set_u32(a + ".attention.head_count_kv", static_cast<uint32_t>(c.n_kv_heads));
    w.set_u32(a + ".attention.key_length", static_cast<uint32_t>(c.attn_head_dim));
    w.set_u32(a + ".attention.value_length", static_cast<uint32_t>(c.attn_head_dim));
    w.set_u32(a + ".feed_forward_length", static_cast<uint32_t>(c.mlp_size));
    w.set_u32(a + ".rope.dimension_count", static_cast<uint32_t>(c.rope_theta > 0 ? c.rope_dim : 0));
    if (c.rope_theta > 0) w.set_f32(a + ".rope.freq_base", static_cast<float>(c.rope_theta));
    return;
  }
  std::vector<int64_t> kv, ff;
  for (int64_t i = 0; i < c.n_layer; ++i) {
    kv.push_back(c.layer_kind(i) == LayerKind::Attention ? c.n_kv_heads : 0);
    // nemotron_h_moe: the expert width marks an expert layer (as its converter writes it).
    ff.push_back(c.layer_kind(i) == LayerKind::MLP ? c.mlp_size
                 : c.layer_kind(i) == LayerKind::MoE ? c.moe.expert_size
                                                     : 0);
  }
  w.set_u32(a + ".attention.head_count", static_cast<uint32_t>(c.n_attn_heads));
  w.set_ints(a + ".attention.head_count_kv", GgufType::I32, kv);
  if (c.family == Family::Jamba) {
    // As conversion/jamba.py writes it: no key_length (head_dim = d_model / heads), the MLP / expert width, the
    // expert counts; expert layers are those with an ffn_gate_inp.
    w.set_u32(a + ".feed_forward_length", static_cast<uint32_t>(c.mlp_size));
    if (c.moe.n_experts > 0) {
      w.set_u32(a + ".expert_count", static_cast<uint32_t>(c.moe.n_experts));
      w.set_u32(a + ".expert_used_count", static_cast<uint32_t>(c.moe.top_k));
    }
    return;
  }
  w.set_u32(a + ".attention.key_length", static_cast<uint32_t>(c.attn_head_dim));
  w.set_u32(a + ".attention.value_length", static_cast<uint32_t>(c.attn_head_dim));
  if (c.family == Family::NemotronH) {
    w.set_ints(a + ".feed_forward_length", GgufType::I32, ff);
    if (c.moe.n_experts > 0) {
      const MoeConfig& m = c.moe;
      w.set_u32(a + ".expert_count", static_cast<uint32_t>(m.n_experts));
      w.set_u32(a + ".expert_used_count", static_cast<uint32_t>(m.top_k));
      w.set_u32(a + ".expert_feed_forward_length", static_cast<uint32_t>(m.expert_size));
      w.set_u32(a + ".expert_shared_feed_forward_length", static_cast<uint32_t>(m.shared_size));
      w.set_u32(a + ".expert_shared_count", 1);
      w.set_bool(a + ".expert_weights_norm", m.norm_topk_prob);
      w.set_f32(a + ".expert_weights_scale", static_cast<float>(m.routed_scaling));
      // Groups: llama.cpp requires 0 < expert_group_used_count < expert_group_count where there are several (its
      // converter writes only the count). Choosing every group is no grouping at all: written as one group.
      const bool grouped = m.n_group > 1 && m.topk_group < m.n_group;
      w.set_u32(a + ".expert_group_count", static_cast<uint32_t>(grouped ? m.n_group : 1));
      if (grouped) w.set_u32(a + ".expert_group_used_count", static_cast<uint32_t>(m.topk_group));
    }
  } else {
    // Granite-4.0-H with experts (conversion/granite.py): feed_forward_length is the routed experts' width and the
    // shared MLP's is expert_shared_feed_forward_length.
    const bool moe = c.moe.n_experts > 0;
    w.set_u32(a + ".feed_forward_length", static_cast<uint32_t>(moe ? c.moe.expert_size : c.mlp_size));
    if (moe) {
      w.set_u32(a + ".expert_count", static_cast<uint32_t>(c.moe.n_experts));
      w.set_u32(a + ".expert_used_count", static_cast<uint32_t>(c.moe.top_k));
      w.set_u32(a + ".expert_shared_feed_forward_length", static_cast<uint32_t>(c.mlp_size));
    }
    w.set_f32(a + ".embedding_scale", static_cast<float>(c.embedding_multiplier));
    w.set_f32(a + ".residual_scale", static_cast<float>(c.residual_multiplier));
    w.set_f32(a + ".logit_scale", static_cast<float>(c.logits_scaling));
    if (c.attn_scale > 0) w.set_f32(a + ".attention.scale", static_cast<float>(c.attn_scale));
    w.set_u32(a + ".rope.dimension_count", static_cast<uint32_t>(c.rope_theta > 0 ? c.rope_dim : 0));
    if (c.rope_theta > 0) w.set_f32(a + ".rope.freq_base", static_cast<float>(c.rope_theta));
    // llama.cpp's granitehybrid switches RoPE off where this flag is false (its converter sets it for Bamba, clears
    // it for Granite-4.0-H, whose files still carry a rope.dimension_count); absent, RoPE is on.
    w.set_bool(a + ".rope.scaling.finetuned", c.rope_theta > 0);
  }
}

ModelConfig gguf_model_config(const GgufFile& f) {
  const std::string a = f.get_string("general.architecture");
  ModelConfig c;
  if (a == "mamba") {
    c.arch = Arch::Mamba1;
  } else if (a == "mamba2") {
    c.arch = Arch::Mamba2;
  } else if (a == "nemotron_h" || a == "nemotron_h_moe") {
    c.family = Family::NemotronH;
  } else if (a == "granitehybrid") {
    c.family = Family::GraniteHybrid;
  } else if (a == "falcon-h1") {
    c.family = Family::FalconH1;
  } else if (a == "jamba") {
    c.family = Family::Jamba;
    c.arch = Arch::Mamba1;
  } else if (a == "granitemoe" || a == "plamo2" || a == "lfm2") {
    fail(f.path(), ": GGUF architecture '", a, "' is not one mambacpp reads yet (it reads mamba, mamba2, nemotron_h, "
         "nemotron_h_moe, granitehybrid, falcon-h1 and jamba files; the model's checkpoint directory runs)");
  } else {
    fail(f.path(), ": unknown GGUF architecture '", a, "'; mambacpp runs mamba, mamba2, nemotron_h, nemotron_h_moe, "
         "granitehybrid, falcon-h1 and jamba");
  }
  // llama.cpp's converter can append Nemotron-H MoE's multi-token-prediction block as the last block(s); mambacpp does
  // not run it (its checkpoint loader skips mtp.*), and such a block's tensors have no place in this config.
  if (const int64_t nextn = f.get_int(a + ".nextn_predict_layers", 0); nextn > 0)
    fail(f.path(), ": the file holds ", nextn, " multi-token-prediction block(s) (", a, ".nextn_predict_layers), which "
         "mambacpp does not run; convert without them (convert_hf_to_gguf.py --no-mtp)");
  c.d_model = positive(f, a + ".embedding_length");
  c.n_layer = positive(f, a + ".block_count");
  if (c.n_layer > 4096) fail(f.path(), ": key '", a, ".block_count' is ", c.n_layer, "; expected at most 4096");
  c.d_conv = positive(f, a + ".ssm.conv_kernel");
  c.d_inner = positive(f, a + ".ssm.inner_size");
  c.d_state = positive(f, a + ".ssm.state_size");
  c.norm_eps = f.get_float(a + ".attention.layer_norm_rms_epsilon", f.get_float(a + ".attention.layer_norm_epsilon", 1e-5));
  c.dt_min = f.get_float(a + ".ssm.time_step_min", 0.0);
  c.dt_max = f.get_float(a + ".ssm.time_step_max", std::numeric_limits<double>::infinity());
  const GgufTensor& embd = need_tensor(f, "token_embd.weight");
  if (embd.n_dims != 2 || embd.ne[0] != c.d_model)
    fail(f.path(), ": tensor 'token_embd.weight' has shape ", embd.shape_string(), "; expected [vocab, ", c.d_model,
         "]");
  c.vocab_size = embd.ne[1];
  c.tie_embeddings = f.tensor("output.weight") == nullptr;
  // Any Mamba layer's (the first layer of a hybrid may be attention).
  auto any_tensor = [&f](const char* tail) {
    const size_t k = std::strlen(tail);
    for (const GgufTensor& t : f.tensors())
      if (t.name.size() >= k && t.name.compare(t.name.size() - k, k, tail) == 0) return true;
    return false;
  };
  c.use_conv_bias = any_tensor(".ssm_conv1d.bias");
  c.use_bias = any_tensor(".ssm_in.bias");
  if (c.arch == Arch::Mamba1) {
    c.dt_rank = positive(f, a + ".ssm.time_step_rank");
    if (f.get_bool(a + ".ssm.dt_b_c_rms", false)) c.mixer_rms_eps = c.norm_eps;
    if (c.family == Family::Jamba) jamba_config(f, a, c);
  } else {
    c.arch = Arch::Mamba2;
    c.n_heads = positive(f, a + ".ssm.time_step_rank");
    c.n_groups = f.get_int(a + ".ssm.group_count", 1);
    if (c.n_groups < 1 || c.d_inner % c.n_heads != 0)
      fail(f.path(), ": ssm.inner_size ", c.d_inner, " is not a multiple of the head count ", c.n_heads,
           " (ssm.time_step_rank), or ssm.group_count ", c.n_groups, " is not positive");
    c.head_dim = c.d_inner / c.n_heads;
  }
  if (c.family == Family::FalconH1) {
    // Every layer runs Mamba-2 and attention side by side, then the gated SiLU MLP. The muP multipliers are folded
    // into the weights (llama.cpp's converter), so they all stay 1 here; no bias slots but the MLP's (and conv's).
    c.layers.assign(static_cast<size_t>(c.n_layer), LayerKind::ParallelHybrid);
    c.residual_in_fp32 = true;
    c.use_bias = false;  // an ssm_in.bias is then refused as a tensor falcon-h1 does not have
    c.n_attn_heads = positive(f, a + ".attention.head_count");
    const std::vector<int64_t> kv = per_layer(f, a + ".attention.head_count_kv", c.n_layer);
    c.n_kv_heads = kv.empty() ? 0 : kv[0];
    for (int64_t x : kv)
      if (x != c.n_kv_heads || x < 1)
        fail(f.path(), ": key '", a, ".attention.head_count_kv' must give every layer the same positive count");
    c.attn_head_dim = f.get_int(a + ".attention.key_length", c.d_model / c.n_attn_heads);
    c.mlp_size = positive(f, a + ".feed_forward_length");
    c.mlp_act = MlpAct::SiluGated;
    c.mlp_bias = f.tensor("blk.0.ffn_gate.bias") != nullptr;
    c.mamba_rms_norm = f.tensor("blk.0.ssm_norm.weight") != nullptr;
    c.mamba_norm_before_gate = false;  // llama.cpp's only order: norm(y * silu(z))
    c.gated_norm_groups = c.n_groups;
    c.rope_theta = f.get_float(a + ".rope.freq_base", 10000.0);
    c.rope_dim = f.get_int(a + ".rope.dimension_count", c.attn_head_dim);
    if (c.rope_dim == 0) c.rope_theta = 0;  // as written for a model without RoPE
    c.max_position = f.get_int(a + ".context_length", 0);
  }
  if (c.family == Family::NemotronH || c.family == Family::GraniteHybrid) {
    const std::vector<int64_t> kv = per_layer(f, a + ".attention.head_count_kv", c.n_layer);
    const bool nemotron = c.family == Family::NemotronH;
    const std::vector<int64_t> ff = nemotron ? per_layer(f, a + ".feed_forward_length", c.n_layer)
                                             : std::vector<int64_t>(static_cast<size_t>(c.n_layer), 0);
    for (int64_t i = 0; i < c.n_layer; ++i) {
      const size_t l = static_cast<size_t>(i);
      if (kv[l] > 0 && ff[l] > 0)
        fail(f.path(), ": layer ", i, " has both attention heads and a feed-forward length; a Nemotron-H layer is one");
      if (kv[l] > 0) {
        c.layers.push_back(LayerKind::Attention);
        if (c.n_kv_heads && c.n_kv_heads != kv[l])
          fail(f.path(), ": attention layers with different head_count_kv (", c.n_kv_heads, ", ", kv[l], ")");
        c.n_kv_heads = kv[l];
      } else if (ff[l] > 0 && a == "nemotron_h_moe") {
        c.layers.push_back(LayerKind::MoE);  // every feed-forward layer of nemotron_h_moe is an expert layer
      } else if (ff[l] > 0) {
        c.layers.push_back(LayerKind::MLP);
        if (c.mlp_size && c.mlp_size != ff[l])
          fail(f.path(), ": MLP layers with different feed_forward_length (", c.mlp_size, ", ", ff[l], ")");
        c.mlp_size = ff[l];
      } else {
        c.layers.push_back(LayerKind::Mamba2);
      }
    }
    if (c.has_attention()) {
      c.n_attn_heads = positive(f, a + ".attention.head_count");
      c.attn_head_dim = f.get_int(a + ".attention.key_length", c.d_model / c.n_attn_heads);
    }
    c.attn_bias = f.tensor("blk." + std::to_string([&] {
      for (int64_t i = 0; i < c.n_layer; ++i)
        if (c.layer_kind(i) == LayerKind::Attention) return i;
      return int64_t(0);
    }()) + ".attn_q.bias") != nullptr;
    if (nemotron) {
      c.mlp_act = MlpAct::Relu2;
      c.gated_norm_groups = c.n_groups;
      for (const GgufTensor& t : f.tensors())
        if (t.name.find("ffn_up.bias") != std::string::npos) c.mlp_bias = true;
      if (a == "nemotron_h_moe") nemotron_moe_config(f, a, c);
    } else {
      c.mlp_after_mixer = true;
      c.mlp_act = MlpAct::SiluGated;
      c.gated_norm_groups = 1;
      c.mlp_size = positive(f, a + ".feed_forward_length");
      if (f.get_int(a + ".expert_count", 0) > 0) granite_moe_config(f, a, c);
      c.embedding_multiplier = f.get_float(a + ".embedding_scale", 1.0);
      c.residual_multiplier = f.get_float(a + ".residual_scale", 1.0);
      c.logits_scaling = f.get_float(a + ".logit_scale", 1.0);
      c.attn_scale = f.get_float(a + ".attention.scale", 0.0);
      // RoPE where llama.cpp applies it: unless rope.scaling.finetuned is false (absent: on, as in llama.cpp).
      c.rope_dim = f.get_bool(a + ".rope.scaling.finetuned", true) ? f.get_int(a + ".rope.dimension_count", 0) : 0;
      if (c.rope_dim > 0) {
        c.rope_theta = f.get_float(a + ".rope.freq_base", 10000.0);
        c.max_position = f.get_int(a + ".context_length", 0);
      }
    }
  }
  auto token = [&](const std::string& key) {
    const int64_t v = f.get_int(key, -1);
    return v >= 0 && v < (int64_t(1) << 31) ? v : -1;
  };
  c.bos_token_id = token("tokenizer.ggml.bos_token_id");
  c.eos_token_id = token("tokenizer.ggml.eos_token_id");
  c.pad_token_id = token("tokenizer.ggml.padding_token_id");
  try {
    c.validate();
  } catch (const Error& e) {
    fail(f.path(), ": the GGUF metadata gives an inconsistent model: ", e.what());
  }
  return c;
}

struct GgufModel::Converted {
  // hf name -> the weight handed to the binder (views into the file, or into `owned`).
  std::map<std::string, Weight> weights;
  std::vector<std::vector<uint8_t>> owned;
};

GgufModel::~GgufModel() = default;

GgufModel::GgufModel(const std::string& path)
    : file_(std::make_unique<GgufFile>(path)), converted_(std::make_unique<Converted>()) {
  const GgufFile& f = *file_;
  config_ = gguf_model_config(f);
  names_ = gguf_tensor_names(config_);
  std::set<std::string> known;
  for (const GgufTensorName& n : names_) known.insert(n.gguf);
  for (const GgufTensor& t : f.tensors())
    if (!known.count(t.name))
      fail(path, ": tensor '", t.name, "' is not one a ", gguf_arch_name(config_), " model with ", config_.n_layer,
           " layers has (mambacpp refuses rather than silently ignore weights)");

  // Granite's ffn_gate + ffn_up halves, collected then joined below.
  std::map<std::string, std::pair<const GgufTensor*, const GgufTensor*>> halves;
  for (const GgufTensorName& n : names_) {
    const GgufTensor* t = f.tensor(n.gguf);
    if (!t) continue;  // the binder reports what it needs and cannot find
    const Shape stored = t->shape();
    // ggml pads shapes with 1s, and its writers differ in what they keep: llama.cpp's converter stores ssm_norm of one
    // group as [1, d_inner] and A / D as [heads, 1], its quantizer (ggml_n_dims) drops those 1s. Either is the
    // same tensor; a packed one must still have the expected row length.
    auto squeezed = [](const Shape& s) {
      Shape r;
      for (int64_t d : s)
        if (d != 1) r.push_back(d);
      return r;
    };
    if (stored != n.gguf_shape && (squeezed(stored) != squeezed(n.gguf_shape) ||
                                   (!is_dense(t->format) && stored.back() != n.gguf_shape.back())))
      fail(path, ": tensor '", n.gguf, "' has shape ", t->shape_string(), "; expected ", shape_str(n.gguf_shape),
           " for this ", gguf_arch_name(config_), " config");
    const bool matrix = n.hf_shape.size() >= 2 && n.gguf_shape.size() >= 2 && n.conversion != GgufConversion::NegExp;
    if (!is_dense(t->format) && !matrix)
      fail(path, ": tensor '", n.gguf, "' is stored as ", weight_format_name(t->format),
           "; only projection and embedding matrices may be quantized");
    auto* bytes = const_cast<uint8_t*>(t->data);  // read-only mapping: the views are never written through
    if (n.conversion == GgufConversion::GateHalf || n.conversion == GgufConversion::UpHalf) {
      auto& h = halves[n.hf];
      (n.conversion == GgufConversion::GateHalf ? h.first : h.second) = t;
      continue;
    }
    if (n.conversion == GgufConversion::HeadPermute) {
      // Back to transformers' order: stored row (or element) i is transformers' gguf_head_permuted_source(i).
      const int64_t units = n.hf_shape[0];  // rows of a matrix, elements of a bias
      if (n.heads < 1 || units % n.heads != 0 || (units / n.heads) % 2 != 0 || t->nbytes % static_cast<uint64_t>(units))
        fail(path, ": tensor '", n.gguf, "' of ", units, " channels cannot hold ", n.heads,
             " heads of an even size; the attention metadata disagrees with it");
      const size_t unit = static_cast<size_t>(t->nbytes / static_cast<uint64_t>(units));
      std::vector<uint8_t> out(static_cast<size_t>(t->nbytes));
      for (int64_t i = 0; i < units; ++i)
        std::memcpy(out.data() + static_cast<size_t>(gguf_head_permuted_source(i, units, n.heads)) * unit,
                    t->data + static_cast<size_t>(i) * unit, unit);
      converted_->owned.push_back(std::move(out));
      void* p = converted_->owned.back().data();
      converted_->weights[n.hf] = is_dense(t->format) ? Weight(view_of(p, dense_dtype(t->format), n.hf_shape))
                                                      : Weight::packed(t->format, p, {n.hf_shape[0], n.hf_shape[1]});
      continue;
    }
    if (n.conversion == GgufConversion::NegExp) {
      // A = -exp(A_log) back to A_log, in f32 whatever the stored dtype (log of a positive number; a value that is
      // not negative has no A_log and is refused).
      const int64_t count = numel(n.hf_shape);
      std::vector<float> a(static_cast<size_t>(count));
      convert_to_f32(t->data, dense_dtype(t->format), a.data(), count);
      std::vector<uint8_t> out(static_cast<size_t>(count) * 4);
      for (int64_t i = 0; i < count; ++i) {
        const float v = a[static_cast<size_t>(i)];
        if (!(v < 0.0f)) fail(path, ": tensor '", n.gguf, "' holds ", v, " at ", i, "; A = -exp(A_log) must be negative");
        const float l = static_cast<float>(std::log(-static_cast<double>(v)));
        std::memcpy(out.data() + 4 * i, &l, 4);
      }
      converted_->owned.push_back(std::move(out));
      TensorView view = view_of(converted_->owned.back().data(), DType::F32, n.hf_shape);
      converted_->weights[n.hf] = Weight(view);
      continue;
    }
    if (is_dense(t->format)) {
      converted_->weights[n.hf] = Weight(view_of(bytes, dense_dtype(t->format), n.hf_shape));
    } else if (n.hf_shape.size() == 3) {  // stacked experts [E, rows, cols]
      converted_->weights[n.hf] = Weight::packed(t->format, bytes, {n.hf_shape[0], n.hf_shape[1], n.hf_shape[2]});
    } else {
      converted_->weights[n.hf] = Weight::packed(t->format, bytes, {n.hf_shape[0], n.hf_shape[1]});
    }
  }
  for (const auto& [hf, h] : halves) {
    if (!h.first || !h.second) continue;  // the binder names the missing input_linear
    if (h.first->format != h.second->format)
      fail(path, ": '", h.first->name, "' (", weight_format_name(h.first->format), ") and '", h.second->name, "' (",
           weight_format_name(h.second->format), ") must share a format to be joined into ", hf);
    if (h.first->shape() != h.second->shape())
      fail(path, ": '", h.first->name, "' ", h.first->shape_string(), " and '", h.second->name, "' ",
           h.second->shape_string(), " must have one shape to be joined into ", hf);
    // Stacked experts [E, I, D] each: expert e's gate rows then its up rows ([E, 2I, D], transformers' fused
    // layout); a matrix is one "expert".
    const bool stacked = h.first->n_dims == 3;
    const int64_t E = stacked ? h.first->ne[2] : 1, rows = h.first->ne[1], cols = h.first->ne[0];
    const size_t part = static_cast<size_t>(h.first->nbytes / static_cast<uint64_t>(E));
    std::vector<uint8_t> joined(h.first->nbytes + h.second->nbytes);
    for (int64_t e = 0; e < E; ++e) {
      std::memcpy(joined.data() + 2 * part * static_cast<size_t>(e), h.first->data + part * static_cast<size_t>(e), part);
      std::memcpy(joined.data() + 2 * part * static_cast<size_t>(e) + part, h.second->data + part * static_cast<size_t>(e),
                  part);
    }
    converted_->owned.push_back(std::move(joined));
    void* p = converted_->owned.back().data();
    if (stacked)
      converted_->weights[hf] = is_dense(h.first->format)
                                    ? Weight(TensorView(p, dense_dtype(h.first->format), {E, 2 * rows, cols}))
                                    : Weight::packed(h.first->format, p, {E, 2 * rows, cols});
    else
      converted_->weights[hf] = is_dense(h.first->format)
                                    ? Weight(TensorView(p, dense_dtype(h.first->format), {2 * rows, cols}))
                                    : Weight::packed(h.first->format, p, {2 * rows, cols});
  }
  widen_packed_experts();
}

// Stacked experts in a block format, widened to f32 (each row dequantized exactly as ggml dequantizes it): the
// backends' expert kernels take dense weights until the quantized-kernels issue gives them packed ones. Only the
// expert tensors are widened; every other matrix stays packed.
void GgufModel::widen_packed_experts() {
  for (const GgufTensorName& n : names_) {
    if (n.experts == 0) continue;
    auto it = converted_->weights.find(n.hf);
    if (it == converted_->weights.end() || it->second.dense()) continue;
    const Weight& w = it->second;
    const int64_t cols = w.dim(w.ndim - 1), rows = w.numel() / cols, rb = w.data.dim(1);
    std::vector<uint8_t> out(static_cast<size_t>(w.numel()) * 4);
    auto* dst = reinterpret_cast<float*>(out.data());
    for (int64_t r = 0; r < rows; ++r)
      ggml_dequantize_row(w.format, static_cast<const uint8_t*>(w.data.data) + r * rb, cols, dst + r * cols);
    converted_->owned.push_back(std::move(out));
    const Shape shape(w.shape.begin(), w.shape.begin() + w.ndim);
    it->second = Weight(view_of(converted_->owned.back().data(), DType::F32, shape));
  }
}

std::optional<Weight> GgufModel::find(const std::string& hf_name) const {
  auto it = converted_->weights.find(hf_name);
  if (it == converted_->weights.end()) return std::nullopt;
  return it->second;
}

std::vector<std::string> GgufModel::names() const {
  std::vector<std::string> out;
  for (const auto& kv : converted_->weights) out.push_back(kv.first);
  return out;
}

}  // namespace mambacpp

namespace mambacpp {

uint64_t GgufModel::content_hash() const {
  uint64_t h = 0xcbf29ce484222325ull;
  auto mix = [&h](const void* p, size_t n) {
    const auto* b = static_cast<const uint8_t*>(p);
    for (size_t i = 0; i < n; ++i) h = (h ^ b[i]) * 0x100000001b3ull;
  };
  for (const GgufTensor& t : file_->tensors()) {
    mix(t.name.data(), t.name.size());
    const uint32_t type = ggml_type_of(t.format);
    mix(&type, 4);
    mix(t.ne.data(), sizeof(t.ne));
    mix(t.data, static_cast<size_t>(t.nbytes));
  }
  return h;
}

}  // namespace mambacpp
