#include "model/decode_step.h"

#include <algorithm>
#include <vector>

#include "model/layer_stack.h"
#include "model/model_impl.h"
#include "model/step_pieces.h"

namespace mambacpp {

namespace {
// Larger batches take the general path, which computes their logits in blocks of this many rows: a step's
// [B, vocab] logits buffer stays as bounded as prefill's.
constexpr int64_t kMaxDecodeBatch = 256;
}  // namespace

bool decode_step_applies(const Model::Impl& m, std::span<const Sequence> seqs, Output output) {
  if (step_pieces_one_forward(m, seqs, output)) return true;
  if (output != Output::LastLogits && output != Output::None) return false;
  // Hybrid decode steps read the KV cache on the device (graph-safe); backends without that take the general path.
  if (m.config.hybrid() && !m.backend->supports_device_kv()) return false;
  const int64_t n = static_cast<int64_t>(seqs.size());
  if (n > std::max<int64_t>(1, m.options.max_batch_tokens) || n > kMaxDecodeBatch) return false;
  for (const Sequence& s : seqs)
    if (s.token_ids.size() != 1) return false;
  return true;
}

void decode_step(const Model::Impl& m, StateCache& state, std::span<const Sequence> seqs, Output output,
                 const std::vector<TopKRequest>* top_k, ForwardResult& result) {
  const ModelConfig& c = m.config;
  Backend& be = *m.backend;
  const Device dev = be.device();
  Workspace& ws = m.workspace;
  const int64_t B = static_cast<int64_t>(seqs.size());
  // Rows: one per token. Several tokens in a sequence make a batch of step pieces (step_pieces_one_forward held):
  // the step kernels run each sequence's tokens in order, every other op row by row.
  std::vector<int32_t> ids;
  BatchLayout batch;
  for (const Sequence& s : seqs) {
    const int64_t start = static_cast<int64_t>(ids.size()), len = static_cast<int64_t>(s.token_ids.size());
    ids.insert(ids.end(), s.token_ids.begin(), s.token_ids.end());
    batch.seqs.push_back({start, len, s.slot});
  }
  const int64_t T = static_cast<int64_t>(ids.size());
  batch.total_tokens = T;
  batch.step_pieces = T != B;
  ws.reserve(be, c, T, T);
  be.copy_from_host(ws.ids.data(), ids.data(), static_cast<size_t>(T) * 4);
  be.prepare_batch(batch);
  reserve_kv(state, batch, Pass::Decode);
  StateCache::Impl& st = state_impl(state);

  const bool want_logits = output == Output::LastLogits || output == Output::AllLogits;
  TensorView logits = Workspace::f32(ws.logits, dev, T, c.vocab_size);
  auto device_work = [&] {  // embedding, layers and LM head of the step: what a graph captures
    TensorView residual = Workspace::f32(ws.residual, dev, T, c.d_model);
    be.embed(m.weights.embeddings, TensorView(ws.ids.data(), DType::I32, {T}, dev), residual);
    run_layers(m, state, batch, Pass::Decode, residual);
    if (want_logits) lm_head_decode(m, residual, batch, logits);
  };

  // MoE layers capture only where the backend routes and combines on the device (the default ops wait on the host).
  // Step pieces run uncaptured: a graph per combination of lengths would pile up, and their launches are shared by
  // all of a verify row's tokens.
  const bool moe_capturable = c.moe.n_experts == 0 || be.moe_ops_capturable();
  if (!m.options.cuda_graphs || !be.supports_graphs() || !moe_capturable || batch.step_pieces) {
    device_work();
  } else {
    // The key is every state buffer, the row count and the output kind. The kernels read each row's slot from the
    // batch layout in device memory (prepare_batch rewrites it in place), so a changing set of sequences replays the
    // same graph. The key is the exact row count rather than a bucket: a padding row would read and write a whole
    // slot's state (at 2.7b, 168 MB in f32), while a capture per count costs once.
    std::vector<const void*> key;
    for (const LayerCache& l : state.layers()) key.push_back(l.conv.data), key.push_back(l.ssm.data);
    if (st.has_kv()) {  // the page tables' buffer and layout (a growth of table_pages is a new buffer)
      key.push_back(st.kv_table.data());
      key.push_back(st.kv_lengths.data());
      key.push_back(reinterpret_cast<const void*>(static_cast<intptr_t>(st.table_pages)));
      key.push_back(reinterpret_cast<const void*>(static_cast<intptr_t>(st.n_slots)));
    }
    key.push_back(reinterpret_cast<const void*>(static_cast<intptr_t>(B)));
    key.push_back(reinterpret_cast<const void*>(static_cast<intptr_t>(output)));
    m.decode_graphs.run(be, key, ws.generation, batch.device_seqs, device_work);
  }
  advance_kv(state, batch);
  if (!batch.step_pieces) {
    if (top_k)  // only the candidates come back
      select_outputs(be, logits, *top_k, result.candidates, result.logprobs);
    else if (output == Output::LastLogits)
      be.copy_to_host(result.values.data(), logits.data, result.values.size() * 4);
    be.synchronize();
    return;
  }
  if (output == Output::AllLogits) {  // every row, in the call's order
    be.copy_to_host(result.values.data(), logits.data, static_cast<size_t>(T * c.vocab_size) * 4);
  } else if (top_k) {
    // Each row gets its sequence's request; the candidates of a sequence's last row come back.
    std::vector<TopKRequest> per_row;
    for (size_t i = 0; i < seqs.size(); ++i)
      per_row.insert(per_row.end(), static_cast<size_t>(batch.seqs[i].len), (*top_k)[i]);
    std::vector<TopKCandidates> cands;
    std::vector<RowLogprobs> lps;
    select_outputs(be, logits, per_row, cands, lps);
    for (size_t i = 0; i < seqs.size(); ++i) {
      const size_t last = static_cast<size_t>(batch.seqs[i].start + batch.seqs[i].len - 1);
      result.candidates[i] = std::move(cands[last]);
      result.logprobs[i] = std::move(lps[last]);
    }
  } else if (output == Output::LastLogits) {
    const int64_t V = c.vocab_size;
    std::vector<float> all(static_cast<size_t>(T * V));
    be.copy_to_host(all.data(), logits.data, all.size() * 4);
    for (size_t i = 0; i < seqs.size(); ++i) {
      const int64_t last = batch.seqs[i].start + batch.seqs[i].len - 1;
      std::copy_n(all.begin() + last * V, V, result.values.begin() + static_cast<int64_t>(i) * V);
    }
  }
  be.synchronize();
}

}  // namespace mambacpp
