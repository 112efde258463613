// What the state cache's files share: a slot snapshot's storage and the order in which a slot's tensors are laid
// out (snapshots and state files use the same order).
#pragma once

#include <vector>

#include "model/model_impl.h"

namespace mambacpp {

struct SlotSnapshot::Impl {
  DeviceBuffer buffer;  // every layer's tensors of one slot, back to back, in file order (may be longer: reused)
  size_t bytes = 0;     // the bytes held
  int64_t kv_tokens = 0;  // rows of each KV entry (keys [kv_tokens, kv_dim], then values, per attention layer)
};

// The fixed-size tensors of one layer's cache entry, in file order (KV entries have none: their rows are sized by
// the tokens held).
inline std::vector<const TensorView*> entry_tensors(const LayerCache& l) {
  if (l.kind != LayerCacheKind::Ssm) return {};
  return {&l.conv, &l.ssm};
}

}  // namespace mambacpp
