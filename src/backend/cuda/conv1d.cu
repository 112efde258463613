// Causal depthwise conv1d + SiLU over the sequences of a packed batch, continuing from each slot's conv state:
//   out[t, c] = silu(bias[c] + sum_k w[c, k] * in[t - (K-1) + k, c])
// where positions before the sequence start read the slot's state (the last K-1 inputs, oldest first).
// Two launches: (1) the outputs, fully parallel over the packed batch, reading the old state; (2) one thread per
// (sequence, channel) writing the new state (the last K-1 inputs of old state ++ sequence). Splitting them keeps (1)
// free of any read-after-write hazard on the state.
// (1) for K <= kWinMaxK (every released model has K = 4): a thread per (one or two channels, kWinTokens consecutive
// tokens) keeps the inputs in a sliding window of registers, so each input is read once (not K times) and no 64-bit
// division is needed per element. The kernel waits on memory latency, so its speed is the bytes it keeps in flight
// per multiprocessor: few registers (blocks inside one sequence take a path with no lookups and no state) and
// two channels per load where the rows allow. Larger K: one thread per (token,
// channel).
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
constexpr int kWinRows = kWinTokens + kWinMaxK - 1;  // the input rows a window block reads
constexpr int kWinThreads = 128;  // 5,376 and 1,792 channels (2.7b, 130m) fill whole blocks at one or two per thread

// VEC adjacent channels of one row as one access: Half, bf16 bits; else f32.
template <bool Half, int VEC>
using Lanes = std::conditional_t<Half, std::conditional_t<VEC == 2, uint32_t, uint16_t>,
                                 std::conditional_t<VEC == 2, float2, float>>;

template <bool Half, int VEC>
__device__ __forceinline__ void unpack_lanes(const Lanes<Half, VEC>& raw, float (&v)[VEC]) {
  if constexpr (Half && VEC == 2) {
    v[0] = __uint_as_float(raw << 16);  // the lower address: the first channel
    v[1] = __uint_as_float(raw & 0xffff0000u);
  } else if constexpr (Half) {
    v[0] = __uint_as_float(uint32_t(raw) << 16);
  } else if constexpr (VEC == 2) {
    v[0] = raw.x;
    v[1] = raw.y;
  } else {
    v[0] = raw;
  }
}

template <bool Half, int VEC>
__device__ __forceinline__ Lanes<Half, VEC> pack_lanes(const float (&v)[VEC]) {
  if constexpr (Half && VEC == 2) {
    const __nv_bfloat162 b = __floats2bfloat162_rn(v[0], v[1]);  // .x at the lower address
    return *reinterpret_cast<const uint32_t*>(&b);
  } else if constexpr (Half) {
    return __bfloat16_as_ushort(__float2bfloat16_rn(v[0]));
  } else if constexpr (VEC == 2) {
    return make_float2(v[0], v[1]);
  } else {
    return v[0];
  }
}

// Where channels [c, c + VEC) go: f32 `out`, or (B16: out16 set) the bf16 tensor of their part (conv_window_vec
// keeps a channel pair inside one part).
template <bool B16, int VEC>
struct ConvSink {
  char* row0 = nullptr;  // channel c of row 0
  int64_t row_bytes = 0;
  __device__ ConvSink(const Conv1dLaunch& p, int64_t c) {
    if constexpr (!B16) {
      row0 = reinterpret_cast<char*>(p.out.data + c);
      row_bytes = p.out.stride * 4;
    } else {
      const int part = c < p.split[0] ? 0 : c < p.split[1] ? 1 : 2;
      const int64_t begin = part == 0 ? 0 : p.split[part - 1];
      const int64_t end = part == 2 ? p.C : p.split[part];
      row0 = reinterpret_cast<char*>(p.out16[part] + (c - begin));
      row_bytes = (end - begin) * 2;
    }
  }
  __device__ void store(int64_t t, const float (&v)[VEC]) const {
    *reinterpret_cast<Lanes<B16, VEC>*>(row0 + t * row_bytes) = pack_lanes<B16, VEC>(v);
  }
};

// silu by the hardware's exp2 and reciprocal approximations: a few ulp, where bf16 rounding follows (fast_silu);
// silu_f's exact exp and IEEE division are ~13 more instructions per output in a kernel that ncu found issue-bound.
__device__ __forceinline__ float silu_approx(float v) { return __fdividef(v, 1.0f + __expf(-v)); }

template <int VEC>
__device__ __forceinline__ void conv_weights(const Conv1dLaunch& p, int64_t c, float (&w)[VEC][kWinMaxK],
                                             float (&b)[VEC]) {
  const int K = static_cast<int>(p.K);
#pragma unroll
  for (int j = 0; j < VEC; ++j) {
#pragma unroll
    for (int k = 0; k < kWinMaxK; ++k) w[j][k] = k < K ? load_f(p.w.data, p.w.dtype, (c + j) * K + k) : 0.0f;
    b[j] = p.bias.data ? load_f(p.bias.data, p.bias.dtype, c + j) : 0.0f;
  }
}

// A block whose n tokens [t0, t0 + n) all lie in one sequence, past its first K-1 positions (every block of a long
// prompt but the first): the inputs need no lookups and no state. Each input row is read once, into a sliding
// window of registers.
template <bool B16, bool X16, int VEC, bool Approx>
__device__ __forceinline__ void conv_window_interior(const Conv1dLaunch& p, int64_t c, int64_t t0, int n) {
  const int K = static_cast<int>(p.K), S = K - 1;
  float w[VEC][kWinMaxK], b[VEC];
  conv_weights<VEC>(p, c, w, b);
  const int64_t row_bytes = p.x.stride * (X16 ? 2 : 4);
  const char* row = X16 ? reinterpret_cast<const char*>(p.x16 + (t0 - S) * p.x.stride + c)
                        : reinterpret_cast<const char*>(p.x.data + (t0 - S) * p.x.stride + c);
  float xw[kWinRows][VEC];  // xw[u] = x[t0 - S + u]
#pragma unroll
  for (int u = 0; u < kWinRows; ++u) {
    if (u < n + S) {
      unpack_lanes<X16, VEC>(*reinterpret_cast<const Lanes<X16, VEC>*>(row + u * row_bytes), xw[u]);
    } else {
#pragma unroll
      for (int j = 0; j < VEC; ++j) xw[u][j] = 0.0f;
    }
  }
  const ConvSink<B16, VEC> sink(p, c);
#pragma unroll
  for (int v = 0; v < kWinTokens; ++v) {
    if (v >= n) break;
    float out[VEC];
#pragma unroll
    for (int j = 0; j < VEC; ++j) {
      float acc = b[j];
#pragma unroll
      for (int k = 0; k < kWinMaxK; ++k)
        if (k < K) acc += w[j][k] * xw[v + k][j];
      out[j] = Approx ? silu_approx(acc) : silu_f(acc);
    }
    sink.store(t0 + v, out);
  }
}

// Any other block (sequence starts inside it or within K-1 rows before it, padding rows): each token looks up its
// sequence and reads the slot's state for positions before the sequence start. The same arithmetic, in the same
// order, as the interior blocks.
template <bool B16, bool X16>
__device__ void conv_window_edge(const Conv1dLaunch& p, int64_t c, int64_t t0, int n) {
  const int K = static_cast<int>(p.K), S = K - 1;
  float w[1][kWinMaxK], b[1];
  conv_weights<1>(p, c, w, b);
  const ConvSink<B16, 1> sink(p, c);
  for (int v = 0; v < n; ++v) {
    const int64_t t = t0 + v;
    const int32_t s = p.token_seq[t];
    if (s < 0) continue;
    const SeqSpan seq = p.seqs[s];
    const int64_t rel = t - seq.start;  // position inside the sequence
    float acc = b[0];
#pragma unroll
    for (int k = 0; k < kWinMaxK; ++k) {
      if (k < K) {
        const int64_t pos = rel - S + k;  // input row t - S + k, or the state before the sequence starts
        const float val = pos >= 0 ? conv_x<X16>(p, t - S + k, c)
                                   : load_state(p.state, p.state_bf16, (seq.slot * p.C + c) * S + S + pos);
        acc += w[0][k] * val;
      }
    }
    const float out[1] = {p.fast_silu && seq.len > 1 ? silu_approx(acc) : silu_f(acc)};
    sink.store(t, out);
  }
}

// grid (ceil(C / (VEC * kWinThreads)), ceil(T / kWinTokens)): VEC channels (conv_window_vec) by kWinTokens tokens
// per thread. X16: the input in bf16 (Conv1dLaunch::x16).
template <bool B16, bool X16, int VEC>
__global__ void __launch_bounds__(kWinThreads) conv_out_window_kernel(Conv1dLaunch p) {
  enter_dependent();
  const int64_t c = (blockIdx.x * int64_t(kWinThreads) + threadIdx.x) * VEC;
  if (c >= p.C) return;
  const int64_t t0 = int64_t(blockIdx.y) * kWinTokens;
  const int n = static_cast<int>(min(int64_t(kWinTokens), p.T - t0));
  const int32_t s_first = p.token_seq[t0], s_last = p.token_seq[t0 + n - 1];
  if (s_first >= 0 && s_first == s_last && t0 - p.seqs[s_first].start >= p.K - 1) {  // block-uniform
    if (p.fast_silu && p.seqs[s_first].len > 1)
      conv_window_interior<B16, X16, VEC, true>(p, c, t0, n);
    else
      conv_window_interior<B16, X16, VEC, false>(p, c, t0, n);
    return;
  }
#pragma unroll
  for (int j = 0; j < VEC; ++j) conv_window_edge<B16, X16>(p, c + j, t0, n);
}

// A value as the conv state holds it: rounded to bf16 where the state is bf16 (store_state's rounding).
__device__ __forceinline__ float as_state(float v, bool bf16) {
  return bf16 ? __bfloat162float(__float2bfloat16_rn(v)) : v;
}

// Decode (every sequence one token, K <= kWinMaxK), or short pieces (Conv1dLaunch::all_single: 1..kStepMaxLen
// tokens each, every one as a decode step): a thread per (sequence, channel) reads the K-1 state entries and each new
// input once, writes the outputs and the shifted state. Between tokens the window keeps the inputs as the state
// would hold them (as_state), since a decode step reads its window back from the state. grid (ceil(C / kThreads),
// n_seqs). One kernel, not two: a decode step's conv moves little memory, so a second launch and the round trip
// through memory between the two would cost more than the work.
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
  for (int64_t i = 0; i < seq.len; ++i) {
    const int64_t t = seq.start + i;
    const float xv = p.x.data[t * p.x.stride + c];
    float acc = p.bias.data ? load_f(p.bias.data, p.bias.dtype, c) : 0.0f;
#pragma unroll
    for (int k = 0; k < kWinMaxK; ++k) {
      if (k < K) acc += load_f(p.w.data, p.w.dtype, c * K + k) * (k == S ? xv : win[k]);
    }
    p.out.data[t * p.out.stride + c] = silu_f(acc);
#pragma unroll
    for (int j = 0; j < kWinMaxK - 1; ++j) {
      if (j < S) win[j] = j + 1 < S ? win[j + 1] : as_state(xv, p.state_bf16);
    }
  }
#pragma unroll
  for (int j = 0; j < kWinMaxK - 1; ++j) {
    if (j < S) store_state(p.state, p.state_bf16, base + j, win[j]);
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

// Two channels per thread (one 4- or 8-byte access per row instead of two) where every row keeps channel pairs
// aligned: an even channel count, even row strides, aligned bases and, for the bf16 outputs, even split points.
int conv_window_vec(const Conv1dLaunch& p) {
  auto aligned = [](const void* ptr, int64_t stride, int elem_bytes) {
    return reinterpret_cast<uintptr_t>(ptr) % (2 * elem_bytes) == 0 && stride % 2 == 0;
  };
  if (p.C % 2 != 0) return 1;
  if (!(p.x16 ? aligned(p.x16, p.x.stride, 2) : aligned(p.x.data, p.x.stride, 4))) return 1;
  if (p.out16[0]) {
    if (p.split[0] % 2 != 0 || p.split[1] % 2 != 0) return 1;
    for (const uint16_t* o : p.out16)
      if (!aligned(o, 0, 2)) return 1;
  } else if (!aligned(p.out.data, p.out.stride, 4)) {
    return 1;
  }
  return 2;
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
    const bool b16 = p.out16[0] != nullptr, x16 = p.x16 != nullptr;
    const int vec = conv_window_vec(p);
    void (*kernel)(Conv1dLaunch) =
        vec == 2 ? (b16 ? (x16 ? conv_out_window_kernel<true, true, 2> : conv_out_window_kernel<true, false, 2>)
                        : (x16 ? conv_out_window_kernel<false, true, 2> : conv_out_window_kernel<false, false, 2>))
                 : (b16 ? (x16 ? conv_out_window_kernel<true, true, 1> : conv_out_window_kernel<true, false, 1>)
                        : (x16 ? conv_out_window_kernel<false, true, 1> : conv_out_window_kernel<false, false, 1>));
    const int64_t per_block = int64_t(vec) * kWinThreads;
    launch_dependent(kernel,
                     dim3(static_cast<unsigned>((p.C + per_block - 1) / per_block),
                          static_cast<unsigned>((p.T + kWinTokens - 1) / kWinTokens)),
                     dim3(kWinThreads), stream, p);
  } else {
    launch_dependent(conv_out_kernel, dim3(blocks_for(p.T * p.C)), dim3(kThreads), stream, p);
  }
  // Its wait also orders it after the outputs, which read the old state it overwrites.
  if (p.K > 1 && p.n_seqs > 0)
    launch_dependent(conv_state_kernel, dim3(blocks_for(p.n_seqs * p.C)), dim3(kThreads), stream, p);
}

}  // namespace mambacpp::cuda
