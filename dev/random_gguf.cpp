// A GGUF of random weights of a named shape (src/model/shapes.cpp), written by the same code as `mambacpp quantize`
// (io/gguf_export.h: llama.cpp's tensor names, conventions and per-tensor types for the target), so that llama.cpp
// and `mambacpp bench --model FILE.gguf` run the very same file. Values as Model::random draws them (projections
// uniform in +-1/sqrt(fan_in), norms and D one, A_log = log(1 + 15u), dt_bias = softplus^-1 of dt in [0.001, 0.1]);
// speed depends on the shapes and types only. The vocabulary is a placeholder (token ids only). CPU machine:
//   g++ -O2 -std=c++20 -fopenmp -Isrc -Iinclude dev/random_gguf.cpp build/libmambacpp.a \
//       $(pkg-config --libs libhwy libpcre2-8 libutf8proc zlib) -o build/random_gguf
//   build/random_gguf granite-4.0-h-1b q4_k /tmp/gguf/granite-4.0-h-1b-q4_k.gguf
#include <cmath>
#include <cstdio>
#include <map>
#include <string>
#include <vector>

#include "core/splitmix.h"
#include "io/gguf_export.h"
#include "io/gguf_writer.h"
#include "mambacpp/error.h"
#include "mambacpp/shapes.h"
#include "model/weights.h"

using namespace mambacpp;

namespace {

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

double uniform01(uint64_t stream, uint64_t i) {
  return static_cast<double>(splitmix64(1 ^ splitmix64(stream * 0x100000001b3ull + i)) >> 11) * 0x1.0p-53;
}

}  // namespace

int main(int argc, char** argv) try {
  if (argc != 4) {
    std::fprintf(stderr, "usage: random_gguf SHAPE f32|f16|bf16|q8_0|q4_k|q6_k OUT.gguf\n");
    return 2;
  }
  const ModelConfig c = named_shape(argv[1]);
  if (!c.hybrid()) fail("random_gguf: ", argv[1], " is a pure Mamba shape; scripts/llamacpp_bench/make_gguf.mjs writes those");
  const GgufTarget target = parse_gguf_target(argv[2]);
  std::map<std::string, std::vector<int64_t>> shapes;
  for (auto& [name, shape] : hybrid_weight_shapes(c)) shapes[name] = shape;
  // f32 values, drawn when the writer asks for the tensor and kept until the file is written.
  std::map<std::string, std::vector<float>> values;
  std::map<std::string, uint64_t> streams;
  uint64_t stream = 0;
  for (auto& [name, shape] : shapes) streams[name] = ++stream;
  WeightSource source = [&](const std::string& name) -> std::optional<Weight> {
    auto it = shapes.find(name);
    if (it == shapes.end()) return std::nullopt;
    const std::vector<int64_t>& shape = it->second;
    std::vector<float>& v = values[name];
    if (v.empty()) {
      int64_t n = 1;
      for (int64_t d : shape) n *= d;
      v.resize(static_cast<size_t>(n));
      const double scale = 1.0 / std::sqrt(shape.size() >= 2 ? static_cast<double>(shape.back()) : 1.0);
      const bool is_norm = ends_with(name, "norm.weight"), is_a_log = ends_with(name, "A_log"),
                 is_d = ends_with(name, ".D"), is_dt_bias = ends_with(name, "dt_bias");
#pragma omp parallel for
      for (int64_t i = 0; i < n; ++i) {
        const double u = uniform01(streams[name], static_cast<uint64_t>(i));
        v[i] = static_cast<float>(is_norm || is_d ? 1.0
                                  : is_a_log      ? std::log(1.0 + 15.0 * u)
                                  : is_dt_bias    ? std::log(std::expm1(0.001 + 0.099 * u))
                                                  : (2.0 * u - 1.0) * scale);
      }
    }
    TensorView t(v.data(), DType::F32, {1});
    t.ndim = static_cast<int>(shape.size());
    for (size_t k = 0; k < shape.size(); ++k) t.shape[k] = shape[k];
    return Weight(t);
  };
  GgufWriter w;
  gguf_add_model(w, c, source, target);
  w.set_string("general.name", std::string(argv[1]) + "-random");
  std::vector<std::string> tokens;
  for (int64_t i = 0; i < c.vocab_size; ++i) tokens.push_back("<t" + std::to_string(i) + ">");
  w.set_string("tokenizer.ggml.model", "gpt2");
  w.set_string("tokenizer.ggml.pre", "default");
  w.set_strings("tokenizer.ggml.tokens", std::move(tokens));
  w.set_ints("tokenizer.ggml.token_type", GgufType::I32, std::vector<int64_t>(static_cast<size_t>(c.vocab_size), 1));
  w.set_strings("tokenizer.ggml.merges", {});
  w.set_bool("mambacpp.vocab_placeholder", true);
  w.write(argv[3]);
  std::fprintf(stderr, "wrote %s\n", argv[3]);
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "random_gguf: %s\n", e.what());
  return 1;
}
