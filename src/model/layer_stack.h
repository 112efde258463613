// The one loop over a model's layers, for prefill pieces and decode steps alike. A layer's kind (Mamba-1, Mamba-2,
// attention, MLP) is the single branch; families differ by their config (multipliers, an MLP sublayer after the
// mixer), not by separate loops. Each piece makes its Mamba-2 plan (Backend::plan_mamba2) once, before any layer.
#pragma once

#include "backend/backend.h"
#include "mambacpp/state.h"
#include "model/model_impl.h"

namespace mambacpp {

// Prefill pieces run the plain ops (or the fused projections); decode steps (one token per sequence, sequence i in
// row i) take the fused decode recipe where the backend has it, and read the KV positions and page tables from the
// state's device mirror, so that the work can be captured as a graph.
enum class Pass { Prefill, Decode };

struct PieceContext {
  const BatchLayout& batch;
  Pass pass;
  Mamba2Plan mamba2;  // the plan of the model's Mamba-2 blocks for this piece (default for models without them)
};

// residual [T, d_model] holds the piece's embedded input rows; runs the input multiplier and every layer on it.
// A model with attention: the caller brackets this with reserve_kv / advance_kv.
void run_layers(const Model::Impl& m, StateCache& state, const BatchLayout& batch, Pass pass, TensorView residual);

// Host work around run_layers for models with attention (outside any graph capture): pages for the piece's rows
// (and, for decode steps, the device mirror of positions and page tables) before; positions advanced after.
void reserve_kv(StateCache& state, const BatchLayout& batch, Pass pass);
void advance_kv(StateCache& state, const BatchLayout& batch);

// logits [n, V] = normed . lm_head^T / logits_scaling, for final-normed hidden rows.
void lm_head(const Model::Impl& m, const TensorView& normed, TensorView logits);
// The same from a decode step's residual rows: norm_f folded into the head where the backend fuses it.
void lm_head_decode(const Model::Impl& m, const TensorView& residual, const BatchLayout& batch, TensorView logits);

}  // namespace mambacpp
