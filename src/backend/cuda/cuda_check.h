// Host-side CUDA / cuBLAS error checks: any failure becomes a mambacpp::Error naming the call, the CUDA error and
// where it happened. Kernel launches are followed by MAMBACPP_CUDA_LAUNCHED() (launch-configuration errors);
// faults inside a kernel surface at the next synchronising call, which is checked the same way.
#pragma once

#include <cuda_runtime.h>

namespace mambacpp::cuda {

[[noreturn]] void throw_cuda_error(cudaError_t err, const char* what, const char* file, int line);
[[noreturn]] void throw_cublas_error(int status, const char* what, const char* file, int line);

}  // namespace mambacpp::cuda

#define MAMBACPP_CUDA_CHECK(expr)                                                           \
  do {                                                                                      \
    const cudaError_t mambacpp_err_ = (expr);                                               \
    if (mambacpp_err_ != cudaSuccess)                                                       \
      ::mambacpp::cuda::throw_cuda_error(mambacpp_err_, #expr, __FILE__, __LINE__);         \
  } while (0)

#define MAMBACPP_CUBLAS_CHECK(expr)                                                         \
  do {                                                                                      \
    const int mambacpp_st_ = static_cast<int>(expr);                                        \
    if (mambacpp_st_ != 0) ::mambacpp::cuda::throw_cublas_error(mambacpp_st_, #expr, __FILE__, __LINE__); \
  } while (0)

#define MAMBACPP_CUDA_LAUNCHED() MAMBACPP_CUDA_CHECK(cudaGetLastError())
