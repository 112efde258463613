// The decode GEMVs alone: mambacpp's CPU linear (src/backend/cpu/linear.cpp, one token) on the projections of a
// model shape, weights in 2 MiB pages as the backend keeps them, enough copies of each matrix (>= 1 GiB) that every
// call streams from DRAM as a decode step does. Prints per (shape, dtype) the median GB/s of 7 passes over the
// copies, beside a plain read of the same bytes (the read_bw.c loop, on the same threads): the GEMV's share of what
// the machine reads (passes alternate, so both see the same moment of a shared machine's bandwidth). A benchmark
// tool, not built by CMake (-march=native is for the plain read's loop; the GEMV dispatches as the library does):
//   g++ -O3 -march=native -std=c++20 -Isrc -Iinclude scripts/llamacpp_bench/gemv_bw.cpp build/libmambacpp.a
//       -lhwy -o gemv_bw    (one command, from the repository root)
//   ./gemv_bw 2 [bf16|f16|f32] [a substring of the shape names to run]
#include <sys/mman.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "backend/cpu/cpu_ops.h"
#include "backend/cpu/simd.h"
#include "backend/cpu/thread_pool.h"
#include "mambacpp/dtype.h"

using namespace mambacpp;

namespace {

char* huge_alloc(size_t bytes) {
  bytes = (bytes + (2u << 20) - 1) / (2u << 20) * (2u << 20);
  char* p = static_cast<char*>(std::aligned_alloc(2u << 20, bytes));
  if (!p) std::exit(1);
  madvise(p, bytes, MADV_HUGEPAGE);
  return p;
}

double now() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// The plain read of [p, p + bytes) split in contiguous slices over the pool's threads (read_bw.c's loop).
float plain_read(const char* p, size_t bytes, int threads) {
  const size_t n = bytes / sizeof(float);
  std::vector<float> part(static_cast<size_t>(threads));
  cpu::parallel_for(threads, threads, 1, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      const float* f = reinterpret_cast<const float*>(p);
      const size_t lo = n * t / threads, hi = n * (t + 1) / threads;
      float acc[16] = {};
      for (size_t i = lo; i + 16 <= hi; i += 16)
        for (int k = 0; k < 16; ++k) acc[k] += f[i + k];
      float s = 0;
      for (float a : acc) s += a;
      part[static_cast<size_t>(t)] = s;
    }
  });
  float s = 0;
  for (float v : part) s += v;
  return s;
}

}  // namespace

int main(int argc, char** argv) {
  const int threads = argc > 1 ? std::atoi(argv[1]) : 2;
  const std::string dt = argc > 2 ? argv[2] : "bf16";
  const std::string only = argc > 3 ? argv[3] : "";
  const DType wd = dt == "f32" ? DType::F32 : dt == "f16" ? DType::F16 : DType::BF16;
  const size_t ws = dtype_size(wd);
  struct Shape {
    const char* name;
    int64_t in, out;
  };
  const Shape shapes[] = {{"mamba2-130m in_proj", 768, 3352},   {"mamba2-130m out_proj", 1536, 768},
                          {"mamba2-1.3b in_proj", 2048, 8512},  {"mamba2-1.3b out_proj", 4096, 2048},
                          {"mamba2-1.3b lm_head", 2048, 50280}, {"mamba-130m in_proj", 768, 3072}};
  std::printf("target %s, %d threads, %s weights\n", cpu::simd::target_name().c_str(), threads, dt.c_str());
  std::mt19937 rng(1);
  float sink = 0;
  for (const Shape& s : shapes) {
    if (std::string(s.name).find(only) == std::string::npos) continue;
    const size_t mbytes = static_cast<size_t>(s.in * s.out) * ws;
    const size_t copies = std::max<size_t>(1, (size_t(1) << 30) / mbytes), total = copies * mbytes;
    char* w = huge_alloc(total);
    // Small values (bf16/f16 of uniform [-1/64, 1/64]) in every copy: the bytes differ, the speed does not.
    std::vector<uint16_t> pat(1 << 16);
    for (auto& v : pat)
      v = wd == DType::F16 ? f32_to_f16((static_cast<int>(rng() % 2048) - 1024) / 65536.0f)
                           : f32_to_bf16((static_cast<int>(rng() % 2048) - 1024) / 65536.0f);
    if (wd == DType::F32)
      for (size_t i = 0; i < total / 4; ++i)
        reinterpret_cast<float*>(w)[i] = (static_cast<int>(i % 2047) - 1023) / 65536.0f;
    else
      for (size_t i = 0; i < total / 2; ++i) reinterpret_cast<uint16_t*>(w)[i] = pat[i & 0xffff];
    std::vector<float> x(static_cast<size_t>(s.in)), y(static_cast<size_t>(s.out));
    for (auto& v : x) v = static_cast<float>(rng() % 1000) / 1000.0f;
    auto pass = [&] {
      for (size_t c = 0; c < copies; ++c)
        cpu::linear_f32({x.data(), s.in}, {w + c * mbytes, wd}, {}, {y.data(), s.out}, 1, s.in, s.out, threads);
      sink += y[0];
    };
    pass();
    std::vector<double> g, r;
    for (int rep = 0; rep < 7; ++rep) {
      double t0 = now();
      pass();
      g.push_back(static_cast<double>(total) / (now() - t0) / 1e9);
      t0 = now();
      sink += plain_read(w, total, threads);
      r.push_back(static_cast<double>(total) / (now() - t0) / 1e9);
    }
    const double gm = median(g), rm = median(r);
    std::printf("%-22s %6lld x %6lld  %4zu copies  GEMV %6.2f GB/s  read %6.2f GB/s  %5.1f%%  (%.3f ms per matrix)\n",
                s.name, static_cast<long long>(s.in), static_cast<long long>(s.out), copies, gm, rm, 100 * gm / rm,
                1e3 * static_cast<double>(mbytes) / (gm * 1e9));
    std::free(w);
  }
  std::printf("checksum %g\n", sink);
  return 0;
}
