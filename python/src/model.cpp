// _Model: load, config, forward over numpy input, states.
#include <pybind11/stl.h>

#include "errors.h"
#include "handles.h"

namespace py = pybind11;

namespace mambacpp::python {

namespace {

// ids [B, L] int32, or embeddings [B, L, D] float32 / float16 / uint16 (read as bfloat16).
TensorView input_view(const py::array& input, int64_t d_model) {
  const py::dtype dt = input.dtype();
  const char kind = dt.kind();
  if (kind == 'i' && dt.itemsize() == 4) {
    check_array(input, "ids", 2);
    return TensorView(const_cast<void*>(input.data()), DType::I32, {input.shape(0), input.shape(1)});
  }
  DType t;
  if (kind == 'f' && dt.itemsize() == 4) {
    t = DType::F32;
  } else if (kind == 'f' && dt.itemsize() == 2) {
    t = DType::F16;
  } else if (kind == 'u' && dt.itemsize() == 2) {
    t = DType::BF16;
  } else {
    throw InvalidArgument("input: expected int32 ids [B, L] or float32/float16/bfloat16-as-uint16 embeddings [B, L, " +
                          std::to_string(d_model) + "], found dtype " + std::string(py::str(py::handle(dt))));
  }
  check_array(input, "embeddings", 3);
  return TensorView(const_cast<void*>(input.data()), t, {input.shape(0), input.shape(1), input.shape(2)});
}

void check_own_state(const Model& m, const State& s) {
  if (s.model.get() != &m) throw InvalidArgument("state: it belongs to another model (create it with this model's new_state)");
  if (s.layer >= 0)
    throw InvalidArgument("state: it is the state of block " + std::to_string(s.layer) +
                          " alone; the model needs a state from Model.new_state");
}

}  // namespace

void bind_model(py::module_& m) {
  py::class_<Model, std::shared_ptr<Model>>(m, "_Model")
      .def(py::init([](const std::string& dir, const std::string& device, const std::string& dtype, int threads,
                       int64_t batch_tokens, bool cuda_graphs, const std::string& precision) {
             LoadOptions lo;
             input_errors([&] {
               lo.device = parse_device_choice(device);
               if (!dtype.empty()) lo.weight_dtype = parse_dtype(dtype);
               lo.precision = parse_precision(precision);
             });
             if (threads < 0 || threads > kMaxThreads)
               throw InvalidArgument("threads: expected 0 (all cores) to " + std::to_string(kMaxThreads) + ", found " +
                                     std::to_string(threads));
             if (batch_tokens < 0)
               throw InvalidArgument("batch_tokens: expected >= 0 (0: the device's default), found " +
                                     std::to_string(batch_tokens));
             lo.threads = threads;
             lo.max_batch_tokens = batch_tokens;
             lo.cuda_graphs = cuda_graphs;
             py::gil_scoped_release nogil;
             return std::shared_ptr<Model>(file_errors([&] { return Model::load(dir, lo); }));
           }),
           py::arg("dir"), py::arg("device"), py::arg("dtype"), py::arg("threads"), py::arg("batch_tokens"),
           py::arg("cuda_graphs"), py::arg("precision"))
      .def_property_readonly("config_json", [](const Model& self) { return self.config().to_json(); })
      .def_property_readonly("device", [](const Model& self) { return std::string(device_name(self.device())); })
      .def_property_readonly("device_description", &Model::device_description)
      .def_property_readonly("directory", &Model::directory)
      .def_property_readonly("weights_hash", [](const Model& self) {
        py::gil_scoped_release nogil;
        return self.weights_hash();
      })
      .def_property_readonly("weight_dtype", [](const Model& self) { return std::string(dtype_name(self.weight_dtype())); })
      // Rows [B * L, V] (all positions) or [B, V]; row b continues slot b of `state`, which must have B slots.
      .def("forward",
           [](const Model& self, State& state, const py::array& input, bool all_positions) {
             check_own_state(self, state);
             const TensorView view = input_view(input, self.config().d_model);
             if (view.dim(0) != state.cache->n_slots())
               throw InvalidArgument("state: holds " + std::to_string(state.cache->n_slots()) +
                                     " sequences, the input has B = " + std::to_string(view.dim(0)) + " rows");
             ForwardResult r;
             {
               py::gil_scoped_release nogil;
               r = input_errors([&] {
                 return self.forward(*state.cache, view, all_positions ? Output::AllLogits : Output::LastLogits);
               });
             }
             return to_numpy(std::move(r.values), {r.rows, r.cols});
           },
           py::arg("state"), py::arg("input"), py::arg("all_positions"))
      .def("new_state",
           [](const std::shared_ptr<Model>& self, int64_t n_slots, const std::string& dtype) {
             if (n_slots < 1) throw InvalidArgument("batch: expected >= 1, found " + std::to_string(n_slots));
             auto s = std::make_unique<State>();
             s->model = self;
             s->cache = input_errors([&] { return self->create_state(n_slots, parse_dtype(dtype)); });
             return s;
           },
           py::arg("n_slots"), py::arg("dtype"))
      // A one-sequence state from a state file, and the tokens it stands for.
      .def("load_state",
           [](const std::shared_ptr<Model>& self, const std::string& path) {
             auto s = std::make_unique<State>();
             s->model = self;
             s->cache = self->create_state(1);
             std::vector<int32_t> tokens = file_errors([&] { return s->cache->load(0, path); });
             return py::make_tuple(py::cast(std::move(s)), py::cast(tokens));
           },
           py::arg("path"));
}

}  // namespace mambacpp::python
