// The GEMV of q4_k / q5_k / q6_k weights (quant_ops.h): y = x . W^T (+ bias) for a few rows (decode).
// One warp per output feature; lane l takes the 64-element units l, l + 32, ... of its row (quant_loads.cuh: 16-byte
// loads of the quant bytes), dequantizes each unit in registers exactly as ggml does, and multiplies it by up to 8 f32
// activation rows held in L1/L2. Each row's sum has a fixed order that does not involve the other rows: per lane, per
// unit a chain of fmaf from zero over its 64 elements (group by group), added to the lane's sum; then the warp sum in
// shuffle order and the bias. So row t of a T-row call is the bits of a 1-row call, whatever T.
#include <cuda_fp16.h>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/quant_loads.cuh"
#include "backend/cuda/quant_ops.h"
#include "mambacpp/error.h"

namespace mambacpp::cuda {
namespace {

constexpr int kThreads = 256;  // 8 warps = 8 output features per block
constexpr int kFeaturesPerBlock = kThreads / 32;
constexpr int kMaxRowsPerLaunch = 8;

// Blocks per SM asked of the register allocator. At a few rows the kernel is bound by the latency of its weight loads
// (each lane has one or two units of a row to fetch), so it needs many warps in flight: 4 blocks (32 warps, <= 64
// registers) at 1 row, the batch-1 decode; more rows hold more sums (3 blocks at 2 rows, 2 beyond: <= 80 / 128
// registers, a few spilled words at most, in L1).
template <int NT>
inline constexpr int kMinBlocks = NT == 1 ? 4 : (NT == 2 ? 3 : 2);

// Row r's products with group G of a decoded unit, chained onto part (elements in order).
template <bool XVEC>
__device__ __forceinline__ float kq_dot16(const float* wv, const float* xg, float part) {
#pragma unroll
  for (int q = 0; q < 4; ++q) {
    float4 xv;
    if constexpr (XVEC) {
      xv = *reinterpret_cast<const float4*>(xg + 4 * q);
    } else {
      const float* p = xg + 4 * q;
      xv = make_float4(p[0], p[1], p[2], p[3]);
    }
    part = __fmaf_rn(wv[4 * q], xv.x, part);
    part = __fmaf_rn(wv[4 * q + 1], xv.y, part);
    part = __fmaf_rn(wv[4 * q + 2], xv.z, part);
    part = __fmaf_rn(wv[4 * q + 3], xv.w, part);
  }
  return part;
}

template <WeightFormat F, int G, int NT, bool XVEC>
__device__ __forceinline__ void kq_group_rows(const KqUnitRaw<F>& raw, ConstF32Rows x, int64_t p0, float* part) {
  float wf[16];
  kq_group<F, G>(raw, wf);
#pragma unroll
  for (int r = 0; r < NT; ++r)
    part[r] = kq_dot16<XVEC>(wf, x.data + r * x.stride + p0 + G * kq_group_stride<F>, part[r]);
}

// XVEC: x 16-byte aligned with a stride that keeps it so (float4 loads); otherwise scalar loads, the same sums. The
// choice depends on x's layout, never on the row count. The unit's bytes are loaded first, then decoded 16 elements
// (a group) at a time, so only one group's floats live in registers; each row's chain still runs over the unit's 64
// elements in order, so the sums are those of decoding the whole unit first.
template <WeightFormat F, int NT, bool XVEC>
__global__ void __launch_bounds__(kThreads, kMinBlocks<NT>) kquant_gemv_kernel(ConstF32Rows x, QuantMatrix w,
                                                                              DevWeight bias, F32Rows y) {
  const int lane = threadIdx.x & 31;
  const int64_t o = blockIdx.x * int64_t(kFeaturesPerBlock) + (threadIdx.x >> 5);
  if (o >= w.rows) return;  // the whole warp leaves together
  const int n_units = static_cast<int>(w.cols / kKqUnitElems);
  float acc[NT];
#pragma unroll
  for (int r = 0; r < NT; ++r) acc[r] = 0.0f;
  for (int u = lane; u < n_units; u += 32) {
    KqUnitRaw<F> raw;
    kq_unit_load<F>(w, o, u, raw);
    const int64_t p0 = kq_unit_pos<F>(u);
    float part[NT];
#pragma unroll
    for (int r = 0; r < NT; ++r) part[r] = 0.0f;
    kq_group_rows<F, 0, NT, XVEC>(raw, x, p0, part);
    kq_group_rows<F, 1, NT, XVEC>(raw, x, p0, part);
    kq_group_rows<F, 2, NT, XVEC>(raw, x, p0, part);
    kq_group_rows<F, 3, NT, XVEC>(raw, x, p0, part);
#pragma unroll
    for (int r = 0; r < NT; ++r) acc[r] = __fadd_rn(acc[r], part[r]);
  }
#pragma unroll
  for (int r = 0; r < NT; ++r) acc[r] = warp_sum(acc[r]);
  if (lane == 0) {
    const float b = bias.data ? load_f(bias.data, bias.dtype, o) : 0.0f;
#pragma unroll
    for (int r = 0; r < NT; ++r) y.data[r * y.stride + o] = __fadd_rn(acc[r], b);
  }
}

template <WeightFormat F, int NT>
void launch_rows(ConstF32Rows x, const QuantMatrix& w, DevWeight bias, F32Rows y, bool xvec, cudaStream_t stream) {
  const unsigned blocks = static_cast<unsigned>((w.rows + kFeaturesPerBlock - 1) / kFeaturesPerBlock);
  if (xvec)
    kquant_gemv_kernel<F, NT, true><<<blocks, kThreads, 0, stream>>>(x, w, bias, y);
  else
    kquant_gemv_kernel<F, NT, false><<<blocks, kThreads, 0, stream>>>(x, w, bias, y);
  MAMBACPP_CUDA_LAUNCHED();
}

template <WeightFormat F>
void launch_chunk(ConstF32Rows x, const QuantMatrix& w, DevWeight bias, F32Rows y, int64_t nt, bool xvec,
                  cudaStream_t stream) {
  switch (nt) {
    case 1: launch_rows<F, 1>(x, w, bias, y, xvec, stream); break;
    case 2: launch_rows<F, 2>(x, w, bias, y, xvec, stream); break;
    case 3: launch_rows<F, 3>(x, w, bias, y, xvec, stream); break;
    case 4: launch_rows<F, 4>(x, w, bias, y, xvec, stream); break;
    case 5: launch_rows<F, 5>(x, w, bias, y, xvec, stream); break;
    case 6: launch_rows<F, 6>(x, w, bias, y, xvec, stream); break;
    case 7: launch_rows<F, 7>(x, w, bias, y, xvec, stream); break;
    default: launch_rows<F, 8>(x, w, bias, y, xvec, stream); break;
  }
}

}  // namespace

void launch_kquant_gemv(ConstF32Rows x, const QuantMatrix& w, DevWeight bias, F32Rows y, int64_t T,
                        cudaStream_t stream) {
  if (T <= 0 || w.rows <= 0) return;
  MAMBACPP_ASSERT(is_kquant(w.format) && w.cols % 256 == 0 && reinterpret_cast<uintptr_t>(w.q) % 16 == 0);
  const bool xvec = reinterpret_cast<uintptr_t>(x.data) % 16 == 0 && x.stride % 4 == 0;
  for (int64_t t0 = 0; t0 < T; t0 += kMaxRowsPerLaunch) {
    const int64_t nt = T - t0 < kMaxRowsPerLaunch ? T - t0 : kMaxRowsPerLaunch;
    const ConstF32Rows xs{x.data + t0 * x.stride, x.stride};
    const F32Rows ys{y.data + t0 * y.stride, y.stride};
    switch (w.format) {
      case WeightFormat::Q6_K: launch_chunk<WeightFormat::Q6_K>(xs, w, bias, ys, nt, xvec, stream); break;
      case WeightFormat::Q5_K: launch_chunk<WeightFormat::Q5_K>(xs, w, bias, ys, nt, xvec, stream); break;
      default: launch_chunk<WeightFormat::Q4_K>(xs, w, bias, ys, nt, xvec, stream); break;
    }
  }
}

}  // namespace mambacpp::cuda
