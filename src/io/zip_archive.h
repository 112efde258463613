// The central directory of a zip archive held in memory (an mmap or a buffer), validated against the buffer before
// any entry is handed out. Entries are read in place (stored) or inflated once with zlib (deflated). Zip64 records
// (what torch.save writes for archives or entries past 4 GiB) are understood. Refused, with a message naming the
// archive and the entry: encryption, multi-disk archives, compression methods other than stored and deflate, and any
// size or offset that points outside the buffer.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace mambacpp {

struct ZipEntry {
  std::string name;
  uint16_t method = 0;  // 0 = stored, 8 = deflate
  uint32_t crc32 = 0;
  uint64_t compressed_size = 0;
  uint64_t size = 0;         // uncompressed
  uint64_t data_offset = 0;  // where the entry's (compressed) bytes start in the archive
};

class ZipArchive {
 public:
  // Indexes the archive `data[0, size)` (not copied: it must outlive this object); `source` names it in messages.
  // Throws mambacpp::Error on anything malformed.
  ZipArchive(const uint8_t* data, uint64_t size, std::string source);

  const std::string& source() const { return source_; }
  // In central-directory order.
  const std::vector<ZipEntry>& entries() const { return entries_; }
  const ZipEntry* find(const std::string& name) const;

  // A stored entry's bytes, in place (nullptr for a deflated entry). Not CRC-checked: that would read every weight
  // of a large checkpoint at open time.
  const uint8_t* stored_data(const ZipEntry& e) const;
  // The entry's bytes in a new buffer: copied (stored) or inflated (deflated), and checked against its CRC-32.
  std::vector<uint8_t> extract(const ZipEntry& e) const;

 private:
  void read_directory();

  const uint8_t* data_;
  uint64_t size_;
  std::string source_;
  std::vector<ZipEntry> entries_;
  std::map<std::string, size_t> index_;  // name -> position in entries_
};

// True when `data` starts like a zip archive (a local file header, or an empty archive's end record).
bool looks_like_zip(const uint8_t* data, uint64_t size);

}  // namespace mambacpp
