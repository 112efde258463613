// Can a prefill GEMM write bf16 with the bits of its f32 output rounded to nearest even? y^T [out, T] = W [out, in] .
// X^T with bf16 operands and f32 accumulation, as gemm_lt.h runs it: each of cuBLASLt's heuristic candidates with a
// bf16 output is compared, over every element, with each f32-output candidate's result rounded, and timed (10 runs).
// Build and run on the GPU machine (docs/perf-log/benchmarks-2026-12.md, q19):
//   nvcc -std=c++17 -arch=sm_90 -O2 dev/gemm_bf16_output_probe.cu -lcublasLt -o /tmp/probe
//   /tmp/probe [OUT IN T]   (default: mamba2-2.7b's in_proj, 10576 2560 4096)
#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <cstdio>
#include <cstdlib>
#include <vector>
#define CK(x) do { auto e_ = (x); if ((int)e_) { printf("err %d at %s:%d\n", (int)e_, __FILE__, __LINE__); exit(1); } } while (0)
__global__ void fill(__nv_bfloat16* p, size_t n, unsigned seed) {
  size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
  if (i >= n) return;
  unsigned h = (unsigned)i * 2654435761u ^ seed; h ^= h >> 13; h *= 0x5bd1e995u; h ^= h >> 15;
  p[i] = __float2bfloat16(((h & 0xffff) / 65536.0f - 0.5f) * 0.1f);
}
__global__ void round_cmp(const float* f, const __nv_bfloat16* b, size_t n, unsigned long long* bad) {
  size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
  if (i >= n) return;
  __nv_bfloat16 r = __float2bfloat16_rn(f[i]);
  if (*(unsigned short*)&r != *(const unsigned short*)&b[i]) atomicAdd(bad, 1ull);
}
int main(int argc, char** argv) {
  int out = argc > 1 ? atoi(argv[1]) : 10576, in = argc > 2 ? atoi(argv[2]) : 2560, T = argc > 3 ? atoi(argv[3]) : 4096;
  cublasLtHandle_t h; CK(cublasLtCreate(&h));
  __nv_bfloat16 *w, *x, *yb; float* yf; void* ws; size_t wsb = 32u << 20; unsigned long long* bad;
  CK(cudaMalloc(&w, (size_t)out * in * 2)); CK(cudaMalloc(&x, (size_t)T * in * 2));
  CK(cudaMalloc(&yb, (size_t)T * out * 2)); CK(cudaMalloc(&yf, (size_t)T * out * 4)); CK(cudaMalloc(&ws, wsb));
  CK(cudaMalloc(&bad, 8));
  fill<<<(out * (size_t)in + 255) / 256, 256>>>(w, (size_t)out * in, 1);
  fill<<<(T * (size_t)in + 255) / 256, 256>>>(x, (size_t)T * in, 2);
  // y^T [out, T] = W [out, in] . X^T: A = W row-major [out, in] = col-major [in, out] transposed; B = X^T col-major [in, T].
  cublasLtMatmulDesc_t d; CK(cublasLtMatmulDescCreate(&d, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
  CK(cublasLtMatmulDescSetAttribute(d, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta));
  CK(cublasLtMatmulDescSetAttribute(d, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb));
  cublasLtMatrixLayout_t la, lb, lf, l16;
  CK(cublasLtMatrixLayoutCreate(&la, CUDA_R_16BF, in, out, in));
  CK(cublasLtMatrixLayoutCreate(&lb, CUDA_R_16BF, in, T, in));
  CK(cublasLtMatrixLayoutCreate(&lf, CUDA_R_32F, out, T, out));
  CK(cublasLtMatrixLayoutCreate(&l16, CUDA_R_16BF, out, T, out));
  cublasLtMatmulPreference_t pref; CK(cublasLtMatmulPreferenceCreate(&pref));
  CK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &wsb, sizeof wsb));
  auto cands = [&](cublasLtMatrixLayout_t lc) {
    std::vector<cublasLtMatmulHeuristicResult_t> r(16); int n = 0;
    CK(cublasLtMatmulAlgoGetHeuristic(h, d, la, lb, lc, lc, pref, 16, r.data(), &n)); r.resize(n); return r;
  };
  auto fc = cands(lf), bc = cands(l16);
  float one = 1, zero = 0;
  cudaEvent_t e0, e1; cudaEventCreate(&e0); cudaEventCreate(&e1);
  auto desc = [&](const cublasLtMatmulAlgo_t& a) {
    int id = 0, tile = 0, sk = 0, stages = 0; size_t s;
    cublasLtMatmulAlgoConfigGetAttribute(&a, CUBLASLT_ALGO_CONFIG_ID, &id, sizeof id, &s);
    cublasLtMatmulAlgoConfigGetAttribute(&a, CUBLASLT_ALGO_CONFIG_TILE_ID, &tile, sizeof tile, &s);
    cublasLtMatmulAlgoConfigGetAttribute(&a, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &sk, sizeof sk, &s);
    cublasLtMatmulAlgoConfigGetAttribute(&a, CUBLASLT_ALGO_CONFIG_STAGES_ID, &stages, sizeof stages, &s);
    static char buf[96]; snprintf(buf, sizeof buf, "id %d tile %d splitk %d stages %d", id, tile, sk, stages); return buf;
  };
  auto timeit = [&](auto&& f) { f(); cudaEventRecord(e0); for (int i = 0; i < 10; ++i) f(); cudaEventRecord(e1);
    cudaEventSynchronize(e1); float ms; cudaEventElapsedTime(&ms, e0, e1); return ms * 100.0f; };  // us per call
  double flop = 2.0 * out * in * (double)T;
  printf("shape out %d in %d T %d: %zu f32-D candidates, %zu bf16-D candidates\n", out, in, T, fc.size(), bc.size());
  for (size_t i = 0; i < fc.size(); ++i) {
    float us = timeit([&] { cublasLtMatmul(h, d, &one, w, la, x, lb, &zero, yf, lf, yf, lf, &fc[i].algo, ws, wsb, 0); });
    CK(cudaDeviceSynchronize());
    printf("f32  %2zu  %-40s %8.1f us %6.0f TFLOP/s\n", i, desc(fc[i].algo), us, flop / us * 1e-6);
  }
  for (size_t j = 0; j < bc.size(); ++j) {
    float us = timeit([&] { cublasLtMatmul(h, d, &one, w, la, x, lb, &zero, yb, l16, yb, l16, &bc[j].algo, ws, wsb, 0); });
    CK(cudaDeviceSynchronize());
    printf("bf16 %2zu  %-40s %8.1f us %6.0f TFLOP/s  equal to round(f32 #):", j, desc(bc[j].algo), us, flop / us * 1e-6);
    for (size_t i = 0; i < fc.size(); ++i) {
      CK(cublasLtMatmul(h, d, &one, w, la, x, lb, &zero, yf, lf, yf, lf, &fc[i].algo, ws, wsb, 0));
      CK(cudaMemset(bad, 0, 8));
      size_t n = (size_t)out * T;
      round_cmp<<<(n + 255) / 256, 256>>>(yf, yb, n, bad);
      unsigned long long nb; CK(cudaMemcpy(&nb, bad, 8, cudaMemcpyDeviceToHost));
      if (nb == 0) printf(" %zu", i); else if (i == 0) printf(" (#0: %llu differ)", nb);
    }
    printf("\n");
  }
  return 0;
}
