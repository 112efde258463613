// Causal depthwise conv1d + SiLU over the sequences of a packed batch, continuing from each slot's conv state:
//   out[t, c] = silu(bias[c] + sum_k w[c, k] * in[t - (K-1) + k, c])
// where positions before the sequence start read the slot's state (the last K-1 inputs, oldest first).
// Two launches: (1) one thread per (token, channel), fully parallel over the packed batch, reading the old state;
// (2) one thread per (sequence, channel) writing the new state (the last K-1 inputs of old state ++ sequence).
// Splitting them keeps (1) free of any read-after-write hazard on the state.
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/cuda_ops.h"

namespace mambacpp::cuda {
namespace {

constexpr int kThreads = 256;

__global__ void conv_out_kernel(Conv1dLaunch p) {
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

__global__ void conv_state_kernel(Conv1dLaunch p) {
  const int64_t n = p.n_seqs * p.C, S = p.K - 1;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t s = i / p.C, c = i % p.C;
    const SeqSpan seq = p.seqs[s];
    if (seq.len <= 0) continue;
    const int64_t base = (seq.slot * p.C + c) * S;
    // Ascending j reads old entry j + len (> j) before anything overwrites it.
    for (int64_t j = 0; j < S; ++j) {
      const int64_t pos = seq.len - S + j;
      const float v = pos >= 0 ? p.x.data[(seq.start + pos) * p.x.stride + c]
                               : load_state(p.state, p.state_bf16, base + j + seq.len);
      store_state(p.state, p.state_bf16, base + j, v);
    }
  }
}

unsigned blocks_for(int64_t n) {
  const int64_t b = (n + kThreads - 1) / kThreads;
  return static_cast<unsigned>(b < 1 ? 1 : (b > (1 << 20) ? (1 << 20) : b));
}

}  // namespace

void launch_conv1d_silu(const Conv1dLaunch& p, cudaStream_t stream) {
  if (p.T <= 0 || p.C <= 0) return;
  conv_out_kernel<<<blocks_for(p.T * p.C), kThreads, 0, stream>>>(p);
  MAMBACPP_CUDA_LAUNCHED();
  if (p.K > 1 && p.n_seqs > 0) {
    conv_state_kernel<<<blocks_for(p.n_seqs * p.C), kThreads, 0, stream>>>(p);
    MAMBACPP_CUDA_LAUNCHED();
  }
}

}  // namespace mambacpp::cuda
