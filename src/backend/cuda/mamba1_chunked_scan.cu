// Mamba-1 selective scan over pieces of the sequence, in parallel (prompts of kMamba1ChunkedMinLen tokens and more).
// The sequential kernel (mamba1_scan.cu) walks a sequence token by token in one lane per state: ~81,920 lanes at
// mamba-2.8b, each waiting on its own chain, most of a prefill layer's time. The recurrence
//   h_t[c, n] = exp(dt_t A[c, n]) h_{t-1}[c, n] + dt_t x_t[c] B_t[n]
// is linear in h, so over a piece of tokens [a, b) it is h_b = exp(A S) h_a + e, with S the piece's sum of dt and e
// the piece's own contribution (its scan from h = 0). Three kernels:
//   1. piece state: a thread per (piece, channel) scans its piece from zero: e [d_state] and S (piece_states,
//      piece_dt);
//   2. carry: a thread per (sequence, channel, state) walks the sequence's pieces in order, replacing each e with the
//      state entering that piece (h_a) and carrying h to the next, h = exp(A S) h + e; the last h is the new state;
//   3. output: a thread per (piece, channel) scans its piece again from its entering state and writes y.
// Each thread holds a channel's kMamba1PieceStates states in registers (the model's d_state). A piece's tokens take
// the step kernel's code (scan_token, mamba1_common.cuh: state_update, C . h in the sequential kernel's order), so
// a sequence's first piece, which enters with the stored state itself, gets the sequential kernel's bits; later
// pieces enter with a carried state, rounded differently: exp(A S) against the product of the steps' exp(dt A), S
// summed in f32 (relative error <= kMamba1Piece * 2^-24 in S: ~4e-6 of |A S|, at most ~1.4e-6 of the carried state,
// whose factor exp(-|A S|) shrinks as |A S| grows), far below f32's tolerance for a split prompt (1e-5 relative).
// Twice the sequential kernel's updates, in ~n_pieces times its parallel threads. In fast precision
// (Mamba1Launch::fast) the pieces' decays are exp2 by the hardware's approximation of dt (A log2 e) (~2^-22 relative,
// A log2 e rounded once: ~1e-7 of the exponent) instead of expf's longer sequence, the most frequent instruction
// sequence of both piece kernels; exact precision keeps expf and the sequential kernel's bits.
#include <algorithm>
#include <cstdint>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/cuda_launch.cuh"
#include "backend/cuda/cuda_ops.h"
#include "backend/cuda/mamba1_common.cuh"

namespace mambacpp::cuda {
namespace {

constexpr int kPieceThreads = 128;  // channels per block of the piece kernels
constexpr int kCarryThreads = 256;  // (channel, state) pairs per block of the carry kernel
constexpr int kCarryBatch = 8;      // pieces whose inputs the carry loads before it walks them
constexpr int N = static_cast<int>(kMamba1PieceStates);

__device__ __forceinline__ bool chunked_seq(const SeqSpan& seq) { return seq.len >= kMamba1ChunkedMinLen; }

// A channel's constants: A[c, :] (times log2 e where FastExp) and the dt bias.
template <bool FastExp>
struct ChannelConsts {
  float A[N];
  float bias;
};
template <bool FastExp>
__device__ __forceinline__ ChannelConsts<FastExp> channel_consts(const Mamba1Launch& p, int64_t c) {
  ChannelConsts<FastExp> k;
#pragma unroll
  for (int n = 0; n < N; ++n) {
    k.A[n] = -expf(load_f(p.A_log.data, p.A_log.dtype, c * N + n));
    if constexpr (FastExp) k.A[n] *= 1.4426950408889634f;
  }
  k.bias = load_f(p.dt_bias.data, p.dt_bias.dtype, c);
  return k;
}

// 1. grid (n_pieces, channel blocks): e = the piece's scan from h = 0, S = its sum of dt.
template <bool FastExp>
__global__ void __launch_bounds__(kPieceThreads) mamba1_piece_state_kernel(Mamba1Launch p) {
  const int64_t c = blockIdx.y * int64_t(kPieceThreads) + threadIdx.x;
  if (c >= p.d_inner) return;
  const ChannelConsts<FastExp> k = channel_consts<FastExp>(p, c);
  enter_dependent();  // weights above; the batch's tables and activations below
  const SsdChunk piece = p.pieces[blockIdx.x];
  if (!chunked_seq(p.seqs[piece.seq])) return;
  float h[N] = {};
  float S = 0.0f;
  for (int64_t t = piece.start; t < piece.start + piece.len; ++t) {
    const float dtv = softplus_f(p.dt.data[t * p.dt.stride + c] + k.bias);
    const float dtx = __fmul_rn(dtv, p.x.data[t * p.x.stride + c]);
    const float* Bt = p.B.data + t * p.B.stride;
#pragma unroll
    for (int n = 0; n < N; ++n) h[n] = scan_update<FastExp>(dtv, k.A[n], h[n], dtx, Bt[n]);
    S += dtv;
  }
  float4* e = reinterpret_cast<float4*>(p.piece_states + (blockIdx.x * p.d_inner + c) * N);
#pragma unroll
  for (int q = 0; q < N / 4; ++q) e[q] = make_float4(h[4 * q], h[4 * q + 1], h[4 * q + 2], h[4 * q + 3]);
  p.piece_dt[blockIdx.x * p.d_inner + c] = S;
}

// 2. grid (channel-state blocks, sequences): e of each piece replaced by the state entering it; the state stored.
__global__ void __launch_bounds__(kCarryThreads) mamba1_piece_carry_kernel(Mamba1Launch p) {
  const int64_t i = blockIdx.x * int64_t(kCarryThreads) + threadIdx.x;  // c * N + n
  if (i >= p.d_inner * N) return;
  const int64_t c = i / N;
  const float A = -expf(load_f(p.A_log.data, p.A_log.dtype, i));
  enter_dependent();
  for (int64_t s = blockIdx.y; s < p.n_seqs; s += gridDim.y) {
    const SeqSpan seq = p.seqs[s];
    if (!chunked_seq(seq)) continue;
    const SsdSeqChunks sp = p.seq_pieces[s];
    const int64_t at = seq.slot * p.d_inner * N + i;
    float h = load_state(p.state, p.state_bf16, at);
    for (int k0 = 0; k0 < sp.count; k0 += kCarryBatch) {
      // The pieces' inputs do not depend on h: load a batch of them, then walk it (the chain is one fma each).
      float e[kCarryBatch], S[kCarryBatch];
#pragma unroll
      for (int j = 0; j < kCarryBatch; ++j) {
        const int64_t k = sp.first + k0 + j;
        const bool ok = k0 + j < sp.count;
        e[j] = ok ? p.piece_states[k * p.d_inner * N + i] : 0.0f;
        S[j] = ok ? p.piece_dt[k * p.d_inner + c] : 0.0f;
      }
#pragma unroll
      for (int j = 0; j < kCarryBatch; ++j) {
        if (k0 + j < sp.count) {
          p.piece_states[(sp.first + k0 + j) * p.d_inner * N + i] = h;
          h = __fmaf_rn(expf(__fmul_rn(S[j], A)), h, e[j]);
        }
      }
    }
    store_state(p.state, p.state_bf16, at, h);
  }
}

// 3. grid (n_pieces, channel blocks): the piece scanned from its entering state, y written.
template <bool FastExp>
__global__ void __launch_bounds__(kPieceThreads) mamba1_piece_output_kernel(Mamba1Launch p) {
  const int64_t c = blockIdx.y * int64_t(kPieceThreads) + threadIdx.x;
  if (c >= p.d_inner) return;
  const ChannelConsts<FastExp> k = channel_consts<FastExp>(p, c);
  const float Dc = load_f(p.D.data, p.D.dtype, c);
  enter_dependent();
  const SsdChunk piece = p.pieces[blockIdx.x];
  if (!chunked_seq(p.seqs[piece.seq])) return;
  float h[N];
  const float4* entering = reinterpret_cast<const float4*>(p.piece_states + (blockIdx.x * p.d_inner + c) * N);
#pragma unroll
  for (int q = 0; q < N / 4; ++q) {
    const float4 v = entering[q];
    h[4 * q] = v.x, h[4 * q + 1] = v.y, h[4 * q + 2] = v.z, h[4 * q + 3] = v.w;
  }
  for (int64_t t = piece.start; t < piece.start + piece.len; ++t) scan_token<FastExp>(p, t, c, k.A, k.bias, Dc, h);
}

unsigned cdiv(int64_t a, int64_t b) { return static_cast<unsigned>((a + b - 1) / b); }

}  // namespace

void launch_mamba1_chunked_scan(const Mamba1Launch& p, cudaStream_t stream) {
  const dim3 pieces(static_cast<unsigned>(p.n_pieces), cdiv(p.d_inner, kPieceThreads));
  const dim3 carry(cdiv(p.d_inner * N, kCarryThreads), static_cast<unsigned>(std::min<int64_t>(p.n_seqs, 65535)));
  auto run = [&](auto state_kernel, auto output_kernel) {
    launch_dependent(state_kernel, pieces, dim3(kPieceThreads), stream, p);
    launch_dependent(mamba1_piece_carry_kernel, carry, dim3(kCarryThreads), stream, p);
    launch_dependent(output_kernel, pieces, dim3(kPieceThreads), stream, p);
  };
  if (p.fast)
    run(mamba1_piece_state_kernel<true>, mamba1_piece_output_kernel<true>);
  else
    run(mamba1_piece_state_kernel<false>, mamba1_piece_output_kernel<false>);
}

}  // namespace mambacpp::cuda
