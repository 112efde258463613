// Read bandwidth of this machine: threads each sum their contiguous slice of a buffer far larger than the caches,
// as a decode step streams its weights. Prints one JSON line: the median of 7 passes, in GB/s (1e9 bytes/s), from a
// buffer in 2 MiB pages (madvise(MADV_HUGEPAGE), where the kernel grants them: mambacpp keeps its CPU weights so)
// as "read_gb_s", and from one in 4 KiB pages as "read_gb_s_4k" (as a memory-mapped GGUF); summarise.mjs's floor
// takes the higher of the two.
//   cc -O3 -march=native -fopenmp read_bw.c -o read_bw && ./read_bw 2 [MiB]
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

static int cmp(const void* a, const void* b) {
  const double x = *(const double*)a, y = *(const double*)b;
  return (x > y) - (x < y);
}

static double median_pass(const float* buf, size_t n, int threads, double* sink) {
  double gbs[7];
  for (int rep = 0; rep < 7; ++rep) {
    const double t0 = omp_get_wtime();
    double total = 0;
#pragma omp parallel num_threads(threads) reduction(+ : total)
    {
      const int t = omp_get_thread_num(), nt = omp_get_num_threads();
      const size_t lo = n * t / nt, hi = n * (t + 1) / nt;
      float acc[16] = {0};
      for (size_t i = lo; i + 16 <= hi; i += 16)
        for (int k = 0; k < 16; ++k) acc[k] += buf[i + k];
      for (int k = 0; k < 16; ++k) total += acc[k];
    }
    gbs[rep] = (double)n * sizeof(float) / (omp_get_wtime() - t0) / 1e9;
    *sink += total;
  }
  qsort(gbs, 7, sizeof(double), cmp);
  return gbs[3];
}

static float* filled(size_t n, int threads, int huge) {
  const size_t bytes = (n * sizeof(float) + (2u << 20) - 1) / (2u << 20) * (2u << 20);
  float* buf = aligned_alloc(2u << 20, bytes);
  if (!buf) return NULL;
  if (huge) madvise(buf, bytes, MADV_HUGEPAGE);  /* advisory: refused, the pages stay 4 KiB */
  else madvise(buf, bytes, MADV_NOHUGEPAGE);
#pragma omp parallel for num_threads(threads) schedule(static)
  for (size_t i = 0; i < n; ++i) buf[i] = (float)(i & 1023) * 1e-3f;
  return buf;
}

int main(int argc, char** argv) {
  const int threads = argc > 1 ? atoi(argv[1]) : 2;
  const size_t mib = argc > 2 ? (size_t)atoll(argv[2]) : 1024;
  const size_t n = mib * 1024 * 1024 / sizeof(float);
  double sink = 0;
  float* buf = filled(n, threads, 1);
  if (!buf) return fprintf(stderr, "read_bw: cannot allocate %zu MiB\n", mib), 1;
  const double huge = median_pass(buf, n, threads, &sink);
  free(buf);
  buf = filled(n, threads, 0);
  if (!buf) return fprintf(stderr, "read_bw: cannot allocate %zu MiB\n", mib), 1;
  const double small = median_pass(buf, n, threads, &sink);
  free(buf);
  printf("{\"threads\": %d, \"buffer_mib\": %zu, \"read_gb_s\": %.2f, \"read_gb_s_4k\": %.2f, \"checksum\": %.1f}\n",
         threads, mib, huge, small, sink);
  return 0;
}
