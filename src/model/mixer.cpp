// Mixer: one Mamba-1 / Mamba-2 mixer from weights in memory, run by the model's own mixer code (mixers.cpp) on a
// backend of its own; MixerState: its conv and SSM state.
#include "mambacpp/mixer.h"

#include <algorithm>
#include <cstring>
#include <mutex>
#include <sstream>
#include <utility>

#include "mambacpp/error.h"
#include "model/mixers.h"
#include "model/model_impl.h"

namespace mambacpp {

namespace {

ModelConfig model_config_of(const MixerConfig& m) {
  ModelConfig c;
  c.arch = m.arch;
  c.d_model = m.d_model;
  c.n_layer = 1;
  c.vocab_size = 1;  // a mixer has no vocabulary; the config's checks want one row
  c.d_state = m.d_state;
  c.d_conv = m.d_conv;
  c.d_inner = m.d_inner;
  c.norm_eps = m.norm_eps;
  c.use_bias = m.use_bias;
  c.use_conv_bias = m.use_conv_bias;
  c.dt_rank = m.dt_rank;
  c.mixer_rms_eps = m.mixer_rms_eps;
  c.n_heads = m.n_heads;
  c.head_dim = m.head_dim;
  c.n_groups = m.n_groups;
  c.chunk_size = m.chunk_size;
  c.dt_min = m.dt_min;
  c.dt_max = m.dt_max;
  c.gated_norm_groups = m.norm_groups;
  return c;
}

struct Expected {
  std::string name;
  std::vector<int64_t> shape;
  bool matrix = false;  // a projection (Backend::adopt_matrix), else a plain tensor (adopt_weight)
};

std::vector<Expected> expected_weights(const MixerConfig& m) {
  const ModelConfig c = model_config_of(m);
  std::vector<Expected> e = {{"in_proj.weight", {c.in_proj_size(), c.d_model}, true},
                             {"conv1d.weight", {c.conv_channels(), 1, c.d_conv}},
                             {"out_proj.weight", {c.d_model, c.d_inner}, true}};
  if (m.arch == Arch::Mamba1) {
    e.push_back({"x_proj.weight", {c.dt_rank + 2 * c.d_state, c.d_inner}, true});
    e.push_back({"dt_proj.weight", {c.d_inner, c.dt_rank}, true});
    e.push_back({"dt_proj.bias", {c.d_inner}});
    e.push_back({"A_log", {c.d_inner, c.d_state}});
    e.push_back({"D", {c.d_inner}});
  } else {
    e.push_back({"dt_bias", {c.n_heads}});
    e.push_back({"A_log", {c.n_heads}});
    e.push_back({"D", {c.n_heads}});
    e.push_back({"norm.weight", {c.d_inner}});
  }
  if (m.use_conv_bias) e.push_back({"conv1d.bias", {c.conv_channels()}});
  if (m.use_bias) {
    e.push_back({"in_proj.bias", {c.in_proj_size()}});
    e.push_back({"out_proj.bias", {c.d_model}});
  }
  return e;
}

std::string shape_str(const std::vector<int64_t>& shape) {
  std::ostringstream os;
  os << '[';
  for (size_t i = 0; i < shape.size(); ++i) os << (i ? ", " : "") << shape[i];
  os << ']';
  return os.str();
}

// A contiguous host view of `shape` (at most 4 dims, as every mixer weight is).
TensorView host_view(void* data, DType dtype, const std::vector<int64_t>& shape) {
  TensorView t;
  t.data = data;
  t.dtype = dtype;
  t.ndim = static_cast<int>(shape.size());
  std::copy(shape.begin(), shape.end(), t.shape.begin());
  return t;
}

const char* mixer_name(Arch a) { return a == Arch::Mamba1 ? "MambaMixer" : "Mamba2Mixer"; }

}  // namespace

MixerConfig MixerConfig::of(const ModelConfig& c) {
  MixerConfig m;
  m.arch = c.arch;
  m.d_model = c.d_model;
  m.d_state = c.d_state;
  m.d_conv = c.d_conv;
  m.d_inner = c.d_inner;
  m.use_bias = c.use_bias;
  m.use_conv_bias = c.use_conv_bias;
  m.dt_rank = c.dt_rank;
  m.mixer_rms_eps = c.mixer_rms_eps;
  m.n_heads = c.n_heads;
  m.head_dim = c.head_dim;
  m.n_groups = c.n_groups;
  m.chunk_size = c.chunk_size;
  m.dt_min = c.dt_min;
  m.dt_max = c.dt_max;
  m.norm_eps = c.norm_eps;
  m.norm_groups = c.gated_norm_groups;
  return m;
}

void MixerConfig::validate() const {
  try {
    model_config_of(*this).validate();
  } catch (const Error& e) {
    std::string msg = e.what();
    const std::string model = "model config: ";
    if (msg.rfind(model, 0) == 0) msg = msg.substr(model.size());
    fail("mixer config: ", msg);
  }
  if (arch == Arch::Mamba2 && (norm_groups < 0 || (norm_groups > 0 && n_groups % norm_groups != 0)))
    fail("mixer config: norm_groups = ", norm_groups, ", expected 0 (n_groups) or a divisor of n_groups = ", n_groups);
}

// ---- MixerState ------------------------------------------------------------------------------------------------

struct MixerState::Impl {
  const Mixer* owner = nullptr;
  Backend* backend = nullptr;
  int64_t n_slots = 0;
  DType dtype = DType::F32;
  DeviceBuffer conv, ssm;
  LayerCache cache;  // views of conv and ssm, as the mixer code takes them
};

MixerState::MixerState(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
MixerState::~MixerState() = default;

int64_t MixerState::n_slots() const { return impl_->n_slots; }
DType MixerState::dtype() const { return impl_->dtype; }

std::vector<int64_t> MixerState::conv_shape() const {
  const TensorView& t = impl_->cache.conv;
  return {t.dim(1), t.dim(2)};
}

std::vector<int64_t> MixerState::ssm_shape() const {
  const TensorView& t = impl_->cache.ssm;
  std::vector<int64_t> s;
  for (int d = 1; d < t.ndim; ++d) s.push_back(t.dim(d));
  return s;
}

size_t MixerState::slot_bytes() const {
  return slot_view(impl_->cache.conv, 0).nbytes() + slot_view(impl_->cache.ssm, 0).nbytes();
}

void MixerState::check_slot(int64_t slot, const char* what) const {
  if (slot < 0 || slot >= impl_->n_slots)
    fail(what, " ", slot, " out of range: this mixer state has slots [0, ", impl_->n_slots, ")");
}

void MixerState::reset(int64_t slot) {
  check_slot(slot);
  for (const TensorView* t : {&impl_->cache.conv, &impl_->cache.ssm}) {
    const TensorView s = slot_view(*t, slot);
    impl_->backend->fill_zero(s.data, s.nbytes());
  }
}

void MixerState::reset_all() {
  impl_->backend->fill_zero(impl_->conv.data(), impl_->conv.size());
  impl_->backend->fill_zero(impl_->ssm.data(), impl_->ssm.size());
}

void MixerState::copy(int64_t src_slot, int64_t dst_slot) {
  check_slot(src_slot, "source slot");
  check_slot(dst_slot, "destination slot");
  if (src_slot == dst_slot) return;
  for (const TensorView* t : {&impl_->cache.conv, &impl_->cache.ssm}) {
    const TensorView s = slot_view(*t, src_slot), d = slot_view(*t, dst_slot);
    impl_->backend->copy(d.data, s.data, s.nbytes());
  }
}

std::vector<float> MixerState::read_slot(int64_t slot) const {
  check_slot(slot);
  std::vector<float> out;
  std::vector<char> bytes;
  for (const TensorView* t : {&impl_->cache.conv, &impl_->cache.ssm}) {
    const TensorView s = slot_view(*t, slot);
    bytes.resize(s.nbytes());
    impl_->backend->copy_to_host(bytes.data(), s.data, bytes.size());
    const size_t at = out.size();
    out.resize(at + static_cast<size_t>(s.numel()));
    convert_to_f32(bytes.data(), s.dtype, out.data() + at, s.numel());
  }
  return out;
}

// ---- Mixer -----------------------------------------------------------------------------------------------------

struct Mixer::Impl {
  MixerConfig config;
  ModelConfig model_config;  // the same sizes as the model code reads them (one layer, no vocabulary)
  LoadOptions options;
  std::unique_ptr<Backend> backend;
  std::vector<std::vector<char>> host;  // the weights' bytes (the CPU backend reads them in place)
  std::vector<float> mixer_norm_ones;   // FalconMamba: the weight of its weightless dt/B/C norms
  LayerWeights weights;
  mutable std::mutex mutex;  // one forward at a time: the workspace is shared
  mutable Workspace workspace;

};

std::unique_ptr<MixerState> MixerState::clone() const {
  auto c = impl_->owner->create_state(impl_->n_slots, impl_->dtype);
  impl_->backend->copy(c->impl_->conv.data(), impl_->conv.data(), impl_->conv.size());
  impl_->backend->copy(c->impl_->ssm.data(), impl_->ssm.data(), impl_->ssm.size());
  return c;
}

Mixer::Mixer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Mixer::~Mixer() = default;

const MixerConfig& Mixer::config() const { return impl_->config; }
Device Mixer::device() const { return impl_->backend->device(); }
std::string Mixer::device_description() const { return impl_->backend->description(); }

std::vector<std::string> Mixer::weight_names(const MixerConfig& config) {
  std::vector<std::string> out;
  for (const Expected& e : expected_weights(config)) out.push_back(e.name);
  return out;
}

std::unique_ptr<Mixer> Mixer::create(const MixerConfig& config, const std::map<std::string, TensorView>& weights,
                                     const MixerOptions& options) {
  config.validate();
  const char* who = mixer_name(config.arch);
  const std::vector<Expected> expected = expected_weights(config);
  for (const auto& [name, view] : weights) {
    if (std::any_of(expected.begin(), expected.end(), [&](const Expected& e) { return e.name == name; })) continue;
    std::string why;
    if (name == "in_proj.bias" || name == "out_proj.bias") why = " (config.use_bias is false)";
    else if (name == "conv1d.bias") why = " (config.use_conv_bias is false)";
    std::ostringstream names;
    for (size_t i = 0; i < expected.size(); ++i) names << (i ? ", " : "") << expected[i].name;
    fail(who, " weight '", name, "': unexpected", why, "; this config takes ", names.str());
  }

  auto impl = std::make_unique<Impl>();
  impl->config = config;
  impl->model_config = model_config_of(config);
  impl->options.device = options.device;
  impl->options.weight_dtype = options.weight_dtype;
  impl->options.precision = options.precision;
  impl->options.threads = options.threads;
  impl->options.max_batch_tokens = options.max_batch_tokens;
  // Every weight is checked before a backend (a GPU context) is made.
  std::vector<TensorView> given;
  for (const Expected& e : expected) {
    const auto it = weights.find(e.name);
    if (it == weights.end()) fail(who, " weight '", e.name, "' is missing: expected shape ", shape_str(e.shape));
    const TensorView& v = it->second;
    std::vector<int64_t> shape(v.shape.begin(), v.shape.begin() + v.ndim);
    if (shape != e.shape || !is_weight_float(v.dtype))
      fail(who, " weight '", e.name, "': expected f32, f16 or bf16 of shape ", shape_str(e.shape), ", found ",
           dtype_name(v.dtype), " ", shape_str(shape));
    if (v.device != Device::CPU || !v.contiguous() || (!v.data && v.numel() > 0))
      fail(who, " weight '", e.name, "': expected a contiguous host tensor");
    given.push_back(v);
  }
  impl->backend = make_backend(impl->options);
  Backend& be = *impl->backend;
  LayerWeights& w = impl->weights;
  w.kind = config.arch == Arch::Mamba1 ? LayerKind::Mamba1 : LayerKind::Mamba2;
  for (size_t i = 0; i < expected.size(); ++i) {
    const Expected& e = expected[i];
    const TensorView& v = given[i];
    std::vector<char>& bytes = impl->host.emplace_back(v.nbytes());
    if (v.nbytes() > 0) std::memcpy(bytes.data(), v.data, v.nbytes());
    const TensorView own = host_view(bytes.data(), v.dtype, e.shape);
    Weight adopted = e.matrix ? be.adopt_matrix(Weight(own)) : Weight(be.adopt_weight(own));
    const std::string& n = e.name;
    if (n == "in_proj.weight") w.in_proj = adopted;
    else if (n == "out_proj.weight") w.out_proj = adopted;
    else if (n == "x_proj.weight") w.x_proj = adopted;
    else if (n == "dt_proj.weight") w.dt_proj = adopted;
    else if (n == "conv1d.weight") w.conv = adopted.data;
    else if (n == "conv1d.bias") w.conv_bias = adopted.data;
    else if (n == "in_proj.bias") w.in_proj_bias = adopted.data;
    else if (n == "out_proj.bias") w.out_proj_bias = adopted.data;
    else if (n == "dt_proj.bias" || n == "dt_bias") w.dt_bias = adopted.data;
    else if (n == "A_log") w.A_log = adopted.data;
    else if (n == "D") w.D = adopted.data;
    else if (n == "norm.weight") w.gated_norm = adopted.data;
  }
  if (config.arch == Arch::Mamba1 && config.mixer_rms_eps > 0) {
    impl->mixer_norm_ones.assign(static_cast<size_t>(std::max(config.dt_rank, config.d_state)), 1.0f);
    w.mixer_norm = be.adopt_weight(TensorView(impl->mixer_norm_ones.data(), DType::F32,
                                              {static_cast<int64_t>(impl->mixer_norm_ones.size())}));
  }
  return std::unique_ptr<Mixer>(new Mixer(std::move(impl)));
}

std::unique_ptr<MixerState> Mixer::create_state(int64_t n_slots, DType dtype) const {
  if (n_slots < 1) fail("Mixer create_state: n_slots must be >= 1, found ", n_slots);
  if (dtype != DType::F32 && dtype != DType::BF16)
    fail("Mixer create_state: state dtype: expected f32 or bf16, found ", dtype_name(dtype));
  const ModelConfig& c = impl_->model_config;
  auto s = std::make_unique<MixerState::Impl>();
  s->owner = this;
  s->backend = impl_->backend.get();
  s->n_slots = n_slots;
  s->dtype = dtype;
  const Device dev = impl_->backend->device();
  s->conv = DeviceBuffer(*impl_->backend, static_cast<size_t>(n_slots * c.conv_state_size()) * dtype_size(dtype));
  s->ssm = DeviceBuffer(*impl_->backend, static_cast<size_t>(n_slots * c.ssm_state_size()) * dtype_size(dtype));
  s->cache.conv = TensorView(s->conv.data(), dtype, {n_slots, c.conv_channels(), c.d_conv - 1}, dev);
  s->cache.ssm = c.arch == Arch::Mamba1
                     ? TensorView(s->ssm.data(), dtype, {n_slots, c.d_inner, c.d_state}, dev)
                     : TensorView(s->ssm.data(), dtype, {n_slots, c.n_heads, c.head_dim, c.d_state}, dev);
  auto state = std::unique_ptr<MixerState>(new MixerState(std::move(s)));
  state->reset_all();
  return state;
}

std::vector<float> Mixer::forward(MixerState& state, const TensorView& x) const {
  const ModelConfig& c = impl_->model_config;
  const char* who = mixer_name(c.arch);
  if (x.ndim != 3 || x.dim(2) != c.d_model || x.dtype != DType::F32 || x.device != Device::CPU || !x.contiguous())
    fail(who, " input: expected f32 host tensor [B, L, ", c.d_model, "], found ", dtype_name(x.dtype), " ",
         x.shape_string());
  const int64_t B = x.dim(0), L = x.dim(1);
  if (B < 1 || L < 1) fail(who, " input: expected B >= 1 and L >= 1, found ", x.shape_string());
  if (state.impl_->owner != this) fail(who, ": expected a state made by this mixer's create_state");
  if (B > state.n_slots())
    fail(who, " input: ", B, " rows, but the state holds ", state.n_slots(), " slots (row b continues slot b)");

  std::lock_guard<std::mutex> lock(impl_->mutex);
  Backend& be = *impl_->backend;
  const Device dev = be.device();
  Workspace& ws = impl_->workspace;
  const int64_t cap = std::max<int64_t>(1, impl_->options.max_batch_tokens);
  std::vector<float> out(static_cast<size_t>(B * L * c.d_model));
  // Pieces of whole rows-in-time: each piece covers positions [p, p + n) of every row (n * B <= cap when possible).
  const int64_t n_per_piece = std::max<int64_t>(1, cap / B);
  for (int64_t p = 0; p < L; p += n_per_piece) {
    const int64_t n = std::min(n_per_piece, L - p);
    ws.reserve(be, c, n * B, 1);
    BatchLayout batch;
    for (int64_t b = 0; b < B; ++b) batch.seqs.push_back({b * n, n, b});
    batch.total_tokens = n * B;
    be.prepare_batch(batch);
    TensorView h = Workspace::f32(ws.normed, dev, n * B, c.d_model);
    TensorView y = Workspace::f32(ws.mixer_out, dev, n * B, c.d_model);
    for (int64_t b = 0; b < B; ++b)
      be.copy_from_host(h.rows(b * n, n).data, x.ptr<float>() + (b * L + p) * c.d_model,
                        static_cast<size_t>(n * c.d_model) * 4);
    if (c.arch == Arch::Mamba1)
      mamba1_mixer(be, c, impl_->weights, state.impl_->cache, batch, ws, h, y);
    else
      mamba2_mixer(be, c, impl_->weights, state.impl_->cache, batch, ws, h, y);
    for (int64_t b = 0; b < B; ++b)
      be.copy_to_host(out.data() + (b * L + p) * c.d_model, y.rows(b * n, n).data,
                      static_cast<size_t>(n * c.d_model) * 4);
  }
  be.synchronize();
  return out;
}

std::vector<float> Mixer::step(MixerState& state, const TensorView& x) const {
  const int64_t d = impl_->model_config.d_model;
  if (x.ndim != 2 || x.dim(1) != d || x.dtype != DType::F32 || x.device != Device::CPU || !x.contiguous())
    fail(mixer_name(impl_->config.arch), " step input: expected f32 host tensor [B, ", d, "], found ",
         dtype_name(x.dtype), " ", x.shape_string());
  return forward(state, TensorView(x.data, DType::F32, {x.dim(0), 1, d}));
}

}  // namespace mambacpp
