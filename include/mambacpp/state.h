// Per-sequence recurrent state, in slots. Each layer has a typed cache entry: Mamba layers keep a conv state
// (the last d_conv-1 conv inputs) and an SSM state; attention layers of hybrid models will keep KV entries here.
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

enum class LayerCacheKind : uint8_t { Ssm };

struct LayerCache {
  LayerCacheKind kind = LayerCacheKind::Ssm;
  TensorView conv;  // [n_slots, conv_channels, d_conv - 1]
  TensorView ssm;   // Mamba-1: [n_slots, d_inner, d_state]; Mamba-2: [n_slots, n_heads, head_dim, d_state]
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

  // One slot's state as f32 on the host, layer by layer: conv then ssm.
  std::vector<float> read_slot(int64_t slot) const;

  // Saves one slot to a file whose header carries the model's config and weights hash, a table of each layer's
  // cache-entry kind and tensor shapes, and the tokens the state stands for (may be empty). load() rejects a file
  // written by another model (or a different state layout) with a clear error, before touching the slot, and
  // returns the tokens.
  void save(int64_t slot, const std::string& path, const std::vector<int32_t>& tokens = {}) const;
  std::vector<int32_t> load(int64_t slot, const std::string& path);

  // The bytes of one slot's state (every layer's tensors).
  size_t slot_bytes() const;
  SlotSnapshot snapshot(int64_t slot) const;
  void restore(int64_t slot, const SlotSnapshot& snapshot);
  // State files from and to snapshots (the same format as save/load).
  void save_snapshot(const SlotSnapshot& snapshot, const std::string& path, const std::vector<int32_t>& tokens) const;
  SlotSnapshot load_snapshot(const std::string& path, std::vector<int32_t>* tokens) const;

  // Throws Error naming `what` when slot is outside [0, n_slots).
  void check_slot(int64_t slot, const char* what = "slot") const;

 private:
  friend class Model;
  friend class MambaBlock;
  struct Impl;
  explicit StateCache(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace mambacpp
