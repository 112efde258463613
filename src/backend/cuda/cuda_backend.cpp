// The CUDA backend: owns the device copies of the weights, one stream, a cuBLAS handle (both created on first use)
// and the scratch buffers the kernels need; checks each op's shapes, then calls the launchers of cuda_ops.h.
// All work is enqueued on the one stream, so its order is the program order; copy_to_host and synchronize wait.
//
// Dtypes: activations f32; state f32 or bf16 (computed in f32); weights as adopt_weight made them (2-D matrices in
// the backend's weight dtype, vectors and conv kernels in f32: they are a negligible share of the bytes and feed
// exponentials, softplus and normalisations where 16-bit rounding would show).
#include <cublas_v2.h>
#include <cuda_profiler_api.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/cuda_ops.h"
#include "backend/cuda/fused_ops.h"
#include "backend/cuda/gemm_lt.h"
#include "mambacpp/error.h"

namespace mambacpp {
namespace cuda {

void throw_cuda_error(cudaError_t err, const char* what, const char* file, int line) {
  fail("CUDA error: ", cudaGetErrorName(err), " (", cudaGetErrorString(err), ") in ", what, " at ", file, ":", line);
}

void throw_cublas_error(int status, const char* what, const char* file, int line) {
  fail("cuBLAS error: ", cublasGetStatusString(static_cast<cublasStatus_t>(status)), " (", status, ") in ", what,
       " at ", file, ":", line);
}

// True when this binary's kernels can run on the current device (defined in elementwise.cu).
bool kernels_loadable();

}  // namespace cuda

namespace {

using namespace cuda;

// A device buffer that only grows; reused across calls.
struct Scratch {
  void* ptr = nullptr;
  size_t cap = 0;
};

bool is_float_dtype(DType t) { return t == DType::F32 || t == DType::F16 || t == DType::BF16; }

class CudaBackend final : public Backend {
 public:
  CudaBackend(int device, DType weight_dtype, Precision precision, bool batch_invariant)
      : device_(device),
        weight_dtype_(weight_dtype),
        fast_(precision == Precision::Fast),
        batch_invariant_(batch_invariant) {
    cudaDeviceProp prop{};
    MAMBACPP_CUDA_CHECK(cudaGetDeviceProperties(&prop, device_));
    sm_count_ = prop.multiProcessorCount;
    // Opt-in (docs/benchmarks.md, v12): MAMBACPP_DECODE_GEMM=fused runs fast precision's decode linears on
    // fused_gemv_fast.cu at every batch size (batch-invariant, faster at 1-8 rows, slower from 32) instead of
    // norm-and-round -> pinned cuBLASLt GEMM -> conv step.
    if (const char* env = std::getenv("MAMBACPP_DECODE_GEMM")) decode_gemm_fused_ = std::string(env) == "fused";
    if (decode_gemm_fused_) init_fast_gemv();
    // Fast precision's SSD chunk output runs as a block per (chunk, head) for chunks of up to 256 tokens (docs/
    // benchmarks.md, q19: +4% at 16k). MAMBACPP_SSD_OUTPUT=tile keeps the block per 64-row output tile (the same
    // bits; the tests compare the two, and longer chunks always take it).
    if (const char* env = std::getenv("MAMBACPP_SSD_OUTPUT")) ssd_output_by_chunk_ = std::string(env) != "tile";
    // Mamba-1 prompts of kMamba1ChunkedMinLen tokens and more run the scan over pieces (mamba1_chunked_scan.cu; q19:
    // 3.3x at mamba-2.8b 4k). MAMBACPP_MAMBA1_SCAN=sequential keeps every sequence on the sequential kernel.
    if (const char* env = std::getenv("MAMBACPP_MAMBA1_SCAN")) mamba1_chunked_ = std::string(env) != "sequential";
    // Fast precision holds Mamba-2's in_proj output [z | xBC | dt] at bf16 precision on prompt rows, written in bf16
    // where a batch is all prompts (Mamba2Plan::proj_dtype). MAMBACPP_PROJ_OUT=f32 keeps every row in f32, unrounded.
    if (const char* env = std::getenv("MAMBACPP_PROJ_OUT")) prompt_proj_bf16_ = std::string(env) != "f32";
    // mamba2_conv_ssd fuses conv1d into the fast SSD where it can. MAMBACPP_CONV_SSD=split runs its other path (f32
    // conv output, then the SSD's rounding): the same bits, which the tests compare.
    if (const char* env = std::getenv("MAMBACPP_CONV_SSD")) conv_ssd_fused_ = std::string(env) != "split";
    // scripts/gpu_prefill_profile.sh: MAMBACPP_PROFILE_AFTER_SSD=N opens the profiler's window (ncu
    // --profile-from-start off) at the N-th multi-token SSD or Mamba-1 scan call, past the load and the first
    // layer's plan probes.
    if (const char* env = std::getenv("MAMBACPP_PROFILE_AFTER_SSD")) profile_after_ssd_ = std::atoll(env);
    description_ = std::string(prop.name) + " (sm_" + std::to_string(prop.major) + std::to_string(prop.minor) +
                   ", weights " + dtype_name(weight_dtype_) + (fast_ ? "" : ", exact products") +
                   (fast_ && decode_gemm_fused_ ? ", fused decode linears" : "") +
                   (fast_ && !ssd_output_by_chunk_ ? ", SSD output by tile" : "") +
                   (!mamba1_chunked_ ? ", sequential Mamba-1 scan" : "") +
                   (fast_ && !prompt_proj_bf16_ ? ", f32 in_proj output" : "") +
                   (fast_ && !conv_ssd_fused_ ? ", conv1d and SSD split" : "") + ")";
  }

  ~CudaBackend() override {
    // No throwing here: errors at teardown are ignored (the process may be exiting after a device fault).
    if (stream_) cudaStreamSynchronize(stream_);
    for (void* p : owned_) cudaFree(p);
    for (void* p : retired_) cudaFree(p);
    for (Scratch* s : {&batch_, &chunk_table_, &ssd_dt_, &ssd_cum_, &ssd_states_, &ssd_fast_, &split_, &proj32_,
                       &m1_pieces_, &m1_dt_, &fast_x16_, &rows_, &select_in_, &select_out_, &attn_meta_,
                       &attn_partial_, &rope_meta_})
      if (s->ptr) cudaFree(s->ptr);
    if (pinned_) cudaFreeHost(pinned_);
    if (cublas_) cublasDestroy(cublas_);
    if (cublas_workspace_) cudaFree(cublas_workspace_);
    if (stream_) cudaStreamDestroy(stream_);
    cudaGetLastError();
  }

  Device device() const override { return Device::CUDA; }
  std::string description() const override { return description_; }

  // ---- Memory -----------------------------------------------------------------------------------------------------
  void* allocate(size_t bytes) override {
    void* p = nullptr;
    if (bytes == 0) return nullptr;
    MAMBACPP_CUDA_CHECK(cudaMalloc(&p, bytes));
    return p;
  }
  void deallocate(void* p) override {
    if (p) MAMBACPP_CUDA_CHECK(cudaFree(p));
  }
  // Host memory here is pageable: cudaMemcpyAsync stages it before returning, so the caller may reuse it at once,
  // and the copy still runs in stream order (after every kernel enqueued before it).
  void copy_from_host(void* dst, const void* host_src, size_t bytes) override {
    if (bytes) MAMBACPP_CUDA_CHECK(cudaMemcpyAsync(dst, host_src, bytes, cudaMemcpyHostToDevice, stream()));
  }
  void copy_to_host(void* host_dst, const void* src, size_t bytes) override {
    if (!bytes) return;
    MAMBACPP_CUDA_CHECK(cudaMemcpyAsync(host_dst, src, bytes, cudaMemcpyDeviceToHost, stream()));
    MAMBACPP_CUDA_CHECK(cudaStreamSynchronize(stream()));
  }
  void copy(void* dst, const void* src, size_t bytes) override {
    if (bytes) MAMBACPP_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream()));
  }
  void fill_zero(void* dst, size_t bytes) override {
    if (bytes) MAMBACPP_CUDA_CHECK(cudaMemsetAsync(dst, 0, bytes, stream()));
  }
  void synchronize() override { MAMBACPP_CUDA_CHECK(cudaStreamSynchronize(stream())); }

  TensorView adopt_weight(const TensorView& host) override {
    if (host.device != Device::CPU) fail("adopt_weight: expected a host tensor, found one on ", device_name(host.device));
    if (!host.contiguous()) fail("adopt_weight: expected a contiguous tensor, found row stride ", host.row_stride);
    if (!is_float_dtype(host.dtype) && host.dtype != DType::F64)
      fail("adopt_weight: expected an f32/f16/bf16/f64 weight, found ", dtype_name(host.dtype));
    const DType target = host.ndim == 2 ? weight_dtype_ : DType::F32;
    const int64_t n = host.numel();
    TensorView dev = host;
    dev.device = Device::CUDA;
    dev.dtype = target;
    dev.row_stride = 0;
    dev.data = allocate(static_cast<size_t>(n) * dtype_size(target));
    owned_.push_back(dev.data);
    if (n == 0) return dev;

    // f64 (rare) is narrowed on the host first; then the raw bytes go up in pieces through a staging buffer and
    // are converted there. Stream order makes reusing the staging buffer for the next piece safe.
    std::vector<float> narrowed;
    const void* src = host.data;
    DType from = host.dtype;
    if (from == DType::F64) {
      narrowed.resize(static_cast<size_t>(n));
      convert_to_f32(host.data, DType::F64, narrowed.data(), n);
      src = narrowed.data();
      from = DType::F32;
    }
    if (from == target) {
      copy_from_host(dev.data, src, static_cast<size_t>(n) * dtype_size(target));
    } else {
      constexpr int64_t kPiece = int64_t(1) << 24;  // elements per piece (64 MiB of f32)
      const int64_t piece = std::min(n, kPiece);
      void* staging = nullptr;
      MAMBACPP_CUDA_CHECK(cudaMalloc(&staging, static_cast<size_t>(piece) * dtype_size(from)));
      for (int64_t i = 0; i < n; i += piece) {
        const int64_t m = std::min(piece, n - i);
        copy_from_host(staging, static_cast<const char*>(src) + static_cast<size_t>(i) * dtype_size(from),
                       static_cast<size_t>(m) * dtype_size(from));
        launch_convert(staging, from, static_cast<char*>(dev.data) + static_cast<size_t>(i) * dtype_size(target),
                       target, m, stream());
      }
      MAMBACPP_CUDA_CHECK(cudaStreamSynchronize(stream()));
      MAMBACPP_CUDA_CHECK(cudaFree(staging));
    }
    if (!narrowed.empty()) MAMBACPP_CUDA_CHECK(cudaStreamSynchronize(stream()));
    return dev;
  }

  // Uploads the spans, followed by a per-token map (sequence index of each packed row, -1 for rows in no sequence)
  // that lets conv1d run one thread per (token, channel).
  // ---- CUDA graphs: the model captures a decode step once and replays it -------------------------------------
  struct CudaGraph final : Graph {
    cudaGraphExec_t exec = nullptr;
    ~CudaGraph() override {
      if (exec) cudaGraphExecDestroy(exec);
    }
  };
  bool supports_graphs() const override { return true; }
  void begin_capture() override {
    cublas();  // handles and workspaces exist before capture: nothing is created or allocated inside it
    captured_ = true;
    MAMBACPP_CUDA_CHECK(cudaStreamBeginCapture(stream(), cudaStreamCaptureModeThreadLocal));
  }
  std::unique_ptr<Graph> end_capture() override {
    cudaGraph_t graph = nullptr;
    MAMBACPP_CUDA_CHECK(cudaStreamEndCapture(stream(), &graph));
    auto g = std::make_unique<CudaGraph>();
    const cudaError_t err = cudaGraphInstantiate(&g->exec, graph, 0);
    cudaGraphDestroy(graph);
    MAMBACPP_CUDA_CHECK(err);
    return g;
  }
  void abort_capture() override {
    cudaGraph_t graph = nullptr;
    if (stream_ && cudaStreamEndCapture(stream_, &graph) == cudaSuccess && graph) cudaGraphDestroy(graph);
    cudaGetLastError();
  }
  void replay(Graph& graph) override {
    MAMBACPP_CUDA_CHECK(cudaGraphLaunch(static_cast<CudaGraph&>(graph).exec, stream()));
  }

  void prepare_batch(BatchLayout& layout) override {
    const int64_t n = static_cast<int64_t>(layout.seqs.size());
    int64_t n_tokens = 0;
    for (const SeqSpan& s : layout.seqs) {
      if (s.start < 0 || s.len < 0 || s.slot < 0)
        fail("prepare_batch: expected non-negative start/len/slot, found start ", s.start, " len ", s.len, " slot ",
             s.slot);
      n_tokens = std::max(n_tokens, s.start + s.len);
    }
    if (n > INT32_MAX) fail("prepare_batch: at most 2^31-1 sequences per batch, found ", n);
    const size_t seq_bytes = align(static_cast<size_t>(n) * sizeof(SeqSpan));
    std::vector<unsigned char> host(seq_bytes + static_cast<size_t>(n_tokens) * sizeof(int32_t));
    if (n) std::memcpy(host.data(), layout.seqs.data(), static_cast<size_t>(n) * sizeof(SeqSpan));
    auto* map = reinterpret_cast<int32_t*>(host.data() + seq_bytes);
    std::fill(map, map + n_tokens, -1);
    for (int64_t s = 0; s < n; ++s) {
      const SeqSpan& sp = layout.seqs[static_cast<size_t>(s)];
      std::fill(map + sp.start, map + sp.start + sp.len, static_cast<int32_t>(s));
    }
    // Decode steps prepare the same layout over and over: the upload (and the new generation, which makes
    // mamba2_ssd rebuild its chunk table) is skipped when the device already holds exactly these bytes.
    if (host == uploaded_batch_ && n == n_prepared_seqs_ && batch_.ptr) {
      layout.device_seqs = batch_.ptr;  // token_seq_ and n_mapped_tokens_ are those of the same bytes
      return;
    }
    void* buf = grow(batch_, std::max<size_t>(host.size(), 1));
    copy_from_host(buf, host.data(), host.size());
    uploaded_batch_ = std::move(host);
    layout.device_seqs = buf;
    token_seq_ = reinterpret_cast<const int32_t*>(static_cast<char*>(buf) + seq_bytes);
    n_mapped_tokens_ = n_tokens;
    n_prepared_seqs_ = n;
    ++batch_generation_;
  }

  // ---- Ops --------------------------------------------------------------------------------------------------------
  void embed(const Weight& table_weight, const TensorView& ids, TensorView out) override {
    const TensorView& table = table_weight.dense_view("embed");
    check_f32_2d(out, "embed: out");
    need(table.ndim == 2 && is_float_dtype(table.dtype), "embed: table must be a 2-D float tensor, found ",
         table.shape_string(), " ", dtype_name(table.dtype));
    need(ids.dtype == DType::I32 && ids.numel() == out.dim(0), "embed: ids must be i32 [", out.dim(0), "], found ",
         dtype_name(ids.dtype), " ", ids.shape_string());
    need(table.dim(1) == out.dim(1), "embed: table width ", table.dim(1), " != out width ", out.dim(1));
    launch_embed(weight(table), table.dim(1), ids.ptr<const int32_t>(), out.dim(0), rows(out), stream());
  }

  void to_f32(const TensorView& src, TensorView out) override {
    need(is_float_dtype(src.dtype), "to_f32: expected f32/f16/bf16 input, found ", dtype_name(src.dtype));
    need(out.dtype == DType::F32, "to_f32: out must be f32, found ", dtype_name(out.dtype));
    need(src.numel() == out.numel() && src.ndim >= 1 && out.ndim >= 1 && src.dim(0) == out.dim(0),
         "to_f32: shapes differ: ", src.shape_string(), " vs ", out.shape_string());
    launch_to_f32(src.data, src.dtype, src.stride0(), src.dim(0), src.row_size(), F32Rows{out.ptr<float>(),
                  out.stride0()}, stream());
  }

  void rmsnorm(const TensorView& x, const TensorView& w, float eps, TensorView out) override {
    check_f32_2d(x, "rmsnorm: x");
    check_f32_2d(out, "rmsnorm: out");
    need(same_2d(x, out), "rmsnorm: x ", x.shape_string(), " vs out ", out.shape_string());
    need(w.numel() == x.dim(1), "rmsnorm: w has ", w.numel(), " elements, expected ", x.dim(1));
    launch_rmsnorm(crows(x), weight(w), eps, rows(out), x.dim(0), x.dim(1), stream());
  }

  void add_inplace(TensorView acc, const TensorView& x) override {
    check_f32_2d(acc, "add_inplace: acc");
    check_f32_2d(x, "add_inplace: x");
    need(same_2d(acc, x), "add_inplace: acc ", acc.shape_string(), " vs x ", x.shape_string());
    launch_add_inplace(rows(acc), crows(x), acc.dim(0), acc.dim(1), stream());
  }

  // T <= kGemvMaxRows: the GEMV kernel (exact products of the stored weights, f32 sums).
  // Larger T, f32 weights: cublasGemmEx in plain f32 (CUBLAS_COMPUTE_32F with the default math mode: no TF32), so
  // results match an f32 reference to ~1e-6 relative.
  // Larger T, bf16/f16 weights: the tensor cores need both operands in the weight's dtype. Rounding x to bf16 would
  // cost 2^-9 relative per activation (~1e-3 on every projection, compounding over layers, and making prefill
  // differ from the f32-activation GEMV decode). Instead x = hi + lo (+ r, |r| <= 2^-17 |x| for bf16, 2^-22 for f16)
  // with hi = round(x), lo = round(x - hi), and y = W.hi + W.lo: two GEMMs (cuBLASLt, gemm_lt.h; the second
  // accumulates with beta = 1) with f32 accumulation whose products are
  // exact, so the op is as accurate as an f32 GEMM over the stored weights (~1e-5 relative) at twice the tensor-core
  // work, still far cheaper than an f32 GEMM. What remains between bf16-weight logits and the fp32 CPU path is the
  // rounding of the weights themselves (2^-9 relative each), which stays within ~1e-2 of the logits' range.
  // f16 caveat: |x| > 65504 would overflow hi; projection inputs are normalised or gated activations, far below it.
  void linear(const TensorView& x, const Weight& weight_in, const TensorView& bias, TensorView y) override {
    const TensorView& w = weight_in.dense_view("linear");
    check_f32_2d(x, "linear: x");
    check_f32_2d(y, "linear: y");
    need(w.ndim == 2 && is_float_dtype(w.dtype) && w.contiguous(), "linear: w must be a contiguous 2-D float "
         "tensor, found ", w.shape_string(), " ", dtype_name(w.dtype));
    const int64_t T = x.dim(0), in = x.dim(1), out = w.dim(0);
    need(w.dim(1) == in, "linear: w ", w.shape_string(), " does not take x ", x.shape_string());
    need(y.dim(0) == T && y.dim(1) == out, "linear: y ", y.shape_string(), ", expected [", T, ", ", out, "]");
    need(bias.empty() || bias.numel() == out, "linear: bias has ", bias.numel(), " elements, expected ", out);
    if (T == 0 || out == 0) return;
    const DevWeight b = bias.empty() ? DevWeight{} : weight(bias);
    if (fast_ && w.dtype != DType::F32 && in > 0) {
      linear_fast(x, w, b, y);
      return;
    }
    if (in == 0 || T <= kGemvMaxRows) {
      launch_gemv(crows(x), weight(w), b, rows(y), T, in, out, stream());
      return;
    }
    need(T <= INT_MAX && in <= INT_MAX && out <= INT_MAX && x.stride0() <= INT_MAX && y.stride0() <= INT_MAX,
         "linear: dimensions beyond cuBLAS's 32-bit limits: x ", x.shape_string(), ", w ", w.shape_string());
    const int m = static_cast<int>(out), n = static_cast<int>(T), k = static_cast<int>(in);
    const float one = 1.0f, zero = 0.0f;
    if (b.data) launch_broadcast_bias(b, rows(y), T, out, stream());
    const float* beta0 = b.data ? &one : &zero;
    // Column-major view: y^T [out, T] = w [in, out]^T . x^T [in, T].
    if (w.dtype == DType::F32) {
      MAMBACPP_CUBLAS_CHECK(cublasGemmEx(cublas(), CUBLAS_OP_T, CUBLAS_OP_N, m, n, k, &one, w.data, CUDA_R_32F, k,
                                         x.data, CUDA_R_32F, static_cast<int>(x.stride0()), beta0, y.data, CUDA_R_32F,
                                         static_cast<int>(y.stride0()), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
      return;
    }
    const size_t half_bytes = static_cast<size_t>(T * in) * 2;
    char* hi = static_cast<char*>(grow(split_, 2 * half_bytes));
    char* lo = hi + half_bytes;
    launch_split_hi_lo(crows(x), T, in, w.dtype, hi, lo, stream());
    // Two cuBLASLt matmuls (gemm_lt.h), the second accumulating onto the first (dropping it, i.e. rounding the
    // activations to 16 bits, was measured in docs/benchmarks.md: 17% faster prefill, 1e-3 worse logits).
    const cudaDataType_t ab = w.dtype == DType::BF16 ? CUDA_R_16BF : CUDA_R_16F;
    cublas();  // the shared workspace exists
    lt_.run(stream(), cublas_workspace_, kCublasWorkspaceBytes, ab, w.data, hi, y.ptr<float>(), m, n, k, y.stride0(),
            *beta0);
    lt_.run(stream(), cublas_workspace_, kCublasWorkspaceBytes, ab, w.data, lo, y.ptr<float>(), m, n, k,
              y.stride0(), 1.0f);
  }

  // Fast precision, 16-bit weights: x rounded once to the weight dtype (2^-9 relative for bf16, as mamba_ssm and
  // vLLM feed their GEMMs), one tensor-core GEMM with f32 accumulation, at every T (decode's single rows too), on the
  // pinned cuBLASLt plan (gemm_lt.h): a row's result is the same bits whatever the batch around it.
  // x16: where the rounded rows go (null: the linear op's own scratch).
  void linear_fast(const TensorView& x, const TensorView& w, const DevWeight& b, TensorView y, void* x16 = nullptr) {
    const int64_t T = x.dim(0), in = x.dim(1), out = w.dim(0);
    need(T <= INT_MAX && in <= INT_MAX && out <= INT_MAX && y.stride0() <= INT_MAX,
         "linear: dimensions beyond cuBLAS's 32-bit limits: x ", x.shape_string(), ", w ", w.shape_string());
    const size_t half_bytes = static_cast<size_t>(T * in) * 2;
    char* hi = static_cast<char*>(x16 ? x16 : grow(split_, half_bytes));
    launch_split_hi_lo(crows(x), T, in, w.dtype, hi, nullptr, stream());
    if (b.data) launch_broadcast_bias(b, rows(y), T, out, stream());
    cublas();  // the shared workspace exists
    const cudaDataType_t ab = w.dtype == DType::BF16 ? CUDA_R_16BF : CUDA_R_16F;
    lt_.run(stream(), cublas_workspace_, kCublasWorkspaceBytes, ab, w.data, hi, y.ptr<float>(), static_cast<int>(out),
            static_cast<int>(T), static_cast<int>(in), y.stride0(), b.data ? 1.0f : 0.0f, LtMatmul::Pin::Decode);
  }

  void conv1d_silu(const TensorView& x, const TensorView& w, const TensorView& bias, TensorView state,
                   const BatchLayout& batch, TensorView out) override {
    launch_conv1d_silu(conv_launch(x, w, bias, state, batch, out), stream());
  }
  Conv1dLaunch conv_launch(const TensorView& x, const TensorView& w, const TensorView& bias, TensorView state,
                           const BatchLayout& batch, TensorView out) {
    const bool x16 = x.dtype == DType::BF16;  // Mamba2Plan::proj_dtype
    if (x16)
      need(x.ndim == 2 && x.device == Device::CUDA, "conv1d: x must be a 2-D CUDA tensor, found ", x.shape_string());
    else
      check_f32_2d(x, "conv1d: x");
    check_f32_2d(out, "conv1d: out");
    need(same_2d(x, out), "conv1d: x ", x.shape_string(), " vs out ", out.shape_string());
    const int64_t C = x.dim(1);
    need(w.ndim >= 2 && w.dim(0) == C && w.numel() % C == 0, "conv1d: w ", w.shape_string(), " for ", C,
         " channels");
    const int64_t K = w.numel() / C;
    need(K >= 1, "conv1d: kernel width must be >= 1");
    need(bias.empty() || bias.numel() == C, "conv1d: bias has ", bias.numel(), " elements, expected ", C);
    check_state(state, "conv1d: state", {C, K - 1});
    const SeqSpan* seqs = device_seqs(batch, state.dim(0), x.dim(0), "conv1d");
    Conv1dLaunch p;
    if (x16) {
      p.x16 = x.ptr<uint16_t>();
      p.x.stride = x.stride0();
    } else {
      p.x = crows(x);
    }
    p.w = weight(w);
    p.bias = bias.empty() ? DevWeight{} : weight(bias);
    p.state = state.data;
    p.state_bf16 = state.dtype == DType::BF16;
    p.out = rows(out);
    p.T = std::min(x.dim(0), n_mapped_tokens_);
    p.C = C;
    p.K = K;
    p.seqs = seqs;
    p.token_seq = token_seq_;
    p.n_seqs = n_prepared_seqs_;
    p.all_single = !batch.seqs.empty() && one_token_each(batch);
    return p;
  }

  void mamba1_scan(const Mamba1ScanArgs& a, const BatchLayout& batch) override {
    for (const TensorView* v : {&a.x, &a.dt, &a.B, &a.C, &a.z, &a.y}) check_f32_2d(*v, "mamba1_scan: activation");
    const int64_t T = a.x.dim(0), DI = a.x.dim(1);
    need(a.A_log.ndim == 2 && a.A_log.dim(0) == DI, "mamba1_scan: A_log ", a.A_log.shape_string(), " for d_inner ",
         DI);
    const int64_t N = a.A_log.dim(1);
    const bool low_rank = !a.dt_proj.empty();
    if (low_rank)
      need(a.dt_proj.ndim == 2 && a.dt_proj.dim(0) == DI && a.dt_proj.contiguous() && a.dt.dim(0) == T &&
               a.dt.dim(1) == a.dt_proj.dim(1),
           "mamba1_scan: dt_proj ", a.dt_proj.shape_string(), " and low-rank dt ", a.dt.shape_string(),
           " must be [", DI, ", r] and [", T, ", r]");
    for (const TensorView* v : {&a.dt, &a.z, &a.y})
      if (v != &a.dt || !low_rank)
        need(v->dim(0) == T && v->dim(1) == DI, "mamba1_scan: expected [", T, ", ", DI, "], found ",
             v->shape_string());
    for (const TensorView* v : {&a.B, &a.C})
      need(v->dim(0) == T && v->dim(1) == N, "mamba1_scan: B/C expected [", T, ", ", N, "], found ",
           v->shape_string());
    need(a.D.numel() == DI && a.dt_bias.numel() == DI, "mamba1_scan: D/dt_bias must have ", DI, " elements");
    check_state(a.state, "mamba1_scan: state", {DI, N});
    Mamba1Launch p;
    p.x = crows(a.x);
    if (low_rank && fast_ && a.dt_proj.dtype != DType::F32 && (batch_invariant_ || T > kFusedMaxRows)) {
      // Fast precision: dt_proj as the pinned GEMM (the same at every T), not folded into the scan, where every
      // (sequence, channel) would re-read its dt_proj row: mamba-2.8b batch 128 took 25.4 ms/step folded.
      TensorView dt(decode_scratch(m1_dt_, T, DI, sizeof(float)), DType::F32, {T, DI}, Device::CUDA);
      linear_fast(a.dt, a.dt_proj, DevWeight{}, dt, decode_scratch(fast_x16_, T, a.dt.dim(1), 2));
      p.dt = crows(dt);
    } else if (low_rank) {
      p.dt_low = crows(a.dt);
      p.dt_proj = weight(a.dt_proj);
      p.dt_rank = a.dt_proj.dim(1);
    } else {
      p.dt = crows(a.dt);
    }
    p.B = crows(a.B);
    p.C = crows(a.C);
    p.z = crows(a.z);
    p.A_log = weight(a.A_log);
    p.D = weight(a.D);
    p.dt_bias = weight(a.dt_bias);
    p.state = a.state.data;
    p.state_bf16 = a.state.dtype == DType::BF16;
    p.y = rows(a.y);
    p.d_inner = DI;
    p.d_state = N;
    p.seqs = device_seqs(batch, a.state.dim(0), T, "mamba1_scan");
    p.n_seqs = n_prepared_seqs_;
    p.single_tokens = one_token_each(batch);
    if (!p.single_tokens && profile_after_ssd_ > 0 && --profile_after_ssd_ == 0)
      MAMBACPP_CUDA_CHECK(cudaProfilerStart());
    auto long_seq = [](const SeqSpan& s) { return s.len >= kMamba1ChunkedMinLen; };
    if (mamba1_chunked_ && N == kMamba1PieceStates && !p.dt_proj.data &&
        std::any_of(batch.seqs.begin(), batch.seqs.end(), long_seq)) {
      p.n_pieces = upload_chunk_table(batch, kMamba1Piece);
      p.pieces = static_cast<const SsdChunk*>(chunk_table_.ptr);
      p.seq_pieces = reinterpret_cast<const SsdSeqChunks*>(static_cast<const char*>(chunk_table_.ptr) +
                                                           chunk_seq_offset_);
      p.piece_states = static_cast<float*>(grow(m1_pieces_, static_cast<size_t>(p.n_pieces * DI * (N + 1)) * 4));
      p.piece_dt = p.piece_states + p.n_pieces * DI * N;
      p.has_short_seqs = !std::all_of(batch.seqs.begin(), batch.seqs.end(), long_seq);
      p.fast = fast_ && weight_dtype_ != DType::F32;  // as Mamba2Launch::fast
    }
    launch_mamba1_scan(p, stream());
  }

  // The checked launch of mamba2_ssd (nullopt: no sequences); fast and has_single_seqs set, the scratch not yet.
  std::optional<Mamba2Launch> mamba2_launch(const Mamba2ScanArgs& a, const BatchLayout& batch) {
    const int64_t H = a.n_heads, P = a.head_dim, G = a.n_groups, N = a.d_state;
    need(H > 0 && G > 0 && H % G == 0, "mamba2_ssd: n_heads ", H, " must be a positive multiple of n_groups ", G);
    need(P >= 0 && N >= 0 && a.chunk_size > 0, "mamba2_ssd: bad head_dim ", P, " / d_state ", N, " / chunk_size ",
         a.chunk_size);
    for (const TensorView* v : {&a.x, &a.B, &a.C}) check_f32_2d(*v, "mamba2_ssd: activation");
    const bool dt_bf16 = a.dt.dtype == DType::BF16;  // Mamba2Plan::proj_dtype
    if (!dt_bf16) check_f32_2d(a.dt, "mamba2_ssd: dt");
    const bool y_bf16 = a.y.dtype == DType::BF16;  // Mamba2Plan::y_dtype
    if (!y_bf16) check_f32_2d(a.y, "mamba2_ssd: y");
    const int64_t T = a.x.dim(0);
    need(a.x.dim(1) == H * P && a.y.dim(0) == T && a.y.dim(1) == H * P, "mamba2_ssd: x/y must be [", T, ", ",
         H * P, "], found ", a.x.shape_string(), " / ", a.y.shape_string());
    need(a.dt.dim(0) == T && a.dt.dim(1) == H, "mamba2_ssd: dt must be [", T, ", ", H, "], found ",
         a.dt.shape_string());
    for (const TensorView* v : {&a.B, &a.C})
      need(v->dim(0) == T && v->dim(1) == G * N, "mamba2_ssd: B/C must be [", T, ", ", G * N, "], found ",
           v->shape_string());
    need(a.A_log.numel() == H && a.D.numel() == H && a.dt_bias.numel() == H,
         "mamba2_ssd: A_log/D/dt_bias must have ", H, " elements");
    if (!a.z.empty()) {
      check_f32_2d(a.z, "mamba2_ssd: z");
      need(a.z.dim(0) == T && a.z.dim(1) == H * P, "mamba2_ssd: z must be [", T, ", ", H * P, "], found ",
           a.z.shape_string());
    }
    check_state(a.state, "mamba2_ssd: state", {H, P, N});
    Mamba2Launch p;
    p.x = crows(a.x);
    if (dt_bf16) {
      p.dt16 = a.dt.ptr<uint16_t>();
      p.dt.stride = a.dt.stride0();
    } else {
      p.dt = crows(a.dt);
    }
    p.B = crows(a.B);
    p.C = crows(a.C);
    p.A_log = weight(a.A_log);
    p.D = weight(a.D);
    p.dt_bias = weight(a.dt_bias);
    p.dt_min = a.dt_min;
    p.dt_max = a.dt_max;
    p.n_heads = H;
    p.head_dim = P;
    p.n_groups = G;
    p.d_state = N;
    p.chunk_size = a.chunk_size;
    p.state = a.state.data;
    p.state_bf16 = a.state.dtype == DType::BF16;
    if (y_bf16) {
      p.y16 = a.y.ptr<uint16_t>();
      p.y.stride = a.y.stride0();
    } else {
      p.y = rows(a.y);
    }
    if (!a.z.empty()) p.z = crows(a.z);
    p.T = T;
    p.seqs = device_seqs(batch, a.state.dim(0), T, "mamba2_ssd");
    p.n_seqs = n_prepared_seqs_;
    if (p.n_seqs == 0) return std::nullopt;
    p.fast = fast_ && weight_dtype_ != DType::F32;  // fast precision covers 16-bit weights only
    p.output_by_chunk = ssd_output_by_chunk_;
    p.has_single_seqs = std::any_of(batch.seqs.begin(), batch.seqs.end(), [](const SeqSpan& s) { return s.len == 1; });
    if (y_bf16)
      need(a.y.ndim == 2 && a.y.device == Device::CUDA && a.z.empty() && p.fast && !p.has_single_seqs &&
               ssd_fast_path(p),
           "mamba2_ssd: y in bf16 is for fast precision's prompts (Mamba2Plan::y_dtype), found ", a.y.shape_string(),
           a.z.empty() ? "" : " with a gate", p.has_single_seqs ? " in a batch with one-token sequences" : "");
    if (dt_bf16)
      need(a.dt.ndim == 2 && a.dt.device == Device::CUDA && p.fast && !p.has_single_seqs && ssd_fast_path(p),
           "mamba2_ssd: dt in bf16 is for fast precision's prompts (Mamba2Plan::proj_dtype), found ", a.dt.shape_string(),
           p.has_single_seqs ? " in a batch with one-token sequences" : "");
    return p;
  }

  // y: bf16 where the fast chunked kernels write every row of it (no one-token sequences: those take the step
  // kernel), which round it to bf16 in either dtype. proj: bf16 where, besides, the batch is all prompts on the
  // prefill GEMM plan (LtMatmul::kPrefillMinRows tokens and more) and conv1d runs on the window kernel; fast precision
  // rounds prompt rows of an f32 proj alike (docs/benchmarks.md, decisions).
  Mamba2Plan plan_mamba2(const Mamba2Shape& shape, const BatchLayout& batch) const override {
    Mamba2Plan plan;
    Mamba2Launch p;
    p.fast = fast_ && weight_dtype_ != DType::F32;
    p.head_dim = shape.head_dim;
    p.d_state = shape.d_state;
    p.chunk_size = shape.chunk_size;
    const bool prompts_only = !batch.seqs.empty() && std::none_of(batch.seqs.begin(), batch.seqs.end(),
                                                                   [](const SeqSpan& s) { return s.len == 1; });
    if (prompts_only && ssd_fast_path(p)) plan.y_dtype = DType::BF16;
    if (shape.in_proj_bias || !prompt_proj_bf16_) return plan;  // the bf16 output plans add no bias
    plan.round_proj_prompt_rows = true;
    const bool long_prompts = std::all_of(batch.seqs.begin(), batch.seqs.end(),
                                          [](const SeqSpan& s) { return s.len >= LtMatmul::kPrefillMinRows; });
    Conv1dLaunch c;
    c.K = shape.conv_kernel;
    c.T = batch.total_tokens;
    if (plan.y_dtype == DType::BF16 && long_prompts && conv1d_bf16_outputs_supported(c)) plan.proj_dtype = DType::BF16;
    return plan;
  }

  void mamba2_ssd(const Mamba2ScanArgs& a, const BatchLayout& batch) override {
    if (std::optional<Mamba2Launch> p = mamba2_launch(a, batch)) run_mamba2(*p, batch, nullptr);
  }

  // Fast precision's multi-token batches: conv1d writes the SSD's bf16 x, B and C itself (Conv1dLaunch::out16), so
  // the f32 conv output and the rounding pass are gone (~25 us of a 2,048-token mamba2-2.7b layer-piece). Batches
  // with single tokens keep the two steps: those rows take the step kernel, which reads the f32 rows.
  void mamba2_conv_ssd(const TensorView& xbc, const TensorView& conv_w, const TensorView& conv_bias,
                       TensorView conv_state, TensorView conv_out, const Mamba2ScanArgs& ssd,
                       const BatchLayout& batch) override {
    Conv1dLaunch c = conv_launch(xbc, conv_w, conv_bias, conv_state, batch, conv_out);
    std::optional<Mamba2Launch> p = mamba2_launch(ssd, batch);
    const int64_t HP = ssd.n_heads * ssd.head_dim, GN = ssd.n_groups * ssd.d_state;
    const bool x_B_C_of_conv = ssd.x.data == conv_out.data && ssd.B.data == conv_out.ptr<float>() + HP &&
                               ssd.C.data == conv_out.ptr<float>() + HP + GN && c.C == HP + 2 * GN;
    // The fast SSD rounds x, B and C to bf16 whether conv1d writes them so or not: the same silu either way.
    c.fast_silu = p && ssd_fast_path(*p) && x_B_C_of_conv;
    const bool fuse = conv_ssd_fused_ && p && p->fast && !p->has_single_seqs && ssd_fast_path(*p) &&
                      x_B_C_of_conv && conv1d_bf16_outputs_supported(c);
    if (!fuse) {
      launch_conv1d_silu(c, stream());
      if (p) run_mamba2(*p, batch, nullptr);
      return;
    }
    p->inputs_bf16 = true;
    p->x = p->B = p->C = ConstF32Rows{};
    c.split[0] = HP;
    c.split[1] = HP + GN;
    run_mamba2(*p, batch, &c);
  }

  // The step kernel, or the chunked path; `conv` (set: the fused conv1d) is launched once the scratch it writes
  // into exists.
  void run_mamba2(Mamba2Launch& p, const BatchLayout& batch, Conv1dLaunch* conv) {
    const int64_t T = p.T, H = p.n_heads, P = p.head_dim, G = p.n_groups, N = p.d_state;
    const bool all_single = one_token_each(batch);
    if (all_single) {
      need(p.n_seqs <= INT_MAX && H <= 65535, "mamba2_ssd: too many sequences/heads for one launch");
      launch_mamba2_step(p, stream());
      return;
    }
    if (profile_after_ssd_ > 0 && --profile_after_ssd_ == 0) MAMBACPP_CUDA_CHECK(cudaProfilerStart());
    const int64_t n_chunks = upload_chunk_table(batch, p.chunk_size);
    need(n_chunks <= INT_MAX && H <= 65535, "mamba2_ssd: too many chunks/heads for one launch");
    SsdScratch sc;
    sc.chunk_states = static_cast<float*>(
        grow(ssd_states_, static_cast<size_t>(std::max<int64_t>(n_chunks * H * P * N, 1)) * sizeof(float)));
    if (!ssd_fast_path(p)) {  // dt and the f64 cumulative sums (the fast kernels keep theirs in cum2 and w2)
      sc.dt = static_cast<float*>(grow(ssd_dt_, static_cast<size_t>(std::max<int64_t>(T * H, 1)) * sizeof(float)));
      sc.cum =
          static_cast<double*>(grow(ssd_cum_, static_cast<size_t>(std::max<int64_t>(T * H, 1)) * sizeof(double)));
    } else {  // bf16 copies of x, B, C and of the entering states, the scores, the f32 decays (mamba2_ssd_fast.cu)
      auto part = [](int64_t elems) { return align(static_cast<size_t>(std::max<int64_t>(elems, 1)) * 2); };
      const size_t bx = part(T * H * P), bg = part(T * G * N), bs = part(n_chunks * H * P * N);
      const size_t bscores = align(static_cast<size_t>(std::max<int64_t>(n_score_tiles_ * G, 1)) * kSsdFastTile *
                                   kSsdFastTile * sizeof(float));
      const size_t bdecay = align(static_cast<size_t>(std::max<int64_t>(T * H, 1)) * sizeof(float));
      char* base = static_cast<char*>(grow(ssd_fast_, bx + 2 * bg + bs + bscores + 2 * bdecay));
      sc.x16 = reinterpret_cast<uint16_t*>(base);
      sc.B16 = reinterpret_cast<uint16_t*>(base + bx);
      sc.C16 = reinterpret_cast<uint16_t*>(base + bx + bg);
      sc.states16 = reinterpret_cast<uint16_t*>(base + bx + 2 * bg);
      sc.scores = reinterpret_cast<float*>(base + bx + 2 * bg + bs);
      sc.cum2 = reinterpret_cast<float*>(base + bx + 2 * bg + bs + bscores);
      sc.w2 = reinterpret_cast<float*>(base + bx + 2 * bg + bs + bscores + bdecay);
    }
    const auto* chunks = static_cast<const SsdChunk*>(chunk_table_.ptr);
    const auto* seq_chunks = reinterpret_cast<const SsdSeqChunks*>(static_cast<const char*>(chunk_table_.ptr) +
                                                                   chunk_seq_offset_);
    if (conv) {
      conv->out16[0] = sc.x16;
      conv->out16[1] = sc.B16;
      conv->out16[2] = sc.C16;
      launch_conv1d_silu(*conv, stream());
    }
    launch_mamba2_chunked(p, chunks, n_chunks, seq_chunks, sc, stream());
    if (p.z.data) launch_silu_gate(p.y, p.z, T, H * P, stream());  // the step kernel gates inside, this path after
  }

  void gated_rmsnorm(const TensorView& y, const TensorView& z, const TensorView& w, int64_t group_size, float eps,
                     TensorView out) override {
    check_f32_2d(y, "gated_rmsnorm: y");
    check_f32_2d(z, "gated_rmsnorm: z");
    check_f32_2d(out, "gated_rmsnorm: out");
    need(same_2d(y, z) && same_2d(y, out), "gated_rmsnorm: y ", y.shape_string(), ", z ", z.shape_string(),
         ", out ", out.shape_string());
    const int64_t D = y.dim(1);
    need(group_size > 0 && D % group_size == 0, "gated_rmsnorm: group_size ", group_size, " must divide ", D);
    need(w.numel() == D, "gated_rmsnorm: w has ", w.numel(), " elements, expected ", D);
    launch_gated_rmsnorm(crows(y), crows(z), weight(w), group_size, eps, rows(out), y.dim(0), D, stream());
  }

  // Fused decode (fused_linear.cpp): batches of up to kFusedMaxRows sequences, sequence i in row i.
  // Fast precision with 16-bit weights: every decode batch size on the same kernels (fused_ops.h, kFastMaxRows);
  // never the fused GEMVs, whose products differ from the GEMM's.
  // Without a conv epilogue the fast path is row by row and takes prefill pieces too (the prefill recipe's norms and
  // residual add folded into the GEMMs).
  bool supports_fused_linear(const FusedLinearArgs& a, const BatchLayout& batch) const override {
    if (!a.w.dense()) return false;
    if (fast_fused(a, batch)) return fast_rows(a, batch) && fast_fused_supported(a, batch.total_tokens);
    return decode_rows(batch, kFusedMaxRows) && fused_gemv_launch(a, batch.total_tokens).has_value();
  }
  bool fast_rows(const FusedLinearArgs& a, const BatchLayout& batch) const {
    return a.conv_w.empty() ? batch.total_tokens >= 1 : decode_rows(batch, kFastMaxRows);
  }
  // Whether fused_linear takes the fast kernels: fast precision, 16-bit weights, and (unless batch invariance is
  // required) more rows than the fused GEMVs take.
  bool fast_fused(const FusedLinearArgs& a, const BatchLayout& batch) const {
    if (!fast_ || a.w.data.dtype == DType::F32) return false;
    return batch_invariant_ || !decode_rows(batch, kFusedMaxRows) || !fused_gemv_launch(a, batch.total_tokens);
  }

  void fused_linear(const FusedLinearArgs& a, const BatchLayout& batch) override {
    const int64_t B = batch.total_tokens;
    if (fast_fused(a, batch)) {
      need(fast_rows(a, batch) && fast_fused_supported(a, B),
           "fused_linear: these arguments have no fast kernels (ask supports_fused_linear first)");
      fused_linear_fast(a, batch);
      return;
    }
    need(decode_rows(batch, kFusedMaxRows), "fused_linear: needs a decode batch of 1..", kFusedMaxRows,
         " one-token sequences in row order");
    std::optional<FusedGemvLaunch> p = fused_gemv_launch(a, B);
    need(p.has_value(), "fused_linear: these arguments have no fused kernel (ask supports_fused_linear first)");
    if (p->conv_channels > 0) p->seqs = device_seqs(batch, a.conv_state.dim(0), B, "fused_linear");
    launch_fused_gemv(*p, sm_count_, stream());
  }

  // Rows of x normed (norm_w set) and rounded to the weight dtype by one kernel, the pinned GEMM into y (added to it
  // when accumulating: beta = 1), then the conv step over the conv columns of y. Opted in (decode_gemm_fused_): one
  // kernel (fused_gemv_fast.cu) for every decode batch size, where it takes the shapes (the same answer at every
  // batch size).
  void fused_linear_fast(const FusedLinearArgs& a, const BatchLayout& batch) {
    const int64_t B = batch.total_tokens, in = a.x.dim(1), out = a.w.data.dim(0);
    need(in <= INT_MAX && out <= INT_MAX && a.y.stride0() <= INT_MAX, "fused_linear: dimensions beyond cuBLAS's ",
         "32-bit limits: x ", a.x.shape_string(), ", w ", a.w.data.shape_string());
    // The opted-in GEMVs take decode batches only: a prompt's rows take the GEMM alone or batched alike.
    if (decode_gemm_fused_ && decode_rows(batch, kFastMaxRows) && a.x.dtype == DType::F32) {
      if (std::optional<FusedGemvLaunch> p = fast_gemv_launch(a, B)) {
        if (p->conv_channels > 0) p->seqs = device_seqs(batch, a.conv_state.dim(0), B, "fused_linear");
        launch_fast_gemv(*p, sm_count_, stream());
        return;
      }
    }
    // Decode batches round into the scratch graphs hold; prefill pieces into the linear op's own.
    void* x16 = B <= kFastMaxRows ? decode_scratch(fast_x16_, B, in, 2)
                                  : grow(split_, static_cast<size_t>(B * in) * 2);
    const ConstF32Rows gate = a.gate.empty() || a.gate.dtype == DType::BF16 ? ConstF32Rows{} : crows(a.gate);
    const DevWeight norm_w = a.norm_w.empty() ? DevWeight{} : weight(a.norm_w);
    const int64_t group = a.norm_group > 0 ? a.norm_group : in;
    if (a.x.dtype == DType::BF16 && a.gate.dtype == DType::BF16 && !a.gate.empty())
      launch_rmsnorm_round_bf16_xz(a.x.ptr<uint16_t>(), a.x.stride0(), a.gate.ptr<uint16_t>(), a.gate.stride0(), norm_w,
                                   group, a.eps, a.w.data.dtype, x16, B, in, stream());
    else if (a.x.dtype == DType::BF16)
      launch_rmsnorm_round_bf16_x(a.x.ptr<uint16_t>(), a.x.stride0(), gate, norm_w, group, a.eps, a.w.data.dtype, x16, B,
                                  in, stream());
    else
      launch_rmsnorm_round(crows(a.x), gate, norm_w, group, a.eps, a.w.data.dtype, x16, B, in, stream());
    if (!a.bias.empty()) launch_broadcast_bias(weight(a.bias), rows(a.y), B, out, stream());
    cublas();  // the shared workspace exists
    const cudaDataType_t ab = a.w.data.dtype == DType::BF16 ? CUDA_R_16BF : CUDA_R_16F;
    const float beta = a.accumulate || !a.bias.empty() ? 1.0f : 0.0f;
    // Rows of long prompts on the prefill plan, those of short and one-token sequences on the decode plan (gemm_lt.h):
    // each row gets the bits it gets alone, whatever the forward mixes. Runs of rows of one kind, one GEMM each.
    // A bf16 y (Mamba2Plan::proj_dtype): prompt rows only, the prefill plan with a bf16 output (gemm_lt.h); an f32 y with
    // round_prompt_rows: the prompt rows rounded after it, the same bits.
    const bool y16 = a.y.dtype == DType::BF16;
    const bool round_prompts = a.round_prompt_rows;
    for (const RowRun& r : row_runs(batch)) {
      const void* x_rows = static_cast<const char*>(x16) + static_cast<size_t>(r.start * in) * 2;
      const int rows_n = static_cast<int>(r.len);
      if (y16) {
        need(r.prompt && round_prompts && beta == 0.0f && a.y.stride0() == out,
             "fused_linear: a bf16 y is for Mamba-2's in_proj on prompts of ", LtMatmul::kPrefillMinRows,
             " tokens and more (Mamba2Plan::proj_dtype), found ", a.y.shape_string(), r.prompt ? "" : " with short rows");
        uint16_t* y_rows = a.y.ptr<uint16_t>() + r.start * out;
        if (lt_.run_prefill_bf16(stream(), cublas_workspace_, kCublasWorkspaceBytes, ab, a.w.data.data, x_rows, y_rows,
                                 static_cast<int>(out), rows_n, static_cast<int>(in), out))
          continue;
        float* f = static_cast<float*>(grow(proj32_, static_cast<size_t>(r.len * out) * 4));
        lt_.run(stream(), cublas_workspace_, kCublasWorkspaceBytes, ab, a.w.data.data, x_rows, f, static_cast<int>(out),
                rows_n, static_cast<int>(in), out, 0.0f, LtMatmul::Pin::Prefill);
        launch_convert(f, DType::F32, y_rows, DType::BF16, r.len * out, stream());
        continue;
      }
      float* y_rows = a.y.ptr<float>() + r.start * a.y.stride0();
      lt_.run(stream(), cublas_workspace_, kCublasWorkspaceBytes, ab, a.w.data.data, x_rows, y_rows, static_cast<int>(out),
              rows_n, static_cast<int>(in), a.y.stride0(), beta,
              r.prompt ? LtMatmul::Pin::Prefill : LtMatmul::Pin::Decode);
      if (r.prompt && round_prompts) launch_round_bf16(F32Rows{y_rows, a.y.stride0()}, r.len, out, stream());
    }
    if (a.conv_w.empty()) return;
    // The GEMM wrote the conv columns of y too (y holds all `out` columns); the step reads them from there.
    const int64_t ch = a.conv_w.dim(0);
    Conv1dLaunch p;
    p.x = crows(a.y.cols(a.conv_begin, ch));
    p.w = weight(a.conv_w);
    p.bias = a.conv_bias.empty() ? DevWeight{} : weight(a.conv_bias);
    p.state = a.conv_state.data;
    p.state_bf16 = a.conv_state.dtype == DType::BF16;
    p.out = rows(a.conv_out);
    p.T = B;
    p.C = ch;
    p.K = a.conv_w.dim(2);
    p.seqs = device_seqs(batch, a.conv_state.dim(0), B, "fused_linear");
    p.token_seq = token_seq_;
    p.n_seqs = n_prepared_seqs_;
    p.all_single = true;
    launch_conv1d_silu(p, stream());
  }

  void gather_rows(const TensorView& x, const int64_t* host_rows, int64_t n, TensorView out) override {
    need(x.ndim >= 1 && out.ndim >= 1 && x.dtype == out.dtype && x.row_size() == out.row_size() && out.dim(0) >= n,
         "gather_rows: x ", x.shape_string(), " vs out ", out.shape_string());
    const size_t es = dtype_size(x.dtype);
    need(es == 2 || es == 4 || es == 8, "gather_rows: unsupported dtype ", dtype_name(x.dtype));
    if (n <= 0) return;
    for (int64_t i = 0; i < n; ++i)
      need(host_rows[i] >= 0 && host_rows[i] < x.dim(0), "gather_rows: row ", host_rows[i], " outside [0, ",
           x.dim(0), ")");
    void* dev_rows = grow(rows_, static_cast<size_t>(n) * sizeof(int64_t));
    copy_from_host(dev_rows, host_rows, static_cast<size_t>(n) * sizeof(int64_t));
    launch_gather_rows(x.data, x.stride0(), static_cast<const int64_t*>(dev_rows), n, x.row_size(), es, out.data,
                       out.stride0(), stream());
  }

  // One upload (row parameters, then the penalised ids), the kernel, one download of the packed candidates.
  void select_top_k(TensorView logits, const std::vector<TopKRequest>& requests,
                    std::vector<TopKCandidates>& out) override {
    const std::vector<int64_t> limits = check_top_k_requests(logits, requests);
    check_f32_2d(logits, "select_top_k: logits");
    const int64_t n = logits.dim(0);
    out.assign(static_cast<size_t>(n), TopKCandidates{});
    if (n == 0) return;
    std::vector<SelectRowParams> params(static_cast<size_t>(n));
    std::vector<int32_t> ids;
    int32_t kmax = 1;
    for (size_t r = 0; r < params.size(); ++r) {
      const TopKRequest& q = requests[r];
      SelectRowParams& pr = params[r];
      pr.k = q.k;
      pr.limit = static_cast<int32_t>(limits[r]);
      pr.penalty = q.repeat_penalty;
      pr.pen_offset = static_cast<int32_t>(ids.size());
      if (q.repeat_penalty != 1.0f) ids.insert(ids.end(), q.penalized.begin(), q.penalized.end());
      pr.pen_count = static_cast<int32_t>(ids.size()) - pr.pen_offset;
      need(ids.size() <= INT32_MAX, "select_top_k: more than 2^31-1 penalized ids in one call");
      kmax = std::max(kmax, q.k);
    }
    // Both copies go through one pinned host buffer (parameters, then the packed output), so that they are truly
    // asynchronous and the call waits once. It is free again when this call returns (the stream has drained).
    const size_t ids_offset = align(params.size() * sizeof(SelectRowParams));
    const size_t in_bytes = ids_offset + ids.size() * sizeof(int32_t);
    const int64_t out_stride = 3 + 2 * int64_t(kmax);
    const size_t out_bytes = static_cast<size_t>(n * out_stride) * sizeof(int32_t);
    auto* pinned = static_cast<unsigned char*>(grow_pinned(align(in_bytes) + out_bytes));
    std::memcpy(pinned, params.data(), params.size() * sizeof(SelectRowParams));
    if (!ids.empty()) std::memcpy(pinned + ids_offset, ids.data(), ids.size() * sizeof(int32_t));
    auto* in = static_cast<unsigned char*>(grow(select_in_, in_bytes));
    MAMBACPP_CUDA_CHECK(cudaMemcpyAsync(in, pinned, in_bytes, cudaMemcpyHostToDevice, stream()));
    SelectLaunch p;
    p.logits = logits.ptr<float>();
    p.stride = logits.stride0();
    p.n_rows = n;
    p.rows = reinterpret_cast<const SelectRowParams*>(in);
    p.pen_ids = reinterpret_cast<const int32_t*>(in + ids_offset);
    p.out_stride = out_stride;
    p.kmax = kmax;
    p.out = static_cast<int32_t*>(grow(select_out_, out_bytes));
    launch_select_top_k(p, stream());
    auto* packed = reinterpret_cast<int32_t*>(pinned + align(in_bytes));
    MAMBACPP_CUDA_CHECK(cudaMemcpyAsync(packed, p.out, out_bytes, cudaMemcpyDeviceToHost, stream()));
    MAMBACPP_CUDA_CHECK(cudaStreamSynchronize(stream()));
    for (int64_t r = 0; r < n; ++r) {
      const int32_t* w = packed + r * p.out_stride;
      TopKCandidates& c = out[static_cast<size_t>(r)];
      c.bad_id = w[1];
      std::memcpy(&c.bad_value, &w[2], sizeof(float));
      c.ids.assign(w + 3, w + 3 + w[0]);
      c.logits.resize(static_cast<size_t>(w[0]));
      std::memcpy(c.logits.data(), w + 3 + kmax, static_cast<size_t>(w[0]) * sizeof(float));
    }
  }

  void row_logsumexp(const TensorView& logits, const std::vector<int64_t>& limits, std::vector<float>& out) override {
    check_row_logsumexp(logits, limits);
    check_f32_2d(logits, "row_logsumexp: logits");
    const int64_t n = logits.dim(0);
    out.assign(static_cast<size_t>(n), 0.0f);
    if (n == 0) return;
    need(n <= INT32_MAX, "row_logsumexp: at most 2^31-1 rows");
    // Limits in, results out, through the pinned buffer of select_top_k (free between calls).
    const size_t in_bytes = align(static_cast<size_t>(n) * sizeof(int32_t));
    auto* pinned = static_cast<unsigned char*>(grow_pinned(in_bytes + static_cast<size_t>(n) * sizeof(float)));
    auto* lim = reinterpret_cast<int32_t*>(pinned);
    for (int64_t r = 0; r < n; ++r) lim[r] = static_cast<int32_t>(limits[static_cast<size_t>(r)]);
    auto* dev = static_cast<unsigned char*>(grow(select_in_, in_bytes + static_cast<size_t>(n) * sizeof(float)));
    MAMBACPP_CUDA_CHECK(cudaMemcpyAsync(dev, pinned, in_bytes, cudaMemcpyHostToDevice, stream()));
    auto* dev_out = reinterpret_cast<float*>(dev + in_bytes);
    launch_row_logsumexp(crows(logits), reinterpret_cast<const int32_t*>(dev), n, dev_out, stream());
    MAMBACPP_CUDA_CHECK(cudaMemcpyAsync(pinned + in_bytes, dev_out, static_cast<size_t>(n) * sizeof(float),
                                        cudaMemcpyDeviceToHost, stream()));
    MAMBACPP_CUDA_CHECK(cudaStreamSynchronize(stream()));
    std::memcpy(out.data(), pinned + in_bytes, static_cast<size_t>(n) * sizeof(float));
  }

  // ---- Hybrid-model ops (attention.cu, hybrid_elementwise.cu) ------------------------------------------------------
  // The call's sequences, tiles and page pointers go up in one copy (stream-ordered, so reusing the buffer for the
  // next layer is safe), then the append kernel, the attention kernel and, for split keys, the combine.
  void attention(const AttentionArgs& a, const BatchLayout& batch) override {
    const char* op = "attention";
    const int64_t NH = a.n_heads, KV = a.n_kv_heads, HD = a.head_dim;
    need(NH > 0 && KV > 0 && HD > 0 && NH % KV == 0 && a.page_tokens > 0, op, ": bad sizes n_heads ", NH,
         ", n_kv_heads ", KV, ", head_dim ", HD, ", page_tokens ", a.page_tokens,
         " (all positive, n_kv_heads dividing n_heads)");
    need(HD <= 256, op, ": head_dim ", HD, " is above the GPU kernel's limit of 256");
    need(a.kv_dtype == DType::F32 || a.kv_dtype == DType::BF16, op, ": KV pages must be f32 or bf16, found ",
         dtype_name(a.kv_dtype));
    for (const TensorView* v : {&a.q, &a.k, &a.v, &a.out}) check_f32_2d(*v, "attention: q/k/v/out");
    const int64_t T = a.q.dim(0);
    need(a.q.dim(1) == NH * HD && a.out.dim(0) == T && a.out.dim(1) == NH * HD, op, ": q ", a.q.shape_string(),
         " and out ", a.out.shape_string(), " must be [", T, ", ", NH * HD, "]");
    need(a.k.dim(0) == T && a.v.dim(0) == T && a.k.dim(1) == KV * HD && a.v.dim(1) == KV * HD, op, ": k ",
         a.k.shape_string(), " and v ", a.v.shape_string(), " must be [", T, ", ", KV * HD, "]");
    AttentionLaunch p;
    p.token_seq = token_seq_;
    const SeqSpan* spans = device_seqs(batch, INT64_MAX, T, op);
    need(n_mapped_tokens_ >= T, op, ": the batch maps ", n_mapped_tokens_, " rows, expected ", T);
    const int64_t rep = NH / KV;
    p.q = crows(a.q);
    p.k = crows(a.k);
    p.v = crows(a.v);
    p.out = rows(a.out);
    p.T = T;
    p.n_heads = NH;
    p.n_kv_heads = KV;
    p.head_dim = HD;
    p.page_tokens = a.page_tokens;
    p.scale = a.scale;
    p.kv_bf16 = a.kv_dtype == DType::BF16;
    const int64_t elem = static_cast<int64_t>(dtype_size(a.kv_dtype));
    if (a.device_pages) {
      need(a.device_lengths && a.max_pages > 0, op, ": device_pages needs device_lengths and max_pages > 0");
      int64_t max_len = 0;
      for (const SeqSpan& sp : batch.seqs) max_len = std::max(max_len, sp.len);
      p.spans = spans;
      p.lengths = a.device_lengths;
      p.pages = a.device_pages;
      p.max_pages = a.max_pages;
      p.tiles_per_seq = (max_len * rep + kAttnTileItems - 1) / kAttnTileItems;
      p.pipelined = p.tiles_per_seq == 1 && HD * elem % 16 == 0;
      p.n_tiles = static_cast<int64_t>(batch.seqs.size()) * p.tiles_per_seq;
      need(p.n_tiles <= INT32_MAX, op, ": too many query tiles in one call");
      if (p.n_tiles == 0) return;
      set_splits(p, a.max_pages * a.page_tokens, p.tiles_per_seq == 1);
      launch_kv_append(p, stream());
      launch_attention(p, stream());
      return;
    }
    need(a.cache.size() == batch.seqs.size(), op, ": ", a.cache.size(), " KV caches for ", batch.seqs.size(),
         " sequences");
    std::vector<AttnSeq> seqs(batch.seqs.size());
    std::vector<AttnTile> tiles;
    std::vector<void*> pages;
    int64_t max_keys = 0, max_len = 0;
    for (size_t i = 0; i < seqs.size(); ++i) {
      const KvSequence& c = a.cache[i];
      const SeqSpan& sp = batch.seqs[i];
      const int64_t keys = c.past + sp.len;
      need(c.past >= 0 && static_cast<int64_t>(c.pages.size()) * a.page_tokens >= keys, op, ": sequence ", i,
           " has ", c.pages.size(), " pages of ", a.page_tokens, " rows for ", keys, " positions");
      seqs[i] = {sp.start, sp.len, c.past, static_cast<int64_t>(pages.size())};
      pages.insert(pages.end(), c.pages.begin(), c.pages.end());
      for (int64_t it = 0; it < sp.len * rep; it += kAttnTileItems) {
        need(it <= INT32_MAX, op, ": sequence ", i, " has too many rows for one call (", sp.len, ")");
        tiles.push_back({static_cast<int32_t>(i), static_cast<int32_t>(it)});
      }
      max_keys = std::max(max_keys, keys);
      max_len = std::max(max_len, sp.len);
    }
    // One tile per sequence (decode steps, short pieces): the block's compute is short against its key loads. The
    // pipelined staging moves 16-byte chunks: rows of whole chunks, pages 16-byte aligned (cudaMalloc'd: 256).
    const bool decode_shaped = max_len * rep <= kAttnTileItems;
    bool aligned = HD * elem % 16 == 0;
    for (void* pg : pages) aligned = aligned && reinterpret_cast<uintptr_t>(pg) % 16 == 0;
    p.pipelined = decode_shaped && aligned;
    need(tiles.size() <= INT32_MAX, op, ": too many query tiles in one call");
    if (tiles.empty()) return;

    const size_t tiles_at = align(seqs.size() * sizeof(AttnSeq));
    const size_t pages_at = tiles_at + align(tiles.size() * sizeof(AttnTile));
    std::vector<unsigned char> host(pages_at + pages.size() * sizeof(void*));
    std::memcpy(host.data(), seqs.data(), seqs.size() * sizeof(AttnSeq));
    std::memcpy(host.data() + tiles_at, tiles.data(), tiles.size() * sizeof(AttnTile));
    if (!pages.empty()) std::memcpy(host.data() + pages_at, pages.data(), pages.size() * sizeof(void*));
    auto* meta = static_cast<unsigned char*>(grow(attn_meta_, host.size()));
    copy_from_host(meta, host.data(), host.size());
    p.seqs = reinterpret_cast<const AttnSeq*>(meta);
    p.tiles = reinterpret_cast<const AttnTile*>(meta + tiles_at);
    p.n_tiles = static_cast<int64_t>(tiles.size());
    p.pages = reinterpret_cast<void* const*>(meta + pages_at);
    set_splits(p, max_keys, decode_shaped);
    launch_kv_append(p, stream());
    launch_attention(p, stream());
  }

  // Splits the keys (up to max_keys per sequence) over grid.z when the blocks would not fill the GPU twice over
  // (decode-shaped calls: kDecodeBlocksPerSm times over, as such a block streams its keys with little compute and an
  // SM needs many of them to keep enough loads in flight; prefill-sized calls never split) and the contexts are
  // long: at least 256 keys per split (a split costs its partial row and a share of the combine). The partials'
  // buffer grows here, so a captured step finds it sized by its eager first run.
  static constexpr int64_t kDecodeBlocksPerSm = 16;
  void set_splits(AttentionLaunch& p, int64_t max_keys, bool decode_shaped) {
    const int64_t blocks = p.n_tiles * p.n_kv_heads;
    const int64_t target = (decode_shaped ? kDecodeBlocksPerSm : 2) * sm_count_;
    int64_t splits = 1;
    if (blocks < target && max_keys > 512) splits = std::min((target + blocks - 1) / blocks, (max_keys + 255) / 256);
    const int64_t split_keys = ((max_keys + splits - 1) / splits + 31) / 32 * 32;
    splits = (max_keys + split_keys - 1) / split_keys;
    p.n_splits = static_cast<int>(splits);
    p.split_keys = splits > 1 ? split_keys : std::max<int64_t>(max_keys, 1);
    if (splits > 1)
      p.partial = static_cast<float*>(grow(
          attn_partial_, static_cast<size_t>(splits * p.T * p.n_heads * (p.head_dim + 2)) * sizeof(float)));
  }

  bool supports_device_kv() const override { return true; }

  void rope_at_lengths(TensorView x, int64_t n_heads, int64_t head_dim, int64_t rope_dim, double theta,
                       const int64_t* device_lengths, const BatchLayout& batch) override {
    const char* op = "rope_at_lengths";
    need(n_heads > 0 && head_dim > 0 && rope_dim >= 2 && rope_dim % 2 == 0 && rope_dim <= head_dim && theta > 0, op,
         ": bad sizes n_heads ", n_heads, ", head_dim ", head_dim, ", rope_dim ", rope_dim, ", theta ", theta,
         " (rope_dim even in [2, head_dim], theta > 0)");
    check_f32_2d(x, "rope_at_lengths: x");
    need(x.dim(1) == n_heads * head_dim, op, ": x ", x.shape_string(), " must be [T, ", n_heads * head_dim, "]");
    need(device_lengths != nullptr, op, ": no device lengths");
    const SeqSpan* spans = device_seqs(batch, INT64_MAX, x.dim(0), op);
    need(n_mapped_tokens_ >= x.dim(0), op, ": the batch maps ", n_mapped_tokens_, " rows, expected ", x.dim(0));
    launch_rope_at_lengths(rows(x), x.dim(0), n_heads, head_dim, rope_dim, theta, spans, token_seq_, device_lengths,
                           stream());
  }

  void rope(TensorView x, int64_t n_heads, int64_t head_dim, int64_t rope_dim, double theta,
            const std::vector<int64_t>& start_positions, const BatchLayout& batch) override {
    const char* op = "rope";
    need(n_heads > 0 && head_dim > 0 && rope_dim >= 2 && rope_dim % 2 == 0 && rope_dim <= head_dim && theta > 0, op,
         ": bad sizes n_heads ", n_heads, ", head_dim ", head_dim, ", rope_dim ", rope_dim, ", theta ", theta,
         " (rope_dim even in [2, head_dim], theta > 0)");
    check_f32_2d(x, "rope: x");
    const int64_t T = x.dim(0), half = rope_dim / 2;
    need(x.dim(1) == n_heads * head_dim, op, ": x ", x.shape_string(), " must be [T, ", n_heads * head_dim, "]");
    need(start_positions.size() == batch.seqs.size(), op, ": ", start_positions.size(), " start positions for ",
         batch.seqs.size(), " sequences");
    std::vector<int64_t> pos(static_cast<size_t>(T), -1);
    for (size_t s = 0; s < batch.seqs.size(); ++s) {
      const SeqSpan& sp = batch.seqs[s];
      need(sp.start >= 0 && sp.len >= 0 && sp.start + sp.len <= T && start_positions[s] >= 0, op, ": sequence ", s,
           " (start ", sp.start, ", len ", sp.len, ", position ", start_positions[s], ") outside ", T, " rows");
      for (int64_t i = 0; i < sp.len; ++i) pos[static_cast<size_t>(sp.start + i)] = start_positions[s] + i;
    }
    std::vector<double> inv_freq(static_cast<size_t>(half));
    for (int64_t i = 0; i < half; ++i)
      inv_freq[static_cast<size_t>(i)] = std::pow(theta, -static_cast<double>(2 * i) / static_cast<double>(rope_dim));
    const size_t freq_at = align(pos.size() * sizeof(int64_t));
    std::vector<unsigned char> host(freq_at + inv_freq.size() * sizeof(double));
    if (!pos.empty()) std::memcpy(host.data(), pos.data(), pos.size() * sizeof(int64_t));
    std::memcpy(host.data() + freq_at, inv_freq.data(), inv_freq.size() * sizeof(double));
    auto* meta = static_cast<unsigned char*>(grow(rope_meta_, host.size()));
    copy_from_host(meta, host.data(), host.size());
    launch_rope(rows(x), T, n_heads, head_dim, rope_dim, reinterpret_cast<const int64_t*>(meta),
                reinterpret_cast<const double*>(meta + freq_at), stream());
  }

  void relu2(TensorView x) override {
    check_f32_2d(x, "relu2: x");
    launch_relu2(rows(x), x.dim(0), x.dim(1), stream());
  }

  void silu_mul(const TensorView& gate, const TensorView& up, TensorView out) override {
    check_f32_2d(gate, "silu_mul: gate");
    check_f32_2d(up, "silu_mul: up");
    check_f32_2d(out, "silu_mul: out");
    need(same_2d(gate, up) && same_2d(gate, out), "silu_mul: gate ", gate.shape_string(), ", up ", up.shape_string(),
         ", out ", out.shape_string(), " must have one shape");
    launch_silu_mul(crows(gate), crows(up), rows(out), gate.dim(0), gate.dim(1), stream());
  }

  void scale(TensorView x, float alpha) override {
    check_f32_2d(x, "scale: x");
    launch_scale(rows(x), alpha, x.dim(0), x.dim(1), stream());
  }

 private:
  template <class... Parts>
  static void need(bool ok, const Parts&... parts) {
    if (!ok) fail(parts...);
  }
  static size_t align(size_t n) { return (n + 255) & ~size_t(255); }
  static void check_f32_2d(const TensorView& v, const char* what) {
    need(v.ndim == 2 && v.dtype == DType::F32 && v.device == Device::CUDA, what,
         ": expected a 2-D f32 tensor on cuda, found ", v.shape_string(), " ", dtype_name(v.dtype), " on ",
         device_name(v.device));
  }
  static bool same_2d(const TensorView& a, const TensorView& b) { return a.dim(0) == b.dim(0) && a.dim(1) == b.dim(1); }
  static void check_state(const TensorView& s, const char* what, std::initializer_list<int64_t> inner) {
    need(s.dtype == DType::F32 || s.dtype == DType::BF16, what, ": state dtype must be f32 or bf16, found ",
         dtype_name(s.dtype));
    need(s.ndim == static_cast<int>(inner.size()) + 1 && s.contiguous(), what, ": expected a contiguous [n_slots",
         inner.size() > 0 ? ", ..." : "", "] tensor, found ", s.shape_string());
    int i = 1;
    for (int64_t d : inner) {
      need(s.dim(i) == d, what, ": dim ", i, " is ", s.dim(i), ", expected ", d, " (shape ", s.shape_string(), ")");
      ++i;
    }
  }
  static F32Rows rows(const TensorView& v) { return {v.ptr<float>(), v.stride0()}; }
  static ConstF32Rows crows(const TensorView& v) { return {v.ptr<const float>(), v.stride0()}; }
  static DevWeight weight(const TensorView& v) {
    need(is_float_dtype(v.dtype), "weight dtype must be f32/f16/bf16, found ", dtype_name(v.dtype));
    return {v.data, v.dtype};
  }

  // The device copy of the batch's spans, after checking that it is the one prepare_batch made for this batch and
  // that every span fits the activations (T rows) and the state (n_slots).
  // Every sequence of the batch has one token (a decode step): the step kernels of conv1d and the scans.
  static bool one_token_each(const BatchLayout& b) {
    return std::all_of(b.seqs.begin(), b.seqs.end(), [](const SeqSpan& s) { return s.len == 1; });
  }

  // Consecutive rows of sequences of at least LtMatmul::kPrefillMinRows tokens (prompt = true), or of shorter ones,
  // in row order; every row in exactly one run.
  struct RowRun {
    int64_t start, len;
    bool prompt;
  };
  static std::vector<RowRun> row_runs(const BatchLayout& b) {
    std::vector<RowRun> runs;
    for (const SeqSpan& s : b.seqs) {
      if (s.len < 1) continue;
      const bool prompt = s.len >= LtMatmul::kPrefillMinRows;
      if (!runs.empty() && runs.back().prompt == prompt && runs.back().start + runs.back().len == s.start)
        runs.back().len += s.len;
      else
        runs.push_back({s.start, s.len, prompt});
    }
    int64_t covered = 0;
    for (const RowRun& r : runs) covered += r.len;
    need(covered == b.total_tokens, "fused_linear: the batch's sequences cover ", covered, " of its ", b.total_tokens,
         " rows");
    return runs;
  }

  // A decode batch the fused kernels take: 1..kFusedMaxRows sequences, sequence i in row i with one token.
  static bool decode_rows(const BatchLayout& b, int64_t max_rows) {
    const int64_t B = b.total_tokens;
    if (B < 1 || B > max_rows || static_cast<int64_t>(b.seqs.size()) != B) return false;
    for (int64_t i = 0; i < B; ++i)
      if (b.seqs[static_cast<size_t>(i)].start != i || b.seqs[static_cast<size_t>(i)].len != 1) return false;
    return true;
  }

  const SeqSpan* device_seqs(const BatchLayout& b, int64_t n_slots, int64_t T, const char* op) const {
    need(b.device_seqs != nullptr && b.device_seqs == batch_.ptr &&
             static_cast<int64_t>(b.seqs.size()) == n_prepared_seqs_,
         op, ": the batch was not prepared by this backend (call prepare_batch first)");
    for (const SeqSpan& s : b.seqs)
      need(s.slot < n_slots && s.start + s.len <= T, op, ": sequence (start ", s.start, ", len ", s.len, ", slot ",
           s.slot, ") outside ", T, " rows / ", n_slots, " slots");
    return static_cast<const SeqSpan*>(b.device_seqs);
  }

  // Cuts the batch's sequences into chunks of at most chunk_size tokens and uploads the table, unless it is already
  // there for this batch and chunk size (every layer of a forward piece reuses it). Returns the number of chunks.
  int64_t upload_chunk_table(const BatchLayout& b, int64_t chunk_size) {
    if (chunk_table_generation_ == batch_generation_ && chunk_table_chunk_size_ == chunk_size) return n_chunks_;
    std::vector<SsdChunk> chunks;
    std::vector<SsdSeqChunks> per_seq(b.seqs.size());
    int64_t score_tiles = 0;
    for (size_t s = 0; s < b.seqs.size(); ++s) {
      const SeqSpan& sp = b.seqs[s];
      per_seq[s].first = static_cast<int32_t>(chunks.size());
      for (int64_t off = 0; off < sp.len; off += chunk_size) {
        const int64_t len = std::min(chunk_size, sp.len - off);
        need(score_tiles <= INT32_MAX, "mamba2_ssd: too many chunks for one call");
        chunks.push_back({sp.start + off, static_cast<int32_t>(len), static_cast<int32_t>(s),
                          static_cast<int32_t>(score_tiles), sp.len == 1 ? 1 : 0});
        if (sp.len > 1) score_tiles += ssd_score_tiles(len);  // single tokens take the step kernel
      }
      per_seq[s].count = static_cast<int32_t>(chunks.size()) - per_seq[s].first;
    }
    n_score_tiles_ = score_tiles;
    chunk_seq_offset_ = align(chunks.size() * sizeof(SsdChunk));
    std::vector<unsigned char> host(chunk_seq_offset_ + per_seq.size() * sizeof(SsdSeqChunks));
    if (!chunks.empty()) std::memcpy(host.data(), chunks.data(), chunks.size() * sizeof(SsdChunk));
    if (!per_seq.empty())
      std::memcpy(host.data() + chunk_seq_offset_, per_seq.data(), per_seq.size() * sizeof(SsdSeqChunks));
    void* buf = grow(chunk_table_, std::max<size_t>(host.size(), 1));
    copy_from_host(buf, host.data(), host.size());
    chunk_table_generation_ = batch_generation_;
    chunk_table_chunk_size_ = chunk_size;
    n_chunks_ = static_cast<int64_t>(chunks.size());
    return n_chunks_;
  }

  // Scratch of the decode ops, which captured graphs hold by pointer: sized for kFastMaxRows rows from the first
  // use, so it grows only when a wider row appears -- during the first (eager) step of a model, which runs every op
  // of a step before any graph is captured -- never later under a captured graph. (The prefill-sized scratch
  // buffers grow with T, so decode ops must not share them.)
  void* decode_scratch(Scratch& s, int64_t rows, int64_t width, size_t elem) {
    return grow(s, static_cast<size_t>(std::max(rows, kFastMaxRows) * std::max<int64_t>(width, 1)) * elem);
  }

  // Grows a scratch buffer. The old one may still be read by enqueued kernels, so the stream drains first.
  void* grow(Scratch& s, size_t bytes) {
    if (bytes <= s.cap) return s.ptr;
    if (s.ptr) {
      // A captured graph may hold the old buffer (scratch of an op it recorded) and write it on every replay:
      // once anything has been captured, old buffers are retired, not freed, and live as long as the backend
      // (at most the geometric sum of the growth steps, under 3x the final size).
      MAMBACPP_CUDA_CHECK(cudaStreamSynchronize(stream()));
      if (captured_)
        retired_.push_back(s.ptr);
      else
        MAMBACPP_CUDA_CHECK(cudaFree(s.ptr));
      s.ptr = nullptr;
      s.cap = 0;
    }
    const size_t cap = align(std::max(bytes, s.cap + s.cap / 2));
    MAMBACPP_CUDA_CHECK(cudaMalloc(&s.ptr, cap));
    s.cap = cap;
    return s.ptr;
  }

  // The pinned host buffer of select_top_k. Only ever in use inside one call, which drains the stream before
  // returning, so growing it needs no wait.
  void* grow_pinned(size_t bytes) {
    if (bytes <= pinned_cap_) return pinned_;
    if (pinned_) MAMBACPP_CUDA_CHECK(cudaFreeHost(pinned_));
    pinned_ = nullptr;
    pinned_cap_ = 0;
    const size_t cap = align(std::max(bytes, size_t(64) << 10));
    MAMBACPP_CUDA_CHECK(cudaMallocHost(&pinned_, cap));
    pinned_cap_ = cap;
    return pinned_;
  }

  cudaStream_t stream() {
    if (!stream_) MAMBACPP_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    return stream_;
  }
  cublasHandle_t cublas() {
    if (!cublas_) {
      MAMBACPP_CUBLAS_CHECK(cublasCreate(&cublas_));
      MAMBACPP_CUBLAS_CHECK(cublasSetStream(cublas_, stream()));
      // A workspace of our own, so that cuBLAS allocates nothing while a CUDA graph is being captured.
      MAMBACPP_CUDA_CHECK(cudaMalloc(&cublas_workspace_, kCublasWorkspaceBytes));
      MAMBACPP_CUBLAS_CHECK(cublasSetWorkspace(cublas_, cublas_workspace_, kCublasWorkspaceBytes));
      lt_.init();
    }
    return cublas_;
  }

  int device_ = 0;
  int sm_count_ = 1;
  DType weight_dtype_ = DType::BF16;
  bool fast_ = false;  // Precision::Fast: 16-bit weights take linear_fast / the fast fused_linear
  bool decode_gemm_fused_ = false;  // MAMBACPP_DECODE_GEMM=fused: the fast fused_linear on fused_gemv_fast.cu
  bool batch_invariant_ = true;  // fast: the fast fused_linear at every batch size (false: fused GEMVs up to 8 rows)
  bool ssd_output_by_chunk_ = true;  // false: MAMBACPP_SSD_OUTPUT=tile
  bool mamba1_chunked_ = true;       // false: MAMBACPP_MAMBA1_SCAN=sequential
  bool prompt_proj_bf16_ = true;     // false: MAMBACPP_PROJ_OUT=f32
  bool conv_ssd_fused_ = true;       // false: MAMBACPP_CONV_SSD=split
  int64_t profile_after_ssd_ = 0;  // > 0: multi-token SSD / Mamba-1 scan calls left before cudaProfilerStart
  std::string description_;
  cudaStream_t stream_ = nullptr;
  cublasHandle_t cublas_ = nullptr;
  static constexpr size_t kCublasWorkspaceBytes = size_t(32) << 20;
  void* cublas_workspace_ = nullptr;  // shared by cuBLAS and cuBLASLt (one stream: never used at once)
  LtMatmul lt_;                        // prefill GEMMs with 16-bit weights
  std::vector<void*> owned_;  // adopted weights

  bool captured_ = false;         // a graph has been captured: grow() retires old scratch instead of freeing it
  std::vector<void*> retired_;   // scratch buffers captured graphs may still use
  Scratch batch_;  // SeqSpan[n] then the token -> sequence map
  std::vector<unsigned char> uploaded_batch_;  // what batch_ holds
  const int32_t* token_seq_ = nullptr;
  int64_t n_mapped_tokens_ = 0;
  int64_t n_prepared_seqs_ = 0;
  uint64_t batch_generation_ = 0;

  Scratch chunk_table_;  // SsdChunk[n_chunks] then SsdSeqChunks[n_seqs]
  size_t chunk_seq_offset_ = 0;
  int64_t n_chunks_ = 0;
  int64_t n_score_tiles_ = 0;  // SsdChunk::score_tile's range in the chunk table above
  uint64_t chunk_table_generation_ = ~uint64_t(0);
  int64_t chunk_table_chunk_size_ = 0;

  Scratch ssd_dt_, ssd_cum_, ssd_states_;  // mamba2_ssd's chunked path
  Scratch ssd_fast_;                       // its fast-precision bf16 copies (SsdScratch::x16 ...)
  Scratch split_;                          // linear: hi/lo halves of x
  Scratch proj32_;                         // fused_linear: f32 rows for a bf16 y without a bf16-output plan
  Scratch m1_pieces_;                      // mamba1_scan's chunked path (Mamba1Launch::piece_states, piece_dt)
  Scratch m1_dt_, fast_x16_;               // decode ops, fast precision: dt_proj's output, 16-bit rows
  Scratch rows_;                           // gather_rows: row indices
  Scratch select_in_, select_out_;         // select_top_k: parameters in, packed candidates out
  Scratch attn_meta_, attn_partial_;       // attention: sequences, tiles, page pointers; split partials
  Scratch rope_meta_;                      // rope: positions and inverse frequencies
  void* pinned_ = nullptr;                 // select_top_k's host side of both copies (pinned)
  size_t pinned_cap_ = 0;
};

}  // namespace

// Any CUDA error (no driver, a driver older than the runtime, no device, a device our kernels cannot run on) means
// "no GPU". cudaGetLastError() clears the runtime's last-error slot so nothing sticky is left behind.
bool cuda_available() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess || n <= 0) {
    cudaGetLastError();
    return false;
  }
  if (!cuda::kernels_loadable()) {
    cudaGetLastError();
    return false;
  }
  return true;
}

std::unique_ptr<Backend> make_cuda_backend(DType weight_dtype, Precision precision, bool batch_invariant) {
  if (!is_float_dtype(weight_dtype))
    fail("--device cuda: weight dtype must be fp32, fp16 or bf16, found ", dtype_name(weight_dtype));
  if (!cuda_available())
    fail("--device cuda: no usable CUDA GPU (no device, no driver, a driver older than CUDA ", CUDART_VERSION / 1000,
         ".", (CUDART_VERSION % 1000) / 10, ", or a GPU older than this build's sm_90 target)");
  int device = 0;
  MAMBACPP_CUDA_CHECK(cudaGetDevice(&device));
  return std::make_unique<CudaBackend>(device, weight_dtype, precision, batch_invariant);
}

}  // namespace mambacpp
