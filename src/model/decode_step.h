// The decode step: every sequence of the call is one token id. On a backend with graphs (CUDA) the device work of
// a step — embedding, every block, norm_f, LM head — is captured once per (state buffers, row count) and replayed, so a
// step costs one graph launch instead of hundreds of kernel launches. Only the token ids go in and the logits come
// out around the replay. A call of short pieces that step_pieces_one_forward takes runs here too, uncaptured: each
// sequence's tokens are rows of the one forward (BatchLayout::step_pieces), the step kernels looping over them.
#pragma once

#include <span>

#include "mambacpp/model.h"
#include "model/model_impl.h"

namespace mambacpp {

bool decode_step_applies(const Model::Impl& m, std::span<const Sequence> seqs, Output output);

// Fills `result` (sized by the caller: [n_seqs, vocab] for LastLogits, [tokens, vocab] for AllLogits (step pieces
// only), empty for None; with top_k, LastLogits is reduced to result.candidates by Backend::select_top_k after the
// step, outside any captured graph).
void decode_step(const Model::Impl& m, StateCache& state, std::span<const Sequence> seqs, Output output,
                 const std::vector<TopKRequest>* top_k, ForwardResult& result);

}  // namespace mambacpp
