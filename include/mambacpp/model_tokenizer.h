// The tokenizer of a model path as the commands take it: a directory's tokenizer.json, or a .gguf file's own
// vocabulary (tokenizer.ggml.*).
#pragma once

#include <memory>
#include <string>

#include "mambacpp/tokenizer.h"

namespace mambacpp {

// nullptr when the model has none (a directory without tokenizer.json, a GGUF whose vocabulary is "none" or a
// placeholder); throws naming the file for one that is there but cannot be reproduced exactly.
std::unique_ptr<Tokenizer> load_model_tokenizer(const std::string& model_path);

}  // namespace mambacpp
