// Byte-for-byte check of mambacpp's ggml block formats (src/core/ggml_blocks.cpp) against the ggml that
// node-llama-cpp ships (libggml-base.so, loaded at run time): the same floats must give the same bytes through
// ggml_quantize_chunk (what llama.cpp's quantizer calls, without an importance matrix), and ggml's dequantize_row_*
// must give exactly our floats for those bytes. Rows of several distributions (gaussian, heavy tails, constant,
// zeros, tiny and huge scales). Build and run (docs/gguf.md):
//   g++ -O2 -std=c++20 -ffp-contract=off -Isrc -Iinclude scripts/llamacpp_bench/ggml_quant_check.cpp \
//       src/core/ggml_blocks.cpp src/core/weight.cpp src/core/dtype.cpp src/core/tensor.cpp -ldl -o /tmp/ggml_quant_check
//   /tmp/ggml_quant_check scripts/llamacpp_bench/node_modules/@node-llama-cpp/linux-x64/bins/linux-x64/libggml-base.so
#include <dlfcn.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "core/ggml_blocks.h"

using namespace mambacpp;

using QuantizeChunk = size_t (*)(int type, const float* src, void* dst, int64_t start, int64_t nrows,
                                 int64_t n_per_row, const float* imatrix);
using Dequantize = void (*)(const void* x, float* y, int64_t k);

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s path/to/libggml-base.so\n", argv[0]);
    return 2;
  }
  void* lib = dlopen(argv[1], RTLD_NOW);
  if (!lib) {
    std::fprintf(stderr, "dlopen: %s\n", dlerror());
    return 2;
  }
  auto quantize_chunk = reinterpret_cast<QuantizeChunk>(dlsym(lib, "ggml_quantize_chunk"));
  const struct {
    WeightFormat f;
    int ggml_type;
    const char* dequant;
  } formats[] = {{WeightFormat::Q8_0, 8, "dequantize_row_q8_0"}, {WeightFormat::Q4_0, 2, "dequantize_row_q4_0"},
                 {WeightFormat::Q5_0, 6, "dequantize_row_q5_0"}, {WeightFormat::Q5_1, 7, "dequantize_row_q5_1"},
                 {WeightFormat::Q4_K, 12, "dequantize_row_q4_K"}, {WeightFormat::Q5_K, 13, "dequantize_row_q5_K"},
                 {WeightFormat::Q6_K, 14, "dequantize_row_q6_K"}};
  const int64_t n = 256 * 64;  // one row of 64 super-blocks
  std::mt19937_64 rng(1234);
  int failures = 0;
  for (const auto& fm : formats) {
    auto dequant = reinterpret_cast<Dequantize>(dlsym(lib, fm.dequant));
    if (!quantize_chunk || !dequant) {
      std::fprintf(stderr, "missing symbol in %s\n", argv[1]);
      return 2;
    }
    const int64_t rb = weight_row_bytes(fm.f, n);
    size_t blocks = 0, byte_mismatch_blocks = 0, float_mismatches = 0;
    for (int dist = 0; dist < 8; ++dist) {
      std::vector<float> x(static_cast<size_t>(n));
      std::normal_distribution<double> g(0.0, 1.0);
      std::student_t_distribution<double> t(2.0);
      for (int64_t i = 0; i < n; ++i) {
        double v = 0;
        switch (dist) {
          case 0: v = g(rng) * 0.02; break;                   // a projection's weights
          case 1: v = t(rng) * 0.05; break;                   // heavy tails (outliers)
          case 2: v = g(rng) + 3.0; break;                    // all positive, offset
          case 3: v = (i / 32) % 3 == 0 ? 0.0 : g(rng); break;  // zero blocks among others
          case 4: v = 0.25; break;                            // constant
          case 5: v = g(rng) * 1e-6; break;                   // tiny scales (f16 subnormals)
          case 6: v = g(rng) * 1e3; break;                    // large
          default: v = std::round(g(rng) * 4) / 4; break;     // ties in rounding
        }
        x[static_cast<size_t>(i)] = static_cast<float>(v);
      }
      std::vector<uint8_t> ours(static_cast<size_t>(rb)), theirs(static_cast<size_t>(rb));
      ggml_quantize_row(fm.f, x.data(), n, ours.data());
      quantize_chunk(fm.ggml_type, x.data(), theirs.data(), 0, 1, n, nullptr);
      const int64_t bb = weight_format_info(fm.f).block_bytes;
      for (int64_t b = 0; b < rb / bb; ++b) {
        ++blocks;
        if (std::memcmp(ours.data() + b * bb, theirs.data() + b * bb, static_cast<size_t>(bb)) != 0)
          ++byte_mismatch_blocks;
      }
      std::vector<float> y_ours(static_cast<size_t>(n)), y_theirs(static_cast<size_t>(n));
      ggml_dequantize_row(fm.f, ours.data(), n, y_ours.data());
      dequant(ours.data(), y_theirs.data(), n);
      for (int64_t i = 0; i < n; ++i)
        if (std::memcmp(&y_ours[static_cast<size_t>(i)], &y_theirs[static_cast<size_t>(i)], 4) != 0) ++float_mismatches;
    }
    std::printf("%-5s blocks %6zu  quantized blocks differing %zu  dequantized floats differing %zu\n",
                weight_format_name(fm.f), blocks, byte_mismatch_blocks, float_mismatches);
    failures += byte_mismatch_blocks != 0 || float_mismatches != 0;
  }
  std::printf(failures ? "MISMATCH\n" : "ALL IDENTICAL\n");
  return failures ? 1 : 0;
}
