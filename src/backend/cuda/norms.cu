// RMSNorm and Mamba-2's gated, group-wise RMSNorm. One block per (row, group): the block sums the squares in f32
// (per-thread partials, then a warp/block tree, which keeps the rounding error at ~log2(D) ulps), then every thread
// scales the elements it read. `out` may alias the input: each thread rereads only its own elements, and all reads
// for the sum finish (block barrier) before any write.
#include <type_traits>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/cuda_launch.cuh"
#include "backend/cuda/cuda_ops.h"

namespace mambacpp::cuda {
namespace {

// 1024 threads, loops unrolled by 4: a decode row (T = 1) has a single block, so the loads of a row must be in
// flight together: with 256 threads and rolled loops the gated norm of mamba2-2.7b (5120 channels) is a chain of
// dependent memory round trips.
constexpr int kThreads = 1024;

// grid.x strides over rows (T may exceed 65535).
__global__ void __launch_bounds__(kThreads) rmsnorm_kernel(ConstF32Rows x, DevWeight w, float eps, F32Rows out, int64_t T, int64_t D) {
  __shared__ float scratch[32];
  enter_dependent();
  for (int64_t t = blockIdx.x; t < T; t += gridDim.x) {
    const float* xr = x.data + t * x.stride;
    float ss = 0.0f;
#pragma unroll 4
    for (int64_t i = threadIdx.x; i < D; i += blockDim.x) ss += xr[i] * xr[i];
    const float scale = rsqrtf(block_sum(ss, scratch) / static_cast<float>(D) + eps);
    float* o = out.data + t * out.stride;
#pragma unroll 4
    for (int64_t i = threadIdx.x; i < D; i += blockDim.x) o[i] = xr[i] * scale * load_f(w.data, w.dtype, i);
  }
}

// grid.x strides over rows * groups.
__global__ void __launch_bounds__(kThreads) gated_rmsnorm_kernel(ConstF32Rows y, ConstF32Rows z, DevWeight w, int64_t group_size, float eps,
                                     F32Rows out, int64_t T, int64_t n_groups) {
  __shared__ float scratch[32];
  enter_dependent();
  for (int64_t r = blockIdx.x; r < T * n_groups; r += gridDim.x) {
    const int64_t t = r / n_groups, c0 = (r % n_groups) * group_size;
    const float* yr = y.data + t * y.stride + c0;
    const float* zr = z.data + t * z.stride + c0;
    float ss = 0.0f;
#pragma unroll 4
    for (int64_t i = threadIdx.x; i < group_size; i += blockDim.x) {
      const float g = yr[i] * silu_f(zr[i]);
      ss += g * g;
    }
    const float scale = rsqrtf(block_sum(ss, scratch) / static_cast<float>(group_size) + eps);
    float* o = out.data + t * out.stride + c0;
#pragma unroll 4
    for (int64_t i = threadIdx.x; i < group_size; i += blockDim.x)
      o[i] = yr[i] * silu_f(zr[i]) * scale * load_f(w.data, w.dtype, c0 + i);
  }
}

// v rounded to the 16-bit type H (__nv_bfloat16 or __half).
template <class H>
__device__ __forceinline__ H round_to(float v) {
  if constexpr (std::is_same_v<H, __nv_bfloat16>) {
    return __float2bfloat16_rn(v);
  } else {
    return __float2half_rn(v);
  }
}

// The fast-precision GEMMs' prologue: a group-wise RMSNorm times w (group_size == D: the plain RMSNorm; w absent:
// no norm, the rows only rounded), written once as the weight's 16-bit dtype into a contiguous [T, D] buffer.
// grid.x strides over rows * groups, as above. The scalar fallback for rows the vector kernel below does not take;
// the same sums as rmsnorm_kernel and gated_rmsnorm_kernel.
// x's element as f32: In is float, or uint16_t for bf16 raw bits.
template <class In>
__device__ __forceinline__ float in_f32(const In* x, int64_t i) {
  if constexpr (std::is_same_v<In, float>)
    return x[i];
  else
    return __uint_as_float(uint32_t(x[i]) << 16);
}

template <class H, class In, class Z>
__global__ void __launch_bounds__(kThreads) rmsnorm_round_kernel(const In* x, int64_t x_stride, const Z* gate,
                                                                 int64_t gate_stride, DevWeight w, int64_t group_size,
                                                                 float eps, H* out, int64_t T, int64_t D,
                                                                 int64_t n_groups) {
  __shared__ float scratch[32];
  enter_dependent();
  for (int64_t r = blockIdx.x; r < T * n_groups; r += gridDim.x) {
    const int64_t t = r / n_groups, c0 = (r % n_groups) * group_size;
    const In* xr = x + t * x_stride + c0;
    const Z* zr = gate ? gate + t * gate_stride + c0 : nullptr;
    float scale = 1.0f;
    if (w.data) {
      float ss = 0.0f;
#pragma unroll 4
      for (int64_t i = threadIdx.x; i < group_size; i += blockDim.x) {
        const float g = zr ? in_f32(xr, i) * silu_f(in_f32(zr, i)) : in_f32(xr, i);
        ss += g * g;
      }
      scale = rsqrtf(block_sum(ss, scratch) / static_cast<float>(group_size) + eps);
    }
    H* o = out + t * D + c0;
#pragma unroll 4
    for (int64_t i = threadIdx.x; i < group_size; i += blockDim.x) {
      const float g = zr ? in_f32(xr, i) * silu_f(in_f32(zr, i)) : in_f32(xr, i);
      o[i] = round_to<H>(w.data ? g * scale * load_f(w.data, w.dtype, c0 + i) : g);
    }
  }
}

// Prefill-sized rows: 16-byte accesses, each thread's kVecPer vectors of the row (or group) loaded together and kept
// in registers between the sum of squares and the scaling, silu(z) computed once; blockDim = the vectors of a row
// over kVecPer, rounded up to a warp. The scalar kernels above read every element twice and compute silu twice
// (for mamba2-2.7b's gated norm and rmsnorm at 2048 tokens, over twice their memory traffic's time).
// Taken when rows and weights allow vector accesses (rows_vec_ok / vec_rows, weight_vec_ok); the same sums, in
// another order. Registers held to 32 (two blocks of 1,024 threads): the prefill rows' blocks of a few hundred
// threads then fit six to a multiprocessor (four at 46 registers), so that more rows' loads are in flight while
// others compute silu or sum.
constexpr int kVecPer = 4;
constexpr int kVecMaxThreads = 1024;

// Four consecutive elements of x as f32: In is float (16 bytes), or uint16_t for bf16 raw bits (8 bytes).
template <class In>
__device__ __forceinline__ float4 in_f32x4(const In* x, int i) {
  if constexpr (std::is_same_v<In, float>) {
    return reinterpret_cast<const float4*>(x)[i];
  } else {
    const uint2 u = reinterpret_cast<const uint2*>(x)[i];
    return make_float4(__uint_as_float(u.x << 16), __uint_as_float(u.x & 0xffff0000u), __uint_as_float(u.y << 16),
                       __uint_as_float(u.y & 0xffff0000u));
  }
}

// Weights c .. c + 3 as f32 by one access (c a multiple of 4; the launchers check the base's alignment, weight_vec_ok)
// in place of four scalar loads, each behind a switch on the dtype. The same values.
__device__ __forceinline__ float4 weight_f32x4(DevWeight w, int64_t c) {
  if (w.dtype == DType::F32) return *reinterpret_cast<const float4*>(static_cast<const float*>(w.data) + c);
  const uint2 u = *reinterpret_cast<const uint2*>(static_cast<const uint16_t*>(w.data) + c);
  if (w.dtype == DType::BF16)
    return make_float4(__uint_as_float(u.x << 16), __uint_as_float(u.x & 0xffff0000u), __uint_as_float(u.y << 16),
                       __uint_as_float(u.y & 0xffff0000u));
  const float2 lo = __half22float2(*reinterpret_cast<const __half2*>(&u.x));
  const float2 hi = __half22float2(*reinterpret_cast<const __half2*>(&u.y));
  return make_float4(lo.x, lo.y, hi.x, hi.y);
}

// Out: float (the norm's f32 rows), or bf16 / half (the fast GEMMs' rounded inputs, launch_rmsnorm_round).
// In: float, or uint16_t for x in bf16 (Mamba-2's y from the fast SSD): the same sums of the same f32 values.
// Z, the gate's type, likewise (z in bf16: the fast prompts' in_proj output).
template <bool Gated, class Out, class In = float, class Z = float>
__global__ void __launch_bounds__(kVecMaxThreads, 2) rmsnorm_vec_kernel(const In* x, int64_t x_stride, const Z* z,
                                                                   int64_t z_stride, DevWeight w, int64_t group_size,
                                                                   float eps, Out* out, int64_t out_stride,
                                                                   int64_t n_groups) {
  __shared__ float scratch[32];
  enter_dependent();
  const int64_t r = blockIdx.x;  // one block per (row, group); the launcher keeps T * n_groups within grid.x
  const int64_t t = r / n_groups, c0 = (r % n_groups) * group_size;
  const int n4 = static_cast<int>(group_size / 4);
  const In* xr = x + t * x_stride + c0;
  const Z* zr = Gated ? z + t * z_stride + c0 : nullptr;
  float4 v[kVecPer];
  float ss = 0.0f;
#pragma unroll
  for (int k = 0; k < kVecPer; ++k) {
    const int i = threadIdx.x + k * blockDim.x;
    v[k] = i < n4 ? in_f32x4(xr, i) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  }
  if constexpr (Gated) {
#pragma unroll
    for (int k = 0; k < kVecPer; ++k) {
      const int i = threadIdx.x + k * blockDim.x;
      if (i < n4) {
        const float4 g = in_f32x4(zr, i);
        v[k].x *= silu_f(g.x);
        v[k].y *= silu_f(g.y);
        v[k].z *= silu_f(g.z);
        v[k].w *= silu_f(g.w);
      }
    }
  }
#pragma unroll
  for (int k = 0; k < kVecPer; ++k) ss += v[k].x * v[k].x + v[k].y * v[k].y + v[k].z * v[k].z + v[k].w * v[k].w;
  const float scale = rsqrtf(block_sum(ss, scratch) / static_cast<float>(group_size) + eps);
  Out* o = out + t * out_stride + c0;
#pragma unroll
  for (int k = 0; k < kVecPer; ++k) {
    const int i = threadIdx.x + k * blockDim.x;
    if (i < n4) {
      const float4 wv = weight_f32x4(w, c0 + 4 * int64_t(i));
      const float4 r = make_float4(v[k].x * scale * wv.x, v[k].y * scale * wv.y, v[k].z * scale * wv.z,
                                   v[k].w * scale * wv.w);
      if constexpr (std::is_same_v<Out, float>) {
        reinterpret_cast<float4*>(o)[i] = r;
      } else {  // four 16-bit values: 8 bytes (rows and groups are multiples of 4 elements)
        reinterpret_cast<uint2*>(o)[i] = make_uint2(pack2<Out>(r.x, r.y), pack2<Out>(r.z, r.w));
      }
    }
  }
}

bool rows_vec_ok(const float* p, int64_t stride) { return reinterpret_cast<uintptr_t>(p) % 16 == 0 && stride % 4 == 0; }

// Four weights per access (weight_f32x4): 16 bytes of f32, 8 of a 16-bit type.
bool weight_vec_ok(DevWeight w) {
  return reinterpret_cast<uintptr_t>(w.data) % (w.dtype == DType::F32 ? 16 : 8) == 0;
}

// Threads per block for the vector kernels, or 0 when they do not apply.
int norm_vec_threads(int64_t rows, int64_t group_size) {
  if (group_size % 4 != 0 || rows > 0x7fffffff) return 0;
  const int64_t per_thread = kVecPer * 4;
  const int64_t threads = ((group_size + per_thread - 1) / per_thread + 31) / 32 * 32;
  return threads <= kVecMaxThreads ? static_cast<int>(threads) : 0;
}

int row_blocks(int64_t rows) { return static_cast<int>(rows > (1 << 20) ? (1 << 20) : rows); }

}  // namespace

void launch_rmsnorm(ConstF32Rows x, DevWeight w, float eps, F32Rows out, int64_t T, int64_t D, cudaStream_t stream) {
  if (T <= 0 || D <= 0) return;
  const int vt = rows_vec_ok(x.data, x.stride) && rows_vec_ok(out.data, out.stride) && weight_vec_ok(w)
                     ? norm_vec_threads(T, D)
                     : 0;
  if (vt > 0) {
    launch_dependent(rmsnorm_vec_kernel<false, float>, dim3(static_cast<unsigned>(T)), dim3(vt), stream, x.data,
                     x.stride, static_cast<const float*>(nullptr), int64_t{0}, w, D, eps, out.data, out.stride,
                     int64_t{1});
    return;
  }
  launch_dependent(rmsnorm_kernel, dim3(row_blocks(T)), dim3(kThreads), stream, x, w, eps, out, T, D);
}

void launch_gated_rmsnorm(ConstF32Rows y, ConstF32Rows z, DevWeight w, int64_t group_size, float eps, F32Rows out,
                          int64_t T, int64_t D, cudaStream_t stream) {
  if (T <= 0 || D <= 0) return;
  const int64_t n_groups = D / group_size;
  const int vt = rows_vec_ok(y.data, y.stride) && rows_vec_ok(z.data, z.stride) &&
                         rows_vec_ok(out.data, out.stride) && weight_vec_ok(w)
                     ? norm_vec_threads(T * n_groups, group_size)
                     : 0;
  if (vt > 0) {
    launch_dependent(rmsnorm_vec_kernel<true, float>, dim3(static_cast<unsigned>(T * n_groups)), dim3(vt), stream,
                     y.data, y.stride, z.data, z.stride, w, group_size, eps, out.data, out.stride, n_groups);
    return;
  }
  launch_dependent(gated_rmsnorm_kernel, dim3(row_blocks(T * n_groups)), dim3(kThreads), stream, y, z, w, group_size,
                   eps, out, T, n_groups);
}

namespace {

// 16 bytes of f32 (8 of bf16) per vector access.
template <class E>
bool vec_rows(const E* p, int64_t stride) {
  return reinterpret_cast<uintptr_t>(p) % (4 * sizeof(E)) == 0 && stride % 4 == 0;
}

template <class H, class In, class Z>
void rmsnorm_round(const In* x, int64_t x_stride, const Z* gate, int64_t gate_stride, DevWeight w,
                   int64_t group_size, float eps, H* out, int64_t T, int64_t D, cudaStream_t stream) {
  const int64_t n_groups = D / group_size;
  const bool aligned = vec_rows(x, x_stride) && (!gate || vec_rows(gate, gate_stride)) &&
                       reinterpret_cast<uintptr_t>(out) % 8 == 0;
  const int vt = w.data && aligned && weight_vec_ok(w) ? norm_vec_threads(T * n_groups, group_size) : 0;
  if (vt > 0) {
    launch_dependent(gate ? rmsnorm_vec_kernel<true, H, In, Z> : rmsnorm_vec_kernel<false, H, In, Z>,
                     dim3(static_cast<unsigned>(T * n_groups)), dim3(vt), stream, x, x_stride, gate, gate_stride, w,
                     group_size, eps, out, D, n_groups);
  } else {
    launch_dependent(rmsnorm_round_kernel<H, In, Z>, dim3(row_blocks(T * n_groups)), dim3(kThreads), stream, x,
                     x_stride, gate, gate_stride, w, group_size, eps, out, T, D, n_groups);
  }
}

template <class In, class Z>
void rmsnorm_round_to(const In* x, int64_t x_stride, const Z* gate, int64_t gate_stride, DevWeight w,
                      int64_t group_size, float eps, DType to, void* out, int64_t T, int64_t D, cudaStream_t stream) {
  if (T <= 0 || D <= 0) return;
  if (group_size <= 0 || !w.data) group_size = D;
  if (to == DType::BF16)
    rmsnorm_round(x, x_stride, gate, gate_stride, w, group_size, eps, static_cast<__nv_bfloat16*>(out), T, D, stream);
  else
    rmsnorm_round(x, x_stride, gate, gate_stride, w, group_size, eps, static_cast<__half*>(out), T, D, stream);
}

}  // namespace

void launch_rmsnorm_round(ConstF32Rows x, ConstF32Rows gate, DevWeight w, int64_t group_size, float eps, DType to,
                          void* out, int64_t T, int64_t D, cudaStream_t stream) {
  rmsnorm_round_to(x.data, x.stride, gate.data, gate.stride, w, group_size, eps, to, out, T, D, stream);
}

void launch_rmsnorm_round_bf16_x(const uint16_t* x, int64_t x_stride, ConstF32Rows gate, DevWeight w,
                                 int64_t group_size, float eps, DType to, void* out, int64_t T, int64_t D,
                                 cudaStream_t stream) {
  rmsnorm_round_to(x, x_stride, gate.data, gate.stride, w, group_size, eps, to, out, T, D, stream);
}

void launch_rmsnorm_round_bf16_xz(const uint16_t* x, int64_t x_stride, const uint16_t* gate, int64_t gate_stride,
                                  DevWeight w, int64_t group_size, float eps, DType to, void* out, int64_t T,
                                  int64_t D, cudaStream_t stream) {
  rmsnorm_round_to(x, x_stride, gate, gate_stride, w, group_size, eps, to, out, T, D, stream);
}

}  // namespace mambacpp::cuda
