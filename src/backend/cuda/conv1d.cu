// Causal depthwise conv1d + SiLU over the sequences of a packed batch, continuing from each slot's conv state:
//   out[t, c] = silu(bias[c] + sum_k w[c, k] * in[t - (K-1) + k, c])
// where positions before the sequence start read the slot's state (the last K-1 inputs, oldest first).
// Two launches: (1) the outputs, fully parallel over the packed batch, reading the old state; (2) one thread per
// (sequence, channel) writing the new state (the last K-1 inputs of old state ++ sequence). Splitting them keeps (1)
// free of any read-after-write hazard on the state.
// (1) for K <= kWinMaxK (every released model has K = 4): a thread per (channel, kWinTokens consecutive tokens)
// keeps the inputs in a sliding window of registers, so each input is read once (not K times) and no 64-bit
// division is needed per element (146 us -> see docs/benchmarks.md, mamba2-2.7b, 2048 x 5376). Larger K: one
// thread per (token, channel).
#include <type_traits>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/cuda_launch.cuh"
#include "backend/cuda/cuda_ops.h"
#include "mambacpp/error.h"

namespace mambacpp::cuda {
namespace {

constexpr int kThreads = 256;

// Input row t, channel c as f32 (x16: from bf16 bits, exact).
template <bool X16>
__device__ __forceinline__ float conv_x(const Conv1dLaunch& p, int64_t t, int64_t c) {
  if constexpr (X16)
    return __uint_as_float(uint32_t(p.x16[t * p.x.stride + c]) << 16);
  else
    return p.x.data[t * p.x.stride + c];
}

__global__ void conv_out_kernel(Conv1dLaunch p) {
  enter_dependent();
  const int64_t n = p.T * p.C, S = p.K - 1;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t t = i / p.C, c = i % p.C;  // c fastest: a warp reads consecutive channels of one row
    const int32_t s = p.token_seq[t];
    if (s < 0) continue;
    const SeqSpan seq = p.seqs[s];
    const int64_t rel = t - seq.start;  // position inside the sequence
    float acc = p.bias.data ? load_f(p.bias.data, p.bias.dtype, c) : 0.0f;
    for (int64_t k = 0; k < p.K; ++k) {
      const int64_t pos = rel - S + k;
      const float v = pos >= 0 ? p.x.data[(seq.start + pos) * p.x.stride + c]
                               : load_state(p.state, p.state_bf16, (seq.slot * p.C + c) * S + S + pos);
      acc += load_f(p.w.data, p.w.dtype, c * p.K + k) * v;
    }
    p.out.data[t * p.out.stride + c] = silu_f(acc);
  }
}

constexpr int kWinMaxK = 4;
constexpr int kWinTokens = 16;

// Where channel c's outputs go: f32 `out`, or (B16: out16 set) its bf16 tensor.
template <bool B16>
struct ConvSink {
  float* f32 = nullptr;
  uint16_t* b16 = nullptr;
  int64_t stride = 0;
  __device__ ConvSink(const Conv1dLaunch& p, int64_t c) {
    if constexpr (!B16) {
      f32 = p.out.data + c;
      stride = p.out.stride;
    } else {
      const int part = c < p.split[0] ? 0 : c < p.split[1] ? 1 : 2;
      const int64_t begin = part == 0 ? 0 : p.split[part - 1];
      const int64_t end = part == 2 ? p.C : p.split[part];
      b16 = p.out16[part] + (c - begin);
      stride = end - begin;
    }
  }
  __device__ void store(int64_t t, float v) const {
    if constexpr (B16)
      b16[t * stride] = __bfloat16_as_ushort(__float2bfloat16_rn(v));
    else
      f32[t * stride] = v;
  }
};

// silu by the hardware's exp2 and reciprocal approximations: a few ulp, where bf16 rounding follows (fast_silu);
// silu_f's exact exp and IEEE division are ~13 more instructions per output in a kernel that ncu found issue-bound.
__device__ __forceinline__ float silu_approx(float v) { return __fdividef(v, 1.0f + __expf(-v)); }

// grid (ceil(C / kThreads), ceil(T / kWinTokens)). X16: the input in bf16 (Conv1dLaunch::x16).
template <bool B16, bool X16>
__global__ void __launch_bounds__(kThreads) conv_out_window_kernel(Conv1dLaunch p) {
  enter_dependent();
  const int64_t c = blockIdx.x * int64_t(kThreads) + threadIdx.x;
  const int64_t t0 = int64_t(blockIdx.y) * kWinTokens;
  if (c >= p.C) return;
  const int K = static_cast<int>(p.K), S = K - 1;
  float w[kWinMaxK];
#pragma unroll
  for (int k = 0; k < kWinMaxK; ++k) w[k] = k < K ? load_f(p.w.data, p.w.dtype, c * K + k) : 0.0f;
  const float b = p.bias.data ? load_f(p.bias.data, p.bias.dtype, c) : 0.0f;
  const ConvSink<B16> sink(p, c);
  // xw[u] = x[t0 - S + u]: the window of inputs the block's tokens read (rows outside [0, T) never used).
  float xw[kWinTokens + kWinMaxK - 1];
#pragma unroll
  for (int u = 0; u < kWinTokens + kWinMaxK - 1; ++u) {
    const int64_t t = t0 - S + u;
    xw[u] = u < kWinTokens + S && t >= 0 && t < p.T ? conv_x<X16>(p, t, c) : 0.0f;
  }
  // The block's tokens all inside one sequence and past its first S positions (every block of a long prompt but
  // the first): no per-token lookups, which were a chain of two dependent loads per token.
  const int64_t t_last = min(t0 + kWinTokens, p.T) - 1;
  const int32_t s_first = p.token_seq[t0], s_last = p.token_seq[t_last];
  if (s_first >= 0 && s_first == s_last && t0 - p.seqs[s_first].start >= S) {  // block-uniform
    auto outputs = [&](auto approx) {
#pragma unroll
      for (int v = 0; v < kWinTokens; ++v) {
        if (t0 + v > t_last) break;
        float acc = b;
#pragma unroll
        for (int k = 0; k < kWinMaxK; ++k)
          if (k < K) acc += w[k] * xw[v + k];
        sink.store(t0 + v, decltype(approx)::value ? silu_approx(acc) : silu_f(acc));
      }
    };
    if (p.fast_silu && p.seqs[s_first].len > 1)
      outputs(std::true_type{});
    else
      outputs(std::false_type{});
    return;
  }
#pragma unroll
  for (int v = 0; v < kWinTokens; ++v) {
    const int64_t t = t0 + v;
    if (t >= p.T) break;
    const int32_t s = p.token_seq[t];
    if (s < 0) continue;
    const SeqSpan seq = p.seqs[s];
    const int64_t rel = t - seq.start;  // position inside the sequence
    float acc = b;
#pragma unroll
    for (int k = 0; k < kWinMaxK; ++k) {
      if (k < K) {
        const int64_t pos = rel - S + k;  // input row t - S + k, or the state before the sequence starts
        const float val = pos >= 0 ? xw[v + k]
                                   : load_state(p.state, p.state_bf16, (seq.slot * p.C + c) * S + S + pos);
        acc += w[k] * val;
      }
    }
    sink.store(t, p.fast_silu && seq.len > 1 ? silu_approx(acc) : silu_f(acc));
  }
}

// Decode (every sequence one token, K <= kWinMaxK): a thread per (sequence, channel) reads the K-1 state entries
// and the new input once, writes the output and the shifted state. grid (ceil(C / kThreads), n_seqs). At batch 32
// of mamba2-2.7b the two-kernel form took 18 + 7 us per layer (ncu), for 0.7 MB of state and activations.
__global__ void __launch_bounds__(kThreads) conv_step_kernel(Conv1dLaunch p) {
  enter_dependent();
  const int64_t c = blockIdx.x * int64_t(kThreads) + threadIdx.x;
  if (c >= p.C) return;
  const SeqSpan seq = p.seqs[blockIdx.y];
  if (seq.len <= 0) return;
  const int K = static_cast<int>(p.K), S = K - 1;
  const int64_t base = (seq.slot * p.C + c) * S;
  float win[kWinMaxK];
#pragma unroll
  for (int k = 0; k < kWinMaxK - 1; ++k) win[k] = k < S ? load_state(p.state, p.state_bf16, base + k) : 0.0f;
  const float xv = p.x.data[seq.start * p.x.stride + c];
  float acc = p.bias.data ? load_f(p.bias.data, p.bias.dtype, c) : 0.0f;
#pragma unroll
  for (int k = 0; k < kWinMaxK; ++k) {
    if (k < K) acc += load_f(p.w.data, p.w.dtype, c * K + k) * (k == S ? xv : win[k]);
  }
  p.out.data[seq.start * p.out.stride + c] = silu_f(acc);
#pragma unroll
  for (int j = 0; j < kWinMaxK - 1; ++j) {
    if (j < S) store_state(p.state, p.state_bf16, base + j, j + 1 < S ? win[j + 1] : xv);
  }
}

__global__ void conv_state_kernel(Conv1dLaunch p) {
  enter_dependent();
  const int64_t n = p.n_seqs * p.C, S = p.K - 1;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t s = i / p.C, c = i % p.C;
    const SeqSpan seq = p.seqs[s];
    if (seq.len <= 0) continue;
    const int64_t base = (seq.slot * p.C + c) * S;
    // Ascending j reads old entry j + len (> j) before anything overwrites it.
    for (int64_t j = 0; j < S; ++j) {
      const int64_t pos = seq.len - S + j;
      const float v = pos < 0    ? load_state(p.state, p.state_bf16, base + j + seq.len)
                      : p.x16 ? conv_x<true>(p, seq.start + pos, c)
                              : conv_x<false>(p, seq.start + pos, c);
      store_state(p.state, p.state_bf16, base + j, v);
    }
  }
}

unsigned blocks_for(int64_t n) {
  const int64_t b = (n + kThreads - 1) / kThreads;
  return static_cast<unsigned>(b < 1 ? 1 : (b > (1 << 20) ? (1 << 20) : b));
}

}  // namespace

bool conv1d_bf16_outputs_supported(const Conv1dLaunch& p) {
  return !p.all_single && p.K >= 1 && p.K <= kWinMaxK && (p.T + kWinTokens - 1) / kWinTokens <= 65535;
}

void launch_conv1d_silu(const Conv1dLaunch& p, cudaStream_t stream) {
  if (p.T <= 0 || p.C <= 0) return;
  if (p.x16 && !conv1d_bf16_outputs_supported(p))
    fail("conv1d: a bf16 input is for multi-token batches on the window kernel (K <= ", kWinMaxK, "), found K = ", p.K,
         p.all_single ? " in a decode batch" : "");
  if (p.all_single && p.K >= 1 && p.K <= kWinMaxK && p.n_seqs > 0 && p.n_seqs <= 65535) {
    launch_dependent(conv_step_kernel,
                     dim3(static_cast<unsigned>((p.C + kThreads - 1) / kThreads), static_cast<unsigned>(p.n_seqs)),
                     dim3(kThreads), stream, p);
    return;
  }
  if (p.K <= kWinMaxK && (p.T + kWinTokens - 1) / kWinTokens <= 65535) {
    launch_dependent(p.out16[0] ? (p.x16 ? conv_out_window_kernel<true, true> : conv_out_window_kernel<true, false>)
                                : (p.x16 ? conv_out_window_kernel<false, true> : conv_out_window_kernel<false, false>),
                     dim3(static_cast<unsigned>((p.C + kThreads - 1) / kThreads),
                          static_cast<unsigned>((p.T + kWinTokens - 1) / kWinTokens)),
                     dim3(kThreads), stream, p);
  } else {
    launch_dependent(conv_out_kernel, dim3(blocks_for(p.T * p.C)), dim3(kThreads), stream, p);
  }
  // Its wait also orders it after the outputs, which read the old state it overwrites.
  if (p.K > 1 && p.n_seqs > 0)
    launch_dependent(conv_state_kernel, dim3(blocks_for(p.n_seqs * p.C)), dim3(kThreads), stream, p);
}

}  // namespace mambacpp::cuda
