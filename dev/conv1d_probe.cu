// Where conv1d's window kernel loses time with a bf16 input (docs/perf-log/benchmarks-2026-12.md, q22): the kernel
// of conv1d.cu on mamba2-2.7b's xBC (8,192 tokens, 5,376 channels, K = 4, bf16 outputs as the fused SSD takes them), its input in f32
// or bf16 at in_proj's row stride, padded strides or contiguous rows; then simpler kernels of the same arithmetic
// (one sequence, no per-token lookups) with VEC channels and TOK tokens per thread. Inputs and weights are zeros
// (no kernel here branches on values). Events, median of 21 launches.
// Build and run on the GPU machine, from the repository root:
//   nvcc -std=c++20 -O3 -arch=sm_90 -I src -I include -I build-gpu dev/conv1d_probe.cu -o /tmp/conv1d_probe
//   /tmp/conv1d_probe
#include "../src/backend/cuda/conv1d.cu"
// The library's error path, which this file does not link.
namespace mambacpp::cuda {
[[noreturn]] void throw_cuda_error(cudaError_t e, const char* what, const char* file, int line) {
  printf("CUDA error %s at %s:%d (%s)\n", cudaGetErrorString(e), file, line, what);
  exit(1);
}
}  // namespace mambacpp::cuda
#include <algorithm>
#include <cstdio>
#include <vector>
using namespace mambacpp;
using namespace mambacpp::cuda;
#define CK(x) do { cudaError_t e = (x); if (e != cudaSuccess) { printf("CUDA %s line %d\n", cudaGetErrorString(e), __LINE__); return 1; } } while (0)

// The simpler kernels (one sequence from token 0; rows before it read as zero): VEC channels per thread by
// VEC*2-byte loads, TOK tokens per thread, the same arithmetic per channel.
template <int VEC, int TOK>
__global__ void __launch_bounds__(128) probe_vec_kernel(const uint16_t* x, int64_t stride, const float* w,
                                                         const float* bias, int64_t T, int64_t C, uint16_t* o0,
                                                         uint16_t* o1, uint16_t* o2, int64_t s0, int64_t s1) {
  const int64_t c = (blockIdx.x * int64_t(128) + threadIdx.x) * VEC;
  const int64_t t0 = int64_t(blockIdx.y) * TOK;
  if (c >= C) return;
  float wk[VEC][4], b[VEC];
#pragma unroll
  for (int j = 0; j < VEC; ++j) {
    b[j] = bias[c + j];
#pragma unroll
    for (int k = 0; k < 4; ++k) wk[j][k] = w[(c + j) * 4 + k];
  }
  using L = std::conditional_t<VEC == 8, uint4, std::conditional_t<VEC == 4, uint2, std::conditional_t<VEC == 2, uint32_t, uint16_t>>>;
  float xw[TOK + 3][VEC];
#pragma unroll
  for (int u = 0; u < TOK + 3; ++u) {
    const int64_t t = t0 - 3 + u;
    L v{};
    if (t >= 0 && t < T) v = *reinterpret_cast<const L*>(x + t * stride + c);
    const uint16_t* h = reinterpret_cast<const uint16_t*>(&v);
#pragma unroll
    for (int j = 0; j < VEC; ++j) xw[u][j] = __uint_as_float(uint32_t(h[j]) << 16);
  }
  const int part = c < s0 ? 0 : c < s1 ? 1 : 2;
  const int64_t begin = part == 0 ? 0 : part == 1 ? s0 : s1, end = part == 0 ? s0 : part == 1 ? s1 : C;
  uint16_t* o = (part == 0 ? o0 : part == 1 ? o1 : o2) + (c - begin);
  const int64_t ostride = end - begin;
#pragma unroll
  for (int v = 0; v < TOK; ++v) {
    if (t0 + v >= T) break;
    L outv;
    uint16_t* h = reinterpret_cast<uint16_t*>(&outv);
#pragma unroll
    for (int j = 0; j < VEC; ++j) {
      float acc = b[j];
#pragma unroll
      for (int k = 0; k < 4; ++k) acc += wk[j][k] * xw[v + k][j];
      h[j] = __bfloat16_as_ushort(__float2bfloat16_rn(__fdividef(acc, 1.0f + __expf(-acc))));
    }
    *reinterpret_cast<L*>(o + (t0 + v) * ostride) = outv;
  }
}

int main() {
  const int64_t T = 8192, C = 5376, K = 4, HP = 5120, GN = 128;
  int32_t* tseq; SeqSpan* seqs; float *w, *bias, *state, *f32in; uint16_t *b16in, *o16;
  CK(cudaMalloc(&tseq, T * 4)); CK(cudaMemset(tseq, 0, T * 4));
  SeqSpan s{0, T, 0}; CK(cudaMalloc(&seqs, sizeof s)); CK(cudaMemcpy(seqs, &s, sizeof s, cudaMemcpyHostToDevice));
  CK(cudaMalloc(&w, C * K * 4)); CK(cudaMemset(w, 0, C * K * 4));
  CK(cudaMalloc(&bias, C * 4)); CK(cudaMemset(bias, 0, C * 4));
  CK(cudaMalloc(&state, C * 3 * 4)); CK(cudaMemset(state, 0, C * 3 * 4));
  const int64_t maxw = 10752 + 64;
  CK(cudaMalloc(&f32in, T * maxw * 4)); CK(cudaMemset(f32in, 0, T * maxw * 4));
  CK(cudaMalloc(&b16in, T * maxw * 2)); CK(cudaMemset(b16in, 0, T * maxw * 2));
  CK(cudaMalloc(&o16, T * C * 2));
  cudaStream_t st; CK(cudaStreamCreate(&st));
  cudaEvent_t e0, e1; cudaEventCreate(&e0); cudaEventCreate(&e1);
  struct V { const char* name; bool x16; int64_t stride, offset; };
  const V vs[] = {{"f32 stride 10576 off 5120 (q19 path)", false, 10576, 5120},
                  {"bf16 stride 10576 off 5120 (q20 path)", true, 10576, 5120},
                  {"bf16 stride 10624 off 5120 (rows 128 B aligned)", true, 10624, 5120},
                  {"bf16 stride 10608 off 5120 (rows 64 B aligned)", true, 10608, 5120},
                  {"bf16 stride 5376 off 0 (xBC alone, 128 B rows)", true, 5376, 0},
                  {"f32 stride 10624 off 5120", false, 10624, 5120}};
  for (int round = 0; round < 2; ++round)
  for (const V& v : vs) {
    Conv1dLaunch p;
    if (v.x16) { p.x16 = b16in + v.offset; p.x.stride = v.stride; }
    else { p.x.data = f32in + v.offset; p.x.stride = v.stride; }
    p.w = DevWeight{w, DType::F32}; p.bias = DevWeight{bias, DType::F32};
    p.state = state; p.T = T; p.C = C; p.K = K; p.seqs = seqs; p.token_seq = tseq; p.n_seqs = 1;
    p.out16[0] = o16; p.out16[1] = o16 + T * HP; p.out16[2] = o16 + T * (HP + GN);
    p.split[0] = HP; p.split[1] = HP + GN; p.fast_silu = true;
    std::vector<float> ms;
    for (int r = 0; r < 22; ++r) {
      cudaEventRecord(e0, st);
      launch_conv1d_silu(p, st);
      cudaEventRecord(e1, st);
      CK(cudaEventSynchronize(e1));
      float m; cudaEventElapsedTime(&m, e0, e1);
      if (r) ms.push_back(m * 1000);
    }
    std::sort(ms.begin(), ms.end());
    printf("%-50s median %7.1f us (min %.1f)\n", v.name, ms[ms.size() / 2], ms[0]);
  }
  // The window kernel at one and two channels per thread on q20's input, launched directly.
  for (int round = 0; round < 2; ++round)
  for (int vec : {1, 2}) {
    Conv1dLaunch p;
    p.x16 = b16in + 5120; p.x.stride = 10576;
    p.w = DevWeight{w, DType::F32}; p.bias = DevWeight{bias, DType::F32};
    p.state = state; p.T = T; p.C = C; p.K = K; p.seqs = seqs; p.token_seq = tseq; p.n_seqs = 1;
    p.out16[0] = o16; p.out16[1] = o16 + T * HP; p.out16[2] = o16 + T * (HP + GN);
    p.split[0] = HP; p.split[1] = HP + GN; p.fast_silu = true;
    const dim3 grid(unsigned((C + vec * kWinThreads - 1) / (vec * kWinThreads)), unsigned((T + kWinTokens - 1) / kWinTokens));
    std::vector<float> ms;
    for (int r = 0; r < 22; ++r) {
      cudaEventRecord(e0, st);
      if (vec == 1) conv_out_window_kernel<true, true, 1><<<grid, kWinThreads, 0, st>>>(p);
      else conv_out_window_kernel<true, true, 2><<<grid, kWinThreads, 0, st>>>(p);
      cudaEventRecord(e1, st);
      CK(cudaEventSynchronize(e1));
      float m; cudaEventElapsedTime(&m, e0, e1);
      if (r) ms.push_back(m * 1000);
    }
    std::sort(ms.begin(), ms.end());
    printf("window kernel, %d channel(s) per thread (q20 input)      median %7.1f us (min %.1f) %s\n", vec,
           ms[ms.size() / 2], ms[0], cudaGetErrorString(cudaGetLastError()));
  }
  // The simpler kernels on q20's input (bf16, stride 10576, columns from 5120) and a padded stride.
  for (int round = 0; round < 2; ++round)
  for (int64_t stride : {10576, 10624}) {
    auto timev = [&](const char* name, auto kernel, int vec, int tok) {
      std::vector<float> ms;
      const dim3 grid(unsigned((C / vec + 127) / 128), unsigned((T + tok - 1) / tok));
      for (int r = 0; r < 22; ++r) {
        cudaEventRecord(e0, st);
        kernel<<<grid, 128, 0, st>>>(b16in + 5120, stride, w, bias, T, C, o16, o16 + T * HP, o16 + T * (HP + GN), HP, HP + GN);
        cudaEventRecord(e1, st);
        cudaEventSynchronize(e1);
        float m; cudaEventElapsedTime(&m, e0, e1);
        if (r) ms.push_back(m * 1000);
      }
      std::sort(ms.begin(), ms.end());
      printf("variant %-22s stride %lld: median %7.1f us (min %.1f) %s\n", name, (long long)stride, ms[ms.size() / 2], ms[0],
             cudaGetErrorString(cudaGetLastError()));
    };
    timev("1 ch x 16 tok", probe_vec_kernel<1, 16>, 1, 16);
    timev("1 ch x 32 tok", probe_vec_kernel<1, 32>, 1, 32);
    timev("2 ch x 16 tok", probe_vec_kernel<2, 16>, 2, 16);
    timev("4 ch x 16 tok", probe_vec_kernel<4, 16>, 4, 16);
    timev("8 ch x 16 tok", probe_vec_kernel<8, 16>, 8, 16);
    timev("8 ch x 8 tok", probe_vec_kernel<8, 8>, 8, 8);
    timev("4 ch x 32 tok", probe_vec_kernel<4, 32>, 4, 32);
  }
  return 0;
}
