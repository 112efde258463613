// f32 FMA peak of this machine: each thread runs 12 independent chains of 8-lane FMAs (AVX2 + FMA: enough chains to
// cover the FMA latency on two FMA pipes) on registers only. Prints one JSON line: the median of 7 passes in GFLOP/s
// (an FMA counts 2 flops), the figure prefill's achieved GFLOP/s is compared with.
//   cc -O3 -march=native -fopenmp fma_peak.c -o fma_peak && ./fma_peak 2
#include <immintrin.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>

static int cmp(const void* a, const void* b) {
  const double x = *(const double*)a, y = *(const double*)b;
  return (x > y) - (x < y);
}

#define CHAINS 12
static const long kIters = 100000000;  // per thread and pass: 12 * 8 * 2 * 1e8 = 19.2 GFLOP

int main(int argc, char** argv) {
  const int threads = argc > 1 ? atoi(argv[1]) : 2;
  double gflops[7];
  float sink = 0;
  for (int rep = 0; rep < 7; ++rep) {
    const double t0 = omp_get_wtime();
    float part = 0;
#pragma omp parallel num_threads(threads) reduction(+ : part)
    {
      __m256 acc[CHAINS];
      const __m256 m = _mm256_set1_ps(0.999999f), a = _mm256_set1_ps(1e-7f);
      for (int c = 0; c < CHAINS; ++c) acc[c] = _mm256_set1_ps((float)(c + omp_get_thread_num()));
      for (long i = 0; i < kIters; ++i)
        for (int c = 0; c < CHAINS; ++c) acc[c] = _mm256_fmadd_ps(acc[c], m, a);
      float out[8];
      __m256 s = acc[0];
      for (int c = 1; c < CHAINS; ++c) s = _mm256_add_ps(s, acc[c]);
      _mm256_storeu_ps(out, s);
      part = out[0];
    }
    const double dt = omp_get_wtime() - t0;
    sink += part;
    gflops[rep] = (double)threads * kIters * CHAINS * 8 * 2 / dt / 1e9;
  }
  qsort(gflops, 7, sizeof(double), cmp);
  printf("{\"threads\": %d, \"fma_peak_gflop_s\": %.2f, \"fma_peak_gflop_s_runs\": [%.2f, %.2f, %.2f, %.2f, %.2f, %.2f, %.2f], \"sink\": %g}\n",
         threads, gflops[3], gflops[0], gflops[1], gflops[2], gflops[3], gflops[4], gflops[5], gflops[6], (double)sink);
  return 0;
}
