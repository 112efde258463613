// The engine's state prefix cache: snapshots of sequence states (StateCache::snapshot), each standing for the exact
// token sequence that produced it, in an LRU bounded in bytes. Lookups find the longest cached prefix of a prompt.
#pragma once

#include <cstdint>
#include <list>
#include <span>
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
  void clear();

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

  int64_t budget_;
  int64_t bytes_ = 0;
  Lru lru_;
  std::unordered_multimap<uint64_t, Lru::iterator> by_hash_;
};

}  // namespace mambacpp
