// A model directory opened for inference: config.json parsed into ModelConfig, and every weight tensor of its
// weight file(s) mapped and indexed by name. Layouts, in this order of preference: model.safetensors;
// model.safetensors.index.json plus the shards it names; pytorch_model.bin (torch.save zip format, read by a restricted
// unpickler that never executes the file); pytorch_model.bin.index.json plus its shards; any other *.safetensors files.
// FP8 checkpoints as ModelOpt and compressed-tensors publish them (io/quant_config.h) are read as they are: each
// F8_E4M3 weight with its weight_scale becomes one typed FP8 weight (core/weight.h) with f32 scales per output
// channel (a per-tensor scale broadcast); the scale tensors, static input scales and KV-cache scales are checked and
// consumed, so a model binds the weights by their module names as in a 16-bit checkpoint.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "core/weight.h"
#include "io/quant_config.h"
#include "io/safetensors.h"
#include "mambacpp/config.h"
#include "mambacpp/tensor.h"

namespace mambacpp {

class Checkpoint {
 public:
  // Throws mambacpp::Error naming the path on a missing config.json, missing shard, unsupported format, or any
  // defect of the files.
  explicit Checkpoint(const std::string& directory);

  Checkpoint(Checkpoint&&) noexcept;
  Checkpoint& operator=(Checkpoint&&) noexcept;
  ~Checkpoint();

  const ModelConfig& config() const { return config_; }
  const std::string& directory() const { return directory_; }
  // The tensor called `name` (CPU, pointing into the read-only mapping, valid while this object lives), or nullptr.
  // An F8_E4M3 tensor is a U8 view of its bytes here; weight() pairs it with its scales.
  const TensorView* find(const std::string& name) const;
  // The quantization the checkpoint declares (method None for a 16-bit checkpoint).
  const QuantConfig& quant() const { return quant_; }
  // The tensor `name` as a model binds it: an FP8 weight (e4m3 bytes in place, f32 scales [rows] owned here) for a
  // quantized module's weight, else the dense tensor; nullopt when absent. Throws naming the tensor when its dtype is
  // not f32, f16 or bf16.
  std::optional<Weight> weight(const std::string& name) const;
  // Every tensor name a model binds, sorted: names() without the scales weight() folds in (weight_scale,
  // input_scale, k_scale / v_scale).
  std::vector<std::string> weight_names() const;
  // Every tensor name, sorted.
  std::vector<std::string> names() const;
  // The file that holds tensor `name` (for messages), or "" when absent.
  std::string file_of(const std::string& name) const;
  // The weight files that were opened, in the order they were read.
  std::vector<std::string> files() const;
  // 64-bit FNV-1a over every tensor's name, dtype, shape and bytes, in name order; independent of config.json and of
  // how the tensors are split into files. Computed on the first call (reads all weights once) and cached.
  uint64_t content_hash() const;

 private:
  struct Entry {
    TensorView view;
    size_t file = 0;  // index into files_
    bool fp8 = false;  // stored as F8_E4M3 (view: U8 bytes of the logical shape)
  };
  struct File {
    std::string path;
    std::shared_ptr<const void> owner;  // the SafetensorsFile / TorchCheckpointFile whose memory the views use
  };
  struct HashCache;

  void open_single(const std::string& path);
  void open_index(const std::string& index_path);
  void add_file(const std::string& path);
  void open_weights();
  void read_quant_config(const std::string& config_text, const std::string& config_path);
  void bind_fp8();
  float scalar_scale(const std::string& name, const char* what) const;

  std::string directory_;
  ModelConfig config_;
  std::vector<File> files_;
  std::map<std::string, Entry> tensors_;
  QuantConfig quant_;
  std::map<std::string, Weight> fp8_;               // quantized module weights by tensor name
  std::vector<std::unique_ptr<float[]>> scales_;    // their f32 scales [rows]
  std::set<std::string> consumed_;                  // scale tensors folded into fp8_ or checked and not used
  std::unique_ptr<HashCache> hash_;
};

}  // namespace mambacpp
