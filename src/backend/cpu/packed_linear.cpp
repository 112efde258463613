#include "backend/cpu/packed_linear.h"

#include <algorithm>
#include <vector>

#include "hwy/aligned_allocator.h"

#include "backend/cpu/gemm.h"
#include "backend/cpu/linear_shares.h"
#include "backend/cpu/packed_kernels.h"
#include "backend/cpu/thread_pool.h"
#include "core/fp8.h"
#include "mambacpp/error.h"

namespace mambacpp::cpu {

namespace {

const uint8_t* row_bytes(const Weight& w, int64_t r) {
  return static_cast<const uint8_t*>(w.data.data) + r * w.data.dim(1);
}

// Q8_0 / Q4_K / Q6_K: each token's activations rounded to int8 once (packed_kernels.h), then every token count runs
// the decode loop: a thread's share of the rows, a block of rows at a time, the tokens four at a time against the
// block while its bytes are in cache. A token's operations are the same in every group (packed_kernels.h), so its
// outputs do not depend on the batch or the split.
void packed_linear_int8(Rows<const float> x, const Weight& w, WeightRef bias, Rows<float> y, int64_t T, int threads,
                        const LinearEpilogue& epilogue) {
  const int64_t out = w.dim(0), in = w.dim(1), rb = w.data.dim(1);
  const int64_t ab = simd::packed_act_bytes(w.format, in);
  thread_local std::vector<uint8_t> xbuf;
  if (static_cast<int64_t>(xbuf.size()) < T * ab) xbuf.resize(static_cast<size_t>(T * ab));
  uint8_t* xq = xbuf.data();
  const auto quantize = [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) simd::packed_quantize_act(x[t], w.format, in, xq + t * ab);
  };
  if (T <= kStreamTokens) quantize(0, T);
  else parallel_for(threads, T, 16, quantize);

  const int64_t n_blocks = (out + kRowsPerBlock - 1) / kRowsPerBlock;
  const int64_t grain = std::max<int64_t>(1, (kMinShareBytes + kRowsPerBlock * rb - 1) / (kRowsPerBlock * rb));
  const int64_t parts = std::max<int64_t>(1, std::min<int64_t>(n_blocks / grain, threads * kSharesPerThread));
  parallel_tasks(threads, parts, [&](int64_t part) {
    const int64_t b0 = n_blocks * part / parts, b1 = n_blocks * (part + 1) / parts;
    const int64_t o0 = b0 * kRowsPerBlock, nr = std::min(b1 * kRowsPerBlock, out) - o0;
    for (int64_t r0 = o0; r0 < o0 + nr; r0 += kRowsPerBlock) {
      const int64_t m = std::min(kRowsPerBlock, o0 + nr - r0);
      simd::packed_dot_rows_int8(xq, ab, T, row_bytes(w, r0), w.format, in, m, y[0] + r0, y.stride);
      for (int64_t t = 0; t < T; ++t) add_bias(bias, r0, m, y[t] + r0);
    }
    if (epilogue) epilogue(o0, nr);
  });
}

}  // namespace

void packed_linear_f32(Rows<const float> x, const Weight& w, WeightRef bias, Rows<float> y, int64_t T, int threads,
                       const LinearEpilogue& epilogue) {
  if (simd::packed_int8(w.format)) return packed_linear_int8(x, w, bias, y, T, threads, epilogue);
  const int64_t out = w.dim(0), in = w.dim(1), rb = w.data.dim(1);
  const int64_t n_blocks = (out + kRowsPerBlock - 1) / kRowsPerBlock;

  if (T <= kStreamTokens) {
    const int64_t grain = std::max<int64_t>(1, (kMinShareBytes + kRowsPerBlock * rb - 1) / (kRowsPerBlock * rb));
    const int64_t parts = std::max<int64_t>(1, std::min<int64_t>(n_blocks / grain, threads * kSharesPerThread));
    parallel_tasks(threads, parts, [&](int64_t part) {
      const int64_t b0 = n_blocks * part / parts, b1 = n_blocks * (part + 1) / parts;
      const int64_t o0 = b0 * kRowsPerBlock, nr = std::min(b1 * kRowsPerBlock, out) - o0;
      // Token by token over a block of rows at a time: the block's bytes stay in cache for the next token.
      for (int64_t r0 = o0; r0 < o0 + nr; r0 += kRowsPerBlock) {
        const int64_t m = std::min(kRowsPerBlock, o0 + nr - r0);
        for (int64_t t = 0; t < T; ++t) {
          simd::packed_dot_rows(x[t], row_bytes(w, r0), w.format, in, m, y[t] + r0);
          add_bias(bias, r0, m, y[t] + r0);
        }
      }
      if (epilogue) epilogue(o0, nr);
    });
    return;
  }

  // Prefill, as linear_f32's: x packed once; W in L2-sized panels, each dequantized and packed by the task using it.
  const int64_t Kp = simd::packed_row_floats(in), MR = simd::gemm_tile_tokens(), NR = simd::gemm_tile_rows();
  const int64_t Tp = (T + MR - 1) / MR * MR;
  thread_local AlignedFloats xbuf;
  float* xp = xbuf.get(Tp * Kp);
  parallel_for(threads, T, 16, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) simd::pack_rows(x[t], DType::F32, 0, 1, in, xp + t * Kp);
  });
  std::fill(xp + T * Kp, xp + Tp * Kp, 0.0f);
  const int64_t panel = std::max(NR, kPanelBytes / (Kp * static_cast<int64_t>(sizeof(float))) / NR * NR);
  const int64_t n_panels = (out + panel - 1) / panel;
  const int64_t n_ranges = n_panels >= 2 * threads ? 1 : std::max<int64_t>(1, std::min<int64_t>(threads, Tp / MR));
  const int64_t range = (Tp / MR + n_ranges - 1) / n_ranges * MR;
  parallel_for(threads, n_panels * n_ranges, 1, [&](int64_t task0, int64_t task1) {
    thread_local AlignedFloats wbuf, dbuf;
    for (int64_t task = task0; task < task1; ++task) {
      const int64_t p = task / n_ranges, t0 = (task % n_ranges) * range;
      if (t0 >= T) continue;
      const int64_t o0 = p * panel, nr = std::min(panel, out - o0), nrp = (nr + NR - 1) / NR * NR;
      const int64_t nt = std::min(range, T - t0);
      float* rows = dbuf.get(nr * in);
      simd::packed_dequantize_rows(row_bytes(w, o0), w.format, in, nr, rows, in);
      float* wp = wbuf.get(nrp * Kp);
      simd::pack_rows(rows, DType::F32, in, nr, in, wp);
      std::fill(wp + nr * Kp, wp + nrp * Kp, 0.0f);
      simd::gemm_packed(xp + t0 * Kp, nt, wp, nr, in, y[t0] + o0, y.stride);
      for (int64_t t = t0; t < t0 + nt; ++t) add_bias(bias, o0, nr, y[t] + o0);
    }
  });
  if (epilogue) epilogue(0, out);
}

void packed_embed_f32(const Weight& table, const int32_t* ids, Rows<float> out, int64_t T, int threads) {
  const int64_t V = table.dim(0), D = table.dim(1);
  for (int64_t t = 0; t < T; ++t)
    if (ids[t] < 0 || ids[t] >= V) fail("embed: token id ", ids[t], " is outside the vocabulary [0, ", V, ")");
  parallel_for(threads, T, 16, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) simd::packed_dequantize_rows(row_bytes(table, ids[t]), table.format, D, 1, out[t], D);
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

Weight CpuBackend::adopt_matrix(const Weight& host) {
  if (host.format != WeightFormat::FP8_E4M3) return Backend::adopt_matrix(host);
  if (host.device() != Device::CPU) fail("adopt_matrix: expected a host weight, found one on ", device_name(host.device()));
  const int64_t cols = host.dim(host.ndim - 1), rows = host.numel() / std::max<int64_t>(cols, 1);
  if (host.scale.dtype != DType::F32 || (host.scale.numel() != rows && host.scale.numel() != 1) ||
      host.data.dim(0) != rows || !host.data.contiguous())
    fail("adopt_matrix: fp8 weight ", host.describe(), " needs contiguous bytes and f32 scales [", rows,
         "] or [1], found ", dtype_name(host.scale.dtype), " ", host.scale.shape_string());
  std::vector<float> values(static_cast<size_t>(rows * cols));
  fp8_dequantize_rows(host.data.ptr<const uint8_t>(), rows, cols, host.scale.ptr<const float>(),
                      host.scale.numel() == 1 && rows > 1, values.data());
  Weight w = host;
  w.format = WeightFormat::F32;
  w.data = TensorView(values.data(), DType::F32, {rows, cols});
  w.data.ndim = host.ndim;
  for (int d = 0; d < host.ndim; ++d) w.data.shape[static_cast<size_t>(d)] = host.dim(d);
  w.scale = TensorView();
  std::lock_guard<std::mutex> lock(dequantized_mutex_);
  dequantized_.push_back(std::move(values));  // the vector's buffer stays where it is
  return w;
}

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
