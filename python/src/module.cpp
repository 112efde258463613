// mambacpp._mambacpp: the native half of the Python package (the Python half, mambacpp/*.py, checks arguments and
// gives the API its shape). Every function here still checks what it is given: calling it directly cannot crash.
#include "errors.h"
#include "handles.h"

namespace py = pybind11;

namespace mambacpp::python {

py::array_t<float> to_numpy(std::vector<float>&& values, const std::vector<py::ssize_t>& shape) {
  auto* owned = new std::vector<float>(std::move(values));
  py::capsule free_when_done(owned, [](void* p) { delete static_cast<std::vector<float>*>(p); });
  return py::array_t<float>(shape, owned->data(), free_when_done);
}

void check_array(const py::array& a, const char* what, int ndim) {
  if (a.ndim() != ndim)
    throw InvalidArgument(std::string(what) + ": expected " + std::to_string(ndim) + " dimensions, found " +
                          std::to_string(a.ndim()));
  if (!(a.flags() & py::array::c_style)) throw InvalidArgument(std::string(what) + ": expected a C-contiguous array");
}

}  // namespace mambacpp::python

PYBIND11_MODULE(_mambacpp, m) {
  using namespace mambacpp::python;
  m.doc() = "mamba.cpp native module (use the mambacpp package)";
  register_errors(m);
  bind_tokenizer(m);
  bind_model(m);
  bind_state(m);
  bind_block(m);
  bind_mixer(m);
  bind_engine(m);
  bind_chat(m);
  m.attr("MAX_THREADS") = mambacpp::kMaxThreads;  // the largest Model(threads=...) (the library checks it too)
  m.def("default_model_dir", [] { return file_errors([] { return mambacpp::default_model_dir(); }); },
        "The shipped model's directory as the C++ library finds it ($MAMBACPP_MODEL, the source tree, the data dir).");
}
