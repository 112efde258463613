// Writes GGUF version 3 files: metadata in the order it was set, then the tensor infos, then each tensor's bytes at
// an offset aligned to general.alignment (32). Tensors are produced when the file is written (one at a time, so a
// model is quantized without holding it all in memory). The file appears atomically: it is written beside the
// target, flushed to disk, then renamed over it.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "core/weight.h"
#include "io/gguf_file.h"

namespace mambacpp {

class GgufWriter {
 public:
  // Fills `out` (exactly the tensor's byte size) with its bytes.
  using Producer = std::function<void(uint8_t* out)>;

  // Sets (or replaces, keeping its place) a key.
  void set(const std::string& key, GgufValue value);
  void set_string(const std::string& key, const std::string& v);
  void set_u32(const std::string& key, uint32_t v);
  void set_i32(const std::string& key, int32_t v);
  void set_f32(const std::string& key, float v);
  void set_bool(const std::string& key, bool v);
  void set_strings(const std::string& key, std::vector<std::string> v);
  void set_ints(const std::string& key, GgufType type, std::vector<int64_t> v);  // an array of an integer type
  void set_floats(const std::string& key, std::vector<double> v);               // an array of f32
  bool has(const std::string& key) const;

  // A tensor of logical (PyTorch-order) shape `shape` in format `f`; rows must hold whole blocks.
  void add_tensor(const std::string& name, WeightFormat f, const std::vector<int64_t>& shape, Producer produce);

  // Writes the file atomically; throws naming `path` on any I/O error (the temporary file is removed).
  void write(const std::string& path) const;

 private:
  struct Tensor {
    std::string name;
    WeightFormat format;
    std::vector<int64_t> shape;
    uint64_t nbytes;
    Producer produce;
  };
  std::vector<std::pair<std::string, GgufValue>> kv_;
  std::vector<Tensor> tensors_;
};

}  // namespace mambacpp
