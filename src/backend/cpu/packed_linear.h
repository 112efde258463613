// Reference kernels for block-format weights (core/ggml_blocks.h) on the CPU: each output row is dequantized exactly
// as ggml dequantizes it, then dotted with the inputs in double precision. Correct first; the quantized-kernels
// issue replaces them with kernels that dot the blocks directly.
#pragma once

#include <cstdint>

#include "backend/cpu/kernel_common.h"
#include "core/weight.h"

namespace mambacpp::cpu {

// y[t, o] = sum_i x[t, i] * w[o, i] (+ bias[o]); w: a packed [out, in] weight on the CPU. x: [T, in], y: [T, out].
void packed_linear_f32(Rows<const float> x, const Weight& w, WeightRef bias, Rows<float> y, int64_t T, int threads);
// out[t, :] = table[ids[t], :] dequantized; table: a packed [V, D] weight. Throws on an id outside [0, V).
void packed_embed_f32(const Weight& table, const int32_t* ids, Rows<float> out, int64_t T, int threads);

}  // namespace mambacpp::cpu
