// The machine's physical memory, for checks of allocations made up front (an overcommitted allocation succeeds and
// the process is killed later, so the size is checked before allocating).
#pragma once

#include <unistd.h>

namespace mambacpp {

// Bytes of physical memory; a huge value when the system does not say (the check then never refuses).
inline double physical_memory_bytes() {
  const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
  return pages > 0 && page > 0 ? static_cast<double>(pages) * static_cast<double>(page) : 0x1p62;
}

}  // namespace mambacpp
