// _Block: one Mamba block of a loaded model as a layer (x + mixer(rmsnorm(x))), with a state of its own.
#include "errors.h"
#include "handles.h"

namespace py = pybind11;

namespace mambacpp::python {

void bind_block(py::module_& m) {
  py::class_<Block>(m, "_Block")
      .def(py::init([](const std::shared_ptr<Model>& model, int64_t layer) {
             const int64_t n = model->config().n_layer;
             if (layer < 0 || layer >= n)
               throw InvalidArgument("layer: expected 0 <= layer < " + std::to_string(n) + " (n_layer), found " +
                                     std::to_string(layer));
             return std::make_unique<Block>(Block{model, MambaBlock(*model, layer)});
           }),
           py::arg("model"), py::arg("layer"))
      .def_property_readonly("layer", [](const Block& b) { return b.block.layer(); })
      .def("new_state",
           [](const Block& b, int64_t n_slots) {
             if (n_slots < 1) throw InvalidArgument("batch: expected >= 1, found " + std::to_string(n_slots));
             auto s = std::make_unique<State>();
             s->model = b.model;
             s->layer = b.block.layer();
             s->cache = input_errors([&] { return b.block.create_state(n_slots); });
             return s;
           },
           py::arg("n_slots"))
      // x: float32 [B, L, d_model]; row b continues slot b of `state` (B slots). Returns [B, L, d_model].
      .def("forward",
           [](const Block& b, State& state, const py::array& x) {
             if (state.model != b.model || state.layer != b.block.layer())
               throw InvalidArgument("state: expected a state made by this block's new_state");
             const py::dtype dt = x.dtype();
             if (dt.kind() != 'f' || dt.itemsize() != 4)
               throw InvalidArgument("x: expected dtype float32, found " + std::string(py::str(py::handle(dt))));
             check_array(x, "x", 3);
             if (x.shape(0) != state.cache->n_slots())
               throw InvalidArgument("state: holds " + std::to_string(state.cache->n_slots()) +
                                     " sequences, x has B = " + std::to_string(x.shape(0)) + " rows");
             const TensorView view(const_cast<void*>(x.data()), DType::F32, {x.shape(0), x.shape(1), x.shape(2)});
             std::vector<float> y;
             {
               py::gil_scoped_release nogil;
               y = input_errors([&] { return b.block.forward(*state.cache, view); });
             }
             return to_numpy(std::move(y), {x.shape(0), x.shape(1), x.shape(2)});
           },
           py::arg("state"), py::arg("x"));
}

}  // namespace mambacpp::python
