// The GEMV of quantized weights (quant_ops.h): y = x . W^T (+ bias) for a few rows (decode), W in q8_0 or fp8 e4m3.
// One warp per output feature reads its row once, 16 stored bytes per lane per step (16 int8 quants, half a q8_0
// block, or 16 e4m3 values), converts them to f32 in registers (exact) and multiplies by up to 8 f32 activation rows
// held in L1/L2. Each row's sum has a fixed order that does not involve the other rows: per lane, per 16 elements
// a chain of fmaf from zero, then (q8_0) times the block scale into the lane's sum, or (fp8) added to it; the warp
// sum in shuffle order; fp8's channel scale last. So row t of a T-row call is the bits of a 1-row call, whatever T.
#include <cuda_fp16.h>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/quant_loads.cuh"
#include "backend/cuda/quant_ops.h"

namespace mambacpp::cuda {
namespace {

constexpr int kThreads = 256;  // 8 warps = 8 output features per block
constexpr int kFeaturesPerBlock = kThreads / 32;
constexpr int kMaxRowsPerLaunch = 8;

// VEC: cols % 16 == 0 (every row 16-byte aligned: the buffers come from cudaMalloc) and x 16-byte aligned with a
// stride that keeps it so; otherwise one element per lane per step. The choice depends on the shapes and x's
// layout, never on the row count.
template <bool FP8, int NT, bool VEC>
__global__ void __launch_bounds__(kThreads) quant_gemv_kernel(ConstF32Rows x, QuantMatrix w, DevWeight bias,
                                                             F32Rows y) {
  const int lane = threadIdx.x & 31;
  const int64_t o = blockIdx.x * int64_t(kFeaturesPerBlock) + (threadIdx.x >> 5);
  if (o >= w.rows) return;  // the whole warp leaves together
  const int64_t cols = w.cols;
  const uint8_t* wr = w.q + o * cols;
  const __half* d = FP8 ? nullptr : static_cast<const __half*>(w.scale) + o * (cols / 32);
  float acc[NT];
#pragma unroll
  for (int r = 0; r < NT; ++r) acc[r] = 0.0f;

  if constexpr (VEC) {
    const int64_t n_vec = cols / 16;
    const uint4* wv = reinterpret_cast<const uint4*>(wr);
#pragma unroll 4
    for (int64_t v = lane; v < n_vec; v += 32) {
      const uint4 raw = __ldg(wv + v);
      float wf[16];
      unpack_q16<FP8>(raw, wf);
      const float s = FP8 ? 1.0f : __half2float(d[v >> 1]);
#pragma unroll
      for (int r = 0; r < NT; ++r) {
        const float4* xp = reinterpret_cast<const float4*>(x.data + r * x.stride + v * 16);
        float part = 0.0f;
#pragma unroll
        for (int q = 0; q < 4; ++q) {
          const float4 xv = xp[q];
          part = __fmaf_rn(wf[4 * q], xv.x, part);
          part = __fmaf_rn(wf[4 * q + 1], xv.y, part);
          part = __fmaf_rn(wf[4 * q + 2], xv.z, part);
          part = __fmaf_rn(wf[4 * q + 3], xv.w, part);
        }
        acc[r] = FP8 ? __fadd_rn(acc[r], part) : __fmaf_rn(s, part, acc[r]);
      }
    }
  } else {
    for (int64_t i = lane; i < cols; i += 32) {
      const uint8_t b = wr[i];
      const float wf = FP8 ? e4m3_to_f(b) : static_cast<float>(static_cast<int8_t>(b));
      const float s = FP8 ? 1.0f : __half2float(d[i / 32]);
#pragma unroll
      for (int r = 0; r < NT; ++r) {
        const float part = __fmul_rn(wf, x.data[r * x.stride + i]);
        acc[r] = FP8 ? __fadd_rn(acc[r], part) : __fmaf_rn(s, part, acc[r]);
      }
    }
  }
#pragma unroll
  for (int r = 0; r < NT; ++r) acc[r] = warp_sum(acc[r]);
  if (lane == 0) {
    const float cs = FP8 ? static_cast<const float*>(w.scale)[w.per_tensor ? 0 : o] : 1.0f;
    const float b = bias.data ? load_f(bias.data, bias.dtype, o) : 0.0f;
#pragma unroll
    for (int r = 0; r < NT; ++r) y.data[r * y.stride + o] = __fadd_rn(FP8 ? __fmul_rn(cs, acc[r]) : acc[r], b);
  }
}

template <bool FP8, int NT>
void launch_rows(ConstF32Rows x, const QuantMatrix& w, DevWeight bias, F32Rows y, bool vec, cudaStream_t stream) {
  const unsigned blocks = static_cast<unsigned>((w.rows + kFeaturesPerBlock - 1) / kFeaturesPerBlock);
  if (vec)
    quant_gemv_kernel<FP8, NT, true><<<blocks, kThreads, 0, stream>>>(x, w, bias, y);
  else
    quant_gemv_kernel<FP8, NT, false><<<blocks, kThreads, 0, stream>>>(x, w, bias, y);
  MAMBACPP_CUDA_LAUNCHED();
}

template <bool FP8>
void launch_chunk(ConstF32Rows x, const QuantMatrix& w, DevWeight bias, F32Rows y, int64_t nt, bool vec,
                  cudaStream_t stream) {
  switch (nt) {
    case 1: launch_rows<FP8, 1>(x, w, bias, y, vec, stream); break;
    case 2: launch_rows<FP8, 2>(x, w, bias, y, vec, stream); break;
    case 3: launch_rows<FP8, 3>(x, w, bias, y, vec, stream); break;
    case 4: launch_rows<FP8, 4>(x, w, bias, y, vec, stream); break;
    case 5: launch_rows<FP8, 5>(x, w, bias, y, vec, stream); break;
    case 6: launch_rows<FP8, 6>(x, w, bias, y, vec, stream); break;
    case 7: launch_rows<FP8, 7>(x, w, bias, y, vec, stream); break;
    default: launch_rows<FP8, 8>(x, w, bias, y, vec, stream); break;
  }
}

}  // namespace

void launch_quant_gemv(ConstF32Rows x, const QuantMatrix& w, DevWeight bias, F32Rows y, int64_t T,
                       cudaStream_t stream) {
  if (T <= 0 || w.rows <= 0) return;
  if (is_kquant(w.format)) return launch_kquant_gemv(x, w, bias, y, T, stream);
  const bool vec = w.cols % 16 == 0 && reinterpret_cast<uintptr_t>(w.q) % 16 == 0 &&
                   reinterpret_cast<uintptr_t>(x.data) % 16 == 0 && x.stride % 4 == 0;
  const bool fp8 = w.format == WeightFormat::FP8_E4M3;
  for (int64_t t0 = 0; t0 < T; t0 += kMaxRowsPerLaunch) {
    const int64_t nt = T - t0 < kMaxRowsPerLaunch ? T - t0 : kMaxRowsPerLaunch;
    const ConstF32Rows xs{x.data + t0 * x.stride, x.stride};
    const F32Rows ys{y.data + t0 * y.stride, y.stride};
    if (fp8)
      launch_chunk<true>(xs, w, bias, ys, nt, vec, stream);
    else
      launch_chunk<false>(xs, w, bias, ys, nt, vec, stream);
  }
}

}  // namespace mambacpp::cuda
