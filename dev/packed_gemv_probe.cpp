// The CPU's packed GEMV (backend/cpu/packed_linear.cpp) alone, against this machine's read bandwidth: a stack of
// [out, in] weights larger than the caches (so every call streams from memory), T tokens, the backend's threads.
// Prints GB/s of weight bytes read per format and the share of a plain 2-thread read of the same bytes.
//   g++ -O2 -std=c++20 -fopenmp -Isrc -Iinclude dev/packed_gemv_probe.cpp build/libmambacpp.a \
//       $(pkg-config --libs libhwy libpcre2-8 libutf8proc zlib) -o build/packed_gemv_probe
//   build/packed_gemv_probe [threads=2] [T=1] [in=2048] [out=8192]
//   build/packed_gemv_probe hot [T=1] [in=2048] [out=128]
//   build/packed_gemv_probe kernels [in=2048] [out=128]
//   build/packed_gemv_probe prefill [T=64] [in=2048] [out=1024]
// `hot`: one thread on a weight that stays in L2, timed in CPU time (not wall time), so the kernel's own cost per
// byte shows even on a loaded machine: where it exceeds the memory's rate per core, decode is bound by the memory.
// `kernels`: the A/B of the two activation kinds on the same L2-resident rows, one thread, CPU time, interleaved
// (f32 activations: packed_dot_rows; int8 activations: packed_dot_rows_int8; packed_quantize_act timed apart).
// `prefill`: T tokens, one thread, CPU time: the product's linear (int8 activations, the decode kernel per token over
// blocks of rows) against the f32 path it replaced (L2-sized panels dequantized to f32, packed, the register-tiled
// GEMM of gemm.h), interleaved.
#include <algorithm>
#include <chrono>
#include <ctime>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

#include "backend/backend.h"
#include "backend/cpu/gemm.h"
#include "backend/cpu/packed_kernels.h"
#include "core/ggml_blocks.h"
#include "core/weight.h"
#include "mambacpp/dtype.h"

using namespace mambacpp;
using Clock = std::chrono::steady_clock;

double cpu_seconds() {
  timespec ts;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return ts.tv_sec + ts.tv_nsec * 1e-9;
}

int hot(int argc, char** argv) {
  const int64_t T = argc > 2 ? std::atoll(argv[2]) : 1, in = argc > 3 ? std::atoll(argv[3]) : 2048,
                out = argc > 4 ? std::atoll(argv[4]) : 128;
  auto be = make_cpu_backend(1);
  std::mt19937 rng(1);
  std::uniform_real_distribution<float> u(-0.03f, 0.03f);
  std::vector<float> row(static_cast<size_t>(in)), x(static_cast<size_t>(T * in)), y(static_cast<size_t>(T * out));
  for (float& v : x) v = u(rng);
  for (const char* name : {"bf16", "q8_0", "q6_k", "q4_k", "q5_0", "q4_0"}) {
    const WeightFormat f = parse_weight_format(name);
    const int64_t rb = is_dense(f) ? in * static_cast<int64_t>(dtype_size(dense_dtype(f))) : weight_row_bytes(f, in);
    std::vector<uint8_t> bytes(static_cast<size_t>(out * rb));
    for (int64_t r = 0; r < out; ++r) {
      for (float& v : row) v = u(rng);
      if (is_dense(f)) convert_from_f32(row.data(), bytes.data() + r * rb, dense_dtype(f), in);
      else ggml_quantize_row(f, row.data(), in, bytes.data() + r * rb);
    }
    const Weight w = is_dense(f) ? Weight(TensorView(bytes.data(), dense_dtype(f), {out, in}))
                                 : Weight::packed(f, bytes.data(), {out, in});
    const int reps = 2000;
    double best = 1e30;
    for (int k = 0; k < 3; ++k) {
      const double t0 = cpu_seconds();
      for (int r = 0; r < reps; ++r)
        be->linear(TensorView(x.data(), DType::F32, {T, in}), w, {}, TensorView(y.data(), DType::F32, {T, out}));
      best = std::min(best, cpu_seconds() - t0);
    }
    std::printf("hot %-5s T=%lld [%lld, %lld]: %.2f GB/s of weights per core (CPU time), %.2f Gelem/s\n", name,
                (long long)T, (long long)out, (long long)in, reps * static_cast<double>(bytes.size()) / best / 1e9,
                reps * static_cast<double>(out * in) / best / 1e9);
  }
  return 0;
}

int kernels(int argc, char** argv) {
  const int64_t in = argc > 2 ? std::atoll(argv[2]) : 2048, out = argc > 3 ? std::atoll(argv[3]) : 128;
  std::mt19937 rng(1);
  std::uniform_real_distribution<float> u(-0.03f, 0.03f);
  std::vector<float> row(static_cast<size_t>(in)), x(static_cast<size_t>(in)), y(static_cast<size_t>(out));
  for (float& v : x) v = u(rng);
  for (const char* name : {"q8_0", "q4_k", "q6_k"}) {
    const WeightFormat f = parse_weight_format(name);
    const int64_t rb = weight_row_bytes(f, in);
    std::vector<uint8_t> bytes(static_cast<size_t>(out * rb)), xq(static_cast<size_t>(cpu::simd::packed_act_bytes(f, in)));
    for (int64_t r = 0; r < out; ++r) {
      for (float& v : row) v = u(rng);
      ggml_quantize_row(f, row.data(), in, bytes.data() + r * rb);
    }
    const int reps = 2000;
    double best[3] = {1e30, 1e30, 1e30};
    cpu::simd::packed_quantize_act(x.data(), f, in, xq.data());
    for (int k = 0; k < 5; ++k)
      for (int kind = 0; kind < 3; ++kind) {
        const double t0 = cpu_seconds();
        for (int r = 0; r < reps; ++r) {
          if (kind == 0) {
            if (cpu::simd::packed_int8(f)) continue;  // f32 activations left the product (the perf log has them)
            cpu::simd::packed_dot_rows(x.data(), bytes.data(), f, in, out, y.data());
          } else if (kind == 1) {
            cpu::simd::packed_dot_rows_int8(xq.data(), 0, 1, bytes.data(), f, in, out, y.data(), out);
          } else {
            cpu::simd::packed_quantize_act(x.data(), f, in, xq.data());
          }
        }
        best[kind] = std::min(best[kind], cpu_seconds() - t0);
      }
    for (int kind = cpu::simd::packed_int8(f) ? 1 : 0; kind < 2; ++kind)
      std::printf("%s %-5s [%lld, %lld]: %.2f GB/s of weights per core (CPU time), %.2f Gelem/s\n",
                  kind == 0 ? "f32 " : "int8", name, (long long)out, (long long)in,
                  reps * static_cast<double>(bytes.size()) / best[kind] / 1e9,
                  reps * static_cast<double>(out * in) / best[kind] / 1e9);
    std::printf("quantizing the activations: %.2f us per token of %lld\n", best[2] / reps * 1e6, (long long)in);
  }
  return 0;
}

int prefill(int argc, char** argv) {
  const int64_t T = argc > 2 ? std::atoll(argv[2]) : 64, in = argc > 3 ? std::atoll(argv[3]) : 2048,
                out = argc > 4 ? std::atoll(argv[4]) : 1024;
  auto be = make_cpu_backend(1);
  std::mt19937 rng(1);
  std::uniform_real_distribution<float> u(-0.03f, 0.03f);
  std::vector<float> row(static_cast<size_t>(in)), x(static_cast<size_t>(T * in)), y(static_cast<size_t>(T * out));
  for (float& v : x) v = u(rng);
  namespace s = cpu::simd;
  const int64_t Kp = s::packed_row_floats(in), MR = s::gemm_tile_tokens(), NR = s::gemm_tile_rows();
  const int64_t Tp = (T + MR - 1) / MR * MR;
  std::vector<float> xp(static_cast<size_t>(Tp * Kp), 0.0f);
  const int64_t panel = std::max(NR, 192 * 1024 / (Kp * 4) / NR * NR);
  std::vector<float> deq(static_cast<size_t>(panel * in)), wp(static_cast<size_t>((panel + NR) * Kp), 0.0f);
  for (const char* name : {"q8_0", "q4_k", "q6_k"}) {
    const WeightFormat f = parse_weight_format(name);
    const int64_t rb = weight_row_bytes(f, in);
    std::vector<uint8_t> bytes(static_cast<size_t>(out * rb));
    for (int64_t r = 0; r < out; ++r) {
      for (float& v : row) v = u(rng);
      ggml_quantize_row(f, row.data(), in, bytes.data() + r * rb);
    }
    const Weight w = Weight::packed(f, bytes.data(), {out, in});
    double best[2] = {1e30, 1e30};
    for (int k = 0; k < 3; ++k)
      for (int kind = 0; kind < 2; ++kind) {
        const double t0 = cpu_seconds();
        if (kind == 0) {
          be->linear(TensorView(x.data(), DType::F32, {T, in}), w, {}, TensorView(y.data(), DType::F32, {T, out}));
        } else {
          for (int64_t t = 0; t < T; ++t) s::pack_rows(x.data() + t * in, DType::F32, 0, 1, in, xp.data() + t * Kp);
          for (int64_t o0 = 0; o0 < out; o0 += panel) {
            const int64_t nr = std::min(panel, out - o0), nrp = (nr + NR - 1) / NR * NR;
            s::packed_dequantize_rows(bytes.data() + o0 * rb, f, in, nr, deq.data(), in);
            s::pack_rows(deq.data(), DType::F32, in, nr, in, wp.data());
            std::fill(wp.begin() + nr * Kp, wp.begin() + nrp * Kp, 0.0f);
            s::gemm_packed(xp.data(), T, wp.data(), nr, in, y.data() + o0, out);
          }
        }
        best[kind] = std::min(best[kind], cpu_seconds() - t0);
      }
    for (int kind = 0; kind < 2; ++kind)
      std::printf("prefill %s %-5s T=%lld [%lld, %lld]: %.2f Gelem/s per core (CPU time)\n",
                  kind == 0 ? "int8 loop      " : "f32 panel GEMM ", name, (long long)T, (long long)out, (long long)in,
                  static_cast<double>(T * out * in) / best[kind] / 1e9);
  }
  return 0;
}

int main(int argc, char** argv) {
  if (argc > 1 && std::strcmp(argv[1], "prefill") == 0) return prefill(argc, argv);
  if (argc > 1 && std::strcmp(argv[1], "hot") == 0) return hot(argc, argv);
  if (argc > 1 && std::strcmp(argv[1], "kernels") == 0) return kernels(argc, argv);
  const int threads = argc > 1 ? std::atoi(argv[1]) : 2;
  const int64_t T = argc > 2 ? std::atoll(argv[2]) : 1, in = argc > 3 ? std::atoll(argv[3]) : 2048,
                out = argc > 4 ? std::atoll(argv[4]) : 8192;
  auto be = make_cpu_backend(threads);
  std::mt19937 rng(1);
  std::uniform_real_distribution<float> u(-0.03f, 0.03f);
  std::vector<float> row(static_cast<size_t>(in)), x(static_cast<size_t>(T * in)), y(static_cast<size_t>(T * out));
  for (float& v : x) v = u(rng);
  // A plain read of 256 MiB on the same threads: the floor's bandwidth.
  {
    const size_t n = size_t(64) << 20;
    std::vector<float> big(n, 1.0f);
    double best = 1e30;
    for (int rep = 0; rep < 5; ++rep) {
      const auto t0 = Clock::now();
      double s = 0;
#pragma omp parallel for reduction(+ : s) num_threads(threads)
      for (size_t i = 0; i < n; ++i) s += big[i];
      const double dt = std::chrono::duration<double>(Clock::now() - t0).count();
      if (s < 0) std::printf("?");
      best = std::min(best, dt);
    }
    std::printf("read %.1f GB/s (%d threads)\n", n * 4.0 / best / 1e9, threads);
  }
  for (const char* name : {"bf16", "q8_0", "q6_k", "q4_k", "q5_0", "q4_0"}) {
    const WeightFormat f = parse_weight_format(name);
    const int64_t rb = is_dense(f) ? in * static_cast<int64_t>(dtype_size(dense_dtype(f))) : weight_row_bytes(f, in);
    const int64_t mats = std::max<int64_t>(2, (int64_t(256) << 20) / (out * rb));  // > 256 MiB in all
    std::vector<uint8_t> bytes(static_cast<size_t>(mats * out * rb));
    for (int64_t r = 0; r < mats * out; ++r) {
      for (float& v : row) v = u(rng);
      if (is_dense(f)) convert_from_f32(row.data(), bytes.data() + r * rb, dense_dtype(f), in);
      else ggml_quantize_row(f, row.data(), in, bytes.data() + r * rb);
    }
    std::vector<double> times;
    for (int rep = 0; rep < 4; ++rep) {
      const auto t0 = Clock::now();
      for (int64_t m = 0; m < mats; ++m) {
        uint8_t* p = bytes.data() + m * out * rb;
        const Weight w = is_dense(f) ? Weight(TensorView(p, dense_dtype(f), {out, in})) : Weight::packed(f, p, {out, in});
        be->linear(TensorView(x.data(), DType::F32, {T, in}), w, {}, TensorView(y.data(), DType::F32, {T, out}));
      }
      times.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
    }
    std::sort(times.begin(), times.end());
    const double gbs = static_cast<double>(bytes.size()) / times[1] / 1e9;
    std::printf("%-5s T=%lld [%lld, %lld] x%lld: %.2f ms per matrix, %.1f GB/s of weights\n", name, (long long)T,
                (long long)out, (long long)in, (long long)mats, times[1] / mats * 1e3, gbs);
  }
}
