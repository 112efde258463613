// Per-sequence recurrent state, in slots. Each layer has a typed cache entry: Mamba layers keep a conv state
// (the last d_conv-1 conv inputs) and an SSM state; attention layers of hybrid models keep the keys and values of
// every token the slot holds, in fixed-size pages allocated as the sequence grows (memory follows the tokens held,
// not a maximum context); MLP layers keep nothing.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "mambacpp/tensor.h"

namespace mambacpp {

class Model;


// A copy of one slot's state in the backend's memory (device memory on a GPU), for prefix caches: taking and
// restoring one is a device-to-device copy.
class SlotSnapshot {
 public:
  SlotSnapshot();  // holds nothing: for StateCache::snapshot_into
  ~SlotSnapshot();
  SlotSnapshot(SlotSnapshot&&) noexcept;
  SlotSnapshot& operator=(SlotSnapshot&&) noexcept;
  size_t bytes() const;

 private:
  friend class StateCache;
  struct Impl;
  explicit SlotSnapshot(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// The values are those of the state file's kind table: do not renumber.
enum class LayerCacheKind : uint8_t { Ssm = 0, Kv = 1, Stateless = 2 };

struct LayerCache {
  LayerCacheKind kind = LayerCacheKind::Ssm;
  TensorView conv;  // Ssm: [n_slots, conv_channels, d_conv - 1]
  TensorView ssm;   // Ssm: Mamba-1 [n_slots, d_inner, d_state]; Mamba-2 [n_slots, n_heads, head_dim, d_state]
  int64_t kv_dim = 0;  // Kv: channels of one token's keys (and of its values), n_kv_heads * head_dim
};

class StateCache {
 public:
  ~StateCache();
  StateCache(const StateCache&) = delete;
  StateCache& operator=(const StateCache&) = delete;

  int64_t n_slots() const;
  DType dtype() const;
  const std::vector<LayerCache>& layers() const;

  void reset(int64_t slot);  // back to a fresh sequence (zeros)
  void reset_all();
  void copy(int64_t src_slot, int64_t dst_slot);  // fork a sequence

  // One slot's state as f32 on the host, layer by layer: conv then ssm (Ssm), keys then values of the tokens held
  // (Kv).
  std::vector<float> read_slot(int64_t slot) const;

  // Tokens the slot's KV entries hold (the position of its next token); 0 for models without attention.
  int64_t tokens_held(int64_t slot) const;
  // Rows per KV page (a slot's KV memory grows in steps of this many tokens per attention layer).
  int64_t kv_page_tokens() const;

  // Saves one slot to a file whose header carries the model's config and weights hash, a table of each layer's
  // cache-entry kind and tensor shapes, and the tokens the state stands for (may be empty). load() rejects a file
  // written by another model (or a different state layout) with a clear error, before touching the slot, and
  // returns the tokens.
  void save(int64_t slot, const std::string& path, const std::vector<int32_t>& tokens = {}) const;
  std::vector<int32_t> load(int64_t slot, const std::string& path);

  // The bytes of one slot's fixed-size state (every Mamba layer's tensors). A snapshot also holds the KV rows of the
  // tokens the slot holds: slot_bytes() + tokens_held(slot) * kv_bytes_per_token().
  size_t slot_bytes() const;
  size_t kv_bytes_per_token() const;
  SlotSnapshot snapshot(int64_t slot) const;
  // The same into `into`, whose storage is reused when it is large enough (a snapshot taken every step costs no
  // allocation).
  void snapshot_into(int64_t slot, SlotSnapshot& into) const;
  void restore(int64_t slot, const SlotSnapshot& snapshot);
  // State files from and to snapshots (the same format as save/load).
  void save_snapshot(const SlotSnapshot& snapshot, const std::string& path, const std::vector<int32_t>& tokens) const;
  SlotSnapshot load_snapshot(const std::string& path, std::vector<int32_t>* tokens) const;

  // Throws Error naming `what` when slot is outside [0, n_slots).
  void check_slot(int64_t slot, const char* what = "slot") const;

  struct Impl;  // opaque; defined in the library's internal headers

 private:
  friend class Model;
  friend class MambaBlock;
  friend Impl& state_impl(StateCache& s);  // for the library's layer recipes (src/model)
  explicit StateCache(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace mambacpp
