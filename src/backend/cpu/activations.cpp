// Elementwise ops of the hybrid models' MLPs and multipliers on the CPU: relu2, silu(gate) * up, scaling.
#include "backend/cpu/cpu_ops.h"

namespace mambacpp::cpu {

void relu2_f32(Rows<float> x, int64_t T, int64_t D, int threads) {
#pragma omp parallel for schedule(static) num_threads(threads) if (T * D > 65536)
  for (int64_t t = 0; t < T; ++t) {
    float* r = x[t];
    for (int64_t i = 0; i < D; ++i) {
      const float v = r[i] > 0.0f ? r[i] : 0.0f;
      r[i] = v * v;
    }
  }
}

void silu_mul_f32(Rows<const float> gate, Rows<const float> up, Rows<float> out, int64_t T, int64_t D, int threads) {
#pragma omp parallel for schedule(static) num_threads(threads) if (T * D > 65536)
  for (int64_t t = 0; t < T; ++t) {
    const float* g = gate[t];
    const float* u = up[t];
    float* o = out[t];
    for (int64_t i = 0; i < D; ++i) o[i] = silu(g[i]) * u[i];
  }
}

void scale_f32(Rows<float> x, float alpha, int64_t T, int64_t D, int threads) {
#pragma omp parallel for schedule(static) num_threads(threads) if (T * D > 65536)
  for (int64_t t = 0; t < T; ++t) {
    float* r = x[t];
#pragma omp simd
    for (int64_t i = 0; i < D; ++i) r[i] *= alpha;
  }
}

}  // namespace mambacpp::cpu
