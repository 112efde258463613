// Nemotron-H's multi-token-prediction (MTP) block, as a draft source for speculative decoding (--draft-mtp).
//
// The checkpoint's MTP block (Nemotron 3 Super: num_nextn_predict_layers = 1, layers [attention, moe]) predicts the
// token after next. Row p pairs the model's final hidden state after token p (after norm_f: what its LM head reads)
// with the embedding of token p+1:
//
//   x_p = eh_proj [enorm(embed(t_{p+1})) ; hnorm(h_p)]       eh_proj: [d_model, 2 d_model], embeddings first
//   g_p = final_layernorm(layers(x_p))                        the block's layers: pre-norm residual blocks, their
//                                                             own KV rows / state, causal over the rows p run so far
//   logits_p = lm_head(g_p)                                   the model's own LM head and embedding table
//
// (vLLM's nemotron_h_mtp.py and the NemotronH checkpoints' tensor names: mtp.layers.{i}.* with enorm, hnorm and
// eh_proj in layer 0 and final_layernorm in the last.) Chained drafts reuse the block on its own output: the row
// after a drafted token d pairs g_p (in place of the model's h_{p+1}) with d, as vLLM does.
//
// The layers are a small model of their own (config: the target's, with the MTP layer kinds), so their state is a
// StateCache like any other: snapshots and restores roll it back exactly.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "backend/backend.h"
#include "core/weight.h"
#include "mambacpp/model.h"
#include "mambacpp/state.h"

namespace mambacpp {

// One sequence of an MTP call: rows p = 0..L-1 pair hidden row p ([L, d_model] row-major, the model's final hidden
// states after norm_f) with next_tokens[p], the token that followed it.
struct MtpSequence {
  int64_t slot = 0;
  std::span<const int32_t> next_tokens;  // [L]
  std::span<const float> hidden;         // [L * d_model]
};

class MtpHead {
 public:
  // The MTP block of the checkpoint `target` was loaded from, on the same device with the same options. Throws Error
  // naming the model when it has none (a config without num_nextn_predict_layers, another family, a GGUF file), and
  // naming the tensor when one is missing or misshapen.
  static std::unique_ptr<MtpHead> load(const Model& target);
  ~MtpHead();
  MtpHead(const MtpHead&) = delete;
  MtpHead& operator=(const MtpHead&) = delete;

  // The block's state: KV rows of its attention layers, Mamba states of its Mamba layers; one per slot.
  std::unique_ptr<StateCache> create_state(int64_t n_slots, DType state_dtype = DType::F32) const;
  // Runs the rows of each sequence from its slot's state. Output::None advances the state only;
  // Output::AllLogitsAndHidden also returns every row's logits (of the token after next_tokens[p]) in `values` and
  // g_p in `hidden`. Throws Error on a bad input (sizes, token ids), before touching any state.
  ForwardResult forward(StateCache& state, std::span<const MtpSequence> seqs, Output output) const;

  // The block's layers as a model whose input embeddings are the fused rows x_p.
  const Model& block() const { return *block_; }

 private:
  MtpHead() = default;

  std::unique_ptr<Model> block_;  // first: the weights below live on its backend
  TensorView enorm_, hnorm_;      // [d_model]
  std::vector<float> eh_embed_host_, eh_hidden_host_;  // eh_proj's two halves, [d_model, d_model] each
  Weight eh_embed_, eh_hidden_;   // eh_proj's columns that read the embedding, and those that read h
  float eps_ = 1e-5f;
  mutable DeviceBuffer ids_, embedded_, hidden_, normed_e_, normed_h_, fused_, fused_h_;
  mutable int64_t rows_reserved_ = 0;
};

}  // namespace mambacpp
