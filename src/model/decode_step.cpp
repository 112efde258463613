#include "model/decode_step.h"

#include "model/layers.h"
#include "model/mixers.h"
#include "model/model_impl.h"

namespace mambacpp {

namespace {
// Distinct (state, row count, output) keys kept; beyond that the cache starts over. One state needs at most
// kMaxDecodeBatch of them per output kind.
constexpr size_t kMaxGraphs = 1024;
// Larger batches take the general path, which computes their logits in blocks of this many rows: a step's
// [B, vocab] logits buffer stays as bounded as prefill's.
constexpr int64_t kMaxDecodeBatch = 256;

// Embedding, blocks and LM head of one step (the work a graph captures). Blocks go through the fused decode recipe
// where the backend has the fused ops, else through the plain ops; one token per sequence, so the hidden rows are
// already the last rows.
void run_step(const Model::Impl& m, StateCache& state, const BatchLayout& batch, Output output, TensorView logits) {
  const ModelConfig& c = m.config;
  Backend& be = *m.backend;
  const Device dev = be.device();
  Workspace& ws = m.workspace;
  const int64_t B = batch.total_tokens;
  const float eps = static_cast<float>(c.norm_eps);
  TensorView residual = Workspace::f32(ws.residual, dev, B, c.d_model);
  be.embed(m.weights.embeddings, TensorView(ws.ids.data(), DType::I32, {B}, dev), residual);
  if (c.hybrid()) {
    // Mamba-2 layers on the fused recipe where the family adds their output unscaled (Nemotron-H, Bamba), then the
    // MLP sublayer; attention and MLP layers (and Granite's scaled sublayers) through the plain ops, the KV cache read
    // from the state's device mirror.
    if (c.embedding_multiplier != 1.0) be.scale(residual, static_cast<float>(c.embedding_multiplier));
    for (int64_t l = 0; l < c.n_layer; ++l) {
      const LayerCache& cache = state.layers()[static_cast<size_t>(l)];
      const LayerWeights& w = m.weights.layers[static_cast<size_t>(l)];
      if (w.kind == LayerKind::Mamba2 && m.options.fused_decode && c.residual_multiplier == 1.0 &&
          mamba_block_decode_fused(be, c, w, cache, batch, ws, residual)) {
        if (c.mlp_after_mixer) run_mlp_sublayer(m, l, B, residual);
        continue;
      }
      run_hybrid_layer(m, l, state, batch, residual, /*device_kv=*/true);
    }
  } else {
    for (int64_t l = 0; l < c.n_layer; ++l) {
      const LayerCache& cache = state.layers()[static_cast<size_t>(l)];
      const LayerWeights& w = m.weights.layers[static_cast<size_t>(l)];
      if (!m.options.fused_decode || !mamba_block_decode_fused(be, c, w, cache, batch, ws, residual))
        run_block(m, l, cache, batch, residual);
    }
  }
  if (output != Output::LastLogits) return;
  FusedLinearArgs head;  // the final norm folded into the LM head
  head.x = residual;
  head.w = m.weights.lm_head;
  head.norm_w = m.weights.norm_f;
  head.eps = eps;
  head.y = logits;
  if (m.options.fused_decode && be.supports_fused_linear(head, batch)) {
    be.fused_linear(head, batch);
  } else {
    TensorView normed = Workspace::f32(ws.normed, dev, B, c.d_model);
    be.rmsnorm(residual, m.weights.norm_f, eps, normed);
    be.linear(normed, m.weights.lm_head, {}, logits);
  }
  if (c.logits_scaling != 1.0) be.scale(logits, static_cast<float>(1.0 / c.logits_scaling));
}

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
  StateCache::Impl& st = state_impl(state);
  if (st.has_kv()) {  // a page for each row's new position, and the device mirror of positions and page tables
    for (const SeqSpan& s : batch.seqs) st.fit_kv(s.slot, st.positions[static_cast<size_t>(s.slot)] + 1);
    st.sync_device_kv(batch.seqs);
  }

  TensorView logits = Workspace::f32(ws.logits, dev, B, c.vocab_size);
  auto device_work = [&] { run_step(m, state, batch, output, logits); };

  if (!m.options.cuda_graphs || !be.supports_graphs()) {
    device_work();
  } else {
    // Captured kernels hold raw pointers: the key is every state buffer, the row count and the output kind. The
    // kernels read each row's slot from the batch layout in device memory (prepare_batch rewrites it in place), so
    // a changing set of sequences replays the same graph. The key is the exact row count rather than a bucket:
    // a padding row would read and write a whole slot's state (at 2.7b, 168 MB in f32), while a capture per count
    // costs once.
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
    if (m.decode_graphs.size() >= kMaxGraphs && !m.decode_graphs.count(key)) m.decode_graphs.clear();
    DecodeGraph& g = m.decode_graphs[key];
    if (g.workspace_generation != ws.generation || g.device_seqs != batch.device_seqs) g = DecodeGraph{};
    if (!g.warmed) {
      device_work();
      g.warmed = true;
      g.workspace_generation = ws.generation;
      g.device_seqs = batch.device_seqs;
    } else {
      if (!g.graph) {
        be.begin_capture();
        try {
          device_work();
        } catch (...) {
          be.abort_capture();
          throw;
        }
        g.graph = be.end_capture();
      }
      be.replay(*g.graph);
    }
  }
  if (st.has_kv())
    for (const SeqSpan& s : batch.seqs) ++st.positions[static_cast<size_t>(s.slot)];
  if (top_k)  // only the candidates come back
    select_outputs(be, logits, *top_k, result.candidates, result.logprobs);
  else if (output == Output::LastLogits)
    be.copy_to_host(result.values.data(), logits.data, result.values.size() * 4);
  be.synchronize();
}

}  // namespace mambacpp
