// The small ops of hybrid layers: RoPE (Backend::rope), relu2, silu_mul and scale. Memory-bound; rows on grid.y,
// columns on threads, as in elementwise.cu.
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/cuda_ops.h"

namespace mambacpp::cuda {
namespace {

constexpr int kThreads = 256;

int cols_grid(int64_t n) {
  const int64_t b = (n + kThreads - 1) / kThreads;
  return static_cast<int>(b < 1 ? 1 : (b > 65535 ? 65535 : b));
}
int rows_grid(int64_t rows) { return static_cast<int>(rows < 1 ? 1 : (rows > 65535 ? 65535 : rows)); }

// Thread (h, f) of row t turns the pair (f, f + half) of head h. The angle is formed in double from the inverse
// frequencies the host computed in double, and its cosine and sine taken in double (as the CPU backend does), so
// long positions keep their phase; the rotation itself is f32.
__global__ void rope_kernel(F32Rows x, int64_t T, int64_t n_heads, int64_t head_dim, int64_t half,
                            const int64_t* positions, const double* inv_freq) {
  for (int64_t t = blockIdx.y; t < T; t += gridDim.y) {
    const int64_t pos = positions[t];
    if (pos < 0) continue;  // a row in no sequence
    float* row = x.data + t * x.stride;
    for (int64_t e = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; e < n_heads * half;
         e += int64_t(gridDim.x) * blockDim.x) {
      const int64_t h = e / half, f = e % half;
      double sn, cs;
      sincos(static_cast<double>(pos) * inv_freq[f], &sn, &cs);
      const float c = static_cast<float>(cs), s = static_cast<float>(sn);
      float* p = row + h * head_dim;
      const float x1 = p[f], x2 = p[f + half];
      p[f] = x1 * c - x2 * s;
      p[f + half] = x2 * c + x1 * s;
    }
  }
}

// As rope_kernel, the position of row t read from the slot's length and the frequencies formed here (in double).
__global__ void rope_lengths_kernel(F32Rows x, int64_t T, int64_t n_heads, int64_t head_dim, int64_t half,
                                    double theta, const SeqSpan* spans, const int32_t* token_seq,
                                    const int64_t* lengths) {
  for (int64_t t = blockIdx.y; t < T; t += gridDim.y) {
    const int32_t si = token_seq[t];
    if (si < 0) continue;
    const SeqSpan sp = spans[si];
    const int64_t pos = lengths[sp.slot] + (t - sp.start);
    float* row = x.data + t * x.stride;
    for (int64_t e = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; e < n_heads * half;
         e += int64_t(gridDim.x) * blockDim.x) {
      const int64_t h = e / half, f = e % half;
      const double inv_freq = pow(theta, -static_cast<double>(2 * f) / static_cast<double>(2 * half));
      double sn, cs;
      sincos(static_cast<double>(pos) * inv_freq, &sn, &cs);
      const float c = static_cast<float>(cs), s = static_cast<float>(sn);
      float* p = row + h * head_dim;
      const float x1 = p[f], x2 = p[f + half];
      p[f] = x1 * c - x2 * s;
      p[f + half] = x2 * c + x1 * s;
    }
  }
}

__global__ void relu2_kernel(F32Rows x, int64_t T, int64_t D) {
  for (int64_t t = blockIdx.y; t < T; t += gridDim.y) {
    float* r = x.data + t * x.stride;
    for (int64_t c = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; c < D; c += int64_t(gridDim.x) * blockDim.x) {
      const float v = r[c] > 0.0f ? r[c] : 0.0f;
      r[c] = v * v;
    }
  }
}

__global__ void silu_mul_kernel(ConstF32Rows gate, ConstF32Rows up, F32Rows out, int64_t T, int64_t D) {
  for (int64_t t = blockIdx.y; t < T; t += gridDim.y) {
    const float* g = gate.data + t * gate.stride;
    const float* u = up.data + t * up.stride;
    float* o = out.data + t * out.stride;
    for (int64_t c = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; c < D; c += int64_t(gridDim.x) * blockDim.x)
      o[c] = silu_f(g[c]) * u[c];
  }
}

__global__ void scale_kernel(F32Rows x, float alpha, int64_t T, int64_t D) {
  for (int64_t t = blockIdx.y; t < T; t += gridDim.y) {
    float* r = x.data + t * x.stride;
    for (int64_t c = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; c < D; c += int64_t(gridDim.x) * blockDim.x)
      r[c] *= alpha;
  }
}

}  // namespace

void launch_rope(F32Rows x, int64_t T, int64_t n_heads, int64_t head_dim, int64_t rope_dim, const int64_t* positions,
                 const double* inv_freq, cudaStream_t stream) {
  const int64_t half = rope_dim / 2;
  if (T <= 0 || n_heads <= 0 || half <= 0) return;
  rope_kernel<<<dim3(cols_grid(n_heads * half), rows_grid(T)), kThreads, 0, stream>>>(x, T, n_heads, head_dim, half,
                                                                                      positions, inv_freq);
  MAMBACPP_CUDA_LAUNCHED();
}

void launch_rope_at_lengths(F32Rows x, int64_t T, int64_t n_heads, int64_t head_dim, int64_t rope_dim, double theta,
                            const SeqSpan* spans, const int32_t* token_seq, const int64_t* lengths,
                            cudaStream_t stream) {
  const int64_t half = rope_dim / 2;
  if (T <= 0 || n_heads <= 0 || half <= 0) return;
  rope_lengths_kernel<<<dim3(cols_grid(n_heads * half), rows_grid(T)), kThreads, 0, stream>>>(
      x, T, n_heads, head_dim, half, theta, spans, token_seq, lengths);
  MAMBACPP_CUDA_LAUNCHED();
}

void launch_relu2(F32Rows x, int64_t T, int64_t D, cudaStream_t stream) {
  if (T <= 0 || D <= 0) return;
  relu2_kernel<<<dim3(cols_grid(D), rows_grid(T)), kThreads, 0, stream>>>(x, T, D);
  MAMBACPP_CUDA_LAUNCHED();
}

void launch_silu_mul(ConstF32Rows gate, ConstF32Rows up, F32Rows out, int64_t T, int64_t D, cudaStream_t stream) {
  if (T <= 0 || D <= 0) return;
  silu_mul_kernel<<<dim3(cols_grid(D), rows_grid(T)), kThreads, 0, stream>>>(gate, up, out, T, D);
  MAMBACPP_CUDA_LAUNCHED();
}

void launch_scale(F32Rows x, float alpha, int64_t T, int64_t D, cudaStream_t stream) {
  if (T <= 0 || D <= 0) return;
  scale_kernel<<<dim3(cols_grid(D), rows_grid(T)), kThreads, 0, stream>>>(x, alpha, T, D);
  MAMBACPP_CUDA_LAUNCHED();
}

}  // namespace mambacpp::cuda
