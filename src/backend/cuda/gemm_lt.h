// The prefill GEMMs of the linear layer through cuBLASLt: y^T [out, T] = W [out, in] . X^T + beta * y^T, with W and
// X in the same 16-bit dtype (X: [T, in] contiguous), f32 accumulation and an f32 y whose rows are ldy apart.
// One plan per shape and alignment (matmul descriptor, layouts and the heuristic's first algorithm for the given
// workspace), built on first use and reused, so steady-state calls only enqueue the matmul; the last kMaxPlans kept.
// Pinned (batch-invariant) plans use one algorithm for every T of a weight shape: the heuristic's choice at
// kPinnedRefT rows, split-K count and tiles included. Each output element's reduction over `in` then runs in the
// same order whatever T is, so a row's result does not depend on the rows beside it (tests/gpu/ops_test.cpp checks
// it bit for bit). Should cuBLASLt refuse that algorithm for some T, that T falls back to its own heuristic choice
// and pinned_fallbacks() counts it.
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
           float* y, int out, int T, int in, int64_t ldy, float beta, bool pinned = false);
  int64_t pinned_fallbacks() const { return pinned_fallbacks_; }

  static constexpr int kPinnedRefT = 64;  // decode-sized: the tiles the heuristic picks for a server's batches

 private:
  struct Plan;
  Plan& plan(cudaDataType_t ab, int out, int T, int in, int64_t ldy, int align_w, int align_x, int align_y,
             size_t ws_bytes, bool pinned);
  // The heuristic's first algorithm for y [T, out] = x [T, in] . w^T with these alignments (throws when none).
  cublasLtMatmulAlgo_t heuristic(cublasLtMatmulDesc_t desc, cublasLtMatrixLayout_t a, cublasLtMatrixLayout_t b,
                                 cublasLtMatrixLayout_t c, int align_w, int align_x, int align_y, size_t ws_bytes,
                                 int out, int T, int in);

  static constexpr size_t kMaxPlans = 256;  // pinned decode plans: one per (weight shape, batch size)
  cublasLtHandle_t handle_ = nullptr;
  std::vector<std::unique_ptr<Plan>> plans_;
  int64_t pinned_fallbacks_ = 0;
};

}  // namespace mambacpp::cuda
