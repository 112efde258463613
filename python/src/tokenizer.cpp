// _Tokenizer: tokenizer.json encode/decode. Decoded bytes that are not valid UTF-8 (a cut multi-byte character)
// become U+FFFD in str results, as HF's decode does; the *_bytes methods give the exact bytes. Decoding skips ids
// outside the vocabulary, as HF does (the library checks them).
#include <pybind11/stl.h>

#include "errors.h"
#include "handles.h"

namespace py = pybind11;

namespace mambacpp::python {

namespace {

void check_ids(const Tokenizer& t, const std::vector<int32_t>& ids) {
  const int64_t v = t.vocab_size();
  for (size_t i = 0; i < ids.size(); ++i)
    if (ids[i] < 0 || ids[i] >= v)
      throw InvalidArgument("ids: expected token ids in [0, " + std::to_string(v) + "), found " +
                            std::to_string(ids[i]) + " at index " + std::to_string(i));
}

}  // namespace

py::str utf8_replace(const std::string& bytes) {
  PyObject* s = PyUnicode_DecodeUTF8(bytes.data(), static_cast<Py_ssize_t>(bytes.size()), "replace");
  if (!s) throw py::error_already_set();
  return py::reinterpret_steal<py::str>(s);
}

void bind_tokenizer(py::module_& m) {
  py::class_<Tokenizer, std::shared_ptr<Tokenizer>>(m, "_Tokenizer")
      .def(py::init([](const std::string& path) {
             return std::shared_ptr<Tokenizer>(file_errors([&] { return Tokenizer::load(path); }));
           }),
           py::arg("path"))
      .def("encode",
           [](const Tokenizer& t, const std::string& text, bool add_special_tokens) {
             return t.encode(text, add_special_tokens);
           },
           py::arg("text"), py::arg("add_special_tokens"))
      .def("decode",
           [](const Tokenizer& t, const std::vector<int32_t>& ids, bool skip_special) {
             return utf8_replace(t.decode(ids, skip_special));  // unknown ids vanish, as in HF
           },
           py::arg("ids"), py::arg("skip_special"))
      .def("decode_bytes",
           [](const Tokenizer& t, const std::vector<int32_t>& ids, bool skip_special) {
             return py::bytes(t.decode(ids, skip_special));
           },
           py::arg("ids"), py::arg("skip_special"))
      .def("token_bytes",
           [](const Tokenizer& t, int32_t id) {
             return py::bytes(t.token_bytes(id));  // empty for an unknown id
           },
           py::arg("id"))
      .def_property_readonly("vocab_size", &Tokenizer::vocab_size)
      .def("token_to_id", [](const Tokenizer& t, const std::string& token) { return t.token_to_id(token); }, py::arg("token"))
      .def("is_special",
           [](const Tokenizer& t, int32_t id) {
             check_ids(t, {id});
             return t.is_special(id);
           },
           py::arg("id"));
}

}  // namespace mambacpp::python
