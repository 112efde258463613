// Where the CPU backend keeps its weights: copies in memory backed by 2 MiB pages (transparent huge pages, asked for
// with madvise) when the kernel offers them. A decode step streams every weight once, and with 4 KiB pages each
// page is a TLB miss and a stop for the hardware prefetcher: on the development machine (Zen 3, KVM) a plain read
// ran 12-30% faster from huge pages. Without huge pages (THP "never", not Linux) the weights stay where the loader
// put them (the checkpoint's mapping), as before.
#pragma once

#include <cstddef>
#include <memory>
#include <mutex>
#include <unordered_map>
#include <utility>
#include <vector>

namespace mambacpp::cpu {

class WeightArena {
 public:
  // Huge pages are available (Linux, /sys/kernel/mm/transparent_hugepage/enabled is "always" or "madvise").
  static bool huge_pages_available();

  // A copy of [src, src + bytes) in the arena, 64-byte aligned; src itself when it lies in the arena already, and
  // the earlier copy when the same address with the same bytes was adopted before (tied embeddings: one copy). The
  // bytes are compared, so a source freed after its adoption and another one at its address get their own copies.
  const void* adopt(const void* src, size_t bytes);

  // p lies in a copy made by adopt (so it stays valid, unchanged, as long as the arena).
  bool contains(const void* p);

 private:
  bool contains_locked(const void* p) const;

  struct Chunk {
    std::unique_ptr<char, void (*)(void*)> data{nullptr, nullptr};
    size_t size = 0, used = 0;
  };
  std::mutex mutex_;
  std::vector<Chunk> chunks_;
  std::unordered_map<const void*, std::pair<const void*, size_t>> copies_;  // source -> (copy, bytes)
};

}  // namespace mambacpp::cpu
