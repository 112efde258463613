// cuBLASLt plans for the prefill GEMMs (see gemm_lt.h).
#include "backend/cuda/gemm_lt.h"

#include <algorithm>
#include <cstring>
#include <random>

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
  Pin pin = Pin::None;
  cudaDataType_t y_type = CUDA_R_32F;
  bool pinned = false;  // runs the pinned algorithm itself (not the heuristic's fallback choice at T)
  bool usable = true;   // a bf16-output plan: prefill_bf16 found an algorithm
  int block_rows = 0;  // > 0: run as blocks of this many rows (the pinned algorithm is not runnable at T)
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

// An algorithm chosen once per shape (the wide variant of a decode plan, or a prefill plan); found = false: none.
struct LtMatmul::Chosen {
  cudaDataType_t ab;
  int out, in;
  int align_w, align_x, align_y;
  size_t ws_bytes;
  bool found = false;
  cublasLtMatmulAlgo_t algo{};
};

namespace {

int algo_attr(const cublasLtMatmulAlgo_t& algo, cublasLtMatmulAlgoConfigAttributes_t attr) {
  int v = -1;
  size_t written = 0;
  if (cublasLtMatmulAlgoConfigGetAttribute(&algo, attr, &v, sizeof(v), &written) != CUBLAS_STATUS_SUCCESS) return -1;
  return v;
}

// The decode algorithm with other tiles and custom options, every other field (its split of `in` among them) kept:
// the variants the heuristic may not offer at wide T (it rarely offers split-K there).
std::vector<cublasLtMatmulAlgo_t> tile_variants(const cublasLtMatmulAlgo_t& algo) {
  std::vector<cublasLtMatmulAlgo_t> out;
  size_t bytes = 0;
  if (cublasLtMatmulAlgoCapGetAttribute(&algo, CUBLASLT_ALGO_CAP_TILE_IDS, nullptr, 0, &bytes) !=
          CUBLAS_STATUS_SUCCESS ||
      bytes == 0)
    return out;
  std::vector<uint32_t> tiles(bytes / sizeof(uint32_t));
  if (cublasLtMatmulAlgoCapGetAttribute(&algo, CUBLASLT_ALGO_CAP_TILE_IDS, tiles.data(), bytes, &bytes) !=
      CUBLAS_STATUS_SUCCESS)
    return out;
  int32_t max_option = 0;
  if (cublasLtMatmulAlgoCapGetAttribute(&algo, CUBLASLT_ALGO_CAP_CUSTOM_OPTION_MAX, &max_option, sizeof(max_option),
                                        &bytes) != CUBLAS_STATUS_SUCCESS)
    max_option = 0;
  for (const uint32_t tile : tiles)
    for (uint32_t option = 0; option <= static_cast<uint32_t>(std::clamp(max_option, 0, 15)); ++option) {
      cublasLtMatmulAlgo_t v = algo;
      if (cublasLtMatmulAlgoConfigSetAttribute(&v, CUBLASLT_ALGO_CONFIG_TILE_ID, &tile, sizeof(tile)) ==
              CUBLAS_STATUS_SUCCESS &&
          cublasLtMatmulAlgoConfigSetAttribute(&v, CUBLASLT_ALGO_CONFIG_CUSTOM_OPTION, &option, sizeof(option)) ==
              CUBLAS_STATUS_SUCCESS)
        out.push_back(v);
    }
  return out;
}

// Random finite 16-bit values of magnitude 2^-3 .. 2 and either sign: products exact in f32, sums over `in` terms
// whose rounding depends on their order.
std::vector<uint16_t> probe_values(size_t n, cudaDataType_t ab, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<uint16_t> v(n);
  const bool bf16 = ab == CUDA_R_16BF;
  for (auto& e : v) {
    const uint32_t r = rng();
    const uint32_t sign = (r >> 31) & 1u, expo = (r >> 24) % 4u;
    e = bf16 ? static_cast<uint16_t>(sign << 15 | (124u + expo) << 7 | (r & 0x7fu))
             : static_cast<uint16_t>(sign << 15 | (12u + expo) << 10 | (r & 0x3ffu));
  }
  return v;
}

// Device memory freed on every path out.
struct DeviceBlock {
  void* p = nullptr;
  ~DeviceBlock() {
    if (p) cudaFree(p);
  }
};

// A matrix layout destroyed on every path out.
struct Layout {
  cublasLtMatrixLayout_t h = nullptr;
  Layout(cudaDataType_t type, int rows, int cols, int64_t ld) {
    MAMBACPP_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&h, type, rows, cols, ld));
  }
  Layout(const Layout&) = delete;
  Layout& operator=(const Layout&) = delete;
  ~Layout() { cublasLtMatrixLayoutDestroy(h); }
};

// The probes' layouts of x [rows, in] (16-bit) and y [rows, out] (f32), at `rows` and at kPinnedRefT rows.
struct ProbeLayouts {
  Layout b, c, b_ref, c_ref;
  ProbeLayouts(cudaDataType_t ab, int out, int in, int rows)
      : b(ab, in, rows, in),
        c(CUDA_R_32F, out, rows, out),
        b_ref(ab, in, LtMatmul::kPinnedRefT, in),
        c_ref(CUDA_R_32F, out, LtMatmul::kPinnedRefT, out) {}
};

}  // namespace

// The plan's matmul descriptor and layouts from its fields.
void LtMatmul::describe(Plan& p) {
  // Column-major view: y^T [out, T] = op(W) . X^T with W seen as [in, out] (ld in) and transposed, X^T as [in, T].
  MAMBACPP_CUBLAS_CHECK(cublasLtMatmulDescCreate(&p.desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  const cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
  MAMBACPP_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)));
  MAMBACPP_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb)));
  MAMBACPP_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p.a, p.ab, p.in, p.out, p.in));
  MAMBACPP_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p.b, p.ab, p.in, p.T, p.in));
  MAMBACPP_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p.c, p.y_type, p.out, p.T, p.ldy));
}

LtMatmul::LtMatmul() = default;

LtMatmul::~LtMatmul() {
  plans_.clear();
  plans_bf16_.clear();
  if (handle_) cublasLtDestroy(handle_);
}

void LtMatmul::init() {
  if (!handle_) MAMBACPP_CUBLAS_CHECK(cublasLtCreate(&handle_));
}

std::vector<cublasLtMatmulHeuristicResult_t> LtMatmul::candidates(cublasLtMatmulDesc_t desc, cublasLtMatrixLayout_t a,
                                                                  cublasLtMatrixLayout_t b, cublasLtMatrixLayout_t c,
                                                                  int align_w, int align_x, int align_y,
                                                                  size_t ws_bytes, int n) {
  cublasLtMatmulPreference_t pref = nullptr;
  MAMBACPP_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
  const uint64_t ws = ws_bytes;
  const uint32_t aw = static_cast<uint32_t>(align_w), ax = static_cast<uint32_t>(align_x),
                 ay = static_cast<uint32_t>(align_y);
  std::vector<cublasLtMatmulHeuristicResult_t> results(static_cast<size_t>(n));
  int found = 0;
  cublasStatus_t st =
      cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws));
  if (st == CUBLAS_STATUS_SUCCESS)
    st = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &aw, sizeof(aw));
  if (st == CUBLAS_STATUS_SUCCESS)
    st = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &ax, sizeof(ax));
  if (st == CUBLAS_STATUS_SUCCESS)
    st = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &ay, sizeof(ay));
  if (st == CUBLAS_STATUS_SUCCESS)
    st = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &ay, sizeof(ay));
  if (st == CUBLAS_STATUS_SUCCESS)
    st = cublasLtMatmulAlgoGetHeuristic(handle_, desc, a, b, c, c, pref, n, results.data(), &found);
  cublasLtMatmulPreferenceDestroy(pref);
  MAMBACPP_CUBLAS_CHECK(st);
  results.resize(static_cast<size_t>(std::max(found, 0)));
  return results;
}

cublasLtMatmulAlgo_t LtMatmul::heuristic(cublasLtMatmulDesc_t desc, cublasLtMatrixLayout_t a, cublasLtMatrixLayout_t b,
                                         cublasLtMatrixLayout_t c, int align_w, int align_x, int align_y,
                                         size_t ws_bytes, int out, int T, int in) {
  const auto found = candidates(desc, a, b, c, align_w, align_x, align_y, ws_bytes, 1);
  if (found.empty()) fail("linear: cuBLASLt has no algorithm for y [", T, ", ", out, "] = x [", T, ", ", in, "] . w^T");
  return found[0].algo;
}

bool LtMatmul::runnable(cublasLtMatmulDesc_t desc, cublasLtMatrixLayout_t a, cublasLtMatrixLayout_t b,
                        cublasLtMatrixLayout_t c, const cublasLtMatmulAlgo_t& algo, size_t ws_bytes) const {
  cublasLtMatmulHeuristicResult_t check{};
  return cublasLtMatmulAlgoCheck(handle_, desc, a, b, c, c, &algo, &check) == CUBLAS_STATUS_SUCCESS &&
         check.workspaceSize <= ws_bytes;
}

LtMatmul::Chosen* LtMatmul::find_chosen(std::vector<std::unique_ptr<Chosen>>& list, const Plan& shape) {
  for (auto& c : list)
    if (c->ab == shape.ab && c->out == shape.out && c->in == shape.in && c->align_w == shape.align_w &&
        c->align_x == shape.align_x && c->align_y == shape.align_y && c->ws_bytes == shape.ws_bytes)
      return c.get();
  return nullptr;
}

std::optional<cublasLtMatmulAlgo_t> LtMatmul::fastest_equal(cudaStream_t stream, void* workspace, const Plan& shape,
                                                            const std::vector<cublasLtMatmulAlgo_t>& algos,
                                                            const cublasLtMatmulAlgo_t* reference, int rows) {
  if (algos.empty()) return std::nullopt;
  const int R = rows;
  const int out = shape.out, in = shape.in;
  const ProbeLayouts layouts(shape.ab, out, in, R);
  const cublasLtMatrixLayout_t b = layouts.b.h, c = layouts.c.h, b_ref = layouts.b_ref.h, c_ref = layouts.c_ref.h;

  const size_t w_bytes = size_t(out) * in * 2, x_bytes = size_t(R) * in * 2, y_bytes = size_t(R) * out * 4;
  DeviceBlock block;
  if (cudaMalloc(&block.p, w_bytes + x_bytes + 2 * y_bytes + size_t(kPinnedRefT) * out * 4) != cudaSuccess) {
    cudaGetLastError();  // clear the failed allocation; the caller keeps what it has
    return std::nullopt;
  }
  char* base = static_cast<char*>(block.p);
  void *dw = base, *dx = base + w_bytes;
  float* y_init = reinterpret_cast<float*>(base + w_bytes + x_bytes);
  float* y = y_init + size_t(R) * out;
  float* y_ref = y + size_t(R) * out;  // kPinnedRefT rows
  const auto hw = probe_values(size_t(out) * in, shape.ab, 1), hx = probe_values(size_t(R) * in, shape.ab, 2);
  std::vector<float> h_init(size_t(R) * out);
  std::mt19937 rng(3);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  for (auto& v : h_init) v = dist(rng);
  MAMBACPP_CUDA_CHECK(cudaMemcpyAsync(dw, hw.data(), w_bytes, cudaMemcpyHostToDevice, stream));
  MAMBACPP_CUDA_CHECK(cudaMemcpyAsync(dx, hx.data(), x_bytes, cudaMemcpyHostToDevice, stream));
  MAMBACPP_CUDA_CHECK(cudaMemcpyAsync(y_init, h_init.data(), y_bytes, cudaMemcpyHostToDevice, stream));
  // beta = 1 over random y: the epilogue's add is part of what must match.
  const float one = 1.0f;
  auto matmul = [&](const cublasLtMatmulAlgo_t& a, float* dst, cublasLtMatrixLayout_t bl, cublasLtMatrixLayout_t cl) {
    MAMBACPP_CUBLAS_CHECK(cublasLtMatmul(handle_, shape.desc, &one, dw, shape.a, dx, bl, &one, dst, cl, dst, cl, &a,
                                         workspace, shape.ws_bytes, stream));
  };
  // The first kPinnedRefT rows of y_init + x . w^T, by algorithm a over `rows` rows.
  const size_t ref_bytes = size_t(kPinnedRefT) * out * 4;
  auto result = [&](const cublasLtMatmulAlgo_t& a, float* dst, int rows, std::vector<float>& host) {
    MAMBACPP_CUDA_CHECK(cudaMemcpyAsync(dst, y_init, size_t(rows) * out * 4, cudaMemcpyDeviceToDevice, stream));
    matmul(a, dst, rows == R ? b : b_ref, rows == R ? c : c_ref);
    host.resize(size_t(kPinnedRefT) * out);
    MAMBACPP_CUDA_CHECK(cudaMemcpyAsync(host.data(), dst, ref_bytes, cudaMemcpyDeviceToHost, stream));
    MAMBACPP_CUDA_CHECK(cudaStreamSynchronize(stream));
  };
  std::vector<float> want, got;
  bool have_want = reference != nullptr;
  if (reference) result(*reference, y_ref, kPinnedRefT, want);
  cudaEvent_t e0 = nullptr, e1 = nullptr;
  MAMBACPP_CUDA_CHECK(cudaEventCreate(&e0));
  MAMBACPP_CUDA_CHECK(cudaEventCreate(&e1));
  std::optional<cublasLtMatmulAlgo_t> best;
  float best_ms = 0;
  for (const auto& a : algos) {
    if (!have_want) {  // no reference yet: the first candidate whose rows do not depend on T becomes it
      if (!runnable(shape.desc, shape.a, b_ref, c_ref, a, shape.ws_bytes)) continue;
      result(a, y_ref, kPinnedRefT, want);
    }
    result(a, y, R, got);
    if (std::memcmp(got.data(), want.data(), got.size() * sizeof(float)) != 0) continue;
    have_want = true;
    constexpr int kTimedRuns = 5;
    MAMBACPP_CUDA_CHECK(cudaEventRecord(e0, stream));
    for (int i = 0; i < kTimedRuns; ++i) matmul(a, y, b, c);
    MAMBACPP_CUDA_CHECK(cudaEventRecord(e1, stream));
    MAMBACPP_CUDA_CHECK(cudaEventSynchronize(e1));
    float ms = 0;
    MAMBACPP_CUDA_CHECK(cudaEventElapsedTime(&ms, e0, e1));
    if (!best || ms < best_ms) {
      best = a;
      best_ms = ms;
    }
  }
  cudaEventDestroy(e1);
  cudaEventDestroy(e0);
  return best;
}

namespace {

// The probes synchronize the stream and allocate: never inside a CUDA graph capture.
bool capturing(cudaStream_t stream) {
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  return cudaStreamIsCapturing(stream, &capture) != cudaSuccess || capture != cudaStreamCaptureStatusNone;
}

}  // namespace

const cublasLtMatmulAlgo_t* LtMatmul::wide(cudaStream_t stream, void* workspace, const Plan& ref) {
  if (Chosen* w = find_chosen(wides_, ref)) return w->found ? &w->algo : nullptr;
  // (Decode's graphs have fewer than kWideMinT rows; should one not, it keeps the decode plan.)
  if (capturing(stream)) return nullptr;
  auto w =
      std::make_unique<Chosen>(Chosen{ref.ab, ref.out, ref.in, ref.align_w, ref.align_x, ref.align_y, ref.ws_bytes});
  const ProbeLayouts layouts(ref.ab, ref.out, ref.in, kProbeRows);
  const cublasLtMatrixLayout_t b = layouts.b.h, c = layouts.c.h, b_ref = layouts.b_ref.h, c_ref = layouts.c_ref.h;
  const cublasLtMatmulAlgo_t decode = ref.algo;
  auto valid = [&](const cublasLtMatmulAlgo_t& a, cublasLtMatrixLayout_t bl, cublasLtMatrixLayout_t cl) {
    return runnable(ref.desc, ref.a, bl, cl, a, ref.ws_bytes);
  };
  // Same kernel family, same split of `in` (count and reduction): only tiles, stages and options may differ.
  std::vector<cublasLtMatmulAlgo_t> same_kernel;
  if (valid(decode, b_ref, c_ref)) {
    for (const auto& r : candidates(ref.desc, ref.a, b, c, ref.align_w, ref.align_x, ref.align_y, ref.ws_bytes, 16))
      if (algo_attr(r.algo, CUBLASLT_ALGO_CONFIG_ID) == algo_attr(decode, CUBLASLT_ALGO_CONFIG_ID) &&
          algo_attr(r.algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM) == algo_attr(decode, CUBLASLT_ALGO_CONFIG_SPLITK_NUM) &&
          algo_attr(r.algo, CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME) ==
              algo_attr(decode, CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME) &&
          r.workspaceSize <= ref.ws_bytes)
        same_kernel.push_back(r.algo);
    for (const auto& v : tile_variants(decode))
      if (valid(v, b, c)) same_kernel.push_back(v);
  }
  if (std::optional<cublasLtMatmulAlgo_t> a = fastest_equal(stream, workspace, ref, same_kernel, &decode, kProbeRows)) {
    w->found = true;
    w->algo = *a;
  }
  ++(w->found ? wide_chosen_ : wide_rejected_);
  wides_.push_back(std::move(w));
  return wides_.back()->found ? &wides_.back()->algo : nullptr;
}

const cublasLtMatmulAlgo_t* LtMatmul::prefill(cudaStream_t stream, void* workspace, const Plan& shape) {
  if (Chosen* p = find_chosen(prefills_, shape)) return p->found ? &p->algo : nullptr;
  // A prefill inside a capture runs on the heuristic's choice for its T (counted as a fallback).
  if (capturing(stream)) return nullptr;
  auto p = std::make_unique<Chosen>(
      Chosen{shape.ab, shape.out, shape.in, shape.align_w, shape.align_x, shape.align_y, shape.ws_bytes});
  const ProbeLayouts layouts(shape.ab, shape.out, shape.in, kPrefillProbeRows);
  // Without split-K (no partial sums through the workspace; a split that varies with T would vary the bits too).
  std::vector<cublasLtMatmulAlgo_t> unsplit;
  for (const auto& r : candidates(shape.desc, shape.a, layouts.b.h, layouts.c.h, shape.align_w, shape.align_x,
                                  shape.align_y, shape.ws_bytes, 16))
    if (algo_attr(r.algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM) <= 1) unsplit.push_back(r.algo);
  // The bits are those of the heuristic's first candidate whose rows do not depend on T (the heuristic's order is the
  // same in every process, a timing is not); the fastest candidate giving those bits runs.
  if (std::optional<cublasLtMatmulAlgo_t> a =
          fastest_equal(stream, workspace, shape, unsplit, nullptr, kPrefillProbeRows)) {
    p->found = true;
    p->algo = *a;
    ++prefill_chosen_;
  }
  prefills_.push_back(std::move(p));
  return prefills_.back()->found ? &prefills_.back()->algo : nullptr;
}

LtMatmul::Plan& LtMatmul::plan(cudaStream_t stream, void* workspace, cudaDataType_t ab, int out, int T, int in,
                               int64_t ldy, int align_w, int align_x, int align_y, size_t ws_bytes, Pin pin) {
  for (auto& p : plans_)
    if (p->ab == ab && p->out == out && p->T == T && p->in == in && p->ldy == ldy && p->align_w == align_w &&
        p->align_x == align_x && p->align_y == align_y && p->ws_bytes == ws_bytes && p->pin == pin)
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
  p->pin = pin;
  describe(*p);

  bool have = false;
  auto valid_here = [&](const cublasLtMatmulAlgo_t& a) { return runnable(p->desc, p->a, p->b, p->c, a, ws_bytes); };
  if (pin == Pin::Prefill) {
    if (const cublasLtMatmulAlgo_t* a = prefill(stream, workspace, *p); a && valid_here(*a)) {
      p->algo = *a;
      have = p->pinned = true;
    }
    if (!have) ++pinned_fallbacks_;
  } else if (pin == Pin::Decode) {
    // The reference shape's layouts (T = kPinnedRefT, same leading dimensions), for the heuristic only.
    {
      const Layout rb(ab, in, kPinnedRefT, in), rc(CUDA_R_32F, out, kPinnedRefT, std::max<int64_t>(ldy, out));
      p->algo = heuristic(p->desc, p->a, rb.h, rc.h, align_w, align_x, align_y, ws_bytes, out, kPinnedRefT, in);
    }
    if (T >= kWideMinT)
      if (const cublasLtMatmulAlgo_t* w = wide(stream, workspace, *p); w && valid_here(*w)) {
        p->algo = *w;
        have = true;
      }
    if (!have) have = valid_here(p->algo);
    // Not runnable at T (a split-K algorithm's workspace grows with T): the same algorithm over blocks of rows, the
    // largest power of two it accepts. A row's bits stay the decode plan's.
    for (int rows = kPinnedRefT; !have && rows < T; rows *= 2) {
      const Layout bb(ab, in, rows, in), bc(CUDA_R_32F, out, rows, ldy);
      if (runnable(p->desc, p->a, bb.h, bc.h, p->algo, ws_bytes))
        p->block_rows = rows;
      else if (p->block_rows)
        break;
    }
    if (p->block_rows) {
      have = true;
      ++pinned_blocked_;
    }
    p->pinned = have;
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
                   const void* x, float* y, int out, int T, int in, int64_t ldy, float beta, Pin pin, float alpha) {
  init();
  const int elem = 2;  // 16-bit operands
  Plan& p = plan(stream, workspace, ab, out, T, in, ldy, alignment(w, int64_t(in) * elem),
                 alignment(x, int64_t(in) * elem), alignment(y, ldy * 4), ws_bytes, pin);
  if (p.block_rows) {
    const int rows = p.block_rows;  // copied: the calls below may drop the plan from the cache
    for (int t = 0; t < T; t += rows)
      run(stream, workspace, ws_bytes, ab, w, static_cast<const char*>(x) + int64_t(t) * in * elem, y + t * ldy, out,
          std::min(rows, T - t), in, ldy, beta, pin, alpha);
    return;
  }
  MAMBACPP_CUBLAS_CHECK(cublasLtMatmul(handle_, p.desc, &alpha, w, p.a, x, p.b, &beta, y, p.c, y, p.c, &p.algo,
                                       workspace, ws_bytes, stream));
}

const cublasLtMatmulAlgo_t* LtMatmul::prefill_bf16(cudaStream_t stream, void* workspace, const Plan& f,
                                                   const Plan& h) {
  if (Chosen* c = find_chosen(bf16_chosen_, h)) return c->found ? &c->algo : nullptr;
  auto chosen = std::make_unique<Chosen>(Chosen{h.ab, h.out, h.in, h.align_w, h.align_x, h.align_y, h.ws_bytes});
  const int R = kPrefillProbeRows, out = f.out, in = f.in;
  const Layout b(f.ab, in, R, in), c32(CUDA_R_32F, out, R, out), c16(CUDA_R_16BF, out, R, out);
  // The f32 plan's own algorithm first, then the heuristic's for a bf16 output, without split-K.
  std::vector<cublasLtMatmulAlgo_t> algos{f.algo};
  for (const auto& r : candidates(h.desc, h.a, b.h, c16.h, h.align_w, h.align_x, h.align_y, h.ws_bytes, 16))
    if (algo_attr(r.algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM) <= 1) algos.push_back(r.algo);
  const size_t w_bytes = size_t(out) * in * 2, x_bytes = size_t(R) * in * 2, y_bytes = size_t(R) * out * 4;
  DeviceBlock block;
  if (runnable(f.desc, f.a, b.h, c32.h, f.algo, f.ws_bytes) &&
      cudaMalloc(&block.p, w_bytes + x_bytes + y_bytes + y_bytes / 2) == cudaSuccess) {
    char* base = static_cast<char*>(block.p);
    void *dw = base, *dx = base + w_bytes, *y32 = base + w_bytes + x_bytes, *y16 = base + w_bytes + x_bytes + y_bytes;
    const auto hw = probe_values(size_t(out) * in, f.ab, 4), hx = probe_values(size_t(R) * in, f.ab, 5);
    MAMBACPP_CUDA_CHECK(cudaMemcpyAsync(dw, hw.data(), w_bytes, cudaMemcpyHostToDevice, stream));
    MAMBACPP_CUDA_CHECK(cudaMemcpyAsync(dx, hx.data(), x_bytes, cudaMemcpyHostToDevice, stream));
    const float one = 1.0f, zero = 0.0f;
    MAMBACPP_CUBLAS_CHECK(cublasLtMatmul(handle_, f.desc, &one, dw, f.a, dx, b.h, &zero, y32, c32.h, y32, c32.h,
                                         &f.algo, workspace, f.ws_bytes, stream));
    std::vector<float> v32(size_t(R) * out);
    MAMBACPP_CUDA_CHECK(cudaMemcpyAsync(v32.data(), y32, y_bytes, cudaMemcpyDeviceToHost, stream));
    MAMBACPP_CUDA_CHECK(cudaStreamSynchronize(stream));
    std::vector<uint16_t> want(v32.size()), got(v32.size());
    for (size_t i = 0; i < v32.size(); ++i) {  // round to nearest even (the probe's values are finite)
      uint32_t u;
      std::memcpy(&u, &v32[i], 4);
      want[i] = static_cast<uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
    }
    auto matmul = [&](const cublasLtMatmulAlgo_t& a) {
      MAMBACPP_CUBLAS_CHECK(cublasLtMatmul(handle_, h.desc, &one, dw, h.a, dx, b.h, &zero, y16, c16.h, y16, c16.h, &a,
                                           workspace, h.ws_bytes, stream));
    };
    cudaEvent_t e0 = nullptr, e1 = nullptr;
    MAMBACPP_CUDA_CHECK(cudaEventCreate(&e0));
    MAMBACPP_CUDA_CHECK(cudaEventCreate(&e1));
    float best_ms = 0;
    for (const auto& a : algos) {  // every equal candidate gives the same bits: the fastest runs
      if (!runnable(h.desc, h.a, b.h, c16.h, a, h.ws_bytes)) continue;
      matmul(a);
      MAMBACPP_CUDA_CHECK(cudaMemcpyAsync(got.data(), y16, y_bytes / 2, cudaMemcpyDeviceToHost, stream));
      MAMBACPP_CUDA_CHECK(cudaStreamSynchronize(stream));
      if (got != want) continue;
      constexpr int kTimedRuns = 5;
      MAMBACPP_CUDA_CHECK(cudaEventRecord(e0, stream));
      for (int i = 0; i < kTimedRuns; ++i) matmul(a);
      MAMBACPP_CUDA_CHECK(cudaEventRecord(e1, stream));
      MAMBACPP_CUDA_CHECK(cudaEventSynchronize(e1));
      float ms = 0;
      MAMBACPP_CUDA_CHECK(cudaEventElapsedTime(&ms, e0, e1));
      if (!chosen->found || ms < best_ms) {
        chosen->found = true;
        chosen->algo = a;
        best_ms = ms;
      }
    }
    cudaEventDestroy(e1);
    cudaEventDestroy(e0);
  } else {
    cudaGetLastError();  // a failed allocation: no bf16 plan for the shape
  }
  if (!chosen->found) ++prefill_bf16_rejected_;
  bf16_chosen_.push_back(std::move(chosen));
  return bf16_chosen_.back()->found ? &bf16_chosen_.back()->algo : nullptr;
}

const LtMatmul::Plan* LtMatmul::plan_bf16(cudaStream_t stream, void* workspace, const Plan& f, int align_y) {
  for (auto& p : plans_bf16_)
    if (p->ab == f.ab && p->out == f.out && p->T == f.T && p->in == f.in && p->ldy == f.ldy &&
        p->align_w == f.align_w && p->align_x == f.align_x && p->align_y == align_y && p->ws_bytes == f.ws_bytes)
      return p->usable ? p.get() : nullptr;
  auto p = std::make_unique<Plan>();
  p->ab = f.ab;
  p->out = f.out;
  p->T = f.T;
  p->in = f.in;
  p->ldy = f.ldy;
  p->align_w = f.align_w;
  p->align_x = f.align_x;
  p->align_y = align_y;
  p->ws_bytes = f.ws_bytes;
  p->pin = Pin::Prefill;
  p->y_type = CUDA_R_16BF;
  describe(*p);
  const cublasLtMatmulAlgo_t* a = capturing(stream) ? nullptr : prefill_bf16(stream, workspace, f, *p);
  p->usable = a && runnable(p->desc, p->a, p->b, p->c, *a, p->ws_bytes);
  if (a) p->algo = *a;
  if (plans_bf16_.size() >= kMaxPlans) plans_bf16_.erase(plans_bf16_.begin());
  plans_bf16_.push_back(std::move(p));
  return plans_bf16_.back()->usable ? plans_bf16_.back().get() : nullptr;
}

bool LtMatmul::run_prefill_bf16(cudaStream_t stream, void* workspace, size_t ws_bytes, cudaDataType_t ab,
                                const void* w, const void* x, uint16_t* y, int out, int T, int in, int64_t ldy) {
  init();
  // The f32 plan these rows take in a batch that mixes them with others (rows ldy apart in f32): its algorithm, with a
  // bf16 output, where that rounds its results.
  const Plan& f = plan(stream, workspace, ab, out, T, in, ldy, alignment(w, int64_t(in) * 2),
                       alignment(x, int64_t(in) * 2), alignment(y, ldy * 4), ws_bytes, Pin::Prefill);
  if (!f.pinned || f.block_rows) return false;
  const Plan* p = plan_bf16(stream, workspace, f, alignment(y, ldy * 2));
  if (!p) return false;
  const float alpha = 1.0f, beta = 0.0f;
  MAMBACPP_CUBLAS_CHECK(cublasLtMatmul(handle_, p->desc, &alpha, w, p->a, x, p->b, &beta, y, p->c, y, p->c, &p->algo,
                                       workspace, ws_bytes, stream));
  return true;
}

}  // namespace mambacpp::cuda
