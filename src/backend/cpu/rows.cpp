// Row-wise data movement on the CPU: residual add and embedding lookup (rows converted from the table's dtype).
#include <algorithm>

#include "backend/cpu/cpu_ops.h"
#include "backend/cpu/simd.h"
#include "backend/cpu/thread_pool.h"
#include "mambacpp/error.h"

namespace mambacpp::cpu {

void add_inplace_f32(Rows<float> acc, Rows<const float> x, int64_t T, int64_t D, int threads) {
  parallel_for(threads, T, 65536 / std::max<int64_t>(D, 1) + 1, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      float* a = acc[t];
      const float* b = x[t];
#pragma omp simd
      for (int64_t i = 0; i < D; ++i) a[i] += b[i];
    }
  });
}

void embed_f32(WeightRef table, int64_t V, const int32_t* ids, Rows<float> out, int64_t T, int64_t D, int threads) {
  for (int64_t t = 0; t < T; ++t)
    if (ids[t] < 0 || ids[t] >= V) fail("embed: token id ", ids[t], " at position ", t, " is outside [0, ", V, ")");
  const size_t esize = dtype_size(table.dtype);
  parallel_for(threads, T, 17, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      const void* row = static_cast<const char*>(table.data) + static_cast<size_t>(ids[t]) * static_cast<size_t>(D) * esize;
      if (table.dtype == DType::F64) convert_to_f32(row, table.dtype, out[t], D);
      else simd::to_f32(row, table.dtype, out[t], D);
    }
  });
}

}  // namespace mambacpp::cpu
