// Activation buffers for one forward piece of at most `capacity` tokens, allocated once on the backend and reused.
// Sizes are per token, so a piece of T <= capacity tokens uses the first T rows of each buffer.
#pragma once

#include "backend/backend.h"
#include "mambacpp/config.h"

namespace mambacpp {

struct Workspace {
  int64_t capacity = 0;  // tokens
  DeviceBuffer ids;       // [cap] i32
  DeviceBuffer staging;   // [cap, d_model] input embeddings in their own dtype (up to 4 bytes)
  DeviceBuffer residual;  // [cap, d_model] f32 residual stream
  DeviceBuffer normed;    // [cap, d_model] f32
  DeviceBuffer proj;      // [cap, in_proj_size] f32
  DeviceBuffer conv;      // [cap, conv_channels] f32
  DeviceBuffer xdbc;      // [cap, dt_rank + 2 d_state] f32 (Mamba-1)
  DeviceBuffer dt;        // [cap, d_inner] f32 (Mamba-1)
  DeviceBuffer y;         // [cap, d_inner] f32
  DeviceBuffer y_normed;  // [cap, d_inner] f32 (Mamba-2)
  DeviceBuffer mixer_out; // [cap, d_model] f32
  // Hybrid models only.
  DeviceBuffer q;         // [cap, n_attn_heads * attn_head_dim] f32
  DeviceBuffer k, v;      // [cap, n_kv_heads * attn_head_dim] f32
  DeviceBuffer attn;      // [cap, n_attn_heads * attn_head_dim] f32
  DeviceBuffer mlp_h;     // [cap, 2 mlp_size] f32 (gate | up; relu2 uses the first mlp_size columns)
  DeviceBuffer mlp_act;   // [cap, mlp_size] f32
  DeviceBuffer parallel_in;  // [cap, d_model] f32: a parallel layer's attention input (Falcon-H1)
  // Mixture of experts (moe_layer.cpp).
  DeviceBuffer moe_logits;   // [cap, n_experts] f32 router logits
  DeviceBuffer moe_ids;      // [cap, top_k] i32 chosen experts
  DeviceBuffer moe_weights;  // [cap, top_k] f32
  DeviceBuffer moe_hidden;   // [cap, max(shared_size, 2 mlp_size)] f32 shared expert's hidden rows
  DeviceBuffer moe_shared;   // [cap, d_model] f32 shared expert's output
  DeviceBuffer moe_latent_in, moe_latent_out;  // [cap, latent_size] f32 routed experts' input and output (latent MoE)
  DeviceBuffer logits;    // [logit_rows, vocab] f32
  int64_t logit_rows = 0;
  uint64_t generation = 0;  // bumped whenever a buffer moves (captured graphs hold the old pointers)

  void reserve(Backend& backend, const ModelConfig& c, int64_t tokens, int64_t rows_of_logits);

  static TensorView f32(const DeviceBuffer& b, Device dev, int64_t rows, int64_t cols) {
    return TensorView(b.data(), DType::F32, {rows, cols}, dev);
  }
  // A view of b in a dtype of at most 4 bytes (b is sized for f32).
  static TensorView of(const DeviceBuffer& b, DType dtype, Device dev, int64_t rows, int64_t cols) {
    return TensorView(b.data(), dtype, {rows, cols}, dev);
  }
};

}  // namespace mambacpp
