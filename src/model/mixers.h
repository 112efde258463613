// The Mamba-1 and Mamba-2 mixers (one block's token mixing), written once against the backend ops.
// Input `h` is the normed hidden state [T, d_model]; output `out` is [T, d_model]; the layer's conv and SSM state
// (all slots) is read and updated per the sequences of `batch`.
#pragma once

#include "backend/backend.h"
#include "mambacpp/config.h"
#include "mambacpp/state.h"
#include "model/weights.h"
#include "model/workspace.h"

namespace mambacpp {

void mamba1_mixer(Backend& be, const ModelConfig& c, const LayerWeights& w, const LayerCache& cache,
                  const BatchLayout& batch, Workspace& ws, const TensorView& h, TensorView out);

// The SSD's arguments over in_proj's output proj = [z | xBC | dt] [T, in_proj_size] and the conv output
// xbc = [x | B | C] [T, conv_channels], writing y [T, d_inner] (no gate: the caller sets z for the decode step's).
Mamba2ScanArgs mamba2_scan_args(const ModelConfig& c, const LayerWeights& w, const LayerCache& cache,
                                const TensorView& proj, const TensorView& xbc, TensorView y);

// Mamba-2 between in_proj and the gated norm: zxbcdt = [z | xBC | dt] -> conv, SSD -> y [T, d_inner] (ungated).
void mamba2_core(Backend& be, const ModelConfig& c, const LayerWeights& w, const LayerCache& cache,
                 const BatchLayout& batch, Workspace& ws, const TensorView& zxbcdt, TensorView y);

void mamba2_mixer(Backend& be, const ModelConfig& c, const LayerWeights& w, const LayerCache& cache,
                  const BatchLayout& batch, Workspace& ws, const TensorView& h, TensorView out);

// A whole Mamba block, residual += mixer(rmsnorm(residual)), for any batch, with the block's RMSNorm folded into
// in_proj and the residual add into out_proj (Mamba-2: the gated norm too) through Backend::fused_linear; the ops
// between them as in the mixers above. Returns false, having run nothing, when the backend does not take both
// projections; the caller then runs the plain ops. Same values as the plain ops to f32 rounding.
// `plan`: the piece's Backend::plan_mamba2 (Mamba-2 blocks; ignored for Mamba-1).
bool mamba_block_fused_projections(Backend& be, const ModelConfig& c, const LayerWeights& w, const LayerCache& cache,
                                   const BatchLayout& batch, const Mamba2Plan& plan, Workspace& ws,
                                   TensorView residual);

// A whole Mamba block of a decode step (sequence i in row i, one token each) on the backend's fused ops:
// residual += mixer(rmsnorm(residual)). Mamba-2 in three calls: in_proj with the block norm before it and the conv1d +
// SiLU of the xBC outputs after it; the SSD step with the silu(z) gate; out_proj with the gated norm's group-wise
// RMSNorm before it and the residual add after it. Mamba-1 in four: in_proj + norm + conv (of the x half); x_proj;
// the scan with dt_proj folded in; out_proj + residual. Returns false, having run nothing, when the backend has no
// fused op for one of the pieces; the caller then runs the plain ops. Same values as the plain ops to f32 rounding.
bool mamba_block_decode_fused(Backend& be, const ModelConfig& c, const LayerWeights& w, const LayerCache& cache,
                              const BatchLayout& batch, Workspace& ws, TensorView residual);

}  // namespace mambacpp
