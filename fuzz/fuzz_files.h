// Scratch files for fuzz targets whose parser takes a path (tokenizer.json, state files, checkpoint directories):
// the input is written to an in-memory file (memfd) or a private temporary directory, never into the tree.
#pragma once

#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>

#ifndef MAMBACPP_SOURCE_DIR
#error "MAMBACPP_SOURCE_DIR must name the source tree (fixtures are read from it)"
#endif

namespace mambacpp::fuzz {

inline std::string source_dir() { return MAMBACPP_SOURCE_DIR; }

// One in-memory file, rewritten per input; path() opens it like any file.
class MemFile {
 public:
  MemFile() : fd_(static_cast<int>(::memfd_create("mambacpp-fuzz", 0))) {
    if (fd_ < 0) throw std::runtime_error("memfd_create failed");
  }
  ~MemFile() { ::close(fd_); }
  MemFile(const MemFile&) = delete;
  MemFile& operator=(const MemFile&) = delete;
  std::string write(const uint8_t* data, size_t size) {
    if (::ftruncate(fd_, 0) != 0) throw std::runtime_error("ftruncate failed");
    size_t done = 0;
    while (done < size) {
      const ssize_t n = ::pwrite(fd_, data + done, size - done, static_cast<off_t>(done));
      if (n <= 0) throw std::runtime_error("pwrite failed");
      done += static_cast<size_t>(n);
    }
    return path();
  }
  std::string path() const { return "/proc/self/fd/" + std::to_string(fd_); }

 private:
  int fd_;
};

// A private directory under the system temp dir, removed at exit.
class ScratchDir {
 public:
  ScratchDir() {
    std::string tmpl = (std::filesystem::temp_directory_path() / "mambacpp-fuzz-XXXXXX").string();
    if (!::mkdtemp(tmpl.data())) throw std::runtime_error("mkdtemp failed");
    path_ = tmpl;
  }
  ~ScratchDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  const std::string& path() const { return path_; }
  void write(const std::string& name, const void* data, size_t size) const {
    std::ofstream out(path_ + "/" + name, std::ios::binary | std::ios::trunc);
    out.write(static_cast<const char*>(data), static_cast<std::streamsize>(size));
  }
  void remove(const std::string& name) const {
    std::error_code ec;
    std::filesystem::remove(path_ + "/" + name, ec);
  }

 private:
  std::string path_;
};

inline std::string read_all(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

}  // namespace mambacpp::fuzz
