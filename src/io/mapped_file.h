// A whole file mapped read-only (POSIX mmap), unmapped when the object dies. Empty files map to no memory.
#pragma once

#include <cstdint>
#include <string>

namespace mambacpp {

class MappedFile {
 public:
  // Throws mambacpp::Error naming `path` when it cannot be opened, is not a regular file, or cannot be mapped.
  explicit MappedFile(const std::string& path);
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;
  ~MappedFile();

  const std::string& path() const { return path_; }
  const uint8_t* data() const { return data_; }
  uint64_t size() const { return size_; }

 private:
  std::string path_;
  const uint8_t* data_ = nullptr;
  uint64_t size_ = 0;
};

}  // namespace mambacpp
