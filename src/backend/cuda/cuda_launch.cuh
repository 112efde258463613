// Kernel launch with programmatic dependent launch enabled (sm_90): the kernel may be scheduled before the
// previous kernel in the stream has finished, overlapping its launch and its independent loads (weights, state)
// with that kernel's tail; it must call wait_for_previous_kernel() (cuda_common.cuh) before touching anything the
// previous kernels write. Stream capture keeps the relation as a programmatic edge of the CUDA graph.
// Also the opt-in to more than 48 KB of dynamic shared memory.
#pragma once

#include <cuda_runtime.h>

#include <mutex>
#include <utility>

#include "backend/cuda/cuda_check.h"

namespace mambacpp::cuda {

// With `smem` bytes of dynamic shared memory.
template <class... KernelArgs, class... Args>
void launch_dependent_smem(void (*kernel)(KernelArgs...), dim3 grid, dim3 block, size_t smem, cudaStream_t stream,
                           Args&&... args) {
  cudaLaunchConfig_t config{};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = smem;
  config.stream = stream;
  cudaLaunchAttribute attribute{};
  attribute.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attribute.val.programmaticStreamSerializationAllowed = 1;
  config.attrs = &attribute;
  config.numAttrs = 1;
  MAMBACPP_CUDA_CHECK(cudaLaunchKernelEx(&config, kernel, std::forward<Args>(args)...));
}

// Above 48 KB of dynamic shared memory a kernel needs an opt-in: `bytes`, the most any of its launches asks for, set
// on the first call for `once` (before any launch, so never inside a graph capture).
template <class... KernelArgs>
void allow_dynamic_smem_once(std::once_flag& once, void (*kernel)(KernelArgs...), size_t bytes) {
  std::call_once(once, [&] {
    MAMBACPP_CUDA_CHECK(
        cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes)));
  });
}

template <class... KernelArgs, class... Args>
void launch_dependent(void (*kernel)(KernelArgs...), dim3 grid, dim3 block, cudaStream_t stream, Args&&... args) {
  launch_dependent_smem(kernel, grid, block, 0, stream, std::forward<Args>(args)...);
}

}  // namespace mambacpp::cuda
