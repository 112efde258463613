// Writing GGUF files (llama.cpp's format) from any model mambacpp reads: `mambacpp quantize`. Loading a .gguf needs
// nothing here: Model::load takes a FILE.gguf wherever it takes a model directory.
#pragma once

#include <cstdint>
#include <functional>
#include <string>

namespace mambacpp {

struct QuantizeReport {
  int64_t tensors = 0;
  uint64_t bytes = 0;  // of the written file
};

// Writes the model at `model_path` (a checkpoint directory or a .gguf file) to `out_path` as GGUF of type `type`
// (f32, f16, bf16, q8_0, q4_k = Q4_K_M, q6_k) in llama.cpp's architecture, names and conventions, each tensor's type
// chosen as llama.cpp's quantizer chooses it, with the vocabulary of the directory's tokenizer.json (or the source
// file's). Atomic: the file appears complete or not at all. Throws mambacpp::Error naming what it cannot write.
QuantizeReport quantize_to_gguf(const std::string& model_path, const std::string& type, const std::string& out_path);

}  // namespace mambacpp
