// The mixture-of-experts kernels (declarations and the design in moe_kernels.cuh).
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cmath>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/moe_kernels.cuh"
#include "backend/cuda/weight_loads.cuh"
#include "mambacpp/error.h"

namespace mambacpp::cuda {
namespace {

// ---- Routing ---------------------------------------------------------------------------------------------------
// One warp per token. Lane l owns experts l, l + 32, ... (its taken flags in a register bit mask); the scores sit in
// shared memory. Each pick is a warp-wide arg-max under one strict order: a non-NaN score beats a NaN one, a larger
// one a smaller one, and equal ones (or two NaNs) go to the lower index. Without exact ties the ids are the host's;
// at exact ties the host follows torch's CPU top-k order instead (moe::torch_top_k), and both are a valid top k.
// The sums whose order shows in the bits (the softmax denominator over all experts, the weights' sums) are taken by
// lane 0 in the host's order.

constexpr int kRouteWarps = 4;  // tokens per block

__device__ __forceinline__ bool better(float v, int i, float bv, int bi) {
  if (i < 0) return false;
  if (bi < 0) return true;
  const bool vn = isnan(v), bn = isnan(bv);
  if (vn != bn) return bn;
  if (!vn && v != bv) return v > bv;
  return i < bi;
}

// The best of score[e] over the experts e < n this lane owns whose bit in `taken` is clear, then over the warp.
__device__ __forceinline__ int warp_first_max(const float* score, int n, uint32_t taken, int lane) {
  float bv = 0.0f;
  int bi = -1;
  for (int m = 0; lane + 32 * m < n; ++m) {
    const int e = lane + 32 * m;
    if ((taken >> m) & 1u) continue;
    if (better(score[e], e, bv, bi)) bv = score[e], bi = e;
  }
#pragma unroll
  for (int d = 16; d >= 1; d >>= 1) {
    const float ov = __shfl_xor_sync(0xffffffffu, bv, d);
    const int oi = __shfl_xor_sync(0xffffffffu, bi, d);
    if (better(ov, oi, bv, bi)) bv = ov, bi = oi;
  }
  return bi;
}

__global__ void __launch_bounds__(kRouteWarps * 32) moe_route_kernel(MoeRouteLaunch p) {
  extern __shared__ float route_smem[];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t t = blockIdx.x * int64_t(kRouteWarps) + warp;
  if (t >= p.T) return;  // warp-uniform
  const int E = static_cast<int>(p.E), k = static_cast<int>(p.k);
  float* s = route_smem + warp * 2 * E;  // scores whose values become the weights
  float* c = s + E;                      // scores that rank the choice
  const float* l = p.logits + t * p.logits_stride;
  int32_t* ids = p.ids + t * k;
  float* w = p.weights + t * k;
  uint32_t taken = 0;  // bit m: expert lane + 32 m

  if (p.rule == MoeRouteRule::SigmoidGrouped) {
    for (int e = lane; e < E; e += 32) {
      s[e] = 1.0f / (1.0f + expf(-l[e]));
      c[e] = p.bias ? s[e] + p.bias[e] : s[e];
    }
    __syncwarp();
    const int G = static_cast<int>(p.n_group), per = E / G;
    if (G > 1) {
      // A group's score: its two best biased scores summed (the multiset's top two: any scan order gives them).
      __shared__ float group_smem[kRouteWarps][kMoeMaxGroups];
      float* group = group_smem[warp];
      for (int g = lane; g < G; g += 32) {
        float b1 = -INFINITY, b2 = b1;
        for (int i = 0; i < per; ++i) {
          const float v = c[g * per + i];
          if (v > b1) b2 = b1, b1 = v;
          else if (v > b2) b2 = v;
        }
        group[g] = b1 + b2;
      }
      __syncwarp();
      uint32_t group_taken = 0;  // groups lane + 32 m, as for the experts
      uint32_t eligible_lane_mask[2] = {0u, 0u};
      for (int j = 0; j < p.topk_group; ++j) {
        const int g = warp_first_max(group, G, group_taken, lane);
        if ((g & 31) == lane) group_taken |= 1u << (g >> 5);
        eligible_lane_mask[g >> 5] |= 1u << (g & 31);
      }
      for (int m = 0; lane + 32 * m < E; ++m) {
        const int g = (lane + 32 * m) / per;
        if (!((eligible_lane_mask[g >> 5] >> (g & 31)) & 1u)) taken |= 1u << m;  // not eligible
      }
    }
    for (int j = 0; j < k; ++j) {
      const int e = warp_first_max(c, E, taken, lane);
      if ((e & 31) == lane) taken |= 1u << (e >> 5);
      if (lane == 0) ids[j] = e, w[j] = s[e];
    }
    if (lane == 0) {
      float sum = 0.0f;
      for (int j = 0; j < k; ++j) sum += w[j];
      const float denom = sum + 1e-20f;
      for (int j = 0; j < k; ++j) {
        float v = w[j];
        if (p.renormalize) v /= denom;
        w[j] = v * p.scale;
      }
    }
    return;
  }
  if (p.rule == MoeRouteRule::SoftmaxAll) {
    float mx = -INFINITY;  // the host's std::max scan: NaN never replaces, so it is the largest non-NaN logit
    for (int e = lane; e < E; e += 32) mx = mx < l[e] ? l[e] : mx;
#pragma unroll
    for (int d = 16; d >= 1; d >>= 1) {
      const float o = __shfl_xor_sync(0xffffffffu, mx, d);
      mx = mx < o ? o : mx;
    }
    for (int e = lane; e < E; e += 32) s[e] = expf(l[e] - mx);
    __syncwarp();
    float sum = 0.0f;
    if (lane == 0)
      for (int e = 0; e < E; ++e) sum += s[e];  // the host's order
    sum = __shfl_sync(0xffffffffu, sum, 0);
    for (int e = lane; e < E; e += 32) s[e] /= sum;
    __syncwarp();
    for (int j = 0; j < k; ++j) {
      const int e = warp_first_max(s, E, taken, lane);
      if ((e & 31) == lane) taken |= 1u << (e >> 5);
      if (lane == 0) ids[j] = e, w[j] = s[e];
    }
    return;
  }
  // SoftmaxChosen: the k best logits, softmax over them.
  for (int e = lane; e < E; e += 32) s[e] = l[e];
  __syncwarp();
  for (int j = 0; j < k; ++j) {
    const int e = warp_first_max(s, E, taken, lane);
    if ((e & 31) == lane) taken |= 1u << (e >> 5);
    if (lane == 0) ids[j] = e, w[j] = s[e];
  }
  if (lane == 0) {
    const float mx = w[0];
    float sum = 0.0f;
    for (int j = 0; j < k; ++j) sum += (w[j] = expf(w[j] - mx));
    for (int j = 0; j < k; ++j) w[j] /= sum;
  }
}

// ---- Sort ------------------------------------------------------------------------------------------------------

constexpr int kSortThreads = 1024;
static_assert(kSortThreads == kMoeMaxExperts, "the sort's scan gives each expert one thread");

__global__ void __launch_bounds__(kSortThreads)
    moe_sort_kernel(const int32_t* ids, int64_t P, int64_t E, int32_t* offsets, int32_t* sorted, int32_t* pos,
                    int32_t* active) {
  __shared__ int32_t count[kMoeMaxExperts];
  __shared__ int32_t cursor[kMoeMaxExperts];
  for (int64_t e = threadIdx.x; e < E; e += blockDim.x) count[e] = 0;
  __syncthreads();
  for (int64_t i = threadIdx.x; i < P; i += blockDim.x) {
    const int32_t e = ids[i];
    if (e >= 0 && e < E) atomicAdd(&count[e], 1);  // counts: the order of the additions does not matter
  }
  __syncthreads();
  // Offsets (exclusive prefix sum of the counts) and the active list (prefix sum of count > 0), thread e for expert e
  // (kSortThreads == kMoeMaxExperts): warp scans, then a scan of the warp totals.
  __shared__ int32_t warp_count[kSortThreads / 32], warp_active[kSortThreads / 32];
  const int tid = threadIdx.x, tl = tid % 32, tw = tid / 32;
  const int32_t mine = tid < E ? count[tid] : 0, flag = mine > 0 ? 1 : 0;
  int32_t c = mine, f = flag;
#pragma unroll
  for (int d = 1; d < 32; d <<= 1) {
    const int32_t uc = __shfl_up_sync(0xffffffffu, c, d), uf = __shfl_up_sync(0xffffffffu, f, d);
    if (tl >= d) c += uc, f += uf;
  }
  if (tl == 31) warp_count[tw] = c, warp_active[tw] = f;
  __syncthreads();
  if (tw == 0) {
    int32_t wc = warp_count[tl], wf = warp_active[tl];
#pragma unroll
    for (int d = 1; d < 32; d <<= 1) {
      const int32_t uc = __shfl_up_sync(0xffffffffu, wc, d), uf = __shfl_up_sync(0xffffffffu, wf, d);
      if (tl >= d) wc += uc, wf += uf;
    }
    warp_count[tl] = wc;  // inclusive totals through warp tl
    warp_active[tl] = wf;
  }
  __syncthreads();
  const int32_t before_c = (tw > 0 ? warp_count[tw - 1] : 0) + c - mine;
  const int32_t before_f = (tw > 0 ? warp_active[tw - 1] : 0) + f - flag;
  const int32_t n_active = warp_active[kSortThreads / 32 - 1];
  if (tid < E) {
    offsets[tid] = before_c;
    cursor[tid] = before_c;
    if (flag) active[before_f] = tid;      // places 0 .. n_active - 1
    if (tid >= n_active) active[tid] = -1;  // places n_active .. E - 1: disjoint from the above
  }
  if (tid == 0) offsets[E] = warp_count[kSortThreads / 32 - 1];
  __syncthreads();
  // The scatter: one warp, 32 pairs at a time in pair order; lanes with the same expert take consecutive places in
  // lane order, so the order within an expert is ascending pair index.
  if (threadIdx.x >= 32) return;
  const unsigned lane = threadIdx.x;
  for (int64_t base = 0; base < P; base += 32) {
    const int64_t i = base + lane;
    const bool live = i < P;
    const int32_t e = live ? ids[i] : -1;
    const bool valid = live && e >= 0 && e < E;
    const unsigned group = __match_any_sync(0xffffffffu, valid ? e : -1 - static_cast<int32_t>(lane));
    const unsigned before = group & ((1u << lane) - 1u);
    int32_t place = -1;
    if (valid) {
      place = cursor[e] + __popc(before);
      sorted[place] = static_cast<int32_t>(i);
    }
    if (live) pos[i] = place;
    __syncwarp();
    if (valid && before == 0u) cursor[e] += __popc(group);
    __syncwarp();
  }
}

// ---- Grouped GEMV ----------------------------------------------------------------------------------------------

constexpr int kGemvWarps = 8;  // output rows per block (one per warp)
constexpr int kRun = 8;        // pairs per pass over a weight row

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int m = 16; m >= 1; m >>= 1) v += __shfl_xor_sync(0xffffffffu, v, m);
  return v;
}

// Input values x[i .. i + n) as floats (n = 16 bytes of weights: 8 for 16-bit, 4 for f32).
template <int N>
__device__ __forceinline__ void load_x(const float* x, float* out) {
  const float4* v = reinterpret_cast<const float4*>(x);
#pragma unroll
  for (int q = 0; q < N / 4; ++q) {
    const float4 f = __ldg(v + q);
    out[4 * q] = f.x, out[4 * q + 1] = f.y, out[4 * q + 2] = f.z, out[4 * q + 3] = f.w;
  }
}

template <class W, bool TWO, bool VEC>
__global__ void __launch_bounds__(kGemvWarps * 32) moe_gemv_kernel(MoeGemvLaunch p) {
  const int32_t e = p.active[blockIdx.y];
  if (e < 0) return;
  const int64_t o = blockIdx.x * int64_t(kGemvWarps) + threadIdx.x / 32;
  if (o >= p.out) return;
  const int lane = threadIdx.x % 32;
  const int64_t in = p.in;
  const W* wa = static_cast<const W*>(p.a[e]) + (p.a_row0 + o) * in;
  const W* wb = TWO ? static_cast<const W*>(p.b[e]) + (p.b_row0 + o) * in : nullptr;
  const int64_t beg = p.offsets[e], end = p.offsets[e + 1];
  for (int64_t s0 = beg; s0 < end; s0 += kRun) {
    const int n = static_cast<int>(end - s0 < kRun ? end - s0 : kRun);
    const float* xr[kRun];
#pragma unroll
    for (int q = 0; q < kRun; ++q) {
      const int64_t s = s0 + (q < n ? q : 0);
      const int64_t row = p.by_token ? p.sorted[s] / p.k : s;
      xr[q] = p.x + row * p.x_stride;
    }
    float acc_a[kRun], acc_b[kRun];
#pragma unroll
    for (int q = 0; q < kRun; ++q) acc_a[q] = 0.0f, acc_b[q] = 0.0f;
    if constexpr (VEC) {
      constexpr int V = 16 / sizeof(W);
#pragma unroll 2
      for (int64_t i = int64_t(lane) * V; i < in; i += 32 * V) {  // two loads in flight per lane and table
        float fa[V], fb[V];
        unpack16<W>(__ldg(reinterpret_cast<const uint4*>(wa + i)), fa);
        if constexpr (TWO) unpack16<W>(__ldg(reinterpret_cast<const uint4*>(wb + i)), fb);
#pragma unroll
        for (int q = 0; q < kRun; ++q) {
          if (q < n) {
            float xv[V];
            load_x<V>(xr[q] + i, xv);
#pragma unroll
            for (int v = 0; v < V; ++v) {
              acc_a[q] = fmaf(fa[v], xv[v], acc_a[q]);
              if constexpr (TWO) acc_b[q] = fmaf(fb[v], xv[v], acc_b[q]);
            }
          }
        }
      }
    } else {
      for (int64_t i = lane; i < in; i += 32) {
        const float fa = w_to_f(wa[i]);
        const float fb = TWO ? w_to_f(wb[i]) : 0.0f;
#pragma unroll
        for (int q = 0; q < kRun; ++q) {
          if (q < n) {
            const float xv = __ldg(xr[q] + i);
            acc_a[q] = fmaf(fa, xv, acc_a[q]);
            if constexpr (TWO) acc_b[q] = fmaf(fb, xv, acc_b[q]);
          }
        }
      }
    }
#pragma unroll
    for (int q = 0; q < kRun; ++q) {
      if (q < n) {  // n is the same across the warp: every lane takes part in the shuffles
        const float a = warp_sum(acc_a[q]);
        const float b = TWO ? warp_sum(acc_b[q]) : 0.0f;
        if (lane == 0) {
          float r = a;
          if (p.epilogue == MoeEpilogue::Relu2) {
            const float v = a > 0.0f ? a : 0.0f;
            r = v * v;
          } else if (p.epilogue == MoeEpilogue::SiluMul) {
            r = a / (1.0f + expf(-a)) * b;
          }
          p.y[(s0 + q) * p.y_stride + o] = r;
        }
      }
    }
  }
}

// The streaming GEMVs for 16-bit weights with 16-byte loads: each warp owns R consecutive output rows and issues
// kStreamLoads 16-byte loads per lane (over its rows and tables) before the first FMA, so that a decode step's few
// experts are read at the memory's bandwidth rather than one load round trip at a time. R is chosen from the
// matrix's width alone (stream_rows), never from the number of tokens. Lane l reads features (32 c + l) * 8 .. + 7,
// c = 0, 1, ... in ascending order whatever R, and the warp's partial sums are reduced by the same shuffle tree, as
// moe_gemv_kernel's 16-byte path does, so a pair's dot product is summed in one fixed order: the sorted kernel
// (pairs grouped by expert, more than 8 tokens), the pair kernel (one pair per block row, no sort) and the
// down-and-combine kernel give a pair the same bits, and a token's result does not depend on the batch around it.
constexpr int kStreamLoads = 16;

// acc_a[r][q] (+)= row r of table a . x row q, for the pairs q < n (NRUN at most); likewise table b when TWO.
template <class W, bool TWO, int R, int NRUN>
__device__ __forceinline__ void stream_dots(const W* const (&wa)[R], const W* const (&wb)[R],
                                            const float* const (&xr)[NRUN], int n, int64_t in, int lane,
                                            float (&acc_a)[R][NRUN], float (&acc_b)[R][NRUN]) {
  constexpr int NT = TWO ? 2 : 1;             // tables read per row
  constexpr int C = kStreamLoads / (R * NT);  // loads per lane, row and table in one chunk
  constexpr int V = 8;                        // 16-bit weights per 16-byte load
  static_assert(C >= 1, "at least one load per row and table");
#pragma unroll
  for (int r = 0; r < R; ++r)
#pragma unroll
    for (int q = 0; q < NRUN; ++q) acc_a[r][q] = 0.0f, acc_b[r][q] = 0.0f;
  for (int64_t base = 0; base < in; base += int64_t(C) * 32 * V) {
    uint4 ra[R][C], rb[R][C];  // every load of the chunk in flight before the first use
#pragma unroll
    for (int c = 0; c < C; ++c) {
      const int64_t i = base + (int64_t(c) * 32 + lane) * V;
#pragma unroll
      for (int r = 0; r < R; ++r) {
        const uint4 zero = make_uint4(0, 0, 0, 0);
        ra[r][c] = i < in ? __ldg(reinterpret_cast<const uint4*>(wa[r] + i)) : zero;
        if constexpr (TWO) rb[r][c] = i < in ? __ldg(reinterpret_cast<const uint4*>(wb[r] + i)) : zero;
      }
    }
#pragma unroll
    for (int c = 0; c < C; ++c) {
      const int64_t i = base + (int64_t(c) * 32 + lane) * V;
      if (i >= in) continue;  // lanes past the row's end add nothing (their x is out of range)
      float fa[R][V], fb[R][V];
#pragma unroll
      for (int r = 0; r < R; ++r) {
        unpack16<W>(ra[r][c], fa[r]);
        if constexpr (TWO) unpack16<W>(rb[r][c], fb[r]);
      }
#pragma unroll
      for (int q = 0; q < NRUN; ++q) {
        if (q < n) {
          float xv[V];
          load_x<V>(xr[q] + i, xv);
#pragma unroll
          for (int r = 0; r < R; ++r)
#pragma unroll
            for (int v = 0; v < V; ++v) {
              acc_a[r][q] = fmaf(fa[r][v], xv[v], acc_a[r][q]);
              if constexpr (TWO) acc_b[r][q] = fmaf(fb[r][v], xv[v], acc_b[r][q]);
            }
        }
      }
    }
  }
}

__device__ __forceinline__ float epilogue(MoeEpilogue kind, float a, float b) {
  if (kind == MoeEpilogue::Relu2) {
    const float v = a > 0.0f ? a : 0.0f;
    return v * v;
  }
  if (kind == MoeEpilogue::SiluMul) return a / (1.0f + expf(-a)) * b;
  return a;
}

// Rows o0 .. o0 + R - 1 of expert e's tables (rows past `out` repeat the last one, never stored).
template <class W, bool TWO, int R>
__device__ __forceinline__ void stream_rows_of(const MoeGemvLaunch& p, int32_t e, int64_t o0, const W* (&wa)[R],
                                               const W* (&wb)[R]) {
#pragma unroll
  for (int r = 0; r < R; ++r) {
    const int64_t o = o0 + r < p.out ? o0 + r : p.out - 1;
    wa[r] = static_cast<const W*>(p.a[e]) + (p.a_row0 + o) * p.in;
    wb[r] = TWO ? static_cast<const W*>(p.b[e]) + (p.b_row0 + o) * p.in : nullptr;
  }
}

// Grid (row blocks, pair): pair p = blockIdx.y of ids (no sort), its x row p / k (by_token) or p, its y row p.
template <class W, bool TWO, int R>
__global__ void __launch_bounds__(kGemvWarps * 32, 1) moe_gemv_pairs_kernel(MoeGemvLaunch p) {
  const int64_t pair = blockIdx.y;
  const int32_t e = p.ids[pair];
  if (e < 0 || e >= p.E) return;  // the combine writes NaN for its token
  const int64_t o0 = (blockIdx.x * int64_t(kGemvWarps) + threadIdx.x / 32) * R;
  if (o0 >= p.out) return;
  const int lane = threadIdx.x % 32;
  const W* wa[R];
  const W* wb[R];
  stream_rows_of<W, TWO, R>(p, e, o0, wa, wb);
  const float* xr[1] = {p.x + (p.by_token ? pair / p.k : pair) * p.x_stride};
  float acc_a[R][1], acc_b[R][1];
  stream_dots<W, TWO, R, 1>(wa, wb, xr, 1, p.in, lane, acc_a, acc_b);
#pragma unroll
  for (int r = 0; r < R; ++r) {
    const float a = warp_sum(acc_a[r][0]);
    const float b = TWO ? warp_sum(acc_b[r][0]) : 0.0f;
    if (lane == 0 && o0 + r < p.out) p.y[pair * p.y_stride + o0 + r] = epilogue(p.epilogue, a, b);
  }
}

// Grid (row blocks of R rows, token): the down projection of token t's k pairs (x row t * k + j), warp w taking the
// slots j = w, w + 8, ... so that every chosen expert's rows stream at once, then their combine in slot order as
// launch_moe_combine sums them: out[t, o] = w[0] y[0], then fmaf(w[j], y[j], .) for j = 1 .. k - 1.
template <class W, int R>
__global__ void __launch_bounds__(kGemvWarps * 32, 1) moe_down_combine_kernel(MoeGemvLaunch p) {
  __shared__ float part[kMoeCombineMaxSlots][R];
  __shared__ int bad;
  const int64_t t = blockIdx.y, o0 = blockIdx.x * int64_t(R);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (threadIdx.x == 0) bad = 0;
  __syncthreads();
  for (int64_t j = warp; j < p.k; j += kGemvWarps) {
    const int64_t pair = t * p.k + j;
    const int32_t e = p.ids[pair];
    if (e < 0 || e >= p.E) {  // the token's output is NaN, as the combine makes it
      if (lane == 0) bad = 1;
      continue;
    }
    const W* wa[R];
    const W* wb[R];
    stream_rows_of<W, false, R>(p, e, o0, wa, wb);
    const float* xr[1] = {p.x + pair * p.x_stride};
    float acc_a[R][1], acc_b[R][1];
    stream_dots<W, false, R, 1>(wa, wb, xr, 1, p.in, lane, acc_a, acc_b);
#pragma unroll
    for (int r = 0; r < R; ++r) {
      const float y = warp_sum(acc_a[r][0]);
      if (lane == 0) part[j][r] = y;
    }
  }
  __syncthreads();
  const int r = threadIdx.x;
  if (r < R && o0 + r < p.out) {
    const float* w = p.combine_weights + t * p.k;
    float sum = w[0] * part[0][r];
    for (int64_t j = 1; j < p.k; ++j) sum = fmaf(w[j], part[j][r], sum);
    p.y[t * p.y_stride + o0 + r] = bad ? NAN : sum;
  }
}

// Rows per warp for the streaming GEMVs: enough that a lane's kStreamLoads loads cover a whole row of each of its
// rows and tables where the rows are short (the down projection's), at most 4.
int stream_rows(int64_t in, bool two) {
  const int64_t loads = (in + 32 * 8 - 1) / (32 * 8) * (two ? 2 : 1);  // per lane, one row
  return loads * 4 <= kStreamLoads ? 4 : loads * 2 <= kStreamLoads ? 2 : 1;
}

template <class W, int R>
void stream_launch(const MoeGemvLaunch& p, unsigned grid_y, bool two, cudaStream_t stream) {
  const int64_t rows = p.rows == MoeGemvRows::DownCombine ? R : int64_t(kGemvWarps) * R;  // per block
  const dim3 grid(static_cast<unsigned>((p.out + rows - 1) / rows), grid_y);
  const unsigned block = kGemvWarps * 32;
  if (p.rows == MoeGemvRows::DownCombine) moe_down_combine_kernel<W, R><<<grid, block, 0, stream>>>(p);
  else if (two) moe_gemv_pairs_kernel<W, true, R><<<grid, block, 0, stream>>>(p);
  else moe_gemv_pairs_kernel<W, false, R><<<grid, block, 0, stream>>>(p);
  MAMBACPP_CUDA_LAUNCHED();
}

template <class W>
void gemv_for(const MoeGemvLaunch& p, cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned>((p.out + kGemvWarps - 1) / kGemvWarps), static_cast<unsigned>(p.max_active));
  const dim3 block(kGemvWarps * 32);
  const bool two = p.epilogue == MoeEpilogue::SiluMul;
  // Pairs and DownCombine (few tokens): the streaming kernels. Sorted (more tokens): one warp per row over runs of
  // kRun pairs, which measured faster there than streaming R rows per warp over the sorted pairs (H100,
  // docs/perf-log/moe-gpu-2026-12-07.md: granite-tiny 294 vs 393 us at 32 tokens, 818 vs 1200 at 128), and sums a
  // pair's products in the same order (the same bits).
  if constexpr (sizeof(W) == 2) {
    if (p.rows != MoeGemvRows::Sorted) {
      MAMBACPP_ASSERT(p.vec);  // the pair and down-combine kernels need 16-byte loads
      const int r = stream_rows(p.in, two);
      const unsigned gy = static_cast<unsigned>(p.n_rows);
      if (r == 4) stream_launch<W, 4>(p, gy, two, stream);
      else if (r == 2) stream_launch<W, 2>(p, gy, two, stream);
      else stream_launch<W, 1>(p, gy, two, stream);
      return;
    }
  }
  MAMBACPP_ASSERT(p.rows == MoeGemvRows::Sorted);  // the pair and down-combine kernels need 16-byte loads
  if (two && p.vec) moe_gemv_kernel<W, true, true><<<grid, block, 0, stream>>>(p);
  else if (two) moe_gemv_kernel<W, true, false><<<grid, block, 0, stream>>>(p);
  else if (p.vec) moe_gemv_kernel<W, false, true><<<grid, block, 0, stream>>>(p);
  else moe_gemv_kernel<W, false, false><<<grid, block, 0, stream>>>(p);
  MAMBACPP_CUDA_LAUNCHED();
}

// ---- Gather and combine ----------------------------------------------------------------------------------------

__global__ void moe_gather_kernel(const float* x, int64_t x_stride, const int32_t* sorted, int64_t P, int64_t k,
                                  int64_t D, float* xs, int64_t xs_stride) {
  for (int64_t s = blockIdx.y; s < P; s += gridDim.y) {
    const float* src = x + (sorted[s] / k) * x_stride;
    float* dst = xs + s * xs_stride;
    for (int64_t c = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; c < D; c += int64_t(gridDim.x) * blockDim.x)
      dst[c] = src[c];
  }
}

__global__ void moe_combine_kernel(const float* y, int64_t y_stride, const int32_t* pos, const float* weights,
                                   int64_t T, int64_t k, int64_t D, float* out, int64_t out_stride) {
  for (int64_t t = blockIdx.y; t < T; t += gridDim.y) {
    const int32_t* pt = pos + t * k;
    const float* wt = weights + t * k;
    bool ok = true;
    for (int64_t j = 0; j < k; ++j) ok = ok && pt[j] >= 0;
    float* o = out + t * out_stride;
    for (int64_t c = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; c < D; c += int64_t(gridDim.x) * blockDim.x) {
      if (!ok) {
        o[c] = NAN;
        continue;
      }
      float acc = wt[0] * y[pt[0] * y_stride + c];  // as moe_down_combine_kernel: the same bits
      for (int64_t j = 1; j < k; ++j) acc = fmaf(wt[j], y[pt[j] * y_stride + c], acc);
      o[c] = acc;
    }
  }
}

constexpr int kEltThreads = 256;
unsigned cols_grid(int64_t D) { return static_cast<unsigned>(std::min<int64_t>((D + kEltThreads - 1) / kEltThreads, 64)); }
unsigned rows_grid(int64_t T) { return static_cast<unsigned>(std::min<int64_t>(std::max<int64_t>(T, 1), 65535)); }

}  // namespace

void launch_moe_route(const MoeRouteLaunch& p, cudaStream_t stream) {
  if (p.T == 0) return;
  MAMBACPP_ASSERT(p.E <= kMoeMaxExperts && p.n_group <= kMoeMaxGroups);
  const size_t smem = size_t(kRouteWarps) * 2 * static_cast<size_t>(p.E) * sizeof(float);  // <= 32 KB
  moe_route_kernel<<<static_cast<unsigned>((p.T + kRouteWarps - 1) / kRouteWarps), kRouteWarps * 32, smem, stream>>>(p);
  MAMBACPP_CUDA_LAUNCHED();
}

void launch_moe_sort(const int32_t* ids, int64_t P, int64_t E, int32_t* offsets, int32_t* sorted, int32_t* pos,
                     int32_t* active, cudaStream_t stream) {
  MAMBACPP_ASSERT(E <= kMoeMaxExperts);
  moe_sort_kernel<<<1, kSortThreads, 0, stream>>>(ids, P, E, offsets, sorted, pos, active);
  MAMBACPP_CUDA_LAUNCHED();
}

void launch_moe_gemv(const MoeGemvLaunch& p, cudaStream_t stream) {
  if (p.out == 0 || (p.rows == MoeGemvRows::Sorted ? p.max_active : p.n_rows) == 0) return;
  switch (p.dtype) {
    case DType::BF16: gemv_for<__nv_bfloat16>(p, stream); return;
    case DType::F16: gemv_for<__half>(p, stream); return;
    case DType::F32: gemv_for<float>(p, stream); return;
    default: fail("moe_experts: expert weights of dtype ", dtype_name(p.dtype), " are not supported on the GPU");
  }
}

void launch_moe_gather(const float* x, int64_t x_stride, const int32_t* sorted, int64_t P, int64_t k, int64_t D,
                       float* xs, int64_t xs_stride, cudaStream_t stream) {
  if (P == 0 || D == 0) return;
  moe_gather_kernel<<<dim3(cols_grid(D), rows_grid(P)), kEltThreads, 0, stream>>>(x, x_stride, sorted, P, k, D, xs,
                                                                                  xs_stride);
  MAMBACPP_CUDA_LAUNCHED();
}

void launch_moe_combine(const float* y, int64_t y_stride, const int32_t* pos, const float* weights, int64_t T,
                        int64_t k, int64_t D, float* out, int64_t out_stride, cudaStream_t stream) {
  if (T == 0 || D == 0) return;
  moe_combine_kernel<<<dim3(cols_grid(D), rows_grid(T)), kEltThreads, 0, stream>>>(y, y_stride, pos, weights, T, k,
                                                                                   D, out, out_stride);
  MAMBACPP_CUDA_LAUNCHED();
}

MoePointerTables::~MoePointerTables() {
  for (auto& [key, ptr] : tables_) cudaFree(ptr);  // no throwing at teardown
  cudaGetLastError();
}

const void* const* MoePointerTables::get(const std::vector<const void*>& ptrs) {
  auto it = tables_.find(ptrs);
  if (it == tables_.end()) {
    void* d = nullptr;
    MAMBACPP_CUDA_CHECK(cudaMalloc(&d, std::max<size_t>(ptrs.size(), 1) * sizeof(void*)));
    MAMBACPP_CUDA_CHECK(cudaMemcpy(d, ptrs.data(), ptrs.size() * sizeof(void*), cudaMemcpyHostToDevice));
    it = tables_.emplace(ptrs, d).first;
  }
  return static_cast<const void* const*>(it->second);
}

}  // namespace mambacpp::cuda
