// y = x W^T (+ b) on the CPU, W [out, in] in f32/f16/bf16 converted on the fly.
// Work is split into (tile of tokens, block of W rows): a task converts its block of W rows to f32 once (into a
// thread-local buffer; f32 weights are used in place) and dots it against every token row of its tile. For T == 1
// (decode) that is one streaming pass over W, the bound for memory-bound decode.
// Each output element is a dot product with kLanes independent partial sums, reduced in a fixed tree: the same
// operations for every element whatever T and whatever the element's neighbours, so batching never changes bits.
#include <algorithm>
#include <vector>

#include "backend/cpu/cpu_ops.h"
#include "mambacpp/error.h"

namespace mambacpp::cpu {
namespace {

constexpr int64_t kLanes = 8;           // partial sums per dot product (one AVX register of f32)
constexpr int64_t kRowsPerBlock = 16;   // W rows per task: their f32 copy stays in L1/L2 across the token tile
constexpr int64_t kTokensPerTile = 64;  // token rows per task: the x tile stays in L2 across W blocks

// out[r] = dot(x, w + r * n) for R rows of W, each with its own kLanes partial sums; element-wise identical for
// every R (only the number of rows sharing each load of x changes).
template <int R>
inline void dot_rows(const float* x, const float* w, int64_t n, float* out) {
  float acc[R][kLanes] = {};
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    for (int r = 0; r < R; ++r) {
      const float* wr = w + r * n + i;
      for (int64_t k = 0; k < kLanes; ++k) acc[r][k] += x[i + k] * wr[k];
    }
  }
  for (int64_t k = 0; i + k < n; ++k)
    for (int r = 0; r < R; ++r) acc[r][k] += x[i + k] * w[r * n + i + k];
  for (int r = 0; r < R; ++r) {
    const float* a = acc[r];
    out[r] = ((a[0] + a[1]) + (a[2] + a[3])) + ((a[4] + a[5]) + (a[6] + a[7]));
  }
}
static_assert(kLanes == 8, "dot_rows' reduction tree is written for 8 lanes");

}  // namespace

void linear_f32(Rows<const float> x, WeightRef w, WeightRef bias, Rows<float> y, int64_t T, int64_t in, int64_t out,
                int threads) {
  const int64_t n_blocks = (out + kRowsPerBlock - 1) / kRowsPerBlock;
  const int64_t n_tiles = (T + kTokensPerTile - 1) / kTokensPerTile;
  const bool f32 = w.dtype == DType::F32;
  const size_t wsize = dtype_size(w.dtype);
  MAMBACPP_ASSERT(w.dtype == DType::F32 || w.dtype == DType::F16 || w.dtype == DType::BF16);

#pragma omp parallel num_threads(threads)
  {
    std::vector<float> wbuf(f32 ? 0 : static_cast<size_t>(kRowsPerBlock * in));
#pragma omp for collapse(2) schedule(static)
    for (int64_t tile = 0; tile < n_tiles; ++tile) {
      for (int64_t blk = 0; blk < n_blocks; ++blk) {
        const int64_t o0 = blk * kRowsPerBlock, nr = std::min(kRowsPerBlock, out - o0);
        const void* wsrc = static_cast<const char*>(w.data) + static_cast<size_t>(o0 * in) * wsize;
        const float* wb = static_cast<const float*>(wsrc);
        if (!f32) {
          convert_to_f32(wsrc, w.dtype, wbuf.data(), nr * in);
          wb = wbuf.data();
        }
        float b[kRowsPerBlock];
        for (int64_t r = 0; r < nr; ++r) b[r] = bias.present() ? weight_at<float>(bias, o0 + r) : 0.0f;

        const int64_t t1 = std::min(T, (tile + 1) * kTokensPerTile);
        for (int64_t t = tile * kTokensPerTile; t < t1; ++t) {
          const float* xt = x[t];
          float* yt = y[t] + o0;
          int64_t r = 0;
          for (; r + 4 <= nr; r += 4) dot_rows<4>(xt, wb + r * in, in, yt + r);
          for (; r < nr; ++r) dot_rows<1>(xt, wb + r * in, in, yt + r);
          if (bias.present())
            for (r = 0; r < nr; ++r) yt[r] += b[r];
        }
      }
    }
  }
}

}  // namespace mambacpp::cpu
