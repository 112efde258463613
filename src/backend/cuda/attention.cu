// Causal self-attention over the paged KV cache (Backend::attention), for prefill and decode alike.
//
// A block takes one KV head g of one sequence and a tile of up to kTileItems "items", an item being one (query row,
// query head of g's group) pair: the GQA group's heads share every key and value the block stages in shared
// memory, so a decode step (one row, rep heads) still fills the block's warps, and prefill rows reuse each staged
// tile of keys kTileItems times. Keys go through shared memory 32 at a time (lane j scores key j: no shuffles in
// the dot products; the next 32 are loaded into registers while these are used); each warp keeps its items' running max, sum and output (online softmax, all in f32), items
// assigned round-robin over the warps.
//
// Long contexts with few blocks (decode) split the keys over grid.z: each split writes its unnormalised output with
// its max and sum, and a second kernel combines them. Within a block keys are visited in position order, so a row's
// result depends only on its keys and the split length, never on the other sequences of the batch (batch
// invariance) or on how its sequence was cut into calls, as long as the split count is the same (prefill-sized
// calls never split).
//
// Pages hold f32 or bf16 elements (the kernels are templates on the element type P): the append rounds to bf16,
// staging widens to f32, so everything after the load is the f32 kernel on the rounded rows.
#include <cfloat>
#include <type_traits>

#include "backend/cuda/attention_common.cuh"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/cuda_ops.h"

namespace mambacpp::cuda {
namespace {

constexpr int kWarps = 4;
constexpr int kKeys = 32;  // keys staged per step: one per lane

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, off));
  return v;
}

__device__ __forceinline__ float to_f32(float v) { return v; }
__device__ __forceinline__ float to_f32(__nv_bfloat16 v) { return __bfloat162float(v); }
template <class P>
__device__ __forceinline__ P from_f32(float v) {
  if constexpr (std::is_same_v<P, __nv_bfloat16>) return __float2bfloat16_rn(v);
  else return v;
}

// The 16 / sizeof(P) elements of a 16-byte chunk as floats (bf16: element 0 in the low half of each word).
__device__ __forceinline__ void unpack(const uint4& c, float* out, float) {
  out[0] = __uint_as_float(c.x);
  out[1] = __uint_as_float(c.y);
  out[2] = __uint_as_float(c.z);
  out[3] = __uint_as_float(c.w);
}
__device__ __forceinline__ void unpack(const uint4& c, float* out, __nv_bfloat16) {
  const uint32_t w[4] = {c.x, c.y, c.z, c.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    out[2 * i] = __uint_as_float(w[i] << 16);
    out[2 * i + 1] = __uint_as_float(w[i] & 0xffff0000u);
  }
}

// grid: one block per row of this call; copies its k and v rows into the pages at position past + i.
template <class P>
__global__ void kv_append_kernel(AttentionLaunch p) {
  const int64_t t = blockIdx.x;
  const int32_t si = p.token_seq[t];
  if (si < 0) return;
  const AttnSeq s = seq_of(p, si);
  const int64_t kv_dim = p.n_kv_heads * p.head_dim, pos = s.past + (t - s.start);
  P* page = static_cast<P*>(p.pages[s.page0 + pos / p.page_tokens]);
  P* krow = page + (pos % p.page_tokens) * kv_dim;
  P* vrow = page + (p.page_tokens + pos % p.page_tokens) * kv_dim;
  const float* k = p.k.data + t * p.k.stride;
  const float* v = p.v.data + t * p.v.stride;
  for (int64_t c = threadIdx.x; c < kv_dim; c += blockDim.x) {
    krow[c] = from_f32<P>(k[c]);
    vrow[c] = from_f32<P>(v[c]);
  }
}

// NC = ceil(head_dim / 32) rounded up to a template size: lane owns output channels lane + 32 c.
// Shared memory: q [kTileItems][hd] (pre-scaled), K [32][hd + 1] (padded: lane j reads row j), V [32][32 NC]
// (padded columns zero), p [kWarps][32].
template <int NC, class P, bool kPipe>
__global__ void __launch_bounds__(kWarps * 32) attention_kernel(AttentionLaunch p) {
  extern __shared__ float smem[];
  const int hd = static_cast<int>(p.head_dim), vw = 32 * NC;
  float* q_s = smem;
  float* k_s = q_s + kAttnTileItems * hd;
  float* v_s = k_s + kKeys * (hd + 1);
  float* p_s = v_s + kKeys * vw;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;

  AttnTile tile;
  if (p.tiles) {
    tile = p.tiles[blockIdx.x];
  } else {
    tile.seq = static_cast<int32_t>(blockIdx.x / p.tiles_per_seq);
    tile.item0 = static_cast<int32_t>((blockIdx.x % p.tiles_per_seq) * kAttnTileItems);
  }
  const AttnSeq s = seq_of(p, tile.seq);
  const int64_t g = blockIdx.y, rep = p.n_heads / p.n_kv_heads, kv_dim = p.n_kv_heads * p.head_dim;
  if (tile.item0 >= s.len * rep) return;  // block-uniform, before any barrier
  const int n_items = static_cast<int>(min(static_cast<int64_t>(kAttnTileItems), s.len * rep - tile.item0));
  const int64_t i_last = (tile.item0 + n_items - 1) / rep;
  const int64_t k_limit = s.past + i_last + 1;  // keys any item of the tile sees
  const int64_t k_begin = static_cast<int64_t>(blockIdx.z) * p.split_keys;
  const int64_t k_end = min(k_limit, k_begin + p.split_keys);

  for (int idx = threadIdx.x; idx < n_items * hd; idx += blockDim.x) {
    const int it = idx / hd, d = idx % hd;
    const int64_t item = tile.item0 + it, i = item / rep, h = g * rep + item % rep;
    q_s[it * hd + d] = p.q.data[(s.start + i) * p.q.stride + h * hd + d] * p.scale;
  }
  for (int idx = threadIdx.x; idx < kKeys * vw; idx += blockDim.x) v_s[idx] = 0.0f;  // padded columns stay zero

  constexpr int kPerWarp = kAttnTileItems / kWarps;
  float m[kPerWarp], l[kPerWarp], o[kPerWarp][NC];
  int64_t n_keys[kPerWarp];
#pragma unroll
  for (int r = 0; r < kPerWarp; ++r) {
    m[r] = -FLT_MAX;
    l[r] = 0.0f;
    n_keys[r] = s.past + (tile.item0 + warp + kWarps * r) / rep + 1;
#pragma unroll
    for (int c = 0; c < NC; ++c) o[r][c] = 0.0f;
  }

  // Staging. Pipelined (decode-shaped calls: few items per block, long key loops): the next step's keys and values
  // are loaded into registers, as 16-byte chunks (thread t takes chunks t, t + 128, ... of the step's 32 rows of
  // hd / kChunk chunks; the launch checks that rows are whole chunks), while the current step computes, and written
  // to shared memory after the barrier, so a block has a whole step of loads in flight during its compute. That
  // costs registers, which prefill, latency-bound on its dot-product chains, needs for warps: it loads element by
  // element in place after the barrier. Shared memory gets the same values either way, so the results are the same
  // bit for bit.
  constexpr int kChunk = 16 / static_cast<int>(sizeof(P));
  constexpr int kMaxChunks = kPipe ? kKeys * 32 * NC / kChunk / (kWarps * 32) : 1;
  uint4 k_reg[kMaxChunks], v_reg[kMaxChunks];
  const int cpr = hd / kChunk, n_chunks = kKeys * cpr;
  auto load_step = [&](int64_t k0) {
#pragma unroll
    for (int i = 0; i < kMaxChunks; ++i) {
      const int idx = static_cast<int>(threadIdx.x) + kWarps * 32 * i;
      const int j = idx / cpr, c = idx - j * cpr;
      const int64_t pos = k0 + j;
      if (idx < n_chunks && pos < k_end) {
        k_reg[i] = *reinterpret_cast<const uint4*>(kv_at<P>(p.pages, s, pos, p.page_tokens, kv_dim, g, hd, false) +
                                                   c * kChunk);
        v_reg[i] = *reinterpret_cast<const uint4*>(kv_at<P>(p.pages, s, pos, p.page_tokens, kv_dim, g, hd, true) +
                                                   c * kChunk);
      } else {
        k_reg[i] = make_uint4(0u, 0u, 0u, 0u);  // +0.0 in f32 and in bf16
        v_reg[i] = make_uint4(0u, 0u, 0u, 0u);
      }
    }
  };
  if (kPipe && k_begin < k_end) load_step(k_begin);
  for (int64_t k0 = k_begin; k0 < k_end; k0 += kKeys) {
    __syncthreads();  // the previous step's keys are no longer read (and q_s / v_s padding are written)
    if constexpr (!kPipe) {
      for (int j = warp; j < kKeys; j += kWarps) {
        const int64_t pos = k0 + j;
        if (pos < k_end) {
          const P* kr = kv_at<P>(p.pages, s, pos, p.page_tokens, kv_dim, g, hd, false);
          const P* vr = kv_at<P>(p.pages, s, pos, p.page_tokens, kv_dim, g, hd, true);
          for (int d = lane; d < hd; d += 32) {
            k_s[j * (hd + 1) + d] = to_f32(kr[d]);
            v_s[j * vw + d] = to_f32(vr[d]);
          }
        } else {
          for (int d = lane; d < hd; d += 32) {
            k_s[j * (hd + 1) + d] = 0.0f;
            v_s[j * vw + d] = 0.0f;
          }
        }
      }
    } else {
#pragma unroll
      for (int i = 0; i < kMaxChunks; ++i) {
        const int idx = static_cast<int>(threadIdx.x) + kWarps * 32 * i;
        if (idx >= n_chunks) continue;
        const int j = idx / cpr, c = idx - j * cpr;
        float kf[kChunk], vf[kChunk];
        unpack(k_reg[i], kf, P());
        unpack(v_reg[i], vf, P());
#pragma unroll
        for (int e = 0; e < kChunk; ++e) {
          k_s[j * (hd + 1) + c * kChunk + e] = kf[e];
          v_s[j * vw + c * kChunk + e] = vf[e];
        }
      }
      if (k0 + kKeys < k_end) load_step(k0 + kKeys);  // in flight during this step's compute
    }
    __syncthreads();
#pragma unroll
    for (int r = 0; r < kPerWarp; ++r) {
      const int it = warp + kWarps * r;
      if (it >= n_items) continue;  // warp-uniform
      const int64_t pos = k0 + lane;
      const bool valid = pos < k_end && pos < n_keys[r];
      const float* qr = q_s + it * hd;
      const float* kr = k_s + lane * (hd + 1);
      float dot = 0.0f;
      for (int d = 0; d < hd; ++d) dot = fmaf(qr[d], kr[d], dot);
      const float sc = valid ? dot : -FLT_MAX;
      const float tmax = warp_max(sc);
      if (tmax == -FLT_MAX) continue;  // no key of this step is visible to the item (warp-uniform)
      const float m_new = fmaxf(m[r], tmax);
      const float corr = expf(m[r] - m_new);
      const float pj = valid ? expf(sc - m_new) : 0.0f;
      l[r] = l[r] * corr + warp_sum(pj);
      m[r] = m_new;
      p_s[warp * 32 + lane] = pj;
      __syncwarp();
#pragma unroll
      for (int c = 0; c < NC; ++c) {
        float acc = o[r][c] * corr;
        const float* vc = v_s + lane + 32 * c;
#pragma unroll 8
        for (int j = 0; j < kKeys; ++j) acc = fmaf(p_s[warp * 32 + j], vc[j * vw], acc);
        o[r][c] = acc;
      }
      __syncwarp();  // p_s is rewritten by the next item
    }
  }

  const int64_t H = p.n_heads;
#pragma unroll
  for (int r = 0; r < kPerWarp; ++r) {
    const int it = warp + kWarps * r;
    if (it >= n_items) continue;
    const int64_t item = tile.item0 + it, i = item / rep, h = g * rep + item % rep, t = s.start + i;
    if (p.n_splits == 1) {
      float* out = p.out.data + t * p.out.stride + h * hd;
      const float inv = 1.0f / l[r];
#pragma unroll
      for (int c = 0; c < NC; ++c)
        if (lane + 32 * c < hd) out[lane + 32 * c] = o[r][c] * inv;
    } else {
      float* part = p.partial + ((static_cast<int64_t>(blockIdx.z) * p.T + t) * H + h) * (hd + 2);
#pragma unroll
      for (int c = 0; c < NC; ++c)
        if (lane + 32 * c < hd) part[lane + 32 * c] = o[r][c];
      if (lane == 0) {
        part[hd] = m[r];
        part[hd + 1] = l[r];
      }
    }
  }
}

// grid: (T, n_heads); combines the splits of one (row, head): o = sum_z o_z e^(m_z - M) / sum_z l_z e^(m_z - M).
__global__ void attention_combine_kernel(AttentionLaunch p) {
  const int64_t t = blockIdx.x, h = blockIdx.y, H = p.n_heads, hd = p.head_dim;
  if (p.token_seq[t] < 0) return;
  const int64_t zstride = p.T * H * (hd + 2);
  const float* part = p.partial + (t * H + h) * (hd + 2);
  float M = -FLT_MAX;
  for (int z = 0; z < p.n_splits; ++z) M = fmaxf(M, part[z * zstride + hd]);
  float L = 0.0f;
  for (int z = 0; z < p.n_splits; ++z) {
    const float lz = part[z * zstride + hd + 1];
    if (lz > 0.0f) L += lz * expf(part[z * zstride + hd] - M);
  }
  const float inv = 1.0f / L;
  float* out = p.out.data + t * p.out.stride + h * hd;
  for (int64_t d = threadIdx.x; d < hd; d += blockDim.x) {
    float acc = 0.0f;
    for (int z = 0; z < p.n_splits; ++z)
      if (part[z * zstride + hd + 1] > 0.0f) acc += part[z * zstride + d] * expf(part[z * zstride + hd] - M);
    out[d] = acc * inv;
  }
}

template <int NC, class P, bool kPipe>
void launch_nc(const AttentionLaunch& p, cudaStream_t stream) {
  const int hd = static_cast<int>(p.head_dim);
  const size_t smem = sizeof(float) * (kAttnTileItems * hd + kKeys * (hd + 1) + kKeys * 32 * NC + kWarps * 32);
  MAMBACPP_CUDA_CHECK(
      cudaFuncSetAttribute(attention_kernel<NC, P, kPipe>, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)));
  const dim3 grid(static_cast<unsigned>(p.n_tiles), static_cast<unsigned>(p.n_kv_heads),
                  static_cast<unsigned>(p.n_splits));
  attention_kernel<NC, P, kPipe><<<grid, kWarps * 32, smem, stream>>>(p);
  MAMBACPP_CUDA_LAUNCHED();
}

template <class P, bool kPipe>
void launch_p(const AttentionLaunch& p, cudaStream_t stream) {
  const int64_t nc = (p.head_dim + 31) / 32;
  if (nc <= 1) launch_nc<1, P, kPipe>(p, stream);
  else if (nc <= 2) launch_nc<2, P, kPipe>(p, stream);
  else if (nc <= 4) launch_nc<4, P, kPipe>(p, stream);
  else launch_nc<8, P, kPipe>(p, stream);
}

}  // namespace

void launch_kv_append(const AttentionLaunch& p, cudaStream_t stream) {
  if (p.T <= 0) return;
  if (p.kv_bf16) kv_append_kernel<__nv_bfloat16><<<static_cast<unsigned>(p.T), 128, 0, stream>>>(p);
  else kv_append_kernel<float><<<static_cast<unsigned>(p.T), 128, 0, stream>>>(p);
  MAMBACPP_CUDA_LAUNCHED();
}

void launch_attention(const AttentionLaunch& p, cudaStream_t stream) {
  if (p.T <= 0 || p.n_tiles <= 0) return;
  if (p.mma) launch_attention_mma(p, stream);
  else if (p.kv_bf16 && p.pipelined) launch_p<__nv_bfloat16, true>(p, stream);
  else if (p.kv_bf16) launch_p<__nv_bfloat16, false>(p, stream);
  else if (p.pipelined) launch_p<float, true>(p, stream);
  else launch_p<float, false>(p, stream);
  if (p.n_splits > 1) {
    attention_combine_kernel<<<dim3(static_cast<unsigned>(p.T), static_cast<unsigned>(p.n_heads)), 128, 0, stream>>>(p);
    MAMBACPP_CUDA_LAUNCHED();
  }
}

}  // namespace mambacpp::cuda
