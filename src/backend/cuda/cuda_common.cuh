// Device-side building blocks shared by the CUDA kernels: loads of f32/f16/bf16 storage as float, the bf16 state
// load/store, the scalar activations (softplus with torch's threshold, SiLU), warp reductions and the controls of
// programmatic dependent launch.
// Host-side error checks live in cuda_check.h.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <cstring>
#include <type_traits>

#include "mambacpp/dtype.h"

namespace mambacpp::cuda {

// Element i of a float buffer of dtype t (f32, f16 or bf16; the caller has checked which) as float.
__device__ __forceinline__ float load_f(const void* p, DType t, int64_t i) {
  switch (t) {
    case DType::BF16: return __bfloat162float(static_cast<const __nv_bfloat16*>(p)[i]);
    case DType::F16: return __half2float(static_cast<const __half*>(p)[i]);
    default: return static_cast<const float*>(p)[i];
  }
}

// State buffers are f32 or bf16 (computed in f32 either way; bf16 rounds once when the state is written back).
__device__ __forceinline__ float load_state(const void* p, bool bf16, int64_t i) {
  return bf16 ? __bfloat162float(static_cast<const __nv_bfloat16*>(p)[i]) : static_cast<const float*>(p)[i];
}
__device__ __forceinline__ void store_state(void* p, bool bf16, int64_t i, float v) {
  if (bf16) {
    static_cast<__nv_bfloat16*>(p)[i] = __float2bfloat16_rn(v);
  } else {
    static_cast<float*>(p)[i] = v;
  }
}

// 16 bytes of a state buffer (8 bf16 or 4 f32 values, in address order) as floats, and back (bf16: rounded to
// nearest even, as store_state rounds).
template <bool BF16>
struct StateVec {
  static constexpr int kElems = BF16 ? 8 : 4;
  __device__ __forceinline__ static void unpack(const uint4& raw, float* out) {
    const uint32_t u[4] = {raw.x, raw.y, raw.z, raw.w};
    if constexpr (BF16) {
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        out[2 * k] = __uint_as_float(u[k] << 16);  // low half = lower address
        out[2 * k + 1] = __uint_as_float(u[k] & 0xffff0000u);
      }
    } else {
#pragma unroll
      for (int k = 0; k < 4; ++k) out[k] = __uint_as_float(u[k]);
    }
  }
  __device__ __forceinline__ static uint4 pack(const float* v) {
    uint32_t u[4];
    if constexpr (BF16) {
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        const __nv_bfloat162 b = __floats2bfloat162_rn(v[2 * k], v[2 * k + 1]);  // .x at the lower address
        u[k] = *reinterpret_cast<const uint32_t*>(&b);
      }
    } else {
#pragma unroll
      for (int k = 0; k < 4; ++k) u[k] = __float_as_uint(v[k]);
    }
    return make_uint4(u[0], u[1], u[2], u[3]);
  }
};

// softplus(v) = log(1 + exp(v)); v itself above 20, as torch.nn.functional.softplus (threshold 20) does.
__device__ __forceinline__ float softplus_f(float v) { return v > 20.0f ? v : log1pf(expf(v)); }
__device__ __forceinline__ float silu_f(float v) { return v / (1.0f + expf(-v)); }

// 2^x by the hardware's approximation (relative error ~2^-22; subnormal results flushed to 0): the fast kernels'
// decays (the fast SSD's, from SsdScratch::cum2; the chunked Mamba-1 scan's in fast precision).
__device__ __forceinline__ float exp2_approx(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

// a and b rounded to the 16-bit type H (__nv_bfloat16 or __half), a in the low half (the lower address or column).
template <class H>
__device__ __forceinline__ uint32_t pack2(float a, float b) {
  uint32_t u;
  if constexpr (std::is_same_v<H, __nv_bfloat16>) {
    const __nv_bfloat162 h = __floats2bfloat162_rn(a, b);
    memcpy(&u, &h, 4);
  } else {
    const __half2 h = __floats2half2_rn(a, b);
    memcpy(&u, &h, 4);
  }
  return u;
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(0xffffffffu, v, off);
  return v;
}

// Sum over the whole block (blockDim.x a multiple of 32, at most 1024). `scratch` holds 32 floats. Every thread
// gets the total. Contains __syncthreads: call it from all threads.
__device__ __forceinline__ float block_sum(float v, float* scratch) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, n_warps = blockDim.x >> 5;
  v = warp_sum(v);
  __syncthreads();  // scratch may still be read by a previous call
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  float total = lane < n_warps ? scratch[lane] : 0.0f;
  return warp_sum(total);
}

// Programmatic dependent launch (sm_90; see launch_dependent in cuda_launch.cuh). A kernel launched that way may
// start while the previous kernel of the stream is still running: before the wait it may only read what no
// earlier kernel of the step writes (weights, the state it alone updates); the wait returns once the previous
// kernel has finished and its writes are visible. Launched normally, both are no-ops.
__device__ __forceinline__ void wait_for_previous_kernel() { asm volatile("griddepcontrol.wait;" ::: "memory"); }
// Lets the next kernel (if launched as dependent) be scheduled now rather than when this one exits.
__device__ __forceinline__ void allow_next_kernel() { asm volatile("griddepcontrol.launch_dependents;" ::: "memory"); }
// The first statement of a kernel launched as dependent that reads nothing before the wait: the previous kernel
// is done, and the next one's blocks may take the multiprocessors this grid's last wave leaves idle (they wait in
// their own enter_dependent), so the next launch overlaps this kernel's tail.
__device__ __forceinline__ void enter_dependent() {
  wait_for_previous_kernel();
  allow_next_kernel();
}

}  // namespace mambacpp::cuda
