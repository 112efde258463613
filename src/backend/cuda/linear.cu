// Kernels of the linear layer (the cuBLAS calls are in cuda_backend.cpp):
// - gemv: y = x . w^T (+ bias) for a few rows (decode: T = number of sequences). One warp per output feature reads
//   its weight row once with 16-byte loads (8 bf16 / 8 f16 / 4 f32), converts to f32 and multiplies by up to
//   kGemvMaxRows f32 activation rows held in L1/L2. Exact products and f32 accumulation: the result is as accurate
//   as an f32 dot product of the stored weights, whatever the weight dtype.
// - split_hi_lo: x = hi + lo + r with hi, lo in the weight's 16-bit dtype, for the two-GEMM tensor-core path
//   (see CudaBackend::linear for the precision argument).
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/cuda_ops.h"
#include "backend/cuda/weight_loads.cuh"

namespace mambacpp::cuda {
namespace {

constexpr int kThreads = 256;           // 8 warps = 8 output features per block
constexpr int kRowsPerBlock = kThreads / 32;

// VEC: in % (16 / sizeof(W)) == 0 and x rows 16-byte aligned (checked by the launcher); otherwise scalar loads.
template <class W, int NT, bool VEC>
__global__ void __launch_bounds__(kThreads) gemv_kernel(ConstF32Rows x, const W* __restrict__ w, DevWeight bias,
                                                       F32Rows y, int64_t in, int64_t out) {
  const int lane = threadIdx.x & 31;
  const int64_t o = blockIdx.x * int64_t(kRowsPerBlock) + (threadIdx.x >> 5);
  if (o >= out) return;  // the whole warp leaves together
  const W* wr = w + o * in;
  float acc[NT];
#pragma unroll
  for (int r = 0; r < NT; ++r) acc[r] = 0.0f;

  if constexpr (VEC) {
    constexpr int V = 16 / sizeof(W);
    const int64_t n_vec = in / V;
    const uint4* wv = reinterpret_cast<const uint4*>(wr);
#pragma unroll 4
    for (int64_t v = lane; v < n_vec; v += 32) {
      const uint4 raw = __ldg(wv + v);
      float wf[V];
      unpack16<W>(raw, wf);
#pragma unroll
      for (int r = 0; r < NT; ++r) {
        const float4* xp = reinterpret_cast<const float4*>(x.data + r * x.stride + v * V);
#pragma unroll
        for (int q = 0; q < V / 4; ++q) {
          const float4 xv = xp[q];
          acc[r] += wf[4 * q] * xv.x + wf[4 * q + 1] * xv.y + wf[4 * q + 2] * xv.z + wf[4 * q + 3] * xv.w;
        }
      }
    }
  } else {
    for (int64_t i = lane; i < in; i += 32) {
      const float wf = w_to_f(wr[i]);
#pragma unroll
      for (int r = 0; r < NT; ++r) acc[r] += wf * x.data[r * x.stride + i];
    }
  }
#pragma unroll
  for (int r = 0; r < NT; ++r) acc[r] = warp_sum(acc[r]);
  if (lane == 0) {
    const float b = bias.data ? load_f(bias.data, bias.dtype, o) : 0.0f;
#pragma unroll
    for (int r = 0; r < NT; ++r) y.data[r * y.stride + o] = acc[r] + b;
  }
}

template <class W, int NT>
void gemv_rows(ConstF32Rows x, const void* w, DevWeight bias, F32Rows y, int64_t in, int64_t out, bool vec,
               cudaStream_t stream) {
  const int64_t blocks = (out + kRowsPerBlock - 1) / kRowsPerBlock;
  const W* wp = static_cast<const W*>(w);
  if (vec) {
    gemv_kernel<W, NT, true><<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(x, wp, bias, y, in, out);
  } else {
    gemv_kernel<W, NT, false><<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(x, wp, bias, y, in, out);
  }
  MAMBACPP_CUDA_LAUNCHED();
}

template <class W>
void gemv_typed(ConstF32Rows x, DevWeight w, DevWeight bias, F32Rows y, int64_t T, int64_t in, int64_t out,
                cudaStream_t stream) {
  constexpr int64_t V = 16 / sizeof(W);
  const bool vec = in % V == 0 && reinterpret_cast<uintptr_t>(w.data) % 16 == 0 &&
                   reinterpret_cast<uintptr_t>(x.data) % 16 == 0 && (T == 1 || x.stride % 4 == 0);
  switch (T) {
    case 1: gemv_rows<W, 1>(x, w.data, bias, y, in, out, vec, stream); break;
    case 2: gemv_rows<W, 2>(x, w.data, bias, y, in, out, vec, stream); break;
    case 3: gemv_rows<W, 3>(x, w.data, bias, y, in, out, vec, stream); break;
    case 4: gemv_rows<W, 4>(x, w.data, bias, y, in, out, vec, stream); break;
    case 5: gemv_rows<W, 5>(x, w.data, bias, y, in, out, vec, stream); break;
    case 6: gemv_rows<W, 6>(x, w.data, bias, y, in, out, vec, stream); break;
    case 7: gemv_rows<W, 7>(x, w.data, bias, y, in, out, vec, stream); break;
    default: gemv_rows<W, 8>(x, w.data, bias, y, in, out, vec, stream); break;
  }
}

template <class H>
__device__ __forceinline__ void split_one(float v, H& h, H& l) {
  if constexpr (std::is_same_v<H, __nv_bfloat16>) {
    h = __float2bfloat16_rn(v);
    l = __float2bfloat16_rn(v - __bfloat162float(h));
  } else {
    h = __float2half_rn(v);
    l = __float2half_rn(v - __half2float(h));
  }
}

// grid (ceil(in / (4 * kThreads)) , rows): each thread splits 4 consecutive columns of a row; 16-byte loads and 8-byte
// stores when VEC (in % 4 == 0, x 16-byte aligned with a stride that keeps it so). One element per thread with a
// 64-bit division for its row is twice the memory time.
template <class H, bool VEC>
__global__ void __launch_bounds__(kThreads) split_kernel(ConstF32Rows x, int64_t T, int64_t in, H* hi, H* lo) {
  const int64_t c = (blockIdx.x * int64_t(kThreads) + threadIdx.x) * 4;
  if (c >= in) return;
  for (int64_t t = blockIdx.y; t < T; t += gridDim.y) {
    const float* xr = x.data + t * x.stride + c;
    H* hr = hi + t * in + c;
    H* lr = lo ? lo + t * in + c : nullptr;  // lo absent: round only (the fast GEMMs' activations)
    if constexpr (VEC) {
      const float4 v = *reinterpret_cast<const float4*>(xr);
      H h[4], l[4];
      split_one(v.x, h[0], l[0]);
      split_one(v.y, h[1], l[1]);
      split_one(v.z, h[2], l[2]);
      split_one(v.w, h[3], l[3]);
      uint2 hb, lb;
      memcpy(&hb, h, 8);
      memcpy(&lb, l, 8);
      *reinterpret_cast<uint2*>(hr) = hb;
      if (lo) *reinterpret_cast<uint2*>(lr) = lb;
    } else {
      for (int k = 0; k < 4 && c + k < in; ++k) {
        H h, l;
        split_one(xr[k], h, l);
        hr[k] = h;
        if (lo) lr[k] = l;
      }
    }
  }
}

template <class H>
void split_typed(ConstF32Rows x, int64_t T, int64_t in, H* hi, H* lo, cudaStream_t stream) {
  const bool vec = in % 4 == 0 && x.stride % 4 == 0 && reinterpret_cast<uintptr_t>(x.data) % 16 == 0 &&
                   reinterpret_cast<uintptr_t>(hi) % 8 == 0 && reinterpret_cast<uintptr_t>(lo) % 8 == 0;  // null: 0
  const dim3 grid(static_cast<unsigned>((in + 4 * kThreads - 1) / (4 * kThreads)),
                  static_cast<unsigned>(std::min<int64_t>(T, 65535)));
  if (vec) {
    split_kernel<H, true><<<grid, kThreads, 0, stream>>>(x, T, in, hi, lo);
  } else {
    split_kernel<H, false><<<grid, kThreads, 0, stream>>>(x, T, in, hi, lo);
  }
  MAMBACPP_CUDA_LAUNCHED();
}

}  // namespace

void launch_gemv(ConstF32Rows x, DevWeight w, DevWeight bias, F32Rows y, int64_t T, int64_t in, int64_t out,
                 cudaStream_t stream) {
  if (T <= 0 || out <= 0) return;
  switch (w.dtype) {
    case DType::BF16: gemv_typed<__nv_bfloat16>(x, w, bias, y, T, in, out, stream); break;
    case DType::F16: gemv_typed<__half>(x, w, bias, y, T, in, out, stream); break;
    default: gemv_typed<float>(x, w, bias, y, T, in, out, stream); break;
  }
}

void launch_split_hi_lo(ConstF32Rows x, int64_t T, int64_t in, DType to, void* hi, void* lo, cudaStream_t stream) {
  if (T <= 0 || in <= 0) return;
  if (to == DType::BF16) {
    split_typed(x, T, in, static_cast<__nv_bfloat16*>(hi), static_cast<__nv_bfloat16*>(lo), stream);
  } else {
    split_typed(x, T, in, static_cast<__half*>(hi), static_cast<__half*>(lo), stream);
  }
}

}  // namespace mambacpp::cuda
