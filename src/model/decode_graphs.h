// Decode steps replayed as backend graphs (CUDA graphs). Captured kernels hold raw pointers and shapes, so a graph
// is keyed by every buffer and count its kernels read (the caller builds the key) and dropped when the workspace's
// buffers or the batch layout's device copy move.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <vector>

#include "backend/backend.h"

namespace mambacpp {

class DecodeGraphs {
 public:
  // Runs `work` (device work only) for the step `key`: the first time eagerly, so that lazy allocations happen
  // outside any capture; the second time captured, then replayed; later replayed.
  void run(Backend& be, const std::vector<const void*>& key, uint64_t workspace_generation, const void* device_seqs,
           const std::function<void()>& work);

 private:
  struct Entry {
    bool warmed = false;
    std::unique_ptr<Backend::Graph> graph;
    uint64_t workspace_generation = 0;
    const void* device_seqs = nullptr;
  };
  std::map<std::vector<const void*>, Entry> graphs_;
};

}  // namespace mambacpp
