// The model hyper-parameters, normalised from either transformers' config.json ("mamba", "mamba2", "falcon_mamba")
// or mamba_ssm's (d_model/n_layer/ssm_cfg). Everything the forward pass needs is resolved here once ("auto" ranks, defaults,
// derived sizes), so the model code never looks at JSON.
#pragma once

#include <cstdint>
#include <limits>
#include <string>

namespace mambacpp {

enum class Arch : uint8_t { Mamba1, Mamba2 };
const char* arch_name(Arch a);  // "mamba" / "mamba2"

struct ModelConfig {
  Arch arch = Arch::Mamba2;
  int64_t d_model = 0;     // hidden_size
  int64_t n_layer = 0;     // num_hidden_layers
  int64_t vocab_size = 0;  // rows of the embedding matrix (logits have one entry per row)
  int64_t d_state = 0;     // state_size
  int64_t d_conv = 4;      // conv_kernel
  int64_t d_inner = 0;     // expand * d_model (Mamba-2: num_heads * head_dim)
  double norm_eps = 1e-5;  // layer_norm_epsilon (block norms, norm_f, and Mamba-2's gated norm)
  bool use_bias = false;       // in_proj / out_proj bias
  bool use_conv_bias = true;
  bool residual_in_fp32 = true;
  bool tie_embeddings = true;  // lm_head shares the embedding matrix

  // Mamba-1 only.
  int64_t dt_rank = 0;  // time_step_rank ("auto" = ceil(d_model / 16))
  // FalconMamba (Mamba-1 with RMS norms, without weights, on dt, B and C after x_proj): their eps (mixer_rms_eps);
  // 0 for plain Mamba-1.
  double mixer_rms_eps = 0.0;

  // Mamba-2 only.
  int64_t n_heads = 0;
  int64_t head_dim = 0;
  int64_t n_groups = 1;
  int64_t chunk_size = 256;
  double dt_min = 0.0;  // time_step_limit; dt is clamped to [dt_min, dt_max] when finite
  double dt_max = std::numeric_limits<double>::infinity();

  // Tokens (-1 when absent).
  int64_t bos_token_id = -1;
  int64_t eos_token_id = -1;
  int64_t pad_token_id = -1;

  // Derived sizes.
  int64_t conv_channels() const {  // channels of conv1d
    return arch == Arch::Mamba1 ? d_inner : d_inner + 2 * n_groups * d_state;
  }
  int64_t in_proj_size() const {  // output features of in_proj
    return arch == Arch::Mamba1 ? 2 * d_inner : 2 * d_inner + 2 * n_groups * d_state + n_heads;
  }
  // Elements of one slot's SSM state for one layer.
  int64_t ssm_state_size() const { return d_inner * d_state; }
  // Elements of one slot's conv state for one layer: the last d_conv - 1 conv inputs per channel.
  int64_t conv_state_size() const { return conv_channels() * (d_conv - 1); }

  // Canonical JSON (our own field names); round-trips through parse_model_config().
  std::string to_json() const;
  // Throws mambacpp::Error naming the inconsistent field.
  void validate() const;
};

// Parses config.json text as transformers or mamba_ssm write it: bare Infinity/-Infinity/NaN and
// {"__float__": "Infinity"} are accepted; strings that merely contain such words are left alone.
// `source` names the file in error messages. Rejects unsupported architectures and variants with a clear error.
ModelConfig parse_model_config(const std::string& json_text, const std::string& source = "config.json");

}  // namespace mambacpp
