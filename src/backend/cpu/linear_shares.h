// What the CPU's linear kernels share, dense (linear.cpp) or block-format (packed_linear.cpp): how a GEMV's rows are
// cut into work for the threads, the GEMM's panel size, the aligned buffer the panels live in, and the bias pass.
// One set of numbers, so that both weight kinds split their work alike (docs/benchmarks.md, decisions).
#pragma once

#include <cstdint>

#include "hwy/aligned_allocator.h"

#include "backend/cpu/kernel_common.h"
#include "mambacpp/error.h"

namespace mambacpp::cpu {

inline constexpr int64_t kRowsPerBlock = 16;          // GEMV: W rows per unit of work
inline constexpr int64_t kPanelBytes = 192 * 1024;    // GEMM: an f32 panel of W rows stays in L2 (512 KiB on Zen 3)
inline constexpr int64_t kMinShareBytes = 32 * 1024;  // GEMV: the least weight bytes worth a thread of their own
inline constexpr int64_t kStreamTokens = 4;           // up to this many tokens, W is read in place as stored
inline constexpr int64_t kSharesPerThread = 2;  // GEMV: units of work per thread, handed out as threads free up

// A reusable 64-byte aligned f32 buffer (panels are read with whole-vector loads).
struct AlignedFloats {
  hwy::AlignedFreeUniquePtr<float[]> data;
  int64_t size = 0;
  float* get(int64_t n) {
    if (n > size) {
      data = hwy::AllocateAligned<float>(static_cast<size_t>(n));
      if (!data) fail("linear: out of memory for a packed buffer of ", n, " floats");
      size = n;
    }
    return data.get();
  }
};

// yt[r] += bias[o0 + r] for the nr rows from o0 (nothing without a bias).
inline void add_bias(WeightRef bias, int64_t o0, int64_t nr, float* yt) {
  if (!bias.present()) return;
  for (int64_t r = 0; r < nr; ++r) yt[r] += weight_at<float>(bias, o0 + r);
}

}  // namespace mambacpp::cpu
