// The layer recipes, written once against the backend ops: a layer is a pre-norm sublayer of its kind (Mamba-1 or
// Mamba-2 mixer, attention, MLP) and, where the family has one (mlp_after_mixer: Granite, Bamba), a second pre-norm
// MLP sublayer; each sublayer's output is scaled by residual_multiplier (1 outside Granite) and added to the residual
// stream.
#pragma once

#include <initializer_list>

#include "backend/backend.h"
#include "mambacpp/state.h"
#include "model/layer_stack.h"
#include "model/model_impl.h"

namespace mambacpp {

// residual [T, d_model] += layer `layer`'s sublayers on the piece; reads and updates the layer's cache entry (Mamba
// state, or KV rows: the caller has reserved the pages and advances the positions after the last layer).
void run_layer(const Model::Impl& m, int64_t layer, StateCache& state, const PieceContext& ctx, TensorView residual);

// The attention mixer, out [T, d_model] = attention(h [T, d_model]) over the KV pages of cache entry `li` (for
// recipes in other files). device_kv: positions and pages from the state's device mirror (decode steps).
void attention_mixer(const Model::Impl& m, const LayerWeights& w, StateCache::Impl& st, size_t li,
                     const BatchLayout& batch, const TensorView& h, TensorView out, bool device_kv);

// ---- Decode-step pieces on Backend::fused_linear (sequence i in row i, one token each) ---------------------------
// Each piece's arguments are built first, so that a recipe asks supports_fused_linear for every piece of a layer
// before it runs any (fused_supported), and falls back to the plain ops having run nothing.

// An attention sublayer: q, k, v from the pre-norm `norm` of the residual folded into their GEMVs (the inputs times
// x_scale: Falcon-H1's attn_in_multiplier; K times key_multiplier), RoPE and attention over the KV pages, then o_proj
// added onto the residual times out_scale (Granite's residual_multiplier, Falcon-H1's attn_out_multiplier).
struct FusedAttentionDecode {
  FusedLinearArgs q, k, v, o;
};
FusedAttentionDecode fused_attention_decode_args(const Model::Impl& m, const LayerWeights& w, const TensorView& norm,
                                                 double x_scale, double out_scale, int64_t T, TensorView residual);
// q, k and v of the step (they read the residual, which they leave as it is).
void run_fused_qkv(Backend& be, const FusedAttentionDecode& a, const BatchLayout& batch);
// RoPE, attention over cache entry li's pages, o_proj onto the residual.
void run_fused_attend(const Model::Impl& m, StateCache::Impl& st, size_t li, const BatchLayout& batch,
                      const FusedAttentionDecode& a);

// An MLP sublayer: the pre-norm folded into the up (and gate) GEMVs, the activation, down onto the residual times
// down_scale; the gate's outputs times gate_scale before the SiLU (Falcon-H1's mlp_multipliers).
struct FusedMlpDecode {
  FusedLinearArgs gate, up, down;  // gate unused (w empty) for relu2 and for Granite's [gate | up] in one matrix
  TensorView hid_gate, hid_up;     // the activation's inputs
};
FusedMlpDecode fused_mlp_decode_args(const Model::Impl& m, const LayerWeights& w, const TensorView& norm,
                                     double gate_scale, double down_scale, int64_t T, TensorView residual);
void run_fused_mlp(const Model::Impl& m, const FusedMlpDecode& a, const BatchLayout& batch);

// Whether the backend takes every piece given (pieces with an empty weight are skipped).
bool fused_supported(const Backend& be, const BatchLayout& batch, std::initializer_list<const FusedLinearArgs*> args);

}  // namespace mambacpp
