// MambaBlock: one block of a model run on its own, through the same mixers and workspace as Model::forward.
#include "mambacpp/block.h"

#include "mambacpp/error.h"
#include "model/mixers.h"
#include "model/model_impl.h"

namespace mambacpp {

MambaBlock::MambaBlock(const Model& model, int64_t layer) : model_(model), layer_(layer) {
  if (model.config().hybrid())
    fail("MambaBlock: ", family_name(model.config().family), " is a hybrid model; MambaBlock runs the layers of pure ",
         "Mamba models only");
  if (layer < 0 || layer >= model.config().n_layer)
    fail("MambaBlock: layer ", layer, " out of range: the model has layers [0, ", model.config().n_layer, ")");
}

std::unique_ptr<StateCache> MambaBlock::create_state(int64_t n_slots) const {
  // A whole-model cache, then keep only this block's layer: the same allocation code and state file format.
  auto full = model_.create_state(n_slots);
  auto& impl = *full->impl_;
  LayerCache mine = impl.layers[static_cast<size_t>(layer_)];
  std::vector<DeviceBuffer> keep;
  keep.push_back(std::move(impl.buffers[static_cast<size_t>(2 * layer_)]));
  keep.push_back(std::move(impl.buffers[static_cast<size_t>(2 * layer_ + 1)]));
  impl.buffers = std::move(keep);
  impl.layers = {mine};
  impl.first_layer = layer_;
  return full;
}

std::vector<float> MambaBlock::forward(StateCache& state, const TensorView& x) const {
  const ModelConfig& c = model_.config();
  if (x.ndim != 3 || x.dim(2) != c.d_model || x.dtype != DType::F32 || x.device != Device::CPU || !x.contiguous())
    fail("MambaBlock input: expected f32 host tensor [B, L, ", c.d_model, "], found ", dtype_name(x.dtype), " ",
         x.shape_string());
  const int64_t B = x.dim(0), L = x.dim(1);
  if (B < 1 || L < 1) fail("MambaBlock input: expected B >= 1 and L >= 1, found ", x.shape_string());
  if (state.impl_->model != &model_ || state.layers().size() != 1 || state.impl_->first_layer != layer_)
    fail("MambaBlock (layer ", layer_, "): expected a state made by this block's create_state");
  for (int64_t b = 0; b < B; ++b) state.check_slot(b, "MambaBlock row slot");

  const Model::Impl& m = *model_.impl_;
  std::lock_guard<std::mutex> lock(m.forward_mutex);
  Backend& be = *m.backend;
  const Device dev = be.device();
  Workspace& ws = m.workspace;
  const int64_t cap = std::max<int64_t>(1, m.options.max_batch_tokens);
  ws.reserve(be, c, std::min(cap, B * L), 1);
  const LayerWeights& w = m.weights.layers[static_cast<size_t>(layer_)];
  std::vector<float> out(static_cast<size_t>(B * L * c.d_model));
  const float eps = static_cast<float>(c.norm_eps);

  // Pieces of whole rows-in-time: each piece covers positions [p, p + n) of every row (n * B <= cap when possible).
  const int64_t n_per_piece = std::max<int64_t>(1, cap / B);
  for (int64_t p = 0; p < L; p += n_per_piece) {
    const int64_t n = std::min(n_per_piece, L - p);
    ws.reserve(be, c, n * B, 1);
    BatchLayout batch;
    for (int64_t b = 0; b < B; ++b) batch.seqs.push_back({b * n, n, b});
    batch.total_tokens = n * B;
    be.prepare_batch(batch);
    TensorView residual = Workspace::f32(ws.residual, dev, n * B, c.d_model);
    for (int64_t b = 0; b < B; ++b)
      be.copy_from_host(residual.rows(b * n, n).data, x.ptr<float>() + (b * L + p) * c.d_model,
                        static_cast<size_t>(n * c.d_model) * 4);
    TensorView normed = Workspace::f32(ws.normed, dev, n * B, c.d_model);
    TensorView mixed = Workspace::f32(ws.mixer_out, dev, n * B, c.d_model);
    be.rmsnorm(residual, w.norm, eps, normed);
    if (c.arch == Arch::Mamba1)
      mamba1_mixer(be, c, w, state.layers()[0], batch, ws, normed, mixed);
    else
      mamba2_mixer(be, c, w, state.layers()[0], batch, ws, normed, mixed);
    be.add_inplace(residual, mixed);
    for (int64_t b = 0; b < B; ++b)
      be.copy_to_host(out.data() + (b * L + p) * c.d_model, residual.rows(b * n, n).data,
                      static_cast<size_t>(n * c.d_model) * 4);
  }
  be.synchronize();
  return out;
}

}  // namespace mambacpp
