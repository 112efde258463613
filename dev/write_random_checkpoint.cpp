// Writes random weights of a released model's shape as a checkpoint directory (config.json + model.safetensors), for
// speculative decoding benchmarks that need `generate --model DIR` (which has no --shape): a target and a draft of
// the same vocabulary, or a model and a shallower one (N_LAYERS: Mamba and Mamba-2 shapes only).
//
//   c++ -O2 -std=c++20 -fopenmp -Isrc -Itests -Iinclude -DMAMBACPP_FIXTURE_DIR='"fixtures"' \
//       -DMAMBACPP_SOURCE_DIR='"."' -DMAMBACPP_BINARY='"build/mambacpp"' dev/write_random_checkpoint.cpp \
//       tests/support/test_support.cpp build/libmambacpp.a -lgomp -lpcre2-8 -lutf8proc -lz -lhwy -o /tmp/write_ckpt
//   /tmp/write_ckpt mamba2-130m /tmp/m130            # all layers
//   /tmp/write_ckpt mamba2-130m /tmp/m130-l4 4       # its first 4 layers' shape (other random values)
// (a CPU build's library; a CUDA build's also needs -lcudart -lcublas and the CUDA library path.)
#include <cstdio>
#include <cstdlib>
#include <string>

#include "mambacpp/shapes.h"
#include "support/test_support.h"

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: %s SHAPE OUT_DIR [N_LAYERS]\n", argv[0]);
    return 2;
  }
  mambacpp::ModelConfig c = mambacpp::named_shape(argv[1]);
  if (argc > 3) c.n_layer = std::atoi(argv[3]);
  mambacpp::test::write_random_model(argv[2], c, /*seed=*/5, mambacpp::DType::BF16);
  std::printf("%s: %s, %lld layers, bf16\n", argv[2], argv[1], static_cast<long long>(c.n_layer));
  return 0;
}
