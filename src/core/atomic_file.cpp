#include "core/atomic_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <filesystem>

#include "mambacpp/error.h"

namespace mambacpp {

namespace {

constexpr size_t kBufferBytes = size_t{1} << 20;  // writes smaller than this are gathered into one write(2)

std::atomic<uint64_t> g_temp_counter{0};

std::string directory_of(const std::string& path) {
  const std::filesystem::path p(path);
  const std::filesystem::path dir = p.parent_path();
  return dir.empty() ? std::string(".") : dir.string();
}

}  // namespace

std::string errno_name(int err) {
#if defined(__GLIBC__) && (__GLIBC__ > 2 || (__GLIBC__ == 2 && __GLIBC_MINOR__ >= 32))
  if (const char* name = strerrorname_np(err)) return name;
#endif
  return "errno " + std::to_string(err);
}

AtomicFile::AtomicFile(const std::string& path, std::string what) : path_(path), what_(std::move(what)) {
  if (path.empty()) fail(what_, ": the output path is empty");
  struct stat st {};
  if (::lstat(path.c_str(), &st) == 0 && S_ISLNK(st.st_mode)) {
    // Replace the file the link points to, not the link (as an editor saving through a link does).
    std::error_code ec;
    const auto target = std::filesystem::weakly_canonical(path, ec);
    if (!ec) path_ = target.string();
  }
  mode_t mode = 0666;  // umask applies, as for any new file
  if (::stat(path_.c_str(), &st) == 0) {
    if (S_ISDIR(st.st_mode)) fail("cannot write ", what_, " '", path_, "': it is a directory");
    if (!S_ISREG(st.st_mode))
      fail("cannot write ", what_, " '", path_, "': it exists and is not a regular file (a device or a pipe cannot be ",
           "replaced atomically)");
    target_existed_ = true;
    mode = st.st_mode & 07777;  // the replacement keeps the permissions of the file it replaces
  }
  const std::string dir = directory_of(path_);
  const std::string base = std::filesystem::path(path_).filename().string();
  for (int attempt = 0;; ++attempt) {
    tmp_ = dir + "/." + base + ".tmp-" + std::to_string(::getpid()) + "-" + std::to_string(g_temp_counter++);
    fd_ = ::open(tmp_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, mode);
    if (fd_ >= 0) break;
    const int err = errno;
    if (err == EEXIST && attempt < 100) continue;  // a leftover of a killed process with the same pid
    const std::string tmp = std::move(tmp_);
    tmp_.clear();
    fail_at("cannot create a temporary file in '" + dir + "' (" + tmp + ")", err);
  }
  if (target_existed_) {
    // The umask may have narrowed the mode at creation; should this fail, the mode only stays narrower.
    const int narrowed = ::fchmod(fd_, mode);
    (void)narrowed;
  }
  buf_.reserve(kBufferBytes);
}

AtomicFile::~AtomicFile() { abandon(); }

void AtomicFile::abandon() noexcept {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
  if (!tmp_.empty()) ::unlink(tmp_.c_str());
  tmp_.clear();
  buf_.clear();
}

void AtomicFile::fail_at(const std::string& step, int err) {
  const std::string reason = std::string(std::strerror(err)) + " (" + errno_name(err) + ")";
  const bool existed = target_existed_;
  const bool replaced = replaced_;
  abandon();
  fail("cannot write ", what_, " '", path_, "': ", step, ": ", reason,
       replaced ? "" : existed ? "; the previous file is left as it was" : "; no file was written");
}

void AtomicFile::write_fd(const char* p, size_t n) {
  while (n > 0) {
    const ssize_t k = ::write(fd_, p, n);
    if (k < 0) {
      if (errno == EINTR) continue;
      fail_at("writing at byte " + std::to_string(on_disk_), errno);
    }
    if (k == 0) fail_at("writing", EIO);
    p += k;
    n -= static_cast<size_t>(k);
    on_disk_ += static_cast<uint64_t>(k);
  }
}

void AtomicFile::flush_buffer() {
  if (buf_.empty()) return;
  write_fd(buf_.data(), buf_.size());
  buf_.clear();
}

void AtomicFile::write(const void* data, size_t n) {
  if (fd_ < 0) fail(what_, " '", path_, "': write after the file was committed or abandoned");
  const char* p = static_cast<const char*>(data);
  written_ += n;
  if (buf_.size() + n <= kBufferBytes) {
    buf_.insert(buf_.end(), p, p + n);
    return;
  }
  flush_buffer();
  write_fd(p, n);
}

void AtomicFile::write_at(uint64_t offset, const void* data, size_t n) {
  if (fd_ < 0) fail(what_, " '", path_, "': write after the file was committed or abandoned");
  flush_buffer();
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    const ssize_t k = ::pwrite(fd_, p, n, static_cast<off_t>(offset));
    if (k < 0) {
      if (errno == EINTR) continue;
      fail_at("writing at byte " + std::to_string(offset), errno);
    }
    if (k == 0) fail_at("writing", EIO);
    p += k;
    n -= static_cast<size_t>(k);
    offset += static_cast<uint64_t>(k);
  }
}

void AtomicFile::commit() {
  if (fd_ < 0) fail(what_, " '", path_, "': commit after the file was committed or abandoned");
  flush_buffer();
  while (::fsync(fd_) != 0) {
    if (errno != EINTR) fail_at("fsync", errno);
  }
  const int fd = fd_;
  fd_ = -1;
  if (::close(fd) != 0 && errno != EINTR) fail_at("close", errno);  // NFS reports write errors here
  if (::rename(tmp_.c_str(), path_.c_str()) != 0) fail_at("renaming " + tmp_ + " over it", errno);
  tmp_.clear();  // the temporary file is the target now
  replaced_ = true;
  // The rename is durable once the directory entry is: without this a power loss may bring the old file back.
  const std::string dir = directory_of(path_);
  const int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd < 0) fail_at("the file was replaced, but opening its directory to fsync it failed", errno);
  const int r = ::fsync(dfd);
  const int err = errno;
  ::close(dfd);
  if (r != 0 && err != EINVAL)  // EINVAL: a file system that cannot sync directories (nothing to wait for)
    fail_at("the file was replaced, but the fsync of its directory failed", err);
}

void write_file_atomically(const std::string& path, std::string_view bytes, const std::string& what) {
  AtomicFile f(path, what);
  f.write(bytes);
  f.commit();
}

}  // namespace mambacpp
