// Linear and embedding over block-format weights (core/ggml_blocks.h) on the CPU, the shape of linear_f32
// (linear.cpp) with the weights kept in their blocks. Few tokens (decode): each thread streams its contiguous share of
// the packed rows once, dequantizing in registers (packed_kernels.h). More tokens (prefill): panels of rows are
// dequantized to f32 (the same floats) and packed for the register-tiled GEMM of gemm.h. Both compute every output in
// dot_rows' order over the exactly dequantized row, so a token's result does not depend on the batch or the split.
#pragma once

#include <cstdint>

#include "backend/cpu/cpu_ops.h"
#include "backend/cpu/kernel_common.h"
#include "core/weight.h"

namespace mambacpp::cpu {

// y[t, o] = sum_i x[t, i] * w[o, i] (+ bias[o]); w: a packed [out, in] weight on the CPU. x: [T, in], y: [T, out].
// epilogue(o0, n), as linear_f32's, runs once the columns [o0, o0 + n) of every token are written.
void packed_linear_f32(Rows<const float> x, const Weight& w, WeightRef bias, Rows<float> y, int64_t T, int threads,
                       const LinearEpilogue& epilogue = {});
// out[t, :] = table[ids[t], :] dequantized; table: a packed [V, D] weight. Throws on an id outside [0, V).
void packed_embed_f32(const Weight& table, const int32_t* ids, Rows<float> out, int64_t T, int threads);

}  // namespace mambacpp::cpu
