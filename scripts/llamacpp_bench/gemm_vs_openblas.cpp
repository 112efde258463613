// The prefill projections alone: mambacpp's CPU linear (the packed GEMM of src/backend/cpu/gemm.h) against OpenBLAS
// sgemm on the same shapes and threads, f32 weights, and bf16 weights (OpenBLAS: widened to f32 once per call, then
// sgemm; the widening is timed with it). Prints one line per (shape, weights): median ms of 7 calls after a warm-up and
// GFLOP/s. A benchmark tool, not built by CMake; OpenBLAS is not a dependency of the project. Build it against the
// static library of a build directory and Debian's OpenBLAS (libopenblas-pthread-dev; unpacked anywhere with dpkg -x):
//   OB=/usr  # or the dpkg -x root
//   g++ -O2 -std=c++20 -Isrc -Iinclude scripts/llamacpp_bench/gemm_vs_openblas.cpp build/libmambacpp.a -lhwy \
//     -I$OB/usr/include/x86_64-linux-gnu/openblas-pthread -L$OB/usr/lib/x86_64-linux-gnu/openblas-pthread -lopenblas \
//     -Wl,-rpath,$OB/usr/lib/x86_64-linux-gnu/openblas-pthread -fopenmp -o /tmp/gemm_vs_openblas
//   /tmp/gemm_vs_openblas 2 512
#include <cblas.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>

#include "backend/cpu/cpu_ops.h"
#include "mambacpp/dtype.h"

extern "C" void openblas_set_num_threads(int);

using namespace mambacpp;

template <class F>
double median_ms(F&& f) {
  f();
  std::vector<double> ms;
  for (int r = 0; r < 7; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    f();
    ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
  }
  std::sort(ms.begin(), ms.end());
  return ms[3];
}

int main(int argc, char** argv) {
  const int threads = argc > 1 ? std::atoi(argv[1]) : 2;
  const int64_t T = argc > 2 ? std::atoll(argv[2]) : 512;
  openblas_set_num_threads(threads);
  struct Shape { const char* name; int64_t in, out; };
  const Shape shapes[] = {{"mamba2-130m in_proj", 768, 3352}, {"mamba2-130m out_proj", 1536, 768},
                          {"mamba-130m in_proj", 768, 3072},  {"mamba2-1.3b in_proj", 2048, 8512},
                          {"mamba2-1.3b out_proj", 4096, 2048}};
  std::mt19937 rng(1);
  std::uniform_real_distribution<float> d(-1, 1);
  for (const Shape& s : shapes) {
    std::vector<float> x(static_cast<size_t>(T * s.in)), w(static_cast<size_t>(s.out * s.in)), y(static_cast<size_t>(T * s.out));
    for (auto& v : x) v = d(rng);
    std::vector<uint16_t> wb(w.size());
    for (size_t i = 0; i < w.size(); ++i) {
      wb[i] = f32_to_bf16(d(rng));
      w[i] = bf16_to_f32(wb[i]);
    }
    std::vector<float> wtmp(w.size());
    const double gflop = 2.0 * T * s.in * s.out / 1e9;
    const cpu::Rows<const float> xr{x.data(), s.in};
    const cpu::Rows<float> yr{y.data(), s.out};
    const double m_f32 = median_ms([&] { cpu::linear_f32(xr, {w.data(), DType::F32}, {}, yr, T, s.in, s.out, threads); });
    const double m_bf16 = median_ms([&] { cpu::linear_f32(xr, {wb.data(), DType::BF16}, {}, yr, T, s.in, s.out, threads); });
    auto sgemm = [&](const float* wp) {
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, T, s.out, s.in, 1.0f, x.data(), s.in, wp, s.in, 0.0f,
                  y.data(), s.out);
    };
    const double o_f32 = median_ms([&] { sgemm(w.data()); });
    const double o_bf16 = median_ms([&] {
      convert_to_f32(wb.data(), DType::BF16, wtmp.data(), static_cast<int64_t>(wb.size()));
      sgemm(wtmp.data());
    });
    std::printf("| %s, %lld x %lld x %lld | %.1f (%.0f) | %.1f (%.0f) | %.1f (%.0f) | %.1f (%.0f) |\n", s.name,
                static_cast<long long>(T), static_cast<long long>(s.in), static_cast<long long>(s.out), m_f32,
                gflop / m_f32 * 1e3, o_f32, gflop / o_f32 * 1e3, m_bf16, gflop / m_bf16 * 1e3, o_bf16,
                gflop / o_bf16 * 1e3);
  }
  return 0;
}
