// _Mixer / _MixerState: mambacpp::Mixer (include/mambacpp/mixer.h) over numpy: a Mamba-1 / Mamba-2 mixer built from
// arrays in memory, and its state. _MixerState answers what mambacpp.State asks of a native state.
#include <pybind11/stl.h>

#include <cmath>
#include <map>

#include "errors.h"
#include "handles.h"
#include "mambacpp/mixer.h"

namespace py = pybind11;

namespace mambacpp::python {

namespace {

struct PyMixer {
  std::shared_ptr<Mixer> mixer;
};

struct PyMixerState {
  std::shared_ptr<Mixer> mixer;  // the state's buffers live on the mixer's backend
  std::unique_ptr<MixerState> state;
};

// A numpy array as a host view: float32, float16, or uint16 holding bfloat16; C-contiguous, at most 4 dimensions.
TensorView weight_view(const std::string& name, const py::array& a) {
  const py::dtype dt = a.dtype();
  DType t;
  if (dt.kind() == 'f' && dt.itemsize() == 4) t = DType::F32;
  else if (dt.kind() == 'f' && dt.itemsize() == 2) t = DType::F16;
  else if (dt.kind() == 'u' && dt.itemsize() == 2) t = DType::BF16;
  else
    throw InvalidArgument("weights['" + name + "']: expected float32, float16 or bfloat16-as-uint16, found dtype " +
                          std::string(py::str(py::handle(dt))));
  if (a.ndim() < 1 || a.ndim() > 4)
    throw InvalidArgument("weights['" + name + "']: expected 1 to 4 dimensions, found " + std::to_string(a.ndim()));
  if (!(a.flags() & py::array::c_style)) throw InvalidArgument("weights['" + name + "']: expected a C-contiguous array");
  TensorView v;
  v.data = const_cast<void*>(a.data());
  v.dtype = t;
  v.ndim = static_cast<int>(a.ndim());
  for (int i = 0; i < v.ndim; ++i) v.shape[static_cast<size_t>(i)] = a.shape(i);
  return v;
}

template <class T>
T get(const py::dict& d, const char* key, T fallback) {
  return d.contains(key) ? py::cast<T>(d[key]) : fallback;
}

MixerConfig config_of(const std::string& arch, const py::dict& d) {
  MixerConfig c;
  if (arch == "mamba") c.arch = Arch::Mamba1;
  else if (arch == "mamba2") c.arch = Arch::Mamba2;
  else throw InvalidArgument("arch: expected 'mamba' or 'mamba2', found '" + arch + "'");
  c.d_model = get<int64_t>(d, "d_model", c.d_model);
  c.d_state = get<int64_t>(d, "d_state", c.d_state);
  c.d_conv = get<int64_t>(d, "d_conv", c.d_conv);
  c.d_inner = get<int64_t>(d, "d_inner", c.d_inner);
  c.use_bias = get<bool>(d, "use_bias", c.use_bias);
  c.use_conv_bias = get<bool>(d, "use_conv_bias", c.use_conv_bias);
  c.dt_rank = get<int64_t>(d, "dt_rank", c.dt_rank);
  c.mixer_rms_eps = get<double>(d, "mixer_rms_eps", c.mixer_rms_eps);
  c.n_heads = get<int64_t>(d, "n_heads", c.n_heads);
  c.head_dim = get<int64_t>(d, "head_dim", c.head_dim);
  c.n_groups = get<int64_t>(d, "n_groups", c.n_groups);
  c.chunk_size = get<int64_t>(d, "chunk_size", c.chunk_size);
  c.dt_min = get<double>(d, "dt_min", c.dt_min);
  c.dt_max = get<double>(d, "dt_max", c.dt_max);
  c.norm_eps = get<double>(d, "norm_eps", c.norm_eps);
  c.norm_groups = get<int64_t>(d, "norm_groups", c.norm_groups);
  return c;
}

py::dict config_dict(const MixerConfig& c) {
  py::dict d;
  d["arch"] = arch_name(c.arch);
  d["d_model"] = c.d_model;
  d["d_state"] = c.d_state;
  d["d_conv"] = c.d_conv;
  d["d_inner"] = c.d_inner;
  d["use_bias"] = c.use_bias;
  d["use_conv_bias"] = c.use_conv_bias;
  d["norm_eps"] = c.norm_eps;
  if (c.arch == Arch::Mamba1) {
    d["dt_rank"] = c.dt_rank;
    d["mixer_rms_eps"] = c.mixer_rms_eps;
  } else {
    d["n_heads"] = c.n_heads;
    d["head_dim"] = c.head_dim;
    d["n_groups"] = c.n_groups;
    d["chunk_size"] = c.chunk_size;
    d["dt_min"] = c.dt_min;
    d["dt_max"] = c.dt_max;
    d["norm_groups"] = c.norm_groups;
  }
  return d;
}

py::tuple as_tuple(const std::vector<int64_t>& v) {
  py::tuple t(v.size());
  for (size_t i = 0; i < v.size(); ++i) t[i] = v[i];
  return t;
}

void check_slot(const PyMixerState& s, int64_t slot, const char* what) {
  input_errors([&] { s.state->check_slot(slot, what); });
}

// y = mixer(x) for x float32 [B, L, d_model] (rows continue the state's slots 0..B-1, which must be all of them).
py::array_t<float> run(const PyMixer& m, PyMixerState& state, const py::array& x, bool step) {
  if (state.mixer != m.mixer) throw InvalidArgument("state: expected a state made by this mixer's new_state");
  const py::dtype dt = x.dtype();
  if (dt.kind() != 'f' || dt.itemsize() != 4)
    throw InvalidArgument("x: expected dtype float32, found " + std::string(py::str(py::handle(dt))));
  check_array(x, "x", step ? 2 : 3);
  if (x.shape(0) != state.state->n_slots())
    throw InvalidArgument("state: holds " + std::to_string(state.state->n_slots()) + " sequences, x has B = " +
                          std::to_string(x.shape(0)) + " rows");
  const int64_t d = m.mixer->config().d_model;
  if (x.shape(x.ndim() - 1) != d)
    throw InvalidArgument("x: expected " + std::to_string(d) + " (d_model) columns, found " +
                          std::to_string(x.shape(x.ndim() - 1)));
  std::vector<py::ssize_t> shape(x.shape(), x.shape() + x.ndim());
  TensorView view;
  view.data = const_cast<void*>(x.data());
  view.ndim = static_cast<int>(x.ndim());
  for (int i = 0; i < view.ndim; ++i) view.shape[static_cast<size_t>(i)] = x.shape(i);
  std::vector<float> y;
  {
    py::gil_scoped_release nogil;
    y = input_errors([&] { return step ? m.mixer->step(*state.state, view) : m.mixer->forward(*state.state, view); });
  }
  return to_numpy(std::move(y), shape);
}

}  // namespace

void bind_mixer(py::module_& m) {
  py::class_<PyMixer>(m, "_Mixer")
      // arch "mamba" / "mamba2"; config: MixerConfig's fields by name (absent: the defaults); weights: name -> array.
      .def(py::init([](const std::string& arch, const py::dict& config, const py::dict& weights,
                       const std::string& device, const std::string& dtype, int threads, const std::string& precision) {
             const MixerConfig c = config_of(arch, config);
             MixerOptions o;
             input_errors([&] {
               o.device = parse_device_choice(device);
               if (!dtype.empty()) o.weight_dtype = parse_dtype(dtype);
               o.precision = parse_precision(precision);
             });
             if (threads < 0 || threads > kMaxThreads)
               throw InvalidArgument("threads: expected 0 (all cores) to " + std::to_string(kMaxThreads) + ", found " +
                                     std::to_string(threads));
             o.threads = threads;
             std::map<std::string, TensorView> views;
             std::vector<py::array> keep;  // the arrays the views point into, alive until create has copied them
             for (const auto& [key, value] : weights) {
               const std::string name = py::cast<std::string>(key);
               keep.push_back(py::cast<py::array>(value));
               views[name] = weight_view(name, keep.back());
             }
             py::gil_scoped_release nogil;
             return PyMixer{input_errors([&] { return std::shared_ptr<Mixer>(Mixer::create(c, views, o)); })};
           }),
           py::arg("arch"), py::arg("config"), py::arg("weights"), py::arg("device") = "cpu", py::arg("dtype") = "",
           py::arg("threads") = 0, py::arg("precision") = "exact")
      .def_property_readonly("config", [](const PyMixer& self) { return config_dict(self.mixer->config()); })
      .def_property_readonly("device", [](const PyMixer& self) { return std::string(device_name(self.mixer->device())); })
      .def_property_readonly("device_description", [](const PyMixer& self) { return self.mixer->device_description(); })
      .def_property_readonly("weight_names", [](const PyMixer& self) { return Mixer::weight_names(self.mixer->config()); })
      .def("new_state",
           [](const PyMixer& self, int64_t n_slots, const std::string& dtype) {
             if (n_slots < 1) throw InvalidArgument("batch: expected >= 1, found " + std::to_string(n_slots));
             auto s = std::make_unique<PyMixerState>();
             s->mixer = self.mixer;
             s->state = input_errors([&] { return self.mixer->create_state(n_slots, parse_dtype(dtype)); });
             return s;
           },
           py::arg("n_slots"), py::arg("dtype") = "f32")
      // x: float32 [B, L, d_model]; row b continues slot b of `state` (B slots). Returns [B, L, d_model].
      .def("forward", [](const PyMixer& self, PyMixerState& state, const py::array& x) { return run(self, state, x, false); },
           py::arg("state"), py::arg("x"))
      // x: float32 [B, d_model], one token per row. Returns [B, d_model].
      .def("step", [](const PyMixer& self, PyMixerState& state, const py::array& x) { return run(self, state, x, true); },
           py::arg("state"), py::arg("x"));

  py::class_<PyMixerState>(m, "_MixerState")
      .def_property_readonly("n_slots", [](const PyMixerState& s) { return s.state->n_slots(); })
      .def_property_readonly("dtype", [](const PyMixerState& s) { return std::string(dtype_name(s.state->dtype())); })
      .def_property_readonly("slot_bytes", [](const PyMixerState& s) { return s.state->slot_bytes(); })
      .def("reset", [](PyMixerState& s, int64_t slot) { check_slot(s, slot, "row"), s.state->reset(slot); }, py::arg("slot"))
      .def("reset_all", [](PyMixerState& s) { s.state->reset_all(); })
      .def("copy_slot",
           [](PyMixerState& s, int64_t src, int64_t dst) {
             check_slot(s, src, "src"), check_slot(s, dst, "dst");
             s.state->copy(src, dst);
           },
           py::arg("src"), py::arg("dst"))
      .def("clone",
           [](const PyMixerState& s) {
             auto c = std::make_unique<PyMixerState>();
             c->mixer = s.mixer;
             c->state = s.state->clone();
             return c;
           })
      .def("save",
           [](const PyMixerState&, int64_t, const std::string&, const std::vector<int32_t>&) {
             throw InvalidArgument("save: a mixer's state cannot be saved (state files hold a whole model's state)");
           },
           py::arg("slot"), py::arg("path"), py::arg("tokens"))
      .def("load",
           [](PyMixerState&, int64_t, const std::string&) -> std::vector<int32_t> {
             throw InvalidArgument("load: a mixer's state cannot be loaded from a state file");
           },
           py::arg("slot"), py::arg("path"))
      // One slot as f32: conv then ssm (shapes in layer_shapes()).
      .def("read_slot",
           [](const PyMixerState& s, int64_t slot) {
             check_slot(s, slot, "row");
             std::vector<float> v = s.state->read_slot(slot);
             const auto n = static_cast<py::ssize_t>(v.size());
             return to_numpy(std::move(v), {n});
           },
           py::arg("slot"))
      .def("layer_shapes", [](const PyMixerState& s) {
        py::list out;
        out.append(py::make_tuple(as_tuple(s.state->conv_shape()), as_tuple(s.state->ssm_shape())));
        return out;
      });
}

}  // namespace mambacpp::python
