// Elementwise ops of the hybrid models' MLPs and multipliers on the CPU: relu2, silu(gate) * up, scaling.
#include <algorithm>
#include <vector>

#include "backend/cpu/cpu_ops.h"
#include "backend/cpu/simd.h"
#include "backend/cpu/thread_pool.h"

namespace mambacpp::cpu {

void relu2_f32(Rows<float> x, int64_t T, int64_t D, int threads) {
  parallel_for(threads, T, 65536 / std::max<int64_t>(D, 1) + 1, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      float* r = x[t];
      for (int64_t i = 0; i < D; ++i) {
        const float v = r[i] > 0.0f ? r[i] : 0.0f;
        r[i] = v * v;
      }
    }
  });
}

void silu_mul_f32(Rows<const float> gate, Rows<const float> up, Rows<float> out, int64_t T, int64_t D, int threads) {
  parallel_for(threads, T, 65536 / std::max<int64_t>(D, 1) + 1, [&](int64_t t0, int64_t t1) {
    std::vector<float> s(static_cast<size_t>(D));  // silu(gate) by the vector kernel; out may alias gate or up
    for (int64_t t = t0; t < t1; ++t) {
      const float* u = up[t];
      float* o = out[t];
      simd::silu(gate[t], s.data(), D);
      for (int64_t i = 0; i < D; ++i) o[i] = s[static_cast<size_t>(i)] * u[i];
    }
  });
}

void scale_f32(Rows<float> x, float alpha, int64_t T, int64_t D, int threads) {
  parallel_for(threads, T, 65536 / std::max<int64_t>(D, 1) + 1, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      float* r = x[t];
#pragma omp simd
      for (int64_t i = 0; i < D; ++i) r[i] *= alpha;
    }
  });
}

}  // namespace mambacpp::cpu
