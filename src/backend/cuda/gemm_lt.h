// The prefill GEMMs of the linear layer through cuBLASLt: y^T [out, T] = W [out, in] . X^T + beta * y^T, with W and
// X in the same 16-bit dtype (X: [T, in] contiguous), f32 accumulation and an f32 y whose rows are ldy apart.
// One plan per shape and alignment (matmul descriptor, layouts and the heuristic's first algorithm for the given
// workspace), built on first use and reused, so steady-state calls only enqueue the matmul; the last kMaxPlans kept.
// Pinned (batch-invariant) plans use one algorithm for every T of a weight shape: the heuristic's choice at
// kPinnedRefT rows, split-K count and tiles included. Each output element's reduction over `in` then runs in the
// same order whatever T is, so a row's result does not depend on the rows beside it (tests/gpu/ops_test.cpp checks
// it bit for bit). Where that algorithm cannot run at T (a split-K algorithm's workspace grows with T), it runs over
// blocks of rows (the largest power of two it accepts; pinned_blocked() counts such plans); should it not run even at
// kPinnedRefT rows, T falls back to its own heuristic choice and pinned_fallbacks() counts it.
// The decode-sized tiles run prefill-sized T at ~480 TFLOP/s where wider ones reach ~750. From kWideMinT rows a
// pinned shape therefore runs a wide variant of the same kernel, chosen once per shape (the fastest on a probe) among
// the heuristic's candidates at that T and the decode algorithm's other tiles and custom options that keep the
// algorithm and its split of `in` (split-K count, reduction scheme) and give the decode plan's bits exactly on a
// random probe: its first kPinnedRefT rows against the decode plan's own, beta = 1 over random y, so every output is
// a full reduction over `in` followed by the epilogue's add. Equal bits on such a probe mean the same reduction order,
// so a row's result still does not depend on T. No candidate equal (or no memory for the probe): the decode plan
// stays, and wide_rejected() counts the shape.
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
  int64_t pinned_blocked() const { return pinned_blocked_; }
  int64_t wide_chosen() const { return wide_chosen_; }
  int64_t wide_rejected() const { return wide_rejected_; }

  static constexpr int kPinnedRefT = 64;  // decode-sized: the tiles the heuristic picks for a server's batches
  static constexpr int kWideMinT = 512;   // prefill pieces; batches of decode rows stay on the decode tiles

 private:
  struct Plan;
  struct Wide;
  Plan& plan(cudaStream_t stream, void* workspace, cudaDataType_t ab, int out, int T, int in, int64_t ldy, int align_w,
             int align_x, int align_y, size_t ws_bytes, bool pinned);
  // The wide variant of a pinned shape's decode algorithm (chosen on first use; null: none, keep the decode plan).
  const cublasLtMatmulAlgo_t* wide(cudaStream_t stream, void* workspace, const Plan& decode_ref);
  // The heuristic's first algorithm for y [T, out] = x [T, in] . w^T with these alignments (throws when none).
  cublasLtMatmulAlgo_t heuristic(cublasLtMatmulDesc_t desc, cublasLtMatrixLayout_t a, cublasLtMatrixLayout_t b,
                                 cublasLtMatrixLayout_t c, int align_w, int align_x, int align_y, size_t ws_bytes,
                                 int out, int T, int in);
  // Whether cuBLASLt runs algo on these layouts within ws_bytes of workspace.
  bool runnable(cublasLtMatmulDesc_t desc, cublasLtMatrixLayout_t a, cublasLtMatrixLayout_t b, cublasLtMatrixLayout_t c,
                const cublasLtMatmulAlgo_t& algo, size_t ws_bytes) const;
  // Up to `n` of the heuristic's algorithms, best first.
  std::vector<cublasLtMatmulHeuristicResult_t> candidates(cublasLtMatmulDesc_t desc, cublasLtMatrixLayout_t a,
                                                          cublasLtMatrixLayout_t b, cublasLtMatrixLayout_t c,
                                                          int align_w, int align_x, int align_y, size_t ws_bytes,
                                                          int n);

  static constexpr size_t kMaxPlans = 256;  // pinned decode plans: one per (weight shape, batch size)
  cublasLtHandle_t handle_ = nullptr;
  std::vector<std::unique_ptr<Plan>> plans_;
  std::vector<std::unique_ptr<Wide>> wides_;  // one per pinned shape that reached kWideMinT rows
  int64_t pinned_fallbacks_ = 0, pinned_blocked_ = 0, wide_chosen_ = 0, wide_rejected_ = 0;
};

}  // namespace mambacpp::cuda
