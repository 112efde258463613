#include "engine/prefix_cache.h"

#include <algorithm>

#include "core/splitmix.h"

namespace mambacpp {

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
  if (n <= 0 || lru_.empty()) return {};
  const std::vector<uint64_t> hashes = prefix_hashes(tokens.first(static_cast<size_t>(n)));
  for (int64_t len = n; len >= 1; --len) {
    if (!by_hash_.count(hashes[static_cast<size_t>(len - 1)])) continue;
    auto it = find(tokens.first(static_cast<size_t>(len)), hashes[static_cast<size_t>(len - 1)]);
    if (it == lru_.end()) continue;
    lru_.splice(lru_.begin(), lru_, it);
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

}  // namespace mambacpp
