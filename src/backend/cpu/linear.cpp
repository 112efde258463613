// y = x W^T (+ b) on the CPU, W [out, in] in f32/f16/bf16, through the vector dot products of simd.h.
// Few tokens (decode): the rows of W are split into contiguous blocks per thread and streamed once, read in their
// stored dtype and widened in registers, each block dotted against every token while it is in L1 — the pass over
// W is the bound. More tokens (prefill): the register-tiled GEMM of gemm.h over packed rows (x packed once per call,
// W widened to f32 once per L2-sized panel). Both paths compute each output element in dot_rows' order (widening is
// exact; gemm.h reproduces the order), so neither the number of tokens nor an element's neighbours change its bits.
#include <algorithm>

#include "hwy/aligned_allocator.h"

#include "backend/cpu/cpu_ops.h"
#include "backend/cpu/gemm.h"
#include "backend/cpu/linear_shares.h"
#include "backend/cpu/simd.h"
#include "backend/cpu/thread_pool.h"
#include "mambacpp/error.h"

namespace mambacpp::cpu {

void linear_f32(Rows<const float> x, WeightRef w, WeightRef bias, Rows<float> y, int64_t T, int64_t in, int64_t out,
                int threads, const LinearEpilogue& epilogue) {
  MAMBACPP_ASSERT(is_weight_float(w.dtype));
  const int64_t n_blocks = (out + kRowsPerBlock - 1) / kRowsPerBlock;
  const size_t wsize = dtype_size(w.dtype);
  auto block_ptr = [&](int64_t o0) { return static_cast<const char*>(w.data) + static_cast<size_t>(o0 * in) * wsize; };

  if (T <= kStreamTokens) {
    // A thread's share is worth a fork-join from ~32 KiB of weights: Mamba-1's x_proj (80 rows) splits in two.
    const int64_t block_bytes = kRowsPerBlock * in * static_cast<int64_t>(wsize);
    const int64_t grain = std::max<int64_t>(1, (kMinShareBytes + block_bytes - 1) / block_bytes);
    // kSharesPerThread contiguous shares per thread, taken in turn by whichever thread is free: with one fixed
    // half each, the caller waits for the slower thread's half; with many small shares each, the shorter streams read
    // further below the memory's rate (docs/benchmarks.md, decisions).
    const int64_t parts = std::max<int64_t>(1, std::min<int64_t>(n_blocks / grain, threads * kSharesPerThread));
    parallel_tasks(threads, parts, [&](int64_t part) {
      const int64_t b0 = n_blocks * part / parts, b1 = n_blocks * (part + 1) / parts;
      const int64_t o0 = b0 * kRowsPerBlock, nr = std::min(b1 * kRowsPerBlock, out) - o0;
      if (T == 1) {  // the share as one stream, which the hardware prefetcher follows best
        simd::dot_rows(x[0], block_ptr(o0), w.dtype, in, nr, y[0] + o0);
      } else {
        // Block by block, every token while the block is in cache: W is read from memory once, not once a token.
        for (int64_t b = o0; b < o0 + nr; b += kRowsPerBlock) {
          const int64_t n = std::min(kRowsPerBlock, o0 + nr - b);
          for (int64_t t = 0; t < T; ++t) simd::dot_rows(x[t], block_ptr(b), w.dtype, in, n, y[t] + b);
        }
      }
      for (int64_t t = 0; t < T; ++t) add_bias(bias, o0, nr, y[t] + o0);
      if (epilogue) epilogue(o0, nr);
    });
    return;
  }

  // Prefill: x packed once (shared by all threads); W in panels of rows that fit L2, each panel packed (widened to
  // f32) by the task that uses it. Enough panels: each task takes one panel and every token; too few for the
  // threads (a narrow projection): the tokens are split too, and a panel is packed once per token range.
  const int64_t Kp = simd::packed_row_floats(in), MR = simd::gemm_tile_tokens(), NR = simd::gemm_tile_rows();
  const int64_t Tp = (T + MR - 1) / MR * MR;
  thread_local AlignedFloats xbuf;  // reused across calls (no page faults per projection); grows to the largest call
  float* xp = xbuf.get(Tp * Kp);
  parallel_for(threads, T, 16, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) simd::pack_rows(x[t], DType::F32, 0, 1, in, xp + t * Kp);
  });
  std::fill(xp + T * Kp, xp + Tp * Kp, 0.0f);
  const int64_t panel = std::max(NR, kPanelBytes / (Kp * static_cast<int64_t>(sizeof(float))) / NR * NR);
  const int64_t n_panels = (out + panel - 1) / panel;
  const int64_t n_ranges = n_panels >= 2 * threads ? 1 : std::max<int64_t>(1, std::min<int64_t>(threads, Tp / MR));
  const int64_t range = (Tp / MR + n_ranges - 1) / n_ranges * MR;  // tokens per range, whole tiles
  parallel_for(threads, n_panels * n_ranges, 1, [&](int64_t task0, int64_t task1) {
    thread_local AlignedFloats wbuf;
    for (int64_t task = task0; task < task1; ++task) {
      const int64_t p = task / n_ranges, t0 = (task % n_ranges) * range;
      if (t0 >= T) continue;
      const int64_t o0 = p * panel, nr = std::min(panel, out - o0), nrp = (nr + NR - 1) / NR * NR;
      const int64_t nt = std::min(range, T - t0);
      float* wp = wbuf.get(nrp * Kp);
      simd::pack_rows(block_ptr(o0), w.dtype, in, nr, in, wp);
      std::fill(wp + nr * Kp, wp + nrp * Kp, 0.0f);
      simd::gemm_packed(xp + t0 * Kp, nt, wp, nr, in, y[t0] + o0, y.stride);
      for (int64_t t = t0; t < t0 + nt; ++t) add_bias(bias, o0, nr, y[t] + o0);
    }
  });
  if (epilogue) epilogue(0, out);
}

}  // namespace mambacpp::cpu
