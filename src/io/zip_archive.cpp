// Zip reading from the end: the end-of-central-directory record (and its zip64 form), then each central-directory
// entry, each checked against its local header. All reads go through `Bytes`, which refuses any range outside the
// buffer, so a hostile archive can only produce an error.
#include "io/zip_archive.h"

#include <zlib.h>

#include <algorithm>
#include <cstring>
#include <limits>

#include "mambacpp/error.h"

namespace mambacpp {
namespace {

constexpr uint32_t kLocalHeader = 0x04034b50;
constexpr uint32_t kCentralHeader = 0x02014b50;
constexpr uint32_t kEndRecord = 0x06054b50;
constexpr uint32_t kZip64EndRecord = 0x06064b50;
constexpr uint32_t kZip64Locator = 0x07064b50;
constexpr uint64_t kEndRecordSize = 22;
constexpr uint64_t kMaxCommentSize = 0xffff;
// Deflate cannot expand data by more than about 1032:1; an entry claiming more is corrupt (or a zip bomb).
constexpr uint64_t kMaxDeflateRatio = 1032;

// Bounds-checked little-endian reads of a buffer; `what` names the structure in messages.
class Bytes {
 public:
  Bytes(const uint8_t* data, uint64_t size, const std::string& source) : data_(data), size_(size), source_(source) {}

  void need(uint64_t offset, uint64_t n, const char* what) const {
    if (offset > size_ || n > size_ - offset)
      fail(source_, ": zip ", what, " at byte ", offset, " (", n, " bytes) runs past the end of the file (", size_,
           " bytes)");
  }
  uint16_t u16(uint64_t at) const { return static_cast<uint16_t>(data_[at] | data_[at + 1] << 8); }
  uint32_t u32(uint64_t at) const { return u16(at) | static_cast<uint32_t>(u16(at + 2)) << 16; }
  uint64_t u64(uint64_t at) const { return u32(at) | static_cast<uint64_t>(u32(at + 4)) << 32; }
  const uint8_t* at(uint64_t offset) const { return data_ + offset; }

 private:
  const uint8_t* data_;
  uint64_t size_;
  const std::string& source_;
};

std::string printable(const std::string& name) {
  std::string out;
  for (unsigned char c : name.substr(0, 200)) out += (c >= 0x20 && c < 0x7f) ? static_cast<char>(c) : '?';
  return name.size() > 200 ? out + "..." : out;
}

}  // namespace

bool looks_like_zip(const uint8_t* data, uint64_t size) {
  if (size < 4) return false;
  const uint32_t sig = data[0] | data[1] << 8 | data[2] << 16 | static_cast<uint32_t>(data[3]) << 24;
  return sig == kLocalHeader || sig == kEndRecord;
}

ZipArchive::ZipArchive(const uint8_t* data, uint64_t size, std::string source)
    : data_(data), size_(size), source_(std::move(source)) {
  read_directory();
}

void ZipArchive::read_directory() {
  const Bytes b(data_, size_, source_);
  if (size_ < kEndRecordSize)
    fail(source_, ": ", size_, " bytes is too short for a zip archive (its end record alone is 22 bytes)");
  // The end record is the last thing in the file, followed only by its comment.
  uint64_t end = std::numeric_limits<uint64_t>::max();
  const uint64_t lowest = size_ - kEndRecordSize > kMaxCommentSize ? size_ - kEndRecordSize - kMaxCommentSize : 0;
  for (uint64_t p = size_ - kEndRecordSize + 1; p-- > lowest;) {
    if (b.u32(p) == kEndRecord && p + kEndRecordSize + b.u16(p + 20) == size_) {
      end = p;
      break;
    }
  }
  if (end == std::numeric_limits<uint64_t>::max())
    fail(source_, ": no zip end-of-central-directory record found: not a zip archive, or truncated");

  uint64_t count = b.u16(end + 10);
  uint64_t dir_size = b.u32(end + 12);
  uint64_t dir_offset = b.u32(end + 16);
  if (b.u16(end + 4) != 0 || b.u16(end + 6) != 0 || b.u16(end + 8) != b.u16(end + 10))
    fail(source_, ": multi-disk zip archives are not supported");
  // Zip64: a locator 20 bytes before the end record points at the zip64 end record with 64-bit fields.
  if (end >= 20 && b.u32(end - 20) == kZip64Locator) {
    const uint64_t rec = b.u64(end - 20 + 8);
    if (b.u32(end - 20 + 4) != 0 || b.u32(end - 20 + 16) > 1)
      fail(source_, ": multi-disk zip archives are not supported");
    b.need(rec, 56, "zip64 end record");
    if (rec > end - 20) fail(source_, ": zip64 end record offset ", rec, " lies after its locator");
    if (b.u32(rec) != kZip64EndRecord)
      fail(source_, ": zip64 locator points at byte ", rec, ", which holds no zip64 end record");
    if (b.u32(rec + 16) != 0 || b.u32(rec + 20) != 0 || b.u64(rec + 24) != b.u64(rec + 32))
      fail(source_, ": multi-disk zip archives are not supported");
    count = b.u64(rec + 32);
    dir_size = b.u64(rec + 40);
    dir_offset = b.u64(rec + 48);
  } else if (count == 0xffff || dir_size == 0xffffffffu || dir_offset == 0xffffffffu) {
    fail(source_, ": the end record defers to a zip64 record, but there is no zip64 locator");
  }
  b.need(dir_offset, dir_size, "central directory");
  if (count > dir_size / 46)
    fail(source_, ": central directory of ", dir_size, " bytes cannot hold ", count,
         " entries (46 bytes each at least)");

  uint64_t p = dir_offset;
  const uint64_t dir_end = dir_offset + dir_size;
  entries_.reserve(count);
  for (uint64_t i = 0; i < count; ++i) {
    if (p > dir_end || dir_end - p < 46) fail(source_, ": central directory entry ", i, " runs past the directory");
    if (b.u32(p) != kCentralHeader)
      fail(source_, ": central directory entry ", i, " at byte ", p, " has a bad signature");
    const uint16_t flags = b.u16(p + 8);
    ZipEntry e;
    e.method = b.u16(p + 10);
    e.crc32 = b.u32(p + 16);
    e.compressed_size = b.u32(p + 20);
    e.size = b.u32(p + 24);
    const uint64_t name_len = b.u16(p + 28), extra_len = b.u16(p + 30), comment_len = b.u16(p + 32);
    uint64_t disk = b.u16(p + 34);
    uint64_t local = b.u32(p + 42);
    const uint64_t var_len = name_len + extra_len + comment_len;
    if (dir_end - p - 46 < var_len) fail(source_, ": central directory entry ", i, " runs past the directory");
    e.name.assign(reinterpret_cast<const char*>(b.at(p + 46)), name_len);
    // The zip64 extra field holds, in this order, whichever of the 32-bit fields are saturated.
    for (uint64_t x = p + 46 + name_len, x_end = x + extra_len; x + 4 <= x_end;) {
      const uint16_t id = b.u16(x), len = b.u16(x + 2);
      if (len > x_end - x - 4) fail(source_, ": entry '", printable(e.name), "': extra field runs past its end");
      if (id == 0x0001) {
        uint64_t q = x + 4;
        const uint64_t q_end = q + len;
        auto take64 = [&](uint64_t& field) {
          if (q + 8 > q_end) fail(source_, ": entry '", printable(e.name), "': zip64 extra field too short");
          field = b.u64(q);
          q += 8;
        };
        if (e.size == 0xffffffffu) take64(e.size);
        if (e.compressed_size == 0xffffffffu) take64(e.compressed_size);
        if (local == 0xffffffffu) take64(local);
        if (disk == 0xffff) {
          if (q + 4 > q_end) fail(source_, ": entry '", printable(e.name), "': zip64 extra field too short");
          disk = b.u32(q);
        }
      }
      x += 4 + len;
    }
    p += 46 + var_len;

    const std::string shown = printable(e.name);
    if (disk != 0) fail(source_, ": entry '", shown, "' is on disk ", disk, "; multi-disk archives are not supported");
    if (flags & 0x1) fail(source_, ": entry '", shown, "' is encrypted; encrypted archives are not supported");
    if (e.method != 0 && e.method != 8)
      fail(source_, ": entry '", shown, "' uses compression method ", e.method,
           "; supported: 0 (stored) and 8 (deflate)");
    if (e.method == 0 && e.compressed_size != e.size)
      fail(source_, ": stored entry '", shown, "' has compressed size ", e.compressed_size, " != size ", e.size);
    if (e.method == 8 && e.size / kMaxDeflateRatio > e.compressed_size + 1)
      fail(source_, ": deflated entry '", shown, "' claims ", e.size, " bytes from ", e.compressed_size,
           " compressed: beyond what deflate can produce");
    // The local header repeats the name; its extra field (torch.save pads with one for alignment) may differ.
    b.need(local, 30, "local file header");
    if (b.u32(local) != kLocalHeader) fail(source_, ": entry '", shown, "': no local file header at byte ", local);
    const uint64_t local_name = b.u16(local + 26), local_extra = b.u16(local + 28);
    b.need(local + 30, local_name + local_extra, "local file header");
    if (local_name != name_len || std::memcmp(b.at(local + 30), e.name.data(), name_len) != 0)
      fail(source_, ": entry '", shown, "': its local header names a different file");
    e.data_offset = local + 30 + local_name + local_extra;
    b.need(e.data_offset, e.compressed_size, ("data of entry '" + shown + "'").c_str());
    if (!index_.emplace(e.name, entries_.size()).second) fail(source_, ": entry '", shown, "' appears twice");
    entries_.push_back(std::move(e));
  }
}

const ZipEntry* ZipArchive::find(const std::string& name) const {
  auto it = index_.find(name);
  return it == index_.end() ? nullptr : &entries_[it->second];
}

const uint8_t* ZipArchive::stored_data(const ZipEntry& e) const {
  return e.method == 0 ? data_ + e.data_offset : nullptr;
}

std::vector<uint8_t> ZipArchive::extract(const ZipEntry& e) const {
  std::vector<uint8_t> out;
  const std::string shown = printable(e.name);
  if (e.size > std::numeric_limits<size_t>::max() / 2) fail(source_, ": entry '", shown, "' is too large");
  out.resize(static_cast<size_t>(e.size));
  if (e.method == 0) {
    if (e.size) std::memcpy(out.data(), data_ + e.data_offset, out.size());
  } else {
    z_stream z{};
    if (inflateInit2(&z, -MAX_WBITS) != Z_OK) fail(source_, ": zlib inflateInit failed for entry '", shown, "'");
    const uint8_t* in = data_ + e.data_offset;
    uint64_t in_left = e.compressed_size, out_done = 0;
    int rc = Z_OK;
    // zlib counts in 32-bit units: feed and drain in pieces of at most 1 GiB.
    constexpr uint64_t kPiece = 1ull << 30;
    while (rc == Z_OK) {
      if (z.avail_in == 0 && in_left > 0) {
        z.next_in = const_cast<Bytef*>(in);
        z.avail_in = static_cast<uInt>(std::min(in_left, kPiece));
        in += z.avail_in;
        in_left -= z.avail_in;
      }
      // One byte of room past the declared size, so that an entry inflating to more is noticed.
      uint8_t overflow = 0;
      const bool full = out_done == e.size;
      z.next_out = full ? &overflow : out.data() + out_done;
      z.avail_out = full ? 1 : static_cast<uInt>(std::min(e.size - out_done, kPiece));
      const uInt before = z.avail_out;
      rc = inflate(&z, Z_NO_FLUSH);
      const uInt produced = before - z.avail_out;
      if (full && produced > 0) {
        inflateEnd(&z);
        fail(source_, ": deflated entry '", shown, "' inflates to more than the ", e.size, " bytes it declares");
      }
      out_done += produced;
      if (rc == Z_BUF_ERROR && z.avail_in == 0 && in_left == 0) break;  // input exhausted before the end
      if (rc == Z_BUF_ERROR) rc = Z_OK;  // no progress possible in this call: more room or input comes next
    }
    inflateEnd(&z);
    if (rc != Z_STREAM_END)
      fail(source_, ": deflated entry '", shown,
           "' is corrupt (zlib: ", rc == Z_BUF_ERROR ? "the compressed data ends early" : "invalid compressed data",
           ")");
    if (out_done != e.size)
      fail(source_, ": deflated entry '", shown, "' inflates to ", out_done, " bytes, but declares ", e.size);
  }
#ifndef FUZZING_BUILD_MODE_UNSAFE_FOR_PRODUCTION  // fuzzing: let mutations past the checksum reach the parsers
  uLong crc = crc32(0L, Z_NULL, 0);
  for (uint64_t at = 0; at < out.size(); at += 1u << 30)
    crc = crc32(crc, out.data() + at, static_cast<uInt>(std::min<uint64_t>(out.size() - at, 1u << 30)));
  if (static_cast<uint32_t>(crc) != e.crc32)
    fail(source_, ": entry '", shown, "' fails its CRC-32 check (stored ", e.crc32, ", computed ",
         static_cast<uint32_t>(crc), "): corrupt file");
#endif
  return out;
}

}  // namespace mambacpp
