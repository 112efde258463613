// A model in a GGUF file as the rest of mambacpp sees a checkpoint: llama.cpp's metadata turned into a ModelConfig,
// and llama.cpp's tensor names and conventions turned back into the transformers names and layouts the weight binder
// asks for. The same table drives the writer (gguf_export_plan), so reading what we write is the identity.
//
// Conventions (llama.cpp's convert_hf_to_gguf.py and llama-model.cpp):
//   token_embd / output_norm / output (absent: tied embeddings); blk.N.attn_norm is the layer's (mixer's) pre-norm;
//   ssm_in, ssm_out, ssm_x, ssm_dt: the projections; ssm_conv1d.weight is [C, K] (transformers: [C, 1, K]);
//   ssm_dt.bias is dt_proj.bias (Mamba-1) or dt_bias (Mamba-2); ssm_a holds A = -exp(A_log), not A_log;
//   ssm_d is D; Mamba-2's A and D are [heads, 1] and ssm_norm is [groups, d_inner / groups]; attention attn_q/k/v/
//   output; MLPs ffn_up / ffn_down (Nemotron-H's relu2), ffn_gate + ffn_up (Granite's shared_mlp.input_linear, split in
//   two halves: gate rows first) and ffn_down, ffn_norm the MLP sublayer's pre-norm.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/weight.h"
#include "io/gguf_file.h"
#include "mambacpp/config.h"

namespace mambacpp {

// How a transformers tensor is stored in GGUF.
enum class GgufConversion : uint8_t {
  Plain,      // the same values (possibly reshaped: conv1d, A, D, ssm_norm)
  NegExp,     // stored as -exp(value): ssm_a from A_log
  GateHalf,   // the first half of the rows (Granite's input_linear -> ffn_gate); of each expert's rows where
              // `experts` > 0 (a fused [E, 2I, D] gate_up -> ffn_gate_exps [E, I, D])
  UpHalf,     // the second half of the rows (-> ffn_up, ffn_up_exps)
  // attn_q / attn_k (weight rows, bias elements) of granitehybrid and nemotron_h: llama.cpp's converter reorders
  // each head's channels from transformers' rotate-half pairs (j, j + d/2) to adjacent pairs (2j, 2j + 1), because
  // its RoPE for these architectures rotates adjacent pairs (LLAMA_ROPE_TYPE_NORM). Stored channel 2j + s of a head
  // is transformers' channel s * d/2 + j (gguf_head_permuted_source).
  HeadPermute,
};

struct GgufTensorName {
  std::string hf;                 // transformers name, e.g. "backbone.layers.0.mixer.A_log"
  std::string gguf;               // e.g. "blk.0.ssm_a"
  std::vector<int64_t> hf_shape;  // the shape the binder expects
  std::vector<int64_t> gguf_shape;  // the logical (PyTorch-order) shape llama.cpp stores
  GgufConversion conversion = GgufConversion::Plain;
  int64_t heads = 0;  // HeadPermute: the heads the rows (or elements) hold
  // Stacked experts (ffn_*_exps, [E, rows, cols]): E, else 0. The writer reads the transformers tensor `hf` (fused,
  // [E, rows or 2 rows, cols]), or, where the checkpoint has none, the E per-expert matrices `expert_names` (each one
  // expert's [rows, cols], as the released checkpoints store them). The reader hands the binder `hf`.
  int64_t experts = 0;
  std::vector<std::string> expert_names;
  // Other names a checkpoint may hold `hf` under (the released checkpoints' and transformers 5's), tried in order by
  // the writer after `hf`.
  std::vector<std::string> alt;
  // Falcon-H1's muP multipliers, folded into the stored values as llama.cpp's converter folds them: rows [previous
  // segment's end, end) are multiplied by each factor in turn (f32 products, as its torch code computes them); empty
  // for every other tensor and for a config whose multipliers are all 1 (what the reader makes of such a file).
  struct Scale {
    int64_t end;  // first row (of a matrix; element of a vector) past the segment
    std::vector<double> factors;
  };
  std::vector<Scale> scale;
};

// HeadPermute: the transformers row (or element) stored at position `i` of `n` holding `heads` heads.
int64_t gguf_head_permuted_source(int64_t i, int64_t n, int64_t heads);

// llama.cpp's architecture name for a config ("mamba", "mamba2", "nemotron_h", "nemotron_h_moe", "granitehybrid",
// "falcon-h1", "jamba").
std::string gguf_arch_name(const ModelConfig& config);
// Every tensor of a model with this config, transformers name beside the GGUF one (Granite's input_linear appears
// twice, once per half).
std::vector<GgufTensorName> gguf_tensor_names(const ModelConfig& config);
// The metadata llama.cpp reads for the architecture (general.architecture and the {arch}.* keys). Throws naming the
// feature for a model llama.cpp's architecture would run wrong (see gguf_check_writable).
class GgufWriter;
void gguf_write_config(const ModelConfig& config, GgufWriter& writer);
// The config from a file's metadata and tensors; throws naming the key for a missing or inconsistent one, and naming
// the architecture for one mambacpp does not run.
ModelConfig gguf_model_config(const GgufFile& file);
// Throws naming the feature for a config llama.cpp's architecture has no slot or no computation for (Mamba-1
// in_proj / out_proj biases; Falcon-H1's Mamba projection biases, attention biases, norm before the gate;
// nemotron_h_moe's dense MLP layers beside expert layers and shared-expert biases; experts of other families), rather
// than write a file llama.cpp would load and run wrong.
void gguf_check_writable(const ModelConfig& config);

class GgufModel {
 public:
  // Opens and validates `path` (see GgufFile), reads its config, and checks that every tensor it holds is one this
  // config names, with the shape llama.cpp stores it in.
  explicit GgufModel(const std::string& path);
  ~GgufModel();

  const GgufFile& file() const { return *file_; }
  const ModelConfig& config() const { return config_; }
  // The tensor the binder knows as `hf_name`, converted to its transformers layout (A_log from ssm_a, Granite's
  // input_linear from ffn_gate + ffn_up), in its stored format; nullopt when the file has none.
  std::optional<Weight> find(const std::string& hf_name) const;
  // Every tensor the file holds, under its transformers name.
  std::vector<std::string> names() const;
  // 64-bit FNV-1a over every tensor's GGUF name, type, shape and bytes, in file order (the model's identity in state
  // files). Reads all weights; the caller caches it.
  uint64_t content_hash() const;

 private:
  struct Converted;
  void widen_packed_experts();
  std::unique_ptr<GgufFile> file_;
  ModelConfig config_;
  std::vector<GgufTensorName> names_;
  std::unique_ptr<Converted> converted_;
};

}  // namespace mambacpp
