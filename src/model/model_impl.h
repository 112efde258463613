// Model internals shared by model.cpp (loading, forward) and state_cache.cpp (state files need the model's identity).
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
};

struct StateCache::Impl {
  const Model* model = nullptr;
  Backend* backend = nullptr;
  int64_t n_slots = 0;
  DType dtype = DType::F32;
  std::vector<DeviceBuffer> buffers;
  std::vector<LayerCache> layers;
  int64_t first_layer = 0;  // the model layer of layers[0] (a MambaBlock's state holds one layer)

  // KV entries (hybrid models with attention). kv_pages[l][slot] are layer l's pages for a slot (empty for layers
  // of other kinds); positions[slot] is the number of tokens the slot holds (every attention layer holds them all).
  int64_t page_tokens = 64;
  std::vector<std::vector<std::vector<DeviceBuffer>>> kv_pages;
  std::vector<int64_t> positions;

  // Device mirror of the page lists and positions, for decode steps that read them on the device (backends with
  // supports_device_kv; what lets a captured step replay as contexts grow): per attention layer a [n_slots,
  // table_pages] array of page pointers, and positions [n_slots] as int64. table_pages only grows, by doubling (a
  // new buffer: graphs keyed on it are captured again, a handful of times over a context's growth).
  int64_t table_pages = 0;
  DeviceBuffer kv_table, kv_lengths;
  std::vector<int64_t> kv_table_index;  // per layer: its table among the attention layers, or -1
  std::vector<void*> kv_table_host;     // what kv_table holds
  // Brings the device mirror up to date for the slots of `seqs` (the caller has fitted their pages).
  void sync_device_kv(const std::vector<SeqSpan>& seqs);
  // Layer li's [n_slots, table_pages] page table on the device.
  void* const* device_pages(size_t li) const;

  bool has_kv() const { return !positions.empty(); }
  // KV rows are held in the state dtype (f32 or bf16), like the Mamba layers' state.
  size_t kv_elem_bytes() const { return dtype_size(dtype); }
  size_t page_bytes(const LayerCache& l) const {
    return static_cast<size_t>(2 * page_tokens * l.kv_dim) * kv_elem_bytes();
  }
  // Grows (or shrinks) every KV layer's pages of `slot` to hold exactly enough pages for `tokens` positions.
  void fit_kv(int64_t slot, int64_t tokens);
  // Layer li's cache of `slot` as the attention op takes it (past = positions[slot]).
  KvSequence kv_sequence(size_t li, int64_t slot) const;
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
