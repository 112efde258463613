// Launchers of the tensor-core chunk kernels of the Mamba-2 SSD (mamba2_ssd_tc.cu), used by launch_mamba2_chunked
// for the shapes ssd_tc_supported accepts. Same scratch contract as the CUDA-core kernels they replace: the state
// kernel writes each chunk's own contribution into scratch.chunk_states, the output kernel reads the state entering
// each chunk from there and writes y.
#pragma once

#include <cuda_runtime.h>

#include "backend/cuda/cuda_ops.h"

namespace mambacpp::cuda {

inline constexpr int kMaxSsdTcState = 256;

// head_dim and d_state multiples of 16, d_state <= kMaxSsdTcState.
bool ssd_tc_supported(const Mamba2Launch& p);
void launch_ssd_chunk_state_tc(const Mamba2Launch& p, const SsdChunk* chunks, int64_t n_chunks,
                               const SsdScratch& scratch, cudaStream_t stream);
void launch_ssd_chunk_output_tc(const Mamba2Launch& p, const SsdChunk* chunks, int64_t n_chunks,
                                const SsdScratch& scratch, cudaStream_t stream);

// Fast precision (Mamba2Launch::fast; mamba2_ssd_fast.cu): bf16 copies of x, B, C into the scratch, then the chunk
// state from those, the scores C_i . B_j once per group, and the chunk output from the scores, x and the entering
// states' bf16 copy (written by the state pass), one bf16 product per term.
void launch_ssd_round_inputs(const Mamba2Launch& p, const SsdScratch& scratch, cudaStream_t stream);
void launch_ssd_chunk_scores_fast(const Mamba2Launch& p, const SsdChunk* chunks, int64_t n_chunks,
                                  const SsdScratch& scratch, cudaStream_t stream);
void launch_ssd_chunk_state_fast(const Mamba2Launch& p, const SsdChunk* chunks, int64_t n_chunks,
                                 const SsdScratch& scratch, cudaStream_t stream);
void launch_ssd_chunk_output_fast(const Mamba2Launch& p, const SsdChunk* chunks, int64_t n_chunks,
                                  const SsdScratch& scratch, cudaStream_t stream);

}  // namespace mambacpp::cuda
