// Mamba-2 state-space dual (SSD). Per head h (reading B, C of group g = h / (n_heads / n_groups)):
//   dt_t = clamp(softplus(dt_raw[t, h] + dt_bias[h]), dt_min, dt_max);  a_t = dt_t * A[h],  A[h] = -exp(A_log[h])
//   H_t = exp(a_t) * H_{t-1} + dt_t * x_t (x) B_t        (H: [head_dim, d_state])
//   y_t = H_t . C_t + D[h] * x_t
//
// Single-token batches (decode) take that step directly. With d_state = L * VEC for L a power of two <= 32 (VEC = 8
// bf16 or 4 f32 states: 16 bytes) and 16-byte aligned B/C rows -- every released model -- a group of L lanes owns
// a row of H, each lane one 16-byte vector of it, four rows per thread in flight; other shapes take a warp per row.
//
// Multi-token batches run the chunked form over a table of chunks (each sequence cut into pieces of at most
// chunk_size tokens; a sequence of length 1 is a chunk of one). With S_i = sum_{k<=i} a_k inside a chunk:
//   y_i   = sum_{j<=i} exp(S_i - S_j) * (C_i . B_j) * dt_j * x_j  +  exp(S_i) * (H_in . C_i)  +  D * x_i
//   H_out = exp(S_last) * H_in  +  sum_j exp(S_last - S_j) * dt_j * x_j (x) B_j
// in four launches:
//   1. ssd_cumsum:       dt_t and S_t per (token, head); S is accumulated in f64.
//   2. ssd_chunk_state:  each chunk's own contribution to H_out (the second term), per (chunk, head, 64x64 tile).
//   3. ssd_state_pass:   per (sequence, head, element of H), walks the sequence's chunks in order, replacing each
//                        chunk's contribution by the state entering it, and writes the final state to the slot.
//   4. ssd_chunk_output: y per (chunk, head, 64 rows, 64 columns): the carried-in term, then the causal
//                        intra-chunk term tile by tile (C.B^T masked and scaled, times x), then D * x.
// Steps 2 and 4 run on the tensor cores (mamba2_ssd_tc.cu, near-f32 by a bf16 hi/lo split) for head_dim and
// d_state multiples of 16 (every released model); the CUDA-core kernels below cover every other shape. In fast
// precision (Mamba2Launch::fast) they take bf16 operands and one product instead (mamba2_ssd_fast.cu), step 1 runs
// inside step 2 with f32 decays (SsdScratch::cum2), and single-token sequences of a multi-token batch take the step
// kernel, as they would alone.
// Numerics: |S| reaches hundreds within a 256-long chunk; an f32 difference S_i - S_j of two running sums would lose
// ~1e-5 relative. S is kept in f64 (exact to ~1e-16 relative), so S_i - S_j is formed in f64 and rounded once to
// f32 before the exponential: as accurate as summing a_{j+1..i} directly, without the O(Q^2) segment sums.
// Everything else is f32 with f32 accumulation.
#include <algorithm>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/cuda_launch.cuh"
#include "backend/cuda/cuda_ops.h"
#include "backend/cuda/mamba2_ssd_common.cuh"
#include "backend/cuda/mamba2_ssd_tc.h"

namespace mambacpp::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kTile = 64;   // rows / columns of the output tiles (a 16 x 16 thread grid, 4 x 4 per thread)
constexpr int kJ = 32;      // tokens staged per step in ssd_chunk_state
constexpr int kK = 16;      // d_state slice staged per step in ssd_chunk_output

// ---- decode ----------------------------------------------------------------------------------------------------
// grid (n_seqs, n_heads, ceil(head_dim / 8)); warp w of a block owns row p = 8 * blockIdx.z + w of H, its lanes
// stride over d_state. The loads of a lane's kStepPer states are issued together before any is used, and the grid
// has n_heads * head_dim / 8 blocks (640 for mamba2-2.7b), so a step is one memory round trip deep rather than
// head_dim / 8 of them as with a block per head.
constexpr int kStepRowsPerBlock = kThreads / 32;
constexpr int kStepPer = 4;  // states per lane per pass: 128 = d_state of the released models in one pass

__global__ void __launch_bounds__(kThreads) ssd_step_kernel(Mamba2Launch p) {
  allow_next_kernel();
  const int64_t s = blockIdx.x, h = blockIdx.y;
  const int64_t row = int64_t(blockIdx.z) * kStepRowsPerBlock + (threadIdx.x >> 5);
  const SeqSpan seq = p.seqs[s];
  const int64_t P = p.head_dim, N = p.d_state;
  // Warp-uniform. Length 0: an idle row; longer than step_max_len: the chunked kernels'.
  if (seq.len < 1 || seq.len > p.step_max_len || row >= P) return;
  const int64_t g = h / (p.n_heads / p.n_groups);
  const int lane = threadIdx.x & 31;
  const int64_t base = ((seq.slot * p.n_heads + h) * P + row) * N;
  // The state is written by this kernel alone: its first pass is loaded before waiting for the kernel that
  // produces x, B, C and dt (launched as a dependent, see cuda_launch.cuh).
  float h_first[kStepPer];
#pragma unroll
  for (int j = 0; j < kStepPer; ++j) {
    const int64_t n = lane + 32 * j;
    h_first[j] = n < N ? load_state(p.state, p.state_bf16, base + n) : 0.0f;
  }
  const float bias = load_f(p.dt_bias.data, p.dt_bias.dtype, h), A = ssd_head_A(p, h);
  const float Dh = load_f(p.D.data, p.D.dtype, h);
  wait_for_previous_kernel();

  // Token i is decode step i: it reads the state as step i - 1 stored it (this lane's own elements, rounded to the
  // state's dtype by the store).
  for (int64_t i = 0; i < seq.len; ++i) {
    const int64_t t = seq.start + i;
    const float dtv = ssd_dt(p, t, h, bias);
    const float dA = expf(dtv * A);
    const float* Bt = p.B.data + t * p.B.stride + g * N;
    const float* Ct = p.C.data + t * p.C.stride + g * N;
    const float xv = p.x.data[t * p.x.stride + h * P + row];
    const float dtx = dtv * xv;
    float acc = 0.0f;
    for (int64_t n0 = 0; n0 < N; n0 += 32 * kStepPer) {
      float hv[kStepPer], bv[kStepPer], cv[kStepPer];
#pragma unroll
      for (int j = 0; j < kStepPer; ++j) {
        const int64_t n = n0 + lane + 32 * j;
        const bool ok = n < N;
        hv[j] = i == 0 && n0 == 0 ? h_first[j] : ok ? load_state(p.state, p.state_bf16, base + n) : 0.0f;
        bv[j] = ok ? Bt[n] : 0.0f;
        cv[j] = ok ? Ct[n] : 0.0f;
      }
#pragma unroll
      for (int j = 0; j < kStepPer; ++j) {
        const int64_t n = n0 + lane + 32 * j;
        const float v = dA * hv[j] + dtx * bv[j];
        if (n < N) store_state(p.state, p.state_bf16, base + n, v);
        acc += v * cv[j];
      }
    }
    acc = warp_sum(acc);
    if (lane == 0) {
      float out = acc + Dh * xv;
      if (p.z.data) out *= silu_f(p.z.data[t * p.z.stride + h * P + row]);  // the decode recipe's gate (Mamba2ScanArgs::z)
      p.y.data[t * p.y.stride + h * P + row] = out;
    }
  }
}

// Vectorised step: the state is read and written once, in 16-byte accesses (8 bf16 or 4 f32 states per lane), B_t
// and C_t loaded once per thread as float4s. Group `grp` of L lanes owns rows row0 + k * kVecGroups (k < kVecRows)
// of head h; all kVecRows state vectors are loaded before the dependency wait. Memory-bound on the state (batch 32
// of mamba2-2.7b moves 84 MB per layer in bf16), which the warp-per-row kernel, with its narrower accesses, is not.
constexpr int kVecThreads = 128;
constexpr int kVecRows = 4;

template <bool BF16, int L>
__global__ void __launch_bounds__(kVecThreads) ssd_step_vec_kernel(Mamba2Launch p) {
  using SV = StateVec<BF16>;
  constexpr int V = SV::kElems;
  constexpr int kGroups = kVecThreads / L;  // rows per pass of the block
  allow_next_kernel();
  const int64_t s = blockIdx.x, h = blockIdx.y;
  const SeqSpan seq = p.seqs[s];
  // Block-uniform. Length 0: an idle row; longer than step_max_len: the chunked kernels'.
  if (seq.len < 1 || seq.len > p.step_max_len) return;
  const int lane = threadIdx.x % L, grp = threadIdx.x / L;
  const int64_t P = p.head_dim, N = int64_t(L) * V;
  const int64_t row0 = int64_t(blockIdx.z) * (kGroups * kVecRows) + grp;
  const int64_t head_base = (seq.slot * p.n_heads + h) * P * N;
  uint4* st = reinterpret_cast<uint4*>(static_cast<char*>(p.state) + head_base * (BF16 ? 2 : 4));
  uint4 raw[kVecRows];
#pragma unroll
  for (int k = 0; k < kVecRows; ++k) {
    const int64_t row = row0 + int64_t(k) * kGroups;
    raw[k] = row < P ? st[row * L + lane] : make_uint4(0, 0, 0, 0);
  }
  const float bias = load_f(p.dt_bias.data, p.dt_bias.dtype, h), A = ssd_head_A(p, h);
  const float Dh = load_f(p.D.data, p.D.dtype, h);
  wait_for_previous_kernel();

  const int64_t g = h / (p.n_heads / p.n_groups);
  // Token i is decode step i: raw holds the state as step i - 1 would have stored it (packed: rounded to the state's
  // dtype), and only the last token's is written back.
  for (int64_t i = 0; i < seq.len; ++i) {
    const int64_t t = seq.start + i;
    const bool last = i + 1 == seq.len;
    const float dtv = ssd_dt(p, t, h, bias);
    const float dA = expf(dtv * A);
    float bv[V], cv[V];
    const float4* Bt = reinterpret_cast<const float4*>(p.B.data + t * p.B.stride + g * N + lane * V);
    const float4* Ct = reinterpret_cast<const float4*>(p.C.data + t * p.C.stride + g * N + lane * V);
#pragma unroll
    for (int q = 0; q < V / 4; ++q) {
      const float4 b4 = Bt[q], c4 = Ct[q];
      bv[4 * q] = b4.x, bv[4 * q + 1] = b4.y, bv[4 * q + 2] = b4.z, bv[4 * q + 3] = b4.w;
      cv[4 * q] = c4.x, cv[4 * q + 1] = c4.y, cv[4 * q + 2] = c4.z, cv[4 * q + 3] = c4.w;
    }
    // Every row's x (and gate) is loaded before the first state store: the compiler cannot move a load past a store
    // that may alias it, and one L2 round trip per row in series was the step's critical path.
    float xs[kVecRows], zs[kVecRows];
#pragma unroll
    for (int k = 0; k < kVecRows; ++k) {
      const int64_t row = row0 + int64_t(k) * kGroups;
      const int64_t col = h * P + (row < P ? row : 0);
      xs[k] = p.x.data[t * p.x.stride + col];
      zs[k] = p.z.data ? p.z.data[t * p.z.stride + col] : 0.0f;
    }
#pragma unroll
    for (int k = 0; k < kVecRows; ++k) {
      const int64_t row = row0 + int64_t(k) * kGroups;
      const bool ok = row < P;  // groups past the head still shuffle below
      const int64_t col = h * P + (ok ? row : 0);
      const float xv = xs[k];
      const float dtx = dtv * xv;
      float hv[V];
      SV::unpack(raw[k], hv);
      float acc = 0.0f;
#pragma unroll
      for (int j = 0; j < V; ++j) {
        hv[j] = dA * hv[j] + dtx * bv[j];
        acc += hv[j] * cv[j];
      }
      raw[k] = SV::pack(hv);  // y below uses the f32 values; only the stored copy is rounded
      if (ok && last) st[row * L + lane] = raw[k];
#pragma unroll
      for (int off = L / 2; off > 0; off >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, off);
      if (lane == 0 && ok) {
        float out = acc + Dh * xv;
        if (p.z.data) out *= silu_f(zs[k]);  // the fused decode block's gate
        p.y.data[t * p.y.stride + col] = out;
      }
    }
  }
}

// The vectorised step's lane count for this launch, or 0 when it does not apply.
int ssd_step_vec_lanes(const Mamba2Launch& p) {
  const int V = p.state_bf16 ? 8 : 4;
  if (p.d_state <= 0 || p.d_state % V != 0 || p.n_groups <= 0 || p.n_heads % p.n_groups != 0) return 0;
  const int64_t L = p.d_state / V;
  if (L < 2 || L > 32 || (L & (L - 1)) != 0) return 0;
  auto aligned = [](const float* ptr, int64_t stride) {
    return reinterpret_cast<uintptr_t>(ptr) % 16 == 0 && stride % 4 == 0;
  };
  if (!aligned(p.B.data, p.B.stride) || !aligned(p.C.data, p.C.stride)) return 0;
  if (reinterpret_cast<uintptr_t>(p.state) % 16 != 0) return 0;
  return static_cast<int>(L);
}

// ---- 1. dt and the in-chunk cumulative sum of a = dt * A -----------------------------------------------------------
// grid (n_chunks, ceil(n_heads / 32)); lane = head, so every load and store is 32 consecutive heads of one token.
// The chunk's tokens are cut into kCumSegments runs, one per warp: each lane sums its run (pass 1, which also writes
// dt), the block adds the runs' totals in order, and pass 2 writes S from the run's offset. Each pass loads kCumBatch
// tokens before it stores any (stores may alias the loads as far as the compiler knows, so a load-store loop is one
// round trip per token). A warp per (chunk, head) scanning 32 tokens at a time, or 8 runs of 32 tokens with a round
// trip each, leave the loads of too few tokens in flight.
constexpr int kCumThreads = 1024;
constexpr int kCumSegments = kCumThreads / 32;
constexpr int kCumBatch = 8;

__global__ void __launch_bounds__(kCumThreads) ssd_cumsum_kernel(Mamba2Launch p, const SsdChunk* chunks,
                                                                SsdScratch sc) {
  __shared__ double totals[kCumSegments][32];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int64_t H = p.n_heads, h = blockIdx.y * int64_t(32) + lane;
  const bool mine = h < H;
  const SsdChunk ch = chunks[blockIdx.x];
  const int seg = (ch.len + kCumSegments - 1) / kCumSegments;
  const int i_begin = min(ch.len, warp * seg), i_end = min(ch.len, i_begin + seg);
  const float A = mine ? ssd_head_A(p, h) : 0.0f, bias = mine ? load_f(p.dt_bias.data, p.dt_bias.dtype, h) : 0.0f;
  double run = 0.0;
  if (mine) {
    for (int i0 = i_begin; i0 < i_end; i0 += kCumBatch) {
      float d[kCumBatch];
#pragma unroll
      for (int k = 0; k < kCumBatch; ++k) d[k] = i0 + k < i_end ? ssd_dt(p, ch.start + i0 + k, h, bias) : 0.0f;
#pragma unroll
      for (int k = 0; k < kCumBatch; ++k) {
        if (i0 + k < i_end) {
          sc.dt[(ch.start + i0 + k) * H + h] = d[k];
          run += static_cast<double>(d[k] * A);
        }
      }
    }
  }
  totals[warp][lane] = run;
  __syncthreads();
  if (!mine) return;
  double s = 0.0;
  for (int w = 0; w < warp; ++w) s += totals[w][lane];
  for (int i0 = i_begin; i0 < i_end; i0 += kCumBatch) {
    float d[kCumBatch];  // this thread's own stores of pass 1
#pragma unroll
    for (int k = 0; k < kCumBatch; ++k) d[k] = i0 + k < i_end ? sc.dt[(ch.start + i0 + k) * H + h] : 0.0f;
#pragma unroll
    for (int k = 0; k < kCumBatch; ++k) {
      if (i0 + k < i_end) {
        s += static_cast<double>(d[k] * A);
        sc.cum[(ch.start + i0 + k) * H + h] = s;
      }
    }
  }
}

// ---- 2. each chunk's own contribution to its outgoing state --------------------------------------------------------
// grid (n_chunks, n_heads, tiles_p * tiles_n). out[p, n] = sum_j w_j * x_j[p] * B_j[n], w_j = exp(S_last - S_j) dt_j.
__global__ void __launch_bounds__(kThreads) ssd_chunk_state_kernel(Mamba2Launch p, const SsdChunk* chunks,
                                                                  SsdScratch sc, int tiles_n) {
  __shared__ float Xs[kJ][kTile];
  __shared__ float Bs[kJ][kTile];
  __shared__ float Ws[kJ];
  const int tid = threadIdx.x, ty = tid / 16, tx = tid % 16;
  const int64_t chunk = blockIdx.x, h = blockIdx.y;
  const int64_t p0 = int64_t(blockIdx.z / tiles_n) * kTile, n0 = int64_t(blockIdx.z % tiles_n) * kTile;
  const SsdChunk ch = chunks[chunk];
  const int64_t P = p.head_dim, N = p.d_state, H = p.n_heads;
  const int64_t g = h / (H / p.n_groups);
  const double cum_last = sc.cum[(ch.start + ch.len - 1) * H + h];

  float acc[4][4] = {};
  for (int j0 = 0; j0 < ch.len; j0 += kJ) {
    if (tid < kJ) {
      const int j = j0 + tid;
      const int64_t t = ch.start + j;
      Ws[tid] = j < ch.len ? expf(static_cast<float>(cum_last - sc.cum[t * H + h])) * sc.dt[t * H + h] : 0.0f;
    }
    __syncthreads();
    for (int e = tid; e < kJ * kTile; e += kThreads) {
      const int jj = e / kTile, col = e % kTile;
      const int j = j0 + jj;
      const int64_t t = ch.start + j;
      const bool jv = j < ch.len;
      Xs[jj][col] = jv && p0 + col < P ? p.x.data[t * p.x.stride + h * P + p0 + col] : 0.0f;
      Bs[jj][col] = jv && n0 + col < N ? p.B.data[t * p.B.stride + g * N + n0 + col] * Ws[jj] : 0.0f;
    }
    __syncthreads();
#pragma unroll 8
    for (int jj = 0; jj < kJ; ++jj) {
      float xr[4], br[4];
#pragma unroll
      for (int a = 0; a < 4; ++a) xr[a] = Xs[jj][ty + 16 * a];
#pragma unroll
      for (int b = 0; b < 4; ++b) br[b] = Bs[jj][tx + 16 * b];
#pragma unroll
      for (int a = 0; a < 4; ++a)
#pragma unroll
        for (int b = 0; b < 4; ++b) acc[a][b] += xr[a] * br[b];
    }
    __syncthreads();
  }
  float* out = sc.chunk_states + (chunk * H + h) * P * N;
#pragma unroll
  for (int a = 0; a < 4; ++a) {
    const int64_t row = p0 + ty + 16 * a;
#pragma unroll
    for (int b = 0; b < 4; ++b) {
      const int64_t col = n0 + tx + 16 * b;
      if (row < P && col < N) out[row * N + col] = acc[a][b];
    }
  }
}

// ---- 3. pass the state along each sequence's chunks ----------------------------------------------------------------
// grid (n_seqs, n_heads, ceil(P * N / 256)); one thread per element of H. The chunk decays of a batch of kPassBatch
// chunks go to shared memory first, and each thread issues the loads of kPassLoads chunk contributions before it
// uses any: otherwise each chunk costs a chain of dependent memory round trips (table entry, then cum, then the
// contribution), and the pass is bound by that latency.
constexpr int kPassBatch = 32;
constexpr int kPassLoads = 8;

__global__ void __launch_bounds__(kThreads) ssd_state_pass_kernel(Mamba2Launch p, const SsdChunk* chunks,
                                                                 const SsdSeqChunks* seq_chunks, SsdScratch sc) {
  __shared__ float decay[kPassBatch];
  enter_dependent();
  const int64_t s = blockIdx.x, h = blockIdx.y, PN = p.head_dim * p.d_state;
  const int64_t e = blockIdx.z * int64_t(kThreads) + threadIdx.x;
  const bool mine_e = e < PN;
  const SsdSeqChunks mine = seq_chunks[s];
  if (mine.count == 0) return;  // block-uniform
  if (sc.states16 && p.seqs[s].len == 1) return;  // fast precision: single tokens take the step kernel
  const SeqSpan seq = p.seqs[s];
  const int64_t sidx = (seq.slot * p.n_heads + h) * PN + e;
  float state = mine_e ? load_state(p.state, p.state_bf16, sidx) : 0.0f;
  for (int32_t k0 = 0; k0 < mine.count; k0 += kPassBatch) {
    const int nb = min(kPassBatch, mine.count - k0);
    __syncthreads();  // the previous batch's decays have been read
    if (threadIdx.x < nb) {
      const SsdChunk ch = chunks[mine.first + k0 + threadIdx.x];
      const int64_t last = ch.start + ch.len - 1;
      decay[threadIdx.x] =
          sc.cum2 ? exp2f(sc.cum2[h * p.T + last]) : expf(static_cast<float>(sc.cum[last * p.n_heads + h]));
    }
    __syncthreads();
    if (!mine_e) continue;
    for (int b0 = 0; b0 < nb; b0 += kPassLoads) {
      float own[kPassLoads];
#pragma unroll
      for (int u = 0; u < kPassLoads; ++u) {
        const int64_t chunk = mine.first + k0 + b0 + u;
        own[u] = b0 + u < nb ? sc.chunk_states[(chunk * p.n_heads + h) * PN + e] : 0.0f;
      }
#pragma unroll
      for (int u = 0; u < kPassLoads; ++u) {
        if (b0 + u < nb) {
          const int64_t chunk = mine.first + k0 + b0 + u;
          // From here on: the state entering the chunk; in fast precision only its bf16 copy, which is all the
          // chunk output reads (the f32 store was a third of the kernel's bytes).
          if (sc.states16)
            sc.states16[(chunk * p.n_heads + h) * PN + e] = __bfloat16_as_ushort(__float2bfloat16_rn(state));
          else
            sc.chunk_states[(chunk * p.n_heads + h) * PN + e] = state;
          state = decay[b0 + u] * state + own[u];
        }
      }
    }
  }
  if (mine_e) store_state(p.state, p.state_bf16, sidx, state);
}

// ---- 4. outputs ----------------------------------------------------------------------------------------------------
// grid (n_chunks, n_heads, tiles_i * tiles_p); thread (ty, tx) owns rows i0 + ty + 16a and columns p0 + tx + 16b.
__global__ void __launch_bounds__(kThreads) ssd_chunk_output_kernel(Mamba2Launch p, const SsdChunk* chunks,
                                                                   SsdScratch sc, int tiles_p) {
  __shared__ float Cs[kTile][kK + 1];  // C rows of this tile, one d_state slice (+1: no bank conflicts)
  __shared__ float Ks[kTile][kK + 1];  // H_in rows or B rows, same slice
  __shared__ float Gs[kTile][kTile + 1];
  __shared__ float Xs[kTile][kTile];
  __shared__ double cum_i[kTile], cum_j[kTile];
  __shared__ float dt_j[kTile];

  const int tid = threadIdx.x, ty = tid / 16, tx = tid % 16;
  const int64_t chunk = blockIdx.x, h = blockIdx.y;
  const SsdChunk ch = chunks[chunk];
  const int i0 = static_cast<int>(blockIdx.z / tiles_p) * kTile;
  if (i0 >= ch.len) return;  // block-uniform
  const int64_t p0 = int64_t(blockIdx.z % tiles_p) * kTile;
  const int64_t P = p.head_dim, N = p.d_state, H = p.n_heads;
  const int64_t g = h / (H / p.n_groups);
  const float* Hin = sc.chunk_states + (chunk * H + h) * P * N;

  if (tid < kTile) {
    const int i = i0 + tid;
    cum_i[tid] = i < ch.len ? sc.cum[(ch.start + i) * H + h] : 0.0;
  }
  __syncthreads();
  // Stages C[i0 + r, k0 + k] into Cs.
  auto stage_C = [&](int64_t k0) {
    for (int e = tid; e < kTile * kK; e += kThreads) {
      const int r = e / kK, k = e % kK;
      const int i = i0 + r;
      Cs[r][k] = i < ch.len && k0 + k < N ? p.C.data[(ch.start + i) * p.C.stride + g * N + k0 + k] : 0.0f;
    }
  };

  // Carried-in term: acc[i][p] = exp(S_i) * sum_n C_i[n] * H_in[p, n].
  float acc[4][4] = {};
  for (int64_t k0 = 0; k0 < N; k0 += kK) {
    stage_C(k0);
    for (int e = tid; e < kTile * kK; e += kThreads) {
      const int r = e / kK, k = e % kK;
      Ks[r][k] = p0 + r < P && k0 + k < N ? Hin[(p0 + r) * N + k0 + k] : 0.0f;
    }
    __syncthreads();
#pragma unroll
    for (int k = 0; k < kK; ++k) {
      float cr[4], hr[4];
#pragma unroll
      for (int a = 0; a < 4; ++a) cr[a] = Cs[ty + 16 * a][k];
#pragma unroll
      for (int b = 0; b < 4; ++b) hr[b] = Ks[tx + 16 * b][k];
#pragma unroll
      for (int a = 0; a < 4; ++a)
#pragma unroll
        for (int b = 0; b < 4; ++b) acc[a][b] += cr[a] * hr[b];
    }
    __syncthreads();
  }
#pragma unroll
  for (int a = 0; a < 4; ++a) {
    const float decay = expf(static_cast<float>(cum_i[ty + 16 * a]));
#pragma unroll
    for (int b = 0; b < 4; ++b) acc[a][b] *= decay;
  }

  // Intra-chunk term, one 64-token tile of sources j at a time, up to the diagonal.
  for (int j0 = 0; j0 <= i0 && j0 < ch.len; j0 += kTile) {
    if (tid < kTile) {
      const int j = j0 + tid;
      const bool jv = j < ch.len;
      cum_j[tid] = jv ? sc.cum[(ch.start + j) * H + h] : 0.0;
      dt_j[tid] = jv ? sc.dt[(ch.start + j) * H + h] : 0.0f;
    }
    __syncthreads();
    float gacc[4][4] = {};
    for (int64_t k0 = 0; k0 < N; k0 += kK) {
      stage_C(k0);
      for (int e = tid; e < kTile * kK; e += kThreads) {
        const int r = e / kK, k = e % kK;
        const int j = j0 + r;
        Ks[r][k] = j < ch.len && k0 + k < N ? p.B.data[(ch.start + j) * p.B.stride + g * N + k0 + k] : 0.0f;
      }
      __syncthreads();
#pragma unroll
      for (int k = 0; k < kK; ++k) {
        float cr[4], br[4];
#pragma unroll
        for (int a = 0; a < 4; ++a) cr[a] = Cs[ty + 16 * a][k];
#pragma unroll
        for (int b = 0; b < 4; ++b) br[b] = Ks[tx + 16 * b][k];
#pragma unroll
        for (int a = 0; a < 4; ++a)
#pragma unroll
          for (int b = 0; b < 4; ++b) gacc[a][b] += cr[a] * br[b];
      }
      __syncthreads();
    }
    // Mask (j <= i, both inside the chunk) and scale by exp(S_i - S_j) * dt_j.
#pragma unroll
    for (int a = 0; a < 4; ++a) {
      const int ri = ty + 16 * a, i = i0 + ri;
#pragma unroll
      for (int b = 0; b < 4; ++b) {
        const int rj = tx + 16 * b, j = j0 + rj;
        Gs[ri][rj] = j <= i && i < ch.len && j < ch.len
                         ? gacc[a][b] * expf(static_cast<float>(cum_i[ri] - cum_j[rj])) * dt_j[rj]
                         : 0.0f;
      }
    }
    for (int e = tid; e < kTile * kTile; e += kThreads) {
      const int r = e / kTile, col = e % kTile;
      const int j = j0 + r;
      Xs[r][col] = j < ch.len && p0 + col < P ? p.x.data[(ch.start + j) * p.x.stride + h * P + p0 + col] : 0.0f;
    }
    __syncthreads();
#pragma unroll 8
    for (int jj = 0; jj < kTile; ++jj) {
      float gr[4], xr[4];
#pragma unroll
      for (int a = 0; a < 4; ++a) gr[a] = Gs[ty + 16 * a][jj];
#pragma unroll
      for (int b = 0; b < 4; ++b) xr[b] = Xs[jj][tx + 16 * b];
#pragma unroll
      for (int a = 0; a < 4; ++a)
#pragma unroll
        for (int b = 0; b < 4; ++b) acc[a][b] += gr[a] * xr[b];
    }
    __syncthreads();
  }

  const float Dh = load_f(p.D.data, p.D.dtype, h);
#pragma unroll
  for (int a = 0; a < 4; ++a) {
    const int i = i0 + ty + 16 * a;
    if (i >= ch.len) continue;
    const int64_t t = ch.start + i;
#pragma unroll
    for (int b = 0; b < 4; ++b) {
      const int64_t col = p0 + tx + 16 * b;
      if (col < P) {
        const float xv = p.x.data[t * p.x.stride + h * P + col];
        p.y.data[t * p.y.stride + h * P + col] = acc[a][b] + Dh * xv;
      }
    }
  }
}

unsigned cdiv(int64_t a, int64_t b) { return static_cast<unsigned>((a + b - 1) / b); }

}  // namespace

template <bool BF16>
void launch_step_vec(const Mamba2Launch& p, int L, cudaStream_t stream) {
  const unsigned rows_per_block = static_cast<unsigned>(kVecThreads / L * kVecRows);
  const dim3 grid(static_cast<unsigned>(p.n_seqs), static_cast<unsigned>(p.n_heads), cdiv(p.head_dim, rows_per_block));
  switch (L) {
    case 2: launch_dependent(ssd_step_vec_kernel<BF16, 2>, grid, dim3(kVecThreads), stream, p); break;
    case 4: launch_dependent(ssd_step_vec_kernel<BF16, 4>, grid, dim3(kVecThreads), stream, p); break;
    case 8: launch_dependent(ssd_step_vec_kernel<BF16, 8>, grid, dim3(kVecThreads), stream, p); break;
    case 16: launch_dependent(ssd_step_vec_kernel<BF16, 16>, grid, dim3(kVecThreads), stream, p); break;
    default: launch_dependent(ssd_step_vec_kernel<BF16, 32>, grid, dim3(kVecThreads), stream, p); break;
  }
}

void launch_mamba2_step(const Mamba2Launch& p, cudaStream_t stream) {
  if (p.n_seqs <= 0 || p.n_heads <= 0) return;
  if (p.head_dim > 0) {
    if (const int L = ssd_step_vec_lanes(p)) {
      if (p.state_bf16) {
        launch_step_vec<true>(p, L, stream);
      } else {
        launch_step_vec<false>(p, L, stream);
      }
      return;
    }
  }
  launch_dependent(ssd_step_kernel,
                   dim3(static_cast<unsigned>(p.n_seqs), static_cast<unsigned>(p.n_heads),
                        cdiv(p.head_dim, kStepRowsPerBlock)),
                   dim3(kThreads), stream, p);
}

bool ssd_fast_path(const Mamba2Launch& p) {
  return p.fast && ssd_tc_supported(p) && p.chunk_size <= kSsdFastMaxChunk;
}

void launch_mamba2_chunked(const Mamba2Launch& p, const SsdChunk* chunks, int64_t n_chunks,
                           const SsdSeqChunks* seq_chunks, const SsdScratch& sc, cudaStream_t stream) {
  if (n_chunks <= 0 || p.n_heads <= 0) return;
  const unsigned nc = static_cast<unsigned>(n_chunks), nh = static_cast<unsigned>(p.n_heads);
  const bool tensor_cores = ssd_tc_supported(p);  // steps 2 and 4 on tensor cores (mamba2_ssd_tc.cu)
  // Fast precision on the tensor-core path: bf16 operands, one product each (mamba2_ssd_fast.cu); the state pass
  // then also writes the entering states' bf16 copy.
  const bool fast = ssd_fast_path(p);
  if (!fast) {  // the fast kernels' decays are cum2 and w2, written by the chunk state kernel
    ssd_cumsum_kernel<<<dim3(nc, cdiv(p.n_heads, 32)), kCumThreads, 0, stream>>>(p, chunks, sc);
    MAMBACPP_CUDA_LAUNCHED();
  }
  if (p.head_dim <= 0 || p.d_state <= 0) {
    // No state: y = D * x only (ssd_chunk_output's carried-in and intra-chunk terms are empty sums).
  } else {
    if (fast) {
      if (!p.inputs_bf16) launch_ssd_round_inputs(p, sc, stream);  // the bf16 x, B, C the fast kernels read
      launch_ssd_chunk_scores_fast(p, chunks, n_chunks, sc, stream);
      launch_ssd_chunk_state_fast(p, chunks, n_chunks, sc, stream);
    } else if (tensor_cores) {
      launch_ssd_chunk_state_tc(p, chunks, n_chunks, sc, stream);
    } else {
      const int tiles_n = static_cast<int>(cdiv(p.d_state, kTile));
      ssd_chunk_state_kernel<<<dim3(nc, nh, cdiv(p.head_dim, kTile) * tiles_n), kThreads, 0, stream>>>(
          p, chunks, sc, tiles_n);
      MAMBACPP_CUDA_LAUNCHED();
    }
    launch_dependent(ssd_state_pass_kernel,
                     dim3(static_cast<unsigned>(p.n_seqs), nh, cdiv(p.head_dim * p.d_state, kThreads)),
                     dim3(kThreads), stream, p, chunks, seq_chunks, sc);
  }
  if (fast) {
    launch_ssd_chunk_output_fast(p, chunks, n_chunks, sc, stream);
    // Single-token sequences (decode rows of a mixed batch, one-token prompts) run the step kernel, which skips the
    // others, as when they run alone: the bf16 chunk products would give other bits (the chunk kernels skip them).
    if (p.has_single_seqs) {
      Mamba2Launch ps = p;
      ps.z = ConstF32Rows{};  // the caller gates every row after the chunked path
      launch_mamba2_step(ps, stream);
    }
  } else if (tensor_cores) {
    launch_ssd_chunk_output_tc(p, chunks, n_chunks, sc, stream);
  } else if (p.head_dim > 0) {
    const int tiles_p = static_cast<int>(cdiv(p.head_dim, kTile));
    ssd_chunk_output_kernel<<<dim3(nc, nh, cdiv(p.chunk_size, kTile) * tiles_p), kThreads, 0, stream>>>(
        p, chunks, sc, tiles_p);
    MAMBACPP_CUDA_LAUNCHED();
  }
}

}  // namespace mambacpp::cuda
