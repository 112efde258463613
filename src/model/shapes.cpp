#include "mambacpp/shapes.h"

#include <string>

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

// The fields every hybrid shape here shares: a Mamba-2 mixer with d_state 128 and a conv of 4, heads of `head_dim`.
ModelConfig hybrid_base(Family family, int64_t d_model, int64_t vocab, bool tied, int64_t mamba_heads,
                        int64_t head_dim, int64_t n_groups, int64_t chunk) {
  ModelConfig c;
  c.family = family;
  c.arch = Arch::Mamba2;
  c.d_model = d_model;
  c.vocab_size = vocab;
  c.tie_embeddings = tied;
  c.d_state = 128;
  c.d_conv = 4;
  c.n_heads = mamba_heads;
  c.head_dim = head_dim;
  c.d_inner = mamba_heads * head_dim;
  c.n_groups = n_groups;
  c.chunk_size = chunk;
  return c;
}

ModelConfig granite_hybrid(const HybridShape& s) {
  ModelConfig c = hybrid_base(Family::GraniteHybrid, s.d_model, 100352, true, s.mamba_heads, s.mamba_head_dim, 1, 256);
  c.n_layer = s.n_layer;
  c.gated_norm_groups = 1;
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

// NVIDIA Nemotron-H-8B (nvidia/Nemotron-H-8B-Base-8K config.json, as recalled here without hub access): hidden 4096,
// 52 layers from hybrid_override_pattern "M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M-" (24 Mamba-2, 4
// attention, 24 relu2 MLP layers), Mamba-2 with 128 heads of 64 (d_inner 8192), 8 groups (the gated norm per
// group), d_state 128, conv 4, chunk 128; attention 32 query / 8 KV heads of head_dim 128, NoPE; MLP 21504; vocab
// 131072, untied LM head.
ModelConfig nemotron_h_8b() {
  ModelConfig c = hybrid_base(Family::NemotronH, 4096, 131072, false, 128, 64, 8, 128);
  for (char k : std::string("M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M-"))
    c.layers.push_back(k == 'M' ? LayerKind::Mamba2 : k == '*' ? LayerKind::Attention : LayerKind::MLP);
  c.n_layer = static_cast<int64_t>(c.layers.size());
  c.n_attn_heads = 32;
  c.n_kv_heads = 8;
  c.attn_head_dim = 128;
  c.mlp_size = 21504;
  c.mlp_act = MlpAct::Relu2;
  return c;
}

// IBM Bamba-9B (ibm-ai-platform/Bamba-9B config.json, as recalled here): hidden 4096, 32 layers with attention at
// 9, 18, 27 (attn_layer_indices), every layer followed by a gated SiLU MLP of 14336; Mamba-2 with 128 heads of 64
// (mamba_expand 2), one group, d_state 128, conv 4, chunk 256, the gated norm over the whole d_inner; attention 32
// query / 8 KV heads of 128 with RoPE (theta 10000) on the first half of each head (partial_rotary_factor 0.5);
// vocab 128256, untied LM head. max_position_embeddings is not bound here (0), so 16k-token contexts run.
ModelConfig bamba_9b() {
  ModelConfig c = hybrid_base(Family::Bamba, 4096, 128256, false, 128, 64, 1, 256);
  c.n_layer = 32;
  c.gated_norm_groups = 1;
  for (int64_t l = 0; l < c.n_layer; ++l)
    c.layers.push_back(l == 9 || l == 18 || l == 27 ? LayerKind::Attention : LayerKind::Mamba2);
  c.mlp_after_mixer = true;
  c.n_attn_heads = 32;
  c.n_kv_heads = 8;
  c.attn_head_dim = 128;
  c.rope_theta = 10000.0;
  c.rope_dim = 64;
  c.mlp_size = 14336;
  c.mlp_act = MlpAct::SiluGated;
  return c;
}

// TII Falcon-H1 (falcon_h1): every layer a Mamba-2 mixer and RoPE GQA attention side by side, then a gated SiLU
// MLP; untied LM head, rope_theta 1e11, one Mamba group, conv 4. Sizes from the Falcon-H1 report's table and the
// tiiuae/Falcon-H1-{0.5B,7B} config.json as recalled here without hub access; UNCONFIRMED: the exact vocab sizes
// (32784, 130049), the chunk sizes, mamba_rms_norm (false here), and the multiplier values, which are illustrative
// (non-unit, so their scale ops are counted; they change no byte of the cost).
struct FalconH1Shape {
  const char* name;
  int64_t d_model, n_layer, vocab, attn_heads, kv_heads, attn_head_dim, mamba_heads, mamba_head_dim, d_state,
      chunk, mlp_size, max_position;
};
constexpr FalconH1Shape kFalconH1Shapes[] = {
    {"falcon-h1-0.5b", 1024, 36, 32784, 8, 2, 64, 24, 64, 128, 128, 2048, 16384},
    {"falcon-h1-7b", 3072, 44, 130049, 12, 2, 128, 24, 128, 256, 256, 12288, 262144},
};

ModelConfig falcon_h1(const FalconH1Shape& s) {
  ModelConfig c = hybrid_base(Family::FalconH1, s.d_model, s.vocab, false, s.mamba_heads, s.mamba_head_dim, 1, s.chunk);
  c.d_state = s.d_state;
  c.n_layer = s.n_layer;
  c.layers.assign(static_cast<size_t>(s.n_layer), LayerKind::ParallelHybrid);
  c.gated_norm_groups = 1;
  c.mamba_rms_norm = false;
  c.n_attn_heads = s.attn_heads;
  c.n_kv_heads = s.kv_heads;
  c.attn_head_dim = s.attn_head_dim;
  c.rope_theta = 1e11;
  c.rope_dim = s.attn_head_dim;
  c.mlp_size = s.mlp_size;
  c.mlp_act = MlpAct::SiluGated;
  c.max_position = s.max_position;
  c.embedding_multiplier = 5.66;
  c.logits_scaling = 1.0 / 0.039;
  c.key_multiplier = 0.39;
  c.attn_out_multiplier = 0.94;
  c.ssm_in_multiplier = 1.25;
  c.ssm_out_multiplier = 0.24;
  c.ssm_multipliers = {0.35, 0.25, 0.35, 0.5, 0.35};
  c.mlp_gate_multiplier = 0.88;
  c.mlp_down_multiplier = 0.59;
  return c;
}

// The mixture-of-experts hybrids, one row each. Values recalled without hub access; those marked (?) in the
// comments are not confirmed: correct them here. Nemotron-H's routing: sigmoid with correction bias, n_group /
// topk_group 1 (?), norm_topk_prob (?); Granite's: softmax over the top-k. Attention layers are NoPE in all of them.
struct MoeShape {
  const char* name;
  Family family;
  const char* layers;  // M Mamba-2, * attention, E MoE (Nemotron-H); Granite: M / * with experts in every layer
  int64_t d_model, vocab, mamba_heads, mamba_head_dim, n_groups, chunk, attn_heads, kv_heads, attn_head_dim;
  int64_t experts, top_k, expert_size, shared_size;
  double routed_scaling;
};
constexpr MoeShape kMoeShapes[] = {
    // nvidia/NVIDIA-Nemotron-3-Nano-30B-A3B: 23 Mamba-2, 23 MoE, 6 attention layers (the order of the pattern (?)),
    // 128 experts top-6 of 1856, shared 3712, scaling 2.5, chunk 128 (?).
    {"nemotron-3-nano-30b-a3b", Family::NemotronH, "MEMEM*EMEMEM*EMEMEM*EMEMEM*EMEMEM*EMEMEMEM*EMEMEMEME", 2688, 131072,
     64, 64, 8, 128, 32, 2, 128, 128, 6, 1856, 3712, 2.5},
    // ibm-granite/granite-4.0-h-tiny: 40 layers, attention at every tenth (?), Mamba 48 heads of 64 (?), 12 / 4 (?)
    // attention heads, 64 experts top-6 of 512 beside a shared_mlp of 1024.
    {"granite-4.0-h-tiny", Family::GraniteHybrid, "MMMMM*MMMMMMMMM*MMMMMMMMM*MMMMMMMMM*MMMM", 1536, 100352, 48, 64, 1,
     256, 12, 4, 128, 64, 6, 512, 1024, 1.0},
    // ibm-granite/granite-4.0-h-small: 40 layers (?), attention at every tenth (?), Mamba 128 heads of 64 (?), 32 / 8
    // attention heads (?), 72 experts top-10 of 768 beside a shared_mlp of 1536.
    {"granite-4.0-h-small", Family::GraniteHybrid, "MMMMM*MMMMMMMMM*MMMMMMMMM*MMMMMMMMM*MMMM", 4096, 100352, 128, 64, 1,
     256, 32, 8, 128, 72, 10, 768, 1536, 1.0},
};

ModelConfig moe_hybrid(const MoeShape& s) {
  ModelConfig c = hybrid_base(s.family, s.d_model, s.vocab, s.family == Family::GraniteHybrid, s.mamba_heads,
                              s.mamba_head_dim, s.n_groups, s.chunk);
  for (const char* k = s.layers; *k; ++k)
    c.layers.push_back(*k == 'M' ? LayerKind::Mamba2 : *k == '*' ? LayerKind::Attention : LayerKind::MoE);
  c.n_layer = static_cast<int64_t>(c.layers.size());
  c.n_attn_heads = s.attn_heads;
  c.n_kv_heads = s.kv_heads;
  c.attn_head_dim = s.attn_head_dim;
  MoeConfig& m = c.moe;
  m.n_experts = s.experts;
  m.top_k = s.top_k;
  m.expert_size = s.expert_size;
  m.routed_scaling = s.routed_scaling;
  if (s.family == Family::NemotronH) {
    m.routing = MoeRouting::SigmoidGrouped;
    m.act = MlpAct::Relu2;
    m.norm_topk_prob = true;
    m.shared_size = s.shared_size;
    return c;
  }
  c.gated_norm_groups = 1;
  c.attn_scale = 1.0 / static_cast<double>(c.attn_head_dim);  // Granite's attention_multiplier form (?)
  c.mlp_after_mixer = true;
  c.mlp_size = s.shared_size;
  c.mlp_act = MlpAct::SiluGated;
  c.embedding_multiplier = 12.0;
  c.residual_multiplier = 0.22;
  c.logits_scaling = 6.0;
  m.routing = MoeRouting::SoftmaxChosen;
  m.act = MlpAct::SiluGated;
  c.moe_layer_period = 1;
  return c;
}

// AI21 Jamba Mini (ai21labs/AI21-Jamba-Mini-1.5, as recalled here (?)): hidden 4096, 32 layers, attention every
// 8th from layer 4 (32 / 8 heads of 128, NoPE), Mamba-1 with d_inner 8192, d_state 16, conv 4, dt_rank 256 and
// dt/B/C RMSNorms; MoE every 2nd layer from 1 (16 experts top-2 of 14336, softmax over all), dense SwiGLU MLP of
// 14336 elsewhere; vocab 65536, untied LM head.
ModelConfig jamba_mini() {
  ModelConfig c;
  c.family = Family::Jamba;
  c.arch = Arch::Mamba1;
  c.d_model = 4096;
  c.vocab_size = 65536;
  c.tie_embeddings = false;
  c.n_layer = 32;
  c.norm_eps = 1e-6;
  c.d_state = 16;
  c.d_conv = 4;
  c.d_inner = 8192;
  c.dt_rank = 256;
  c.mixer_rms_eps = 1e-6;
  for (int64_t l = 0; l < c.n_layer; ++l) c.layers.push_back(l % 8 == 4 ? LayerKind::Attention : LayerKind::Mamba1);
  c.n_attn_heads = 32;
  c.n_kv_heads = 8;
  c.attn_head_dim = 128;
  c.mlp_after_mixer = true;
  c.mlp_size = 14336;
  c.mlp_act = MlpAct::SiluGated;
  c.moe.n_experts = 16;
  c.moe.top_k = 2;
  c.moe.expert_size = 14336;
  c.moe.routing = MoeRouting::SoftmaxAll;
  c.moe.act = MlpAct::SiluGated;
  c.moe_layer_period = 2;
  c.moe_layer_offset = 1;
  return c;
}

}  // namespace

std::vector<std::string> named_shapes() {
  std::vector<std::string> names;
  for (const Shape& s : kShapes) names.emplace_back(s.name);
  for (const HybridShape& s : kGraniteShapes) names.emplace_back(s.name);
  names.emplace_back("nemotron-h-8b");
  names.emplace_back("bamba-9b");
  for (const FalconH1Shape& s : kFalconH1Shapes) names.emplace_back(s.name);
  for (const MoeShape& s : kMoeShapes) names.emplace_back(s.name);
  names.emplace_back("jamba-mini");
  return names;
}

ModelConfig named_shape(const std::string& name) {
  if (name == "nemotron-h-8b") return nemotron_h_8b();
  if (name == "bamba-9b") return bamba_9b();
  for (const FalconH1Shape& s : kFalconH1Shapes)
    if (name == s.name) return falcon_h1(s);
  for (const MoeShape& s : kMoeShapes)
    if (name == s.name) return moe_hybrid(s);
  if (name == "jamba-mini") return jamba_mini();
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
