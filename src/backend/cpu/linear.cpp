// y = x W^T (+ b) on the CPU, W [out, in] in f32/f16/bf16, through the vector dot products of simd.h.
// Few tokens (decode): the rows of W are split into contiguous blocks per thread and streamed once, read in their
// stored dtype and widened in registers, each block dotted against every token while it is in L1 — the pass over
// W is the bound. More tokens (prefill): work is split into (tile of tokens, block of W rows); a task widens its
// block of W rows to f32 once (f32 weights are used in place) and dots it against every token row of its tile.
// Both paths compute each output element with the same dot_rows order (widening is exact), so neither the number
// of tokens nor an element's neighbours change its bits.
#include <algorithm>
#include <vector>

#include "backend/cpu/cpu_ops.h"
#include "backend/cpu/simd.h"
#include "backend/cpu/thread_pool.h"
#include "mambacpp/error.h"

namespace mambacpp::cpu {
namespace {

constexpr int64_t kRowsPerBlock = 16;   // W rows per task: their f32 copy stays in L1/L2 across the token tile
constexpr int64_t kTokensPerTile = 64;  // token rows per task: the x tile stays in L2 across W blocks
constexpr int64_t kStreamTokens = 4;    // up to this many tokens, W is read in place in its stored dtype

void add_bias(WeightRef bias, int64_t o0, int64_t nr, float* yt) {
  if (!bias.present()) return;
  for (int64_t r = 0; r < nr; ++r) yt[r] += weight_at<float>(bias, o0 + r);
}

}  // namespace

void linear_f32(Rows<const float> x, WeightRef w, WeightRef bias, Rows<float> y, int64_t T, int64_t in, int64_t out,
                int threads) {
  MAMBACPP_ASSERT(w.dtype == DType::F32 || w.dtype == DType::F16 || w.dtype == DType::BF16);
  const int64_t n_blocks = (out + kRowsPerBlock - 1) / kRowsPerBlock;
  const size_t wsize = dtype_size(w.dtype);
  auto block_ptr = [&](int64_t o0) { return static_cast<const char*>(w.data) + static_cast<size_t>(o0 * in) * wsize; };

  if (T <= kStreamTokens) {
    parallel_for(threads, n_blocks, 4, [&](int64_t b0, int64_t b1) {
      const int64_t o0 = b0 * kRowsPerBlock, nr = std::min(b1 * kRowsPerBlock, out) - o0;
      for (int64_t t = 0; t < T; ++t) {
        simd::dot_rows(x[t], block_ptr(o0), w.dtype, in, nr, y[t] + o0);
        add_bias(bias, o0, nr, y[t] + o0);
      }
    });
    return;
  }

  const int64_t n_tiles = (T + kTokensPerTile - 1) / kTokensPerTile;
  const bool f32 = w.dtype == DType::F32;
  parallel_for(threads, n_tiles * n_blocks, 1, [&](int64_t task0, int64_t task1) {
    std::vector<float> wbuf(f32 ? 0 : static_cast<size_t>(kRowsPerBlock * in));
    for (int64_t task = task0; task < task1; ++task) {
      const int64_t tile = task / n_blocks, blk = task % n_blocks;
      const int64_t o0 = blk * kRowsPerBlock, nr = std::min(kRowsPerBlock, out - o0);
      const float* wb = reinterpret_cast<const float*>(block_ptr(o0));
      if (!f32) {
        simd::to_f32(block_ptr(o0), w.dtype, wbuf.data(), nr * in);
        wb = wbuf.data();
      }
      const int64_t t1 = std::min(T, (tile + 1) * kTokensPerTile);
      for (int64_t t = tile * kTokensPerTile; t < t1; ++t) {
        simd::dot_rows(x[t], wb, DType::F32, in, nr, y[t] + o0);
        add_bias(bias, o0, nr, y[t] + o0);
      }
    }
  });
}

}  // namespace mambacpp::cpu
