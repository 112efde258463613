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

// Mamba1ScanArgs semantics for single-token sequences, dt_proj (when given) folded in: each task dots the low-rank
// dt with its own channels' dt_proj rows (dot_rows, the GEMV's order: the same bits as a separate linear).
// A: -exp(A_log) as simd::neg_exp_rows makes it ([d_inner, d_state] f32), or null to compute it per step.
void mamba1_decode_step(const Mamba1ScanArgs& a, const BatchLayout& batch, int threads, const float* A = nullptr);

}  // namespace mambacpp::cpu
