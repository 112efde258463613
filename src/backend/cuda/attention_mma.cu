// Causal self-attention on the bf16 tensor cores (fast precision; AttentionLaunch::mma), FlashAttention-2 style,
// for prefill and decode alike.
//
// A block takes one KV head g of one sequence and a tile of up to kAttnMmaTileItems items (item = one query row and
// one query head of g's group, as in attention.cu): the group's heads share every K/V tile the block stages, so a
// decode step's rep heads fill one warp's 16 rows, and prefill rows reuse each staged tile 128 times. Each warp owns
// 16 items: S = Q K^T and O += P V with mma.sync m16n8k16 (bf16 in, f32 accumulation), the softmax
// online in f32 (exp2 of scores pre-multiplied by scale * log2 e), P rounded to bf16 for its product and the row sum
// taken over the rounded weights (the output is then an exact convex combination of the value rows it weighs).
//
// Keys go through shared memory 64 at a time, in tiles anchored at absolute positions (multiples of 64), double
// buffered: bf16 pages by cp.async in 16-byte chunks, f32 pages loaded as 2 x 16 bytes and rounded to bf16 on the way.
// A query row's arithmetic depends only on its own q, its keys and (when split) its split: the tensor-core products
// of a row do not depend on the other rows of the tile, a tile where none of a row's keys are visible leaves its
// max, sum and output unchanged bit for bit (correction 1, weights 0), and warps skip the tiles none of their items
// see (the same no-op, not taken). So a row's output is the same bit for bit however its prompt was cut into calls
// and whatever else is batched with it, as long as the call does not split its keys; split calls (decode-shaped,
// few blocks) cut each sequence's live keys into n_splits runs of whole tiles, per = ceil(keys / n_splits) rounded
// up to 64, so the split count alone decides a row's result and splits past the live keys exit at once (the CUDA
// graph's launch, sized by the table's capacity, keeps every split busy).
#include <cuda_bf16.h>

#include <cfloat>
#include <cmath>
#include <type_traits>

#include "backend/cuda/attention_common.cuh"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/cuda_ops.h"

namespace mambacpp::cuda {
namespace {

using bf16 = __nv_bfloat16;

constexpr int kKT = 64;  // keys per tile

__device__ __forceinline__ uint32_t smem_u32(const void* ptr) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(ptr));
}

__device__ __forceinline__ void ldsm_x4(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

__device__ __forceinline__ void ldsm_x4_trans(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

// c += A (16 x 16, row) B (16 x 8, col); fragment layouts as in mma_bf16x3.cuh.
__device__ __forceinline__ void mma_bf16(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ void cp_async16(uint32_t dst, const void* src) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(dst), "l"(src));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);  // lo in the low half
  return *reinterpret_cast<const uint32_t*>(&v);
}

__device__ __forceinline__ float round_bf16(float x) { return __bfloat162float(__float2bfloat16_rn(x)); }

// HDP: head_dim rounded up to a multiple of 16 that the template is instantiated for (channels past head_dim are
// zero in Q, K and V). W warps of 16 items: 8 (a whole tile of kAttnMmaTileItems) for prefill-shaped calls, 4 for
// decode-shaped ones (every tile <= kAttnTileItems items: one busy warp, and half the registers per block, so that two
// blocks share an SM and one's loads overlap the other's compute). Shared memory: Q [16 W][HDP + 8] then two buffers
// of K [64][HDP + 8], V [64][HDP + 8], all bf16; the 8-element pad makes a row pitch of 4 mod 8 words, so the 8 rows
// of one ldmatrix fall on distinct banks.
template <int HDP, int W, class P>
__global__ void __launch_bounds__(W * 32) attention_mma_kernel(AttentionLaunch p) {
  constexpr int kWarps = W, kThreads = W * 32, kItems = W * 16;
  constexpr int LD = HDP + 8;
  constexpr int kTileElems = kKT * LD;  // one K or V tile
  extern __shared__ __align__(16) unsigned char smem_raw[];
  bf16* q_s = reinterpret_cast<bf16*>(smem_raw);
  bf16* kv_s = q_s + kItems * LD;  // [buffer][K, V][64][LD]
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int hd = static_cast<int>(p.head_dim);

  AttnTile tile;
  if (p.tiles) {
    tile = p.tiles[blockIdx.x];
  } else {
    tile.seq = static_cast<int32_t>(blockIdx.x / p.tiles_per_seq);
    // Last tile first: the tiles with the most keys start first, the short ones fill the tail.
    tile.item0 = static_cast<int32_t>((p.tiles_per_seq - 1 - blockIdx.x % p.tiles_per_seq) * kAttnMmaTileItems);
  }
  const AttnSeq s = seq_of(p, tile.seq);
  const int64_t g = blockIdx.y, rep = p.n_heads / p.n_kv_heads, kv_dim = p.n_kv_heads * p.head_dim;
  if (tile.item0 >= s.len * rep) return;  // block-uniform, before any barrier
  // At most kItems (the launch picks W = 4 only where every tile has <= kAttnTileItems items).
  const int n_items = static_cast<int>(min(static_cast<int64_t>(kAttnMmaTileItems), s.len * rep - tile.item0));
  const int64_t k_limit = s.past + (tile.item0 + n_items - 1) / rep + 1;  // keys any item of the tile sees
  int64_t k_begin = 0, k_end = k_limit;
  if (p.n_splits > 1) {
    const int64_t keys = s.past + s.len;
    const int64_t per = ((keys + p.n_splits - 1) / p.n_splits + kKT - 1) / kKT * kKT;
    k_begin = static_cast<int64_t>(blockIdx.z) * per;
    k_end = min(k_limit, k_begin + per);
  }
  const int n_tiles = k_end > k_begin ? static_cast<int>((k_end - k_begin + kKT - 1) / kKT) : 0;

  // Zero the K/V buffers where head_dim < HDP (their channels past head_dim are read and never written again), then
  // Q rounded to bf16 (items past the tile and channels past head_dim zero).
  if (hd < HDP) {
    uint4* z = reinterpret_cast<uint4*>(kv_s);
    const int n16 = 4 * kTileElems * static_cast<int>(sizeof(bf16)) / 16;
    for (int i = threadIdx.x; i < n16; i += kThreads) z[i] = make_uint4(0u, 0u, 0u, 0u);
  }
  for (int idx = threadIdx.x; idx < kItems * HDP; idx += kThreads) {
    const int it = idx / HDP, d = idx - it * HDP;
    float x = 0.0f;
    if (it < n_items && d < hd) {
      const int64_t item = tile.item0 + it, i = item / rep, h = g * rep + item % rep;
      x = p.q.data[(s.start + i) * p.q.stride + h * hd + d];
    }
    q_s[it * LD + d] = __float2bfloat16_rn(x);
  }
  __syncthreads();  // the zeroed buffers before the first tile's loads

  // Tile at key k0 into buffer buf: 16-byte chunks of 8 channels; rows past k_end are zero (their pages may hold
  // anything, and a zero weight times a NaN would still be NaN).
  const int cpr = hd / 8;
  auto issue = [&](int64_t k0, int buf) {
    bf16* ks = kv_s + buf * 2 * kTileElems;
    bf16* vs = ks + kTileElems;
    for (int idx = threadIdx.x; idx < kKT * cpr; idx += kThreads) {
      const int j = idx / cpr, c = idx - j * cpr;
      const int64_t pos = k0 + j;
      bf16* kd = ks + j * LD + c * 8;
      bf16* vd = vs + j * LD + c * 8;
      if (pos < k_end) {
        const P* kr = kv_at<P>(p.pages, s, pos, p.page_tokens, kv_dim, g, hd, false) + c * 8;
        const P* vr = kv_at<P>(p.pages, s, pos, p.page_tokens, kv_dim, g, hd, true) + c * 8;
        if constexpr (std::is_same_v<P, bf16>) {
          cp_async16(smem_u32(kd), kr);
          cp_async16(smem_u32(vd), vr);
        } else {
          const float4 k0v = reinterpret_cast<const float4*>(kr)[0], k1v = reinterpret_cast<const float4*>(kr)[1];
          const float4 v0v = reinterpret_cast<const float4*>(vr)[0], v1v = reinterpret_cast<const float4*>(vr)[1];
          *reinterpret_cast<uint4*>(kd) = make_uint4(pack_bf16(k0v.x, k0v.y), pack_bf16(k0v.z, k0v.w),
                                                     pack_bf16(k1v.x, k1v.y), pack_bf16(k1v.z, k1v.w));
          *reinterpret_cast<uint4*>(vd) = make_uint4(pack_bf16(v0v.x, v0v.y), pack_bf16(v0v.z, v0v.w),
                                                     pack_bf16(v1v.x, v1v.y), pack_bf16(v1v.z, v1v.w));
        }
      } else {
        *reinterpret_cast<uint4*>(kd) = make_uint4(0u, 0u, 0u, 0u);
        *reinterpret_cast<uint4*>(vd) = make_uint4(0u, 0u, 0u, 0u);
      }
    }
    cp_async_commit();
  };

  // The warp's 16 items are those of slot `slot`, rotated with the block so that decode blocks (one slot of items)
  // put their one busy warp on different SM sub-partitions. This thread's two items are rows g8 and g8 + 8 of the
  // slot: the keys each sees (0 for padding items).
  const int slot = (warp + static_cast<int>(blockIdx.x + blockIdx.y + blockIdx.z)) % kWarps;
  const int g8 = lane >> 2, t4 = lane & 3;
  int64_t nk[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int it = slot * 16 + g8 + 8 * r;
    nk[r] = it < n_items ? s.past + (tile.item0 + it) / rep + 1 : 0;
  }
  const bool warp_active = slot * 16 < n_items;
  const int it_last = min(slot * 16 + 15, n_items - 1);
  const int64_t warp_keys = s.past + (tile.item0 + it_last) / rep + 1;  // keys the warp's last item sees

  float o[HDP / 8][4];
#pragma unroll
  for (int n = 0; n < HDP / 8; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
  const float sl2 = p.scale * 1.4426950408889634f;
  const int mi = lane >> 3, mr = lane & 7;  // ldmatrix x4: this lane's matrix and row address

  if (n_tiles > 0) issue(k_begin, 0);
  for (int ti = 0; ti < n_tiles; ++ti) {
    const int buf = ti & 1;
    const int64_t k0 = k_begin + static_cast<int64_t>(ti) * kKT;
    if (ti + 1 < n_tiles) {
      issue(k0 + kKT, buf ^ 1);
      cp_async_wait<1>();
    } else {
      cp_async_wait<0>();
    }
    __syncthreads();  // tile ti is in its buffer for every thread
    if (warp_active && k0 < warp_keys) {  // warp-uniform
      const bf16* ks = kv_s + buf * 2 * kTileElems;
      const bf16* vs = ks + kTileElems;
      float sc[kKT / 8][4];
#pragma unroll
      for (int n = 0; n < kKT / 8; ++n) sc[n][0] = sc[n][1] = sc[n][2] = sc[n][3] = 0.0f;
#pragma unroll
      for (int kk = 0; kk < HDP / 16; ++kk) {
        uint32_t a[4];
        ldsm_x4(a, smem_u32(q_s + (slot * 16 + (lane & 15)) * LD + kk * 16 + (lane >> 4) * 8));
#pragma unroll
        for (int nn = 0; nn < kKT / 16; ++nn) {
          uint32_t b[4];
          ldsm_x4(b, smem_u32(ks + (nn * 16 + mr + (mi >> 1) * 8) * LD + kk * 16 + (mi & 1) * 8));
          mma_bf16(sc[2 * nn], a, b[0], b[1]);
          mma_bf16(sc[2 * nn + 1], a, b[2], b[3]);
        }
      }
      // Online softmax per row; the 4 lanes of a quad hold one row's 64 scores (2 per 8-key column block each).
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        // Keys of this tile the row sees: offsets below lim (in 32 bits: the tile's own offsets).
        const int64_t seen = (nk[r] < k_end ? nk[r] : k_end) - k0;
        const int lim = seen < 0 ? 0 : seen > kKT ? kKT : static_cast<int>(seen);
        float mx = -INFINITY;
#pragma unroll
        for (int n = 0; n < kKT / 8; ++n)
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            const float v = n * 8 + 2 * t4 + e < lim ? sc[n][2 * r + e] * sl2 : -INFINITY;
            sc[n][2 * r + e] = v;
            mx = fmaxf(mx, v);
          }
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
        const float m_new = fmaxf(m[r], mx);
        const float m_use = m_new == -INFINITY ? 0.0f : m_new;  // no key yet: weights 0, not NaN
        const float corr = exp2f(m[r] - m_use);
        m[r] = m_new;
        float ls = 0.0f;
#pragma unroll
        for (int n = 0; n < kKT / 8; ++n)
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            const float w = round_bf16(exp2f(sc[n][2 * r + e] - m_use));
            sc[n][2 * r + e] = w;
            ls += w;
          }
        l[r] = l[r] * corr + ls;
#pragma unroll
        for (int n = 0; n < HDP / 8; ++n) {
          o[n][2 * r] *= corr;
          o[n][2 * r + 1] *= corr;
        }
      }
      // O += P V: two neighbouring 8-key accumulators are the A fragment of one 16-key step.
#pragma unroll
      for (int kk = 0; kk < kKT / 16; ++kk) {
        const uint32_t a[4] = {pack_bf16(sc[2 * kk][0], sc[2 * kk][1]), pack_bf16(sc[2 * kk][2], sc[2 * kk][3]),
                               pack_bf16(sc[2 * kk + 1][0], sc[2 * kk + 1][1]),
                               pack_bf16(sc[2 * kk + 1][2], sc[2 * kk + 1][3])};
#pragma unroll
        for (int dn = 0; dn < HDP / 16; ++dn) {
          uint32_t b[4];
          ldsm_x4_trans(b, smem_u32(vs + (kk * 16 + mr + (mi & 1) * 8) * LD + dn * 16 + (mi >> 1) * 8));
          mma_bf16(o[2 * dn], a, b[0], b[1]);
          mma_bf16(o[2 * dn + 1], a, b[2], b[3]);
        }
      }
    }
    __syncthreads();  // buffer buf is free for the load issued next iteration
  }

  if (!warp_active) return;
  const int64_t H = p.n_heads;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    float lt = l[r] + __shfl_xor_sync(0xffffffffu, l[r], 1);
    lt += __shfl_xor_sync(0xffffffffu, lt, 2);
    const int it = slot * 16 + g8 + 8 * r;
    if (it >= n_items) continue;
    const int64_t item = tile.item0 + it, i = item / rep, h = g * rep + item % rep, t = s.start + i;
    if (p.n_splits == 1) {
      float* out = p.out.data + t * p.out.stride + h * hd;
      const float inv = 1.0f / lt;
#pragma unroll
      for (int n = 0; n < HDP / 8; ++n) {
        const int d = n * 8 + 2 * t4;
        if (d < hd) {
          out[d] = o[n][2 * r] * inv;
          out[d + 1] = o[n][2 * r + 1] * inv;
        }
      }
    } else {
      // The combine (attention.cu) takes natural-log maxima: m is in log2 units of the scaled score.
      float* part = p.partial + ((static_cast<int64_t>(blockIdx.z) * p.T + t) * H + h) * (hd + 2);
#pragma unroll
      for (int n = 0; n < HDP / 8; ++n) {
        const int d = n * 8 + 2 * t4;
        if (d < hd) {
          part[d] = o[n][2 * r];
          part[d + 1] = o[n][2 * r + 1];
        }
      }
      if (t4 == 0) {
        part[hd] = m[r] == -INFINITY ? -FLT_MAX : m[r] * 0.6931471805599453f;
        part[hd + 1] = lt;
      }
    }
  }
}

template <int HDP, int W, class P>
void launch_w(const AttentionLaunch& p, cudaStream_t stream) {
  const size_t smem = sizeof(bf16) * static_cast<size_t>((W * 16 + 4 * kKT) * (HDP + 8));
  MAMBACPP_CUDA_CHECK(cudaFuncSetAttribute(attention_mma_kernel<HDP, W, P>,
                                           cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)));
  const dim3 grid(static_cast<unsigned>(p.n_tiles), static_cast<unsigned>(p.n_kv_heads),
                  static_cast<unsigned>(p.n_splits));
  attention_mma_kernel<HDP, W, P><<<grid, W * 32, smem, stream>>>(p);
  MAMBACPP_CUDA_LAUNCHED();
}

// Decode-shaped calls (AttentionLaunch::pipelined: every tile <= kAttnTileItems items) take 4 warps.
template <int HDP, class P>
void launch_hdp(const AttentionLaunch& p, cudaStream_t stream) {
  static_assert(kAttnTileItems <= 4 * 16 && kAttnMmaTileItems == 8 * 16);
  if (p.pipelined) launch_w<HDP, 4, P>(p, stream);
  else launch_w<HDP, 8, P>(p, stream);
}

template <class P>
void launch_p(const AttentionLaunch& p, cudaStream_t stream) {
  if (p.head_dim <= 64) launch_hdp<64, P>(p, stream);
  else if (p.head_dim <= 96) launch_hdp<96, P>(p, stream);
  else if (p.head_dim <= 128) launch_hdp<128, P>(p, stream);
  else launch_hdp<256, P>(p, stream);
}

}  // namespace

void launch_attention_mma(const AttentionLaunch& p, cudaStream_t stream) {
  if (p.kv_bf16) launch_p<bf16>(p, stream);
  else launch_p<float>(p, stream);
}

}  // namespace mambacpp::cuda
