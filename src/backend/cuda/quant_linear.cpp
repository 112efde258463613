// Quantized weights on the CUDA backend (layouts and kernels: quant_ops.h).
//
// adopt_packed: q8_0 rows are split at upload into the int8 quants and the f16 block scales (the same bytes in two
// arrays, so the GEMV reads 16 quants per 16-byte load); fp8 bytes and their f32 scales go up as they are.
// linear: up to kQuantGemvMaxRows rows, the GEMV that dequantizes in registers (exact products of the stored
// weights, f32 sums, a row's bits independent of the row count). More rows (prefill, large decode batches): the
// whole matrix is dequantized into a 16-bit scratch copy and the dense path runs on it (CudaBackend::linear: the
// hi/lo split of x and two tensor-core GEMMs, or fast precision's one). q8_0 goes to f16, where d * q rounds once
// (2^-12 relative; bf16 would cost 2^-9); fp8 goes to bf16 unscaled, which holds every e4m3 value exactly, and the
// channel scales are applied to the GEMM's output. The copy costs a read of the quantized bytes and a write and read
// of 2 bytes per weight per call: negligible against the GEMMs of a prompt, a loss against the bf16 weights at
// batches of a few tens of rows.
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
  if ((w.format != WeightFormat::Q8_0 && w.format != WeightFormat::FP8_E4M3) || w.ndim != 2 ||
      w.device() != Device::CUDA)
    fail(op, ": the CUDA backend runs 2-D q8_0 and fp8_e4m3 weights on the device, found ", w.describe(), " on ",
         device_name(w.device()));
  QuantMatrix q;
  q.format = w.format;
  q.rows = w.dim(0);
  q.cols = w.dim(1);
  q.q = static_cast<const uint8_t*>(w.data.data);
  if (w.format == WeightFormat::Q8_0) {
    q.scale = q.q + q.rows * q.cols;
  } else {
    if (w.scale.empty() || w.scale.dtype != DType::F32 || (w.scale.numel() != 1 && w.scale.numel() != q.rows))
      fail(op, ": fp8 weight ", w.describe(), " needs f32 scales [", q.rows, "] or [1], found ",
           w.scale.empty() ? std::string("none") : w.scale.shape_string());
    q.scale = w.scale.data;
    q.per_tensor = w.scale.numel() == 1 && q.rows != 1;
  }
  return q;
}

}  // namespace

bool CudaBackend::supports_weight_format(WeightFormat f) const {
  return is_dense(f) || f == WeightFormat::Q8_0 || f == WeightFormat::FP8_E4M3;
}

Weight CudaBackend::adopt_packed(const Weight& host) {
  if (host.device() != Device::CPU) fail("adopt_matrix: expected a host weight, found one on ", device_name(host.device()));
  if ((host.format != WeightFormat::Q8_0 && host.format != WeightFormat::FP8_E4M3) || host.ndim != 2)
    fail(description(), ": quantized weights run as 2-D q8_0 or fp8_e4m3 matrices, found ", host.describe());
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
  const DType dt = fp8 ? DType::BF16 : DType::F16;
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
