// One Mamba block of a loaded model as a layer, the way people put a Mamba-2 block inside their own models:
// [B, L, d_model] in, [B, L, d_model] out (x + mixer(rmsnorm(x))), with its own state in slots (row b uses slot b).
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "mambacpp/model.h"

namespace mambacpp {

class MambaBlock {
 public:
  // Block `layer` of `model`; the model must outlive the block.
  MambaBlock(const Model& model, int64_t layer);

  // A state for this block alone (one layer's conv and SSM state per slot).
  std::unique_ptr<StateCache> create_state(int64_t n_slots) const;

  // x: [B, L, d_model] f32 on the host. Row b continues from slot b of `state` and updates it.
  std::vector<float> forward(StateCache& state, const TensorView& x) const;

  int64_t layer() const { return layer_; }

 private:
  const Model& model_;
  int64_t layer_;
};

}  // namespace mambacpp
