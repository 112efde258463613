#include "backend/cpu/decode_steps.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "backend/cpu/simd.h"
#include "backend/cpu/thread_pool.h"

namespace mambacpp::cpu {
namespace {

// A weight vector as f32: in place when stored in f32, else widened into `buf`.
const float* f32_weight(const TensorView& v, int64_t n, std::vector<float>& buf) {
  if (v.dtype == DType::F32) return v.ptr<const float>();
  buf.resize(static_cast<size_t>(n));
  simd::to_f32(v.data, v.dtype, buf.data(), n);
  return buf.data();
}

char* slot_ptr(const TensorView& state, int64_t slot) {
  return static_cast<char*>(state.data) +
         static_cast<size_t>(slot) * static_cast<size_t>(state.row_size()) * dtype_size(state.dtype);
}

}  // namespace

bool single_token_batch(const BatchLayout& batch) {
  for (const SeqSpan& s : batch.seqs)
    if (s.len != 1) return false;
  return !batch.seqs.empty();
}

void mamba2_decode_step(const Mamba2ScanArgs& a, const BatchLayout& batch, int threads) {
  const int64_t NH = a.n_heads, P = a.head_dim, G = a.n_groups, N = a.d_state;
  std::vector<float> bufa, bufd, bufb;
  const float* A_log = f32_weight(a.A_log, NH, bufa);
  const float* Dw = f32_weight(a.D, NH, bufd);
  const float* dtb = f32_weight(a.dt_bias, NH, bufb);
  const DType sdt = a.state.dtype;
  const size_t head_bytes = static_cast<size_t>(P * N) * dtype_size(sdt);
  const int64_t n_seqs = static_cast<int64_t>(batch.seqs.size());
  auto row = [](const TensorView& v, int64_t t) { return v.ptr<const float>() + t * v.stride0(); };
  parallel_for(threads, n_seqs * NH, 2, [&](int64_t i0, int64_t i1) {
    std::vector<float> gate(static_cast<size_t>(P));
    for (int64_t i = i0; i < i1; ++i) {
      const SeqSpan& s = batch.seqs[static_cast<size_t>(i / NH)];
      const int64_t h = i % NH, g = h / (NH / G), t = s.start;
      const float raw = row(a.dt, t)[h] + dtb[h];
      const float dt = std::clamp(raw > 20.0f ? raw : std::log1p(std::exp(raw)), a.dt_min, a.dt_max);
      const float dA = std::exp(dt * -std::exp(A_log[h]));
      float* y = a.y.ptr<float>() + t * a.y.stride0() + h * P;
      simd::ssd_step_head(slot_ptr(a.state, s.slot) + static_cast<size_t>(h) * head_bytes, sdt, row(a.x, t) + h * P,
                          row(a.B, t) + g * N, row(a.C, t) + g * N, dt, dA, Dw[h], P, N, y);
      if (!a.z.empty()) {
        simd::silu(row(a.z, t) + h * P, gate.data(), P);
        for (int64_t k = 0; k < P; ++k) y[k] *= gate[static_cast<size_t>(k)];
      }
    }
  });
}

void mamba1_decode_step(const Mamba1ScanArgs& a, const BatchLayout& batch, int threads, const float* A) {
  const int64_t DI = a.x.dim(1), N = a.A_log.dim(1), R = a.dt_proj.empty() ? 0 : a.dt_proj.dim(1);
  std::vector<float> bufd, bufb;
  const float* Dw = f32_weight(a.D, DI, bufd);
  const float* dtb = f32_weight(a.dt_bias, DI, bufb);
  constexpr int64_t kChannels = 64;  // per task: its A_log rows and state rows are a few KB
  const int64_t n_blocks = (DI + kChannels - 1) / kChannels, n_seqs = static_cast<int64_t>(batch.seqs.size());
  const size_t row_bytes = static_cast<size_t>(N) * dtype_size(a.state.dtype);
  auto row = [](const TensorView& v, int64_t t) { return v.ptr<const float>() + t * v.stride0(); };
  parallel_for(threads, n_seqs * n_blocks, 2, [&](int64_t i0, int64_t i1) {
    std::vector<float> abuf;
    float dt_rows[kChannels];
    for (int64_t i = i0; i < i1; ++i) {
      const SeqSpan& s = batch.seqs[static_cast<size_t>(i / n_blocks)];
      const int64_t c0 = (i % n_blocks) * kChannels, nc = std::min(kChannels, DI - c0), t = s.start;
      const float* dt = row(a.dt, t) + c0;
      if (R > 0) {  // this block's dt_proj rows: nc x dt_rank, a few KB
        simd::dot_rows(row(a.dt, t),
                       static_cast<const char*>(a.dt_proj.data) + static_cast<size_t>(c0 * R) * dtype_size(a.dt_proj.dtype),
                       a.dt_proj.dtype, R, nc, dt_rows);
        dt = dt_rows;
      }
      void* h = slot_ptr(a.state, s.slot) + static_cast<size_t>(c0) * row_bytes;
      float* y = a.y.ptr<float>() + t * a.y.stride0() + c0;
      if (A) {
        simd::mamba1_step_a(h, a.state.dtype, row(a.x, t) + c0, dt, dtb + c0, A + c0 * N, row(a.B, t), row(a.C, t),
                            Dw + c0, row(a.z, t) + c0, nc, N, y);
        continue;
      }
      const float* A_log = a.A_log.ptr<const float>() + c0 * N;
      if (a.A_log.dtype != DType::F32) {
        abuf.resize(static_cast<size_t>(nc * N));
        simd::to_f32(static_cast<const char*>(a.A_log.data) + static_cast<size_t>(c0 * N) * dtype_size(a.A_log.dtype),
                     a.A_log.dtype, abuf.data(), nc * N);
        A_log = abuf.data();
      }
      simd::mamba1_step(h, a.state.dtype, row(a.x, t) + c0, dt, dtb + c0, A_log, row(a.B, t), row(a.C, t), Dw + c0,
                        row(a.z, t) + c0, nc, N, y);
    }
  });
}

}  // namespace mambacpp::cpu
