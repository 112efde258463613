// Small memory-bound kernels: dtype conversion (weights at load), embedding gather, to_f32, add_inplace,
// gather_rows, the bias broadcast of the GEMM path and batched region copies (state snapshots). Grid-stride loops
// with 64-bit indices; 2-D kernels put rows on grid.y-strided loops and columns on threads so that every warp reads
// consecutive addresses.
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/cuda_ops.h"

namespace mambacpp::cuda {
namespace {

constexpr int kThreads = 256;

int grid_for(int64_t n, int64_t cap = 65535) {
  const int64_t blocks = (n + kThreads - 1) / kThreads;
  return static_cast<int>(blocks < 1 ? 1 : (blocks > cap ? cap : blocks));
}
int rows_grid(int64_t rows) { return static_cast<int>(rows < 1 ? 1 : (rows > 65535 ? 65535 : rows)); }

__device__ __forceinline__ void store_as(void* p, DType t, int64_t i, float v) {
  switch (t) {
    case DType::BF16: static_cast<__nv_bfloat16*>(p)[i] = __float2bfloat16_rn(v); break;
    case DType::F16: static_cast<__half*>(p)[i] = __float2half_rn(v); break;
    default: static_cast<float*>(p)[i] = v; break;
  }
}

__global__ void convert_kernel(const void* src, DType from, void* dst, DType to, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    store_as(dst, to, i, load_f(src, from, i));
}

// y[t, c] = y[t, c] rounded to bf16 (nearest even), kept in f32. grid.x strides over columns, grid.y over rows.
__global__ void round_bf16_kernel(F32Rows y, int64_t T, int64_t D) {
  for (int64_t t = blockIdx.y; t < T; t += gridDim.y) {
    float* r = y.data + t * y.stride;
    for (int64_t c = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; c < D; c += int64_t(gridDim.x) * blockDim.x)
      r[c] = __bfloat162float(__float2bfloat16_rn(r[c]));
  }
}

// grid.x strides over columns, grid.y over rows.
__global__ void embed_kernel(DevWeight table, int64_t D, const int32_t* ids, int64_t T, F32Rows out) {
  for (int64_t t = blockIdx.y; t < T; t += gridDim.y) {
    const int64_t base = static_cast<int64_t>(ids[t]) * D;
    float* o = out.data + t * out.stride;
    for (int64_t c = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; c < D; c += int64_t(gridDim.x) * blockDim.x)
      o[c] = load_f(table.data, table.dtype, base + c);
  }
}

__global__ void to_f32_kernel(const void* src, DType from, int64_t src_stride, int64_t rows, int64_t cols,
                              F32Rows out) {
  for (int64_t r = blockIdx.y; r < rows; r += gridDim.y) {
    float* o = out.data + r * out.stride;
    for (int64_t c = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; c < cols; c += int64_t(gridDim.x) * blockDim.x)
      o[c] = load_f(src, from, r * src_stride + c);
  }
}

__global__ void add_kernel(F32Rows acc, ConstF32Rows x, int64_t T, int64_t D) {
  for (int64_t t = blockIdx.y; t < T; t += gridDim.y) {
    float* a = acc.data + t * acc.stride;
    const float* b = x.data + t * x.stride;
    for (int64_t c = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; c < D; c += int64_t(gridDim.x) * blockDim.x)
      a[c] += b[c];
  }
}

// 16-byte accesses (rows 16-byte aligned, D % 4 == 0): with 4-byte accesses the scalar kernel keeps too few bytes in
// flight to reach the memory bandwidth on prefill rows.
__global__ void add_vec_kernel(F32Rows acc, ConstF32Rows x, int64_t T, int64_t D4) {
  for (int64_t t = blockIdx.y; t < T; t += gridDim.y) {
    float4* a = reinterpret_cast<float4*>(acc.data + t * acc.stride);
    const float4* b = reinterpret_cast<const float4*>(x.data + t * x.stride);
    for (int64_t c = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; c < D4; c += int64_t(gridDim.x) * blockDim.x) {
      float4 u = a[c];
      const float4 v = b[c];
      u.x += v.x, u.y += v.y, u.z += v.z, u.w += v.w;
      a[c] = u;
    }
  }
}

__global__ void silu_gate_kernel(F32Rows y, ConstF32Rows z, int64_t T, int64_t D) {
  for (int64_t t = blockIdx.y; t < T; t += gridDim.y) {
    float* a = y.data + t * y.stride;
    const float* g = z.data + t * z.stride;
    for (int64_t c = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; c < D; c += int64_t(gridDim.x) * blockDim.x)
      a[c] *= silu_f(g[c]);
  }
}

template <class E>
__global__ void gather_kernel(const E* x, int64_t x_stride, const int64_t* rows, int64_t n, int64_t cols, E* out,
                              int64_t out_stride) {
  for (int64_t i = blockIdx.y; i < n; i += gridDim.y) {
    const E* src = x + rows[i] * x_stride;
    E* dst = out + i * out_stride;
    for (int64_t c = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; c < cols; c += int64_t(gridDim.x) * blockDim.x)
      dst[c] = src[c];
  }
}

__global__ void bias_kernel(DevWeight bias, F32Rows y, int64_t T, int64_t out) {
  for (int64_t t = blockIdx.y; t < T; t += gridDim.y) {
    float* row = y.data + t * y.stride;
    for (int64_t o = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; o < out; o += int64_t(gridDim.x) * blockDim.x)
      row[o] = load_f(bias.data, bias.dtype, o);
  }
}

// grid.y: one region each; grid.x strides over its 16-byte units (a byte loop where an end is not 16-byte aligned).
__global__ void copy_regions_kernel(CopyRegionBatch b) {
  const int r = blockIdx.y;
  char* dst = static_cast<char*>(b.dst[r]);
  const char* src = static_cast<const char*>(b.src[r]);
  const uint64_t n = b.bytes[r];
  const uint64_t first = blockIdx.x * uint64_t(blockDim.x) + threadIdx.x, step = uint64_t(gridDim.x) * blockDim.x;
  if (((reinterpret_cast<uintptr_t>(dst) | reinterpret_cast<uintptr_t>(src)) & 15) == 0) {
    const uint64_t units = n / 16;
    for (uint64_t i = first; i < units; i += step)
      reinterpret_cast<uint4*>(dst)[i] = reinterpret_cast<const uint4*>(src)[i];
    for (uint64_t i = units * 16 + first; i < n; i += step) dst[i] = src[i];
  } else {
    for (uint64_t i = first; i < n; i += step) dst[i] = src[i];
  }
}

}  // namespace

void launch_convert(const void* src, DType from, void* dst, DType to, int64_t n, cudaStream_t stream) {
  if (n <= 0) return;
  convert_kernel<<<grid_for(n), kThreads, 0, stream>>>(src, from, dst, to, n);
  MAMBACPP_CUDA_LAUNCHED();
}

void launch_round_bf16(F32Rows y, int64_t T, int64_t D, cudaStream_t stream) {
  if (T <= 0 || D <= 0) return;
  round_bf16_kernel<<<dim3(grid_for(D), rows_grid(T)), kThreads, 0, stream>>>(y, T, D);
  MAMBACPP_CUDA_LAUNCHED();
}

void launch_embed(DevWeight table, int64_t D, const int32_t* ids, int64_t T, F32Rows out, cudaStream_t stream) {
  if (T <= 0 || D <= 0) return;
  embed_kernel<<<dim3(grid_for(D), rows_grid(T)), kThreads, 0, stream>>>(table, D, ids, T, out);
  MAMBACPP_CUDA_LAUNCHED();
}

void launch_to_f32(const void* src, DType from, int64_t src_stride, int64_t rows, int64_t cols, F32Rows out,
                   cudaStream_t stream) {
  if (rows <= 0 || cols <= 0) return;
  to_f32_kernel<<<dim3(grid_for(cols), rows_grid(rows)), kThreads, 0, stream>>>(src, from, src_stride, rows, cols,
                                                                                out);
  MAMBACPP_CUDA_LAUNCHED();
}

void launch_add_inplace(F32Rows acc, ConstF32Rows x, int64_t T, int64_t D, cudaStream_t stream) {
  if (T <= 0 || D <= 0) return;
  auto vec_ok = [](const void* p, int64_t stride) { return reinterpret_cast<uintptr_t>(p) % 16 == 0 && stride % 4 == 0; };
  if (D % 4 == 0 && vec_ok(acc.data, acc.stride) && vec_ok(x.data, x.stride)) {
    add_vec_kernel<<<dim3(grid_for(D / 4), rows_grid(T)), kThreads, 0, stream>>>(acc, x, T, D / 4);
    MAMBACPP_CUDA_LAUNCHED();
    return;
  }
  add_kernel<<<dim3(grid_for(D), rows_grid(T)), kThreads, 0, stream>>>(acc, x, T, D);
  MAMBACPP_CUDA_LAUNCHED();
}

void launch_silu_gate(F32Rows y, ConstF32Rows z, int64_t T, int64_t D, cudaStream_t stream) {
  if (T <= 0 || D <= 0) return;
  silu_gate_kernel<<<dim3(grid_for(D), rows_grid(T)), kThreads, 0, stream>>>(y, z, T, D);
  MAMBACPP_CUDA_LAUNCHED();
}

void launch_gather_rows(const void* x, int64_t x_stride, const int64_t* rows, int64_t n, int64_t cols,
                        size_t elem_size, void* out, int64_t out_stride, cudaStream_t stream) {
  if (n <= 0 || cols <= 0) return;
  const dim3 grid(grid_for(cols), rows_grid(n));
  switch (elem_size) {
    case 2:
      gather_kernel<<<grid, kThreads, 0, stream>>>(static_cast<const uint16_t*>(x), x_stride, rows, n, cols,
                                                   static_cast<uint16_t*>(out), out_stride);
      break;
    case 4:
      gather_kernel<<<grid, kThreads, 0, stream>>>(static_cast<const uint32_t*>(x), x_stride, rows, n, cols,
                                                   static_cast<uint32_t*>(out), out_stride);
      break;
    default:
      gather_kernel<<<grid, kThreads, 0, stream>>>(static_cast<const uint64_t*>(x), x_stride, rows, n, cols,
                                                   static_cast<uint64_t*>(out), out_stride);
      break;
  }
  MAMBACPP_CUDA_LAUNCHED();
}

void launch_broadcast_bias(DevWeight bias, F32Rows y, int64_t T, int64_t out, cudaStream_t stream) {
  if (T <= 0 || out <= 0) return;
  bias_kernel<<<dim3(grid_for(out), rows_grid(T)), kThreads, 0, stream>>>(bias, y, T, out);
  MAMBACPP_CUDA_LAUNCHED();
}

void launch_copy_regions(const CopyRegionBatch& b, cudaStream_t stream) {
  if (b.n <= 0) return;
  uint64_t most = 0;
  for (int r = 0; r < b.n; ++r) most = b.bytes[r] > most ? b.bytes[r] : most;
  const int x = grid_for(static_cast<int64_t>((most + 15) / 16), 64);
  copy_regions_kernel<<<dim3(x, b.n), kThreads, 0, stream>>>(b);
  MAMBACPP_CUDA_LAUNCHED();
}

}  // namespace mambacpp::cuda

namespace mambacpp::cuda {
// Asks the runtime for one of our kernels: fails when the binary holds no code this device can run.
bool kernels_loadable() {
  cudaFuncAttributes attr{};
  return cudaFuncGetAttributes(&attr, convert_kernel) == cudaSuccess;
}
}  // namespace mambacpp::cuda
