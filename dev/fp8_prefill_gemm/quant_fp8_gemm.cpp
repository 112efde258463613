// The fp8 prefill GEMM on Hopper's FP8 tensor cores (quant_ops.h): y^T [out, T] = W_q [out, in] . X_q^T with both
// operands e4m3, f32 accumulation and an f32 output, through cuBLASLt (column-major TN: W seen as [in, out] and
// transposed, X^T as [in, T]; the layout FP8 matmuls require). The scales stay outside: the caller quantized X per
// row and scales y by the row's and the channel's scales afterwards (launch_scale_rows_columns).
// One algorithm per weight shape and alignment: the heuristic's first at kRefRows rows, run at every T where cuBLASLt
// accepts it (so a row's reduction order does not change with the prompt's length), else T's own heuristic choice.
// The plans (descriptor, layouts, algorithm) are kept per (shape, T, output pitch), the last kMaxPlans.
#include <cublasLt.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/quant_ops.h"
#include "mambacpp/error.h"

namespace mambacpp::cuda {
namespace {

constexpr int kRefRows = 4096;
constexpr size_t kMaxPlans = 256;

int alignment(const void* p, int64_t pitch_bytes) {
  const uint64_t v = reinterpret_cast<uintptr_t>(p) | static_cast<uint64_t>(pitch_bytes) | 256u;
  return static_cast<int>(v & (~v + 1));
}

struct Plan {
  int out = 0, T = 0, in = 0;
  int64_t ldy = 0;
  int align_y = 0;
  size_t ws_bytes = 0;
  bool usable = false;
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
  cublasLtMatmulAlgo_t algo{};
  Plan() = default;
  Plan(const Plan&) = delete;
  Plan& operator=(const Plan&) = delete;
  ~Plan() {
    if (c) cublasLtMatrixLayoutDestroy(c);
    if (b) cublasLtMatrixLayoutDestroy(b);
    if (a) cublasLtMatrixLayoutDestroy(a);
    if (desc) cublasLtMatmulDescDestroy(desc);
  }
};

// The shape's reference algorithm (found = false: the heuristic had none at kRefRows).
struct Reference {
  int out, in, align_y;
  size_t ws_bytes;
  bool found = false;
  cublasLtMatmulAlgo_t algo{};
};

class Fp8Plans {
 public:
  bool run(cudaStream_t stream, void* ws, size_t ws_bytes, const uint8_t* w, const uint8_t* x, float* y, int out,
           int T, int in, int64_t ldy) {
    std::lock_guard<std::mutex> lock(mu_);
    if (!handle_) MAMBACPP_CUBLAS_CHECK(cublasLtCreate(&handle_));
    const int align_y = alignment(y, ldy * 4);
    Plan& p = plan(out, T, in, ldy, align_y, ws_bytes);
    if (!p.usable) return false;
    const float one = 1.0f, zero = 0.0f;
    MAMBACPP_CUBLAS_CHECK(cublasLtMatmul(handle_, p.desc, &one, w, p.a, x, p.b, &zero, y, p.c, y, p.c, &p.algo, ws,
                                         ws_bytes, stream));
    return true;
  }

 private:
  static void describe(Plan& p) {
    MAMBACPP_CUBLAS_CHECK(cublasLtMatmulDescCreate(&p.desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    const cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
    MAMBACPP_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)));
    MAMBACPP_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb)));
    MAMBACPP_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p.a, CUDA_R_8F_E4M3, p.in, p.out, p.in));
    MAMBACPP_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p.b, CUDA_R_8F_E4M3, p.in, p.T, p.in));
    MAMBACPP_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p.c, CUDA_R_32F, p.out, p.T, p.ldy));
  }

  // The heuristic's first algorithm for the plan's layouts (false: none).
  bool heuristic(const Plan& p, cublasLtMatmulAlgo_t& algo) {
    cublasLtMatmulPreference_t pref = nullptr;
    MAMBACPP_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
    const uint64_t ws = p.ws_bytes;
    const uint32_t a16 = 16, ay = static_cast<uint32_t>(p.align_y);
    cublasStatus_t st =
        cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws));
    if (st == CUBLAS_STATUS_SUCCESS)
      st = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &a16, sizeof(a16));
    if (st == CUBLAS_STATUS_SUCCESS)
      st = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &a16, sizeof(a16));
    if (st == CUBLAS_STATUS_SUCCESS)
      st = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &ay, sizeof(ay));
    if (st == CUBLAS_STATUS_SUCCESS)
      st = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &ay, sizeof(ay));
    cublasLtMatmulHeuristicResult_t result{};
    int found = 0;
    if (st == CUBLAS_STATUS_SUCCESS)
      st = cublasLtMatmulAlgoGetHeuristic(handle_, p.desc, p.a, p.b, p.c, p.c, pref, 1, &result, &found);
    cublasLtMatmulPreferenceDestroy(pref);
    // Layouts cuBLASLt does not take for FP8 answer NOT_SUPPORTED: no plan, the caller's fallback runs.
    if (st != CUBLAS_STATUS_SUCCESS || found < 1) return false;
    algo = result.algo;
    return true;
  }

  const Reference& reference(int out, int in, int align_y, size_t ws_bytes) {
    for (const Reference& r : refs_)
      if (r.out == out && r.in == in && r.align_y == align_y && r.ws_bytes == ws_bytes) return r;
    Plan probe;
    probe.out = out, probe.T = kRefRows, probe.in = in, probe.ldy = out, probe.align_y = align_y;
    probe.ws_bytes = ws_bytes;
    describe(probe);
    Reference r{out, in, align_y, ws_bytes};
    r.found = heuristic(probe, r.algo);
    refs_.push_back(r);
    return refs_.back();
  }

  Plan& plan(int out, int T, int in, int64_t ldy, int align_y, size_t ws_bytes) {
    for (auto& p : plans_)
      if (p->out == out && p->T == T && p->in == in && p->ldy == ldy && p->align_y == align_y &&
          p->ws_bytes == ws_bytes)
        return *p;
    if (plans_.size() >= kMaxPlans) plans_.pop_front();
    auto p = std::make_unique<Plan>();
    p->out = out, p->T = T, p->in = in, p->ldy = ldy, p->align_y = align_y, p->ws_bytes = ws_bytes;
    describe(*p);
    const Reference& ref = reference(out, in, align_y, ws_bytes);
    cublasLtMatmulHeuristicResult_t check{};
    if (ref.found && cublasLtMatmulAlgoCheck(handle_, p->desc, p->a, p->b, p->c, p->c, &ref.algo, &check) ==
                         CUBLAS_STATUS_SUCCESS &&
        check.workspaceSize <= ws_bytes) {
      p->algo = ref.algo;
      p->usable = true;
    } else {
      p->usable = heuristic(*p, p->algo);
    }
    plans_.push_back(std::move(p));
    return *plans_.back();
  }

  std::mutex mu_;
  cublasLtHandle_t handle_ = nullptr;
  std::deque<std::unique_ptr<Plan>> plans_;
  std::deque<Reference> refs_;
};

// Process-wide and never destroyed: a static's destructor would run after the CUDA runtime has shut down.
Fp8Plans& fp8_plans() {
  static Fp8Plans* plans = new Fp8Plans;
  return *plans;
}

}  // namespace

bool run_fp8_gemm(cudaStream_t stream, void* workspace, size_t ws_bytes, const uint8_t* w, const uint8_t* x, float* y,
                  int64_t out, int64_t T, int64_t in, int64_t ldy) {
  if (out % 16 != 0 || in % 16 != 0 || out > INT32_MAX || T > INT32_MAX || in > INT32_MAX || ldy % 4 != 0)
    return false;
  if (reinterpret_cast<uintptr_t>(w) % 16 != 0 || reinterpret_cast<uintptr_t>(x) % 16 != 0) return false;
  return fp8_plans().run(stream, workspace, ws_bytes, w, x, y, static_cast<int>(out), static_cast<int>(T),
                         static_cast<int>(in), ldy);
}

}  // namespace mambacpp::cuda
