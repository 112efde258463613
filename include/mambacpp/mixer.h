// A Mamba-1 or Mamba-2 mixer on its own, built from weights in memory: the token mixing of one block as
// transformers' MambaMixer / Mamba2Mixer (and mamba_ssm's Mamba / Mamba2) compute it, without the block's norm and
// residual. It runs the model's own mixer code on the CPU or CUDA backend, with a state of its own.
//
//   mambacpp::MixerConfig c;                       // Mamba-2: d_model, d_state, n_heads, head_dim, n_groups, ...
//   auto mixer = mambacpp::Mixer::create(c, {{"in_proj.weight", in_proj}, {"conv1d.weight", conv}, ...});
//   auto state = mixer->create_state(/*n_slots=*/B);
//   std::vector<float> y = mixer->forward(*state, x);   // x: [B, L, d_model] f32 on the host; row b uses slot b
//   y = mixer->step(*state, x_t);                       // x_t: [B, d_model], one token per row
#pragma once

#include <cstdint>
#include <limits>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "mambacpp/config.h"
#include "mambacpp/model.h"
#include "mambacpp/tensor.h"

namespace mambacpp {

// The mixer's hyper-parameters (the names of ModelConfig's fields; transformers' names in the comments).
struct MixerConfig {
  Arch arch = Arch::Mamba2;
  int64_t d_model = 0;           // hidden_size
  int64_t d_state = 0;           // state_size
  int64_t d_conv = 4;            // conv_kernel
  int64_t d_inner = 0;           // expand * hidden_size (Mamba-2: n_heads * head_dim)
  bool use_bias = false;         // in_proj.bias and out_proj.bias
  bool use_conv_bias = true;     // conv1d.bias
  // Mamba-1.
  int64_t dt_rank = 0;           // time_step_rank
  double mixer_rms_eps = 0.0;    // FalconMamba: eps of the unweighted RMS norms on dt, B and C (0: plain Mamba-1)
  // Mamba-2.
  int64_t n_heads = 0;           // num_heads
  int64_t head_dim = 0;
  int64_t n_groups = 1;
  int64_t chunk_size = 256;
  double dt_min = 0.0;           // time_step_limit: dt is clamped to [dt_min, dt_max]
  double dt_max = std::numeric_limits<double>::infinity();
  double norm_eps = 1e-5;        // the gated RMSNorm's epsilon (layer_norm_epsilon)
  int64_t norm_groups = 0;       // the gated norm normalises groups of d_inner / norm_groups channels; 0: n_groups
                                 // (mamba_ssm, Mamba2Mixer), 1: one group (Granite-4.0-H, Bamba)

  // The mixer of a model config's Mamba layers (a hybrid's Mamba-2 layers).
  static MixerConfig of(const ModelConfig& c);
  // Throws mambacpp::Error naming the inconsistent field.
  void validate() const;
};

struct MixerOptions {
  DeviceChoice device = DeviceChoice::Auto;
  DType weight_dtype = DType::F32;        // GPU only: the weights' dtype on the device (the CPU keeps the given one)
  Precision precision = Precision::Exact; // GPU, 16-bit weights: how activations enter the products (precision.h)
  int threads = 0;                        // CPU threads (0: all hardware threads)
  int64_t max_batch_tokens = 0;           // rows per piece of a forward call (bounds memory); 0: the device's default
};

// The conv inputs and SSM state of n_slots sequences, on the mixer's device. Made by Mixer::create_state; belongs
// to that mixer (which must outlive it).
class MixerState {
 public:
  ~MixerState();
  MixerState(const MixerState&) = delete;
  MixerState& operator=(const MixerState&) = delete;

  int64_t n_slots() const;
  DType dtype() const;
  // One slot's shapes: conv [conv_channels, d_conv - 1]; ssm Mamba-1 [d_inner, d_state], Mamba-2 [n_heads,
  // head_dim, d_state].
  std::vector<int64_t> conv_shape() const;
  std::vector<int64_t> ssm_shape() const;
  size_t slot_bytes() const;  // bytes of one slot's conv and SSM state
  void reset(int64_t slot);   // back to a fresh sequence (zeros)
  void reset_all();
  void copy(int64_t src_slot, int64_t dst_slot);
  // A new state of the same mixer holding the same values.
  std::unique_ptr<MixerState> clone() const;
  // One slot as f32: conv then ssm, each in the shapes above.
  std::vector<float> read_slot(int64_t slot) const;
  // Throws naming `what` unless 0 <= slot < n_slots.
  void check_slot(int64_t slot, const char* what = "slot") const;

  struct Impl;

 private:
  friend class Mixer;
  explicit MixerState(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

class Mixer {
 public:
  // Weights by transformers' state_dict names (the mixer's own, without the "backbone.layers.N.mixer." prefix):
  //   both:    in_proj.weight [in_proj_size, d_model], conv1d.weight [conv_channels, 1, d_conv],
  //            out_proj.weight [d_model, d_inner], A_log, D; conv1d.bias [conv_channels] (use_conv_bias),
  //            in_proj.bias [in_proj_size] and out_proj.bias [d_model] (use_bias)
  //   Mamba-1: x_proj.weight [dt_rank + 2 d_state, d_inner], dt_proj.weight [d_inner, dt_rank], dt_proj.bias [d_inner],
  //            A_log [d_inner, d_state], D [d_inner]
  //   Mamba-2: dt_bias, A_log, D [n_heads], norm.weight [d_inner]
  // as host tensors of f32, f16 or bf16 (each its own). The weights are copied: the arrays may go after create.
  // Errors name the weight and what was expected and found (a missing or unexpected name, a shape, a dtype).
  static std::unique_ptr<Mixer> create(const MixerConfig& config, const std::map<std::string, TensorView>& weights,
                                       const MixerOptions& options = {});
  ~Mixer();
  Mixer(const Mixer&) = delete;
  Mixer& operator=(const Mixer&) = delete;

  const MixerConfig& config() const;
  Device device() const;
  std::string device_description() const;
  // The names create takes for this config, required ones first.
  static std::vector<std::string> weight_names(const MixerConfig& config);

  // A fresh (zero) state for n_slots sequences; dtype f32, or bf16 (GPU).
  std::unique_ptr<MixerState> create_state(int64_t n_slots, DType dtype = DType::F32) const;

  // x: [B, L, d_model] f32 on the host, any L >= 1. Row b continues slot b of `state` and updates it; returns y
  // [B, L, d_model] f32. Chunks of any length give what one call gives.
  std::vector<float> forward(MixerState& state, const TensorView& x) const;
  // One token per row: x [B, d_model] f32 on the host -> y [B, d_model]; the same as forward of L = 1.
  std::vector<float> step(MixerState& state, const TensorView& x) const;

  struct Impl;

 private:
  explicit Mixer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace mambacpp
