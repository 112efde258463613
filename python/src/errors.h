// C++ errors as Python exceptions (mambacpp/_errors.py). The library throws one type, mambacpp::Error; the bindings
// know from the call whether it means bad input or a bad file, and say so with the exception class.
#pragma once

#include <pybind11/pybind11.h>

#include <stdexcept>
#include <string>
#include <utility>

#include "mambacpp/error.h"

namespace mambacpp::python {

// Raised as mambacpp.InvalidArgumentError (a ValueError).
struct InvalidArgument : std::runtime_error {
  using std::runtime_error::runtime_error;
};
// Raised as mambacpp.FileError (an OSError).
struct FileProblem : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// Registers the translator; every other mambacpp::Error becomes mambacpp.Error.
void register_errors(pybind11::module_& m);

// Runs f; a mambacpp::Error it throws is bad input.
template <class F>
decltype(auto) input_errors(F&& f) {
  try {
    return std::forward<F>(f)();
  } catch (const Error& e) {
    throw InvalidArgument(e.what());
  }
}

// Runs f; a mambacpp::Error it throws is about a file.
template <class F>
decltype(auto) file_errors(F&& f) {
  try {
    return std::forward<F>(f)();
  } catch (const Error& e) {
    throw FileProblem(e.what());
  }
}

}  // namespace mambacpp::python
