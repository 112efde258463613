#include "backend/cpu/packed_linear.h"

#include <vector>

#include "backend/cpu/thread_pool.h"
#include "core/ggml_blocks.h"
#include "mambacpp/error.h"

namespace mambacpp::cpu {

namespace {
const uint8_t* row_bytes(const Weight& w, int64_t r) {
  return static_cast<const uint8_t*>(w.data.data) + r * w.data.dim(1);
}
}  // namespace

void packed_linear_f32(Rows<const float> x, const Weight& w, WeightRef bias, Rows<float> y, int64_t T, int threads) {
  const int64_t out = w.dim(0), in = w.dim(1);
  // Rows of w per task: each is dequantized once and used for every token.
  parallel_for(threads, out, 8, [&](int64_t o0, int64_t o1) {
    std::vector<float> row(static_cast<size_t>(in));
    for (int64_t o = o0; o < o1; ++o) {
      ggml_dequantize_row(w.format, row_bytes(w, o), in, row.data());
      const double b = bias.present() ? weight_at<double>(bias, o) : 0.0;
      for (int64_t t = 0; t < T; ++t) {
        const float* xt = x[t];
        double acc = 0.0;
        for (int64_t i = 0; i < in; ++i) acc += static_cast<double>(xt[i]) * row[static_cast<size_t>(i)];
        y[t][o] = static_cast<float>(acc + b);
      }
    }
  });
}

void packed_embed_f32(const Weight& table, const int32_t* ids, Rows<float> out, int64_t T, int threads) {
  const int64_t V = table.dim(0), D = table.dim(1);
  for (int64_t t = 0; t < T; ++t)
    if (ids[t] < 0 || ids[t] >= V) fail("embed: token id ", ids[t], " is outside the vocabulary [0, ", V, ")");
  parallel_for(threads, T, 16, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) ggml_dequantize_row(table.format, row_bytes(table, ids[t]), D, out[t]);
  });
}

}  // namespace mambacpp::cpu

// CpuBackend's entry points for packed weights (declared in cpu_backend.h), checked here.
#include "backend/cpu/cpu_backend.h"

namespace mambacpp {

namespace {
void check_packed(const char* op, const Weight& w) {
  if (w.ndim != 2) fail(op, ": a ", weight_format_name(w.format), " weight must be 2-D, found ", w.shape_string());
  if (w.device() != Device::CPU) fail(op, ": weight must be on the CPU, found ", device_name(w.device()));
  if (w.format == WeightFormat::FP8_E4M3) fail(op, ": the CPU backend has no kernels for fp8_e4m3 weights");
  if (w.data.dtype != DType::U8 || w.data.ndim != 2 || w.data.dim(0) != w.dim(0) ||
      w.data.dim(1) != weight_row_bytes(w.format, w.dim(1), op))
    fail(op, ": ", w.describe(), " weight's bytes are ", w.data.shape_string(), "; expected [rows, row bytes]");
}
void check_rows(const char* op, const char* name, const TensorView& v, int64_t rows, int64_t cols) {
  if (v.empty() || v.device != Device::CPU || v.dtype != DType::F32 || v.ndim != 2 || v.dim(0) != rows ||
      v.dim(1) != cols || v.stride0() < cols)
    fail(op, ": ", name, " must be f32 [", rows, ", ", cols, "] on the CPU, found ", dtype_name(v.dtype), " ",
         v.shape_string());
}
}  // namespace

void CpuBackend::packed_linear(const TensorView& x, const Weight& w, const TensorView& bias, TensorView y) {
  check_packed("linear", w);
  if (x.ndim != 2) fail("linear: x must be 2-D, found ", x.shape_string());
  const int64_t T = x.dim(0), out = w.dim(0);
  check_rows("linear", "x", x, T, w.dim(1));
  check_rows("linear", "y", y, T, out);
  cpu::WeightRef b;
  if (!bias.empty()) {
    if (bias.numel() != out || !bias.contiguous() ||
        (bias.dtype != DType::F32 && bias.dtype != DType::F16 && bias.dtype != DType::BF16))
      fail("linear: bias must be f32/f16/bf16 of ", out, " elements, found ", dtype_name(bias.dtype), " ",
           bias.shape_string());
    b = {bias.data, bias.dtype};
  }
  cpu::packed_linear_f32({x.ptr<const float>(), x.stride0()}, w, b, {y.ptr<float>(), y.stride0()}, T, threads_);
}

void CpuBackend::packed_embed(const Weight& table, const TensorView& ids, TensorView out) {
  check_packed("embed", table);
  if (ids.dtype != DType::I32 || ids.ndim != 1) fail("embed: ids must be 1-D i32, found ", ids.shape_string());
  check_rows("embed", "out", out, ids.dim(0), table.dim(1));
  cpu::packed_embed_f32(table, ids.ptr<const int32_t>(), {out.ptr<float>(), out.stride0()}, ids.dim(0), threads_);
}

}  // namespace mambacpp
