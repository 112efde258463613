// A torch.save checkpoint (pytorch_model.bin and its shards) read without Python: a zip archive whose
// <archive>/data.pkl is read by the restricted unpickler (io/torch_pickle.h) and whose <archive>/data/<key> entries
// hold the tensor storages. Stored entries are used in place (mmap, no copy); deflated ones are inflated once.
// Every tensor is checked against its storage and every storage against its entry before a view is handed out.
// PyTorch's legacy format (before 1.6: a bare pickle stream) is refused with a message that says how to convert it.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "io/mapped_file.h"
#include "mambacpp/dtype.h"
#include "mambacpp/tensor.h"

namespace mambacpp {

class TorchCheckpointFile {
 public:
  struct Tensor {
    std::string name;
    DType dtype = DType::F32;
    std::vector<int64_t> shape;
    const uint8_t* data = nullptr;  // into the mapping or an inflated copy owned by the file
    uint64_t nbytes = 0;
  };

  // Maps `path` read-only and validates it; throws mambacpp::Error naming the file (and tensor or entry).
  static std::unique_ptr<TorchCheckpointFile> open(const std::string& path);
  // Validates a copy held in memory (tests, fuzzing); `source` names it in messages.
  static std::unique_ptr<TorchCheckpointFile> from_bytes(std::vector<uint8_t> bytes,
                                                         const std::string& source = "<memory>");

  TorchCheckpointFile(const TorchCheckpointFile&) = delete;
  TorchCheckpointFile& operator=(const TorchCheckpointFile&) = delete;

  const std::string& path() const { return path_; }
  // In the order of the pickled dict.
  const std::vector<Tensor>& tensors() const { return tensors_; }
  // A CPU view of `t` (read-only memory: never write through it). Throws for more than 4 dimensions.
  TensorView view(const Tensor& t) const;

 private:
  TorchCheckpointFile() = default;
  void parse(const uint8_t* data, uint64_t size);

  std::string path_;
  std::unique_ptr<MappedFile> map_;
  std::vector<uint8_t> bytes_;               // from_bytes: the whole file
  std::vector<std::vector<uint8_t>> owned_;  // inflated (or realigned) storages
  std::vector<Tensor> tensors_;
};

}  // namespace mambacpp
