// A file replaced whole or not at all. Everything mambacpp writes (state files, `logits --out`, GGUF output, the
// prefix cache's files) goes through here: the bytes go to a temporary file in the target's directory, which is
// flushed and fsynced, renamed over the target, and the directory is fsynced so that the rename survives a power
// loss. A failure at any step (a full disk, a file-size limit, no permission, a kill) leaves the previous file byte
// for byte; the error names the file, the step and the errno reason (ENOSPC, EFBIG, EACCES...).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace mambacpp {

class AtomicFile {
 public:
  // Creates the temporary file next to `path`; `what` names the file's role in messages ("state file").
  AtomicFile(const std::string& path, std::string what);
  // Without commit() the temporary file is removed and the target is left as it was.
  ~AtomicFile();
  AtomicFile(const AtomicFile&) = delete;
  AtomicFile& operator=(const AtomicFile&) = delete;

  void write(const void* data, size_t n);
  void write(std::string_view bytes) { write(bytes.data(), bytes.size()); }
  // Writes at `offset` of the temporary file (pwrite), for files filled out of order; bytes never written read as
  // zeros. Not counted in bytes_written().
  void write_at(uint64_t offset, const void* data, size_t n);
  // Flushes, fsyncs, renames over the target and fsyncs its directory. Once only.
  void commit();
  // Removes the temporary file now (commit() can no longer be called); never throws.
  void abandon() noexcept;

  const std::string& path() const { return path_; }
  const std::string& temp_path() const { return tmp_; }
  uint64_t bytes_written() const { return written_; }

 private:
  void flush_buffer();
  void write_fd(const char* p, size_t n);
  [[noreturn]] void fail_at(const std::string& step, int err);

  std::string path_;  // the target (a symbolic link's destination when the target is one)
  std::string tmp_;
  std::string what_;
  bool target_existed_ = false;
  bool replaced_ = false;  // renamed over the target: an error past this point cannot restore the previous file
  int fd_ = -1;
  std::vector<char> buf_;  // small writes are gathered here
  uint64_t written_ = 0;  // bytes given to write()
  uint64_t on_disk_ = 0;  // bytes that reached the temporary file
};

// One whole buffer as `path`, through an AtomicFile.
void write_file_atomically(const std::string& path, std::string_view bytes, const std::string& what);

// "ENOSPC" for ENOSPC, "errno 1234" for a number without a name.
std::string errno_name(int err);

}  // namespace mambacpp
