// Short pieces as decode steps (issues 53 and 54). On the GPU a piece of several tokens takes the prefill kernels
// (chunked SSD, window conv, the prompt plans) and a decode token the step kernels; the two round differently, so a
// verify row of speculative decoding, a short remainder after a cache hit or a decode row beside another request's
// prompt would not give the bits that plain decode steps give. Here every sequence of a forward with at most
// kStepPieceMaxLen tokens runs as decode steps: where step_pieces_one_forward holds, all of them as ONE decode
// forward whose step kernels loop over each sequence's tokens; elsewhere as successive decode forwards (round r holds
// token r of each short sequence). The longer ones run as the prefill forward they would have been alone; the
// outputs are put back in the caller's order.
#pragma once

#include <functional>
#include <span>
#include <vector>

#include "mambacpp/model.h"
#include "model/model_impl.h"

namespace mambacpp {

inline constexpr int64_t kStepPieceMaxLen = 16;  // the CUDA backend's cuda::kStepMaxLen
inline constexpr int64_t kStepPieceMaxRows = 256;  // rows of one forward of step pieces (the fast decode kernels')

// Runs a forward of some sequences (a subset of the call's, or one round of single tokens): Model::forward_impl.
using ForwardFn =
    std::function<ForwardResult(std::span<const Sequence>, Output, const std::vector<TopKRequest>*)>;

// Whether `seqs` run as ONE decode forward (decode_step), each sequence's tokens in order through the step kernels
// and every other op row by row, so each token gets the bits of a decode step while the weights are read once: a
// CUDA backend, fast precision with batch invariance and the fused decode recipes, dense 16-bit projections, pure
// Mamba-2 or Mamba-1 (not FalconMamba's normed dt/B/C; hybrids' attention and exact precision's row-count-dependent
// fused GEMVs keep the successive decode forwards of step_pieces), an output of None / LastLogits / AllLogits, token
// ids only, every sequence 1..kStepPieceMaxLen tokens, at least one of several, at most kStepPieceMaxRows rows in all.
bool step_pieces_one_forward(const Model::Impl& m, std::span<const Sequence> seqs, Output output);

// Whether `seqs` take the step-piece route: a CUDA backend, an output of None / LastLogits / AllLogits, token ids
// only, at least one sequence of 1..kStepPieceMaxLen tokens that is not already a plain decode step (a call of
// single tokens alone is one), and rounds the decode step takes (decode_step_applies).
bool step_pieces_apply(const Model::Impl& m, std::span<const Sequence> seqs, Output output);

// The call's result from a forward of the long sequences (if any) and one decode-step forward per round.
ForwardResult step_pieces(const Model::Impl& m, std::span<const Sequence> seqs, Output output,
                          const std::vector<TopKRequest>* top_k, const ForwardFn& forward);

}  // namespace mambacpp
