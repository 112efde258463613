// CpuBackend::fused_linear (backend.h) for decode batches: the prologue RMSNorm over each norm group, the streaming
// GEMV of linear.cpp, or of packed_linear.cpp for block formats (W read once as stored), then the epilogue: the
// one-token conv1d + SiLU of the conv outputs from the row's slot of the conv state (f32 or bf16, shifted in place),
// the other outputs written to y or added to it, each GEMV task doing the epilogue of the columns it wrote. The
// prologue is serial (a few thousand elements); the GEMV is the one pool job.
#include <cmath>
#include <vector>

#include "backend/cpu/conv1d.h"
#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/cpu_ops.h"
#include "backend/cpu/packed_linear.h"
#include "backend/cpu/simd.h"
#include "mambacpp/error.h"

namespace mambacpp {
namespace {

using cpu::Rows;
using cpu::WeightRef;

bool f32_rows(const TensorView& v, int64_t rows, int64_t cols) {
  return v.device == Device::CPU && v.dtype == DType::F32 && v.ndim == 2 && v.dim(0) == rows && v.dim(1) == cols &&
         v.stride0() >= cols;
}
bool float_vector(const TensorView& v, int64_t n) {
  return v.device == Device::CPU && is_weight_float(v.dtype) && v.contiguous() && v.numel() == n;
}
WeightRef wref(const TensorView& v) { return v.empty() ? WeightRef{} : WeightRef{v.data, v.dtype}; }
// A block-format weight [out, in] as packed_linear.cpp runs it.
bool packed_ok(const Weight& w, int64_t in) {
  return w.format != WeightFormat::FP8_E4M3 && w.ndim == 2 && w.dim(1) == in && w.data.dtype == DType::U8 &&
         w.data.ndim == 2 && w.data.dim(0) == w.dim(0) && in % weight_format_info(w.format).block_elems == 0 &&
         w.data.dim(1) == weight_row_bytes(w.format, in);
}
// The streaming GEMV of linear.cpp or packed_linear.cpp, by the weight's format.
void gemv(Rows<const float> x, const Weight& w, const TensorView& bias, Rows<float> y, int64_t B, int64_t in,
          int64_t out, int threads, const cpu::LinearEpilogue& epilogue = {}) {
  if (w.dense()) cpu::linear_f32(x, wref(w.data), wref(bias), y, B, in, out, threads, epilogue);
  else cpu::packed_linear_f32(x, w, wref(bias), y, B, threads, epilogue);
}

// A weight vector as f32: in place when stored in f32, else widened into `buf`.
const float* f32_weight(const TensorView& v, int64_t n, std::vector<float>& buf) {
  if (v.dtype == DType::F32) return v.ptr<const float>();
  buf.resize(static_cast<size_t>(n));
  cpu::simd::to_f32(v.data, v.dtype, buf.data(), n);
  return buf.data();
}

// x[:] * rsqrt(mean over each group of x^2 + eps) * w, sums of squares in double (as rmsnorm_f32).
void group_rmsnorm(const float* x, const float* w, int64_t D, int64_t group, float eps, float* out) {
  for (int64_t c0 = 0; c0 < D; c0 += group) {
    double ss = 0.0;
    for (int64_t i = c0; i < c0 + group; ++i) ss += static_cast<double>(x[i]) * x[i];
    const float scale = static_cast<float>(1.0 / std::sqrt(ss / static_cast<double>(group) + eps));
    for (int64_t i = c0; i < c0 + group; ++i) out[i] = x[i] * scale * w[i];
  }
}

// One token of the causal depthwise conv + SiLU for C channels: x the new inputs, st the slot's [C, K-1] state
// (f32 or bf16), shifted by one in place; out = silu(bias + taps . [state, x]).
void conv_step(const float* x, const float* w, const float* bias, void* st, DType sdt, int64_t C, int64_t K,
               float* out) {
  const int64_t S = K - 1;
  auto* s32 = static_cast<float*>(st);
  auto* s16 = static_cast<uint16_t*>(st);
  for (int64_t c = 0; c < C; ++c) {
    float acc = bias ? bias[c] : 0.0f;
    const float* wc = w + c * K;
    for (int64_t k = 0; k < S; ++k) {
      const float v = sdt == DType::F32 ? s32[c * S + k] : bf16_to_f32(s16[c * S + k]);
      acc += wc[k] * v;
      if (k > 0) {  // shift left by one: entry k moves to k - 1
        if (sdt == DType::F32) s32[c * S + k - 1] = v;
        else s16[c * S + k - 1] = s16[c * S + k];
      }
    }
    acc += wc[S] * x[c];
    if (S > 0) {
      if (sdt == DType::F32) s32[c * S + S - 1] = x[c];
      else s16[c * S + S - 1] = f32_to_bf16(x[c]);
    }
    out[c] = acc;
  }
  cpu::simd::silu(out, out, C);
}

}  // namespace

bool CpuBackend::supports_fused_linear(const FusedLinearArgs& a, const BatchLayout& batch) const {
  const int64_t B = batch.total_tokens;
  if (B < 1 || static_cast<int64_t>(batch.seqs.size()) != B) return false;
  for (int64_t i = 0; i < B; ++i) {
    const SeqSpan& s = batch.seqs[static_cast<size_t>(i)];
    if (s.start != i || s.len != 1) return false;
  }
  if (a.x.ndim != 2 || a.w.data.ndim != 2 || !a.gate.empty()) return false;  // no gated prologue here
  if (a.x_scale != 1.0f || !a.out_scales.empty()) return false;  // no multipliers here: the plain ops apply them
  const int64_t in = a.x.dim(1), out = a.w.data.dim(0);
  if (!f32_rows(a.x, B, in) || !f32_rows(a.y, B, out) || !a.w.data.contiguous() || a.w.data.device != Device::CPU)
    return false;
  if (a.w.dense() ? (a.w.data.dim(1) != in || !is_weight_float(a.w.data.dtype))
                  : !packed_ok(a.w, in))
    return false;
  if (!a.bias.empty() && !float_vector(a.bias, out)) return false;
  if (!a.norm_w.empty() && (!float_vector(a.norm_w, in) || a.norm_group < 0 ||
                            (a.norm_group > 0 && in % a.norm_group != 0)))
    return false;
  if (a.conv_w.empty()) return true;
  const int64_t C = a.conv_w.dim(0), K = a.conv_w.dim(a.conv_w.ndim - 1);
  if (a.conv_w.ndim < 2 || K < 1 || K > cpu::kConvMaxKernel || !float_vector(a.conv_w, C * K)) return false;
  if (a.conv_begin < 0 || a.conv_begin + C > out || !f32_rows(a.conv_out, B, C)) return false;
  if (!a.conv_bias.empty() && !float_vector(a.conv_bias, C)) return false;
  const TensorView& st = a.conv_state;
  if (st.empty() || (st.dtype != DType::F32 && st.dtype != DType::BF16) || !st.contiguous() ||
      st.row_size() != C * (K - 1))
    return false;
  for (const SeqSpan& s : batch.seqs)
    if (s.slot < 0 || s.slot >= st.dim(0)) return false;
  return true;
}

void CpuBackend::fused_linear(const FusedLinearArgs& a, const BatchLayout& batch) {
  if (!supports_fused_linear(a, batch))
    fail("fused_linear: arguments the CPU backend does not take (x ", a.x.shape_string(), ", w ", a.w.data.shape_string(),
         " ", dtype_name(a.w.data.dtype), ", y ", a.y.shape_string(), ", ", batch.total_tokens,
         " rows); ask supports_fused_linear first");
  const int64_t B = batch.total_tokens, in = a.x.dim(1), out = a.w.data.dim(0);
  Rows<const float> x{a.x.ptr<const float>(), a.x.stride0()};
  thread_local std::vector<float> xn, ys, wbuf, bbuf;
  if (!a.norm_w.empty()) {
    xn.resize(static_cast<size_t>(B * in));
    const float* w = f32_weight(a.norm_w, in, wbuf);
    for (int64_t i = 0; i < B; ++i)
      group_rmsnorm(x[i], w, in, a.norm_group > 0 ? a.norm_group : in, a.eps, xn.data() + i * in);
    x = {xn.data(), in};
  }
  Rows<float> y{a.y.ptr<float>(), a.y.stride0()};
  if (a.conv_w.empty() && !a.accumulate) {
    gemv(x, a.w, a.bias, y, B, in, out, threads_);
    return;
  }
  // The epilogue runs in the GEMV's tasks, on the columns each has just written: the conv step and the residual add
  // were ~2% of a mamba2-130m decode step on the calling thread alone, the other thread waiting.
  ys.resize(static_cast<size_t>(B * out));
  const int64_t C = a.conv_w.empty() ? 0 : a.conv_w.dim(0), c0 = a.conv_begin, c1 = c0 + C;
  const int64_t K = C ? a.conv_w.dim(a.conv_w.ndim - 1) : 0, S = K - 1;
  thread_local std::vector<float> cw, cb;
  const float* w = C ? f32_weight(a.conv_w, C * K, cw) : nullptr;
  const float* b = C && !a.conv_bias.empty() ? f32_weight(a.conv_bias, C, cb) : nullptr;
  const size_t state_elem = C ? dtype_size(a.conv_state.dtype) : 0;
  const float* yg = ys.data();  // ys is this thread's: the tasks on the pool's threads read it through this pointer
  auto epilogue = [&](int64_t o0, int64_t n) {
    const int64_t o1 = o0 + n;
    for (int64_t i = 0; i < B; ++i) {
      const float* r = yg + i * out;
      float* yi = y[i];
      auto write = [&](int64_t lo, int64_t hi) {
        for (int64_t o = lo; o < hi; ++o) yi[o] = a.accumulate ? yi[o] + r[o] : r[o];
      };
      write(o0, std::min(o1, std::max(o0, c0)));  // columns before the conv's
      write(std::max(o0, std::min(o1, c1)), o1);  // and after them
      const int64_t lo = std::max(o0, c0), hi = std::min(o1, c1);
      if (lo >= hi) continue;
      const int64_t ch = lo - c0;  // the conv's channels [ch, ch + hi - lo)
      char* slot = static_cast<char*>(a.conv_state.data) +
                   static_cast<size_t>(batch.seqs[static_cast<size_t>(i)].slot * C * S) * state_elem;
      conv_step(r + lo, w + ch * K, b ? b + ch : nullptr, slot + static_cast<size_t>(ch * S) * state_elem,
                a.conv_state.dtype, hi - lo, K, a.conv_out.ptr<float>() + i * a.conv_out.stride0() + ch);
    }
  };
  gemv(x, a.w, a.bias, {ys.data(), out}, B, in, out, threads_, epilogue);
}

}  // namespace mambacpp
