// select_top_k on the GPU (definition in mambacpp/top_k.h): one block of 1024 threads per logits row.
//   1. the repetition penalty, in place, one thread per penalised id (ids are distinct: no two threads share one);
//   2. k == 1: one pass, a block argmax over (key, -id) plus the lowest bad id;
//      k > 1: a radix select for the k-th largest key, 8 bits per pass from the top (<= 4 passes over the row, a
//      shared 256-bin histogram fed by warp-aggregated atomics), then one pass in id order that collects every key
//      above the threshold and the lowest-id keys equal to it (a block-wide ballot scan), then a bitonic sort of the
//      <= 256 candidates by (key descending, id ascending) in shared memory.
// Keys are the logits mapped to uint32 so that unsigned order is float order, with -0 folded onto +0 (the two
// compare equal as floats, so they must tie). Only considered entries (id < limit, not -inf, not NaN) take part.
// Output (one row of `out_stride` int32 words per logits row, fetched by one copy):
//   [0] count, [1] bad id (-1: none), [2] bad value bits, [3, 3 + kmax) ids, [3 + kmax, 3 + 2 kmax) value bits.
// Values are read back from the penalised row, so they are bitwise what a CPU computes (the division and the
// product of the penalty are IEEE operations here too: no fast-math flags in this build).
#include <climits>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/cuda_ops.h"

namespace mambacpp::cuda {
namespace {

constexpr int kThreads = 1024;
constexpr int kWarps = kThreads / 32;
// Each thread loads kUnroll entries of a tile before it looks at any: one block reads a whole row, so its passes
// are bound by load latency unless many loads are in flight.
constexpr int kUnroll = 8;
constexpr int kTile = kThreads * kUnroll;
constexpr int kSortSize = kMaxTopK;  // candidates fit one bitonic network
static_assert((kSortSize & (kSortSize - 1)) == 0, "the bitonic sort needs a power of two");
constexpr unsigned kFull = 0xffffffffu;

__device__ __forceinline__ uint32_t key_of(float v) {
  uint32_t b = __float_as_uint(v);
  if (b == 0x80000000u) b = 0;  // -0 -> +0
  return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}
__device__ __forceinline__ bool is_bad(float v) { return isnan(v) || v == __int_as_float(0x7f800000); }
__device__ __forceinline__ bool is_considered(float v) { return !isnan(v) && v != __int_as_float(0xff800000); }

// Entries [base, base + kTile) of a row as kUnroll sub-tiles of kThreads consecutive ids (sub-tile u, thread t:
// id base + u * kThreads + t); ids at or past `limit` read as -inf.
__device__ __forceinline__ void load_tile(const float* row, int base, int limit, float (&v)[kUnroll]) {
#pragma unroll
  for (int u = 0; u < kUnroll; ++u) {
    const int i = base + u * kThreads + static_cast<int>(threadIdx.x);
    v[u] = i < limit ? row[i] : __int_as_float(0xff800000);
  }
}

// Candidate a goes before b: larger key, then lower id.
__device__ __forceinline__ bool before(uint32_t ka, int32_t ia, uint32_t kb, int32_t ib) {
  return ka > kb || (ka == kb && ia < ib);
}

struct SelectShared {
  uint32_t hist[256];
  uint32_t keys[kSortSize];
  int32_t ids[kSortSize];
  uint32_t warp_ties[2][kWarps];  // per-warp tie counts of a tile, double-buffered by tile parity
  unsigned long long warp_best[kWarps];
  int bad;             // lowest bad id (INT_MAX: none)
  uint32_t prefix;     // key bits chosen so far
  uint32_t remaining;  // candidates still to take from inside the chosen bin
  uint32_t k_eff;      // min(k, considered)
  uint32_t n_above;    // candidates collected above the threshold
  int done;            // the threshold is final (the chosen bin is taken whole, or 4 passes ran)
  int shift;           // the bits below the prefix
};

__global__ void __launch_bounds__(kThreads) select_top_k_kernel(SelectLaunch p) {
  __shared__ SelectShared sh;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const SelectRowParams rp = p.rows[blockIdx.x];
  float* row = p.logits + static_cast<int64_t>(blockIdx.x) * p.stride;
  int32_t* out = p.out + static_cast<int64_t>(blockIdx.x) * p.out_stride;
  const int limit = rp.limit;

  // 1. Penalty. Writes to global memory are visible to the whole block after the barrier.
  if (rp.penalty != 1.0f) {
    for (int j = tid; j < rp.pen_count; j += kThreads) {
      const int id = p.pen_ids[rp.pen_offset + j];
      if (id < limit) {
        const float v = row[id];
        row[id] = v > 0.0f ? v / rp.penalty : v * rp.penalty;
      }
    }
  }
  if (tid == 0) sh.bad = INT_MAX;
  __syncthreads();

  auto write_header = [&](int count, int bad_id) {
    out[0] = count;
    out[1] = bad_id;
    out[2] = bad_id >= 0 ? __float_as_int(row[bad_id]) : 0;
  };

  // 2a. k == 1: argmax. (key << 32 | ~id) is largest for the largest key, then the lowest id; 0 means none (key 0
  // is a negative NaN, never considered).
  if (rp.k == 1) {
    unsigned long long best = 0;
    int bad = INT_MAX;
    for (int base = 0; base < limit; base += kTile) {
      float v[kUnroll];
      load_tile(row, base, limit, v);
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const int i = base + u * kThreads + tid;
        if (is_bad(v[u])) bad = min(bad, i);
        if (is_considered(v[u])) {
          const unsigned long long c =
              (static_cast<unsigned long long>(key_of(v[u])) << 32) | (~static_cast<uint32_t>(i));
          best = c > best ? c : best;
        }
      }
    }
    for (int off = 16; off > 0; off >>= 1) {
      const unsigned long long o = __shfl_xor_sync(kFull, best, off);
      best = o > best ? o : best;
      bad = min(bad, __shfl_xor_sync(kFull, bad, off));
    }
    if (lane == 0) {
      sh.warp_best[warp] = best;
      if (bad != INT_MAX) atomicMin(&sh.bad, bad);
    }
    __syncthreads();
    if (warp == 0) {
      best = sh.warp_best[lane];
      for (int off = 16; off > 0; off >>= 1) {
        const unsigned long long o = __shfl_xor_sync(kFull, best, off);
        best = o > best ? o : best;
      }
      if (lane == 0) {
        if (sh.bad != INT_MAX) {
          write_header(0, sh.bad);
        } else if (best == 0) {
          write_header(0, -1);
        } else {
          const int id = static_cast<int>(~static_cast<uint32_t>(best));
          write_header(1, -1);
          out[3] = id;
          out[3 + p.kmax] = __float_as_int(row[id]);
        }
      }
    }
    return;
  }

  // 2b. Radix select: after pass `pass`, `prefix` holds the top 8 * (pass + 1) bits of the k-th largest key.
  if (tid == 0) {
    sh.prefix = 0;
    sh.remaining = static_cast<uint32_t>(rp.k);
    sh.done = 0;
  }
  for (int pass = 0; pass < 4; ++pass) {
    const int shift = 24 - 8 * pass;
    if (tid < 256) sh.hist[tid] = 0;
    __syncthreads();
    const uint32_t prefix = sh.prefix;
    int bad = INT_MAX;
    // Every thread runs the same number of iterations, so whole warps meet at the match below.
    for (int base = 0; base < limit; base += kTile) {
      float v[kUnroll];
      load_tile(row, base, limit, v);
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const int i = base + u * kThreads + tid;
        if (pass == 0 && is_bad(v[u])) bad = min(bad, i);
        const uint32_t key = key_of(v[u]);
        const bool take = is_considered(v[u]) && (pass == 0 || (key >> (shift + 8)) == prefix);
        const uint32_t bin = take ? (key >> shift) & 255u : 256u;
        if (__any_sync(kFull, take)) {  // later passes: most warps hold no entry of the chosen prefix
          const unsigned peers = __match_any_sync(kFull, bin);
          if (take && lane == __ffs(peers) - 1) atomicAdd(&sh.hist[bin], static_cast<uint32_t>(__popc(peers)));
        }
      }
    }
    if (pass == 0) {
      for (int off = 16; off > 0; off >>= 1) bad = min(bad, __shfl_xor_sync(kFull, bad, off));
      if (lane == 0 && bad != INT_MAX) atomicMin(&sh.bad, bad);
    }
    __syncthreads();
    if (warp == 0) {
      uint32_t rem = sh.remaining;
      __syncwarp();  // every lane has read `remaining` before the lane that finds the bin rewrites it
      // Lane l holds bins 255 - 8l down to 248 - 8l: lanes in descending key order.
      uint32_t c[8], sum = 0;
#pragma unroll
      for (int j = 0; j < 8; ++j) sum += (c[j] = sh.hist[255 - 8 * lane - j]);
      uint32_t incl = sum;
      for (int off = 1; off < 32; off <<= 1) {
        const uint32_t o = __shfl_up_sync(kFull, incl, off);
        if (lane >= off) incl += o;
      }
      if (pass == 0) {  // the whole histogram counts the considered entries
        const uint32_t total = __shfl_sync(kFull, incl, 31);
        rem = min(rem, total);
        if (lane == 0) sh.k_eff = rem;
      }
      const uint32_t excl = incl - sum;
      if (rem > 0 && excl < rem && incl >= rem) {  // exactly one lane holds the bin of the rem-th largest
        uint32_t r = rem - excl;
#pragma unroll
        for (int j = 0; j < 8; ++j) {
          if (r <= c[j]) {
            sh.prefix = (prefix << 8) | static_cast<uint32_t>(255 - 8 * lane - j);
            sh.remaining = r;
            sh.shift = shift;
            // Taking the whole bin: its lowest key is the threshold and there are no ties to break.
            sh.done = (r == c[j] || pass == 3) ? 1 : 0;
            if (r == c[j]) sh.remaining = 0;
            break;
          }
          r -= c[j];
        }
      }
    }
    __syncthreads();
    if (sh.bad != INT_MAX || sh.k_eff == 0) {
      if (tid == 0) write_header(0, sh.bad != INT_MAX ? sh.bad : -1);
      return;
    }
    if (sh.done) break;
  }

  // 3. Collection in id order. Entries with key >= take_from are all taken; when ties at `tie_key` must be broken
  // (remaining > 0), the `remaining` lowest ids among them are taken after the n_above larger ones.
  const uint32_t k_eff = sh.k_eff, ties_wanted = sh.remaining;
  const int shift = sh.shift;
  const uint32_t tie_key = sh.prefix << shift;  // after 4 passes shift == 0: the exact k-th key
  const uint32_t n_above = k_eff - ties_wanted;
  // Whole bin taken: everything from the bin's lowest key up. Otherwise strictly above the k-th key.
  const uint32_t take_from = ties_wanted == 0 ? tie_key : tie_key + 1;
  if (tid == 0) sh.n_above = 0;
  __syncthreads();
  uint32_t ties_before = 0;  // ties at tie_key seen in earlier sub-tiles (the same in every thread)
  int sub = 0;               // sub-tiles done: its parity picks the buffer of per-warp tie counts
  for (int base = 0; base < limit; base += kTile) {
    float v[kUnroll];
    load_tile(row, base, limit, v);
#pragma unroll
    for (int u = 0; u < kUnroll; ++u, ++sub) {
      const int i = base + u * kThreads + tid;
      const uint32_t key = key_of(v[u]);
      const bool ok = is_considered(v[u]);
      if (ok && key >= take_from) {
        const uint32_t pos = atomicAdd(&sh.n_above, 1u);
        sh.keys[pos] = key;
        sh.ids[pos] = i;
      }
      const bool tie = ok && ties_wanted > 0 && key == tie_key && ties_before < ties_wanted;
      if (__syncthreads_or(tie)) {
        const unsigned ballot = __ballot_sync(kFull, tie);
        uint32_t* counts = sh.warp_ties[sub & 1];
        if (lane == 0) counts[warp] = static_cast<uint32_t>(__popc(ballot));
        __syncthreads();
        uint32_t before_warp = 0, total = 0;
        for (int w = 0; w < kWarps; ++w) {
          const uint32_t n = counts[w];
          before_warp += w < warp ? n : 0;
          total += n;
        }
        const uint32_t rank = ties_before + before_warp + static_cast<uint32_t>(__popc(ballot & ((1u << lane) - 1u)));
        if (tie && rank < ties_wanted) {
          sh.keys[n_above + rank] = key;
          sh.ids[n_above + rank] = i;
        }
        ties_before += total;
      }
    }
  }
  // Padding sorts last.
  for (int j = static_cast<int>(k_eff) + tid; j < kSortSize; j += kThreads) {
    sh.keys[j] = 0;
    sh.ids[j] = INT_MAX;
  }
  __syncthreads();

  // 4. Bitonic sort of kSortSize entries, best first; each thread of the first half compares one pair per step.
  for (int size = 2; size <= kSortSize; size <<= 1) {
    for (int stride = size >> 1; stride > 0; stride >>= 1) {
      if (tid < kSortSize / 2) {
        const int a = 2 * tid - (tid & (stride - 1)), b = a + stride;
        const bool ascending_block = (a & size) != 0;  // this half of the merge runs the other way
        const uint32_t ka = sh.keys[a], kb = sh.keys[b];
        const int32_t ia = sh.ids[a], ib = sh.ids[b];
        if (before(kb, ib, ka, ia) != ascending_block) {
          sh.keys[a] = kb, sh.keys[b] = ka;
          sh.ids[a] = ib, sh.ids[b] = ia;
        }
      }
      __syncthreads();
    }
  }
  for (int j = tid; j < static_cast<int>(k_eff); j += kThreads) {
    const int id = sh.ids[j];
    out[3 + j] = id;
    out[3 + p.kmax + j] = __float_as_int(row[id]);
  }
  if (tid == 0) write_header(static_cast<int>(k_eff), -1);
}

}  // namespace

void launch_select_top_k(const SelectLaunch& p, cudaStream_t stream) {
  if (p.n_rows == 0) return;
  select_top_k_kernel<<<static_cast<unsigned>(p.n_rows), kThreads, 0, stream>>>(p);
  MAMBACPP_CUDA_LAUNCHED();
}

}  // namespace mambacpp::cuda
