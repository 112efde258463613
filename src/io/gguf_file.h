// A read-only GGUF file (llama.cpp's single-file model format, versions 2 and 3), mmapped, every field validated
// against the file before use: it is a parser of untrusted input. Layout, little-endian:
//   "GGUF", u32 version, u64 n_tensors, u64 n_kv,
//   n_kv x (string key, u32 value type, value)             string = u64 length + bytes (no terminator)
//   n_tensors x (string name, u32 n_dims, u64 ne[n_dims], u32 ggml type, u64 offset)
//   padding to general.alignment (default 32), then the data section; offsets are relative to it, aligned.
// ne[0] is the fastest-varying dimension (a row's length): a PyTorch [out, in] matrix is stored as ne = {in, out}.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/weight.h"
#include "io/mapped_file.h"
#include "mambacpp/tensor.h"

namespace mambacpp {

enum class GgufType : uint32_t {
  U8 = 0, I8 = 1, U16 = 2, I16 = 3, U32 = 4, I32 = 5, F32 = 6, BOOL = 7, STRING = 8, ARRAY = 9, U64 = 10, I64 = 11,
  F64 = 12,
};
const char* gguf_type_name(GgufType t);

// One metadata value. Integers and bools are held in `ints`, floats in `floats`, strings in `strings`; a scalar is
// a one-element list with is_array false. `type` is the element type (for arrays, of the elements).
struct GgufValue {
  GgufType type = GgufType::U32;
  bool is_array = false;
  std::vector<int64_t> ints;
  std::vector<double> floats;
  std::vector<std::string> strings;

  size_t size() const;
  bool is_int() const;    // an integer or bool type
  bool is_float() const;  // f32 / f64
};

// ggml's type ids of the tensor types this project reads (others are refused, named by gguf_ggml_type_name).
enum : uint32_t {
  kGgmlF32 = 0, kGgmlF16 = 1, kGgmlQ4_0 = 2, kGgmlQ5_0 = 6, kGgmlQ5_1 = 7, kGgmlQ8_0 = 8, kGgmlQ4_K = 12,
  kGgmlQ5_K = 13, kGgmlQ6_K = 14, kGgmlBF16 = 30,
};
const char* gguf_ggml_type_name(uint32_t ggml_type);  // "q4_1", "iq2_xs", ... or "unknown"
std::optional<WeightFormat> weight_format_of_ggml(uint32_t ggml_type);
uint32_t ggml_type_of(WeightFormat f);  // throws for FP8

struct GgufTensor {
  std::string name;
  WeightFormat format = WeightFormat::F32;
  int n_dims = 0;
  std::array<int64_t, 4> ne{};  // GGUF order: ne[0] is the row length
  uint64_t offset = 0;          // in the data section
  uint64_t nbytes = 0;
  const uint8_t* data = nullptr;  // into the mapping (read-only)

  // The logical (PyTorch-order) shape: ne reversed.
  std::vector<int64_t> shape() const;
  std::string shape_string() const;  // "[out, in]"
};

// Limits a well-formed file stays far inside; they bound the parser's memory and time on a hostile one.
constexpr uint64_t kGgufMaxString = uint64_t(1) << 24;      // a key, a tensor name or a string value (chat templates)
constexpr uint64_t kGgufMaxName = 256;                      // tensor names (ggml allows 63)
constexpr uint64_t kGgufMaxAlignment = uint64_t(1) << 16;

class GgufFile {
 public:
  // Maps `path` and validates it; throws mambacpp::Error naming the file and the key or tensor on any defect.
  explicit GgufFile(const std::string& path);
  // Validates bytes held in memory (tests, fuzzing); `source` names them in messages.
  static std::unique_ptr<GgufFile> from_bytes(std::vector<uint8_t> bytes, const std::string& source = "<memory>");

  GgufFile(const GgufFile&) = delete;
  GgufFile& operator=(const GgufFile&) = delete;

  const std::string& path() const { return path_; }
  uint32_t version() const { return version_; }
  uint64_t alignment() const { return alignment_; }
  // Keys in file order and the values by key.
  const std::vector<std::string>& keys() const { return key_order_; }
  const GgufValue* find(const std::string& key) const;
  // Typed getters: throw naming the key when it is absent (without a fallback) or of another type.
  std::string get_string(const std::string& key) const;
  std::string get_string(const std::string& key, const std::string& fallback) const;
  int64_t get_int(const std::string& key) const;
  int64_t get_int(const std::string& key, int64_t fallback) const;
  double get_float(const std::string& key, double fallback) const;  // accepts integer values too
  bool get_bool(const std::string& key, bool fallback) const;

  // Tensors in file order, and by name.
  const std::vector<GgufTensor>& tensors() const { return tensors_; }
  const GgufTensor* tensor(const std::string& name) const;

 private:
  GgufFile() = default;
  void parse();

  std::string path_;
  std::unique_ptr<MappedFile> map_;
  std::vector<uint8_t> owned_;
  const uint8_t* base_ = nullptr;
  uint64_t size_ = 0;
  uint32_t version_ = 0;
  uint64_t alignment_ = 32;
  std::vector<std::string> key_order_;
  std::map<std::string, GgufValue> kv_;
  std::vector<GgufTensor> tensors_;
  std::map<std::string, size_t> tensor_index_;
};

}  // namespace mambacpp
