#include "engine/prefix_cache.h"

#include <algorithm>
#include <cctype>
#include <cinttypes>
#include <cstdio>
#include <filesystem>
#include <system_error>

#include "core/file_bytes.h"
#include "core/splitmix.h"
#include "mambacpp/error.h"

namespace mambacpp {

namespace {

namespace fs = std::filesystem;

uint64_t fnv1a64(std::string_view bytes) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char c : bytes) h = (h ^ c) * 0x100000001b3ull;
  return h;
}

std::string hex16(uint64_t v) {
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016" PRIx64, v);
  return buf;
}

// "<tokens hash>-<checksum>.state", both 16 hex digits.
bool parse_name(const std::string& name, uint64_t* hash, uint64_t* checksum) {
  if (name.size() != 16 + 1 + 16 + 6 || name[16] != '-' || name.substr(33) != ".state") return false;
  for (size_t i = 0; i < 33; ++i)
    if (i != 16 && !std::isxdigit(static_cast<unsigned char>(name[i]))) return false;
  *hash = std::stoull(name.substr(0, 16), nullptr, 16);
  *checksum = std::stoull(name.substr(17, 16), nullptr, 16);
  return true;
}

void warn(const std::string& what) { std::fprintf(stderr, "mambacpp: prefix cache: %s\n", what.c_str()); }

}  // namespace

std::vector<uint64_t> PrefixCache::prefix_hashes(std::span<const int32_t> tokens) {
  std::vector<uint64_t> out(tokens.size());
  uint64_t h = 0x6d616d6261637070ull;
  for (size_t i = 0; i < tokens.size(); ++i) {
    h = splitmix64(h ^ static_cast<uint32_t>(tokens[i]));
    out[i] = h;
  }
  return out;
}

PrefixCache::Lru::iterator PrefixCache::find(std::span<const int32_t> tokens, uint64_t hash) {
  auto [lo, hi] = by_hash_.equal_range(hash);
  for (auto it = lo; it != hi; ++it)  // a hash collision must not pass for a hit: compare the tokens
    if (std::ranges::equal(it->second->tokens, tokens)) return it->second;
  return lru_.end();
}

PrefixCache::Hit PrefixCache::lookup(std::span<const int32_t> tokens, int64_t max_length) {
  const int64_t n = std::min<int64_t>(max_length, static_cast<int64_t>(tokens.size()));
  if (n <= 0 || (lru_.empty() && disk_lru_.empty())) return {};
  const std::vector<uint64_t> hashes = prefix_hashes(tokens.first(static_cast<size_t>(n)));
  for (int64_t len = n; len >= 1; --len) {
    const uint64_t h = hashes[static_cast<size_t>(len - 1)];
    const auto prefix = tokens.first(static_cast<size_t>(len));
    if (by_hash_.count(h)) {
      if (auto it = find(prefix, h); it != lru_.end()) {
        lru_.splice(lru_.begin(), lru_, it);
        return {&lru_.front().snapshot, len};
      }
    }
    if (!codec_ || !disk_by_hash_.count(h)) continue;
    auto d = disk_find(prefix, h);
    if (d == disk_lru_.end()) continue;
    std::optional<SlotSnapshot> snap = disk_read(d);  // the entry is gone when this fails
    if (!snap) continue;
    disk_lru_.splice(disk_lru_.begin(), disk_lru_, d);
    if (insert_memory(std::vector<int32_t>(prefix.begin(), prefix.end()), h, std::move(*snap)))
      return {&lru_.front().snapshot, len};
  }
  return {};
}

bool PrefixCache::contains(std::span<const int32_t> tokens) const {
  if (tokens.empty()) return false;
  const uint64_t h = prefix_hashes(tokens).back();
  auto [lo, hi] = by_hash_.equal_range(h);
  for (auto it = lo; it != hi; ++it)
    if (std::ranges::equal(it->second->tokens, tokens)) return true;
  return false;
}

void PrefixCache::erase(Lru::iterator it) {
  auto [lo, hi] = by_hash_.equal_range(it->hash);
  for (auto m = lo; m != hi; ++m)
    if (m->second == it) {
      by_hash_.erase(m);
      break;
    }
  bytes_ -= static_cast<int64_t>(it->snapshot.bytes());
  lru_.erase(it);
}

bool PrefixCache::insert(std::vector<int32_t> tokens, SlotSnapshot snapshot) {
  if (tokens.empty()) return false;
  const uint64_t h = prefix_hashes(tokens).back();
  if (codec_ && disk_find(tokens, h) == disk_lru_.end()) disk_write(tokens, h, snapshot);
  return insert_memory(std::move(tokens), h, std::move(snapshot));
}

bool PrefixCache::insert_memory(std::vector<int32_t> tokens, uint64_t h, SlotSnapshot snapshot) {
  if (auto it = find(tokens, h); it != lru_.end()) erase(it);
  const int64_t size = static_cast<int64_t>(snapshot.bytes());
  if (size > budget_) return false;
  while (bytes_ + size > budget_) erase(std::prev(lru_.end()));
  lru_.push_front(Entry{std::move(tokens), h, std::move(snapshot)});
  by_hash_.emplace(h, lru_.begin());
  bytes_ += size;
  return true;
}

void PrefixCache::clear() {
  by_hash_.clear();
  lru_.clear();
  bytes_ = 0;
}

// ---- The disk tier --------------------------------------------------------------------------------------------

PrefixCache::DiskLru::iterator PrefixCache::disk_find(std::span<const int32_t> tokens, uint64_t hash) {
  auto [lo, hi] = disk_by_hash_.equal_range(hash);
  for (auto it = lo; it != hi; ++it)
    if (std::ranges::equal(it->second->tokens, tokens)) return it->second;
  return disk_lru_.end();
}

void PrefixCache::disk_erase(DiskLru::iterator it, bool remove_file) {
  auto [lo, hi] = disk_by_hash_.equal_range(it->hash);
  for (auto m = lo; m != hi; ++m)
    if (m->second == it) {
      disk_by_hash_.erase(m);
      break;
    }
  if (remove_file) {
    std::error_code ec;
    fs::remove(it->path, ec);
  }
  disk_bytes_ -= it->bytes;
  disk_lru_.erase(it);
}

void PrefixCache::disk_write(const std::vector<int32_t>& tokens, uint64_t hash, const SlotSnapshot& snapshot) {
  const std::string pending = disk_dir_ + "/" + hex16(hash) + ".state.new";
  try {
    // The state file goes in whole (atomic, fsynced); its checksum then names it, so that a file is never found under
    // a name that does not describe its bytes.
    codec_->save_snapshot(snapshot, pending, tokens);
    const std::string bytes = read_file_bytes(pending, "prefix cache file", UINT64_MAX);
    DiskEntry e{tokens, hash, "", fnv1a64(bytes), static_cast<int64_t>(bytes.size())};
    e.path = disk_dir_ + "/" + hex16(hash) + "-" + hex16(e.checksum) + ".state";
    std::error_code ec;
    fs::rename(pending, e.path, ec);
    if (ec) fail("cannot rename '", pending, "' to '", e.path, "': ", ec.message());
    if (auto old = disk_find(tokens, hash); old != disk_lru_.end()) disk_erase(old, old->path != e.path);
    disk_lru_.push_front(std::move(e));
    disk_by_hash_.emplace(hash, disk_lru_.begin());
    disk_bytes_ += disk_lru_.front().bytes;
    while (disk_bytes_ > disk_budget_ && !disk_lru_.empty()) disk_erase(std::prev(disk_lru_.end()), true);
  } catch (const std::exception& e) {  // a cache that cannot write (a full disk) must not fail the request
    std::error_code ec;
    fs::remove(pending, ec);
    warn(std::string("not kept on disk: ") + e.what());
  }
}

std::optional<SlotSnapshot> PrefixCache::disk_read(DiskLru::iterator it) {
  try {
    const std::string bytes = read_file_bytes(it->path, "prefix cache file", UINT64_MAX);
    if (fnv1a64(bytes) != it->checksum)
      fail("'", it->path, "': its checksum is ", hex16(fnv1a64(bytes)), ", its name says ", hex16(it->checksum));
    std::vector<int32_t> tokens;
    SlotSnapshot snap = codec_->load_snapshot(it->path, &tokens);
    if (tokens != it->tokens) fail("'", it->path, "' stands for other tokens than its index entry");
    return snap;
  } catch (const std::exception& e) {
    warn(std::string("skipping a cached state (deleted): ") + e.what());
    disk_erase(it, true);
    return std::nullopt;
  }
}

void PrefixCache::enable_disk(const std::string& dir, int64_t budget_bytes, const StateCache& codec) {
  if (budget_bytes <= 0) fail("prefix cache: the disk budget must be positive, found ", budget_bytes, " bytes");
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec || !fs::is_directory(dir)) fail("prefix cache: cannot use '", dir, "' as its directory: ", ec.message());
  codec_ = &codec;
  disk_dir_ = dir;
  disk_budget_ = budget_bytes;
  struct Found {
    fs::file_time_type written;
    DiskEntry entry;
  };
  std::vector<Found> found;
  for (const auto& f : fs::directory_iterator(dir, ec)) {
    const std::string name = f.path().filename().string();
    const std::string path = f.path().string();
    // Leftovers of a process killed while writing: never complete, never read.
    if ((name.rfind(".", 0) == 0 && name.find(".tmp-") != std::string::npos) ||
        (name.size() > 10 && name.substr(name.size() - 10) == ".state.new")) {
      fs::remove(path, ec);
      continue;
    }
    DiskEntry e;
    if (!parse_name(name, &e.hash, &e.checksum)) continue;  // not one of ours: left alone
    e.path = path;
    try {
      const std::string bytes = read_file_bytes(path, "prefix cache file", UINT64_MAX);
      if (fnv1a64(bytes) != e.checksum)
        fail("its checksum is ", hex16(fnv1a64(bytes)), ", its name says ", hex16(e.checksum), " (a damaged file)");
      codec.load_snapshot(path, &e.tokens);  // refuses another model's state, or shapes this model does not have
      if (e.tokens.empty() || prefix_hashes(e.tokens).back() != e.hash)
        fail("the tokens it records do not hash to its name");
      e.bytes = static_cast<int64_t>(bytes.size());
      found.push_back({fs::last_write_time(path, ec), std::move(e)});
    } catch (const std::exception& ex) {
      warn("skipping '" + path + "' (deleted): " + ex.what());
      fs::remove(path, ec);
    }
  }
  std::sort(found.begin(), found.end(), [](const Found& a, const Found& b) { return a.written > b.written; });
  for (Found& f : found) {
    if (disk_find(f.entry.tokens, f.entry.hash) != disk_lru_.end()) {  // the same tokens twice: keep the newer
      fs::remove(f.entry.path, ec);
      continue;
    }
    disk_lru_.push_back(std::move(f.entry));
    disk_by_hash_.emplace(disk_lru_.back().hash, std::prev(disk_lru_.end()));
    disk_bytes_ += disk_lru_.back().bytes;
  }
  while (disk_bytes_ > disk_budget_ && !disk_lru_.empty()) disk_erase(std::prev(disk_lru_.end()), true);
}

}  // namespace mambacpp
