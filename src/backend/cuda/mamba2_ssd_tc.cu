// Tensor-core versions of the two matrix-shaped stages of the chunked SSD (see mamba2_ssd.cu for the algorithm and
// the scratch layout), with f32 operands split into bf16 hi/lo pairs and three products each (mma_bf16x3.cuh):
//   chunk state:  out[p, n] = sum_j x_j[p] * (w_j B_j[n]),  w_j = exp(S_last - S_j) dt_j      (P x Q . Q x N)
//   chunk output: y_i = exp(S_i) C_i . H_in^T  +  sum_{j<=i} [exp(S_i - S_j) dt_j (C_i . B_j)] x_j  +  D x_i
// The output kernel is shaped like attention: a warp owns 16 rows i; the masked and scaled scores C.B^T of a 64-token
// source tile stay in registers and are re-split there as the A operand of scores . X.
// Covered shapes: head_dim and d_state multiples of 16, d_state <= 256 (ssd_tc_supported); any chunk size and
// sequence layout (tiles are zero-padded). Others take the CUDA-core kernels of mamba2_ssd.cu. Fast precision
// takes mamba2_ssd_fast.cu instead (bf16 operands, one product).
#include <algorithm>
#include <mutex>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/cuda_launch.cuh"
#include "backend/cuda/mamba2_ssd_tc.h"
#include "backend/cuda/mma_bf16x3.cuh"

namespace mambacpp::cuda {
namespace {

constexpr int kThreads = 128;  // 4 warps x 16 rows = one 64-row tile
constexpr int kT = 64;         // rows i, sources j, columns p and columns n per tile
constexpr int kPitch = kT + 8; // bf16 row pitch of the 64-wide tiles (see SplitTile)
constexpr int kMaxState = kMaxSsdTcState;

// Staging issues kStage pairs of loads per thread before it converts and stores any of them: a loop that waits for
// each load before the next makes both kernels latency-bound, no faster than the CUDA-core kernels.
constexpr int kStage = 8;

// t[r][c] (hi/lo) = src[r * stride + c] for r < rows, c < cols, zero elsewhere; r < kT, c < C_pad (even).
// Thread `tid` takes pairs e = tid, tid + kThreads, ... i.e. (row, pair column) = (e / half, e % half); stepping e
// by kThreads steps that by (dr, dc) with one carry, so a thread divides once, not twice per pair (a run-time
// division is ~20 instructions, more than the load, the split and the stores of a pair together).
__device__ __forceinline__ void stage_rows(const SplitTile& t, int c_pad, const float* src, int64_t stride, int rows,
                                           int cols) {
  const int half = c_pad / 2;  // 8 .. 128 pairs per row
  const int dr = kThreads / half, dc = kThreads % half;
  int r0 = threadIdx.x / half, c0 = threadIdx.x % half;  // this thread's first pair of the current round
  auto step = [&](int& r, int& c) {
    r += dr;
    c += dc;
    if (c >= half) {
      c -= half;
      ++r;
    }
  };
  while (r0 < kT) {
    float a[kStage], b[kStage];
    int r = r0, c = c0;
#pragma unroll
    for (int u = 0; u < kStage; ++u) {
      a[u] = 0.0f;
      b[u] = 0.0f;
      if (r < rows) {
        const float* s = src + r * stride + 2 * c;
        if (2 * c < cols) a[u] = s[0];
        if (2 * c + 1 < cols) b[u] = s[1];
      }
      step(r, c);
    }
    r = r0;
    c = c0;
#pragma unroll
    for (int u = 0; u < kStage; ++u) {
      if (r < kT) store_split2(t, r, 2 * c, a[u], b[u]);
      step(r, c);
    }
    r0 = r;
    c0 = c;
  }
}

// Transposed: t[c][r], t[c][r + 1] = w_r src[r][c], w_{r+1} src[r + 1][c] for r < rows, c < cols, zero elsewhere
// (r < kT, c < kT). A warp reads 32 consecutive columns of a row (coalesced). w: shared, kT entries, or null.
__device__ __forceinline__ void stage_transposed(const SplitTile& t, const float* src, int64_t stride, int rows,
                                                 int cols, const float* w) {
  constexpr int total = (kT / 2) * kT;
  static_assert(total % (kThreads * kStage) == 0, "whole staging rounds");
  for (int base = 0; base < total; base += kThreads * kStage) {
    float a[kStage], b[kStage];
#pragma unroll
    for (int u = 0; u < kStage; ++u) {
      const int e = base + u * kThreads + threadIdx.x;
      const int c = e % kT, r = 2 * (e / kT);
      a[u] = 0.0f;
      b[u] = 0.0f;
      if (c < cols) {
        if (r < rows) a[u] = src[r * stride + c];
        if (r + 1 < rows) b[u] = src[(r + 1) * stride + c];
      }
    }
#pragma unroll
    for (int u = 0; u < kStage; ++u) {
      const int e = base + u * kThreads + threadIdx.x;
      const int c = e % kT, r = 2 * (e / kT);
      store_split2(t, c, r, w ? a[u] * w[r] : a[u], w ? b[u] * w[r + 1] : b[u]);
    }
  }
}

// ---- chunk state: grid (n_chunks, n_heads, tiles_p * tiles_n) ------------------------------------------------------
// Warp w computes out rows p0 + 16w .. +15, columns n0 .. n0 + 63, over the chunk's tokens in 64-token steps.
__global__ void __launch_bounds__(kThreads) ssd_chunk_state_tc_kernel(Mamba2Launch p, const SsdChunk* chunks,
                                                                     SsdScratch sc, int tiles_n) {
  __shared__ __align__(16) __nv_bfloat16 xs_hi[kT * kPitch], xs_lo[kT * kPitch];  // [p][j]
  __shared__ __align__(16) __nv_bfloat16 bs_hi[kT * kPitch], bs_lo[kT * kPitch];  // [n][j], times w_j
  __shared__ float w_j[kT];
  const SplitTile xs{xs_hi, xs_lo, kPitch}, bs{bs_hi, bs_lo, kPitch};
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int64_t chunk = blockIdx.x, h = blockIdx.y;
  const SsdChunk ch = chunks[chunk];
  const int64_t P = p.head_dim, N = p.d_state, H = p.n_heads;
  const int64_t g = h / (H / p.n_groups);
  const int64_t p0 = int64_t(blockIdx.z / tiles_n) * kT, n0 = int64_t(blockIdx.z % tiles_n) * kT;
  const int rows_p = static_cast<int>(std::min<int64_t>(kT, P - p0));
  const int cols_n = static_cast<int>(std::min<int64_t>(kT, N - n0));
  const double cum_last = sc.cum[(ch.start + ch.len - 1) * H + h];

  float acc[8][4] = {};
  for (int j0 = 0; j0 < ch.len; j0 += kT) {
    const int rows_j = min(kT, ch.len - j0);
    const int64_t t0 = ch.start + j0;
    __syncthreads();  // the previous step's readers are done with the tiles and w_j
    if (tid < kT) {
      const int64_t t = t0 + tid;
      w_j[tid] = tid < rows_j ? expf(static_cast<float>(cum_last - sc.cum[t * H + h])) * sc.dt[t * H + h] : 0.0f;
    }
    __syncthreads();
    stage_transposed(xs, p.x.data + t0 * p.x.stride + h * P + p0, p.x.stride, rows_j, rows_p, nullptr);
    stage_transposed(bs, p.B.data + t0 * p.B.stride + g * N + n0, p.B.stride, rows_j, cols_n, w_j);
    __syncthreads();
#pragma unroll
    for (int ks = 0; ks < kT / 16; ++ks) {
      uint32_t ah[4], al[4], bh[8][2], bl[8][2];
      load_a(xs, 16 * warp, 16 * ks, lane, ah, al);
      load_b_row(bs, 16 * ks, lane, 8, bh, bl);
      mma3_row(acc, ah, al, bh, bl, 8);
    }
  }
  float* out = sc.chunk_states + (chunk * H + h) * P * N;
  const int gr = lane >> 2, q = lane & 3;
#pragma unroll
  for (int nt = 0; nt < 8; ++nt) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int r = 16 * warp + gr + (e >> 1) * 8, c = 8 * nt + 2 * q + (e & 1);
      if (r < rows_p && c < cols_n) out[(p0 + r) * N + n0 + c] = acc[nt][e];
    }
  }
}

// ---- chunk output: grid (n_chunks, n_heads, tiles_i * tiles_p) -----------------------------------------------------
// Dynamic shared memory: C rows of the i tile and a K tile (H_in rows p, then B rows j), each kT x (N + 8) hi/lo,
// and X of the source tile transposed ([p][j]), kT x kPitch hi/lo.
size_t output_smem_bytes(int64_t N) {
  return static_cast<size_t>(2 * 2 * kT * (N + 8) + 2 * kT * kPitch) * sizeof(__nv_bfloat16);
}

// Two blocks per SM (the shared-memory bound at d_state 128) leave 255 registers per thread: no cap below that.
__global__ void __launch_bounds__(kThreads, 2) ssd_chunk_output_tc_kernel(Mamba2Launch p, const SsdChunk* chunks,
                                                                      SsdScratch sc, int tiles_p) {
  extern __shared__ __align__(16) unsigned char smem_raw[];
  __shared__ double cum_j[kT];
  __shared__ float dt_j[kT];
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, gr = lane >> 2, q = lane & 3;
  const int64_t chunk = blockIdx.x, h = blockIdx.y;
  const SsdChunk ch = chunks[chunk];
  const int it = static_cast<int>(blockIdx.z / tiles_p);
  const int i0 = it * kT;
  if (i0 >= ch.len) return;  // block-uniform
  const int64_t P = p.head_dim, H = p.n_heads;
  const int N = static_cast<int>(p.d_state);
  const int64_t g = h / (H / p.n_groups);
  const int64_t p0 = int64_t(blockIdx.z % tiles_p) * kT;
  const int rows_i = min(kT, ch.len - i0);
  const int cols_p = static_cast<int>(std::min<int64_t>(kT, P - p0));
  const int pitch = N + 8;
  auto* base = reinterpret_cast<__nv_bfloat16*>(smem_raw);
  const SplitTile cs{base, base + kT * pitch, pitch};
  const SplitTile ks{base + 2 * kT * pitch, base + 3 * kT * pitch, pitch};
  const SplitTile xs{base + 4 * kT * pitch, base + 4 * kT * pitch + kT * kPitch, kPitch};

  // This thread's two rows (within the tile) and their cumulative decays.
  const int r0 = 16 * warp + gr, r1 = r0 + 8;
  const double cum0 = r0 < rows_i ? sc.cum[(ch.start + i0 + r0) * H + h] : 0.0;
  const double cum1 = r1 < rows_i ? sc.cum[(ch.start + i0 + r1) * H + h] : 0.0;

  stage_rows(cs, N, p.C.data + (ch.start + i0) * p.C.stride + g * N, p.C.stride, rows_i, N);
  stage_rows(ks, N, sc.chunk_states + ((chunk * H + h) * P + p0) * N, N, cols_p, N);
  __syncthreads();

  // Carried-in term: acc[i][p] = exp(S_i) * sum_n C_i[n] H_in[p, n].
  float acc[8][4] = {};
  for (int k0 = 0; k0 < N; k0 += 16) {
    uint32_t ah[4], al[4], bh[8][2], bl[8][2];
    load_a(cs, 16 * warp, k0, lane, ah, al);
    load_b_row(ks, k0, lane, 8, bh, bl);
    mma3_row(acc, ah, al, bh, bl, 8);
  }
  {
    const float e0 = expf(static_cast<float>(cum0)), e1 = expf(static_cast<float>(cum1));
#pragma unroll
    for (int nt = 0; nt < 8; ++nt) {
      acc[nt][0] *= e0;
      acc[nt][1] *= e0;
      acc[nt][2] *= e1;
      acc[nt][3] *= e1;
    }
  }

  // Intra-chunk term, one 64-token source tile at a time up to the diagonal tile.
  for (int jt = 0; jt <= it; ++jt) {
    const int j0 = jt * kT;
    const int rows_j = min(kT, ch.len - j0);  // >= 1: j0 <= i0 < len
    const int64_t t0 = ch.start + j0;
    __syncthreads();  // everyone is done with ks, xs, cum_j, dt_j of the previous tile
    if (tid < kT) {
      const bool v = tid < rows_j;
      cum_j[tid] = v ? sc.cum[(t0 + tid) * H + h] : 0.0;
      dt_j[tid] = v ? sc.dt[(t0 + tid) * H + h] : 0.0f;
    }
    stage_rows(ks, N, p.B.data + t0 * p.B.stride + g * N, p.B.stride, rows_j, N);
    stage_transposed(xs, p.x.data + t0 * p.x.stride + h * P + p0, p.x.stride, rows_j, cols_p, nullptr);
    __syncthreads();

    // On the diagonal tile, source columns beyond this warp's last row (16 w + 15) are all masked: skip them.
    const bool diag = jt == it;
    const int nt_end = diag ? 2 * warp + 2 : 8;
    float s[8][4] = {};
    for (int k0 = 0; k0 < N; k0 += 16) {
      uint32_t ah[4], al[4], bh[8][2], bl[8][2];
      load_a(cs, 16 * warp, k0, lane, ah, al);
      load_b_row(ks, k0, lane, nt_end, bh, bl);
      mma3_row(s, ah, al, bh, bl, nt_end);
    }
    // Mask (j <= i, both inside the chunk) and scale by exp(S_i - S_j) dt_j.
#pragma unroll
    for (int nt = 0; nt < 8; ++nt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int r = e < 2 ? r0 : r1, c = 8 * nt + 2 * q + (e & 1);
        const bool ok = j0 + c <= i0 + r && r < rows_i && c < rows_j;
        const double cr = e < 2 ? cum0 : cum1;
        s[nt][e] = ok ? s[nt][e] * expf(static_cast<float>(cr - cum_j[c])) * dt_j[c] : 0.0f;
      }
    }
    // acc += scores . X (k = source j, n = column p).
    const int kk_end = diag ? warp + 1 : 4;
#pragma unroll
    for (int kk = 0; kk < 4; ++kk) {
      if (kk < kk_end) {
        uint32_t ah[4], al[4], bh[8][2], bl[8][2];
        acc_to_a(s[2 * kk], s[2 * kk + 1], ah, al);
        load_b_row(xs, 16 * kk, lane, 8, bh, bl);
        mma3_row(acc, ah, al, bh, bl, 8);
      }
    }
  }

  // y = acc + D x: all loads of x first, then the stores (y and x may alias as far as the compiler knows).
  const float Dh = load_f(p.D.data, p.D.dtype, h);
#pragma unroll
  for (int nt = 0; nt < 8; ++nt) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int r = e < 2 ? r0 : r1, c = 8 * nt + 2 * q + (e & 1);
      if (r < rows_i && c < cols_p)
        acc[nt][e] += Dh * p.x.data[(ch.start + i0 + r) * p.x.stride + h * P + p0 + c];
    }
  }
#pragma unroll
  for (int nt = 0; nt < 8; ++nt) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int r = e < 2 ? r0 : r1, c = 8 * nt + 2 * q + (e & 1);
      if (r < rows_i && c < cols_p) p.y.data[(ch.start + i0 + r) * p.y.stride + h * P + p0 + c] = acc[nt][e];
    }
  }
}

unsigned cdiv(int64_t a, int64_t b) { return static_cast<unsigned>((a + b - 1) / b); }

}  // namespace

bool ssd_tc_supported(const Mamba2Launch& p) {
  return p.head_dim > 0 && p.d_state > 0 && p.head_dim % 16 == 0 && p.d_state % 16 == 0 &&
         p.d_state <= kMaxState;
}

void launch_ssd_chunk_state_tc(const Mamba2Launch& p, const SsdChunk* chunks, int64_t n_chunks,
                               const SsdScratch& scratch, cudaStream_t stream) {
  const int tiles_n = static_cast<int>(cdiv(p.d_state, kT));
  ssd_chunk_state_tc_kernel<<<dim3(static_cast<unsigned>(n_chunks), static_cast<unsigned>(p.n_heads),
                                   cdiv(p.head_dim, kT) * tiles_n),
                              kThreads, 0, stream>>>(p, chunks, scratch, tiles_n);
  MAMBACPP_CUDA_LAUNCHED();
}

void launch_ssd_chunk_output_tc(const Mamba2Launch& p, const SsdChunk* chunks, int64_t n_chunks,
                                const SsdScratch& scratch, cudaStream_t stream) {
  static std::once_flag opt_in;  // the largest covered d_state's size, set once for all
  allow_dynamic_smem_once(opt_in, ssd_chunk_output_tc_kernel, output_smem_bytes(kMaxState));
  const int tiles_p = static_cast<int>(cdiv(p.head_dim, kT));
  ssd_chunk_output_tc_kernel<<<dim3(static_cast<unsigned>(n_chunks), static_cast<unsigned>(p.n_heads),
                                    cdiv(p.chunk_size, kT) * tiles_p),
                               kThreads, output_smem_bytes(p.d_state), stream>>>(p, chunks, scratch, tiles_p);
  MAMBACPP_CUDA_LAUNCHED();
}

}  // namespace mambacpp::cuda
