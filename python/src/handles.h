// What the Python objects hold. A state, block or engine keeps its model alive (shared_ptr), so Python may drop the
// model first; the C++ objects only borrow it.
#pragma once

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "mambacpp/block.h"
#include "mambacpp/model.h"
#include "mambacpp/state.h"
#include "mambacpp/tokenizer.h"

namespace mambacpp::python {

struct State {
  std::shared_ptr<const Model> model;
  std::unique_ptr<StateCache> cache;
  int64_t layer = -1;  // -1: a whole model's state; otherwise the state of MambaBlock `layer` alone
};

struct Block {
  std::shared_ptr<const Model> model;
  MambaBlock block;
};

// A float vector as a numpy array of `shape`, without a copy (the array owns the vector).
pybind11::array_t<float> to_numpy(std::vector<float>&& values, const std::vector<pybind11::ssize_t>& shape);

// Throws InvalidArgument unless `a` is C-contiguous with `ndim` dimensions (names `what` in the message).
void check_array(const pybind11::array& a, const char* what, int ndim);

void bind_model(pybind11::module_& m);
void bind_state(pybind11::module_& m);
void bind_block(pybind11::module_& m);
void bind_mixer(pybind11::module_& m);
void bind_engine(pybind11::module_& m);
void bind_tokenizer(pybind11::module_& m);
void bind_chat(pybind11::module_& m);

// Bytes as str; invalid UTF-8 becomes U+FFFD.
pybind11::str utf8_replace(const std::string& bytes);

}  // namespace mambacpp::python
