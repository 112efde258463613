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

struct TakenMask {
  uint32_t bits[kMoeMaxExperts / 32];
  __device__ void clear(int64_t n) {
    for (int64_t w = 0; w < (n + 31) / 32; ++w) bits[w] = 0u;
  }
  __device__ bool get(int64_t i) const { return (bits[i >> 5] >> (i & 31)) & 1u; }
  __device__ void set(int64_t i) { bits[i >> 5] |= 1u << (i & 31); }
};

// moe::first_max: the largest of score(0 .. n) not taken; NaN never wins; all NaN or taken: the first free index.
template <class Score, class Taken>
__device__ int64_t first_max(int64_t n, const Score& score, const Taken& taken) {
  int64_t best = -1;
  float bv = 0.0f;
  for (int64_t i = 0; i < n; ++i) {
    if (taken(i)) continue;
    const float v = score(i);
    if (best < 0 || v > bv || (isnan(bv) && !isnan(v))) best = i, bv = v;
  }
  return best;
}

__device__ __forceinline__ float sigmoid_host_order(float l) { return 1.0f / (1.0f + expf(-l)); }

__global__ void moe_route_kernel(MoeRouteLaunch p) {
  const int64_t t = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (t >= p.T) return;
  const float* l = p.logits + t * p.logits_stride;
  const int64_t E = p.E, k = p.k;
  int32_t* ids = p.ids + t * k;
  float* w = p.weights + t * k;
  TakenMask taken;
  taken.clear(E);
  auto is_taken = [&](int64_t e) { return taken.get(e); };

  if (p.rule == MoeRouteRule::SigmoidGrouped) {
    const float* bias = p.bias;
    auto s = [&](int64_t e) { return sigmoid_host_order(l[e]); };
    auto choice = [&](int64_t e) { return bias ? s(e) + bias[e] : s(e); };
    const int64_t G = p.n_group, per = E / G;
    if (G > 1) {
      float group[kMoeMaxGroups];
      for (int64_t g = 0; g < G; ++g) {
        float b1 = -INFINITY, b2 = b1;
        for (int64_t i = 0; i < per; ++i) {
          const float c = choice(g * per + i);
          if (c > b1) b2 = b1, b1 = c;
          else if (c > b2) b2 = c;
        }
        group[g] = b1 + b2;
      }
      uint64_t group_taken = 0;
      for (int64_t j = 0; j < p.topk_group; ++j) {
        const int64_t g = first_max(
            G, [&](int64_t i) { return group[i]; }, [&](int64_t i) { return ((group_taken >> i) & 1u) != 0; });
        group_taken |= uint64_t(1) << g;
      }
      for (int64_t g = 0; g < G; ++g)
        if (!((group_taken >> g) & 1u))
          for (int64_t i = 0; i < per; ++i) taken.set(g * per + i);  // not eligible
    }
    float sum = 0.0f;
    for (int64_t j = 0; j < k; ++j) {
      const int64_t e = first_max(E, choice, is_taken);
      taken.set(e);
      ids[j] = static_cast<int32_t>(e);
      w[j] = s(e);
      sum += w[j];
    }
    const float denom = sum + 1e-20f;
    for (int64_t j = 0; j < k; ++j) {
      float v = w[j];
      if (p.renormalize) v /= denom;
      w[j] = v * p.scale;
    }
    return;
  }
  if (p.rule == MoeRouteRule::SoftmaxAll) {
    float mx = -INFINITY;
    for (int64_t e = 0; e < E; ++e) mx = mx < l[e] ? l[e] : mx;  // std::max(mx, l[e])
    float sum = 0.0f;
    for (int64_t e = 0; e < E; ++e) sum += expf(l[e] - mx);
    auto prob = [&](int64_t e) { return expf(l[e] - mx) / sum; };
    for (int64_t j = 0; j < k; ++j) {
      const int64_t e = first_max(E, prob, is_taken);
      taken.set(e);
      ids[j] = static_cast<int32_t>(e);
      w[j] = prob(e);
    }
    return;
  }
  // SoftmaxChosen: the k best logits, softmax over them.
  auto logit = [&](int64_t e) { return l[e]; };
  for (int64_t j = 0; j < k; ++j) {
    const int64_t e = first_max(E, logit, is_taken);
    taken.set(e);
    ids[j] = static_cast<int32_t>(e);
    w[j] = l[e];
  }
  const float mx = w[0];
  float sum = 0.0f;
  for (int64_t j = 0; j < k; ++j) sum += (w[j] = expf(w[j] - mx));
  for (int64_t j = 0; j < k; ++j) w[j] /= sum;
}

// ---- Sort ------------------------------------------------------------------------------------------------------

constexpr int kSortThreads = 1024;

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
  if (threadIdx.x == 0) {
    int32_t at = 0, n_active = 0;
    for (int64_t e = 0; e < E; ++e) {
      offsets[e] = at;
      cursor[e] = at;
      if (count[e] > 0) active[n_active++] = static_cast<int32_t>(e);
      at += count[e];
    }
    offsets[E] = at;
    for (int64_t e = n_active; e < E; ++e) active[e] = -1;
  }
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
      for (int64_t i = int64_t(lane) * V; i < in; i += 32 * V) {
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

template <class W>
void gemv_for(const MoeGemvLaunch& p, cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned>((p.out + kGemvWarps - 1) / kGemvWarps), static_cast<unsigned>(p.max_active));
  const dim3 block(kGemvWarps * 32);
  const bool two = p.epilogue == MoeEpilogue::SiluMul;
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
      float acc = wt[0] * y[pt[0] * y_stride + c];
      for (int64_t j = 1; j < k; ++j) acc += wt[j] * y[pt[j] * y_stride + c];
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
  constexpr int kThreads = 64;
  moe_route_kernel<<<static_cast<unsigned>((p.T + kThreads - 1) / kThreads), kThreads, 0, stream>>>(p);
  MAMBACPP_CUDA_LAUNCHED();
}

void launch_moe_sort(const int32_t* ids, int64_t P, int64_t E, int32_t* offsets, int32_t* sorted, int32_t* pos,
                     int32_t* active, cudaStream_t stream) {
  MAMBACPP_ASSERT(E <= kMoeMaxExperts);
  moe_sort_kernel<<<1, kSortThreads, 0, stream>>>(ids, P, E, offsets, sorted, pos, active);
  MAMBACPP_CUDA_LAUNCHED();
}

void launch_moe_gemv(const MoeGemvLaunch& p, cudaStream_t stream) {
  if (p.out == 0 || p.max_active == 0) return;
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
