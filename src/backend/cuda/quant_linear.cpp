// Quantized weights on the CUDA backend (layouts and kernels: quant_ops.h).
//
// adopt_packed: q8_0 rows are split at upload into the int8 quants and the f16 block scales (the same bytes in two
// arrays, so the GEMV reads 16 quants per 16-byte load); fp8 bytes and their f32 scales go up as they are; q4_k
// and q5_k blocks go up as they are (144 and 176 bytes: 16-byte aligned); q6_k blocks (210 bytes) are split into
// their four arrays.
// linear: up to kQuantGemvMaxRows rows, the GEMV that dequantizes in registers (exact products of the stored
// weights, f32 sums, a row's bits independent of the row count). More rows (prefill, large decode batches): the
// whole matrix is dequantized into a 16-bit scratch copy and the dense path runs on it (CudaBackend::linear: the
// hi/lo split of x and two tensor-core GEMMs, or fast precision's one). q8_0 goes to f16, where d * q rounds once
// (2^-12 relative; bf16 would cost 2^-9); fp8 goes to bf16 unscaled, which holds every e4m3 value exactly, and the
// channel scales are applied to the GEMM's output. q4_k, q5_k and q6_k go to f16 for the same reason as q8_0:
// their f32 values (up to 21, 22 and 23 significant bits) fit neither 16-bit type, and f16 rounds them 8x closer
// than bf16 would; the range is ggml's own (f16 super-block scales: every value of a weight matrix quantized from
// sane floats is far inside f16's 65504). The copy costs a read of the quantized bytes and a write and read of 2
// bytes per weight per call: negligible against the GEMMs of a prompt, a loss against the bf16 weights at batches of
// a few tens of rows.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/quant_ops.h"

namespace mambacpp {

using namespace cuda;

namespace {

// The device weight's arrays (adopt_packed made them).
QuantMatrix quant_matrix(const Weight& w, const char* op) {
  if ((w.format != WeightFormat::Q8_0 && w.format != WeightFormat::FP8_E4M3 && !is_kquant(w.format)) ||
      w.ndim != 2 || w.device() != Device::CUDA)
    fail(op, ": the CUDA backend runs 2-D q8_0, q4_k, q5_k, q6_k and fp8_e4m3 weights on the device, found ",
         w.describe(), " on ", device_name(w.device()));
  QuantMatrix q;
  q.format = w.format;
  q.rows = w.dim(0);
  q.cols = w.dim(1);
  q.q = static_cast<const uint8_t*>(w.data.data);
  if (w.format == WeightFormat::Q8_0) {
    q.scale = q.q + q.rows * q.cols;
  } else if (w.format == WeightFormat::FP8_E4M3) {
    if (w.scale.empty() || w.scale.dtype != DType::F32 || (w.scale.numel() != 1 && w.scale.numel() != q.rows))
      fail(op, ": fp8 weight ", w.describe(), " needs f32 scales [", q.rows, "] or [1], found ",
           w.scale.empty() ? std::string("none") : w.scale.shape_string());
    q.scale = w.scale.data;
    q.per_tensor = w.scale.numel() == 1 && q.rows != 1;
  }
  return q;
}

// q6_k: block b of row r is ql[128], qh[64], scales[16], d (2 bytes); to ql [rows, cols / 2], qh [rows, cols / 4],
// scales [rows, cols / 16], d [rows, cols / 256] (quant_ops.h), staged a few thousand rows at a time.
void upload_q6_k(CudaBackend& be, const Weight& host, uint8_t* dev) {
  const int64_t rows = host.dim(0), cols = host.dim(1), nb = cols / 256;
  const int64_t ql_row = nb * 128, qh_row = nb * 64, sc_row = nb * 16, d_row = nb * 2;
  uint8_t* dql = dev;
  uint8_t* dqh = dql + rows * ql_row;
  uint8_t* dsc = dqh + rows * qh_row;
  uint8_t* dd = dsc + rows * sc_row;
  const uint8_t* src = static_cast<const uint8_t*>(host.data.data);
  constexpr int64_t kPieceRows = 2048;  // bounds the host staging buffer
  std::vector<uint8_t> ql, qh, sc, d;
  for (int64_t r0 = 0; r0 < rows; r0 += kPieceRows) {
    const int64_t n = std::min(kPieceRows, rows - r0);
    ql.resize(static_cast<size_t>(n * ql_row));
    qh.resize(static_cast<size_t>(n * qh_row));
    sc.resize(static_cast<size_t>(n * sc_row));
    d.resize(static_cast<size_t>(n * d_row));
    for (int64_t r = 0; r < n; ++r)
      for (int64_t b = 0; b < nb; ++b) {
        const uint8_t* blk = src + ((r0 + r) * nb + b) * 210;
        std::memcpy(&ql[static_cast<size_t>(r * ql_row + b * 128)], blk, 128);
        std::memcpy(&qh[static_cast<size_t>(r * qh_row + b * 64)], blk + 128, 64);
        std::memcpy(&sc[static_cast<size_t>(r * sc_row + b * 16)], blk + 192, 16);
        std::memcpy(&d[static_cast<size_t>(r * d_row + b * 2)], blk + 208, 2);
      }
    be.copy_from_host(dql + r0 * ql_row, ql.data(), ql.size());
    be.copy_from_host(dqh + r0 * qh_row, qh.data(), qh.size());
    be.copy_from_host(dsc + r0 * sc_row, sc.data(), sc.size());
    be.copy_from_host(dd + r0 * d_row, d.data(), d.size());
  }
}

}  // namespace

bool CudaBackend::supports_weight_format(WeightFormat f) const {
  return is_dense(f) || f == WeightFormat::Q8_0 || f == WeightFormat::FP8_E4M3 || is_kquant(f);
}

Weight CudaBackend::adopt_packed(const Weight& host) {
  if (host.device() != Device::CPU) fail("adopt_matrix: expected a host weight, found one on ", device_name(host.device()));
  if ((host.format != WeightFormat::Q8_0 && host.format != WeightFormat::FP8_E4M3 && !is_kquant(host.format)) ||
      host.ndim != 2)
    fail(description(), ": quantized weights run as 2-D q8_0, q4_k, q5_k, q6_k or fp8_e4m3 matrices, found ",
         host.describe());
  if (!host.data.contiguous()) fail("adopt_matrix: ", host.describe(), " bytes are not contiguous");
  const int64_t rows = host.dim(0), cols = host.dim(1);
  const size_t bytes = host.nbytes();
  void* dev = allocate(std::max<size_t>(bytes, 1));
  owned_.push_back(dev);
  if (host.format == WeightFormat::FP8_E4M3) {
    const int64_t ns = host.scale.numel();
    if (host.scale.empty() || host.scale.dtype != DType::F32 || (ns != 1 && ns != rows) || !host.scale.contiguous())
      fail("adopt_matrix: fp8 weight ", host.describe(), " needs contiguous f32 scales [", rows, "] or [1], found ",
           host.scale.empty() ? std::string("none") : host.scale.shape_string() + " " + dtype_name(host.scale.dtype));
    copy_from_host(dev, host.data.data, bytes);
    void* s = allocate(static_cast<size_t>(ns) * 4);
    owned_.push_back(s);
    copy_from_host(s, host.scale.data, static_cast<size_t>(ns) * 4);
    return Weight::packed(host.format, dev, {rows, cols}, Device::CUDA, TensorView(s, DType::F32, {ns}, Device::CUDA));
  }
  if (host.format == WeightFormat::Q4_K || host.format == WeightFormat::Q5_K) {
    const int64_t bb = weight_format_info(host.format).block_bytes;  // 144 or 176: 16-byte multiples
    need(cols % 256 == 0 && static_cast<int64_t>(bytes) == rows * (cols / 256) * bb, "adopt_matrix: ",
         weight_format_name(host.format), " weight ", host.describe(), " must be whole ", bb,
         "-byte blocks of 256 elements per row, found ", bytes, " bytes");
    copy_from_host(dev, host.data.data, bytes);
    return Weight::packed(host.format, dev, {rows, cols}, Device::CUDA);
  }
  if (host.format == WeightFormat::Q6_K) {
    need(cols % 256 == 0 && static_cast<int64_t>(bytes) == rows * (cols / 256) * 210, "adopt_matrix: q6_k weight ",
         host.describe(), " must be whole 210-byte blocks of 256 elements per row, found ", bytes, " bytes");
    upload_q6_k(*this, host, static_cast<uint8_t*>(dev));
    return Weight::packed(host.format, dev, {rows, cols}, Device::CUDA);
  }
  // q8_0: block b of row r is d (2 bytes) then 32 quants; quants to [rows, cols], scales to [rows, cols / 32].
  const int64_t nb = cols / 32, row_bytes = nb * 34;
  constexpr int64_t kPieceRows = 4096;  // bounds the host staging buffer
  std::vector<uint8_t> quants, scales;
  const uint8_t* src = static_cast<const uint8_t*>(host.data.data);
  uint8_t* dq = static_cast<uint8_t*>(dev);
  uint8_t* ds = dq + rows * cols;
  for (int64_t r0 = 0; r0 < rows; r0 += kPieceRows) {
    const int64_t n = std::min(kPieceRows, rows - r0);
    quants.resize(static_cast<size_t>(n * cols));
    scales.resize(static_cast<size_t>(n * nb * 2));
    for (int64_t r = 0; r < n; ++r)
      for (int64_t b = 0; b < nb; ++b) {
        const uint8_t* blk = src + (r0 + r) * row_bytes + b * 34;
        std::memcpy(&scales[static_cast<size_t>((r * nb + b) * 2)], blk, 2);
        std::memcpy(&quants[static_cast<size_t>(r * cols + b * 32)], blk + 2, 32);
      }
    copy_from_host(dq + r0 * cols, quants.data(), quants.size());
    copy_from_host(ds + r0 * nb * 2, scales.data(), scales.size());
  }
  return Weight::packed(host.format, dev, {rows, cols}, Device::CUDA);
}

void CudaBackend::linear_quant(const TensorView& x, const Weight& w, const TensorView& bias, TensorView y) {
  const QuantMatrix q = quant_matrix(w, "linear");
  check_f32_2d(x, "linear: x");
  check_f32_2d(y, "linear: y");
  const int64_t T = x.dim(0), in = x.dim(1), out = q.rows;
  need(q.cols == in, "linear: w ", w.describe(), " does not take x ", x.shape_string());
  need(y.dim(0) == T && y.dim(1) == out, "linear: y ", y.shape_string(), ", expected [", T, ", ", out, "]");
  need(bias.empty() || bias.numel() == out, "linear: bias has ", bias.numel(), " elements, expected ", out);
  if (T == 0 || out == 0) return;
  const DevWeight b = bias.empty() ? DevWeight{} : weight(bias);
  if (T <= kQuantGemvMaxRows) {
    launch_quant_gemv(crows(x), q, b, rows(y), T, stream());
    return;
  }
  const bool fp8 = q.format == WeightFormat::FP8_E4M3;
  const DType dt = fp8 ? DType::BF16 : DType::F16;  // q8_0 and the k-quants: f16 (top of the file)
  void* dense = grow(Slot::kQuantDense, static_cast<size_t>(out * in) * 2);
  launch_quant_dequantize(q, dt, dense, stream());
  const TensorView dv(dense, dt, {out, in}, Device::CUDA);
  if (!fp8) {
    linear(x, Weight(dv), bias, y);
    return;
  }
  linear(x, Weight(dv), TensorView(), y);
  launch_scale_columns(rows(y), q, b, T, stream());
}

void CudaBackend::embed_quant(const Weight& table, const TensorView& ids, TensorView out) {
  const QuantMatrix q = quant_matrix(table, "embed");
  check_f32_2d(out, "embed: out");
  need(ids.dtype == DType::I32 && ids.numel() == out.dim(0), "embed: ids must be i32 [", out.dim(0), "], found ",
       dtype_name(ids.dtype), " ", ids.shape_string());
  need(q.cols == out.dim(1), "embed: table width ", q.cols, " != out width ", out.dim(1));
  launch_quant_embed(q, ids.ptr<const int32_t>(), out.dim(0), rows(out), stream());
}

}  // namespace mambacpp
