// A model written as GGUF the way llama.cpp writes it: its architecture's metadata and tensor names
// (io/gguf_model.h), the vocabulary (io/gguf_vocab_export.h), and each tensor's type chosen as llama.cpp's quantizer
// (llama-quant.cpp, without an importance matrix) chooses it for the target type, the blocks rounded by ggml's
// reference quantizers (core/ggml_blocks.h).
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>

#include "core/weight.h"
#include "io/gguf_model.h"
#include "io/gguf_writer.h"
#include "mambacpp/config.h"

namespace mambacpp {

// The file types `mambacpp quantize --type` writes, with llama.cpp's names: q4_k is Q4_K_M (attn_v and ffn_down of
// some layers in Q6_K), the embedding / output in Q6_K for every K type.
enum class GgufTarget : uint8_t { F32, F16, BF16, Q8_0, Q4_K_M, Q6_K };
GgufTarget parse_gguf_target(const std::string& name);  // f32 | f16 | bf16 | q8_0 | q4_k | q6_k; throws listing them
const char* gguf_target_name(GgufTarget t);
uint32_t gguf_file_type(GgufTarget t);  // llama_ftype: general.file_type

// The type llama.cpp's quantizer gives tensor `gguf_name` of logical shape `shape`: `i_layer` / `n_layers` count the
// tensors of the same kind (attn_v, ffn_down) for Q4_K_M's choice of layers; `tied` says token_embd is also the output;
// `n_experts` is the model's expert count (llama.cpp treats 8-expert models' attention apart).
WeightFormat gguf_tensor_type(GgufTarget target, const std::string& gguf_name, const std::vector<int64_t>& shape,
                              bool tied, int64_t i_layer, int64_t n_layers, int64_t n_experts = 0);

using WeightSource = std::function<std::optional<Weight>(const std::string& hf_name)>;
class Checkpoint;
// A checkpoint's tensors by the names gguf_tensor_names uses, accepting the variants the binder accepts
// (mamba_ssm's backbone.embedding.weight, older Nemotron-H checkpoints' backbone.* prefix).
WeightSource gguf_source_of(const Checkpoint& checkpoint);

// Adds the config's metadata and every tensor (read through `source` by transformers name, converted to llama.cpp's
// conventions, quantized for `target`) to `writer`. The tensors are read when the writer writes, so `source` must
// outlive writer.write(). Throws naming a tensor the source lacks or one llama.cpp has no slot for.
void gguf_add_model(GgufWriter& writer, const ModelConfig& config, const WeightSource& source, GgufTarget target);

}  // namespace mambacpp
