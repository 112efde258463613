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

// IBM Granite-4.0-H (granitemoehybrid, dense: num_local_experts 0): Mamba-2 layers (one group, d_state 128, the
// gated norm over the whole d_inner) and a few NoPE GQA attention layers, each followed by the gated SiLU
// shared_mlp; vocab 100352, tied embeddings, Granite's multipliers. The sizes are the published configs' (as
// best known here, without access to the hub); the attention layers sit every tenth (1b) / eighth (350m) layer,
// which does not change the cost of a step.
struct HybridShape {
  const char* name;
  int64_t d_model, n_layer, attn_every, mamba_heads, mamba_head_dim, attn_heads, kv_heads, mlp_size;
};
constexpr HybridShape kGraniteShapes[] = {
    {"granite-4.0-h-1b", 1536, 40, 10, 48, 64, 12, 4, 4096},
    {"granite-4.0-h-350m", 768, 32, 8, 48, 32, 12, 4, 2048},
};

ModelConfig granite_hybrid(const HybridShape& s) {
  ModelConfig c;
  c.family = Family::GraniteHybrid;
  c.arch = Arch::Mamba2;
  c.d_model = s.d_model;
  c.n_layer = s.n_layer;
  c.vocab_size = 100352;
  c.tie_embeddings = true;
  c.d_state = 128;
  c.d_conv = 4;
  c.n_heads = s.mamba_heads;
  c.head_dim = s.mamba_head_dim;
  c.d_inner = s.mamba_heads * s.mamba_head_dim;
  c.n_groups = 1;
  c.gated_norm_groups = 1;
  c.chunk_size = 256;
  for (int64_t l = 0; l < s.n_layer; ++l)
    c.layers.push_back(l % s.attn_every == s.attn_every - 1 ? LayerKind::Attention : LayerKind::Mamba2);
  c.mlp_after_mixer = true;
  c.n_attn_heads = s.attn_heads;
  c.n_kv_heads = s.kv_heads;
  c.attn_head_dim = s.d_model / s.attn_heads;
  c.attn_scale = 1.0 / static_cast<double>(c.attn_head_dim);  // Granite's attention_multiplier form
  c.mlp_size = s.mlp_size;
  c.mlp_act = MlpAct::SiluGated;
  c.embedding_multiplier = 12.0;
  c.residual_multiplier = 0.22;
  c.logits_scaling = 6.0;
  return c;
}

}  // namespace

std::vector<std::string> named_shapes() {
  std::vector<std::string> names;
  for (const Shape& s : kShapes) names.emplace_back(s.name);
  for (const HybridShape& s : kGraniteShapes) names.emplace_back(s.name);
  return names;
}

ModelConfig named_shape(const std::string& name) {
  for (const HybridShape& s : kGraniteShapes)
    if (name == s.name) return granite_hybrid(s);
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
  for (const std::string& n : named_shapes()) known += (known.empty() ? "" : ", ") + n;
  fail("--shape: unknown shape '", name, "'; known: ", known);
}

}  // namespace mambacpp
