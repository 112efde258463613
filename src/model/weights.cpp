#include "model/weights.h"

#include <algorithm>
#include <optional>
#include <set>
#include <sstream>

#include "mambacpp/error.h"
#include "model/moe_layer.h"

namespace mambacpp {

namespace {

class Binder {
 public:
  Binder(const TensorLookup& lookup, Backend& backend, const std::string& source)
      : lookup_(lookup), backend_(&backend), source_(source) {}
  // A binder that binds nothing: it records the name and shape of every tensor asked for (hybrid_weight_shapes).
  Binder(const TensorLookup& lookup, const std::string& source, WeightShapes* record)
      : lookup_(lookup), source_(source), record_(record) {}

  // The dense tensor `name` (norms, conv kernels, A, D, biases) with exactly `shape`; absent -> error unless optional.
  TensorView bind(const std::string& name, std::initializer_list<int64_t> shape, bool optional = false) {
    const Weight w = find({name}, shape, optional);
    if (w.empty()) return {};
    if (!w.dense())
      fail(source_, ": tensor '", name, "' is stored as ", w.describe(),
           "; only projection and embedding matrices may be quantized");
    return backend_->adopt_weight(w.data);
  }

  // A projection or embedding matrix `name` of logical shape `shape`, in any format the backend runs.
  Weight matrix(const std::string& name, std::initializer_list<int64_t> shape, bool optional = false) {
    return matrix_any({name}, shape, optional);
  }
  Weight matrix_any(std::initializer_list<std::string> names, std::initializer_list<int64_t> shape,
                    bool optional = false) {
    const Weight w = find(names, shape, optional);
    if (w.empty()) return {};
    if (!backend_->supports_weight_format(w.format))
      fail(source_, ": tensor '", *names.begin(), "' is stored as ", w.describe(), ", a format the ",
           backend_->description(), " backend has no kernels for");
    return backend_->adopt_matrix(w);
  }

  void mark_used(const std::string& name) { used_.insert(name); }
  const std::set<std::string>& used() const { return used_; }

 private:
  static std::string shape_str(std::initializer_list<int64_t> shape) {
    std::ostringstream os;
    os << '[';
    size_t i = 0;
    for (int64_t d : shape) os << (i++ ? ", " : "") << d;
    os << ']';
    return os.str();
  }

  // The first of `names` the checkpoint has, checked against `shape`; empty when none is there (and recording).
  Weight find(std::initializer_list<std::string> names, std::initializer_list<int64_t> shape, bool optional) {
    if (record_) {
      record_->emplace_back(*names.begin(), std::vector<int64_t>(shape));
      return {};
    }
    for (const std::string& name : names) {
      std::optional<Weight> w = lookup_(name);
      if (!w) continue;
      used_.insert(name);
      check_shape(name, *w, shape);
      return *w;
    }
    if (optional) return {};
    fail(source_, ": missing tensor '", *names.begin(), "' with shape ", shape_str(shape));
  }

  void check_shape(const std::string& name, const Weight& w, std::initializer_list<int64_t> shape) const {
    bool ok = w.ndim == static_cast<int>(shape.size());
    int i = 0;
    for (int64_t d : shape) ok = ok && w.dim(i++) == d;
    if (!ok)
      fail(source_, ": tensor '", name, "' has shape ", w.shape_string(), "; expected ", shape_str(shape),
           " for this config");
  }

  const TensorLookup& lookup_;
  Backend* backend_ = nullptr;
  const std::string& source_;
  std::set<std::string> used_;
  WeightShapes* record_ = nullptr;
};


void check_all_used(const Binder& b, const ModelConfig& c, const std::vector<std::string>& all_names,
                    const std::string& source);

// The Mamba-2 mixer of a hybrid layer under `m` (".../mixer." or ".../mamba.").
void bind_mamba2(Binder& b, const ModelConfig& c, const std::string& m, LayerWeights& l) {
  l.in_proj = b.matrix(m + "in_proj.weight", {c.in_proj_size(), c.d_model});
  l.conv = b.bind(m + "conv1d.weight", {c.conv_channels(), 1, c.d_conv});
  l.out_proj = b.matrix(m + "out_proj.weight", {c.d_model, c.d_inner});
  if (c.use_bias) {
    l.in_proj_bias = b.bind(m + "in_proj.bias", {c.in_proj_size()});
    l.out_proj_bias = b.bind(m + "out_proj.bias", {c.d_model});
  }
  if (c.use_conv_bias) l.conv_bias = b.bind(m + "conv1d.bias", {c.conv_channels()});
  l.dt_bias = b.bind(m + "dt_bias", {c.n_heads});
  l.A_log = b.bind(m + "A_log", {c.n_heads});
  l.D = b.bind(m + "D", {c.n_heads});
  l.gated_norm = b.bind(m + "norm.weight", {c.d_inner});
}

// The Mamba-1 mixer of a Jamba layer under `m` (".../mamba."), with its dt/B/C norms' weights.
void bind_jamba_mamba1(Binder& b, const ModelConfig& c, const std::string& m, LayerWeights& l) {
  const int64_t di = c.d_inner, n = c.d_state, r = c.dt_rank;
  l.in_proj = b.matrix(m + "in_proj.weight", {2 * di, c.d_model});
  l.conv = b.bind(m + "conv1d.weight", {di, 1, c.d_conv});
  if (c.use_conv_bias) l.conv_bias = b.bind(m + "conv1d.bias", {di});
  l.x_proj = b.matrix(m + "x_proj.weight", {r + 2 * n, di});
  l.dt_proj = b.matrix(m + "dt_proj.weight", {di, r});
  l.dt_bias = b.bind(m + "dt_proj.bias", {di});
  l.A_log = b.bind(m + "A_log", {di, n});
  l.D = b.bind(m + "D", {di});
  l.out_proj = b.matrix(m + "out_proj.weight", {c.d_model, di});
  if (c.use_bias) {
    l.in_proj_bias = b.bind(m + "in_proj.bias", {2 * di});
    l.out_proj_bias = b.bind(m + "out_proj.bias", {c.d_model});
  }
  l.dt_norm = b.bind(m + "dt_layernorm.weight", {r});
  l.b_norm = b.bind(m + "b_layernorm.weight", {n});
  l.c_norm = b.bind(m + "c_layernorm.weight", {n});
}

void bind_attention(Binder& b, const ModelConfig& c, const std::string& a, LayerWeights& l) {
  const int64_t q = c.q_dim(), kv = c.kv_dim();
  l.q_proj = b.matrix(a + "q_proj.weight", {q, c.d_model});
  l.k_proj = b.matrix(a + "k_proj.weight", {kv, c.d_model});
  l.v_proj = b.matrix(a + "v_proj.weight", {kv, c.d_model});
  l.o_proj = b.matrix(a + "o_proj.weight", {c.d_model, q});
  if (c.attn_bias) {
    l.q_bias = b.bind(a + "q_proj.bias", {q});
    l.k_bias = b.bind(a + "k_proj.bias", {kv});
    l.v_bias = b.bind(a + "v_proj.bias", {kv});
    l.o_bias = b.bind(a + "o_proj.bias", {c.d_model});
  }
}

// Falcon-H1 (FalconH1ForCausalLM): every layer holds a Mamba-2 mixer (`mamba.`), attention (`self_attn.`) and a
// gated MLP (`feed_forward.`), with input_layernorm before the first two and pre_ff_layernorm before the MLP.
void bind_falcon_h1_layers(Binder& b, const ModelConfig& c, ModelWeights& w,
                           const std::function<void(int64_t, int64_t)>& on_layer) {
  const int64_t m = c.mlp_size, d = c.d_model;
  w.embeddings = b.matrix("model.embed_tokens.weight", {c.vocab_size, d});
  w.norm_f = b.bind("model.final_layernorm.weight", {d});
  for (int64_t i = 0; i < c.n_layer; ++i) {
    const std::string p = "model.layers." + std::to_string(i) + ".", mx = p + "mamba.";
    LayerWeights l;
    l.kind = LayerKind::ParallelHybrid;
    l.norm = b.bind(p + "input_layernorm.weight", {d});
    l.in_proj = b.matrix(mx + "in_proj.weight", {c.in_proj_size(), d});
    if (c.use_bias) l.in_proj_bias = b.bind(mx + "in_proj.bias", {c.in_proj_size()});
    l.conv = b.bind(mx + "conv1d.weight", {c.conv_channels(), 1, c.d_conv});
    if (c.use_conv_bias) l.conv_bias = b.bind(mx + "conv1d.bias", {c.conv_channels()});
    l.out_proj = b.matrix(mx + "out_proj.weight", {d, c.d_inner});
    if (c.mamba_out_proj_bias) l.out_proj_bias = b.bind(mx + "out_proj.bias", {d});
    l.dt_bias = b.bind(mx + "dt_bias", {c.n_heads});
    l.A_log = b.bind(mx + "A_log", {c.n_heads});
    l.D = b.bind(mx + "D", {c.n_heads});
    if (c.mamba_rms_norm) l.gated_norm = b.bind(mx + "norm.weight", {c.d_inner});
    // A non-persistent buffer transformers rebuilds from the config's ssm_multipliers (and ignores in a checkpoint).
    b.mark_used(mx + "mup_vector");
    bind_attention(b, c, p + "self_attn.", l);
    l.mlp_norm = b.bind(p + "pre_ff_layernorm.weight", {d});
    const std::string f = p + "feed_forward.";
    l.mlp_gate = b.matrix(f + "gate_proj.weight", {m, d});
    l.mlp_up = b.matrix(f + "up_proj.weight", {m, d});
    l.mlp_down = b.matrix(f + "down_proj.weight", {d, m});
    if (c.mlp_bias) {
      l.mlp_gate_bias = b.bind(f + "gate_proj.bias", {m});
      l.mlp_up_bias = b.bind(f + "up_proj.bias", {m});
      l.mlp_down_bias = b.bind(f + "down_proj.bias", {d});
    }
    w.layers.push_back(l);
    if (on_layer) on_layer(i + 1, c.n_layer);
  }
}

MoeBinder moe_binder(Binder& b, const TensorLookup& lookup) {
  return {[&b](const std::string& n, std::initializer_list<int64_t> s) { return b.matrix(n, s); },
          [&b](const std::string& n, std::initializer_list<int64_t> s) { return b.bind(n, s); },
          [&lookup](const std::string& n) { return lookup(n).has_value(); }};
}

// Nemotron-H ("model." in transformers 5, "backbone." in older checkpoints), Granite-4.0-H and Bamba layers.
void bind_hybrid_layers(Binder& b, const ModelConfig& c, const TensorLookup& lookup, ModelWeights& w,
                        const std::function<void(int64_t, int64_t)>& on_layer) {
  if (c.family == Family::FalconH1) return bind_falcon_h1_layers(b, c, w, on_layer);
  const bool nemotron = c.family == Family::NemotronH;
  const std::string root = nemotron && !lookup("model.embeddings.weight") && lookup("backbone.embeddings.weight")
                               ? "backbone."
                               : "model.";
  const int64_t m = c.mlp_size;
  if (nemotron) {
    w.embeddings = b.matrix(root + "embeddings.weight", {c.vocab_size, c.d_model});
    w.norm_f = b.bind(root + "norm_f.weight", {c.d_model});
  } else {
    w.embeddings = b.matrix("model.embed_tokens.weight", {c.vocab_size, c.d_model});
    w.norm_f = b.bind(c.family == Family::Bamba || c.family == Family::Jamba ? "model.final_layernorm.weight"
                                                                             : "model.norm.weight",
                      {c.d_model});
  }
  for (int64_t i = 0; i < c.n_layer; ++i) {
    const std::string p = root + "layers." + std::to_string(i) + ".";
    LayerWeights l;
    l.kind = c.layer_kind(i);
    if (nemotron) {
      l.norm = b.bind(p + "norm.weight", {c.d_model});
      const std::string mx = p + "mixer.";
      if (l.kind == LayerKind::Mamba2) bind_mamba2(b, c, mx, l);
      else if (l.kind == LayerKind::Attention) bind_attention(b, c, mx, l);
      else if (l.kind == LayerKind::MoE) l.moe = bind_moe(moe_binder(b, lookup), c, mx);
      else {  // relu2 MLP layer
        l.mlp_up = b.matrix(mx + "up_proj.weight", {m, c.d_model});
        l.mlp_down = b.matrix(mx + "down_proj.weight", {c.d_model, m});
        if (c.mlp_bias) {
          l.mlp_up_bias = b.bind(mx + "up_proj.bias", {m});
          l.mlp_down_bias = b.bind(mx + "down_proj.bias", {c.d_model});
        }
      }
    } else {
      l.norm = b.bind(p + "input_layernorm.weight", {c.d_model});
      if (l.kind == LayerKind::Mamba2) bind_mamba2(b, c, p + "mamba.", l);
      else if (l.kind == LayerKind::Mamba1) bind_jamba_mamba1(b, c, p + "mamba.", l);
      else bind_attention(b, c, p + "self_attn.", l);
      if (c.family == Family::GraniteHybrid) {
        l.mlp_norm = b.bind(p + "post_attention_layernorm.weight", {c.d_model});
        l.mlp_up = b.matrix(p + "shared_mlp.input_linear.weight", {2 * m, c.d_model});
        l.mlp_down = b.matrix(p + "shared_mlp.output_linear.weight", {c.d_model, m});
        if (c.mlp_has_experts(i)) l.moe = bind_moe(moe_binder(b, lookup), c, p + "block_sparse_moe.");
      } else {
        l.mlp_norm = b.bind(p + "pre_ff_layernorm.weight", {c.d_model});
        if (c.mlp_has_experts(i)) {  // Jamba's sparse MoE block
          l.moe = bind_moe(moe_binder(b, lookup), c, p + "feed_forward.");
          w.layers.push_back(l);
          if (on_layer) on_layer(i + 1, c.n_layer);
          continue;
        }
        l.mlp_gate = b.matrix(p + "feed_forward.gate_proj.weight", {m, c.d_model});
        l.mlp_up = b.matrix(p + "feed_forward.up_proj.weight", {m, c.d_model});
        l.mlp_down = b.matrix(p + "feed_forward.down_proj.weight", {c.d_model, m});
      }
    }
    w.layers.push_back(l);
    if (on_layer) on_layer(i + 1, c.n_layer);
  }
}

}  // namespace

WeightShapes hybrid_weight_shapes(const ModelConfig& c) {
  if (!c.hybrid()) fail("hybrid_weight_shapes: ", arch_name(c.arch), " is not a hybrid model");
  WeightShapes shapes;
  const TensorLookup none = [](const std::string&) -> std::optional<Weight> { return std::nullopt; };
  const std::string source = "(shapes)";
  Binder b(none, source, &shapes);
  ModelWeights w;
  bind_hybrid_layers(b, c, none, w, {});
  if (!c.tie_embeddings) b.matrix("lm_head.weight", {c.vocab_size, c.d_model});
  return shapes;
}

ModelWeights bind_weights(const ModelConfig& c, const TensorLookup& lookup, const std::vector<std::string>& all_names,
                          Backend& backend, const std::string& source,
                          const std::function<void(int64_t, int64_t)>& on_layer) {
  Binder b(lookup, backend, source);
  ModelWeights w;
  if (c.hybrid()) {
    bind_hybrid_layers(b, c, lookup, w, on_layer);
    if (c.tie_embeddings) {
      w.lm_head = w.embeddings;
      b.mark_used("lm_head.weight");
    } else {
      w.lm_head = b.matrix("lm_head.weight", {c.vocab_size, c.d_model});
    }
    check_all_used(b, c, all_names, source);
    return w;
  }
  w.embeddings = b.matrix_any({"backbone.embeddings.weight", "backbone.embedding.weight"}, {c.vocab_size, c.d_model});
  w.norm_f = b.bind("backbone.norm_f.weight", {c.d_model});
  if (c.tie_embeddings) {
    w.lm_head = w.embeddings;
    b.mark_used("lm_head.weight");  // some checkpoints store the tied copy as well; it is ignored, as transformers does
  } else {
    w.lm_head = b.matrix("lm_head.weight", {c.vocab_size, c.d_model});
  }
  const bool m1 = c.arch == Arch::Mamba1;
  TensorView mixer_norm;
  if (m1 && c.mixer_rms_eps > 0) {
    w.mixer_norm_host = std::make_shared<std::vector<float>>(std::max(c.dt_rank, c.d_state), 1.0f);
    mixer_norm = backend.adopt_weight(TensorView(w.mixer_norm_host->data(), DType::F32,
                                                 {static_cast<int64_t>(w.mixer_norm_host->size())}));
  }
  for (int64_t i = 0; i < c.n_layer; ++i) {
    const std::string p = "backbone.layers." + std::to_string(i) + ".";
    const std::string m = p + "mixer.";
    LayerWeights l;
    l.kind = c.layer_kind(i);
    l.norm = b.bind(p + "norm.weight", {c.d_model});
    l.in_proj = b.matrix(m + "in_proj.weight", {c.in_proj_size(), c.d_model});
    l.conv = b.bind(m + "conv1d.weight", {c.conv_channels(), 1, c.d_conv});
    l.out_proj = b.matrix(m + "out_proj.weight", {c.d_model, c.d_inner});
    if (c.use_bias) {
      l.in_proj_bias = b.bind(m + "in_proj.bias", {c.in_proj_size()});
      l.out_proj_bias = b.bind(m + "out_proj.bias", {c.d_model});
    }
    if (c.use_conv_bias) l.conv_bias = b.bind(m + "conv1d.bias", {c.conv_channels()});
    if (m1) {
      l.x_proj = b.matrix(m + "x_proj.weight", {c.dt_rank + 2 * c.d_state, c.d_inner});
      l.dt_proj = b.matrix(m + "dt_proj.weight", {c.d_inner, c.dt_rank});
      l.dt_bias = b.bind(m + "dt_proj.bias", {c.d_inner});
      l.A_log = b.bind(m + "A_log", {c.d_inner, c.d_state});
      l.D = b.bind(m + "D", {c.d_inner});
      l.mixer_norm = mixer_norm;
    } else {
      l.dt_bias = b.bind(m + "dt_bias", {c.n_heads});
      l.A_log = b.bind(m + "A_log", {c.n_heads});
      l.D = b.bind(m + "D", {c.n_heads});
      l.gated_norm = b.bind(m + "norm.weight", {c.d_inner});
    }
    w.layers.push_back(l);
    if (on_layer) on_layer(i + 1, c.n_layer);
  }
  check_all_used(b, c, all_names, source);
  return w;
}

namespace {

void check_all_used(const Binder& b, const ModelConfig& c, const std::vector<std::string>& all_names,
                    const std::string& source) {
  std::vector<std::string> unexpected;
  for (const std::string& name : all_names) {
    // Nemotron-H's multi-token-prediction layers are not run (ModelConfig::mtp_layers_ignored); their tensors'
    // prefix is not confirmed here, so both spellings are skipped.
    if (c.mtp_layers_ignored > 0 && (name.rfind("mtp.", 0) == 0 || name.rfind("model.mtp.", 0) == 0 ||
                                     name.rfind("backbone.mtp.", 0) == 0))
      continue;
    if (!b.used().count(name)) unexpected.push_back(name);
  }
  if (!unexpected.empty()) {
    std::ostringstream os;
    for (size_t i = 0; i < unexpected.size() && i < 5; ++i) os << (i ? ", " : "") << "'" << unexpected[i] << "'";
    if (unexpected.size() > 5) os << " and " << unexpected.size() - 5 << " more";
    fail(source, ": ", unexpected.size(), " unexpected tensor(s) for a ",
         c.hybrid() ? family_name(c.family) : arch_name(c.arch), " model with ", c.n_layer, " layers: ", os.str(),
         " (a different architecture or variant? mambacpp refuses rather than silently ignore weights)");
  }
}

}  // namespace

TensorLookup lookup_views(std::function<const TensorView*(const std::string&)> find, const std::string& source) {
  return [find = std::move(find), source](const std::string& name) -> std::optional<Weight> {
    const TensorView* t = find(name);
    if (!t) return std::nullopt;
    if (t->dtype != DType::F32 && t->dtype != DType::F16 && t->dtype != DType::BF16)
      fail(source, ": tensor '", name, "' has dtype ", dtype_name(t->dtype), "; expected f32, f16 or bf16");
    return Weight(*t);
  };
}

}  // namespace mambacpp
