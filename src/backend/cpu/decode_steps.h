// The scans' single-token step (every sequence of the batch has one token: a decode step) on the vector kernels of
// simd.h, reading and writing the state in its own dtype (f32 or bf16) in place. CpuBackend::mamba2_ssd and
// mamba1_scan take this path after checking their arguments; multi-token batches run ssd.h / selective_scan.h.
#pragma once

#include "backend/backend.h"
#include "backend/cpu/kernel_common.h"

namespace mambacpp::cpu {

// True when every sequence of `batch` has exactly one token.
bool single_token_batch(const BatchLayout& batch);

// Mamba2ScanArgs semantics (backend.h) for single-token sequences, with the optional z gate.
void mamba2_decode_step(const Mamba2ScanArgs& a, const BatchLayout& batch, int threads);

// Mamba1ScanArgs semantics for single-token sequences; dt: [T, d_inner] before its bias (dt_proj already applied).
void mamba1_decode_step(const Mamba1ScanArgs& a, Rows<const float> dt, const BatchLayout& batch, int threads);

}  // namespace mambacpp::cpu
