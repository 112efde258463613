#include "backend/cpu/weight_arena.h"

#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>

#if defined(__linux__)
#include <sys/mman.h>
#endif

#include "mambacpp/error.h"

namespace mambacpp::cpu {
namespace {

constexpr size_t kHugePage = size_t(2) << 20;
constexpr size_t kChunkBytes = size_t(64) << 20;  // one chunk holds many small tensors; a larger one gets its own
constexpr size_t kAlign = 64;

}  // namespace

bool WeightArena::huge_pages_available() {
#if defined(__linux__) && defined(MADV_HUGEPAGE)
  static const bool available = [] {
    std::ifstream f("/sys/kernel/mm/transparent_hugepage/enabled");
    std::string s;
    std::getline(f, s);
    return s.find("[always]") != std::string::npos || s.find("[madvise]") != std::string::npos;
  }();
  return available;
#else
  return false;
#endif
}

bool WeightArena::contains(const void* p) {
  std::lock_guard<std::mutex> lock(mutex_);
  return contains_locked(p);
}

bool WeightArena::contains_locked(const void* p) const {
  const char* q = static_cast<const char*>(p);
  for (const Chunk& c : chunks_)
    if (q >= c.data.get() && q < c.data.get() + c.used) return true;
  return false;
}

const void* WeightArena::adopt(const void* src, size_t bytes) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (contains_locked(src)) return src;
  if (auto it = copies_.find(src); it != copies_.end() && it->second.second == bytes &&
                                    std::memcmp(it->second.first, src, bytes) == 0)
    return it->second.first;
  const size_t need = (std::max<size_t>(bytes, 1) + kAlign - 1) / kAlign * kAlign;
  if (chunks_.empty() || chunks_.back().size - chunks_.back().used < need) {
    Chunk c;
    c.size = std::max(kChunkBytes, (need + kHugePage - 1) / kHugePage * kHugePage);
    c.data = {static_cast<char*>(std::aligned_alloc(kHugePage, c.size)), std::free};
    if (!c.data) fail("CPU backend: out of memory copying a weight of ", bytes, " bytes");
#if defined(__linux__) && defined(MADV_HUGEPAGE)
    ::madvise(c.data.get(), c.size, MADV_HUGEPAGE);  // advisory: a refusal leaves 4 KiB pages, still correct
#endif
    chunks_.push_back(std::move(c));
  }
  Chunk& c = chunks_.back();
  char* dst = c.data.get() + c.used;
  c.used += need;
  if (bytes) std::memcpy(dst, src, bytes);
  copies_[src] = {dst, bytes};
  return dst;
}

}  // namespace mambacpp::cpu
