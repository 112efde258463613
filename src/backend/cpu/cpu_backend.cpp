// CpuBackend: memory (64-byte aligned malloc), argument checks, and dispatch to the CPU kernels.
// Every op checks what a caller can get wrong (dtypes, shapes, sequence spans, slots) and throws a mambacpp::Error
// that names the op, what was expected and what was found.
#include "backend/cpu/cpu_backend.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <cstdlib>
#include <cstring>
#include <span>
#include <thread>
#include <utility>
#include <vector>

#include "backend/cpu/attention.h"
#include "backend/cpu/conv1d.h"
#include "backend/cpu/cpu_ops.h"
#include "backend/cpu/decode_steps.h"
#include "backend/cpu/selective_scan.h"
#include "backend/cpu/simd.h"
#include "backend/cpu/ssd.h"
#include "mambacpp/error.h"

namespace mambacpp {
namespace {

using cpu::Rows;
using cpu::WeightRef;

constexpr size_t kAlignment = 64;

bool is_float_storage(DType t) {
  return t == DType::F32 || t == DType::F16 || t == DType::BF16 || t == DType::F64;
}

// An f32 activation of `rows` x `cols` (2-D, possibly with a row stride).
void check_act(const char* op, const char* name, const TensorView& v, int64_t rows, int64_t cols) {
  if (v.empty()) fail(op, ": ", name, " is missing");
  if (v.device != Device::CPU) fail(op, ": ", name, " must be on the CPU, found ", device_name(v.device));
  if (v.dtype != DType::F32) fail(op, ": ", name, " must be f32, found ", dtype_name(v.dtype));
  if (v.ndim != 2 || v.dim(0) != rows || v.dim(1) != cols)
    fail(op, ": ", name, " must be [", rows, ", ", cols, "], found ", v.shape_string());
  if (v.stride0() < cols) fail(op, ": ", name, " has row stride ", v.stride0(), " < its ", cols, " columns");
}

// A weight of `numel` elements in a float storage dtype; `optional` allows an empty view.
WeightRef weight(const char* op, const char* name, const TensorView& v, int64_t numel, bool optional = false) {
  if (v.empty()) {
    if (optional) return {};
    fail(op, ": weight ", name, " is missing");
  }
  if (!is_float_storage(v.dtype)) fail(op, ": weight ", name, " has dtype ", dtype_name(v.dtype), ", expected f32/f16/bf16");
  if (!v.contiguous()) fail(op, ": weight ", name, " must be contiguous");
  if (v.numel() != numel) fail(op, ": weight ", name, " must have ", numel, " elements, found ", v.shape_string());
  return {v.data, v.dtype};
}

// State [n_slots, inner...] in f32 or bf16 whose row (one slot) holds `slot_elems` elements.
void check_state(const char* op, const char* name, const TensorView& s, int64_t slot_elems) {
  if (s.empty()) fail(op, ": ", name, " state is missing");
  if (s.dtype != DType::F32 && s.dtype != DType::BF16)
    fail(op, ": ", name, " state has dtype ", dtype_name(s.dtype), "; expected f32 or bf16");
  if (!s.contiguous() || s.row_size() != slot_elems)
    fail(op, ": ", name, " state must be contiguous with ", slot_elems, " elements per slot, found ", s.shape_string());
}

// Runs kernel(f32 state, sequences) on the state in place when it is f32. A bf16 state is widened first: the slots
// the batch uses are copied to f32 rows (the sequences renumbered to them), and rounded back afterwards. The fused
// decode (decode_block.cpp) reads and writes bf16 directly; this path serves prefill, where the copy is small
// beside the work.
template <class F>
void with_f32_state(const TensorView& s, const BatchLayout& batch, F&& kernel) {
  if (s.dtype == DType::F32) return kernel(s.ptr<float>(), std::span<const SeqSpan>(batch.seqs));
  const int64_t n = s.row_size();
  const size_t row_bytes = static_cast<size_t>(n) * dtype_size(s.dtype);
  std::vector<float> rows_f32(batch.seqs.size() * static_cast<size_t>(n));
  std::vector<SeqSpan> seqs = batch.seqs;
  for (size_t i = 0; i < seqs.size(); ++i) {
    cpu::simd::to_f32(static_cast<const char*>(s.data) + static_cast<size_t>(seqs[i].slot) * row_bytes, s.dtype,
                      rows_f32.data() + i * static_cast<size_t>(n), n);
    seqs[i].slot = static_cast<int64_t>(i);
  }
  kernel(rows_f32.data(), std::span<const SeqSpan>(seqs));
  for (size_t i = 0; i < seqs.size(); ++i)
    convert_from_f32(rows_f32.data() + i * static_cast<size_t>(n),
                     static_cast<char*>(s.data) + static_cast<size_t>(batch.seqs[i].slot) * row_bytes, s.dtype, n);
}

// Whether the memory spanned by two 2-D views intersects. conv1d and the SSD read inputs of earlier rows after
// writing outputs of later ones, so their outputs must not alias their inputs.
bool overlaps(const TensorView& a, const TensorView& b) {
  auto span = [](const TensorView& v) {
    const auto* lo = static_cast<const char*>(v.data);
    const int64_t elems = v.dim(0) > 0 ? (v.dim(0) - 1) * v.stride0() + v.row_size() : 0;
    return std::pair{lo, lo + static_cast<size_t>(elems) * dtype_size(v.dtype)};
  };
  const auto [a0, a1] = span(a);
  const auto [b0, b1] = span(b);
  return a0 < b1 && b0 < a1;
}

// Every sequence lies inside [0, T), uses a slot in [0, n_slots), and no two sequences share a slot.
void check_batch(const char* op, const BatchLayout& batch, int64_t T, int64_t n_slots) {
  std::vector<bool> used(static_cast<size_t>(n_slots), false);
  for (const SeqSpan& s : batch.seqs) {
    if (s.start < 0 || s.len < 0 || s.start + s.len > T)
      fail(op, ": sequence rows [", s.start, ", ", s.start + s.len, ") outside the batch's ", T, " tokens");
    if (s.slot < 0 || s.slot >= n_slots) fail(op, ": slot ", s.slot, " outside [0, ", n_slots, ")");
    if (used[static_cast<size_t>(s.slot)]) fail(op, ": slot ", s.slot, " is used by two sequences of one batch");
    used[static_cast<size_t>(s.slot)] = true;
  }
}

// Every sequence lies inside [0, T) (ops that take no state slots).
void check_spans(const char* op, const BatchLayout& batch, int64_t T) {
  for (const SeqSpan& s : batch.seqs)
    if (s.start < 0 || s.len < 0 || s.start + s.len > T)
      fail(op, ": sequence rows [", s.start, ", ", s.start + s.len, ") outside the batch's ", T, " tokens");
}

template <class T>
Rows<const T> crows(const TensorView& v) {
  return {v.ptr<const T>(), v.stride0()};
}
template <class T>
Rows<T> rows(const TensorView& v) {
  return {v.ptr<T>(), v.stride0()};
}

}  // namespace

CpuBackend::CpuBackend(int threads)
    : threads_(threads > 0 ? threads : std::max(1, static_cast<int>(std::thread::hardware_concurrency()))),
      weights_(cpu::WeightArena::huge_pages_available() ? std::make_unique<cpu::WeightArena>() : nullptr) {}

std::string CpuBackend::description() const {
  return "CPU (" + std::to_string(threads_) + (threads_ == 1 ? " thread, " : " threads, ") + cpu::simd::target_name() + ")";
}

// ---- Memory -----------------------------------------------------------------------------------------------------

void* CpuBackend::allocate(size_t bytes) {
  const size_t rounded = (std::max<size_t>(bytes, 1) + kAlignment - 1) / kAlignment * kAlignment;
  void* p = std::aligned_alloc(kAlignment, rounded);
  if (!p) fail("CPU backend: out of memory allocating ", bytes, " bytes");
  return p;
}

void CpuBackend::deallocate(void* p) { std::free(p); }

TensorView CpuBackend::adopt_weight(const TensorView& host) {
  if (!weights_ || host.device != Device::CPU || !host.contiguous() || host.empty()) return host;
  TensorView v = host;
  v.data = const_cast<void*>(weights_->adopt(host.data, host.nbytes()));
  return v;
}

void CpuBackend::copy_from_host(void* dst, const void* host_src, size_t bytes) {
  if (bytes) std::memcpy(dst, host_src, bytes);
}
void CpuBackend::copy_to_host(void* host_dst, const void* src, size_t bytes) {
  if (bytes) std::memcpy(host_dst, src, bytes);
}
void CpuBackend::copy(void* dst, const void* src, size_t bytes) {
  if (bytes) std::memmove(dst, src, bytes);
}
void CpuBackend::fill_zero(void* dst, size_t bytes) {
  if (bytes) std::memset(dst, 0, bytes);
}

// ---- Row ops ----------------------------------------------------------------------------------------------------

void CpuBackend::embed(const Weight& table_weight, const TensorView& ids, TensorView out) {
  if (!table_weight.dense()) return packed_embed(table_weight, ids, out);
  const TensorView& table = table_weight.dense_view("embed");
  if (table.ndim != 2) fail("embed: table must be 2-D, found ", table.shape_string());
  const int64_t V = table.dim(0), D = table.dim(1);
  WeightRef tab = weight("embed", "table", table, V * D);
  if (ids.dtype != DType::I32 || ids.ndim != 1) fail("embed: ids must be 1-D i32, found ", ids.shape_string(), " ", dtype_name(ids.dtype));
  const int64_t T = ids.dim(0);
  check_act("embed", "out", out, T, D);
  cpu::embed_f32(tab, V, ids.ptr<const int32_t>(), rows<float>(out), T, D, threads_);
}

void CpuBackend::to_f32(const TensorView& src, TensorView out) {
  if (!is_float_storage(src.dtype)) fail("to_f32: source dtype ", dtype_name(src.dtype), " is not a float type");
  if (out.dtype != DType::F32) fail("to_f32: out must be f32, found ", dtype_name(out.dtype));
  if (src.ndim != out.ndim || src.numel() != out.numel())
    fail("to_f32: shapes differ: ", src.shape_string(), " vs ", out.shape_string());
  for (int i = 0; i < src.ndim; ++i)
    if (src.dim(i) != out.dim(i)) fail("to_f32: shapes differ: ", src.shape_string(), " vs ", out.shape_string());
  if (src.ndim == 0) return;
  const int64_t n = src.dim(0), rs = src.row_size();
  const size_t es = dtype_size(src.dtype);
  for (int64_t r = 0; r < n; ++r)
    convert_to_f32(static_cast<const char*>(src.data) + static_cast<size_t>(r * src.stride0()) * es, src.dtype,
                   out.ptr<float>() + r * out.stride0(), rs);
}

void CpuBackend::rmsnorm(const TensorView& x, const TensorView& w, float eps, TensorView out) {
  if (x.ndim != 2) fail("rmsnorm: x must be [T, D], found ", x.shape_string());
  const int64_t T = x.dim(0), D = x.dim(1);
  check_act("rmsnorm", "x", x, T, D);
  check_act("rmsnorm", "out", out, T, D);
  cpu::rmsnorm_f32(crows<float>(x), weight("rmsnorm", "w", w, D), eps, rows<float>(out), T, D, threads_);
}

void CpuBackend::add_inplace(TensorView acc, const TensorView& x) {
  if (acc.ndim != 2) fail("add_inplace: acc must be [T, D], found ", acc.shape_string());
  const int64_t T = acc.dim(0), D = acc.dim(1);
  check_act("add_inplace", "acc", acc, T, D);
  check_act("add_inplace", "x", x, T, D);
  cpu::add_inplace_f32(rows<float>(acc), crows<float>(x), T, D, threads_);
}

void CpuBackend::linear(const TensorView& x, const Weight& weight_in, const TensorView& bias, TensorView y) {
  if (!weight_in.dense()) return packed_linear(x, weight_in, bias, y);
  const TensorView& w = weight_in.dense_view("linear");
  if (x.ndim != 2 || w.ndim != 2) fail("linear: x and w must be 2-D, found ", x.shape_string(), " and ", w.shape_string());
  const int64_t T = x.dim(0), in = x.dim(1), outf = w.dim(0);
  if (w.dim(1) != in) fail("linear: w must be [out, ", in, "], found ", w.shape_string());
  check_act("linear", "x", x, T, in);
  check_act("linear", "y", y, T, outf);
  WeightRef wr = weight("linear", "w", w, outf * in);
  WeightRef br = weight("linear", "bias", bias, outf, /*optional=*/true);
  cpu::linear_f32(crows<float>(x), wr, br, rows<float>(y), T, in, outf, threads_);
}

void CpuBackend::gated_rmsnorm(const TensorView& y, const TensorView& z, const TensorView& w, int64_t group_size,
                               float eps, TensorView out) {
  if (y.ndim != 2) fail("gated_rmsnorm: y must be [T, d_inner], found ", y.shape_string());
  const int64_t T = y.dim(0), D = y.dim(1);
  if (group_size <= 0 || D % group_size != 0)
    fail("gated_rmsnorm: group size ", group_size, " does not divide d_inner ", D);
  check_act("gated_rmsnorm", "y", y, T, D);
  check_act("gated_rmsnorm", "z", z, T, D);
  check_act("gated_rmsnorm", "out", out, T, D);
  cpu::gated_rmsnorm_f32(crows<float>(y), crows<float>(z), weight("gated_rmsnorm", "w", w, D), group_size, eps,
                         rows<float>(out), T, D, threads_);
}

void CpuBackend::gather_rows(const TensorView& x, const int64_t* idx, int64_t n, TensorView out) {
  if (x.ndim < 1 || out.ndim != x.ndim || out.dtype != x.dtype || out.dim(0) != n || out.row_size() != x.row_size())
    fail("gather_rows: out must be [", n, ", ...] like x ", x.shape_string(), ", found ", out.shape_string());
  const size_t row_bytes = static_cast<size_t>(x.row_size()) * dtype_size(x.dtype);
  for (int64_t i = 0; i < n; ++i) {
    if (idx[i] < 0 || idx[i] >= x.dim(0)) fail("gather_rows: row ", idx[i], " outside [0, ", x.dim(0), ")");
    std::memcpy(static_cast<char*>(out.data) + static_cast<size_t>(i * out.stride0()) * dtype_size(x.dtype),
                static_cast<const char*>(x.data) + static_cast<size_t>(idx[i] * x.stride0()) * dtype_size(x.dtype),
                row_bytes);
  }
}

void CpuBackend::select_top_k(TensorView logits, const std::vector<TopKRequest>& requests,
                              std::vector<TopKCandidates>& out) {
  const std::vector<int64_t> limits = check_top_k_requests(logits, requests);
  check_act("select_top_k", "logits", logits, logits.dim(0), logits.dim(1));
  cpu::select_top_k_f32(rows<float>(logits), requests, limits, out, threads_);
}

void CpuBackend::row_logsumexp(const TensorView& logits, const std::vector<int64_t>& limits, std::vector<float>& out) {
  check_row_logsumexp(logits, limits);
  check_act("row_logsumexp", "logits", logits, logits.dim(0), logits.dim(1));
  const Rows<float> r = rows<float>(logits);
  out.resize(limits.size());
  for (size_t i = 0; i < limits.size(); ++i) {
    const float* row = r.data + static_cast<int64_t>(i) * r.stride;
    float mx = -std::numeric_limits<float>::infinity();
    for (int64_t j = 0; j < limits[i]; ++j) mx = std::isnan(row[j]) || row[j] > mx ? row[j] : mx;
    if (std::isnan(mx) || std::isinf(mx)) {
      out[i] = mx;  // NaN, +inf, or every logit -inf
      continue;
    }
    float sum = 0.0f;
    for (int64_t j = 0; j < limits[i]; ++j) sum += std::exp(row[j] - mx);
    out[i] = mx + std::log(sum);
  }
}

// ---- Mixer ops --------------------------------------------------------------------------------------------------

void CpuBackend::conv1d_silu(const TensorView& x, const TensorView& w, const TensorView& bias, TensorView state,
                             const BatchLayout& batch, TensorView out) {
  const char* op = "conv1d_silu";
  if (x.ndim != 2) fail(op, ": x must be [T, C], found ", x.shape_string());
  const int64_t T = x.dim(0), C = x.dim(1);
  if (w.ndim < 2 || w.dim(0) != C) fail(op, ": w must be [", C, ", 1, K], found ", w.shape_string());
  const int64_t K = w.dim(w.ndim - 1);
  if (K < 1 || K > cpu::kConvMaxKernel) fail(op, ": kernel width ", K, " outside [1, ", cpu::kConvMaxKernel, "]");
  check_act(op, "x", x, T, C);
  check_act(op, "out", out, T, C);
  if (overlaps(x, out)) fail(op, ": out must not overlap x");
  cpu::Conv1dParams<float> p;
  p.x = crows<float>(x);
  p.w = weight(op, "w", w, C * K);
  p.bias = weight(op, "bias", bias, C, /*optional=*/true);
  check_state(op, "conv", state, C * (K - 1));
  p.out = rows<float>(out);
  p.channels = C;
  p.kernel = K;
  p.threads = threads_;
  check_batch(op, batch, T, state.dim(0));
  with_f32_state(state, batch, [&](float* st, std::span<const SeqSpan> seqs) {
    p.state = st;
    cpu::conv1d_silu(p, seqs);
  });
}

void CpuBackend::mamba1_scan(const Mamba1ScanArgs& a, const BatchLayout& batch) {
  const char* op = "mamba1_scan";
  if (a.x.ndim != 2 || a.A_log.ndim != 2) fail(op, ": x must be [T, d_inner] and A_log [d_inner, d_state]");
  const int64_t T = a.x.dim(0), DI = a.x.dim(1), N = a.A_log.dim(1);
  if (a.A_log.dim(0) != DI) fail(op, ": A_log must be [", DI, ", d_state], found ", a.A_log.shape_string());
  check_act(op, "x", a.x, T, DI);
  WeightRef dt_proj;
  if (!a.dt_proj.empty()) {
    if (a.dt_proj.ndim != 2 || a.dt_proj.dim(0) != DI)
      fail(op, ": dt_proj must be [", DI, ", dt_rank], found ", a.dt_proj.shape_string());
    check_act(op, "dt (low rank)", a.dt, T, a.dt_proj.dim(1));
    dt_proj = weight(op, "dt_proj", a.dt_proj, a.dt_proj.numel());
  } else {
    check_act(op, "dt", a.dt, T, DI);
  }
  check_act(op, "B", a.B, T, N);
  check_act(op, "C", a.C, T, N);
  check_act(op, "z", a.z, T, DI);
  check_act(op, "y", a.y, T, DI);
  cpu::Mamba1Params<float> p;
  p.A_log = weight(op, "A_log", a.A_log, DI * N);
  p.D = weight(op, "D", a.D, DI);
  p.dt_bias = weight(op, "dt_bias", a.dt_bias, DI);
  check_state(op, "ssm", a.state, DI * N);
  check_batch(op, batch, T, a.state.dim(0));
  if (cpu::single_token_batch(batch))  // dt_proj folded in
    return cpu::mamba1_decode_step(a, batch, threads_, mamba1_neg_a(a.A_log));
  std::vector<float> dt_full;  // dt_proj first: dt = low-rank dt . dt_proj^T
  if (dt_proj.present()) {
    dt_full.resize(static_cast<size_t>(T * DI));
    cpu::linear_f32(crows<float>(a.dt), dt_proj, WeightRef{}, cpu::Rows<float>{dt_full.data(), DI}, T,
                    a.dt_proj.dim(1), DI, threads_);
  }
  p.x = crows<float>(a.x);
  p.dt = dt_full.empty() ? crows<float>(a.dt) : cpu::Rows<const float>{dt_full.data(), DI};
  p.B = crows<float>(a.B);
  p.C = crows<float>(a.C);
  p.z = crows<float>(a.z);
  p.y = rows<float>(a.y);
  p.d_inner = DI;
  p.d_state = N;
  p.threads = threads_;
  with_f32_state(a.state, batch, [&](float* st, std::span<const SeqSpan> seqs) {
    p.state = st;
    cpu::mamba1_scan(p, seqs);
  });
}

const float* CpuBackend::mamba1_neg_a(const TensorView& A_log) {
  if (!weights_ || !weights_->contains(A_log.data)) return nullptr;
  std::lock_guard<std::mutex> lock(neg_a_mutex_);
  std::vector<float>& A = neg_a_[{A_log.data, cpu::simd::target_name()}];
  if (A.empty()) {
    const int64_t rows = A_log.dim(0), N = A_log.dim(1);
    A.resize(static_cast<size_t>(rows * N));
    cpu::simd::to_f32(A_log.data, A_log.dtype, A.data(), rows * N);
    cpu::simd::neg_exp_rows(A.data(), rows, N, A.data());
  }
  return A.data();
}

void CpuBackend::mamba2_ssd(const Mamba2ScanArgs& a, const BatchLayout& batch) {
  const char* op = "mamba2_ssd";
  const int64_t NH = a.n_heads, P = a.head_dim, G = a.n_groups, N = a.d_state;
  if (NH <= 0 || P <= 0 || G <= 0 || N <= 0 || NH % G != 0)
    fail(op, ": bad sizes n_heads ", NH, ", head_dim ", P, ", n_groups ", G, ", d_state ", N,
         " (all positive, n_groups dividing n_heads)");
  if (a.chunk_size <= 0) fail(op, ": chunk_size must be positive, found ", a.chunk_size);
  if (a.x.ndim != 2) fail(op, ": x must be [T, n_heads * head_dim], found ", a.x.shape_string());
  const int64_t T = a.x.dim(0);
  check_act(op, "x", a.x, T, NH * P);
  check_act(op, "dt", a.dt, T, NH);
  check_act(op, "B", a.B, T, G * N);
  check_act(op, "C", a.C, T, G * N);
  check_act(op, "y", a.y, T, NH * P);
  if (!a.z.empty()) check_act(op, "z", a.z, T, NH * P);
  for (const TensorView* in : {&a.x, &a.dt, &a.B, &a.C, &a.z})
    if (!in->empty() && overlaps(a.y, *in)) fail(op, ": y must not overlap its inputs x, dt, B, C, z");
  cpu::Mamba2Params<float> p;
  p.x = crows<float>(a.x);
  p.dt = crows<float>(a.dt);
  p.B = crows<float>(a.B);
  p.C = crows<float>(a.C);
  p.A_log = weight(op, "A_log", a.A_log, NH);
  p.D = weight(op, "D", a.D, NH);
  p.dt_bias = weight(op, "dt_bias", a.dt_bias, NH);
  p.dt_min = a.dt_min;
  p.dt_max = a.dt_max;
  p.n_heads = NH;
  p.head_dim = P;
  p.n_groups = G;
  p.d_state = N;
  p.chunk_size = a.chunk_size;
  check_state(op, "ssm", a.state, NH * P * N);
  p.y = rows<float>(a.y);
  p.threads = threads_;
  check_batch(op, batch, T, a.state.dim(0));
  if (cpu::single_token_batch(batch)) return cpu::mamba2_decode_step(a, batch, threads_);
  with_f32_state(a.state, batch, [&](float* st, std::span<const SeqSpan> seqs) {
    p.state = st;
    cpu::mamba2_ssd(p, seqs);
  });
  if (!a.z.empty())  // y *= silu(z), in place
    cpu::silu_mul_f32(crows<float>(a.z), crows<float>(a.y), rows<float>(a.y), T, NH * P, threads_);
}

// ---- Hybrid-model ops -------------------------------------------------------------------------------------------

void CpuBackend::attention(const AttentionArgs& a, const BatchLayout& batch) {
  const char* op = "attention";
  const int64_t NH = a.n_heads, KV = a.n_kv_heads, HD = a.head_dim;
  if (NH <= 0 || KV <= 0 || HD <= 0 || NH % KV != 0 || a.page_tokens <= 0)
    fail(op, ": bad sizes n_heads ", NH, ", n_kv_heads ", KV, ", head_dim ", HD, ", page_tokens ", a.page_tokens,
         " (all positive, n_kv_heads dividing n_heads)");
  if (a.q.ndim != 2) fail(op, ": q must be [T, n_heads * head_dim], found ", a.q.shape_string());
  const int64_t T = a.q.dim(0);
  check_act(op, "q", a.q, T, NH * HD);
  check_act(op, "k", a.k, T, KV * HD);
  check_act(op, "v", a.v, T, KV * HD);
  check_act(op, "out", a.out, T, NH * HD);
  for (const TensorView* in : {&a.q, &a.k, &a.v})
    if (overlaps(a.out, *in)) fail(op, ": out must not overlap q, k or v");
  if (a.cache.size() != batch.seqs.size())
    fail(op, ": ", a.cache.size(), " KV caches for ", batch.seqs.size(), " sequences");
  check_spans(op, batch, T);
  if (a.kv_dtype != DType::F32 && a.kv_dtype != DType::BF16)
    fail(op, ": KV pages must be f32 or bf16, found ", dtype_name(a.kv_dtype));
  for (size_t s = 0; s < a.cache.size(); ++s) {
    const int64_t need = a.cache[s].past + batch.seqs[s].len;
    if (a.cache[s].past < 0 || static_cast<int64_t>(a.cache[s].pages.size()) * a.page_tokens < need)
      fail(op, ": sequence ", s, " has ", a.cache[s].pages.size(), " pages of ", a.page_tokens, " rows for ", need,
           " positions");
  }
  cpu::AttentionParams<float> p;
  p.q = crows<float>(a.q);
  p.k = crows<float>(a.k);
  p.v = crows<float>(a.v);
  p.out = rows<float>(a.out);
  p.n_heads = NH;
  p.n_kv_heads = KV;
  p.head_dim = HD;
  p.page_tokens = a.page_tokens;
  p.scale = a.scale;
  p.threads = threads_;
  auto run = [&]<class P>() {
    std::vector<cpu::KvPages<P>> pages(a.cache.size());
    for (size_t s = 0; s < a.cache.size(); ++s) {
      for (void* pg : a.cache[s].pages) pages[s].pages.push_back(static_cast<P*>(pg));
      pages[s].past = a.cache[s].past;
    }
    cpu::attention<float, P>(p, std::span<const SeqSpan>(batch.seqs), std::span<const cpu::KvPages<P>>(pages));
  };
  if (a.kv_dtype == DType::BF16) run.template operator()<cpu::Bf16>();
  else run.template operator()<float>();
}

void CpuBackend::rope(TensorView x, int64_t n_heads, int64_t head_dim, int64_t rope_dim, double theta,
                      const std::vector<int64_t>& start_positions, const BatchLayout& batch) {
  const char* op = "rope";
  if (n_heads <= 0 || head_dim <= 0 || rope_dim < 2 || rope_dim % 2 != 0 || rope_dim > head_dim || !(theta > 0))
    fail(op, ": bad sizes n_heads ", n_heads, ", head_dim ", head_dim, ", rope_dim ", rope_dim, ", theta ", theta,
         " (rope_dim even in [2, head_dim], theta > 0)");
  if (x.ndim != 2) fail(op, ": x must be [T, n_heads * head_dim], found ", x.shape_string());
  check_act(op, "x", x, x.dim(0), n_heads * head_dim);
  if (start_positions.size() != batch.seqs.size())
    fail(op, ": ", start_positions.size(), " start positions for ", batch.seqs.size(), " sequences");
  check_spans(op, batch, x.dim(0));
  cpu::rope(rows<float>(x), n_heads, head_dim, rope_dim, theta, std::span<const SeqSpan>(batch.seqs),
            std::span<const int64_t>(start_positions), threads_);
}

void CpuBackend::relu2(TensorView x) {
  if (x.ndim != 2) fail("relu2: x must be [T, D], found ", x.shape_string());
  check_act("relu2", "x", x, x.dim(0), x.dim(1));
  cpu::relu2_f32(rows<float>(x), x.dim(0), x.dim(1), threads_);
}

void CpuBackend::silu_mul(const TensorView& gate, const TensorView& up, TensorView out) {
  if (gate.ndim != 2) fail("silu_mul: gate must be [T, D], found ", gate.shape_string());
  const int64_t T = gate.dim(0), D = gate.dim(1);
  check_act("silu_mul", "gate", gate, T, D);
  check_act("silu_mul", "up", up, T, D);
  check_act("silu_mul", "out", out, T, D);
  cpu::silu_mul_f32(crows<float>(gate), crows<float>(up), rows<float>(out), T, D, threads_);
}

void CpuBackend::scale(TensorView x, float alpha) {
  if (x.ndim != 2) fail("scale: x must be [T, D], found ", x.shape_string());
  check_act("scale", "x", x, x.dim(0), x.dim(1));
  cpu::scale_f32(rows<float>(x), alpha, x.dim(0), x.dim(1), threads_);
}

std::unique_ptr<Backend> make_cpu_backend(int threads) { return std::make_unique<CpuBackend>(threads); }

}  // namespace mambacpp
