// A read-only safetensors file: mmapped (or held in memory), its header validated strictly before any tensor is
// handed out. Layout: u64 little-endian header length N, N bytes of JSON {name: {dtype, shape, data_offsets}},
// then the data section; data_offsets are [begin, end) byte offsets into the data section.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "io/mapped_file.h"
#include "mambacpp/dtype.h"
#include "mambacpp/tensor.h"

namespace mambacpp {

struct SafetensorInfo {
  std::string name;
  DType dtype = DType::F32;   // U8 for F8_E4M3 bytes
  bool fp8_e4m3 = false;      // stored as "F8_E4M3" (one e4m3fn byte per element)
  std::vector<int64_t> shape;  // may have any rank; view() supports up to 4
  uint64_t begin = 0;          // byte range [begin, end) inside the data section
  uint64_t end = 0;
  uint64_t nbytes() const { return end - begin; }
  int64_t copy = -1;  // index into the aligned copies when the bytes in the file are not aligned to the dtype
};

// Header lengths above this are rejected as corrupt (the reference implementation uses the same bound).
constexpr uint64_t kMaxSafetensorsHeader = 100'000'000;

class SafetensorsFile {
 public:
  // Maps `path` read-only and validates it; throws mambacpp::Error naming the file (and tensor) on any defect.
  explicit SafetensorsFile(const std::string& path);
  // Validates a copy held in memory (tests, fuzzing); `source` names it in messages.
  static SafetensorsFile from_bytes(std::vector<uint8_t> bytes, const std::string& source = "<memory>");

  // Moving keeps base_ valid: the mapping and a moved vector's buffer stay where they are.
  SafetensorsFile(SafetensorsFile&& other) noexcept = default;
  SafetensorsFile& operator=(SafetensorsFile&& other) noexcept = default;
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;
  ~SafetensorsFile() = default;

  const std::string& path() const { return path_; }
  uint64_t file_size() const { return size_; }
  // Every tensor, sorted by name.
  const std::vector<SafetensorInfo>& tensors() const { return tensors_; }
  // The tensor called `name`, or nullptr.
  const SafetensorInfo* find(const std::string& name) const;
  // A CPU view whose data points into the mapping (valid while this object lives; read-only memory: never write
  // through it). Throws for more than 4 dimensions.
  TensorView view(const SafetensorInfo& info) const;
  TensorView view(const std::string& name) const;  // throws when absent
  // The optional "__metadata__" string map.
  const std::map<std::string, std::string>& metadata() const { return metadata_; }

 private:
  SafetensorsFile() = default;
  void parse_header();

  std::string path_;
  std::unique_ptr<MappedFile> map_;  // the file, or
  std::vector<uint8_t> owned_;       // its bytes in memory (from_bytes)
  const uint8_t* base_ = nullptr;    // the whole file: into map_ or owned_
  uint64_t size_ = 0;
  uint64_t data_start_ = 0;    // 8 + header length
  std::vector<SafetensorInfo> tensors_;
  // The format allows any offset, kernels read whole elements: a tensor whose bytes are not aligned to its dtype is
  // copied once into 8-byte-aligned memory (each buffer stays where it is when the object moves, so views stay valid).
  std::vector<std::unique_ptr<uint64_t[]>> aligned_copies_;
  std::map<std::string, std::string> metadata_;
};

// One tensor for write_safetensors_file: its safetensors dtype ("F32", "BF16", "F8_E4M3", ...), shape and bytes
// (read while the file is written, so they must stay valid until then).
struct SafetensorsOut {
  std::string name;
  std::string dtype;
  std::vector<int64_t> shape;
  const void* data = nullptr;
  uint64_t nbytes = 0;
};
// The safetensors spelling of a dtype (F32, F16, BF16, F64, I32, I64, U8).
const char* safetensors_dtype_name(DType t);
// Writes `tensors` (stored in name order, 8-byte aligned) and `metadata` as a safetensors file, whole or not at all
// (core/atomic_file.h). Throws naming the tensor when its byte count is not dtype size x shape, or a name repeats.
void write_safetensors_file(const std::string& path, std::vector<SafetensorsOut> tensors,
                            const std::map<std::string, std::string>& metadata = {});

}  // namespace mambacpp
