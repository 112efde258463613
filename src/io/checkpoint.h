// A model directory opened for inference: config.json parsed into ModelConfig, and every weight tensor of its
// weight file(s) mapped and indexed by name. Layouts, in this order of preference: model.safetensors;
// model.safetensors.index.json plus the shards it names; pytorch_model.bin (torch.save zip format, read by a restricted
// unpickler that never executes the file); pytorch_model.bin.index.json plus its shards; any other *.safetensors files.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

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
  const TensorView* find(const std::string& name) const;
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
  };
  struct File {
    std::string path;
    std::shared_ptr<const void> owner;  // the SafetensorsFile / TorchCheckpointFile whose memory the views use
  };
  struct HashCache;

  void open_single(const std::string& path);
  void open_index(const std::string& index_path);
  void add_file(const std::string& path);

  std::string directory_;
  ModelConfig config_;
  std::vector<File> files_;
  std::map<std::string, Entry> tensors_;
  std::unique_ptr<HashCache> hash_;
};

}  // namespace mambacpp
