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
// Prefill plans (Pin::Prefill) are pinned apart from the decode ones: a split-K decode plan (out_proj's at mamba2-2.7b)
// writes every split's partial sums to the workspace and reduces them in a second kernel, which a prefill piece pays in
// bytes (mamba2-2.7b's out_proj: well above its memory floor on the decode plan, near it on the prefill plan). A
// prefill plan is one algorithm without split-K for every T of a shape, chosen once: among the heuristic's candidates at
// kProbeRows rows, the first whose first kPinnedRefT rows there are the bits it gives at kPinnedRefT rows sets the bits
// (so they are the same in every process), and the fastest candidate giving those bits on the probe runs. A prompt's
// rows are then the same bits alone or packed with others. Which plan a row takes depends on its sequence's length
// alone (kPrefillMinRows tokens and more: the prefill plan; one-token and short sequences: the decode plan, whose
// split-K is the faster at a few hundred rows), so a forward that mixes decode rows with prompts gives each row the
// bits it gets alone.
// A prompt piece whose every row is on the prefill plan may take its output in bf16 (run_prefill_bf16): an algorithm
// with a bf16 output whose results are the prefill plan's f32 results rounded to nearest even on a probe (the same
// reduction, the rounding in the epilogue), so the rows are the bits an f32 output rounded afterwards holds.
#pragma once

#include <cublasLt.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <memory>
#include <optional>
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
  // Which algorithm a call's rows run on: the heuristic's for this T (None), or one pinned for every T of the
  // shape, that of decode batches or that of prompts.
  enum class Pin { None, Decode, Prefill };
  // ab: CUDA_R_16BF or CUDA_R_16F. workspace: device, ws_bytes long, used in stream order.
  // alpha: y = alpha * (the f32 accumulator) + beta * y in cuBLASLt's epilogue, a host scalar read when the matmul is
  // enqueued (a graph keeps the value captured). It takes no part in choosing or pinning a plan: the same algorithm,
  // split and reduction order run whatever its value, so it scales every row alike at every T.
  void run(cudaStream_t stream, void* workspace, size_t ws_bytes, cudaDataType_t ab, const void* w, const void* x,
           float* y, int out, int T, int in, int64_t ldy, float beta, Pin pin = Pin::None, float alpha = 1.0f);
  // y [T, out] (rows ldy apart) in bf16 (raw bits) = the Pin::Prefill result with beta = 0 rounded to nearest even,
  // bit for bit. False (nothing enqueued) where no such plan exists: the caller runs run() and rounds.
  bool run_prefill_bf16(cudaStream_t stream, void* workspace, size_t ws_bytes, cudaDataType_t ab, const void* w,
                        const void* x, uint16_t* y, int out, int T, int in, int64_t ldy);
  int64_t pinned_fallbacks() const { return pinned_fallbacks_; }
  int64_t pinned_blocked() const { return pinned_blocked_; }
  int64_t wide_chosen() const { return wide_chosen_; }
  int64_t wide_rejected() const { return wide_rejected_; }
  int64_t prefill_chosen() const { return prefill_chosen_; }
  int64_t prefill_bf16_rejected() const { return prefill_bf16_rejected_; }  // shapes without a bf16-output plan

  static constexpr int kPinnedRefT = 64;   // decode-sized: the tiles the heuristic picks for a server's batches
  static constexpr int kWideMinT = 512;    // prefill pieces; batches of decode rows stay on the decode tiles
  static constexpr int kProbeRows = 1024;  // the rows the decode plans' wide variants are chosen on
  // The rows prefill plans are chosen on: a prompt piece's size (the GPU's default piece is 8,192 tokens; a 4k prompt
  // is one piece of 4,096). At 1,024 rows mamba2-2.7b's out_proj candidates filled one or two waves of the GPU and
  // timed alike, while the pick (80x128 or 176x128 tiles) differed on 8,192-token pieces.
  static constexpr int kPrefillProbeRows = 4096;
  // Sequences of at least this many tokens run on the prefill plan: mamba2-2.7b's 64-token prompts are faster on the
  // decode plan, its 256-token prompts on the prefill plan (docs/benchmarks.md, decisions).
  static constexpr int kPrefillMinRows = 256;

 private:
  struct Plan;
  struct Chosen;
  Plan& plan(cudaStream_t stream, void* workspace, cudaDataType_t ab, int out, int T, int in, int64_t ldy, int align_w,
             int align_x, int align_y, size_t ws_bytes, Pin pin);
  static void describe(Plan& p);  // the plan's descriptor and layouts, from its fields
  // The bf16-output twin of the prefill plan f (null: none; see run_prefill_bf16).
  const Plan* plan_bf16(cudaStream_t stream, void* workspace, const Plan& f, int align_y);
  // The fastest algorithm with a bf16 output (f's own, or one of the heuristic's without split-K) whose results are
  // f's f32 results rounded to nearest even, on a probe of kPrefillProbeRows random rows; chosen once per shape
  // (null: none). Synchronizes the stream.
  const cublasLtMatmulAlgo_t* prefill_bf16(cudaStream_t stream, void* workspace, const Plan& f, const Plan& h);
  // The wide variant of a pinned shape's decode algorithm (chosen on first use; null: none, keep the decode plan).
  const cublasLtMatmulAlgo_t* wide(cudaStream_t stream, void* workspace, const Plan& decode_ref);
  // A shape's prefill algorithm (chosen on first use; null: none passed the probe).
  const cublasLtMatmulAlgo_t* prefill(cudaStream_t stream, void* workspace, const Plan& shape);
  // The fastest of `algos` on `rows` random rows whose first kPinnedRefT rows equal the reference: `reference`'s
  // result at kPinnedRefT rows, or (reference null) that of the first of `algos`, in order, whose own rows there
  // equal them (its rows do not depend on T). Null when none does, or the probe's memory is not there. Synchronizes
  // the stream.
  std::optional<cublasLtMatmulAlgo_t> fastest_equal(cudaStream_t stream, void* workspace, const Plan& shape,
                                                    const std::vector<cublasLtMatmulAlgo_t>& algos,
                                                    const cublasLtMatmulAlgo_t* reference, int rows);
  Chosen* find_chosen(std::vector<std::unique_ptr<Chosen>>& list, const Plan& shape);
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
  std::vector<std::unique_ptr<Chosen>> wides_;     // one per decode-pinned shape that reached kWideMinT rows
  std::vector<std::unique_ptr<Chosen>> prefills_;  // one per prefill-pinned shape
  std::vector<std::unique_ptr<Plan>> plans_bf16_;  // run_prefill_bf16's plans (usable or not), the last kMaxPlans
  std::vector<std::unique_ptr<Chosen>> bf16_chosen_;  // prefill_bf16's choice per shape
  int64_t pinned_fallbacks_ = 0, pinned_blocked_ = 0, wide_chosen_ = 0, wide_rejected_ = 0, prefill_chosen_ = 0,
          prefill_bf16_rejected_ = 0;
};

}  // namespace mambacpp::cuda
