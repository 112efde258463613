#include "mambacpp/shapes.h"

#include "mambacpp/error.h"

namespace mambacpp {

namespace {

struct Shape {
  const char* name;
  Arch arch;
  int64_t d_model, n_layer;
};

// state-spaces/mamba-* and mamba2-* configs: vocab 50277 padded to a multiple of 8 (mamba_ssm's
// pad_vocab_size_multiple), d_conv 4, expand 2, tied embeddings; Mamba-1 d_state 16, Mamba-2 d_state 128,
// head_dim 64, one group, chunk 256.
constexpr Shape kShapes[] = {
    {"mamba-130m", Arch::Mamba1, 768, 24},   {"mamba-370m", Arch::Mamba1, 1024, 48},
    {"mamba-1.4b", Arch::Mamba1, 2048, 48},  {"mamba-2.8b", Arch::Mamba1, 2560, 64},
    {"mamba2-130m", Arch::Mamba2, 768, 24},  {"mamba2-370m", Arch::Mamba2, 1024, 48},
    {"mamba2-1.3b", Arch::Mamba2, 2048, 48}, {"mamba2-2.7b", Arch::Mamba2, 2560, 64},
};

}  // namespace

std::vector<std::string> named_shapes() {
  std::vector<std::string> names;
  for (const Shape& s : kShapes) names.emplace_back(s.name);
  return names;
}

ModelConfig named_shape(const std::string& name) {
  for (const Shape& s : kShapes) {
    if (name != s.name) continue;
    ModelConfig c;
    c.arch = s.arch;
    c.d_model = s.d_model;
    c.n_layer = s.n_layer;
    c.d_inner = 2 * s.d_model;
    c.d_conv = 4;
    c.tie_embeddings = true;
    if (s.arch == Arch::Mamba1) {
      c.vocab_size = 50280;
      c.d_state = 16;
      c.dt_rank = (s.d_model + 15) / 16;
    } else {
      c.vocab_size = 50288;
      c.d_state = 128;
      c.head_dim = 64;
      c.n_heads = c.d_inner / 64;
      c.n_groups = 1;
      c.chunk_size = 256;
    }
    return c;
  }
  std::string known;
  for (const Shape& s : kShapes) known += std::string(known.empty() ? "" : ", ") + s.name;
  fail("--shape: unknown shape '", name, "'; known: ", known);
}

}  // namespace mambacpp
