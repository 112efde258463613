#include "model/decode_step.h"

#include "model/layer_stack.h"
#include "model/model_impl.h"

namespace mambacpp {

namespace {
// Larger batches take the general path, which computes their logits in blocks of this many rows: a step's
// [B, vocab] logits buffer stays as bounded as prefill's.
constexpr int64_t kMaxDecodeBatch = 256;
}  // namespace

bool decode_step_applies(const Model::Impl& m, std::span<const Sequence> seqs, Output output) {
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
  ws.reserve(be, c, B, B);

  std::vector<int32_t> ids(static_cast<size_t>(B));
  BatchLayout batch;
  for (int64_t i = 0; i < B; ++i) {
    ids[static_cast<size_t>(i)] = seqs[static_cast<size_t>(i)].token_ids[0];
    batch.seqs.push_back({i, 1, seqs[static_cast<size_t>(i)].slot});
  }
  batch.total_tokens = B;
  be.copy_from_host(ws.ids.data(), ids.data(), static_cast<size_t>(B) * 4);
  be.prepare_batch(batch);
  reserve_kv(state, batch, Pass::Decode);
  StateCache::Impl& st = state_impl(state);

  TensorView logits = Workspace::f32(ws.logits, dev, B, c.vocab_size);
  auto device_work = [&] {  // embedding, layers and LM head of the step: what a graph captures
    TensorView residual = Workspace::f32(ws.residual, dev, B, c.d_model);
    be.embed(m.weights.embeddings, TensorView(ws.ids.data(), DType::I32, {B}, dev), residual);
    run_layers(m, state, batch, Pass::Decode, residual);
    if (output == Output::LastLogits) lm_head_decode(m, residual, batch, logits);
  };

  // MoE layers capture only where the backend routes and combines on the device (the default ops wait on the host).
  const bool moe_capturable = c.moe.n_experts == 0 || be.moe_ops_capturable();
  if (!m.options.cuda_graphs || !be.supports_graphs() || !moe_capturable) {
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
  if (top_k)  // only the candidates come back
    select_outputs(be, logits, *top_k, result.candidates, result.logprobs);
  else if (output == Output::LastLogits)
    be.copy_to_host(result.values.data(), logits.data, result.values.size() * 4);
  be.synchronize();
}

}  // namespace mambacpp
