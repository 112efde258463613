// The engine's state prefix cache: snapshots of sequence states (StateCache::snapshot), each standing for the exact
// token sequence that produced it, in an LRU bounded in bytes. Lookups find the longest cached prefix of a prompt.
//
// With a directory (enable_disk), a second tier on disk: every snapshot kept in memory is also written there (a state
// file, core/atomic_file.h, named by its tokens' hash and the file's checksum), in an LRU of its own bounded in bytes,
// so that a snapshot dropped from memory, or lost with the process, is found again. A lookup whose longest prefix is
// on disk only reads it back into memory. At start the index is rebuilt from the directory: every file is read whole,
// its checksum and its state (the model, the shapes) checked, and a corrupt or foreign file is skipped with a
// warning and deleted, never served.
#pragma once

#include <cstdint>
#include <list>
#include <optional>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "mambacpp/state.h"

namespace mambacpp {

class PrefixCache {
 public:
  explicit PrefixCache(int64_t budget_bytes) : budget_(budget_bytes) {}

  struct Hit {
    const SlotSnapshot* snapshot = nullptr;  // null: no cached prefix
    int64_t length = 0;                      // tokens it stands for
  };
  // The longest cached prefix of `tokens` of at most `max_length` tokens (marked as just used).
  Hit lookup(std::span<const int32_t> tokens, int64_t max_length);
  // Whether `tokens` exactly is cached (not marked as used).
  bool contains(std::span<const int32_t> tokens) const;
  // Adds a snapshot standing for `tokens` (replacing one for the same tokens), then evicts the least recently used
  // entries until the cache fits its budget. A snapshot larger than the whole budget is not kept. Returns whether
  // it was kept.
  bool insert(std::vector<int32_t> tokens, SlotSnapshot snapshot);
  // Drops the snapshots in memory (the disk tier keeps its files).
  void clear();

  // Opens the disk tier in `dir` (created if missing) with a budget of `budget_bytes`; `codec` writes and reads the
  // files and refuses those of another model. Files past the budget (the least recently written) are deleted.
  void enable_disk(const std::string& dir, int64_t budget_bytes, const StateCache& codec);
  int64_t disk_bytes() const { return disk_bytes_; }
  int64_t disk_entries() const { return static_cast<int64_t>(disk_lru_.size()); }

  int64_t bytes() const { return bytes_; }
  int64_t budget() const { return budget_; }
  int64_t entries() const { return static_cast<int64_t>(lru_.size()); }

  // The hash of each prefix: hashes[i] stands for tokens[0, i + 1).
  static std::vector<uint64_t> prefix_hashes(std::span<const int32_t> tokens);

 private:
  struct Entry {
    std::vector<int32_t> tokens;
    uint64_t hash = 0;
    SlotSnapshot snapshot;
  };
  using Lru = std::list<Entry>;  // most recently used first
  Lru::iterator find(std::span<const int32_t> tokens, uint64_t hash);
  void erase(Lru::iterator it);

  struct DiskEntry {
    std::vector<int32_t> tokens;
    uint64_t hash = 0;
    std::string path;
    uint64_t checksum = 0;  // of the whole file (FNV-1a 64), also in its name
    int64_t bytes = 0;
  };
  using DiskLru = std::list<DiskEntry>;  // most recently used first
  DiskLru::iterator disk_find(std::span<const int32_t> tokens, uint64_t hash);
  void disk_erase(DiskLru::iterator it, bool remove_file);
  void disk_write(const std::vector<int32_t>& tokens, uint64_t hash, const SlotSnapshot& snapshot);
  // Reads a file back (its checksum and its tokens checked); nullopt and the entry gone, with a warning, on failure.
  std::optional<SlotSnapshot> disk_read(DiskLru::iterator it);
  bool insert_memory(std::vector<int32_t> tokens, uint64_t hash, SlotSnapshot snapshot);

  int64_t budget_;
  int64_t bytes_ = 0;
  Lru lru_;
  std::unordered_multimap<uint64_t, Lru::iterator> by_hash_;

  const StateCache* codec_ = nullptr;  // null: no disk tier
  std::string disk_dir_;
  int64_t disk_budget_ = 0, disk_bytes_ = 0;
  DiskLru disk_lru_;
  std::unordered_multimap<uint64_t, DiskLru::iterator> disk_by_hash_;
};

}  // namespace mambacpp
