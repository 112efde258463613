#include "model/weights.h"

#include <algorithm>
#include <set>
#include <sstream>

#include "mambacpp/error.h"

namespace mambacpp {

namespace {

class Binder {
 public:
  Binder(const TensorLookup& lookup, Backend& backend, const std::string& source)
      : lookup_(lookup), backend_(backend), source_(source) {}

  // The tensor `name` with exactly `shape`; absent -> error unless optional.
  TensorView bind(const std::string& name, std::initializer_list<int64_t> shape, bool optional = false) {
    return bind_any({name}, shape, optional);
  }

  TensorView bind_any(std::initializer_list<std::string> names, std::initializer_list<int64_t> shape,
                      bool optional = false) {
    for (const std::string& name : names) {
      const TensorView* t = lookup_(name);
      if (!t) continue;
      used_.insert(name);
      check_shape(name, *t, shape);
      if (t->dtype != DType::F32 && t->dtype != DType::F16 && t->dtype != DType::BF16)
        fail(source_, ": tensor '", name, "' has dtype ", dtype_name(t->dtype), "; expected f32, f16 or bf16");
      return backend_.adopt_weight(*t);
    }
    if (optional) return {};
    fail(source_, ": missing tensor '", *names.begin(), "' with shape ", shape_str(shape));
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

  void check_shape(const std::string& name, const TensorView& t, std::initializer_list<int64_t> shape) const {
    bool ok = t.ndim == static_cast<int>(shape.size());
    int i = 0;
    for (int64_t d : shape) ok = ok && t.dim(i++) == d;
    if (!ok)
      fail(source_, ": tensor '", name, "' has shape ", t.shape_string(), "; expected ", shape_str(shape),
           " for this config");
  }

  const TensorLookup& lookup_;
  Backend& backend_;
  const std::string& source_;
  std::set<std::string> used_;
};

}  // namespace

ModelWeights bind_weights(const ModelConfig& c, const TensorLookup& lookup, const std::vector<std::string>& all_names,
                          Backend& backend, const std::string& source,
                          const std::function<void(int64_t, int64_t)>& on_layer) {
  Binder b(lookup, backend, source);
  ModelWeights w;
  w.embeddings = b.bind_any({"backbone.embeddings.weight", "backbone.embedding.weight"}, {c.vocab_size, c.d_model});
  w.norm_f = b.bind("backbone.norm_f.weight", {c.d_model});
  if (c.tie_embeddings) {
    w.lm_head = w.embeddings;
    b.mark_used("lm_head.weight");  // some checkpoints store the tied copy as well; it is ignored, as transformers does
  } else {
    w.lm_head = b.bind("lm_head.weight", {c.vocab_size, c.d_model});
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
    l.norm = b.bind(p + "norm.weight", {c.d_model});
    l.in_proj = b.bind(m + "in_proj.weight", {c.in_proj_size(), c.d_model});
    l.conv = b.bind(m + "conv1d.weight", {c.conv_channels(), 1, c.d_conv});
    l.out_proj = b.bind(m + "out_proj.weight", {c.d_model, c.d_inner});
    if (c.use_bias) {
      l.in_proj_bias = b.bind(m + "in_proj.bias", {c.in_proj_size()});
      l.out_proj_bias = b.bind(m + "out_proj.bias", {c.d_model});
    }
    if (c.use_conv_bias) l.conv_bias = b.bind(m + "conv1d.bias", {c.conv_channels()});
    if (m1) {
      l.x_proj = b.bind(m + "x_proj.weight", {c.dt_rank + 2 * c.d_state, c.d_inner});
      l.dt_proj = b.bind(m + "dt_proj.weight", {c.d_inner, c.dt_rank});
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
  std::vector<std::string> unexpected;
  for (const std::string& name : all_names)
    if (!b.used().count(name)) unexpected.push_back(name);
  if (!unexpected.empty()) {
    std::ostringstream os;
    for (size_t i = 0; i < unexpected.size() && i < 5; ++i) os << (i ? ", " : "") << "'" << unexpected[i] << "'";
    if (unexpected.size() > 5) os << " and " << unexpected.size() - 5 << " more";
    fail(source, ": ", unexpected.size(), " unexpected tensor(s) for a ", arch_name(c.arch),
         " model with ", c.n_layer, " layers: ", os.str(),
         " (a different architecture or variant? mambacpp refuses rather than silently ignore weights)");
  }
  return w;
}

}  // namespace mambacpp
