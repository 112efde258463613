// Model internals shared by model.cpp (loading, forward) and the state cache's files (state files need the model's
// identity).
#pragma once

#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "io/checkpoint.h"
#include "io/gguf_model.h"
#include "mambacpp/model.h"
#include "model/decode_graphs.h"
#include "model/kv_cache.h"
#include "model/weights.h"
#include "model/workspace.h"

namespace mambacpp {

struct Model::Impl {
  std::string dir;
  LoadOptions options;
  std::unique_ptr<Checkpoint> checkpoint;  // keeps the mmap'd weights alive (the CPU backend reads them in place)
  std::unique_ptr<GgufModel> gguf;         // or, for a .gguf file, the same for its mapping and converted tensors
  std::vector<std::vector<char>> random_blobs;  // Model::random: the host weights (instead of a checkpoint)
  uint64_t random_seed = 0;
  ModelConfig config;
  std::unique_ptr<Backend> backend;
  ModelWeights weights;

  mutable std::mutex forward_mutex;  // one forward at a time per model: the workspace is shared
  mutable Workspace workspace;
  mutable DecodeGraphs decode_graphs;  // decode steps replayed as graphs (decode_step.cpp)
  mutable std::once_flag hash_once;
  mutable uint64_t hash = 0;

  // A model of a filled-in Impl, for the library's own loaders of model parts (model/mtp.cpp).
  static std::unique_ptr<Model> wrap(std::unique_ptr<Impl> impl);
};

// A state cache: the slot tensors (state_slots.cpp), the KV cache of the attention layers (kv_cache.cpp) and the
// identity its state files record (state_file.cpp).
struct StateCache::Impl : KvCache {
  const Model* model = nullptr;
  Backend* backend = nullptr;
  int64_t n_slots = 0;
  DType dtype = DType::F32;
  std::vector<DeviceBuffer> buffers;
  std::vector<LayerCache> layers;
  int64_t first_layer = 0;  // the model layer of layers[0] (a MambaBlock's state holds one layer)

  // KV rows are held in the state dtype (f32 or bf16), like the Mamba layers' state.
  size_t kv_elem_bytes() const { return dtype_size(dtype); }
  size_t page_bytes(const LayerCache& l) const { return kv_page_bytes(l.kv_dim, kv_elem_bytes()); }
  void fit_kv(int64_t slot, int64_t tokens) { fit_pages(*backend, layers, kv_elem_bytes(), slot, tokens); }
  void sync_device_kv(const std::vector<SeqSpan>& seqs) { sync_device(*backend, layers, seqs); }
};

StateCache::Impl& state_impl(StateCache& s);

// The backend LoadOptions::device asks for (auto: the GPU when one is usable). Checks the options' sizes and fills in
// the defaults that depend on the device (max_batch_tokens 0).
std::unique_ptr<Backend> make_backend(LoadOptions& options);

// The outputs forward_top_k asks of a block of last-position logits [n, V]: each row's logprobs (where asked for;
// first, as select_top_k applies the penalty in place) and top-k candidates, into cands[i] / logprobs[i].
void select_outputs(Backend& be, TensorView logits, const std::vector<TopKRequest>& reqs,
                    std::vector<TopKCandidates>& cands, std::vector<RowLogprobs>& logprobs);

// Per-slot views into a layer's state tensors.
TensorView slot_view(const TensorView& t, int64_t slot);

}  // namespace mambacpp
