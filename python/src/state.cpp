// _State: a StateCache with its model: reset, copy, save, and the conv/SSM arrays as numpy.
#include <pybind11/stl.h>

#include "errors.h"
#include "handles.h"

namespace py = pybind11;

namespace mambacpp::python {

namespace {

void check_slot(const State& s, int64_t slot, const char* what) {
  input_errors([&] { s.cache->check_slot(slot, what); });
}

std::unique_ptr<StateCache> fresh_like(const State& s) {
  if (s.layer >= 0) return MambaBlock(*s.model, s.layer).create_state(s.cache->n_slots());
  return s.model->create_state(s.cache->n_slots(), s.cache->dtype());
}

// Per-slot shape of a view whose dim 0 is the slot.
py::tuple slot_shape(const TensorView& v) {
  py::tuple t(static_cast<size_t>(v.ndim - 1));
  for (int i = 1; i < v.ndim; ++i) t[static_cast<size_t>(i - 1)] = v.dim(i);
  return t;
}

}  // namespace

void bind_state(py::module_& m) {
  py::class_<State>(m, "_State")
      .def_property_readonly("n_slots", [](const State& s) { return s.cache->n_slots(); })
      .def_property_readonly("dtype", [](const State& s) { return std::string(dtype_name(s.cache->dtype())); })
      .def_property_readonly("layer", [](const State& s) { return s.layer; })
      .def_property_readonly("slot_bytes", [](const State& s) { return s.cache->slot_bytes(); })
      .def("reset", [](State& s, int64_t slot) { check_slot(s, slot, "row"), s.cache->reset(slot); }, py::arg("slot"))
      .def("reset_all", [](State& s) { s.cache->reset_all(); })
      .def("copy_slot",
           [](State& s, int64_t src, int64_t dst) {
             check_slot(s, src, "src"), check_slot(s, dst, "dst");
             s.cache->copy(src, dst);
           },
           py::arg("src"), py::arg("dst"))
      // A new state of the same model and shape holding the same values (through slot snapshots).
      .def("clone",
           [](const State& s) {
             auto c = std::make_unique<State>();
             c->model = s.model;
             c->layer = s.layer;
             c->cache = fresh_like(s);
             for (int64_t i = 0; i < s.cache->n_slots(); ++i) c->cache->restore(i, s.cache->snapshot(i));
             return c;
           })
      .def("save",
           [](const State& s, int64_t slot, const std::string& path, const std::vector<int32_t>& tokens) {
             check_slot(s, slot, "row");
             if (s.layer >= 0) throw InvalidArgument("save: a block's state cannot be saved (state files hold a whole model's state)");
             file_errors([&] { s.cache->save(slot, path, tokens); });
           },
           py::arg("slot"), py::arg("path"), py::arg("tokens"))
      // Into slot `slot` of this state; returns the tokens the file stands for.
      .def("load",
           [](State& s, int64_t slot, const std::string& path) {
             check_slot(s, slot, "row");
             if (s.layer >= 0) throw InvalidArgument("load: a block's state cannot be loaded from a state file");
             return file_errors([&] { return s.cache->load(slot, path); });
           },
           py::arg("slot"), py::arg("path"))
      // One slot as f32, layer by layer: conv then ssm (shapes in layer_shapes()).
      .def("read_slot",
           [](const State& s, int64_t slot) {
             check_slot(s, slot, "row");
             std::vector<float> v = s.cache->read_slot(slot);
             const auto n = static_cast<py::ssize_t>(v.size());
             return to_numpy(std::move(v), {n});
           },
           py::arg("slot"))
      .def("layer_shapes", [](const State& s) {
        py::list out;
        for (const LayerCache& l : s.cache->layers()) out.append(py::make_tuple(slot_shape(l.conv), slot_shape(l.ssm)));
        return out;
      });
}

}  // namespace mambacpp::python
