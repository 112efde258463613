// cuBLASLt plans for the prefill GEMMs (see gemm_lt.h).
#include "backend/cuda/gemm_lt.h"

#include <algorithm>

#include "backend/cuda/cuda_check.h"
#include "mambacpp/error.h"

namespace mambacpp::cuda {
namespace {

// Largest power of two (<= 256) dividing both the address and the row pitch in bytes: what cuBLASLt may assume.
int alignment(const void* p, int64_t pitch_bytes) {
  const uint64_t v = reinterpret_cast<uintptr_t>(p) | static_cast<uint64_t>(pitch_bytes) | 256u;
  return static_cast<int>(v & (~v + 1));
}

}  // namespace

struct LtMatmul::Plan {
  cudaDataType_t ab;
  int out, T, in;
  int64_t ldy;
  int align_w, align_x, align_y;
  size_t ws_bytes;
  bool pinned = false;
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
  cublasLtMatmulAlgo_t algo{};

  ~Plan() {
    if (c) cublasLtMatrixLayoutDestroy(c);
    if (b) cublasLtMatrixLayoutDestroy(b);
    if (a) cublasLtMatrixLayoutDestroy(a);
    if (desc) cublasLtMatmulDescDestroy(desc);
  }
};

LtMatmul::LtMatmul() = default;

LtMatmul::~LtMatmul() {
  plans_.clear();
  if (handle_) cublasLtDestroy(handle_);
}

void LtMatmul::init() {
  if (!handle_) MAMBACPP_CUBLAS_CHECK(cublasLtCreate(&handle_));
}

cublasLtMatmulAlgo_t LtMatmul::heuristic(cublasLtMatmulDesc_t desc, cublasLtMatrixLayout_t a,
                                         cublasLtMatrixLayout_t b, cublasLtMatrixLayout_t c, int align_w,
                                         int align_x, int align_y, size_t ws_bytes, int out, int T, int in) {
  cublasLtMatmulPreference_t pref = nullptr;
  MAMBACPP_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
  const uint64_t ws = ws_bytes;
  const uint32_t aw = static_cast<uint32_t>(align_w), ax = static_cast<uint32_t>(align_x),
                 ay = static_cast<uint32_t>(align_y);
  cublasLtMatmulHeuristicResult_t result{};
  int found = 0;
  cublasStatus_t st = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws,
                                                           sizeof(ws));
  if (st == CUBLAS_STATUS_SUCCESS)
    st = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &aw, sizeof(aw));
  if (st == CUBLAS_STATUS_SUCCESS)
    st = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &ax, sizeof(ax));
  if (st == CUBLAS_STATUS_SUCCESS)
    st = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &ay, sizeof(ay));
  if (st == CUBLAS_STATUS_SUCCESS)
    st = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &ay, sizeof(ay));
  if (st == CUBLAS_STATUS_SUCCESS)
    st = cublasLtMatmulAlgoGetHeuristic(handle_, desc, a, b, c, c, pref, 1, &result, &found);
  cublasLtMatmulPreferenceDestroy(pref);
  MAMBACPP_CUBLAS_CHECK(st);
  if (found < 1)
    fail("linear: cuBLASLt has no algorithm for y [", T, ", ", out, "] = x [", T, ", ", in, "] . w^T");
  return result.algo;
}

LtMatmul::Plan& LtMatmul::plan(cudaDataType_t ab, int out, int T, int in, int64_t ldy, int align_w, int align_x,
                               int align_y, size_t ws_bytes, bool pinned) {
  for (auto& p : plans_)
    if (p->ab == ab && p->out == out && p->T == T && p->in == in && p->ldy == ldy && p->align_w == align_w &&
        p->align_x == align_x && p->align_y == align_y && p->ws_bytes == ws_bytes && p->pinned == pinned)
      return *p;
  auto p = std::make_unique<Plan>();
  p->ab = ab;
  p->out = out;
  p->T = T;
  p->in = in;
  p->ldy = ldy;
  p->align_w = align_w;
  p->align_x = align_x;
  p->align_y = align_y;
  p->ws_bytes = ws_bytes;
  p->pinned = pinned;
  // Column-major view: y^T [out, T] = op(W) . X^T with W seen as [in, out] (ld in) and transposed, X^T as [in, T].
  MAMBACPP_CUBLAS_CHECK(cublasLtMatmulDescCreate(&p->desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  const cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
  MAMBACPP_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)));
  MAMBACPP_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb)));
  MAMBACPP_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p->a, ab, in, out, in));
  MAMBACPP_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p->b, ab, in, T, in));
  MAMBACPP_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p->c, CUDA_R_32F, out, T, ldy));

  bool have = false;
  if (pinned) {
    // The reference shape's layouts (T = kPinnedRefT, same leading dimensions), for the heuristic only.
    cublasLtMatrixLayout_t rb = nullptr, rc = nullptr;
    MAMBACPP_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&rb, ab, in, kPinnedRefT, in));
    MAMBACPP_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&rc, CUDA_R_32F, out, kPinnedRefT, std::max<int64_t>(ldy, out)));
    try {
      p->algo = heuristic(p->desc, p->a, rb, rc, align_w, align_x, align_y, ws_bytes, out, kPinnedRefT, in);
    } catch (...) {
      cublasLtMatrixLayoutDestroy(rc);
      cublasLtMatrixLayoutDestroy(rb);
      throw;
    }
    cublasLtMatrixLayoutDestroy(rc);
    cublasLtMatrixLayoutDestroy(rb);
    cublasLtMatmulHeuristicResult_t check{};
    have = cublasLtMatmulAlgoCheck(handle_, p->desc, p->a, p->b, p->c, p->c, &p->algo, &check) ==
               CUBLAS_STATUS_SUCCESS &&
           check.workspaceSize <= ws_bytes;
    if (!have) ++pinned_fallbacks_;
  }
  if (!have) p->algo = heuristic(p->desc, p->a, p->b, p->c, align_w, align_x, align_y, ws_bytes, out, T, in);
  // Every distinct T (prompt piece length) is a shape: keep the most recent plans only. Dropping one is safe at any
  // time, a matmul reads its descriptors when it is enqueued.
  if (plans_.size() >= kMaxPlans) plans_.erase(plans_.begin());
  plans_.push_back(std::move(p));
  return *plans_.back();
}

void LtMatmul::run(cudaStream_t stream, void* workspace, size_t ws_bytes, cudaDataType_t ab, const void* w,
                   const void* x, float* y, int out, int T, int in, int64_t ldy, float beta, bool pinned) {
  init();
  const int elem = 2;  // 16-bit operands
  Plan& p = plan(ab, out, T, in, ldy, alignment(w, int64_t(in) * elem), alignment(x, int64_t(in) * elem),
                 alignment(y, ldy * 4), ws_bytes, pinned);
  const float alpha = 1.0f;
  MAMBACPP_CUBLAS_CHECK(cublasLtMatmul(handle_, p.desc, &alpha, w, p.a, x, p.b, &beta, y, p.c, y, p.c, &p.algo,
                                       workspace, ws_bytes, stream));
}

}  // namespace mambacpp::cuda
