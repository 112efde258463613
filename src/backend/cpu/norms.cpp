// RMSNorm and Mamba-2's gated RMSNorm on the CPU, one token row per iteration; the gate's SiLU by the vector kernel.
// Sums of squares accumulate in double: exact enough that the result is the f32 rounding of the true norm for any
// width.
#include <cmath>
#include <vector>

#include "backend/cpu/cpu_ops.h"
#include "backend/cpu/simd.h"
#include "backend/cpu/thread_pool.h"

namespace mambacpp::cpu {

void rmsnorm_f32(Rows<const float> x, WeightRef w, float eps, Rows<float> out, int64_t T, int64_t D, int threads) {
  parallel_for(threads, T, 4, [&](int64_t t0, int64_t t1) {
    std::vector<float> wf(static_cast<size_t>(D));
    weight_load(w, 0, D, wf.data());
    for (int64_t t = t0; t < t1; ++t) {
      const float* xt = x[t];
      double ss = 0.0;
      for (int64_t i = 0; i < D; ++i) ss += static_cast<double>(xt[i]) * xt[i];
      const float scale = static_cast<float>(1.0 / std::sqrt(ss / static_cast<double>(D) + eps));
      float* ot = out[t];
      for (int64_t i = 0; i < D; ++i) ot[i] = xt[i] * scale * wf[static_cast<size_t>(i)];
    }
  });
}

void gated_rmsnorm_f32(Rows<const float> y, Rows<const float> z, WeightRef w, int64_t group_size, float eps,
                       Rows<float> out, int64_t T, int64_t D, int threads) {
  parallel_for(threads, T, 4, [&](int64_t t0, int64_t t1) {
    std::vector<float> wf(static_cast<size_t>(D)), g(static_cast<size_t>(group_size));
    weight_load(w, 0, D, wf.data());
    for (int64_t t = t0; t < t1; ++t) {
      const float* yt = y[t];
      const float* zt = z[t];
      float* ot = out[t];
      for (int64_t c0 = 0; c0 < D; c0 += group_size) {
        simd::silu(zt + c0, g.data(), group_size);
        double ss = 0.0;
        for (int64_t i = 0; i < group_size; ++i) {
          const float v = yt[c0 + i] * g[static_cast<size_t>(i)];
          g[static_cast<size_t>(i)] = v;
          ss += static_cast<double>(v) * v;
        }
        const float scale = static_cast<float>(1.0 / std::sqrt(ss / static_cast<double>(group_size) + eps));
        for (int64_t i = 0; i < group_size; ++i)
          ot[c0 + i] = g[static_cast<size_t>(i)] * scale * wf[static_cast<size_t>(c0 + i)];
      }
    }
  });
}

}  // namespace mambacpp::cpu
