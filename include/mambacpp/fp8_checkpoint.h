// Writing FP8 checkpoints from any model mambacpp reads: `mambacpp quantize --type fp8`. The output is ModelOpt's
// FP8_PER_CHANNEL_PER_TOKEN layout (the per-channel FP8 layout vLLM's ModelOpt loader reads): every projection matrix
// as F8_E4M3 `<module>.weight` with an f32 `<module>.weight_scale` [out] (max|row| / 448, round to nearest even,
// saturating), the embeddings, lm_head, MoE routers and every vector left as they are; config.json gains a
// "quantization_config" (quant_method "modelopt") and hf_quant_config.json is written beside it. Loading such a
// directory needs nothing here: Model::load reads it as any ModelOpt checkpoint.
#pragma once

#include <cstdint>
#include <functional>
#include <string>

namespace mambacpp {

struct Fp8QuantizeReport {
  int64_t quantized = 0;  // tensors written as F8_E4M3
  int64_t kept = 0;       // tensors written in their stored dtype
  uint64_t bytes = 0;     // of model.safetensors
};

// Writes the model at `model_path` (a checkpoint directory or a .gguf file) into the new directory `out_dir`
// (absent or empty): model.safetensors, config.json, hf_quant_config.json, and the source directory's other files
// (tokenizer, generation config, chat template) copied. A checkpoint's FP8 weights pass through unchanged; GGUF block
// formats are dequantized first (their config.json is mamba.cpp's canonical form; no tokenizer.json is made).
// `progress(done, total)` is called after each tensor. Every file is written whole or not at all; throws
// mambacpp::Error naming what it cannot read or write.
Fp8QuantizeReport quantize_to_fp8_checkpoint(const std::string& model_path, const std::string& out_dir,
                                             const std::function<void(int64_t, int64_t)>& progress = {});

}  // namespace mambacpp
