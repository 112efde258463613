// Mamba-1 selective scan, sequential in time, parallel over (sequence, channel, state):
//   dt = softplus(dt_raw[t, c] + dt_bias[c]);  A[c, n] = -exp(A_log[c, n])
// (dt_raw read from `dt`, or computed here from the low-rank dt and dt_proj: Mamba1ScanArgs::dt_proj)
//   h[c, n] = exp(dt * A[c, n]) * h[c, n] + dt * B[t, n] * x[t, c]
//   y[t, c] = (sum_n C[t, n] * h[c, n] + D[c] * x[t, c]) * silu(z[t, c])
// A group of G lanes (a power of two up to 32) owns one channel; each lane keeps NPER states in registers and the
// group sums C . h with shuffles. The next step's inputs are loaded before the current step is computed, so the
// loads overlap the arithmetic of the serial recurrence. States beyond 256 per channel run in extra passes over
// the sequence (the states of different n never interact; only y sums over them): the first pass writes the
// partial sum to y, later passes add to it, and the last applies D and the gate.
// Step pieces (Mamba1Launch::step_pieces) take the same loop over each sequence's tokens, the state rounded to its
// dtype after every token (y of a token uses its f32 states, as a decode step's does before its store).
#include <algorithm>
#include <cstdint>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/cuda_launch.cuh"
#include "backend/cuda/cuda_ops.h"
#include "backend/cuda/mamba1_common.cuh"

namespace mambacpp::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int64_t kStatesPerPass = 256;  // 32 lanes x 8 registers

template <int NPER>
struct StepIn {
  float x, dt, z;
  float B[NPER], C[NPER];
};

// dt_low[t, :] . dt_proj[c, :], summed by the G lanes of channel c's group (every lane gets the total).
__device__ __forceinline__ float dt_from_low_rank(const Mamba1Launch& p, int64_t t, int64_t c, int G, int lane_g) {
  float acc = 0.0f;
  for (int64_t r = lane_g; r < p.dt_rank; r += G)
    acc += load_f(p.dt_proj.data, p.dt_proj.dtype, c * p.dt_rank + r) * p.dt_low.data[t * p.dt_low.stride + r];
  for (int off = G / 2; off > 0; off >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, off);
  return acc;
}

// Called by every lane of the warp (the dt_proj sum shuffles).
template <int NPER>
__device__ __forceinline__ StepIn<NPER> load_step(const Mamba1Launch& p, int64_t t, int64_t c, const int64_t* n,
                                                  const bool* nv, int G, int lane_g) {
  StepIn<NPER> s;
  s.x = p.x.data[t * p.x.stride + c];
  s.dt = p.dt_proj.data ? dt_from_low_rank(p, t, c, G, lane_g) : p.dt.data[t * p.dt.stride + c];
  s.z = p.z.data[t * p.z.stride + c];
#pragma unroll
  for (int j = 0; j < NPER; ++j) {
    s.B[j] = nv[j] ? p.B.data[t * p.B.stride + n[j]] : 0.0f;
    s.C[j] = nv[j] ? p.C.data[t * p.C.stride + n[j]] : 0.0f;
  }
  return s;
}

template <int NPER>
__global__ void __launch_bounds__(kThreads) mamba1_kernel(Mamba1Launch p, int G, int64_t n0, int64_t n_end,
                                                          bool first_pass, bool last_pass) {
  allow_next_kernel();
  const int lane_g = threadIdx.x % G;
  const int64_t c = blockIdx.x * int64_t(kThreads / G) + threadIdx.x / G;
  const bool c_valid = c < p.d_inner;
  const int64_t cc = c_valid ? c : p.d_inner - 1;  // idle groups still run the loop: the shuffles need full warps
  const int64_t N = p.d_state;

  int64_t n[NPER];
  bool nv[NPER];
  float A[NPER];
#pragma unroll
  for (int j = 0; j < NPER; ++j) {
    n[j] = n0 + lane_g + int64_t(j) * G;
    nv[j] = n[j] < n_end;
    A[j] = nv[j] ? -expf(load_f(p.A_log.data, p.A_log.dtype, cc * N + n[j])) : 0.0f;
  }
  const float bias = load_f(p.dt_bias.data, p.dt_bias.dtype, cc);
  const float Dc = load_f(p.D.data, p.D.dtype, cc);
  const bool round_each = p.step_pieces && p.state_bf16;  // as store_state + load_state between decode steps
  wait_for_previous_kernel();  // launched as a dependent (cuda_launch.cuh): weights above, activations below

  for (int64_t s = blockIdx.y; s < p.n_seqs; s += gridDim.y) {
    const SeqSpan seq = p.seqs[s];
    if (seq.len <= 0) continue;
    if (p.n_pieces > 0 && seq.len >= kMamba1ChunkedMinLen) continue;  // the chunked scan's
    const int64_t sbase = (seq.slot * p.d_inner + cc) * N;
    float h[NPER];
#pragma unroll
    for (int j = 0; j < NPER; ++j) h[j] = nv[j] ? load_state(p.state, p.state_bf16, sbase + n[j]) : 0.0f;

    const int64_t t_end = seq.start + seq.len;
    StepIn<NPER> cur = load_step<NPER>(p, seq.start, cc, n, nv, G, lane_g);
    for (int64_t t = seq.start; t < t_end; ++t) {
      const StepIn<NPER> nxt = t + 1 < t_end ? load_step<NPER>(p, t + 1, cc, n, nv, G, lane_g) : cur;
      const float dtv = softplus_f(cur.dt + bias);
      const float dtx = __fmul_rn(dtv, cur.x);
      float acc = 0.0f;
#pragma unroll
      for (int j = 0; j < NPER; ++j) {
        h[j] = state_update(dtv, A[j], h[j], dtx, cur.B[j]);
        acc = __fmaf_rn(cur.C[j], h[j], acc);
      }
      for (int off = G / 2; off > 0; off >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, off);
      if (lane_g == 0 && c_valid) {
        float* yp = p.y.data + t * p.y.stride + c;
        float v = first_pass ? acc : *yp + acc;
        if (last_pass) v = __fmaf_rn(Dc, cur.x, v) * silu_f(cur.z);
        *yp = v;
      }
      if (round_each) {
#pragma unroll
        for (int j = 0; j < NPER; ++j) h[j] = __bfloat162float(__float2bfloat16_rn(h[j]));
      }
      cur = nxt;
    }
    if (c_valid) {
#pragma unroll
      for (int j = 0; j < NPER; ++j)
        if (nv[j]) store_state(p.state, p.state_bf16, sbase + n[j], h[j]);
    }
  }
}

// Decode (every sequence one token) at d_state = kStepStates: one thread per (sequence, channel) holding the
// channel's whole state, read and written as 16-byte vectors (the kernel above gives each state its own lane and
// 2-byte loads, too few bytes in flight for a batch's states). It computes what mamba1_kernel<1> with G = kStepStates
// computes, bit for bit: the same roundings per state (state_update), and C . h summed in the order of that
// kernel's butterfly (lane 0 ends with the sum of pairs k, k + off for off = G/2 .. 1), so decode, prefill and
// every batch size agree (CudaMamba1Scan.StepKernelBitsEqualTheSequenceKernel).
constexpr int kStepThreads = 64;
constexpr int kStepStates = 16;
// Below this many sequences the kernel above, a lane per state, has more threads in flight (mamba-2.8b batch 1 is
// slower on this one). Either kernel gives the same bits.
constexpr int64_t kStepMinSeqs = 4;

template <bool BF16>
__global__ void __launch_bounds__(kStepThreads) mamba1_step_kernel(Mamba1Launch p) {
  using SV = StateVec<BF16>;
  constexpr int N = kStepStates, V = SV::kElems;
  allow_next_kernel();
  const int64_t c = blockIdx.x * int64_t(kStepThreads) + threadIdx.x;
  if (c >= p.d_inner) return;
  float A[N];
#pragma unroll
  for (int j = 0; j < N; ++j) A[j] = -expf(load_f(p.A_log.data, p.A_log.dtype, c * N + j));
  const float bias = load_f(p.dt_bias.data, p.dt_bias.dtype, c);
  const float Dc = load_f(p.D.data, p.D.dtype, c);
  const SeqSpan seq = p.seqs[blockIdx.y];
  if (seq.len <= 0) return;
  // The state is read after the wait: a scan launched right after another one over the same state (two steps with
  // nothing between) would otherwise read it before the first has written it.
  wait_for_previous_kernel();

  const int64_t t = seq.start;
  uint4* st = reinterpret_cast<uint4*>(static_cast<char*>(p.state) + (seq.slot * p.d_inner + c) * N * (BF16 ? 2 : 4));
  float h[N];
#pragma unroll
  for (int q = 0; q < N / V; ++q) SV::unpack(st[q], h + q * V);
  scan_token<false>(p, t, c, A, bias, Dc, h);
#pragma unroll
  for (int q = 0; q < N / V; ++q) st[q] = SV::pack(h + q * V);
}

}  // namespace

void launch_mamba1_scan(const Mamba1Launch& p, cudaStream_t stream) {
  if (p.n_seqs <= 0 || p.d_inner <= 0) return;
  if (p.n_pieces > 0) {
    launch_mamba1_chunked_scan(p, stream);
    if (!p.has_short_seqs) return;
  }
  if (p.single_tokens && p.n_seqs >= kStepMinSeqs && p.d_state == kStepStates && p.dt_proj.data == nullptr &&
      reinterpret_cast<uintptr_t>(p.state) % 16 == 0 && p.n_seqs <= 65535) {
    const dim3 grid(static_cast<unsigned>((p.d_inner + kStepThreads - 1) / kStepThreads),
                    static_cast<unsigned>(p.n_seqs));
    if (p.state_bf16) {
      launch_dependent(mamba1_step_kernel<true>, grid, dim3(kStepThreads), stream, p);
    } else {
      launch_dependent(mamba1_step_kernel<false>, grid, dim3(kStepThreads), stream, p);
    }
    return;
  }
  for (int64_t n0 = 0; n0 < std::max<int64_t>(p.d_state, 1); n0 += kStatesPerPass) {
    const int64_t tile = std::min(kStatesPerPass, p.d_state - n0);
    int G = 1;
    while (G < 32 && G < tile) G *= 2;
    const int64_t per_lane = (tile + G - 1) / G;  // 1..8
    const bool first = n0 == 0, last = n0 + kStatesPerPass >= p.d_state;
    const dim3 grid(static_cast<unsigned>((p.d_inner + kThreads / G - 1) / (kThreads / G)),
                    static_cast<unsigned>(std::min<int64_t>(p.n_seqs, 65535)));
    const int64_t n_end = n0 + tile;
    if (per_lane <= 1) {
      launch_dependent(mamba1_kernel<1>, grid, dim3(kThreads), stream, p, G, n0, n_end, first, last);
    } else if (per_lane <= 2) {
      launch_dependent(mamba1_kernel<2>, grid, dim3(kThreads), stream, p, G, n0, n_end, first, last);
    } else if (per_lane <= 4) {
      launch_dependent(mamba1_kernel<4>, grid, dim3(kThreads), stream, p, G, n0, n_end, first, last);
    } else {
      launch_dependent(mamba1_kernel<8>, grid, dim3(kThreads), stream, p, G, n0, n_end, first, last);
    }
  }
}

}  // namespace mambacpp::cuda
