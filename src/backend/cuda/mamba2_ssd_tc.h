// Launchers of the tensor-core chunk kernels of the Mamba-2 SSD (mamba2_ssd_tc.cu), used by launch_mamba2_chunked
// for the shapes ssd_tc_supported accepts. Same scratch contract as the CUDA-core kernels they replace: the state
// kernel writes each chunk's own contribution into scratch.chunk_states, the output kernel reads the state entering
// each chunk from there and writes y.
#pragma once

#include <cuda_runtime.h>

#include "backend/cuda/cuda_ops.h"

namespace mambacpp::cuda {

// head_dim and d_state multiples of 16, d_state <= 256.
bool ssd_tc_supported(const Mamba2Launch& p);
void launch_ssd_chunk_state_tc(const Mamba2Launch& p, const SsdChunk* chunks, int64_t n_chunks,
                               const SsdScratch& scratch, cudaStream_t stream);
void launch_ssd_chunk_output_tc(const Mamba2Launch& p, const SsdChunk* chunks, int64_t n_chunks,
                                const SsdScratch& scratch, cudaStream_t stream);

}  // namespace mambacpp::cuda
