// The CUDA backend's construction, memory, weights, batch layout, norms and elementwise ops, and the checks every
// room shares (cuda_backend.h lists the rooms).
#include "backend/cuda/cuda_backend.h"

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <climits>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "backend/cuda/cuda_check.h"
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

using namespace cuda;

CudaBackend::CudaBackend(int device, DType weight_dtype, Precision precision, bool batch_invariant)
    : device_(device),
      weight_dtype_(weight_dtype),
      fast_(precision == Precision::Fast),
      batch_invariant_(batch_invariant) {
  cudaDeviceProp prop{};
  MAMBACPP_CUDA_CHECK(cudaGetDeviceProperties(&prop, device_));
  sm_count_ = prop.multiProcessorCount;
  description_ = std::string(prop.name) + " (sm_" + std::to_string(prop.major) + std::to_string(prop.minor) +
                 ", weights " + dtype_name(weight_dtype_) + (fast_ ? "" : ", exact products") + ")";
}

CudaBackend::~CudaBackend() {
  // No throwing here: errors at teardown are ignored (the process may be exiting after a device fault). The scratch
  // arena frees its buffers after this body, once the stream has drained.
  if (stream_) cudaStreamSynchronize(stream_);
  for (void* p : owned_) cudaFree(p);
  if (cublas_) cublasDestroy(cublas_);
  if (cublas_workspace_) cudaFree(cublas_workspace_);
  if (stream_) cudaStreamDestroy(stream_);
  cudaGetLastError();
}

// ---- Memory -------------------------------------------------------------------------------------------------------
void* CudaBackend::allocate(size_t bytes) {
  void* p = nullptr;
  if (bytes == 0) return nullptr;
  MAMBACPP_CUDA_CHECK(cudaMalloc(&p, bytes));
  return p;
}

void CudaBackend::deallocate(void* p) {
  if (p) MAMBACPP_CUDA_CHECK(cudaFree(p));
}

// Host memory here is pageable: cudaMemcpyAsync stages it before returning, so the caller may reuse it at once, and
// the copy still runs in stream order (after every kernel enqueued before it).
void CudaBackend::copy_from_host(void* dst, const void* host_src, size_t bytes) {
  if (bytes) MAMBACPP_CUDA_CHECK(cudaMemcpyAsync(dst, host_src, bytes, cudaMemcpyHostToDevice, stream()));
}

void CudaBackend::copy_to_host(void* host_dst, const void* src, size_t bytes) {
  if (!bytes) return;
  MAMBACPP_CUDA_CHECK(cudaMemcpyAsync(host_dst, src, bytes, cudaMemcpyDeviceToHost, stream()));
  MAMBACPP_CUDA_CHECK(cudaStreamSynchronize(stream()));
}

void CudaBackend::copy(void* dst, const void* src, size_t bytes) {
  if (bytes) MAMBACPP_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream()));
}

void CudaBackend::copy_many(const std::vector<CopyRegion>& regions) {
  CopyRegionBatch batch;
  for (const CopyRegion& r : regions) {
    if (!r.bytes) continue;
    batch.dst[batch.n] = r.dst, batch.src[batch.n] = r.src, batch.bytes[batch.n] = r.bytes;
    if (++batch.n == kCopyRegionBatch) launch_copy_regions(batch, stream()), batch.n = 0;
  }
  launch_copy_regions(batch, stream());
}

void CudaBackend::fill_zero(void* dst, size_t bytes) {
  if (bytes) MAMBACPP_CUDA_CHECK(cudaMemsetAsync(dst, 0, bytes, stream()));
}

void CudaBackend::synchronize() { MAMBACPP_CUDA_CHECK(cudaStreamSynchronize(stream())); }

TensorView CudaBackend::adopt_weight(const TensorView& host) {
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
      launch_convert(staging, from, static_cast<char*>(dev.data) + static_cast<size_t>(i) * dtype_size(target), target,
                     m, stream());
    }
    MAMBACPP_CUDA_CHECK(cudaStreamSynchronize(stream()));
    MAMBACPP_CUDA_CHECK(cudaFree(staging));
  }
  if (!narrowed.empty()) MAMBACPP_CUDA_CHECK(cudaStreamSynchronize(stream()));
  return dev;
}

// Uploads the spans, followed by a per-token map (sequence index of each packed row, -1 for rows in no sequence)
// that lets conv1d run one thread per (token, channel).
void CudaBackend::prepare_batch(BatchLayout& layout) {
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
  if (host == uploaded_batch_ && n == n_prepared_seqs_ && scratch_.get(Slot::kBatch)) {
    layout.device_seqs = scratch_.get(Slot::kBatch);  // token_seq_ and n_mapped_tokens_ are those of the same bytes
    return;
  }
  void* buf = grow(Slot::kBatch, std::max<size_t>(host.size(), 1));
  copy_from_host(buf, host.data(), host.size());
  uploaded_batch_ = std::move(host);
  layout.device_seqs = buf;
  token_seq_ = reinterpret_cast<const int32_t*>(static_cast<char*>(buf) + seq_bytes);
  n_mapped_tokens_ = n_tokens;
  n_prepared_seqs_ = n;
  ++batch_generation_;
}

// ---- Norms and elementwise ops -----------------------------------------------------------------------------------
void CudaBackend::to_f32(const TensorView& src, TensorView out) {
  need(is_float_dtype(src.dtype), "to_f32: expected f32/f16/bf16 input, found ", dtype_name(src.dtype));
  need(out.dtype == DType::F32, "to_f32: out must be f32, found ", dtype_name(out.dtype));
  need(src.numel() == out.numel() && src.ndim >= 1 && out.ndim >= 1 && src.dim(0) == out.dim(0),
       "to_f32: shapes differ: ", src.shape_string(), " vs ", out.shape_string());
  launch_to_f32(src.data, src.dtype, src.stride0(), src.dim(0), src.row_size(),
                F32Rows{out.ptr<float>(), out.stride0()}, stream());
}

void CudaBackend::rmsnorm(const TensorView& x, const TensorView& w, float eps, TensorView out) {
  check_f32_2d(x, "rmsnorm: x");
  check_f32_2d(out, "rmsnorm: out");
  need(same_2d(x, out), "rmsnorm: x ", x.shape_string(), " vs out ", out.shape_string());
  need(w.numel() == x.dim(1), "rmsnorm: w has ", w.numel(), " elements, expected ", x.dim(1));
  launch_rmsnorm(crows(x), weight(w), eps, rows(out), x.dim(0), x.dim(1), stream());
}

void CudaBackend::add_inplace(TensorView acc, const TensorView& x) {
  check_f32_2d(acc, "add_inplace: acc");
  check_f32_2d(x, "add_inplace: x");
  need(same_2d(acc, x), "add_inplace: acc ", acc.shape_string(), " vs x ", x.shape_string());
  launch_add_inplace(rows(acc), crows(x), acc.dim(0), acc.dim(1), stream());
}

void CudaBackend::gated_rmsnorm(const TensorView& y, const TensorView& z, const TensorView& w, int64_t group_size,
                                float eps, TensorView out) {
  check_f32_2d(y, "gated_rmsnorm: y");
  check_f32_2d(z, "gated_rmsnorm: z");
  check_f32_2d(out, "gated_rmsnorm: out");
  need(same_2d(y, z) && same_2d(y, out), "gated_rmsnorm: y ", y.shape_string(), ", z ", z.shape_string(), ", out ",
       out.shape_string());
  const int64_t D = y.dim(1);
  need(group_size > 0 && D % group_size == 0, "gated_rmsnorm: group_size ", group_size, " must divide ", D);
  need(w.numel() == D, "gated_rmsnorm: w has ", w.numel(), " elements, expected ", D);
  launch_gated_rmsnorm(crows(y), crows(z), weight(w), group_size, eps, rows(out), y.dim(0), D, stream());
}

void CudaBackend::relu2(TensorView x) {
  check_f32_2d(x, "relu2: x");
  launch_relu2(rows(x), x.dim(0), x.dim(1), stream());
}

void CudaBackend::silu_mul(const TensorView& gate, const TensorView& up, TensorView out) {
  check_f32_2d(gate, "silu_mul: gate");
  check_f32_2d(up, "silu_mul: up");
  check_f32_2d(out, "silu_mul: out");
  need(same_2d(gate, up) && same_2d(gate, out), "silu_mul: gate ", gate.shape_string(), ", up ", up.shape_string(),
       ", out ", out.shape_string(), " must have one shape");
  launch_silu_mul(crows(gate), crows(up), rows(out), gate.dim(0), gate.dim(1), stream());
}

void CudaBackend::scale(TensorView x, float alpha) {
  check_f32_2d(x, "scale: x");
  launch_scale(rows(x), alpha, x.dim(0), x.dim(1), stream());
}

// ---- Shared checks and conversions ------------------------------------------------------------------------------
void CudaBackend::check_f32_2d(const TensorView& v, const char* what) {
  need(v.ndim == 2 && v.dtype == DType::F32 && v.device == Device::CUDA, what,
       ": expected a 2-D f32 tensor on cuda, found ", v.shape_string(), " ", dtype_name(v.dtype), " on ",
       device_name(v.device));
}

void CudaBackend::check_state(const TensorView& s, const char* what, std::initializer_list<int64_t> inner) {
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

DevWeight CudaBackend::weight(const TensorView& v) {
  need(is_float_dtype(v.dtype), "weight dtype must be f32/f16/bf16, found ", dtype_name(v.dtype));
  return {v.data, v.dtype};
}

bool CudaBackend::one_token_each(const BatchLayout& b) {
  return std::all_of(b.seqs.begin(), b.seqs.end(), [](const SeqSpan& s) { return s.len == 1; });
}

bool CudaBackend::decode_rows(const BatchLayout& b, int64_t max_rows) {
  const int64_t B = b.total_tokens;
  if (B < 1 || B > max_rows || static_cast<int64_t>(b.seqs.size()) != B) return false;
  for (int64_t i = 0; i < B; ++i)
    if (b.seqs[static_cast<size_t>(i)].start != i || b.seqs[static_cast<size_t>(i)].len != 1) return false;
  return true;
}

bool CudaBackend::step_batch(const BatchLayout& b) {
  if (!b.step_pieces) return one_token_each(b);
  int64_t row = 0;
  for (const SeqSpan& s : b.seqs) {
    need(s.start == row && s.len >= 1 && s.len <= cuda::kStepMaxLen, "a batch of step pieces needs sequences of 1..",
         cuda::kStepMaxLen, " tokens in row order, found (start ", s.start, ", len ", s.len, ") at row ", row);
    row += s.len;
  }
  need(row == b.total_tokens, "a batch of step pieces covers ", row, " of its ", b.total_tokens, " rows");
  return true;
}

bool CudaBackend::step_rows(const BatchLayout& b, int64_t max_rows) {
  if (!b.step_pieces) return decode_rows(b, max_rows);
  return b.total_tokens >= 1 && b.total_tokens <= max_rows && step_batch(b);
}

const SeqSpan* CudaBackend::device_seqs(const BatchLayout& b, int64_t n_slots, int64_t T, const char* op) const {
  need(b.device_seqs != nullptr && b.device_seqs == scratch_.get(Slot::kBatch) &&
           static_cast<int64_t>(b.seqs.size()) == n_prepared_seqs_,
       op, ": the batch was not prepared by this backend (call prepare_batch first)");
  for (const SeqSpan& s : b.seqs)
    need(s.slot < n_slots && s.start + s.len <= T, op, ": sequence (start ", s.start, ", len ", s.len, ", slot ",
         s.slot, ") outside ", T, " rows / ", n_slots, " slots");
  return static_cast<const SeqSpan*>(b.device_seqs);
}

cudaStream_t CudaBackend::stream() {
  if (!stream_) MAMBACPP_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  return stream_;
}

cublasHandle_t CudaBackend::cublas() {
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
  if (weight_dtype != DType::F32 && weight_dtype != DType::F16 && weight_dtype != DType::BF16)
    fail("--device cuda: weight dtype must be fp32, fp16 or bf16, found ", dtype_name(weight_dtype));
  if (!cuda_available())
    fail("--device cuda: no usable CUDA GPU (no device, no driver, a driver older than CUDA ", CUDART_VERSION / 1000,
         ".", (CUDART_VERSION % 1000) / 10, ", or a GPU older than this build's sm_90 target)");
  int device = 0;
  MAMBACPP_CUDA_CHECK(cudaGetDevice(&device));
  return std::make_unique<CudaBackend>(device, weight_dtype, precision, batch_invariant);
}

}  // namespace mambacpp
