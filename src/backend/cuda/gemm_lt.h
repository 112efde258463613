// The prefill GEMMs of the linear layer through cuBLASLt: y^T [out, T] = W [out, in] . X^T + beta * y^T, with W and
// X in the same 16-bit dtype (X: [T, in] contiguous), f32 accumulation and an f32 y whose rows are ldy apart.
// One plan per shape and alignment (matmul descriptor, layouts and the heuristic's first algorithm for the given
// workspace), built on first use and reused, so steady-state calls only enqueue the matmul; the last kMaxPlans kept.
#pragma once

#include <cublasLt.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <memory>
#include <vector>

namespace mambacpp::cuda {

class LtMatmul {
 public:
  LtMatmul();
  LtMatmul(const LtMatmul&) = delete;
  LtMatmul& operator=(const LtMatmul&) = delete;
  ~LtMatmul();

  // Creates the handle (no device allocation inside a CUDA graph capture later). Idempotent.
  void init();
  // ab: CUDA_R_16BF or CUDA_R_16F. workspace: device, ws_bytes long, used in stream order.
  void run(cudaStream_t stream, void* workspace, size_t ws_bytes, cudaDataType_t ab, const void* w, const void* x,
           float* y, int out, int T, int in, int64_t ldy, float beta);

 private:
  struct Plan;
  Plan& plan(cudaDataType_t ab, int out, int T, int in, int64_t ldy, int align_w, int align_x, int align_y,
             size_t ws_bytes);

  static constexpr size_t kMaxPlans = 64;
  cublasLtHandle_t handle_ = nullptr;
  std::vector<std::unique_ptr<Plan>> plans_;
};

}  // namespace mambacpp::cuda
