// splitmix64's finaliser: a bijection of 64-bit words in which every input bit reaches every output bit. Used for
// hashing token prefixes and as a counter-based random generator.
#pragma once

#include <cstdint>

namespace mambacpp {

constexpr uint64_t splitmix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

}  // namespace mambacpp
