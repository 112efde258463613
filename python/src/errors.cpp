#include "errors.h"

namespace py = pybind11;

namespace mambacpp::python {

namespace {
// The classes live in mambacpp._errors (multiple inheritance: Error is also a ValueError or an OSError there).
// Held for the life of the process: translators run until the interpreter exits.
PyObject* error_class = nullptr;
PyObject* invalid_class = nullptr;
PyObject* file_class = nullptr;
}  // namespace

void register_errors(py::module_& m) {
  py::module_ errors = py::module_::import("mambacpp._errors");
  error_class = py::object(errors.attr("Error")).release().ptr();
  invalid_class = py::object(errors.attr("InvalidArgumentError")).release().ptr();
  file_class = py::object(errors.attr("FileError")).release().ptr();
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const InvalidArgument& e) {
      PyErr_SetString(invalid_class, e.what());
    } catch (const FileProblem& e) {
      PyErr_SetString(file_class, e.what());
    } catch (const Error& e) {
      PyErr_SetString(error_class, e.what());
    }
  });
}

}  // namespace mambacpp::python
